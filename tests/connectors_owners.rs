//! The table owner registry through the API: an app whose ledger did not
//! create a table is refused by the connector itself (in the transaction of
//! the table's DDL), naming the owner, and changes nothing; an app built
//! with `adopt_tables` takes the table over; App::owner names the ledger,
//! or the worker group.

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod pg;

use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use sqlx::{PgPool, SqlitePool};
use weir::connectors::sql::{ColumnType, TableSchema};
use weir::connectors::{postgres, sqlite};
use weir::prelude::*;

#[derive(Clone, Debug, Serialize)]
struct Doc {
    id: String,
    title: String,
}

fn schema() -> Result<TableSchema> {
    TableSchema::builder()
        .column("id", ColumnType::Text)
        .column("title", ColumnType::Text)
        .primary_key(["id"])
        .build()
}

fn docs(rows: &[(&str, &str)]) -> Vec<Doc> {
    rows.iter()
        .map(|(id, title)| Doc {
            id: id.to_string(),
            title: title.to_string(),
        })
        .collect()
}

fn retry() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 2,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(10),
        call_timeout: Some(Duration::from_secs(20)),
    }
}

async fn sqlite_app(ledger: &Path, pool: &SqlitePool, adopt: bool) -> Result<App> {
    App::builder("owners")
        .ledger_path(ledger)
        .retry_policy(retry())
        .adopt_tables(adopt)
        .provide_key(&ContextKey::<SqlitePool>::new("db"), pool.clone())
        .build()
        .await
}

async fn sqlite_sync(app: &App, table: &str, rows: Vec<Doc>) -> Result<UpdateStats> {
    let table = table.to_string();
    app.run(move |ctx| async move {
        let db = ContextKey::<SqlitePool>::new("db");
        let target = sqlite::mount_table_target(&ctx, &db, &table, schema()?).await?;
        for row in &rows {
            target.declare_row(&ctx, row)?;
        }
        Ok(())
    })
    .await
}

async fn sqlite_rows(pool: &SqlitePool) -> Vec<(String, String)> {
    sqlx::query_as("SELECT id, title FROM docs ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_table_of_another_ledger_is_refused_by_the_connector_and_adopted_only_when_asked(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pool = sqlite::connect(dir.path().join("db.sqlite")).await?;
    let first = sqlite_app(&dir.path().join("first"), &pool, false).await?;
    sqlite_sync(&first, "docs", docs(&[("a", "A"), ("b", "B")])).await?;
    let owner = first.owner()?;
    assert!(owner.key().starts_with("ledger:"), "{owner:?}");
    assert_eq!(
        sqlite::table_owner(&pool, "docs").await?,
        Some(owner.clone())
    );

    let second = sqlite_app(&dir.path().join("second"), &pool, false).await?;
    let err = sqlite_sync(&second, "docs", docs(&[("c", "C")]))
        .await
        .expect_err("a second owner is refused");
    let text = err.to_string();
    assert!(text.contains("table docs is managed by"), "{text}");
    assert!(text.contains(owner.description()), "{text}");
    assert_eq!(
        sqlite_rows(&pool).await,
        vec![("a".into(), "A".into()), ("b".into(), "B".into())],
        "nothing was changed"
    );
    drop(second);

    let adopting = sqlite_app(&dir.path().join("second"), &pool, true).await?;
    sqlite_sync(&adopting, "docs", docs(&[("c", "C")])).await?;
    // Rows the lost ledger wrote are unknown to the new owner: they stay.
    let all = vec![
        ("a".into(), "A".into()),
        ("b".into(), "B".into()),
        ("c".into(), "C".into()),
    ];
    assert_eq!(sqlite_rows(&pool).await, all);
    assert_eq!(
        sqlite::table_owner(&pool, "docs").await?,
        Some(adopting.owner()?)
    );
    // The first ledger is now the other owner: its drop is refused, and
    // the table stays.
    let err = first
        .drop_state(|ctx| async move {
            sqlite::register_database(&ctx, &ContextKey::<SqlitePool>::new("db"))
        })
        .await
        .expect_err("a drop by another owner is refused");
    assert!(err.to_string().contains("is managed by"), "{err}");
    assert_eq!(sqlite_rows(&pool).await, all);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_table_dropped_by_hand_goes_to_the_next_ledger_that_creates_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pool = sqlite::connect(dir.path().join("db.sqlite")).await?;
    let first = sqlite_app(&dir.path().join("first"), &pool, false).await?;
    sqlite_sync(&first, "docs", docs(&[("a", "A")])).await?;
    sqlx::query("DROP TABLE docs").execute(&pool).await?;
    let second = sqlite_app(&dir.path().join("second"), &pool, false).await?;
    sqlite_sync(&second, "docs", docs(&[("b", "B")])).await?;
    assert_eq!(sqlite_rows(&pool).await, vec![("b".into(), "B".into())]);
    assert_eq!(
        sqlite::table_owner(&pool, "docs").await?,
        Some(second.owner()?)
    );
    Ok(())
}

use pg::unique;

async fn pg_app(ledger: &Path, pool: &PgPool, adopt: bool) -> Result<App> {
    App::builder("owners")
        .ledger_path(ledger)
        .retry_policy(retry())
        .adopt_tables(adopt)
        .provide_key(&ContextKey::<PgPool>::new("pg"), pool.clone())
        .build()
        .await
}

async fn pg_sync(app: &App, table: &str, rows: Vec<Doc>) -> Result<UpdateStats> {
    let table = table.to_string();
    app.run(move |ctx| async move {
        let db = ContextKey::<PgPool>::new("pg");
        let target = postgres::mount_table_target(&ctx, &db, &table, schema()?).await?;
        for row in &rows {
            target.declare_row(&ctx, row)?;
        }
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_table_of_another_ledger_is_refused_in_the_ddl_transaction_and_adopted_when_asked(
) -> Result<()> {
    let Some((_, pool)) = pg::server(4).await.map_err(Error::msg)? else {
        return Ok(());
    };
    let table = unique("owned");
    let dir = tempfile::tempdir()?;
    let first = pg_app(&dir.path().join("first"), &pool, false).await?;
    pg_sync(&first, &table, docs(&[("a", "A")])).await?;
    assert_eq!(
        postgres::table_owner(&pool, &table).await?,
        Some(first.owner()?)
    );
    let count = format!("SELECT count(*) FROM \"{table}\"");

    let second = pg_app(&dir.path().join("second"), &pool, false).await?;
    let err = pg_sync(&second, &table, docs(&[("b", "B"), ("c", "C")]))
        .await
        .expect_err("a second owner is refused");
    assert!(
        err.to_string().contains(first.owner()?.description()),
        "{err}"
    );
    let n: i64 = sqlx::query_scalar(&count).fetch_one(&pool).await?;
    assert_eq!(n, 1, "nothing was changed");
    drop(second);

    let adopting = pg_app(&dir.path().join("second"), &pool, true).await?;
    pg_sync(&adopting, &table, docs(&[("b", "B"), ("c", "C")])).await?;
    // The row the lost ledger wrote is unknown to the new owner: it stays.
    let n: i64 = sqlx::query_scalar(&count).fetch_one(&pool).await?;
    assert_eq!(n, 3);
    adopting
        .drop_state(|ctx| async move {
            postgres::register_database(&ctx, &ContextKey::<PgPool>::new("pg"))
        })
        .await?;
    assert_eq!(postgres::table_owner(&pool, &table).await?, None);
    Ok(())
}

/// A pool on the test server whose unqualified names resolve in `schema`
/// (created here).
async fn pool_in_schema(url: &str, admin: &PgPool, schema: &str) -> Result<PgPool> {
    sqlx::raw_sql(&format!("CREATE SCHEMA \"{schema}\""))
        .execute(admin)
        .await?;
    let options = <sqlx::postgres::PgConnectOptions as std::str::FromStr>::from_str(url)
        .map_err(|e| Error::msg(e.to_string()))?
        .options([("search_path", schema)]);
    Ok(sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apps_writing_a_table_of_one_name_into_two_schemas_each_own_their_own() -> Result<()> {
    let Some((url, admin)) = pg::server(2).await.map_err(Error::msg)? else {
        return Ok(());
    };
    let (s1, s2) = (unique("owners_a"), unique("owners_b"));
    let table = unique("shared_name");
    let (p1, p2) = (
        pool_in_schema(&url, &admin, &s1).await?,
        pool_in_schema(&url, &admin, &s2).await?,
    );
    let dir = tempfile::tempdir()?;
    let first = pg_app(&dir.path().join("first"), &p1, false).await?;
    let second = pg_app(&dir.path().join("second"), &p2, false).await?;
    for _ in 0..2 {
        pg_sync(&first, &table, docs(&[("a", "A")])).await?;
        pg_sync(&second, &table, docs(&[("b", "B")])).await?;
    }
    assert_eq!(
        postgres::table_owner(&p1, &table).await?,
        Some(first.owner()?)
    );
    assert_eq!(
        postgres::table_owner(&p2, &table).await?,
        Some(second.owner()?)
    );
    // Dropped by the group of tables of an owner: its own schema's only.
    let dropped = postgres::drop_tables_of(&admin, &first.owner()?).await?;
    assert_eq!(dropped, vec![format!("{s1}.{table}")]);
    let count = format!("SELECT count(*) FROM \"{s2}\".\"{table}\"");
    let n: i64 = sqlx::query_scalar(&count).fetch_one(&admin).await?;
    assert_eq!(n, 1, "the other schema's table stays");
    second
        .drop_state(|ctx| async move {
            postgres::register_database(&ctx, &ContextKey::<PgPool>::new("pg"))
        })
        .await?;
    for schema in [&s1, &s2] {
        sqlx::raw_sql(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .execute(&admin)
            .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_of_an_earlier_build_keyed_by_the_bare_name_still_guards_its_table(
) -> Result<()> {
    let Some((_, pool)) = pg::server(4).await.map_err(Error::msg)? else {
        return Ok(());
    };
    let table = unique("legacy");
    let dir = tempfile::tempdir()?;
    let first = pg_app(&dir.path().join("first"), &pool, false).await?;
    pg_sync(&first, &table, docs(&[("a", "A")])).await?;
    // As an earlier build registered it: by its bare name.
    sqlx::query("UPDATE weir.table_owner SET table_name = $1 WHERE table_name LIKE '%.' || $1")
        .bind(&table)
        .execute(&pool)
        .await?;
    assert_eq!(
        postgres::table_owner(&pool, &table).await?,
        Some(first.owner()?)
    );
    let second = pg_app(&dir.path().join("second"), &pool, false).await?;
    let err = pg_sync(&second, &table, docs(&[("b", "B")]))
        .await
        .expect_err("a second owner is refused");
    assert!(
        err.to_string().contains(first.owner()?.description()),
        "{err}"
    );
    // Its owner's next run keys it as this build does.
    pg_sync(&first, &table, docs(&[("a", "A2")])).await?;
    let keys: Vec<String> = sqlx::query_scalar(
        "SELECT table_name FROM weir.table_owner WHERE table_name LIKE '%' || $1",
    )
    .bind(&table)
    .fetch_all(&pool)
    .await?;
    assert_eq!(keys.len(), 1);
    assert!(keys[0].ends_with(&format!(".{table}")), "{keys:?}");
    first
        .drop_state(|ctx| async move {
            postgres::register_database(&ctx, &ContextKey::<PgPool>::new("pg"))
        })
        .await?;
    assert_eq!(postgres::table_owner(&pool, &table).await?, None);
    Ok(())
}
