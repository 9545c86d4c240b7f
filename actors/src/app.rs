//! `App` and `AppBuilder`: the entry points of weir.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::actors::cleanup::finish_run;
use crate::actors::component::{run_component, ComponentState};
use crate::actors::pipeline::{AbortOnDrop, Engine, EngineConfig};
use crate::actors::reconciler::EndRun;
use crate::config::{
    BatchPolicy, RetryPolicy, DEFAULT_MAX_INFLIGHT_COMPONENTS, DEFAULT_QUARANTINE_AFTER,
    DEFAULT_RECONCILE_CHUNK,
};
use crate::ctx::{ContextKey, Ctx};
use crate::error::{ComponentFailure, Error, Result};
use crate::group::{GroupStatus, WorkerGroup};
use crate::ledger::record::LedgerOp;
pub use crate::ledger::LedgerReport;
use crate::ledger::{Ledger, DEFAULT_LEDGER_CACHE_BYTES};
use crate::model::ComponentPath;
use crate::run::{PreviewAction, Run, UpdateStats};
use crate::scope::RunScope;
use crate::sync::lock;

/// The default ledger directory, relative to the working directory.
pub const DEFAULT_LEDGER_DIR: &str = ".weir";

/// An embedded weir engine with its ledger.
///
/// Build one with [`App::builder`], then call [`App::update`] (or
/// [`App::run`]) with the root component's code. Dropping the `App` stops
/// its threads, cancels a run still going in the background, and releases
/// its ledger: another `App` can open it at once.
///
/// Dropping the future of a run ([`App::run`], [`App::update`],
/// [`App::preview`], [`App::drop_state`]) or of a
/// [`Ctx::mount`](crate::Ctx::mount) (a timeout, a `select!`) cancels it:
/// its components' code stops at once, and nothing more of them is
/// committed, so their earlier target states stay as they were. Sink calls
/// already in flight finish, bounded by
/// [`RetryPolicy::call_timeout`](crate::RetryPolicy::call_timeout); the
/// App's next run waits only for them, and folds the intents they left
/// into the ledger before it reconciles.
///
/// ```
/// use weir_actors::{App, Result};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<()> {
/// let dir = tempfile::tempdir()?;
/// let app = App::builder("docs").ledger_path(dir.path()).build().await?;
/// let stats = app.run(|ctx| async move {
///     ctx.mount("child", |_ctx| async move { Ok(()) }).await
/// }).await?;
/// assert_eq!(stats.failed_components, 0);
/// # Ok(())
/// # }
/// ```
pub struct App {
    name: String,
    pub(crate) engine: Arc<Engine>,
}

impl fmt::Debug for App {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("App")
            .field("name", &self.name)
            .field("ledger", &self.engine.ledger.dir())
            .finish()
    }
}

/// Configures and builds an [`App`].
#[must_use]
pub struct AppBuilder {
    name: String,
    ledger_path: PathBuf,
    ledger_cache_bytes: u64,
    shards: Option<usize>,
    reconcile_chunk: usize,
    max_inflight: usize,
    batch: BatchPolicy,
    retry: RetryPolicy,
    quarantine_after: u32,
    adopt_tables: bool,
    keys: HashMap<String, Arc<dyn Any + Send + Sync>>,
    group: Option<WorkerGroup>,
}

impl fmt::Debug for AppBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppBuilder")
            .field("name", &self.name)
            .field("ledger_path", &self.ledger_path)
            .field("shards", &self.shards)
            .field("reconcile_chunk", &self.reconcile_chunk)
            .field("max_inflight", &self.max_inflight)
            .field("batch", &self.batch)
            .field("retry", &self.retry)
            .finish()
    }
}

impl AppBuilder {
    /// The sled ledger directory (default: `.weir` in the working directory).
    pub fn ledger_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.ledger_path = path.into();
        self
    }

    /// The ledger's page cache size in bytes (default: 64 MiB).
    pub fn ledger_cache_bytes(mut self, bytes: u64) -> Self {
        self.ledger_cache_bytes = bytes;
        self
    }

    /// The number of reconciler shards (default: the number of cores).
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = Some(n);
        self
    }

    /// How many declarations a component sends to the reconcilers at once
    /// while its code is still running (default: 4096).
    ///
    /// Reconciling is read-only, so a component that declares many states
    /// has them compared with the ledger while it declares the rest;
    /// nothing is applied before its code has returned `Ok`. Smaller chunks
    /// overlap more and cost more messages.
    pub fn reconcile_chunk(mut self, n: usize) -> Self {
        self.reconcile_chunk = n;
        self
    }

    /// The most components running at once in `mount_each` (default: 4096).
    pub fn max_inflight_components(mut self, n: usize) -> Self {
        self.max_inflight = n;
        self
    }

    /// How actions are batched into sink calls.
    pub fn batch_policy(mut self, p: BatchPolicy) -> Self {
        self.batch = p;
        self
    }

    /// How failed sink calls are retried.
    pub fn retry_policy(mut self, p: RetryPolicy) -> Self {
        self.retry = p;
        self
    }

    /// How many runs in a row a component fails before it is reported as
    /// quarantined (default: 3): in [`UpdateStats::quarantined`], in its
    /// [`ComponentFailure::failed_runs`], and in the
    /// `weir_component_quarantined` gauge. It still runs in every run: a
    /// run with a narrower scope ([`App::scoped`]) can leave it out.
    pub fn quarantine_after(mut self, runs: u32) -> Self {
        self.quarantine_after = runs;
        self
    }

    /// Takes over the tables (and other containers) that another owner
    /// registered, instead of refusing them (off by default; see
    /// [`App::owner`]): for when that owner's ledger is lost for good.
    /// The app then manages them as its own: rows it does not declare are
    /// deleted, as always.
    pub fn adopt_tables(mut self, adopt: bool) -> Self {
        self.adopt_tables = adopt;
        self
    }

    /// Makes the App a member of a worker group: its runs cover only the
    /// partitions it holds, its writes are fenced, and its ledger is kept
    /// in the group's changelog (see [`crate::group`]). `build` joins the
    /// group.
    pub fn worker_group(mut self, group: WorkerGroup) -> Self {
        self.group = Some(group);
        self
    }

    /// Provides a value to every component, read with [`Ctx::get_key`].
    pub fn provide_key<T: Send + Sync + 'static>(mut self, key: &ContextKey<T>, value: T) -> Self {
        self.keys.insert(key.name().to_string(), Arc::new(value));
        self
    }

    /// Opens the ledger and starts the engine.
    ///
    /// # Errors
    /// When called outside a tokio runtime, when a setting is out of range,
    /// or when the ledger cannot be opened: it is locked by another `App` or
    /// process, of an unknown format version, or corrupt, or the directory
    /// holds a `sled/` store that is not a weir ledger (a usage error naming
    /// it; a missing or empty directory, or one holding other files,
    /// becomes a new ledger).
    pub async fn build(self) -> Result<App> {
        crate::metrics::describe_once();
        let user = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::Usage("App::build must be called inside a tokio runtime".into()))?;
        let shards = match self.shards {
            Some(0) => return Err(Error::Usage("shards must be at least 1".into())),
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(2, |n| n.get()),
        };
        if self.reconcile_chunk == 0 {
            return Err(Error::Usage("reconcile_chunk must be at least 1".into()));
        }
        if self.max_inflight == 0 {
            return Err(Error::Usage(
                "max_inflight_components must be at least 1".into(),
            ));
        }
        if self.batch.max_actions == 0 {
            return Err(Error::Usage(
                "BatchPolicy::max_actions must be at least 1".into(),
            ));
        }
        if self.retry.max_attempts == 0 {
            return Err(Error::Usage(
                "RetryPolicy::max_attempts must be at least 1".into(),
            ));
        }
        if self.quarantine_after == 0 {
            return Err(Error::Usage("quarantine_after must be at least 1".into()));
        }
        if self.name.is_empty() {
            return Err(Error::Usage("an App needs a non-empty name".into()));
        }
        let path = self.ledger_path.clone();
        let cache = self.ledger_cache_bytes;
        let ledger = user
            .spawn_blocking(move || Ledger::open(&path, cache))
            .await
            .map_err(|e| Error::Shutdown(format!("opening the ledger was cancelled: {e}")))??;
        let config = EngineConfig {
            shards,
            reconcile_chunk: self.reconcile_chunk,
            max_inflight: self.max_inflight,
            batch: self.batch,
            retry: self.retry,
            quarantine_after: self.quarantine_after,
            adopt_tables: self.adopt_tables,
        };
        let member = match self.group {
            Some(group) => Some(crate::group::run::join(group).await?),
            None => None,
        };
        let for_engine = user.clone();
        let for_start = member.clone();
        let engine = user
            .spawn_blocking(move || Engine::start(ledger, config, for_engine, self.keys, for_start))
            .await
            .map_err(|e| Error::Shutdown(format!("starting the engine was cancelled: {e}")))??;
        let engine = Arc::new(engine);
        if let Some(member) = member {
            crate::group::run::start_heartbeat(&engine, member);
        }
        Ok(App {
            name: self.name,
            engine,
        })
    }
}

impl App {
    /// A builder for an app named `name`.
    pub fn builder(name: &str) -> AppBuilder {
        AppBuilder {
            name: name.to_string(),
            ledger_path: PathBuf::from(DEFAULT_LEDGER_DIR),
            ledger_cache_bytes: DEFAULT_LEDGER_CACHE_BYTES,
            shards: None,
            reconcile_chunk: DEFAULT_RECONCILE_CHUNK,
            max_inflight: DEFAULT_MAX_INFLIGHT_COMPONENTS,
            batch: BatchPolicy::default(),
            retry: RetryPolicy::default(),
            quarantine_after: DEFAULT_QUARANTINE_AFTER,
            adopt_tables: false,
            keys: HashMap::new(),
            group: None,
        }
    }

    /// The app's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The owner of what this app creates: its worker group when it has
    /// one, otherwise its ledger (named by the identity the ledger was
    /// given when it was created, and where it is). Connectors register
    /// the tables they create with it, and refuse to manage a table that
    /// another owner registered: two ledgers writing one table would undo
    /// each other's work.
    ///
    /// # Errors
    /// When the ledger cannot be read.
    pub fn owner(&self) -> Result<crate::Owner> {
        self.engine.owner()
    }

    /// Runs `f` as the root component, then brings every target to what was
    /// declared, and returns `f`'s value.
    ///
    /// # Errors
    /// When components failed (every other component is still committed):
    /// the error names each failed component and its cause, and
    /// [`Error::failed_components`] lists them. Also on ledger failures.
    pub async fn update<F, Fut, T>(&self, f: F) -> Result<T>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let (value, _, _) = self.execute(f, Mode::Apply, None).await?;
        Ok(value)
    }

    /// Like [`App::update`], returning what was done.
    ///
    /// # Errors
    /// As [`App::update`].
    pub async fn run<F, Fut>(&self, f: F) -> Result<UpdateStats>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        let (_, stats, _) = self.execute(f, Mode::Apply, None).await?;
        Ok(stats)
    }

    /// Runs `f` and lists the actions an update would take, without
    /// applying anything or writing the ledger. Container sinks' child
    /// handler factories are called in place of applying.
    ///
    /// # Errors
    /// As [`App::update`].
    pub async fn preview<F, Fut, T>(&self, f: F) -> Result<Vec<PreviewAction>>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let (_, _, actions) = self.execute(f, Mode::Preview, None).await?;
        Ok(actions)
    }

    /// Deletes every target state the ledger tracks. `f` registers the
    /// providers (so their handlers can delete) and declares nothing.
    ///
    /// # Errors
    /// As [`App::update`]; declaring a target state in `f` is an error.
    pub async fn drop_state<F, Fut>(&self, f: F) -> Result<UpdateStats>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        let (_, stats, _) = self.execute(f, Mode::Drop, None).await?;
        Ok(stats)
    }

    /// Counts of what the ledger tracks: `(components, target states)`, and
    /// its size on disk in bytes.
    ///
    /// # Errors
    /// When the ledger cannot be read.
    pub async fn ledger_summary(&self) -> Result<(u64, u64, u64)> {
        let ledger = self.engine.ledger.clone();
        let (c, s) = self
            .engine
            .user
            .spawn_blocking(move || ledger.counts())
            .await
            .map_err(|e| Error::Shutdown(e.to_string()))??;
        Ok((c, s, self.engine.ledger.size_on_disk()))
    }

    /// Whether `dir` holds a ledger, without creating one there (as
    /// building an `App` on it would): for tools that only read one.
    /// `Ok(false)` when it holds none (it is missing, empty, or holds other
    /// files).
    ///
    /// # Errors
    /// A usage error naming the directory when it holds a `sled/` store
    /// that is not a weir ledger (building an `App` on it fails the same
    /// way).
    pub fn ledger_exists(dir: impl AsRef<std::path::Path>) -> Result<bool> {
        Ledger::exists(dir.as_ref())
    }

    /// A report of what the ledger holds: target states by provider,
    /// failed components with their causes, size and format version.
    ///
    /// # Errors
    /// When the ledger cannot be read.
    pub async fn inspect(&self) -> Result<LedgerReport> {
        let ledger = self.engine.ledger.clone();
        self.engine
            .user
            .spawn_blocking(move || ledger.report())
            .await
            .map_err(|e| Error::Shutdown(e.to_string()))?
    }

    /// In a worker group, the group as the coordinator sees it: its
    /// partition count, lease TTL, live members and each partition's
    /// owner and epoch. `None` outside a group.
    ///
    /// # Errors
    /// When the coordinator cannot be reached.
    pub async fn group_status(&self) -> Result<Option<GroupStatus>> {
        let Some(member) = &self.engine.member else {
            return Ok(None);
        };
        let status = member.group.coordinator.status(&member.group.name).await?;
        Ok(Some(status))
    }

    /// In a worker group, the data partitions this member has completed a
    /// pass of, sorted (empty outside a group).
    pub fn synced_partitions(&self) -> Vec<u32> {
        self.engine
            .member
            .as_ref()
            .map(|m| m.synced())
            .unwrap_or_default()
    }

    /// In a worker group, whether every partition has completed a pass
    /// that began after this member joined, whoever ran it: a one-shot
    /// sync in a group runs until this holds. `true` outside a group.
    ///
    /// # Errors
    /// When the coordinator cannot be reached.
    pub async fn group_synced(&self) -> Result<bool> {
        let Some(member) = &self.engine.member else {
            return Ok(true);
        };
        let Some(pass) = member.join_pass() else {
            return Ok(false);
        };
        member
            .group
            .coordinator
            .all_completed_after(&member.group.name, pass)
            .await
    }

    /// Leaves the worker group at once: releases every partition this
    /// member holds and its membership, so that other members take them
    /// over without waiting for the lease to expire. Call it when the
    /// program exits cleanly (a later run joins again). Nothing to do
    /// outside a group.
    ///
    /// # Errors
    /// When the coordinator cannot be reached (the leases then expire
    /// after their TTL).
    pub async fn leave_group(&self) -> Result<()> {
        let Some(member) = &self.engine.member else {
            return Ok(());
        };
        let _one_at_a_time = self.engine.run_lock.lock().await;
        crate::group::run::leave(member).await
    }

    /// The components whose last run failed, with the cause and how many
    /// runs in a row they have failed, sorted by path: to retry just them
    /// (see [`App::scoped`]), or to report them.
    ///
    /// # Errors
    /// When the ledger cannot be read.
    pub async fn failed_components(&self) -> Result<Vec<FailedComponent>> {
        let ledger = self.engine.ledger.clone();
        let quarantine_after = self.engine.config.quarantine_after;
        self.engine
            .user
            .spawn_blocking(move || {
                let report = ledger.report()?;
                report
                    .failures
                    .into_iter()
                    .map(|(path, cause)| {
                        let key = crate::model::keycode::component_key(path.segments());
                        let failed_runs = ledger.failed_runs(&key)?.max(1);
                        Ok(FailedComponent {
                            path,
                            cause,
                            failed_runs,
                            quarantined: failed_runs >= quarantine_after,
                        })
                    })
                    .collect()
            })
            .await
            .map_err(|e| Error::Shutdown(e.to_string()))?
    }

    pub(crate) async fn execute<F, Fut, T>(
        &self,
        f: F,
        mode: Mode,
        scope: Option<RunScope>,
    ) -> Result<(T, UpdateStats, Vec<PreviewAction>)>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let done = self.execute_inner(f, mode, scope).await?;
        if !done.failures.is_empty() {
            return Err(Error::ComponentsFailed(done.failures));
        }
        let value = done.result?;
        Ok((value, done.stats, done.preview))
    }

    /// Runs an update in apply mode, with failed components collected
    /// rather than returned as an error.
    pub(crate) async fn execute_collecting<F, Fut>(
        &self,
        f: F,
        scope: Option<RunScope>,
    ) -> Result<(UpdateStats, Vec<ComponentFailure>)>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        // The root's own error, if any, is among the failures already.
        let done = self.execute_inner(f, Mode::Apply, scope).await?;
        Ok((done.stats, done.failures))
    }

    /// Runs a preview, with failed components collected rather than
    /// returned as an error.
    pub(crate) async fn preview_collecting<F, Fut>(
        &self,
        f: F,
    ) -> Result<(Vec<PreviewAction>, Vec<ComponentFailure>)>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        let done = self.execute_inner(f, Mode::Preview, None).await?;
        Ok((done.preview, done.failures))
    }

    /// Runs an update as a task of its own. Dropping the returned future (a
    /// timeout, a `select!`) cancels the run: its components' code stops
    /// at once and nothing more of it is committed; sink calls it started
    /// finish, and the next run waits for them and folds their intents in
    /// before it reconciles.
    async fn execute_inner<F, Fut, T>(
        &self,
        f: F,
        mode: Mode,
        scope: Option<RunScope>,
    ) -> Result<Executed<T>>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let run = self
            .engine
            .user
            .spawn(execute_run(Arc::clone(&self.engine), f, mode, scope));
        self.engine.tasks.track(&run);
        match AbortOnDrop(run).await {
            Ok(done) => done,
            // An engine bug's panic goes on as if the run had not been a
            // task of its own (user code's panics are caught per component).
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(Error::Shutdown(format!("the run was cancelled: {e}"))),
        }
    }
}

/// One update, from taking the run lock to its stats.
async fn execute_run<F, Fut, T>(
    engine: Arc<Engine>,
    f: F,
    mode: Mode,
    scope: Option<RunScope>,
) -> Result<Executed<T>>
where
    F: FnOnce(Ctx) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let _one_at_a_time = engine.run_lock.lock().await;
    settle_cancelled_run(&engine).await?;
    let started = Instant::now();
    let group = match &engine.member {
        Some(member) => Some(crate::group::run::before_run(&engine, member).await?),
        None => None,
    };
    let scope = scope_of_run(&engine, scope, group.as_ref());
    let run = Run::new(
        Arc::clone(&engine),
        mode == Mode::Preview,
        mode == Mode::Drop,
        scope,
        group,
    );
    let root = ComponentState::new(Arc::clone(&run), ComponentPath::root());
    root.enter_activity();
    let result = run_component(root, f).await;
    // Components whose mount was dropped are stopping: once they have
    // (and their sink calls ended), their failures are all recorded.
    engine.work.idle().await;
    let cleanup = finish_run(&run).await;
    run.release_sinks();
    for shard in &engine.shards {
        shard.do_send(EndRun { run_id: run.id });
    }
    cleanup?;
    let mut failures = std::mem::take(&mut *lock(&run.failures));
    if let (Some(member), Some(group)) = (&engine.member, &run.group) {
        crate::group::run::after_run(member, group, &failures).await?;
    }
    let quarantined = count_failed_runs(&run, &mut failures).await?;
    Ok(run_outcome(&run, result, failures, quarantined, started))
}

/// What an ended run reports: its value, statistics, preview and
/// failures; its metrics.
fn run_outcome<T>(
    run: &Run,
    result: Result<T>,
    failures: Vec<ComponentFailure>,
    quarantined: u64,
    started: Instant,
) -> Executed<T> {
    let c = &run.counters;
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let stats = UpdateStats {
        created: load(&c.created),
        updated: load(&c.updated),
        deleted: load(&c.deleted),
        unchanged: load(&c.unchanged),
        failed_components: failures.len() as u64,
        elapsed: started.elapsed(),
        components: load(&c.components),
        memoized: load(&c.memoized),
        quarantined,
    };
    let preview = std::mem::take(&mut *lock(&run.preview_actions));
    let outcome = if failures.is_empty() && result.is_ok() {
        "ok"
    } else {
        "failed"
    };
    metrics::counter!(crate::metrics::UPDATE_RUNS, "outcome" => outcome).increment(1);
    metrics::histogram!(crate::metrics::UPDATE_DURATION).record(stats.elapsed.as_secs_f64());
    Executed {
        result,
        stats,
        preview,
        failures,
    }
}

/// Counts one more failed run for each component that failed, and tells
/// each how many runs in a row it has failed; returns how many failed
/// [`AppBuilder::quarantine_after`] runs in a row or more (quarantined),
/// which the quarantine gauge follows.
async fn count_failed_runs(run: &Run, failures: &mut [ComponentFailure]) -> Result<u64> {
    if run.preview {
        return Ok(0);
    }
    let keys: Vec<Vec<u8>> = failures
        .iter()
        .map(|f| crate::model::keycode::component_key(f.path.segments()))
        .collect();
    // A member that does not hold the root partition records nothing of
    // it: the root's holder counts its failures.
    let mut distinct: Vec<Vec<u8>> = keys.iter().filter(|k| run.may_write(k)).cloned().collect();
    distinct.sort();
    distinct.dedup();
    if !distinct.is_empty() {
        let ops = distinct
            .into_iter()
            .map(|component| LedgerOp::CountFailedRun { component })
            .collect();
        run.engine.ledger_handle.commit(ops).await?;
    }
    let limit = run.engine.config.quarantine_after;
    let mut quarantined = 0;
    for (failure, key) in failures.iter_mut().zip(&keys) {
        failure.failed_runs = run.engine.ledger.failed_runs(key)?.max(1);
        if failure.failed_runs >= limit {
            quarantined += 1;
        }
    }
    metrics::gauge!(crate::metrics::COMPONENTS_QUARANTINED).set(quarantined as f64);
    Ok(quarantined)
}

/// The scope of a run: the caller's, within the partitions a member of a
/// worker group holds.
fn scope_of_run(
    engine: &Engine,
    scope: Option<RunScope>,
    group: Option<&crate::group::run::GroupRun>,
) -> Option<RunScope> {
    let held = match (&engine.member, group) {
        (Some(member), Some(group)) => member.scope(&group.holding),
        _ => return scope,
    };
    Some(match scope {
        None => held,
        Some(scope) => RunScope::filter(move |k| held.contains(k) && scope.contains(k)),
    })
}

/// Waits for what a cancelled run left going (its components' aborted
/// tasks, its sink calls), then folds the intents it left into the ledger,
/// so that no run reconciles without them. Nothing to do after a run that
/// ended.
async fn settle_cancelled_run(engine: &Engine) -> Result<()> {
    engine.work.idle().await;
    if engine.ledger.has_leftover_intents() {
        engine.ledger_handle.recover_leftover_intents().await?;
    }
    Ok(())
}

/// A component whose last run failed (see [`App::failed_components`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailedComponent {
    /// Its path.
    pub path: ComponentPath,
    /// Why its last run failed.
    pub cause: String,
    /// How many runs in a row it has failed.
    pub failed_runs: u32,
    /// Whether it has failed [`AppBuilder::quarantine_after`] runs in a
    /// row or more.
    pub quarantined: bool,
}

/// The outcome of one update, before failures are turned into an error.
struct Executed<T> {
    result: Result<T>,
    stats: UpdateStats,
    preview: Vec<PreviewAction>,
    failures: Vec<ComponentFailure>,
}

/// What a run does.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Apply,
    Preview,
    Drop,
}

impl Drop for App {
    fn drop(&mut self) {
        self.engine.stop();
    }
}
