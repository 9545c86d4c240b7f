//! A row's tracking record: the fingerprint of its non-NULL values by
//! column name, shared by the SQL targets.
//!
//! Keyed by name and without NULLs, the fingerprint of an unchanged row
//! stays the same when a nullable column is added or columns are
//! reordered, so such a schema change rewrites no row.

use serde::Serialize;
use weir_actors::Fingerprint;

use super::{msgpack, Column, SqlValue, TableSchema};

/// A row as it is fingerprinted: its non-NULL values by column name, in
/// name order, so that adding a nullable column (or reordering columns)
/// leaves unchanged rows alone. It encodes as the list of `(name, value)`
/// pairs it stands for.
pub(crate) struct NamedValues<'a> {
    columns: &'a [Column],
    /// Column positions in name order.
    by_name: &'a [usize],
    values: &'a [SqlValue],
}

impl NamedValues<'_> {
    fn pairs(&self) -> impl Iterator<Item = (&str, &SqlValue)> + '_ {
        self.by_name.iter().filter_map(|&i| {
            let value = self.values.get(i)?;
            let column = self.columns.get(i)?;
            (!matches!(value, SqlValue::Null)).then_some((column.name.as_str(), value))
        })
    }
}

impl Serialize for NamedValues<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.pairs().count()))?;
        for pair in self.pairs() {
            seq.serialize_element(&pair)?;
        }
        seq.end()
    }
}

/// The fingerprint of a row's `values` (see [`NamedValues`]); `by_name` is
/// [`name_order`] of `schema`.
pub(crate) fn row_fingerprint(
    schema: &TableSchema,
    by_name: &[usize],
    values: &[SqlValue],
) -> Fingerprint {
    let named = NamedValues {
        columns: schema.columns(),
        by_name,
        values,
    };
    // The bytes `named` serializes to, written directly.
    msgpack::fingerprint(&named, |buf| {
        let pair = |buf: &mut Vec<u8>, (name, value): (&str, &SqlValue)| {
            msgpack::write_len(buf, 2)?;
            rmp::encode::write_str(buf, name)?;
            msgpack::write_value(buf, value)
        };
        // Up to 15 pairs, the length is one byte (a fixarray): written
        // once the pairs are counted, rather than counting them first.
        if values.len() <= MAX_FIXARRAY {
            let at = buf.len();
            msgpack::write_len(buf, 0)?;
            let mut count: u8 = 0;
            for p in named.pairs() {
                pair(buf, p)?;
                count += 1;
            }
            if let Some(slot) = buf.get_mut(at) {
                *slot = rmp::Marker::FixArray(count).to_u8();
            }
            return Ok(());
        }
        msgpack::write_len(buf, named.pairs().count())?;
        named.pairs().try_for_each(|p| pair(buf, p))
    })
}

/// The most items whose MessagePack array header is one byte.
const MAX_FIXARRAY: usize = 15;

/// The positions of `schema`'s columns, in name order.
pub(crate) fn name_order(schema: &TableSchema) -> Vec<usize> {
    let mut order: Vec<usize> = (0..schema.columns().len()).collect();
    order.sort_by(|&a, &b| {
        let name = |i: usize| schema.columns().get(i).map(|c| c.name.as_str());
        name(a).cmp(&name(b))
    });
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::ColumnType;
    use weir_actors::{Error, Result};

    /// The time in the pinned rows.
    fn pinned_time() -> Result<chrono::DateTime<chrono::Utc>> {
        Ok(chrono::DateTime::parse_from_rfc3339("2026-11-30T12:00:00Z")
            .map_err(|e| Error::msg(e.to_string()))?
            .with_timezone(&chrono::Utc))
    }

    /// The fingerprint of the list a row's fingerprint stands for (its
    /// non-NULL values by column name, in name order), built the plain way:
    /// through serde.
    fn plain_fingerprint(schema: &TableSchema, values: &[SqlValue]) -> Fingerprint {
        let mut named: Vec<(&str, &SqlValue)> = schema
            .columns()
            .iter()
            .zip(values)
            .filter(|(_, v)| !matches!(v, SqlValue::Null))
            .map(|(c, v)| (c.name.as_str(), v))
            .collect();
        named.sort_by_key(|(name, _)| *name);
        Fingerprint::from(&named)
    }

    #[test]
    fn a_row_fingerprint_of_any_width_is_that_of_its_non_null_values_by_column_name() -> Result<()>
    {
        // Up to 15 pairs the list's length is written after its pairs,
        // beyond it before them: both must give the serde encoding's digest.
        for width in [1, 14, 15, 16, 17, 40] {
            let mut builder = TableSchema::builder();
            for i in 0..width {
                let name = format!("c{:02}", width - i);
                builder = match i {
                    0 => builder.column(&name, ColumnType::BigInt),
                    _ => builder.nullable_column(&name, ColumnType::BigInt),
                };
            }
            let schema = builder.primary_key([format!("c{width:02}")]).build()?;
            let by_name = name_order(&schema);
            for nulls in [0, 1, 3] {
                let values: Vec<SqlValue> = (0..width)
                    .map(|i| match i % 4 < nulls {
                        true if i > 0 => SqlValue::Null,
                        _ => SqlValue::Int(i as i64),
                    })
                    .collect();
                assert_eq!(
                    row_fingerprint(&schema, &by_name, &values),
                    plain_fingerprint(&schema, &values),
                    "{width} columns, {nulls} nulls in 4"
                );
            }
        }
        Ok(())
    }

    #[test]
    fn a_row_fingerprint_is_that_of_its_non_null_values_by_column_name() -> Result<()> {
        let schema = TableSchema::builder()
            .column("zeta", ColumnType::Text)
            .column("alpha", ColumnType::BigInt)
            .nullable_column("mid", ColumnType::Double)
            .column("beta", ColumnType::Text)
            .primary_key(["alpha"])
            .build()?;
        let by_name = name_order(&schema);
        for mid in [SqlValue::Null, SqlValue::Float(2.5)] {
            let values = vec![
                SqlValue::Text("z".into()),
                SqlValue::Int(7),
                mid.clone(),
                SqlValue::Text("b".into()),
            ];
            assert_eq!(
                row_fingerprint(&schema, &by_name, &values),
                plain_fingerprint(&schema, &values)
            );
        }
        Ok(())
    }

    #[test]
    fn sqlite_row_fingerprints_do_not_change_between_releases() -> Result<()> {
        // Ledgers keep these digests: a change would rewrite every row once.
        let schema = TableSchema::builder()
            .column("id", ColumnType::BigInt)
            .nullable_column("doc", ColumnType::Json)
            .column("tags", ColumnType::Array(Box::new(ColumnType::Text)))
            .column("at", ColumnType::Timestamp)
            .column("ok", ColumnType::Boolean)
            .nullable_column("none", ColumnType::Text)
            .primary_key(["id"])
            .build()?;
        let at = pinned_time()?;
        let values = vec![
            SqlValue::Int(42),
            SqlValue::Json(serde_json::json!({"a": [1, 2.5, "x"]})),
            SqlValue::Array(vec![
                SqlValue::Text("t1".into()),
                SqlValue::Text("t2".into()),
            ]),
            SqlValue::Timestamp(at),
            SqlValue::Bool(true),
            SqlValue::Null,
        ];
        let fp = row_fingerprint(&schema, &name_order(&schema), &values);
        assert_eq!(fp.to_string(), "69ed1ae6d4854126c15b88ee782b64db");
        Ok(())
    }

    fn fingerprint_schema(extra: Option<&str>) -> Result<TableSchema> {
        let mut b = TableSchema::builder()
            .column("id", ColumnType::BigInt)
            .column("small", ColumnType::Integer)
            .column("doc", ColumnType::Json)
            .column("tags", ColumnType::Array(Box::new(ColumnType::Text)))
            .column("at", ColumnType::Timestamp)
            .column("ok", ColumnType::Boolean)
            .column("score", ColumnType::Double)
            .column("body", ColumnType::Text)
            .column("raw", ColumnType::Bytes)
            .column("uid", ColumnType::Uuid)
            .nullable_column("none", ColumnType::Text);
        if let Some(name) = extra {
            b = b.nullable_column(name, ColumnType::Text);
        }
        b.primary_key(["id"]).build()
    }

    fn fingerprint_values() -> Result<Vec<SqlValue>> {
        let at = pinned_time()?;
        Ok(vec![
            SqlValue::Int(42),
            SqlValue::Int(-70_000),
            SqlValue::Json(serde_json::json!({"a": [1, 2.5, "x"]})),
            SqlValue::Array(vec![
                SqlValue::Text("t1".into()),
                SqlValue::Text("t2".into()),
            ]),
            SqlValue::Timestamp(at),
            SqlValue::Bool(true),
            SqlValue::Float(0.25),
            SqlValue::Text("text".into()),
            SqlValue::Bytes(vec![1, 2]),
            SqlValue::Uuid(uuid::Uuid::from_u128(9)),
            SqlValue::Null,
        ])
    }

    #[test]
    fn postgres_row_fingerprints_do_not_change_between_releases() -> Result<()> {
        // Ledgers keep these digests: a change would rewrite every row once.
        let schema = fingerprint_schema(None)?;
        let fp = row_fingerprint(&schema, &name_order(&schema), &fingerprint_values()?);
        assert_eq!(fp.to_string(), "fee381672ed50a3cd0418e1b047f040b");
        Ok(())
    }

    #[test]
    fn a_new_nullable_column_leaves_the_fingerprints_of_unchanged_rows_alone() -> Result<()> {
        let before = fingerprint_schema(None)?;
        let after = fingerprint_schema(Some("added"))?;
        let values = fingerprint_values()?;
        let mut widened = values.clone();
        widened.push(SqlValue::Null);
        assert_eq!(
            row_fingerprint(&before, &name_order(&before), &values),
            row_fingerprint(&after, &name_order(&after), &widened)
        );
        widened.pop();
        widened.push(SqlValue::Text("set".into()));
        assert_ne!(
            row_fingerprint(&before, &name_order(&before), &values),
            row_fingerprint(&after, &name_order(&after), &widened)
        );
        Ok(())
    }
}
