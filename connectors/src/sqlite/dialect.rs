//! SQLite as a [`Dialect`]: its names, statements and sinks.

use std::borrow::Cow;
use std::sync::Arc;

use sqlx::SqlitePool;
use weir_actors::statediff::ManagedBy;
use weir_actors::{Error, Result, TargetAction};

use super::db::{SqDatabase, Sqlite};
use super::sink;
use crate::sql::table::actions::{RowWrite, TableAction};
use crate::sql::table::dialect::Dialect;
use crate::sql::TableSchema;

impl Dialect for Sqlite {
    type Pool = SqlitePool;
    /// Statements are built per call, for the number of rows it writes.
    type Statements = ();
    /// The writer lock (see [`ROW_SINK_CONCURRENT_CALLS`](Self::ROW_SINK_CONCURRENT_CALLS)).
    type PerDatabase = tokio::sync::Mutex<()>;

    const NAME: &'static str = "sqlite";
    /// Two calls at once: one prepares its statements (groups and binds
    /// its rows) while the other writes. SQLite writes one transaction at
    /// a time: the calls take turns through the database's writer lock,
    /// in the order they asked for it.
    const ROW_SINK_CONCURRENT_CALLS: usize = 2;
    /// A SQLite database is not shared by the members of a worker group.
    const CHECKS_FENCE: bool = false;

    /// SQLite ignores the case of table names, and so does a table's key:
    /// `Docs` and `docs` are one table, one key.
    fn key_name(table: &str) -> Cow<'_, str> {
        if table.bytes().any(|b| b.is_ascii_uppercase()) {
            Cow::Owned(table.to_ascii_lowercase())
        } else {
            Cow::Borrowed(table)
        }
    }

    fn check_table(table: &str, _schema: &TableSchema) -> Result<()> {
        if table.to_ascii_lowercase().starts_with("sqlite_") {
            return Err(Error::permanent(format!(
                "invalid table name {table:?}: names starting with sqlite_ are reserved"
            )));
        }
        Ok(())
    }

    fn statements(_table: &str, _schema: &TableSchema, _managed_by: ManagedBy) -> Result<()> {
        Ok(())
    }

    async fn table_exists(db: &SqDatabase, table: &str) -> Result<bool> {
        sink::table_exists(db, table).await
    }

    async fn apply_tables(
        db: Arc<SqDatabase>,
        actions: Vec<TargetAction<TableAction>>,
    ) -> Result<()> {
        sink::apply_tables(&db, actions).await
    }

    async fn apply_rows(db: Arc<SqDatabase>, actions: Vec<TargetAction<RowWrite>>) -> Result<()> {
        sink::apply_rows(&db, actions).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_provider_keeps_the_name_that_ledgers_store() {
        // Ledgers hold this name in the path of every table and row they
        // track: another name needs an upgrade of the ledger's format
        // (weir_actors' `ledger::upgrade` renamed the earlier one).
        assert_eq!(Sqlite::tables_provider_name("db"), "weir.sqlite.table/db");
    }

    #[test]
    fn table_names_are_keyed_in_lower_case_and_reserved_ones_refused() -> Result<()> {
        assert_eq!(Sqlite::key_name("Docs"), "docs");
        assert!(matches!(Sqlite::key_name("docs"), Cow::Borrowed("docs")));
        let schema = TableSchema::builder()
            .column("id", crate::sql::ColumnType::Text)
            .primary_key(["id"])
            .build()?;
        let err = Sqlite::check_table("SQLITE_stat1", &schema).err();
        assert!(
            err.is_some_and(|e| e.to_string().contains("reserved")),
            "a reserved name is refused"
        );
        Sqlite::check_table("docs", &schema)
    }
}
