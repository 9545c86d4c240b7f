//! The handlers: tables (containers) and their rows (the children).
//!
//! Both `reconcile`s are pure: they compare the declared value with the
//! tracking records and return an action for the sinks in
//! [`sink`](super::sink), which do all the I/O.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use weir_actors::statediff::{
    diff, DiffAction, ManagedBy, MutualTrackingRecord, TrackingRecordTransition,
};
use weir_actors::{
    Error, Fingerprint, Owner, Result, StableKey, TargetAction, TargetActionSink,
    TargetChildInvalidation, TargetHandler, TargetReconcileOutput,
};

use crate::sql::fingerprint::{name_order, row_fingerprint};
use crate::sql::owners::Claim;
use crate::sql::{ColumnType, SchemaChange, SqlValue, TableSchema};

/// The declared value of a table.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct TableSpec {
    /// The table's schema.
    pub schema: TableSchema,
    /// Who owns the table.
    pub managed_by: ManagedBy,
    /// The table's name as declared: its key holds it in lower case, since
    /// SQLite ignores the case of names. When empty, the key's name.
    #[serde(default)]
    pub name: String,
    /// Whether this app takes the table over from another owner.
    #[serde(default)]
    pub adopt: bool,
}

/// The tracking record of a table: its schema and who owns it.
pub(crate) type TableRecord = MutualTrackingRecord<TableSchema>;

/// What the table sink does to the table itself.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) enum TableDdl {
    /// Nothing: the table is as declared (or the user owns it).
    Nothing,
    /// `CREATE TABLE IF NOT EXISTS`, then add, drop and retype columns until
    /// the table has the declared columns.
    Ensure,
    /// `DROP TABLE IF EXISTS` then `CREATE TABLE` (the key changed).
    Rebuild,
    /// `DROP TABLE IF EXISTS` (a table weir created, no longer declared).
    Drop,
}

/// One table action.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct TableAction {
    /// The table's name.
    pub table: String,
    /// The declared schema (`None` on a delete).
    pub schema: Option<TableSchema>,
    /// What to do.
    pub ddl: TableDdl,
    /// The registration to settle first (a table weir manages).
    #[serde(default)]
    pub claim: Option<Claim>,
}

/// The handler of one database's tables (the root provider's handler).
pub(crate) struct SqliteTableHandler {
    sink: TargetActionSink<TableAction>,
    /// The owner of the app: the tables it creates are registered to it.
    owner: Owner,
}

impl SqliteTableHandler {
    pub(crate) fn new(sink: TargetActionSink<TableAction>, owner: Owner) -> Self {
        Self { sink, owner }
    }

    fn claim(&self, adopt: bool) -> Claim {
        Claim {
            owner: self.owner.clone(),
            adopt,
        }
    }
}

/// The table name in a table key (`[database, table]`).
fn table_of(key: &StableKey) -> Result<String> {
    if let StableKey::Array(parts) = key {
        if let [StableKey::Str(_), StableKey::Str(table)] = parts.as_ref() {
            return Ok(table.to_string());
        }
    }
    Err(Error::permanent(format!(
        "sqlite table key {key} is not [database, table]; it was not declared by this connector"
    )))
}

/// Decides the DDL and the invalidation of the rows for a declared,
/// system-managed table.
fn plan(
    desired: &TableSchema,
    prev: &[TableRecord],
    prev_may_be_missing: bool,
) -> (TableDdl, Option<TargetChildInvalidation>) {
    let mine: Vec<&TableSchema> = prev
        .iter()
        .filter(|p| p.managed_by == ManagedBy::System)
        .map(|p| &p.record)
        .collect();
    if mine.is_empty() {
        // New, or taken over from the user: what is there may differ.
        let invalidation = (!prev.is_empty()).then_some(TargetChildInvalidation::Lossy);
        return (TableDdl::Ensure, invalidation);
    }
    let changes: Vec<SchemaChange> = mine.iter().map(|old| old.diff(desired)).collect();
    if changes.iter().any(|c| matches!(c, SchemaChange::Rebuild)) {
        return (
            TableDdl::Rebuild,
            Some(TargetChildInvalidation::Destructive),
        );
    }
    let invalidation = changes
        .iter()
        .filter_map(SchemaChange::child_invalidation)
        .max_by_key(|i| match i {
            TargetChildInvalidation::Lossy => 1,
            TargetChildInvalidation::Destructive => 2,
        });
    let same = changes.iter().all(|c| matches!(c, SchemaChange::Same));
    if same && !prev_may_be_missing {
        (TableDdl::Nothing, None)
    } else if prev_may_be_missing {
        // A table that may be missing is created if it is: its rows may
        // be missing too, so they are written again.
        (
            TableDdl::Ensure,
            invalidation.or(Some(TargetChildInvalidation::Lossy)),
        )
    } else {
        (TableDdl::Ensure, invalidation)
    }
}

impl TargetHandler<TableSpec> for SqliteTableHandler {
    type TrackingRecord = TableRecord;
    type Action = TableAction;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<TableSpec>,
        prev: Vec<TableRecord>,
        prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<TableAction, TableRecord>>> {
        let table = table_of(&key)?;
        match desired {
            // A container always answers while declared: the child-handler
            // factory builds the rows' handler from this action.
            Some(spec) => {
                let table = if spec.name.is_empty() {
                    table
                } else {
                    spec.name.clone()
                };
                let (ddl, child_invalidation) = match spec.managed_by {
                    ManagedBy::User => (TableDdl::Nothing, None),
                    ManagedBy::System => plan(&spec.schema, &prev, prev_may_be_missing),
                };
                let claim = (spec.managed_by == ManagedBy::System).then(|| self.claim(spec.adopt));
                let action = TableAction {
                    table,
                    schema: Some(spec.schema.clone()),
                    ddl,
                    claim,
                };
                Ok(Some(TargetReconcileOutput {
                    action: if prev.is_empty() {
                        TargetAction::Create(action)
                    } else {
                        TargetAction::Update(action)
                    },
                    sink: self.sink.clone(),
                    tracking_record: Some(MutualTrackingRecord::new(spec.schema, spec.managed_by)),
                    child_invalidation,
                }))
            }
            None => {
                if prev.is_empty() && !prev_may_be_missing {
                    return Ok(None);
                }
                // Destroy a table weir created; abandon one the user owns
                // (or one no record says weir created). An abandoned one
                // carries its schema: `drop_state` deletes its rows one by
                // one through the row handler built from it.
                let created_by_weir = prev.iter().any(|p| p.managed_by == ManagedBy::System);
                Ok(Some(TargetReconcileOutput {
                    action: TargetAction::Delete(TableAction {
                        table,
                        schema: (!created_by_weir)
                            .then(|| prev.first().map(|p| p.record.clone()))
                            .flatten(),
                        ddl: if created_by_weir {
                            TableDdl::Drop
                        } else {
                            TableDdl::Nothing
                        },
                        claim: created_by_weir.then(|| self.claim(false)),
                    }),
                    sink: self.sink.clone(),
                    tracking_record: None,
                    child_invalidation: created_by_weir
                        .then_some(TargetChildInvalidation::Destructive),
                }))
            }
        }
    }
}

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
            schema,
            sink,
        }
    }
}

/// A primary key value back as the value of type `ty` the upsert bound
/// (the inverse of [`SqlValue::to_key`]), for deletes. A JSON document is
/// parsed back from its text: bound alone it is that text again, and inside
/// an array it is written as the document, not as a string holding it.
fn key_part(part: &StableKey, ty: &ColumnType) -> Result<SqlValue> {
    Ok(match part {
        StableKey::Null => SqlValue::Null,
        StableKey::Bool(b) => SqlValue::Bool(*b),
        StableKey::Int(i) => SqlValue::Int(*i),
        StableKey::Str(s) | StableKey::Symbol(s) => match ty {
            ColumnType::Real | ColumnType::Double => {
                SqlValue::Float(s.parse::<f64>().map_err(|e| {
                    Error::permanent(format!("key part {part} is not a number: {e}"))
                })?)
            }
            ColumnType::Json => SqlValue::Json(
                serde_json::from_str(s)
                    .map_err(|e| Error::permanent(format!("key part {part} is not JSON: {e}")))?,
            ),
            _ => SqlValue::Text(s.to_string()),
        },
        StableKey::Bytes(b) => SqlValue::Bytes(b.to_vec()),
        StableKey::Uuid(u) => SqlValue::Uuid(*u),
        StableKey::Array(items) => {
            let inner = match ty {
                ColumnType::Array(inner) => inner.as_ref(),
                other => other,
            };
            SqlValue::Array(
                items
                    .iter()
                    .map(|i| key_part(i, inner))
                    .collect::<Result<_>>()?,
            )
        }
    })
}

/// The primary key values of a row key made by [`Row::key`](crate::sql::Row::key).
pub(crate) fn key_values(key: &StableKey, schema: &TableSchema) -> Result<Vec<SqlValue>> {
    let types: Vec<&ColumnType> = schema
        .primary_key()
        .iter()
        .filter_map(|k| schema.column(k).map(|c| &c.ty))
        .collect();
    match (types.as_slice(), key) {
        ([ty], part) => Ok(vec![key_part(part, ty)?]),
        (types, StableKey::Array(parts)) if parts.len() == types.len() => parts
            .iter()
            .zip(types)
            .map(|(p, ty)| key_part(p, ty))
            .collect(),
        _ => Err(Error::permanent(format!(
            "row key {key} does not match the primary key ({})",
            schema.primary_key().join(", ")
        ))),
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
                values: key_values(&key, &self.schema)
                    .map_err(|e| Error::permanent(format!("sqlite table {}: {e}", self.table)))?,
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

    fn schema(key: &[&str]) -> Result<TableSchema> {
        TableSchema::builder()
            .column("id", ColumnType::Text)
            .column("n", ColumnType::BigInt)
            .column("score", ColumnType::Double)
            .primary_key(key)
            .build()
    }

    #[test]
    fn row_keys_turn_back_into_typed_key_values() -> Result<()> {
        let s = schema(&["id", "n", "score"])?;
        let row = Row {
            values: vec![
                SqlValue::Text("a".into()),
                SqlValue::Int(3),
                SqlValue::Float(1.5),
            ],
        };
        assert_eq!(key_values(&row.key(&s), &s)?, row.values);
        let single = schema(&["n"])?;
        assert_eq!(
            key_values(&row.key(&single), &single)?,
            vec![SqlValue::Int(3)]
        );
        Ok(())
    }

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
            let deleted = key_values(&row.key(&schema), &schema)?;
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
        let deleted = key_values(&row.key(&all), &all)?;
        assert_eq!(
            deleted.iter().map(bound).collect::<Vec<_>>(),
            row.values.iter().map(bound).collect::<Vec<_>>()
        );
        Ok(())
    }

    #[test]
    fn an_unchanged_schema_needs_no_ddl_and_a_new_key_rebuilds() -> Result<()> {
        let old = schema(&["id"])?;
        let prev = vec![MutualTrackingRecord::new(old.clone(), ManagedBy::System)];
        assert_eq!(plan(&old, &prev, false), (TableDdl::Nothing, None));
        assert_eq!(
            plan(&old, &prev, true),
            (TableDdl::Ensure, Some(TargetChildInvalidation::Lossy))
        );
        assert_eq!(plan(&old, &[], false), (TableDdl::Ensure, None));
        assert_eq!(
            plan(&schema(&["n"])?, &prev, false),
            (
                TableDdl::Rebuild,
                Some(TargetChildInvalidation::Destructive)
            )
        );
        Ok(())
    }
}
