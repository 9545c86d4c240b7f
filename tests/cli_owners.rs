//! One owner per table: the tables `weir sync` creates are registered in
//! their database with the ledger that manages them, a second ledger is
//! refused (exit 2, naming the owner) without changing anything, `weir
//! drop` drops only what its owner owns, and `--adopt` takes the tables
//! over when their ledger is lost.

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli;
mod cmd;
mod pg;

use std::path::Path;

use cli::{exits, ok, sync_args, Env, PgDatabase, TestResult};
use cmd::text;

/// `weir sync` of the env's tree into `into` with the ledger at `ledger`.
fn sync_with(env: &Env, into: &str, ledger: &Path, extra: &[&str]) -> std::process::Output {
    env.weir(&sync_args(&env.tree, into, ledger, extra))
}

/// `weir drop --yes` of `into` with the ledger at `ledger`.
fn drop_with(env: &Env, into: &str, ledger: &Path) -> std::process::Output {
    env.weir(&[
        "drop",
        "--into",
        into,
        "--ledger",
        ledger.to_str().unwrap(),
        "--yes",
    ])
}

fn files(env: &Env) {
    env.put("a.md", "alpha\n\nsecond paragraph\n");
    env.put("b.md", "beta\n");
}

#[tokio::test]
async fn a_second_ledger_syncing_into_a_sqlite_database_is_refused_naming_the_owner_and_changes_nothing(
) {
    let env = Env::new();
    files(&env);
    ok(&env.sync(&[]));
    let before = (env.docs().await, env.chunks().await);

    // Another tree, another ledger, the same database.
    let other = env.tmp.path().join("other-ledger");
    std::fs::remove_file(env.path("a.md")).unwrap();
    env.put("c.md", "gamma\n");
    let out = sync_with(&env, &env.url_arg(), &other, &[]);
    let stderr = exits(&out, 2);
    assert!(stderr.contains("table documents"), "{stderr}");
    assert!(stderr.contains("is managed by the ledger"), "{stderr}");
    assert!(
        stderr.contains(
            &std::fs::canonicalize(&env.ledger)
                .unwrap()
                .display()
                .to_string()
        ),
        "the error names where the owning ledger is: {stderr}"
    );
    assert!(stderr.contains("--adopt"), "{stderr}");
    assert_eq!((env.docs().await, env.chunks().await), before);

    // Its drop drops nothing of the first ledger's.
    let out = drop_with(&env, &env.url_arg(), &other);
    exits(&out, 2);
    assert_eq!((env.docs().await, env.chunks().await), before);

    // The owner goes on as before.
    ok(&env.sync(&[]));
    assert_eq!(env.docs().await, env.expected(&["b.md", "c.md"]));
}

#[tokio::test]
async fn a_lost_ledgers_tables_are_taken_over_with_adopt_and_then_refused_to_the_old_ledger() {
    let env = Env::new();
    files(&env);
    ok(&env.sync(&[]));
    let new_ledger = env.tmp.path().join("new-ledger");
    env.put("c.md", "gamma\n");
    let out = sync_with(&env, &env.url_arg(), &new_ledger, &["--adopt"]);
    let stdout = ok(&out);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("taking table documents"),
        "{stdout}\n{stderr}"
    );
    assert_eq!(env.docs().await, env.expected(&["a.md", "b.md", "c.md"]));
    // The new ledger manages them now: a further sync changes nothing.
    let again = ok(&sync_with(&env, &env.url_arg(), &new_ledger, &[]));
    assert!(again.contains("0 created, 0 updated, 0 deleted"), "{again}");
    // The old ledger is the other owner now.
    exits(&env.sync(&[]), 2);
    // Dropping with the new owner drops the tables, and the registry
    // goes with its last registration.
    ok(&drop_with(&env, &env.url_arg(), &new_ledger));
    assert_eq!(env.tables().await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_ledger_syncing_into_a_postgres_database_is_refused_and_the_first_ones_tables_are_unchanged(
) -> TestResult {
    PgDatabase::around("cli_owners_pg", async |pg| {
        let env = Env::new();
        files(&env);
        let first = env.tmp.path().join("first");
        let second = env.tmp.path().join("second");
        ok(&sync_with(&env, &pg.url, &first, &[]));
        let before = (pg.docs().await, pg.chunks().await);
        env.put("c.md", "gamma\n");
        let stderr = exits(&sync_with(&env, &pg.url, &second, &[]), 2);
        assert!(stderr.contains("is managed by the ledger"), "{stderr}");
        exits(&drop_with(&env, &pg.url, &second), 2);
        assert_eq!((pg.docs().await, pg.chunks().await), before);
        // The registry is in weir's own schema, not among the tables.
        assert_eq!(pg.tables().await, vec!["chunks", "documents"]);
        // Its owner drops the tables and their registration.
        ok(&drop_with(&env, &pg.url, &first));
        assert_eq!(pg.tables().await, Vec::<String>::new());
        ok(&sync_with(&env, &pg.url, &second, &[]));
        Ok(())
    })
    .await
}
