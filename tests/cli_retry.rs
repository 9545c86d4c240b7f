//! End-to-end tests of `weir retry` (a sync of just the files that failed
//! in the last sync), `weir inspect --failed`, and the quarantine of files
//! that keep failing.

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli;
mod cmd;
mod pg;

use std::process::Output;

use cli::{exits, ok, Env, TestResult};

/// `weir retry TREE --into sqlite://DB --ledger LEDGER`.
fn retry(env: &Env) -> Output {
    let into = env.url_arg();
    env.weir(&[
        "retry",
        env.tree.to_str().unwrap(),
        "--into",
        &into,
        "--ledger",
        env.ledger.to_str().unwrap(),
    ])
}

/// `weir inspect --failed --ledger LEDGER`.
fn failed(env: &Env) -> String {
    ok(&env.weir(&[
        "inspect",
        "--failed",
        "--ledger",
        env.ledger.to_str().unwrap(),
    ]))
}

/// A link to nothing: it cannot be read, even by root.
fn break_file(env: &Env, rel: &str) {
    let path = env.path(rel);
    let _ = std::fs::remove_file(&path);
    std::os::unix::fs::symlink("missing-target", path).unwrap();
}

#[tokio::test]
async fn retry_syncs_just_the_files_that_failed_and_leaves_the_others_as_they_are() -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    break_file(&env, "broken.md");
    exits(&env.sync(&[]), 1);
    let listed = failed(&env);
    assert!(
        listed.contains("broken.md: failed 1 sync(s) in a row"),
        "{listed}"
    );

    // The file is mended; another one changes meanwhile.
    std::fs::remove_file(env.path("broken.md"))?;
    env.put("broken.md", "mended\n");
    env.put("a.md", "a, edited\n");
    let out = ok(&retry(&env));
    assert!(out.contains("retrying 1 failed file(s)"), "{out}");
    let docs = env.docs().await;
    assert_eq!(docs.get("broken.md"), Some(&cli::doc_of(b"mended\n")));
    assert_eq!(
        docs.get("a.md"),
        Some(&cli::doc_of(b"a\n")),
        "a file that did not fail is left for the next sync"
    );
    assert_eq!(failed(&env).trim(), "no failed files");

    // The next sync takes the edit.
    ok(&env.sync(&[]));
    assert_eq!(env.docs().await, env.expected(&["a.md", "broken.md"]));
    Ok(())
}

#[test]
fn retry_with_nothing_failed_says_so_and_exits_0() -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    ok(&env.sync(&[]));
    let out = ok(&retry(&env));
    assert!(out.contains("nothing to retry"), "{out}");
    Ok(())
}

#[test]
fn retry_without_a_ledger_is_an_error_that_says_to_sync_first() -> TestResult {
    let env = Env::new();
    let stderr = exits(&retry(&env), 2);
    assert!(stderr.contains("weir sync"), "{stderr}");
    assert!(!env.ledger.exists());
    Ok(())
}

#[test]
fn a_file_failing_three_syncs_in_a_row_is_reported_quarantined_until_it_is_mended() -> TestResult {
    let env = Env::new();
    env.put("a.md", "a\n");
    break_file(&env, "broken.md");
    let mut stderr = String::new();
    for _ in 0..3 {
        stderr = exits(&env.sync(&[]), 1);
    }
    assert!(
        stderr.contains("failed 3 syncs in a row: quarantined"),
        "{stderr}"
    );
    assert!(stderr.contains("1 file(s) quarantined"), "{stderr}");
    let listed = failed(&env);
    assert!(
        listed.contains("broken.md: failed 3 sync(s) in a row, quarantined"),
        "{listed}"
    );

    std::fs::remove_file(env.path("broken.md"))?;
    env.put("broken.md", "mended\n");
    ok(&retry(&env));
    assert_eq!(failed(&env).trim(), "no failed files");
    Ok(())
}
