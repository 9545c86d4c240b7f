//! Typed SQL values, from any `Serialize` row.
//!
//! A row becomes generic MessagePack values by field name, which keep what
//! JSON would lose: NaN and infinities (to reject them), byte strings, and
//! integer widths. A flat row (scalar fields) is collected straight into
//! such values; any other row is serialized with MessagePack and read back.
//! Each column's value is then checked against the column's type.

use chrono::{DateTime, TimeZone, Utc};
use rmpv::Value;
use serde::{Deserialize, Serialize};
use weir_actors::{Error, Result, StableKey};

use super::depth::{Bounded, Limits};
use super::flat::flat_fields;
use super::schema::{ColumnType, TableSchema};

/// How deep a row may nest, the row itself being the first level: a column
/// value may nest one level less (a JSON column, 127 levels of arrays or
/// objects). Deeper values are refused when a row is converted, before
/// anything recurses through them: every level costs stack in
/// serialization, decoding and conversion, and a value nested deeply enough
/// would overflow it and abort the process.
pub const MAX_NESTING: usize = 128;

/// One column value, typed for binding.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum SqlValue {
    /// NULL.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer (any width).
    Int(i64),
    /// A finite float.
    Float(f64),
    /// Text without NUL bytes.
    Text(String),
    /// Raw bytes.
    Bytes(Vec<u8>),
    /// A JSON document (finite numbers, no NUL in strings).
    Json(serde_json::Value),
    /// A point in time, in UTC.
    Timestamp(DateTime<Utc>),
    /// A UUID.
    Uuid(uuid::Uuid),
    /// An array of values of one type.
    Array(Vec<SqlValue>),
}

/// A row's values, in the order of its schema's columns.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// One value per column of the schema, in order.
    pub values: Vec<SqlValue>,
}

impl Row {
    /// Converts a `Serialize` value (a struct, or a map from column names to
    /// values) into a row of `schema`. Fields that are not columns are
    /// ignored; a missing field is NULL.
    ///
    /// # Errors
    /// A permanent error naming the table, the column and what is wrong: a
    /// NULL in a NOT NULL column, a value of the wrong type or out of range,
    /// a NaN or infinite float, a NUL byte in text, a value nested more than
    /// [`MAX_NESTING`] levels deep.
    pub fn from_serialize<T: Serialize + ?Sized>(
        table: &str,
        schema: &TableSchema,
        row: &T,
    ) -> Result<Row> {
        if let Some(mut fields) = flat_fields(row) {
            return Self::from_fields(table, schema, |name| {
                let field = fields.iter_mut().find(|(k, _)| k == name)?;
                Some(std::mem::replace(&mut field.1, Value::Nil))
            });
        }
        // Bounded: deeper values are cut (and refused below, when they are
        // columns) before anything recurses through them.
        let limits = Limits::new(MAX_NESTING);
        let bytes = rmp_serde::to_vec_named(&Bounded::new(row, &limits))?;
        if limits.cut_outside() {
            return Err(Error::permanent(format!(
                "table {table}: the row is nested more than {MAX_NESTING} levels deep"
            )));
        }
        // rmpv counts two steps per level of nesting, and one per leaf.
        let value =
            rmpv::decode::read_value_with_max_depth(&mut bytes.as_slice(), 2 * MAX_NESTING + 4)
                .map_err(|e| {
                    Error::permanent(format!("table {table}: cannot read the row: {e}"))
                })?;
        let Value::Map(mut fields) = value else {
            return Err(Error::permanent(format!(
                "table {table}: a row must be a struct or a map of column names, not {value}"
            )));
        };
        let find = |name: &str| {
            fields
                .iter()
                .position(|(k, _)| k.as_str() == Some(name))
                .and_then(|i| Some((i, &fields.get(i)?.1)))
        };
        for column in schema.columns() {
            if let Some((position, _)) = find(&column.name) {
                if limits.cut_entry(position) {
                    return Err(Error::permanent(format!(
                        "table {table}, column {}: the value is nested more than {} levels deep",
                        column.name,
                        limits.max() - 1
                    )));
                }
            }
        }
        Self::from_fields(table, schema, |name| {
            let field = fields.iter_mut().find(|(k, _)| k.as_str() == Some(name))?;
            Some(std::mem::replace(&mut field.1, Value::Nil))
        })
    }

    /// The row of `schema` whose fields `take` takes out by column name
    /// (each at most once): each column's value is checked against its type
    /// and nullability.
    fn from_fields(
        table: &str,
        schema: &TableSchema,
        mut take: impl FnMut(&str) -> Option<Value>,
    ) -> Result<Row> {
        let mut values = Vec::with_capacity(schema.columns().len());
        for column in schema.columns() {
            let value = match take(&column.name) {
                None | Some(Value::Nil) => {
                    if !column.nullable {
                        return Err(Error::permanent(format!(
                            "table {table}, column {}: no value, but the column is NOT NULL",
                            column.name
                        )));
                    }
                    SqlValue::Null
                }
                Some(v) => convert_owned(v, &column.ty).map_err(|why| {
                    Error::permanent(format!("table {table}, column {}: {why}", column.name))
                })?,
            };
            values.push(value);
        }
        Ok(Row { values })
    }

    /// The row's primary key as a stable key: the key value itself for a
    /// single-column key, an array for a composite one.
    pub fn key(&self, schema: &TableSchema) -> StableKey {
        key_of(schema.primary_key().iter().filter_map(|k| {
            let i = schema.columns().iter().position(|c| &c.name == k)?;
            self.values.get(i)
        }))
    }
}

/// The stable key of a row's primary key values, in key order: the value
/// itself for a one-column key (no list is built for it), an array
/// otherwise.
pub(crate) fn key_of<'a>(values: impl IntoIterator<Item = &'a SqlValue>) -> StableKey {
    let mut values = values.into_iter();
    let first = values.next().map(SqlValue::to_key);
    let second = values.next().map(SqlValue::to_key);
    match (first, second) {
        (Some(one), None) => one,
        (first, second) => StableKey::Array(
            first
                .into_iter()
                .chain(second)
                .chain(values.map(SqlValue::to_key))
                .collect(),
        ),
    }
}

impl SqlValue {
    /// The value as a stable key (for primary key values).
    pub fn to_key(&self) -> StableKey {
        match self {
            SqlValue::Null => StableKey::Null,
            SqlValue::Bool(b) => StableKey::Bool(*b),
            SqlValue::Int(i) => StableKey::Int(*i),
            SqlValue::Float(f) => StableKey::Str(f.to_string().into()),
            SqlValue::Text(s) => StableKey::Str(s.as_str().into()),
            SqlValue::Bytes(b) => StableKey::Bytes(b.as_slice().into()),
            SqlValue::Json(j) => StableKey::Str(j.to_string().into()),
            SqlValue::Timestamp(t) => StableKey::Str(t.to_rfc3339().into()),
            SqlValue::Uuid(u) => StableKey::Uuid(*u),
            SqlValue::Array(items) => StableKey::Array(
                items
                    .iter()
                    .map(SqlValue::to_key)
                    .collect::<Vec<_>>()
                    .into(),
            ),
        }
    }
}

fn text(s: &rmpv::Utf8String) -> std::result::Result<&str, String> {
    let s = s.as_str().ok_or("text is not valid UTF-8")?;
    if s.contains('\0') {
        return Err("text contains a NUL byte, which databases cannot store".into());
    }
    Ok(s)
}

fn integer(v: &Value, min: i64, max: i64) -> std::result::Result<i64, String> {
    let i = match v {
        Value::Integer(i) => i
            .as_i64()
            .ok_or_else(|| format!("{v} does not fit a 64-bit integer"))?,
        other => return Err(format!("expected an integer, got {other}")),
    };
    if i < min || i > max {
        return Err(format!("{i} is out of range ({min}..={max})"));
    }
    Ok(i)
}

fn float(v: &Value) -> std::result::Result<f64, String> {
    let f = match v {
        Value::F64(f) => *f,
        Value::F32(f) => f64::from(*f),
        Value::Integer(i) => i.as_f64().ok_or("not a number")?,
        other => return Err(format!("expected a number, got {other}")),
    };
    if !f.is_finite() {
        return Err(format!("{f} is not a finite number"));
    }
    Ok(f)
}

/// [`convert`], moving text instead of copying it.
fn convert_owned(v: Value, ty: &ColumnType) -> std::result::Result<SqlValue, String> {
    match (ty, v) {
        (ColumnType::Text, Value::String(s)) => {
            text(&s)?;
            // `text` checked that it is UTF-8.
            s.into_str()
                .map(SqlValue::Text)
                .ok_or_else(|| "text is not valid UTF-8".to_string())
        }
        (ty, v) => convert(&v, ty),
    }
}

fn convert(v: &Value, ty: &ColumnType) -> std::result::Result<SqlValue, String> {
    Ok(match ty {
        ColumnType::Text => match v {
            Value::String(s) => SqlValue::Text(text(s)?.to_string()),
            other => return Err(format!("expected text, got {other}")),
        },
        ColumnType::SmallInt => {
            SqlValue::Int(integer(v, i64::from(i16::MIN), i64::from(i16::MAX))?)
        }
        ColumnType::Integer => SqlValue::Int(integer(v, i64::from(i32::MIN), i64::from(i32::MAX))?),
        ColumnType::BigInt => SqlValue::Int(integer(v, i64::MIN, i64::MAX)?),
        ColumnType::Real => {
            let f = float(v)?;
            if (f as f32).is_infinite() {
                return Err(format!("{f} does not fit a 32-bit float"));
            }
            SqlValue::Float(f)
        }
        ColumnType::Double => SqlValue::Float(float(v)?),
        ColumnType::Boolean => match v {
            Value::Boolean(b) => SqlValue::Bool(*b),
            other => return Err(format!("expected a boolean, got {other}")),
        },
        ColumnType::Bytes => match v {
            Value::Binary(b) => SqlValue::Bytes(b.clone()),
            Value::Array(items) => SqlValue::Bytes(
                items
                    .iter()
                    .map(|i| integer(i, 0, 255).map(|b| b as u8))
                    .collect::<std::result::Result<Vec<u8>, String>>()?,
            ),
            other => return Err(format!("expected bytes, got {other}")),
        },
        ColumnType::Json => SqlValue::Json(json(v)?),
        ColumnType::Timestamp => SqlValue::Timestamp(match v {
            Value::String(s) => DateTime::parse_from_rfc3339(text(s)?)
                .map_err(|e| format!("{s} is not an RFC 3339 timestamp: {e}"))?
                .with_timezone(&Utc),
            Value::Integer(_) => {
                let secs = integer(v, i64::MIN, i64::MAX)?;
                Utc.timestamp_opt(secs, 0)
                    .single()
                    .ok_or_else(|| format!("{secs} seconds is out of range"))?
            }
            other => return Err(format!("expected a timestamp, got {other}")),
        }),
        ColumnType::Uuid => SqlValue::Uuid(match v {
            Value::String(s) => {
                uuid::Uuid::parse_str(text(s)?).map_err(|e| format!("{s} is not a UUID: {e}"))?
            }
            Value::Binary(b) => {
                uuid::Uuid::from_slice(b).map_err(|e| format!("not a UUID: {e}"))?
            }
            other => return Err(format!("expected a UUID, got {other}")),
        }),
        ColumnType::Array(inner) => match v {
            Value::Array(items) => SqlValue::Array(
                items
                    .iter()
                    .map(|i| match i {
                        Value::Nil => Ok(SqlValue::Null),
                        other => convert(other, inner),
                    })
                    .collect::<std::result::Result<Vec<_>, String>>()?,
            ),
            other => return Err(format!("expected an array, got {other}")),
        },
    })
}

/// Converts a generic value to JSON, rejecting what JSON databases refuse.
fn json(v: &Value) -> std::result::Result<serde_json::Value, String> {
    use serde_json::Value as J;
    Ok(match v {
        Value::Nil => J::Null,
        Value::Boolean(b) => J::Bool(*b),
        Value::Integer(i) => match (i.as_i64(), i.as_u64()) {
            (Some(n), _) => J::from(n),
            (None, Some(n)) => J::from(n),
            _ => return Err(format!("{i} is not a representable integer")),
        },
        Value::F32(_) | Value::F64(_) => {
            let f = float(v)?;
            serde_json::Number::from_f64(f)
                .map(J::Number)
                .ok_or("not a finite number")?
        }
        Value::String(s) => J::String(text(s)?.to_string()),
        Value::Binary(b) => J::Array(b.iter().map(|x| J::from(*x)).collect()),
        Value::Array(items) => J::Array(
            items
                .iter()
                .map(json)
                .collect::<std::result::Result<_, _>>()?,
        ),
        Value::Map(entries) => {
            let mut map = serde_json::Map::with_capacity(entries.len());
            for (k, val) in entries {
                let key = match k {
                    Value::String(s) => text(s)?.to_string(),
                    other => other.to_string(),
                };
                map.insert(key, json(val)?);
            }
            J::Object(map)
        }
        Value::Ext(_, _) => return Err("MessagePack extension values are not supported".into()),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Serialize)]
    struct Doc {
        id: String,
        n: i64,
        score: f64,
        meta: BTreeMap<String, f64>,
        tags: Vec<String>,
    }

    fn schema() -> Result<TableSchema> {
        TableSchema::builder()
            .column("id", ColumnType::Text)
            .column("n", ColumnType::Integer)
            .nullable_column("score", ColumnType::Double)
            .nullable_column("meta", ColumnType::Json)
            .nullable_column("tags", ColumnType::Array(Box::new(ColumnType::Text)))
            .nullable_column("missing", ColumnType::Text)
            .primary_key(["id"])
            .build()
    }

    fn doc(score: f64) -> Doc {
        Doc {
            id: "a".into(),
            n: 7,
            score,
            meta: BTreeMap::from([("x".to_string(), 1.5)]),
            tags: vec!["t".into()],
        }
    }

    #[test]
    fn a_struct_becomes_typed_values_in_column_order() -> Result<()> {
        let row = Row::from_serialize("docs", &schema()?, &doc(0.5))?;
        assert_eq!(row.values[0], SqlValue::Text("a".into()));
        assert_eq!(row.values[1], SqlValue::Int(7));
        assert_eq!(row.values[2], SqlValue::Float(0.5));
        assert_eq!(row.values[3], SqlValue::Json(serde_json::json!({"x": 1.5})));
        assert_eq!(
            row.values[4],
            SqlValue::Array(vec![SqlValue::Text("t".into())])
        );
        assert_eq!(row.values[5], SqlValue::Null);
        assert_eq!(row.key(&schema()?), StableKey::Str("a".into()));
        Ok(())
    }

    #[test]
    fn non_finite_floats_and_nul_bytes_are_rejected_naming_table_and_column() -> Result<()> {
        for bad in [f64::NAN, f64::INFINITY] {
            let err = Row::from_serialize("docs", &schema()?, &doc(bad)).err();
            let text = err.map(|e| e.to_string()).unwrap_or_default();
            assert!(text.contains("table docs, column score"), "{text}");
        }
        let mut d = doc(1.0);
        d.id = "a\0b".into();
        let text = Row::from_serialize("docs", &schema()?, &d)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(text.contains("column id") && text.contains("NUL"), "{text}");
        let mut d = doc(1.0);
        d.meta.insert("nan".into(), f64::NAN);
        assert!(Row::from_serialize("docs", &schema()?, &d).is_err());
        Ok(())
    }

    #[test]
    fn a_column_map_works_and_out_of_range_integers_are_rejected() -> Result<()> {
        let s = TableSchema::builder()
            .column("id", ColumnType::SmallInt)
            .primary_key(["id"])
            .build()?;
        let ok = BTreeMap::from([("id", 5)]);
        assert_eq!(
            Row::from_serialize("t", &s, &ok)?.values,
            vec![SqlValue::Int(5)]
        );
        let big = BTreeMap::from([("id", 70_000)]);
        assert!(Row::from_serialize("t", &s, &big).is_err());
        let missing: BTreeMap<&str, i32> = BTreeMap::new();
        let text = Row::from_serialize("t", &s, &missing)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(text.contains("NOT NULL"), "{text}");
        Ok(())
    }

    #[test]
    fn a_row_of_every_value_kind_decodes_back_equal_from_its_encoding() -> Result<()> {
        // The connectors declare rows with `target_state_exact`, which is
        // right only because a row's encoding loses nothing.
        let at = DateTime::parse_from_rfc3339("2026-11-30T12:00:00.123456789+02:00")
            .map_err(|e| Error::msg(e.to_string()))?
            .with_timezone(&Utc);
        let row = Row {
            values: vec![
                SqlValue::Null,
                SqlValue::Bool(true),
                SqlValue::Int(i64::MIN),
                SqlValue::Float(-0.0),
                SqlValue::Float(1e300),
                SqlValue::Text("é\u{1F600} text".into()),
                SqlValue::Bytes(vec![0, 255, 7]),
                SqlValue::Json(serde_json::json!({
                    "b": [1, -2, 2.5, u64::MAX, null, true],
                    "a": {"nested": "x"}
                })),
                SqlValue::Timestamp(at),
                SqlValue::Uuid(uuid::Uuid::from_u128(0x0123_4567_89ab_cdef)),
                SqlValue::Array(vec![SqlValue::Int(1), SqlValue::Null]),
            ],
        };
        let decoded: Row = rmp_serde::from_slice(&rmp_serde::to_vec(&row)?)?;
        assert_eq!(decoded, row);
        // -0.0 == 0.0: check the sign survived too.
        assert_eq!(
            format!("{:?}", decoded.values[3]),
            format!("{:?}", row.values[3])
        );
        Ok(())
    }
}
