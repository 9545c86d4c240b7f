//! What the source reads, as the catalog describes it: the table, its
//! columns, its key and its ordinal column, each checked to exist.

use sqlx::postgres::types::Oid;
use sqlx::PgPool;
use weir_actors::{Error, Result};

use super::TableSourceOptions;
use crate::sql::quote_identifier;

/// The type OIDs of `int8`, `int2` and `int4`.
const INTEGER_TYPES: [u32; 3] = [20, 21, 23];
/// The type OID of `uuid`.
const UUID_TYPE: u32 = 2950;

/// How the text of a key column becomes a part of a stable key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum KeyKind {
    /// `smallint`, `integer`, `bigint`: [`StableKey::Int`](weir_actors::StableKey::Int).
    Int,
    /// `uuid`: [`StableKey::Uuid`](weir_actors::StableKey::Uuid).
    Uuid,
    /// Anything else, as its PostgreSQL text:
    /// [`StableKey::Str`](weir_actors::StableKey::Str).
    Text,
}

/// A column of the table.
#[derive(Clone, Debug)]
pub(super) struct Column {
    /// Its name, as the catalog spells it.
    pub name: String,
    /// Its type as `format_type` writes it (quoted by PostgreSQL where
    /// needed), without modifiers: what a key's text is cast back to.
    pub ty: String,
    /// What kind of stable key part it makes.
    pub kind: KeyKind,
}

/// The table a source reads, checked against the catalog.
#[derive(Clone, Debug)]
pub(super) struct Table {
    /// Its schema.
    pub schema: String,
    /// Its name.
    pub name: String,
    /// Whether it is a table (plain or partitioned), which triggers can
    /// be created on, rather than a view or a foreign table.
    pub is_table: bool,
    /// Its key columns, in key order.
    pub key: Vec<Column>,
    /// Its ordinal column, in incremental mode.
    pub ordinal: Option<Column>,
}

impl Table {
    /// `schema.table`, unquoted, for messages and names.
    pub fn display(&self) -> String {
        format!("{}.{}", self.schema, self.name)
    }

    /// `"schema"."table"`, for SQL text.
    pub fn quoted(&self) -> String {
        format!(
            "{}.{}",
            quote_identifier(&self.schema),
            quote_identifier(&self.name)
        )
    }
}

/// Reads the table of `options` from the catalog, checking that the
/// schema, the table, its key columns and its ordinal column exist.
pub(super) async fn resolve(pool: &PgPool, options: &TableSourceOptions) -> Result<Table> {
    let schema = match &options.schema {
        Some(schema) => schema.clone(),
        None => current_schema(pool).await?,
    };
    check_schema(pool, &schema).await?;
    let display = format!("{schema}.{}", options.table);
    let (oid, is_table) = relation(pool, &schema, &options.table, &display).await?;
    let columns = columns(pool, oid).await?;
    let key_names = match &options.key {
        Some(names) => names.clone(),
        None => primary_key(pool, oid).await?,
    };
    if key_names.is_empty() {
        return Err(no_key(&display, options.key.is_some()));
    }
    let key = key_names
        .iter()
        .map(|name| find_column(&columns, "key column", name, &display))
        .collect::<Result<Vec<_>>>()?;
    let ordinal = options
        .ordinal
        .as_deref()
        .map(|name| find_column(&columns, "ordinal column", name, &display))
        .transpose()?;
    Ok(Table {
        schema,
        name: options.table.clone(),
        is_table,
        key,
        ordinal,
    })
}

/// The first schema of the connection's `search_path` that exists.
async fn current_schema(pool: &PgPool) -> Result<String> {
    let schema: Option<String> = sqlx::query_scalar("SELECT current_schema()::text")
        .fetch_one(pool)
        .await?;
    schema.ok_or_else(|| {
        Error::permanent(
            "no schema of the connection's search_path exists: name the table's schema with TableSourceOptions::schema",
        )
    })
}

async fn check_schema(pool: &PgPool, schema: &str) -> Result<()> {
    let found: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_namespace WHERE nspname = $1")
        .bind(schema)
        .fetch_optional(pool)
        .await?;
    match found {
        Some(_) => Ok(()),
        None => Err(Error::permanent(format!(
            "PostgreSQL schema `{schema}` does not exist"
        ))),
    }
}

/// The table's OID, and whether it is a table rather than a view.
async fn relation(pool: &PgPool, schema: &str, table: &str, display: &str) -> Result<(Oid, bool)> {
    let found: Option<(Oid, String)> = sqlx::query_as(
        "SELECT c.oid, c.relkind::text FROM pg_class c \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
    )
    .bind(schema)
    .bind(table)
    .fetch_optional(pool)
    .await?;
    match found {
        Some((oid, kind)) => Ok((oid, kind == "r" || kind == "p")),
        None => Err(Error::permanent(format!(
            "PostgreSQL table `{display}` does not exist"
        ))),
    }
}

/// The table's columns, in their order.
async fn columns(pool: &PgPool, oid: Oid) -> Result<Vec<Column>> {
    let rows: Vec<(String, String, Oid)> = sqlx::query_as(
        "SELECT a.attname::text, format_type(a.atttypid, NULL), a.atttypid \
         FROM pg_attribute a \
         WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped \
         ORDER BY a.attnum",
    )
    .bind(oid)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(name, ty, type_oid)| Column {
            name,
            ty,
            kind: kind_of(type_oid),
        })
        .collect())
}

fn kind_of(type_oid: Oid) -> KeyKind {
    if INTEGER_TYPES.contains(&type_oid.0) {
        KeyKind::Int
    } else if type_oid.0 == UUID_TYPE {
        KeyKind::Uuid
    } else {
        KeyKind::Text
    }
}

/// The table's primary key columns, in key order (none without one).
async fn primary_key(pool: &PgPool, oid: Oid) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT a.attname::text FROM pg_index i \
         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
         WHERE i.indrelid = $1 AND i.indisprimary \
         ORDER BY array_position(i.indkey::int2[], a.attnum)",
    )
    .bind(oid)
    .fetch_all(pool)
    .await?)
}

fn no_key(display: &str, given: bool) -> Error {
    if given {
        Error::permanent(format!(
            "the key of PostgreSQL table `{display}` names no column"
        ))
    } else {
        Error::permanent(format!(
            "PostgreSQL table `{display}` has no primary key: name its key columns with TableSourceOptions::key"
        ))
    }
}

/// The column `name`, or an error naming it (`what`: "key column") and
/// listing the table's columns.
fn find_column(columns: &[Column], what: &str, name: &str, display: &str) -> Result<Column> {
    if let Some(c) = columns.iter().find(|c| c.name == name) {
        return Ok(c.clone());
    }
    let names: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
    Err(Error::permanent(format!(
        "{what} `{name}` is not a column of `{display}` (its columns: {})",
        names.join(", ")
    )))
}
