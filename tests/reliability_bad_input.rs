//! A table of bad inputs. Each one fails with an error naming the culprit,
//! never panics or crashes, and leaves the other components (their rows
//! land) alone:
//!
//! | input | where | test |
//! | --- | --- | --- |
//! | SQL injection in table and column names | SQLite, PostgreSQL | `injection_attempts_in_*` |
//! | NaN, +/-infinity, NUL bytes in values | SQLite (all), PostgreSQL (NaN, NUL) | `nan_*` |
//! | a 100 MiB text value | SQLite | `a_100_mib_value_*` |
//! | JSON nested 100,000 levels deep | SQLite | `json_nested_*` |
//! | one key declared twice in a component | SQLite | `a_key_declared_twice_*` |
//! | a file name that is not UTF-8, a symlink loop, an unreadable file | the `weir` command | `the_command_*` |
//! | a truncated, overwritten, other-version or locked ledger | the `weir` command and `App` | `a_*_ledger_*` |
//!
//! PostgreSQL cases use the server at `WEIR_TEST_POSTGRES_URL`, else
//! `postgres://postgres@127.0.0.1:5432/test`; without one they print
//! `SKIPPED` and pass, except under `CI=true`, where they fail.

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cmd;
mod pg;
mod support;

use cmd::text;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::{PgPool, SqlitePool};
use support::{app_with, err_or, failed_paths};
use tempfile::TempDir;
use weir::connectors::sql::{ColumnType, TableSchema};
use weir::connectors::{postgres, sqlite};
use weir::prelude::*;

/// The longest one run may take before the test calls it hung.
const LIMIT: Duration = Duration::from_secs(120);

async fn bounded<T>(fut: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(LIMIT, fut)
        .await
        .map_err(|_| Error::msg(format!("no answer within {LIMIT:?}: the run hung")))?
}

// ---------------------------------------------------------------------------
// SQLite fixture and rows
// ---------------------------------------------------------------------------

fn db() -> ContextKey<SqlitePool> {
    ContextKey::new("db")
}

/// A temp dir holding a SQLite file and a ledger, the pool and an app.
struct Fixture {
    _dir: TempDir,
    pool: SqlitePool,
    app: App,
}

async fn fixture() -> Result<Fixture> {
    let dir = tempfile::tempdir()?;
    let pool = sqlite::connect(dir.path().join("test.db")).await?;
    let app = app_with(dir.path(), |b| b.provide_key(&db(), pool.clone())).await?;
    Ok(Fixture {
        _dir: dir,
        pool,
        app,
    })
}

/// A row of `docs`; `meta` is a JSON column.
#[derive(Clone, Debug, Default, Serialize)]
struct Item {
    id: String,
    body: Option<String>,
    score: Option<f64>,
    meta: Option<BTreeMap<String, f64>>,
}

fn item(id: &str) -> Item {
    Item {
        id: id.into(),
        body: Some(format!("body of {id}")),
        ..Item::default()
    }
}

fn docs_schema() -> Result<TableSchema> {
    TableSchema::builder()
        .column("id", ColumnType::Text)
        .nullable_column("body", ColumnType::Text)
        .nullable_column("score", ColumnType::Double)
        .nullable_column("meta", ColumnType::Json)
        .primary_key(["id"])
        .build()
}

/// Components by key, each declaring its items.
type Components = Vec<(String, Vec<Item>)>;

fn one_each(items: Vec<Item>) -> Components {
    items.into_iter().map(|i| (i.id.clone(), vec![i])).collect()
}

/// One run: the root mounts `docs`; each component declares its items.
async fn sync_sqlite(f: &Fixture, comps: Components) -> Result<UpdateStats> {
    bounded(f.app.run(move |ctx| async move {
        let table = sqlite::mount_table_target(&ctx, &db(), "docs", docs_schema()?).await?;
        ctx.mount_each(
            comps,
            |(k, _)| k.clone(),
            move |ctx, (_, items)| {
                let table = table.clone();
                async move {
                    for i in &items {
                        table.declare_row(&ctx, i)?;
                    }
                    Ok(())
                }
            },
        )
        .await
    }))
    .await
}

async fn ids(pool: &SqlitePool, table: &str) -> Result<Vec<String>> {
    Ok(
        sqlx::query_scalar(&format!("SELECT id FROM \"{table}\" ORDER BY id"))
            .fetch_all(pool)
            .await?,
    )
}

async fn sqlite_tables(pool: &SqlitePool) -> Result<Vec<String>> {
    Ok(
        sqlx::query_scalar("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
            .fetch_all(pool)
            .await?,
    )
}

/// The cause of the failure of component `/<key>`.
fn cause_of<'a>(err: &'a Error, key: &str) -> &'a str {
    let path = format!("/{key}");
    err.failed_components()
        .iter()
        .find(|f| f.path.to_string() == path)
        .map(|f| f.cause.as_str())
        .unwrap_or_else(|| panic!("{path} did not fail: {err}"))
}

/// A schema whose column `body` is renamed `column`, built without the
/// builder's checks (as a deserialized schema would be).
fn smuggled_schema(column: &str) -> Result<TableSchema> {
    let json = serde_json::to_string(&docs_schema()?).map_err(Error::msg)?;
    let bad = serde_json::to_string(column).map_err(Error::msg)?;
    serde_json::from_str(&json.replace("\"body\"", &bad)).map_err(Error::msg)
}

const EVIL_TABLE: &str = "docs\"; DROP TABLE x; --";
const EVIL_COLUMN: &str = "a\" text); --";

// ---------------------------------------------------------------------------
// Injection in identifiers
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injection_attempts_in_sqlite_table_and_column_names_fail_only_their_component_naming_the_identifier(
) -> Result<()> {
    let f = fixture().await?;
    sqlx::raw_sql("CREATE TABLE x (id TEXT PRIMARY KEY); INSERT INTO x VALUES ('kept');")
        .execute(&f.pool)
        .await?;
    let result = bounded(f.app.run(|ctx| async move {
        ctx.mount_each(
            ["good", "evil_table", "evil_column", "smuggled_column"],
            |k| k.to_string(),
            |ctx, case| async move {
                match case {
                    "evil_table" => {
                        sqlite::mount_table_target(&ctx, &db(), EVIL_TABLE, docs_schema()?).await?;
                    }
                    "evil_column" => {
                        TableSchema::builder()
                            .column("id", ColumnType::Text)
                            .column(EVIL_COLUMN, ColumnType::Text)
                            .primary_key(["id"])
                            .build()?;
                    }
                    "smuggled_column" => {
                        sqlite::mount_table_target(
                            &ctx,
                            &db(),
                            "evil",
                            smuggled_schema(EVIL_COLUMN)?,
                        )
                        .await?;
                    }
                    _ => {
                        let table =
                            sqlite::mount_table_target(&ctx, &db(), "docs", docs_schema()?).await?;
                        table.declare_row(&ctx, item("a"))?;
                        table.declare_row(&ctx, item("b"))?;
                    }
                }
                Ok(())
            },
        )
        .await
    }))
    .await;
    let err = err_or(result, |s| format!("injections were accepted: {s:?}"))?;
    assert_eq!(
        failed_paths(&err),
        vec!["/evil_column", "/evil_table", "/smuggled_column"],
        "{err}"
    );
    let table = cause_of(&err, "evil_table");
    assert!(
        table.contains("invalid table name") && table.contains(&format!("{EVIL_TABLE:?}")),
        "{table}"
    );
    for case in ["evil_column", "smuggled_column"] {
        let cause = cause_of(&err, case);
        assert!(
            cause.contains("invalid column name") && cause.contains(&format!("{EVIL_COLUMN:?}")),
            "{case}: {cause}"
        );
    }
    assert_eq!(sqlite_tables(&f.pool).await?, vec!["docs", "x"]);
    assert_eq!(ids(&f.pool, "x").await?, vec!["kept"]);
    assert_eq!(ids(&f.pool, "docs").await?, vec!["a", "b"]);
    Ok(())
}

// ---------------------------------------------------------------------------
// NaN, infinities, NUL bytes
// ---------------------------------------------------------------------------

/// The value cases: (component and row id, column named in the error, row).
fn value_cases() -> Vec<(&'static str, &'static str, Item)> {
    let with = |id: &str, f: &dyn Fn(&mut Item)| {
        let mut i = item(id);
        f(&mut i);
        i
    };
    vec![
        ("nan", "score", with("nan", &|i| i.score = Some(f64::NAN))),
        (
            "inf",
            "score",
            with("inf", &|i| i.score = Some(f64::INFINITY)),
        ),
        (
            "neginf",
            "score",
            with("neginf", &|i| i.score = Some(f64::NEG_INFINITY)),
        ),
        (
            "nul",
            "body",
            with("nul", &|i| i.body = Some("a\0b".into())),
        ),
        (
            "json_nan",
            "meta",
            with("json_nan", &|i| {
                i.meta = Some(BTreeMap::from([("x".to_string(), f64::NAN)]))
            }),
        ),
        (
            "json_inf",
            "meta",
            with("json_inf", &|i| {
                i.meta = Some(BTreeMap::from([("x".to_string(), f64::INFINITY)]))
            }),
        ),
        (
            "json_nul_key",
            "meta",
            with("json_nul_key", &|i| {
                i.meta = Some(BTreeMap::from([("a\0b".to_string(), 1.0)]))
            }),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nan_infinities_and_nul_bytes_fail_only_their_component_naming_table_column_and_key(
) -> Result<()> {
    let f = fixture().await?;
    let cases = value_cases();
    let mut items: Vec<Item> = cases.iter().map(|(_, _, i)| i.clone()).collect();
    items.push(item("good1"));
    items.push(item("good2"));
    let err = err_or(sync_sqlite(&f, one_each(items)).await, |s| {
        format!("bad values were accepted: {s:?}")
    })?;
    assert_eq!(err.failed_components().len(), cases.len(), "{err}");
    for (id, column, _) in &cases {
        let cause = cause_of(&err, id);
        assert!(
            cause.contains(&format!("table docs, column {column}"))
                && cause.contains(&format!("row key \"{id}\"")),
            "{id}: {cause}"
        );
        assert!(!cause.contains("panicked"), "{cause}");
    }
    assert!(cause_of(&err, "nul").contains("NUL"));
    assert!(
        err.failed_components().iter().all(|f| !f.retriable),
        "bad values are permanent failures: {err}"
    );
    assert_eq!(ids(&f.pool, "docs").await?, vec!["good1", "good2"]);
    Ok(())
}

// ---------------------------------------------------------------------------
// A 100 MiB value
// ---------------------------------------------------------------------------

/// The peak resident memory of this process so far, in MiB.
fn peak_rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}

fn rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}

#[derive(Serialize)]
struct Big<'a> {
    id: &'a str,
    body: &'a str,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_mib_value_lands_whole_without_disturbing_its_siblings() -> Result<()> {
    const SIZE: usize = 100 << 20;
    let f = fixture().await?;
    // Resets the peak (Linux); other tests of this binary run alongside,
    // so the figure is an upper bound.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = rss_mib();
    let started = Instant::now();
    let stats = bounded(f.app.run(|ctx| async move {
        let schema = TableSchema::builder()
            .column("id", ColumnType::Text)
            .column("body", ColumnType::Text)
            .primary_key(["id"])
            .build()?;
        let table = sqlite::mount_table_target(&ctx, &db(), "big", schema).await?;
        ctx.mount_each(
            ["huge", "small1", "small2"],
            |k| k.to_string(),
            move |ctx, id| {
                let table = table.clone();
                async move {
                    let body = if id == "huge" {
                        "x".repeat(SIZE)
                    } else {
                        format!("body of {id}")
                    };
                    table.declare_row(&ctx, &Big { id, body: &body })
                }
            },
        )
        .await
    }))
    .await?;
    let elapsed = started.elapsed();
    let peak = peak_rss_mib();
    eprintln!(
        "100 MiB value: {elapsed:?}; RSS before {before:?} MiB, peak {peak:?} MiB, after {:?} MiB",
        rss_mib()
    );
    assert_eq!(stats.created, 4, "{stats:?}");
    let lengths: Vec<(String, i64)> =
        sqlx::query_as("SELECT id, length(body) FROM big ORDER BY id")
            .fetch_all(&f.pool)
            .await?;
    assert_eq!(
        lengths,
        vec![
            ("huge".to_string(), SIZE as i64),
            ("small1".to_string(), 14),
            ("small2".to_string(), 14)
        ]
    );
    if let (Some(before), Some(peak)) = (before, peak) {
        // A handful of copies of the value at most (row conversion, the
        // engine's encoding, the statement's binding), never dozens.
        assert!(
            peak.saturating_sub(before) < 1_024,
            "converting and writing one 100 MiB value took {} MiB",
            peak - before
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Deeply nested JSON
// ---------------------------------------------------------------------------

/// `depth` arrays nested in one another (`[[[...]]]`), built in a loop:
/// recursion would overflow the stack long before 100,000 levels.
fn nested(depth: usize) -> serde_json::Value {
    let mut v = serde_json::Value::Array(Vec::new());
    for _ in 1..depth {
        v = serde_json::Value::Array(vec![v]);
    }
    v
}

/// Drops a value in a loop: serde_json's own drop recurses once per level
/// and overflows the stack on a deep value.
fn dismantle(v: serde_json::Value) {
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            serde_json::Value::Array(items) => stack.extend(items),
            serde_json::Value::Object(map) => stack.extend(map.into_iter().map(|(_, v)| v)),
            _ => {}
        }
    }
}

/// A row of `json_docs`: `doc` is a JSON column, `extra` is not a column.
#[derive(Serialize)]
struct JsonDoc {
    id: String,
    doc: Option<serde_json::Value>,
    extra: Option<serde_json::Value>,
}

/// JSON nested 100,000 levels deep is built as a `serde_json::Value` in a
/// loop, declared, and dismantled in a loop; the limit is 127 levels below
/// the row (`weir::connectors::sql::value::MAX_NESTING`, 128 with the row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_nested_100_000_levels_deep_fails_its_component_naming_the_column_without_overflowing_the_stack(
) -> Result<()> {
    let f = fixture().await?;
    let limit = weir::connectors::sql::value::MAX_NESTING - 1;
    let result = bounded(f.app.run(move |ctx| async move {
        let schema = TableSchema::builder()
            .column("id", ColumnType::Text)
            .nullable_column("doc", ColumnType::Json)
            .primary_key(["id"])
            .build()?;
        let table = sqlite::mount_table_target(&ctx, &db(), "json_docs", schema).await?;
        ctx.mount_each(
            [
                "deep",
                "deep_object",
                "at_the_limit",
                "deep_but_not_a_column",
                "good",
            ],
            |k| k.to_string(),
            move |ctx, id| {
                let table = table.clone();
                async move {
                    let (doc, extra) = match id {
                        "deep" => (Some(nested(100_000)), None),
                        "deep_object" => {
                            let mut v = serde_json::json!(1);
                            for _ in 0..100_000 {
                                v = serde_json::Value::Object(serde_json::Map::from_iter([(
                                    "k".to_string(),
                                    v,
                                )]));
                            }
                            (Some(v), None)
                        }
                        "at_the_limit" => (Some(nested(limit)), None),
                        "deep_but_not_a_column" => (Some(nested(3)), Some(nested(100_000))),
                        _ => (Some(serde_json::json!({"a": [1, 2]})), None),
                    };
                    let row = JsonDoc {
                        id: id.to_string(),
                        doc,
                        extra,
                    };
                    let result = table.declare_row(&ctx, &row);
                    for v in [row.doc, row.extra].into_iter().flatten() {
                        dismantle(v);
                    }
                    result
                }
            },
        )
        .await
    }))
    .await;
    let err = err_or(result, |s| format!("100,000 levels were accepted: {s:?}"))?;
    assert_eq!(failed_paths(&err), vec!["/deep", "/deep_object"], "{err}");
    for id in ["deep", "deep_object"] {
        let cause = cause_of(&err, id);
        assert!(
            cause.contains("table json_docs, column doc")
                && cause.contains(&format!("nested more than {limit} levels deep"))
                && cause.contains(&format!("row key \"{id}\"")),
            "{cause}"
        );
    }
    assert_eq!(
        ids(&f.pool, "json_docs").await?,
        vec!["at_the_limit", "deep_but_not_a_column", "good"]
    );
    let depth: i64 = sqlx::query_scalar(
        "SELECT length(doc) - length(replace(doc, '[', '')) FROM json_docs WHERE id = 'at_the_limit'",
    )
    .fetch_one(&f.pool)
    .await?;
    assert_eq!(depth, limit as i64, "the value at the limit landed whole");
    Ok(())
}

// ---------------------------------------------------------------------------
// A duplicate declaration
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_declared_twice_in_one_component_fails_only_that_component_naming_the_key(
) -> Result<()> {
    let f = fixture().await?;
    let comps: Components = vec![
        (
            "dup".into(),
            vec![item("same"), item("other"), item("same")],
        ),
        ("good".into(), vec![item("g1"), item("g2")]),
    ];
    let err = err_or(sync_sqlite(&f, comps).await, |s| {
        format!("a duplicate was accepted: {s:?}")
    })?;
    assert_eq!(failed_paths(&err), vec!["/dup"], "{err}");
    let cause = cause_of(&err, "dup");
    assert!(
        cause.contains("\"same\"") && cause.contains("declared twice"),
        "{cause}"
    );
    // The failed component applied nothing, not even its other row.
    assert_eq!(ids(&f.pool, "docs").await?, vec!["g1", "g2"]);
    Ok(())
}

// ---------------------------------------------------------------------------
// PostgreSQL
// ---------------------------------------------------------------------------

fn pg() -> ContextKey<PgPool> {
    ContextKey::new("pg")
}

/// A pool on the test server, or `None` (after a loud message) when there
/// is none and `CI` is not `true`.
async fn server() -> Result<Option<PgPool>> {
    Ok(pg::server(4)
        .await
        .map_err(Error::msg)?
        .map(|(_, pool)| pool))
}

/// A name unique to this test and process.
fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{what}_{:x}_{:x}", std::process::id(), nanos)
}

async fn pg_app(pool: &PgPool) -> Result<(TempDir, App)> {
    let dir = tempfile::tempdir()?;
    let app = app_with(dir.path(), |b| b.provide_key(&pg(), pool.clone())).await?;
    Ok((dir, app))
}

async fn pg_ids(pool: &PgPool, table: &str) -> Result<Vec<String>> {
    Ok(
        sqlx::query_scalar(&format!("SELECT id FROM \"{table}\" ORDER BY id"))
            .fetch_all(pool)
            .await?,
    )
}

async fn pg_drop(pool: &PgPool, tables: &[&str]) -> Result<()> {
    for t in tables {
        sqlx::raw_sql(&format!("DROP TABLE IF EXISTS \"{t}\" CASCADE"))
            .execute(pool)
            .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injection_attempts_in_postgres_table_and_column_names_fail_only_their_component_naming_the_identifier(
) -> Result<()> {
    let Some(pool) = server().await? else {
        return Ok(());
    };
    let canary = unique("canary");
    let docs = unique("docs");
    sqlx::raw_sql(&format!(
        "CREATE TABLE \"{canary}\" (id text PRIMARY KEY); INSERT INTO \"{canary}\" VALUES ('kept');"
    ))
    .execute(&pool)
    .await?;
    let evil_table = format!("{docs}\"; DROP TABLE \"{canary}\"; --");
    let (_dir, app) = pg_app(&pool).await?;
    let (evil, good) = (evil_table.clone(), docs.clone());
    let result = bounded(app.run(move |ctx| async move {
        ctx.mount_each(
            ["good", "evil_table", "smuggled_column"],
            |k| k.to_string(),
            move |ctx, case| {
                let (evil, good) = (evil.clone(), good.clone());
                async move {
                    match case {
                        "evil_table" => {
                            postgres::mount_table_target(&ctx, &pg(), &evil, docs_schema()?)
                                .await?;
                        }
                        "smuggled_column" => {
                            let name = format!("{good}_evil");
                            postgres::mount_table_target(
                                &ctx,
                                &pg(),
                                &name,
                                smuggled_schema(EVIL_COLUMN)?,
                            )
                            .await?;
                        }
                        _ => {
                            let table =
                                postgres::mount_table_target(&ctx, &pg(), &good, docs_schema()?)
                                    .await?;
                            table.declare_row(&ctx, item("a"))?;
                            table.declare_row(&ctx, item("b"))?;
                        }
                    }
                    Ok(())
                }
            },
        )
        .await
    }))
    .await;
    // Read and clean up first, then check.
    let canary_rows = pg_ids(&pool, &canary).await;
    let docs_rows = pg_ids(&pool, &docs).await;
    let smuggled = format!("{docs}_evil");
    let smuggled_exists: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
        .bind(format!("public.\"{smuggled}\""))
        .fetch_one(&pool)
        .await?;
    drop(app);
    pg_drop(&pool, &[&docs, &canary, &smuggled]).await?;

    let err = err_or(result, |s| format!("injections were accepted: {s:?}"))?;
    assert_eq!(
        failed_paths(&err),
        vec!["/evil_table", "/smuggled_column"],
        "{err}"
    );
    let cause = cause_of(&err, "evil_table");
    assert!(
        cause.contains("invalid table name") && cause.contains(&format!("{evil_table:?}")),
        "{cause}"
    );
    let cause = cause_of(&err, "smuggled_column");
    assert!(
        cause.contains("invalid column name") && cause.contains(&format!("{EVIL_COLUMN:?}")),
        "{cause}"
    );
    assert_eq!(
        smuggled_exists, None,
        "a table with the smuggled column was created"
    );
    assert_eq!(canary_rows?, vec!["kept"]);
    assert_eq!(docs_rows?, vec!["a", "b"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nan_and_nul_in_postgres_rows_fail_only_their_component_naming_table_column_and_key(
) -> Result<()> {
    let Some(pool) = server().await? else {
        return Ok(());
    };
    let docs = unique("values");
    let (_dir, app) = pg_app(&pool).await?;
    let table = docs.clone();
    let items = one_each(vec![
        Item {
            score: Some(f64::NAN),
            ..item("nan")
        },
        Item {
            body: Some("a\0b".into()),
            ..item("nul")
        },
        Item {
            meta: Some(BTreeMap::from([("x".to_string(), f64::NEG_INFINITY)])),
            ..item("json_inf")
        },
        item("good1"),
        item("good2"),
    ]);
    let result = bounded(app.run(move |ctx| async move {
        let target = postgres::mount_table_target(&ctx, &pg(), &table, docs_schema()?).await?;
        ctx.mount_each(
            items,
            |(k, _)| k.clone(),
            move |ctx, (_, items)| {
                let target = target.clone();
                async move {
                    for i in &items {
                        target.declare_row(&ctx, i)?;
                    }
                    Ok(())
                }
            },
        )
        .await
    }))
    .await;
    let rows = pg_ids(&pool, &docs).await;
    drop(app);
    pg_drop(&pool, &[&docs]).await?;
    let err = err_or(result, |s| format!("bad values were accepted: {s:?}"))?;
    assert_eq!(
        failed_paths(&err),
        vec!["/json_inf", "/nan", "/nul"],
        "{err}"
    );
    for (id, column) in [("nan", "score"), ("nul", "body"), ("json_inf", "meta")] {
        let cause = cause_of(&err, id);
        assert!(
            cause.contains(&format!("table {docs}, column {column}"))
                && cause.contains(&format!("row key \"{id}\"")),
            "{cause}"
        );
    }
    assert_eq!(rows?, vec!["good1", "good2"]);
    Ok(())
}

// ---------------------------------------------------------------------------
// The `weir` command: files that cannot be synced
// ---------------------------------------------------------------------------

/// Runs `weir args...` in `cwd` (as user and group `uid` when given).
fn weir(cwd: &Path, args: &[&OsStr], uid: Option<u32>) -> Output {
    cmd::run(cwd, args, uid)
}

/// A temp dir with a tree of good files (`tree/`), a database path and a
/// ledger path next to it.
struct CliRig {
    tmp: TempDir,
}

impl CliRig {
    fn new() -> CliRig {
        let tmp = tempfile::tempdir().unwrap();
        let tree = tmp.path().join("tree");
        std::fs::create_dir_all(tree.join("sub")).unwrap();
        std::fs::write(tree.join("a.txt"), "alpha\n").unwrap();
        std::fs::write(tree.join("b.md"), "# beta\n\ntext\n").unwrap();
        std::fs::write(tree.join("sub/c.txt"), "gamma\n").unwrap();
        CliRig { tmp }
    }
    fn tree(&self) -> PathBuf {
        self.tmp.path().join("tree")
    }
    fn db(&self) -> PathBuf {
        self.tmp.path().join("out.db")
    }
    fn ledger(&self) -> PathBuf {
        self.tmp.path().join("ledger")
    }
    /// `weir sync tree --into sqlite://out.db --ledger ledger`.
    fn sync(&self) -> Output {
        self.sync_as(None)
    }
    /// [`CliRig::sync`], as user `uid` when given.
    fn sync_as(&self, uid: Option<u32>) -> Output {
        let into = format!("sqlite://{}", self.db().display());
        weir(
            self.tmp.path(),
            &[
                OsStr::new("sync"),
                self.tree().as_os_str(),
                OsStr::new("--into"),
                OsStr::new(&into),
                OsStr::new("--ledger"),
                self.ledger().as_os_str(),
            ],
            uid,
        )
    }
    /// The `documents` table: path -> fingerprint.
    async fn documents(&self) -> BTreeMap<String, String> {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(
                sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(self.db())
                    .read_only(true),
            )
            .await
            .unwrap();
        let rows: Vec<(String, String)> = sqlx::query_as("SELECT path, fingerprint FROM documents")
            .fetch_all(&pool)
            .await
            .unwrap();
        pool.close().await;
        rows.into_iter().collect()
    }
    /// The paths of `documents`.
    async fn paths(&self) -> Vec<String> {
        self.documents().await.into_keys().collect()
    }
}

/// Asserts a run that failed for `culprit` alone: exit code 1, the culprit
/// listed on stderr with `why`, no panic, and the good files synced.
async fn assert_fails_alone(rig: &CliRig, out: &Output, culprit: &str, why: &str) {
    let stderr = text(&out.stderr);
    eprintln!("weir sync: {stderr}");
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains(&format!("failed: {culprit}")) && stderr.contains(why),
        "the culprit {culprit:?} ({why}) is not listed: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        text(&out.stdout).contains("1 failed"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(rig.paths().await, vec!["a.txt", "b.md", "sub/c.txt"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_lists_a_file_name_that_is_not_utf8_and_syncs_the_other_files() {
    let rig = CliRig::new();
    let name = OsStr::from_bytes(b"bad-\xff\xfe.txt");
    std::fs::write(rig.tree().join(name), "unnamed\n").unwrap();
    let out = rig.sync();
    assert_fails_alone(&rig, &out, "bad-\u{fffd}\u{fffd}.txt", "not valid UTF-8").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_lists_a_symlink_loop_and_syncs_the_other_files() {
    let rig = CliRig::new();
    // sub/loop -> .. : the tree again, below itself.
    std::os::unix::fs::symlink("..", rig.tree().join("sub/loop")).unwrap();
    let out = rig.sync();
    assert_fails_alone(&rig, &out, "sub/loop", "loop").await;
}

/// Gives everything below `dir` (and `dir`) to user and group `uid`.
fn chown_all(dir: &Path, uid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(dir, Some(uid), Some(uid))?;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() && !path.is_symlink() {
            chown_all(&path, uid)?;
        } else {
            std::os::unix::fs::lchown(&path, Some(uid), Some(uid))?;
        }
    }
    Ok(())
}

/// The user `nobody` runs the command when this process ignores file modes.
const NOBODY: u32 = 65_534;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_lists_an_unreadable_file_and_syncs_the_other_files() {
    use std::os::unix::fs::PermissionsExt;
    let rig = CliRig::new();
    let secret = rig.tree().join("secret.txt");
    std::fs::write(&secret, "hidden\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o000)).unwrap();
    if std::fs::read(&secret).is_err() {
        let out = rig.sync();
        assert_fails_alone(&rig, &out, "secret.txt", "Permission denied").await;
        return;
    }
    eprintln!(
        "SKIPPED (chmod 000 as this user): this process reads files of mode 000 (it runs as \
         root); a dangling symlink stands in for the unreadable file, and the mode-000 file is \
         tried with the command run as user nobody"
    );
    std::fs::remove_file(&secret).unwrap();
    std::os::unix::fs::symlink("no-such-target", &secret).unwrap();
    let out = rig.sync();
    assert_fails_alone(&rig, &out, "secret.txt", "broken symbolic link").await;

    // The real thing, as a user that file modes apply to.
    let rig = CliRig::new();
    let secret = rig.tree().join("secret.txt");
    std::fs::write(&secret, "hidden\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o000)).unwrap();
    if let Err(e) = chown_all(rig.tmp.path(), NOBODY) {
        eprintln!("SKIPPED (chmod 000 as user nobody): cannot give the tree to nobody: {e}");
        return;
    }
    let out = rig.sync_as(Some(NOBODY));
    assert_fails_alone(&rig, &out, "secret.txt", "Permission denied").await;
}

// ---------------------------------------------------------------------------
// Damaged or busy ledgers
// ---------------------------------------------------------------------------

/// Every file below `dir`, recursively.
fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut queue = vec![dir.to_path_buf()];
    while let Some(d) = queue.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                queue.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Deterministic pseudo-random bytes.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.u8(..)).collect()
}

/// A synced tree whose ledger `damage` then spoils; the tree changes
/// afterwards (one file edited, one removed, one added), so that any write
/// of a run on the damaged ledger shows in `documents`. Then checks that
/// the command refuses with a sentence containing each of `expected` and
/// exit code 2, writes nothing, and that `App::build` refuses the ledger
/// too (unless `app_too` is false).
async fn assert_refused_after(damage: impl FnOnce(&Path), expected: &[&str], app_too: bool) {
    let rig = CliRig::new();
    let first = rig.sync();
    assert!(first.status.success(), "{}", text(&first.stderr));
    let synced = rig.documents().await;
    assert_eq!(synced.len(), 3);

    damage(&rig.ledger());
    std::fs::write(rig.tree().join("a.txt"), "alpha, edited\n").unwrap();
    std::fs::remove_file(rig.tree().join("sub/c.txt")).unwrap();
    std::fs::write(rig.tree().join("new.txt"), "new\n").unwrap();

    let out = rig.sync();
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        out.status.code(),
        Some(2),
        "the damaged ledger was used: stdout: {} stderr: {stderr}",
        text(&out.stdout)
    );
    for e in expected {
        assert!(stderr.contains(e), "{e:?} not in: {stderr}");
    }
    assert_eq!(
        rig.documents().await,
        synced,
        "a refused run changed the table"
    );
    if app_too {
        let built = App::builder("inspect")
            .ledger_path(rig.ledger())
            .build()
            .await;
        let err = err_or(built, |_| "App::build opened the damaged ledger".into()).unwrap();
        assert_eq!(err.kind(), weir::ErrorKind::Ledger, "{err}");
        for e in expected {
            assert!(err.to_string().contains(e), "{e:?} not in: {err}");
        }
    }
}

/// What a corrupt ledger's refusal says to do.
const CORRUPT: [&str; 2] = ["is corrupt", "restore it from a backup, or remove it"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_ledger_is_refused_and_the_synced_table_is_untouched() {
    for keep in [0.0, 0.5] {
        assert_refused_after(
            |ledger| {
                let db = ledger.join("sled/db");
                let len = std::fs::metadata(&db).unwrap().len();
                let file = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
                file.set_len((len as f64 * keep) as u64).unwrap();
            },
            &CORRUPT,
            true,
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_whose_sled_files_are_all_overwritten_with_random_bytes_is_refused() {
    assert_refused_after(
        |ledger| {
            for (i, file) in files_below(&ledger.join("sled")).iter().enumerate() {
                let len = std::fs::metadata(file).unwrap().len().max(64) as usize;
                std::fs::write(file, noise(len, 0xBAD_5EED + i as u64)).unwrap();
            }
        },
        &CORRUPT,
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_whose_sled_log_is_overwritten_with_random_bytes_is_refused() {
    assert_refused_after(
        |ledger| {
            let db = ledger.join("sled/db");
            let len = std::fs::metadata(&db).unwrap().len() as usize;
            std::fs::write(&db, noise(len, 0xBAD_10C)).unwrap();
        },
        &CORRUPT,
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_of_another_format_version_is_refused_with_what_to_do() {
    assert_refused_after(
        |ledger| {
            let db = sled::open(ledger.join("sled")).unwrap();
            let found = db.get(b"mformat").unwrap().expect("a format version");
            assert_eq!(found.as_ref(), 4u32.to_be_bytes());
            db.insert(b"mformat", &5u32.to_be_bytes()).unwrap();
            db.flush().unwrap();
        },
        &[
            "has format version 5",
            "reads version 4",
            "use a matching weir version or remove the ledger",
        ],
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_held_by_an_app_is_refused_by_the_command_with_what_to_do() {
    let rig = CliRig::new();
    let first = rig.sync();
    assert!(first.status.success(), "{}", text(&first.stderr));
    let synced = rig.documents().await;
    let held = App::builder("holder")
        .ledger_path(rig.ledger())
        .build()
        .await
        .unwrap();
    std::fs::remove_file(rig.tree().join("sub/c.txt")).unwrap();
    let out = rig.sync();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("already open") && stderr.contains("try again"),
        "{stderr}"
    );
    assert_eq!(
        rig.documents().await,
        synced,
        "a refused run changed the table"
    );
    drop(held);
    // Released: the command runs again, and catches up.
    let again = rig.sync();
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(rig.paths().await, vec!["a.txt", "b.md"]);
}
