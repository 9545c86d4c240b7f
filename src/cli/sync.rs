//! `weir sync`: once, or live.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use weir::connectors::localfs::{self, DirWatcher, FingerprintCache, SourceFile, WalkOptions};
use weir::{ChangeFeed, Error, ErrorKind, Result, RunReport, RunScope, ShutdownHandle, WatchEvent};

use super::progress::Progress;
use super::target::{self, Database};
use super::{job, RetryArgs, SyncArgs, EXIT_FAILED_FILES, EXIT_INTERRUPTED, EXIT_OK};

/// How often a sync without a terminal logs its progress.
const LOG_EVERY: Duration = Duration::from_secs(5);

/// What a sync, or a dry run, starts from: the arguments checked and the
/// directory walked.
pub(super) struct Prepared {
    pub db: Database,
    pub root: PathBuf,
    pub options: WalkOptions,
    /// The files walked, for the first run.
    pub files: Vec<SourceFile>,
    /// The fingerprint cache, loaded from beside the ledger.
    pub cache: FingerprintCache,
    /// Where the fingerprint cache is saved.
    pub cache_file: PathBuf,
}

/// Checks the arguments, loads the fingerprint cache (if there is one)
/// and walks the directory. Nothing is written.
pub(super) async fn prepare(args: &SyncArgs) -> Result<Prepared> {
    let db = Database::parse(&args.into.into)?;
    let root = args.dir.clone();
    if !root.is_dir() {
        let why = if root.exists() {
            "it is not a directory"
        } else {
            "no such directory"
        };
        return Err(Error::msg(format!("cannot sync {}: {why}", root.display())));
    }
    let ledger = &args.ledger.ledger;
    if let (Ok(ledger_abs), Ok(root_abs)) = (absolute_canonical(ledger), absolute_canonical(&root))
    {
        if root_abs.starts_with(&ledger_abs) {
            return Err(Error::msg(format!(
                "cannot sync {}: it is inside the ledger directory {}; pick a ledger elsewhere with --ledger",
                root.display(),
                ledger.display()
            )));
        }
    }
    let mut options = WalkOptions::new().gitignore(!args.no_gitignore);
    for glob in &args.include {
        options = options.include(glob.clone());
    }
    for glob in &args.exclude {
        options = options.exclude(glob.clone());
    }
    // weir's own files never sync, wherever they are.
    options = options.exclude_path(args.ledger.ledger.clone());
    for file in db.files() {
        options = options.exclude_path(file);
    }
    // Files whose size and time did not change are not read again to be
    // fingerprinted: their fingerprints are kept next to the ledger.
    let cache_file = args.ledger.ledger.join(FINGERPRINT_CACHE_FILE);
    let cache = {
        let file = cache_file.clone();
        tokio::task::spawn_blocking(move || FingerprintCache::load(file))
            .await
            .unwrap_or_default()
    };
    let options = options.fingerprint_cache(cache.clone());
    // The walk checks the globs before the ledger or the database is
    // touched; its list serves the first run.
    let files = walk(&root, &options).await?;
    Ok(Prepared {
        db,
        root,
        options,
        files,
        cache,
        cache_file,
    })
}

/// `weir sync DIR`: syncs a directory (prepared with [`prepare`]).
pub async fn run(args: SyncArgs, prepared: Prepared) -> Result<u8> {
    sync(args, prepared, false).await
}

/// `weir retry`: a sync of just the files that failed in the last sync
/// (their components), leaving every other file's rows as they are. A
/// failure of the sync as a whole (an unreadable directory) is retried by
/// a whole sync.
pub async fn retry(args: RetryArgs) -> Result<u8> {
    if !weir::App::ledger_exists(&args.ledger.ledger)? {
        return Err(Error::msg(format!(
            "no ledger at {}: nothing was synced there yet (run `weir sync DIR` first, or pass --ledger)",
            args.ledger.ledger.display()
        )));
    }
    let args = SyncArgs {
        dir: args.dir,
        into: args.into,
        ledger: args.ledger,
        live: false,
        dry_run: false,
        metrics: None,
        include: Vec::new(),
        exclude: Vec::new(),
        no_gitignore: args.no_gitignore,
        debounce_ms: 0,
        group: super::GroupArg::default(),
        adopt: false,
        table: None,
        consumer: super::records::DEFAULT_CONSUMER.to_string(),
        creds: None,
    };
    let prepared = prepare(&args).await?;
    sync(args, prepared, true).await
}

/// The scope of a retry: the root-level keys (files) of the components
/// that failed; `None` (everything) when the root itself failed; and how
/// many failed.
fn retry_scope(failed: &[weir::FailedComponent]) -> Option<RunScope> {
    if failed.iter().any(|f| f.path.is_root()) {
        return None;
    }
    Some(RunScope::keys(
        failed
            .iter()
            .filter_map(|f| f.path.segments().first().cloned())
            .collect::<Vec<_>>(),
    ))
}

/// Syncs once or live; with `retry`, once and only what failed last time.
async fn sync(args: SyncArgs, prepared: Prepared, retry: bool) -> Result<u8> {
    let Prepared {
        db,
        root,
        options,
        files,
        cache,
        cache_file,
    } = prepared;
    let saver = CacheSaver::new(cache, cache_file);
    if let Some(addr) = args.metrics {
        // Its errors name the address.
        weir::metrics::install_prometheus(addr)?;
        tracing::info!("serving Prometheus metrics on http://{addr}/metrics");
    }
    let target = job::open_target(&db, &args.ledger.ledger, &args.group, args.adopt).await?;
    if lost_all_tables(&target, &args.ledger.ledger).await? {
        eprintln!(
            "note: {} has none of the tables the ledger tracks there (the database was deleted or replaced, or an earlier sync failed to create them): syncing every file again",
            target.into.display()
        );
        job::drop_all(&target).await?;
    }
    let scope = if retry {
        let failed = target.app.failed_components().await?;
        if failed.is_empty() {
            println!("nothing to retry: no file failed in the last sync");
            target.close().await;
            return Ok(EXIT_OK);
        }
        println!("retrying {} failed file(s)", failed.len());
        retry_scope(&failed)
    } else {
        None
    };
    let shutdown = target.app.shutdown_handle();
    let job = Job::new(root, options, db, files, shutdown.clone());
    job.set_scope(scope);
    let signals = tokio::spawn(super::signal::stop_on_signal(shutdown.clone()));
    let code = if args.live {
        let tick = args.group.group.as_ref().map(|_| group_tick(&args.group));
        live(
            &target,
            job,
            Duration::from_millis(args.debounce_ms),
            tick,
            &saver,
        )
        .await
    } else if args.group.group.is_some() {
        let code = once_in_group(&target, job).await;
        saver.save();
        code
    } else {
        let code = once(&target, job).await;
        saver.save();
        code
    };
    saver.finish().await;
    signals.abort();
    if args.group.group.is_some() {
        print_partitions_synced(&target.app.synced_partitions());
    }
    leave_group(&target).await;
    target.close().await;
    code
}

/// Leaves the worker group (if any) on a clean exit, so that the other
/// members take this one's partitions over at once rather than after the
/// lease TTL.
async fn leave_group(target: &target::Target) {
    if let Err(e) = target.app.leave_group().await {
        tracing::warn!("leaving the worker group failed (its leases expire after their TTL): {e}");
    }
}

/// How long a one-shot member waits between passes while other members
/// finish theirs.
const GROUP_PASS_WAIT: Duration = Duration::from_millis(500);

/// A one-shot sync as a member of a worker group: passes over the
/// partitions this member holds, until every partition of the group
/// completed a pass begun after this member joined (whoever ran it: a
/// member that died is taken over).
async fn once_in_group(target: &target::Target, job: Arc<Job>) -> Result<u8> {
    let stopping = target.app.shutdown_handle();
    let mut code = EXIT_OK;
    loop {
        match once(target, Arc::clone(&job)).await {
            // A file that failed in any pass fails the sync (it may have
            // completed its partition's pass that way).
            Ok(c) => code = code.max(c),
            // A member whose declaration of the tables differs from the
            // root holder's (a rolling update) waits, and tries again.
            Err(e) if e.is_root_pending() => tracing::warn!("{e}"),
            Err(e) => return Err(e),
        }
        if stopping.is_requested() || target.app.group_synced().await? {
            break;
        }
        tokio::time::sleep(GROUP_PASS_WAIT).await;
    }
    Ok(code)
}

/// Prints the line naming the partitions this member synced itself (in a
/// live sync, over the whole run): `partitions synced: 0, 3, 7`, or
/// `partitions synced: none`.
fn print_partitions_synced(partitions: &[u32]) {
    println!("partitions synced: {}", partition_list(partitions));
}

/// `0, 3, 7`: partitions separated by commas (`none` when empty).
fn partition_list(partitions: &[u32]) -> String {
    if partitions.is_empty() {
        return "none".to_string();
    }
    let list: Vec<String> = partitions.iter().map(u32::to_string).collect();
    list.join(", ")
}

/// Whether the database has none of the tables the ledger tracks there
/// (it was deleted and created anew, or replaced; or an earlier sync
/// failed to create them, which leaves them tracked as possibly created).
/// The ledger's records, and the memo keys that skip unchanged files, then
/// no longer hold: a sync forgets them (dropping what no longer exists),
/// so that it writes every file again. When only some are gone (dropped
/// by hand), weir does not drop the others on its own: this is an error
/// that says what to do.
pub(super) async fn lost_all_tables(target: &target::Target, ledger: &Path) -> Result<bool> {
    let missing = target.missing_tables().await?;
    if missing.is_empty() || !target.tracks_tables().await? {
        return Ok(false);
    }
    // A sync stopped while it created the tables tracks fewer than the
    // database has: the next one creates the rest.
    let existing = job::TABLES.len() - missing.len();
    if target.tracked_tables().await? <= existing as u64 {
        return Ok(false);
    }
    if missing.len() < job::TABLES.len() {
        let db = target.into.display();
        return Err(Error::msg(format!(
            "{db} has no {} table any more, though weir created it there and still tracks it; weir rebuilds its tables only all together: restore the table, or run `weir drop --yes --into {db} --ledger {}` to delete what is left of them, then sync again",
            missing.join(" or "),
            ledger.display(),
        )));
    }
    Ok(true)
}

/// `path` made absolute, with symbolic links resolved as far as it exists.
fn absolute_canonical(path: &Path) -> std::io::Result<PathBuf> {
    let absolute = std::path::absolute(path)?;
    Ok(std::fs::canonicalize(&absolute).unwrap_or(absolute))
}

/// The file next to the ledger that keeps files' fingerprints.
const FINGERPRINT_CACHE_FILE: &str = "fingerprints";

/// Saves the fingerprint cache after a run, on a blocking thread.
struct CacheSaver {
    cache: FingerprintCache,
    file: PathBuf,
    /// The last save started; each waits for the one before it.
    last: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl CacheSaver {
    fn new(cache: FingerprintCache, file: PathBuf) -> CacheSaver {
        CacheSaver {
            cache,
            file,
            last: Mutex::new(None),
        }
    }

    /// Starts saving the cache as it is when the save runs, after the
    /// saves started before.
    fn save(&self) {
        let cache = self.cache.clone();
        let file = self.file.clone();
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let previous = last.take();
        *last = Some(tokio::spawn(async move {
            if let Some(previous) = previous {
                let _ = previous.await;
            }
            let saved = tokio::task::spawn_blocking(move || cache.save(&file)).await;
            // Losing the cache only costs reading the files again next time.
            match saved {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!("{e}"),
                Err(e) => tracing::warn!("saving the fingerprint cache stopped: {e}"),
            }
        }));
    }

    /// Waits for the saves started.
    async fn finish(&self) {
        let last = self
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(last) = last {
            let _ = last.await;
        }
    }
}

/// Lists the files to sync, off the async threads.
async fn walk(root: &Path, options: &WalkOptions) -> Result<Vec<SourceFile>> {
    let root = root.to_path_buf();
    let options = options.clone();
    tokio::task::spawn_blocking(move || localfs::walk_dir(&root, &options))
        .await
        .map_err(|e| Error::msg(format!("the directory walk stopped: {e}")))?
}

/// The job of every run: list the files, then sync each.
pub(super) struct Job {
    root: PathBuf,
    options: WalkOptions,
    db: Database,
    /// The list walked before the first run (taken by it).
    walked: Mutex<Option<Vec<SourceFile>>>,
    /// How many files the last run saw.
    files: AtomicU64,
    /// Requested when the sync is to stop.
    stop: ShutdownHandle,
    /// The files a run covers (`weir retry`); all when `None`.
    scope: Mutex<Option<RunScope>>,
}

impl Job {
    /// The job syncing `root`, whose first run syncs the `walked` files.
    pub(super) fn new(
        root: PathBuf,
        options: WalkOptions,
        db: Database,
        walked: Vec<SourceFile>,
        stop: ShutdownHandle,
    ) -> Arc<Job> {
        Arc::new(Job {
            root,
            options,
            db,
            walked: Mutex::new(Some(walked)),
            files: AtomicU64::new(0),
            stop,
            scope: Mutex::new(None),
        })
    }

    /// The directory synced.
    /// Restricts the job's runs to `scope`.
    fn set_scope(&self, scope: Option<RunScope>) {
        if let Ok(mut s) = self.scope.lock() {
            *s = scope;
        }
    }

    pub(super) fn root(&self) -> &Path {
        &self.root
    }

    /// How many files the last run saw.
    pub(super) fn files(&self) -> u64 {
        self.files.load(Ordering::Relaxed)
    }

    /// The root component of one run.
    pub(super) async fn run(self: Arc<Self>, ctx: weir::Ctx) -> Result<()> {
        let walked = self.walked.lock().map_or(None, |mut walked| walked.take());
        let files = match walked {
            Some(files) => files,
            None => walk(&self.root, &self.options).await?,
        };
        self.files.store(files.len() as u64, Ordering::Relaxed);
        let progress = Progress::new(files.len() as u64);
        let logger = progress.log_periodically(LOG_EVERY);
        let result = job::sync_files(
            ctx,
            self.db.clone(),
            files,
            progress.clone(),
            self.stop.clone(),
        )
        .await;
        progress.finish();
        if let Some(logger) = logger {
            logger.abort();
        }
        result
    }

    /// Prints what a run did; returns the exit code.
    fn summarize(&self, report: &RunReport, interrupted: bool) -> u8 {
        summarize(
            &self.root,
            &self.db,
            self.files.load(Ordering::Relaxed),
            report,
            interrupted,
        )
    }
}

async fn once(target: &target::Target, job: Arc<Job>) -> Result<u8> {
    tracing::info!(
        "syncing {} into {}",
        job.root.display(),
        target.into.display()
    );
    let run = Arc::clone(&job);
    let scope = job.scope.lock().map_or(None, |s| s.clone());
    let report = match scope {
        Some(scope) => {
            target
                .app
                .scoped(scope)
                .run_report(move |ctx| run.run(ctx))
                .await?
        }
        None => target.app.run_report(move |ctx| run.run(ctx)).await?,
    };
    Ok(job.summarize(&report, target.app.shutdown_handle().is_requested()))
}

/// Prints what a run did and lists failed files; returns the exit code.
/// `interrupted`: a shutdown was requested during the run.
fn summarize(root: &Path, db: &Database, files: u64, report: &RunReport, interrupted: bool) -> u8 {
    let s = &report.stats;
    // In a worker group, components that wait for the root partition's
    // holder (another version of the tables) did not fail: they run again.
    let waiting = report.failures.iter().find(|f| f.is_root_pending());
    if let Some(wait) = waiting {
        eprintln!("waiting: {}", wait.cause);
    }
    let failed: Vec<_> = report
        .failures
        .iter()
        .filter(|f| !f.path.is_root() && !f.is_root_pending())
        .collect();
    println!(
        "synced {files} files from {} into {} in {:.2}s: {} unchanged files skipped; tables and rows: {} created, {} updated, {} deleted, {} unchanged; {} failed",
        root.display(),
        db.display(),
        s.elapsed.as_secs_f64(),
        s.memoized,
        s.created,
        s.updated,
        s.deleted,
        s.unchanged,
        failed.len(),
    );
    for f in &failed {
        let quarantined = if f.failed_runs >= weir::DEFAULT_QUARANTINE_AFTER {
            format!(" (failed {} syncs in a row: quarantined)", f.failed_runs)
        } else {
            String::new()
        };
        eprintln!(
            "failed: {}: {}{quarantined}",
            f.path.to_string().trim_start_matches('/'),
            f.cause
        );
    }
    if s.quarantined > 0 {
        eprintln!(
            "{} file(s) quarantined: they failed {} syncs in a row or more; fix them, then `weir retry` syncs just the failed files",
            s.quarantined,
            weir::DEFAULT_QUARANTINE_AFTER
        );
    }
    if interrupted {
        eprintln!("interrupted: the files that finished are committed; run `weir sync` again to do the rest");
        return EXIT_INTERRUPTED;
    }
    if let Some(root_failure) = report
        .failures
        .iter()
        .find(|f| f.path.is_root() && !f.is_root_pending())
    {
        // The files it reached are committed: a partial success.
        eprintln!("error: {}", root_failure.cause);
        return EXIT_FAILED_FILES;
    }
    if failed.is_empty() {
        EXIT_OK
    } else {
        EXIT_FAILED_FILES
    }
}

/// A directory watcher as a change feed.
struct Feed {
    watcher: DirWatcher,
    debounce: Duration,
    /// In a worker group: a run at least this often, with or without a
    /// change, so that partitions taken over (from a member that died or
    /// left) are synced, and a run that waited for the root partition's
    /// holder tries again.
    tick: Option<Duration>,
}

impl ChangeFeed for Feed {
    async fn next_change(&mut self) -> Option<Vec<String>> {
        let Some(tick) = self.tick else {
            return self.watcher.changed(self.debounce).await;
        };
        match tokio::time::timeout(tick, self.watcher.changed(self.debounce)).await {
            Ok(changes) => changes,
            Err(_) => Some(Vec::new()),
        }
    }
}

/// How often a live member of a worker group runs without a change: a
/// third of the lease TTL, so that a partition taken over is synced
/// within about one TTL of its owner's death.
fn group_tick(group: &super::GroupArg) -> Duration {
    group.lease_ttl.unwrap_or(weir::group::DEFAULT_LEASE_TTL) / 3
}

async fn live(
    target: &target::Target,
    job: Arc<Job>,
    debounce: Duration,
    tick: Option<Duration>,
    saver: &CacheSaver,
) -> Result<u8> {
    // Watch before the first run, so that nothing changed during it is
    // missed: the list walked before the watch started may be stale.
    let watcher = {
        let (root, options) = (job.root.clone(), job.options.clone());
        tokio::task::spawn_blocking(move || DirWatcher::new(&root, &options))
            .await
            .map_err(|e| Error::msg(format!("starting the directory watcher stopped: {e}")))??
    };
    if let Ok(mut walked) = job.walked.lock() {
        walked.take();
    }
    tracing::info!(
        "watching {} and syncing it into {} (Ctrl-C stops)",
        job.root.display(),
        target.into.display()
    );
    let mut last = EXIT_OK;
    let stopping = target.app.shutdown_handle();
    let run = Arc::clone(&job);
    target
        .app
        .watch(
            Feed {
                watcher,
                debounce,
                tick,
            },
            move |ctx| Arc::clone(&run).run(ctx),
            |event| match event {
                WatchEvent::Ran { changes, report } => {
                    if !changes.is_empty() {
                        tracing::info!("changed: {}", abbreviate(&changes));
                    }
                    saver.save();
                    last = job.summarize(&report, stopping.is_requested());
                }
                WatchEvent::Failed { error, .. } => {
                    tracing::error!("the sync failed: {error}; {}", after_failure(tick));
                }
                _ => {}
            },
        )
        .await
        .map_err(|e| match e.kind() {
            ErrorKind::Shutdown => Error::msg(format!("live mode stopped: {e}")),
            _ => e,
        })?;
    tracing::info!("stopped");
    Ok(if last == EXIT_INTERRUPTED {
        EXIT_OK
    } else {
        last
    })
}

/// When a live sync whose run failed runs again: at the next change, or
/// for a member of a worker group also at its next tick.
fn after_failure(tick: Option<Duration>) -> String {
    match tick {
        Some(tick) => format!(
            "running again within {} ms, or at the next change",
            tick.as_millis()
        ),
        None => "waiting for the next change".to_string(),
    }
}

/// The first few changed paths, for a log line.
fn abbreviate(changes: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut text = changes
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if changes.len() > SHOWN {
        text.push_str(&format!(" and {} more", changes.len() - SHOWN));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_live_sync_says_a_group_member_runs_again_at_its_tick_and_others_at_a_change() {
        assert_eq!(
            after_failure(Some(Duration::from_millis(666))),
            "running again within 666 ms, or at the next change"
        );
        assert_eq!(after_failure(None), "waiting for the next change");
    }
}
