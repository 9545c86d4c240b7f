//! One database's tables and sinks, kept by the app.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use weir_actors::statediff::ManagedBy;
use weir_actors::{ChildTargetDef, ContextKey, Ctx, Error, Result, StableKey, TargetActionSink};

use super::dialect::Dialect;
use super::handler::TableAction;
use super::rows::{RowHandler, RowWrite};
use crate::sql::value::key_of;
use crate::sql::{Row, SqlValue, TableSchema};

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
    tables: Mutex<HashMap<String, Arc<Table<D>>>>,
}

impl<D: Dialect> Database<D> {
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

/// A database and its two sinks: one for its tables' DDL and one for the
/// rows of all its tables, so that rows of every table batch together and
/// are applied in one transaction per sink call.
pub(crate) struct Shared<D: Dialect> {
    /// The database.
    pub db: Arc<Database<D>>,
    /// The tables' sink; its child-handler factory gives each declared
    /// table a row handler over the row sink.
    pub table_sink: TargetActionSink<TableAction>,
    /// The rows' sink.
    pub row_sink: TargetActionSink<RowWrite>,
}

impl<D: Dialect> Shared<D> {
    fn new(name: &str, pool: D::Pool) -> Self {
        let db = Arc::new(Database {
            name: name.to_string(),
            pool,
            tables: Mutex::new(HashMap::new()),
        });
        let for_rows = Arc::clone(&db);
        let row_sink = TargetActionSink::from_async_fn(move |actions| {
            D::apply_rows(Arc::clone(&for_rows), actions)
        })
        .concurrent_calls(D::ROW_SINK_CONCURRENT_CALLS);
        let row_sink = fenced::<D, _>(row_sink);
        let for_tables = Arc::clone(&db);
        let for_children = Arc::clone(&db);
        let rows = row_sink.clone();
        let table_sink = TargetActionSink::from_async_fn_with_child_handler(
            move |actions| D::apply_tables(Arc::clone(&for_tables), actions),
            move |action: &TableAction| rows_of(&for_children, action, &rows),
        );
        Self {
            db,
            table_sink: fenced::<D, _>(table_sink),
            row_sink,
        }
    }
}

/// The sink, checking the fence of each call if the dialect does.
fn fenced<D: Dialect, A>(sink: TargetActionSink<A>) -> TargetActionSink<A> {
    if D::CHECKS_FENCE {
        sink.checks_fence()
    } else {
        sink
    }
}

/// The rows' handler of the table of `action`, built by the table sink's
/// child-handler factory. A table not declared in this run (its rows are
/// deleted by `drop_state`) is recorded from the action's schema.
fn rows_of<D: Dialect>(
    db: &Database<D>,
    action: &TableAction,
    rows: &TargetActionSink<RowWrite>,
) -> Result<ChildTargetDef> {
    let schema = action.schema.as_ref().ok_or_else(|| {
        Error::Usage(format!(
            "{} table {}: a dropped table has no rows",
            D::NAME,
            action.table
        ))
    })?;
    if db.table(&action.table).is_none() {
        let table = Table::new(&action.table, schema, ManagedBy::User)?;
        db.set_table(Arc::new(table));
    }
    Ok(ChildTargetDef::new::<Row, _>(RowHandler::new(
        D::NAME,
        &action.table,
        schema,
        rows.clone(),
    )))
}

/// The shared state of `db` for the app of `ctx`: one per app and
/// `ContextKey` name, kept by the app ([`Ctx::app_state`]) so that every
/// component's rows of that database meet in the same sinks, and two apps
/// never share them.
///
/// # Errors
/// When `db` was not provided to the app.
pub(crate) fn shared<D: Dialect>(ctx: &Ctx, db: &ContextKey<D::Pool>) -> Result<Arc<Shared<D>>> {
    let pool = ctx.get_key(db)?;
    Ok(ctx.app_state(db.name(), || Shared::new(db.name(), pool.clone())))
}
