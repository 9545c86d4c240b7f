//! Column types in PostgreSQL, and columns of values bound as arrays.
//!
//! Rows are written column-wise: every column of a batch is bound as one
//! PostgreSQL array and the statement reads them back with `UNNEST`, so a
//! statement carries one bind parameter per column whatever its row count.
//!
//! Most types bind as the array of their own type (`bigint[]`, `uuid[]`,
//! ...). Two are bound as `text[]` and cast in the statement:
//!
//! - `Json` columns bind the JSON text of each value, cast with `::jsonb`.
//! - `Array(t)` columns bind each value as a PostgreSQL array literal
//!   (`{"a","b",NULL}`), cast with `::t[]`. Binding a two-dimensional array
//!   would require every row's array to have the same length; a `text[]` of
//!   literals has no such limit and keeps the one-statement-per-chunk shape.
//!   Arrays of arrays are not supported (PostgreSQL arrays must be
//!   rectangular); such schemas are rejected when the table is declared.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::Postgres;
use weir_actors::{Error, Result};

use crate::sql::{ColumnType, SqlValue, TableSchema};

/// The PostgreSQL type of a column.
pub(crate) fn pg_type(ty: &ColumnType) -> Result<String> {
    Ok(match ty {
        ColumnType::Text => "text".into(),
        ColumnType::SmallInt => "smallint".into(),
        ColumnType::Integer => "integer".into(),
        ColumnType::BigInt => "bigint".into(),
        ColumnType::Real => "real".into(),
        ColumnType::Double => "double precision".into(),
        ColumnType::Boolean => "boolean".into(),
        ColumnType::Bytes => "bytea".into(),
        ColumnType::Json => "jsonb".into(),
        ColumnType::Timestamp => "timestamptz".into(),
        ColumnType::Uuid => "uuid".into(),
        ColumnType::Array(inner) => {
            if matches!(**inner, ColumnType::Array(_)) {
                return Err(Error::permanent(
                    "arrays of arrays are not supported by the PostgreSQL target",
                ));
            }
            format!("{}[]", pg_type(inner)?)
        }
    })
}

/// Checks that every column of `schema` has a PostgreSQL type.
pub(crate) fn validate_schema(table: &str, schema: &TableSchema) -> Result<()> {
    for column in schema.columns() {
        pg_type(&column.ty)
            .map_err(|e| Error::permanent(format!("table {table}, column {}: {e}", column.name)))?;
    }
    Ok(())
}

/// The array type a column is bound as (`$n::<this>`).
pub(crate) fn bind_type(ty: &ColumnType) -> &'static str {
    match ty {
        ColumnType::Text | ColumnType::Json | ColumnType::Array(_) => "text[]",
        ColumnType::SmallInt => "smallint[]",
        ColumnType::Integer => "integer[]",
        ColumnType::BigInt => "bigint[]",
        ColumnType::Real => "real[]",
        ColumnType::Double => "double precision[]",
        ColumnType::Boolean => "boolean[]",
        ColumnType::Bytes => "bytea[]",
        ColumnType::Timestamp => "timestamptz[]",
        ColumnType::Uuid => "uuid[]",
    }
}

/// The expression reading the unnested column `alias` as the column's type.
pub(crate) fn select_expr(ty: &ColumnType, alias: &str) -> Result<String> {
    Ok(match ty {
        ColumnType::Json => format!("{alias}::jsonb"),
        ColumnType::Array(_) => format!("{alias}::{}", pg_type(ty)?),
        _ => alias.to_string(),
    })
}

/// One column of a batch of rows, ready to bind as an array.
#[derive(Debug)]
pub(crate) enum ColumnArray {
    /// `text[]` (also JSON text and array literals).
    Text(Vec<Option<String>>),
    /// `smallint[]`.
    I16(Vec<Option<i16>>),
    /// `integer[]`.
    I32(Vec<Option<i32>>),
    /// `bigint[]`.
    I64(Vec<Option<i64>>),
    /// `real[]`.
    F32(Vec<Option<f32>>),
    /// `double precision[]`.
    F64(Vec<Option<f64>>),
    /// `boolean[]`.
    Bool(Vec<Option<bool>>),
    /// `bytea[]`.
    Bytes(Vec<Option<Vec<u8>>>),
    /// `timestamptz[]`.
    Timestamp(Vec<Option<DateTime<Utc>>>),
    /// `uuid[]`.
    Uuid(Vec<Option<uuid::Uuid>>),
}

impl ColumnArray {
    /// An empty column of type `ty`, with room for `capacity` values.
    pub(crate) fn new(ty: &ColumnType, capacity: usize) -> Self {
        match ty {
            ColumnType::Text | ColumnType::Json | ColumnType::Array(_) => {
                ColumnArray::Text(Vec::with_capacity(capacity))
            }
            ColumnType::SmallInt => ColumnArray::I16(Vec::with_capacity(capacity)),
            ColumnType::Integer => ColumnArray::I32(Vec::with_capacity(capacity)),
            ColumnType::BigInt => ColumnArray::I64(Vec::with_capacity(capacity)),
            ColumnType::Real => ColumnArray::F32(Vec::with_capacity(capacity)),
            ColumnType::Double => ColumnArray::F64(Vec::with_capacity(capacity)),
            ColumnType::Boolean => ColumnArray::Bool(Vec::with_capacity(capacity)),
            ColumnType::Bytes => ColumnArray::Bytes(Vec::with_capacity(capacity)),
            ColumnType::Timestamp => ColumnArray::Timestamp(Vec::with_capacity(capacity)),
            ColumnType::Uuid => ColumnArray::Uuid(Vec::with_capacity(capacity)),
        }
    }

    /// Appends `value`, which must fit the column's type.
    ///
    /// # Errors
    /// When the value does not fit (a row converted for another schema).
    pub(crate) fn push(&mut self, value: SqlValue) -> std::result::Result<(), String> {
        let mismatch = |v: &SqlValue, want: &str| Err(format!("expected {want}, got {v:?}"));
        match (self, value) {
            (ColumnArray::Text(c), SqlValue::Null) => c.push(None),
            (ColumnArray::Text(c), SqlValue::Text(s)) => c.push(Some(s)),
            (ColumnArray::Text(c), SqlValue::Json(j)) => c.push(Some(j.to_string())),
            (ColumnArray::Text(c), SqlValue::Array(items)) => c.push(Some(array_literal(&items)?)),
            (ColumnArray::I16(c), SqlValue::Null) => c.push(None),
            (ColumnArray::I16(c), SqlValue::Int(i)) => {
                c.push(Some(i16::try_from(i).map_err(|e| format!("{i}: {e}"))?))
            }
            (ColumnArray::I32(c), SqlValue::Null) => c.push(None),
            (ColumnArray::I32(c), SqlValue::Int(i)) => {
                c.push(Some(i32::try_from(i).map_err(|e| format!("{i}: {e}"))?))
            }
            (ColumnArray::I64(c), SqlValue::Null) => c.push(None),
            (ColumnArray::I64(c), SqlValue::Int(i)) => c.push(Some(i)),
            (ColumnArray::F32(c), SqlValue::Null) => c.push(None),
            // Checked to fit an f32 when the row was converted.
            #[allow(clippy::cast_possible_truncation)]
            (ColumnArray::F32(c), SqlValue::Float(f)) => c.push(Some(f as f32)),
            (ColumnArray::F64(c), SqlValue::Null) => c.push(None),
            (ColumnArray::F64(c), SqlValue::Float(f)) => c.push(Some(f)),
            (ColumnArray::Bool(c), SqlValue::Null) => c.push(None),
            (ColumnArray::Bool(c), SqlValue::Bool(b)) => c.push(Some(b)),
            (ColumnArray::Bytes(c), SqlValue::Null) => c.push(None),
            (ColumnArray::Bytes(c), SqlValue::Bytes(b)) => c.push(Some(b)),
            (ColumnArray::Timestamp(c), SqlValue::Null) => c.push(None),
            (ColumnArray::Timestamp(c), SqlValue::Timestamp(t)) => c.push(Some(t)),
            (ColumnArray::Uuid(c), SqlValue::Null) => c.push(None),
            (ColumnArray::Uuid(c), SqlValue::Uuid(u)) => c.push(Some(u)),
            (ColumnArray::Text(_), v) => return mismatch(&v, "text, JSON or an array"),
            (ColumnArray::I16(_) | ColumnArray::I32(_) | ColumnArray::I64(_), v) => {
                return mismatch(&v, "an integer")
            }
            (ColumnArray::F32(_) | ColumnArray::F64(_), v) => return mismatch(&v, "a float"),
            (ColumnArray::Bool(_), v) => return mismatch(&v, "a boolean"),
            (ColumnArray::Bytes(_), v) => return mismatch(&v, "bytes"),
            (ColumnArray::Timestamp(_), v) => return mismatch(&v, "a timestamp"),
            (ColumnArray::Uuid(_), v) => return mismatch(&v, "a UUID"),
        }
        Ok(())
    }

    /// Binds the column as the next parameter of `query`.
    pub(crate) fn bind<'q>(
        self,
        query: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments> {
        match self {
            ColumnArray::Text(c) => query.bind(c),
            ColumnArray::I16(c) => query.bind(c),
            ColumnArray::I32(c) => query.bind(c),
            ColumnArray::I64(c) => query.bind(c),
            ColumnArray::F32(c) => query.bind(c),
            ColumnArray::F64(c) => query.bind(c),
            ColumnArray::Bool(c) => query.bind(c),
            ColumnArray::Bytes(c) => query.bind(c),
            ColumnArray::Timestamp(c) => query.bind(c),
            ColumnArray::Uuid(c) => query.bind(c),
        }
    }
}

/// The statement copying rows into `table` in COPY's binary format, its
/// columns in schema order; `None` when a column has no binary form here
/// (arrays), so that the table's rows are always upserted.
pub(crate) fn copy_sql(table: &str, schema: &TableSchema) -> Option<String> {
    if schema
        .columns()
        .iter()
        .any(|c| matches!(c.ty, ColumnType::Array(_)))
    {
        return None;
    }
    let columns: Vec<String> = schema
        .columns()
        .iter()
        .map(|c| crate::sql::quote_identifier(&c.name))
        .collect();
    Some(format!(
        "COPY {} ({}) FROM STDIN (FORMAT binary)",
        crate::sql::quote_identifier(table),
        columns.join(", ")
    ))
}

/// `rows` (full rows, in schema order) in COPY's binary format, each value
/// encoded as the upsert's parameters encode it, so that a row lands the
/// same either way.
///
/// # Errors
/// A value that does not fit its column (the upsert then reports it).
pub(crate) fn copy_binary<'a>(
    schema: &TableSchema,
    rows: impl IntoIterator<Item = &'a [SqlValue]>,
) -> std::result::Result<Vec<u8>, String> {
    let rows = rows.into_iter();
    let columns = schema.columns();
    let fields = i16::try_from(columns.len()).map_err(|_| "too many columns".to_string())?;
    // Room for as many rows as there may be (all of them, for a first load).
    let (fewest, most) = rows.size_hint();
    let mut out = Vec::with_capacity(19 + most.unwrap_or(fewest) * 16 * columns.len());
    out.extend_from_slice(b"PGCOPY\n\xff\r\n\0");
    out.extend_from_slice(&0u32.to_be_bytes()); // flags
    out.extend_from_slice(&0u32.to_be_bytes()); // header extension length
    for row in rows {
        if row.len() != columns.len() {
            return Err(format!(
                "{} values for {} columns",
                row.len(),
                columns.len()
            ));
        }
        out.extend_from_slice(&fields.to_be_bytes());
        for (column, value) in columns.iter().zip(row) {
            copy_field(&mut out, &column.ty, value)
                .map_err(|why| format!("column {}: {why}", column.name))?;
        }
    }
    out.extend_from_slice(&(-1i16).to_be_bytes());
    Ok(out)
}

/// Appends one field: its length, then its binary form.
fn copy_field(
    out: &mut Vec<u8>,
    ty: &ColumnType,
    value: &SqlValue,
) -> std::result::Result<(), String> {
    fn field(out: &mut Vec<u8>, bytes: &[u8]) -> std::result::Result<(), String> {
        let len = i32::try_from(bytes.len()).map_err(|_| "a value over 2 GiB".to_string())?;
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(bytes);
        Ok(())
    }
    match (ty, value) {
        (_, SqlValue::Null) => out.extend_from_slice(&(-1i32).to_be_bytes()),
        (ColumnType::SmallInt, SqlValue::Int(i)) => {
            let v = i16::try_from(*i).map_err(|e| format!("{i}: {e}"))?;
            field(out, &v.to_be_bytes())?;
        }
        (ColumnType::Integer, SqlValue::Int(i)) => {
            let v = i32::try_from(*i).map_err(|e| format!("{i}: {e}"))?;
            field(out, &v.to_be_bytes())?;
        }
        (ColumnType::BigInt, SqlValue::Int(i)) => field(out, &i.to_be_bytes())?,
        // Checked to fit an f32 when the row was converted.
        #[allow(clippy::cast_possible_truncation)]
        (ColumnType::Real, SqlValue::Float(f)) => field(out, &(*f as f32).to_be_bytes())?,
        (ColumnType::Double, SqlValue::Float(f)) => field(out, &f.to_be_bytes())?,
        (ColumnType::Boolean, SqlValue::Bool(b)) => field(out, &[u8::from(*b)])?,
        (ColumnType::Text, SqlValue::Text(s)) => field(out, s.as_bytes())?,
        (ColumnType::Bytes, SqlValue::Bytes(b)) => field(out, b)?,
        (ColumnType::Json, SqlValue::Json(j)) => {
            // jsonb's binary form: a version byte, then the text.
            let mut bytes = vec![1u8];
            serde_json::to_writer(&mut bytes, j).map_err(|e| e.to_string())?;
            field(out, &bytes)?;
        }
        (ColumnType::Timestamp, SqlValue::Timestamp(t)) => {
            // Microseconds since 2000-01-01, worked out as sqlx binds them.
            let micros = postgres_epoch()
                .and_then(|epoch| (t.naive_utc() - epoch).num_microseconds())
                .ok_or_else(|| format!("{t} is out of range"))?;
            field(out, &micros.to_be_bytes())?;
        }
        (ColumnType::Uuid, SqlValue::Uuid(u)) => field(out, u.as_bytes())?,
        (ty, v) => return Err(format!("{v:?} cannot be copied as {ty:?}")),
    }
    Ok(())
}

/// PostgreSQL's epoch, 2000-01-01 00:00:00 UTC.
fn postgres_epoch() -> Option<chrono::NaiveDateTime> {
    DateTime::<Utc>::from_timestamp(946_684_800, 0).map(|t| t.naive_utc())
}

/// A PostgreSQL array literal (`{"a","b",NULL}`) of one-dimensional values.
fn array_literal(items: &[SqlValue]) -> std::result::Result<String, String> {
    let mut out = String::from("{");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let text = match item {
            SqlValue::Null => {
                out.push_str("NULL");
                continue;
            }
            SqlValue::Bool(b) => if *b { "t" } else { "f" }.to_string(),
            SqlValue::Int(i) => i.to_string(),
            SqlValue::Float(f) => f.to_string(),
            SqlValue::Text(s) => s.clone(),
            SqlValue::Bytes(b) => {
                let mut hex = String::with_capacity(2 + 2 * b.len());
                hex.push_str("\\x");
                for byte in b {
                    hex.push_str(&format!("{byte:02x}"));
                }
                hex
            }
            SqlValue::Json(j) => j.to_string(),
            SqlValue::Timestamp(t) => t.to_rfc3339(),
            SqlValue::Uuid(u) => u.to_string(),
            SqlValue::Array(_) => return Err("arrays of arrays are not supported".into()),
        };
        out.push('"');
        for c in text.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
    }
    out.push('}');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_with_array_columns_are_never_copied_and_misfits_are_refused() -> Result<()> {
        let with_array = TableSchema::builder()
            .column("id", ColumnType::BigInt)
            .column("tags", ColumnType::Array(Box::new(ColumnType::Text)))
            .primary_key(["id"])
            .build()?;
        assert_eq!(copy_sql("t", &with_array), None);
        let plain = TableSchema::builder()
            .column("id", ColumnType::BigInt)
            .nullable_column("body", ColumnType::Text)
            .primary_key(["id"])
            .build()?;
        assert_eq!(
            copy_sql("t", &plain).as_deref(),
            Some(r#"COPY "t" ("id", "body") FROM STDIN (FORMAT binary)"#)
        );
        let rows = [vec![SqlValue::Int(1), SqlValue::Null]];
        let data = copy_binary(&plain, rows.iter().map(Vec::as_slice)).map_err(Error::msg)?;
        // Header, one tuple (2 fields: 8-byte id, NULL body), trailer.
        let mut expected = b"PGCOPY\n\xff\r\n\0".to_vec();
        expected.extend_from_slice(&[0; 8]);
        expected.extend_from_slice(&2i16.to_be_bytes());
        expected.extend_from_slice(&8i32.to_be_bytes());
        expected.extend_from_slice(&1i64.to_be_bytes());
        expected.extend_from_slice(&(-1i32).to_be_bytes());
        expected.extend_from_slice(&(-1i16).to_be_bytes());
        assert_eq!(data, expected);
        let misfit = [vec![SqlValue::Text("1".into()), SqlValue::Null]];
        let err = copy_binary(&plain, misfit.iter().map(Vec::as_slice));
        assert!(err.is_err_and(|e| e.starts_with("column id:")));
        Ok(())
    }

    #[test]
    fn array_literals_quote_and_escape_every_element() {
        let items = vec![
            SqlValue::Text("a\"b\\c".into()),
            SqlValue::Null,
            SqlValue::Text("NULL".into()),
            SqlValue::Bytes(vec![1, 255]),
        ];
        assert_eq!(
            array_literal(&items),
            Ok(r#"{"a\"b\\c",NULL,"NULL","\\x01ff"}"#.to_string())
        );
        assert_eq!(array_literal(&[]), Ok("{}".to_string()));
    }

    #[test]
    fn nested_arrays_are_rejected() {
        let nested = ColumnType::Array(Box::new(ColumnType::Array(Box::new(ColumnType::Text))));
        assert!(pg_type(&nested).is_err());
        assert_eq!(
            pg_type(&ColumnType::Array(Box::new(ColumnType::Double))).ok(),
            Some("double precision[]".to_string())
        );
    }

    #[test]
    fn values_of_the_wrong_type_are_refused() {
        let mut col = ColumnArray::new(&ColumnType::BigInt, 1);
        assert!(col.push(SqlValue::Text("x".into())).is_err());
        assert!(col.push(SqlValue::Int(1)).is_ok());
        let mut small = ColumnArray::new(&ColumnType::SmallInt, 1);
        assert!(small.push(SqlValue::Int(70_000)).is_err());
    }
}
