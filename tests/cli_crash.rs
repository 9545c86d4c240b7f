//! The `weir` command killed (`SIGKILL`, by the engine's fault-injection
//! hooks, on for this package's tests) at a point of a sync, then run
//! again on the same ledger and database.

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli;
mod cmd;
mod pg;

use std::time::Duration;

use cli::{ok, Env};
use weir::fault;

#[tokio::test]
async fn a_sync_killed_between_creating_its_two_tables_creates_the_second_on_the_next_sync() {
    let env = Env::new();
    env.put("a.md", "alpha\n");
    env.put("b.md", "beta\n");
    let into = env.url_arg();
    let args = cli::sync_args(&env.tree, &into, &env.ledger, &[]);
    // The second sink call is the creation of `chunks`, after `documents`
    // was created and committed: killed with its intent durable.
    let kill = format!("{}:2", fault::SINK_BEFORE_APPLY);
    let mut child = cmd::spawn_env(env.tmp.path(), &args, None, &[(fault::KILL_ENV, &kill)]);
    let status = cmd::wait_for_exit(&mut child, Duration::from_secs(60));
    assert_eq!(
        status.and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s)),
        Some(9),
        "the sync was not killed where planned"
    );
    let mut tables = env.tables().await;
    tables.sort();
    assert_eq!(tables, ["documents"], "killed before chunks was created");
    let out = ok(&env.sync(&[]));
    assert!(out.contains("synced 2 files"), "{out}");
    let mut tables = env.tables().await;
    tables.sort();
    assert_eq!(tables, ["chunks", "documents"]);
    assert_eq!(env.docs().await.len(), 2);
    assert_eq!(env.chunks().await.len(), 2);
}
