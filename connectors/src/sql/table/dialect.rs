//! What a SQL dialect supplies to the shared table target, and what the
//! sinks of a database of that dialect know of it: its declared tables.

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use weir_actors::statediff::ManagedBy;
use weir_actors::{Error, Result, StableKey, TargetAction};

use super::actions::{RowWrite, TableAction};
use crate::sql::value::key_of;
use crate::sql::{SqlValue, TableSchema};

/// A database engine the table target writes: only what really differs
/// between engines. The rest (declaring tables and rows, schema evolution,
/// key encoding, grouping a call's rows) is shared.
pub(crate) trait Dialect: Sized + Send + Sync + 'static {
    /// The pool a database of this dialect is provided as.
    type Pool: Clone + Send + Sync + 'static;
    /// What the dialect prepares once for each declared table (its
    /// statements, what it found out about the table).
    type Statements: Send + Sync + 'static;
    /// What the dialect keeps for each database of an app (such as a lock
    /// that lets one sink call write at a time).
    type PerDatabase: Default + Send + Sync + 'static;

    /// Names the dialect in errors and logs: `postgres`, `sqlite`.
    const NAME: &'static str;
    /// How many row-sink calls of one database may run at once.
    const ROW_SINK_CONCURRENT_CALLS: usize;
    /// Whether each sink call checks the worker group's fence in its own
    /// transaction (see `TargetActionSink::checks_fence`).
    const CHECKS_FENCE: bool;

    /// The name of the provider of the tables of the database provided
    /// under the context key named `db`: `weir.<dialect>.table/<db>`.
    /// Ledgers store it in the path of every table and row they track, so
    /// another name needs an upgrade of the ledger's format.
    fn tables_provider_name(db: &str) -> String {
        format!("weir.{}.table/{db}", Self::NAME)
    }

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

    /// Whether the table `table` (as declared) is in the database.
    ///
    /// # Errors
    /// When the database cannot be asked.
    fn table_exists(db: &Database<Self>, table: &str) -> impl Future<Output = Result<bool>> + Send;

    /// Applies table actions: settles registrations, runs DDL steps. The
    /// tables that must exist already have been checked (see
    /// `sinks::check_tables_exist`).
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

/// What the row sink needs to know about a declared table.
pub(crate) struct Table<D: Dialect> {
    /// The table's name, as declared.
    pub name: String,
    /// Its declared schema.
    pub schema: TableSchema,
    /// Positions of the primary key columns among the columns.
    pub key_positions: Vec<usize>,
    /// Parents are written before children (rank ascending), deletes in
    /// reverse: see `TableTarget::depends_on`.
    pub rank: AtomicU32,
    /// What the dialect prepared for it.
    pub statements: D::Statements,
}

impl<D: Dialect> Table<D> {
    /// The table declared as `name` with `schema`.
    ///
    /// # Errors
    /// When the dialect cannot prepare its statements.
    pub(crate) fn new(name: &str, schema: &TableSchema, managed_by: ManagedBy) -> Result<Self> {
        Ok(Self {
            name: name.to_string(),
            schema: schema.clone(),
            key_positions: schema
                .primary_key()
                .iter()
                .filter_map(|k| schema.columns().iter().position(|c| &c.name == k))
                .collect(),
            rank: AtomicU32::new(0),
            statements: D::statements(name, schema, managed_by)?,
        })
    }

    /// The table's rank (see `TableTarget::depends_on`).
    pub(crate) fn rank(&self) -> u32 {
        self.rank.load(Ordering::Relaxed)
    }

    /// The key of a row: of an upsert (`values` holds every column) or of
    /// a delete (`values` holds the primary key's).
    pub(crate) fn row_key(&self, values: &[SqlValue], is_delete: bool) -> StableKey {
        if is_delete {
            key_of(values)
        } else {
            key_of(self.key_positions.iter().filter_map(|&i| values.get(i)))
        }
    }
}

/// One database of an app: its pool and the tables declared in it.
pub(crate) struct Database<D: Dialect> {
    /// The name of the `ContextKey` the pool is provided under.
    pub name: String,
    /// The pool.
    pub pool: D::Pool,
    /// What the dialect keeps for the database.
    pub dialect: D::PerDatabase,
    tables: Mutex<HashMap<String, Arc<Table<D>>>>,
}

impl<D: Dialect> Database<D> {
    /// The database provided as `pool` under the context key named `name`,
    /// with no table declared yet.
    pub(crate) fn new(name: &str, pool: D::Pool) -> Self {
        Self {
            name: name.to_string(),
            pool,
            dialect: D::PerDatabase::default(),
            tables: Mutex::new(HashMap::new()),
        }
    }

    /// The declared table `name`, if it is.
    pub(crate) fn table(&self, name: &str) -> Option<Arc<Table<D>>> {
        self.tables
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// The declared table `name`, or an error saying it is not.
    ///
    /// # Errors
    /// A permanent error naming the table and the database.
    pub(crate) fn declared(&self, name: &str) -> Result<Arc<Table<D>>> {
        self.table(name).ok_or_else(|| {
            Error::permanent(format!(
                "{} database {}: table {name} is not declared in this run",
                D::NAME,
                self.name
            ))
        })
    }

    /// Records a declared table (replacing an earlier declaration).
    pub(crate) fn set_table(&self, table: Arc<Table<D>>) {
        self.tables
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(table.name.clone(), table);
    }
}
