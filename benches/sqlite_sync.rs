//! The SQLite target's throughput against hand-written sqlx.
//!
//! `cargo bench --bench sqlite_sync` syncs 100k rows (`WEIR_BENCH_ROWS`)
//! into a WAL database file through weir, phase by phase:
//!
//! - `first`: every row is new;
//! - `change1pct`: the same rows, 1% of them with a new title;
//! - `delete10pct`: 10% of the rows are no longer declared.
//!
//! Each phase is then done the raw way, on another file of the same
//! directory: a full sync of the same rows with sqlx and no change tracking
//! (one transaction of multi-row upserts of every declared row, plus
//! multi-row deletes of the removed ones). Both rates count the rows
//! declared in the phase, so weir's rate includes its ledger and its
//! change detection, and raw's its rewriting of unchanged rows.
//!
//! The sequence runs `WEIR_BENCH_REPEAT` times (default 3) from scratch,
//! each run in new files and a new ledger; each phase then ends with one
//! line of medians, `RESULT sqlite_sync <phase> weir_rows_per_sec=<n>
//! raw_rows_per_sec=<n> ratio=<r>` (see `shared/paired.rs`).
//!
//! `WEIR_BENCH_MAX_ACTIONS` sets the actions per sink call (default
//! `DEFAULT_MAX_ACTIONS`, 4096). 16 384 measured the same in every phase
//! (six alternating runs, once deletions reached the sinks in key order;
//! before that it made `delete10pct` about 13% faster).
//! `WEIR_BENCH_SHARDS` sets the reconciler shards (default: one per core).
//! weir's rows are declared by one component; `WEIR_BENCH_COMPONENTS=n`
//! splits them over n child components instead, each with a contiguous
//! range of ids (see `shared/split.rs`).

#[path = "shared/paired.rs"]
mod paired;
#[path = "shared/split.rs"]
mod split;

// weir allocates across many threads; see benches/engine.rs.
#[cfg(not(feature = "bench-system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use sqlx::SqlitePool;
use weir::connectors::sql::{ColumnType, TableSchema};
use weir::connectors::sqlite;
use weir::prelude::*;
use weir::DEFAULT_MAX_ACTIONS;

#[derive(Clone, Debug, Serialize)]
struct Doc {
    id: i64,
    title: String,
    body: String,
    n: i64,
}

fn schema() -> Result<TableSchema> {
    TableSchema::builder()
        .column("id", ColumnType::BigInt)
        .column("title", ColumnType::Text)
        .column("body", ColumnType::Text)
        .column("n", ColumnType::BigInt)
        .primary_key(["id"])
        .build()
}

/// The rows declared in a phase.
fn rows(phase: &str, count: i64) -> Vec<Doc> {
    (0..count)
        .filter(|i| phase != "delete10pct" || i % 10 != 3)
        .map(|i| Doc {
            id: i,
            title: if phase != "first" && i % 100 == 0 {
                format!("changed title {i}")
            } else {
                format!("title {i}")
            },
            body: format!("{i:08} the body of a document, long enough to look like one"),
            n: i * 7,
        })
        .collect()
}

async fn weir_phase(app: &App, db: &ContextKey<SqlitePool>, docs: Arc<Vec<Doc>>) -> Result<f64> {
    let db = ContextKey::<SqlitePool>::new(db.name());
    let start = Instant::now();
    app.run(move |ctx| async move {
        let table = sqlite::mount_table_target(&ctx, &db, "docs", schema()?).await?;
        split::declare_rows(
            &ctx,
            docs,
            table,
            split::components(),
            |d| d.id as u64,
            |t, ctx, d| t.declare_row(ctx, d),
        )
        .await
    })
    .await?;
    Ok(start.elapsed().as_secs_f64())
}

const RAW_ROWS_PER_STATEMENT: usize = 1_000;

async fn raw_phase(pool: &SqlitePool, docs: &[Doc], removed: &[i64]) -> Result<f64> {
    let start = Instant::now();
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    for chunk in docs.chunks(RAW_ROWS_PER_STATEMENT) {
        let values = vec!["(?, ?, ?, ?)"; chunk.len()].join(", ");
        let sql = format!(
            "INSERT INTO docs (id, title, body, n) VALUES {values} ON CONFLICT (id) DO UPDATE \
             SET title = excluded.title, body = excluded.body, n = excluded.n"
        );
        let mut query = sqlx::query(&sql);
        for d in chunk {
            query = query
                .bind(d.id)
                .bind(d.title.as_str())
                .bind(d.body.as_str())
                .bind(d.n);
        }
        query.execute(&mut *tx).await?;
    }
    for chunk in removed.chunks(RAW_ROWS_PER_STATEMENT) {
        let list = vec!["?"; chunk.len()].join(", ");
        let sql = format!("DELETE FROM docs WHERE id IN ({list})");
        let mut query = sqlx::query(&sql);
        for id in chunk {
            query = query.bind(*id);
        }
        query.execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(start.elapsed().as_secs_f64())
}

async fn bench() -> Result<()> {
    let count: i64 = std::env::var("WEIR_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let mut runs = Vec::new();
    for run in 1..=paired::repeats() {
        let rates = sequence(count).await?;
        for r in &rates {
            paired::print_run("sqlite_sync", run, r);
        }
        runs.push(rates);
    }
    paired::print_medians("sqlite_sync", &runs);
    Ok(())
}

/// One run of every phase, from scratch.
async fn sequence(count: i64) -> Result<Vec<paired::Rates>> {
    let dir = tempfile::tempdir()?;
    let weir_pool = sqlite::connect(dir.path().join("weir.db")).await?;
    let raw_pool = sqlite::connect(dir.path().join("raw.db")).await?;
    sqlx::query(
        "CREATE TABLE docs (id INTEGER NOT NULL, title TEXT NOT NULL, body TEXT NOT NULL, \
         n INTEGER NOT NULL, PRIMARY KEY (id))",
    )
    .execute(&raw_pool)
    .await?;
    let db = ContextKey::<SqlitePool>::new("bench_db");
    // Sink calls of `max_actions` rows, one transaction each.
    let max_actions = std::env::var("WEIR_BENCH_MAX_ACTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_MAX_ACTIONS);
    let app = paired::shards(App::builder("sqlite-bench"))
        .ledger_path(dir.path().join("ledger"))
        .batch_policy(BatchPolicy {
            max_actions,
            ..BatchPolicy::default()
        })
        .provide_key(&db, weir_pool.clone())
        .build()
        .await?;
    let mut previous: Vec<i64> = Vec::new();
    let mut rates = Vec::new();
    for phase in ["first", "change1pct", "delete10pct"] {
        let docs = rows(phase, count);
        let declared: std::collections::HashSet<i64> = docs.iter().map(|d| d.id).collect();
        let removed: Vec<i64> = previous
            .iter()
            .copied()
            .filter(|id| !declared.contains(id))
            .collect();
        previous = docs.iter().map(|d| d.id).collect();
        let n = docs.len() as f64;
        let docs = Arc::new(docs);
        let weir_secs = weir_phase(&app, &db, Arc::clone(&docs)).await?;
        let raw_secs = raw_phase(&raw_pool, &docs, &removed).await?;
        rates.push(paired::Rates {
            phase,
            weir: n / weir_secs,
            raw: n / raw_secs,
        });
    }
    let (weir_rows, raw_rows): (i64, i64) = (
        sqlx::query_scalar("SELECT count(*) FROM docs")
            .fetch_one(&weir_pool)
            .await?,
        sqlx::query_scalar("SELECT count(*) FROM docs")
            .fetch_one(&raw_pool)
            .await?,
    );
    if weir_rows != raw_rows {
        return Err(Error::msg(format!(
            "weir wrote {weir_rows} rows, raw {raw_rows}: the runs disagree"
        )));
    }
    Ok(rates)
}

fn main() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start tokio: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bench()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sqlite_sync failed: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
