//! A table the command creates, in either database.

use serde::Serialize;
use weir::connectors::sql::TableSchema;
use weir::connectors::{postgres, sqlite};
use weir::{Ctx, Result};

use super::target::{Database, POSTGRES, SQLITE};

/// A table target of the database the command writes to.
#[derive(Clone)]
pub enum Table {
    /// A SQLite table.
    Sqlite(sqlite::TableTarget),
    /// A PostgreSQL table.
    Postgres(postgres::TableTarget),
}

impl Table {
    /// Declares the table `name` (created, or altered, at once).
    pub async fn mount(ctx: &Ctx, db: &Database, name: &str, schema: TableSchema) -> Result<Table> {
        Ok(match db {
            Database::Sqlite(_) => Table::Sqlite(
                sqlite::mount_table_target(ctx, &SQLITE.sqlite(), name, schema).await?,
            ),
            Database::Postgres(_) => Table::Postgres(
                postgres::mount_table_target(ctx, &POSTGRES.postgres(), name, schema).await?,
            ),
        })
    }

    /// This table, written after `parent` and deleted from before it.
    pub fn depends_on(self, parent: &Table) -> Table {
        match (self, parent) {
            (Table::Sqlite(t), Table::Sqlite(p)) => Table::Sqlite(t.depends_on(p)),
            (Table::Postgres(t), Table::Postgres(p)) => Table::Postgres(t.depends_on(p)),
            // Tables of two databases never depend on each other.
            (t, _) => t,
        }
    }

    /// Changes when the table is rebuilt: its rows must be declared again.
    pub fn memo_key(&self) -> String {
        match self {
            Table::Sqlite(t) => t.memo_key(),
            Table::Postgres(t) => t.memo_key(),
        }
    }

    /// Declares one row.
    pub fn declare_row<R: Serialize>(&self, ctx: &Ctx, row: R) -> Result<()> {
        match self {
            Table::Sqlite(t) => t.declare_row(ctx, row),
            Table::Postgres(t) => t.declare_row(ctx, row),
        }
    }
}
