//! Engine review: scenarios where the engine loses track of what it
//! created, or fails to report a failure. Each test names the behaviour the
//! contract asks for; a failing test demonstrates a bug.

mod support;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::*;
use weir::prelude::*;

const ROWS: &str = "test/rows";

async fn bounded<T>(fut: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .map_err(|_| Error::msg("timed out after 60s: the engine hung"))?
}

// ---------------------------------------------------------------------------
// Child lists of failed parents (guarantee 3)
// ---------------------------------------------------------------------------

/// Run 1: `/p` mounts `/p/c` (which declares `x` and commits), then `/p`'s
/// own code fails. Run 2: `/p` succeeds and no longer mounts `c`: `x` must
/// be deleted.
#[tokio::test]
async fn a_child_mounted_by_a_parent_that_then_failed_is_deleted_once_no_longer_mounted(
) -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();

        let handler = rig.handler();
        let r = app
            .run(move |ctx| async move {
                let provider = register_root_target_states_provider(&ctx, ROWS, handler)?;
                ctx.mount("p", move |p| async move {
                    let provider = provider.clone();
                    p.mount("c", move |c| async move {
                        declare_target_state(&c, provider.target_state("x", "1".to_string()))
                    })
                    .await?;
                    Err::<(), _>(Error::msg("p fails after mounting c"))
                })
                .await
                .ok();
                Ok(())
            })
            .await;
        let err = r.err().ok_or_else(|| Error::msg("run 1 should fail"))?;
        assert_eq!(failed_paths(&err), vec!["/p"], "{err}");
        assert_eq!(rig.store.snapshot(), map(&[("x", "1")]), "c committed x");

        // Run 2: p succeeds and mounts nothing.
        let handler = rig.handler();
        app.run(move |ctx| async move {
            register_root_target_states_provider(&ctx, ROWS, handler)?;
            ctx.mount("p", |_p| async move { Ok(()) }).await
        })
        .await?;
        assert_eq!(
            rig.store.snapshot(),
            map(&[]),
            "x, created by /p/c, was never deleted: the failed parent did not record its new child"
        );
        Ok(())
    })
    .await
}

/// As above, but `/p` fails because its own row's sink call fails.
#[tokio::test]
async fn a_child_mounted_by_a_parent_whose_sink_failed_is_deleted_once_no_longer_mounted(
) -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let store = Store::default();
        let failing = Rig {
            store: store.clone(),
            ..Rig::failing(Arc::new(|_, keys: &[String]| {
                keys.iter()
                    .any(|k| k == "p-row")
                    .then(|| "p-row is rejected".to_string())
            }))
        };
        let handler = failing.handler();
        let r = app
            .run(move |ctx| async move {
                let provider = register_root_target_states_provider(&ctx, ROWS, handler)?;
                ctx.mount("p", move |p| async move {
                    let inner = provider.clone();
                    p.mount("c", move |c| async move {
                        declare_target_state(&c, inner.target_state("x", "1".to_string()))
                    })
                    .await?;
                    declare_target_state(&p, provider.target_state("p-row", "1".to_string()))
                })
                .await
                .ok();
                Ok(())
            })
            .await;
        let err = r.err().ok_or_else(|| Error::msg("run 1 should fail"))?;
        assert_eq!(failed_paths(&err), vec!["/p"], "{err}");
        assert_eq!(store.snapshot(), map(&[("x", "1")]));

        let healthy = Rig {
            store: store.clone(),
            ..Rig::new()
        };
        let handler = healthy.handler();
        app.run(move |ctx| async move {
            let provider = register_root_target_states_provider(&ctx, ROWS, handler)?;
            ctx.mount("p", move |p| async move {
                declare_target_state(&p, provider.target_state("p-row", "1".to_string()))
            })
            .await
        })
        .await?;
        assert_eq!(
            store.snapshot(),
            map(&[("p-row", "1")]),
            "x, created by /p/c, was never deleted"
        );
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------
// Containers whose table sink really drops the rows on a destructive change
// ---------------------------------------------------------------------------

/// A table whose rows live in `store`: dropping or recreating the table
/// clears them. Switches make the table sink fail (applying nothing) or
/// the row sink apply and then fail (as a call that times out after the
/// write does).
#[derive(Clone, Default)]
struct TableWorld {
    store: Store,
    log: Log,
    table_fails: Arc<AtomicBool>,
    rows_apply_then_fail: Arc<AtomicBool>,
}

impl TableWorld {
    fn row_sink(&self) -> TargetActionSink<RowAction> {
        let store = self.store.clone();
        let log = self.log.clone();
        let fail = Arc::clone(&self.rows_apply_then_fail);
        TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<RowAction>>| {
            let store = store.clone();
            let log = log.clone();
            let fail = fail.load(Ordering::SeqCst);
            async move {
                let mut entries = Vec::new();
                {
                    let mut rows = store.rows.lock().map_err(|_| Error::msg("poisoned"))?;
                    for a in actions {
                        let verb = verb_of(&a);
                        let row = a.into_inner();
                        match &row.value {
                            Some(v) => {
                                rows.insert(row.key.clone(), v.clone());
                            }
                            None => {
                                rows.remove(&row.key);
                            }
                        }
                        entries.push(format!("{verb} {}", row.key));
                    }
                }
                if let Ok(mut c) = log.calls.lock() {
                    c.push(entries);
                }
                if fail {
                    return Err(Error::permanent("the row call timed out after writing"));
                }
                Ok(())
            }
        })
    }

    /// The reference design's TableHandler, Destructive on a changed spec.
    fn table(&self) -> TableHandler {
        let store = self.store.clone();
        let fails = Arc::clone(&self.table_fails);
        let rows = self.row_sink();
        TableHandler {
            sink: TargetActionSink::from_async_fn_with_child_handler(
                move |actions: Vec<TargetAction<TableAction>>| {
                    let store = store.clone();
                    let fails = fails.load(Ordering::SeqCst);
                    async move {
                        if fails {
                            return Err(Error::permanent("the table cannot be altered now"));
                        }
                        for a in actions {
                            let a = a.into_inner();
                            if a.recreate || a.drop {
                                if let Ok(mut r) = store.rows.lock() {
                                    r.clear();
                                }
                            }
                        }
                        Ok(())
                    }
                },
                move |_: &TableAction| {
                    Ok(ChildTargetDef::new::<String, _>(RowHandler::new(
                        rows.clone(),
                    )))
                },
            ),
            invalidation: Some(TargetChildInvalidation::Destructive),
        }
    }

    /// One run: mount table "t" with `generation` and declare `rows` in it.
    async fn sync(&self, app: &App, generation: &str, rows: &[(&str, &str)]) -> Result<()> {
        let table = self.table();
        let spec = spec(generation);
        let rows = owned(rows);
        bounded(app.run(move |ctx| async move {
            let p = register_root_target_states_provider(&ctx, "test/table", table)?;
            let child: TargetStateProvider<String> =
                mount_target(&ctx, p.target_state("t", spec)).await?;
            declare_into(&ctx, &child, rows)
        }))
        .await
        .map(|_| ())
    }
}

/// Run 1: table g1 with row r. Run 2: table g2 (destructive: the table is
/// recreated, r is gone), r is written again but its sink call fails after
/// writing. Run 3: r is no longer declared: it must be deleted.
#[tokio::test]
async fn a_row_written_under_a_new_generation_by_a_failed_call_is_deleted_when_no_longer_declared(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let w = TableWorld::default();
    w.sync(&app, "g1", &[("r", "v")]).await?;
    assert_eq!(w.store.snapshot(), map(&[("r", "v")]));

    w.rows_apply_then_fail.store(true, Ordering::SeqCst);
    let err = w.sync(&app, "g2", &[("r", "v")]).await;
    assert!(err.is_err(), "run 2 should fail");
    assert_eq!(
        w.store.snapshot(),
        map(&[("r", "v")]),
        "r was written again"
    );

    w.rows_apply_then_fail.store(false, Ordering::SeqCst);
    w.log.clear();
    w.sync(&app, "g2", &[]).await?;
    assert_eq!(
        w.store.snapshot(),
        map(&[]),
        "r exists in the table but its records were dropped: nothing deleted it (row calls: {:?})",
        w.log.calls()
    );
    Ok(())
}

/// Run 1: table g1 with rows r and s. Run 2: table g2 (destructive), but
/// the table call fails: the table was never recreated, r and s are still
/// there. Run 3: table g2 succeeds (the handler sees g2 among the possible
/// records: no invalidation), only r declared: s must be deleted.
#[tokio::test]
async fn a_destructive_change_whose_container_call_failed_does_not_drop_the_rows_records(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let w = TableWorld::default();
    w.sync(&app, "g1", &[("r", "v"), ("s", "v")]).await?;

    w.table_fails.store(true, Ordering::SeqCst);
    let err = w.sync(&app, "g2", &[("r", "v"), ("s", "v")]).await;
    assert!(err.is_err(), "run 2 should fail");
    assert_eq!(w.store.snapshot(), map(&[("r", "v"), ("s", "v")]));

    w.table_fails.store(false, Ordering::SeqCst);
    w.log.clear();
    w.sync(&app, "g2", &[("r", "v")]).await?;
    assert_eq!(
        w.store.snapshot(),
        map(&[("r", "v")]),
        "s is still in the never-recreated table, and untracked (row calls: {:?})",
        w.log.calls()
    );
    Ok(())
}

/// Run 1: table g1 with rows r and s, declared by the root. Run 2: table
/// g2 (destructive), but the table call fails, so the root (which goes on
/// without the table) declares no rows: r and s are no longer declared and
/// the table was never recreated, so they must be deleted.
#[tokio::test]
async fn rows_no_longer_declared_under_a_container_whose_destructive_call_failed_are_deleted(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let w = TableWorld::default();
    w.sync(&app, "g1", &[("r", "v"), ("s", "v")]).await?;

    w.table_fails.store(true, Ordering::SeqCst);
    w.log.clear();
    let table = w.table();
    let r = bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, "test/table", table)?;
        let spec = spec("g2");
        if let Ok(child) = mount_target::<TableSpec, String>(&ctx, p.target_state("t", spec)).await
        {
            declare_target_state(&ctx, child.target_state("r", "v".to_string()))?;
        }
        Ok(())
    }))
    .await;
    let err = r.err().ok_or_else(|| Error::msg("run 2 should fail"))?;
    assert_eq!(
        failed_paths(&err).len(),
        1,
        "only the table's component: {err}"
    );
    // Run 3: the table call works again; still no rows declared.
    w.table_fails.store(false, Ordering::SeqCst);
    w.sync(&app, "g2", &[]).await?;
    assert_eq!(
        w.store.snapshot(),
        map(&[]),
        "r and s, still in the never-recreated table, were forgotten without a delete (row calls: {:?})",
        w.log.calls()
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Panics in handler code
// ---------------------------------------------------------------------------

/// A row handler that panics on the value "!panic".
#[derive(Clone)]
struct PanickyRows(RowHandler);

impl TargetHandler<String> for PanickyRows {
    type TrackingRecord = String;
    type Action = RowAction;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<String>,
        prev: Vec<String>,
        missing: bool,
    ) -> Result<Option<TargetReconcileOutput<RowAction, String>>> {
        if desired.as_deref() == Some("!panic") {
            // The point of this handler: a connector bug that panics.
            #[allow(clippy::panic)]
            std::panic::panic_any("handler bug".to_string());
        }
        self.0.reconcile(key, desired, prev, missing)
    }
}

/// A handler that panics once must fail that run's component only, not
/// break the app for every later run.
#[tokio::test]
async fn a_handler_panic_fails_its_component_and_later_runs_still_work() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app_with(dir.path(), |b| b.shards(1)).await?;
    let rig = Rig::new();

    let handler = PanickyRows(rig.handler());
    let first = bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, ROWS, handler)?;
        let p2 = p.clone();
        ctx.mount("bad", move |c| async move {
            declare_target_state(&c, p2.target_state("b", "!panic".to_string()))
        })
        .await
        .ok();
        ctx.mount("good", move |c| async move {
            declare_target_state(&c, p.target_state("g", "1".to_string()))
        })
        .await
        .ok();
        Ok(())
    }))
    .await;
    let handler = PanickyRows(rig.handler());
    let second = bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, ROWS, handler)?;
        declare_target_state(&ctx, p.target_state("g2", "1".to_string()))
    }))
    .await;
    let first_failed = first.as_ref().err().map(failed_paths);
    assert!(
        second.is_ok() && first_failed == Some(vec!["/bad".to_string()]),
        "run 1 should fail /bad only: {:?}; run 2 should succeed: {:?}",
        first.err().map(|e| e.to_string()),
        second.err().map(|e| e.to_string())
    );
    Ok(())
}

/// A container sink whose child-handler factory panics for table "boom".
fn panicking_factory_table() -> TableHandler {
    let rows = recording_sink(Log::default(), Store::default(), None);
    TableHandler {
        sink: TargetActionSink::from_async_fn_with_child_handler(
            |_: Vec<TargetAction<TableAction>>| async { Ok(()) },
            move |a: &TableAction| {
                if a.name == "boom" {
                    // The point of this factory: a connector bug that panics.
                    #[allow(clippy::panic)]
                    std::panic::panic_any("factory bug".to_string());
                }
                Ok(ChildTargetDef::new::<String, _>(RowHandler::new(
                    rows.clone(),
                )))
            },
        ),
        invalidation: Some(TargetChildInvalidation::Destructive),
    }
}

/// A `mount_each` child that panics while committing (in the child-handler
/// factory) must be reported as failed, not silently dropped.
#[tokio::test]
async fn a_mount_each_child_that_panics_while_committing_is_reported_as_failed() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let table = panicking_factory_table();
    let r = bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, "test/table", table)?;
        ctx.mount_each(
            vec!["ok", "boom"],
            |k: &&str| k.to_string(),
            move |c, k| {
                let p = p.clone();
                async move {
                    let _child: TargetStateProvider<String> =
                        declare_target_state_with_child(&c, p.target_state(k, spec("g")))?;
                    Ok(())
                }
            },
        )
        .await
    }))
    .await;
    match r {
        Ok(stats) => Err(Error::msg(format!(
            "the update succeeded although /boom panicked: {stats:?}"
        ))),
        Err(e) => {
            assert_eq!(failed_paths(&e), vec!["/boom"], "{e}");
            Ok(())
        }
    }
}

// ---------------------------------------------------------------------------
// Resources of a run are released when it ends
// ---------------------------------------------------------------------------

/// A sink (and whatever its function captured, e.g. a connection pool) must
/// not outlive the run that used it: a long-lived App would otherwise keep
/// one sink actor, with its captures, per sink per run.
#[tokio::test]
async fn a_runs_sinks_and_their_captures_are_released_when_the_run_ends() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let pool = Arc::new(());
    for run in 0..3 {
        let captured = Arc::clone(&pool);
        let sink = TargetActionSink::from_async_fn(move |_: Vec<TargetAction<RowAction>>| {
            let _keep = Arc::clone(&captured);
            async { Ok(()) }
        });
        let handler = RowHandler::new(sink);
        bounded(app.run(move |ctx| async move {
            let p = register_root_target_states_provider(&ctx, ROWS, handler)?;
            declare_target_state(&ctx, p.target_state("k", format!("v{run}")))
        }))
        .await?;
    }
    // Let the actor system process any stop.
    let mut held = Arc::strong_count(&pool) - 1;
    for _ in 0..50 {
        if held == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        held = Arc::strong_count(&pool) - 1;
    }
    assert_eq!(
        held, 0,
        "after 3 finished runs, {held} sink function(s) are still alive"
    );
    Ok(())
}
