//! What the sinks of one database share: its declared tables' metadata,
//! and the actions of its table and row sinks.

use std::collections::HashMap;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use weir_actors::statediff::ManagedBy;
use weir_actors::Result;

use super::ddl;
use super::types;
use crate::sql::{SqlValue, TableSchema};

/// What the row sink does: upsert the row `values` (create, update), or
/// delete the row whose primary key values are `values` (delete).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RowAction {
    /// The table (shared by the table's row actions).
    pub table: Arc<str>,
    pub values: Vec<SqlValue>,
}

/// What the row sink needs to know about a table of its database.
#[derive(Debug)]
pub(crate) struct TableMeta {
    pub name: String,
    pub schema: TableSchema,
    /// Positions of the primary key columns among the columns.
    pub key_positions: Vec<usize>,
    pub upsert_sql: String,
    pub delete_sql: String,
    /// How rows new to weir are written (see `sink::apply_rows`); `None`
    /// when the table's rows are always upserted: it has array columns, or
    /// the user manages it (its rules and triggers may expect the upsert's
    /// `INSERT`; COPY applies no rules). A table without a unique index on
    /// the key is upserted too, found out when rows are first copied.
    pub copy_sql: Option<String>,
    /// Whether the table has a unique index on the key (asked once, when
    /// rows are first copied; see `sink::key_is_unique`).
    pub key_is_unique: std::sync::OnceLock<bool>,
    /// Parents are written before children (rank ascending), deletes in
    /// reverse: see `TableTarget::depends_on`.
    pub rank: AtomicU32,
}

impl TableMeta {
    pub(crate) fn new(name: &str, schema: &TableSchema, managed_by: ManagedBy) -> Result<Self> {
        Ok(Self {
            name: name.to_string(),
            schema: schema.clone(),
            key_positions: schema
                .primary_key()
                .iter()
                .filter_map(|k| schema.columns().iter().position(|c| &c.name == k))
                .collect(),
            upsert_sql: ddl::upsert_sql(name, schema)?,
            delete_sql: ddl::delete_sql(name, schema)?,
            copy_sql: match managed_by {
                ManagedBy::System => types::copy_sql(name, schema),
                ManagedBy::User => None,
            },
            key_is_unique: std::sync::OnceLock::new(),
            rank: AtomicU32::new(0),
        })
    }
}

/// What the sinks of one database share: its pool and its declared tables.
#[derive(Debug)]
pub(crate) struct DbInner {
    pub db_name: String,
    pub pool: PgPool,
    pub tables: Mutex<HashMap<String, Arc<TableMeta>>>,
}

impl DbInner {
    pub(crate) fn table(&self, name: &str) -> Option<Arc<TableMeta>> {
        self.tables
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    pub(crate) fn set_table(&self, meta: Arc<TableMeta>) {
        self.tables
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(meta.name.clone(), meta);
    }
}
