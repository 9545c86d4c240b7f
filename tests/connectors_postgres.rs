//! The PostgreSQL target against a real server: its types, COPY of new
//! rows, concurrent calls and what only PostgreSQL does. What both SQL
//! dialects do is tested once for both in `sql_tables.rs`.
//!
//! The server is `WEIR_TEST_POSTGRES_URL`, else
//! `postgres://postgres@127.0.0.1:5432/test`, else
//! `postgres://root@127.0.0.1:5432/test`. When none answers, each test prints
//! `SKIPPED` and passes, except under `CI=true`, where it fails. Every test
//! uses tables of its own (test name + a unique suffix), so tests run in
//! parallel, and drops them at the end.

mod keys;
mod pg;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use sqlx::{PgPool, Row as _};
use weir::connectors::postgres::{
    mount_table_target, mount_table_target_with, previewed_table, PreviewedTable, TableOptions,
    TableTarget,
};
use weir::connectors::sql::{ColumnType, TableSchema};
use weir::prelude::*;
use weir::statediff::ManagedBy;

use keys::{KeyCase, KeyedRow};

// ---------------------------------------------------------------------------
// Support
// ---------------------------------------------------------------------------

fn db() -> ContextKey<PgPool> {
    ContextKey::new("pg")
}

/// A pool on the test server, or `None` (after a loud message) when there
/// is none and `CI` is not `true`.
async fn server() -> Result<Option<PgPool>> {
    Ok(pg::server(8)
        .await
        .map_err(Error::msg)?
        .map(|(_, pool)| pool))
}

/// A table name unique to this test and this process.
use pg::unique;

/// One test's app, ledger and tables (dropped by `finish`).
struct Rig {
    pool: PgPool,
    app: App,
    _dir: tempfile::TempDir,
    tables: Vec<String>,
}

impl Rig {
    async fn new(pool: PgPool, tables: &[&str]) -> Result<Rig> {
        Self::with_batch(pool, tables, BatchPolicy::default()).await
    }

    async fn with_batch(pool: PgPool, tables: &[&str], batch: BatchPolicy) -> Result<Rig> {
        let dir = tempfile::tempdir()?;
        let app = App::builder("pg-test")
            .ledger_path(dir.path().join("ledger"))
            .provide_key(&db(), pool.clone())
            .batch_policy(batch)
            .build()
            .await?;
        Ok(Rig {
            pool,
            app,
            _dir: dir,
            tables: tables.iter().map(|t| t.to_string()).collect(),
        })
    }

    async fn run<F, Fut>(&self, f: F) -> Result<UpdateStats>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        tokio::time::timeout(Duration::from_secs(60), self.app.run(f))
            .await
            .map_err(|_| Error::msg("run timed out"))?
    }

    async fn exec(&self, sql: &str) -> Result<()> {
        sqlx::raw_sql(sql).execute(&self.pool).await?;
        Ok(())
    }

    /// `id -> body` of a table with text columns `id` and `body`.
    async fn bodies(&self, table: &str) -> Result<BTreeMap<String, Option<String>>> {
        let rows = sqlx::query(&format!("SELECT id, body FROM \"{table}\" ORDER BY id"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("id")?, r.try_get("body")?)))
            .collect()
    }

    /// `id -> xmin` (the transaction that last wrote each row).
    async fn xmins(&self, table: &str) -> Result<BTreeMap<String, String>> {
        let rows = sqlx::query(&format!("SELECT id, xmin::text AS x FROM \"{table}\""))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("id")?, r.try_get("x")?)))
            .collect()
    }

    async fn exists(&self, table: &str) -> Result<bool> {
        let found: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
            .bind(format!("public.\"{table}\""))
            .fetch_one(&self.pool)
            .await?;
        Ok(found.is_some())
    }

    async fn columns(&self, table: &str) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT column_name::text FROM information_schema.columns WHERE table_name = $1 ORDER BY ordinal_position",
        )
        .bind(table)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn finish(self) -> Result<()> {
        for t in &self.tables {
            self.exec(&format!("DROP TABLE IF EXISTS \"{t}\" CASCADE"))
                .await?;
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Serialize)]
struct Doc {
    id: String,
    body: Option<String>,
}

fn doc(id: &str, body: &str) -> Doc {
    Doc {
        id: id.into(),
        body: Some(body.into()),
    }
}

fn docs_schema() -> Result<TableSchema> {
    TableSchema::builder()
        .column("id", ColumnType::Text)
        .nullable_column("body", ColumnType::Text)
        .primary_key(["id"])
        .build()
}

fn expected(rows: &[(&str, &str)]) -> BTreeMap<String, Option<String>> {
    rows.iter()
        .map(|(k, v)| (k.to_string(), Some(v.to_string())))
        .collect()
}

/// Runs one component that mounts `table` with `schema` and declares `rows`.
async fn sync_docs(
    rig: &Rig,
    table: &str,
    schema: TableSchema,
    rows: Vec<Doc>,
) -> Result<UpdateStats> {
    let table = table.to_string();
    rig.run(move |ctx| async move {
        let t = mount_table_target(&ctx, &db(), &table, schema).await?;
        for row in &rows {
            t.declare_row(&ctx, row)?;
        }
        Ok(())
    })
    .await
}

macro_rules! server_or_skip {
    () => {
        match server().await? {
            Some(pool) => pool,
            None => return Ok(()),
        }
    };
}

// ---------------------------------------------------------------------------
// Rows
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn two_apps_with_one_key_name_and_pools_on_different_databases_each_write_through_their_own(
) -> Result<()> {
    let Some((url, pool)) = pg::server(4).await.map_err(Error::msg)? else {
        return Ok(());
    };
    let (base, _) = url
        .rsplit_once('/')
        .ok_or_else(|| Error::msg("a server URL without a database"))?;
    let other = sqlx::PgPool::connect(&format!("{base}/postgres")).await?;
    let t = unique("two_apps");
    let (a, b) = (Rig::new(pool, &[&t]).await?, Rig::new(other, &[&t]).await?);

    // Interleaved: both apps live, each with its key `pg`.
    sync_docs(&a, &t, docs_schema()?, vec![doc("1", "a")]).await?;
    sync_docs(&b, &t, docs_schema()?, vec![doc("2", "b")]).await?;
    sync_docs(&a, &t, docs_schema()?, vec![doc("1", "a"), doc("3", "c")]).await?;

    assert_eq!(a.bodies(&t).await?, expected(&[("1", "a"), ("3", "c")]));
    assert_eq!(b.bodies(&t).await?, expected(&[("2", "b")]));
    a.finish().await?;
    b.finish().await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_preview_tells_the_table_and_the_row_actions_of_each_table_apart() -> Result<()> {
    let pool = server_or_skip!();
    let t = unique("preview");
    let rig = Rig::new(pool, &[&t]).await?;
    let table = t.clone();
    let actions = rig
        .app
        .preview(move |ctx| async move {
            let docs = mount_table_target(&ctx, &db(), &table, docs_schema()?).await?;
            docs.declare_row(&ctx, doc("1", "a"))?;
            Ok(())
        })
        .await?;
    let mut seen: Vec<_> = actions
        .iter()
        .map(|a| (previewed_table(&db(), &[&t], a), a.kind))
        .collect();
    seen.sort_by_key(|(table, _)| format!("{table:?}"));
    assert_eq!(
        seen,
        vec![
            (Some(PreviewedTable::Row(t.clone())), ActionKind::Create),
            (Some(PreviewedTable::Table(t.clone())), ActionKind::Create),
        ]
    );
    assert!(!rig.exists(&t).await?, "a preview creates no table");
    assert!(actions.iter().all(|a| previewed_table(&db(), &["other"], a)
        .is_none_or(|p| matches!(p, PreviewedTable::Table(_)))));
    rig.finish().await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unchanged_run_writes_no_row() -> Result<()> {
    let pool = server_or_skip!();
    let t = unique("nochange");
    let rig = Rig::new(pool, &[&t]).await?;
    let rows: Vec<Doc> = (0..50).map(|i| doc(&format!("k{i:02}"), "v")).collect();

    sync_docs(&rig, &t, docs_schema()?, rows.clone()).await?;
    let before = rig.xmins(&t).await?;
    let stats = sync_docs(&rig, &t, docs_schema()?, rows.clone()).await?;
    assert_eq!(rig.xmins(&t).await?, before, "rows were rewritten");
    assert_eq!((stats.created, stats.deleted), (0, 0), "{stats:?}");
    assert!(stats.unchanged >= 50, "{stats:?}");

    // One changed row is the only one written.
    let mut changed = rows;
    changed[7].body = Some("new".into());
    sync_docs(&rig, &t, docs_schema()?, changed).await?;
    let after = rig.xmins(&t).await?;
    let rewritten: Vec<&String> = after
        .iter()
        .filter(|(k, x)| before.get(*k) != Some(*x))
        .map(|(k, _)| k)
        .collect();
    assert_eq!(rewritten, vec!["k07"]);
    rig.finish().await
}

// ---------------------------------------------------------------------------
// Types and values
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, Serialize)]
struct AllTypes {
    id: i64,
    t: String,
    s: i16,
    i: i32,
    b: i64,
    r: f32,
    d: f64,
    flag: bool,
    #[serde(with = "serde_bytes_compat")]
    raw: Vec<u8>,
    meta: BTreeMap<String, serde_json::Value>,
    at: String,
    u: String,
    tags: Vec<String>,
    nums: Vec<Option<i64>>,
    none: Option<String>,
}

/// Serializes a `Vec<u8>` as a byte string (what `serde_bytes` does).
mod serde_bytes_compat {
    pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }
}

fn all_types_schema() -> Result<TableSchema> {
    TableSchema::builder()
        .column("id", ColumnType::BigInt)
        .column("t", ColumnType::Text)
        .column("s", ColumnType::SmallInt)
        .column("i", ColumnType::Integer)
        .column("b", ColumnType::BigInt)
        .column("r", ColumnType::Real)
        .column("d", ColumnType::Double)
        .column("flag", ColumnType::Boolean)
        .column("raw", ColumnType::Bytes)
        .column("meta", ColumnType::Json)
        .column("at", ColumnType::Timestamp)
        .column("u", ColumnType::Uuid)
        .column("tags", ColumnType::Array(Box::new(ColumnType::Text)))
        .column("nums", ColumnType::Array(Box::new(ColumnType::BigInt)))
        .nullable_column("none", ColumnType::Text)
        .primary_key(["id"])
        .build()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_column_type_round_trips() -> Result<()> {
    let pool = server_or_skip!();
    let t = unique("types");
    let rig = Rig::new(pool, &[&t]).await?;
    let u = "67e55044-10b1-426f-9247-bb680e5fe0c8";
    let row = AllTypes {
        id: 1,
        t: "héllo \"quoted\" \\ 'x'".into(),
        s: -32768,
        i: 2_147_483_647,
        b: i64::MIN,
        r: 1.5,
        d: 1e-300,
        flag: true,
        raw: vec![0, 1, 254, 255],
        meta: BTreeMap::from([
            (
                "nested".to_string(),
                serde_json::json!({"a": [1, 2.5, null]}),
            ),
            ("s".to_string(), serde_json::json!("text")),
        ]),
        at: "2024-05-06T07:08:09.123456Z".into(),
        u: u.into(),
        tags: vec![
            "a,b".into(),
            "{c}".into(),
            "NULL".into(),
            "\"q\"".into(),
            String::new(),
        ],
        nums: vec![Some(1), None, Some(-3)],
        none: None,
    };
    let table = t.clone();
    let declared = row.clone();
    rig.run(move |ctx| async move {
        let target = mount_table_target(&ctx, &db(), &table, all_types_schema()?).await?;
        target.declare_row(&ctx, &declared)?;
        target.declare_row(
            &ctx,
            &AllTypes {
                id: 2,
                tags: vec![],
                nums: vec![],
                ..declared.clone()
            },
        )
    })
    .await?;

    let r = sqlx::query(&format!("SELECT * FROM \"{t}\" WHERE id = 1"))
        .fetch_one(&rig.pool)
        .await?;
    assert_eq!(r.try_get::<String, _>("t")?, row.t);
    assert_eq!(r.try_get::<i16, _>("s")?, row.s);
    assert_eq!(r.try_get::<i32, _>("i")?, row.i);
    assert_eq!(r.try_get::<i64, _>("b")?, row.b);
    assert_eq!(r.try_get::<f32, _>("r")?, row.r);
    assert_eq!(r.try_get::<f64, _>("d")?, row.d);
    assert!(r.try_get::<bool, _>("flag")?);
    assert_eq!(r.try_get::<Vec<u8>, _>("raw")?, row.raw);
    assert_eq!(
        r.try_get::<serde_json::Value, _>("meta")?,
        serde_json::json!({"nested": {"a": [1, 2.5, null]}, "s": "text"})
    );
    let at: chrono::DateTime<chrono::Utc> = r.try_get("at")?;
    assert_eq!(
        at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        row.at
    );
    assert_eq!(r.try_get::<uuid::Uuid, _>("u")?.to_string(), u);
    assert_eq!(r.try_get::<Vec<String>, _>("tags")?, row.tags);
    assert_eq!(r.try_get::<Vec<Option<i64>>, _>("nums")?, row.nums);
    assert_eq!(r.try_get::<Option<String>, _>("none")?, None);
    let empty = sqlx::query(&format!("SELECT tags, nums FROM \"{t}\" WHERE id = 2"))
        .fetch_one(&rig.pool)
        .await?;
    assert!(empty.try_get::<Vec<String>, _>("tags")?.is_empty());
    assert!(empty.try_get::<Vec<Option<i64>>, _>("nums")?.is_empty());

    // Unchanged values of every type are recognized as unchanged.
    let before: String =
        sqlx::query_scalar(&format!("SELECT xmin::text FROM \"{t}\" WHERE id = 1"))
            .fetch_one(&rig.pool)
            .await?;
    let table = t.clone();
    let again = row.clone();
    rig.run(move |ctx| async move {
        let target = mount_table_target(&ctx, &db(), &table, all_types_schema()?).await?;
        target.declare_row(&ctx, &again)?;
        target.declare_row(
            &ctx,
            &AllTypes {
                id: 2,
                tags: vec![],
                nums: vec![],
                ..again.clone()
            },
        )
    })
    .await?;
    let after: String = sqlx::query_scalar(&format!("SELECT xmin::text FROM \"{t}\" WHERE id = 1"))
        .fetch_one(&rig.pool)
        .await?;
    assert_eq!(before, after);
    rig.finish().await
}

/// Every column type with a binary COPY form (arrays have none).
#[derive(Clone, Debug, Serialize)]
struct Scalars {
    id: i64,
    t: String,
    s: i16,
    i: i32,
    r: f32,
    d: f64,
    flag: bool,
    #[serde(with = "serde_bytes_compat")]
    raw: Vec<u8>,
    meta: serde_json::Value,
    at: String,
    u: String,
    none: Option<String>,
}

fn scalars_schema() -> Result<TableSchema> {
    TableSchema::builder()
        .column("id", ColumnType::BigInt)
        .column("t", ColumnType::Text)
        .column("s", ColumnType::SmallInt)
        .column("i", ColumnType::Integer)
        .column("r", ColumnType::Real)
        .column("d", ColumnType::Double)
        .column("flag", ColumnType::Boolean)
        .column("raw", ColumnType::Bytes)
        .column("meta", ColumnType::Json)
        .column("at", ColumnType::Timestamp)
        .column("u", ColumnType::Uuid)
        .nullable_column("none", ColumnType::Text)
        .primary_key(["id"])
        .build()
}

/// Rows with the values a text or binary encoding gets wrong first.
fn awkward_scalars() -> Vec<Scalars> {
    let row = |id: i64, t: &str, d: f64, r: f32, at: &str, none: Option<&str>| Scalars {
        id,
        t: t.into(),
        s: i16::try_from(id % 3).unwrap_or_default() * 16_383,
        i: i32::MIN + i32::try_from(id).unwrap_or_default(),
        r,
        d,
        flag: id % 2 == 0,
        raw: (0..=255u8)
            .rev()
            .take(usize::try_from(id).unwrap_or(0) * 40)
            .collect(),
        meta: serde_json::json!({"é": [1, 2.5, null, "tab\there", {"q": "\"\\"}], "n": id}),
        at: at.into(),
        u: format!("67e55044-10b1-426f-9247-bb680e5fe0c{id}"),
        none: none.map(Into::into),
    };
    vec![
        row(
            1,
            "tab\tnew\nline\r\\back",
            -0.0,
            0.1,
            "1999-12-31T23:59:59.9999995Z",
            None,
        ),
        row(
            2,
            "",
            1e-300,
            -3.4e38,
            "2026-11-30T12:00:00.000001Z",
            Some("x"),
        ),
        row(
            3,
            "héllo \"q\" 'x' \\N",
            f64::MAX,
            f32::MIN_POSITIVE,
            "1970-01-01T00:00:00Z",
            Some(""),
        ),
        row(4, "\\.", 2.5, 1.0, "2000-01-01T00:00:00.0000004Z", None),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_new_to_weir_are_copied_in_and_land_exactly_as_upserted_rows() -> Result<()> {
    let pool = server_or_skip!();
    let (copied, upserted, user) = (unique("copied"), unique("upserted"), unique("usercopy"));
    let log = unique("copylog");
    let rig = Rig::new(pool, &[&copied, &upserted, &user, &log]).await?;
    let columns = "id bigint PRIMARY KEY, t text NOT NULL, s smallint NOT NULL, \
                   i integer NOT NULL, r real NOT NULL, d double precision NOT NULL, \
                   flag boolean NOT NULL, raw bytea NOT NULL, meta jsonb NOT NULL, \
                   at timestamptz NOT NULL, u uuid NOT NULL, none text";
    rig.exec(&format!("CREATE TABLE \"{user}\" ({columns})"))
        .await?;
    let tables = [
        (copied.clone(), ManagedBy::System),
        (upserted.clone(), ManagedBy::System),
        (user.clone(), ManagedBy::User),
    ];
    let sync = |rows: Vec<Scalars>| {
        let tables = tables.clone();
        rig.run(move |ctx| async move {
            for (table, managed_by) in &tables {
                let options = TableOptions::default().managed_by(*managed_by);
                let target =
                    mount_table_target_with(&ctx, &db(), table, scalars_schema()?, options).await?;
                for row in &rows {
                    target.declare_row(&ctx, row)?;
                }
            }
            Ok(())
        })
    };
    // weir creates its two tables; then each inserted row records the
    // statement that inserted it, and the second table gets the rows'
    // keys behind weir's back.
    sync(Vec::new()).await?;
    let mut setup = format!(
        "CREATE TABLE \"{log}\" (tbl text, q text); \
         CREATE FUNCTION \"{log}_f\"() RETURNS trigger LANGUAGE plpgsql AS \
           $$ BEGIN INSERT INTO \"{log}\" VALUES (TG_TABLE_NAME, current_query()); RETURN NEW; END $$; \
         INSERT INTO \"{upserted}\" (id, t, s, i, r, d, flag, raw, meta, at, u) \
           SELECT g, 'old', 0, 0, 0, 0, false, '', '{{}}', now(), gen_random_uuid() \
           FROM generate_series(1, 4) g;"
    );
    for table in [&copied, &upserted, &user] {
        setup.push_str(&format!(
            " CREATE TRIGGER log BEFORE INSERT ON \"{table}\" \
              FOR EACH ROW EXECUTE FUNCTION \"{log}_f\"();"
        ));
    }
    rig.exec(&setup).await?;
    // Every row is new to weir. The first table has none of them and takes
    // the copy; the second has them all already, so its copy fails and its
    // rows are upserted; the user's table is always upserted.
    sync(awkward_scalars()).await?;
    let statements = |table: &str| {
        let sql = format!("SELECT split_part(q, ' ', 1) FROM \"{log}\" WHERE tbl = $1");
        let (table, pool) = (table.to_string(), rig.pool.clone());
        async move {
            sqlx::query_scalar::<_, String>(&sql)
                .bind(table)
                .fetch_all(&pool)
                .await
        }
    };
    assert_eq!(statements(&copied).await?, vec!["COPY"; 4]);
    assert_eq!(statements(&upserted).await?, vec!["INSERT"; 4]);
    assert_eq!(statements(&user).await?, vec!["INSERT"; 4]);
    // Compared as text, where -0 and 0 differ.
    for other in [&upserted, &user] {
        let differing: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM ((SELECT x::text FROM \"{copied}\" x EXCEPT SELECT y::text FROM \"{other}\" y) \
             UNION ALL (SELECT y::text FROM \"{other}\" y EXCEPT SELECT x::text FROM \"{copied}\" x)) d"
        ))
        .fetch_one(&rig.pool)
        .await?;
        assert_eq!(
            differing, 0,
            "copied rows differ from the rows upserted into {other}"
        );
    }
    let d: String = sqlx::query_scalar(&format!("SELECT d::text FROM \"{copied}\" WHERE id = 1"))
        .fetch_one(&rig.pool)
        .await?;
    assert_eq!(d, "-0");
    rig.exec(&format!("DROP FUNCTION \"{log}_f\"() CASCADE"))
        .await?;
    rig.finish().await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_adopted_table_without_a_unique_key_gets_no_second_row() -> Result<()> {
    let pool = server_or_skip!();
    let t = unique("adopted");
    let rig = Rig::new(pool, &[&t]).await?;
    // A table weir will manage, there before it, with no key at all.
    rig.exec(&format!(
        "CREATE TABLE \"{t}\" (id text NOT NULL, body text); \
         INSERT INTO \"{t}\" VALUES ('a', 'theirs')"
    ))
    .await?;
    let result = sync_docs(&rig, &t, docs_schema()?, vec![doc("a", "ours")]).await;
    // The upsert cannot run without a unique key, and nothing is copied
    // in past it.
    assert!(result.is_err(), "{result:?}");
    let rows: Vec<(String, Option<String>)> =
        sqlx::query_as(&format!("SELECT id, body FROM \"{t}\""))
            .fetch_all(&rig.pool)
            .await?;
    assert_eq!(rows, vec![("a".to_string(), Some("theirs".to_string()))]);
    rig.finish().await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_row_can_take_a_unique_value_an_updated_row_gives_up() -> Result<()> {
    let pool = server_or_skip!();
    let t = unique("swap");
    let rig = Rig::new(pool, &[&t]).await?;
    sync_docs(&rig, &t, docs_schema()?, vec![doc("1", "x")]).await?;
    rig.exec(&format!(
        "CREATE UNIQUE INDEX \"{t}_body\" ON \"{t}\" (body)"
    ))
    .await?;
    // Row 1 gives up "x" and new row 2 takes it, in one call: the copy of
    // row 2 fails, and the rows are upserted in the order they came.
    sync_docs(&rig, &t, docs_schema()?, vec![doc("1", "y"), doc("2", "x")]).await?;
    assert_eq!(rig.bodies(&t).await?, expected(&[("1", "y"), ("2", "x")]));
    rig.finish().await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_copy_cancelled_by_the_call_timeout_leaves_no_broken_connection_behind() -> Result<()> {
    // One connection, so that a call after the cancelled one would get the
    // same connection back if it were returned to the pool.
    let Some((_, pool)) = pg::server(1).await.map_err(Error::msg)? else {
        return Ok(());
    };
    let t = unique("cancelled");
    let dir = tempfile::tempdir()?;
    let app = App::builder("pg-test")
        .ledger_path(dir.path().join("ledger"))
        .provide_key(&db(), pool.clone())
        .retry_policy(RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(20),
            call_timeout: Some(Duration::from_millis(300)),
        })
        .build()
        .await?;
    let rig = Rig {
        pool,
        app,
        _dir: dir,
        tables: vec![t.clone()],
    };
    sync_docs(&rig, &t, docs_schema()?, Vec::new()).await?;
    // The first row ever inserted makes the copy wait a second, well past
    // the timeout (a sequence, which no rollback resets, says which is first).
    rig.exec(&format!(
        "CREATE SEQUENCE \"{t}_seq\"; \
         CREATE FUNCTION \"{t}_f\"() RETURNS trigger LANGUAGE plpgsql AS \
           $$ BEGIN IF nextval('\"{t}_seq\"') = 1 THEN PERFORM pg_sleep(1); END IF; RETURN NEW; END $$; \
         CREATE TRIGGER slow BEFORE INSERT ON \"{t}\" FOR EACH ROW EXECUTE FUNCTION \"{t}_f\"();"
    ))
    .await?;
    sync_docs(&rig, &t, docs_schema()?, vec![doc("a", "1"), doc("b", "2")]).await?;
    assert_eq!(rig.bodies(&t).await?, expected(&[("a", "1"), ("b", "2")]));
    // The pool's connection still answers each query with its own result.
    let n: i64 = sqlx::query_scalar("SELECT 42::bigint")
        .fetch_one(&rig.pool)
        .await?;
    assert_eq!(n, 42);
    rig.exec(&format!(
        "DROP FUNCTION \"{t}_f\"() CASCADE; DROP SEQUENCE \"{t}_seq\""
    ))
    .await?;
    rig.finish().await
}

#[tokio::test(flavor = "multi_thread")]
async fn injection_attempts_in_table_and_column_names_are_rejected() -> Result<()> {
    let pool = server_or_skip!();
    let victim = unique("victim");
    let rig = Rig::new(pool, &[&victim]).await?;
    rig.exec(&format!("CREATE TABLE \"{victim}\" (id text)"))
        .await?;
    let evil = format!("x\"; DROP TABLE \"{victim}\"; --");
    let result = rig
        .run(move |ctx| async move {
            mount_table_target(&ctx, &db(), &evil, docs_schema()?).await?;
            Ok(())
        })
        .await;
    let text = result.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(text.contains("invalid table name"), "{text}");
    let bad_column = TableSchema::builder()
        .column("id) ; DROP TABLE x; --", ColumnType::Text)
        .primary_key(["id) ; DROP TABLE x; --"])
        .build();
    assert!(bad_column.is_err());
    assert!(rig.exists(&victim).await?);
    rig.finish().await
}

// ---------------------------------------------------------------------------
// Schema changes and table lifecycle
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn a_nullable_column_is_added_in_place_and_the_rows_keep_their_data() -> Result<()> {
    let pool = server_or_skip!();
    let t = unique("addcol");
    let rig = Rig::new(pool, &[&t]).await?;
    sync_docs(&rig, &t, docs_schema()?, vec![doc("1", "a"), doc("2", "b")]).await?;
    // A row weir does not manage survives: the table is altered, not rebuilt.
    rig.exec(&format!(
        "INSERT INTO \"{t}\" (id, body) VALUES ('foreign', 'f')"
    ))
    .await?;

    let wider = TableSchema::builder()
        .column("id", ColumnType::Text)
        .nullable_column("body", ColumnType::Text)
        .nullable_column("extra", ColumnType::BigInt)
        .primary_key(["id"])
        .build()?;
    let table = t.clone();
    let stats = rig
        .run(move |ctx| async move {
            let target = mount_table_target(&ctx, &db(), &table, wider).await?;
            target.declare_row(&ctx, doc("1", "a"))?;
            let mut row = BTreeMap::new();
            row.insert("id", serde_json::json!("2"));
            row.insert("body", serde_json::json!("b"));
            row.insert("extra", serde_json::json!(42));
            target.declare_row(&ctx, &row)
        })
        .await?;
    // Row 1 is unchanged (its new column is NULL): not written again.
    assert_eq!(
        (stats.updated, stats.unchanged),
        (2, 1),
        "the table and row 2 updated: {stats:?}"
    );
    assert_eq!(rig.columns(&t).await?, vec!["id", "body", "extra"]);
    assert_eq!(
        rig.bodies(&t).await?,
        expected(&[("1", "a"), ("2", "b"), ("foreign", "f")])
    );
    let extra: Option<i64> =
        sqlx::query_scalar(&format!("SELECT extra FROM \"{t}\" WHERE id = '2'"))
            .fetch_one(&rig.pool)
            .await?;
    assert_eq!(extra, Some(42));
    rig.finish().await
}

// ---------------------------------------------------------------------------
// Several tables, foreign keys, constraints
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn several_tables_of_one_database_are_kept_in_sync_together() -> Result<()> {
    let pool = server_or_skip!();
    let tables: Vec<String> = (0..3).map(|i| unique(&format!("multi{i}"))).collect();
    let refs: Vec<&str> = tables.iter().map(String::as_str).collect();
    let rig = Rig::new(pool, &refs).await?;
    for round in 0..2 {
        let names = tables.clone();
        rig.run(move |ctx| async move {
            for (i, name) in names.iter().enumerate() {
                let target = mount_table_target(&ctx, &db(), name, docs_schema()?).await?;
                for j in 0..(i + round + 1) {
                    target.declare_row(&ctx, doc(&format!("{j}"), &format!("{name}/{round}")))?;
                }
            }
            Ok(())
        })
        .await?;
        for (i, name) in tables.iter().enumerate() {
            let want: BTreeMap<String, Option<String>> = (0..(i + round + 1))
                .map(|j| (j.to_string(), Some(format!("{name}/{round}"))))
                .collect();
            assert_eq!(rig.bodies(name).await?, want);
        }
    }
    rig.finish().await
}

#[derive(Clone, Debug, Serialize)]
struct Child {
    id: String,
    parent: String,
}

fn child_schema() -> Result<TableSchema> {
    TableSchema::builder()
        .column("id", ColumnType::Text)
        .column("parent", ColumnType::Text)
        .primary_key(["id"])
        .build()
}

/// Mounts `parent` and `child` tables (the child sorts first by name) and
/// declares `parents` and `children` in one component.
async fn sync_family(
    rig: &Rig,
    (parent, child): (&str, &str),
    parents: &[&str],
    children: &[(&str, &str)],
    depends: bool,
) -> Result<UpdateStats> {
    let (parent, child) = (parent.to_string(), child.to_string());
    let parents: Vec<Doc> = parents.iter().map(|p| doc(p, "p")).collect();
    let children: Vec<Child> = children
        .iter()
        .map(|(c, p)| Child {
            id: c.to_string(),
            parent: p.to_string(),
        })
        .collect();
    rig.run(move |ctx| async move {
        let p = mount_table_target(&ctx, &db(), &parent, docs_schema()?).await?;
        let c: TableTarget = mount_table_target(&ctx, &db(), &child, child_schema()?).await?;
        let c = if depends { c.depends_on(&p) } else { c };
        for row in &children {
            c.declare_row(&ctx, row)?;
        }
        for row in &parents {
            p.declare_row(&ctx, row)?;
        }
        Ok(())
    })
    .await
}

const FAMILIES: i64 = 1500;

#[tokio::test(flavor = "multi_thread")]
async fn parents_written_by_earlier_calls_are_committed_before_calls_that_write_their_children(
) -> Result<()> {
    let pool = server_or_skip!();
    let suffix = unique("fkcalls");
    let (parent, child) = (format!("b_parent_{suffix}"), format!("a_child_{suffix}"));
    // Parents and their children go in different sink calls, large enough
    // to take a while, and the row sink could run calls at once.
    let batch = BatchPolicy {
        max_actions: 999,
        linger: Duration::from_millis(1),
    };
    let rig = Rig::with_batch(pool, &[&child, &parent], batch).await?;
    let names = (parent.as_str(), child.as_str());
    sync_family(&rig, names, &["p0"], &[("c0", "p0")], true).await?;
    rig.exec(&format!(
        "ALTER TABLE \"{child}\" ADD CONSTRAINT \"{child}_fk\" FOREIGN KEY (parent) REFERENCES \"{parent}\" (id)"
    ))
    .await?;

    // The race this guards against is timing-dependent: several rounds,
    // each with new families.
    for round in 1..=4 {
        let (p, c) = (parent.clone(), child.clone());
        rig.run(move |ctx| async move {
            let parents = mount_table_target(&ctx, &db(), &p, docs_schema()?).await?;
            let children = mount_table_target(&ctx, &db(), &c, child_schema()?)
                .await?
                .depends_on(&parents);
            // The parents, then their children (those of earlier rounds
            // again, unchanged): the second call ends with the last new
            // parents and the first new children, and the third holds only
            // children, about half of them children of the second call's
            // parents.
            let families = || (1..=round).flat_map(|r| (0..FAMILIES).map(move |i| (r, i)));
            for (r, i) in families() {
                parents.declare_row(&ctx, doc(&format!("p{r}_{i}"), "p"))?;
            }
            for (r, i) in families() {
                children.declare_row(
                    &ctx,
                    &Child {
                        id: format!("c{r}_{i}"),
                        parent: format!("p{r}_{i}"),
                    },
                )?;
            }
            Ok(())
        })
        .await?;
    }
    let kids: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM \"{child}\""))
        .fetch_one(&rig.pool)
        .await?;
    assert_eq!(kids, 4 * FAMILIES);
    rig.finish().await
}

// ---------------------------------------------------------------------------
// Keys of every type
// ---------------------------------------------------------------------------

/// Each row of `table` (a key case's) by its `v`: its key as a row
/// literal and the transaction that last wrote it, in `v` order.
async fn keyed_rows(
    rig: &Rig,
    table: &str,
    case: &KeyCase,
) -> Result<Vec<(String, String, String)>> {
    let key: Vec<String> = (0..case.types.len()).map(|i| format!("k{i}")).collect();
    let sql = format!(
        "SELECT v, ROW({})::text, xmin::text FROM \"{table}\" ORDER BY v COLLATE \"C\"",
        key.join(", ")
    );
    Ok(sqlx::query_as(&sql).fetch_all(&rig.pool).await?)
}

async fn sync_keyed(
    rig: &Rig,
    table: &str,
    case: &KeyCase,
    rows: Vec<KeyedRow>,
) -> Result<UpdateStats> {
    let (table, schema) = (table.to_string(), case.schema()?);
    rig.run(move |ctx| async move {
        let t = mount_table_target(&ctx, &db(), &table, schema).await?;
        for row in &rows {
            t.declare_row(&ctx, row)?;
        }
        Ok(())
    })
    .await
}

fn vs(rows: &[(String, String, String)]) -> Vec<String> {
    rows.iter().map(|(v, _, _)| v.clone()).collect()
}

/// Declares the rows of `case`, then all of them again with other values
/// and their JSON members in another order (one update each, in place),
/// then every other one (the rest deleted, the kept ones untouched), then
/// none, checking the table itself after each run.
async fn check_key_case(pool: &PgPool, case: &KeyCase) -> Result<()> {
    let t = unique("keys");
    let rig = Rig::new(pool.clone(), &[&t]).await?;
    let result = check_key_case_in(&rig, &t, case).await;
    rig.finish().await?;
    result
}

async fn check_key_case_in(rig: &Rig, t: &str, case: &KeyCase) -> Result<()> {
    let n = case.keys.len() as u64;
    let all = |_| true;

    let stats = sync_keyed(rig, t, case, case.rows("first", false, all)).await?;
    let rows = keyed_rows(rig, t, case).await?;
    if stats.created != n + 1 || vs(&rows) != case.values("first", all) {
        return Err(Error::msg(format!(
            "the first run wrote {rows:?} ({stats:?})"
        )));
    }
    let first = rows;

    let stats = sync_keyed(rig, t, case, case.rows("second", true, all)).await?;
    let rows = keyed_rows(rig, t, case).await?;
    if (stats.created, stats.deleted) != (0, 0) || vs(&rows) != case.values("second", all) {
        return Err(Error::msg(format!(
            "updating every row (keys respelled) left {rows:?} ({stats:?})"
        )));
    }
    let same_keys = rows
        .iter()
        .zip(&first)
        .all(|((_, key, _), (_, key0, _))| key == key0);
    if !same_keys {
        return Err(Error::msg(format!(
            "updates changed the rows' keys: {first:?} became {rows:?}"
        )));
    }
    let updated = rows;

    let stats = sync_keyed(rig, t, case, case.rows("second", false, keys::kept)).await?;
    let rows = keyed_rows(rig, t, case).await?;
    let kept = case.values("second", keys::kept);
    let dropped = case.keys.len() - kept.len();
    let untouched: Vec<_> = updated
        .into_iter()
        .filter(|(v, _, _)| kept.contains(v))
        .collect();
    if stats.deleted != dropped as u64 || rows != untouched {
        return Err(Error::msg(format!(
            "deleting every other row left {rows:?}, not {untouched:?} ({stats:?})"
        )));
    }

    let stats = sync_keyed(rig, t, case, Vec::new()).await?;
    let rows = keyed_rows(rig, t, case).await?;
    if !rows.is_empty() {
        return Err(Error::msg(format!(
            "deleting every row left {rows:?} ({stats:?})"
        )));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_keyed_by_every_column_type_are_updated_in_place_and_deleted_when_no_longer_declared(
) -> Result<()> {
    let pool = server_or_skip!();
    let mut failures = Vec::new();
    for case in keys::cases() {
        if let Err(e) = check_key_case(&pool, &case).await {
            failures.push(format!("key {}: {e}", case.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_of_arrays_of_arrays_is_refused_naming_the_table_and_the_column() -> Result<()> {
    let pool = server_or_skip!();
    for case in keys::nested_array_cases() {
        let t = unique("nested");
        let rig = Rig::new(pool.clone(), &[&t]).await?;
        let result = sync_keyed(&rig, &t, &case, case.rows("first", false, |_| true)).await;
        let exists = rig.exists(&t).await?;
        rig.finish().await?;
        let text = match result {
            Ok(stats) => {
                return Err(Error::msg(format!(
                    "key {}: the table was accepted ({stats:?})",
                    case.name
                )))
            }
            Err(e) => e.to_string(),
        };
        assert!(
            text.contains(&format!(
                "table {t}, column k0: arrays of arrays are not supported"
            )),
            "key {}: {text}",
            case.name
        );
        assert!(!exists, "key {}: the table was created", case.name);
    }
    Ok(())
}
