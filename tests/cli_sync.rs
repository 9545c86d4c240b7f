//! End-to-end tests of the `weir` command: they run the built binary on
//! generated directories and read the database it wrote.

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli;
mod cmd;
mod pg;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use cli::{
    chunks_sqlite, doc_count, doc_of, documents_sqlite, no_backtrace, ok, set_mode, sqlite_pool,
    sqlite_url, wait_for_documents, while_live, within, Doc, Env, PgDatabase, TestResult,
};
use cmd::text;
use weir::Fingerprint;

/// Runs `weir args...` in `cwd` and returns its output (see `cmd::run`).
fn weir(cwd: &Path, args: &[&str]) -> Output {
    cmd::run(cwd, args, None)
}

/// Writes a tree of text files (with paragraphs), one binary file and one
/// empty file under `root`.
fn generate_tree(root: &Path, files: usize) {
    for i in 0..files {
        let dir = root
            .join(format!("dir{}", i % 3))
            .join(format!("sub{}", i % 2));
        std::fs::create_dir_all(&dir).unwrap();
        let mut body = String::new();
        for p in 0..(1 + i % 4) {
            body.push_str(&format!(
                "File {i}, paragraph {p}: {}\n",
                "lorem ipsum ".repeat(20 + 40 * p)
            ));
            body.push('\n');
        }
        std::fs::write(dir.join(format!("file{i}.md")), body).unwrap();
    }
    std::fs::write(root.join("binary.bin"), [0u8, 159, 146, 150, 255, 0, 1]).unwrap();
    std::fs::write(root.join("empty.txt"), "").unwrap();
}

/// An [`Env`] whose tree holds `files` generated text files (plus a binary
/// and an empty one).
fn setup(files: usize) -> Env {
    let env = Env::new();
    generate_tree(&env.tree, files);
    env
}

/// What `documents` must hold for the files under `root` (relative paths
/// with `/`), skipping `skip` (weir's own files).
fn expected_documents(root: &Path, skip: &[&str]) -> BTreeMap<String, Doc> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            if skip
                .iter()
                .any(|s| rel == *s || rel.starts_with(&format!("{s}/")))
            {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            out.insert(rel, doc_of(&std::fs::read(&path).unwrap()));
        }
    }
    out
}

/// The texts of `chunks` (see `cli::chunks_by_path`), path by path, their
/// indexes checked contiguous from 0.
fn texts(chunks: BTreeMap<String, Vec<(i64, String)>>) -> BTreeMap<String, Vec<String>> {
    chunks
        .into_iter()
        .map(|(path, chunks)| {
            for (i, (index, _)) in chunks.iter().enumerate() {
                assert_eq!(*index, i as i64, "chunk indexes of {path} are contiguous");
            }
            (path, chunks.into_iter().map(|(_, t)| t).collect())
        })
        .collect()
}

/// Chunks must cover each text document's paragraphs, in order, and
/// nothing else; binary and empty documents have none.
fn check_chunks(docs: &BTreeMap<String, Doc>, chunks: &BTreeMap<String, Vec<String>>) {
    for (path, doc) in docs {
        let paragraphs: Vec<&str> = doc
            .content
            .as_deref()
            .unwrap_or("")
            .split("\n\n")
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        let got = chunks.get(path).cloned().unwrap_or_default();
        if paragraphs.is_empty() {
            assert!(got.is_empty(), "{path} has no text, but chunks {got:?}");
            continue;
        }
        assert!(
            got.iter().all(|c| c.len() <= 2000),
            "{path}: chunk too long"
        );
        let joined: Vec<&str> = got
            .iter()
            .flat_map(|c| c.split("\n\n"))
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        assert_eq!(joined, paragraphs, "chunks of {path}");
    }
    for path in chunks.keys() {
        assert!(
            docs.contains_key(path),
            "chunks of {path}, which is no document"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_writes_one_document_and_its_chunks_per_file_and_a_resync_matches_the_tree_exactly(
) -> TestResult {
    let env = setup(30);

    let first = ok(&env.sync(&[]));
    assert!(first.contains("synced 32 files"), "{first}");
    let pool = env.pool().await;
    let docs = documents_sqlite(&pool).await;
    assert_eq!(docs, expected_documents(&env.tree, &[]));
    check_chunks(&docs, &texts(chunks_sqlite(&pool).await));

    // Change one file, add one, delete one (a long one with chunks).
    std::fs::write(env.path("dir0/sub0/file0.md"), "rewritten\n\nentirely\n")?;
    std::fs::write(env.path("new.md"), "a new file\n")?;
    std::fs::remove_file(env.path("dir0/sub1/file3.md"))?;
    let second = ok(&env.sync(&[]));
    assert!(second.contains("synced 32 files"), "{second}");
    assert!(second.contains("30 unchanged files skipped"), "{second}");
    let docs = documents_sqlite(&pool).await;
    assert_eq!(docs, expected_documents(&env.tree, &[]));
    let chunks = texts(chunks_sqlite(&pool).await);
    check_chunks(&docs, &chunks);
    assert!(!chunks.contains_key("dir0/sub1/file3.md"));
    assert_eq!(chunks["dir0/sub0/file0.md"], vec!["rewritten\n\nentirely"]);

    // Nothing changed: every file is skipped.
    let third = ok(&env.sync(&[]));
    assert!(third.contains("32 unchanged files skipped"), "{third}");
    assert!(third.contains("0 created, 0 updated, 0 deleted"), "{third}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_sync_the_database_file_alone_holds_every_row_and_no_write_ahead_log_content_is_left(
) -> TestResult {
    let env = setup(12);
    ok(&env.sync(&[]));
    let mut wal = env.db.clone().into_os_string();
    wal.push("-wal");
    let left = std::fs::metadata(PathBuf::from(&wal)).map_or(0, |m| m.len());
    assert_eq!(
        left, 0,
        "the write-ahead log beside the database holds {left} bytes"
    );
    // A copy of the file alone is whole.
    let copy = env.tmp.path().join("copy.db");
    std::fs::copy(&env.db, &copy)?;
    let pool = sqlite_pool(&copy).await;
    let docs = documents_sqlite(&pool).await;
    pool.close().await;
    assert_eq!(docs, expected_documents(&env.tree, &[]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_defaults_sync_the_current_directory_into_weir_db_without_syncing_weirs_own_files(
) -> TestResult {
    let tmp = tempfile::tempdir()?;
    generate_tree(tmp.path(), 5);
    ok(&weir(tmp.path(), &["sync", "."]));
    assert!(tmp.path().join("weir.db").is_file());
    assert!(tmp.path().join(".weir").is_dir());
    let pool = sqlite_pool(&tmp.path().join("weir.db")).await;
    let docs = documents_sqlite(&pool).await;
    let expected = expected_documents(
        tmp.path(),
        &[
            ".weir",
            "weir.db",
            "weir.db-wal",
            "weir.db-shm",
            "weir.db-journal",
            // The registry of the tables' owner.
            "weir.db-weir",
            "weir.db-weir-journal",
        ],
    );
    assert_eq!(
        docs.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    // Its own writes are not changes: a second sync skips every file.
    let again = ok(&weir(tmp.path(), &["sync", "."]));
    assert!(again.contains("7 unchanged files skipped"), "{again}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_cannot_be_read_fails_alone_and_is_listed_with_a_non_zero_exit() -> TestResult {
    let env = setup(4);
    // A link to nothing cannot be read, even by root.
    std::os::unix::fs::symlink("missing-target", env.path("broken.md"))?;

    let out = env.sync(&[]);
    assert_eq!(out.status.code(), Some(1), "stderr: {}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("failed: broken.md"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(text(&out.stdout).contains("1 failed"));
    let pool = env.pool().await;
    let docs = documents_sqlite(&pool).await;
    assert_eq!(docs.len(), 6, "every other file landed: {:?}", docs.keys());

    let inspect = ok(&env.inspect());
    assert!(inspect.contains("failed components: 1"), "{inspect}");
    assert!(inspect.contains("broken.md"), "{inspect}");

    // Fixed: the next sync runs only it, and exits 0.
    std::fs::remove_file(env.path("broken.md"))?;
    std::fs::write(env.path("broken.md"), "fixed\n")?;
    let fixed = ok(&env.sync(&[]));
    assert!(fixed.contains("6 unchanged files skipped"), "{fixed}");
    assert_eq!(documents_sqlite(&pool).await.len(), 7);
    Ok(())
}

#[test]
fn bad_input_gets_a_sentence_and_exit_code_2_never_a_backtrace() -> TestResult {
    let tmp = tempfile::tempdir()?;
    std::fs::create_dir(tmp.path().join("tree"))?;
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["sync", "no-such-dir"], "no such directory"),
        (
            vec!["sync", "tree", "--into", "mysql://x"],
            "unsupported database URL",
        ),
        (
            vec!["sync", "tree", "--into", "sqlite://no/such/dir/x.db"],
            "does not exist",
        ),
        (
            vec!["sync", "tree", "--into", "postgres://nobody@127.0.0.1:1/x"],
            "cannot connect to PostgreSQL",
        ),
        (vec!["sync", "tree", "--include", "[broken"], "[broken"),
        (
            vec!["inspect", "--ledger", "nothing-here"],
            "run `weir sync",
        ),
        // A directory that holds no ledger is not made one.
        (vec!["inspect", "--ledger", "tree"], "no ledger at tree"),
        (
            vec![
                "drop",
                "--ledger",
                "tree",
                "--into",
                "sqlite://x.db",
                "--yes",
            ],
            "no ledger at tree",
        ),
        (
            vec!["sync", "tree", "--ledger", "a-file"],
            "cannot open the ledger at a-file: it is a file",
        ),
    ];
    std::fs::write(tmp.path().join("a-file"), "not a ledger")?;
    for (args, expected) in cases {
        let out = weir(tmp.path(), &args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        no_backtrace(&stderr);
    }
    let left: Vec<_> = std::fs::read_dir(tmp.path().join("tree"))?.collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(!tmp.path().join("x.db").exists());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_in_use_or_tied_to_another_database_is_refused_with_what_to_do() -> TestResult {
    let env = setup(2);
    let a = sqlite_url(&env.tmp.path().join("a.db"));
    ok(&env.sync_into(&a, &[]));

    let other = env.sync_into(&sqlite_url(&env.tmp.path().join("b.db")), &[]);
    assert_eq!(other.status.code(), Some(2));
    assert!(
        text(&other.stderr).contains("tracks what weir created in"),
        "{}",
        text(&other.stderr)
    );

    let held = weir::App::builder("holder")
        .ledger_path(&env.ledger)
        .build()
        .await?;
    let locked = env.sync_into(&a, &[]);
    assert_eq!(locked.status.code(), Some(2));
    assert!(
        text(&locked.stderr).contains("already open"),
        "{}",
        text(&locked.stderr)
    );
    drop(held);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_deletes_the_tables_after_confirmation_and_forgets_them() -> TestResult {
    let env = setup(3);
    ok(&env.sync(&[]));
    let refused = env.drop_tables(&[]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(text(&refused.stderr).contains("--yes"));

    ok(&env.drop_tables(&["--yes"]));
    let tables = env.tables().await;
    assert!(tables.is_empty(), "{tables:?}");
    let inspect = ok(&env.inspect());
    assert!(inspect.contains("target states: 0"), "{inspect}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_mode_picks_up_a_change_and_a_deletion_within_two_seconds_and_stops_on_sigterm(
) -> TestResult {
    let env = setup(6);
    let child = env.spawn_live(100, &[]);
    // Then SIGTERM stops it gracefully, with exit code 0.
    let (status, stderr) = while_live(child, async {
        let first = wait_for_documents(&env.db, 8).await;
        assert!(first, "the first sync landed");
        let pool = env.pool().await;

        std::fs::write(env.path("dir0/sub0/file0.md"), "changed live\n")?;
        let changed = within(Duration::from_secs(2), || async {
            let content: Option<String> = sqlx::query_scalar(
                "SELECT content FROM documents WHERE path = 'dir0/sub0/file0.md'",
            )
            .fetch_optional(&pool)
            .await
            .ok()
            .flatten();
            content.as_deref() == Some("changed live\n")
        })
        .await;
        eprintln!("live change landed after {changed:?}");
        assert!(changed.is_some(), "the change landed within 2 s");

        std::fs::remove_file(env.path("dir1/sub1/file1.md"))?;
        let deleted = within(Duration::from_secs(2), || async {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM documents WHERE path = 'dir1/sub1/file1.md'",
            )
            .fetch_one(&pool)
            .await
            .unwrap_or(1);
            n == 0
        })
        .await;
        eprintln!("live deletion landed after {deleted:?}");
        assert!(deleted.is_some(), "the deletion landed within 2 s");
        TestResult::Ok(())
    })
    .await?;
    let status = status.expect("weir --live stops within 30 s of SIGTERM");
    assert_eq!(status.code(), Some(0), "stderr: {stderr}");
    assert!(stderr.contains("stopped"), "{stderr}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_into_postgres_matches_the_tree_after_changes() -> TestResult {
    PgDatabase::around("cli_sync", async |pg| {
        let env = setup(12);
        let sync = || env.sync_into(&pg.url, &[]);
        ok(&sync());
        std::fs::write(env.path("dir0/sub0/file0.md"), "new text\n")?;
        std::fs::remove_file(env.path("dir2/sub0/file2.md"))?;
        std::fs::write(env.path("added.md"), "added\n\nhere\n")?;
        let second = ok(&sync());
        assert!(second.contains("12 unchanged files skipped"), "{second}");

        let docs = pg.docs().await;
        assert_eq!(docs, expected_documents(&env.tree, &[]));
        check_chunks(&docs, &texts(pg.chunks().await));
        TestResult::Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_over_the_content_limit_is_recorded_without_its_content() -> TestResult {
    let env = Env::new();
    let big = "line of text\n".repeat(5 * 1024 * 1024 / 13 + 1);
    env.put("big.txt", &big);
    env.put("small.txt", "small\n");
    ok(&env.sync(&[]));
    let pool = env.pool().await;
    let docs = documents_sqlite(&pool).await;
    let row = &docs["big.txt"];
    assert_eq!(row.size, big.len() as i64);
    assert_eq!(
        row.fingerprint,
        Fingerprint::from_bytes(big.as_bytes()).to_string()
    );
    assert_eq!((row.content.as_deref(), row.line_count), (None, None));
    assert_eq!(docs["small.txt"].content.as_deref(), Some("small\n"));
    let chunks = texts(chunks_sqlite(&pool).await);
    assert!(!chunks.contains_key("big.txt"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_database_named_from_another_directory_is_recognized() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let tree = tmp.path().join("tree");
    generate_tree(&tree, 3);
    let sub = tmp.path().join("sub");
    std::fs::create_dir(&sub)?;
    let tree_arg = tree.to_str().unwrap();
    ok(&weir(
        tmp.path(),
        &[
            "sync",
            tree_arg,
            "--into",
            "sqlite://out.db",
            "--ledger",
            "ledger",
        ],
    ));
    // From `sub`, the same file and ledger are named differently.
    let again = ok(&weir(
        &sub,
        &[
            "sync",
            tree_arg,
            "--into",
            "sqlite://../out.db",
            "--ledger",
            "../ledger",
        ],
    ));
    assert!(again.contains("5 unchanged files skipped"), "{again}");
    // Another file with the same name elsewhere is another database.
    let other = weir(
        &sub,
        &[
            "sync",
            tree_arg,
            "--into",
            "sqlite://out.db",
            "--ledger",
            "../ledger",
        ],
    );
    assert_eq!(other.status.code(), Some(2), "{}", text(&other.stderr));
    Ok(())
}

#[test]
fn a_directory_inside_the_ledger_is_refused() -> TestResult {
    let tmp = tempfile::tempdir()?;
    std::fs::create_dir_all(tmp.path().join("ledger/inner"))?;
    let out = weir(tmp.path(), &["sync", "ledger/inner", "--ledger", "ledger"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("inside the ledger directory"),
        "{}",
        text(&out.stderr)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_that_cannot_be_read_keeps_the_rows_of_the_files_under_it() -> TestResult {
    // Root reads every directory: only an unprivileged user can meet one it
    // cannot list.
    if std::process::Command::new("id").arg("-u").output()?.stdout == b"0\n" {
        let probe = tempfile::tempdir()?;
        let dir = probe.path().join("locked");
        std::fs::create_dir(&dir)?;
        set_mode(&dir, 0o000)?;
        if std::fs::read_dir(&dir).is_ok() {
            eprintln!("SKIPPED: running as root, which can list a directory with mode 000");
            return Ok(());
        }
    }
    let env = setup(6);
    ok(&env.sync(&[]));
    let locked = env.path("dir1");
    set_mode(&locked, 0o000)?;
    std::fs::write(env.path("dir0/sub0/file0.md"), "changed\n")?;
    let out = env.sync(&[]);
    set_mode(&locked, 0o755)?;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("could not be read"),
        "{}",
        text(&out.stderr)
    );
    let pool = env.pool().await;
    let docs = documents_sqlite(&pool).await;
    assert_eq!(
        docs,
        expected_documents(&env.tree, &[]),
        "nothing under dir1 was deleted"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_sync_commits_what_finished_and_the_next_sync_does_the_rest() -> TestResult
{
    let env = setup(4000);
    let mut child = env.spawn_sync(&[]);
    // Signal once some rows have landed.
    let landed = within(Duration::from_secs(60), || async {
        doc_count(&env.db).await.is_some_and(|n| n > 0)
    })
    .await;
    assert!(landed.is_some(), "rows started to land");
    let (status, stderr) = cmd::terminate(&mut child, Duration::from_secs(60));
    let status = status.expect("weir stops after SIGTERM");
    match status.code() {
        Some(130) => {
            assert!(stderr.contains("interrupted"), "{stderr}");
            let n = doc_count(&env.db).await.ok_or("a documents table")?;
            assert!(n > 0 && n < 4002, "part of the files landed: {n}");
        }
        // On a fast machine the sync may finish before the signal lands.
        Some(0) => {
            eprintln!("the sync finished before SIGTERM; the interruption was not exercised")
        }
        other => panic!("unexpected exit {other:?}: {stderr}"),
    }
    // The next sync does the rest, and the table equals the tree.
    ok(&env.sync(&[]));
    let pool = env.pool().await;
    assert_eq!(
        documents_sqlite(&pool).await,
        expected_documents(&env.tree, &[])
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_deleted_between_syncs_is_filled_again_by_the_next_sync() -> TestResult {
    let env = setup(6);
    ok(&env.sync(&[]));
    for suffix in ["", "-wal", "-shm"] {
        let mut file = env.db.clone().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(file));
    }

    // Every file is unchanged, but the rows they declared are gone with
    // the database: skipping them would leave it without tables.
    let out = env.sync(&[]);
    let stdout = ok(&out);
    assert!(stdout.contains("0 unchanged files skipped"), "{stdout}");
    assert!(
        text(&out.stderr).contains("has none of the tables the ledger tracks there"),
        "{}",
        text(&out.stderr)
    );
    let pool = env.pool().await;
    let docs = documents_sqlite(&pool).await;
    assert_eq!(docs, expected_documents(&env.tree, &[]));
    check_chunks(&docs, &texts(chunks_sqlite(&pool).await));
    pool.close().await;

    // Then syncs skip unchanged files again, without the note.
    let out = env.sync(&[]);
    assert!(ok(&out).contains("8 unchanged files skipped"));
    assert!(
        !text(&out.stderr).contains("any more"),
        "{}",
        text(&out.stderr)
    );
    Ok(())
}

/// Rewrites a ledger the command wrote as a build of format 2 stored
/// it: SQLite's tables provider under its former name (as long as the new
/// one, so every encoded length stays right), and the format version 2.
/// Its memo keys go: format 2 hashed the former name into them, so none
/// matches after the upgrade. Returns how many keys and values held the
/// name.
fn as_written_by_format_2(ledger: &Path) -> usize {
    const NOW: &[u8] = b"weir.sqlite.table/weir-sqlite";
    const BEFORE: &[u8] = b"weir.sqlite/weir-sqlite/table";
    let db = sled::open(ledger.join("sled")).unwrap();
    let find = |bytes: &[u8]| bytes.windows(NOW.len()).position(|w| w == NOW);
    let rename = |bytes: &[u8]| -> Option<Vec<u8>> {
        let mut out = bytes.to_vec();
        let mut at = find(bytes)?;
        loop {
            out[at..at + NOW.len()].copy_from_slice(BEFORE);
            at += NOW.len();
            match find(&out[at..]) {
                Some(i) => at += i,
                None => return Some(out),
            }
        }
    };
    let mut renamed = 0;
    for name in db.tree_names() {
        let tree = db.open_tree(name).unwrap();
        let all: Vec<_> = tree.iter().map(Result::unwrap).collect();
        for (k, v) in all {
            let (new_k, new_v) = (rename(&k), rename(&v));
            if new_k.is_none() && new_v.is_none() {
                continue;
            }
            renamed += 1;
            tree.remove(&k).unwrap();
            tree.insert(
                new_k.unwrap_or_else(|| k.to_vec()),
                new_v.unwrap_or_else(|| v.to_vec()),
            )
            .unwrap();
        }
    }
    // Memo keys (packed, and their tombstones) forgotten: a format 2
    // ledger held them under keys of their own.
    for prefix in [b"q", b"n"] {
        for memo in db.scan_prefix(prefix).keys() {
            db.remove(memo.unwrap()).unwrap();
        }
    }
    db.insert(b"mformat", &2u32.to_be_bytes()).unwrap();
    db.flush().unwrap();
    renamed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_of_the_format_before_the_sqlite_tables_provider_was_renamed_keeps_every_table_and_row(
) -> TestResult {
    let env = setup(6);
    ok(&env.sync(&[]));
    let renamed = as_written_by_format_2(&env.ledger);
    assert!(
        renamed >= 3,
        "the tables, the component they are mounted in and the rows name the provider: {renamed}"
    );

    // Every file runs again (its memo key changed with the name) and
    // finds its rows as they are. Had the stored names stayed, every table
    // and row would be deleted and created again.
    let out = ok(&env.sync(&[]));
    assert!(out.contains("0 unchanged files skipped"), "{out}");
    assert!(out.contains("0 created, 0 updated, 0 deleted"), "{out}");
    let out = ok(&env.sync(&[]));
    assert!(out.contains("8 unchanged files skipped"), "{out}");
    let tracked = ok(&env.inspect());
    assert!(tracked.contains("format version 4"), "{tracked}");
    assert!(
        tracked.contains("weir.sqlite.table/weir-sqlite/[\"weir-sqlite\",\"documents\"]")
            && !tracked.contains("weir.sqlite/weir-sqlite/table"),
        "{tracked}"
    );
    let pool = env.pool().await;
    assert_eq!(
        documents_sqlite(&pool).await,
        expected_documents(&env.tree, &[])
    );

    std::fs::write(env.path("dir0/sub0/file0.md"), "rewritten\n")?;
    std::fs::remove_file(env.path("dir1/sub1/file1.md"))?;
    let out = ok(&env.sync(&[]));
    assert!(out.contains("6 unchanged files skipped"), "{out}");
    let docs = documents_sqlite(&pool).await;
    assert_eq!(docs, expected_documents(&env.tree, &[]));
    check_chunks(&docs, &texts(chunks_sqlite(&pool).await));
    pool.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_dropped_by_hand_in_postgres_stops_the_sync_with_what_to_do_and_drop_then_sync_rebuild_it(
) -> TestResult {
    PgDatabase::around("cli_lost_table", async |pg| {
        let env = setup(5);
        let sync = || env.sync_into(&pg.url, &[]);
        ok(&sync());
        let pool = pg.pool().await;
        // A view named like the table is not the table.
        sqlx::query("DROP TABLE chunks").execute(&pool).await?;
        sqlx::query("CREATE VIEW chunks AS SELECT path FROM documents")
            .execute(&pool)
            .await?;

        // weir does not drop `documents` on its own to rebuild both.
        let out = sync();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("has no chunks table any more"), "{stderr}");
        assert!(stderr.contains("weir drop --yes --into"), "{stderr}");
        let count = |table: &'static str| {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(&format!("SELECT count(*) FROM {table}"))
                    .fetch_one(&pool)
                    .await
            }
        };
        assert_eq!(count("documents").await?, 7);

        // What it says to do works.
        sqlx::query("DROP VIEW chunks").execute(&pool).await?;
        ok(&env.drop_tables_in(&pg.url, &["--yes"]));
        assert!(ok(&sync()).contains("0 unchanged files skipped"));
        assert_eq!(count("documents").await?, 7);
        assert!(count("chunks").await? >= 5);
        pool.close().await;
        TestResult::Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_first_sync_that_failed_to_create_the_tables_the_next_one_writes_everything(
) -> TestResult {
    let env = setup(2);
    // The first sync fails to create `documents` (an index has its name),
    // after the ledger was tied to the database.
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(
            sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&env.db)
                .create_if_missing(true),
        )
        .await?;
    sqlx::query("CREATE TABLE other (a INTEGER)")
        .execute(&pool)
        .await?;
    sqlx::query("CREATE INDEX documents ON other (a)")
        .execute(&pool)
        .await?;
    let out = env.sync(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(env.ledger.join("weir-target").is_file());
    sqlx::query("DROP INDEX documents").execute(&pool).await?;
    pool.close().await;

    ok(&env.sync(&[]));
    let pool = env.pool().await;
    let docs = documents_sqlite(&pool).await;
    assert_eq!(docs, expected_documents(&env.tree, &[]));
    check_chunks(&docs, &texts(chunks_sqlite(&pool).await));
    pool.close().await;
    Ok(())
}

#[test]
fn a_metrics_address_in_use_is_a_sentence_and_exit_code_2_not_a_panic() -> TestResult {
    let env = setup(2);
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = taken.local_addr()?.to_string();
    let out = env.sync(&["--metrics", &addr]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot start the Prometheus exporter on {addr}")),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    Ok(())
}
