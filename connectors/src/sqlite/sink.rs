//! The sinks: one table sink and one row sink per database of an app.
//!
//! Every sink call is one `BEGIN IMMEDIATE` transaction, taken through the
//! database's writer lock: two row-sink calls run at once, one grouping its
//! rows while the other writes, and they write in turn. The row sink
//! writes all the tables of its database: deletes first (tables with the
//! highest rank first, children before parents), then upserts (lowest rank
//! first, parents before children), as multi-row statements chunked under
//! SQLite's bind limit. In a database with foreign keys, they are
//! deferred to the commit (`PRAGMA defer_foreign_keys`), so rows of
//! related tables in one call never fail for their order. (Without any,
//! the pragma is skipped: setting it makes SQLite compile every statement
//! of the connection again.)

use std::sync::Arc;

use sqlx::sqlite::{Sqlite, SqliteArguments};
use sqlx::{Arguments as _, Connection as _, Row as _};
use tracing::Instrument;
use weir_actors::{Error, Result, StableKey, TargetAction};

use super::db::{SqDatabase, SqTable};
use super::ddl;
use super::owners;
use super::types::bind;
use crate::observe::{Connector, Tally};
use crate::sql::table::actions::RowWrite;
use crate::sql::table::actions::TableAction;
use crate::sql::table::plan::DdlStep;
use crate::sql::table::rows::{group_by_table, TableRows, Write};
use crate::sql::SqlValue;

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// SQLite's extended result code of a database error.
fn sqlite_code(e: &sqlx::Error) -> Option<i32> {
    match e {
        sqlx::Error::Database(db) => db.code().and_then(|c| c.parse().ok()),
        _ => None,
    }
}

const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;
const SQLITE_CONSTRAINT: i32 = 19;
const SQLITE_CONSTRAINT_FOREIGNKEY: i32 = 787;

/// Whether `e` is a constraint violation.
fn is_constraint(e: &sqlx::Error) -> bool {
    sqlite_code(e).is_some_and(|c| c & 0xff == SQLITE_CONSTRAINT)
}

/// The constraint a violation names: `constraint users.email` for
/// `UNIQUE constraint failed: users.email`. SQLite names no foreign key:
/// `a foreign key` for `FOREIGN KEY constraint failed`.
fn constraint_name(message: &str) -> String {
    match message.split_once("failed: ") {
        Some((_, name)) => format!("constraint {name}"),
        None if message.starts_with("FOREIGN KEY") => "a foreign key".to_string(),
        None => format!("constraint {message}"),
    }
}

/// A weir error for a database error, prefixed with `context` (what was
/// being done, on which table and key). Busy and locked databases and
/// foreign-key violations (the parent row may come in a later call) are
/// retriable; other constraint violations are permanent.
fn db_error(e: sqlx::Error, context: &str) -> Error {
    match (sqlite_code(&e), &e) {
        (Some(code), _) if matches!(code & 0xff, SQLITE_BUSY | SQLITE_LOCKED) => {
            Error::msg(format!("{context}: the database is busy ({e})"))
        }
        (Some(code), sqlx::Error::Database(db)) if code & 0xff == SQLITE_CONSTRAINT => {
            let message = db.message();
            let text = format!(
                "{context}: {} violated ({message})",
                constraint_name(message)
            );
            if code == SQLITE_CONSTRAINT_FOREIGNKEY {
                Error::msg(text)
            } else {
                Error::permanent(text)
            }
        }
        _ => {
            let text = format!("{context}: {e}");
            if Error::from(e).is_retriable() {
                Error::msg(text)
            } else {
                Error::permanent(text)
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Tables
// ---------------------------------------------------------------------------

pub(crate) async fn apply_tables(
    db: &SqDatabase,
    actions: Vec<TargetAction<TableAction>>,
) -> Result<()> {
    if actions.iter().all(|a| {
        let a = TableAction::of(a);
        a.ddl.is_empty() && a.claim.is_none()
    }) {
        return Ok(());
    }
    let context =
        |what: &str, table: &str| format!("sqlite database {}, table {table}: {what}", db.name);
    let begin = |e| db_error(e, &format!("sqlite database {}: begin", db.name));
    let _writer = db.dialect.lock().await;
    let mut conn = db.pool.acquire().await.map_err(begin)?;
    let claims = actions.iter().any(|a| TableAction::of(a).claim.is_some());
    let registry = claims && owners::attach(&mut conn).await?;
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(begin)?;
    let database = format!("sqlite database {}", db.name);
    if registry {
        for action in &actions {
            let dropping = matches!(action, TargetAction::Delete(_));
            let action = TableAction::of(action);
            if let Some(claim) = &action.claim {
                owners::settle(&mut tx, &database, &action.table, claim, dropping).await?;
            }
        }
    }
    for action in actions.iter().map(TableAction::of) {
        let table = action.table.as_str();
        let context = context("alter", table);
        let change = change_table(&mut tx, action, &context);
        SQLITE.timed(table, "ddl", change).await?;
    }
    let commit = async {
        tx.commit()
            .await
            .map_err(|e| db_error(e, &format!("sqlite database {}: commit", db.name)))
    };
    SQLITE.timed(&db.name, "commit", commit).await
}

/// This connector, as its metrics and spans name it.
const SQLITE: Connector = Connector::Sqlite;

/// Carries out a table action's DDL steps. SQLite has no `ADD COLUMN IF
/// NOT EXISTS` nor `DROP COLUMN IF EXISTS`: a column step first looks at
/// the table's columns as they are (read once, then kept up to date), so
/// that every step is idempotent.
async fn change_table(tx: &mut Tx<'_>, action: &TableAction, context: &str) -> Result<()> {
    let table = action.table.as_str();
    let mut columns: Option<Vec<ActualColumn>> = None;
    for step in &action.ddl {
        match step {
            DdlStep::CreateIfMissing => {
                let schema = action.schema.as_ref().ok_or_else(|| {
                    Error::permanent(format!("{context}: no schema to create the table with"))
                })?;
                execute(tx, &ddl::create_table(table, schema), context).await?;
                columns = None;
            }
            DdlStep::DropTable => {
                execute(tx, &ddl::drop_table(table), context).await?;
                columns = None;
            }
            DdlStep::AddColumn(column) => {
                let actual = match &mut columns {
                    Some(actual) => actual,
                    None => columns.insert(read_columns(tx, table, context).await?),
                };
                if find(actual, &column.name).is_none() {
                    execute(tx, &ddl::add_column(table, column), context).await?;
                    actual.push(ActualColumn {
                        name: column.name.clone(),
                        in_key: false,
                    });
                }
            }
            DdlStep::DropColumn(name) => {
                let actual = match &mut columns {
                    Some(actual) => actual,
                    None => columns.insert(read_columns(tx, table, context).await?),
                };
                drop_column(tx, table, actual, name, context).await?;
            }
        }
    }
    Ok(())
}

/// Drops the column `name` if the table has it (`actual`); one in the
/// table's primary key is an error, since SQLite cannot drop it.
async fn drop_column(
    tx: &mut Tx<'_>,
    table: &str,
    actual: &mut Vec<ActualColumn>,
    name: &str,
    context: &str,
) -> Result<()> {
    let Some(at) = find(actual, name) else {
        return Ok(());
    };
    if actual[at].in_key {
        return Err(Error::permanent(format!(
            "{context}: column {name} is in the table's primary key but not in the declared schema"
        )));
    }
    execute(tx, &ddl::drop_column(table, &actual[at].name), context).await?;
    actual.remove(at);
    Ok(())
}

/// Whether `table` is in the database, in any spelling.
pub(crate) async fn table_exists(db: &SqDatabase, table: &str) -> Result<bool> {
    let found: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1 COLLATE NOCASE",
    )
    .bind(table)
    .fetch_optional(&db.pool)
    .await
    .map_err(|e| {
        db_error(
            e,
            &format!("sqlite database {}, table {table}: check", db.name),
        )
    })?;
    Ok(found.is_some())
}

type Tx<'c> = sqlx::Transaction<'c, Sqlite>;

async fn execute(tx: &mut Tx<'_>, sql: &str, context: &str) -> Result<()> {
    sqlx::query(sql)
        .execute(&mut **tx)
        .await
        .map(|_| ())
        .map_err(|e| db_error(e, context))
}

/// One column as the table has it (`PRAGMA table_info`).
struct ActualColumn {
    name: String,
    in_key: bool,
}

/// Where the column `name` is among `actual` (SQLite ignores the case of
/// names).
fn find(actual: &[ActualColumn], name: &str) -> Option<usize> {
    actual
        .iter()
        .position(|a| a.name.eq_ignore_ascii_case(name))
}

/// The table's columns as they are.
async fn read_columns(tx: &mut Tx<'_>, table: &str, context: &str) -> Result<Vec<ActualColumn>> {
    let rows = sqlx::query(&ddl::table_info(table))
        .fetch_all(&mut **tx)
        .await
        .map_err(|e| db_error(e, context))?;
    rows.into_iter()
        .map(|row| {
            let read = |e: sqlx::Error| db_error(e, context);
            Ok(ActualColumn {
                name: row.try_get::<String, _>("name").map_err(read)?,
                in_key: row.try_get::<i64, _>("pk").map_err(read)? != 0,
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Rows
// ---------------------------------------------------------------------------

/// The writes of one sink call to one table, each row's last action
/// only, in key order: a call may carry several components' rows,
/// interleaved, and SQLite writes rows in key order much faster than rows
/// spread over its B-tree.
struct TableWrites {
    table: Arc<SqTable>,
    upserts: Vec<Vec<SqlValue>>,
    deletes: Vec<Vec<SqlValue>>,
}

impl TableWrites {
    fn of(rows: TableRows<super::db::Sqlite>) -> Self {
        let TableRows {
            table, mut rows, ..
        } = rows;
        // Keys are unique here. Rows came in runs (one per component),
        // which this sort finds and merges.
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        let mut upserts = Vec::with_capacity(rows.len());
        let mut deletes = Vec::new();
        for (_, write, values) in rows {
            match write {
                Write::Delete => deletes.push(values),
                Write::Create | Write::Update => upserts.push(values),
            }
        }
        Self {
            table,
            upserts,
            deletes,
        }
    }
}

async fn run_chunk(
    tx: &mut Tx<'_>,
    sql: &str,
    rows: &[Vec<SqlValue>],
) -> std::result::Result<(), sqlx::Error> {
    // Sized once: a statement binds up to 32 766 values.
    let mut args = SqliteArguments::default();
    args.reserve(rows.iter().map(Vec::len).sum(), 0);
    for row in rows {
        for value in row {
            bind(&mut args, value).map_err(sqlx::Error::Encode)?;
        }
    }
    sqlx::query_with(sql, args)
        .execute(&mut **tx)
        .await
        .map(|_| ())
}

/// After a constraint violation in a multi-row statement, finds the first
/// row that violates it alone (inside the same transaction, which is rolled
/// back anyway) to name its key.
async fn culprit(
    tx: &mut Tx<'_>,
    table: &str,
    writes: &TableWrites,
    rows: &[Vec<SqlValue>],
    is_delete: bool,
) -> Option<StableKey> {
    let schema = &writes.table.schema;
    let sql = if is_delete {
        ddl::delete(table, schema, 1)
    } else {
        ddl::upsert(table, schema, 1)
    };
    for row in rows {
        if let Err(e) = run_chunk(tx, &sql, std::slice::from_ref(row)).await {
            if is_constraint(&e) {
                return Some(writes.table.row_key(row, is_delete));
            }
        }
    }
    None
}

async fn write_rows(
    tx: &mut Tx<'_>,
    db: &SqDatabase,
    writes: &TableWrites,
    is_delete: bool,
) -> Result<()> {
    let table = writes.table.name.as_str();
    let schema = &writes.table.schema;
    let rows = if is_delete {
        &writes.deletes
    } else {
        &writes.upserts
    };
    if rows.is_empty() {
        return Ok(());
    }
    let width = if is_delete {
        schema.primary_key().len()
    } else {
        schema.columns().len()
    };
    let per_statement = ddl::rows_per_statement(width);
    let statement = |n: usize| {
        if is_delete {
            ddl::delete(table, schema, n)
        } else {
            ddl::upsert(table, schema, n)
        }
    };
    let full = statement(per_statement.min(rows.len()));
    for chunk in rows.chunks(per_statement) {
        let partial;
        let sql = if chunk.len() == per_statement.min(rows.len()) {
            &full
        } else {
            partial = statement(chunk.len());
            &partial
        };
        if let Err(e) = run_chunk(tx, sql, chunk).await {
            let verb = if is_delete { "delete" } else { "upsert" };
            let key = if is_constraint(&e) {
                culprit(tx, table, writes, chunk, is_delete).await
            } else {
                None
            };
            let key = key.map(|k| format!(", key {k}")).unwrap_or_default();
            return Err(db_error(
                e,
                &format!("sqlite database {}, table {table}{key}: {verb}", db.name),
            ));
        }
    }
    Ok(())
}

/// Whether any table the connection sees declares a foreign key: in the
/// main database, a temporary one or an attached one (unqualified table
/// names resolve to any of them).
///
/// Only then does a call defer foreign keys to its commit: `PRAGMA
/// defer_foreign_keys` is a flag pragma, and setting one expires every
/// statement the connection has prepared, so each call would compile its
/// multi-row statements again (about a millisecond a call for 4 096 rows
/// of four columns). Asked inside the call's write transaction, so no
/// foreign key can appear before the call commits.
async fn has_foreign_keys(tx: &mut Tx<'_>, db: &SqDatabase) -> Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_list AS t, \
         pragma_foreign_key_list(t.name, t.schema) WHERE t.type = 'table')",
    )
    .fetch_one(&mut **tx)
    .await
    .map_err(|e| {
        db_error(
            e,
            &format!("sqlite database {}: list foreign keys", db.name),
        )
    })
}

pub(crate) async fn apply_rows(
    db: &SqDatabase,
    actions: Vec<TargetAction<RowWrite>>,
) -> Result<()> {
    let tally = Tally::of(&actions, |a| &a.table);
    let span = SQLITE.call_span(&db.name, &tally, actions.len());
    write_actions(db, actions).instrument(span).await?;
    tally.record(SQLITE);
    Ok(())
}

/// Groups a call's actions by table and writes them in one transaction.
async fn write_actions(db: &SqDatabase, actions: Vec<TargetAction<RowWrite>>) -> Result<()> {
    let order: Vec<TableWrites> = group_by_table(actions, |name| db.declared(name))?
        .into_iter()
        .map(TableWrites::of)
        .collect();
    // One call writes at a time; the next one groups its rows meanwhile.
    let _writer = db.dialect.lock().await;
    let mut tx = db
        .pool
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(|e| db_error(e, &format!("sqlite database {}: begin", db.name)))?;
    if has_foreign_keys(&mut tx, db).await? {
        let context = format!("sqlite database {}: defer foreign keys", db.name);
        execute(&mut tx, "PRAGMA defer_foreign_keys = ON", &context).await?;
    }
    for writes in order.iter().rev().filter(|w| !w.deletes.is_empty()) {
        let delete = write_rows(&mut tx, db, writes, true);
        SQLITE.timed(&writes.table.name, "delete", delete).await?;
    }
    for writes in order.iter().filter(|w| !w.upserts.is_empty()) {
        let upsert = write_rows(&mut tx, db, writes, false);
        SQLITE.timed(&writes.table.name, "upsert", upsert).await?;
    }
    let commit = async {
        tx.commit().await.map_err(|e| {
            let names: Vec<&str> = order.iter().map(|w| w.table.name.as_str()).collect();
            let context = format!(
                "sqlite database {}, tables {}: commit",
                db.name,
                names.join(", ")
            );
            db_error(e, &context)
        })
    };
    SQLITE.timed(&db.name, "commit", commit).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::{ColumnType, TableSchema};
    use weir_actors::statediff::ManagedBy;

    fn text(s: &str) -> SqlValue {
        SqlValue::Text(s.into())
    }

    /// A table keyed by (`org`, `id`), with a `body` between them.
    fn keyed_by_two(name: &str) -> Result<Arc<SqTable>> {
        let schema = TableSchema::builder()
            .column("org", ColumnType::Text)
            .column("body", ColumnType::Text)
            .column("id", ColumnType::BigInt)
            .primary_key(["org", "id"])
            .build()?;
        Ok(Arc::new(SqTable::new(name, &schema, ManagedBy::System)?))
    }

    fn write(table: &str, values: Vec<SqlValue>) -> RowWrite {
        RowWrite {
            table: table.into(),
            values,
        }
    }

    /// The call's writes, grouped as the row sink groups them.
    fn grouped(
        actions: Vec<TargetAction<RowWrite>>,
        tables: &[Arc<SqTable>],
    ) -> Result<Vec<TableWrites>> {
        let table_of = |name: &str| {
            tables
                .iter()
                .find(|t| t.name == name)
                .cloned()
                .ok_or_else(|| Error::msg(format!("no table {name}")))
        };
        Ok(group_by_table(actions, table_of)?
            .into_iter()
            .map(TableWrites::of)
            .collect())
    }

    #[test]
    fn the_last_action_of_a_row_in_a_call_wins_and_a_delete_matches_its_upsert() -> Result<()> {
        let w = |values| write("t", values);
        let actions = vec![
            TargetAction::Create(w(vec![text("o"), text("old"), SqlValue::Int(1)])),
            TargetAction::Create(w(vec![text("o"), text("kept"), SqlValue::Int(2)])),
            TargetAction::Update(w(vec![text("o"), text("new"), SqlValue::Int(1)])),
            // A delete carries the key values only, in key order.
            TargetAction::Delete(w(vec![text("o"), SqlValue::Int(2)])),
            TargetAction::Create(w(vec![text("p"), text("x"), SqlValue::Int(2)])),
        ];
        let tables = grouped(actions, &[keyed_by_two("t")?])?;
        let [t] = &tables[..] else {
            return Err(Error::msg("not one table"));
        };
        assert_eq!(
            t.upserts,
            vec![
                vec![text("o"), text("new"), SqlValue::Int(1)],
                vec![text("p"), text("x"), SqlValue::Int(2)],
            ]
        );
        assert_eq!(t.deletes, vec![vec![text("o"), SqlValue::Int(2)]]);
        Ok(())
    }

    #[test]
    fn a_tables_rows_are_written_in_key_order_whatever_order_they_came_in() -> Result<()> {
        let row = |k: &str, n: i64| write("t", vec![text(k), text("b"), SqlValue::Int(n)]);
        let key = |k: &str, n: i64| write("t", vec![text(k), SqlValue::Int(n)]);
        let actions = vec![
            TargetAction::Create(row("b", 1)),
            TargetAction::Delete(key("c", 0)),
            TargetAction::Create(row("a", 2)),
            TargetAction::Update(row("a", 1)),
            TargetAction::Delete(key("a", 0)),
            TargetAction::Create(row("b", 0)),
        ];
        let tables = grouped(actions, &[keyed_by_two("t")?])?;
        let [t] = &tables[..] else {
            return Err(Error::msg("not one table"));
        };
        let keys = |rows: &[Vec<SqlValue>], is_delete: bool| -> Vec<StableKey> {
            rows.iter().map(|r| t.table.row_key(r, is_delete)).collect()
        };
        let k = |s: &str, n: i64| {
            StableKey::Array(vec![StableKey::Str(s.into()), StableKey::Int(n)].into())
        };
        assert_eq!(
            keys(&t.upserts, false),
            vec![k("a", 1), k("a", 2), k("b", 0), k("b", 1)]
        );
        assert_eq!(keys(&t.deletes, true), vec![k("a", 0), k("c", 0)]);
        Ok(())
    }

    #[test]
    fn a_declared_rows_key_from_the_tables_key_positions_is_the_rows_own_key() -> Result<()> {
        // Key columns declared apart and out of the key's order.
        let schema = TableSchema::builder()
            .column("id", ColumnType::BigInt)
            .column("body", ColumnType::Text)
            .column("org", ColumnType::Text)
            .primary_key(["org", "id"])
            .build()?;
        let table = SqTable::new("t", &schema, ManagedBy::System)?;
        let row = crate::sql::Row {
            values: vec![SqlValue::Int(7), text("b"), text("o")],
        };
        assert_eq!(table.row_key(&row.values, false), row.key(&schema));
        Ok(())
    }

    #[test]
    fn an_upserts_key_is_the_key_of_the_delete_of_the_same_row() -> Result<()> {
        let table = keyed_by_two("t")?;
        assert_eq!(
            table.row_key(&[text("o"), text("body"), SqlValue::Int(7)], false),
            table.row_key(&[text("o"), SqlValue::Int(7)], true)
        );
        Ok(())
    }

    #[test]
    fn a_calls_tables_come_parents_first_by_their_declared_rank() -> Result<()> {
        let (parent, child) = (keyed_by_two("z_parent")?, keyed_by_two("a_child")?);
        child.rank.store(1, std::sync::atomic::Ordering::Relaxed);
        let row = |table: &str| write(table, vec![text("o"), text("b"), SqlValue::Int(1)]);
        let actions = vec![
            TargetAction::Create(row("a_child")),
            TargetAction::Delete(write("z_parent", vec![text("o"), SqlValue::Int(2)])),
        ];
        let tables = grouped(actions, &[parent, child])?;
        let names: Vec<&str> = tables.iter().map(|w| w.table.name.as_str()).collect();
        assert_eq!(names, vec!["z_parent", "a_child"]);
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_calls_at_once_write_in_turn_without_meeting_a_busy_database() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::msg(e.to_string()))?;
        // A busy database is an error at once: the calls must not meet.
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(dir.path().join("t.db"))
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(std::time::Duration::ZERO);
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(options)
            .await?;
        sqlx::query("CREATE TABLE t (org TEXT, body TEXT, id INTEGER, PRIMARY KEY (org, id))")
            .execute(&pool)
            .await?;
        let db = SqDatabase::new("db", pool.clone());
        db.set_table(keyed_by_two("t")?);
        let call = |org: &str| -> Vec<TargetAction<RowWrite>> {
            (0..20_000)
                .map(|i| {
                    TargetAction::Create(write("t", vec![text(org), text("b"), SqlValue::Int(i)]))
                })
                .collect()
        };
        let (a, b) = tokio::join!(apply_rows(&db, call("a")), apply_rows(&db, call("b")));
        a?;
        b?;
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM t")
            .fetch_one(&pool)
            .await?;
        assert_eq!(rows, 40_000);
        Ok(())
    }

    #[test]
    fn the_constraint_is_read_from_the_message() {
        assert_eq!(
            constraint_name("UNIQUE constraint failed: users.email"),
            "constraint users.email"
        );
        assert_eq!(
            constraint_name("FOREIGN KEY constraint failed"),
            "a foreign key"
        );
        assert_eq!(constraint_name("odd"), "constraint odd");
    }
}
