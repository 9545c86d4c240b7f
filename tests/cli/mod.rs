//! What the end-to-end tests of the `weir` command share (`mod cli;`, which
//! needs `mod cmd;` and `mod pg;` beside it): a tree, a database and a
//! ledger in a temporary directory to run the command on, a fresh
//! PostgreSQL database, the `documents` and `chunks` tables read back, the
//! checks of a run's output, and waiting on a live sync; `group` has what
//! the tests of worker groups share.

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::collections::BTreeMap;
use std::error::Error;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Output};
use std::time::{Duration, Instant, SystemTime};

use sqlx::{PgPool, SqlitePool};
use weir::Fingerprint;

use crate::cmd::{self, text};
use crate::pg;

pub mod group;
pub mod nobody;

/// What a test returns: an `Err` fails it.
pub type TestResult = Result<(), Box<dyn Error>>;

// ------------------------------------------------------------ the output

/// Asserts exit code 0, showing the output otherwise; returns stdout.
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "weir failed ({:?}):\nstdout: {}\nstderr: {}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Asserts the exit code, showing the output otherwise; returns stderr.
pub fn exits(out: &Output, code: i32) -> String {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stderr)
}

/// Asserts that `stderr` shows no panic and no backtrace hint.
pub fn no_backtrace(stderr: &str) {
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "{stderr}"
    );
}

// ---------------------------------------------------------------- files

/// Sets the permission bits of `path` to `mode`.
pub fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
}

// ------------------------------------------------------ the command line

/// `sqlite://DB`, the `--into` of the SQLite file `db`.
pub fn sqlite_url(db: &Path) -> String {
    format!("sqlite://{}", db.display())
}

/// The arguments of `weir sync TREE --into INTO --ledger LEDGER extra...`.
pub fn sync_args<'a>(
    tree: &'a Path,
    into: &'a str,
    ledger: &'a Path,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![
        "sync",
        tree.to_str().unwrap(),
        "--into",
        into,
        "--ledger",
        ledger.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    args
}

/// A tree, a database and a ledger in one temporary directory.
pub struct Env {
    /// The temporary directory, where `weir` runs.
    pub tmp: tempfile::TempDir,
    /// The synced tree, `tree/` in `tmp`.
    pub tree: PathBuf,
    /// The SQLite database, `out.db` in `tmp` (not created).
    pub db: PathBuf,
    /// The ledger, `ledger` in `tmp` (not created).
    pub ledger: PathBuf,
}

impl Env {
    /// A new temporary directory holding an empty tree.
    pub fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let tree = tmp.path().join("tree");
        std::fs::create_dir_all(&tree).unwrap();
        Env {
            db: tmp.path().join("out.db"),
            ledger: tmp.path().join("ledger"),
            tree,
            tmp,
        }
    }

    /// The path of `rel` under the tree.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.tree.join(rel)
    }

    /// Writes `content` at `rel` under the tree, creating directories.
    pub fn put(&self, rel: &str, content: impl AsRef<[u8]>) {
        let path = self.path(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(path, content).unwrap();
    }

    /// The `--into` of the SQLite database.
    pub fn url_arg(&self) -> String {
        sqlite_url(&self.db)
    }

    /// Runs `weir args...` from the temporary directory.
    pub fn weir(&self, args: &[&str]) -> Output {
        cmd::run(self.tmp.path(), args, None)
    }

    /// `weir sync TREE --into sqlite://DB --ledger LEDGER extra...`, from
    /// the temporary directory.
    pub fn sync(&self, extra: &[&str]) -> Output {
        self.sync_into(&self.url_arg(), extra)
    }

    /// `weir sync TREE --into INTO --ledger LEDGER extra...`, from the
    /// temporary directory.
    pub fn sync_into(&self, into: &str, extra: &[&str]) -> Output {
        self.weir(&sync_args(&self.tree, into, &self.ledger, extra))
    }

    /// `weir drop --into sqlite://DB --ledger LEDGER extra...`, from the
    /// temporary directory.
    pub fn drop_tables(&self, extra: &[&str]) -> Output {
        self.drop_tables_in(&self.url_arg(), extra)
    }

    /// `weir drop --into INTO --ledger LEDGER extra...`, from the temporary
    /// directory.
    pub fn drop_tables_in(&self, into: &str, extra: &[&str]) -> Output {
        let mut args = vec![
            "drop",
            "--into",
            into,
            "--ledger",
            self.ledger.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        self.weir(&args)
    }

    /// Starts `weir sync TREE --into sqlite://DB --ledger LEDGER extra...`
    /// from the temporary directory.
    pub fn spawn_sync(&self, extra: &[&str]) -> Child {
        let into = self.url_arg();
        let args = sync_args(&self.tree, &into, &self.ledger, extra);
        cmd::spawn(self.tmp.path(), &args, None)
    }

    /// Starts `weir sync TREE --into sqlite://DB --ledger LEDGER --live
    /// --debounce-ms DEBOUNCE_MS extra...` from the temporary directory.
    pub fn spawn_live(&self, debounce_ms: u64, extra: &[&str]) -> Child {
        let debounce = debounce_ms.to_string();
        let mut live = vec!["--live", "--debounce-ms", &debounce];
        live.extend_from_slice(extra);
        self.spawn_sync(&live)
    }

    /// `weir sync SOURCE --into INTO --ledger LEDGER extra...`, for a
    /// source that is not the tree (a table or a stream's URL).
    pub fn sync_source(&self, source: &str, into: &str, extra: &[&str]) -> Output {
        self.weir(&self.source_args(source, into, extra))
    }

    /// Starts `weir sync SOURCE --into INTO --ledger LEDGER extra...`.
    pub fn spawn_source(&self, source: &str, into: &str, extra: &[&str]) -> Child {
        let args = self.source_args(source, into, extra);
        cmd::spawn(self.tmp.path(), &args, None)
    }

    fn source_args<'a>(
        &'a self,
        source: &'a str,
        into: &'a str,
        extra: &[&'a str],
    ) -> Vec<&'a str> {
        let mut args = vec![
            "sync",
            source,
            "--into",
            into,
            "--ledger",
            self.ledger.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        args
    }

    /// `weir inspect --ledger LEDGER`.
    pub fn inspect(&self) -> Output {
        self.weir(&["inspect", "--ledger", self.ledger.to_str().unwrap()])
    }

    /// What `documents` must hold for the files `keys` of the tree.
    pub fn expected(&self, keys: &[&str]) -> BTreeMap<String, Doc> {
        keys.iter()
            .map(|k| (k.to_string(), doc_of(&std::fs::read(self.path(k)).unwrap())))
            .collect()
    }

    /// A pool on the SQLite database.
    pub async fn pool(&self) -> SqlitePool {
        sqlite_pool(&self.db).await
    }

    /// The SQLite database's `documents` table.
    pub async fn docs(&self) -> BTreeMap<String, Doc> {
        read_documents(&self.db).await
    }

    /// The SQLite database's `chunks` table (see [`chunks_by_path`]).
    pub async fn chunks(&self) -> BTreeMap<String, Vec<(i64, String)>> {
        let pool = self.pool().await;
        let chunks = chunks_sqlite(&pool).await;
        pool.close().await;
        chunks
    }

    /// The names of the SQLite database's tables.
    pub async fn tables(&self) -> Vec<String> {
        let pool = self.pool().await;
        let tables = sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table'")
            .fetch_all(&pool)
            .await
            .unwrap();
        pool.close().await;
        tables
    }

    /// The `modified` column of the document `key`.
    pub async fn modified(&self, key: &str) -> Option<String> {
        let pool = self.pool().await;
        let m: Option<String> = sqlx::query_scalar("SELECT modified FROM documents WHERE path = ?")
            .bind(key)
            .fetch_one(&pool)
            .await
            .unwrap();
        pool.close().await;
        m
    }
}

// ------------------------------------------------------------ the tables

/// A `documents` row (without its modification time).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Doc {
    /// The file's size in bytes.
    pub size: i64,
    /// The fingerprint of the file's bytes.
    pub fingerprint: String,
    /// The number of lines of a text file.
    pub line_count: Option<i64>,
    /// The text of a text file.
    pub content: Option<String>,
}

/// What `documents` must hold for a file of `bytes`: no content nor line
/// count unless they are UTF-8 text without a NUL byte.
pub fn doc_of(bytes: &[u8]) -> Doc {
    let content = std::str::from_utf8(bytes)
        .ok()
        .filter(|t| !t.contains('\0'))
        .map(str::to_string);
    Doc {
        size: bytes.len() as i64,
        fingerprint: Fingerprint::from_bytes(bytes).to_string(),
        line_count: content.as_ref().map(|c| c.lines().count() as i64),
        content,
    }
}

/// Reads `documents` (as [`DocRow`]s) in either database.
const SELECT_DOCUMENTS: &str = "SELECT path, size, fingerprint, line_count, content FROM documents";

/// Reads `chunks`: path, index and text.
const SELECT_CHUNKS: &str = "SELECT path, chunk_index, text FROM chunks";

/// A `documents` row as [`SELECT_DOCUMENTS`] reads it.
type DocRow = (String, i64, String, Option<i64>, Option<String>);

/// `documents` rows by path.
fn docs_by_path(rows: Vec<DocRow>) -> BTreeMap<String, Doc> {
    rows.into_iter()
        .map(|(path, size, fingerprint, line_count, content)| {
            let doc = Doc {
                size,
                fingerprint,
                line_count,
                content,
            };
            (path, doc)
        })
        .collect()
}

/// `chunks` rows grouped by path, in index order.
pub fn chunks_by_path(rows: Vec<(String, i64, String)>) -> BTreeMap<String, Vec<(i64, String)>> {
    let mut out: BTreeMap<String, Vec<(i64, String)>> = BTreeMap::new();
    for (path, index, text) in rows {
        out.entry(path).or_default().push((index, text));
    }
    for chunks in out.values_mut() {
        chunks.sort();
    }
    out
}

/// A pool of one connection on the SQLite file `db`.
pub async fn sqlite_pool(db: &Path) -> SqlitePool {
    sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(sqlx::sqlite::SqliteConnectOptions::new().filename(db))
        .await
        .unwrap()
}

/// The `documents` table of a SQLite database.
pub async fn documents_sqlite(pool: &SqlitePool) -> BTreeMap<String, Doc> {
    let rows = sqlx::query_as(SELECT_DOCUMENTS)
        .fetch_all(pool)
        .await
        .unwrap();
    docs_by_path(rows)
}

/// The `documents` table of the SQLite file `db`, read on a pool of its
/// own.
pub async fn read_documents(db: &Path) -> BTreeMap<String, Doc> {
    let pool = sqlite_pool(db).await;
    let docs = documents_sqlite(&pool).await;
    pool.close().await;
    docs
}

/// The `chunks` table of a SQLite database (see [`chunks_by_path`]).
pub async fn chunks_sqlite(pool: &SqlitePool) -> BTreeMap<String, Vec<(i64, String)>> {
    let rows = sqlx::query_as(SELECT_CHUNKS).fetch_all(pool).await.unwrap();
    chunks_by_path(rows)
}

/// The count of documents in the SQLite file `db`, or `None` when the file
/// or the table is not there yet.
pub async fn doc_count(db: &Path) -> Option<i64> {
    if !db.exists() {
        return None;
    }
    let pool = sqlite_pool(db).await;
    let n = sqlx::query_scalar("SELECT count(*) FROM documents")
        .fetch_one(&pool)
        .await
        .ok();
    pool.close().await;
    n
}

// ------------------------------------------------------------ PostgreSQL

/// A fresh PostgreSQL database for one test (see [`PgDatabase::around`]).
pub struct PgDatabase {
    /// A pool on the server's own database, which creates and drops it.
    admin: PgPool,
    /// The database's name.
    name: String,
    /// The database's URL, the `--into` of the tests.
    pub url: String,
}

impl PgDatabase {
    /// Creates the database `weir_{test}_{process id}_{nanoseconds}`;
    /// `None` (after a loud message) when there is no server and `CI` is
    /// not `true` (see `pg::server`).
    async fn create(test: &str) -> Result<Option<PgDatabase>, Box<dyn Error>> {
        let Some((base, admin)) = pg::server(2).await? else {
            return Ok(None);
        };
        let name = format!(
            "weir_{test}_{}_{}",
            std::process::id(),
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)?
                .subsec_nanos()
        );
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&admin)
            .await?;
        let (prefix, _) = base.rsplit_once('/').ok_or("a database URL has a path")?;
        let url = format!("{prefix}/{name}");
        Ok(Some(PgDatabase { admin, name, url }))
    }

    /// Runs `body` on a fresh database named after `test` (see
    /// [`PgDatabase::create`]), then drops the database whatever `body`
    /// returned: `body`'s outcome, or `Ok` at once when there is no server
    /// and `CI` is not `true`.
    pub async fn around(
        test: &str,
        body: impl AsyncFnOnce(&PgDatabase) -> TestResult,
    ) -> TestResult {
        let Some(pg) = PgDatabase::create(test).await? else {
            return Ok(());
        };
        let outcome = body(&pg).await;
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", pg.name))
            .execute(&pg.admin)
            .await;
        outcome
    }

    /// A pool of one connection on the database.
    pub async fn pool(&self) -> PgPool {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&self.url)
            .await
            .unwrap()
    }

    /// The `documents` table.
    pub async fn docs(&self) -> BTreeMap<String, Doc> {
        let pool = self.pool().await;
        let rows = sqlx::query_as(SELECT_DOCUMENTS)
            .fetch_all(&pool)
            .await
            .unwrap();
        pool.close().await;
        docs_by_path(rows)
    }

    /// The `chunks` table (see [`chunks_by_path`]).
    pub async fn chunks(&self) -> BTreeMap<String, Vec<(i64, String)>> {
        let pool = self.pool().await;
        let rows: Vec<(String, i32, String)> = sqlx::query_as(SELECT_CHUNKS)
            .fetch_all(&pool)
            .await
            .unwrap();
        pool.close().await;
        chunks_by_path(
            rows.into_iter()
                .map(|(p, i, t)| (p, i64::from(i), t))
                .collect(),
        )
    }

    /// The names of the tables in the `public` schema, sorted.
    pub async fn tables(&self) -> Vec<String> {
        let pool = self.pool().await;
        let tables = sqlx::query_scalar(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        pool.close().await;
        tables
    }
}

// ------------------------------------------------------------- waiting

/// Polls `check` every 50 ms until it is true or `limit` passes: how long
/// it took, or `None`.
pub async fn within<F, Fut>(limit: Duration, mut check: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if check().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Waits up to 60 s (a live sync's first run) for the SQLite file `db` to
/// hold `n` documents: whether it did.
pub async fn wait_for_documents(db: &Path, n: i64) -> bool {
    within(Duration::from_secs(60), || async {
        doc_count(db).await == Some(n)
    })
    .await
    .is_some()
}

/// Awaits `body` while the live sync `live` runs, then stops `live` with
/// SIGTERM, waiting up to 30 s: its exit status (`None` if it had to be
/// killed) and its stderr, or `body`'s error once `live` has stopped.
pub async fn while_live(
    mut live: Child,
    body: impl Future<Output = TestResult>,
) -> Result<(Option<ExitStatus>, String), Box<dyn Error>> {
    let outcome = body.await;
    let stopped = cmd::terminate(&mut live, Duration::from_secs(30));
    outcome?;
    Ok(stopped)
}

/// Polls `f` every 20 ms until it holds; whether it did within `limit`.
pub async fn wait_until<F, Fut>(limit: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = Instant::now() + limit;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
