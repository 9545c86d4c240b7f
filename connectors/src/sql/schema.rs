//! Table schemas and how they change.

use serde::{Deserialize, Serialize};
use weir_actors::{Error, Result, TargetChildInvalidation};

use super::ident::validate_identifier;

/// The type of a column, mapped to each database's own types.
///
/// | type | PostgreSQL | SQLite |
/// | --- | --- | --- |
/// | `Text` | `text` | `TEXT` |
/// | `SmallInt`, `Integer`, `BigInt` | `smallint`, `integer`, `bigint` | `INTEGER` |
/// | `Real`, `Double` | `real`, `double precision` | `REAL` |
/// | `Boolean` | `boolean` | `INTEGER` (0/1) |
/// | `Bytes` | `bytea` | `BLOB` |
/// | `Json` | `jsonb` | `TEXT` (JSON) |
/// | `Timestamp` | `timestamptz` | `TEXT` (RFC 3339, UTC) |
/// | `Uuid` | `uuid` | `TEXT` |
/// | `Array(t)` | `t[]` | `TEXT` (JSON array) |
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ColumnType {
    /// UTF-8 text without NUL bytes.
    Text,
    /// A 16-bit integer.
    SmallInt,
    /// A 32-bit integer.
    Integer,
    /// A 64-bit integer.
    BigInt,
    /// A 32-bit float (finite).
    Real,
    /// A 64-bit float (finite).
    Double,
    /// A boolean.
    Boolean,
    /// Raw bytes.
    Bytes,
    /// Any serde value, stored as JSON.
    Json,
    /// A point in time (an RFC 3339 string or seconds since the epoch).
    Timestamp,
    /// A UUID (its string form or 16 bytes).
    Uuid,
    /// An array of another type.
    Array(Box<ColumnType>),
}

/// One column of a table.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Column {
    /// The column's name (a validated identifier).
    pub name: String,
    /// Its type.
    pub ty: ColumnType,
    /// Whether it may hold NULL (primary key columns may not).
    pub nullable: bool,
}

/// The schema of a table: its columns and its (possibly composite) primary key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TableSchema {
    columns: Vec<Column>,
    primary_key: Vec<String>,
}

/// Builds a [`TableSchema`]; validated by [`TableSchemaBuilder::build`].
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct TableSchemaBuilder {
    columns: Vec<Column>,
    primary_key: Vec<String>,
}

impl TableSchemaBuilder {
    /// A column that may not be NULL.
    pub fn column(mut self, name: &str, ty: ColumnType) -> Self {
        self.columns.push(Column {
            name: name.to_string(),
            ty,
            nullable: false,
        });
        self
    }

    /// A column that may be NULL (a missing or `None` field stores NULL).
    pub fn nullable_column(mut self, name: &str, ty: ColumnType) -> Self {
        self.columns.push(Column {
            name: name.to_string(),
            ty,
            nullable: true,
        });
        self
    }

    /// The primary key: one or more of the columns, in order.
    pub fn primary_key<I, S>(mut self, columns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.primary_key = columns
            .into_iter()
            .map(|c| c.as_ref().to_string())
            .collect();
        self
    }

    /// Changes the type of a column already listed (for instance one
    /// derived by [`TableSchema::from_sample`]), keeping its nullability;
    /// adds it as NOT NULL when it is not listed.
    pub fn column_type(mut self, name: &str, ty: ColumnType) -> Self {
        match self.columns.iter_mut().find(|c| c.name == name) {
            Some(column) => column.ty = ty,
            None => return self.column(name, ty),
        }
        self
    }

    /// Validates the schema.
    ///
    /// # Errors
    /// When a name is not a valid identifier, a column is listed twice, the
    /// primary key is empty, names an unknown column, or a nullable one.
    pub fn build(self) -> Result<TableSchema> {
        if self.columns.is_empty() {
            return Err(Error::permanent("a table schema needs at least one column"));
        }
        let mut seen = std::collections::HashSet::new();
        for c in &self.columns {
            validate_identifier("column", &c.name)?;
            if !seen.insert(c.name.to_ascii_lowercase()) {
                return Err(Error::permanent(format!(
                    "column {:?} is listed twice",
                    c.name
                )));
            }
        }
        if self.primary_key.is_empty() {
            return Err(Error::permanent("a table schema needs a primary key"));
        }
        for k in &self.primary_key {
            match self.columns.iter().find(|c| &c.name == k) {
                None => {
                    return Err(Error::permanent(format!(
                        "primary key column {k:?} is not a column of the table"
                    )))
                }
                Some(c) if c.nullable => {
                    return Err(Error::permanent(format!(
                        "primary key column {k:?} must not be nullable"
                    )))
                }
                Some(_) => {}
            }
        }
        Ok(TableSchema {
            columns: self.columns,
            primary_key: self.primary_key,
        })
    }
}

/// Column types derived from a sample row.
mod derive {
    use serde::Serialize;
    use serde_reflection::{ContainerFormat, Format, Registry, Samples, Tracer, TracerConfig};
    use weir_actors::{Error, Result};

    use super::{Column, ColumnType};

    pub(super) fn columns_of<R: Serialize>(sample: &R) -> Result<Vec<Column>> {
        let mut tracer = Tracer::new(TracerConfig::default().is_human_readable(true));
        let mut samples = Samples::new();
        let (format, _) = tracer.trace_value(&mut samples, sample).map_err(|e| {
            Error::permanent(format!("cannot derive a table schema from the sample: {e}"))
        })?;
        let registry = tracer.registry_unchecked();
        let fields = match resolve(&format) {
            Format::TypeName(name) => match registry.get(&name) {
                Some(ContainerFormat::Struct(fields)) => fields.clone(),
                _ => return Err(not_a_struct(&name)),
            },
            _ => return Err(not_a_struct("the sample")),
        };
        fields
            .into_iter()
            .map(|field| {
                let (ty, nullable) = match resolve(&field.value) {
                    Format::Option(inner) => (column_type(&field.name, &inner, &registry)?, true),
                    other => (column_type(&field.name, &other, &registry)?, false),
                };
                Ok(Column {
                    name: field.name,
                    ty,
                    nullable,
                })
            })
            .collect()
    }

    fn not_a_struct(what: &str) -> Error {
        Error::permanent(format!(
            "cannot derive a table schema: {what} is not a struct with named fields"
        ))
    }

    /// The format behind a traced variable (unknown when never seen).
    fn resolve(format: &Format) -> Format {
        match format {
            Format::Variable(v) => v.borrow().as_ref().map_or(Format::Unit, resolve),
            other => other.clone(),
        }
    }

    fn column_type(field: &str, format: &Format, registry: &Registry) -> Result<ColumnType> {
        let unknown = || {
            Error::permanent(format!(
                "cannot derive the type of column `{field}` from the sample: its value says nothing of its type (a None, or an empty list); give it a value in the sample, or set the type with column_type"
            ))
        };
        Ok(match resolve(format) {
            Format::Bool => ColumnType::Boolean,
            Format::I8 | Format::I16 | Format::U8 => ColumnType::SmallInt,
            Format::I32 | Format::U16 => ColumnType::Integer,
            Format::I64 | Format::I128 | Format::U32 | Format::U64 | Format::U128 => {
                ColumnType::BigInt
            }
            Format::F32 => ColumnType::Real,
            Format::F64 => ColumnType::Double,
            Format::Char | Format::Str => ColumnType::Text,
            Format::Bytes => ColumnType::Bytes,
            Format::Seq(inner) => match resolve(&inner) {
                Format::Unit => return Err(unknown()),
                inner => match column_type(field, &inner, registry)? {
                    ColumnType::Json | ColumnType::Array(_) => ColumnType::Json,
                    scalar => ColumnType::Array(Box::new(scalar)),
                },
            },
            Format::TypeName(name) => match registry.get(&name) {
                Some(ContainerFormat::NewTypeStruct(inner)) => column_type(field, inner, registry)?,
                _ => ColumnType::Json,
            },
            Format::Option(_)
            | Format::Map { .. }
            | Format::Tuple(_)
            | Format::TupleArray { .. } => ColumnType::Json,
            Format::Unit | Format::Variable(_) => return Err(unknown()),
        })
    }
}

/// How a table must change to go from one schema to another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchemaChange {
    /// Nothing to change.
    Same,
    /// Only nullable columns added: altered in place, rows keep their data.
    AddNullable(Vec<Column>),
    /// Columns dropped, retyped, or added as NOT NULL: altered in place, but
    /// rows may have lost data, so every row is written again (`Lossy`).
    Alter {
        /// Columns to add.
        add: Vec<Column>,
        /// Columns to drop.
        drop: Vec<String>,
        /// Columns whose type or nullability changed (dropped and added again).
        retype: Vec<Column>,
    },
    /// The primary key changed: the table is dropped and created again
    /// (`Destructive`: every row is created again).
    Rebuild,
}

impl SchemaChange {
    /// How the change affects the table's rows.
    pub fn child_invalidation(&self) -> Option<TargetChildInvalidation> {
        match self {
            SchemaChange::Same | SchemaChange::AddNullable(_) => None,
            SchemaChange::Alter { .. } => Some(TargetChildInvalidation::Lossy),
            SchemaChange::Rebuild => Some(TargetChildInvalidation::Destructive),
        }
    }
}

impl TableSchema {
    /// A builder with one column per field of `sample`, a row of the type
    /// you will declare: its field names, and its types as serde sees them.
    /// Add the primary key (and override types with
    /// [`TableSchemaBuilder::column_type`]) before building.
    ///
    /// | field type | column |
    /// | --- | --- |
    /// | `bool` | `Boolean` |
    /// | `i8`, `i16`, `u8` | `SmallInt` |
    /// | `i32`, `u16` | `Integer` |
    /// | `i64`, `u32`, `u64`, `i128`, `u128` | `BigInt` (values must fit an `i64`) |
    /// | `f32` / `f64` | `Real` / `Double` |
    /// | `String`, `char`, and types serialized as strings (UUIDs, `chrono` times) | `Text` (override with `Uuid` or `Timestamp`) |
    /// | `serde_bytes` bytes | `Bytes` |
    /// | `Vec<T>` of one of the above | `Array(T)` |
    /// | maps, nested structs, enums, tuples | `Json` |
    /// | `Option<T>` | `T`, nullable |
    ///
    /// ```
    /// # use weir_connectors::sql::{ColumnType, TableSchema};
    /// #[derive(serde::Serialize)]
    /// struct Doc { id: i64, title: String, tags: Vec<String>, score: Option<f64> }
    ///
    /// let sample = Doc { id: 1, title: "t".into(), tags: vec!["a".into()], score: Some(0.5) };
    /// let schema = TableSchema::from_sample(&sample)?.primary_key(["id"]).build()?;
    /// assert_eq!(schema.column("tags").map(|c| &c.ty), Some(&ColumnType::Array(Box::new(ColumnType::Text))));
    /// assert!(schema.column("score").is_some_and(|c| c.nullable));
    /// # Ok::<(), weir_actors::Error>(())
    /// ```
    ///
    /// # Errors
    /// When `sample` is not a struct with named fields, or a field's type
    /// cannot be seen from the sample: a `None` (give the sample a `Some`)
    /// or an empty `Vec` of structs.
    pub fn from_sample<R: Serialize>(sample: &R) -> Result<TableSchemaBuilder> {
        derive::columns_of(sample).map(|columns| TableSchemaBuilder {
            columns,
            primary_key: Vec::new(),
        })
    }

    /// A builder.
    pub fn builder() -> TableSchemaBuilder {
        TableSchemaBuilder::default()
    }

    /// The columns, in order.
    pub fn columns(&self) -> &[Column] {
        &self.columns
    }

    /// The primary key columns, in order.
    pub fn primary_key(&self) -> &[String] {
        &self.primary_key
    }

    /// A column by name.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// Whether `name` is part of the primary key.
    pub fn is_key(&self, name: &str) -> bool {
        self.primary_key.iter().any(|k| k == name)
    }

    /// What must change to go from `self` (what exists) to `new`.
    pub fn diff(&self, new: &TableSchema) -> SchemaChange {
        if self == new {
            return SchemaChange::Same;
        }
        let key_types = |s: &TableSchema| -> Vec<(String, ColumnType)> {
            s.primary_key
                .iter()
                .map(|k| {
                    (
                        k.clone(),
                        s.column(k)
                            .map(|c| c.ty.clone())
                            .unwrap_or(ColumnType::Text),
                    )
                })
                .collect()
        };
        if key_types(self) != key_types(new) {
            return SchemaChange::Rebuild;
        }
        let mut add = Vec::new();
        let mut retype = Vec::new();
        for c in &new.columns {
            match self.column(&c.name) {
                None => add.push(c.clone()),
                Some(old) if old != c => retype.push(c.clone()),
                Some(_) => {}
            }
        }
        let drop: Vec<String> = self
            .columns
            .iter()
            .filter(|c| new.column(&c.name).is_none())
            .map(|c| c.name.clone())
            .collect();
        if drop.is_empty() && retype.is_empty() && add.iter().all(|c| c.nullable) {
            if add.is_empty() {
                // Only the column order changed: nothing to do in place.
                return SchemaChange::Same;
            }
            return SchemaChange::AddNullable(add);
        }
        SchemaChange::Alter { add, drop, retype }
    }
}

/// The `ON CONFLICT` action of an upsert into a table with `schema`:
/// `DO UPDATE SET col = <excluded>.col` for every column outside the primary
/// key, or `DO NOTHING` when every column is in the key. `excluded` is the
/// pseudo-table's name as the dialect's SQL spells it (`EXCLUDED`).
pub fn on_conflict_update(schema: &TableSchema, excluded: &str) -> String {
    let updates: Vec<String> = schema
        .columns()
        .iter()
        .filter(|c| !schema.is_key(&c.name))
        .map(|c| {
            let q = super::ident::quote_identifier(&c.name);
            format!("{q} = {excluded}.{q}")
        })
        .collect();
    if updates.is_empty() {
        "DO NOTHING".to_string()
    } else {
        format!("DO UPDATE SET {}", updates.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Sample {
        id: i64,
        small: i16,
        count: u32,
        ok: bool,
        ratio: f32,
        score: Option<f64>,
        name: String,
        #[serde(with = "serde_bytes")]
        blob: Vec<u8>,
        tags: Vec<String>,
        meta: std::collections::BTreeMap<String, i64>,
        when: chrono::DateTime<chrono::Utc>,
        nested: Inner,
    }

    #[derive(Serialize)]
    struct Inner {
        a: i32,
    }

    fn sample() -> Sample {
        Sample {
            id: 1,
            small: 2,
            count: 3,
            ok: true,
            ratio: 0.5,
            score: Some(1.5),
            name: "n".into(),
            blob: vec![1, 2],
            tags: vec!["t".into()],
            meta: [("k".to_string(), 1)].into_iter().collect(),
            when: chrono::DateTime::UNIX_EPOCH,
            nested: Inner { a: 1 },
        }
    }

    #[test]
    fn a_schema_derived_from_a_sample_maps_each_field_type_to_a_column() -> Result<()> {
        let schema = TableSchema::from_sample(&sample())?
            .column_type("when", ColumnType::Timestamp)
            .primary_key(["id"])
            .build()?;
        let types: Vec<(&str, &ColumnType, bool)> = schema
            .columns()
            .iter()
            .map(|c| (c.name.as_str(), &c.ty, c.nullable))
            .collect();
        assert_eq!(
            types,
            vec![
                ("id", &ColumnType::BigInt, false),
                ("small", &ColumnType::SmallInt, false),
                ("count", &ColumnType::BigInt, false),
                ("ok", &ColumnType::Boolean, false),
                ("ratio", &ColumnType::Real, false),
                ("score", &ColumnType::Double, true),
                ("name", &ColumnType::Text, false),
                ("blob", &ColumnType::Bytes, false),
                (
                    "tags",
                    &ColumnType::Array(Box::new(ColumnType::Text)),
                    false
                ),
                ("meta", &ColumnType::Json, false),
                ("when", &ColumnType::Timestamp, false),
                ("nested", &ColumnType::Json, false),
            ]
        );
        assert_eq!(schema.primary_key(), ["id".to_string()]);
        Ok(())
    }

    #[test]
    fn a_sample_whose_field_is_none_is_refused_naming_the_field() {
        #[derive(Serialize)]
        struct Row {
            id: i64,
            maybe: Option<i64>,
        }
        let err = TableSchema::from_sample(&Row { id: 1, maybe: None })
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(matches!(&err, Err(m) if m.contains("`maybe`")), "{err:?}");
    }

    #[test]
    fn a_sample_that_is_not_a_struct_is_refused() {
        assert!(TableSchema::from_sample(&5_i64).is_err());
        assert!(TableSchema::from_sample(&vec![1, 2]).is_err());
    }

    fn base() -> Result<TableSchema> {
        TableSchema::builder()
            .column("id", ColumnType::Text)
            .nullable_column("body", ColumnType::Text)
            .primary_key(["id"])
            .build()
    }

    #[test]
    fn bad_schemas_are_rejected_with_a_reason() {
        let no_key = TableSchema::builder()
            .column("id", ColumnType::Text)
            .build();
        assert!(no_key.is_err());
        let unknown = TableSchema::builder()
            .column("id", ColumnType::Text)
            .primary_key(["nope"])
            .build();
        assert!(unknown
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
            .contains("nope"));
        let injected = TableSchema::builder()
            .column("id; DROP TABLE x", ColumnType::Text)
            .primary_key(["id; DROP TABLE x"])
            .build();
        assert!(injected.is_err());
        let nullable_key = TableSchema::builder()
            .nullable_column("id", ColumnType::Text)
            .primary_key(["id"])
            .build();
        assert!(nullable_key.is_err());
    }

    #[test]
    fn schema_changes_are_classified_by_their_effect_on_rows() -> Result<()> {
        let old = base()?;
        assert_eq!(old.diff(&old), SchemaChange::Same);
        let added = TableSchema::builder()
            .column("id", ColumnType::Text)
            .nullable_column("body", ColumnType::Text)
            .nullable_column("extra", ColumnType::BigInt)
            .primary_key(["id"])
            .build()?;
        assert!(matches!(old.diff(&added), SchemaChange::AddNullable(_)));
        assert_eq!(old.diff(&added).child_invalidation(), None);
        let dropped = TableSchema::builder()
            .column("id", ColumnType::Text)
            .primary_key(["id"])
            .build()?;
        assert_eq!(
            old.diff(&dropped).child_invalidation(),
            Some(TargetChildInvalidation::Lossy)
        );
        let retyped = TableSchema::builder()
            .column("id", ColumnType::Text)
            .nullable_column("body", ColumnType::Json)
            .primary_key(["id"])
            .build()?;
        assert_eq!(
            old.diff(&retyped).child_invalidation(),
            Some(TargetChildInvalidation::Lossy)
        );
        let rekeyed = TableSchema::builder()
            .column("id", ColumnType::BigInt)
            .nullable_column("body", ColumnType::Text)
            .primary_key(["id"])
            .build()?;
        assert_eq!(old.diff(&rekeyed), SchemaChange::Rebuild);
        assert_eq!(
            old.diff(&rekeyed).child_invalidation(),
            Some(TargetChildInvalidation::Destructive)
        );
        Ok(())
    }
}
