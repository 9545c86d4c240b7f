//! The no-change path writes nothing to the ledger. Runs in its own process:
//! it counts ledger commits through a global metrics recorder.

mod support;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::*;
use weir::prelude::*;

/// Ledger commits and keys written since the last call (a snapshot
/// resets the debugging recorder's counters).
fn ledger_writes(snapshotter: &Snapshotter) -> (u64, u64) {
    let snapshot = snapshotter.snapshot().into_vec();
    let sum = |name: &str| -> u64 {
        snapshot
            .iter()
            .filter(|(k, _, _, _)| k.key().name() == name)
            .map(|(_, _, _, v)| match v {
                DebugValue::Counter(n) => *n,
                _ => 0,
            })
            .sum()
    };
    (
        sum(weir::metrics::LEDGER_COMMITS),
        sum(weir::metrics::LEDGER_RECORDS),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_rerun_writes_nothing_to_the_ledger() -> Result<()> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    if recorder.install().is_err() {
        return Err(Error::msg("a global recorder was already installed"));
    }
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let sync =
        |rig: Rig| {
            let handler = rig.handler();
            app.run(move |ctx| async move {
                let rows = register_root_target_states_provider(&ctx, "test/row", handler)?;
                declare_target_state(&ctx, rows.target_state("root", "r".to_string()))?;
                let items: Vec<u32> = (0..50).collect();
                ctx.mount_each(items, |i| *i, move |ctx, i| {
                let rows = rows.clone();
                async move { declare_target_state(&ctx, rows.target_state(i, format!("v{i}"))) }
            })
            .await
            })
        };
    sync(Rig::new()).await?;
    let (commits, keys) = ledger_writes(&snapshotter);
    assert!(commits > 0 && keys > 0, "the first run wrote the ledger");

    let rig = Rig::new();
    let stats = sync(rig.clone()).await?;
    assert_eq!(stats.unchanged, 51);
    assert_eq!(rig.log.call_count(), 0);
    assert_eq!(
        ledger_writes(&snapshotter),
        (0, 0),
        "an unchanged run wrote to the ledger"
    );
    Ok(())
}
