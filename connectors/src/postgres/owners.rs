//! The registry of table owners in PostgreSQL: `weir.table_owner` (see
//! `crate::sql::owners` for what it is for).
//!
//! A registration is keyed by the table's schema-qualified name
//! (`schema.table`): the schema of the table an unqualified name finds
//! from the writing connection, or the schema a `CREATE TABLE` would put
//! it in, so that apps writing tables of one name into different schemas
//! (pools with different `search_path`s) are not taken for owners of one
//! table. Registrations of earlier builds are keyed by the bare name; the
//! first owner that settles a table of that name takes it over under its
//! qualified key.

use sqlx::{PgConnection, PgPool};
use weir_actors::{Owner, Result};

use crate::sql::owners::{judge, refused, Claim, Verdict};

/// The advisory lock key of the registry's creation (`weirown1` in ASCII).
const MIGRATION_LOCK: i64 = 0x7765_6972_6f77_6e31;

/// Creates the registry if it is missing: one query when it exists.
pub(crate) async fn migrate(pool: &PgPool) -> Result<()> {
    let present: bool = sqlx::query_scalar("SELECT to_regclass('weir.table_owner') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if present {
        return Ok(());
    }
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *tx)
        .await?;
    sqlx::query("CREATE SCHEMA IF NOT EXISTS weir")
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS weir.table_owner (
            table_name text PRIMARY KEY,
            owner text NOT NULL,
            description text NOT NULL,
            registered_at timestamptz NOT NULL DEFAULT now())",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Where an unqualified name `table` leads from this connection: the
/// registry's key of the table (see the module's documentation; the bare
/// name when no schema of the search path exists), and whether the table
/// is there. One query.
async fn locate(conn: &mut PgConnection, table: &str) -> Result<(String, bool)> {
    let (key, exists): (Option<String>, bool) = sqlx::query_as(
        "SELECT COALESCE(n.nspname::text, current_schema()::text) || '.' || $1, c.oid IS NOT NULL
           FROM (SELECT to_regclass(quote_ident($1)) AS oid) AS r
           LEFT JOIN pg_class c ON c.oid = r.oid
           LEFT JOIN pg_namespace n ON n.oid = c.relnamespace",
    )
    .bind(table)
    .fetch_one(&mut *conn)
    .await?;
    Ok((key.unwrap_or_else(|| table.to_string()), exists))
}

/// Moves a registration of an earlier build (keyed by the bare name) to
/// `key`, unless `key` is registered already.
async fn qualify_legacy(conn: &mut PgConnection, table: &str, key: &str) -> Result<()> {
    if key == table {
        return Ok(());
    }
    sqlx::query(
        "UPDATE weir.table_owner SET table_name = $2 WHERE table_name = $1
           AND NOT EXISTS (SELECT 1 FROM weir.table_owner WHERE table_name = $2)",
    )
    .bind(table)
    .bind(key)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The owner registered for `table` in the database of `pool`, if any: a
/// registration of a table that no longer exists is none.
///
/// # Errors
/// When the database cannot be read.
pub async fn table_owner(pool: &PgPool, table: &str) -> Result<Option<Owner>> {
    let present: bool = sqlx::query_scalar("SELECT to_regclass('weir.table_owner') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !present {
        return Ok(None);
    }
    let mut conn = pool.acquire().await?;
    let (key, exists) = locate(&mut conn, table).await?;
    if !exists {
        return Ok(None);
    }
    // Its own registration, else one of an earlier build.
    let row: Option<(String, String)> = sqlx::query_as(
        "SELECT owner, description FROM weir.table_owner WHERE table_name IN ($1, $2)
          ORDER BY table_name = $1 DESC LIMIT 1",
    )
    .bind(&key)
    .bind(table)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(|(key, description)| Owner::from_parts(key, description)))
}

/// Settles the registration of `table` for an action of `claim`, in the
/// action's transaction (the registration row stays locked until it
/// ends). With `dropping`, the table's registration goes with it.
///
/// # Errors
/// When another owner holds the table (and the claim does not adopt it).
pub(crate) async fn settle(
    tx: &mut PgConnection,
    database: &str,
    table: &str,
    claim: &Claim,
    dropping: bool,
) -> Result<()> {
    let (key, exists) = locate(tx, table).await?;
    qualify_legacy(tx, table, &key).await?;
    if !dropping {
        // A table no one registered is registered at once: two owners
        // registering one table at the same time cannot both succeed.
        let inserted = sqlx::query(
            "INSERT INTO weir.table_owner (table_name, owner, description) VALUES ($1, $2, $3)
             ON CONFLICT (table_name) DO NOTHING",
        )
        .bind(&key)
        .bind(claim.owner.key())
        .bind(claim.owner.description())
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 1 {
            return Ok(());
        }
    }
    let found: Option<(String, String)> = sqlx::query_as(
        "SELECT owner, description FROM weir.table_owner WHERE table_name = $1 FOR UPDATE",
    )
    .bind(&key)
    .fetch_optional(&mut *tx)
    .await?;
    let found = found.map(|(key, description)| Owner::from_parts(key, description));
    if dropping {
        if let Some(found) = found.filter(|f| f.key() != claim.owner.key() && exists) {
            return Err(refused(database, table, &found, &claim.owner));
        }
        sqlx::query("DELETE FROM weir.table_owner WHERE table_name = $1")
            .bind(&key)
            .execute(&mut *tx)
            .await?;
        return Ok(());
    }
    match judge(database, table, claim, found, exists)? {
        Verdict::Ours | Verdict::Register => Ok(()),
        Verdict::Adopt(_) => {
            sqlx::query(
                "UPDATE weir.table_owner SET owner = $2, description = $3, registered_at = now()
                 WHERE table_name = $1",
            )
            .bind(&key)
            .bind(claim.owner.key())
            .bind(claim.owner.description())
            .execute(&mut *tx)
            .await?;
            Ok(())
        }
    }
}

/// A registered name quoted for SQL: `"schema"."table"`, or `"table"` for
/// a registration of an earlier build (identifiers hold no dot).
fn quote_registered(name: &str) -> String {
    match name.rsplit_once('.') {
        Some((schema, table)) => format!(
            "{}.{}",
            crate::sql::quote_identifier(schema),
            crate::sql::quote_identifier(table)
        ),
        None => crate::sql::quote_identifier(name),
    }
}

/// Drops every table registered to `owner`, with its registration, in
/// one transaction; returns their names (schema-qualified). Used to
/// remove a worker group, whose tables no member's ledger alone answers
/// for.
///
/// # Errors
/// When the database refuses a drop (nothing is dropped then).
pub async fn drop_tables_of(pool: &PgPool, owner: &Owner) -> Result<Vec<String>> {
    migrate(pool).await?;
    let mut tx = pool.begin().await?;
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name FROM weir.table_owner WHERE owner = $1 ORDER BY table_name FOR UPDATE",
    )
    .bind(owner.key())
    .fetch_all(&mut *tx)
    .await?;
    if !tables.is_empty() {
        // One statement: references between them do not stand in the way.
        let list: Vec<String> = tables.iter().map(|t| quote_registered(t)).collect();
        sqlx::query(&format!("DROP TABLE IF EXISTS {}", list.join(", ")))
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query("DELETE FROM weir.table_owner WHERE owner = $1")
        .bind(owner.key())
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(tables)
}
