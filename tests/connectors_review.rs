//! Review findings for the target connectors, as failing tests.

mod pg;

use std::time::Duration;

use sqlx::PgPool;
use weir::connectors::postgres::{declare_table_target_with, register_database, TableOptions};
use weir::connectors::sql::{ColumnType, TableSchema};
use weir::prelude::*;
use weir::statediff::ManagedBy;

fn db() -> ContextKey<PgPool> {
    ContextKey::new("pg")
}

async fn server() -> Result<Option<PgPool>> {
    Ok(pg::server(4)
        .await
        .map_err(Error::msg)?
        .map(|(_, pool)| pool))
}

fn unique(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{test}_{:x}_{:x}", std::process::id(), nanos)
}

fn schema() -> Result<TableSchema> {
    TableSchema::builder()
        .column("id", ColumnType::Text)
        .nullable_column("body", ColumnType::Text)
        .primary_key(["id"])
        .build()
}

async fn exists(pool: &PgPool, table: &str) -> Result<bool> {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_class WHERE relname = $1")
        .bind(table)
        .fetch_one(pool)
        .await?;
    Ok(n > 0)
}

async fn run<F, Fut>(app: &App, f: F) -> Result<Result<UpdateStats>>
where
    F: FnOnce(Ctx) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send + 'static,
{
    tokio::time::timeout(Duration::from_secs(60), app.run(f))
        .await
        .map_err(|_| Error::msg("run timed out"))
}

/// A user-managed table must never be dropped by weir. When the run that
/// declared it failed at the table sink (because another table of the same
/// component failed), its state is "maybe missing"; undeclaring it then
/// must abandon it, not `DROP TABLE` it.
#[tokio::test(flavor = "multi_thread")]
async fn pg_user_table_with_maybe_missing_state_is_not_dropped_when_undeclared() -> Result<()> {
    let Some(pool) = server().await? else {
        return Ok(());
    };
    let user = unique("rv_user");
    let sys = unique("rv_sys");
    sqlx::raw_sql(&format!(
        "CREATE TABLE \"{user}\" (id text PRIMARY KEY, body text); \
         INSERT INTO \"{user}\" VALUES ('precious', 'data'); \
         CREATE TYPE \"{sys}\" AS ENUM ('x')"
    ))
    .execute(&pool)
    .await?;
    let dir = tempfile::tempdir()?;
    let app = App::builder("pg-review")
        .ledger_path(dir.path().join("ledger"))
        .provide_key(&db(), pool.clone())
        .retry_policy(RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        })
        .build()
        .await?;

    // Run 1: the system table cannot be created (a type of that name
    // exists), so the component's table sink call fails.
    let (u, s) = (user.clone(), sys.clone());
    let first = run(&app, move |ctx| async move {
        let user_opts = TableOptions::default().managed_by(ManagedBy::User);
        declare_table_target_with(&ctx, &db(), &u, schema()?, user_opts)?;
        declare_table_target_with(&ctx, &db(), &s, schema()?, TableOptions::default())?;
        Ok(())
    })
    .await?;
    assert!(first.is_err(), "run 1 was expected to fail: {first:?}");

    // Run 2: the user table is no longer declared.
    let second = run(&app, |ctx| async move { register_database(&ctx, &db()) }).await?;
    let user_table_survived = exists(&pool, &user).await?;

    let cleanup = format!(
        "DROP TABLE IF EXISTS \"{user}\"; DROP TABLE IF EXISTS \"{sys}\"; DROP TYPE IF EXISTS \"{sys}\""
    );
    sqlx::raw_sql(&cleanup).execute(&pool).await?;
    second?;
    assert!(
        user_table_survived,
        "weir dropped the user-managed table {user}"
    );
    Ok(())
}

#[derive(serde::Serialize)]
struct Doc {
    id: String,
    body: String,
    n: i64,
}

/// Taking over a user-managed table (`User` -> `System`) must bring it to
/// the declared schema (as the SQLite target does), not just run
/// `CREATE TABLE IF NOT EXISTS` on a table that already exists.
#[tokio::test(flavor = "multi_thread")]
async fn pg_taking_over_a_user_table_converges_its_schema() -> Result<()> {
    let Some(pool) = server().await? else {
        return Ok(());
    };
    let t = unique("rv_takeover");
    sqlx::raw_sql(&format!(
        "CREATE TABLE \"{t}\" (id text PRIMARY KEY, body text)"
    ))
    .execute(&pool)
    .await?;
    let dir = tempfile::tempdir()?;
    let app = App::builder("pg-review-2")
        .ledger_path(dir.path().join("ledger"))
        .provide_key(&db(), pool.clone())
        .retry_policy(RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        })
        .build()
        .await?;
    let table = t.clone();
    let first = run(&app, move |ctx| async move {
        let opts = TableOptions::default().managed_by(ManagedBy::User);
        declare_table_target_with(&ctx, &db(), &table, schema()?, opts)?;
        Ok(())
    })
    .await?;
    let table = t.clone();
    let second = run(&app, move |ctx| async move {
        let wider = TableSchema::builder()
            .column("id", ColumnType::Text)
            .nullable_column("body", ColumnType::Text)
            .nullable_column("n", ColumnType::BigInt)
            .primary_key(["id"])
            .build()?;
        let target =
            declare_table_target_with(&ctx, &db(), &table, wider, TableOptions::default())?;
        target.declare_row(
            &ctx,
            &Doc {
                id: "a".into(),
                body: "b".into(),
                n: 1,
            },
        )
    })
    .await?;
    sqlx::raw_sql(&format!("DROP TABLE IF EXISTS \"{t}\""))
        .execute(&pool)
        .await?;
    first?;
    assert!(
        second.is_ok(),
        "system takeover of {t} did not add the declared column: {second:?}"
    );
    Ok(())
}
