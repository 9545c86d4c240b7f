//! PostgreSQL as a [`Dialect`]: its names, statements and sinks.

use std::sync::{Arc, OnceLock};

use sqlx::PgPool;
use weir_actors::statediff::ManagedBy;
use weir_actors::{Result, TargetAction};

use super::db::{PgDatabase, Postgres, Statements, ROW_SINK_CONCURRENT_CALLS};
use super::{ddl, sink, types};
use crate::sql::table::actions::{RowWrite, TableAction};
use crate::sql::table::dialect::Dialect;
use crate::sql::TableSchema;

impl Dialect for Postgres {
    type Pool = PgPool;
    type Statements = Statements;
    type PerDatabase = ();

    const NAME: &'static str = "postgres";
    const ROW_SINK_CONCURRENT_CALLS: usize = ROW_SINK_CONCURRENT_CALLS;
    const CHECKS_FENCE: bool = true;

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

    async fn table_exists(db: &PgDatabase, table: &str) -> Result<bool> {
        sink::table_exists(db, table).await
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_provider_keeps_the_name_that_ledgers_store() {
        // Ledgers hold this name in the path of every table and row they
        // track: another name needs a migration of the ledger.
        assert_eq!(
            Postgres::tables_provider_name("db"),
            "weir.postgres.table/db"
        );
        assert_eq!(Postgres::key_name("Docs"), "Docs");
    }
}
