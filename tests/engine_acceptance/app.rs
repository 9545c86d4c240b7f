//! The App: reopening, concurrency, cancellation, shards and settings.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use weir::prelude::*;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_dropped_and_reopened_repeatedly_with_other_shard_counts_keeps_its_records(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    let decl = || -> Comps {
        (0..20)
            .map(|c| {
                (
                    StableKey::Int(c),
                    (0..5)
                        .map(|r| ((c, r).into_stable_key(), format!("{c}.{r}")))
                        .collect(),
                )
            })
            .collect()
    };
    for (i, shards) in [4usize, 1, 7, 2, 1].into_iter().enumerate() {
        let app = open_with(dir.path(), |b| b.shards(shards)).await?;
        ext.clear();
        let stats = run_comps(&app, &ext, decl()).await?;
        if i == 0 {
            assert_eq!(stats.created, 100);
        } else {
            assert_eq!(
                ext.calls(),
                0,
                "reopen {i} with {shards} shards: {:?}",
                ext.applied()
            );
            assert_eq!(stats.unchanged, 100);
        }
        if i % 2 == 0 {
            // Dropped on another thread.
            std::thread::spawn(move || drop(app))
                .join()
                .map_err(|_| Error::msg("drop panicked"))?;
        } else {
            drop(app);
        }
    }
    let app = open_with(dir.path(), |b| b.shards(3)).await?;
    ext.clear();
    let stats = run_comps(&app, &ext, vec![]).await?;
    assert_eq!(stats.deleted, 100);
    assert!(ext.store().is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runs_on_one_app_apply_each_change_once() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = Arc::new(open(dir.path()).await?);
    let ext = Ext::new();
    let decl = || one_row_each(30, "v");
    let (a, b) = tokio::join!(run_comps(&app, &ext, decl()), run_comps(&app, &ext, decl()));
    let (a, b) = (a?, b?);
    assert_eq!(a.created + b.created, 30, "{a:?} {b:?}");
    assert_eq!(a.unchanged + b.unchanged, 30);
    let creates = ext.applied().iter().filter(|x| x.verb == "create").count();
    assert_eq!(creates, 30);
    // A run and a preview at once.
    let other = || one_row_each(30, "w");
    ext.clear();
    let (r, p) = tokio::join!(
        run_comps(&app, &ext, other()),
        preview_comps(&app, &ext, other())
    );
    r?;
    let p = p?;
    assert!(
        p.len() == 30 || p.is_empty(),
        "the preview sees the state before or after: {}",
        p.len()
    );
    assert_eq!(ext.applied().len(), 30);
    ext.clear();
    run_comps(&app, &ext, other()).await?;
    assert_eq!(ext.calls(), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cancelled_midway_leaves_the_app_usable_and_converging() -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    let handler = ext.handler();
    // Components that take a while; the run is dropped after 100 ms.
    let slow = app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        ctx.mount_each(
            0..20i64,
            |i| *i,
            move |c, i| {
                let p = p.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(20 * (i as u64 % 10))).await;
                    declare_target_state(&c, p.target_state(i, "old".to_string()))
                }
            },
        )
        .await
    });
    let cancelled = tokio::time::timeout(Duration::from_millis(100), slow).await;
    assert!(
        cancelled.is_err(),
        "the run should still be running at 100 ms"
    );
    let decl = || one_row_each(20, "new");
    run_comps(&app, &ext, decl()).await?;
    // Let whatever the cancelled run left behind finish.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let want: BTreeMap<StableKey, String> = (0..20)
        .map(|c| (StableKey::Int(c), "new".to_string()))
        .collect();
    let mut problems = Vec::new();
    let after_new = ext.store();
    if after_new != want {
        problems.push(format!(
            "after the cancelled run and a complete run declaring \"new\", the target holds \
             {after_new:?}; applied: {:?}",
            ext.applied()
        ));
    }
    // Two more complete runs: the target must converge, and then stay.
    for i in 0..2 {
        ext.clear();
        run_comps(&app, &ext, decl()).await?;
        if ext.store() != want {
            problems.push(format!(
                "after clean run {} the target still holds {:?} (applied {:?})",
                i + 1,
                ext.store(),
                ext.applied()
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// A scenario of several runs; returns, per run, what was applied and the
/// counts.
async fn scenario(shards: usize) -> Result<Vec<(Vec<Applied>, (u64, u64, u64, u64, u64))>> {
    let dir = tempfile::tempdir()?;
    let app = open_with(dir.path(), |b| b.shards(shards)).await?;
    let ext = Ext::new();
    let gen = |round: i64| -> Comps {
        (0..25i64)
            .filter(|c| !(round >= 2 && c % 5 == 0))
            .map(|c| {
                let n = if round >= 1 && c % 3 == 0 { 2 } else { 4 };
                (
                    StableKey::Int(c),
                    (0..n)
                        .map(|r| {
                            // In round 3 the rows of c and c+1 swap owners.
                            let owner = if round >= 3 { c ^ 1 } else { c };
                            let v = if round >= 1 && r == 0 {
                                format!("{round}")
                            } else {
                                "0".into()
                            };
                            ((owner, r).into_stable_key(), v)
                        })
                        .collect(),
                )
            })
            .collect()
    };
    let mut out = Vec::new();
    for round in 0..5i64 {
        ext.clear();
        if round == 4 {
            ext.fail_keys(&[(7i64, 0i64).into_stable_key()]);
        } else {
            ext.heal();
        }
        let r = report_comps(&app, &ext, gen(round)).await?;
        let s = &r.stats;
        out.push((ext.applied(), counts(s)));
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shard_and_many_shards_apply_the_same_actions_and_count_the_same() -> Result<()> {
    let one = scenario(1).await?;
    let many = scenario(6).await?;
    assert_eq!(one.len(), many.len());
    for (i, (a, b)) in one.iter().zip(many.iter()).enumerate() {
        assert_eq!(a, b, "run {i} differs between 1 and 6 shards");
    }
    Ok(())
}

/// A sink over `ext` whose calls carrying the value `"old"` first announce
/// themselves on `entered` and then wait for `gate`.
fn gated_sink(
    ext: &Ext,
    entered: Arc<tokio::sync::Notify>,
    gate: Arc<tokio::sync::Semaphore>,
) -> TargetActionSink<Put> {
    let ext = ext.clone();
    TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<Put>>| {
        let ext = ext.clone();
        let entered = entered.clone();
        let gate = gate.clone();
        async move {
            let old = actions.iter().any(|a| match a {
                TargetAction::Create(p) | TargetAction::Update(p) | TargetAction::Delete(p) => {
                    p.value.as_deref() == Some("old")
                }
            });
            if old {
                entered.notify_one();
                let _permit = gate
                    .acquire()
                    .await
                    .map_err(|e| Error::msg(e.to_string()))?;
            }
            ext.apply(actions);
            Ok(())
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_call_of_a_cancelled_run_finishing_late_leaves_no_lasting_divergence() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let app = Arc::new(open(dir.path()).await?);
    let ext = Ext::new();
    run_flat(&app, &ext, rows(&[("x", "v0")])).await?;

    // Run 1 declares "old"; its sink call hangs until the gate opens, and
    // the run's future is dropped meanwhile (a caller's timeout).
    let entered = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let handler = Kv {
        sink: gated_sink(&ext, entered.clone(), gate.clone()),
        seen: ext.seen.clone(),
    };
    let run1 = app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        declare_target_state(&ctx, p.target_state("x", "old".to_string()))
    });
    let wait_entered = entered.notified();
    tokio::select! {
        r = run1 => panic!("run 1 should hang in its sink, it returned {r:?}"),
        _ = wait_entered => {}
    }
    // Run 2 declares "new"; give it a moment, then let run 1's call finish.
    let app2 = Arc::clone(&app);
    let ext2 = ext.clone();
    let run2 = tokio::spawn(async move { run_flat(&app2, &ext2, rows(&[("x", "new")])).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let run2_done_before_release = run2.is_finished();
    gate.add_permits(1);
    let r2 = bounded(run2).await.map_err(|e| Error::msg(e.to_string()))?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Whatever happened, one more clean run must leave the target at "new".
    ext.clear();
    let r3 = run_flat(&app, &ext, rows(&[("x", "new")])).await;
    assert_eq!(
        ext.store(),
        smap(&[("x", "new")]),
        "run 2 finished before the release: {run2_done_before_release}, run 2: {r2:?}, \
         run 3: {r3:?}, run 3 reconcile saw {:?}",
        ext.seen(&k("x"))
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_dropped_right_after_a_cancelled_run_reopens_at_once_and_converges() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    {
        let app = open(dir.path()).await?;
        run_flat(&app, &ext, rows(&[("x", "v0")])).await?;
        let handler = ext.handler();
        let slow = app.run(move |ctx| async move {
            let p = register_root_target_states_provider(&ctx, KV, handler)?;
            ctx.mount_each(
                0..10i64,
                |i| *i,
                move |c, i| {
                    let p = p.clone();
                    async move {
                        tokio::time::sleep(Duration::from_millis(30 * i as u64)).await;
                        declare_target_state(&c, p.target_state(i, "old".to_string()))
                    }
                },
            )
            .await
        });
        let cancelled = tokio::time::timeout(Duration::from_millis(100), slow).await;
        assert!(cancelled.is_err());
        // The App is dropped here, while the cancelled run's components
        // are still sleeping.
    }
    let first = open(dir.path()).await;
    if let Err(first_err) = &first {
        // How long until it opens?
        let start = std::time::Instant::now();
        let later = loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if open(dir.path()).await.is_ok() {
                break Some(start.elapsed());
            }
            if start.elapsed() > Duration::from_secs(5) {
                break None;
            }
        };
        panic!(
            "dropping the App did not release its ledger: reopening at once failed \
             ({first_err}); it opened again after {later:?} (None = still locked after 5 s)"
        );
    }
    let app = first?;
    let want: Vec<(StableKey, String)> = (0..10)
        .map(|i| (StableKey::Int(i), "new".to_string()))
        .collect();
    run_flat(&app, &ext, want.clone()).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    ext.clear();
    run_flat(&app, &ext, want.clone()).await?;
    assert_eq!(
        ext.store(),
        want.into_iter().collect::<BTreeMap<_, _>>(),
        "applied by the last run: {:?}",
        ext.applied()
    );
    Ok(())
}

#[tokio::test]
async fn invalid_settings_are_errors_naming_the_setting_and_missing_ledger_dirs_are_created(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cases: Vec<(&str, AppBuilder)> = vec![
        (
            "shards",
            App::builder("x")
                .ledger_path(dir.path().join("l1"))
                .shards(0),
        ),
        (
            "max_inflight_components",
            App::builder("x")
                .ledger_path(dir.path().join("l2"))
                .max_inflight_components(0),
        ),
        (
            "max_actions",
            App::builder("x")
                .ledger_path(dir.path().join("l3"))
                .batch_policy(BatchPolicy {
                    max_actions: 0,
                    linger: Duration::from_millis(1),
                }),
        ),
        (
            "max_attempts",
            App::builder("x")
                .ledger_path(dir.path().join("l4"))
                .retry_policy(RetryPolicy {
                    max_attempts: 0,
                    ..RetryPolicy::default()
                }),
        ),
    ];
    for (what, builder) in cases {
        match builder.build().await {
            Ok(_) => panic!("{what} = 0 was accepted"),
            Err(e) => assert!(e.to_string().contains(what), "the error names {what}: {e}"),
        }
    }
    // A ledger path below directories that do not exist yet is created.
    let deep = dir.path().join("a").join("b").join("ledger");
    {
        let app = App::builder("x").ledger_path(&deep).build().await?;
        let ext = Ext::new();
        run_flat(&app, &ext, rows(&[("x", "1")])).await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_ledger_path_that_is_a_regular_file_is_refused_with_an_error_naming_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // A ledger path that is a regular file is refused, naming it.
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"hello")?;
    match App::builder("x").ledger_path(&file).build().await {
        Ok(_) => panic!("a regular file was accepted as a ledger directory"),
        Err(e) => assert!(
            e.to_string().contains("not-a-dir"),
            "the error names the path: {e}"
        ),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_dropped_while_a_cancelled_run_waits_on_slow_code_reopens_at_once() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    {
        let app = open(dir.path()).await?;
        let handler = ext.handler();
        let stuck = app.run(move |ctx| async move {
            let p = register_root_target_states_provider(&ctx, KV, handler)?;
            ctx.mount("slow", move |c| async move {
                tokio::time::sleep(Duration::from_secs(60)).await;
                declare_target_state(&c, p.target_state("x", "late".to_string()))
            })
            .await
        });
        assert!(tokio::time::timeout(Duration::from_millis(100), stuck)
            .await
            .is_err());
        // Dropped while the run's component sleeps for a minute: the App
        // cancels the run rather than wait for it.
    }
    let started = std::time::Instant::now();
    let app = open(dir.path()).await?;
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "reopening took {:?}",
        started.elapsed()
    );
    run_flat(&app, &ext, rows(&[("x", "v1")])).await?;
    assert_eq!(ext.store(), rows(&[("x", "v1")]).into_iter().collect());
    Ok(())
}
