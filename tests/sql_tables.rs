//! The SQL table target's behaviour, written once and run against both
//! dialects: each test is a generic function over [`Db`], run as
//! `<behaviour>::sqlite` and `<behaviour>::postgres`. What only one dialect
//! does (SQLite's names that ignore case and its bind limit, PostgreSQL's
//! COPY of new rows) is tested in `connectors_sqlite.rs` and
//! `connectors_postgres.rs`.
//!
//! PostgreSQL is the test server (see `pg/mod.rs`); when none answers, its
//! tests print `SKIPPED` and pass, except under `CI=true`.

#[path = "sql_tables/db.rs"]
mod db;
#[path = "sql_tables/docs.rs"]
mod docs;
mod support;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use weir::connectors::sql::{ColumnType, TableOptions, TableSchema};
use weir::prelude::*;
use weir::statediff::ManagedBy;

use db::{texts, Db, Lite, Pg, TextRow};
use docs::{doc, docs_schema, Doc};
use support::failed_paths;

/// Runs each behaviour against both dialects.
macro_rules! both_dialects {
    ($($behaviour:ident),* $(,)?) => {$(
        mod $behaviour {
            #[tokio::test(flavor = "multi_thread")]
            async fn sqlite() -> weir::Result<()> {
                super::in_a_fresh_database::<super::Lite, _, _>(
                    stringify!($behaviour),
                    super::$behaviour::<super::Lite>,
                )
                .await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn postgres() -> weir::Result<()> {
                super::in_a_fresh_database::<super::Pg, _, _>(
                    stringify!($behaviour),
                    super::$behaviour::<super::Pg>,
                )
                .await
            }
        }
    )*};
}

both_dialects!(
    rows_are_created_updated_and_deleted_as_declared,
    an_unchanged_run_writes_no_row,
    a_table_dropped_by_hand_stops_the_next_run_with_what_to_do_and_is_not_recreated_empty,
    an_added_nullable_column_keeps_the_rows_data,
    a_dropped_column_is_dropped_and_every_row_written_again,
    a_retyped_column_is_dropped_and_added_again_and_every_row_written_again,
    a_new_primary_key_recreates_the_table_and_its_rows,
    a_table_weir_created_is_dropped_when_no_longer_declared,
    a_table_the_user_manages_is_written_but_never_created_altered_or_dropped,
    a_table_taken_over_from_the_user_keeps_the_columns_it_had_and_its_rows_are_written_again,
    drop_state_deletes_the_rows_weir_wrote_into_a_table_the_user_manages_and_leaves_the_rest,
    composite_keys_are_upserted_and_deleted,
    a_child_table_with_a_real_foreign_key_is_written_after_its_parent_and_deleted_before_it,
    a_unique_violation_fails_only_the_component_whose_row_collides_naming_table_and_key,
    a_value_the_column_cannot_hold_fails_only_its_component_naming_table_column_and_key,
    names_that_are_not_identifiers_are_refused_and_nothing_is_created,
    a_row_declared_twice_in_one_run_fails_its_component_naming_the_key,
    a_table_declared_in_a_component_is_created_when_it_commits_before_its_rows,
);

/// Runs `behaviour` in a database of its own, and drops it after.
async fn in_a_fresh_database<D, F, Fut>(test: &str, behaviour: F) -> Result<()>
where
    D: Db,
    F: FnOnce(Arc<D>) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let Some(db) = D::fresh(test).await? else {
        return Ok(());
    };
    let db = Arc::new(db);
    let outcome = tokio::time::timeout(Duration::from_secs(120), behaviour(Arc::clone(&db)))
        .await
        .map_err(|_| Error::msg(format!("{test} ({}) timed out", D::NAME)))?;
    match Arc::try_unwrap(db) {
        Ok(db) => db.finish().await?,
        Err(_) => return Err(Error::msg("the test kept its database")),
    }
    outcome
}

// ---------------------------------------------------------------------------
// Support
// ---------------------------------------------------------------------------

/// Mounts `table` with `schema` and `options` and declares `rows` into
/// it, each row in a component of its own (keyed by `key`).
async fn sync_with<D: Db, R>(
    app: &App,
    table: &str,
    schema: TableSchema,
    options: TableOptions,
    rows: Vec<R>,
    key: fn(&R) -> String,
) -> Result<UpdateStats>
where
    R: Serialize + Send + Sync + 'static,
{
    let table = table.to_string();
    app.run(move |ctx| async move {
        let target = D::mount(&ctx, &table, schema, options).await?;
        ctx.mount_each(rows, key, move |c, row| {
            let target = target.clone();
            async move { D::declare_row(&target, &c, &row) }
        })
        .await
    })
    .await
}

/// Syncs `docs` rows into the table `table`, weir's.
async fn sync_docs<D: Db>(app: &App, table: &str, rows: Vec<Doc>) -> Result<UpdateStats> {
    sync_docs_with::<D>(app, table, TableOptions::default(), rows).await
}

/// Syncs `docs` rows into the table `table`, declared with `options`.
async fn sync_docs_with<D: Db>(
    app: &App,
    table: &str,
    options: TableOptions,
    rows: Vec<Doc>,
) -> Result<UpdateStats> {
    sync_with::<D, _>(app, table, docs_schema()?, options, rows, |d| d.id.clone()).await
}

/// Syncs rows `a` and `b` into `table`, then changes `a`'s title by hand.
async fn two_docs_one_changed_by_hand<D: Db>(db: &D, app: &App, table: &str) -> Result<()> {
    sync_docs::<D>(
        app,
        table,
        vec![doc("a", "A", Some(1)), doc("b", "B", Some(2))],
    )
    .await?;
    db.exec(&format!(
        "UPDATE \"{table}\" SET title = 'by hand' WHERE id = 'a'"
    ))
    .await
}

/// The `id, title, n` rows of a docs table.
async fn docs<D: Db>(db: &D, table: &str) -> Result<Vec<TextRow>> {
    db.rows(table, &["id", "title", "n"], "id").await
}

fn err_of<T: std::fmt::Debug>(result: Result<T>, what: &str) -> Result<Error> {
    match result {
        Ok(ok) => Err(Error::msg(format!("{what} should have failed: {ok:?}"))),
        Err(e) => Ok(e),
    }
}

// ---------------------------------------------------------------------------
// Rows
// ---------------------------------------------------------------------------

async fn rows_are_created_updated_and_deleted_as_declared<D: Db>(db: Arc<D>) -> Result<()> {
    let (app, t) = (db.app("crud").await?, "docs");
    let stats = sync_docs::<D>(
        &app,
        t,
        vec![
            doc("a", "A", None),
            doc("b", "B", Some(2)),
            doc("c", "C", Some(3)),
        ],
    )
    .await?;
    assert_eq!(stats.created, 4, "the table and its three rows: {stats:?}");
    assert_eq!(
        docs(&*db, t).await?,
        texts(&[
            &[Some("a"), Some("A"), None],
            &[Some("b"), Some("B"), Some("2")],
            &[Some("c"), Some("C"), Some("3")],
        ])
    );
    let stats = sync_docs::<D>(&app, t, vec![doc("a", "A", None), doc("b", "B2", None)]).await?;
    assert_eq!(
        (stats.updated, stats.deleted, stats.unchanged),
        (1, 1, 2),
        "b updated, c deleted, a and the table unchanged: {stats:?}"
    );
    assert_eq!(
        docs(&*db, t).await?,
        texts(&[
            &[Some("a"), Some("A"), None],
            &[Some("b"), Some("B2"), None]
        ])
    );
    Ok(())
}

async fn an_unchanged_run_writes_no_row<D: Db>(db: Arc<D>) -> Result<()> {
    let (app, t) = (db.app("unchanged").await?, "docs");
    let rows: Vec<Doc> = (0..20)
        .map(|i| doc(&format!("k{i:02}"), "same", Some(i)))
        .collect();
    sync_docs::<D>(&app, t, rows.clone()).await?;
    // A row changed behind weir's back stays as it is: weir writes only
    // what its records say changed.
    db.exec(&format!(
        "UPDATE \"{t}\" SET title = 'by hand' WHERE id = 'k05'"
    ))
    .await?;
    let stats = sync_docs::<D>(&app, t, rows).await?;
    assert_eq!(
        (stats.created, stats.updated, stats.deleted, stats.unchanged),
        (0, 0, 0, 21),
        "{stats:?}"
    );
    let by_hand = db
        .rows(t, &["title"], "id")
        .await?
        .into_iter()
        .filter(|r| r[0].as_deref() == Some("by hand"))
        .count();
    assert_eq!(by_hand, 1);
    Ok(())
}

async fn a_table_dropped_by_hand_stops_the_next_run_with_what_to_do_and_is_not_recreated_empty<
    D: Db,
>(
    db: Arc<D>,
) -> Result<()> {
    let (app, t) = (db.app("lost").await?, "docs");
    let rows = || vec![doc("a", "x", None), doc("b", "y", Some(1))];
    sync_docs::<D>(&app, t, rows()).await?;
    db.exec(&format!("DROP TABLE \"{t}\"")).await?;
    for run in 0..2 {
        let err = err_of(
            sync_docs::<D>(&app, t, rows()).await,
            "a run whose table was dropped by hand",
        )?;
        let text = err.to_string();
        assert!(text.contains(t), "run {run}: {text}");
        assert!(text.contains("restore it"), "run {run}: {text}");
        assert!(text.contains("weir drop"), "run {run}: {text}");
        assert!(
            !db.exists(t).await?,
            "run {run} created an empty table under rows recorded as written"
        );
    }
    // Restored by hand, the table is written again.
    db.exec(&format!(
        "CREATE TABLE \"{t}\" (id TEXT NOT NULL PRIMARY KEY, title TEXT NOT NULL, n BIGINT)"
    ))
    .await?;
    sync_docs::<D>(&app, t, vec![doc("a", "x", None), doc("b", "z", Some(1))]).await?;
    assert_eq!(
        docs(&*db, t).await?,
        texts(&[&[Some("b"), Some("z"), Some("1")]]),
        "rows recorded as written are not written again; changed ones are"
    );
    Ok(())
}

async fn composite_keys_are_upserted_and_deleted<D: Db>(db: Arc<D>) -> Result<()> {
    #[derive(Clone, Serialize)]
    struct Cell {
        sheet: String,
        n: i64,
        value: String,
    }
    let cell = |sheet: &str, n: i64, value: &str| Cell {
        sheet: sheet.into(),
        n,
        value: value.into(),
    };
    let schema = TableSchema::builder()
        .column("sheet", ColumnType::Text)
        .column("n", ColumnType::BigInt)
        .column("value", ColumnType::Text)
        .primary_key(["sheet", "n"])
        .build()?;
    let (app, t) = (db.app("composite").await?, "cells");
    let key = |c: &Cell| format!("{}/{}", c.sheet, c.n);
    let sync = |cells: Vec<Cell>| {
        sync_with::<D, _>(&app, t, schema.clone(), TableOptions::default(), cells, key)
    };
    sync(vec![
        cell("a", 1, "x"),
        cell("a", 2, "y"),
        cell("b", 1, "z"),
    ])
    .await?;
    sync(vec![cell("a", 1, "x2"), cell("b", 1, "z")]).await?;
    assert_eq!(
        db.rows(t, &["sheet", "n", "value"], "sheet, n").await?,
        texts(&[
            &[Some("a"), Some("1"), Some("x2")],
            &[Some("b"), Some("1"), Some("z")],
        ])
    );
    Ok(())
}

async fn a_row_declared_twice_in_one_run_fails_its_component_naming_the_key<D: Db>(
    db: Arc<D>,
) -> Result<()> {
    let (app, t) = (db.app("twice").await?, "docs");
    let twice = vec![doc("a", "A", None), doc("a", "again", None)];
    let table = t;
    let result = app
        .run(move |ctx| async move {
            let target = D::mount(&ctx, table, docs_schema()?, TableOptions::default()).await?;
            for row in &twice {
                D::declare_row(&target, &ctx, row)?;
            }
            Ok(())
        })
        .await;
    let err = err_of(result, "a row declared twice")?;
    assert!(err.to_string().contains("\"a\""), "{err}");
    Ok(())
}

async fn a_table_declared_in_a_component_is_created_when_it_commits_before_its_rows<D: Db>(
    db: Arc<D>,
) -> Result<()> {
    let (app, t) = (db.app("declared").await?, "docs");
    let run = |rows: Vec<Doc>| {
        let table = t;
        app.run(move |ctx| async move {
            ctx.mount("docs", move |ctx| async move {
                let target = D::declare(&ctx, table, docs_schema()?, TableOptions::default())?;
                for row in &rows {
                    D::declare_row(&target, &ctx, row)?;
                }
                Ok(())
            })
            .await
        })
    };
    run(vec![doc("a", "A", None), doc("b", "B", Some(2))]).await?;
    assert_eq!(
        docs(&*db, t).await?,
        texts(&[
            &[Some("a"), Some("A"), None],
            &[Some("b"), Some("B"), Some("2")]
        ])
    );
    run(vec![doc("b", "B2", Some(2))]).await?;
    assert_eq!(
        docs(&*db, t).await?,
        texts(&[&[Some("b"), Some("B2"), Some("2")]])
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Schema changes
// ---------------------------------------------------------------------------

/// The docs schema with `n` retyped as `n_type` and a nullable column
/// `extra` added when `extra` is set.
fn docs_schema_with(n_type: ColumnType, extra: bool) -> Result<TableSchema> {
    let b = TableSchema::builder()
        .column("id", ColumnType::Text)
        .column("title", ColumnType::Text)
        .nullable_column("n", n_type);
    let b = if extra {
        b.nullable_column("extra", ColumnType::Text)
    } else {
        b
    };
    b.primary_key(["id"]).build()
}

#[derive(Clone, Serialize)]
struct Wide {
    id: String,
    title: String,
    n: Option<i64>,
    extra: Option<String>,
}

async fn an_added_nullable_column_keeps_the_rows_data<D: Db>(db: Arc<D>) -> Result<()> {
    let (app, t) = (db.app("added").await?, "docs");
    // A row weir does not write again keeps what was changed by hand.
    two_docs_one_changed_by_hand(&*db, &app, t).await?;
    let wide = |id: &str, title: &str, n: i64, extra: Option<&str>| Wide {
        id: id.into(),
        title: title.into(),
        n: Some(n),
        extra: extra.map(str::to_string),
    };
    let stats = sync_with::<D, _>(
        &app,
        t,
        docs_schema_with(ColumnType::BigInt, true)?,
        TableOptions::default(),
        vec![wide("a", "A", 1, None), wide("b", "B", 2, Some("new"))],
        |w| w.id.clone(),
    )
    .await?;
    assert_eq!(db.columns(t).await?, vec!["id", "title", "n", "extra"]);
    assert_eq!(stats.unchanged, 1, "row a did not change: {stats:?}");
    assert_eq!(
        db.rows(t, &["id", "title", "extra"], "id").await?,
        texts(&[
            &[Some("a"), Some("by hand"), None],
            &[Some("b"), Some("B"), Some("new")],
        ])
    );
    Ok(())
}

#[derive(Clone, Serialize)]
struct Narrow {
    id: String,
    title: String,
}

async fn a_dropped_column_is_dropped_and_every_row_written_again<D: Db>(db: Arc<D>) -> Result<()> {
    let (app, t) = (db.app("dropped").await?, "docs");
    two_docs_one_changed_by_hand(&*db, &app, t).await?;
    let narrow = TableSchema::builder()
        .column("id", ColumnType::Text)
        .column("title", ColumnType::Text)
        .primary_key(["id"])
        .build()?;
    let rows = vec![
        Narrow {
            id: "a".into(),
            title: "A".into(),
        },
        Narrow {
            id: "b".into(),
            title: "B".into(),
        },
    ];
    let stats = sync_with::<D, _>(&app, t, narrow, TableOptions::default(), rows, |r| {
        r.id.clone()
    })
    .await?;
    assert_eq!(db.columns(t).await?, vec!["id", "title"]);
    assert_eq!(
        stats.updated, 3,
        "the table and both rows (Lossy): {stats:?}"
    );
    assert_eq!(
        db.rows(t, &["id", "title"], "id").await?,
        texts(&[&[Some("a"), Some("A")], &[Some("b"), Some("B")]])
    );
    Ok(())
}

async fn a_retyped_column_is_dropped_and_added_again_and_every_row_written_again<D: Db>(
    db: Arc<D>,
) -> Result<()> {
    #[derive(Clone, Serialize)]
    struct Retyped {
        id: String,
        title: String,
        n: Option<String>,
    }
    let (app, t) = (db.app("retyped").await?, "docs");
    sync_docs::<D>(&app, t, vec![doc("a", "A", Some(1))]).await?;
    let rows = vec![Retyped {
        id: "a".into(),
        title: "A".into(),
        n: Some("one".into()),
    }];
    let stats = sync_with::<D, _>(
        &app,
        t,
        docs_schema_with(ColumnType::Text, false)?,
        TableOptions::default(),
        rows,
        |r| r.id.clone(),
    )
    .await?;
    assert_eq!(stats.updated, 2, "the table and its row (Lossy): {stats:?}");
    assert_eq!(
        db.rows(t, &["id", "n"], "id").await?,
        texts(&[&[Some("a"), Some("one")]])
    );
    Ok(())
}

async fn a_new_primary_key_recreates_the_table_and_its_rows<D: Db>(db: Arc<D>) -> Result<()> {
    let (app, t) = (db.app("rekeyed").await?, "docs");
    let rows = || vec![doc("a", "A", Some(1)), doc("b", "B", Some(2))];
    sync_docs::<D>(&app, t, rows()).await?;
    db.exec(&format!(
        "INSERT INTO \"{t}\" (id, title) VALUES ('stray', 'not weir''s')"
    ))
    .await?;
    let rekeyed = TableSchema::builder()
        .column("id", ColumnType::Text)
        .column("title", ColumnType::Text)
        .nullable_column("n", ColumnType::BigInt)
        .primary_key(["title"])
        .build()?;
    let stats = sync_with::<D, _>(&app, t, rekeyed, TableOptions::default(), rows(), |d| {
        d.id.clone()
    })
    .await?;
    assert_eq!(
        stats.created, 2,
        "rows created again (Destructive): {stats:?}"
    );
    assert_eq!(
        docs(&*db, t).await?,
        texts(&[
            &[Some("a"), Some("A"), Some("1")],
            &[Some("b"), Some("B"), Some("2")],
        ]),
        "the table was created again, without the stray row"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Who manages a table
// ---------------------------------------------------------------------------

fn users_own() -> TableOptions {
    TableOptions::default().managed_by(ManagedBy::User)
}

async fn sync_nothing<D: Db>(app: &App) -> Result<UpdateStats> {
    app.run(|ctx| async move { D::register(&ctx) }).await
}

async fn a_table_weir_created_is_dropped_when_no_longer_declared<D: Db>(db: Arc<D>) -> Result<()> {
    let (app, t) = (db.app("dropped_table").await?, "docs");
    sync_docs::<D>(&app, t, vec![doc("a", "A", None)]).await?;
    assert!(db.exists(t).await?);
    let stats = sync_nothing::<D>(&app).await?;
    assert_eq!(stats.deleted, 1, "the table, its rows with it: {stats:?}");
    assert!(!db.exists(t).await?);
    Ok(())
}

async fn a_table_the_user_manages_is_written_but_never_created_altered_or_dropped<D: Db>(
    db: Arc<D>,
) -> Result<()> {
    let (app, t) = (db.app("users").await?, "docs");
    let result = sync_docs_with::<D>(&app, t, users_own(), vec![doc("a", "A", None)]).await;
    err_of(result, "rows into a user's table that does not exist")?;
    assert!(!db.exists(t).await?, "weir never creates the user's table");
    db.exec(&format!(
        "CREATE TABLE \"{t}\" (id TEXT PRIMARY KEY, title TEXT NOT NULL, n BIGINT, theirs TEXT); \
         INSERT INTO \"{t}\" (id, title, theirs) VALUES ('x', 'X', 'kept')"
    ))
    .await?;
    sync_docs_with::<D>(&app, t, users_own(), vec![doc("a", "A", None)]).await?;
    assert_eq!(db.columns(t).await?, vec!["id", "title", "n", "theirs"]);
    sync_nothing::<D>(&app).await?;
    assert_eq!(
        db.rows(t, &["id", "theirs"], "id").await?,
        texts(&[&[Some("a"), None], &[Some("x"), Some("kept")]]),
        "a table the user manages is left, rows and all, when no longer declared"
    );
    Ok(())
}

async fn a_table_taken_over_from_the_user_keeps_the_columns_it_had_and_its_rows_are_written_again<
    D: Db,
>(
    db: Arc<D>,
) -> Result<()> {
    let (app, t) = (db.app("takeover").await?, "docs");
    db.exec(&format!(
        "CREATE TABLE \"{t}\" (id TEXT PRIMARY KEY, title TEXT NOT NULL, theirs TEXT, n BIGINT); \
         INSERT INTO \"{t}\" (id, title, theirs) VALUES ('x', 'X', 'kept')"
    ))
    .await?;
    let sync = |options| sync_docs_with::<D>(&app, t, options, vec![doc("a", "A", Some(1))]);
    sync(users_own()).await?;
    db.exec(&format!(
        "UPDATE \"{t}\" SET title = 'by hand' WHERE id = 'a'"
    ))
    .await?;
    // Taken over: the rows weir tracks are written again, since the user
    // may have changed them; the table keeps the columns it had.
    let stats = sync(TableOptions::default()).await?;
    assert_eq!(stats.updated, 2, "the table and its row: {stats:?}");
    assert_eq!(db.columns(t).await?, vec!["id", "title", "theirs", "n"]);
    assert_eq!(
        db.rows(t, &["id", "title", "theirs"], "id").await?,
        texts(&[
            &[Some("a"), Some("A"), None],
            &[Some("x"), Some("X"), Some("kept")]
        ])
    );
    // weir's now: dropped when no longer declared.
    sync_nothing::<D>(&app).await?;
    assert!(!db.exists(t).await?);
    Ok(())
}

async fn drop_state_deletes_the_rows_weir_wrote_into_a_table_the_user_manages_and_leaves_the_rest<
    D: Db,
>(
    db: Arc<D>,
) -> Result<()> {
    let (app, t) = (db.app("userdrop").await?, "docs");
    db.exec(&format!(
        "CREATE TABLE \"{t}\" (id TEXT PRIMARY KEY, title TEXT NOT NULL, n BIGINT); \
         INSERT INTO \"{t}\" (id, title) VALUES ('theirs', 'kept')"
    ))
    .await?;
    sync_docs_with::<D>(
        &app,
        t,
        users_own(),
        vec![doc("a", "A", None), doc("b", "B", None)],
    )
    .await?;
    let stats = app
        .drop_state(|ctx| async move { D::register(&ctx) })
        .await?;
    assert_eq!(
        stats.deleted, 3,
        "the table's record and two rows: {stats:?}"
    );
    assert!(db.exists(t).await?, "the user's table stays");
    assert_eq!(
        db.rows(t, &["id", "title"], "id").await?,
        texts(&[&[Some("theirs"), Some("kept")]])
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Related tables, constraints and bad input
// ---------------------------------------------------------------------------

#[derive(Clone, Serialize)]
struct Author {
    id: String,
    name: String,
}

#[derive(Clone, Serialize)]
struct Book {
    id: String,
    author: String,
}

/// Authors and books (whose `author` references an author) in one run,
/// each row in a component of its own.
async fn sync_library<D: Db>(
    app: &App,
    (authors_table, books_table): (&str, &str),
    authors: Vec<Author>,
    books: Vec<Book>,
) -> Result<UpdateStats> {
    let (a, b) = (authors_table.to_string(), books_table.to_string());
    app.run(move |ctx| async move {
        let author_schema = TableSchema::builder()
            .column("id", ColumnType::Text)
            .column("name", ColumnType::Text)
            .primary_key(["id"])
            .build()?;
        let book_schema = TableSchema::builder()
            .column("id", ColumnType::Text)
            .column("author", ColumnType::Text)
            .primary_key(["id"])
            .build()?;
        let authors_target = D::mount(&ctx, &a, author_schema, TableOptions::default()).await?;
        let books_target = D::mount(&ctx, &b, book_schema, TableOptions::default()).await?;
        let books_target = D::depends_on(books_target, &authors_target);
        ctx.mount_each(
            authors,
            |a| format!("author/{}", a.id),
            move |c, a| {
                let t = authors_target.clone();
                async move { D::declare_row(&t, &c, &a) }
            },
        )
        .await?;
        ctx.mount_each(
            books,
            |b| format!("book/{}", b.id),
            move |c, b| {
                let t = books_target.clone();
                async move { D::declare_row(&t, &c, &b) }
            },
        )
        .await
    })
    .await
}

async fn a_child_table_with_a_real_foreign_key_is_written_after_its_parent_and_deleted_before_it<
    D: Db,
>(
    db: Arc<D>,
) -> Result<()> {
    let app = db.app("library").await?;
    let (a, b) = ("authors", "books");
    db.exec(&format!(
        "CREATE TABLE \"{a}\" (id TEXT PRIMARY KEY, name TEXT NOT NULL); \
         CREATE TABLE \"{b}\" (id TEXT PRIMARY KEY, \
           author TEXT NOT NULL REFERENCES \"{a}\" (id))"
    ))
    .await?;
    let author = |id: &str| Author {
        id: id.into(),
        name: id.to_uppercase(),
    };
    let book = |id: &str, by: &str| Book {
        id: id.into(),
        author: by.into(),
    };
    sync_library::<D>(
        &app,
        (a, b),
        vec![author("ann"), author("bob")],
        vec![book("b1", "ann"), book("b2", "bob")],
    )
    .await?;
    // Bob and his book go in one run: the book is deleted first.
    sync_library::<D>(&app, (a, b), vec![author("ann")], vec![book("b1", "ann")]).await?;
    assert_eq!(
        db.rows(b, &["id", "author"], "id").await?,
        texts(&[&[Some("b1"), Some("ann")]])
    );
    assert_eq!(db.rows(a, &["id"], "id").await?, texts(&[&[Some("ann")]]));
    Ok(())
}

#[derive(Clone, Serialize)]
struct User {
    id: String,
    email: String,
}

async fn a_unique_violation_fails_only_the_component_whose_row_collides_naming_table_and_key<
    D: Db,
>(
    db: Arc<D>,
) -> Result<()> {
    let (app, t) = (db.app("unique").await?, "users");
    let schema = TableSchema::builder()
        .column("id", ColumnType::Text)
        .column("email", ColumnType::Text)
        .primary_key(["id"])
        .build()?;
    let sync = |users: &[(&str, &str)]| {
        let users: Vec<User> = users
            .iter()
            .map(|(id, email)| User {
                id: id.to_string(),
                email: email.to_string(),
            })
            .collect();
        sync_with::<D, _>(
            &app,
            t,
            schema.clone(),
            TableOptions::default(),
            users,
            |u| u.id.clone(),
        )
    };
    sync(&[("a", "a@x"), ("b", "b@x"), ("c", "c@x")]).await?;
    db.exec(&format!(
        "CREATE UNIQUE INDEX \"{t}_email\" ON \"{t}\" (email)"
    ))
    .await?;
    let err = err_of(
        sync(&[("a", "a@x"), ("b", "a@x"), ("c", "c2@x"), ("d", "d@x")]).await,
        "a row whose email collides",
    )?;
    assert_eq!(failed_paths(&err), vec!["/b"], "{err}");
    let text = err.to_string();
    assert!(text.contains(&format!("table {t}")), "{text}");
    assert!(text.contains("unique") || text.contains("UNIQUE"), "{text}");
    assert!(text.contains("\"b\""), "{text}");
    assert_eq!(
        db.rows(t, &["id", "email"], "id").await?,
        texts(&[
            &[Some("a"), Some("a@x")],
            &[Some("b"), Some("b@x")],
            &[Some("c"), Some("c2@x")],
            &[Some("d"), Some("d@x")],
        ]),
        "every other row landed; b kept its last value"
    );
    Ok(())
}

async fn a_value_the_column_cannot_hold_fails_only_its_component_naming_table_column_and_key<
    D: Db,
>(
    db: Arc<D>,
) -> Result<()> {
    #[derive(Clone, Serialize)]
    struct Scored {
        id: String,
        title: String,
        score: f64,
    }
    let scored = |id: &str, title: &str, score: f64| Scored {
        id: id.into(),
        title: title.into(),
        score,
    };
    let schema = TableSchema::builder()
        .column("id", ColumnType::Text)
        .column("title", ColumnType::Text)
        .column("score", ColumnType::Double)
        .primary_key(["id"])
        .build()?;
    let (app, t) = (db.app("values").await?, "scores");
    let rows = vec![
        scored("good1", "ok", 1.0),
        scored("nan", "ok", f64::NAN),
        scored("nul", "a\0b", 2.0),
        scored("good2", "ok", 3.0),
    ];
    let result = sync_with::<D, _>(&app, t, schema, TableOptions::default(), rows, |r| {
        r.id.clone()
    })
    .await;
    let err = err_of(result, "a run with NaN and NUL")?;
    assert_eq!(failed_paths(&err), vec!["/nan", "/nul"], "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("table {t}, column score")) && text.contains("row key \"nan\""),
        "{text}"
    );
    assert!(
        text.contains(&format!("table {t}, column title"))
            && text.contains("NUL")
            && text.contains("row key \"nul\""),
        "{text}"
    );
    assert_eq!(
        db.rows(t, &["id"], "id").await?,
        texts(&[&[Some("good1")], &[Some("good2")]])
    );
    Ok(())
}

async fn names_that_are_not_identifiers_are_refused_and_nothing_is_created<D: Db>(
    db: Arc<D>,
) -> Result<()> {
    let app = db.app("names").await?;
    for name in ["docs; DROP TABLE x", "a\"b", "", "x y"] {
        let name = name.to_string();
        let result = app
            .run(move |ctx| async move {
                D::mount(&ctx, &name, docs_schema()?, TableOptions::default())
                    .await
                    .map(|_| ())
            })
            .await;
        let err = err_of(result, "a bad table name")?;
        assert!(err.to_string().contains("invalid table name"), "{err}");
    }
    let bad_column = TableSchema::builder()
        .column("id\"); DROP TABLE docs; --", ColumnType::Text)
        .primary_key(["id\"); DROP TABLE docs; --"])
        .build();
    let err = err_of(bad_column, "a bad column name")?;
    assert!(err.to_string().contains("invalid column name"), "{err}");
    for table in ["docs; DROP TABLE x", "x y", "x"] {
        assert!(!db.exists(table).await?, "{table}");
    }
    Ok(())
}
