//! Every metric of the catalogue is emitted during an ordinary run, under
//! its catalogue name only, except the worker group's (`weir_group_*`),
//! which only a member of a group records and an ordinary run never does:
//! `.ci/prometheus-check` runs a group on PostgreSQL and checks those, and
//! `tests/cli_group.rs` checks a member's gauges against the database. Runs
//! in its own process: it installs a global recorder.

mod support;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::*;
use weir::prelude::*;
use weir::source::{Batch, Change, ConsumeOptions, Settled, Source, SourceItem};

/// The prefix of the worker group's metrics, which only a member records.
const GROUP_PREFIX: &str = "weir_group_";

/// A change feed that reports one change, then ends.
struct OneChange(bool);

impl ChangeFeed for OneChange {
    async fn next_change(&mut self) -> Option<Vec<String>> {
        std::mem::take(&mut self.0).then(|| vec!["m".to_string()])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_catalogue_metric_is_emitted_and_nothing_outside_it() -> Result<()> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    if recorder.install().is_err() {
        return Err(Error::msg("a global recorder was already installed"));
    }

    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    // The first call fails (a retry of a lone component), and every call
    // holding "poison" fails (a split, then a failed component).
    let rig = Rig::failing(std::sync::Arc::new(|n, keys: &[String]| {
        if n == 0 || keys.iter().any(|k| k == "poison") {
            Some("induced failure".to_string())
        } else {
            None
        }
    }));
    let handler = rig.handler();
    let first = app
        .run(move |ctx| async move {
            let rows = register_root_target_states_provider(&ctx, "test/row", handler)?;
            let keys = vec!["a", "b", "poison"];
            ctx.mount_each(
                keys,
                |k| k.to_string(),
                move |ctx, k| {
                    let rows = rows.clone();
                    async move { declare_target_state(&ctx, rows.target_state(k, "v".to_string())) }
                },
            )
            .await
        })
        .await;
    assert!(first.is_err(), "the poisoned component should fail");
    // A second run deletes a and b (and poison, which was never created).
    let healthy = Rig::new().handler();
    app.run(move |ctx| async move {
        register_root_target_states_provider(&ctx, "test/row", healthy)?;
        Ok(())
    })
    .await?;

    // Live mode: one change, then the feed ends; the second run finds its
    // one component memoized.
    let live = Rig::new().handler();
    app.watch(
        OneChange(true),
        move |ctx| {
            let live = live.clone();
            async move {
                let rows = register_root_target_states_provider(&ctx, "test/row", live)?;
                ctx.mount_each_memo(
                    vec!["m"],
                    |k| k.to_string(),
                    |_| Ok(1),
                    move |ctx, k| {
                        let rows = rows.clone();
                        async move {
                            declare_target_state(&ctx, rows.target_state(k, "v".to_string()))
                        }
                    },
                )
                .await
            }
        },
        |_| {},
    )
    .await?;

    // A component declaring what it declared before, through a handler
    // whose unchanged states need nothing: counted as unchanged.
    let skipping = Rig::new().handler().saying_unchanged_needs_nothing();
    for _ in 0..2 {
        let skipping = skipping.clone();
        app.run(move |ctx| async move {
            let rows = register_root_target_states_provider(&ctx, "test/row", skipping)?;
            ctx.mount_each(
                vec!["u"],
                |k| k.to_string(),
                move |ctx, k| {
                    let rows = rows.clone();
                    async move { declare_target_state(&ctx, rows.target_state(k, "v".to_string())) }
                },
            )
            .await
        })
        .await?;
    }

    // A source consumed: its metrics (lag included: this one knows it).
    let mut source = OneMessage(true);
    let rows = Rig::new().handler();
    app.consume(&mut source, ConsumeOptions::default(), move |ctx, batch| {
        let rows = rows.clone();
        async move {
            let rows = register_root_target_states_provider(&ctx, "test/row", rows)?;
            ctx.mount_source(batch, move |ctx, item: SourceItem<String>| {
                let rows = rows.clone();
                async move { declare_target_state(&ctx, rows.target_state(item.key, item.payload)) }
            })
            .await
        }
    })
    .await?;

    // A connector's table: rows written, then one refused by the database.
    connector_rows_and_a_refused_one(dir.path()).await?;

    let snapshot = snapshotter.snapshot().into_vec();
    let seen: std::collections::BTreeSet<String> = snapshot
        .iter()
        .map(|(key, _, _, _)| key.key().name().to_string())
        .collect();
    for (name, _, _, _) in weir::metrics::CATALOGUE {
        if name.starts_with(GROUP_PREFIX) {
            assert!(
                !seen.contains(*name),
                "{name} was emitted by an App outside any worker group"
            );
            continue;
        }
        assert!(
            seen.contains(*name),
            "{name} was never emitted; seen: {seen:?}"
        );
    }
    for name in &seen {
        assert!(
            weir::metrics::CATALOGUE
                .iter()
                .any(|(n, _, _, _)| n == name),
            "{name} is not in the catalogue"
        );
    }
    // Labels are bounded: never a key.
    for (key, _, _, _) in &snapshot {
        for label in key.key().labels() {
            assert!(
                !["a", "b", "poison"].contains(&label.value()),
                "{} carries a key as a label: {label:?}",
                key.key().name()
            );
        }
    }
    // Retries, splits and failures were counted (their series exist at
    // zero from a sink's first call, so presence alone proves nothing).
    let total = |name: &str| -> u64 {
        snapshot
            .iter()
            .filter(|(k, _, _, _)| k.key().name() == name)
            .map(|(_, _, _, v)| match v {
                DebugValue::Counter(n) => *n,
                _ => 0,
            })
            .sum()
    };
    let retries = total(weir::metrics::SINK_RETRIES);
    assert!(retries >= 1, "retries: {retries}");
    assert!(
        total(weir::metrics::SINK_SPLITS) >= 1,
        "a split was counted"
    );
    assert!(
        total(weir::metrics::SINK_FAILURES) >= 1,
        "a failure was counted"
    );
    assert!(
        total(weir::metrics::LIVE_CHANGES) >= 1,
        "a live change was counted"
    );
    let memoized = snapshot.iter().any(|(k, _, _, _)| {
        k.key().name() == weir::metrics::COMPONENT_RUNS
            && k.key().labels().any(|l| l.value() == "memoized")
    });
    assert!(memoized, "a memoized component is counted by outcome");
    let unchanged: u64 = snapshot
        .iter()
        .filter(|(k, _, _, _)| {
            k.key().name() == weir::metrics::COMPONENT_RUNS
                && k.key().labels().any(|l| l.value() == "unchanged")
        })
        .map(|(_, _, _, v)| match v {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum();
    assert_eq!(
        unchanged, 1,
        "the second run's component is counted unchanged"
    );
    Ok(())
}

/// A source of one message, which then ends; its lag is 0.
struct OneMessage(bool);

impl Source for OneMessage {
    type Payload = String;
    type Ack = ();

    fn name(&self) -> &str {
        "one"
    }

    async fn next_batch(&mut self, _max: usize) -> Result<Option<Batch<String, ()>>> {
        Ok(std::mem::take(&mut self.0)
            .then(|| Batch::Changes(vec![Change::upsert("k", 1, "v".to_string(), ())])))
    }

    async fn settle(&mut self, _settled: Vec<Settled<()>>) -> Result<()> {
        Ok(())
    }

    async fn lag(&mut self) -> Option<u64> {
        Some(0)
    }
}

/// Syncs rows into a SQLite table, then a row a unique index refuses: the
/// connector's rows, statement and error metrics.
async fn connector_rows_and_a_refused_one(dir: &std::path::Path) -> Result<()> {
    use weir::connectors::sql::{ColumnType, TableSchema};
    use weir::connectors::sqlite;

    let pool = sqlite::connect(dir.join("docs.db")).await?;
    let db = ContextKey::<sqlx::SqlitePool>::new("docs");
    let app = App::builder("connector-metrics")
        .ledger_path(dir.join("connector-ledger"))
        .provide_key(&db, pool.clone())
        .build()
        .await?;
    let sync = |rows: Vec<(&'static str, &'static str)>| {
        let db = db.clone();
        app.run(move |ctx| async move {
            let schema = TableSchema::builder()
                .column("id", ColumnType::Text)
                .column("body", ColumnType::Text)
                .primary_key(["id"])
                .build()?;
            let docs = sqlite::mount_table_target(&ctx, &db, "docs", schema).await?;
            ctx.mount_each(
                rows,
                |(id, _)| id.to_string(),
                move |ctx, (id, body)| {
                    let docs = docs.clone();
                    async move {
                        docs.declare_row(&ctx, serde_json::json!({"id": id, "body": body}))
                    }
                },
            )
            .await
        })
    };
    sync(vec![("1", "a")]).await?;
    sqlx::query("CREATE UNIQUE INDEX docs_body ON docs (body)")
        .execute(&pool)
        .await?;
    let refused = sync(vec![("1", "a"), ("2", "a")]).await;
    if refused.is_ok() {
        return Err(Error::msg("a row the unique index refuses was accepted"));
    }
    Ok(())
}
