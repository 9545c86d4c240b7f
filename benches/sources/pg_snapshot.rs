//! A PostgreSQL table copied into another PostgreSQL table: weir's table
//! source against a client-side copy.
//!
//! - weir: a [`TableSource`] snapshot (one listing read from one
//!   transaction) consumed with `App::consume`, one component per row
//!   declaring it into a PostgreSQL table target.
//! - baseline: every row read with one query, then written with
//!   `INSERT ... SELECT FROM UNNEST(...)`, 10 000 rows per statement, in one
//!   transaction (no `INSERT ... SELECT` from the source table: the rows
//!   travel through the client, as they do through weir).
//!
//! Both copy into an empty table; the source table is filled before the
//! clock starts. Every table is dropped at the end.

use std::error::Error as StdError;
use std::time::{Duration, Instant};

use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use weir::connectors::postgres::{mount_table_target, TableSource, TableSourceOptions};
use weir::prelude::*;
use weir::source::ConsumeOptions;

/// Rows per statement of the baseline's inserts (as weir's row sink).
const ROWS_PER_INSERT: usize = 10_000;

/// One row of the copied table, as the baseline reads it.
type Row = (i64, String, String, f64, i64);

/// Seconds taken to copy a table of `rows` rows into another table of the
/// server at `pg_url`: `(weir, baseline)`.
///
/// # Errors
/// When the server cannot be reached, a statement fails, or a copy does
/// not hold every row.
pub async fn measure(rows: usize, pg_url: &str) -> Result<(f64, f64), Box<dyn StdError>> {
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(10))
        .connect(pg_url)
        .await?;
    let suffix = std::process::id();
    let names = Names {
        source: format!("bench_pgsrc_source_{suffix}"),
        weir: format!("bench_pgsrc_weir_{suffix}"),
        baseline: format!("bench_pgsrc_baseline_{suffix}"),
    };
    let result = copies(&pool, rows, &names).await;
    drop_tables(&pool, &names).await?;
    result
}

/// The tables of one measure.
struct Names {
    source: String,
    weir: String,
    baseline: String,
}

async fn copies(
    pool: &PgPool,
    rows: usize,
    names: &Names,
) -> Result<(f64, f64), Box<dyn StdError>> {
    drop_tables(pool, names).await?;
    fill_source(pool, &names.source, rows).await?;
    let start = Instant::now();
    weir_copy(pool, &names.source, &names.weir).await?;
    let weir_secs = start.elapsed().as_secs_f64();
    let start = Instant::now();
    baseline_copy(pool, &names.source, &names.baseline).await?;
    let baseline_secs = start.elapsed().as_secs_f64();
    for table in [&names.weir, &names.baseline] {
        let n = count(pool, table).await?;
        if n != rows as i64 {
            return Err(format!("{table} holds {n} rows, not {rows}").into());
        }
    }
    Ok((weir_secs, baseline_secs))
}

/// The copied table's columns.
const COLUMNS: &str = "id bigint PRIMARY KEY, title text NOT NULL, body text NOT NULL, \
                       score double precision NOT NULL, version bigint NOT NULL";

async fn fill_source(pool: &PgPool, table: &str, rows: usize) -> Result<(), Box<dyn StdError>> {
    sqlx::query(&format!("CREATE TABLE \"{table}\" ({COLUMNS})"))
        .execute(pool)
        .await?;
    sqlx::query(&format!(
        "INSERT INTO \"{table}\" SELECT i, 'item ' || i, \
         'the body of item ' || i || ', with some text to carry', i / 7.0, 0 \
         FROM generate_series(1, $1::int8) AS i"
    ))
    .bind(rows as i64)
    .execute(pool)
    .await?;
    sqlx::query(&format!("ANALYZE \"{table}\""))
        .execute(pool)
        .await?;
    Ok(())
}

/// weir: the source's snapshot, one component per row declaring it into
/// a table target (created by weir).
async fn weir_copy(pool: &PgPool, source: &str, target: &str) -> Result<(), Box<dyn StdError>> {
    let dir = tempfile::tempdir()?;
    let db = ContextKey::<PgPool>::new("bench_pg_source");
    let app = App::builder("pg_snapshot")
        .ledger_path(dir.path().join("ledger"))
        .batch_policy(BatchPolicy {
            max_actions: ROWS_PER_INSERT,
            ..BatchPolicy::default()
        })
        .provide_key(&db, pool.clone())
        .build()
        .await?;
    let mut rows = TableSource::connect(pool.clone(), TableSourceOptions::new(source)).await?;
    let target = target.to_string();
    app.consume(&mut rows, ConsumeOptions::default(), move |ctx, batch| {
        let (db, target) = (db.clone(), target.clone());
        async move {
            let table = mount_table_target(&ctx, &db, &target, crate::documents::schema()?).await?;
            ctx.mount_source(batch, move |ctx, item| {
                let table = table.clone();
                async move { table.declare_row(&ctx, &item.payload.value) }
            })
            .await
        }
    })
    .await?;
    Ok(())
}

/// The baseline: one query reads every row, batched `UNNEST` inserts
/// write them, in one transaction.
async fn baseline_copy(pool: &PgPool, source: &str, target: &str) -> Result<(), Box<dyn StdError>> {
    sqlx::query(&format!("CREATE TABLE \"{target}\" ({COLUMNS})"))
        .execute(pool)
        .await?;
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "SELECT id, title, body, score, version FROM \"{source}\""
    ))
    .fetch_all(pool)
    .await?;
    let insert = format!(
        "INSERT INTO \"{target}\" (id, title, body, score, version) \
         SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::text[], $4::double precision[], $5::bigint[])"
    );
    let mut tx = pool.begin().await?;
    for chunk in rows.chunks(ROWS_PER_INSERT) {
        sqlx::query(&insert)
            .bind(chunk.iter().map(|r| r.0).collect::<Vec<_>>())
            .bind(chunk.iter().map(|r| r.1.clone()).collect::<Vec<_>>())
            .bind(chunk.iter().map(|r| r.2.clone()).collect::<Vec<_>>())
            .bind(chunk.iter().map(|r| r.3).collect::<Vec<_>>())
            .bind(chunk.iter().map(|r| r.4).collect::<Vec<_>>())
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

async fn count(pool: &PgPool, table: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(&format!("SELECT count(*) FROM \"{table}\""))
        .fetch_one(pool)
        .await
}

async fn drop_tables(pool: &PgPool, names: &Names) -> Result<(), sqlx::Error> {
    for table in [&names.source, &names.weir, &names.baseline] {
        sqlx::query(&format!("DROP TABLE IF EXISTS \"{table}\""))
            .execute(pool)
            .await?;
    }
    Ok(())
}
