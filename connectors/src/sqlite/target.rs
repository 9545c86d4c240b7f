//! The rows' handler (the tables' is shared: `crate::sql::table`).
//!
//! Its `reconcile` is pure: it compares the declared row with the tracking
//! record and returns an action for the row sink in [`sink`](super::sink),
//! which does all the I/O.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use weir_actors::statediff::{diff, DiffAction, TrackingRecordTransition};
use weir_actors::{
    Error, Fingerprint, Result, StableKey, TargetAction, TargetActionSink, TargetHandler,
    TargetReconcileOutput,
};

use crate::sql::fingerprint::{name_order, row_fingerprint};
use crate::sql::table::keys::{key_types, key_values};
use crate::sql::{ColumnType, SqlValue, TableSchema};

/// The declared value of a row: its values in schema order, converted when
/// declared, and its table's rank (how many tables it depends on, through
/// [`TableTarget::depends_on`](super::TableTarget::depends_on)).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct RowSpec {
    /// One value per column, in schema order.
    pub values: Vec<SqlValue>,
    /// The table's rank: parents' rows are written first.
    pub rank: u32,
}

/// One row mutation. On an upsert `values` holds every column; on a delete
/// only the primary key's.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct RowWrite {
    /// The table (shared by the table's row actions).
    pub table: Arc<str>,
    /// The table's rank (0 on deletes: the sink knows the ranks it saw).
    pub rank: u32,
    /// The values (see above).
    pub values: Vec<SqlValue>,
}

/// The handler of one table's rows, built by the table sink's child-handler
/// factory. Its sink is the database's row sink, shared by every table.
pub(crate) struct SqliteRowHandler {
    table: Arc<str>,
    schema: Arc<TableSchema>,
    /// The schema's column positions in name order, for fingerprints.
    by_name: Vec<usize>,
    /// The primary key's column types, for deletes.
    key_types: Vec<ColumnType>,
    sink: TargetActionSink<RowWrite>,
}

impl SqliteRowHandler {
    pub(crate) fn new(
        table: String,
        schema: Arc<TableSchema>,
        sink: TargetActionSink<RowWrite>,
    ) -> Self {
        Self {
            table: Arc::from(table),
            by_name: name_order(&schema),
            key_types: key_types(&schema),
            schema,
            sink,
        }
    }
}

impl TargetHandler<RowSpec> for SqliteRowHandler {
    type TrackingRecord = Fingerprint;
    type Action = RowWrite;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<RowSpec>,
        prev: Vec<Fingerprint>,
        prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<RowWrite, Fingerprint>>> {
        let record = desired
            .as_ref()
            .map(|row| row_fingerprint(&self.schema, &self.by_name, &row.values));
        let transition = TrackingRecordTransition::new(record, prev, prev_may_be_missing);
        let Some(kind) = diff(Some(&transition)).map(DiffAction::action_kind) else {
            return Ok(None);
        };
        let write = match desired {
            Some(row) => RowWrite {
                table: self.table.clone(),
                rank: row.rank,
                values: row.values,
            },
            None => RowWrite {
                table: self.table.clone(),
                rank: 0,
                values: key_values(&key, &self.key_types).map_err(|why| {
                    Error::permanent(format!("sqlite table {}, row {key}: {why}", self.table))
                })?,
            },
        };
        Ok(Some(TargetReconcileOutput {
            action: TargetAction::with_kind(kind, write),
            sink: self.sink.clone(),
            tracking_record: record,
            child_invalidation: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::Row;

    #[test]
    fn a_delete_binds_each_key_type_as_the_upsert_bound_it() -> Result<()> {
        use super::super::types::bound;
        use crate::sql::value::key_of;
        use ColumnType as T;
        use SqlValue as V;

        let at = chrono::DateTime::parse_from_rfc3339("1969-12-31T23:59:59.123456789+02:00")
            .map_err(|e| Error::msg(e.to_string()))?
            .with_timezone(&chrono::Utc);
        // 212.91890726713459 parses back to another float unless JSON
        // numbers are parsed exactly.
        let doc = serde_json::json!({"b": [1, 212.918_907_267_134_59, null], "a": {"é": "x"}});
        let array = |ty: T| T::Array(Box::new(ty));
        let cases = vec![
            (T::Text, V::Text("é\u{1F600} ' \"".into())),
            (T::SmallInt, V::Int(-1)),
            (T::Integer, V::Int(i64::from(i32::MIN))),
            (T::BigInt, V::Int(i64::MIN)),
            (T::Real, V::Float(f64::from(0.1_f32))),
            (T::Double, V::Float(-0.0)),
            (T::Double, V::Float(212.918_907_267_134_59)),
            (T::Boolean, V::Bool(true)),
            (T::Bytes, V::Bytes(vec![0, 0, 1])),
            (T::Json, V::Json(doc.clone())),
            (T::Json, V::Json(serde_json::json!("text"))),
            (T::Timestamp, V::Timestamp(at)),
            (T::Uuid, V::Uuid(uuid::Uuid::from_u128(u128::MAX))),
            (array(T::Text), V::Array(vec![V::Text("a".into()), V::Null])),
            (
                array(T::Double),
                V::Array(vec![V::Float(-0.0), V::Float(1e300)]),
            ),
            (array(T::Boolean), V::Array(vec![V::Bool(false)])),
            (
                array(T::Bytes),
                V::Array(vec![V::Bytes(vec![0]), V::Bytes(vec![])]),
            ),
            (
                array(T::Json),
                V::Array(vec![
                    V::Json(doc.clone()),
                    V::Null,
                    V::Json(serde_json::json!("s")),
                ]),
            ),
            (array(T::Timestamp), V::Array(vec![V::Timestamp(at)])),
            (array(T::Uuid), V::Array(vec![V::Uuid(uuid::Uuid::nil())])),
            (array(T::BigInt), V::Array(vec![])),
            (
                array(array(T::Json)),
                V::Array(vec![
                    V::Array(vec![V::Json(doc), V::Null]),
                    V::Array(vec![]),
                ]),
            ),
        ];
        let mut all = TableSchema::builder();
        let mut names = Vec::new();
        for (i, (ty, value)) in cases.iter().enumerate() {
            let schema = TableSchema::builder()
                .column("k", ty.clone())
                .column("v", T::Text)
                .primary_key(["k"])
                .build()?;
            let row = Row {
                values: vec![value.clone(), V::Text("v".into())],
            };
            let deleted =
                key_values(&row.key(&schema), &key_types(&schema)).map_err(Error::permanent)?;
            assert_eq!(
                deleted.iter().map(bound).collect::<Vec<_>>(),
                vec![bound(value)],
                "{ty:?}"
            );
            // Its call groups the delete with the row's upsert, by key.
            assert_eq!(key_of(&deleted), row.key(&schema), "{ty:?}");
            let name = format!("k{i}");
            all = all.column(&name, ty.clone());
            names.push(name);
        }
        let all = all.primary_key(&names).build()?;
        let row = Row {
            values: cases.into_iter().map(|(_, v)| v).collect(),
        };
        let deleted = key_values(&row.key(&all), &key_types(&all)).map_err(Error::permanent)?;
        assert_eq!(
            deleted.iter().map(bound).collect::<Vec<_>>(),
            row.values.iter().map(bound).collect::<Vec<_>>()
        );
        Ok(())
    }
}
