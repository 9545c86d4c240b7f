//! Row keys back to the typed values of a table's primary key.
//!
//! A row's key is its primary key values as a [`StableKey`]
//! ([`Row::key`](crate::sql::Row::key)); a delete has only that key, and
//! binds the values it came from. Both dialects bind them exactly as the
//! upsert bound the row's own values, so a delete finds the row whatever
//! the key's type.

use weir_actors::StableKey;

use crate::sql::{ColumnType, SqlValue, TableSchema};

/// The types of `schema`'s primary key columns, in key order.
pub(crate) fn key_types(schema: &TableSchema) -> Vec<ColumnType> {
    schema
        .primary_key()
        .iter()
        .filter_map(|k| schema.column(k).map(|c| c.ty.clone()))
        .collect()
}

/// The primary key values of a row key made by
/// [`Row::key`](crate::sql::Row::key), typed by the key's column `types`:
/// the inverse of [`SqlValue::to_key`].
///
/// # Errors
/// Why the key does not fit the types (its length, or a part that does not
/// parse as its column's type).
pub(crate) fn key_values(key: &StableKey, types: &[ColumnType]) -> Result<Vec<SqlValue>, String> {
    match (types, key) {
        ([one], _) => Ok(vec![key_part(key, one)?]),
        (_, StableKey::Array(parts)) if parts.len() == types.len() => parts
            .iter()
            .zip(types)
            .map(|(part, ty)| key_part(part, ty))
            .collect(),
        _ => Err(format!(
            "the key does not match the {}-column primary key",
            types.len()
        )),
    }
}

/// One key part as the value of type `ty` that the upsert bound. A JSON
/// document is parsed back from its text (exactly: see the crate's
/// `float_roundtrip`), a float and a timestamp likewise.
fn key_part(part: &StableKey, ty: &ColumnType) -> Result<SqlValue, String> {
    Ok(match part {
        StableKey::Null => SqlValue::Null,
        StableKey::Bool(b) => SqlValue::Bool(*b),
        StableKey::Int(i) => SqlValue::Int(*i),
        StableKey::Str(s) | StableKey::Symbol(s) => text_part(part, s, ty)?,
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
                    .map(|item| key_part(item, inner))
                    .collect::<Result<_, _>>()?,
            )
        }
    })
}

/// A key part held as text: a float, a JSON document, a timestamp or text.
fn text_part(part: &StableKey, s: &str, ty: &ColumnType) -> Result<SqlValue, String> {
    let bad = |what: &str, e: &dyn std::fmt::Display| format!("key part {part} is not {what}: {e}");
    Ok(match ty {
        ColumnType::Real | ColumnType::Double => {
            SqlValue::Float(s.parse::<f64>().map_err(|e| bad("a number", &e))?)
        }
        ColumnType::Json => SqlValue::Json(serde_json::from_str(s).map_err(|e| bad("JSON", &e))?),
        ColumnType::Timestamp => SqlValue::Timestamp(
            chrono::DateTime::parse_from_rfc3339(s)
                .map_err(|e| bad("an RFC 3339 timestamp", &e))?
                .with_timezone(&chrono::Utc),
        ),
        _ => SqlValue::Text(s.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::Row;
    use weir_actors::Result;

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
        let types = key_types(&schema);
        assert_eq!(key_values(&row.key(&schema), &types), Ok(row.values));
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
        let types = key_types(&schema);
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

    #[test]
    fn a_key_part_that_does_not_parse_as_its_column_type_is_an_error_naming_it() {
        let bad = StableKey::Str("yesterday".into());
        let err = key_values(&bad, &[ColumnType::Timestamp]).err();
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("yesterday") && e.contains("timestamp")),
            "{err:?}"
        );
    }
}
