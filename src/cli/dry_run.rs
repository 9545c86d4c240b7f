//! `weir sync --dry-run`: what a sync would do, writing nothing.
//!
//! The preview runs the sync's job with [`weir::App::preview`], which
//! applies nothing and commits nothing. Opening a ledger writes to it all
//! the same (its store's files), so the preview runs on a copy of the
//! ledger in a temporary directory, or on an empty ledger there when there
//! is none yet; the database is opened to be read only (a SQLite file that
//! does not exist is not created). The actions are then told per table.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use weir::connectors::sql::PreviewedTable;
use weir::{ActionKind, App, Error, PreviewAction, Result, StableKey};

use super::sync::{lost_all_tables, Job, Prepared};
use super::target::{self, Target};
use super::{job, SyncArgs, EXIT_INTERRUPTED, EXIT_OK};

/// How many keys of each kind a table's lines show.
const KEYS_SHOWN: usize = 5;

pub async fn run(args: &SyncArgs, prepared: Prepared) -> Result<u8> {
    let Prepared {
        db,
        root,
        options,
        files,
        ..
    } = prepared;
    let ledger = &args.ledger.ledger;
    let scratch = tempfile::Builder::new()
        .prefix("weir-dry-run-")
        .tempdir()
        .map_err(|e| Error::msg(format!("cannot create a temporary directory: {e}")))?;
    let copy = scratch.path().join("ledger");
    if App::ledger_exists(ledger)? {
        copy_ledger(ledger, &copy)?;
    }
    let mut target = target::open_dry(&db, ledger, &copy, &super::job::TABLES).await?;
    if lost_all_tables(&target, ledger).await? {
        println!(
            "note: {} has none of the tables the ledger tracks there (the database was deleted or replaced, or an earlier sync failed to create them): a sync would forget them and sync every file again",
            target.into.display()
        );
        // As after the sync's drop: nothing tracked.
        drop(target);
        let empty = scratch.path().join("empty-ledger");
        target = target::open_dry(&db, ledger, &empty, &super::job::TABLES).await?;
    }
    let job = Job::new(root, options, db, files, target.app.shutdown_handle());
    let previewed = {
        let run = Arc::clone(&job);
        tokio::select! {
            previewed = target.app.preview_report(move |ctx| run.run(ctx)) => previewed?,
            () = signalled() => {
                // The preview's run stops as its future is dropped.
                eprintln!("interrupted: nothing was written");
                return Ok(EXIT_INTERRUPTED);
            }
        }
    };
    print!("{}", report(&job, &target, &previewed.actions));
    for f in &previewed.failures {
        let path = f.path.to_string();
        match path.trim_start_matches('/') {
            "" => eprintln!("would fail: {}", f.cause),
            file => eprintln!("would fail: {file}: {}", f.cause),
        }
    }
    if !previewed.failures.is_empty() {
        eprintln!("a sync would fail on what is listed, and do the rest as shown");
    }
    // The app lets go of the copy before the directory is removed.
    drop(target);
    drop(scratch);
    Ok(EXIT_OK)
}

/// Returns on Ctrl-C or SIGTERM.
async fn signalled() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Copies the ledger at `from` to `to`, holding the ledger's lock meanwhile
/// (as an app holds it while it has the ledger open), so that no sync
/// writes it during the copy; a ledger in use is refused as a sync would
/// refuse it.
fn copy_ledger(from: &Path, to: &Path) -> Result<()> {
    let _lock = hold_lock(from)?;
    copy_dir(from, to).map_err(|e| {
        Error::msg(format!(
            "cannot copy the ledger {} to preview on: {e}",
            from.display()
        ))
    })
}

/// The file an app locks while it has the ledger open.
const LOCK_FILE: &str = "weir.lock";

/// Locks the ledger's lock file, if it has one (it is neither created nor
/// written).
fn hold_lock(ledger: &Path) -> Result<Option<File>> {
    let file = match File::open(ledger.join(LOCK_FILE)) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::LedgerLocked {
            path: ledger.display().to_string(),
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(e.into()),
    }
}

/// Copies the directory `from` (files and directories, but its lock file)
/// to `to`.
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (source, dest) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_dir(&source, &dest)?;
        } else if entry.file_name() != LOCK_FILE {
            std::fs::copy(&source, &dest)?;
        }
    }
    Ok(())
}

/// What would be done to one table.
#[derive(Default)]
struct TablePlan {
    /// What would be done to the table itself.
    table: Option<ActionKind>,
    create: Vec<StableKey>,
    update: Vec<StableKey>,
    delete: Vec<StableKey>,
}

impl TablePlan {
    fn keys(&mut self, kind: ActionKind) -> &mut Vec<StableKey> {
        match kind {
            ActionKind::Create => &mut self.create,
            ActionKind::Update => &mut self.update,
            ActionKind::Delete => &mut self.delete,
        }
    }
}

/// The report of a preview: a header, then per table a line of counts and
/// up to [`KEYS_SHOWN`] keys of each kind of action.
fn report(job: &Job, target: &Target, actions: &[PreviewAction]) -> String {
    let mut tables: BTreeMap<String, TablePlan> = BTreeMap::new();
    // Every table of the job has its line, even with nothing to do.
    for table in job::TABLES {
        tables.entry(table.to_string()).or_default();
    }
    // Actions of no table of the job's (none expected): by provider.
    let mut others: BTreeMap<String, TablePlan> = BTreeMap::new();
    for action in actions {
        match job::previewed_table(&target.into, action) {
            Some(PreviewedTable::Table(table)) => {
                tables.entry(table).or_default().table = Some(action.kind);
            }
            Some(PreviewedTable::Row(table)) => {
                tables
                    .entry(table)
                    .or_default()
                    .keys(action.kind)
                    .push(action.key.clone());
            }
            None => others
                .entry(action.provider.clone())
                .or_default()
                .keys(action.kind)
                .push(action.key.clone()),
        }
    }
    let mut out = format!(
        "dry run of a sync of {} files from {} into {} (nothing written):\n",
        job.files(),
        job.root().display(),
        target.into.display()
    );
    // The job's tables first, in their order; then any other.
    let mut ordered: Vec<(String, TablePlan)> = Vec::new();
    for table in job::TABLES {
        if let Some(plan) = tables.remove(table) {
            ordered.push((table.to_string(), plan));
        }
    }
    ordered.extend(tables);
    ordered.extend(others);
    for (table, plan) in &mut ordered {
        out.push_str(&table_lines(table, plan));
    }
    out
}

/// A table's line of counts, then a line per kind of action with its first
/// keys (sorted).
fn table_lines(table: &str, plan: &mut TablePlan) -> String {
    let container = match plan.table {
        None => "",
        Some(ActionKind::Create) => " (table to create)",
        Some(ActionKind::Update) => " (table to alter)",
        Some(ActionKind::Delete) => " (table to drop)",
    };
    let mut out = format!(
        "{table}: {} to create, {} to update, {} to delete{container}\n",
        plan.create.len(),
        plan.update.len(),
        plan.delete.len()
    );
    for (kind, keys) in [
        ("create", &mut plan.create),
        ("update", &mut plan.update),
        ("delete", &mut plan.delete),
    ] {
        if keys.is_empty() {
            continue;
        }
        keys.sort();
        let shown: Vec<String> = keys
            .iter()
            .take(KEYS_SHOWN)
            .map(|key| job::key_text(table, key))
            .collect();
        out.push_str(&format!("  {kind}: {}", shown.join(", ")));
        if keys.len() > KEYS_SHOWN {
            out.push_str(&format!(" (and {} more)", keys.len() - KEYS_SHOWN));
        }
        out.push('\n');
    }
    out
}
