//! Components found unchanged: a component that declares what its last
//! clean commit recorded, through handlers whose unchanged states need
//! nothing (`TargetHandler::unchanged_needs_nothing`), skips its handlers,
//! sinks and commit. Each test here would catch that path skipping too
//! much: a change it misses, a failure it forgets, a state another
//! component took, a duplicate declaration it hides, a handler that did
//! not opt in, a container's child handler rebuilt with other rules.

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use support::*;
use weir::prelude::*;

const ROWS: &str = "test/rows";

/// What each component declares: component key → its rows (key, value).
type Plan = BTreeMap<String, Vec<(String, String)>>;

fn plan(components: &[(&str, &[(&str, &str)])]) -> Plan {
    components
        .iter()
        .map(|(c, rows)| (c.to_string(), owned(rows)))
        .collect()
}

/// One run: the root mounts one component per entry of `plan`, each
/// declaring its rows through one provider.
async fn sync(app: &App, handler: &RowHandler, plan: &Plan) -> Result<UpdateStats> {
    sync_with(app, handler.clone().saying_unchanged_needs_nothing(), plan).await
}

/// [`sync`] with any row handler.
async fn sync_with(
    app: &App,
    handler: impl TargetHandler<String, TrackingRecord = String, Action = RowAction> + Clone,
    plan: &Plan,
) -> Result<UpdateStats> {
    let items: Vec<(String, Vec<(String, String)>)> = plan.clone().into_iter().collect();
    app.run(move |ctx| async move {
        let rows = register_root_target_states_provider::<String, _>(&ctx, ROWS, handler)?;
        ctx.mount_each(
            items,
            |(c, _)| c.clone(),
            move |ctx, (_, declared)| {
                let rows = rows.clone();
                async move { declare_into(&ctx, &rows, declared) }
            },
        )
        .await
    })
    .await
}

fn calls(handler: &RowHandler) -> usize {
    handler.reconcile_calls.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_declaring_what_its_last_clean_commit_recorded_asks_no_handler_and_calls_no_sink(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let handler = rig.handler();
    let p = plan(&[("a", &[("k1", "v1")]), ("b", &[("k2", "v2")]), ("c", &[])]);
    sync(&app, &handler, &p).await?;
    let (calls_before, sink_calls) = (calls(&handler), rig.log.call_count());
    let stats = sync(&app, &handler, &p).await?;
    assert_eq!(calls(&handler), calls_before, "no handler was asked");
    assert_eq!(rig.log.call_count(), sink_calls, "no sink was called");
    assert_eq!(stats.unchanged, 2);
    assert_eq!((stats.created, stats.updated, stats.deleted), (0, 0, 0));
    assert_eq!(rig.store.snapshot(), map(&[("k1", "v1"), ("k2", "v2")]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_does_not_say_unchanged_states_need_nothing_is_asked_on_every_run(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let handler = rig.handler();
    let p = plan(&[("a", &[("k1", "v1")]), ("b", &[("k2", "v2")])]);
    for _ in 0..3 {
        sync_with(&app, handler.clone(), &p).await?;
    }
    assert_eq!(calls(&handler), 6, "two states, three runs");
    assert_eq!(rig.log.call_count(), 1, "one sink call: the first run's");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_new_and_dropped_states_are_applied_beside_components_found_unchanged() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let handler = rig.handler();
    let first = plan(&[
        ("a", &[("k1", "v1")]),
        ("b", &[("k2", "v2")]),
        ("c", &[("k3", "v3")]),
        ("d", &[("k4", "v4")]),
    ]);
    sync(&app, &handler, &first).await?;
    sync(&app, &handler, &first).await?;
    // a unchanged; b changes its value; c declares another key; d is gone;
    // e is new.
    let second = plan(&[
        ("a", &[("k1", "v1")]),
        ("b", &[("k2", "v2b")]),
        ("c", &[("k3b", "v3")]),
        ("e", &[("k5", "v5")]),
    ]);
    let stats = sync(&app, &handler, &second).await?;
    assert_eq!(
        rig.store.snapshot(),
        map(&[("k1", "v1"), ("k2", "v2b"), ("k3b", "v3"), ("k5", "v5")])
    );
    assert_eq!(
        (stats.created, stats.updated, stats.deleted, stats.unchanged),
        (2, 1, 2, 1)
    );
    Ok(())
}

/// A sink that applies every action, then reports the calls holding
/// `value` as failed (as when a write lands and its answer is lost).
fn lossy_sink(rig: &Rig, value: &'static str) -> TargetActionSink<RowAction> {
    let (log, store) = (rig.log.clone(), rig.store.clone());
    TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<RowAction>>| {
        let (log, store) = (log.clone(), store.clone());
        async move {
            let lost = actions
                .iter()
                .any(|a| a.inner().value.as_deref() == Some(value));
            apply_rows(&log, &store, actions)?;
            if lost {
                return Err(Error::msg(format!(
                    "the answer to writing {value} was lost"
                )));
            }
            Ok(())
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_whose_last_apply_failed_is_reconciled_again_when_it_declares_its_older_value(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let handler = RowHandler::new(lossy_sink(&rig, "v2"));
    let v1 = plan(&[("a", &[("k", "v1")])]);
    sync(&app, &handler, &v1).await?;
    sync(&app, &handler, &v1).await?;
    let failed = sync(&app, &handler, &plan(&[("a", &[("k", "v2")])])).await;
    assert!(failed.is_err(), "the write of v2 reports a failure");
    assert_eq!(rig.store.snapshot(), map(&[("k", "v2")]), "it landed");
    // Back to the value of the last clean commit: the state may hold v2,
    // so the handler is asked and the row written back.
    let stats = sync(&app, &handler, &v1).await?;
    assert_eq!(rig.store.snapshot(), map(&[("k", "v1")]));
    assert_eq!(stats.updated, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_another_component_took_is_taken_back_by_a_component_declaring_it_as_before(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let handler = rig.handler();
    let a_holds = plan(&[("a", &[("p", "v")]), ("b", &[])]);
    sync(&app, &handler, &a_holds).await?;
    sync(&app, &handler, &a_holds).await?;
    // p moves to b, then back to a, declared as a declared it before.
    sync(&app, &handler, &plan(&[("a", &[]), ("b", &[("p", "v")])])).await?;
    sync(&app, &handler, &a_holds).await?;
    assert_eq!(rig.store.snapshot(), map(&[("p", "v")]));
    // b goes: had p stayed in its records, it would be deleted now.
    sync(&app, &handler, &plan(&[("a", &[("p", "v")])])).await?;
    assert_eq!(rig.store.snapshot(), map(&[("p", "v")]));
    let stats = sync(&app, &handler, &plan(&[("a", &[("p", "v")])])).await?;
    assert_eq!((stats.unchanged, stats.deleted), (1, 0));
    assert_eq!(rig.store.snapshot(), map(&[("p", "v")]));
    // a holds p: a new value is written, and p is deleted once a stops
    // declaring it.
    sync(&app, &handler, &plan(&[("a", &[("p", "w")])])).await?;
    assert_eq!(rig.store.snapshot(), map(&[("p", "w")]));
    sync(&app, &handler, &plan(&[("a", &[])])).await?;
    assert_eq!(rig.store.snapshot(), map(&[]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_declared_by_a_component_found_unchanged_and_by_a_new_one_is_a_duplicate_declaration(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let handler = rig.handler();
    let a_holds = plan(&[("a", &[("p", "v")])]);
    sync(&app, &handler, &a_holds).await?;
    sync(&app, &handler, &a_holds).await?;
    let both = plan(&[("a", &[("p", "v")]), ("b", &[("p", "w")])]);
    let err = err_or(sync(&app, &handler, &both).await, |s| {
        format!("two components declared p, and the run succeeded: {s:?}")
    })?;
    let failed = err.failed_components();
    assert_eq!(failed.len(), 1, "one of the two fails: {err}");
    assert!(
        failed[0].cause.contains("p"),
        "the failure names the key: {}",
        failed[0].cause
    );
    // Whichever declared it first keeps it, and the value it declared.
    let winner = if failed[0].path.to_string() == "/b" {
        "v"
    } else {
        "w"
    };
    assert_eq!(rig.store.snapshot(), map(&[("p", winner)]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_found_unchanged_records_its_new_memo_key_and_is_skipped_by_it_next_time(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let handler = rig.handler();
    let runs = Arc::new(Mutex::new(0usize));
    let memo_sync = |version: u32| {
        let (handler, runs) = (handler.clone(), Arc::clone(&runs));
        app.run(move |ctx| async move {
            let rows = register_root_target_states_provider::<String, _>(
                &ctx,
                ROWS,
                handler.saying_unchanged_needs_nothing(),
            )?;
            ctx.mount_each_memo(
                vec!["a".to_string()],
                |k| k.clone(),
                move |_| Ok(version),
                move |ctx, k| {
                    let (rows, runs) = (rows.clone(), Arc::clone(&runs));
                    async move {
                        *runs.lock().unwrap() += 1;
                        declare_into(&ctx, &rows, [(k, "v")])
                    }
                },
            )
            .await
        })
    };
    memo_sync(1).await?;
    // A new memo key: the code runs, declares as before (found
    // unchanged), and the new key is recorded ...
    memo_sync(2).await?;
    assert_eq!(*runs.lock().unwrap(), 2);
    // ... so the same key skips the code.
    memo_sync(2).await?;
    assert_eq!(*runs.lock().unwrap(), 2);
    assert_eq!(rig.store.snapshot(), map(&[("a", "v")]));
    Ok(())
}

/// Rows whose record is `<schema>:<value>`: a child handler built for one
/// schema by its table's sink. It says that an unchanged state needs
/// nothing, which holds for one schema.
#[derive(Clone)]
struct SchemaRows {
    schema: String,
    written: Arc<Mutex<Vec<String>>>,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Written(String);

impl TargetHandler<String> for SchemaRows {
    type TrackingRecord = String;
    type Action = Written;

    fn reconcile(
        &self,
        _key: StableKey,
        desired: Option<String>,
        prev: Vec<String>,
        missing: bool,
    ) -> Result<Option<TargetReconcileOutput<Written, String>>> {
        let Some(value) = desired else {
            return Ok(None);
        };
        let record = format!("{}:{value}", self.schema);
        if !missing && prev == [record.clone()] {
            return Ok(None);
        }
        let written = Arc::clone(&self.written);
        Ok(Some(TargetReconcileOutput {
            action: TargetAction::Update(Written(record.clone())),
            sink: TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<Written>>| {
                let written = Arc::clone(&written);
                async move {
                    for action in actions {
                        written.lock().unwrap().push(action.into_inner().0);
                    }
                    Ok(())
                }
            }),
            tracking_record: Some(record),
            child_invalidation: None,
        }))
    }

    fn unchanged_needs_nothing(&self) -> bool {
        true
    }
}

/// Tables whose record is their schema; an added column changes it
/// without invalidating the rows.
struct Tables {
    written: Arc<Mutex<Vec<String>>>,
}

impl TargetHandler<String> for Tables {
    type TrackingRecord = String;
    type Action = Written;

    fn reconcile(
        &self,
        _key: StableKey,
        desired: Option<String>,
        _prev: Vec<String>,
        _missing: bool,
    ) -> Result<Option<TargetReconcileOutput<Written, String>>> {
        let Some(schema) = desired else {
            return Ok(None);
        };
        let written = Arc::clone(&self.written);
        Ok(Some(TargetReconcileOutput {
            action: TargetAction::Update(Written(schema.clone())),
            sink: TargetActionSink::from_async_fn_with_child_handler(
                |_: Vec<TargetAction<Written>>| async { Ok(()) },
                move |table: &Written| {
                    Ok(ChildTargetDef::new::<String, _>(SchemaRows {
                        schema: table.0.clone(),
                        written: Arc::clone(&written),
                    }))
                },
            ),
            tracking_record: Some(schema),
            child_invalidation: None,
        }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_containers_rows_are_reconciled_after_a_change_of_it_that_keeps_their_generation(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let written = Arc::new(Mutex::new(Vec::new()));
    for schema in ["s1", "s1", "s2"] {
        let tables = Tables {
            written: Arc::clone(&written),
        };
        let schema = schema.to_string();
        app.run(move |ctx| async move {
            let t = register_root_target_states_provider::<String, _>(&ctx, "test/tables", tables)?;
            let rows: TargetStateProvider<String> =
                mount_target(&ctx, t.target_state("t", schema)).await?;
            ctx.mount("a", move |ctx| async move {
                declare_target_state(&ctx, rows.target_state("k", "v".to_string()))
            })
            .await
        })
        .await?;
    }
    // The row handler built for s2 judges the row's s1 record: rewritten.
    assert_eq!(*written.lock().unwrap(), ["s1:v", "s2:v"]);
    Ok(())
}
