//! weir's own threads (the reconciler shards, the sinks' arbiter and the
//! ledger's thread) run as batch work, and the user's runtime keeps its
//! own scheduling policy.
#![cfg(target_os = "linux")]

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use support::*;
use weir::prelude::*;

/// `SCHED_BATCH`, as `/proc` shows it.
const SCHED_BATCH: u32 = 3;

/// The scheduling policy in a thread's `stat` (its field 41).
fn policy_in(stat: &str) -> Option<u32> {
    // The name in parentheses may hold spaces: fields count from the
    // state, field 3, after its closing one.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    after_name.split_whitespace().nth(41 - 3)?.parse().ok()
}

/// The policies of this process's threads, by thread name.
fn threads() -> Result<BTreeMap<String, Vec<u32>>> {
    let mut found = BTreeMap::<String, Vec<u32>>::new();
    for task in std::fs::read_dir("/proc/self/task")? {
        let dir = task?.path();
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            continue; // It ended meanwhile.
        };
        let name = std::fs::read_to_string(dir.join("comm"))?
            .trim()
            .to_string();
        let policy = policy_in(&stat)
            .ok_or_else(|| Error::msg(format!("no policy in {}: {stat}", dir.display())))?;
        found.entry(name).or_default().push(policy);
    }
    Ok(found)
}

/// Whether the app's threads run as batch work: three shards and the
/// sinks' arbiter (actix names its arbiters' threads `actix-rt|system:…`,
/// cut to 15 bytes), and the ledger's thread.
fn engine_is_batch(seen: &BTreeMap<String, Vec<u32>>) -> bool {
    seen.get("actix-rt|system") == Some(&vec![SCHED_BATCH; 4])
        && seen.get("weir-ledger") == Some(&vec![SCHED_BATCH])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_threads_run_as_batch_work_and_the_runtimes_keep_their_policy() -> Result<()> {
    // The runtime's workers inherit the policy of the thread that started
    // the test, whatever it is.
    let inherited = policy_in(&std::fs::read_to_string("/proc/thread-self/stat")?)
        .ok_or_else(|| Error::msg("no policy of this thread"))?;
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    // Each thread sets its policy as the first thing it does, which may
    // come just after the app is built.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = threads()?;
    while !engine_is_batch(&seen) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
        seen = threads()?;
    }
    assert!(engine_is_batch(&seen), "weir's threads: {seen:?}");
    let workers = seen.get("tokio-rt-worker").cloned().unwrap_or_default();
    assert!(!workers.is_empty(), "no runtime worker among {seen:?}");
    assert!(
        workers.iter().all(|&p| p == inherited),
        "the runtime's workers: {seen:?}"
    );
    drop(app);
    Ok(())
}
