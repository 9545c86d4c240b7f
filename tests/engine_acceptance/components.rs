//! Components: failing parents, component keys, nested mounts.

use std::sync::Arc;

use weir::prelude::*;

use crate::support::*;

#[tokio::test]
async fn a_parent_failing_after_its_children_committed_keeps_its_own_states_and_old_children(
) -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    async fn go(
        app: &App,
        ext: &Ext,
        own: &'static str,
        kids: Vec<(&'static str, &'static str)>,
        fail: bool,
    ) -> Result<RunReport> {
        let handler = ext.handler();
        bounded(app.run_report(move |ctx| async move {
            let p = register_root_target_states_provider(&ctx, KV, handler)?;
            ctx.mount_each(
                vec!["p"],
                |c| *c,
                move |c, _| {
                    let p = p.clone();
                    let kids = kids.clone();
                    async move {
                        declare_target_state(&c, p.target_state("p0", own.to_string()))?;
                        let pk = p.clone();
                        c.mount_each(
                            kids,
                            |(name, _)| *name,
                            move |c, (name, v)| {
                                let p = pk.clone();
                                async move {
                                    declare_target_state(
                                        &c,
                                        p.target_state(format!("{name}x"), v.to_string()),
                                    )
                                }
                            },
                        )
                        .await?;
                        if fail {
                            return Err(Error::msg("p broke after its children"));
                        }
                        Ok(())
                    }
                },
            )
            .await
        }))
        .await
    }
    go(&app, &ext, "1", vec![("c1", "1"), ("old", "1")], false).await?;
    assert_eq!(
        ext.store(),
        smap(&[("c1x", "1"), ("oldx", "1"), ("p0", "1")])
    );
    ext.clear();
    let r = go(&app, &ext, "2", vec![("c1", "2"), ("c2", "1")], true).await?;
    assert_eq!(report_paths(&r), vec!["/p"]);
    assert!(r.failures[0].cause.contains("p broke"), "{:?}", r.failures);
    assert_eq!(
        ext.store(),
        smap(&[("c1x", "2"), ("c2x", "1"), ("oldx", "1"), ("p0", "1")]),
        "children commit on their own; the failed parent applies and deletes nothing"
    );
    ext.clear();
    let r = go(&app, &ext, "2", vec![("c1", "2"), ("c2", "1")], false).await?;
    assert!(r.failures.is_empty());
    assert_eq!(
        ext.applied(),
        vec![ap("delete", "oldx", None), ap("update", "p0", Some("2"))]
    );
    Ok(())
}

#[tokio::test]
async fn component_keys_with_slashes_do_not_collide_with_nested_components() -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    async fn go(app: &App, ext: &Ext, flat: bool, nested: bool) -> Result<()> {
        let handler = ext.handler();
        bounded(app.run(move |ctx| async move {
            let p = register_root_target_states_provider(&ctx, KV, handler)?;
            if flat {
                let p = p.clone();
                ctx.mount("a/b", move |c| async move {
                    declare_target_state(&c, p.target_state("flat", "1".to_string()))
                })
                .await?;
            }
            if nested {
                ctx.mount("a", move |c| async move {
                    c.mount("b", move |c| async move {
                        declare_target_state(&c, p.target_state("nested", "1".to_string()))
                    })
                    .await
                })
                .await?;
            }
            Ok(())
        }))
        .await?;
        Ok(())
    }
    go(&app, &ext, true, true).await?;
    assert_eq!(ext.store(), smap(&[("flat", "1"), ("nested", "1")]));
    ext.clear();
    go(&app, &ext, true, true).await?;
    assert_no_calls(&ext);
    go(&app, &ext, false, true).await?;
    assert_eq!(ext.applied(), vec![ap("delete", "flat", None)]);
    ext.clear();
    go(&app, &ext, true, false).await?;
    assert_eq!(
        ext.applied(),
        vec![
            ap("create", "flat", Some("1")),
            ap("delete", "nested", None)
        ]
    );
    Ok(())
}

#[tokio::test]
async fn component_keys_of_different_kinds_are_different_components() -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    let s = |x: &str| StableKey::Str(Arc::from(x));
    let all = vec![
        s("1"),
        StableKey::Int(1),
        StableKey::Symbol(Arc::from("1")),
        StableKey::Bytes(Arc::from(b"1".to_vec())),
        StableKey::Array(Arc::from(vec![s("1")])),
        StableKey::Null,
        s(""),
        ("1", 1i64).into_stable_key(),
    ];
    let mk = |keys: &[StableKey]| -> Comps {
        keys.iter()
            .enumerate()
            .map(|(i, c)| (c.clone(), vec![(StableKey::Int(i as i64), format!("v{i}"))]))
            .collect()
    };
    let stats = run_comps(&app, &ext, mk(&all)).await?;
    assert_eq!(stats.created, all.len() as u64);
    // Remove only the Int(1) component (index 1).
    ext.clear();
    let mut fewer = mk(&all);
    fewer.remove(1);
    run_comps(&app, &ext, fewer).await?;
    assert_eq!(
        ext.applied(),
        vec![Applied {
            verb: "delete",
            key: StableKey::Int(1),
            value: None
        }]
    );
    Ok(())
}

/// Counts the components running their code at once, and the most seen.
#[derive(Default)]
struct Running {
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

impl Running {
    async fn during(&self, work: impl std::future::Future<Output = ()>) {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.now.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        work.await;
        self.now.fetch_sub(1, SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_nested_children_all_commit_and_never_more_than_max_inflight_run_at_once() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let app = open_with(dir.path(), |b| b.max_inflight_components(5)).await?;
    let ext = Ext::new();
    let handler = ext.handler();
    let running = Arc::new(Running::default());
    let leaves = Arc::clone(&running);
    // More children per parent than the parent takes slots for at once.
    bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        ctx.mount_each(
            (0..40i64).collect::<Vec<_>>(),
            |i| *i,
            move |c, i| {
                let p = p.clone();
                let leaves = Arc::clone(&leaves);
                async move {
                    c.mount_each(
                        (0..50i64).collect::<Vec<_>>(),
                        |j| *j,
                        move |e, j| {
                            let p = p.clone();
                            let leaves = Arc::clone(&leaves);
                            async move {
                                leaves
                                    .during(tokio::time::sleep(std::time::Duration::from_micros(
                                        200,
                                    )))
                                    .await;
                                declare_target_state(&e, p.target_state((i, j), "v".to_string()))
                            }
                        },
                    )
                    .await
                }
            },
        )
        .await
    }))
    .await?;
    assert_eq!(ext.store().len(), 40 * 50);
    let most = running.most.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        (2..=5).contains(&most),
        "{most} leaves ran at once, with 5 slots"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_inflight_components_of_one_runs_nested_mounts_without_deadlock() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open_with(dir.path(), |b| b.max_inflight_components(1)).await?;
    let ext = Ext::new();
    let handler = ext.handler();
    bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        ctx.mount_each(
            vec![0i64, 1, 2],
            |i| *i,
            move |c, i| {
                let p = p.clone();
                async move {
                    let pg = p.clone();
                    c.mount("g", move |g| async move {
                        declare_target_state(&g, pg.target_state(("g", i), "v".to_string()))
                    })
                    .await?;
                    let pe = p.clone();
                    c.mount_each(
                        vec![10i64, 11],
                        |j| *j,
                        move |e, j| {
                            let p = pe.clone();
                            async move {
                                declare_target_state(&e, p.target_state((i, j), "v".to_string()))
                            }
                        },
                    )
                    .await
                }
            },
        )
        .await
    }))
    .await?;
    assert_eq!(ext.store().len(), 9);
    Ok(())
}
