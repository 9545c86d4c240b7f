//! Memoized components (`Ctx::mount_each_memo`), shutdown requests, run
//! reports, ledger inspection and live mode (`App::watch`).

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;
use weir::prelude::*;

const ROWS: &str = "test/row";

/// The items of a run: `(key, content)`; each becomes one component
/// declaring the row `key = content`.
type Items = Arc<Mutex<BTreeMap<String, String>>>;

fn items(pairs: &[(&str, &str)]) -> Items {
    Arc::new(Mutex::new(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    ))
}

fn set(items: &Items, key: &str, value: &str) {
    items
        .lock()
        .unwrap()
        .insert(key.to_string(), value.to_string());
}

/// What the test's components do, besides declaring their row.
#[derive(Clone, Default)]
struct Behaviour {
    /// Code runs, by key.
    runs: Arc<Mutex<BTreeMap<String, usize>>>,
    /// Keys whose code returns an error.
    failing: Arc<Mutex<Vec<String>>>,
    /// Bumped to invalidate every memo (a "logic version").
    version: Arc<AtomicUsize>,
}

impl Behaviour {
    fn runs_of(&self, key: &str) -> usize {
        self.runs.lock().unwrap().get(key).copied().unwrap_or(0)
    }
    fn total_runs(&self) -> usize {
        self.runs.lock().unwrap().values().sum()
    }
}

/// One update: the root registers the provider and mounts one memoized
/// component per item.
async fn sync(app: &App, rig: &Rig, items: &Items, b: &Behaviour) -> Result<RunReport> {
    let snapshot: Vec<(String, String)> = items.lock().unwrap().clone().into_iter().collect();
    let handler = rig.handler();
    let b = b.clone();
    app.run_report(move |ctx| async move {
        let rows = register_root_target_states_provider::<String, _>(&ctx, ROWS, handler.clone())?;
        let version = b.version.load(Ordering::SeqCst);
        ctx.mount_each_memo(
            snapshot,
            |(k, _)| k.clone(),
            move |(_, v): &(String, String)| Ok((v.clone(), version)),
            move |ctx, (k, v)| {
                let rows = rows.clone();
                let b = b.clone();
                async move {
                    *b.runs.lock().unwrap().entry(k.clone()).or_default() += 1;
                    if b.failing.lock().unwrap().contains(&k) {
                        return Err(Error::msg(format!("{k} is broken")));
                    }
                    declare_target_state(&ctx, rows.target_state(k.as_str(), v))
                }
            },
        )
        .await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memoized_components_skip_their_code_and_keep_their_states() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let b = Behaviour::default();
    let items = items(&[("a", "1"), ("b", "2"), ("c", "3")]);

    let first = sync(&app, &rig, &items, &b).await?;
    assert_eq!(first.stats.created, 3);
    assert_eq!(first.stats.memoized, 0);
    assert_eq!(b.total_runs(), 3);
    rig.log.clear();

    let second = sync(&app, &rig, &items, &b).await?;
    assert_eq!(second.stats.memoized, 3, "{:?}", second.stats);
    assert_eq!(b.total_runs(), 3, "no component code ran again");
    assert_eq!(rig.log.call_count(), 0, "nothing was applied");
    assert_eq!(
        rig.store.snapshot(),
        map(&[("a", "1"), ("b", "2"), ("c", "3")])
    );

    set(&items, "b", "22");
    let third = sync(&app, &rig, &items, &b).await?;
    assert_eq!(third.stats.memoized, 2);
    assert_eq!(third.stats.updated, 1);
    assert_eq!(b.runs_of("b"), 2);
    assert_eq!(b.runs_of("a"), 1);
    assert_eq!(
        rig.store.snapshot(),
        map(&[("a", "1"), ("b", "22"), ("c", "3")])
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_that_disappears_is_deleted_while_the_others_stay_memoized() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let b = Behaviour::default();
    let items = items(&[("a", "1"), ("b", "2"), ("c", "3")]);
    sync(&app, &rig, &items, &b).await?;

    items.lock().unwrap().remove("b");
    let report = sync(&app, &rig, &items, &b).await?;
    assert_eq!(report.stats.deleted, 1);
    assert_eq!(report.stats.memoized, 2);
    assert_eq!(rig.store.snapshot(), map(&[("a", "1"), ("c", "3")]));

    // Back again with the same content: it is a new component run, not a
    // stale memo.
    set(&items, "b", "2");
    let report = sync(&app, &rig, &items, &b).await?;
    assert_eq!(report.stats.created, 1);
    assert_eq!(
        rig.store.snapshot(),
        map(&[("a", "1"), ("b", "2"), ("c", "3")])
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_whose_code_failed_is_not_memoized() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let b = Behaviour::default();
    let items = items(&[("a", "1"), ("b", "2")]);
    sync(&app, &rig, &items, &b).await?;

    // b changes and fails: its old row stays, and its memo is forgotten.
    set(&items, "b", "22");
    b.failing.lock().unwrap().push("b".into());
    let report = sync(&app, &rig, &items, &b).await?;
    assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
    assert_eq!(report.failures[0].path.to_string(), "/b");
    assert!(report.failures[0].cause.contains("b is broken"));
    assert_eq!(rig.store.snapshot(), map(&[("a", "1"), ("b", "2")]));

    // Back to the content of its last success: it still runs, since it
    // failed in between.
    set(&items, "b", "2");
    b.failing.lock().unwrap().clear();
    let runs_before = b.runs_of("b");
    let report = sync(&app, &rig, &items, &b).await?;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(
        b.runs_of("b"),
        runs_before + 1,
        "the failed component ran again"
    );
    assert_eq!(report.stats.memoized, 1, "only a was skipped");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_whose_actions_failed_in_the_sink_runs_again() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let broken = Arc::new(AtomicBool::new(true));
    let flag = Arc::clone(&broken);
    let rig = Rig::failing(Arc::new(move |_, keys: &[String]| {
        (flag.load(Ordering::SeqCst) && keys.iter().any(|k| k == "b"))
            .then(|| "b rejected".to_string())
    }));
    let b = Behaviour::default();
    let items = items(&[("a", "1"), ("b", "2")]);
    let report = sync(&app, &rig, &items, &b).await?;
    assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
    assert_eq!(rig.store.snapshot(), map(&[("a", "1")]));

    broken.store(false, Ordering::SeqCst);
    let report = sync(&app, &rig, &items, &b).await?;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(b.runs_of("b"), 2);
    assert_eq!(rig.store.snapshot(), map(&[("a", "1"), ("b", "2")]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bumping_the_logic_version_in_the_memo_key_reruns_every_component() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let b = Behaviour::default();
    let items = items(&[("a", "1"), ("b", "2")]);
    sync(&app, &rig, &items, &b).await?;
    b.version.fetch_add(1, Ordering::SeqCst);
    let report = sync(&app, &rig, &items, &b).await?;
    assert_eq!(report.stats.memoized, 0);
    assert_eq!(report.stats.unchanged, 2);
    assert_eq!(b.total_runs(), 4);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memo_survives_reopening_the_ledger() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let rig = Rig::new();
    let b = Behaviour::default();
    let items = items(&[("a", "1"), ("b", "2")]);
    {
        let app = app(dir.path()).await?;
        sync(&app, &rig, &items, &b).await?;
    }
    let app = app(dir.path()).await?;
    let report = sync(&app, &rig, &items, &b).await?;
    assert_eq!(report.stats.memoized, 2);
    assert_eq!(b.total_runs(), 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_taken_over_by_another_component_invalidates_the_memo_of_its_old_owner(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let handler = rig.handler();
    // Component "a" declares x (memoized on a constant); then component
    // "b" takes x over; when b stops, a must run again to declare x.
    let run = |with_b: bool| {
        let handler = handler.clone();
        app.run_report(move |ctx| async move {
            let rows =
                register_root_target_states_provider::<String, _>(&ctx, ROWS, handler.clone())?;
            let mut names = vec!["a"];
            if with_b {
                names.push("b");
            }
            ctx.mount_each_memo(
                names,
                |n| *n,
                |n: &&str| Ok(n.to_string()),
                move |ctx, n| {
                    let rows = rows.clone();
                    async move {
                        let key = if n == "a" && with_b { "a-only" } else { "x" };
                        declare_target_state(&ctx, rows.target_state(key, n.to_string()))
                    }
                },
            )
            .await
        })
    };
    run(false).await?;
    assert_eq!(rig.store.snapshot(), map(&[("x", "a")]));
    // With b, a's memo key is unchanged; a is skipped and keeps x, b also
    // declares x: the state moves to b.
    let _ = run(true).await?;
    let after_b = rig.store.snapshot();
    assert_eq!(
        after_b.get("x").map(String::as_str),
        Some("b"),
        "{after_b:?}"
    );
    run(false).await?;
    assert_eq!(
        rig.store.snapshot().get("x").map(String::as_str),
        Some("a"),
        "a ran again and x is declared by it: {:?}",
        rig.store.snapshot()
    );
    Ok(())
}

/// Mounts `n` memoized components, the `stop_at`-th of which requests a
/// shutdown; at most two run at once.
async fn sync_with_shutdown(
    app: &App,
    rig: &Rig,
    n: usize,
    value: &str,
    stop_at: Option<usize>,
) -> Result<RunReport> {
    let handler = rig.handler();
    let value = value.to_string();
    let shutdown = app.shutdown_handle();
    app.run_report(move |ctx| async move {
        let rows = register_root_target_states_provider::<String, _>(&ctx, ROWS, handler.clone())?;
        ctx.mount_each_memo(
            0..n,
            |i| *i as u64,
            {
                let value = value.clone();
                move |_: &usize| Ok(value.clone())
            },
            move |ctx, i| {
                let rows = rows.clone();
                let value = value.clone();
                let shutdown = shutdown.clone();
                async move {
                    if Some(i) == stop_at {
                        shutdown.shutdown();
                    }
                    declare_target_state(&ctx, rows.target_state(format!("k{i:03}"), value))
                }
            },
        )
        .await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_request_stops_mounting_commits_what_finished_and_deletes_nothing() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let rig = Rig::new();
    let n = 60;
    {
        let app = app_with(dir.path(), |b| b.max_inflight_components(2)).await?;
        sync_with_shutdown(&app, &rig, n, "v1", None).await?;
        assert_eq!(rig.store.snapshot().len(), n);
    }
    {
        let app = app_with(dir.path(), |b| b.max_inflight_components(2)).await?;
        let report = sync_with_shutdown(&app, &rig, n, "v2", Some(5)).await?;
        let root = report
            .failures
            .iter()
            .find(|f| f.path.is_root())
            .expect("the root reports the interruption");
        assert!(root.cause.contains("interrupted"), "{}", root.cause);
        let rows = rig.store.snapshot();
        assert_eq!(rows.len(), n, "nothing was deleted: {rows:?}");
        let updated = rows.values().filter(|v| *v == "v2").count();
        assert!(updated >= 6, "the components that ran committed: {updated}");
        assert!(
            updated < n,
            "the components after the request did not start"
        );
        // A later run on a new app finishes the job.
    }
    let app = app_with(dir.path(), |b| b.max_inflight_components(2)).await?;
    let report = sync_with_shutdown(&app, &rig, n, "v2", None).await?;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert!(report.stats.memoized >= 6, "{:?}", report.stats);
    assert!(rig.store.snapshot().values().all(|v| v == "v2"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_counts_states_by_provider_and_lists_failed_components() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let b = Behaviour::default();
    let items = items(&[("a", "1"), ("b", "2"), ("c", "3")]);
    sync(&app, &rig, &items, &b).await?;
    set(&items, "c", "33");
    b.failing.lock().unwrap().push("c".into());
    sync(&app, &rig, &items, &b).await?;

    let report = app.inspect().await?;
    assert_eq!(report.target_states, 3);
    assert_eq!(report.providers, vec![(ROWS.to_string(), 3)]);
    assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
    assert_eq!(report.failures[0].0.to_string(), "/c");
    assert!(report.failures[0].1.contains("c is broken"));
    assert!(report.format_version >= 1);
    assert!(report.size_on_disk > 0);
    Ok(())
}

/// The next event of a watch, which must be a run.
async fn next_run(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<WatchEvent>,
) -> (Vec<String>, RunReport) {
    match tokio::time::timeout(Duration::from_secs(30), events.recv()).await {
        Ok(Some(WatchEvent::Ran { changes, report })) => (changes, report),
        other => panic!("expected a run, got {other:?}"),
    }
}

/// A change feed driven by the test.
struct TestFeed(tokio::sync::mpsc::UnboundedReceiver<String>);

impl ChangeFeed for TestFeed {
    async fn next_change(&mut self) -> Option<Vec<String>> {
        self.0.recv().await.map(|c| vec![c])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_reruns_on_each_change_and_returns_on_shutdown() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = Arc::new(app(dir.path()).await?);
    let rig = Rig::new();
    let items = items(&[("a", "1"), ("b", "2")]);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let handler = rig.handler();
    let source = Arc::clone(&items);
    let watcher = {
        let app = Arc::clone(&app);
        tokio::spawn(async move {
            app.watch(
                TestFeed(rx),
                move |ctx| {
                    let handler = handler.clone();
                    let snapshot: Vec<(String, String)> =
                        source.lock().unwrap().clone().into_iter().collect();
                    async move {
                        let rows =
                            register_root_target_states_provider::<String, _>(&ctx, ROWS, handler)?;
                        ctx.mount_each_memo(
                            snapshot,
                            |(k, _)| k.clone(),
                            |(_, v): &(String, String)| Ok(v.clone()),
                            move |ctx, (k, v)| {
                                let rows = rows.clone();
                                async move {
                                    declare_target_state(&ctx, rows.target_state(k.as_str(), v))
                                }
                            },
                        )
                        .await
                    }
                },
                move |event| {
                    let _ = events_tx.send(event);
                },
            )
            .await
        })
    };
    let (changes, first) = next_run(&mut events).await;
    assert!(changes.is_empty());
    assert_eq!(first.stats.created, 2);

    set(&items, "b", "22");
    items.lock().unwrap().remove("a");
    tx.send("b changed, a deleted".to_string()).unwrap();
    let (changes, second) = next_run(&mut events).await;
    assert_eq!(changes, vec!["b changed, a deleted".to_string()]);
    assert_eq!(second.stats.updated, 1);
    assert_eq!(second.stats.deleted, 1);
    assert_eq!(rig.store.snapshot(), map(&[("b", "22")]));

    app.shutdown_handle().shutdown();
    tokio::time::timeout(Duration::from_secs(30), watcher)
        .await
        .expect("watch returns after a shutdown request")
        .expect("the watch task did not panic")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_returns_when_its_feed_ends() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    drop(tx);
    let handler = rig.handler();
    let mut runs = 0;
    tokio::time::timeout(
        Duration::from_secs(30),
        app.watch(
            TestFeed(rx),
            move |ctx| {
                let handler = handler.clone();
                async move { declare_rows(&ctx, ROWS, handler, &[("k", "v")]) }
            },
            |_| runs += 1,
        ),
    )
    .await
    .expect("watch returns")?;
    assert_eq!(runs, 1);
    assert_eq!(rig.store.snapshot(), map(&[("k", "v")]));
    Ok(())
}

/// One component declaring `keys` (memoized on the list itself) into the
/// rows of `rig`; counts its runs in `runs`.
async fn sync_one_memoized(
    app: &App,
    rig: &Rig,
    runs: &Arc<AtomicUsize>,
    keys: Vec<&'static str>,
) -> Result<RunReport> {
    let handler = rig.handler();
    let runs = Arc::clone(runs);
    app.run_report(move |ctx| async move {
        let rows = register_root_target_states_provider::<String, _>(&ctx, ROWS, handler.clone())?;
        ctx.mount_each_memo(
            vec![keys],
            |_| "only",
            |keys: &Vec<&'static str>| Ok(keys.clone()),
            move |ctx, keys| {
                let rows = rows.clone();
                let runs = Arc::clone(&runs);
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    for k in keys {
                        declare_target_state(&ctx, rows.target_state(k, "v".to_string()))?;
                    }
                    Ok(())
                }
            },
        )
        .await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_that_stopped_declaring_a_state_is_memoized_once_its_deletion_succeeded(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let runs = Arc::new(AtomicUsize::new(0));
    sync_one_memoized(&app, &rig, &runs, vec!["a", "b"]).await?;
    // b is no longer declared: deleted at the end of this run, after which
    // this run's memo key is recorded.
    let report = sync_one_memoized(&app, &rig, &runs, vec!["a"]).await?;
    assert_eq!(report.stats.deleted, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let again = sync_one_memoized(&app, &rig, &runs, vec!["a"]).await?;
    assert_eq!(again.stats.memoized, 1, "{:?}", again.stats);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(rig.store.snapshot(), map(&[("a", "v")]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_whose_deletion_failed_is_not_memoized_and_runs_again() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let deleting_fails = Arc::new(AtomicBool::new(false));
    let fails = Arc::clone(&deleting_fails);
    let rig = Rig::failing(Arc::new(move |_, keys: &[String]| {
        (fails.load(Ordering::SeqCst) && keys.iter().any(|k| k == "b"))
            .then(|| "cannot delete b".to_string())
    }));
    let runs = Arc::new(AtomicUsize::new(0));
    sync_one_memoized(&app, &rig, &runs, vec!["a", "b"]).await?;
    deleting_fails.store(true, Ordering::SeqCst);
    let failed = sync_one_memoized(&app, &rig, &runs, vec!["a"]).await?;
    assert_eq!(failed.failures.len(), 1, "{:?}", failed.failures);
    deleting_fails.store(false, Ordering::SeqCst);
    let again = sync_one_memoized(&app, &rig, &runs, vec!["a"]).await?;
    assert_eq!(again.stats.memoized, 0, "{:?}", again.stats);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(rig.store.snapshot(), map(&[("a", "v")]));
    let last = sync_one_memoized(&app, &rig, &runs, vec!["a"]).await?;
    assert_eq!(last.stats.memoized, 1, "{:?}", last.stats);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_that_ignores_an_interruption_still_fails_and_deletes_none_of_its_children(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let rig = Rig::new();
    {
        let app = app(dir.path()).await?;
        sync_with_shutdown(&app, &rig, 10, "v1", None).await?;
    }
    let app = app(dir.path()).await?;
    app.shutdown_handle().shutdown();
    let handler = rig.handler();
    let report = app
        .run_report(move |ctx| async move {
            let rows =
                register_root_target_states_provider::<String, _>(&ctx, ROWS, handler.clone())?;
            // The interruption is ignored: the code goes on and returns Ok.
            let ignored = ctx
                .mount_each(
                    0..10_u64,
                    |i| *i,
                    move |ctx, i| {
                        let rows = rows.clone();
                        async move {
                            declare_target_state(
                                &ctx,
                                rows.target_state(format!("k{i:03}"), "v2".to_string()),
                            )
                        }
                    },
                )
                .await;
            assert!(matches!(ignored, Err(Error::Interrupted(_))), "{ignored:?}");
            Ok(())
        })
        .await?;
    assert!(
        report.failures.iter().any(|f| f.path.is_root()),
        "the root fails: {:?}",
        report.failures
    );
    assert_eq!(rig.store.snapshot().len(), 10, "no child was deleted");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_memo_function_runs_the_component_instead() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let handler = rig.handler();
    let report = tokio::time::timeout(
        Duration::from_secs(30),
        app.run_report(move |ctx| async move {
            let rows =
                register_root_target_states_provider::<String, _>(&ctx, ROWS, handler.clone())?;
            ctx.mount_each_memo(
                vec!["a", "b"],
                |k| *k,
                |k: &&str| -> Result<String> {
                    if *k == "b" {
                        panic!("memo of b");
                    }
                    Ok(k.to_string())
                },
                move |ctx, k| {
                    let rows = rows.clone();
                    async move { declare_target_state(&ctx, rows.target_state(k, "v".to_string())) }
                },
            )
            .await
        }),
    )
    .await
    .expect("the run does not hang")?;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(rig.store.snapshot(), map(&[("a", "v"), ("b", "v")]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_without_a_memo_key_that_changed_the_states_forgets_the_memo_key_recorded_before(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let handler = rig.handler();
    // One component declaring `keys`; memoized on a fixed key when `memo`.
    let sync = |keys: Vec<&'static str>, memo: bool| {
        let handler = handler.clone();
        app.run_report(move |ctx| async move {
            let rows =
                register_root_target_states_provider::<String, _>(&ctx, ROWS, handler.clone())?;
            let declare = move |ctx: Ctx, keys: Vec<&'static str>| {
                let rows = rows.clone();
                async move {
                    for k in keys {
                        declare_target_state(&ctx, rows.target_state(k, "v".to_string()))?;
                    }
                    Ok(())
                }
            };
            if memo {
                ctx.mount_each_memo(vec![keys], |_| "only", |_| Ok("fixed"), declare)
                    .await
            } else {
                ctx.mount_each(vec![keys], |_| "only", declare).await
            }
        })
    };
    sync(vec!["a", "b"], true).await?;
    sync(vec!["a", "b"], true).await?;
    // Mounted without a memo key, the component now declares other states.
    sync(vec!["c"], false).await?;
    assert_eq!(rig.store.snapshot(), map(&[("c", "v")]));
    // The memo key of the first runs no longer describes what exists: the
    // component must run, and bring back a and b.
    let report = sync(vec!["a", "b"], true).await?;
    assert_eq!(report.stats.memoized, 0, "{:?}", report.stats);
    assert_eq!(rig.store.snapshot(), map(&[("a", "v"), ("b", "v")]));
    Ok(())
}
