//! Rows: the table's children, keyed by primary key and tracked by a
//! fingerprint of their values (an unchanged row costs no statement); and
//! how one sink call's row actions are grouped by table.

use std::marker::PhantomData;
use std::sync::Arc;

use rustc_hash::FxHashMap;
use weir_actors::statediff::{diff, DiffAction, TrackingRecordTransition};
use weir_actors::{
    Error, Fingerprint, Result, StableKey, TargetAction, TargetActionSink, TargetHandler,
    TargetReconcileOutput,
};

use super::actions::RowWrite;
use super::dialect::{Dialect, Table};
use super::keys::{key_types, key_values};
use crate::sql::fingerprint::{name_order, row_fingerprint};
use crate::sql::{ColumnType, Row, SqlValue, TableSchema};

/// The handler of one table's rows. Its sink is the database's row sink,
/// shared by every table.
pub(crate) struct RowHandler<D> {
    table: Arc<str>,
    /// The table's schema, and its columns' positions in name order: a
    /// row's fingerprint is that of its non-NULL values by column name.
    schema: Arc<TableSchema>,
    by_name: Vec<usize>,
    /// The primary key's column types, for deletes.
    key_types: Vec<ColumnType>,
    sink: TargetActionSink<RowWrite>,
    dialect: PhantomData<fn() -> D>,
}

impl<D: Dialect> RowHandler<D> {
    /// The handler of the rows of `table`, declared with `schema`.
    pub(crate) fn new(table: &str, schema: &TableSchema, sink: TargetActionSink<RowWrite>) -> Self {
        Self {
            table: Arc::from(table),
            by_name: name_order(schema),
            key_types: key_types(schema),
            schema: Arc::new(schema.clone()),
            sink,
            dialect: PhantomData,
        }
    }
}

impl<D: Dialect> TargetHandler<Row> for RowHandler<D> {
    type TrackingRecord = Fingerprint;
    type Action = RowWrite;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<Row>,
        prev: Vec<Fingerprint>,
        prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<RowWrite, Fingerprint>>> {
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
                Error::permanent(format!(
                    "{} table {}, row {key}: {why}",
                    D::NAME,
                    self.table
                ))
            })?,
        };
        let write = RowWrite {
            table: self.table.clone(),
            values,
        };
        Ok(Some(TargetReconcileOutput {
            action: TargetAction::with_kind(kind, write),
            sink: self.sink.clone(),
            tracking_record: fingerprint,
            child_invalidation: None,
        }))
    }
}

/// What a call does to one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    /// A row weir has no record of: it may be inserted without a conflict
    /// check where the dialect can (it is upserted if it is there).
    Create,
    /// Upserted.
    Update,
    /// Deleted.
    Delete,
}

/// The rows of one table in one sink call, one per primary key, in the
/// order they came (the order rows were declared in, which is usually the
/// table's own order): a later action on a key replaces the earlier one in
/// place, so a statement never sees a key twice.
pub(crate) struct TableRows<D: Dialect> {
    /// The table.
    pub table: Arc<Table<D>>,
    /// The position of each key in `rows`.
    index: FxHashMap<StableKey, usize>,
    /// Each row's key, what the call does to it, and its values.
    pub rows: Vec<(StableKey, Write, Vec<SqlValue>)>,
}

impl<D: Dialect> TableRows<D> {
    fn new(table: Arc<Table<D>>, room: usize) -> Self {
        let mut index = FxHashMap::default();
        index.reserve(room);
        Self {
            table,
            index,
            rows: Vec::with_capacity(room),
        }
    }

    fn put(&mut self, key: StableKey, write: Write, values: Vec<SqlValue>) {
        match self.index.get(&key).and_then(|&at| self.rows.get_mut(at)) {
            Some(slot) => *slot = (key, write, values),
            None => {
                self.index.insert(key.clone(), self.rows.len());
                self.rows.push((key, write, values));
            }
        }
    }
}

/// Groups a call's actions by table, in rank order (parents first; ties
/// by name), each table's rows one per key (see [`TableRows`]). Two
/// actions on one key in one call (which the engine does not produce
/// within a run, but a retried call may carry) are reduced to the last.
///
/// # Errors
/// When an action's table is not declared (`table_of` says which are).
pub(crate) fn group_by_table<D: Dialect>(
    actions: Vec<TargetAction<RowWrite>>,
    table_of: impl Fn(&str) -> Result<Arc<Table<D>>>,
) -> Result<Vec<TableRows<D>>> {
    let mut tables: Vec<TableRows<D>> = Vec::new();
    // Most calls write one table: room for all of the call's rows at once.
    let size = actions.len();
    for action in actions {
        let (write, row) = match action {
            TargetAction::Create(row) => (Write::Create, row),
            TargetAction::Update(row) => (Write::Update, row),
            TargetAction::Delete(row) => (Write::Delete, row),
        };
        let at = match tables.iter().position(|t| *t.table.name == *row.table) {
            Some(at) => at,
            None => {
                // The first table gets room for the whole call; calls
                // spanning several tables grow the others as they go.
                let room = if tables.is_empty() { size } else { 0 };
                tables.push(TableRows::new(table_of(&row.table)?, room));
                tables.len() - 1
            }
        };
        if let Some(rows) = tables.get_mut(at) {
            let key = rows.table.row_key(&row.values, write == Write::Delete);
            rows.put(key, write, row.values);
        }
    }
    tables.sort_by(|a, b| (a.table.rank(), &a.table.name).cmp(&(b.table.rank(), &b.table.name)));
    Ok(tables)
}
