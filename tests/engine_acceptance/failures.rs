//! Sink failures, retries and possible records (guarantees 6, 7, 13, 14),
//! and how failures interplay with moves, panics and small batches.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir::prelude::*;

use crate::support::*;

#[tokio::test]
async fn a_key_failing_in_a_batch_shared_by_many_components_fails_only_its_component() -> Result<()>
{
    let (_dir, app, ext) = fresh().await?;
    let n = 40;
    let make = |v: &str| -> Comps {
        (0..n)
            .map(|c| {
                (
                    format!("c{c:02}").into_stable_key(),
                    (0..3)
                        .map(|r| (format!("c{c:02}/k{r}").into_stable_key(), v.to_string()))
                        .collect(),
                )
            })
            .collect()
    };
    let poison = k("c07/k1");
    ext.fail_keys(std::slice::from_ref(&poison));
    let err = expect_err(run_comps(&app, &ext, make("1")).await);
    assert_eq!(failed_paths(&err), vec!["/c07"], "{err}");
    // Every healthy key landed exactly once.
    let per_key = applications_per_key(&ext);
    for c in 0..n {
        for r in 0..3 {
            let key = format!("c{c:02}/k{r}").into_stable_key();
            let got = per_key.get(&key).copied().unwrap_or(0);
            if c == 7 {
                assert!(key != poison || got == 0);
                assert!(got <= 1, "{key} applied {got} times");
            } else {
                assert_eq!(got, 1, "{key} applied {got} times");
            }
        }
    }
    // The next run, healed, does only c07's states.
    ext.heal();
    ext.clear();
    run_comps(&app, &ext, make("1")).await?;
    let touched: BTreeSet<String> = ext.applied().iter().map(|a| a.key.to_string()).collect();
    assert!(touched.contains("\"c07/k1\""), "{touched:?}");
    assert!(
        touched.iter().all(|key| key.starts_with("\"c07/")),
        "only the failed component's states are applied again: {touched:?}"
    );
    ext.clear();
    run_comps(&app, &ext, make("1")).await?;
    assert_eq!(ext.calls(), 0);
    Ok(())
}

#[tokio::test]
async fn retry_policy_max_attempts_is_the_number_of_calls_for_a_failing_component() -> Result<()> {
    for max in [1u32, 2, 3, 5] {
        let dir = tempfile::tempdir()?;
        let app = open_with(dir.path(), |b| b.retry_policy(fast_retry(max))).await?;
        let ext = Ext::new();
        ext.fail_with(|_| Some(Error::msg("down")));
        let err = expect_err(run_flat(&app, &ext, rows(&[("x", "1")])).await);
        assert_eq!(failed_paths(&err), vec!["/"], "{err}");
        assert_eq!(
            ext.attempts().len(),
            max as usize,
            "max_attempts = {max}: {:?}",
            ext.attempts()
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_sink_failing_twice_lands_with_three_attempts_and_fails_with_two() -> Result<()> {
    for (max, ok) in [(3u32, true), (2, false)] {
        let dir = tempfile::tempdir()?;
        let app = open_with(dir.path(), |b| b.retry_policy(fast_retry(max))).await?;
        let ext = Ext::new();
        let n = Arc::new(AtomicUsize::new(0));
        ext.fail_with(move |_| {
            (n.fetch_add(1, Ordering::SeqCst) < 2).then(|| Error::msg("transient"))
        });
        let r = run_flat(&app, &ext, rows(&[("x", "1")])).await;
        assert_eq!(r.is_ok(), ok, "max_attempts {max}: {r:?}");
        assert_eq!(ext.attempts().len(), max as usize);
        if ok {
            assert_eq!(r?.created, 1);
            assert_eq!(ext.store(), smap(&[("x", "1")]));
        } else {
            assert!(ext.store().is_empty());
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_permanent_error_is_tried_once_whatever_max_attempts() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open_with(dir.path(), |b| b.retry_policy(fast_retry(6))).await?;
    let ext = Ext::new();
    ext.fail_with(|_| Some(Error::permanent("constraint violated")));
    let err = expect_err(run_flat(&app, &ext, rows(&[("x", "1")])).await);
    assert!(err.to_string().contains("constraint violated"), "{err}");
    assert_eq!(ext.attempts().len(), 1);
    Ok(())
}

#[tokio::test]
async fn possible_records_accumulate_over_failed_updates_across_reopens_until_one_lands(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    let x = k("x");
    {
        let app = open(dir.path()).await?;
        run_flat(&app, &ext, rows(&[("x", "1")])).await?;
        ext.fail_keys(std::slice::from_ref(&x));
        expect_err(run_flat(&app, &ext, rows(&[("x", "2")])).await);
    }
    {
        let app = open(dir.path()).await?;
        ext.clear();
        expect_err(run_flat(&app, &ext, rows(&[("x", "3")])).await);
        let seen = ext.seen(&x);
        assert!(!seen.is_empty());
        assert_eq!(
            seen[0].prev,
            vec!["1".to_string(), "2".to_string()],
            "{seen:?}"
        );
        assert!(seen[0].missing, "{seen:?}");
    }
    let app = open(dir.path()).await?;
    ext.heal();
    ext.clear();
    run_flat(&app, &ext, rows(&[("x", "3")])).await?;
    let seen = ext.seen(&x);
    assert_eq!(
        seen[0].prev,
        vec!["1".to_string(), "2".to_string(), "3".to_string()],
        "every value the target may hold is a possible record: {seen:?}"
    );
    assert!(seen[0].missing);
    assert_eq!(ext.applied(), vec![ap("update", "x", Some("3"))]);
    // Landed: the records collapse to the one applied.
    ext.clear();
    run_flat(&app, &ext, rows(&[("x", "3")])).await?;
    let seen = ext.seen(&x);
    assert_eq!(seen[0].prev, vec!["3".to_string()]);
    assert!(!seen[0].missing);
    assert_eq!(ext.calls(), 0);
    Ok(())
}

#[tokio::test]
async fn a_failed_create_is_deleted_after_a_reopen_once_no_longer_declared() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    {
        let app = open(dir.path()).await?;
        ext.fail_keys(&[k("y")]);
        expect_err(run_flat(&app, &ext, rows(&[("y", "1"), ("z", "1")])).await);
    }
    ext.heal();
    ext.clear();
    let app = open(dir.path()).await?;
    run_flat(&app, &ext, rows(&[("z", "1")])).await?;
    let seen = ext.seen(&k("y"));
    assert_eq!(
        seen.len(),
        1,
        "the failed create is reconciled with None: {seen:?}"
    );
    assert_eq!(seen[0].desired, None);
    assert!(
        seen[0].missing || seen[0].prev == vec!["1".to_string()],
        "{seen:?}"
    );
    let on_y: Vec<Applied> = ext
        .applied()
        .into_iter()
        .filter(|a| a.key == k("y"))
        .collect();
    assert_eq!(on_y, vec![ap("delete", "y", None)]);
    assert_eq!(ext.store(), smap(&[("z", "1")]));
    ext.clear();
    run_flat(&app, &ext, rows(&[("z", "1")])).await?;
    assert_no_calls(&ext);
    assert!(ext.seen(&k("y")).is_empty(), "y is forgotten once deleted");
    Ok(())
}

#[tokio::test]
async fn failed_deletes_are_retried_and_a_redeclared_state_is_applied_afresh_after_reopen(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    {
        let app = open(dir.path()).await?;
        run_flat(&app, &ext, rows(&[("x", "1"), ("y", "1"), ("z", "1")])).await?;
        ext.fail_keys(&[k("x"), k("y")]);
        ext.clear();
        expect_err(run_flat(&app, &ext, rows(&[("z", "1")])).await);
        assert_eq!(ext.store(), smap(&[("x", "1"), ("y", "1"), ("z", "1")]));
    }
    ext.heal();
    ext.clear();
    let app = open(dir.path()).await?;
    // x comes back with its old value: it may be missing, so it is applied.
    run_flat(&app, &ext, rows(&[("x", "1"), ("z", "1")])).await?;
    assert_eq!(
        ext.applied(),
        vec![ap("delete", "y", None), ap("update", "x", Some("1"))]
    );
    assert_eq!(ext.store(), smap(&[("x", "1"), ("z", "1")]));
    ext.clear();
    run_flat(&app, &ext, rows(&[("x", "1"), ("z", "1")])).await?;
    assert_no_calls(&ext);
    Ok(())
}

#[tokio::test]
async fn a_removed_component_whose_deletes_failed_is_cleaned_up_after_a_reopen() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    {
        let app = open(dir.path()).await?;
        run_comps(
            &app,
            &ext,
            comps(&[("A", &[("a", "1")]), ("B", &[("b", "1")])]),
        )
        .await?;
        ext.fail_keys(&[k("a")]);
        expect_err(run_comps(&app, &ext, comps(&[("B", &[("b", "1")])])).await);
        assert_eq!(ext.store(), smap(&[("a", "1"), ("b", "1")]));
    }
    ext.heal();
    ext.clear();
    let app = open(dir.path()).await?;
    run_comps(&app, &ext, comps(&[("B", &[("b", "1")])])).await?;
    assert_eq!(ext.applied(), vec![ap("delete", "a", None)]);
    ext.clear();
    run_comps(&app, &ext, comps(&[("B", &[("b", "1")])])).await?;
    assert_no_calls(&ext);
    Ok(())
}

#[tokio::test]
async fn a_sink_failure_error_names_the_provider_the_key_and_the_component() -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    let key = ("k", 7i64).into_stable_key();
    let bad = key.clone();
    ext.fail_with(move |keys| {
        keys.contains(&bad)
            .then(|| Error::msg("rejected by the target"))
    });
    let handler = ext.handler();
    let kk = key.clone();
    let r = bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        ctx.mount("outer", move |c| async move {
            let p2 = p.clone();
            c.mount_each(
                vec!["alpha", "beta"],
                |n| *n,
                move |c, n| {
                    let p = p2.clone();
                    let kk = kk.clone();
                    async move {
                        if n == "alpha" {
                            declare_target_state(&c, p.target_state(kk, "v".to_string()))
                        } else {
                            declare_target_state(&c, p.target_state("fine", "v".to_string()))
                        }
                    }
                },
            )
            .await
        })
        .await
    }))
    .await;
    let err = expect_err(r);
    assert_eq!(failed_paths(&err), vec!["/outer/alpha"], "{err}");
    let cause = &err.failed_components()[0].cause;
    for part in [KV, "[\"k\",7]"] {
        assert!(cause.contains(part), "the cause names {part}: {cause}");
    }
    let text = err.to_string();
    assert!(text.contains("/outer/alpha"), "{text}");
    assert_eq!(ext.store(), smap(&[("fine", "v")]));
    Ok(())
}

#[tokio::test]
async fn a_handler_error_names_the_provider_the_key_and_the_full_path() -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    let handler = ext.handler();
    let r = bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        let p2 = p.clone();
        ctx.mount(7i64, move |c| async move {
            c.mount(StableKey::Symbol(Arc::from("in")), move |c| async move {
                declare_target_state(&c, p2.target_state(42i64, "!err".to_string()))
            })
            .await
        })
        .await
        .ok();
        declare_target_state(&ctx, p.target_state("root", "v".to_string()))
    }))
    .await;
    let err = expect_err(r);
    let paths = failed_paths(&err);
    assert!(paths.iter().any(|p| p.contains("in")), "{err}");
    let f = err
        .failed_components()
        .iter()
        .find(|f| f.path.to_string().contains("in"))
        .expect("the inner component fails");
    assert!(f.path.to_string().starts_with("/7/"), "{}", f.path);
    for part in [KV, "42", "refuses"] {
        assert!(
            f.cause.contains(part),
            "the cause names {part}: {}",
            f.cause
        );
    }
    assert_eq!(ext.store(), smap(&[("root", "v")]));
    Ok(())
}

#[tokio::test]
async fn a_state_moved_into_a_component_whose_apply_failed_is_deleted_once_nobody_declares_it(
) -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    run_comps(
        &app,
        &ext,
        comps(&[("A", &[("x", "1")]), ("K", &[("k", "1")])]),
    )
    .await?;
    // A is removed; B takes x with a new value, and the sink rejects it.
    ext.fail_keys(&[k("x")]);
    let err = expect_err(
        run_comps(
            &app,
            &ext,
            comps(&[("B", &[("x", "2")]), ("K", &[("k", "1")])]),
        )
        .await,
    );
    assert_eq!(failed_paths(&err), vec!["/B"], "{err}");
    assert_eq!(ext.store(), smap(&[("k", "1"), ("x", "1")]));
    // Nobody declares x any more: it is deleted, once.
    ext.heal();
    ext.clear();
    run_comps(&app, &ext, comps(&[("K", &[("k", "1")])])).await?;
    assert_eq!(ext.applied(), vec![ap("delete", "x", None)]);
    ext.clear();
    run_comps(&app, &ext, comps(&[("K", &[("k", "1")])])).await?;
    assert_no_calls(&ext);
    assert_eq!(ext.store(), smap(&[("k", "1")]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_whose_code_panics_fails_alone_and_keeps_its_earlier_states() -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    async fn go(
        app: &App,
        ext: &Ext,
        list: Vec<(&'static str, &'static str)>,
    ) -> Result<RunReport> {
        let handler = ext.handler();
        bounded(app.run_report(move |ctx| async move {
            let p = register_root_target_states_provider(&ctx, KV, handler)?;
            ctx.mount_each(
                list,
                |(c, _)| *c,
                move |c, (name, v)| {
                    let p = p.clone();
                    async move {
                        if v == "panic" {
                            panic!("user code panics in {name}");
                        }
                        declare_target_state(&c, p.target_state(format!("{name}x"), v.to_string()))
                    }
                },
            )
            .await
        }))
        .await
    }
    go(&app, &ext, vec![("A", "1"), ("B", "1")]).await?;
    ext.clear();
    let r = go(&app, &ext, vec![("A", "panic"), ("B", "2")]).await?;
    assert_eq!(report_paths(&r), vec!["/A"]);
    assert_eq!(ext.store(), smap(&[("Ax", "1"), ("Bx", "2")]));
    ext.clear();
    let r = go(&app, &ext, vec![("B", "2")]).await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(ext.applied(), vec![ap("delete", "Ax", None)]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_poisoned_components_in_small_batches_fail_alone_and_the_rest_land_once(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open_with(dir.path(), |b| {
        b.batch_policy(BatchPolicy {
            max_actions: 7,
            linger: Duration::from_millis(5),
        })
        .shards(4)
    })
    .await?;
    let ext = Ext::new();
    let poisoned: BTreeSet<i64> = [3, 41, 42, 97].into_iter().collect();
    let bad: Vec<StableKey> = poisoned
        .iter()
        .map(|c| (*c, 1i64).into_stable_key())
        .collect();
    let bad_set: BTreeSet<StableKey> = bad.iter().cloned().collect();
    // Permanent for two of them, retriable for the others.
    ext.fail_with(move |keys| {
        keys.iter().find(|k| bad_set.contains(k)).map(|k| {
            if matches!(k, StableKey::Array(a) if a[0] == StableKey::Int(41) || a[0] == StableKey::Int(3)) {
                Error::permanent(format!("constraint on {k}"))
            } else {
                Error::msg(format!("transient on {k}"))
            }
        })
    });
    let c: Comps = (0..100i64)
        .map(|c| {
            (
                StableKey::Int(c),
                (0..3i64)
                    .map(|r| ((c, r).into_stable_key(), "v".to_string()))
                    .collect(),
            )
        })
        .collect();
    let err = expect_err(run_comps(&app, &ext, c.clone()).await);
    let want: Vec<String> = poisoned.iter().map(|c| format!("/{c}")).collect();
    let mut want = want;
    want.sort();
    assert_eq!(failed_paths(&err), want, "{err}");
    let per_key = applications_per_key(&ext);
    for cc in 0..100i64 {
        for r in 0..3i64 {
            let key = (cc, r).into_stable_key();
            let got = per_key.get(&key).copied().unwrap_or(0);
            if poisoned.contains(&cc) {
                assert!(got <= 1, "{key}: {got}");
            } else {
                assert_eq!(got, 1, "{key} applied {got} times");
            }
        }
    }
    assert!(lock(&ext.applied).iter().all(|call| call.len() <= 7));
    ext.heal();
    ext.clear();
    run_comps(&app, &ext, c.clone()).await?;
    let comps_touched: BTreeSet<StableKey> = ext
        .applied()
        .into_iter()
        .map(|a| match a.key {
            StableKey::Array(items) => items[0].clone(),
            other => other,
        })
        .collect();
    let want: BTreeSet<StableKey> = poisoned.iter().map(|c| StableKey::Int(*c)).collect();
    assert_eq!(comps_touched, want);
    ext.clear();
    run_comps(&app, &ext, c).await?;
    assert_eq!(ext.calls(), 0);
    Ok(())
}
