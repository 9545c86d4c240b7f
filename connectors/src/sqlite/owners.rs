//! The registry of table owners for SQLite (see `crate::sql::owners` for
//! what it is for): the table `table_owner` of a database of its own,
//! the file beside the database's named with the suffix [`FILE_SUFFIX`]
//! (`weir.db-weir` for `weir.db`), attached as schema `weir` to the
//! connection that changes tables. It is never among the user's tables,
//! and an action's registration commits with its DDL. (With the main
//! database in WAL mode, SQLite commits each attached database atomically
//! on its own: a crash between the two leaves a registration without its
//! table, which guards nothing, or a table without one, registered again
//! by the next action on it.) Names are registered in lower case, as
//! SQLite compares them. An in-memory database has no registry: no second
//! app can reach it.

use std::path::Path;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{Connection, SqliteConnection, SqlitePool};
use weir_actors::{Owner, Result};

use crate::sql::owners::{judge, refused, Claim, Verdict};

/// The suffix of the registry's file after the database file's path.
pub const FILE_SUFFIX: &str = "-weir";

/// The registry's table, in its attached schema.
const TABLE: &str = "weir.table_owner";

/// The database's file, or `None` for one in memory.
async fn main_file(conn: &mut SqliteConnection) -> Result<Option<String>> {
    let file: Option<String> =
        sqlx::query_scalar("SELECT file FROM pragma_database_list WHERE name = 'main'")
            .fetch_optional(&mut *conn)
            .await?;
    Ok(file.filter(|f| !f.is_empty()))
}

/// Attaches the registry to `conn`, outside any transaction, creating it
/// if missing. Returns whether there is one (none in memory).
pub(crate) async fn attach(conn: &mut SqliteConnection) -> Result<bool> {
    let attached: Option<i64> =
        sqlx::query_scalar("SELECT 1 FROM pragma_database_list WHERE name = 'weir'")
            .fetch_optional(&mut *conn)
            .await?;
    if attached.is_some() {
        return Ok(true);
    }
    let Some(main) = main_file(conn).await? else {
        return Ok(false);
    };
    sqlx::query("ATTACH DATABASE ?1 AS weir")
        .bind(format!("{main}{FILE_SUFFIX}"))
        .execute(&mut *conn)
        .await?;
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {TABLE} (
            table_name TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            description TEXT NOT NULL,
            registered_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)"
    ))
    .execute(&mut *conn)
    .await?;
    Ok(true)
}

/// The owner registered for `table` in the database of `pool`, if any: a
/// registration of a table that no longer exists is none. Reading it
/// creates nothing.
///
/// # Errors
/// When the database or its registry cannot be read.
pub async fn table_owner(pool: &SqlitePool, table: &str) -> Result<Option<Owner>> {
    let mut conn = pool.acquire().await?;
    if !table_exists(&mut conn, table).await? {
        return Ok(None);
    }
    let Some(main) = main_file(&mut conn).await? else {
        return Ok(None);
    };
    drop(conn);
    let file = format!("{main}{FILE_SUFFIX}");
    if !Path::new(&file).is_file() {
        return Ok(None);
    }
    let options = SqliteConnectOptions::new().filename(&file).read_only(true);
    let mut registry = SqliteConnection::connect_with(&options).await?;
    let row: Option<(String, String)> =
        sqlx::query_as("SELECT owner, description FROM table_owner WHERE table_name = ?1")
            .bind(table.to_lowercase())
            .fetch_optional(&mut registry)
            .await?;
    registry.close().await?;
    Ok(row.map(|(key, description)| Owner::from_parts(key, description)))
}

/// Whether the table `table` exists (names compared as SQLite does).
async fn table_exists(conn: &mut SqliteConnection, table: &str) -> Result<bool> {
    let found: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = ?1 COLLATE NOCASE",
    )
    .bind(table)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(found.is_some())
}

/// Settles the registration of `table` for an action of `claim`, in the
/// action's (immediate, so write-locked) transaction on a connection the
/// registry is attached to ([`attach`]). With `dropping`, the table's
/// registration goes with it.
///
/// # Errors
/// When another owner holds the table (and the claim does not adopt it).
pub(crate) async fn settle(
    tx: &mut SqliteConnection,
    database: &str,
    table: &str,
    claim: &Claim,
    dropping: bool,
) -> Result<()> {
    let name = table.to_lowercase();
    let found: Option<(String, String)> = sqlx::query_as(&format!(
        "SELECT owner, description FROM {TABLE} WHERE table_name = ?1"
    ))
    .bind(&name)
    .fetch_optional(&mut *tx)
    .await?;
    let found = found.map(|(key, description)| Owner::from_parts(key, description));
    let exists = table_exists(tx, table).await?;
    if dropping {
        if let Some(found) = found.filter(|f| f.key() != claim.owner.key() && exists) {
            return Err(refused(database, table, &found, &claim.owner));
        }
        sqlx::query(&format!("DELETE FROM {TABLE} WHERE table_name = ?1"))
            .bind(&name)
            .execute(&mut *tx)
            .await?;
        return Ok(());
    }
    match judge(database, table, claim, found, exists)? {
        Verdict::Ours => Ok(()),
        Verdict::Register | Verdict::Adopt(_) => {
            sqlx::query(&format!(
                "INSERT INTO {TABLE} (table_name, owner, description) VALUES (?1, ?2, ?3)
                 ON CONFLICT (table_name) DO UPDATE
                 SET owner = excluded.owner, description = excluded.description,
                     registered_at = CURRENT_TIMESTAMP"
            ))
            .bind(&name)
            .bind(claim.owner.key())
            .bind(claim.owner.description())
            .execute(&mut *tx)
            .await?;
            Ok(())
        }
    }
}
