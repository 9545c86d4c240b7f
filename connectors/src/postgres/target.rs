//! The table (container) and row (child) handlers, and each database's
//! sinks, kept by the app (their actions and shared state are in
//! [`db`](super::db)).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sqlx::PgPool;
use weir_actors::statediff::{diff, DiffAction, ManagedBy, TrackingRecordTransition};
use weir_actors::{
    ChildTargetDef, ContextKey, Ctx, Error, Fingerprint, Result, StableKey, TargetAction,
    TargetActionSink, TargetHandler, TargetReconcileOutput,
};

use super::db::{DbInner, RowAction, TableMeta};
use super::sink;
use crate::sql::fingerprint::{name_order, row_fingerprint};
use crate::sql::table::handler::TableAction;
use crate::sql::table::keys::{key_types, key_values};
use crate::sql::{ColumnType, Row, TableSchema};

/// One database's sinks: one identity for its tables' DDL and one for the
/// rows of all its tables, so rows of every table batch together and apply
/// in one transaction per sink call.
pub(crate) struct DbShared {
    pub inner: Arc<DbInner>,
    pub table_sink: TargetActionSink<TableAction>,
    /// The rows' sink: up to [`ROW_SINK_CONCURRENT_CALLS`] calls at once,
    /// one once a table of the database depends on another.
    pub row_sink: TargetActionSink<RowAction>,
}

/// How many row-sink calls of one database may run at once, each its own
/// transaction on its own pooled connection, while the server works on
/// another batch. The engine never runs two calls that carry the same
/// key. A database with dependent tables ([`TableTarget::depends_on`])
/// gets one call at a time, so a parent's rows are committed before a
/// later call writes their children.
///
/// [`TableTarget::depends_on`]: super::TableTarget::depends_on
pub const ROW_SINK_CONCURRENT_CALLS: usize = 2;

impl DbShared {
    fn new(db_name: &str, pool: PgPool) -> Self {
        let inner = Arc::new(DbInner {
            db_name: db_name.to_string(),
            pool,
            tables: Mutex::new(HashMap::new()),
        });
        let for_rows = Arc::clone(&inner);
        let row_sink = TargetActionSink::from_async_fn(move |actions| {
            sink::apply_rows(Arc::clone(&for_rows), actions)
        })
        .concurrent_calls(ROW_SINK_CONCURRENT_CALLS)
        .checks_fence();
        let rows_for_tables = row_sink.clone();
        let for_tables = Arc::clone(&inner);
        let for_ddl = Arc::clone(&inner);
        let table_sink = TargetActionSink::from_async_fn_with_child_handler(
            move |actions| sink::apply_tables(Arc::clone(&for_ddl), actions),
            move |action: &TableAction| {
                let schema = action.schema.as_ref().ok_or_else(|| {
                    Error::Usage(format!(
                        "table {}: a delete action has no child rows",
                        action.table
                    ))
                })?;
                if for_tables.table(&action.table).is_none() {
                    // Not declared in this run (its rows are deleted by
                    // `drop_state`): only deletes need it.
                    let meta = TableMeta::new(&action.table, schema, ManagedBy::User)?;
                    for_tables.set_table(Arc::new(meta));
                }
                Ok(ChildTargetDef::new::<Row, _>(PostgresRowHandler {
                    table: Arc::from(action.table.as_str()),
                    by_name: name_order(schema),
                    schema: Arc::new(schema.clone()),
                    key_types: key_types(schema),
                    sink: rows_for_tables.clone(),
                }))
            },
        )
        .checks_fence();
        Self {
            inner,
            table_sink,
            row_sink,
        }
    }
}

/// The shared state of `db` for the app of `ctx`: one per app and
/// `ContextKey` name (the app's pool for that name), kept by the app
/// ([`Ctx::app_state`]) so that every component's rows of that database
/// meet in the same sinks, and two apps never share them.
pub(crate) fn db_shared(ctx: &Ctx, db: &ContextKey<PgPool>) -> Result<Arc<DbShared>> {
    let pool = ctx.get_key(db)?;
    Ok(ctx.app_state(db.name(), || DbShared::new(db.name(), pool.clone())))
}

/// The row handler of one table: rows are its target states, keyed by
/// primary key, tracked by a fingerprint of their values.
pub(crate) struct PostgresRowHandler {
    table: Arc<str>,
    /// The table's schema, and its columns' positions in name order: a
    /// row's fingerprint is that of its non-NULL values by column name.
    schema: Arc<TableSchema>,
    by_name: Vec<usize>,
    key_types: Vec<ColumnType>,
    sink: TargetActionSink<RowAction>,
}

impl TargetHandler<Row> for PostgresRowHandler {
    type TrackingRecord = Fingerprint;
    type Action = RowAction;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<Row>,
        prev: Vec<Fingerprint>,
        prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<RowAction, Fingerprint>>> {
        let fingerprint = desired
            .as_ref()
            .map(|row| row_fingerprint(&self.schema, &self.by_name, &row.values));
        let transition = TrackingRecordTransition::new(fingerprint, prev, prev_may_be_missing);
        let Some(kind) = diff(Some(&transition)).map(DiffAction::action_kind) else {
            return Ok(None);
        };
        let values = match desired {
            Some(row) => row.values,
            None => key_values(&key, &self.key_types).map_err(|why| {
                Error::permanent(format!("table {}, row {key}: {why}", self.table))
            })?,
        };
        let action = RowAction {
            table: self.table.clone(),
            values,
        };
        Ok(Some(TargetReconcileOutput {
            action: TargetAction::with_kind(kind, action),
            sink: self.sink.clone(),
            tracking_record: fingerprint,
            child_invalidation: None,
        }))
    }
}
