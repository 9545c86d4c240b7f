//! The PostgreSQL dialect of the shared table target (`crate::sql::table`),
//! and what its sinks prepare for each table (its trait implementation is
//! in `dialect`).

use std::sync::OnceLock;

use crate::sql::table::dialect::{Database, Table};

/// The PostgreSQL dialect.
pub(crate) struct Postgres;

/// A PostgreSQL database of an app, and a table declared in it.
pub(crate) type PgDatabase = Database<Postgres>;
pub(crate) type PgTable = Table<Postgres>;

/// What the row sink prepares once for each declared table.
#[derive(Debug)]
pub(crate) struct Statements {
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
    pub key_is_unique: OnceLock<bool>,
}

/// How many row-sink calls of one database may run at once, each its own
/// transaction on its own pooled connection, while the server works on
/// another batch. The engine never runs two calls that carry the same
/// key. A database with dependent tables ([`TableTarget::depends_on`])
/// gets one call at a time, so a parent's rows are committed before a
/// later call writes their children.
///
/// [`TableTarget::depends_on`]: super::TableTarget::depends_on
pub const ROW_SINK_CONCURRENT_CALLS: usize = 2;
