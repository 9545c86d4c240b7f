//! Stable keys: every kind reaches the handler and the sink exactly, survives
//! reopening, and keys that print alike stay distinct.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use weir::prelude::*;

use crate::support::*;

fn every_key_kind() -> Vec<StableKey> {
    let u = uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
    let s = |x: &str| StableKey::Str(Arc::from(x));
    let arr = |xs: Vec<StableKey>| StableKey::Array(Arc::from(xs));
    vec![
        StableKey::Null,
        StableKey::Bool(false),
        StableKey::Bool(true),
        StableKey::Int(0),
        StableKey::Int(-1),
        StableKey::Int(1),
        StableKey::Int(i64::MIN),
        StableKey::Int(i64::MAX),
        s(""),
        s("a"),
        s("a\0"),
        s("a\0b"),
        s("a\u{1}"),
        s("ü/\u{1F600} \"quoted\" \\ /x"),
        StableKey::Bytes(Arc::from(Vec::<u8>::new())),
        StableKey::Bytes(Arc::from(vec![0u8])),
        StableKey::Bytes(Arc::from(vec![0u8, 255, 0])),
        StableKey::Bytes(Arc::from(vec![255u8])),
        StableKey::Uuid(u),
        StableKey::Uuid(uuid::Uuid::nil()),
        StableKey::Symbol(Arc::from("sym")),
        StableKey::Symbol(Arc::from("")),
        arr(vec![]),
        arr(vec![StableKey::Null]),
        arr(vec![arr(vec![])]),
        arr(vec![s("a")]),
        arr(vec![s("a"), StableKey::Null]),
        arr(vec![s("a"), s("")]),
        ("a", (1i64, "b")).into_stable_key(),
        ("a", 1i64, "b", (2i64, (3i64, "c"))).into_stable_key(),
        (("x", "y"), ("z", StableKey::Null)).into_stable_key(),
        u64::MAX.into_stable_key(),
        (i64::MAX as u64 + 1).into_stable_key(),
        arr(vec![
            s("a"),
            StableKey::Bytes(Arc::from(vec![1u8])),
            StableKey::Uuid(u),
            StableKey::Symbol(Arc::from("s")),
            StableKey::Bool(true),
            StableKey::Null,
            StableKey::Int(-5),
        ]),
    ]
}

#[tokio::test]
async fn every_stable_key_kind_reaches_handler_and_sink_exactly_and_reruns_silently() -> Result<()>
{
    let keys = every_key_kind();
    let distinct: BTreeSet<StableKey> = keys.iter().cloned().collect();
    assert_eq!(
        distinct.len(),
        keys.len(),
        "the test's keys must be distinct"
    );
    let (_dir, app, ext) = fresh().await?;
    let decl = numbered(&keys);
    let stats = run_flat(&app, &ext, decl.clone()).await?;
    assert_eq!(stats.created, keys.len() as u64);
    let expected: BTreeMap<StableKey, String> = decl.iter().cloned().collect();
    assert_eq!(ext.store(), expected);
    let seen: BTreeSet<StableKey> = lock(&ext.seen).iter().map(|s| s.key.clone()).collect();
    assert_eq!(
        seen, distinct,
        "the handler must get each key exactly as declared"
    );

    ext.clear();
    let stats = run_flat(&app, &ext, decl).await?;
    assert_eq!(
        ext.calls(),
        0,
        "an unchanged rerun calls no sink: {:?}",
        ext.applied()
    );
    assert_eq!(stats.unchanged, keys.len() as u64);
    assert_eq!((stats.created, stats.updated, stats.deleted), (0, 0, 0));
    Ok(())
}

#[tokio::test]
async fn every_stable_key_kind_survives_reopening_and_is_deleted_by_its_exact_key() -> Result<()> {
    let keys = every_key_kind();
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    let decl = numbered(&keys);
    {
        let app = open(dir.path()).await?;
        run_flat(&app, &ext, decl.clone()).await?;
    }
    // Reopen: a no-change run still calls no sink (every key is found).
    let app = open_with(dir.path(), |b| b.shards(1)).await?;
    ext.clear();
    run_flat(&app, &ext, decl.clone()).await?;
    assert_no_calls(&ext);
    drop(app);

    // Reopen again and keep only the odd ones: the even ones are deleted,
    // each by its exact key.
    let app = open_with(dir.path(), |b| b.shards(5)).await?;
    ext.clear();
    let kept: Vec<(StableKey, String)> = decl.iter().skip(1).step_by(2).cloned().collect();
    let stats = run_flat(&app, &ext, kept.clone()).await?;
    let mut expected_deletes: Vec<Applied> = decl
        .iter()
        .step_by(2)
        .map(|(key, _)| Applied {
            verb: "delete",
            key: key.clone(),
            value: None,
        })
        .collect();
    expected_deletes.sort();
    assert_eq!(ext.applied(), expected_deletes);
    assert_eq!(stats.deleted, expected_deletes.len() as u64);
    assert_eq!(ext.store(), kept.into_iter().collect::<BTreeMap<_, _>>());
    Ok(())
}

#[tokio::test]
async fn keys_that_print_alike_are_distinct_target_states() -> Result<()> {
    let s = |x: &str| StableKey::Str(Arc::from(x));
    let arr = |xs: Vec<StableKey>| StableKey::Array(Arc::from(xs));
    let keys = vec![
        s("1"),
        StableKey::Int(1),
        StableKey::Symbol(Arc::from("1")),
        StableKey::Bytes(Arc::from(b"1".to_vec())),
        arr(vec![s("1")]),
        arr(vec![StableKey::Int(1)]),
        s("@1"),
        s("[\"a\",1]"),
        arr(vec![s("a"), StableKey::Int(1)]),
        s("[a,1]"),
        s("null"),
        StableKey::Null,
        s("true"),
        StableKey::Bool(true),
        s("0x31"),
        s("a/b"),
        arr(vec![s("a"), s("b")]),
        arr(vec![arr(vec![s("a")]), s("b")]),
        arr(vec![s("a"), arr(vec![s("b")])]),
    ];
    let (_dir, app, ext) = fresh().await?;
    let decl = numbered(&keys);
    let stats = run_flat(&app, &ext, decl.clone()).await?;
    assert_eq!(stats.created, keys.len() as u64);
    assert_eq!(ext.store().len(), keys.len());

    // Drop every third: exactly those are deleted, the rest untouched.
    ext.clear();
    let kept: Vec<(StableKey, String)> = decl
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 0)
        .map(|(_, x)| x.clone())
        .collect();
    run_flat(&app, &ext, kept.clone()).await?;
    let mut expected: Vec<Applied> = decl
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 == 0)
        .map(|(_, (key, _))| Applied {
            verb: "delete",
            key: key.clone(),
            value: None,
        })
        .collect();
    expected.sort();
    assert_eq!(ext.applied(), expected);
    assert_eq!(ext.store(), kept.into_iter().collect::<BTreeMap<_, _>>());
    Ok(())
}

#[tokio::test]
async fn tuple_keys_are_their_array_form_and_integer_kinds_agree() -> Result<()> {
    let s = |x: &str| StableKey::Str(Arc::from(x));
    let arr = |xs: Vec<StableKey>| StableKey::Array(Arc::from(xs));
    assert_eq!(
        ("a", 1i64).into_stable_key(),
        arr(vec![s("a"), StableKey::Int(1)])
    );
    assert_eq!(
        ("a", (1i32, ("b", 2u32))).into_stable_key(),
        arr(vec![
            s("a"),
            arr(vec![
                StableKey::Int(1),
                arr(vec![s("b"), StableKey::Int(2)])
            ])
        ])
    );
    for key in [
        1i32.into_stable_key(),
        1u32.into_stable_key(),
        1u64.into_stable_key(),
        1i64.into_stable_key(),
    ] {
        assert_eq!(key, StableKey::Int(1));
    }
    assert_eq!((-7i32).into_stable_key(), StableKey::Int(-7));
    assert_eq!(
        (i64::MAX as u64).into_stable_key(),
        StableKey::Int(i64::MAX)
    );
    let big = (i64::MAX as u64 + 1).into_stable_key();
    assert!(matches!(big, StableKey::Bytes(_)), "{big:?}");
    assert_ne!(big, u64::MAX.into_stable_key());
    assert_eq!(String::from("x").into_stable_key(), k("x"));
    assert_eq!((&String::from("x")).into_stable_key(), k("x"));

    // Declared as a tuple, then as its array form: one state, unchanged.
    let (_dir, app, ext) = fresh().await?;
    run_flat(
        &app,
        &ext,
        vec![(("t", 9i64).into_stable_key(), "v".into())],
    )
    .await?;
    ext.clear();
    let stats = run_flat(
        &app,
        &ext,
        vec![(arr(vec![s("t"), StableKey::Int(9)]), "v".into())],
    )
    .await?;
    assert_no_calls(&ext);
    assert_eq!(stats.unchanged, 1);
    Ok(())
}

#[tokio::test]
async fn stable_key_display_is_human_readable() {
    assert_eq!(k("a").to_string(), "\"a\"");
    assert_eq!(StableKey::Int(42).to_string(), "42");
    assert_eq!(("a", 1i64).into_stable_key().to_string(), "[\"a\",1]");
    assert_eq!(StableKey::Symbol(Arc::from("sym")).to_string(), "@sym");
}

#[tokio::test]
async fn one_key_declared_twice_through_different_integer_types_is_a_duplicate() -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    let handler = ext.handler();
    let r = bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        ctx.mount_each(
            vec!["dup", "ok"],
            |c| *c,
            move |c, name| {
                let p = p.clone();
                async move {
                    if name == "dup" {
                        declare_target_state(&c, p.target_state(5i32, "a".to_string()))?;
                        declare_target_state(&c, p.target_state(5u64, "b".to_string()))?;
                    } else {
                        declare_target_state(&c, p.target_state(6i64, "c".to_string()))?;
                    }
                    Ok(())
                }
            },
        )
        .await
    }))
    .await;
    let err = expect_err(r);
    assert_eq!(failed_paths(&err), vec!["/dup"], "{err}");
    assert!(
        err.to_string().contains('5'),
        "the error names the key: {err}"
    );
    assert_eq!(
        ext.store(),
        [(StableKey::Int(6), "c".to_string())].into_iter().collect()
    );
    Ok(())
}
