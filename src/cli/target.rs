//! The database given with `--into`, and the app that writes to it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use weir::connectors::{postgres, sqlite};
use weir::group::WorkerGroup;
use weir::{App, ContextKey, Error, Result};

use super::GroupArg;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::{PgPool, SqlitePool};

/// The context key of the SQLite database. Its name identifies the
/// database in the ledger.
pub static SQLITE: ContextKeyName = ContextKeyName("weir-sqlite");
/// The context key of the PostgreSQL database.
pub static POSTGRES: ContextKeyName = ContextKeyName("weir-postgres");

/// A context key name, turned into typed keys where needed.
pub struct ContextKeyName(&'static str);

impl ContextKeyName {
    pub fn sqlite(&self) -> ContextKey<SqlitePool> {
        ContextKey::new(self.0)
    }
    pub fn postgres(&self) -> ContextKey<PgPool> {
        ContextKey::new(self.0)
    }
}

/// How many files are synced at once.
pub const MAX_INFLIGHT_FILES: usize = 1024;

/// A parsed `--into` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Database {
    /// A SQLite database file.
    Sqlite(PathBuf),
    /// A PostgreSQL connection URL.
    Postgres(String),
}

impl Database {
    /// Parses `sqlite://FILE` (relative to the current directory, or
    /// absolute with `sqlite:///abs/path`) or `postgres://...`.
    pub fn parse(url: &str) -> Result<Database> {
        if let Some(path) = url.strip_prefix("sqlite://") {
            if path.is_empty() {
                return Err(Error::msg(format!(
                    "--into {url}: the SQLite URL names no file; use sqlite://weir.db"
                )));
            }
            return Ok(Database::Sqlite(PathBuf::from(path)));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Database::Postgres(url.to_string()));
        }
        Err(Error::msg(format!(
            "--into {url}: unsupported database URL; use sqlite://FILE (e.g. sqlite://weir.db) or postgres://USER@HOST:PORT/DATABASE"
        )))
    }

    /// The URL without a password, for messages and the ledger marker.
    pub fn display(&self) -> String {
        match self {
            Database::Sqlite(path) => format!("sqlite://{}", path.display()),
            Database::Postgres(url) => redact(url),
        }
    }

    /// What identifies the database in the ledger's marker: the SQLite
    /// file's absolute path (its directory's links resolved), so that the
    /// same file named from another directory is the same database, and
    /// another file is not; the URL without its password for PostgreSQL.
    pub fn identity(&self) -> String {
        match self {
            Database::Sqlite(path) => {
                let absolute = std::path::absolute(path).unwrap_or_else(|_| path.clone());
                let resolved = match (absolute.parent(), absolute.file_name()) {
                    (Some(dir), Some(name)) => std::fs::canonicalize(dir)
                        .map(|dir| dir.join(name))
                        .unwrap_or(absolute.clone()),
                    _ => absolute,
                };
                format!("sqlite://{}", resolved.display())
            }
            Database::Postgres(url) => redact(url),
        }
    }

    /// Files that belong to the database, to keep out of a synced
    /// directory that contains them.
    pub fn files(&self) -> Vec<PathBuf> {
        match self {
            Database::Sqlite(path) => [
                String::new(),
                "-wal".into(),
                "-shm".into(),
                "-journal".into(),
                sqlite::OWNERS_FILE_SUFFIX.into(),
                format!("{}-journal", sqlite::OWNERS_FILE_SUFFIX),
            ]
            .iter()
            .map(|suffix| {
                let mut p = path.clone().into_os_string();
                p.push(suffix);
                PathBuf::from(p)
            })
            .collect(),
            Database::Postgres(_) => Vec::new(),
        }
    }
}

/// `postgres://user:secret@host/db` -> `postgres://user:***@host/db`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((userinfo, host)) = rest.split_once('@') else {
        return url.to_string();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_string(),
    }
}

/// A connected database and an app on the ledger, writing to it.
pub struct Target {
    pub into: Database,
    pub app: App,
    /// The connection pool the app writes with.
    pool: Pool,
    /// The tables the sync creates: [`TABLES`](super::job::TABLES) for a directory.
    tables: Vec<String>,
}

/// A connection pool to either database.
enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// Whether a SQLite table named `?1` exists.
const SQLITE_TABLE_EXISTS: &str =
    "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)";
/// Whether a PostgreSQL table named `$1` exists where an unqualified name
/// finds it (a view or a sequence of that name is not the table).
const POSTGRES_TABLE_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM pg_class \
     WHERE oid = to_regclass(quote_ident($1)) AND relkind IN ('r', 'p'))";

impl Target {
    /// Closes the database's connections. SQLite's write-ahead log is
    /// folded into the database file first, so that after a sync the file
    /// alone holds every row (a copy of it is whole); SQLite removes the
    /// emptied log when its last connection closes.
    pub async fn close(self) {
        match self.pool {
            Pool::Sqlite(pool) => {
                if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                    .execute(&pool)
                    .await
                {
                    tracing::warn!("folding the write-ahead log into {} failed (SQLite does it on its next open): {e}", self.into.display());
                }
                pool.close().await;
            }
            Pool::Postgres(pool) => pool.close().await,
        }
    }

    /// The tables weir creates (see [`TABLES`](super::job::TABLES)) that the database
    /// lacks.
    pub async fn missing_tables(&self) -> Result<Vec<&str>> {
        let mut missing = Vec::new();
        for table in &self.tables {
            let exists: bool = match &self.pool {
                Pool::Sqlite(pool) => {
                    sqlx::query_scalar(SQLITE_TABLE_EXISTS)
                        .bind(table)
                        .fetch_one(pool)
                        .await
                }
                Pool::Postgres(pool) => {
                    sqlx::query_scalar(POSTGRES_TABLE_EXISTS)
                        .bind(table)
                        .fetch_one(pool)
                        .await
                }
            }
            .map_err(|e| {
                Error::msg(format!(
                    "cannot list the tables of {}: {e}",
                    self.into.display()
                ))
            })?;
            if !exists {
                missing.push(table.as_str());
            }
        }
        Ok(missing)
    }

    /// Whether the ledger tracks anything weir created in the database:
    /// the tables first of all (rows are only declared once the tables
    /// are).
    pub async fn tracks_tables(&self) -> Result<bool> {
        Ok(self.app.inspect().await?.target_states > 0)
    }

    /// How many tables the ledger tracks in the database as created: not
    /// counting those it tracks as possibly created (by a sync stopped
    /// while it created them), which the next sync creates if they are
    /// missing.
    pub async fn tracked_tables(&self) -> Result<u64> {
        let provider = match &self.pool {
            Pool::Sqlite(_) => sqlite::tables_provider_name(SQLITE.0),
            Pool::Postgres(_) => postgres::tables_provider_name(POSTGRES.0),
        };
        let report = self.app.inspect().await?;
        let count = |list: &[(String, u64)]| {
            list.iter()
                .find(|(name, _)| *name == provider)
                .map_or(0, |(_, n)| *n)
        };
        Ok(count(&report.providers).saturating_sub(count(&report.maybe_missing)))
    }

    /// Refuses tables another owner manages (another ledger, or a worker
    /// group), before anything runs, unless `adopt` takes them over: the
    /// error names the owner and says how to take them over.
    pub async fn check_owners(&self, adopt: bool) -> Result<()> {
        let ours = self.app.owner()?;
        for table in &self.tables {
            let found = match &self.pool {
                Pool::Sqlite(pool) => sqlite::table_owner(pool, table).await?,
                Pool::Postgres(pool) => postgres::table_owner(pool, table).await?,
            };
            let Some(found) = found.filter(|f| f.key() != ours.key()) else {
                continue;
            };
            if adopt {
                tracing::warn!(
                    "taking table {table} of {} over from {found} (--adopt): rows it wrote for files that are gone now stay, since no ledger knows them (drop the tables and sync again for an exact copy)",
                    self.into.display()
                );
                continue;
            }
            return Err(Error::msg(format!(
                "table {table} of {} is managed by {found}, not by this ledger ({ours}); nothing was changed. Two ledgers writing one table would undo each other's work: sync with the ledger that manages it (--ledger), or into another database. If that ledger is lost for good, run this sync again with --adopt to take the tables over",
                self.into.display()
            )));
        }
        Ok(())
    }
}

/// Connects to the database and opens the ledger (creating both if
/// missing), after checking that the ledger belongs to this database, for
/// a sync that creates the tables `tables`.
pub async fn open_tables(
    into: &Database,
    ledger: &Path,
    group: &GroupArg,
    adopt: bool,
    tables: &[&str],
) -> Result<Target> {
    check_marker(ledger, into)?;
    let pool = match into {
        Database::Sqlite(path) => {
            if let Some(name) = &group.group {
                return Err(Error::msg(format!(
                    "worker group {name}: a group needs a PostgreSQL database (--into postgres://...), which fences each member's writes; {} is a SQLite file, which one process writes",
                    into.display()
                )));
            }
            check_sqlite_dir(path)?;
            Pool::Sqlite(sqlite::connect(path).await?)
        }
        Database::Postgres(url) => Pool::Postgres(connect_postgres(url, false).await?),
    };
    let worker_group = match (&group.group, into) {
        (Some(name), Database::Postgres(url)) => Some(worker_group(name, group, url).await?),
        _ => None,
    };
    let mut target = build(into, ledger, pool, worker_group, adopt).await?;
    target.tables = tables.iter().map(|t| t.to_string()).collect();
    target.check_owners(adopt).await?;
    write_marker(ledger, into)?;
    Ok(target)
}

/// Opens the database to read it only, and an app on `scratch` (a copy of
/// the ledger at `ledger`, or an empty ledger), for a dry run: nothing is
/// created or written in the database or at `ledger`. A SQLite file that
/// does not exist is not created: the app gets an empty database in
/// memory in its place (it has none of the tables, as the file would).
/// PostgreSQL connections are read-only.
pub async fn open_dry(
    into: &Database,
    ledger: &Path,
    scratch: &Path,
    tables: &[&str],
) -> Result<Target> {
    check_marker(ledger, into)?;
    let pool = match into {
        Database::Sqlite(path) => {
            check_sqlite_dir(path)?;
            let pool = if path.exists() {
                sqlite::connect_read_only(path).await?
            } else {
                SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect_with(SqliteConnectOptions::new().in_memory(true))
                    .await
                    .map_err(|e| {
                        Error::msg(format!(
                            "cannot open an empty SQLite database in memory: {e}"
                        ))
                    })?
            };
            Pool::Sqlite(pool)
        }
        Database::Postgres(url) => Pool::Postgres(connect_postgres(url, true).await?),
    };
    let mut target = build(into, scratch, pool, None, false).await?;
    target.tables = tables.iter().map(|t| t.to_string()).collect();
    Ok(target)
}

/// Connections of a member's coordinator: heartbeats and lease changes
/// run on their own, never behind the member's writers.
const COORDINATOR_CONNECTIONS: u32 = 2;

/// The coordinator of worker groups in the database at `url`, on a pool
/// of its own (and the pool, for the group's tables).
pub async fn coordinator(url: &str) -> Result<postgres::PostgresCoordinator> {
    Ok(postgres::PostgresCoordinator::new(
        coordinator_pool(url).await?,
    ))
}

/// A pool of [`COORDINATOR_CONNECTIONS`] connections to `url`, named
/// `weir-coordinator` in PostgreSQL.
pub async fn coordinator_pool(url: &str) -> Result<PgPool> {
    let options: PgConnectOptions = url.parse().map_err(|e| pg_error(url, &e))?;
    let options = options.application_name("weir-coordinator");
    PgPoolOptions::new()
        .max_connections(COORDINATOR_CONNECTIONS)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .map_err(|e| pg_error(url, &e))
}

/// The membership of the worker group `name`, coordinated in the database
/// at `url` on a pool of its own.
async fn worker_group(name: &str, group: &GroupArg, url: &str) -> Result<WorkerGroup> {
    let coordinator = Arc::new(coordinator(url).await?);
    let mut membership = WorkerGroup::new(name, coordinator);
    if let Some(n) = group.partitions {
        membership = membership.partitions(n);
    }
    if let Some(ttl) = group.lease_ttl {
        membership = membership.lease_ttl(ttl);
    }
    if let Some(id) = &group.member_id {
        membership = membership.member_id(id.clone());
    }
    Ok(membership)
}

/// A SQLite file can only be created in a directory that exists.
fn check_sqlite_dir(path: &Path) -> Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.is_dir() {
            return Err(Error::msg(format!(
                "cannot create the SQLite database {}: the directory {} does not exist",
                path.display(),
                parent.display()
            )));
        }
    }
    Ok(())
}

/// A pool of connections to PostgreSQL at `url`; with `read_only`, every
/// transaction of its connections is read-only.
async fn connect_postgres(url: &str, read_only: bool) -> Result<PgPool> {
    let mut options: PgConnectOptions = url.parse().map_err(|e| pg_error(url, &e))?;
    if read_only {
        options = options.options([("default_transaction_read_only", "on")]);
    }
    // One plain connection first: a wrong host or port fails at once,
    // where the pool would retry until its timeout.
    let probe = <sqlx::PgConnection as sqlx::Connection>::connect_with(&options)
        .await
        .map_err(|e| pg_error(url, &e))?;
    let _ = sqlx::Connection::close(probe).await;
    PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .map_err(|e| pg_error(url, &e))
}

/// The app on the ledger at `ledger`, given the database's pool.
async fn build(
    into: &Database,
    ledger: &Path,
    pool: Pool,
    group: Option<WorkerGroup>,
    adopt: bool,
) -> Result<Target> {
    // A file's rows stay in memory until its component commits: fewer
    // files in flight than the engine's default bound the memory a tree of
    // large text files can take (1024 × 2 × MAX_CONTENT_BYTES at most).
    let builder = App::builder("weir")
        .ledger_path(ledger)
        .max_inflight_components(MAX_INFLIGHT_FILES)
        .adopt_tables(adopt);
    let builder = match &pool {
        Pool::Sqlite(pool) => builder.provide_key(&SQLITE.sqlite(), pool.clone()),
        Pool::Postgres(pool) => builder.provide_key(&POSTGRES.postgres(), pool.clone()),
    };
    let builder = match group {
        Some(group) => builder.worker_group(group),
        None => builder,
    };
    let app = builder.build().await?;
    Ok(Target {
        into: into.clone(),
        app,
        pool,
        tables: Vec::new(),
    })
}

fn pg_error(url: &str, e: &sqlx::Error) -> Error {
    Error::msg(format!(
        "cannot connect to PostgreSQL at {}: {e}; check the URL, that the server runs, and that the user may log in",
        redact(url)
    ))
}

/// The file in the ledger directory that names the database it tracks.
fn marker(ledger: &Path) -> PathBuf {
    ledger.join("weir-target")
}

/// The database a ledger tracks, if it tracks one.
pub fn tracked_database(ledger: &Path) -> Option<String> {
    std::fs::read_to_string(marker(ledger))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// A ledger remembers what weir created in one database: refuse to use it
/// with another, which would lose track of both.
fn check_marker(ledger: &Path, into: &Database) -> Result<()> {
    let Some(tracked) = tracked_database(ledger) else {
        return Ok(());
    };
    // A marker is written as an identity; one naming a relative SQLite
    // path (as early builds wrote it) is read relative to here.
    let tracked = Database::parse(&tracked).map_or(tracked, |db| db.identity());
    if tracked == into.identity() {
        return Ok(());
    }
    Err(Error::msg(format!(
        "the ledger {} tracks what weir created in {tracked}, not in {}; pass --into {tracked}, pick another ledger with --ledger, or run `weir drop --ledger {} --into {tracked}` first",
        ledger.display(),
        into.identity(),
        ledger.display(),
    )))
}

fn write_marker(ledger: &Path, into: &Database) -> Result<()> {
    std::fs::write(marker(ledger), format!("{}\n", into.identity()))?;
    Ok(())
}

/// Forgets which database the ledger tracks (after a drop).
pub fn clear_marker(ledger: &Path) -> Result<()> {
    match std::fs::remove_file(marker(ledger)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_and_postgres_urls_parse_and_others_are_refused_with_a_hint() {
        assert_eq!(
            Database::parse("sqlite://weir.db").ok(),
            Some(Database::Sqlite(PathBuf::from("weir.db")))
        );
        assert_eq!(
            Database::parse("sqlite:///tmp/x.db").ok(),
            Some(Database::Sqlite(PathBuf::from("/tmp/x.db")))
        );
        assert!(matches!(
            Database::parse("postgres://u@h/db"),
            Ok(Database::Postgres(_))
        ));
        let err = Database::parse("mysql://x")
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("sqlite://"), "{err}");
        assert!(Database::parse("sqlite://").is_err());
    }

    #[test]
    fn passwords_never_show_in_messages() {
        assert_eq!(
            Database::Postgres("postgres://me:hunter2@db:5432/x".into()).display(),
            "postgres://me:***@db:5432/x"
        );
        assert_eq!(
            Database::Postgres("postgres://me@db/x".into()).display(),
            "postgres://me@db/x"
        );
    }
}
