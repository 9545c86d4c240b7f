//! The PostgreSQL target: tables whose rows weir keeps equal to what
//! components declare; and the PostgreSQL table source ([`source`]): the
//! rows of a table as items, one component each.
//!
//! # Layout
//!
//! - `target`: the table handler (a container target) and the row handler
//!   (its children), their actions, and what one database's sinks share.
//! - `sink`: applying actions: DDL, and row upserts and deletes in one
//!   transaction per sink call.
//! - `ddl`: the SQL text of DDL, upserts and deletes.
//! - `types`: column types, and columns of values bound as arrays.
//! - [`source`]: the table source ([`TableSource`]).
//! - `group`: worker groups coordinated through the database
//!   ([`PostgresCoordinator`]), and the fence check of a writer's
//!   transaction ([`check_fence`]).
//!
//! # Model
//!
//! A table is a container target state keyed by `[db, table]`, where `db`
//! is the *name* of the [`ContextKey`] that holds the pool (so connection
//! details can change without losing track of what weir created). Its
//! tracking record is its [`TableSchema`] and who manages it. Its rows are
//! child target states keyed by primary key ([`Row::key`](crate::sql::Row::key)) and tracked by a
//! [`Fingerprint`](weir_actors::Fingerprint) of their values: an unchanged
//! row costs no statement.
//!
//! Schema changes (see [`SchemaChange`](crate::sql::SchemaChange)):
//!
//! - unchanged: no DDL;
//! - nullable columns added: `ALTER TABLE ... ADD COLUMN`, rows untouched;
//! - columns dropped, retyped or added as NOT NULL: altered in place
//!   (retyped columns are dropped and added again), then every row is
//!   written again (`Lossy`). Columns added to an existing table are added
//!   as nullable, since existing rows have no value for them yet;
//! - primary key changed: `DROP TABLE` and `CREATE TABLE`, every row is
//!   created again (`Destructive`).
//!
//! A table no longer declared (by a run that still declares another table
//! of its database, or calls [`register_database`]) is dropped when weir
//! manages it ([`ManagedBy::System`], the default), and abandoned with its
//! rows when the user does ([`ManagedBy::User`]: weir then never runs DDL
//! on it, not even `CREATE TABLE`; the user creates it).
//!
//! # Writes and ordering
//!
//! All tables of one database share one row sink (one per app and
//! database), so rows of every
//! table that the engine batches together are applied in **one
//! transaction per sink call**: upserts as
//! `INSERT ... SELECT ... FROM UNNEST($1, $2, ...) ON CONFLICT (pk) DO
//! UPDATE` (one array parameter per column, 10 000 rows per statement),
//! deletes as `DELETE ... WHERE pk = ANY($1)` (a composite key, or one
//! bound as text: `WHERE (pk) IN (SELECT ... FROM UNNEST(...))`). Rows new
//! to weir (no record of them) are copied in with `COPY ... FROM STDIN
//! (FORMAT binary)`, about half the server's work of an upsert; a copy
//! that fails (the table has the rows already, or a constraint refuses
//! one) is rolled back to a savepoint and the table's rows are all
//! upserted instead, so errors are reported as for any upsert. Only tables
//! with a unique index on exactly the key are copied into. Tables with
//! array columns, and tables the user manages (whose rules and triggers
//! may expect the upsert's `INSERT`; COPY applies no rules), are always
//! upserted.
//! Within a transaction, upserts of parent tables come before those of
//! their children, and deletes of children before their parents'
//! ([`TableTarget::depends_on`]), so foreign keys between weir's tables hold
//! at every statement. Rows of a parent committed by an *earlier* sink call
//! (an earlier component, or an earlier run) are of course visible too.
//!
//! Up to [`ROW_SINK_CONCURRENT_CALLS`] row-sink calls of one database run
//! at once, each a transaction on its own pooled connection, so the server
//! writes one batch while weir prepares or sends the next; the engine never
//! runs two calls carrying the same key at once. Once a table of the
//! database depends on another, its calls run one at a time, so a parent's
//! rows are committed before a later call writes their children.
//!
//! Two actions on one primary key within a sink call are reduced to the
//! last before sending. A constraint violation (unique, foreign key, check,
//! not null) fails the call with a permanent error naming the table, the
//! constraint and the keys; the engine then splits the call along component
//! boundaries, so only the components whose rows violate it fail. Other
//! driver errors keep their kind: connection and I/O errors, deadlocks and
//! serialization failures are retried.
//!
//! # Values
//!
//! Rows are converted with [`Row::from_serialize`](crate::sql::Row::from_serialize) when declared: a NaN or
//! infinite float, a NUL byte in text or a value of the wrong type fails the
//! declaring component with an error naming the table, the column and the
//! row's key. See [`ColumnType`](crate::sql::ColumnType) for the type
//! mapping; `Json` binds as JSON text cast to `jsonb`, and `Array(t)` as a
//! PostgreSQL array literal cast to `t[]` (arrays of arrays are refused).
//!
//! # Example
//!
//! ```no_run
//! use serde::Serialize;
//! use weir_actors::{App, ContextKey, Result};
//! use weir_connectors::postgres::mount_table_target;
//! use weir_connectors::sql::{ColumnType, TableSchema};
//!
//! #[derive(Serialize)]
//! struct Doc {
//!     id: String,
//!     body: String,
//! }
//!
//! # async fn example(pool: sqlx::PgPool) -> Result<()> {
//! let db = ContextKey::<sqlx::PgPool>::new("main_db");
//! let app = App::builder("docs").provide_key(&db, pool).build().await?;
//! app.run(move |ctx| async move {
//!     let schema = TableSchema::builder()
//!         .column("id", ColumnType::Text)
//!         .column("body", ColumnType::Text)
//!         .primary_key(["id"])
//!         .build()?;
//!     let docs = mount_table_target(&ctx, &db, "docs", schema).await?;
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
mod group;
mod owners;
mod sink;
pub mod source;
mod types;

use serde::Serialize;
use sqlx::PgPool;
pub use weir_actors::statediff::ManagedBy;
use weir_actors::{ContextKey, Ctx, PreviewAction, Result};

use crate::sql::table::{dialect::Dialect, target};
use crate::sql::TableSchema;
use db::Postgres;

pub use db::ROW_SINK_CONCURRENT_CALLS;
pub use group::{check_fence, PostgresCoordinator, DEFAULT_COMPACT_MIN_ROWS};
pub use owners::{drop_tables_of, table_owner};
pub use sink::ROWS_PER_STATEMENT;
pub use source::{SourceRow, TableSource, TableSourceOptions};

pub use crate::sql::{PreviewedTable, TableOptions};

/// A declared PostgreSQL table, to declare rows into.
#[derive(Clone, Debug)]
pub struct TableTarget(target::TableTarget<Postgres>);

/// The name of the provider of the tables of the database provided under
/// the context key named `db`: the name [`App::inspect`](weir_actors::App::inspect)
/// counts their target states under: `weir.postgres.table/<db>`.
pub fn tables_provider_name(db: &str) -> String {
    Postgres::tables_provider_name(db)
}

/// Which table of `db` an action listed by `App::preview` is about: the
/// table itself (created, altered, dropped), or a row of one of `tables`
/// (the action's key is the row's key). `None` for an action of another
/// provider, or a row of a table not in `tables`.
pub fn previewed_table(
    db: &ContextKey<PgPool>,
    tables: &[&str],
    action: &PreviewAction,
) -> Option<PreviewedTable> {
    target::previewed_table::<Postgres>(db, tables, action)
}

/// Registers the tables of `db` for this run without declaring any, so
/// that a run declaring no table of `db` still drops (or abandons) the
/// tables it declared before. Runs that mount a table of `db` need not
/// call it.
///
/// # Errors
/// When `db` was not provided to the `App`.
pub fn register_database(ctx: &Ctx, db: &ContextKey<PgPool>) -> Result<()> {
    target::register_database::<Postgres>(ctx, db).map(|_| ())
}

/// Declares the table `table_name` of the database `db` (managed by weir)
/// and commits it at once: it exists when this returns, and rows can be
/// declared into it.
///
/// # Errors
/// When the table or a column name is not a plain identifier, a column type
/// has no PostgreSQL mapping, `db` was not provided, or the table could not
/// be created or altered.
pub async fn mount_table_target(
    ctx: &Ctx,
    db: &ContextKey<PgPool>,
    table_name: &str,
    schema: TableSchema,
) -> Result<TableTarget> {
    mount_table_target_with(ctx, db, table_name, schema, TableOptions::default()).await
}

/// [`mount_table_target`] with options.
///
/// # Errors
/// As [`mount_table_target`].
pub async fn mount_table_target_with(
    ctx: &Ctx,
    db: &ContextKey<PgPool>,
    table_name: &str,
    schema: TableSchema,
    options: TableOptions,
) -> Result<TableTarget> {
    target::mount::<Postgres>(ctx, db, table_name, schema, options)
        .await
        .map(TableTarget)
}

/// Declares the table `table_name` of the database `db` (managed by weir)
/// in the current component; it is created or altered when the component
/// commits, before the rows declared into it are written.
///
/// # Errors
/// When the table or a column name is not a plain identifier, a column type
/// has no PostgreSQL mapping, or `db` was not provided.
pub fn declare_table_target(
    ctx: &Ctx,
    db: &ContextKey<PgPool>,
    table_name: &str,
    schema: TableSchema,
) -> Result<TableTarget> {
    declare_table_target_with(ctx, db, table_name, schema, TableOptions::default())
}

/// [`declare_table_target`] with options.
///
/// # Errors
/// As [`declare_table_target`].
pub fn declare_table_target_with(
    ctx: &Ctx,
    db: &ContextKey<PgPool>,
    table_name: &str,
    schema: TableSchema,
    options: TableOptions,
) -> Result<TableTarget> {
    target::declare::<Postgres>(ctx, db, table_name, schema, options).map(TableTarget)
}

impl TableTarget {
    /// Declares a row: a struct, or a map from column names to values.
    /// Fields that are not columns are ignored; a missing field is NULL.
    /// The row is read when declared, by value or by reference
    /// (`declare_row(&ctx, row)` or `declare_row(&ctx, &row)`).
    ///
    /// # Errors
    /// When the row does not fit the schema (a NULL in a NOT NULL column, a
    /// value of the wrong type, a NaN or infinite float, a NUL byte in
    /// text): a permanent error naming the table, the column and the row's
    /// key. Also when the same key is declared twice in the run. The error
    /// also fails the component, even if its code goes on.
    pub fn declare_row<R: Serialize>(&self, ctx: &Ctx, row: R) -> Result<()> {
        self.0.declare_row(ctx, row)
    }

    /// Says that this table's rows refer to rows of `parent` (a foreign
    /// key): within each transaction, `parent`'s rows are written before
    /// this table's, and this table's rows deleted before `parent`'s.
    ///
    /// Call it in every run, before declaring rows, and for chains call it
    /// on parents first (`b.depends_on(&a)` before `c.depends_on(&b)`).
    /// Tables of different databases share no transaction: the call is
    /// then ignored. From then on, the database's row-sink calls run one
    /// at a time (see [`ROW_SINK_CONCURRENT_CALLS`]).
    #[must_use]
    pub fn depends_on(self, parent: &TableTarget) -> TableTarget {
        TableTarget(self.0.depends_on(&parent.0))
    }

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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_types_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<TableTarget>();
        check::<TableOptions>();
    }
}
