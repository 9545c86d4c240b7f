//! The PostgreSQL target's throughput against a raw sqlx baseline.
//!
//! `cargo bench --bench postgres_sync` syncs 100 000 rows
//! (`WEIR_BENCH_ROWS`) through weir, phase by phase, and does the same
//! work with hand-written sqlx statements on a twin table:
//!
//! - `first`: every row is new. Raw: `INSERT ... SELECT FROM UNNEST ...
//!   ON CONFLICT DO UPDATE` of every row, 10 000 rows per statement, in one
//!   transaction.
//! - `change1pct`: 1% of the rows change. Raw: a stateless sync does not
//!   know which rows changed, so it upserts every row again.
//! - `delete10pct`: 10% of the rows are no longer declared. Raw: it upserts
//!   the remaining rows and deletes the others by key.
//!
//! Both sides are measured as rows synced (declared) per second. The
//! sequence runs `WEIR_BENCH_REPEAT` times (default 3) from scratch, each
//! run on new tables and a new ledger; each phase then ends with one line
//! of medians, `RESULT postgres_sync <phase> weir_rows_per_sec=<n>
//! raw_rows_per_sec=<n> ratio=<weir/raw>` (see `shared/paired.rs`). The server is
//! `WEIR_TEST_POSTGRES_URL`, else `postgres://postgres@127.0.0.1:5432/test`,
//! else `postgres://root@127.0.0.1:5432/test`; without one the benchmark
//! prints `SKIPPED` and exits successfully.
//!
//! `WEIR_BENCH_SHARDS` sets the reconciler shards (default: one per core).
//! weir's rows are declared by one component; `WEIR_BENCH_COMPONENTS=n`
//! splits them over n child components instead, each with a contiguous
//! range of ids (see `shared/split.rs`).

#[path = "shared/documents.rs"]
mod documents;
#[path = "shared/paired.rs"]
mod paired;
#[path = "shared/split.rs"]
mod split;

#[cfg(not(feature = "bench-system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::PgPool;
use weir::connectors::postgres::mount_table_target;
use weir::prelude::*;

#[derive(Clone, Debug, Serialize)]
struct Item {
    id: i64,
    title: String,
    body: String,
    score: f64,
    version: i64,
}

fn item(id: i64, version: i64) -> Item {
    Item {
        id,
        title: format!("item {id}"),
        body: format!("the body of item {id}, version {version}, with some text to carry"),
        score: id as f64 / 7.0,
        version,
    }
}

async fn connect() -> Option<PgPool> {
    let urls: Vec<String> = match std::env::var("WEIR_TEST_POSTGRES_URL") {
        Ok(url) => vec![url],
        Err(_) => vec![
            "postgres://postgres@127.0.0.1:5432/test".into(),
            "postgres://root@127.0.0.1:5432/test".into(),
        ],
    };
    for url in urls {
        let connect = sqlx::postgres::PgPoolOptions::new()
            .max_connections(16)
            .connect(&url);
        if let Ok(Ok(pool)) = tokio::time::timeout(Duration::from_secs(10), connect).await {
            return Some(pool);
        }
    }
    None
}

/// The raw baseline: upsert `items` and delete `deleted`, in one
/// transaction, 10 000 rows per statement.
async fn raw_sync(pool: &PgPool, table: &str, items: &[Item], deleted: &[i64]) -> Result<()> {
    let upsert = format!(
        "INSERT INTO \"{table}\" (id, title, body, score, version) \
         SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::text[], $4::double precision[], $5::bigint[]) \
         ON CONFLICT (id) DO UPDATE SET title = EXCLUDED.title, body = EXCLUDED.body, \
         score = EXCLUDED.score, version = EXCLUDED.version"
    );
    let delete = format!("DELETE FROM \"{table}\" WHERE id = ANY($1)");
    let mut tx = pool.begin().await?;
    for chunk in items.chunks(10_000) {
        sqlx::query(&upsert)
            .bind(chunk.iter().map(|i| i.id).collect::<Vec<_>>())
            .bind(chunk.iter().map(|i| i.title.clone()).collect::<Vec<_>>())
            .bind(chunk.iter().map(|i| i.body.clone()).collect::<Vec<_>>())
            .bind(chunk.iter().map(|i| i.score).collect::<Vec<_>>())
            .bind(chunk.iter().map(|i| i.version).collect::<Vec<_>>())
            .execute(&mut *tx)
            .await?;
    }
    for chunk in deleted.chunks(10_000) {
        sqlx::query(&delete)
            .bind(chunk.to_vec())
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

async fn weir_sync(
    app: &App,
    db: &ContextKey<PgPool>,
    table: &str,
    items: Arc<Vec<Item>>,
) -> Result<()> {
    let (db, table) = (db.clone(), table.to_string());
    app.run(move |ctx| async move {
        let target = mount_table_target(&ctx, &db, &table, documents::schema()?).await?;
        split::declare_rows(
            &ctx,
            items,
            target,
            split::components(),
            |i| i.id as u64,
            |t, ctx, i| t.declare_row(ctx, i),
        )
        .await
    })
    .await?;
    Ok(())
}

async fn count(pool: &PgPool, table: &str) -> Result<i64> {
    Ok(
        sqlx::query_scalar(&format!("SELECT count(*) FROM \"{table}\""))
            .fetch_one(pool)
            .await?,
    )
}

async fn bench() -> Result<()> {
    let Some(pool) = connect().await else {
        println!("SKIPPED: postgres_sync: no PostgreSQL server (set WEIR_TEST_POSTGRES_URL)");
        return Ok(());
    };
    let n: i64 = std::env::var("WEIR_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let mut runs = Vec::new();
    for run in 1..=paired::repeats() {
        let rates = sequence(&pool, n, run).await?;
        for r in &rates {
            paired::print_run("postgres_sync", run, r);
        }
        runs.push(rates);
    }
    paired::print_medians("postgres_sync", &runs);
    Ok(())
}

/// One run of every phase, from scratch, on tables of its own.
async fn sequence(pool: &PgPool, n: i64, run: usize) -> Result<Vec<paired::Rates>> {
    let suffix = format!("{}_{run}", std::process::id());
    let (weir_table, raw_table) = (
        format!("bench_weir_{suffix}"),
        format!("bench_raw_{suffix}"),
    );
    sqlx::raw_sql(&format!(
        "DROP TABLE IF EXISTS \"{raw_table}\"; CREATE TABLE \"{raw_table}\" \
         (id bigint PRIMARY KEY, title text NOT NULL, body text NOT NULL, \
         score double precision NOT NULL, version bigint NOT NULL)"
    ))
    .execute(pool)
    .await?;
    let dir = tempfile::tempdir()?;
    let db = ContextKey::<PgPool>::new("bench_pg");
    // Large sink calls: one transaction carries up to `max_actions` rows,
    // and the row sink runs two at once (`ROW_SINK_CONCURRENT_CALLS`).
    let max_actions = std::env::var("WEIR_BENCH_MAX_ACTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let app = paired::shards(App::builder("postgres_sync"))
        .ledger_path(dir.path().join("ledger"))
        .batch_policy(BatchPolicy {
            max_actions,
            ..BatchPolicy::default()
        })
        .provide_key(&db, pool.clone())
        .build()
        .await?;

    let first: Vec<Item> = (0..n).map(|id| item(id, 0)).collect();
    let changed: Vec<Item> = (0..n)
        .map(|id| item(id, i64::from(id % 100 == 0)))
        .collect();
    let kept: Vec<Item> = changed.iter().filter(|i| i.id % 10 != 0).cloned().collect();
    let deleted: Vec<i64> = (0..n).filter(|id| id % 10 == 0).collect();
    let phases: Vec<(&str, Vec<Item>, Vec<i64>)> = vec![
        ("first", first, Vec::new()),
        ("change1pct", changed, Vec::new()),
        ("delete10pct", kept, deleted),
    ];
    let mut rates = Vec::new();
    for (phase, items, deleted) in phases {
        let rows = n as f64;
        let items = Arc::new(items);
        let start = Instant::now();
        weir_sync(&app, &db, &weir_table, Arc::clone(&items)).await?;
        let weir_secs = start.elapsed().as_secs_f64();
        let start = Instant::now();
        raw_sync(pool, &raw_table, &items, &deleted).await?;
        let raw_secs = start.elapsed().as_secs_f64();
        let (w, r) = (
            count(pool, &weir_table).await?,
            count(pool, &raw_table).await?,
        );
        if w != r {
            return Err(Error::msg(format!("{phase}: weir has {w} rows, raw {r}")));
        }
        rates.push(paired::Rates {
            phase,
            weir: rows / weir_secs,
            raw: rows / raw_secs,
        });
    }
    drop(app);
    sqlx::raw_sql(&format!(
        "DROP TABLE IF EXISTS \"{weir_table}\"; DROP TABLE IF EXISTS \"{raw_table}\""
    ))
    .execute(pool)
    .await?;
    Ok(rates)
}

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}
