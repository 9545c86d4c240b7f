//! The SQLite target against a real SQLite file per test: its types, and
//! what only SQLite does: names that ignore case, the bind limit, storage
//! types, attached databases, a locked database. What both SQL dialects
//! do is tested once for both in `sql_tables.rs`.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use sqlx::SqlitePool;
use tempfile::TempDir;
use weir::connectors::sql::{ColumnType, TableSchema};
use weir::connectors::sqlite::{self, TableOptions};
use weir::prelude::*;
use weir::statediff::ManagedBy;

#[path = "sql_tables/docs.rs"]
mod docs;
mod keys;

use docs::{doc, docs_schema, Doc};
use keys::KeyCase;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Bounds anything that could hang.
async fn bounded<T>(fut: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .map_err(|_| Error::msg("timed out after 60s"))?
}

fn db() -> ContextKey<SqlitePool> {
    ContextKey::new("db")
}

/// A temp dir holding a database file and a ledger, the pool, and an app.
struct Fixture {
    _dir: TempDir,
    pool: SqlitePool,
    app: App,
}

async fn fixture() -> Result<Fixture> {
    let dir = tempfile::tempdir()?;
    let pool = sqlite::connect(dir.path().join("test.db")).await?;
    let app = App::builder("sqlite-test")
        .ledger_path(dir.path().join("ledger"))
        .shards(3)
        .retry_policy(RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(20),
            call_timeout: Some(Duration::from_secs(20)),
        })
        .provide_key(&db(), pool.clone())
        .build()
        .await?;
    Ok(Fixture {
        _dir: dir,
        pool,
        app,
    })
}

/// Mounts `docs` with `schema` and declares `rows` into it.
async fn sync_rows<R>(f: &Fixture, schema: TableSchema, rows: Vec<R>) -> Result<UpdateStats>
where
    R: Serialize + Send + Sync + 'static,
{
    bounded(f.app.run(move |ctx| async move {
        let table = sqlite::mount_table_target(&ctx, &db(), "docs", schema).await?;
        for row in &rows {
            table.declare_row(&ctx, row)?;
        }
        Ok(())
    }))
    .await
}

async fn sync_docs(f: &Fixture, rows: Vec<Doc>) -> Result<UpdateStats> {
    sync_rows(f, docs_schema()?, rows).await
}

type DocRow = (String, String, Option<i64>);

async fn read_docs(pool: &SqlitePool) -> Result<Vec<DocRow>> {
    Ok(
        sqlx::query_as::<_, DocRow>("SELECT id, title, n FROM docs ORDER BY id")
            .fetch_all(pool)
            .await?,
    )
}

fn expected(rows: &[(&str, &str, Option<i64>)]) -> Vec<DocRow> {
    rows.iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), *c))
        .collect()
}

async fn table_exists(pool: &SqlitePool, name: &str) -> Result<bool> {
    let n: i64 =
        sqlx::query_scalar("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?")
            .bind(name)
            .fetch_one(pool)
            .await?;
    Ok(n == 1)
}

async fn columns(pool: &SqlitePool, table: &str) -> Result<Vec<String>> {
    Ok(
        sqlx::query_scalar("SELECT name FROM pragma_table_info(?) ORDER BY cid")
            .bind(table)
            .fetch_all(pool)
            .await?,
    )
}

fn err_or<T>(result: Result<T>, what: &str) -> Result<Error> {
    match result {
        Ok(_) => Err(Error::msg(format!("{what} should have failed"))),
        Err(e) => Ok(e),
    }
}

// ---------------------------------------------------------------------------
// Rows
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn connect_makes_every_commit_durable_before_the_ledger_records_it() -> Result<()> {
    // weir records a row once its sink call returns. With `synchronous =
    // NORMAL` a WAL commit can still be lost to a power cut while the
    // (synced) ledger keeps its record, and the row would never be written
    // again. Every pooled connection must sync its commits (FULL = 2).
    let f = fixture().await?;
    let mut held = Vec::new();
    for _ in 0..sqlite::DEFAULT_MAX_CONNECTIONS {
        let mut conn = f.pool.acquire().await?;
        let (journal,): (String,) = sqlx::query_as("PRAGMA journal_mode")
            .fetch_one(&mut *conn)
            .await?;
        let (synchronous,): (i64,) = sqlx::query_as("PRAGMA synchronous")
            .fetch_one(&mut *conn)
            .await?;
        assert_eq!((journal.as_str(), synchronous), ("wal", 2));
        held.push(conn);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_preview_tells_the_table_and_the_row_actions_of_each_table_apart() -> Result<()> {
    let f = fixture().await?;
    let mount = |ids: &'static [&'static str]| {
        move |ctx: Ctx| async move {
            let docs = sqlite::mount_table_target(&ctx, &db(), "Docs", docs_schema()?).await?;
            for id in ids {
                docs.declare_row(&ctx, doc(id, "t", None))?;
            }
            Ok(())
        }
    };
    let tables = ["Docs", "other"];
    let actions = bounded(f.app.preview(mount(&["a", "b"]))).await?;
    let mut seen: Vec<(Option<sqlite::PreviewedTable>, String, ActionKind)> = actions
        .iter()
        .map(|a| {
            (
                sqlite::previewed_table(&db(), &tables, a),
                a.key.to_string(),
                a.kind,
            )
        })
        .collect();
    seen.sort_by_key(|(_, key, _)| key.clone());
    let docs_row = || Some(sqlite::PreviewedTable::Row("Docs".into()));
    assert_eq!(
        seen,
        vec![
            (docs_row(), "\"a\"".into(), ActionKind::Create),
            (docs_row(), "\"b\"".into(), ActionKind::Create),
            (
                Some(sqlite::PreviewedTable::Table("docs".into())),
                "[\"db\",\"docs\"]".into(),
                ActionKind::Create
            ),
        ]
    );
    // Another database's actions, or a table not listed, are not told.
    let other: ContextKey<SqlitePool> = ContextKey::new("other");
    assert!(actions
        .iter()
        .all(|a| sqlite::previewed_table(&other, &tables, a).is_none()));
    assert!(actions
        .iter()
        .filter(|a| a.kind == ActionKind::Create && a.key.to_string().starts_with('"'))
        .all(|a| sqlite::previewed_table(&db(), &["other"], a).is_none()));

    bounded(f.app.run(mount(&["a", "b"]))).await?;
    let actions = bounded(f.app.preview(mount(&["a"]))).await?;
    let seen: Vec<_> = actions
        .iter()
        .map(|a| (sqlite::previewed_table(&db(), &tables, a), a.kind))
        .collect();
    assert_eq!(seen, vec![(docs_row(), ActionKind::Delete)]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_read_only_creates_no_file_and_changes_none() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let missing = dir.path().join("missing.db");
    assert!(sqlite::connect_read_only(&missing).await.is_err());
    assert!(!missing.exists());

    // A database in WAL mode, as `sqlite::connect` makes them, closed
    // cleanly by its only connection: only its file is there.
    let path = dir.path().join("test.db");
    {
        use sqlx::Connection as _;
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
        let mut conn = sqlx::SqliteConnection::connect_with(&options).await?;
        sqlx::query("CREATE TABLE t (x INTEGER)")
            .execute(&mut conn)
            .await?;
        conn.close().await?;
    }
    let listing = || -> Result<Vec<(String, Vec<u8>)>> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir.path())? {
            let entry = entry?;
            files.push((
                entry.file_name().to_string_lossy().into_owned(),
                std::fs::read(entry.path())?,
            ));
        }
        files.sort();
        Ok(files)
    };
    let before = listing()?;
    assert_eq!(
        before.len(),
        1,
        "{:?}",
        before.iter().map(|f| &f.0).collect::<Vec<_>>()
    );

    let read = sqlite::connect_read_only(&path).await?;
    assert!(table_exists(&read, "t").await?);
    assert!(sqlx::query("INSERT INTO t VALUES (1)")
        .execute(&read)
        .await
        .is_err());
    read.close().await;
    assert_eq!(listing()?, before);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unchanged_rerun_writes_no_row() -> Result<()> {
    let f = fixture().await?;
    let rows: Vec<Doc> = (0..50)
        .map(|i| doc(&format!("k{i:02}"), "same", Some(i)))
        .collect();
    sync_docs(&f, rows.clone()).await?;
    let rowids = |pool: SqlitePool| async move {
        sqlx::query_as::<_, (i64, String)>("SELECT rowid, id FROM docs ORDER BY id")
            .fetch_all(&pool)
            .await
    };
    let before = rowids(f.pool.clone()).await?;
    // A trigger counts every write the second run would make.
    sqlx::query("CREATE TABLE writes (n INTEGER)")
        .execute(&f.pool)
        .await?;
    sqlx::query(
        "CREATE TRIGGER count_updates AFTER UPDATE ON docs BEGIN INSERT INTO writes VALUES (1); END",
    )
    .execute(&f.pool)
    .await?;
    sqlx::query(
        "CREATE TRIGGER count_inserts AFTER INSERT ON docs BEGIN INSERT INTO writes VALUES (1); END",
    )
    .execute(&f.pool)
    .await?;

    let stats = sync_docs(&f, rows).await?;
    // The table answers (a container always does): its refresh reaches
    // the table sink, which only checks that the table is there; it
    // counts as unchanged, and no row is written.
    assert_eq!(
        (stats.created, stats.updated, stats.deleted, stats.unchanged),
        (0, 0, 0, 51),
        "{stats:?}"
    );
    let writes: i64 = sqlx::query_scalar("SELECT count(*) FROM writes")
        .fetch_one(&f.pool)
        .await?;
    assert_eq!(writes, 0);
    assert_eq!(rowids(f.pool.clone()).await?, before);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn many_rows_are_written_in_chunks_under_the_bind_limit() -> Result<()> {
    let f = fixture().await?;
    let rows: Vec<Doc> = (0..5_000)
        .map(|i| doc(&format!("k{i:05}"), "x", Some(i)))
        .collect();
    sync_docs(&f, rows).await?;
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM docs")
        .fetch_one(&f.pool)
        .await?;
    assert_eq!(n, 5_000);
    let rows: Vec<Doc> = (0..5_000)
        .filter(|i| i % 2 == 0)
        .map(|i| doc(&format!("k{i:05}"), "y", Some(i)))
        .collect();
    sync_docs(&f, rows).await?;
    let (n, ys): (i64, i64) = sqlx::query_as("SELECT count(*), sum(title = 'y') FROM docs")
        .fetch_one(&f.pool)
        .await?;
    assert_eq!((n, ys), (2_500, 2_500));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn composite_keys_upsert_and_delete() -> Result<()> {
    let f = fixture().await?;
    let schema = || {
        TableSchema::builder()
            .column("tenant", ColumnType::Text)
            .column("n", ColumnType::Integer)
            .nullable_column("v", ColumnType::Text)
            .primary_key(["tenant", "n"])
            .build()
    };
    let row = |t: &str, n: i64, v: &str| {
        BTreeMap::from([
            ("tenant".to_string(), t.to_string()),
            ("n".to_string(), n.to_string()),
            ("v".to_string(), v.to_string()),
        ])
    };
    // `n` arrives as text in a map of strings: rejected; use typed maps.
    let bad = sync_rows(&f, schema()?, vec![row("a", 1, "x")]).await;
    assert!(bad.is_err());

    #[derive(Serialize)]
    struct Item {
        tenant: String,
        n: i32,
        v: String,
    }
    let item = |t: &str, n: i32, v: &str| Item {
        tenant: t.into(),
        n,
        v: v.into(),
    };
    bounded(f.app.run(move |ctx| async move {
        let t = sqlite::mount_table_target(&ctx, &db(), "items", schema()?).await?;
        for i in [item("a", 1, "x"), item("a", 2, "y"), item("b", 1, "z")] {
            t.declare_row(&ctx, &i)?;
        }
        Ok(())
    }))
    .await?;
    bounded(f.app.run(move |ctx| async move {
        let t = sqlite::mount_table_target(&ctx, &db(), "items", schema()?).await?;
        t.declare_row(&ctx, item("a", 2, "y2"))
    }))
    .await?;
    let rows: Vec<(String, i64, String)> =
        sqlx::query_as("SELECT tenant, n, v FROM items ORDER BY tenant, n")
            .fetch_all(&f.pool)
            .await?;
    assert_eq!(rows, vec![("a".to_string(), 2, "y2".to_string())]);
    Ok(())
}

// ---------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------

#[derive(Serialize)]
struct AllTypes {
    id: i64,
    text: String,
    small: i16,
    int: i32,
    big: i64,
    real: f32,
    double: f64,
    flag: bool,
    bytes: Vec<u8>,
    json: BTreeMap<String, Vec<i64>>,
    ts: String,
    id2: String,
    tags: Vec<String>,
    missing: Option<String>,
}

#[tokio::test(flavor = "multi_thread")]
async fn every_column_type_round_trips() -> Result<()> {
    let f = fixture().await?;
    let schema = TableSchema::builder()
        .column("id", ColumnType::BigInt)
        .column("text", ColumnType::Text)
        .column("small", ColumnType::SmallInt)
        .column("int", ColumnType::Integer)
        .column("big", ColumnType::BigInt)
        .column("real", ColumnType::Real)
        .column("double", ColumnType::Double)
        .column("flag", ColumnType::Boolean)
        .column("bytes", ColumnType::Bytes)
        .column("json", ColumnType::Json)
        .column("ts", ColumnType::Timestamp)
        .column("id2", ColumnType::Uuid)
        .column("tags", ColumnType::Array(Box::new(ColumnType::Text)))
        .nullable_column("missing", ColumnType::Text)
        .primary_key(["id"])
        .build()?;
    let row = AllTypes {
        id: i64::MAX,
        text: "héllo \"quoted\" 'x'; DROP TABLE docs".into(),
        small: -12,
        int: i32::MIN,
        big: i64::MIN,
        real: 1.5,
        double: -2.25e100,
        flag: true,
        bytes: vec![0, 1, 255],
        json: BTreeMap::from([("a".to_string(), vec![1, 2])]),
        ts: "2024-05-01T14:00:00+02:00".into(),
        id2: "67E55044-10B1-426F-9247-BB680E5FE0C8".into(),
        tags: vec!["x".into(), "y".into()],
        missing: None,
    };
    bounded(f.app.run(move |ctx| async move {
        let t = sqlite::mount_table_target(&ctx, &db(), "types", schema).await?;
        t.declare_row(&ctx, &row)
    }))
    .await?;
    let (id, text, small, int, big, real, double, flag): (
        i64,
        String,
        i64,
        i64,
        i64,
        f64,
        f64,
        i64,
    ) = sqlx::query_as("SELECT id, text, small, int, big, real, double, flag FROM types")
        .fetch_one(&f.pool)
        .await?;
    assert_eq!(
        (id, text.as_str(), small, int, big, real, double, flag),
        (
            i64::MAX,
            "héllo \"quoted\" 'x'; DROP TABLE docs",
            -12,
            i64::from(i32::MIN),
            i64::MIN,
            1.5,
            -2.25e100,
            1
        )
    );
    let (bytes, json, ts, id2, tags, missing): (
        Vec<u8>,
        String,
        String,
        String,
        String,
        Option<String>,
    ) = sqlx::query_as("SELECT bytes, json, ts, id2, tags, missing FROM types")
        .fetch_one(&f.pool)
        .await?;
    assert_eq!(bytes, vec![0, 1, 255]);
    assert_eq!(json, r#"{"a":[1,2]}"#);
    assert_eq!(ts, "2024-05-01T12:00:00+00:00");
    assert_eq!(id2, "67e55044-10b1-426f-9247-bb680e5fe0c8");
    assert_eq!(tags, r#"["x","y"]"#);
    assert_eq!(missing, None);
    let kinds: Vec<String> = sqlx::query_scalar(
        "SELECT typeof(text) || typeof(small) || typeof(real) || typeof(flag) || typeof(bytes) \
         || typeof(json) || typeof(missing) FROM types",
    )
    .fetch_all(&f.pool)
    .await?;
    assert_eq!(kinds, vec!["textintegerrealintegerblobtextnull"]);
    Ok(())
}

// ---------------------------------------------------------------------------
// Schema changes
// ---------------------------------------------------------------------------

#[derive(Clone, Serialize)]
struct Wide {
    id: String,
    title: String,
    n: Option<i64>,
    extra: Option<String>,
}

#[tokio::test(flavor = "multi_thread")]
async fn an_added_nullable_column_keeps_the_rows_data() -> Result<()> {
    let f = fixture().await?;
    sync_docs(&f, vec![doc("a", "A", Some(1)), doc("b", "B", Some(2))]).await?;
    let rowids: Vec<i64> = sqlx::query_scalar("SELECT rowid FROM docs ORDER BY id")
        .fetch_all(&f.pool)
        .await?;
    let wide = TableSchema::builder()
        .column("id", ColumnType::Text)
        .column("title", ColumnType::Text)
        .nullable_column("n", ColumnType::BigInt)
        .nullable_column("extra", ColumnType::Text)
        .primary_key(["id"])
        .build()?;
    let rows = vec![
        Wide {
            id: "a".into(),
            title: "A".into(),
            n: Some(1),
            extra: None,
        },
        Wide {
            id: "b".into(),
            title: "B".into(),
            n: Some(2),
            extra: Some("new".into()),
        },
    ];
    let stats = sync_rows(&f, wide, rows).await?;
    assert_eq!(
        columns(&f.pool, "docs").await?,
        vec!["id", "title", "n", "extra"]
    );
    // Row a's values did not change: it is not written again.
    assert_eq!(stats.unchanged, 1, "{stats:?}");
    let rows: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT id, title, extra FROM docs ORDER BY id")
            .fetch_all(&f.pool)
            .await?;
    assert_eq!(
        rows,
        vec![
            ("a".into(), "A".into(), None),
            ("b".into(), "B".into(), Some("new".into()))
        ]
    );
    let after: Vec<i64> = sqlx::query_scalar("SELECT rowid FROM docs ORDER BY id")
        .fetch_all(&f.pool)
        .await?;
    assert_eq!(after, rowids, "the table was altered in place");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retyped_column_is_dropped_and_added_with_the_rows_written_again() -> Result<()> {
    let f = fixture().await?;
    sync_docs(&f, vec![doc("a", "A", Some(1))]).await?;
    #[derive(Serialize)]
    struct Retyped {
        id: String,
        title: String,
        n: Option<String>,
    }
    let schema = TableSchema::builder()
        .column("id", ColumnType::Text)
        .column("title", ColumnType::Text)
        .nullable_column("n", ColumnType::Text)
        .primary_key(["id"])
        .build()?;
    sync_rows(
        &f,
        schema,
        vec![Retyped {
            id: "a".into(),
            title: "A".into(),
            n: Some("one".into()),
        }],
    )
    .await?;
    let (ty, n): (String, String) = sqlx::query_as("SELECT typeof(n), n FROM docs")
        .fetch_one(&f.pool)
        .await?;
    assert_eq!((ty.as_str(), n.as_str()), ("text", "one"));
    let decl: String =
        sqlx::query_scalar("SELECT type FROM pragma_table_info('docs') WHERE name = 'n'")
            .fetch_one(&f.pool)
            .await?;
    assert_eq!(decl, "TEXT");
    Ok(())
}

// ---------------------------------------------------------------------------
// Lifecycle and ownership
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn two_tables_of_one_database_are_written_in_one_run() -> Result<()> {
    let f = fixture().await?;
    let run = |first: Vec<Doc>, second: Vec<Doc>| {
        bounded(f.app.run(move |ctx| async move {
            let a = sqlite::mount_table_target(&ctx, &db(), "first", docs_schema()?).await?;
            let b = sqlite::mount_table_target(&ctx, &db(), "second", docs_schema()?).await?;
            for d in &first {
                a.declare_row(&ctx, d)?;
            }
            for d in &second {
                b.declare_row(&ctx, d)?;
            }
            Ok(())
        }))
    };
    run(
        vec![doc("a", "A", None)],
        vec![doc("a", "other", Some(2)), doc("b", "B", None)],
    )
    .await?;
    let first: Vec<String> = sqlx::query_scalar("SELECT title FROM first")
        .fetch_all(&f.pool)
        .await?;
    let second: Vec<String> = sqlx::query_scalar("SELECT title FROM second ORDER BY id")
        .fetch_all(&f.pool)
        .await?;
    assert_eq!(
        (first, second),
        (
            vec!["A".to_string()],
            vec!["other".to_string(), "B".to_string()]
        )
    );
    run(vec![], vec![doc("b", "B", None)]).await?;
    let counts: (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM first), (SELECT count(*) FROM second)")
            .fetch_one(&f.pool)
            .await?;
    assert_eq!(counts, (0, 1));
    Ok(())
}

// ---------------------------------------------------------------------------
// Related tables and constraints
// ---------------------------------------------------------------------------

#[derive(Serialize)]
struct Author {
    id: i64,
    name: String,
}

#[derive(Serialize)]
struct Book {
    id: i64,
    author_id: i64,
    title: String,
}

fn authors_schema() -> Result<TableSchema> {
    TableSchema::builder()
        .column("id", ColumnType::BigInt)
        .column("name", ColumnType::Text)
        .primary_key(["id"])
        .build()
}

fn books_schema() -> Result<TableSchema> {
    TableSchema::builder()
        .column("id", ColumnType::BigInt)
        .column("author_id", ColumnType::BigInt)
        .column("title", ColumnType::Text)
        .primary_key(["id"])
        .build()
}

async fn sync_library(f: &Fixture, authors: Vec<Author>, books: Vec<Book>) -> Result<UpdateStats> {
    bounded(f.app.run(move |ctx| async move {
        let a = sqlite::mount_table_target(&ctx, &db(), "authors", authors_schema()?).await?;
        let user = TableOptions {
            managed_by: ManagedBy::User,
        };
        let b = sqlite::mount_table_target_with(&ctx, &db(), "books", books_schema()?, user)
            .await?
            .depends_on(&a);
        // Children declared first: the sink still writes parents first.
        for book in &books {
            b.declare_row(&ctx, book)?;
        }
        for author in &authors {
            a.declare_row(&ctx, author)?;
        }
        Ok(())
    }))
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn dependent_tables_with_a_real_foreign_key_are_written_parents_first() -> Result<()> {
    let f = fixture().await?;
    // The authors table must exist for the books table's foreign key.
    sync_library(&f, vec![], vec![]).await?;
    sqlx::query(
        "CREATE TABLE books (id INTEGER PRIMARY KEY, author_id INTEGER NOT NULL \
         REFERENCES authors(id), title TEXT NOT NULL)",
    )
    .execute(&f.pool)
    .await?;
    let author = |id, name: &str| Author {
        id,
        name: name.into(),
    };
    let book = |id, author_id, title: &str| Book {
        id,
        author_id,
        title: title.into(),
    };
    sync_library(
        &f,
        vec![author(1, "Le Guin"), author(2, "Borges")],
        vec![book(10, 1, "Earthsea"), book(11, 2, "Ficciones")],
    )
    .await?;
    let n: i64 =
        sqlx::query_scalar("SELECT count(*) FROM books JOIN authors ON authors.id = author_id")
            .fetch_one(&f.pool)
            .await?;
    assert_eq!(n, 2);
    // An author and their book go in one run: deletes children first.
    sync_library(
        &f,
        vec![author(1, "Le Guin")],
        vec![book(10, 1, "Earthsea")],
    )
    .await?;
    let names: Vec<String> = sqlx::query_scalar("SELECT name FROM authors")
        .fetch_all(&f.pool)
        .await?;
    assert_eq!(names, vec!["Le Guin"]);
    let violations: Vec<(String, i64, String, i64)> = sqlx::query_as("PRAGMA foreign_key_check")
        .fetch_all(&f.pool)
        .await?;
    assert!(violations.is_empty());
    Ok(())
}

#[derive(Serialize)]
struct User {
    id: String,
    email: String,
}

/// The schema of `users`: a text `id` (the key) and an `email`.
fn users_schema() -> Result<TableSchema> {
    TableSchema::builder()
        .column("id", ColumnType::Text)
        .column("email", ColumnType::Text)
        .primary_key(["id"])
        .build()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_unique_violation_fails_only_its_component_naming_table_constraint_and_key() -> Result<()>
{
    let f = fixture().await?;
    let run = |users: Vec<User>| {
        bounded(f.app.run(move |ctx| async move {
            let t = sqlite::mount_table_target(&ctx, &db(), "users", users_schema()?).await?;
            ctx.mount_each(
                users,
                |u| u.id.clone(),
                move |ctx, u| {
                    let t = t.clone();
                    async move { t.declare_row(&ctx, &u) }
                },
            )
            .await
        }))
    };
    run(vec![User {
        id: "u1".into(),
        email: "one@x".into(),
    }])
    .await?;
    sqlx::query("CREATE UNIQUE INDEX users_email ON users (email)")
        .execute(&f.pool)
        .await?;
    let result = run(vec![
        User {
            id: "u1".into(),
            email: "one@x".into(),
        },
        User {
            id: "u2".into(),
            email: "one@x".into(),
        },
        User {
            id: "u3".into(),
            email: "three@x".into(),
        },
    ])
    .await;
    let err = err_or(result, "a duplicate email")?;
    assert_eq!(err.failed_components().len(), 1, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("/u2")
            && text.contains("table users")
            && text.contains("users.email")
            && text.contains("key \"u2\""),
        "{text}"
    );
    let rows: Vec<(String, String)> = sqlx::query_as("SELECT id, email FROM users ORDER BY id")
        .fetch_all(&f.pool)
        .await?;
    assert_eq!(
        rows,
        vec![
            ("u1".into(), "one@x".into()),
            ("u3".into(), "three@x".into())
        ]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_violation_in_a_later_statement_of_a_large_call_names_its_row() -> Result<()> {
    let f = fixture().await?;
    sqlx::query("CREATE TABLE users (id TEXT PRIMARY KEY, email TEXT NOT NULL UNIQUE)")
        .execute(&f.pool)
        .await?;
    // 1 500 rows in one call: written by two statements of at most 1 000
    // rows, in key order. u1200 (in the second) takes u0001's email (in the
    // first).
    let users: Vec<User> = (0..1500)
        .map(|i| User {
            id: format!("u{i:04}"),
            email: if i == 1200 {
                "e0001".into()
            } else {
                format!("e{i:04}")
            },
        })
        .collect();
    let result = bounded(f.app.run(move |ctx| async move {
        let user = TableOptions {
            managed_by: ManagedBy::User,
        };
        let t =
            sqlite::mount_table_target_with(&ctx, &db(), "users", users_schema()?, user).await?;
        for u in &users {
            t.declare_row(&ctx, u)?;
        }
        Ok(())
    }))
    .await;
    let err = err_or(result, "a duplicate email in the second statement")?;
    let text = err.to_string();
    assert!(
        text.contains("table users")
            && text.contains("users.email")
            && text.contains("key \"u1200\""),
        "{text}"
    );
    let (rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM users")
        .fetch_one(&f.pool)
        .await?;
    assert_eq!(rows, 0, "the failed call's transaction was rolled back");
    Ok(())
}

/// Names that are not identifiers are refused in both dialects (see
/// `tests/sql_tables.rs`); SQLite also reserves the `sqlite_` prefix.
#[tokio::test(flavor = "multi_thread")]
async fn a_name_sqlite_reserves_is_refused_and_nothing_is_created() -> Result<()> {
    let f = fixture().await?;
    for name in ["sqlite_master", "SQLITE_stat1"] {
        let name = name.to_string();
        let result = bounded(f.app.run(move |ctx| async move {
            sqlite::mount_table_target(&ctx, &db(), &name, docs_schema()?)
                .await
                .map(|_| ())
        }))
        .await;
        let err = err_or(result, "a reserved table name")?;
        assert!(err.to_string().contains("invalid table name"), "{err}");
    }
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM sqlite_schema")
        .fetch_one(&f.pool)
        .await?;
    assert_eq!(tables, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_schema_derived_from_a_sample_row_creates_the_table_its_rows_land_in() -> Result<()> {
    let f = fixture().await?;
    let schema = TableSchema::from_sample(&doc("sample", "t", Some(1)))?
        .primary_key(["id"])
        .build()?;
    assert!(schema.column("n").is_some_and(|c| c.nullable));
    sync_rows(
        &f,
        schema,
        vec![doc("a", "A", Some(1)), doc("b", "B", None)],
    )
    .await?;
    assert_eq!(
        read_docs(&f.pool).await?,
        expected(&[("a", "A", Some(1)), ("b", "B", None)])
    );
    Ok(())
}

#[derive(Serialize)]
struct Chapter {
    id: i64,
    book_id: i64,
    heading: String,
}

/// Three user-managed tables with real foreign keys: chapters -> books ->
/// authors, declared children first.
async fn sync_chain(
    f: &Fixture,
    authors: Vec<Author>,
    books: Vec<Book>,
    chapters: Vec<Chapter>,
) -> Result<UpdateStats> {
    bounded(f.app.run(move |ctx| async move {
        let user = || TableOptions {
            managed_by: ManagedBy::User,
        };
        let a = sqlite::mount_table_target_with(&ctx, &db(), "authors", authors_schema()?, user())
            .await?;
        let b = sqlite::mount_table_target_with(&ctx, &db(), "books", books_schema()?, user())
            .await?
            .depends_on(&a);
        let chapters_schema = TableSchema::builder()
            .column("id", ColumnType::BigInt)
            .column("book_id", ColumnType::BigInt)
            .column("heading", ColumnType::Text)
            .primary_key(["id"])
            .build()?;
        let c = sqlite::mount_table_target_with(&ctx, &db(), "chapters", chapters_schema, user())
            .await?
            .depends_on(&b);
        for chapter in &chapters {
            c.declare_row(&ctx, chapter)?;
        }
        for book in &books {
            b.declare_row(&ctx, book)?;
        }
        for author in &authors {
            a.declare_row(&ctx, author)?;
        }
        Ok(())
    }))
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chain_of_three_dependent_tables_writes_parents_first_and_deletes_children_first(
) -> Result<()> {
    let f = fixture().await?;
    for ddl in [
        "CREATE TABLE authors (id INTEGER PRIMARY KEY, name TEXT NOT NULL)",
        "CREATE TABLE books (id INTEGER PRIMARY KEY, author_id INTEGER NOT NULL \
         REFERENCES authors(id), title TEXT NOT NULL)",
        "CREATE TABLE chapters (id INTEGER PRIMARY KEY, book_id INTEGER NOT NULL \
         REFERENCES books(id), heading TEXT NOT NULL)",
    ] {
        sqlx::query(ddl).execute(&f.pool).await?;
    }
    let authors = || {
        vec![Author {
            id: 1,
            name: "Le Guin".into(),
        }]
    };
    let books = || {
        vec![Book {
            id: 10,
            author_id: 1,
            title: "Earthsea".into(),
        }]
    };
    let chapters = || {
        (0..3)
            .map(|i| Chapter {
                id: 100 + i,
                book_id: 10,
                heading: format!("chapter {i}"),
            })
            .collect::<Vec<_>>()
    };
    // All three levels created in one run, in one sink call per database.
    let stats = sync_chain(&f, authors(), books(), chapters()).await?;
    assert_eq!(stats.created, 3 + 5, "three tables, five rows: {stats:?}");
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM chapters JOIN books ON books.id = book_id \
         JOIN authors ON authors.id = author_id",
    )
    .fetch_one(&f.pool)
    .await?;
    assert_eq!(n, 3);
    // All three levels deleted in one run: grandchildren first.
    let stats = sync_chain(&f, vec![], vec![], vec![]).await?;
    assert_eq!(stats.deleted, 5, "{stats:?}");
    for table in ["authors", "books", "chapters"] {
        let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(&f.pool)
            .await?;
        assert_eq!(n, 0, "{table}");
    }
    Ok(())
}

/// Creates `a_books`, whose rows reference `b_authors`, in `schema` (a
/// database the pool's connections see), then declares a book and its
/// author in one run without `depends_on`: the call writes the tables in
/// name order, the book before its author, in separate statements, so
/// only a foreign key checked at the commit lets it pass.
async fn write_a_book_before_its_author(app: &App, pool: &SqlitePool, schema: &str) -> Result<()> {
    for ddl in [
        format!("CREATE TABLE {schema}.b_authors (id INTEGER PRIMARY KEY, name TEXT NOT NULL)"),
        format!(
            "CREATE TABLE {schema}.a_books (id INTEGER PRIMARY KEY, author_id INTEGER NOT NULL \
             REFERENCES b_authors(id), title TEXT NOT NULL)"
        ),
    ] {
        sqlx::query(&ddl).execute(pool).await?;
    }
    let stats = bounded(app.run(move |ctx| async move {
        let user = || TableOptions {
            managed_by: ManagedBy::User,
        };
        let authors =
            sqlite::mount_table_target_with(&ctx, &db(), "b_authors", authors_schema()?, user())
                .await?;
        let books =
            sqlite::mount_table_target_with(&ctx, &db(), "a_books", books_schema()?, user())
                .await?;
        books.declare_row(
            &ctx,
            &Book {
                id: 10,
                author_id: 1,
                title: "Earthsea".into(),
            },
        )?;
        authors.declare_row(
            &ctx,
            &Author {
                id: 1,
                name: "Le Guin".into(),
            },
        )
    }))
    .await?;
    assert_eq!(stats.created, 2 + 2, "two tables, two rows: {stats:?}");
    let n: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {schema}.a_books JOIN {schema}.b_authors \
         ON b_authors.id = author_id"
    ))
    .fetch_one(pool)
    .await?;
    assert_eq!(n, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn related_rows_of_one_call_land_even_in_tables_not_declared_dependent() -> Result<()> {
    let f = fixture().await?;
    write_a_book_before_its_author(&f.app, &f.pool, "main").await
}

#[tokio::test(flavor = "multi_thread")]
async fn related_rows_of_one_call_land_in_tables_of_an_attached_database() -> Result<()> {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    let dir = tempfile::tempdir()?;
    let aux = dir.path().join("aux.db").to_string_lossy().into_owned();
    // Every connection attaches the second database, where the tables are.
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .after_connect(move |conn, _| {
            let aux = aux.clone();
            Box::pin(async move {
                sqlx::query("ATTACH DATABASE ? AS aux")
                    .bind(aux)
                    .execute(conn)
                    .await
                    .map(|_| ())
            })
        })
        .connect_with(
            SqliteConnectOptions::new()
                .filename(dir.path().join("main.db"))
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .foreign_keys(true),
        )
        .await?;
    let app = App::builder("sqlite-attached")
        .ledger_path(dir.path().join("ledger"))
        .provide_key(&db(), pool.clone())
        .build()
        .await?;
    write_a_book_before_its_author(&app, &pool, "aux").await
}

/// Mounts each of `names` (spellings of `docs`) and declares `rows` into
/// the first.
async fn sync_spellings(f: &Fixture, names: &[&str], rows: Vec<Doc>) -> Result<UpdateStats> {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    bounded(f.app.run(move |ctx| async move {
        let mut tables = Vec::new();
        for name in &names {
            tables.push(sqlite::mount_table_target(&ctx, &db(), name, docs_schema()?).await?);
        }
        if let Some(first) = tables.first() {
            for row in &rows {
                first.declare_row(&ctx, row)?;
            }
        }
        Ok(())
    }))
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn two_spellings_of_one_table_name_in_one_run_are_one_table_declared_twice() -> Result<()> {
    let f = fixture().await?;
    let err = match sync_spellings(&f, &["Docs", "docs"], vec![doc("a", "A", None)]).await {
        Ok(stats) => return Err(Error::msg(format!("the run succeeded: {stats:?}"))),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("[\"db\",\"docs\"]"), "{err}");
    assert!(err.contains("twice"), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_table_renamed_only_in_case_is_the_same_table_with_the_same_rows() -> Result<()> {
    let f = fixture().await?;
    sync_spellings(
        &f,
        &["Docs"],
        vec![doc("a", "A", Some(1)), doc("b", "B", None)],
    )
    .await?;
    // SQLite takes `docs` for `Docs`: the same table, so the row no longer
    // declared is deleted and the other is left alone.
    let stats = sync_spellings(&f, &["docs"], vec![doc("a", "A", Some(1))]).await?;
    assert_eq!((stats.deleted, stats.unchanged), (1, 2), "{stats:?}");
    let want = expected(&[("a", "A", Some(1))]);
    assert_eq!(read_docs(&f.pool).await?, want);
    let stats = sync_spellings(&f, &["docs"], vec![doc("a", "A", Some(1))]).await?;
    assert_eq!(stats.unchanged, 2, "{stats:?}");
    assert_eq!(read_docs(&f.pool).await?, want);
    Ok(())
}

#[derive(Serialize)]
struct Blob {
    id: Vec<u8>,
    n: i64,
}

#[tokio::test(flavor = "multi_thread")]
async fn byte_keys_that_extend_each_other_with_zeros_are_deleted_together() -> Result<()> {
    let f = fixture().await?;
    let schema = || {
        TableSchema::builder()
            .column("id", ColumnType::Bytes)
            .column("n", ColumnType::BigInt)
            .primary_key(["id"])
            .build()
    };
    let blob = |id: &[u8], n| Blob { id: id.to_vec(), n };
    let all = vec![
        blob(&[], 0),
        blob(&[0, 0], 1),
        blob(&[1], 2),
        blob(&[1, 0], 3),
        blob(&[7], 4),
    ];
    sync_rows(&f, schema()?, all).await?;
    // [1] encodes to a byte prefix of [1, 0] (and [] of [0, 0]): neither
    // may be taken for a state below the other.
    let stats = sync_rows(&f, schema()?, vec![blob(&[7], 4)]).await?;
    assert_eq!(stats.deleted, 4, "{stats:?}");
    let left: Vec<Vec<u8>> = sqlx::query_scalar("SELECT id FROM docs")
        .fetch_all(&f.pool)
        .await?;
    assert_eq!(left, vec![vec![7u8]]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_locked_by_another_writer_is_waited_for_and_the_rows_land() -> Result<()> {
    let f = fixture().await?;
    sync_docs(&f, vec![doc("a", "A", Some(1))]).await?;
    // Another connection holds the write lock for a while.
    let mut other = f.pool.acquire().await?;
    sqlx::query("BEGIN IMMEDIATE").execute(&mut *other).await?;
    sqlx::query("INSERT INTO docs (id, title) VALUES ('theirs', 'x')")
        .execute(&mut *other)
        .await?;
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        sqlx::query("COMMIT").execute(&mut *other).await.map(|_| ())
    });
    let started = std::time::Instant::now();
    sync_docs(&f, vec![doc("a", "A2", Some(1)), doc("b", "B", None)]).await?;
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "weir waited for the lock rather than failing"
    );
    release
        .await
        .map_err(|e| Error::msg(format!("the lock holder panicked: {e}")))??;
    assert_eq!(
        read_docs(&f.pool).await?,
        expected(&[
            ("a", "A2", Some(1)),
            ("b", "B", None),
            ("theirs", "x", None)
        ])
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Keys of every type
// ---------------------------------------------------------------------------

/// Each row of `docs` (a key case's table) by its `v`: its rowid and its
/// key columns as SQL literals (`quote`), in `v` order.
async fn keyed_rows(pool: &SqlitePool, case: &KeyCase) -> Result<Vec<(String, i64, String)>> {
    let key: Vec<String> = (0..case.types.len())
        .map(|i| format!("quote(k{i})"))
        .collect();
    let sql = format!(
        "SELECT v, rowid, {} FROM docs ORDER BY v",
        key.join(" || ' | ' || ")
    );
    Ok(sqlx::query_as(&sql).fetch_all(pool).await?)
}

fn vs(rows: &[(String, i64, String)]) -> Vec<String> {
    rows.iter().map(|(v, _, _)| v.clone()).collect()
}

/// Declares the rows of `case`, then all of them again with other values
/// and their JSON members in another order (one update each, in place),
/// then every other one (the rest deleted, the kept ones untouched), then
/// none, checking the table itself after each run.
async fn check_key_case(case: &KeyCase) -> Result<()> {
    let f = fixture().await?;
    let n = case.keys.len() as u64;
    let all = |_| true;

    let stats = sync_rows(&f, case.schema()?, case.rows("first", false, all)).await?;
    let rows = keyed_rows(&f.pool, case).await?;
    if stats.created != n + 1 || vs(&rows) != case.values("first", all) {
        return Err(Error::msg(format!(
            "the first run wrote {rows:?} ({stats:?})"
        )));
    }
    let first = rows;

    let stats = sync_rows(&f, case.schema()?, case.rows("second", true, all)).await?;
    let rows = keyed_rows(&f.pool, case).await?;
    if (stats.created, stats.deleted) != (0, 0) || vs(&rows) != case.values("second", all) {
        return Err(Error::msg(format!(
            "updating every row (keys respelled) left {rows:?} ({stats:?})"
        )));
    }
    let same_rows = rows
        .iter()
        .zip(&first)
        .all(|((_, id, key), (_, id0, key0))| id == id0 && key == key0);
    if !same_rows {
        return Err(Error::msg(format!(
            "updates replaced rows or changed their keys: {first:?} became {rows:?}"
        )));
    }
    let updated = rows;

    let stats = sync_rows(&f, case.schema()?, case.rows("second", false, keys::kept)).await?;
    let rows = keyed_rows(&f.pool, case).await?;
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

    let stats = sync_rows(&f, case.schema()?, Vec::<keys::KeyedRow>::new()).await?;
    let rows = keyed_rows(&f.pool, case).await?;
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
    let mut failures = Vec::new();
    for case in keys::cases().iter().chain(&keys::nested_array_cases()) {
        if let Err(e) = check_key_case(case).await {
            failures.push(format!("key {}: {e}", case.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}
