//! The SQLite target: tables (containers) whose children are rows.
//!
//! # Layout
//!
//! - this file: the user-facing API ([`mount_table_target`],
//!   [`declare_table_target`], [`TableTarget::declare_row`], [`connect`]).
//! - `target`: the table and row handlers (pure `reconcile`s).
//! - `sink`: the table and row sinks (all the I/O, one transaction per call).
//! - `ddl`: the SQL text (quoted identifiers, bound values).
//!
//! # Guarantees
//!
//! - A table's key is `[database, table]`, where `database` is the name of
//!   the [`ContextKey`] of its pool: the pool can change (another path,
//!   another connection setting) without losing track of what was written.
//! - A table's tracking record is its schema and who owns it. A changed
//!   schema is applied in place when it can be: added columns with
//!   `ALTER TABLE ADD COLUMN` (rows keep their data); dropped columns with
//!   `DROP COLUMN` and retyped ones by dropping and adding them again (every
//!   row is written again: `Lossy`). A changed primary key drops and
//!   creates the table again (`Destructive`: every row is created again).
//! - A table no longer declared is dropped when weir created it
//!   ([`ManagedBy::System`], the default) and abandoned, rows and all, when
//!   the user owns it ([`ManagedBy::User`]: weir never creates, alters or
//!   drops it, and only writes the rows declared into it).
//! - SQLite ignores the case of table names, and so does a table's key
//!   (its name in lower case; DDL uses the name as declared): `Docs` and
//!   `docs` are one table, declared twice if both are in one run, and a
//!   table renamed only in case keeps its rows. (A table no longer
//!   declared is not dropped while the run declares it in any spelling:
//!   ledgers from before keys were lower case hold `Docs` under its own
//!   key, and dropping it would drop the table just written. Rows that
//!   such an old key tracked and the run does not declare are left in the
//!   table, once.)
//! - A row's key is its primary key ([`Row::key`](crate::sql::Row::key)); its tracking record is a
//!   fingerprint of its values, so an unchanged row costs no write.
//! - All the rows of one database go through one sink (one per app and
//!   database): each sink call is one transaction over any number of
//!   tables, with multi-row
//!   upserts (`INSERT .. ON CONFLICT (pk) DO UPDATE`) and deletes, chunked
//!   under SQLite's bind limit. Deletes run first, children's tables before
//!   parents'; then upserts, parents' tables before children's (see
//!   [`TableTarget::depends_on`]). Foreign keys are deferred to the commit,
//!   so rows that reference each other within one call never fail for
//!   their order; across calls, a foreign-key violation is retried (the
//!   parent row may be in a later call) before its component fails. Two
//!   calls run at once, one grouping its rows while the other writes; they
//!   write in turn (a writer lock per database, so that neither waits on
//!   SQLite's busy timeout). Once a table depends on another, calls run one
//!   at a time, so that a parent's rows commit before its children's.
//! - When one call holds two actions for one row, the last one wins.
//! - A constraint violation (a `UNIQUE` index of the user's, a `CHECK`)
//!   fails only the components whose rows violate it, with an error naming
//!   the database, the table, the constraint and the row key. A busy or
//!   locked database is retried.
//!
//! # Caveats
//!
//! - A table is dropped only by a run that still registers its database:
//!   one that mounts another table of the same database, or calls
//!   [`register_database`].
//! - Open the database with [`connect`] (or the same settings): WAL
//!   journal, `synchronous = FULL`, foreign keys on and a busy timeout.
//!   weir records a row in its ledger once the row's transaction has
//!   committed; with `synchronous = NORMAL` a power cut could lose that
//!   commit but not the record, and weir would not write the row again
//!   until it changes.
//!
//! # Example
//!
//! ```no_run
//! use serde::Serialize;
//! use weir_actors::{App, ContextKey, Result};
//! use weir_connectors::sql::{ColumnType, TableSchema};
//! use weir_connectors::sqlite;
//!
//! #[derive(Serialize)]
//! struct Doc { id: String, body: String }
//!
//! # async fn example() -> Result<()> {
//! let db: ContextKey<sqlx::SqlitePool> = ContextKey::new("docs_db");
//! let pool = sqlite::connect("docs.db").await?;
//! let app = App::builder("docs").provide_key(&db, pool).build().await?;
//! app.run(move |ctx| async move {
//!     let schema = TableSchema::builder()
//!         .column("id", ColumnType::Text)
//!         .column("body", ColumnType::Text)
//!         .primary_key(["id"])
//!         .build()?;
//!     let docs = sqlite::mount_table_target(&ctx, &db, "docs", schema).await?;
//!     docs.declare_row(&ctx, &Doc { id: "a".into(), body: "hello".into() })?;
//!     Ok(())
//! })
//! .await?;
//! # Ok(())
//! # }
//! ```

mod db;
mod ddl;
mod dialect;
mod owners;
mod sink;
mod types;

use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::SqlitePool;
pub use weir_actors::statediff::ManagedBy;
use weir_actors::{ContextKey, Ctx, Error, PreviewAction, Result};

use crate::sql::table::{dialect::Dialect, target};
pub use crate::sql::PreviewedTable;
use crate::sql::TableSchema;
use db::Sqlite;
pub use owners::{table_owner, FILE_SUFFIX as OWNERS_FILE_SUFFIX};

/// The `sqlx` this connector is built on, re-exported so that pools and
/// queries use the same version.
pub use sqlx;

/// How long a connection made by [`connect`] waits for a locked database.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The most connections in a pool made by [`connect`].
pub const DEFAULT_MAX_CONNECTIONS: u32 = 4;

/// Opens (creating it if missing) a SQLite database file as weir expects
/// it: WAL journal (readers never block the writer), `synchronous =
/// FULL` (a commit is on disk before weir records it; one sync per sink
/// call), foreign keys enforced, and a [`DEFAULT_BUSY_TIMEOUT`].
///
/// # Errors
/// When the file cannot be created or opened, naming the path.
pub async fn connect(path: impl AsRef<Path>) -> Result<SqlitePool> {
    let path = path.as_ref();
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        .busy_timeout(DEFAULT_BUSY_TIMEOUT);
    SqlitePoolOptions::new()
        .max_connections(DEFAULT_MAX_CONNECTIONS)
        .connect_with(options)
        .await
        .map_err(|e| {
            Error::msg(format!(
                "cannot open sqlite database {}: {e}",
                path.display()
            ))
        })
}

pub use crate::sql::TableOptions;

/// A declared table: declare its rows with [`TableTarget::declare_row`].
#[derive(Clone, Debug)]
pub struct TableTarget(target::TableTarget<Sqlite>);

/// The name of the provider of the tables of the database provided under
/// the context key named `db`: the name [`App::inspect`](weir_actors::App::inspect)
/// counts their target states under: `weir.sqlite.table/<db>` (ledgers
/// of weir's format 2 and earlier named it `weir.sqlite/<db>/table`, and
/// are renamed when they open).
pub fn tables_provider_name(db: &str) -> String {
    Sqlite::tables_provider_name(db)
}

/// Which table of `db` an action listed by `App::preview` is about: the
/// table itself (created, altered, dropped), or a row of one of `tables`
/// (the action's key is the row's key). `None` for an action of another
/// provider, or a row of a table not in `tables`.
pub fn previewed_table(
    db: &ContextKey<SqlitePool>,
    tables: &[&str],
    action: &PreviewAction,
) -> Option<PreviewedTable> {
    target::previewed_table::<Sqlite>(db, tables, action)
}

/// Opens an existing SQLite database file for reading only: it is never
/// created, and nothing in it (nor its journal mode) is changed. For
/// looking without writing, such as a dry run's check of which tables
/// exist. When the database has no write-ahead log with content (it was
/// closed cleanly, or is not in WAL mode) it is opened as immutable, so
/// that no `-wal` or `-shm` file is created beside it either; use it then
/// while nothing else writes it.
///
/// # Errors
/// When the file does not exist or cannot be opened, naming the path.
pub async fn connect_read_only(path: impl AsRef<Path>) -> Result<SqlitePool> {
    let path = path.as_ref();
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let logged = std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0);
    let options = SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .immutable(!logged)
        .create_if_missing(false)
        .busy_timeout(DEFAULT_BUSY_TIMEOUT);
    SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .map_err(|e| {
            Error::msg(format!(
                "cannot open sqlite database {} to read it: {e}",
                path.display()
            ))
        })
}

/// Registers the tables of `db` in this run without declaring any, so that
/// tables it no longer declares are dropped (or abandoned) even when it
/// declares no table of that database at all (and in `App::drop_state`).
///
/// # Errors
/// When `db` was not provided to the app.
pub fn register_database(ctx: &Ctx, db: &ContextKey<SqlitePool>) -> Result<()> {
    target::register_database::<Sqlite>(ctx, db).map(|_| ())
}

/// Declares the table `table_name` of the database `db` with `schema`, and
/// commits it at once: its rows can be declared right away, and the table
/// exists before any of them is written.
///
/// # Errors
/// When a name is not a valid identifier, `db` was not provided to the app,
/// or the table cannot be created or altered.
pub async fn mount_table_target(
    ctx: &Ctx,
    db: &ContextKey<SqlitePool>,
    table_name: &str,
    schema: TableSchema,
) -> Result<TableTarget> {
    mount_table_target_with(ctx, db, table_name, schema, TableOptions::default()).await
}

/// [`mount_table_target`] with options (who owns the table).
///
/// # Errors
/// As [`mount_table_target`].
pub async fn mount_table_target_with(
    ctx: &Ctx,
    db: &ContextKey<SqlitePool>,
    table_name: &str,
    schema: TableSchema,
    options: TableOptions,
) -> Result<TableTarget> {
    target::mount::<Sqlite>(ctx, db, table_name, schema, options)
        .await
        .map(TableTarget)
}

/// Declares the table `table_name` of the database `db` with `schema` in
/// this component: it is created or altered when the component commits,
/// before its rows are written.
///
/// # Errors
/// When a name is not a valid identifier or `db` was not provided to the
/// app.
pub fn declare_table_target(
    ctx: &Ctx,
    db: &ContextKey<SqlitePool>,
    table_name: &str,
    schema: TableSchema,
) -> Result<TableTarget> {
    declare_table_target_with(ctx, db, table_name, schema, TableOptions::default())
}

/// [`declare_table_target`] with options (who owns the table).
///
/// # Errors
/// As [`declare_table_target`].
pub fn declare_table_target_with(
    ctx: &Ctx,
    db: &ContextKey<SqlitePool>,
    table_name: &str,
    schema: TableSchema,
    options: TableOptions,
) -> Result<TableTarget> {
    target::declare::<Sqlite>(ctx, db, table_name, schema, options).map(TableTarget)
}

impl TableTarget {
    /// The table's name.
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// A string that changes whenever the table is rebuilt or changed in a
    /// way that loses or may lose its rows (a destructive or lossy schema
    /// change). Put it in the memo key of components that declare rows
    /// (see `Ctx::mount_each_memo`), so that they run again and declare
    /// their rows into the new table.
    pub fn memo_key(&self) -> String {
        self.0.memo_key()
    }

    /// The table's schema.
    pub fn schema(&self) -> &TableSchema {
        self.0.schema()
    }

    /// Declares that this table's rows reference `parent`'s (a foreign key):
    /// in a sink call, `parent`'s rows are upserted before this table's and
    /// this table's deleted before `parent`'s. Call it in every run, before
    /// declaring rows, and for chains call it on parents first.
    #[must_use]
    pub fn depends_on(self, parent: &TableTarget) -> TableTarget {
        TableTarget(self.0.depends_on(&parent.0))
    }

    /// Declares a row: a struct or a map from column names to values, whose
    /// primary key columns make its key. Fields that are not columns are
    /// ignored; a missing field is NULL.
    /// The row is read when declared, by value or by reference
    /// (`declare_row(&ctx, row)` or `declare_row(&ctx, &row)`).
    ///
    /// # Errors
    /// A permanent error naming the table, the column and, when it can be
    /// read, the row key: a value of the wrong type or out of range, a NULL
    /// in a NOT NULL column, a NaN or infinite float, a NUL byte in text; or
    /// the row is declared twice in this run. The error also fails the
    /// component, even if its code goes on.
    pub fn declare_row<R: Serialize>(&self, ctx: &Ctx, row: R) -> Result<()> {
        self.0.declare_row(ctx, row)
    }
}
