//! The JetStream source's throughput against a raw async-nats consumer.
//!
//! [`measure`] publishes the same JSON messages (`{"id": "k<n>", "seq":
//! <i>, ...}`, over a quarter as many keys as messages: 20 000 messages
//! over 5 000 keys) to a fresh stream for each side, then reads each
//! stream to its end into a PostgreSQL table of its own `(id text primary
//! key, doc jsonb)`, keeping each key's latest message:
//!
//! - weir: a `JetStreamSource` consumed by `App::consume` in batches of
//!   [`batch_size`] messages (the app runs that many components at once),
//!   each key one component declaring its row in a
//!   `weir_connectors::postgres` table target; acknowledged after each
//!   batch's commit.
//! - baseline: a durable pull consumer read with async-nats, the same
//!   number of messages per fetch, each batch's latest row per key
//!   upserted with one `INSERT ... SELECT FROM UNNEST(...) ON CONFLICT DO
//!   UPDATE`, then the batch's messages acknowledged.
//!
//! Both are measured as messages read per second, from the connection to
//! the stream to the last acknowledgement; publishing is not timed. Both
//! tables end with the same rows, or the measure fails.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Instant;

use async_nats::jetstream::{self, consumer, stream};
use futures::StreamExt;
use serde::Serialize;
use sqlx::PgPool;
use weir::connectors::nats::{JetStreamOptions, JetStreamSource};
use weir::connectors::postgres::mount_table_target;
use weir::connectors::sql::{ColumnType, TableSchema};
use weir::prelude::*;
use weir::source::ConsumeOptions;

type BoxError = Box<dyn StdError>;

const NATS_URL: &str = "nats://127.0.0.1:4222";
/// Messages per fetch of the baseline (weir's default `max_in_flight`).
/// Messages per batch on both sides (`WEIR_BENCH_BATCH`, default 5 000):
/// weir's `max_in_flight`, the baseline's fetch.
fn batch_size() -> usize {
    std::env::var("WEIR_BENCH_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000)
}

/// Messages per second for `(weir, baseline)`, each reading `messages` JSON
/// messages from a fresh stream into a fresh table of the database at
/// `pg_url`.
pub async fn measure(messages: usize, pg_url: &str) -> Result<(f64, f64), BoxError> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect(pg_url)
        .await?;
    let js = jetstream::new(async_nats::connect(NATS_URL).await?);
    let tag = format!("{}_{}", std::process::id(), fastrand::u32(..));
    let weir = timed(
        &js,
        &pool,
        &format!("bench_js_weir_{tag}"),
        messages,
        |s, t| weir_side(s, t, pool.clone()),
    )
    .await?;
    let baseline = timed(
        &js,
        &pool,
        &format!("bench_js_raw_{tag}"),
        messages,
        |s, t| baseline_side(s, t, js.clone(), pool.clone()),
    )
    .await?;
    let (w, b) = (rows(&pool, &weir.1).await?, rows(&pool, &baseline.1).await?);
    drop_table(&pool, &weir.1).await?;
    drop_table(&pool, &baseline.1).await?;
    if w != b {
        return Err(format!(
            "weir's table and the baseline's differ ({} and {} rows)",
            w.len(),
            b.len()
        )
        .into());
    }
    Ok((weir.0, baseline.0))
}

/// Publishes `messages` to a fresh stream `name`, times `read` over it
/// (into the table `name`), deletes the stream; the rate and the table.
async fn timed<F, Fut>(
    js: &jetstream::Context,
    pool: &PgPool,
    name: &str,
    messages: usize,
    read: F,
) -> Result<(f64, String), BoxError>
where
    F: FnOnce(String, String) -> Fut,
    Fut: std::future::Future<Output = Result<(), BoxError>>,
{
    drop_table(pool, name).await?;
    publish(js, name, messages).await?;
    let start = Instant::now();
    let result = read(name.to_string(), name.to_string()).await;
    let secs = start.elapsed().as_secs_f64();
    js.delete_stream(name).await?;
    result?;
    Ok((messages as f64 / secs, name.to_string()))
}

/// A fresh stream `name` (subjects `name.<key>`) holding `messages` JSON
/// messages over `messages / 4` keys.
async fn publish(js: &jetstream::Context, name: &str, messages: usize) -> Result<(), BoxError> {
    js.create_stream(stream::Config {
        name: name.to_string(),
        subjects: vec![format!("{name}.>")],
        ..Default::default()
    })
    .await?;
    let keys = (messages / 4).max(1);
    let mut acks = Vec::with_capacity(1000);
    for seq in 0..messages {
        let id = format!("k{}", seq % keys);
        let doc = serde_json::json!({
            "id": id,
            "seq": seq,
            "body": format!("message {seq} of key {id}, with some text to carry"),
        });
        let ack = js
            .publish(format!("{name}.{id}"), serde_json::to_vec(&doc)?.into())
            .await?;
        acks.push(ack);
        if acks.len() == 1000 {
            for ack in acks.drain(..) {
                ack.await?;
            }
        }
    }
    for ack in acks {
        ack.await?;
    }
    Ok(())
}

#[derive(Serialize)]
struct Doc {
    id: String,
    doc: serde_json::Value,
}

fn schema() -> Result<TableSchema> {
    TableSchema::builder()
        .column("id", ColumnType::Text)
        .column("doc", ColumnType::Json)
        .primary_key(["id"])
        .build()
}

/// weir: the source consumed by `App::consume` into a table target.
async fn weir_side(stream: String, table: String, pool: PgPool) -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let db = ContextKey::<PgPool>::new("bench_pg");
    let app = App::builder("bench_jetstream")
        .ledger_path(dir.path().join("ledger"))
        .provide_key(&db, pool)
        // A batch runs its components at once only if the app lets that
        // many run (see `ConsumeOptions::max_in_flight`).
        .max_inflight_components(batch_size())
        .build()
        .await?;
    let mut source = JetStreamSource::connect(JetStreamOptions::new(NATS_URL, stream)).await?;
    let table = Arc::new(table);
    let report = app
        .consume(
            &mut source,
            ConsumeOptions::default().max_in_flight(batch_size()),
            move |ctx, batch| {
                let (db, table) = (db.clone(), Arc::clone(&table));
                async move {
                    let target = mount_table_target(&ctx, &db, &table, schema()?).await?;
                    ctx.mount_source(batch, move |ctx, item| {
                        let target = target.clone();
                        async move {
                            let doc = serde_json::from_slice(&item.payload.payload)
                                .map_err(|e| Error::msg(format!("not JSON: {e}")))?;
                            let id = item.payload.subject.rsplit('.').next().unwrap_or_default();
                            target.declare_row(
                                &ctx,
                                Doc {
                                    id: id.to_string(),
                                    doc,
                                },
                            )
                        }
                    })
                    .await
                }
            },
        )
        .await?;
    if report.stats.failed_components > 0 {
        return Err(format!("weir: {} components failed", report.stats.failed_components).into());
    }
    Ok(())
}

/// The baseline: a raw pull consumer, a batched upsert, acknowledgements
/// after each batch.
async fn baseline_side(
    stream: String,
    table: String,
    js: jetstream::Context,
    pool: PgPool,
) -> Result<(), BoxError> {
    sqlx::raw_sql(&format!(
        "CREATE TABLE \"{table}\" (id text PRIMARY KEY, doc jsonb NOT NULL)"
    ))
    .execute(&pool)
    .await?;
    let upsert = format!(
        "INSERT INTO \"{table}\" (id, doc) SELECT * FROM UNNEST($1::text[], $2::text[]::jsonb[]) \
         ON CONFLICT (id) DO UPDATE SET doc = EXCLUDED.doc"
    );
    let consumer: consumer::PullConsumer = js
        .get_stream(&stream)
        .await?
        .create_consumer(consumer::pull::Config {
            durable_name: Some("baseline".to_string()),
            ack_policy: consumer::AckPolicy::Explicit,
            max_ack_pending: 20_000,
            ..Default::default()
        })
        .await?;
    loop {
        let mut batch = consumer
            .fetch()
            .max_messages(batch_size())
            .messages()
            .await?;
        let mut messages = Vec::new();
        while let Some(message) = batch.next().await {
            messages.push(message.map_err(|e| e.to_string())?);
        }
        if messages.is_empty() {
            return Ok(());
        }
        let mut latest: HashMap<String, String> = HashMap::new();
        for m in &messages {
            let id = m.subject.rsplit('.').next().unwrap_or_default().to_string();
            let doc: serde_json::Value = serde_json::from_slice(&m.payload)?;
            latest.insert(id, doc.to_string());
        }
        let (ids, docs): (Vec<String>, Vec<String>) = latest.into_iter().unzip();
        sqlx::query(&upsert)
            .bind(ids)
            .bind(docs)
            .execute(&pool)
            .await?;
        for m in &messages {
            m.ack().await.map_err(|e| e.to_string())?;
        }
        js.client().flush().await?;
    }
}

async fn rows(pool: &PgPool, table: &str) -> Result<Vec<(String, String)>, BoxError> {
    Ok(sqlx::query_as(&format!(
        "SELECT id, doc::text FROM \"{table}\" ORDER BY id"
    ))
    .fetch_all(pool)
    .await?)
}

async fn drop_table(pool: &PgPool, table: &str) -> Result<(), BoxError> {
    sqlx::raw_sql(&format!("DROP TABLE IF EXISTS \"{table}\""))
        .execute(pool)
        .await?;
    Ok(())
}
