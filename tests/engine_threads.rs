//! weir's own threads (the reconciler shards, the sinks' arbiter and the
//! ledger's thread) run as batch work, and the user's runtime keeps its
//! own scheduling policy.
#![cfg(target_os = "linux")]

mod support;

use support::*;
use weir::prelude::*;

/// `SCHED_OTHER` and `SCHED_BATCH`, as `/proc` shows them.
const SCHED_OTHER: u32 = 0;
const SCHED_BATCH: u32 = 3;

/// Each thread of this process: its name and its scheduling policy
/// (field 41 of `/proc/self/task/<tid>/stat`).
fn threads() -> Result<Vec<(String, u32)>> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task")? {
        let dir = task?.path();
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            continue; // It ended meanwhile.
        };
        let name = std::fs::read_to_string(dir.join("comm"))?
            .trim()
            .to_string();
        // The name in parentheses may hold spaces: fields count from
        // the state, field 3, after its closing one.
        let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let policy = after_name
            .split_whitespace()
            .nth(41 - 3)
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| Error::msg(format!("no policy in {}: {stat}", dir.display())))?;
        found.push((name, policy));
    }
    Ok(found)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_threads_run_as_batch_work_and_the_runtimes_keep_their_policy() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let mut seen = std::collections::BTreeMap::<String, Vec<u32>>::new();
    for (name, policy) in threads()? {
        seen.entry(name).or_default().push(policy);
    }
    // Three shards and the sinks' arbiter (actix names its arbiters'
    // threads `actix-rt|system:…`, cut to 15 bytes), and the ledger.
    let arbiters = seen.get("actix-rt|system").cloned().unwrap_or_default();
    assert_eq!(arbiters, vec![SCHED_BATCH; 4], "the arbiters: {seen:?}");
    assert_eq!(
        seen.get("weir-ledger"),
        Some(&vec![SCHED_BATCH]),
        "the ledger's thread: {seen:?}"
    );
    let workers = seen.get("tokio-rt-worker").cloned().unwrap_or_default();
    assert!(!workers.is_empty(), "no runtime worker among {seen:?}");
    assert!(
        workers.iter().all(|&p| p == SCHED_OTHER),
        "the runtime's workers: {seen:?}"
    );
    drop(app);
    Ok(())
}
