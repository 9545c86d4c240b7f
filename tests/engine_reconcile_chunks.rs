//! Reconciling while a component runs: a component that declares more than
//! `reconcile_chunk` states sends them to the reconcilers in chunks while
//! its code still runs. The outcome must be the one of reconciling them
//! all at its commit: same actions, nothing applied when the code fails,
//! and a duplicate across components still refused.

mod support;

use std::collections::BTreeMap;

use support::*;
use weir::prelude::*;

const ROWS: &str = "test/row";

/// `n` rows `k000..`, each with `value(i)`.
fn rows(n: usize, value: impl Fn(usize) -> String) -> Vec<(String, String)> {
    (0..n).map(|i| (format!("k{i:03}"), value(i))).collect()
}

async fn chunked_app(dir: &std::path::Path, chunk: usize) -> Result<App> {
    app_with(dir, |b| b.reconcile_chunk(chunk)).await
}

/// One run whose root component declares `declared` into `rig`'s rows.
async fn run_rows(app: &App, rig: &Rig, declared: Vec<(String, String)>) -> Result<UpdateStats> {
    let handler = rig.handler();
    app.run(move |ctx| async move { declare_each(&ctx, ROWS, handler, declared) })
        .await
}

#[tokio::test]
async fn a_component_declaring_many_chunks_creates_updates_and_deletes_as_one_commit_would(
) -> Result<()> {
    for chunk in [1, 3, 7, 4096] {
        let dir = tempfile::tempdir()?;
        let app = chunked_app(dir.path(), chunk).await?;
        let rig = Rig::new();
        let run = |declared| run_rows(&app, &rig, declared);

        let first = rows(50, |i| format!("v{i}"));
        let stats = run(first.clone()).await?;
        assert_eq!((stats.created, stats.updated), (50, 0), "chunk {chunk}");
        assert_eq!(rig.store.snapshot(), first.iter().cloned().collect());

        let stats = run(first.clone()).await?;
        assert_eq!(
            (stats.created, stats.updated, stats.deleted, stats.unchanged),
            (0, 0, 0, 50),
            "chunk {chunk}: an unchanged run changes nothing"
        );

        // Every tenth row changes, the last ten are no longer declared.
        let third: Vec<(String, String)> = rows(40, |i| {
            if i % 10 == 0 {
                format!("new{i}")
            } else {
                format!("v{i}")
            }
        });
        let stats = run(third.clone()).await?;
        assert_eq!(
            (stats.created, stats.updated, stats.deleted, stats.unchanged),
            (0, 4, 10, 36),
            "chunk {chunk}"
        );
        let expected: BTreeMap<String, String> = third.into_iter().collect();
        assert_eq!(rig.store.snapshot(), expected, "chunk {chunk}");
    }
    Ok(())
}

#[tokio::test]
async fn states_a_rerun_left_unchanged_stay_tracked_and_are_deleted_once_no_longer_declared(
) -> Result<()> {
    // Shards count a component's unchanged states instead of answering
    // each: the commit must still keep them in its entry.
    for chunk in [1, 7, 4096] {
        let dir = tempfile::tempdir()?;
        let app = chunked_app(dir.path(), chunk).await?;
        let rig = Rig::new();
        let run = |declared| run_rows(&app, &rig, declared);
        let all = rows(30, |i| format!("v{i}"));
        run(all.clone()).await?;
        // One row changes, the others are only counted.
        let mut changed = all.clone();
        if let Some(row) = changed.get_mut(5) {
            row.1 = "new".to_string();
        }
        let stats = run(changed).await?;
        assert_eq!(
            (stats.created, stats.updated, stats.deleted, stats.unchanged),
            (0, 1, 0, 29),
            "chunk {chunk}"
        );
        let stats = run(Vec::new()).await?;
        assert_eq!((stats.deleted, stats.unchanged), (30, 0), "chunk {chunk}");
        assert!(rig.store.snapshot().is_empty(), "chunk {chunk}");
    }
    Ok(())
}

#[tokio::test]
async fn a_component_whose_code_fails_after_its_chunks_were_reconciled_applies_nothing(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = chunked_app(dir.path(), 2).await?;
    let rig = Rig::new();
    let handler = rig.handler();
    let first = rows(10, |i| format!("v{i}"));
    let declared = first.clone();
    app.run(move |ctx| async move { declare_each(&ctx, ROWS, handler, declared) })
        .await?;
    rig.log.clear();

    // Declares every row changed and twenty more, then fails.
    let handler = rig.handler();
    let result = app
        .run(move |ctx| async move {
            declare_each(&ctx, ROWS, handler, rows(30, |i| format!("changed{i}")))?;
            Err(Error::msg("the source broke after declaring"))
        })
        .await;
    let err = err_or(result, |s| format!("the failing run succeeded: {s:?}"))?;
    assert!(err.to_string().contains("the source broke"), "{err}");
    assert_eq!(rig.log.entries(), Vec::<String>::new(), "nothing applied");
    assert_eq!(rig.store.snapshot(), first.iter().cloned().collect());

    // The ledger was not touched either: the first rows are unchanged.
    let handler = rig.handler();
    let stats = app
        .run(move |ctx| async move { declare_each(&ctx, ROWS, handler, first) })
        .await?;
    assert_eq!((stats.created, stats.updated, stats.unchanged), (0, 0, 10));
    Ok(())
}

#[tokio::test]
async fn a_state_declared_by_two_components_is_refused_when_sent_in_chunks() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = chunked_app(dir.path(), 1).await?;
    let rig = Rig::new();
    let handler = rig.handler();
    let result = app
        .run(move |ctx| async move {
            let provider = register_root_target_states_provider::<String, _>(&ctx, ROWS, handler)?;
            let first = provider.clone();
            ctx.mount("one", move |c| async move {
                declare_into(&c, &first, rows(5, |i| format!("one{i}")))
            })
            .await?;
            ctx.mount("two", move |c| async move {
                declare_into(&c, &provider, rows(5, |i| format!("two{i}")))
            })
            .await?;
            Ok(())
        })
        .await;
    let err = err_or(result, |s| format!("the duplicate run succeeded: {s:?}"))?;
    assert!(err.to_string().contains("/two"), "{err}");
    assert_eq!(
        rig.store.snapshot(),
        rows(5, |i| format!("one{i}")).into_iter().collect(),
        "the first component's rows stay, the second's are refused"
    );
    Ok(())
}

/// Runs `/a` (which declares `a_rows` and then fails when `a_fails`) and
/// then `/b` (which declares `b_rows`), both through one provider.
async fn run_a_then_b(
    app: &App,
    rig: &Rig,
    a_rows: Vec<(String, String)>,
    a_fails: bool,
    b_rows: Vec<(String, String)>,
) -> Result<UpdateStats> {
    let handler = rig.handler();
    app.run(move |ctx| async move {
        let provider = register_root_target_states_provider::<String, _>(&ctx, ROWS, handler)?;
        let for_a = provider.clone();
        let failed_a = ctx
            .mount("a", move |c| async move {
                declare_into(&c, &for_a, a_rows)?;
                if a_fails {
                    return Err(Error::msg("a's source broke"));
                }
                Ok(())
            })
            .await;
        if failed_a.is_ok() == a_fails {
            return Err(Error::msg("/a did not end as planned"));
        }
        ctx.mount(
            "b",
            move |c| async move { declare_into(&c, &provider, b_rows) },
        )
        .await
    })
    .await
}

fn one(key: &str, value: &str) -> Vec<(String, String)> {
    vec![(key.to_string(), value.to_string())]
}

#[tokio::test]
async fn a_component_that_fails_after_sending_chunks_claims_none_of_its_states() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = chunked_app(dir.path(), 1).await?;
    let rig = Rig::new();
    run_a_then_b(&app, &rig, one("x", "1"), false, Vec::new()).await?;
    assert_eq!(rig.store.snapshot(), map(&[("x", "1")]));

    // /a declares x again and fails; /b then declares x: x moves to /b.
    let result = run_a_then_b(&app, &rig, one("x", "1"), true, one("x", "2")).await;
    let err = err_or(result, |s| format!("the run succeeded: {s:?}"))?;
    assert_eq!(failed_paths(&err), strings(&["/a"]), "{err}");
    assert_eq!(rig.store.snapshot(), map(&[("x", "2")]));
    Ok(())
}

#[tokio::test]
async fn a_state_declared_only_by_a_component_that_fails_is_still_deleted() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = chunked_app(dir.path(), 1).await?;
    let rig = Rig::new();
    let both = vec![
        ("x".to_string(), "1".to_string()),
        ("y".to_string(), "1".to_string()),
    ];
    run_a_then_b(&app, &rig, Vec::new(), false, both).await?;
    assert_eq!(rig.store.snapshot(), map(&[("x", "1"), ("y", "1")]));

    // /b no longer declares x; /a declares it and fails: x is deleted.
    let result = run_a_then_b(&app, &rig, one("x", "1"), true, one("y", "1")).await;
    let err = err_or(result, |s| format!("the run succeeded: {s:?}"))?;
    assert_eq!(failed_paths(&err), strings(&["/a"]), "{err}");
    assert_eq!(rig.store.snapshot(), map(&[("y", "1")]));
    Ok(())
}

#[tokio::test]
async fn a_component_declaring_as_many_states_as_before_still_deletes_the_one_it_dropped(
) -> Result<()> {
    // As many declarations as stored states, one of them new: the old one
    // it replaced must still be found and deleted.
    for chunk in [1, 3, 4096] {
        let dir = tempfile::tempdir()?;
        let app = chunked_app(dir.path(), chunk).await?;
        let rig = Rig::new();
        let run = |declared| run_rows(&app, &rig, declared);
        let first = rows(20, |i| format!("v{i}"));
        run(first.clone()).await?;

        let mut second: Vec<(String, String)> = first.into_iter().skip(1).collect();
        second.push(("k999".to_string(), "new".to_string()));
        let stats = run(second.clone()).await?;
        assert_eq!(
            (stats.created, stats.deleted, stats.unchanged),
            (1, 1, 19),
            "chunk {chunk}"
        );
        assert_eq!(
            rig.store.snapshot(),
            second.into_iter().collect(),
            "chunk {chunk}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_state_that_moves_to_another_component_is_not_deleted_when_its_place_is_taken(
) -> Result<()> {
    for chunk in [1, 4096] {
        let dir = tempfile::tempdir()?;
        let app = chunked_app(dir.path(), chunk).await?;
        let rig = Rig::new();
        let xy = vec![
            ("x".to_string(), "1".to_string()),
            ("y".to_string(), "1".to_string()),
        ];
        run_a_then_b(&app, &rig, xy, false, Vec::new()).await?;

        // /a swaps y for z (as many states as before); /b takes y over.
        let xz = vec![
            ("x".to_string(), "1".to_string()),
            ("z".to_string(), "1".to_string()),
        ];
        let stats = run_a_then_b(&app, &rig, xz, false, one("y", "2")).await?;
        assert_eq!(
            (stats.created, stats.updated, stats.deleted),
            (1, 1, 0),
            "chunk {chunk}"
        );
        assert_eq!(
            rig.store.snapshot(),
            map(&[("x", "1"), ("y", "2"), ("z", "1")]),
            "chunk {chunk}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn two_components_sending_one_state_in_chunks_at_once_leave_it_to_the_first_to_commit(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = chunked_app(dir.path(), 1).await?;
    let rig = Rig::new();
    let handler = rig.handler();
    // Both components send their chunk before either reaches its commit,
    // so the second to commit finds the state claimed only then.
    let both_declared = std::sync::Arc::new(tokio::sync::Barrier::new(2));
    let result = app
        .run(move |ctx| async move {
            let provider = register_root_target_states_provider::<String, _>(&ctx, ROWS, handler)?;
            ctx.mount_each(
                vec!["a".to_string(), "b".to_string()],
                |name| name.clone(),
                move |c, name| {
                    let provider = provider.clone();
                    let barrier = std::sync::Arc::clone(&both_declared);
                    async move {
                        declare_into(&c, &provider, one("x", &name))?;
                        barrier.wait().await;
                        Ok(())
                    }
                },
            )
            .await
        })
        .await;
    let err = err_or(result, |s| format!("both components committed x: {s:?}"))?;
    let failed = failed_paths(&err);
    let winner = match failed.as_slice() {
        [one] if one == "/a" => "b",
        [one] if one == "/b" => "a",
        _ => return Err(Error::msg(format!("not one failed component: {err}"))),
    };
    assert!(
        err.to_string().contains(&format!(
            "declared twice in this run (first by component /{winner})"
        )),
        "{err}"
    );
    assert_eq!(rig.store.snapshot(), map(&[("x", winner)]));
    Ok(())
}

#[tokio::test]
async fn a_component_declaring_into_many_providers_reaches_each_ones_own_handler() -> Result<()> {
    // Many providers, declared in turn (so that each declaration names a
    // provider other than the one before), each with the same keys: every
    // state must reach its own provider's sink.
    const PROVIDERS: usize = 40;
    for chunk in [7, 4096] {
        let dir = tempfile::tempdir()?;
        let app = chunked_app(dir.path(), chunk).await?;
        let rigs: Vec<Rig> = (0..PROVIDERS).map(|_| Rig::new()).collect();
        let handlers: Vec<_> = rigs.iter().map(Rig::handler).collect();
        app.run(move |ctx| async move {
            let mut providers = Vec::new();
            for (p, handler) in handlers.into_iter().enumerate() {
                providers.push(register_root_target_states_provider::<String, _>(
                    &ctx,
                    &format!("test/p{p}"),
                    handler,
                )?);
            }
            for round in 0..3 {
                for (p, provider) in providers.iter().enumerate() {
                    declare_into(&ctx, provider, one(&format!("k{round}"), &format!("p{p}")))?;
                }
            }
            Ok(())
        })
        .await?;
        for (p, rig) in rigs.iter().enumerate() {
            let v = format!("p{p}");
            assert_eq!(
                rig.store.snapshot(),
                map(&[("k0", &v), ("k1", &v), ("k2", &v)]),
                "chunk {chunk}, provider {p}"
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn states_no_longer_declared_reach_the_sink_in_key_order_so_each_call_covers_one_range(
) -> Result<()> {
    // Three shards each reconcile a third of the deletions; a sink call
    // that took one shard's share would touch the whole key range.
    let dir = tempfile::tempdir()?;
    let app = app_with(dir.path(), |b| {
        b.shards(3).batch_policy(BatchPolicy {
            max_actions: 8,
            ..BatchPolicy::default()
        })
    })
    .await?;
    let rig = Rig::new();
    let run = |declared| run_rows(&app, &rig, declared);
    run(rows(60, |i| format!("v{i}"))).await?;
    rig.log.clear();

    // Every third row stays.
    let kept: Vec<(String, String)> = rows(60, |i| format!("v{i}"))
        .into_iter()
        .enumerate()
        .filter_map(|(i, row)| (i % 3 == 0).then_some(row))
        .collect();
    let stats = run(kept).await?;
    assert_eq!(stats.deleted, 40);
    let deleted: Vec<String> = rig
        .log
        .calls()
        .into_iter()
        .flatten()
        .filter_map(|e| e.strip_prefix("delete ").map(str::to_string))
        .collect();
    let mut sorted = deleted.clone();
    sorted.sort();
    assert_eq!(deleted.len(), 40);
    assert_eq!(deleted, sorted, "deletions in the order the calls got them");
    Ok(())
}

/// One run whose component `/a` declares `before`, then mounts `/a/b`
/// (which declares `taken` and commits), then declares `after`.
async fn run_a_around_b(
    app: &App,
    rig: &Rig,
    before: Vec<(String, String)>,
    taken: Vec<(String, String)>,
    after: Vec<(String, String)>,
) -> Result<UpdateStats> {
    let handler = rig.handler();
    app.run(move |ctx| async move {
        let provider = register_root_target_states_provider::<String, _>(&ctx, ROWS, handler)?;
        ctx.mount("a", move |c| async move {
            declare_into(&c, &provider, before)?;
            let for_b = provider.clone();
            c.mount("b", move |b| async move { declare_into(&b, &for_b, taken) })
                .await?;
            declare_into(&c, &provider, after)
        })
        .await
    })
    .await
}

#[tokio::test]
async fn states_taken_over_while_their_old_component_runs_are_kept_and_its_dropped_ones_deleted(
) -> Result<()> {
    // /a's entry is read for its first chunks, before /a/b takes some of
    // its states over and commits: /a's orphans are found in that reading,
    // and the states /a/b took must not be deleted with the others.
    for chunk in [1, 3, 4096] {
        let dir = tempfile::tempdir()?;
        let app = chunked_app(dir.path(), chunk).await?;
        let rig = Rig::new();
        let all = rows(20, |i| format!("v{i}"));
        run_a_around_b(&app, &rig, all, Vec::new(), Vec::new()).await?;

        // The rows from..to, unchanged ("v<i>") or changed ("b<i>").
        let part = |from: usize, to: usize, v: &'static str| -> Vec<(String, String)> {
            rows(to, |i| format!("{v}{i}")).split_off(from)
        };
        let (before, taken, after) = (part(0, 5, "v"), part(10, 15, "b"), part(5, 8, "v"));
        let stats =
            run_a_around_b(&app, &rig, before.clone(), taken.clone(), after.clone()).await?;
        let expected: BTreeMap<String, String> = before
            .into_iter()
            .chain(after)
            .chain(taken.clone())
            .collect();
        assert_eq!(rig.store.snapshot(), expected, "chunk {chunk}");
        // k008, k009 and k015..k019: deleted; k010..k014: updated by /a/b.
        assert_eq!(
            (stats.created, stats.updated, stats.deleted),
            (0, 5, 7),
            "chunk {chunk}"
        );

        // Tracked as they are: the same run again changes nothing.
        let stats = run_a_around_b(&app, &rig, part(0, 5, "v"), taken, part(5, 8, "v")).await?;
        assert_eq!(
            (stats.created, stats.updated, stats.deleted),
            (0, 0, 0),
            "chunk {chunk}"
        );
        assert_eq!(rig.store.snapshot(), expected, "chunk {chunk}");
    }
    Ok(())
}
