//! SQLite as a [`Dialect`]: its names, statements and sinks.

use std::borrow::Cow;
use std::sync::Arc;

use sqlx::SqlitePool;
use weir_actors::statediff::ManagedBy;
use weir_actors::{Error, Result, TargetAction};

use super::db::{SqDatabase, Sqlite};
use super::sink;
use crate::sql::table::actions::{RowWrite, TableAction};
use crate::sql::table::dialect::Dialect;
use crate::sql::TableSchema;

impl Dialect for Sqlite {
    type Pool = SqlitePool;
    /// Statements are built per call, for the number of rows it writes.
    type Statements = ();
    /// The writer lock (see [`ROW_SINK_CONCURRENT_CALLS`](Self::ROW_SINK_CONCURRENT_CALLS)).
    type PerDatabase = tokio::sync::Mutex<()>;

    const NAME: &'static str = "sqlite";
    /// Two calls at once: one prepares its statements (groups and binds
    /// its rows) while the other writes. SQLite writes one transaction at
    /// a time: the calls take turns through the database's writer lock,
    /// in the order they asked for it.
    const ROW_SINK_CONCURRENT_CALLS: usize = 2;
    /// A SQLite database is not shared by the members of a worker group.
    const CHECKS_FENCE: bool = false;

    fn tables_provider_name(db: &str) -> String {
        format!("weir.sqlite/{db}/table")
    }

    /// SQLite ignores the case of table names, and so does a table's key:
    /// `Docs` and `docs` are one table, one key.
    fn key_name(table: &str) -> Cow<'_, str> {
        if table.bytes().any(|b| b.is_ascii_uppercase()) {
            Cow::Owned(table.to_ascii_lowercase())
        } else {
            Cow::Borrowed(table)
        }
    }

    fn check_table(table: &str, _schema: &TableSchema) -> Result<()> {
        if table.to_ascii_lowercase().starts_with("sqlite_") {
            return Err(Error::permanent(format!(
                "invalid table name {table:?}: names starting with sqlite_ are reserved"
            )));
        }
        Ok(())
    }

    fn statements(_table: &str, _schema: &TableSchema, _managed_by: ManagedBy) -> Result<()> {
        Ok(())
    }

    async fn apply_tables(
        db: Arc<SqDatabase>,
        actions: Vec<TargetAction<TableAction>>,
    ) -> Result<()> {
        sink::apply_tables(&db, actions).await
    }

    async fn apply_rows(db: Arc<SqDatabase>, actions: Vec<TargetAction<RowWrite>>) -> Result<()> {
        sink::apply_rows(&db, actions).await
    }
}

#[cfg(test)]
mod tests {
    use crate::sql::table::keys::{key_types, key_values};
    use crate::sql::{ColumnType, Row, SqlValue, TableSchema};
    use weir_actors::{Error, Result};

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
