//! Retries of a sink failing a tenth of its calls at random are counted in
//! `weir_sink_retries_total`, and `weir_sink_failures_total` counts only
//! the calls that failed for good. Runs in its own process: it installs a
//! global metrics recorder.

mod chaos;
mod support;

use std::sync::Arc;
use std::time::Duration;

use chaos::{chaos_sink, desired, grid, Chaos};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::*;
use weir::prelude::*;

/// The total of counter `name` since the last snapshot (a snapshot of the
/// debugging recorder resets its counters).
fn counter_totals(snapshotter: &Snapshotter) -> impl Fn(&str) -> u64 {
    let snapshot = snapshotter.snapshot().into_vec();
    move |name: &str| {
        snapshot
            .iter()
            .filter(|(k, _, _, _)| k.key().name() == name)
            .map(|(_, _, _, v)| match v {
                DebugValue::Counter(n) => *n,
                _ => 0,
            })
            .sum()
    }
}

async fn run_grid(
    app: &App,
    handler: RowHandler,
    comps: Vec<(String, Vec<(String, String)>)>,
) -> Result<UpdateStats> {
    let run = app.run(move |ctx| async move {
        let provider =
            register_root_target_states_provider::<String, _>(&ctx, "chaos/rows", handler)?;
        ctx.mount_each(
            comps,
            |(key, _): &(String, Vec<(String, String)>)| key.clone(),
            move |c, (_, rows)| {
                let provider = provider.clone();
                async move { declare_into(&c, &provider, rows) }
            },
        )
        .await
    });
    tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .map_err(|_| Error::msg("the run hung"))?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_counted_and_only_calls_that_fail_for_good_count_as_failures() -> Result<()> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    if recorder.install().is_err() {
        return Err(Error::msg("a global recorder was already installed"));
    }
    let dir = tempfile::tempdir()?;
    // The default RetryPolicy; one component's 100 actions per call, so
    // that each failed call is retried (not split) and there are enough
    // calls for failures to happen.
    let app = App::builder("chaos-metrics")
        .ledger_path(dir.path().join("ledger"))
        .batch_policy(BatchPolicy {
            max_actions: 100,
            ..BatchPolicy::default()
        })
        .build()
        .await?;

    // 5,000 rows in 50 components, 10 % of the calls failing: one run lands
    // everything.
    let chaos = Chaos::from_env(100);
    let rig = Rig::new();
    let handler = RowHandler::new(chaos_sink(
        Arc::clone(&chaos),
        rig.log.clone(),
        rig.store.clone(),
    ));
    let comps = grid(50, 100);
    let want = desired(&comps);
    let stats = run_grid(&app, handler, comps).await?;
    assert_eq!(stats.created, 5_000);
    assert_eq!(rig.store.snapshot(), want);
    let total = counter_totals(&snapshotter);
    let (retries, failures) = (
        total(weir::metrics::SINK_RETRIES),
        total(weir::metrics::SINK_FAILURES),
    );
    eprintln!(
        "{} calls, {} failed; retries counted {retries}, failures {failures}",
        chaos.calls(),
        chaos.failed()
    );
    assert!(retries > 0, "no retry was counted");
    // Every failed call held one component and was retried.
    assert_eq!(retries, chaos.failed() as u64);
    assert_eq!(
        failures, 0,
        "calls that succeeded on retry counted as failures"
    );
    assert_eq!(total(weir::metrics::SINK_SPLITS), 0);

    // A component whose calls always fail: it is retried up to the policy's
    // attempts, then counted once as a failure; the random failures of the
    // other components are retries only.
    let chaos = Chaos::with_seed(chaos.seed ^ 1, 100);
    chaos
        .always_fail
        .lock()
        .map_err(|_| Error::msg("poisoned"))?
        .push("c07-r000".into());
    let rig = Rig::new();
    let handler = RowHandler::new(chaos_sink(
        Arc::clone(&chaos),
        rig.log.clone(),
        rig.store.clone(),
    ));
    let comps: Vec<(String, Vec<(String, String)>)> = grid(50, 100)
        .into_iter()
        .map(|(c, rows)| {
            let rows = rows
                .into_iter()
                .map(|(k, v)| (k, format!("{v}!")))
                .collect();
            (c, rows)
        })
        .collect();
    let err = err_or(run_grid(&app, handler, comps).await, |s| {
        format!("a component whose calls always fail did not fail: {s:?}")
    })?;
    assert_eq!(failed_paths(&err), vec!["/c07"], "{err}");
    let total = counter_totals(&snapshotter);
    let (retries, failures) = (
        total(weir::metrics::SINK_RETRIES),
        total(weir::metrics::SINK_FAILURES),
    );
    eprintln!(
        "with c07 always failing: {} calls, {} failed; retries {retries}, failures {failures}",
        chaos.calls(),
        chaos.failed()
    );
    assert_eq!(failures, 1, "one call failed for good");
    let attempts = u64::from(RetryPolicy::default().max_attempts);
    assert_eq!(retries + failures, chaos.failed() as u64);
    assert!(retries >= attempts - 1, "c07 was retried: {retries}");
    Ok(())
}
