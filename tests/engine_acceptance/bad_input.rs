//! Bad input: values, records, attachments, keys.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use weir::prelude::*;

use crate::support::*;

/// A value whose serialization fails when `refuse` is set.
struct Touchy {
    refuse: bool,
}

impl Serialize for Touchy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        if self.refuse {
            Err(serde::ser::Error::custom("Touchy refuses to be serialized"))
        } else {
            s.serialize_str("touchy")
        }
    }
}

impl<'de> Deserialize<'de> for Touchy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        String::deserialize(d).map(|_| Touchy { refuse: false })
    }
}

struct TouchyKv(Kv);

impl TargetHandler<Touchy> for TouchyKv {
    type TrackingRecord = String;
    type Action = Put;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<Touchy>,
        prev: Vec<String>,
        missing: bool,
    ) -> Result<Option<TargetReconcileOutput<Put, String>>> {
        self.0
            .reconcile(key, desired.map(|_| "touchy".to_string()), prev, missing)
    }
}

#[tokio::test]
async fn a_value_that_cannot_be_serialized_is_an_error_naming_its_key() -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    let handler = TouchyKv(ext.handler());
    let r = bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        ctx.mount_each(
            vec!["bad", "good"],
            |c| *c,
            move |c, name| {
                let p = p.clone();
                async move {
                    let refuse = name == "bad";
                    declare_target_state(
                        &c,
                        p.target_state(format!("{name}-key"), Touchy { refuse }),
                    )
                }
            },
        )
        .await
    }))
    .await;
    let err = expect_err(r);
    assert_eq!(failed_paths(&err), vec!["/bad"], "{err}");
    let cause = &err.failed_components()[0].cause;
    assert!(
        cause.contains("bad-key"),
        "the error names the key: {cause}"
    );
    assert_eq!(ext.store(), smap(&[("good-key", "touchy")]));
    Ok(())
}

/// The kv target with numeric tracking records: a later version of a
/// connector whose record type changed.
struct NumRecords(Ext);

impl TargetHandler<String> for NumRecords {
    type TrackingRecord = u64;
    type Action = Put;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<String>,
        prev: Vec<u64>,
        missing: bool,
    ) -> Result<Option<TargetReconcileOutput<Put, u64>>> {
        let _ = (prev, missing);
        Ok(Some(TargetReconcileOutput {
            action: TargetAction::Update(Put {
                key,
                value: desired.clone(),
            }),
            sink: self.0.sink(),
            tracking_record: desired.map(|d| d.len() as u64),
            child_invalidation: None,
        }))
    }
}

#[tokio::test]
async fn a_tracking_record_of_another_type_is_an_error_naming_provider_and_key() -> Result<()> {
    let (_dir, app, ext) = fresh().await?;
    let other = Ext::new();
    run_flat(&app, &ext, rows(&[("x", "1")])).await?;
    let h = NumRecords(ext.clone());
    let o = other.handler();
    let r = bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, h)?;
        let po = register_root_target_states_provider(&ctx, "acc/other", o)?;
        ctx.mount("m", move |c| async move {
            declare_target_state(&c, p.target_state("x", "2".to_string()))
        })
        .await
        .ok();
        ctx.mount("o", move |c| async move {
            declare_target_state(&c, po.target_state("o", "1".to_string()))
        })
        .await
    }))
    .await;
    let err = expect_err(r);
    assert!(failed_paths(&err).contains(&"/m".to_string()), "{err}");
    let text = err.to_string();
    for part in [KV, "\"x\""] {
        assert!(text.contains(part), "the error names {part}: {text}");
    }
    assert_eq!(other.store(), smap(&[("o", "1")]));
    assert_eq!(ext.store(), smap(&[("x", "1")]));
    Ok(())
}

#[tokio::test]
async fn asking_for_an_attachment_with_the_wrong_value_type_is_an_error() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let main = Ext::new();
    let att = Ext::new();
    let handler = Main {
        sink: main.sink(),
        seen: main.seen.clone(),
        att: att.clone(),
    };
    let r = bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, "acc/main", handler)?;
        declare_target_state(&ctx, p.target_state("row", "v".to_string()))?;
        let wrong: Result<TargetStateProvider<i64>> = p.attachment(&ctx, "index");
        match wrong {
            Ok(a) => declare_target_state(&ctx, a.target_state("i", 5)),
            Err(e) => Err(e),
        }
    }))
    .await;
    let err = expect_err(r);
    assert!(
        err.to_string().contains("index"),
        "the error names the attachment: {err}"
    );
    assert!(att.store().is_empty());
    Ok(())
}

/// A kv target that keys the store by the key's text, so that the action
/// does not carry the (possibly very deep) key itself.
struct TextKv(Kv);

impl TargetHandler<String> for TextKv {
    type TrackingRecord = String;
    type Action = Put;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<String>,
        prev: Vec<String>,
        missing: bool,
    ) -> Result<Option<TargetReconcileOutput<Put, String>>> {
        let depth = {
            let mut d = 0;
            let mut k = &key;
            while let StableKey::Array(items) = k {
                d += 1;
                match items.first() {
                    Some(inner) => k = inner,
                    None => break,
                }
            }
            d
        };
        self.0.reconcile(
            StableKey::Str(Arc::from(format!("depth{depth}"))),
            desired,
            prev,
            missing,
        )
    }
}

fn nested_key(depth: usize) -> StableKey {
    let mut key = StableKey::Int(0);
    for _ in 0..depth {
        key = StableKey::Array(Arc::from(vec![key]));
    }
    key
}

async fn run_deep(app: &App, ext: &Ext, depths: Vec<usize>) -> Result<RunReport> {
    let handler = TextKv(ext.handler());
    bounded(app.run_report(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        ctx.mount_each(depths, |d| *d as i64, move |c, d| {
            let p = p.clone();
            async move { declare_target_state(&c, p.target_state(nested_key(d), "v".to_string())) }
        })
        .await
    }))
    .await
}

#[tokio::test]
async fn a_key_nested_two_hundred_deep_is_tracked_across_a_reopen() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    {
        let app = open(dir.path()).await?;
        let r = run_deep(&app, &ext, vec![1, 200]).await?;
        assert!(r.failures.is_empty(), "{:?}", r.failures);
        assert_eq!(ext.store(), smap(&[("depth1", "v"), ("depth200", "v")]));
    }
    let app = open(dir.path()).await?;
    ext.clear();
    run_deep(&app, &ext, vec![1, 200]).await?;
    assert_no_calls(&ext);
    run_deep(&app, &ext, vec![1]).await?;
    assert_eq!(ext.applied(), vec![ap("delete", "depth200", None)]);
    Ok(())
}

#[tokio::test]
async fn a_key_nested_a_thousand_deep_fails_cleanly_or_works_and_never_crashes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    {
        let app = open(dir.path()).await?;
        // (Deeper keys overflow a 2 MiB test thread in std's own clone and
        // drop in debug builds, so 1,000 is as deep as is fair.)
        let r = run_deep(&app, &ext, vec![1, 1000]).await?;
        assert!(
            report_paths(&r).iter().all(|p| p == "/1000"),
            "only the deep one may fail: {:?}",
            r.failures
        );
        assert_eq!(ext.store().get(&k("depth1")), Some(&"v".to_string()));
    }
    // The ledger opens again and the next run is sane.
    let app = open(dir.path()).await?;
    ext.clear();
    let r = run_deep(&app, &ext, vec![1]).await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(ext.store(), smap(&[("depth1", "v")]));
    Ok(())
}
