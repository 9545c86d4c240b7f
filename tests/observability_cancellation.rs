//! Gauges stay right when runs and mounts are cancelled: the gauge of
//! components in flight comes back to zero. Runs in its own process: it
//! installs a global recorder.

mod support;

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::*;
use weir::prelude::*;

fn gauge(snapshotter: &Snapshotter, name: &str) -> Option<f64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find(|(k, _, _, _)| k.key().name() == name)
        .and_then(|(_, _, _, v)| match v {
            DebugValue::Gauge(g) => Some(g.into_inner()),
            _ => None,
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gauge_of_components_in_flight_returns_to_zero_after_cancelled_runs_and_mounts(
) -> Result<()> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    if recorder.install().is_err() {
        return Err(Error::msg("a global recorder was already installed"));
    }
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let hang = |ctx: Ctx| async move {
        ctx.mount_each(
            0..6i64,
            |i| *i,
            |_, _| async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(())
            },
        )
        .await
    };
    // A run dropped while its components hang.
    let dropped = tokio::time::timeout(Duration::from_millis(200), app.run(hang)).await;
    assert!(dropped.is_err(), "the run should still be running");
    // A run whose mount is dropped while its child hangs.
    app.run_report(|ctx| async move {
        let child = ctx.mount("hangs", |_| async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        });
        let _ = tokio::time::timeout(Duration::from_millis(100), child).await;
        Ok(())
    })
    .await?;
    let name = weir::metrics::COMPONENTS_INFLIGHT;
    let mut last = None;
    for _ in 0..200 {
        last = gauge(&snapshotter, name);
        if last == Some(0.0) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(Error::msg(format!("{name} stays at {last:?}")))
}
