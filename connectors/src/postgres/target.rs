//! The table (container) and row (child) handlers, and each database's
//! sinks, kept by the app (their actions and shared state are in
//! [`db`](super::db)).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use weir_actors::statediff::{
    diff, resolve_system_transition, DiffAction, ManagedBy, MutualTrackingRecord,
    TrackingRecordTransition,
};
use weir_actors::{
    ChildTargetDef, ContextKey, Ctx, Error, Fingerprint, Owner, Result, StableKey, TargetAction,
    TargetActionSink, TargetChildInvalidation, TargetHandler, TargetReconcileOutput,
};

use super::db::{DbInner, RowAction, TableAction, TableMeta};
use super::ddl;
use super::sink;
use crate::sql::fingerprint::{name_order, row_fingerprint};
use crate::sql::owners::Claim;
use crate::sql::{ColumnType, Row, SqlValue, TableSchema};

/// What a table target state declares: the table's name, schema and owner.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct TableSpec {
    pub table: String,
    pub schema: TableSchema,
    pub managed_by: ManagedBy,
    /// Whether this app takes the table over from another owner.
    #[serde(default)]
    pub adopt: bool,
}

/// A table's tracking record: its schema and who manages it.
pub(crate) type TableRecord = MutualTrackingRecord<TableSchema>;

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
                    key_types: schema
                        .primary_key()
                        .iter()
                        .filter_map(|k| schema.column(k).map(|c| c.ty.clone()))
                        .collect(),
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

/// The table handler: creates, alters and drops tables.
pub(crate) struct PostgresTableHandler {
    pub shared: Arc<DbShared>,
    /// The owner of the app: the tables it creates are registered to it.
    pub owner: Owner,
}

impl PostgresTableHandler {
    fn claim(&self, adopt: bool) -> Claim {
        Claim {
            owner: self.owner.clone(),
            adopt,
        }
    }

    fn output(
        &self,
        action: TargetAction<TableAction>,
        tracking_record: Option<TableRecord>,
        child_invalidation: Option<TargetChildInvalidation>,
    ) -> Option<TargetReconcileOutput<TableAction, TableRecord>> {
        Some(TargetReconcileOutput {
            action,
            sink: self.shared.table_sink.clone(),
            tracking_record,
            child_invalidation,
        })
    }
}

/// The table name in a table key `[db, table]`.
fn table_of(key: &StableKey) -> Result<String> {
    match key {
        StableKey::Array(parts) => match parts.as_ref() {
            [_, StableKey::Str(table)] => Ok(table.to_string()),
            _ => Err(Error::permanent(format!("{key} is not a table key"))),
        },
        _ => Err(Error::permanent(format!("{key} is not a table key"))),
    }
}

impl TargetHandler<TableSpec> for PostgresTableHandler {
    type TrackingRecord = TableRecord;
    type Action = TableAction;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<TableSpec>,
        prev: Vec<TableRecord>,
        prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<TableAction, TableRecord>>> {
        let Some(spec) = desired else {
            if prev.is_empty() && !prev_may_be_missing {
                return Ok(None);
            }
            let table = table_of(&key)?;
            let schema = prev.first().map(|p| p.record.clone());
            return Ok(
                match resolve_system_transition(None, prev, prev_may_be_missing) {
                    // User-managed: abandon it, rows and all, and forget
                    // it. Its schema lets `drop_state` delete its rows one
                    // by one through the row handler built from it.
                    None => self.output(
                        TargetAction::Delete(TableAction {
                            table,
                            schema,
                            ddl: Vec::new(),
                            claim: None,
                        }),
                        None,
                        None,
                    ),
                    Some(_) => {
                        let ddl = vec![ddl::drop_table(&table)];
                        self.output(
                            TargetAction::Delete(TableAction {
                                table,
                                schema: None,
                                ddl,
                                claim: Some(self.claim(false)),
                            }),
                            None,
                            Some(TargetChildInvalidation::Destructive),
                        )
                    }
                },
            );
        };
        let first = prev.is_empty();
        let (ddl, invalidation) = match spec.managed_by {
            // The user owns the table: weir writes rows, never DDL.
            ManagedBy::User => (Vec::new(), None),
            ManagedBy::System => {
                let system: Vec<&TableSchema> = prev
                    .iter()
                    .filter(|r| r.managed_by == ManagedBy::System)
                    .map(|r| &r.record)
                    .collect();
                if system.is_empty() {
                    // New, or taken over from the user: it may exist already,
                    // with other columns; rows written by the user may lack
                    // what weir would have written, so a takeover is Lossy.
                    let invalidation = (!first).then_some(TargetChildInvalidation::Lossy);
                    (ddl::adopt_table(&spec.table, &spec.schema)?, invalidation)
                } else {
                    ddl::plan_change(&spec.table, &system, &spec.schema, prev_may_be_missing)?
                }
            }
        };
        let record = MutualTrackingRecord::new(spec.schema.clone(), spec.managed_by);
        let claim = (spec.managed_by == ManagedBy::System).then(|| self.claim(spec.adopt));
        let action = TableAction {
            table: spec.table,
            schema: Some(spec.schema),
            ddl,
            claim,
        };
        // Always an action while declared: the child handler is built from it.
        let action = if first {
            TargetAction::Create(action)
        } else {
            TargetAction::Update(action)
        };
        Ok(self.output(action, Some(record), invalidation))
    }
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

/// The primary key values of a row key (`Row::key`), typed by the key's
/// column types: the inverse of `SqlValue::to_key`.
pub(crate) fn key_values(
    key: &StableKey,
    types: &[ColumnType],
) -> std::result::Result<Vec<SqlValue>, String> {
    match (types, key) {
        ([one], _) => Ok(vec![key_value(key, one)?]),
        (_, StableKey::Array(parts)) if parts.len() == types.len() => parts
            .iter()
            .zip(types)
            .map(|(k, ty)| key_value(k, ty))
            .collect(),
        _ => Err(format!(
            "the key does not match the {}-column primary key",
            types.len()
        )),
    }
}

fn key_value(key: &StableKey, ty: &ColumnType) -> std::result::Result<SqlValue, String> {
    let bad = || Err(format!("key part {key} does not fit a {ty:?} column"));
    Ok(match (key, ty) {
        (StableKey::Null, _) => SqlValue::Null,
        (StableKey::Bool(b), _) => SqlValue::Bool(*b),
        (StableKey::Int(i), _) => SqlValue::Int(*i),
        (StableKey::Str(s), ColumnType::Text) => SqlValue::Text(s.to_string()),
        (StableKey::Str(s), ColumnType::Real | ColumnType::Double) => {
            SqlValue::Float(s.parse::<f64>().map_err(|e| e.to_string())?)
        }
        (StableKey::Str(s), ColumnType::Json) => {
            SqlValue::Json(serde_json::from_str(s).map_err(|e| e.to_string())?)
        }
        (StableKey::Str(s), ColumnType::Timestamp) => SqlValue::Timestamp(
            chrono::DateTime::parse_from_rfc3339(s)
                .map_err(|e| e.to_string())?
                .with_timezone(&chrono::Utc),
        ),
        (StableKey::Bytes(b), _) => SqlValue::Bytes(b.to_vec()),
        (StableKey::Uuid(u), _) => SqlValue::Uuid(*u),
        (StableKey::Array(items), ColumnType::Array(inner)) => SqlValue::Array(
            items
                .iter()
                .map(|k| key_value(k, inner))
                .collect::<std::result::Result<_, _>>()?,
        ),
        _ => return bad(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_keys_convert_back_to_typed_key_values() -> Result<()> {
        let schema = TableSchema::builder()
            .column("id", ColumnType::Uuid)
            .column("at", ColumnType::Timestamp)
            .column("n", ColumnType::Double)
            .primary_key(["id", "at", "n"])
            .build()?;
        let row = Row {
            values: vec![
                SqlValue::Uuid(uuid::Uuid::from_u128(7)),
                SqlValue::Timestamp(chrono::DateTime::<chrono::Utc>::UNIX_EPOCH),
                SqlValue::Float(1.5),
            ],
        };
        let types = vec![ColumnType::Uuid, ColumnType::Timestamp, ColumnType::Double];
        assert_eq!(
            key_values(&row.key(&schema), &types),
            Ok(row.values.clone())
        );
        let single = StableKey::Str("a".into());
        assert_eq!(
            key_values(&single, &[ColumnType::Text]),
            Ok(vec![SqlValue::Text("a".into())])
        );
        assert!(key_values(&single, &[ColumnType::Text, ColumnType::Text]).is_err());
        Ok(())
    }

    #[test]
    fn json_key_values_convert_back_to_the_documents_written_whatever_their_floats() -> Result<()> {
        // The shortest text of these floats parses back to a neighbouring
        // float unless JSON numbers are parsed exactly: the delete's JSON
        // would then differ from the row's.
        let schema = TableSchema::builder()
            .column("doc", ColumnType::Json)
            .column("docs", ColumnType::Array(Box::new(ColumnType::Json)))
            .primary_key(["doc", "docs"])
            .build()?;
        let types = vec![
            ColumnType::Json,
            ColumnType::Array(Box::new(ColumnType::Json)),
        ];
        for f in [212.918_907_267_134_59, 1.071_566_039_146_582_6e-75, 0.1] {
            let row = Row {
                values: vec![
                    SqlValue::Json(serde_json::json!({"x": f, "n": [f]})),
                    SqlValue::Array(vec![SqlValue::Json(serde_json::json!(f)), SqlValue::Null]),
                ],
            };
            assert_eq!(
                key_values(&row.key(&schema), &types),
                Ok(row.values.clone()),
                "{f}"
            );
        }
        Ok(())
    }
}
