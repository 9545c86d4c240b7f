//! Preview (applies nothing, writes no ledger), drop_state, and providers
//! not registered in a run.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use weir::prelude::*;

use crate::support::*;

#[tokio::test]
async fn a_preview_lists_moves_as_updates_and_removed_components_as_deletes_and_applies_nothing(
) -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    run_comps(
        &app,
        &ext,
        comps(&[("A", &[("x", "1"), ("y", "1")]), ("B", &[("z", "1")])]),
    )
    .await?;
    let next = || comps(&[("A", &[("y", "1")]), ("C", &[("x", "2"), ("w", "1")])]);
    let want = vec![
        (KV.to_string(), k("w"), "create"),
        (KV.to_string(), k("x"), "update"),
        (KV.to_string(), k("z"), "delete"),
    ];
    for _ in 0..2 {
        ext.clear();
        let p = preview_comps(&app, &ext, next()).await?;
        assert_eq!(preview_summary(&p), want);
        assert!(ext.attempts().is_empty(), "a preview calls no sink");
        assert_eq!(ext.store(), smap(&[("x", "1"), ("y", "1"), ("z", "1")]));
    }
    ext.clear();
    run_comps(&app, &ext, next()).await?;
    assert_eq!(
        ext.applied(),
        vec![
            ap("create", "w", Some("1")),
            ap("delete", "z", None),
            ap("update", "x", Some("2")),
        ]
    );
    let p = preview_comps(&app, &ext, next()).await?;
    assert!(p.is_empty(), "{p:?}");
    Ok(())
}

#[tokio::test]
async fn a_preview_after_a_failed_run_keeps_the_possible_records_for_the_next_run() -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    run_flat(&app, &ext, rows(&[("x", "1")])).await?;
    ext.fail_keys(&[k("x")]);
    expect_err(run_flat(&app, &ext, rows(&[("x", "2")])).await);
    ext.heal();
    ext.clear();
    let handler = ext.handler();
    let p = bounded(app.preview(|ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        declare_target_state(&ctx, p.target_state("x", "2".to_string()))
    }))
    .await?;
    assert_eq!(
        preview_summary(&p),
        vec![(KV.to_string(), k("x"), "update")]
    );
    assert!(ext.attempts().is_empty());
    ext.clear();
    run_flat(&app, &ext, rows(&[("x", "2")])).await?;
    let seen = ext.seen(&k("x"));
    assert!(
        seen[0].missing,
        "the preview must not confirm the failed update: {seen:?}"
    );
    assert_eq!(ext.applied(), vec![ap("update", "x", Some("2"))]);
    Ok(())
}

#[tokio::test]
async fn previews_on_a_fresh_ledger_record_nothing_for_a_later_app() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    let decl = || comps(&[("A", &[("a", "1")]), ("B", &[("b", "1"), ("c", "1")])]);
    {
        let app = open(dir.path()).await?;
        for _ in 0..2 {
            let p = preview_comps(&app, &ext, decl()).await?;
            assert_eq!(preview_summary(&p).len(), 3);
            assert!(preview_summary(&p)
                .iter()
                .all(|(_, _, kind)| *kind == "create"));
        }
    }
    let app = open(dir.path()).await?;
    let stats = run_comps(&app, &ext, decl()).await?;
    assert_eq!(stats.created, 3);
    assert_eq!(
        ext.applied(),
        vec![
            ap("create", "a", Some("1")),
            ap("create", "b", Some("1")),
            ap("create", "c", Some("1")),
        ]
    );
    Ok(())
}

#[tokio::test]
async fn a_preview_with_a_failing_component_records_no_failure_in_the_ledger() -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    run_comps(
        &app,
        &ext,
        comps(&[("A", &[("a", "1")]), ("B", &[("b", "1")])]),
    )
    .await?;
    ext.clear();
    let handler = ext.handler();
    let r = bounded(app.preview(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        ctx.mount_each(
            vec!["A", "B"],
            |c| *c,
            move |c, name| {
                let p = p.clone();
                async move {
                    if name == "A" {
                        return Err(Error::msg("A fails in the preview"));
                    }
                    declare_target_state(&c, p.target_state("b", "2".to_string()))
                }
            },
        )
        .await
    }))
    .await;
    let err = expect_err(r);
    assert_eq!(failed_paths(&err), vec!["/A"], "{err}");
    let report = app.inspect().await?;
    assert!(
        report.failures.is_empty(),
        "a preview writes nothing to the ledger, yet it holds failures {:?}",
        report.failures
    );
    assert!(ext.attempts().is_empty());
    Ok(())
}

#[tokio::test]
async fn a_preview_of_a_destructive_change_changes_nothing_and_the_run_still_recreates(
) -> Result<()> {
    let (_dir, app, t) = fresh_tables().await?;
    let inv = Some(TargetChildInvalidation::Destructive);
    run_table(&app, &t, inv, Some(1), two_comps_one_row_each()).await?;
    t.clear();
    for _ in 0..2 {
        let handler = t.handler(inv);
        let p = bounded(app.preview(move |ctx| async move {
            let tp = register_root_target_states_provider(&ctx, TABLES, handler)?;
            let rows: TargetStateProvider<String> =
                mount_target(&ctx, tp.target_state("t", Spec { generation: 2 })).await?;
            ctx.mount_each(
                vec!["c1", "c2"],
                |c| *c,
                move |c, name| {
                    let rows = rows.clone();
                    async move {
                        let key = if name == "c1" { "a" } else { "b" };
                        declare_target_state(&c, rows.target_state(key, "1".to_string()))
                    }
                },
            )
            .await
        }))
        .await?;
        let mut summary: Vec<(StableKey, &str)> = preview_summary(&p)
            .into_iter()
            .map(|(_, key, kind)| (key, kind))
            .collect();
        summary.sort();
        assert_eq!(
            summary,
            vec![(k("a"), "create"), (k("b"), "create"), (k("t"), "update")],
            "{p:?}"
        );
        assert!(t.log().is_empty());
        assert_eq!(t.rows.calls(), 0);
    }
    run_table(&app, &t, inv, Some(2), two_comps_one_row_each()).await?;
    assert_eq!(t.log(), vec!["recreate t"]);
    assert_eq!(
        t.rows.applied(),
        vec![ap("create", "a", Some("1")), ap("create", "b", Some("1"))]
    );
    Ok(())
}

#[tokio::test]
async fn drop_state_deletes_nested_states_and_a_container_alone_and_counts_exactly() -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    let t = Tables::default();
    async fn full(app: &App, ext: &Ext, t: &Tables) -> Result<UpdateStats> {
        let handler = ext.handler();
        let th = t.handler(None);
        bounded(app.run(move |ctx| async move {
            let p = register_root_target_states_provider(&ctx, KV, handler)?;
            let tp = register_root_target_states_provider(&ctx, TABLES, th)?;
            declare_target_state(&ctx, p.target_state("r", "1".to_string()))?;
            let rows: TargetStateProvider<String> =
                mount_target(&ctx, tp.target_state("t", Spec { generation: 1 })).await?;
            let pa = p.clone();
            ctx.mount("a", move |c| async move {
                declare_target_state(&c, pa.target_state("a", "1".to_string()))?;
                c.mount("b", move |c| async move {
                    declare_target_state(&c, pa.target_state("b", "1".to_string()))
                })
                .await
            })
            .await?;
            ctx.mount("rows", move |c| async move {
                declare_target_state(&c, rows.target_state("row1", "1".to_string()))?;
                declare_target_state(&c, rows.target_state("row2", "1".to_string()))
            })
            .await
        }))
        .await
    }
    async fn drop_all(app: &App, ext: &Ext, t: &Tables) -> Result<UpdateStats> {
        let handler = ext.handler();
        let th = t.handler(None);
        bounded(app.drop_state(move |ctx| async move {
            register_root_target_states_provider(&ctx, KV, handler)?;
            register_root_target_states_provider(&ctx, TABLES, th)?;
            Ok(())
        }))
        .await
    }
    full(&app, &ext, &t).await?;
    assert_eq!(t.rows.store().len(), 2);
    ext.clear();
    t.clear();
    let stats = drop_all(&app, &ext, &t).await?;
    assert_eq!(
        ext.applied(),
        vec![
            ap("delete", "a", None),
            ap("delete", "b", None),
            ap("delete", "r", None)
        ]
    );
    assert_eq!(t.log(), vec!["drop t"]);
    assert_eq!(t.rows.calls(), 0, "rows go with their table");
    assert_eq!(stats.deleted, 4, "{stats:?}");
    assert_eq!((stats.created, stats.updated), (0, 0));
    // Nothing is tracked any more.
    ext.clear();
    t.clear();
    let stats = drop_all(&app, &ext, &t).await?;
    assert_eq!((ext.calls(), t.log().len(), stats.deleted), (0, 0, 0));
    // And everything is created again by a full run.
    let stats = full(&app, &ext, &t).await?;
    assert_eq!(ext.store(), smap(&[("a", "1"), ("b", "1"), ("r", "1")]));
    assert_eq!(t.rows.store(), smap(&[("row1", "1"), ("row2", "1")]));
    assert_eq!(stats.created, 6, "{stats:?}");
    Ok(())
}

#[tokio::test]
async fn a_drop_state_whose_sink_fails_for_one_key_leaves_only_it_for_the_next_drop() -> Result<()>
{
    let (_dir, app, ext) = fresh().await?;
    run_comps(
        &app,
        &ext,
        comps(&[
            ("A", &[("a", "1")]),
            ("B", &[("b", "1")]),
            ("C", &[("c", "1")]),
        ]),
    )
    .await?;
    async fn drop_all(app: &App, ext: &Ext) -> Result<UpdateStats> {
        let handler = ext.handler();
        bounded(app.drop_state(move |ctx| async move {
            register_root_target_states_provider(&ctx, KV, handler)?;
            Ok(())
        }))
        .await
    }
    ext.fail_keys(&[k("b")]);
    let err = expect_err(drop_all(&app, &ext).await);
    assert!(err.to_string().contains("\"b\""), "{err}");
    assert_eq!(ext.store(), smap(&[("b", "1")]));
    ext.heal();
    ext.clear();
    let stats = drop_all(&app, &ext).await?;
    assert_eq!(ext.applied(), vec![ap("delete", "b", None)]);
    assert_eq!(stats.deleted, 1);
    ext.clear();
    let stats = drop_all(&app, &ext).await?;
    assert_eq!((ext.calls(), stats.deleted), (0, 0));
    Ok(())
}

#[tokio::test]
async fn states_of_a_provider_not_registered_in_a_run_stay_tracked_until_it_is_registered_again(
) -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    // The provider is registered by the components themselves.
    async fn go(
        app: &App,
        ext: &Ext,
        list: Vec<(&'static str, &'static str)>,
        root_registers: bool,
    ) -> Result<()> {
        let handler = Arc::new(Mutex::new(Some(ext.handler())));
        let ext2 = ext.clone();
        bounded(app.run(move |ctx| async move {
            if root_registers {
                let h = lock(&handler).take().expect("one handler");
                register_root_target_states_provider(&ctx, KV, h)?;
            }
            ctx.mount_each(
                list,
                |(c, _)| *c,
                move |c, (_, key)| {
                    let ext = ext2.clone();
                    async move {
                        let p = register_root_target_states_provider(&c, KV, ext.handler())?;
                        declare_target_state(&c, p.target_state(key, "1".to_string()))
                    }
                },
            )
            .await
        }))
        .await?;
        Ok(())
    }
    go(&app, &ext, vec![("A", "a"), ("B", "b")], false).await?;
    assert_eq!(ext.store(), smap(&[("a", "1"), ("b", "1")]));
    // B is removed; A still registers the provider: b is deleted.
    ext.clear();
    go(&app, &ext, vec![("A", "a")], false).await?;
    assert_eq!(ext.applied(), vec![ap("delete", "b", None)]);
    // Nobody registers the provider: its handler cannot be reached, so a is
    // left in place (and must stay tracked).
    ext.clear();
    let r = go(&app, &ext, vec![], false).await;
    assert_eq!(ext.store(), smap(&[("a", "1")]), "{r:?}");
    // Registered again without declaring a: a is deleted now.
    ext.clear();
    go(&app, &ext, vec![], true).await?;
    assert_eq!(
        ext.store(),
        BTreeMap::new(),
        "a state left in place while its provider was not registered must still be \\
         tracked and deleted once the provider is back; applied {:?}",
        ext.applied()
    );
    Ok(())
}

#[tokio::test]
async fn a_drop_state_that_does_not_register_a_provider_leaves_its_states_for_a_later_drop(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let one = Ext::new();
    let two = Ext::new();
    let (h1, h2) = (one.handler(), two.handler());
    bounded(app.run(move |ctx| async move {
        let p1 = register_root_target_states_provider(&ctx, "acc/one", h1)?;
        let p2 = register_root_target_states_provider(&ctx, "acc/two", h2)?;
        declare_target_state(&ctx, p1.target_state("a", "1".to_string()))?;
        declare_target_state(&ctx, p2.target_state("b", "1".to_string()))
    }))
    .await?;
    let h1 = one.handler();
    let r = bounded(app.drop_state(move |ctx| async move {
        register_root_target_states_provider(&ctx, "acc/one", h1)?;
        Ok(())
    }))
    .await;
    assert!(one.store().is_empty(), "{r:?}");
    assert_eq!(two.store(), smap(&[("b", "1")]));
    let (h1, h2) = (one.handler(), two.handler());
    let r = bounded(app.drop_state(move |ctx| async move {
        register_root_target_states_provider(&ctx, "acc/one", h1)?;
        register_root_target_states_provider(&ctx, "acc/two", h2)?;
        Ok(())
    }))
    .await;
    assert!(
        two.store().is_empty(),
        "b must still be tracked and dropped once its provider is registered: {r:?}"
    );
    Ok(())
}
