//! UpdateStats, batching and sink identity (guarantee 5).

use std::time::Duration;

use weir::prelude::*;

use crate::support::*;

#[tokio::test]
async fn update_stats_are_exact_with_moves_removals_and_failed_components() -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    let r = report_comps(
        &app,
        &ext,
        comps(&[
            ("A", &[("a1", "1"), ("a2", "1")]),
            ("B", &[("b1", "1")]),
            ("C", &[("c1", "1")]),
        ]),
    )
    .await?;
    let s = &r.stats;
    assert_eq!(counts(s), (4, 0, 0, 0, 0));
    // a1 changes, a2 moves to B unchanged, C is removed, D fails in its code.
    let r = report_comps(
        &app,
        &ext,
        comps(&[
            ("A", &[("a1", "2")]),
            ("B", &[("b1", "1"), ("a2", "1")]),
            ("D", &[("d1", "1"), ("zz", "!code-fails")]),
        ]),
    )
    .await?;
    let s = &r.stats;
    assert_eq!(report_paths(&r), vec!["/D"]);
    assert_eq!(counts(s), (0, 1, 1, 2, 1), "{s:?}");
    // A sink failure: B's update does not land and must not be counted.
    ext.fail_keys(&[k("b1")]);
    let r = report_comps(
        &app,
        &ext,
        comps(&[
            ("A", &[("a1", "2")]),
            ("B", &[("b1", "2"), ("a2", "1")]),
            ("D", &[("d1", "1")]),
        ]),
    )
    .await?;
    let s = &r.stats;
    assert_eq!(report_paths(&r), vec!["/B"]);
    assert_eq!(
        (s.created, s.updated, s.deleted, s.failed_components),
        (1, 0, 0, 1),
        "only what landed is counted: {s:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Batching and sink identity (guarantee 5).
// ---------------------------------------------------------------------------

#[tokio::test]
async fn one_sink_shared_by_providers_of_different_value_types_gets_their_actions_together(
) -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    let sink = ext.sink();
    let text = Kv {
        sink: sink.clone(),
        seen: ext.seen.clone(),
    };
    let num = KvNum {
        sink,
        seen: ext.seen.clone(),
    };
    bounded(app.run(move |ctx| async move {
        let pt = register_root_target_states_provider(&ctx, "acc/text", text)?;
        let pn = register_root_target_states_provider(&ctx, "acc/num", num)?;
        ctx.mount_each(
            0..10i64,
            |i| *i,
            move |c, i| {
                let pt = pt.clone();
                let pn = pn.clone();
                async move {
                    declare_target_state(&c, pt.target_state(("t", i), format!("t{i}")))?;
                    declare_target_state(&c, pn.target_state(("n", i), i * 100))
                }
            },
        )
        .await
    }))
    .await?;
    let sizes: Vec<usize> = lock(&ext.applied).iter().map(Vec::len).collect();
    assert_eq!(
        sizes,
        vec![20],
        "one sink identity: one call for both providers"
    );
    assert_eq!(
        ext.store().get(&("n", 3i64).into_stable_key()),
        Some(&"300".to_string())
    );
    Ok(())
}

#[tokio::test]
async fn batch_policy_of_one_action_sends_every_action_alone() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open_with(dir.path(), |b| {
        b.batch_policy(BatchPolicy {
            max_actions: 1,
            linger: Duration::from_millis(1),
        })
    })
    .await?;
    let ext = Ext::new();
    let c: Comps = (0..6)
        .map(|i| {
            (
                StableKey::Int(i),
                vec![
                    (("a", i).into_stable_key(), "1".into()),
                    (("b", i).into_stable_key(), "1".into()),
                ],
            )
        })
        .collect();
    run_comps(&app, &ext, c).await?;
    let sizes: Vec<usize> = lock(&ext.applied).iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![1; 12]);
    Ok(())
}
