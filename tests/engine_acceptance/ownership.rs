//! Ownership transfer (guarantee 4) and duplicate declarations (11).

use std::collections::BTreeMap;

use weir::prelude::*;

use crate::support::*;

#[tokio::test]
async fn two_components_swapping_their_states_lose_nothing_and_each_is_deleted_once() -> Result<()>
{
    let (_dir, app, ext) = fresh().await?;
    run_comps(
        &app,
        &ext,
        comps(&[("A", &[("x", "1")]), ("B", &[("y", "1")])]),
    )
    .await?;
    ext.clear();
    run_comps(
        &app,
        &ext,
        comps(&[("A", &[("y", "1")]), ("B", &[("x", "1")])]),
    )
    .await?;
    assert!(
        ext.applied().iter().all(|a| a.verb != "delete"),
        "a swap deletes nothing: {:?}",
        ext.applied()
    );
    assert_eq!(ext.store(), smap(&[("x", "1"), ("y", "1")]));

    // Each state has one owner now: removing both deletes each once.
    ext.clear();
    run_comps(&app, &ext, comps(&[("A", &[]), ("B", &[])])).await?;
    assert_eq!(
        ext.applied(),
        vec![ap("delete", "x", None), ap("delete", "y", None)]
    );
    ext.clear();
    run_comps(&app, &ext, comps(&[])).await?;
    assert_no_calls(&ext);
    Ok(())
}

#[tokio::test]
async fn a_state_moving_with_a_new_value_is_exactly_one_update() -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    run_comps(&app, &ext, comps(&[("A", &[("x", "1"), ("a", "1")])])).await?;
    ext.clear();
    let stats = run_comps(
        &app,
        &ext,
        comps(&[("A", &[("a", "1")]), ("B", &[("x", "2")])]),
    )
    .await?;
    assert_eq!(ext.applied(), vec![ap("update", "x", Some("2"))]);
    assert_eq!(
        (stats.created, stats.updated, stats.deleted, stats.unchanged),
        (0, 1, 0, 1)
    );
    assert_eq!(ext.store(), smap(&[("a", "1"), ("x", "2")]));
    Ok(())
}

#[tokio::test]
async fn a_state_moving_out_of_a_removed_subtree_into_a_new_one_is_kept() -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    // Nested: /p/c declares x; then /p goes away and /q/d declares x.
    async fn nested(app: &App, ext: &Ext, outer: &'static str, inner: &'static str) -> Result<()> {
        let handler = ext.handler();
        bounded(app.run(move |ctx| async move {
            let p = register_root_target_states_provider(&ctx, KV, handler)?;
            ctx.mount(outer, move |c| async move {
                c.mount(inner, move |c| async move {
                    declare_target_state(&c, p.target_state("x", "1".to_string()))
                })
                .await
            })
            .await
        }))
        .await?;
        Ok(())
    }
    nested(&app, &ext, "p", "c").await?;
    ext.clear();
    nested(&app, &ext, "q", "d").await?;
    assert!(
        ext.applied().iter().all(|a| a.verb != "delete"),
        "{:?}",
        ext.applied()
    );
    assert_eq!(ext.store(), smap(&[("x", "1")]));
    ext.clear();
    run_comps(&app, &ext, comps(&[])).await?;
    assert_eq!(ext.applied(), vec![ap("delete", "x", None)]);
    Ok(())
}

#[tokio::test]
async fn a_state_moving_back_and_forth_across_reopens_is_never_lost_or_deleted_twice() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    let steps: Vec<(Comps, BTreeMap<StableKey, String>)> = vec![
        (
            comps(&[("A", &[("x", "1")]), ("B", &[])]),
            smap(&[("x", "1")]),
        ),
        (
            comps(&[("A", &[]), ("B", &[("x", "1")])]),
            smap(&[("x", "1")]),
        ),
        (
            comps(&[("A", &[("x", "2")]), ("B", &[])]),
            smap(&[("x", "2")]),
        ),
        (comps(&[("B", &[("x", "3")])]), smap(&[("x", "3")])),
    ];
    for (i, (c, want)) in steps.into_iter().enumerate() {
        let app = open_with(dir.path(), |b| b.shards(1 + i % 3)).await?;
        ext.clear();
        run_comps(&app, &ext, c).await?;
        assert!(
            ext.applied().iter().all(|a| a.verb != "delete"),
            "step {i}: {:?}",
            ext.applied()
        );
        assert_eq!(ext.store(), want, "step {i}");
    }
    let app = open(dir.path()).await?;
    ext.clear();
    run_comps(&app, &ext, comps(&[("A", &[]), ("B", &[])])).await?;
    assert_eq!(ext.applied(), vec![ap("delete", "x", None)]);
    Ok(())
}

#[tokio::test]
async fn a_state_taken_while_its_old_owner_fails_is_not_deleted_when_the_old_owner_recovers(
) -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    report_comps(
        &app,
        &ext,
        comps(&[("A", &[("a", "1"), ("x", "1")]), ("B", &[])]),
    )
    .await?;
    // A fails in its own code; B takes x with a new value.
    ext.clear();
    let r = report_comps(
        &app,
        &ext,
        comps(&[
            ("A", &[("a", "1"), ("z", "!code-fails")]),
            ("B", &[("x", "2")]),
        ]),
    )
    .await?;
    assert_eq!(report_paths(&r), vec!["/A"]);
    assert_eq!(ext.store(), smap(&[("a", "1"), ("x", "2")]));
    // A succeeds again without x: x belongs to B and stays.
    ext.clear();
    let r = report_comps(
        &app,
        &ext,
        comps(&[("A", &[("a", "1")]), ("B", &[("x", "2")])]),
    )
    .await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(
        ext.store(),
        smap(&[("a", "1"), ("x", "2")]),
        "{:?}",
        ext.applied()
    );
    assert_no_calls(&ext);
    // B drops it: one delete.
    ext.clear();
    report_comps(&app, &ext, comps(&[("A", &[("a", "1")]), ("B", &[])])).await?;
    assert_eq!(ext.applied(), vec![ap("delete", "x", None)]);
    Ok(())
}

#[tokio::test]
async fn a_duplicate_declaration_leaves_the_components_earlier_states_as_they_were() -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    run_comps(
        &app,
        &ext,
        comps(&[("A", &[("x", "1"), ("y", "1")]), ("B", &[("b", "1")])]),
    )
    .await?;
    ext.clear();
    let err = expect_err(
        run_comps(
            &app,
            &ext,
            comps(&[("A", &[("x", "2"), ("x", "3")]), ("B", &[("b", "2")])]),
        )
        .await,
    );
    assert_eq!(failed_paths(&err), vec!["/A"], "{err}");
    let text = err.to_string();
    assert!(text.contains("\"x\""), "the error names the key: {text}");
    assert!(text.contains(KV), "the error names the provider: {text}");
    assert_eq!(
        ext.store(),
        smap(&[("b", "2"), ("x", "1"), ("y", "1")]),
        "A applies and deletes nothing; B lands"
    );
    ext.clear();
    run_comps(
        &app,
        &ext,
        comps(&[("A", &[("x", "2")]), ("B", &[("b", "2")])]),
    )
    .await?;
    assert_eq!(
        ext.applied(),
        vec![ap("delete", "y", None), ap("update", "x", Some("2"))]
    );
    Ok(())
}
