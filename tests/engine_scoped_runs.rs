//! Runs restricted to some root-level components (`App::scoped`), the
//! components that failed (`App::failed_components`), retrying just them,
//! and the quarantine of components that keep failing.

mod support;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;
use weir::prelude::*;

async fn bounded<T>(fut: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .map_err(|_| Error::msg("timed out after 60s"))?
}

/// The components whose code ran, in a shared list.
#[derive(Clone, Default)]
struct Ran(Arc<Mutex<Vec<String>>>);

impl Ran {
    fn note(&self, name: &str) {
        if let Ok(mut r) = self.0.lock() {
            r.push(name.to_string());
        }
    }
    fn take(&self) -> Vec<String> {
        let mut ran = self
            .0
            .lock()
            .map(|mut r| std::mem::take(&mut *r))
            .unwrap_or_default();
        ran.sort();
        ran
    }
}

/// The root mounts one component per name (with `mount_each`); each
/// declares the row `name=value`, and fails if its name is in `failing`.
fn files(
    rig: &Rig,
    ran: &Ran,
    names: &[&str],
    value: &str,
    failing: &[&str],
) -> impl FnOnce(Ctx) -> futures::future::BoxFuture<'static, Result<()>> + Send + 'static {
    let handler = rig.handler();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let failing: Vec<String> = failing.iter().map(|n| n.to_string()).collect();
    let (ran, value) = (ran.clone(), value.to_string());
    move |ctx: Ctx| {
        Box::pin(async move {
            let rows = register_root_target_states_provider(&ctx, "rows", handler)?;
            ctx.mount_each(
                names,
                |n: &String| n.clone(),
                move |c, name| {
                    let (rows, ran, value) = (rows.clone(), ran.clone(), value.clone());
                    let fails = failing.contains(&name);
                    async move {
                        ran.note(&name);
                        if fails {
                            return Err(Error::msg(format!("{name} is broken")));
                        }
                        declare_target_state(&c, rows.target_state(name, value))
                    }
                },
            )
            .await
        })
    }
}

#[tokio::test]
async fn a_scoped_run_runs_only_its_components_and_neither_runs_nor_deletes_the_others(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let (rig, ran) = (Rig::new(), Ran::default());
    bounded(app.run(files(&rig, &ran, &["a", "b", "c"], "1", &[]))).await?;
    ran.take();

    // In scope: b (changed) and c (no longer listed). Out of scope: a (not
    // listed either) and d (new).
    let stats = bounded(app.scoped(RunScope::keys(["b", "c"])).run(files(
        &rig,
        &ran,
        &["b", "d"],
        "2",
        &[],
    )))
    .await?;
    assert_eq!(ran.take(), strings(&["b"]));
    assert_eq!(rig.store.snapshot(), map(&[("a", "1"), ("b", "2")]));
    assert_eq!(
        (stats.updated, stats.deleted, stats.created),
        (1, 1, 0),
        "{stats:?}"
    );

    // A full run then sees a again, and d.
    bounded(app.run(files(&rig, &ran, &["a", "b", "d"], "2", &[]))).await?;
    assert_eq!(
        rig.store.snapshot(),
        map(&[("a", "2"), ("b", "2"), ("d", "2")])
    );
    Ok(())
}

#[tokio::test]
async fn mounting_a_root_level_component_outside_the_scope_is_a_matchable_error_that_deletes_nothing(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let (rig, ran) = (Rig::new(), Ran::default());
    bounded(app.run(files(&rig, &ran, &["a"], "1", &[]))).await?;

    let handler = rig.handler();
    let refused = bounded(
        app.scoped(RunScope::keys(["b"]))
            .update(move |ctx| async move {
                register_root_target_states_provider(&ctx, "rows", handler)?;
                let err = ctx
                    .mount("a", |_| async { Ok(()) })
                    .await
                    .err()
                    .ok_or_else(|| Error::msg("mounting a out of scope succeeded"))?;
                Ok((err.is_out_of_scope(), err.kind(), err.to_string()))
            }),
    )
    .await?;
    assert!(refused.0, "{refused:?}");
    assert_eq!(refused.1, weir::ErrorKind::OutOfScope);
    assert!(refused.2.contains("/a"), "{}", refused.2);
    assert_eq!(rig.store.snapshot(), map(&[("a", "1")]));
    Ok(())
}

#[tokio::test]
async fn the_roots_own_containers_are_applied_in_a_scoped_run() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let table_calls = Arc::new(Mutex::new(0usize));
    let rows = Rig::new();
    let sink_rows = rows.sink();
    let counted = Arc::clone(&table_calls);
    let tables = TargetActionSink::from_async_fn_with_child_handler(
        move |_: Vec<TargetAction<TableAction>>| {
            let counted = Arc::clone(&counted);
            async move {
                *counted.lock().map_err(|_| Error::msg("poisoned"))? += 1;
                Ok(())
            }
        },
        move |_: &TableAction| {
            Ok(ChildTargetDef::new::<String, _>(RowHandler::new(
                sink_rows.clone(),
            )))
        },
    );
    let handler = TableHandler::new(tables, None);
    bounded(
        app.scoped(RunScope::keys(["nothing"]))
            .run(move |ctx| async move {
                let t = register_root_target_states_provider(&ctx, "tables", handler)?;
                let child: TargetStateProvider<String> =
                    mount_target(&ctx, t.target_state("docs", spec("g1"))).await?;
                declare_target_state(&ctx, child.target_state("r", "1".to_string()))
            }),
    )
    .await?;
    assert_eq!(*table_calls.lock().map_err(|_| Error::msg("poisoned"))?, 1);
    assert_eq!(rows.store.snapshot(), map(&[("r", "1")]));
    Ok(())
}

#[tokio::test]
async fn the_failed_components_are_listed_and_retrying_just_them_leaves_the_others_alone(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let (rig, ran) = (Rig::new(), Ran::default());
    let report = bounded(app.run_report(files(&rig, &ran, &["a", "b", "c"], "1", &["b"]))).await?;
    assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
    ran.take();

    let failed = app.failed_components().await?;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].path.to_string(), "/b");
    assert!(failed[0].cause.contains("b is broken"), "{failed:?}");
    assert_eq!(failed[0].failed_runs, 1);

    // Retry: the root-level keys of the failed components, fixed code.
    let keys: Vec<StableKey> = failed
        .iter()
        .filter_map(|f| f.path.segments().first().cloned())
        .collect();
    bounded(
        app.scoped(RunScope::keys(keys))
            .run(files(&rig, &ran, &["a", "b", "c"], "1", &[])),
    )
    .await?;
    assert_eq!(ran.take(), strings(&["b"]));
    assert_eq!(
        rig.store.snapshot(),
        map(&[("a", "1"), ("b", "1"), ("c", "1")])
    );
    assert!(app.failed_components().await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn a_component_failing_k_runs_in_a_row_is_reported_quarantined_until_it_succeeds(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app_with(dir.path(), |b| b.quarantine_after(2)).await?;
    let (rig, ran) = (Rig::new(), Ran::default());
    let mut seen = Vec::new();
    for _ in 0..3 {
        let report = bounded(app.run_report(files(&rig, &ran, &["a", "b"], "1", &["b"]))).await?;
        seen.push((
            report.stats.quarantined,
            report.failures.first().map(|f| f.failed_runs),
        ));
    }
    assert_eq!(seen, vec![(0, Some(1)), (1, Some(2)), (1, Some(3))]);
    let failed = app.failed_components().await?;
    assert!(
        failed[0].quarantined && failed[0].failed_runs == 3,
        "{failed:?}"
    );

    // A success clears the count: the next failure is the first again.
    bounded(app.run(files(&rig, &ran, &["a", "b"], "1", &[]))).await?;
    assert!(app.failed_components().await?.is_empty());
    let report = bounded(app.run_report(files(&rig, &ran, &["a", "b"], "2", &["b"]))).await?;
    assert_eq!(report.failures[0].failed_runs, 1);
    assert_eq!(report.stats.quarantined, 0);
    Ok(())
}
