//! Column types in SQLite, and how values are bound.
//!
//! SQLite has storage classes, not types: integers (booleans too) are
//! INTEGER, floats REAL, bytes BLOB, and everything else TEXT: JSON
//! documents and arrays as JSON, timestamps as RFC 3339, UUIDs hyphenated.

use std::borrow::Cow;

use sqlx::error::BoxDynError;
use sqlx::sqlite::SqliteArguments;
use sqlx::Arguments as _;

use crate::sql::{ColumnType, SqlValue};

/// The SQLite storage class of a column type (see [`ColumnType`]).
pub(super) fn sql_type(ty: &ColumnType) -> &'static str {
    match ty {
        ColumnType::Text
        | ColumnType::Json
        | ColumnType::Timestamp
        | ColumnType::Uuid
        | ColumnType::Array(_) => "TEXT",
        ColumnType::SmallInt | ColumnType::Integer | ColumnType::BigInt | ColumnType::Boolean => {
            "INTEGER"
        }
        ColumnType::Real | ColumnType::Double => "REAL",
        ColumnType::Bytes => "BLOB",
    }
}

/// A value as it is bound, and stored: SQLite's storage classes.
#[derive(Debug, PartialEq)]
pub(super) enum Bound<'a> {
    /// NULL.
    Null,
    /// INTEGER (booleans as 0 and 1).
    Integer(i64),
    /// REAL.
    Real(f64),
    /// TEXT, borrowed when the value is text.
    Text(Cow<'a, str>),
    /// BLOB.
    Blob(&'a [u8]),
}

/// How `value` is bound (see the module's documentation).
pub(super) fn bound(value: &SqlValue) -> Bound<'_> {
    match value {
        SqlValue::Null => Bound::Null,
        SqlValue::Bool(b) => Bound::Integer(i64::from(*b)),
        SqlValue::Int(i) => Bound::Integer(*i),
        SqlValue::Float(f) => Bound::Real(*f),
        SqlValue::Text(s) => Bound::Text(Cow::Borrowed(s)),
        SqlValue::Bytes(b) => Bound::Blob(b),
        other => Bound::Text(Cow::Owned(text_of(other))),
    }
}

/// Adds one value to a statement's arguments, borrowing text and bytes.
pub(super) fn bind<'q>(
    args: &mut SqliteArguments<'q>,
    value: &'q SqlValue,
) -> std::result::Result<(), BoxDynError> {
    match bound(value) {
        Bound::Null => args.add(None::<i64>),
        Bound::Integer(i) => args.add(i),
        Bound::Real(f) => args.add(f),
        Bound::Text(Cow::Borrowed(s)) => args.add(s),
        Bound::Text(Cow::Owned(s)) => args.add(s),
        Bound::Blob(b) => args.add(b),
    }
}

/// The text SQLite stores for a value kept as TEXT: JSON documents and
/// arrays as JSON, timestamps as RFC 3339 (as in row keys), UUIDs
/// hyphenated.
fn text_of(value: &SqlValue) -> String {
    match value {
        SqlValue::Text(s) => s.clone(),
        SqlValue::Json(j) => j.to_string(),
        SqlValue::Timestamp(t) => t.to_rfc3339(),
        SqlValue::Uuid(u) => u.to_string(),
        other => json_of(other).to_string(),
    }
}

/// A value as JSON (for arrays).
fn json_of(value: &SqlValue) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        SqlValue::Null => J::Null,
        SqlValue::Bool(b) => J::Bool(*b),
        SqlValue::Int(i) => J::from(*i),
        SqlValue::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
        SqlValue::Text(s) => J::String(s.clone()),
        SqlValue::Bytes(b) => J::Array(b.iter().map(|x| J::from(*x)).collect()),
        SqlValue::Json(j) => j.clone(),
        SqlValue::Timestamp(t) => J::String(t.to_rfc3339()),
        SqlValue::Uuid(u) => J::String(u.to_string()),
        SqlValue::Array(items) => J::Array(items.iter().map(json_of).collect()),
    }
}

#[cfg(test)]
mod tests {
    use crate::sql::table::keys::{key_types, key_values};
    use crate::sql::{ColumnType, Row, SqlValue, TableSchema};
    use weir_actors::{Error, Result};

    #[test]
    fn a_delete_binds_each_key_type_as_the_upsert_bound_it() -> Result<()> {
        use super::bound;
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
