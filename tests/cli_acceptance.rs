//! Acceptance tests of the main job: the `weir` command run as a
//! black box on generated trees, with the SQLite (and PostgreSQL) tables
//! checked exactly. They look for behaviour the guide (`weir::guide::command`) promises
//! that `tests/cli_sync.rs` does not already check.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli;
mod cmd;
mod pg;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant, SystemTime};

use cli::nobody::{give_tree_to_nobody, nobody_env, NOBODY};
use cli::{
    doc_count, doc_of, exits, no_backtrace, ok, read_documents, set_mode, sqlite_url, sync_args,
    wait_for_documents, while_live, within, Doc, Env, PgDatabase, TestResult,
};
use cmd::text;
use weir::Fingerprint;

// ---------------------------------------------------------------- helpers

/// `[(0, a), (1, b), ...]` for the chunk texts given.
fn indexed(texts: &[&str]) -> Vec<(i64, String)> {
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| (i as i64, t.to_string()))
        .collect()
}

/// The keys of `map`, in order.
fn keys<V>(map: &BTreeMap<String, V>) -> Vec<&str> {
    map.keys().map(String::as_str).collect()
}

/// Sets a file's modification time (without following nothing else).
fn set_mtime(path: &Path, t: SystemTime) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

/// An hour before now.
fn an_hour_ago() -> SystemTime {
    SystemTime::now() - Duration::from_secs(3600)
}

/// A paragraph of `bytes` times `tag`.
fn paragraph(tag: char, bytes: usize) -> String {
    tag.to_string().repeat(bytes)
}

/// One paragraph of `bytes` bytes (see [`paragraph`]) per character of
/// `tags`.
fn paragraphs(tags: &str, bytes: usize) -> Vec<String> {
    tags.chars().map(|c| paragraph(c, bytes)).collect()
}

/// Once things settle (a component that stopped declaring a state records
/// its memo key on its next run), a sync skips all `files` and changes
/// nothing.
fn assert_settles(env: &Env, files: usize) {
    ok(&env.sync(&[]));
    let out = ok(&env.sync(&[]));
    assert!(out.contains(&format!("synced {files} files")), "{out}");
    assert!(
        out.contains(&format!("{files} unchanged files skipped")),
        "{out}"
    );
    assert!(out.contains("0 created, 0 updated, 0 deleted"), "{out}");
}

// ------------------------------------------------------------ the walk

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_with_spaces_unicode_and_backslashes_are_keys_as_they_are() -> TestResult {
    let env = Env::new();
    let names = [
        "with space.md",
        "ünïcødé/日本語 ファイル.txt",
        "back\\slash.md",
        "emoji 🦀/crab.rs",
        "quote'and\"double.txt",
        "semi;colon%percent.md",
        "new\nline.md",
    ];
    for (i, n) in names.iter().enumerate() {
        env.put(n, format!("file number {i}\n"));
    }
    ok(&env.sync(&[]));
    let mut sorted = names.to_vec();
    sorted.sort();
    assert_eq!(env.docs().await, env.expected(&sorted));
    let chunks = env.chunks().await;
    assert_eq!(keys(&chunks), sorted);
    // A second sync sees the same keys: nothing to do.
    let again = ok(&env.sync(&[]));
    assert!(again.contains("7 unchanged files skipped"), "{again}");
    assert!(again.contains("0 created, 0 updated, 0 deleted"), "{again}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deeply_nested_file_is_keyed_by_its_whole_relative_path() -> TestResult {
    let env = Env::new();
    let deep: String = (0..40).map(|i| format!("d{i}/")).collect::<String>() + "leaf.md";
    env.put(&deep, "deep down\n");
    env.put("top.md", "top\n");
    ok(&env.sync(&[]));
    assert_eq!(env.docs().await, env.expected(&[&deep, "top.md"]));
    std::fs::remove_dir_all(env.path("d0"))?;
    ok(&env.sync(&[]));
    assert_eq!(env.docs().await, env.expected(&["top.md"]));
    assert_eq!(keys(&env.chunks().await), ["top.md"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gitignore_in_a_subdirectory_applies_only_below_it_and_one_above_the_root_is_not_read(
) -> TestResult {
    let env = Env::new();
    // Above the root: must be ignored (the guide: ignore files above the root
    // are never read).
    std::fs::write(env.tmp.path().join(".gitignore"), "*.md\n")?;
    env.put("a.log", "top log\n");
    env.put("a.md", "top md\n");
    env.put("sub/.gitignore", "*.log\nbuild/\n");
    env.put("sub/b.log", "ignored log\n");
    env.put("sub/b.md", "kept\n");
    env.put("sub/build/out.md", "ignored build output\n");
    env.put("sub/deeper/c.log", "ignored too\n");
    env.put("other/build/kept.md", "another build dir, not ignored\n");
    ok(&env.sync(&[]));
    assert_eq!(
        env.docs().await,
        env.expected(&[
            "a.log",
            "a.md",
            "other/build/kept.md",
            "sub/.gitignore",
            "sub/b.md",
        ])
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gitignore_added_later_deletes_what_it_ignores_and_no_gitignore_brings_it_back(
) -> TestResult {
    let env = Env::new();
    env.put("keep.md", "keep\n");
    env.put("logs/one.log", "one\n\ntwo\n");
    env.put("logs/keep.log", "negated\n");
    ok(&env.sync(&[]));
    assert_eq!(
        keys(&env.docs().await),
        ["keep.md", "logs/keep.log", "logs/one.log"]
    );

    env.put(".gitignore", "*.log\n!keep.log\n");
    ok(&env.sync(&[]));
    assert_eq!(
        env.docs().await,
        env.expected(&[".gitignore", "keep.md", "logs/keep.log"])
    );
    assert_eq!(
        keys(&env.chunks().await),
        [".gitignore", "keep.md", "logs/keep.log"]
    );

    ok(&env.sync(&["--no-gitignore"]));
    assert_eq!(
        env.docs().await,
        env.expected(&[".gitignore", "keep.md", "logs/keep.log", "logs/one.log"])
    );
    assert_eq!(env.chunks().await["logs/one.log"], indexed(&["one\n\ntwo"]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dot_ignore_file_is_respected_like_a_gitignore() -> TestResult {
    let env = Env::new();
    env.put(".ignore", "secret/\n");
    env.put("secret/key.txt", "hidden\n");
    env.put("public.txt", "shown\n");
    ok(&env.sync(&[]));
    assert_eq!(keys(&env.docs().await), [".ignore", "public.txt"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn include_and_exclude_globs_combine_on_the_command_line() -> TestResult {
    let env = Env::new();
    for f in [
        "README.md",
        "top.txt",
        "sub/top.txt",
        "docs/guide.md",
        "docs/drafts/wip.md",
        "drafts/old.md",
        "a/node_modules/dep.md",
        "node_modules/dep.md",
        "notes/secret-plan.md",
        "code.rs",
    ] {
        env.put(f, format!("{f}\n"));
    }
    ok(&env.sync(&[
        "--include",
        "*.md",
        "--include",
        "/top.txt",
        "--exclude",
        "/drafts/**",
        "--exclude",
        "node_modules",
        "--exclude",
        "secret*",
    ]));
    assert_eq!(
        env.docs().await,
        env.expected(&[
            "README.md",
            "docs/drafts/wip.md",
            "docs/guide.md",
            "top.txt"
        ])
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrowing_the_include_glob_deletes_the_rows_of_files_no_longer_selected() -> TestResult {
    let env = Env::new();
    env.put("a.md", "alpha\n\nbeta\n");
    env.put("b.txt", "gamma\n\ndelta\n");
    env.put("c/d.txt", "epsilon\n");
    ok(&env.sync(&[]));
    assert_eq!(keys(&env.docs().await), ["a.md", "b.txt", "c/d.txt"]);

    let out = ok(&env.sync(&["--include", "*.md"]));
    assert!(out.contains("deleted"), "{out}");
    assert_eq!(env.docs().await, env.expected(&["a.md"]));
    let chunks = env.chunks().await;
    assert_eq!(keys(&chunks), ["a.md"]);

    // Widening again brings them back.
    ok(&env.sync(&[]));
    assert_eq!(
        env.docs().await,
        env.expected(&["a.md", "b.txt", "c/d.txt"])
    );
    assert_eq!(env.chunks().await["b.txt"], indexed(&["gamma\n\ndelta"]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_in_the_tree_neither_hangs_the_sync_nor_becomes_a_document() -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    let status = std::process::Command::new("mkfifo")
        .arg(env.path("pipe"))
        .status()?;
    assert!(status.success());
    let start = Instant::now();
    let out = env.sync(&[]);
    assert!(start.elapsed() < Duration::from_secs(60));
    ok(&out);
    assert_eq!(keys(&env.docs().await), ["a.md"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_replaced_by_a_file_of_the_same_name_and_back() -> TestResult {
    let env = Env::new();
    env.put("x/one.md", "one\n\nuno\n");
    env.put("x/two.md", "two\n");
    env.put("y.md", "why\n");
    ok(&env.sync(&[]));
    assert_eq!(keys(&env.docs().await), ["x/one.md", "x/two.md", "y.md"]);

    std::fs::remove_dir_all(env.path("x"))?;
    env.put("x", "now x is a file\n");
    ok(&env.sync(&[]));
    assert_eq!(env.docs().await, env.expected(&["x", "y.md"]));
    let chunks = env.chunks().await;
    assert_eq!(keys(&chunks), ["x", "y.md"]);
    assert_eq!(chunks["x"], indexed(&["now x is a file"]));

    std::fs::remove_file(env.path("x"))?;
    env.put("x/three.md", "three\n");
    ok(&env.sync(&[]));
    assert_eq!(env.docs().await, env.expected(&["x/three.md", "y.md"]));
    assert_eq!(keys(&env.chunks().await), ["x/three.md", "y.md"]);
    assert_settles(&env, 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_synced_by_a_relative_path_or_through_a_symlink_gives_the_same_keys() -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    env.put("sub/b.md", "b\n");
    ok(&env.sync(&[]));
    let into = env.url_arg();
    let ledger = env.ledger.to_str().unwrap();
    // From the temporary directory, relatively and with a trailing slash.
    let rel = ok(&env.weir(&["sync", "./tree/", "--into", &into, "--ledger", ledger]));
    assert!(rel.contains("2 unchanged files skipped"), "{rel}");
    assert!(rel.contains("0 created, 0 updated, 0 deleted"), "{rel}");
    // Through a symbolic link to the tree.
    let link = env.tmp.path().join("link");
    std::os::unix::fs::symlink(&env.tree, &link)?;
    let linked = ok(&env.weir(&["sync", "link", "--into", &into, "--ledger", ledger]));
    assert!(
        linked.contains("0 created, 0 updated, 0 deleted"),
        "{linked}"
    );
    assert_eq!(env.docs().await, env.expected(&["a.md", "sub/b.md"]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_and_ledger_inside_the_tree_named_relatively_are_never_synced() -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    env.put("out/keep.md", "kept, beside the database\n");
    let args = [
        "sync",
        "tree",
        "--into",
        "sqlite://tree/out/x.db",
        "--ledger",
        "tree/.ledger",
    ];
    ok(&env.weir(&args));
    let again = ok(&env.weir(&args));
    assert!(again.contains("2 unchanged files skipped"), "{again}");
    let docs = read_documents(&env.tree.join("out/x.db")).await;
    assert_eq!(keys(&docs), ["a.md", "out/keep.md"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_to_a_file_outside_the_tree_is_keyed_by_the_link_and_follows_its_target(
) -> TestResult {
    let env = Env::new();
    let outside = env.tmp.path().join("outside.txt");
    std::fs::write(&outside, "outside v1\n")?;
    std::os::unix::fs::symlink(&outside, env.path("link.txt"))?;
    ok(&env.sync(&[]));
    assert_eq!(env.docs().await["link.txt"], doc_of(b"outside v1\n"));

    std::fs::write(&outside, "outside v2, longer\n")?;
    ok(&env.sync(&[]));
    assert_eq!(
        env.docs().await["link.txt"],
        doc_of(b"outside v2, longer\n")
    );
    assert_eq!(
        env.chunks().await["link.txt"],
        indexed(&["outside v2, longer"])
    );
    Ok(())
}

// ----------------------------------------------------- rows and chunks

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_shrinks_keeps_no_stale_chunk_rows() -> TestResult {
    let env = Env::new();
    // Five paragraphs of 1,500 bytes: no two fit in one 2,000-byte chunk.
    let paras = paragraphs("abcde", 1500);
    env.put("big.md", paras.join("\n\n"));
    env.put("other.md", "other\n");
    ok(&env.sync(&[]));
    let refs: Vec<&str> = paras.iter().map(String::as_str).collect();
    assert_eq!(env.chunks().await["big.md"], indexed(&refs));

    env.put("big.md", "short now\n");
    ok(&env.sync(&[]));
    let chunks = env.chunks().await;
    assert_eq!(chunks["big.md"], indexed(&["short now"]));
    assert_eq!(chunks["other.md"], indexed(&["other"]));
    assert_eq!(env.docs().await, env.expected(&["big.md", "other.md"]));
    assert_settles(&env, 2);
    assert_eq!(env.chunks().await["big.md"], indexed(&["short now"]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paragraphs_are_packed_into_chunks_of_at_most_2000_bytes() -> TestResult {
    let env = Env::new();
    let p900a = paragraph('a', 900);
    let p900b = paragraph('b', 900);
    let p900c = paragraph('c', 900);
    env.put("packed.md", format!("{p900a}\n\n{p900b}\n\n\n{p900c}\n"));
    ok(&env.sync(&[]));
    let chunks = env.chunks().await;
    // a and b fit together (900 + 2 + 900 = 1802); c does not.
    assert_eq!(
        chunks["packed.md"],
        indexed(&[&format!("{p900a}\n\n{p900b}"), &p900c])
    );
    for c in chunks.values().flatten() {
        assert!(c.1.len() <= 2000);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_file_turned_binary_loses_content_line_count_and_chunks_and_gets_them_back(
) -> TestResult {
    let env = Env::new();
    env.put("f.dat", "line one\n\nline two\n");
    ok(&env.sync(&[]));
    assert_eq!(
        env.chunks().await["f.dat"],
        indexed(&["line one\n\nline two"])
    );

    env.put("f.dat", [0xffu8, 0xfe, 0, 1, 2, 3, b'\n', 0x80]);
    ok(&env.sync(&[]));
    let docs = env.docs().await;
    assert_eq!(docs, env.expected(&["f.dat"]));
    assert_eq!(
        (docs["f.dat"].content.clone(), docs["f.dat"].line_count),
        (None, None)
    );
    assert!(env.chunks().await.is_empty());

    env.put("f.dat", "text again\n");
    ok(&env.sync(&[]));
    assert_eq!(env.docs().await, env.expected(&["f.dat"]));
    assert_eq!(env.chunks().await["f.dat"], indexed(&["text again"]));
    assert_settles(&env, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_growing_past_the_content_limit_loses_its_chunks_and_gets_them_back() -> TestResult {
    let env = Env::new();
    env.put("grow.txt", "small\n\nfile\n");
    ok(&env.sync(&[]));
    assert_eq!(env.chunks().await["grow.txt"], indexed(&["small\n\nfile"]));

    let big = "a line of text\n".repeat(4 * 1024 * 1024 / 15 + 100);
    assert!(big.len() > 4 * 1024 * 1024);
    env.put("grow.txt", &big);
    ok(&env.sync(&[]));
    let docs = env.docs().await;
    assert_eq!(
        docs["grow.txt"],
        Doc {
            size: big.len() as i64,
            fingerprint: Fingerprint::from_bytes(big.as_bytes()).to_string(),
            line_count: None,
            content: None,
        }
    );
    assert!(
        env.chunks().await.is_empty(),
        "no chunks for a file over 4 MiB"
    );

    env.put("grow.txt", "small again\n");
    ok(&env.sync(&[]));
    assert_eq!(env.docs().await, env.expected(&["grow.txt"]));
    assert_eq!(env.chunks().await["grow.txt"], indexed(&["small again"]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_modified_column_is_the_file_time_and_a_touch_updates_only_it() -> TestResult {
    let env = Env::new();
    env.put("t.md", "timed\n");
    let t1 = an_hour_ago();
    set_mtime(&env.path("t.md"), t1);
    ok(&env.sync(&[]));
    let stored = env.modified("t.md").await.expect("a modification time");
    let parsed = chrono::DateTime::parse_from_rfc3339(&stored)?;
    assert_eq!(
        parsed.with_timezone(&chrono::Utc),
        chrono::DateTime::<chrono::Utc>::from(t1),
        "{stored}"
    );

    let t2 = t1 + Duration::from_secs(60);
    set_mtime(&env.path("t.md"), t2);
    let out = ok(&env.sync(&[]));
    assert!(out.contains("0 unchanged files skipped"), "{out}");
    assert!(out.contains("0 created, 1 updated, 0 deleted"), "{out}");
    let stored = env.modified("t.md").await.expect("a modification time");
    assert_eq!(
        chrono::DateTime::parse_from_rfc3339(&stored)?.with_timezone(&chrono::Utc),
        chrono::DateTime::<chrono::Utc>::from(t2)
    );
    assert_eq!(env.docs().await, env.expected(&["t.md"]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_file_moves_its_document_and_chunks() -> TestResult {
    let env = Env::new();
    env.put("old/name.md", "first\n\nsecond\n\nthird\n");
    env.put("stay.md", "stay\n");
    ok(&env.sync(&[]));
    std::fs::create_dir_all(env.path("new"))?;
    std::fs::rename(env.path("old/name.md"), env.path("new/renamed.md"))?;
    let out = ok(&env.sync(&[]));
    assert!(out.contains("1 unchanged files skipped"), "{out}");
    assert_eq!(
        env.docs().await,
        env.expected(&["new/renamed.md", "stay.md"])
    );
    let chunks = env.chunks().await;
    assert_eq!(keys(&chunks), ["new/renamed.md", "stay.md"]);
    assert_eq!(
        chunks["new/renamed.md"],
        indexed(&["first\n\nsecond\n\nthird"])
    );
    assert_settles(&env, 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_summary_counts_a_removed_file_and_its_chunks_as_deleted_rows() -> TestResult {
    let env = Env::new();
    let paras = paragraphs("xyz", 1500);
    env.put("three_chunks.md", paras.join("\n\n"));
    env.put("other.md", "other\n");
    ok(&env.sync(&[]));
    assert_eq!(env.chunks().await["three_chunks.md"].len(), 3);
    std::fs::remove_file(env.path("three_chunks.md"))?;
    let out = ok(&env.sync(&[]));
    assert!(out.contains("synced 1 files"), "{out}");
    assert!(out.contains("0 created, 0 updated, 4 deleted"), "{out}");
    assert_eq!(env.docs().await, env.expected(&["other.md"]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_tree_syncs_nothing_and_deleting_every_file_empties_both_tables() -> TestResult {
    let env = Env::new();
    let first = ok(&env.sync(&[]));
    assert!(first.contains("synced 0 files"), "{first}");
    assert!(env.docs().await.is_empty());
    assert!(env.chunks().await.is_empty());

    env.put("a.md", "a\n\nb\n");
    env.put("d/e.md", "e\n");
    env.put("empty.txt", "");
    ok(&env.sync(&[]));
    assert_eq!(
        env.docs().await,
        env.expected(&["a.md", "d/e.md", "empty.txt"])
    );
    assert_eq!(keys(&env.chunks().await), ["a.md", "d/e.md"]);

    std::fs::remove_dir_all(&env.tree)?;
    std::fs::create_dir(&env.tree)?;
    let out = ok(&env.sync(&[]));
    assert!(out.contains("synced 0 files"), "{out}");
    assert!(env.docs().await.is_empty());
    assert!(env.chunks().await.is_empty());
    Ok(())
}

// ---------------------------------------------------------- memoization

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_deleted_then_restored_identically_is_created_again() -> TestResult {
    let env = Env::new();
    env.put("a.md", "alpha\n\nbeta\n");
    env.put("b.md", "b\n");
    let t = an_hour_ago();
    set_mtime(&env.path("a.md"), t);
    ok(&env.sync(&[]));

    std::fs::remove_file(env.path("a.md"))?;
    ok(&env.sync(&[]));
    assert_eq!(keys(&env.docs().await), ["b.md"]);

    // Same content, same size, same modification time: same memo key as
    // before the deletion.
    env.put("a.md", "alpha\n\nbeta\n");
    set_mtime(&env.path("a.md"), t);
    let out = ok(&env.sync(&[]));
    assert!(out.contains("1 unchanged files skipped"), "{out}");
    assert_eq!(env.docs().await, env.expected(&["a.md", "b.md"]));
    assert_eq!(env.chunks().await["a.md"], indexed(&["alpha\n\nbeta"]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_replaced_by_another_of_the_same_size_and_time_is_updated() -> TestResult {
    let env = Env::new();
    // Two files of equal size, with the same modification time (as a tar or
    // rsync -t extraction leaves them), synced once.
    env.put("a.md", "AAAA\n");
    env.put("b.md", "BBBB\n");
    let t = an_hour_ago();
    set_mtime(&env.path("a.md"), t);
    set_mtime(&env.path("b.md"), t);
    // Until their status-change times (moved by setting the modification
    // times) are out of the racy window, their fingerprints are not cached,
    // and the swap below could not fool the cache.
    tokio::time::sleep(
        weir::connectors::localfs::FINGERPRINT_CACHE_RACY_WINDOW + Duration::from_millis(50),
    )
    .await;
    ok(&env.sync(&[]));
    assert_eq!(env.docs().await, env.expected(&["a.md", "b.md"]));

    // Swap them by renaming (which keeps modification times).
    std::fs::rename(env.path("a.md"), env.path("tmp"))?;
    std::fs::rename(env.path("b.md"), env.path("a.md"))?;
    std::fs::rename(env.path("tmp"), env.path("b.md"))?;
    ok(&env.sync(&[]));
    assert_eq!(
        env.docs().await,
        env.expected(&["a.md", "b.md"]),
        "a.md now holds BBBB and b.md AAAA"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_file_is_retried_on_every_sync_while_the_others_are_skipped() -> TestResult {
    let env = Env::new();
    env.put("good.md", "good\n");
    env.put("also.md", "also\n");
    std::os::unix::fs::symlink("nowhere", env.path("bad.md"))?;
    let first = env.sync(&[]);
    let stderr = exits(&first, 1);
    assert!(stderr.contains("failed: bad.md"), "{stderr}");

    for _ in 0..2 {
        let again = env.sync(&[]);
        let stderr = exits(&again, 1);
        assert!(stderr.contains("failed: bad.md"), "{stderr}");
        let stdout = text(&again.stdout);
        assert!(stdout.contains("2 unchanged files skipped"), "{stdout}");
        assert!(stdout.contains("1 failed"), "{stdout}");
    }
    assert_eq!(env.docs().await, env.expected(&["also.md", "good.md"]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_becomes_a_broken_link_fails_keeps_its_rows_and_recovers() -> TestResult {
    let env = Env::new();
    env.put("a.md", "original\n\ntext\n");
    env.put("b.md", "b\n");
    ok(&env.sync(&[]));
    let before_docs = env.docs().await;
    let before_chunks = env.chunks().await;

    std::fs::remove_file(env.path("a.md"))?;
    std::os::unix::fs::symlink("gone", env.path("a.md"))?;
    let out = env.sync(&[]);
    let stderr = exits(&out, 1);
    assert!(stderr.contains("failed: a.md"), "{stderr}");
    no_backtrace(&stderr);
    // A failed component changes nothing of its own.
    assert_eq!(env.docs().await, before_docs);
    assert_eq!(env.chunks().await, before_chunks);

    std::fs::remove_file(env.path("a.md"))?;
    env.put("a.md", "fixed\n");
    ok(&env.sync(&[]));
    assert_eq!(env.docs().await, env.expected(&["a.md", "b.md"]));
    assert_eq!(env.chunks().await["a.md"], indexed(&["fixed"]));
    let inspect = ok(&env.inspect());
    assert!(inspect.contains("failed components: 0"), "{inspect}");
    Ok(())
}

/// `env.sync(&[])` run as user nobody.
fn sync_as_nobody(env: &Env) -> Output {
    let into = env.url_arg();
    let args = sync_args(&env.tree, &into, &env.ledger, &[]);
    cmd::run(env.tmp.path(), &args, Some(NOBODY))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_file_fails_each_sync_and_lands_once_readable_again() -> TestResult {
    let Some(env) = nobody_env()? else {
        return Ok(());
    };
    env.put("ok.md", "fine\n");
    env.put("secret.md", "secret\n\ntext\n");
    give_tree_to_nobody(&env)?;
    set_mode(&env.path("secret.md"), 0o000)?;
    for _ in 0..2 {
        let out = sync_as_nobody(&env);
        let stderr = exits(&out, 1);
        assert!(stderr.contains("failed: secret.md"), "{stderr}");
        no_backtrace(&stderr);
        assert_eq!(keys(&env.docs().await), ["ok.md"]);
    }
    // Readable again, with the same size and modification time.
    set_mode(&env.path("secret.md"), 0o644)?;
    ok(&sync_as_nobody(&env));
    assert_eq!(env.docs().await, env.expected(&["ok.md", "secret.md"]));
    assert_eq!(
        env.chunks().await["secret.md"],
        indexed(&["secret\n\ntext"])
    );
    Ok(())
}

// ------------------------------------------------------ inspect and drop

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_names_the_database_counts_every_row_and_lists_the_failed_file_with_its_error(
) -> TestResult {
    let env = Env::new();
    env.put("a.md", "one\n\ntwo\n");
    env.put("b.md", "three\n");
    std::os::unix::fs::symlink("missing-target", env.path("broken.md"))?;
    exits(&env.sync(&[]), 1);
    let inspect = ok(&env.inspect());
    let db_abs = std::fs::canonicalize(&env.db)?;
    assert!(
        inspect.contains(&format!("database: sqlite://{}", db_abs.display())),
        "{inspect}"
    );
    assert!(inspect.contains("format version"), "{inspect}");
    assert!(inspect.contains("failed components: 1"), "{inspect}");
    let line = inspect
        .lines()
        .find(|l| l.trim_start().starts_with("broken.md"))
        .unwrap_or_else(|| panic!("a line for broken.md: {inspect}"));
    assert!(line.contains("missing-target"), "{line}");
    // Two tables, two documents, two chunks.
    assert!(inspect.contains("target states: 6"), "{inspect}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_yes_then_sync_again_recreates_every_row() -> TestResult {
    let env = Env::new();
    env.put("a.md", "alpha\n\nbeta\n");
    env.put("sub/b.md", "gamma\n");
    ok(&env.sync(&[]));
    ok(&env.drop_tables(&["--yes"]));

    let again = ok(&env.sync(&[]));
    assert!(again.contains("0 unchanged files skipped"), "{again}");
    assert_eq!(env.docs().await, env.expected(&["a.md", "sub/b.md"]));
    assert_eq!(env.chunks().await["a.md"], indexed(&["alpha\n\nbeta"]));
    let inspect = ok(&env.inspect());
    // Two tables, two documents, two chunks.
    assert!(inspect.contains("target states: 6"), "{inspect}");
    // And a further sync is a no-op.
    let third = ok(&env.sync(&[]));
    assert!(third.contains("2 unchanged files skipped"), "{third}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_drop_the_ledger_can_sync_into_another_database() -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    ok(&env.sync(&[]));
    ok(&env.drop_tables(&["--yes"]));
    let other = env.tmp.path().join("other.db");
    let other_into = sqlite_url(&other);
    ok(&env.sync_into(&other_into, &[]));
    assert_eq!(keys(&read_documents(&other).await), ["a.md"]);
    // The first database is no longer tracked: it has no tables left.
    let tables = env.tables().await;
    assert!(tables.is_empty(), "{tables:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_is_refused_for_a_database_the_ledger_does_not_track_and_leaves_it_alone() -> TestResult
{
    let env = Env::new();
    env.put("a.md", "a\n");
    ok(&env.sync(&[]));
    let other = sqlite_url(&env.tmp.path().join("other.db"));
    let out = env.drop_tables_in(&other, &["--yes"]);
    let stderr = exits(&out, 2);
    assert!(stderr.contains("tracks what weir created in"), "{stderr}");
    no_backtrace(&stderr);
    assert_eq!(keys(&env.docs().await), ["a.md"]);
    let none = env.weir(&[
        "drop",
        "--into",
        &env.url_arg(),
        "--ledger",
        "no-ledger-here",
        "--yes",
    ]);
    let stderr = exits(&none, 2);
    assert!(stderr.contains("nothing to drop"), "{stderr}");
    Ok(())
}

// --------------------------------------------- errors and exit codes

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_not_covered_elsewhere_gets_a_sentence_and_exit_code_2() -> TestResult {
    let env = Env::new();
    env.put("file.txt", "I am a file\n");
    std::fs::create_dir(env.tmp.path().join("a-dir"))?;
    std::fs::write(env.tmp.path().join("ledger-file"), "not a ledger")?;
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["sync", "tree/file.txt"], "not a directory"),
        (vec!["sync", "tree", "--into", "sqlite://"], "names no file"),
        (
            vec!["sync", "tree", "--into", "http://x/y"],
            "unsupported database URL",
        ),
        (vec!["sync", "tree", "--into", "sqlite://a-dir"], "a-dir"),
        (vec!["sync", "tree", "--exclude", "{unclosed"], "{unclosed"),
        (
            vec![
                "sync",
                "tree",
                "--into",
                "postgres://postgres@127.0.0.1:5432/weir_no_such_database_here",
            ],
            "cannot connect to PostgreSQL",
        ),
        (vec!["inspect", "--ledger", "ledger-file"], "ledger-file"),
    ];
    for (args, expected) in cases {
        let out = env.weir(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        no_backtrace(&stderr);
        // One sentence, not a dump: a few lines at most.
        assert!(stderr.lines().count() <= 3, "{args:?}: {stderr}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_held_by_a_live_sync_is_refused_by_another_sync_with_a_sentence() -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    let live = env.spawn_live(50, &[]);
    let (status, stderr) = while_live(live, async {
        let landed = wait_for_documents(&env.db, 1).await;
        assert!(landed, "the live sync's first run landed");
        let out = env.sync(&[]);
        let stderr = exits(&out, 2);
        no_backtrace(&stderr);
        assert!(stderr.contains(env.ledger.to_str().unwrap()), "{stderr}");
        // `weir inspect` meanwhile: an answer or a sentence, never a panic.
        let inspect = env.inspect();
        let stderr = text(&inspect.stderr);
        no_backtrace(&stderr);
        assert!(
            inspect.status.success() || inspect.status.code() == Some(2),
            "{stderr}"
        );
        TestResult::Ok(())
    })
    .await?;
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{stderr}");
    Ok(())
}

// ----------------------------------------------------------- live mode

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_mode_picks_up_a_new_subdirectory_a_rename_and_a_removed_directory() -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    env.put("gone/x.md", "x\n");
    let live = env.spawn_live(100, &[]);
    let limit = Duration::from_secs(5);
    let (status, stderr) = while_live(live, async {
        let first = wait_for_documents(&env.db, 2).await;
        assert!(first, "the first run landed");

        env.put("new/deeper/n.md", "new\n\nfile\n");
        let t = within(limit, || async {
            env.docs().await.contains_key("new/deeper/n.md")
        })
        .await;
        eprintln!("a file in a new directory landed after {t:?}");
        assert!(t.is_some(), "a file in a new subdirectory landed");

        std::fs::rename(env.path("a.md"), env.path("new/a-renamed.md"))?;
        let t = within(limit, || async {
            let docs = env.docs().await;
            docs.contains_key("new/a-renamed.md") && !docs.contains_key("a.md")
        })
        .await;
        eprintln!("a rename landed after {t:?}");
        assert!(t.is_some(), "a rename landed");

        std::fs::remove_dir_all(env.path("gone"))?;
        let t = within(limit, || async {
            !env.docs().await.contains_key("gone/x.md")
        })
        .await;
        eprintln!("a removed directory landed after {t:?}");
        assert!(t.is_some(), "a removed directory landed");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            env.docs().await,
            env.expected(&["new/a-renamed.md", "new/deeper/n.md"])
        );
        assert_eq!(
            keys(&env.chunks().await),
            ["new/a-renamed.md", "new/deeper/n.md"]
        );
        TestResult::Ok(())
    })
    .await?;
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{stderr}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_mode_with_the_defaults_is_not_woken_by_its_own_database_writes() -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    env.put("b.md", "b\n");
    // Defaults: weir.db and .weir/ inside the synced directory.
    let live = cmd::spawn(
        &env.tree,
        &["sync", ".", "--live", "--debounce-ms", "50"],
        None,
    );
    let db = env.tree.join("weir.db");
    let (status, stderr) = while_live(live, async {
        let first = wait_for_documents(&db, 2).await;
        assert!(first, "the first run landed");
        env.put("c.md", "c\n");
        let t = within(Duration::from_secs(5), || async {
            doc_count(&db).await == Some(3)
        })
        .await;
        assert!(t.is_some(), "a change landed");
        // Then nothing changes for a while.
        tokio::time::sleep(Duration::from_secs(2)).await;
        TestResult::Ok(())
    })
    .await?;
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{stderr}");
    let changed: Vec<&str> = stderr.lines().filter(|l| l.contains("changed:")).collect();
    assert!(!changed.is_empty(), "no change was logged: {stderr}");
    assert!(
        changed
            .iter()
            .all(|l| !l.contains("weir.db") && !l.contains(".weir")),
        "{stderr}"
    );
    assert!(
        changed.len() <= 2,
        "woken up {} times: {stderr}",
        changed.len()
    );
    assert_eq!(keys(&read_documents(&db).await), ["a.md", "b.md", "c.md"]);
    Ok(())
}

// ----------------------------------------------------------- PostgreSQL

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_shrinking_renaming_and_binary_files_leave_exact_tables() -> TestResult {
    PgDatabase::around("accept_shrink", async |pg| {
        let env = Env::new();
        let paras = paragraphs("pqrs", 1500);
        env.put("big.md", paras.join("\n\n"));
        env.put("old.md", "old\n\nname\n");
        env.put("t.txt", "text\n");
        env.put("ünï code.md", "ü\n");
        ok(&env.sync_into(&pg.url, &[]));
        assert_eq!(
            env.expected(&["big.md", "old.md", "t.txt", "ünï code.md"]),
            pg.docs().await
        );
        assert_eq!(pg.chunks().await["big.md"].len(), 4);

        env.put("big.md", "tiny\n");
        std::fs::rename(env.path("old.md"), env.path("new.md"))?;
        env.put("t.txt", [0u8, 1, 2, 0xff]);
        ok(&env.sync_into(&pg.url, &[]));
        assert_eq!(
            pg.docs().await,
            env.expected(&["big.md", "new.md", "t.txt", "ünï code.md"])
        );
        let chunks = pg.chunks().await;
        assert_eq!(keys(&chunks), ["big.md", "new.md", "ünï code.md"]);
        assert_eq!(chunks["big.md"], indexed(&["tiny"]));
        assert_eq!(chunks["new.md"], indexed(&["old\n\nname"]));
        TestResult::Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_drop_yes_deletes_both_tables_and_a_new_sync_recreates_them() -> TestResult {
    PgDatabase::around("accept_drop", async |pg| {
        let env = Env::new();
        env.put("a.md", "a\n\nb\n");
        env.put("c/d.md", "d\n");
        ok(&env.sync_into(&pg.url, &[]));
        assert_eq!(pg.tables().await, ["chunks", "documents"]);
        ok(&env.drop_tables_in(&pg.url, &["--yes"]));
        assert!(pg.tables().await.is_empty(), "{:?}", pg.tables().await);
        let again = ok(&env.sync_into(&pg.url, &[]));
        assert!(again.contains("0 unchanged files skipped"), "{again}");
        assert_eq!(pg.docs().await, env.expected(&["a.md", "c/d.md"]));
        assert_eq!(pg.chunks().await["a.md"], indexed(&["a\n\nb"]));
        TestResult::Ok(())
    })
    .await
}

// ----------------------------------------------------------- more cases

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_path_that_is_a_file_is_refused_with_a_sentence_naming_it() -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    std::fs::write(env.tmp.path().join("ledger-file"), "not a ledger")?;
    let out = env.weir(&["sync", "tree", "--ledger", "ledger-file"]);
    let stderr = exits(&out, 2);
    no_backtrace(&stderr);
    assert!(
        stderr.contains("ledger-file"),
        "the error names the ledger: {stderr}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_fingerprinted_within_the_racy_window_is_read_again_next_time() -> TestResult {
    let env = Env::new();
    // A modification time in the future (clock skew) and one of just now:
    // neither may be trusted by the fingerprint cache.
    env.put("future.md", "1111\n");
    env.put("now.md", "2222\n");
    let future = SystemTime::now() + Duration::from_secs(3600);
    set_mtime(&env.path("future.md"), future);
    let now = SystemTime::now();
    set_mtime(&env.path("now.md"), now);
    ok(&env.sync(&[]));
    assert_eq!(env.docs().await, env.expected(&["future.md", "now.md"]));

    // Same size, same modification time, other content.
    env.put("future.md", "3333\n");
    set_mtime(&env.path("future.md"), future);
    env.put("now.md", "4444\n");
    set_mtime(&env.path("now.md"), now);
    ok(&env.sync(&[]));
    assert_eq!(env.docs().await, env.expected(&["future.md", "now.md"]));
    assert_eq!(env.chunks().await["now.md"], indexed(&["4444"]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_edge_cases_whitespace_only_nul_bytes_crlf_and_wide_characters() -> TestResult {
    let env = Env::new();
    env.put("blank.txt", "   \n\n \t \n");
    env.put("nul.txt", "valid utf-8\0with a nul\n");
    env.put("crlf.txt", "one\r\ntwo\r\n\r\nthree\r\n");
    // 1,000 three-byte characters in one paragraph: cut at a character
    // boundary at or below 2,000 bytes (666 characters = 1,998 bytes).
    let wide = "日".repeat(1000);
    env.put("wide.txt", &wide);
    env.put("bom.txt", "\u{feff}with a bom\n");
    ok(&env.sync(&[]));
    assert_eq!(
        env.docs().await,
        env.expected(&["blank.txt", "bom.txt", "crlf.txt", "nul.txt", "wide.txt"])
    );
    let chunks = env.chunks().await;
    assert!(
        !chunks.contains_key("blank.txt"),
        "{:?}",
        chunks.get("blank.txt")
    );
    assert!(!chunks.contains_key("nul.txt"));
    assert_eq!(chunks["crlf.txt"].len(), 1);
    assert!(chunks["crlf.txt"][0].1.contains("three"));
    assert_eq!(
        chunks["wide.txt"],
        indexed(&[&"日".repeat(666), &"日".repeat(334)])
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_also_forgets_failed_files_and_the_next_sync_retries_them() -> TestResult {
    let env = Env::new();
    env.put("good.md", "good\n");
    std::os::unix::fs::symlink("nowhere", env.path("bad.md"))?;
    exits(&env.sync(&[]), 1);
    ok(&env.drop_tables(&["--yes"]));
    let inspect = ok(&env.inspect());
    assert!(inspect.contains("target states: 0"), "{inspect}");
    assert!(inspect.contains("failed components: 0"), "{inspect}");
    let again = env.sync(&[]);
    let stderr = exits(&again, 1);
    assert!(stderr.contains("failed: bad.md"), "{stderr}");
    assert_eq!(env.docs().await, env.expected(&["good.md"]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlistable_directory_keeps_its_rows_and_the_next_sync_converges() -> TestResult {
    let Some(env) = nobody_env()? else {
        return Ok(());
    };
    env.put("a.md", "a\n");
    env.put("locked/x.md", "x\n\ny\n");
    env.put("locked/deeper/z.md", "z\n");
    env.put("gone.md", "gone soon\n");
    give_tree_to_nobody(&env)?;
    ok(&sync_as_nobody(&env));
    let before_chunks = env.chunks().await;

    set_mode(&env.path("locked"), 0o000)?;
    std::fs::remove_file(env.path("gone.md"))?;
    env.put("a.md", "a changed\n");
    let out = sync_as_nobody(&env);
    set_mode(&env.path("locked"), 0o755)?;
    let stderr = exits(&out, 1);
    no_backtrace(&stderr);
    assert!(stderr.contains("locked"), "{stderr}");
    let docs = env.docs().await;
    // What it saw is committed; nothing under the locked directory is lost.
    assert_eq!(docs["a.md"], doc_of(b"a changed\n"));
    assert_eq!(docs["locked/x.md"], doc_of(b"x\n\ny\n"));
    assert_eq!(docs["locked/deeper/z.md"], doc_of(b"z\n"));
    assert_eq!(
        env.chunks().await["locked/x.md"],
        before_chunks["locked/x.md"]
    );

    ok(&sync_as_nobody(&env));
    assert_eq!(
        env.docs().await,
        env.expected(&["a.md", "locked/deeper/z.md", "locked/x.md"])
    );
    assert_eq!(
        keys(&env.chunks().await),
        ["a.md", "locked/deeper/z.md", "locked/x.md"]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_mode_applies_a_gitignore_written_in_a_subdirectory_at_once() -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    env.put("sub/b.md", "b\n");
    env.put("sub/c.md", "c\n");
    // The include glob does not select the ignore file itself.
    let live = env.spawn_live(100, &["--include", "*.md"]);
    let (status, stderr) = while_live(live, async {
        let first = wait_for_documents(&env.db, 3).await;
        assert!(first, "the first run landed");

        env.put("sub/.gitignore", "b.md\n");
        let t = within(Duration::from_secs(5), || async {
            !env.docs().await.contains_key("sub/b.md")
        })
        .await;
        assert!(
            t.is_some(),
            "the file the new ignore file ignores was deleted"
        );

        // A change to a file it ignores syncs nothing; the others sync.
        env.put("sub/b.md", "b changed\n");
        env.put("sub/c.md", "c changed\n");
        let t = within(Duration::from_secs(5), || async {
            env.chunks().await.get("sub/c.md") == Some(&indexed(&["c changed"]))
        })
        .await;
        assert!(t.is_some(), "the other file's change landed");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(env.docs().await, env.expected(&["a.md", "sub/c.md"]));
        TestResult::Ok(())
    })
    .await?;
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{stderr}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_mode_retries_a_failing_file_once_it_is_fixed_and_stops_on_sigint() -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    std::os::unix::fs::symlink("nowhere", env.path("bad.md"))?;
    let mut live = env.spawn_live(100, &["--include", "*.md"]);
    let result = async {
        let first = wait_for_documents(&env.db, 1).await;
        assert!(first, "the first run landed");
        // A file the include glob does not select is never synced.
        env.put("ignored.txt", "not selected\n");
        std::fs::remove_file(env.path("bad.md"))?;
        env.put("bad.md", "fixed live\n");
        let t = within(Duration::from_secs(5), || async {
            env.docs().await.contains_key("bad.md")
        })
        .await;
        assert!(t.is_some(), "the fixed file landed");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(env.docs().await, env.expected(&["a.md", "bad.md"]));
        TestResult::Ok(())
    }
    .await;
    let _ = std::process::Command::new("kill")
        .args(["-INT", &live.id().to_string()])
        .status();
    let status = cmd::wait_for_exit(&mut live, Duration::from_secs(30));
    let out = live.wait_with_output()?;
    result?;
    let stderr = text(&out.stderr);
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{stderr}");
    assert!(
        stderr.contains("failed: bad.md"),
        "the first run listed it: {stderr}"
    );
    assert!(stderr.contains("stopped"), "{stderr}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_failing_file_fails_alone_and_is_retried() -> TestResult {
    PgDatabase::around("accept_failing", async |pg| {
        let env = Env::new();
        env.put("a.md", "a\n");
        env.put("b/c.md", "c\n\nd\n");
        std::os::unix::fs::symlink("nowhere", env.path("bad.md"))?;
        let stderr = exits(&env.sync_into(&pg.url, &[]), 1);
        assert!(stderr.contains("failed: bad.md"), "{stderr}");
        assert_eq!(pg.docs().await, env.expected(&["a.md", "b/c.md"]));
        let inspect = ok(&env.inspect());
        assert!(inspect.contains("failed components: 1"), "{inspect}");
        std::fs::remove_file(env.path("bad.md"))?;
        env.put("bad.md", "fixed\n");
        let out = ok(&env.sync_into(&pg.url, &[]));
        assert!(out.contains("2 unchanged files skipped"), "{out}");
        assert_eq!(pg.docs().await, env.expected(&["a.md", "b/c.md", "bad.md"]));
        assert_eq!(pg.chunks().await["b/c.md"], indexed(&["c\n\nd"]));
        TestResult::Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_emptied_keeps_its_document_and_loses_its_chunks() -> TestResult {
    let env = Env::new();
    let paras = paragraphs("mn", 1500);
    env.put("e.md", paras.join("\n\n"));
    ok(&env.sync(&[]));
    assert_eq!(env.chunks().await["e.md"].len(), 2);
    env.put("e.md", "");
    ok(&env.sync(&[]));
    let docs = env.docs().await;
    assert_eq!(docs, env.expected(&["e.md"]));
    assert_eq!(
        (docs["e.md"].content.as_deref(), docs["e.md"].line_count),
        (Some(""), Some(0))
    );
    assert!(env.chunks().await.is_empty());
    assert_settles(&env, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_loop_fails_alone_and_the_sync_is_clean_once_it_is_gone() -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    env.put("sub/b.md", "b\n");
    std::os::unix::fs::symlink("..", env.path("sub/loop"))?;
    let out = env.sync(&[]);
    let stderr = exits(&out, 1);
    no_backtrace(&stderr);
    assert!(stderr.contains("sub/loop"), "{stderr}");
    assert_eq!(env.docs().await, env.expected(&["a.md", "sub/b.md"]));
    std::fs::remove_file(env.path("sub/loop"))?;
    ok(&env.sync(&[]));
    let inspect = ok(&env.inspect());
    assert!(inspect.contains("failed components: 0"), "{inspect}");
    assert_eq!(env.docs().await, env.expected(&["a.md", "sub/b.md"]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_and_ledger_with_spaces_and_unicode_in_their_paths_work() -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    let dir = env.tmp.path().join("my dir é");
    std::fs::create_dir(&dir)?;
    let db = dir.join("wéir data.db");
    let into = sqlite_url(&db);
    let ledger = dir.join("lédger dir");
    let args = sync_args(&env.tree, &into, &ledger, &[]);
    ok(&env.weir(&args));
    let again = ok(&env.weir(&args));
    assert!(again.contains("1 unchanged files skipped"), "{again}");
    assert_eq!(keys(&read_documents(&db).await), ["a.md"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_passwords_never_show_and_a_new_password_is_the_same_database() -> TestResult {
    PgDatabase::around("accept_password", async |pg| {
        let env = Env::new();
        env.put("a.md", "a\n");
        // Trust authentication ignores the password.
        let with = |password: &str| pg.url.replacen("://", &format!("://x:{password}@"), 1);
        let url = if pg.url.contains('@') {
            let (scheme, rest) = pg.url.split_once("://").unwrap();
            let (user, host) = rest.split_once('@').unwrap();
            let user = user.split(':').next().unwrap();
            format!("{scheme}://{user}:hunter2@{host}")
        } else {
            with("hunter2")
        };
        let out = env.sync_into(&url, &[]);
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        ok(&out);
        assert!(!all.contains("hunter2"), "{all}");
        let inspect = ok(&env.inspect());
        assert!(!inspect.contains("hunter2"), "{inspect}");
        for entry in std::fs::read_dir(&env.ledger)? {
            let path = entry?.path();
            if path.is_file() {
                let bytes = std::fs::read(&path)?;
                assert!(
                    !bytes.windows(7).any(|w| w == b"hunter2"),
                    "{} holds the password",
                    path.display()
                );
            }
        }
        let other = url.replace("hunter2", "sw0rdfish");
        let again = env.sync_into(&other, &[]);
        let out = ok(&again);
        assert!(out.contains("1 unchanged files skipped"), "{out}");
        // A failed connection does not show it either.
        let bad = url.replace(":5432/", ":1/");
        let other_ledger = Path::new("other-ledger");
        let failed = env.weir(&sync_args(&env.tree, &bad, other_ledger, &[]));
        let stderr = exits(&failed, 2);
        assert!(!stderr.contains("hunter2"), "{stderr}");
        TestResult::Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_mode_does_not_delete_every_row_when_the_watched_directory_disappears() -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    env.put("b.md", "b\n");
    let live = env.spawn_live(100, &[]);
    let (status, stderr) = while_live(live, async {
        let first = wait_for_documents(&env.db, 2).await;
        assert!(first, "the first run landed");
        std::fs::remove_dir_all(&env.tree)?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        TestResult::Ok(())
    })
    .await?;
    no_backtrace(&stderr);
    assert!(status.is_some(), "it stopped: {stderr}");
    // A missing directory is an error for `weir sync` (exit code 2), not an
    // empty one: live mode must not take it for one either.
    assert_eq!(doc_count(&env.db).await, Some(2), "{stderr}");
    Ok(())
}

#[test]
fn inspect_of_a_directory_that_is_not_a_ledger_creates_nothing_in_it() -> TestResult {
    let env = Env::new();
    let dir = env.tmp.path().join("not-a-ledger");
    std::fs::create_dir(&dir)?;
    std::fs::write(dir.join("user-file.txt"), "mine")?;
    let out = env.weir(&["inspect", "--ledger", dir.to_str().unwrap()]);
    no_backtrace(&text(&out.stderr));
    let mut entries: Vec<String> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    assert_eq!(
        entries,
        ["user-file.txt"],
        "inspect wrote a ledger into a directory that held none; it said: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modification_times_before_1970_and_after_2100_are_recorded_exactly() -> TestResult {
    let env = Env::new();
    env.put("old.md", "old\n");
    env.put("far.md", "far\n");
    let old = SystemTime::UNIX_EPOCH - Duration::from_secs(10 * 365 * 86_400 + 123);
    let far = SystemTime::UNIX_EPOCH + Duration::from_secs(200 * 365 * 86_400);
    set_mtime(&env.path("old.md"), old);
    set_mtime(&env.path("far.md"), far);
    ok(&env.sync(&[]));
    for (key, t) in [("old.md", old), ("far.md", far)] {
        let stored = env.modified(key).await.expect("a modification time");
        assert_eq!(
            chrono::DateTime::parse_from_rfc3339(&stored)?.with_timezone(&chrono::Utc),
            chrono::DateTime::<chrono::Utc>::from(t),
            "{key}: {stored}"
        );
    }
    assert_settles(&env, 2);
    Ok(())
}

#[test]
fn inspect_drop_and_sync_refuse_a_directory_with_weir_lock_and_sled_that_is_not_a_ledger(
) -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    let dir = env.tmp.path().join("looks-like-a-ledger");
    std::fs::create_dir_all(dir.join("sled"))?;
    std::fs::write(dir.join("weir.lock"), "")?;
    let shown = dir.to_str().unwrap();
    let db = env.url_arg();
    for args in [
        vec!["inspect", "--ledger", shown],
        vec!["drop", "--yes", "--into", &db, "--ledger", shown],
        vec!["sync", "tree", "--into", &db, "--ledger", shown],
    ] {
        let out = env.weir(&args);
        let stderr = exits(&out, 2);
        no_backtrace(&stderr);
        assert!(
            stderr.contains(&format!("{shown} is not a weir ledger")),
            "{args:?}: {stderr}"
        );
    }
    let mut entries: Vec<String> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    assert_eq!(entries, ["sled", "weir.lock"]);
    assert_eq!(std::fs::read_dir(dir.join("sled"))?.count(), 0);
    Ok(())
}
