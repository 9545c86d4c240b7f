//! What a SQL dialect supplies to the shared table target.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;

use weir_actors::statediff::ManagedBy;
use weir_actors::{Result, TargetAction};

use super::database::Database;
use super::handler::TableAction;
use super::rows::RowWrite;
use crate::sql::TableSchema;

/// A database engine the table target writes: only what really differs
/// between engines. The rest (declaring tables and rows, schema evolution,
/// key encoding, grouping a call's rows) is shared.
pub(crate) trait Dialect: Sized + Send + Sync + 'static {
    /// The pool a database of this dialect is provided as.
    type Pool: Clone + Send + Sync + 'static;
    /// What the dialect prepares once for each declared table (its
    /// statements, what it found out about the table).
    type Statements: Send + Sync + 'static;

    /// Names the dialect in errors and logs: `postgres`, `sqlite`.
    const NAME: &'static str;
    /// How many row-sink calls of one database may run at once.
    const ROW_SINK_CONCURRENT_CALLS: usize;
    /// Whether each sink call checks the worker group's fence in its own
    /// transaction (see `TargetActionSink::checks_fence`).
    const CHECKS_FENCE: bool;

    /// The name of the provider of the tables of the database provided
    /// under the context key named `db`.
    fn tables_provider_name(db: &str) -> String;

    /// The name a table is keyed under: the engine's own identity of the
    /// name (SQLite ignores the case of names: it keys them in lower case).
    fn key_name(table: &str) -> Cow<'_, str> {
        Cow::Borrowed(table)
    }

    /// Checks a declared table's name and schema beyond the shared rules
    /// (names that are identifiers): reserved names, types with no
    /// mapping.
    ///
    /// # Errors
    /// A permanent error naming the table, and the column if one is at fault.
    fn check_table(table: &str, schema: &TableSchema) -> Result<()>;

    /// Prepares what the row sink needs of a declared table.
    ///
    /// # Errors
    /// When a column type has no mapping.
    fn statements(
        table: &str,
        schema: &TableSchema,
        managed_by: ManagedBy,
    ) -> Result<Self::Statements>;

    /// Applies table actions: settles registrations, runs DDL steps.
    fn apply_tables(
        db: Arc<Database<Self>>,
        actions: Vec<TargetAction<TableAction>>,
    ) -> impl Future<Output = Result<()>> + Send + 'static;

    /// Applies row actions of any tables of one database, in one
    /// transaction.
    fn apply_rows(
        db: Arc<Database<Self>>,
        actions: Vec<TargetAction<RowWrite>>,
    ) -> impl Future<Output = Result<()>> + Send + 'static;
}
