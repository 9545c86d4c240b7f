//! Containers (guarantees 8 and 9) and attachments (10).

use weir::prelude::*;

use crate::support::*;

#[tokio::test]
async fn rows_declared_by_other_components_are_created_again_after_a_destructive_change(
) -> Result<()> {
    let (_dir, app, t) = fresh_tables().await?;
    let inv = Some(TargetChildInvalidation::Destructive);
    run_table(&app, &t, inv, Some(1), two_comps_one_row_each()).await?;
    assert_eq!(t.rows.store(), smap(&[("a", "1"), ("b", "1")]));
    t.clear();
    let r = run_table(
        &app,
        &t,
        inv,
        Some(2),
        comps(&[("c1", &[("a", "1")]), ("c2", &[])]),
    )
    .await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(t.log(), vec!["recreate t"]);
    assert_eq!(
        t.rows.applied(),
        vec![ap("create", "a", Some("1"))],
        "a's record was dropped so it is created; b's too, so no delete is needed"
    );
    assert_eq!(t.rows.store(), smap(&[("a", "1")]));
    t.clear();
    run_table(&app, &t, inv, Some(2), two_comps_one_row_each()).await?;
    assert_eq!(t.rows.applied(), vec![ap("create", "b", Some("1"))]);
    Ok(())
}

#[tokio::test]
async fn rows_declared_by_other_components_are_reapplied_after_a_lossy_change() -> Result<()> {
    let (_dir, app, t) = fresh_tables().await?;
    let inv = Some(TargetChildInvalidation::Lossy);
    run_table(&app, &t, inv, Some(1), two_comps_one_row_each()).await?;
    t.clear();
    let r = run_table(
        &app,
        &t,
        inv,
        Some(2),
        comps(&[("c1", &[("a", "1")]), ("c2", &[])]),
    )
    .await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(t.log(), vec!["alter t"]);
    assert_eq!(
        t.rows.applied(),
        vec![ap("delete", "b", None), ap("update", "a", Some("1"))]
    );
    assert_eq!(t.rows.store(), smap(&[("a", "1")]));
    t.clear();
    run_table(
        &app,
        &t,
        inv,
        Some(2),
        comps(&[("c1", &[("a", "1")]), ("c2", &[])]),
    )
    .await?;
    assert_no_calls(&t.rows);
    Ok(())
}

#[tokio::test]
async fn rows_are_left_alone_by_a_container_change_without_invalidation() -> Result<()> {
    let (_dir, app, t) = fresh_tables().await?;
    run_table(&app, &t, None, Some(1), two_comps_one_row_each()).await?;
    t.clear();
    run_table(&app, &t, None, Some(2), two_comps_one_row_each()).await?;
    assert_eq!(t.log(), vec!["ensure t"]);
    assert_no_calls(&t.rows);
    for key in ["a", "b"] {
        let seen = t.rows.seen(&k(key));
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].prev, vec!["1".to_string()]);
        assert!(!seen[0].missing);
    }
    Ok(())
}

/// Declares the usual two components' rows in table "t" at generation 1,
/// clears the record of what was applied, then changes the table to
/// generation 2 in a run where c2's own code fails after declaring b = 1;
/// returns that run's report.
async fn change_the_table_while_c2_fails(
    app: &App,
    t: &Tables,
    inv: Option<TargetChildInvalidation>,
) -> Result<RunReport> {
    run_table(app, t, inv, Some(1), two_comps_one_row_each()).await?;
    t.clear();
    run_table(
        app,
        t,
        inv,
        Some(2),
        comps(&[
            ("c1", &[("a", "1")]),
            ("c2", &[("b", "1"), ("z", "!code-fails")]),
        ]),
    )
    .await
}

#[tokio::test]
async fn a_row_component_failing_in_the_run_of_a_destructive_change_gets_its_rows_back_later(
) -> Result<()> {
    let (_dir, app, t) = fresh_tables().await?;
    let inv = Some(TargetChildInvalidation::Destructive);
    // The table is recreated (every row is gone) while c2's code fails.
    let r = change_the_table_while_c2_fails(&app, &t, inv).await?;
    assert_eq!(report_paths(&r), vec!["/c2"]);
    assert_eq!(t.rows.store(), smap(&[("a", "1")]));
    // c2 works again: its row must be created again, the table lost it.
    t.clear();
    let r = run_table(&app, &t, inv, Some(2), two_comps_one_row_each()).await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(
        t.rows.store(),
        smap(&[("a", "1"), ("b", "1")]),
        "row b was lost by the recreate and never written again; reconcile saw {:?}",
        t.rows.seen(&k("b"))
    );
    Ok(())
}

#[tokio::test]
async fn a_row_component_failing_in_the_run_of_a_lossy_change_gets_its_rows_reapplied_later(
) -> Result<()> {
    let (_dir, app, t) = fresh_tables().await?;
    let inv = Some(TargetChildInvalidation::Lossy);
    let r = change_the_table_while_c2_fails(&app, &t, inv).await?;
    assert_eq!(report_paths(&r), vec!["/c2"]);
    assert_eq!(t.rows.store(), smap(&[("a", "1"), ("b", "<lost>")]));
    t.clear();
    let r = run_table(&app, &t, inv, Some(2), two_comps_one_row_each()).await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(
        t.rows.store(),
        smap(&[("a", "1"), ("b", "1")]),
        "row b was damaged by the lossy change and never reapplied; reconcile saw {:?}",
        t.rows.seen(&k("b"))
    );
    Ok(())
}

#[tokio::test]
async fn a_container_dropped_and_declared_again_creates_its_rows_afresh() -> Result<()> {
    let (_dir, app, t) = fresh_tables().await?;
    run_table(&app, &t, None, Some(1), two_comps_one_row_each()).await?;
    t.clear();
    // The table and the components declaring its rows go away together:
    // only the table's own delete runs (guarantee 9).
    let r = run_table(&app, &t, None, None, vec![]).await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(t.log(), vec!["drop t"]);
    assert_no_calls(&t.rows);
    assert!(
        t.rows.seen(&k("a")).is_empty(),
        "rows are not reconciled one by one"
    );
    assert!(t.rows.store().is_empty());
    // Declared again: the rows' records went with the table.
    t.clear();
    run_table(&app, &t, None, Some(1), two_comps_one_row_each()).await?;
    assert_eq!(
        t.rows.applied(),
        vec![ap("create", "a", Some("1")), ap("create", "b", Some("1"))]
    );
    assert_eq!(t.rows.store(), smap(&[("a", "1"), ("b", "1")]));
    Ok(())
}

/// A component of [`run_kv_and_table`]: its name, its state of the `KV`
/// provider if any (`"!code-fails"`, as in `run_table`: its code fails,
/// before declaring anything),
/// and its rows in table `t`.
type KvAndRows = (
    &'static str,
    Option<&'static str>,
    Vec<(&'static str, &'static str)>,
);

/// One run: table `t` when `table`, and one component per entry of `list`.
async fn run_kv_and_table(
    app: &App,
    ext: &Ext,
    t: &Tables,
    table: bool,
    list: Vec<KvAndRows>,
) -> Result<RunReport> {
    let (kv, th) = (ext.handler(), t.handler(None));
    bounded(app.run_report(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, kv)?;
        let tp = register_root_target_states_provider(&ctx, TABLES, th)?;
        let rows: Option<TargetStateProvider<String>> = if table {
            Some(mount_target(&ctx, tp.target_state("t", Spec { generation: 1 })).await?)
        } else {
            None
        };
        ctx.mount_each(
            list,
            |(c, _, _)| *c,
            move |c, (name, kv, list)| {
                let (p, rows) = (p.clone(), rows.clone());
                async move {
                    if kv == Some("!code-fails") {
                        return Err(Error::msg(format!("{name}'s own code failed")));
                    }
                    if let Some(v) = kv {
                        declare_target_state(&c, p.target_state(name, v.to_string()))?;
                    }
                    if let Some(rows) = &rows {
                        for (key, v) in list {
                            declare_target_state(&c, rows.target_state(key, v.to_string()))?;
                        }
                    }
                    Ok(())
                }
            },
        )
        .await
    }))
    .await
}

#[tokio::test]
async fn rows_updated_in_place_or_taken_over_by_another_component_are_forgotten_with_their_table(
) -> Result<()> {
    let (_dir, app, t) = fresh_tables().await?;
    let ext = Ext::new();
    // c3 holds a state of its own, outside the table, from the start.
    let first = vec![
        ("c1", None, vec![("a", "1")]),
        ("c2", None, vec![("b", "1")]),
        ("c3", Some("x"), vec![]),
    ];
    run_kv_and_table(&app, &ext, &t, true, first).await?;
    // a is updated where it is; b is updated as c3 takes it over from c2.
    let second = vec![
        ("c1", None, vec![("a", "2")]),
        ("c2", None, vec![]),
        ("c3", Some("x"), vec![("b", "2")]),
    ];
    let r = run_kv_and_table(&app, &ext, &t, true, second).await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(t.rows.store(), smap(&[("a", "2"), ("b", "2")]));
    t.clear();
    // The table goes while c1 and c3 fail: their records are kept, but for
    // their rows, which go with the table.
    let dropped = vec![
        ("c1", Some("!code-fails"), vec![]),
        ("c3", Some("!code-fails"), vec![]),
    ];
    let r = run_kv_and_table(&app, &ext, &t, false, dropped).await?;
    assert_eq!(report_paths(&r), vec!["/c1", "/c3"]);
    assert_eq!(t.log(), vec!["drop t"]);
    assert!(t.rows.store().is_empty());
    // Only c3's own state is tracked: a's and b's records went with the
    // table.
    let tracked = app.inspect().await?.providers;
    assert_eq!(tracked, vec![(KV.to_string(), 1)], "{tracked:?}");
    Ok(())
}

#[tokio::test]
async fn a_container_dropped_across_a_reopen_forgets_its_rows() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let t = Tables::default();
    {
        let app = open(dir.path()).await?;
        run_table(&app, &t, None, Some(1), two_comps_one_row_each()).await?;
    }
    {
        let app = open(dir.path()).await?;
        t.clear();
        run_table(&app, &t, None, None, vec![]).await?;
        assert_eq!(t.log(), vec!["drop t"]);
        assert_no_calls(&t.rows);
    }
    let app = open(dir.path()).await?;
    t.clear();
    run_table(&app, &t, None, Some(1), two_comps_one_row_each()).await?;
    assert_eq!(t.rows.store(), smap(&[("a", "1"), ("b", "1")]));
    t.clear();
    run_table(&app, &t, None, None, vec![]).await?;
    assert_eq!(t.log(), vec!["drop t"]);
    assert_no_calls(&t.rows);
    Ok(())
}

#[tokio::test]
async fn attachment_states_follow_their_declaring_component_and_are_updated_and_deleted(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let main = Ext::new();
    let att = Ext::new();
    // comps: name -> Some(index value) declares an attachment state too.
    async fn go(
        app: &App,
        main: &Ext,
        att: &Ext,
        list: Vec<(&'static str, Option<&'static str>)>,
    ) -> Result<()> {
        let handler = Main {
            sink: main.sink(),
            seen: main.seen.clone(),
            att: att.clone(),
        };
        bounded(app.run(move |ctx| async move {
            let p = register_root_target_states_provider(&ctx, "acc/main", handler)?;
            ctx.mount_each(
                list,
                |(n, _)| *n,
                move |c, (n, idx)| {
                    let p = p.clone();
                    async move {
                        declare_target_state(&c, p.target_state(n, "row".to_string()))?;
                        if let Some(v) = idx {
                            let a: TargetStateProvider<String> = p.attachment(&c, "index")?;
                            declare_target_state(
                                &c,
                                a.target_state(format!("{n}-idx"), v.to_string()),
                            )?;
                        }
                        Ok(())
                    }
                },
            )
            .await
        }))
        .await?;
        Ok(())
    }
    go(&app, &main, &att, vec![("c", Some("1")), ("d", Some("1"))]).await?;
    assert_eq!(att.store(), smap(&[("c-idx", "1"), ("d-idx", "1")]));
    att.clear();
    go(&app, &main, &att, vec![("c", Some("2")), ("d", Some("1"))]).await?;
    assert_eq!(att.applied(), vec![ap("update", "c-idx", Some("2"))]);
    // c goes away, d stops asking for the attachment at all.
    att.clear();
    main.clear();
    go(&app, &main, &att, vec![("d", None)]).await?;
    assert_eq!(
        att.applied(),
        vec![ap("delete", "c-idx", None), ap("delete", "d-idx", None)]
    );
    assert_eq!(main.applied(), vec![ap("delete", "c", None)]);
    Ok(())
}
