//! Cancellation (guarantee 15): dropping the future of a run or of a
//! `mount` stops the components' own code at once; sink calls already in
//! flight finish, and the next run waits only for them and folds in the
//! intents they left before it reconciles; a dropped `mount` is a failed
//! component that applies and deletes nothing.

mod support;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::*;
use weir::prelude::*;

async fn bounded<T>(fut: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .map_err(|_| Error::msg("timed out after 60s"))?
}

/// Counts the component code running now: up while a future runs, down
/// when it is dropped or ends.
#[derive(Clone, Default)]
struct Running(Arc<AtomicUsize>);

struct RunningGuard(Arc<AtomicUsize>);

impl Running {
    fn enter(&self) -> RunningGuard {
        self.0.fetch_add(1, Ordering::SeqCst);
        RunningGuard(Arc::clone(&self.0))
    }

    fn now(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// Waits (up to 5 s) until no code runs; the count then.
    async fn settled(&self) -> usize {
        for _ in 0..500 {
            if self.now() == 0 {
                return 0;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.now()
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A sink over `rig` whose calls carrying the value `gated` announce
/// themselves on `entered`, then wait for `gate`.
fn gated_sink(
    rig: &Rig,
    gated: &'static str,
    entered: Arc<tokio::sync::Notify>,
    gate: Arc<tokio::sync::Semaphore>,
) -> TargetActionSink<RowAction> {
    let (log, store) = (rig.log.clone(), rig.store.clone());
    TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<RowAction>>| {
        let (log, store) = (log.clone(), store.clone());
        let entered = entered.clone();
        let gate = gate.clone();
        async move {
            if actions
                .iter()
                .any(|a| a.inner().value.as_deref() == Some(gated))
            {
                entered.notify_one();
                let _permit = gate
                    .acquire()
                    .await
                    .map_err(|e| Error::msg(e.to_string()))?;
            }
            apply_rows(&log, &store, actions)
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_runs_future_stops_its_components_code_at_once() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let running = Running::default();
    let started = Arc::new(AtomicUsize::new(0));
    let handler = rig.handler();
    let (code, count) = (running.clone(), Arc::clone(&started));
    let run = app.run(move |ctx| async move {
        let rows = register_root_target_states_provider(&ctx, "rows", handler)?;
        ctx.mount_each(
            0..8i64,
            |i| *i,
            move |c, i| {
                let (rows, code, count) = (rows.clone(), code.clone(), Arc::clone(&count));
                async move {
                    let _running = code.enter();
                    count.fetch_add(1, Ordering::SeqCst);
                    declare_target_state(&c, rows.target_state(i, "v".to_string()))?;
                    // Code that would run for an hour.
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Ok(())
                }
            },
        )
        .await
    });
    let wait_started = async {
        while started.load(Ordering::SeqCst) < 8 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::select! {
        r = run => return Err(Error::msg(format!("the run ended: {r:?}"))),
        _ = wait_started => {}
    }
    // The run's future is dropped: every component's code is stopped.
    assert_eq!(running.settled().await, 0, "component code still runs");
    // Nothing was applied; the App goes on with its next run at once.
    assert_eq!(rig.log.call_count(), 0, "{:?}", rig.log.entries());
    let handler = rig.handler();
    let stats = bounded(
        app.run(move |ctx| async move { declare_rows(&ctx, "rows", handler, &[("x", "1")]) }),
    )
    .await?;
    assert_eq!(stats.created, 1, "{stats:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_run_waits_only_for_a_cancelled_runs_sink_call_and_reconciles_with_its_intent(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = Arc::new(app(dir.path()).await?);
    let rig = Rig::new();
    let handler = rig.handler();
    bounded(app.run(move |ctx| async move { declare_rows(&ctx, "rows", handler, &[("x", "v0")]) }))
        .await?;

    // Run 2 declares "old"; its sink call waits at the gate, and the run's
    // future is dropped meanwhile.
    let entered = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let gated = RowHandler::new(gated_sink(&rig, "old", entered.clone(), gate.clone()));
    let run2 =
        app.run(move |ctx| async move { declare_rows(&ctx, "rows", gated, &[("x", "old")]) });
    tokio::select! {
        r = run2 => return Err(Error::msg(format!("run 2 ended: {r:?}"))),
        _ = entered.notified() => {}
    }

    // Run 3 starts only once that call has ended.
    let reconciling = Arc::new(AtomicBool::new(false));
    let watched = RowHandler::watched(rig.sink());
    let seen = watched.clone();
    let (app3, flag) = (Arc::clone(&app), Arc::clone(&reconciling));
    let run3 = tokio::spawn(async move {
        app3.run(move |ctx| async move {
            flag.store(true, Ordering::SeqCst);
            declare_rows(&ctx, "rows", watched, &[("x", "new")])
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !reconciling.load(Ordering::SeqCst),
        "run 3 started while run 2's sink call was still in flight"
    );
    gate.add_permits(1);
    let stats = bounded(async { run3.await.map_err(|e| Error::msg(e.to_string()))? }).await?;
    assert_eq!(stats.updated, 1, "{stats:?}");
    // Run 3 reconciled x with the record run 2's call may have written.
    let calls = seen.seen("x");
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].prev, strings(&["old", "v0"]), "{calls:?}");
    assert_eq!(rig.store.snapshot(), map(&[("x", "new")]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_mount_is_a_failed_component_that_applies_and_deletes_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let handler = rig.handler();
    bounded(app.run(move |ctx| async move {
        ctx.mount("c", move |c| async move {
            declare_rows(&c, "rows", handler, &[("a", "1"), ("b", "1")])
        })
        .await
    }))
    .await?;

    // The child now declares only a new a, then hangs; its parent stops
    // waiting for it after 100 ms and goes on.
    let running = Running::default();
    let (handler, code) = (rig.handler(), running.clone());
    let report = bounded(app.run_report(move |ctx| async move {
        let child = ctx.mount("c", move |c| async move {
            let _running = code.enter();
            declare_rows(&c, "rows", handler, &[("a", "2")])?;
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        });
        let timed_out = tokio::time::timeout(Duration::from_millis(100), child).await;
        if timed_out.is_ok() {
            return Err(Error::msg("the child should still be running"));
        }
        Ok(())
    }))
    .await?;
    assert_eq!(running.settled().await, 0, "the child's code still runs");
    let failed: Vec<String> = report.failures.iter().map(|f| f.path.to_string()).collect();
    assert_eq!(failed, vec!["/c"], "{:?}", report.failures);
    assert!(
        report.failures[0].cause.contains("cancelled"),
        "{:?}",
        report.failures
    );
    // Nothing of it was applied or deleted, and its states stay tracked.
    assert_eq!(rig.store.snapshot(), map(&[("a", "1"), ("b", "1")]));
    let handler = rig.handler();
    rig.log.clear();
    let stats = bounded(app.run(move |ctx| async move {
        ctx.mount("c", move |c| async move {
            declare_rows(&c, "rows", handler, &[("a", "1"), ("b", "1")])
        })
        .await
    }))
    .await?;
    assert_eq!(rig.log.call_count(), 0, "{:?}", rig.log.entries());
    assert_eq!(stats.unchanged, 2, "{stats:?}");
    Ok(())
}
