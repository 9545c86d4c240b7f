//! End-to-end tests of `weir sync --dry-run`: it prints what a sync would
//! do, per table, and writes nothing: no database file, table or row, no
//! ledger, not a byte of an existing one.

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli;
mod cmd;
mod pg;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use cli::{exits, no_backtrace, ok, Env, PgDatabase, TestResult};
use cmd::text;

/// A paragraph of `bytes` bytes of `letter`: three of them, blank lines
/// between, make three chunks (a chunk holds at most 2000 bytes).
fn paragraph(letter: char, bytes: usize) -> String {
    std::iter::repeat_n(letter, bytes).collect()
}

/// Paragraphs separated by blank lines.
fn paragraphs(parts: &[&str]) -> String {
    parts.join("\n\n") + "\n"
}

/// `weir sync --dry-run` of the env's tree into `into`.
fn dry_run_into(env: &Env, into: &str, extra: &[&str]) -> Output {
    let mut args = vec!["--dry-run"];
    args.extend_from_slice(extra);
    env.sync_into(into, &args)
}

/// `weir sync --dry-run` of the env's tree into its SQLite file.
fn dry_run(env: &Env, extra: &[&str]) -> Output {
    dry_run_into(env, &env.url_arg(), extra)
}

/// The report's lines after its header, which must name the tree.
fn report(out: &Output) -> Vec<String> {
    let stdout = ok(out);
    let mut lines = stdout.lines();
    let header = lines.next().unwrap_or_default();
    assert!(
        header.starts_with("dry run of a sync of ") && header.ends_with("(nothing written):"),
        "{stdout}"
    );
    lines.map(str::to_string).collect()
}

/// Every file under `dir`, with its bytes.
fn files_under(dir: &Path, into: &mut BTreeMap<PathBuf, Option<Vec<u8>>>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, into);
        } else {
            into.insert(path.clone(), Some(std::fs::read(&path).unwrap()));
        }
    }
}

/// What a dry run must leave as it is: the names in the temporary
/// directory, every file of the ledger with its bytes, and the database's
/// files (the database and its write-ahead log with their bytes; the
/// shared-memory index, which only coordinates connections, by its
/// presence).
fn snapshot(env: &Env) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    wait_for_readers_to_close(env);
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(env.tmp.path()).unwrap() {
        files.insert(entry.unwrap().path(), None);
    }
    files_under(&env.ledger, &mut files);
    for suffix in ["", "-wal", "-journal"] {
        let mut path = env.db.clone().into_os_string();
        path.push(suffix);
        let path = PathBuf::from(path);
        if let Ok(bytes) = std::fs::read(&path) {
            files.insert(path, Some(bytes));
        }
    }
    files
}

/// Waits (up to 10 s) until the test's own readers of the database have
/// closed: SQLite removes the `-wal` and `-shm` files when its last
/// connection closes, which can happen on the connection's thread a little
/// after the pool reports it closed.
fn wait_for_readers_to_close(env: &Env) {
    let mut shm = env.db.clone().into_os_string();
    shm.push("-shm");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while PathBuf::from(&shm).exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Asserts that `now` equals `before`, naming the files that differ.
#[track_caller]
fn assert_unchanged(
    before: &BTreeMap<PathBuf, Option<Vec<u8>>>,
    now: &BTreeMap<PathBuf, Option<Vec<u8>>>,
) {
    let differ: std::collections::BTreeSet<&PathBuf> = before
        .keys()
        .chain(now.keys())
        .filter(|path| before.get(*path) != now.get(*path))
        .collect();
    let presence: Vec<String> = differ
        .iter()
        .map(|path| {
            let state = |files: &BTreeMap<PathBuf, Option<Vec<u8>>>| match files.get(*path) {
                None => "absent".to_string(),
                Some(None) => "present".to_string(),
                Some(Some(bytes)) => format!("{} bytes", bytes.len()),
            };
            format!(
                "{}: {} before, {} after",
                path.display(),
                state(before),
                state(now)
            )
        })
        .collect();
    assert!(
        differ.is_empty(),
        "changed, created or removed: {presence:?}"
    );
}

#[test]
fn a_first_dry_run_lists_every_file_to_create_and_creates_no_database_and_no_ledger() -> TestResult
{
    let env = Env::new();
    for name in ["a", "b", "c", "d", "e", "f", "g"] {
        env.put(&format!("docs/{name}.md"), format!("{name}\n"));
    }
    env.put(
        "big.md",
        paragraphs(&[&paragraph('x', 1500), &paragraph('y', 1500)]),
    );
    let before = snapshot(&env);

    let out = dry_run(&env, &[]);
    assert_eq!(
        report(&out),
        [
            "documents: 8 to create, 0 to update, 0 to delete (table to create)",
            "  create: big.md, docs/a.md, docs/b.md, docs/c.md, docs/d.md (and 3 more)",
            "chunks: 9 to create, 0 to update, 0 to delete (table to create)",
            "  create: big.md#0, big.md#1, docs/a.md#0, docs/b.md#0, docs/c.md#0 (and 4 more)",
        ]
    );
    assert!(ok(&out).starts_with("dry run of a sync of 8 files from "));
    assert!(!env.db.exists(), "the database file was created");
    assert!(!env.ledger.exists(), "the ledger was created");
    assert_unchanged(&before, &snapshot(&env));

    // The default database and ledger are not created either.
    let out = env.weir(&["sync", "--dry-run", "tree"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!env.tmp.path().join("weir.db").exists());
    assert!(!env.tmp.path().join(".weir").exists());
    assert_unchanged(&before, &snapshot(&env));
    Ok(())
}

#[test]
fn after_a_sync_a_dry_run_says_zero_for_every_table_and_changes_no_byte() -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    env.put(
        "sub/b.md",
        paragraphs(&[&paragraph('x', 1500), &paragraph('y', 1500)]),
    );
    ok(&env.sync(&[]));
    let before = snapshot(&env);

    let out = dry_run(&env, &[]);
    assert_eq!(
        report(&out),
        [
            "documents: 0 to create, 0 to update, 0 to delete",
            "chunks: 0 to create, 0 to update, 0 to delete",
        ]
    );
    assert_unchanged(&before, &snapshot(&env));
    // The sync it foretold does nothing either.
    assert!(ok(&env.sync(&[])).contains("2 unchanged files skipped"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_lists_an_edited_a_deleted_and_an_added_file_and_their_chunks_and_writes_nothing(
) -> TestResult {
    let env = Env::new();
    let (p0, p1, p2) = (
        paragraph('a', 1500),
        paragraph('b', 1500),
        paragraph('c', 1500),
    );
    env.put("big.md", paragraphs(&[&p0, &p1, &p2]));
    env.put("grow.md", paragraphs(&[&p0]));
    env.put("gone.md", "going\n");
    env.put("same.md", "same\n");
    ok(&env.sync(&[]));
    let docs = env.docs().await;
    let chunks = env.chunks().await;

    // big.md: its first chunk changes, its second stays, its third goes;
    // grow.md gains a chunk; gone.md is deleted; new.md is added.
    env.put("big.md", paragraphs(&[&paragraph('z', 1500), &p1]));
    env.put("grow.md", paragraphs(&[&p0, &p2]));
    std::fs::remove_file(env.path("gone.md"))?;
    env.put("new.md", "new\n");
    let before = snapshot(&env);

    let out = dry_run(&env, &[]);
    assert_eq!(
        report(&out),
        [
            "documents: 1 to create, 2 to update, 1 to delete",
            "  create: new.md",
            "  update: big.md, grow.md",
            "  delete: gone.md",
            "chunks: 2 to create, 1 to update, 2 to delete",
            "  create: grow.md#1, new.md#0",
            "  update: big.md#0",
            "  delete: big.md#2, gone.md#0",
        ]
    );
    assert!(ok(&out).starts_with("dry run of a sync of 4 files from "));
    assert_unchanged(&before, &snapshot(&env));
    assert_eq!(env.docs().await, docs);
    assert_eq!(env.chunks().await, chunks);

    // The sync does what the dry run said.
    let synced = ok(&env.sync(&[]));
    assert!(
        synced.contains(
            "1 unchanged files skipped; tables and rows: 3 created, 3 updated, 3 deleted"
        ),
        "{synced}"
    );
    let out = dry_run(&env, &[]);
    assert_eq!(
        report(&out),
        [
            "documents: 0 to create, 0 to update, 0 to delete",
            "chunks: 0 to create, 0 to update, 0 to delete",
        ]
    );
    Ok(())
}

#[test]
fn a_dry_run_selects_files_with_include_exclude_and_gitignore_as_a_sync_does() -> TestResult {
    let env = Env::new();
    env.put(".gitignore", "*.log\n");
    env.put("a.md", "a\n");
    env.put("b.txt", "b\n");
    env.put("c.log", "c\n");
    env.put("skip/d.md", "d\n");
    let documents = |extra: &[&str]| report(&dry_run(&env, extra))[..2].join("\n");

    assert_eq!(
        documents(&["--include", "**/*.md", "--exclude", "skip/**"]),
        "documents: 1 to create, 0 to update, 0 to delete (table to create)\n  create: a.md"
    );
    assert_eq!(
        documents(&["--exclude", "**/*.md"]),
        "documents: 2 to create, 0 to update, 0 to delete (table to create)\n  create: .gitignore, b.txt"
    );
    assert_eq!(
        documents(&["--exclude", "**/*.md", "--no-gitignore"]),
        "documents: 3 to create, 0 to update, 0 to delete (table to create)\n  create: .gitignore, b.txt, c.log"
    );

    // After a sync of everything, a narrower selection deletes the rest.
    ok(&env.sync(&[]));
    assert_eq!(
        documents(&["--include", "a.md"]),
        "documents: 0 to create, 0 to update, 3 to delete\n  delete: .gitignore, b.txt, skip/d.md"
    );
    Ok(())
}

#[test]
fn after_the_database_was_deleted_a_dry_run_lists_the_tables_and_every_file_to_create_again(
) -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    env.put("b.md", "b\n");
    ok(&env.sync(&[]));
    for suffix in ["", "-wal", "-shm"] {
        let mut file = env.db.clone().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(file));
    }
    let before = snapshot(&env);

    let out = dry_run(&env, &[]);
    let stdout = ok(&out);
    assert!(
        stdout.starts_with("note: ") && stdout.contains("sync every file again"),
        "{stdout}"
    );
    let lines: Vec<&str> = stdout.lines().skip(2).collect();
    assert_eq!(
        lines,
        [
            "documents: 2 to create, 0 to update, 0 to delete (table to create)",
            "  create: a.md, b.md",
            "chunks: 2 to create, 0 to update, 0 to delete (table to create)",
            "  create: a.md#0, b.md#0",
        ]
    );
    assert!(!env.db.exists());
    assert_unchanged(&before, &snapshot(&env));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_dropped_by_hand_is_refused_by_a_dry_run_as_by_a_sync_and_left_as_it_is(
) -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    ok(&env.sync(&[]));
    let pool = env.pool().await;
    sqlx::query("DROP TABLE chunks").execute(&pool).await?;
    pool.close().await;
    let before = snapshot(&env);

    let stderr = exits(&dry_run(&env, &[]), 2);
    assert!(stderr.contains("has no chunks table any more"), "{stderr}");
    assert!(stderr.contains("weir drop --yes --into"), "{stderr}");
    assert_unchanged(&before, &snapshot(&env));
    assert_eq!(env.tables().await, ["documents"]);
    Ok(())
}

#[test]
fn a_file_that_cannot_be_read_is_listed_beside_what_the_others_would_do_and_the_dry_run_exits_0(
) -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    // A link to nothing cannot be read, even by root.
    std::os::unix::fs::symlink("missing-target", env.path("broken.md"))?;
    let out = dry_run(&env, &[]);
    let stderr = exits(&out, 0);
    assert!(stderr.contains("would fail: broken.md"), "{stderr}");
    let lines = report(&out);
    assert!(
        lines.iter().any(|l| l == "  create: a.md"),
        "the readable file is listed: {lines:?}"
    );
    no_backtrace(&stderr);
    assert!(!env.db.exists());
    assert!(!env.ledger.exists());
    Ok(())
}

#[test]
fn dry_run_is_one_shot_so_live_and_metrics_are_refused_with_it() -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    for extra in [["--live"], ["--metrics"]] {
        let stderr = exits(&dry_run(&env, &extra), 2);
        assert!(
            stderr.contains("--dry-run") && stderr.contains("cannot be used with"),
            "{stderr}"
        );
        no_backtrace(&stderr);
    }
    assert!(!env.db.exists());
    assert!(!env.ledger.exists());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_in_use_by_a_live_sync_is_refused_by_a_dry_run() -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    let live = env.spawn_live(50, &[]);
    let (status, stderr) = cli::while_live(live, async {
        // Once its first run wrote the row, the live sync holds the ledger.
        assert!(cli::wait_for_documents(&env.db, 1).await);
        let stderr = exits(&dry_run(&env, &[]), 2);
        assert!(stderr.contains("already open"), "{stderr}");
        no_backtrace(&stderr);
        TestResult::Ok(())
    })
    .await?;
    assert!(status.is_some_and(|s| s.success()), "{status:?}: {stderr}");
    Ok(())
}

/// `key -> xmin` of a PostgreSQL table (`key` an SQL expression of its
/// columns): the transaction that last wrote each row.
async fn xmins(pg: &PgDatabase, table: &str, key: &str) -> BTreeMap<String, String> {
    let pool = pg.pool().await;
    let rows: Vec<(String, String)> =
        sqlx::query_as(&format!("SELECT {key}, xmin::text FROM {table}"))
            .fetch_all(&pool)
            .await
            .unwrap();
    pool.close().await;
    rows.into_iter().collect()
}

/// The tables of the PostgreSQL database's public schema.
async fn pg_tables(pg: &PgDatabase) -> Vec<String> {
    let pool = pg.pool().await;
    let tables = sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    tables
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_into_postgres_lists_what_a_sync_would_do_and_leaves_the_tables_untouched(
) -> TestResult {
    PgDatabase::around("cli_dry_run", async |pg| {
        let env = Env::new();
        env.put("a.md", "a\n");
        env.put("b.md", "b\n");
        env.put("c.md", "c\n");

        let out = dry_run_into(&env, &pg.url, &[]);
        assert_eq!(
            report(&out),
            [
                "documents: 3 to create, 0 to update, 0 to delete (table to create)",
                "  create: a.md, b.md, c.md",
                "chunks: 3 to create, 0 to update, 0 to delete (table to create)",
                "  create: a.md#0, b.md#0, c.md#0",
            ]
        );
        assert!(pg_tables(pg).await.is_empty(), "a table was created");
        assert!(!env.ledger.exists(), "the ledger was created");

        ok(&env.sync_into(&pg.url, &[]));
        env.put("a.md", "changed\n");
        std::fs::remove_file(env.path("b.md"))?;
        env.put("d.md", "d\n");
        let before = snapshot(&env);
        let rows = (
            pg.docs().await,
            pg.chunks().await,
            xmins(pg, "documents", "path").await,
            xmins(pg, "chunks", "path || '#' || chunk_index").await,
        );

        let out = dry_run_into(&env, &pg.url, &[]);
        assert_eq!(
            report(&out),
            [
                "documents: 1 to create, 1 to update, 1 to delete",
                "  create: d.md",
                "  update: a.md",
                "  delete: b.md",
                "chunks: 1 to create, 1 to update, 1 to delete",
                "  create: d.md#0",
                "  update: a.md#0",
                "  delete: b.md#0",
            ]
        );
        assert_unchanged(&before, &snapshot(&env));
        assert_eq!(
            (
                pg.docs().await,
                pg.chunks().await,
                xmins(pg, "documents", "path").await,
                xmins(pg, "chunks", "path || '#' || chunk_index").await,
            ),
            rows
        );
        assert_eq!(pg_tables(pg).await, ["chunks", "documents"]);
        TestResult::Ok(())
    })
    .await
}
