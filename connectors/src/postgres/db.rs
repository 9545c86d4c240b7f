//! PostgreSQL as a dialect of the shared table target
//! (`crate::sql::table`): its names, statements and sinks.

use std::sync::{Arc, OnceLock};

use sqlx::PgPool;
use weir_actors::statediff::ManagedBy;
use weir_actors::{Result, TargetAction};

use super::{ddl, sink, types};
use crate::sql::table::database::{Database, Table};
use crate::sql::table::dialect::Dialect;
use crate::sql::table::handler::TableAction;
use crate::sql::table::rows::RowWrite;
use crate::sql::TableSchema;

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

impl Dialect for Postgres {
    type Pool = PgPool;
    type Statements = Statements;

    const NAME: &'static str = "postgres";
    const ROW_SINK_CONCURRENT_CALLS: usize = ROW_SINK_CONCURRENT_CALLS;
    const CHECKS_FENCE: bool = true;

    fn tables_provider_name(db: &str) -> String {
        format!("weir.postgres.table/{db}")
    }

    fn check_table(table: &str, schema: &TableSchema) -> Result<()> {
        types::validate_schema(table, schema)
    }

    fn statements(table: &str, schema: &TableSchema, managed_by: ManagedBy) -> Result<Statements> {
        Ok(Statements {
            upsert_sql: ddl::upsert_sql(table, schema)?,
            delete_sql: ddl::delete_sql(table, schema)?,
            copy_sql: match managed_by {
                ManagedBy::System => types::copy_sql(table, schema),
                ManagedBy::User => None,
            },
            key_is_unique: OnceLock::new(),
        })
    }

    fn apply_tables(
        db: Arc<PgDatabase>,
        actions: Vec<TargetAction<TableAction>>,
    ) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        sink::apply_tables(db, actions)
    }

    fn apply_rows(
        db: Arc<PgDatabase>,
        actions: Vec<TargetAction<RowWrite>>,
    ) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        sink::apply_rows(db, actions)
    }
}
