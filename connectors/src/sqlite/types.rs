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
