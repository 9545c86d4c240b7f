//! Applying actions: table DDL, and row upserts and deletes in one
//! transaction per sink call.

use std::sync::Arc;

use sqlx::pool::PoolConnection;
use sqlx::postgres::PgDatabaseError;
use sqlx::{Connection, PgConnection, Postgres, Transaction};
use tracing::Instrument;
use weir_actors::{Error, Fence, Result, StableKey, TargetAction};

use super::db::{PgDatabase, PgTable};
use super::ddl;
use super::owners;
use super::types::{copy_binary, ColumnArray};
use crate::observe::{Connector, Tally};
use crate::sql::table::actions::RowWrite;
use crate::sql::table::actions::TableAction;
use crate::sql::table::rows::{group_by_table, Write};
use crate::sql::SqlValue;

/// Rows per statement. Each statement binds one array per column, far
/// below PostgreSQL's 65535-parameter limit whatever the row count; the
/// chunk only bounds the size of one statement.
pub const ROWS_PER_STATEMENT: usize = 10_000;

/// Runs the DDL of every table action, in order, in one transaction,
/// after settling the registration of each table weir manages (see
/// `crate::sql::owners`): a table another owner registered is refused,
/// and nothing of the call is changed. A call with no DDL and no table of
/// weir's (tables unchanged and user-managed) touches nothing.
pub(crate) async fn apply_tables(
    db: Arc<PgDatabase>,
    actions: Vec<TargetAction<TableAction>>,
) -> Result<()> {
    let pool = &db.pool;
    let mut claims = Vec::new();
    let mut statements = Vec::new();
    for action in actions {
        let dropping = matches!(action, TargetAction::Delete(_));
        let (TargetAction::Create(t) | TargetAction::Update(t) | TargetAction::Delete(t)) = action;
        if let Some(claim) = t.claim {
            claims.push((t.table.clone(), claim, dropping));
        }
        for step in &t.ddl {
            let sql = ddl::step_sql(&t.table, t.schema.as_ref(), step)?;
            statements.push((t.table.clone(), sql));
        }
    }
    if statements.is_empty() && claims.is_empty() {
        return Ok(());
    }
    if !claims.is_empty() {
        owners::migrate(pool).await?;
    }
    let mut tx = pool.begin().await?;
    check_fence_of_call(&mut tx).await?;
    // How the registry of owners names the database.
    let database = format!("postgres database {}", db.name);
    for (table, claim, dropping) in &claims {
        owners::settle(&mut tx, &database, table, claim, *dropping).await?;
    }
    for (table, statement) in statements {
        let ddl = async {
            sqlx::query(&statement)
                .persistent(false)
                .execute(&mut *tx)
                .await
                .map_err(|e| map_error(e, &table, "changing the table", &[]))
        };
        PG.timed(&table, "ddl", ddl).await?;
    }
    PG.timed(&db.name, "commit", async { Ok(tx.commit().await?) })
        .await
}

/// This connector, as its metrics and spans name it.
const PG: Connector = Connector::Postgres;

/// Whether `table` is where an unqualified name finds it.
pub(crate) async fn table_exists(db: &PgDatabase, table: &str) -> Result<bool> {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(crate::sql::quote_identifier(table))
        .fetch_one(&db.pool)
        .await
        .map_err(|e| map_error(e, table, "checking that the table exists", &[]))
}

/// A table's rows of a call, with their keys: full rows, or key values.
type Rows = Vec<(StableKey, Vec<SqlValue>)>;

/// Applies row actions of any tables of one database in one transaction:
/// upserts of parent tables before their children's (rank ascending), then
/// deletes children first (rank descending), so foreign keys between the
/// tables hold at every statement.
///
/// Two actions on one primary key in one call (which the engine does not
/// produce within a run, but a retried call may carry) are reduced to the
/// last one before sending, so `ON CONFLICT` never sees a key twice.
///
/// Rows created (weir holds no record of them) are copied in with `COPY
/// ... FROM STDIN (FORMAT binary)`, about twice as cheap for the server as
/// the upsert (100k rows: 106 ms against 245 ms), when the table has a
/// unique index on its key (see [`copy_then_upsert`]); if the copy fails
/// (the table has some of them already, or a constraint refuses one), it
/// is rolled back to a savepoint and all the table's rows are upserted,
/// which reports any error as before. Tables with array columns, and
/// tables the user manages, are always upserted (see `db::Statements::copy_sql`).
pub(crate) async fn apply_rows(
    db: Arc<PgDatabase>,
    actions: Vec<TargetAction<RowWrite>>,
) -> Result<()> {
    let tally = Tally::of(&actions, |a| &a.table);
    let span = PG.call_span(&db.name, &tally, actions.len());
    write_actions(db, actions).instrument(span).await?;
    tally.record(PG);
    Ok(())
}

/// Groups a call's actions by table and writes them in one transaction.
async fn write_actions(db: Arc<PgDatabase>, actions: Vec<TargetAction<RowWrite>>) -> Result<()> {
    let tables = group_by_table(actions, |name| db.declared(name))?;
    let mut upserts = Vec::with_capacity(tables.len());
    let mut deletes = Vec::with_capacity(tables.len());
    for work in tables {
        let (mut up, mut created, mut del): (Rows, Vec<bool>, Rows) = Default::default();
        for (key, write, values) in work.rows {
            match write {
                Write::Create | Write::Update => {
                    created.push(write == Write::Create);
                    up.push((key, values));
                }
                Write::Delete => del.push((key, values)),
            }
        }
        upserts.push((Arc::clone(&work.table), up, created));
        deletes.push((work.table, del));
    }
    // A call cancelled while it runs (its timeout) closes its connection
    // rather than give it back in an unknown state (a COPY cut short leaves
    // the protocol out of step).
    let mut conn = CloseIfCancelled::new(db.pool.acquire().await?);
    let result = write_all(conn.connection(), &db.name, upserts, deletes).await;
    conn.ended();
    result
}

/// One call's rows per table, in rank order: upserts (with which of them
/// are new to weir), then deletes.
type Upserts = Vec<(Arc<PgTable>, Rows, Vec<bool>)>;
type Deletes = Vec<(Arc<PgTable>, Rows)>;

async fn write_all(
    conn: &mut PgConnection,
    database: &str,
    upserts: Upserts,
    deletes: Deletes,
) -> Result<()> {
    let mut tx = conn.begin().await?;
    check_fence_of_call(&mut tx).await?;
    for (meta, rows, created) in upserts.into_iter().filter(|(_, rows, _)| !rows.is_empty()) {
        let upsert = copy_then_upsert(&mut tx, &meta, rows, &created);
        PG.timed(&meta.name, "upsert", upsert).await?;
    }
    for (meta, keys) in deletes
        .into_iter()
        .rev()
        .filter(|(_, keys)| !keys.is_empty())
    {
        let delete = write_chunks(&mut tx, &meta, keys, true);
        PG.timed(&meta.name, "delete", delete).await?;
    }
    PG.timed(database, "commit", async { Ok(tx.commit().await?) })
        .await
}

/// In a worker group, checks the call's fence first thing in its
/// transaction: the partitions' fence rows stay share-locked until it
/// commits, so a takeover waits for it, and a call of a partition taken
/// over writes nothing (see `weir::group`).
async fn check_fence_of_call(tx: &mut Transaction<'_, Postgres>) -> Result<()> {
    match Fence::current() {
        Some(fence) => super::check_fence(tx, &fence).await,
        None => Ok(()),
    }
}

/// A pooled connection that is closed, not given back, when dropped before
/// [`CloseIfCancelled::ended`].
struct CloseIfCancelled {
    conn: PoolConnection<Postgres>,
    ended: bool,
}

impl CloseIfCancelled {
    fn new(conn: PoolConnection<Postgres>) -> Self {
        Self { conn, ended: false }
    }

    fn connection(&mut self) -> &mut PgConnection {
        &mut self.conn
    }

    /// The call returned (whatever it returned): the connection is in step.
    fn ended(&mut self) {
        self.ended = true;
    }
}

impl Drop for CloseIfCancelled {
    fn drop(&mut self) {
        if !self.ended {
            self.conn.close_on_drop();
        }
    }
}

/// Upserts a table's `rows`, copying in first those new to weir
/// (`created`) when the table allows it: then only the others are upserted.
/// If the copy fails, it is rolled back and every row is upserted, in the
/// order they came (an update may free a unique value a new row takes).
async fn copy_then_upsert(
    tx: &mut Transaction<'_, Postgres>,
    meta: &PgTable,
    rows: Rows,
    created: &[bool],
) -> Result<()> {
    let new = || {
        rows.iter()
            .zip(created)
            .filter(|(_, &c)| c)
            .map(|((_, v), _)| v.as_slice())
    };
    let copied = match &meta.statements.copy_sql {
        Some(sql) if new().next().is_some() && key_is_unique(tx, meta).await? => {
            match copy_binary(&meta.schema, new()) {
                // A value the copy cannot encode: the upsert reports it.
                Err(_) => false,
                Ok(data) => copy_in_savepoint(tx, meta, sql, data).await?,
            }
        }
        _ => false,
    };
    let rows = if copied {
        rows.into_iter()
            .zip(created)
            .filter_map(|(row, &c)| (!c).then_some(row))
            .collect()
    } else {
        rows
    };
    write_chunks(tx, meta, rows, false).await
}

/// Runs the copy inside a savepoint; whether it landed (else it is rolled
/// back).
async fn copy_in_savepoint(
    tx: &mut Transaction<'_, Postgres>,
    meta: &PgTable,
    sql: &str,
    data: Vec<u8>,
) -> Result<bool> {
    let failed =
        |what: &str, e: sqlx::Error| Error::msg(format!("table {}: {what}: {e}", meta.name));
    sqlx::query("SAVEPOINT weir_copy")
        .execute(&mut **tx)
        .await
        .map_err(|e| failed("savepoint", e))?;
    let copied = copy_in(tx, sql, data).await.is_ok();
    let end = if copied {
        "RELEASE SAVEPOINT weir_copy"
    } else {
        "ROLLBACK TO SAVEPOINT weir_copy"
    };
    sqlx::query(end)
        .execute(&mut **tx)
        .await
        .map_err(|e| failed("copying rows", e))?;
    Ok(copied)
}

/// Whether the table has a unique index on exactly its key's columns (not
/// deferred, not partial): only then does a copy fail where the upsert
/// would update. A table weir created has its primary key; one it adopted
/// (`CREATE TABLE IF NOT EXISTS` found it) may not. Asked once per table
/// and run.
async fn key_is_unique(tx: &mut Transaction<'_, Postgres>, meta: &PgTable) -> Result<bool> {
    if let Some(known) = meta.statements.key_is_unique.get() {
        return Ok(*known);
    }
    // Sorted bytewise, as `COLLATE "C"` sorts them.
    let mut key: Vec<String> = meta.schema.primary_key().to_vec();
    key.sort();
    let unique: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_index i \
           WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indimmediate \
             AND i.indpred IS NULL AND i.indnkeyatts = $2 \
             AND (SELECT array_agg(a.attname::text ORDER BY a.attname::text COLLATE \"C\") \
                  FROM pg_attribute a \
                  WHERE a.attrelid = i.indrelid \
                    AND a.attnum = ANY ((i.indkey::int2[])[0:i.indnkeyatts - 1])) = $3)",
    )
    .bind(crate::sql::quote_identifier(&meta.name))
    .bind(i16::try_from(key.len()).unwrap_or(i16::MAX))
    .bind(&key)
    .fetch_one(&mut **tx)
    .await
    .map_err(|e| Error::msg(format!("table {}: reading its indexes: {e}", meta.name)))?;
    Ok(*meta.statements.key_is_unique.get_or_init(|| unique))
}

/// Runs one `COPY ... FROM STDIN` with `data`.
async fn copy_in(
    tx: &mut Transaction<'_, Postgres>,
    sql: &str,
    data: Vec<u8>,
) -> std::result::Result<u64, sqlx::Error> {
    let mut copy = tx.copy_in_raw(sql).await?;
    if let Err(e) = copy.send(data).await {
        let _ = copy.abort("weir: sending the rows failed").await;
        return Err(e);
    }
    copy.finish().await
}

/// Runs the upsert (or delete) statement of `meta` over `rows` (full rows,
/// or primary key values), chunk by chunk.
async fn write_chunks(
    tx: &mut Transaction<'_, Postgres>,
    meta: &PgTable,
    mut rows: Vec<(StableKey, Vec<SqlValue>)>,
    delete: bool,
) -> Result<()> {
    let (sql, columns): (&str, Vec<_>) = if delete {
        (
            &meta.statements.delete_sql,
            meta.key_positions
                .iter()
                .filter_map(|&i| meta.schema.columns().get(i))
                .collect(),
        )
    } else {
        (
            &meta.statements.upsert_sql,
            meta.schema.columns().iter().collect(),
        )
    };
    let what = if delete {
        "deleting rows"
    } else {
        "writing rows"
    };
    while !rows.is_empty() {
        let rest = rows.split_off(rows.len().min(ROWS_PER_STATEMENT));
        let chunk = std::mem::replace(&mut rows, rest);
        let mut arrays: Vec<ColumnArray> = columns
            .iter()
            .map(|c| ColumnArray::new(&c.ty, chunk.len()))
            .collect();
        let mut keys = Vec::with_capacity(chunk.len());
        for (key, values) in chunk {
            if values.len() != arrays.len() {
                return Err(Error::permanent(format!(
                    "table {}, row {key}: {} values for {} columns",
                    meta.name,
                    values.len(),
                    arrays.len()
                )));
            }
            for ((array, value), column) in arrays.iter_mut().zip(values).zip(&columns) {
                array.push(value).map_err(|why| {
                    Error::permanent(format!(
                        "table {}, column {}, row {key}: {why}",
                        meta.name, column.name
                    ))
                })?;
            }
            keys.push(key);
        }
        let mut query = sqlx::query(sql);
        for array in arrays {
            query = array.bind(query);
        }
        query
            .execute(&mut **tx)
            .await
            .map_err(|e| map_error(e, &meta.name, what, &keys))?;
    }
    Ok(())
}

/// Names what a violated constraint is, by SQLSTATE.
fn violation(code: &str) -> Option<&'static str> {
    Some(match code {
        "23505" => "unique",
        "23503" => "foreign key",
        "23514" => "check",
        "23502" => "not null",
        "23P01" => "exclusion",
        c if c.starts_with("23") => "integrity",
        _ => return None,
    })
}

/// Maps a driver error: a constraint violation becomes a permanent error
/// naming the table, the constraint and the key(s), so that the engine
/// splits the call to isolate the component concerned; anything else stays
/// a database error, retriable when transient (connection, I/O, deadlock).
fn map_error(e: sqlx::Error, table: &str, what: &str, keys: &[StableKey]) -> Error {
    let sqlx::Error::Database(db) = &e else {
        return Error::from(e);
    };
    let Some(kind) = db.code().as_deref().and_then(violation) else {
        return Error::from(e);
    };
    let constraint = db.constraint().unwrap_or("?").to_string();
    let detail = db
        .try_downcast_ref::<PgDatabaseError>()
        .and_then(|pg| pg.detail())
        .map(|d| format!(" ({d})"))
        .unwrap_or_default();
    let shown: Vec<String> = keys.iter().take(5).map(ToString::to_string).collect();
    let more = keys.len().saturating_sub(shown.len());
    let keys = match (shown.is_empty(), more) {
        (true, _) => String::new(),
        (false, 0) => format!(", key {}", shown.join(", ")),
        (false, n) => format!(", keys {} and {n} more", shown.join(", ")),
    };
    Error::permanent(format!(
        "table {table}: {kind} constraint {constraint} violated {what}{detail}{keys}: {}",
        db.message()
    ))
}
