//! One database of each dialect per test, behind one trait, so that each
//! behaviour of the SQL table target is written once and run against both.
//!
//! - SQLite: a database file of the test's own.
//! - PostgreSQL: a schema of the test's own in the test server's database
//!   (dropped by [`Db::finish`], with its tables' owner registrations), and
//!   a pool whose `search_path` is that schema, so that tables are named
//!   as in the SQLite tests.

use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, SqlitePool};
use tempfile::TempDir;
use weir::connectors::sql::{TableOptions, TableSchema};
use weir::connectors::{postgres, sqlite};
use weir::prelude::*;

#[path = "../pg/mod.rs"]
mod pg;

/// A row read back: each column as text (`None` for NULL).
pub type TextRow = Vec<Option<String>>;

/// A database of one dialect for one test, and an app over it.
pub trait Db: Sized + Send + Sync + 'static {
    /// Names the dialect in messages.
    const NAME: &'static str;
    /// The pool the app is given.
    type Pool: Clone + Send + Sync + 'static;
    /// The dialect's declared table.
    type Target: Clone + Send + Sync + 'static;

    /// A database of the test's own; `None` (after a loud message) when
    /// there is no server and `CI` is not `true`.
    fn fresh(test: &str) -> impl Future<Output = Result<Option<Self>>> + Send;
    /// Mounts a table.
    fn mount(
        ctx: &Ctx,
        name: &str,
        schema: TableSchema,
        options: TableOptions,
    ) -> impl Future<Output = Result<Self::Target>> + Send;
    /// Declares a table in the current component.
    fn declare(
        ctx: &Ctx,
        name: &str,
        schema: TableSchema,
        options: TableOptions,
    ) -> Result<Self::Target>;
    /// Declares a row.
    fn declare_row<R: Serialize>(target: &Self::Target, ctx: &Ctx, row: R) -> Result<()>;
    /// Says that `child`'s rows refer to `parent`'s.
    fn depends_on(child: Self::Target, parent: &Self::Target) -> Self::Target;
    /// Registers the database in a run that declares none of its tables.
    fn register(ctx: &Ctx) -> Result<()>;
    /// Runs SQL statements.
    fn exec(&self, sql: &str) -> impl Future<Output = Result<()>> + Send;
    /// The `columns` of every row of `table`, as text, ordered by `order`.
    fn rows(
        &self,
        table: &str,
        columns: &[&str],
        order: &str,
    ) -> impl Future<Output = Result<Vec<TextRow>>> + Send;
    /// Whether the table exists.
    fn exists(&self, table: &str) -> impl Future<Output = Result<bool>> + Send;
    /// The table's columns, in order.
    fn columns(&self, table: &str) -> impl Future<Output = Result<Vec<String>>> + Send;
    /// Drops what the test made.
    fn finish(self) -> impl Future<Output = Result<()>> + Send;

    /// An app named `name` over this database, with its own ledger.
    fn app(&self, name: &str) -> impl Future<Output = Result<App>> + Send;
}

/// The context key both dialects' pools are provided under.
pub fn key<P: Send + Sync + 'static>() -> ContextKey<P> {
    ContextKey::new("db")
}

/// The retry policy of the tests' apps: quick, and bounded.
fn retries() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
        call_timeout: Some(Duration::from_secs(20)),
    }
}

fn build_app<P: Clone + Send + Sync + 'static>(
    name: &str,
    dir: &std::path::Path,
    pool: &P,
) -> impl Future<Output = Result<App>> + Send {
    App::builder(name)
        .ledger_path(dir.join(format!("ledger-{name}")))
        .shards(3)
        .retry_policy(retries())
        .provide_key(&key::<P>(), pool.clone())
        .build()
}

/// The `Db` methods that are the same for both dialects but for the
/// connector module they call (`sqlite`, `postgres`) and the pool type,
/// for a type with `dir` and `pool` fields.
macro_rules! forward_to_connector {
    ($connector:ident) => {
        async fn mount(
            ctx: &Ctx,
            name: &str,
            schema: TableSchema,
            options: TableOptions,
        ) -> Result<Self::Target> {
            $connector::mount_table_target_with(ctx, &key(), name, schema, options).await
        }

        fn declare(
            ctx: &Ctx,
            name: &str,
            schema: TableSchema,
            options: TableOptions,
        ) -> Result<Self::Target> {
            $connector::declare_table_target_with(ctx, &key(), name, schema, options)
        }

        fn declare_row<R: Serialize>(target: &Self::Target, ctx: &Ctx, row: R) -> Result<()> {
            target.declare_row(ctx, row)
        }

        fn depends_on(child: Self::Target, parent: &Self::Target) -> Self::Target {
            child.depends_on(parent)
        }

        fn register(ctx: &Ctx) -> Result<()> {
            $connector::register_database(ctx, &key())
        }

        async fn exec(&self, sql: &str) -> Result<()> {
            sqlx::raw_sql(sql).execute(&self.pool).await?;
            Ok(())
        }

        fn app(&self, name: &str) -> impl Future<Output = Result<App>> + Send {
            build_app(name, self.dir.path(), &self.pool)
        }

        async fn rows(&self, table: &str, columns: &[&str], order: &str) -> Result<Vec<TextRow>> {
            let list: Vec<String> = columns
                .iter()
                .map(|c| format!("CAST(\"{c}\" AS TEXT)"))
                .collect();
            let sql = format!(
                "SELECT {} FROM \"{table}\" ORDER BY {order}",
                list.join(", ")
            );
            let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
            read_texts(rows, columns.len())
        }
    };
}

/// SQLite: a database file of the test's own.
pub struct Lite {
    dir: TempDir,
    pool: SqlitePool,
}

impl Db for Lite {
    const NAME: &'static str = "sqlite";
    type Pool = SqlitePool;
    type Target = sqlite::TableTarget;

    async fn fresh(_test: &str) -> Result<Option<Self>> {
        let dir = tempfile::tempdir()?;
        let pool = sqlite::connect(dir.path().join("test.db")).await?;
        Ok(Some(Lite { dir, pool }))
    }

    forward_to_connector!(sqlite);

    async fn exists(&self, table: &str) -> Result<bool> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?",
        )
        .bind(table)
        .fetch_one(&self.pool)
        .await?;
        Ok(n == 1)
    }

    async fn columns(&self, table: &str) -> Result<Vec<String>> {
        Ok(
            sqlx::query_scalar("SELECT name FROM pragma_table_info(?) ORDER BY cid")
                .bind(table)
                .fetch_all(&self.pool)
                .await?,
        )
    }

    async fn finish(self) -> Result<()> {
        self.pool.close().await;
        Ok(())
    }
}

/// PostgreSQL: a schema of the test's own.
pub struct Pg {
    dir: TempDir,
    admin: PgPool,
    pool: PgPool,
    schema: String,
}

impl Db for Pg {
    const NAME: &'static str = "postgres";
    type Pool = PgPool;
    type Target = postgres::TableTarget;

    async fn fresh(test: &str) -> Result<Option<Self>> {
        let Some((url, admin)) = pg::server(2).await.map_err(Error::msg)? else {
            return Ok(None);
        };
        let unique = pg::unique("t").to_ascii_lowercase();
        let suffix = unique.trim_start_matches("t_");
        // The unique part first: names are cut at 63 bytes.
        let schema: String = format!("{suffix}_{test}").chars().take(60).collect();
        sqlx::raw_sql(&format!("CREATE SCHEMA \"{schema}\""))
            .execute(&admin)
            .await?;
        let options = PgConnectOptions::from_str(&url)
            .map_err(|e| Error::msg(e.to_string()))?
            .options([("search_path", schema.as_str())]);
        let pool = PgPoolOptions::new()
            .max_connections(6)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        Ok(Some(Pg {
            dir: tempfile::tempdir()?,
            admin,
            pool,
            schema,
        }))
    }

    forward_to_connector!(postgres);

    async fn exists(&self, table: &str) -> Result<bool> {
        let found: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
            .bind(format!("\"{}\".\"{table}\"", self.schema))
            .fetch_one(&self.pool)
            .await?;
        Ok(found.is_some())
    }

    async fn columns(&self, table: &str) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT column_name::text FROM information_schema.columns \
             WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position",
        )
        .bind(&self.schema)
        .bind(table)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn finish(self) -> Result<()> {
        self.pool.close().await;
        sqlx::raw_sql(&format!("DROP SCHEMA \"{}\" CASCADE", self.schema))
            .execute(&self.admin)
            .await?;
        let registry: bool =
            sqlx::query_scalar("SELECT to_regclass('weir.table_owner') IS NOT NULL")
                .fetch_one(&self.admin)
                .await?;
        if registry {
            sqlx::query("DELETE FROM weir.table_owner WHERE split_part(table_name, '.', 1) = $1")
                .bind(&self.schema)
                .execute(&self.admin)
                .await?;
        }
        Ok(())
    }
}

/// Rows of `width` columns, each read as optional text.
fn read_texts<R: sqlx::Row>(rows: Vec<R>, width: usize) -> Result<Vec<TextRow>>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    rows.iter()
        .map(|row| {
            (0..width)
                .map(|i| row.try_get::<Option<String>, _>(i).map_err(Error::from))
                .collect()
        })
        .collect()
}

/// Text rows from literals, for comparisons.
pub fn texts(rows: &[&[Option<&str>]]) -> Vec<TextRow> {
    rows.iter()
        .map(|row| row.iter().map(|v| v.map(str::to_string)).collect())
        .collect()
}
