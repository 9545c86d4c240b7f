//! The sinks: one table sink and one row sink per database and run.
//!
//! Every sink call is one `BEGIN IMMEDIATE` transaction. The row sink
//! writes all the tables of its database: deletes first (tables with the
//! highest rank first, children before parents), then upserts (lowest rank
//! first, parents before children), as multi-row statements chunked under
//! SQLite's bind limit. In a database with foreign keys, they are
//! deferred to the commit (`PRAGMA defer_foreign_keys`), so rows of
//! related tables in one call never fail for their order. (Without any,
//! the pragma is skipped: setting it makes SQLite compile every statement
//! of the connection again.)

use super::types::bind;
use std::collections::{BTreeMap, HashMap};

use rustc_hash::FxHashSet;
use std::sync::{Arc, Mutex, RwLock};

use sqlx::sqlite::{Sqlite, SqliteArguments};
use sqlx::{Arguments as _, Connection as _, Row as _, SqlitePool};
use tracing::Instrument;
use weir_actors::{ChildTargetDef, Error, Result, StableKey, TargetAction, TargetActionSink};

use super::ddl;
use super::owners;
use super::target::{RowSpec, RowWrite, SqliteRowHandler};
use crate::observe::{Connector, Tally};
use crate::sql::table::handler::TableAction;
use crate::sql::table::plan::DdlStep;
use crate::sql::value::key_of;
use crate::sql::{SqlValue, TableSchema};

/// What the sinks of one database share.
pub(crate) struct Database {
    /// The `ContextKey` name of the database (for messages).
    name: String,
    pool: SqlitePool,
    /// The schema of every table declared in this run, by name: filled by
    /// the child-handler factory, read by the row sink.
    tables: RwLock<HashMap<String, Arc<TableSchema>>>,
    /// The rank of every table seen in an upsert, to order deletes.
    ranks: Mutex<HashMap<String, u32>>,
}

impl Database {
    pub(crate) fn new(name: &str, pool: SqlitePool) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_string(),
            pool,
            tables: RwLock::new(HashMap::new()),
            ranks: Mutex::new(HashMap::new()),
        })
    }

    /// Whether `table` is declared in this run, in any spelling.
    fn declared_in_any_spelling(&self, table: &str) -> Result<bool> {
        let tables = self
            .tables
            .read()
            .map_err(|_| Error::msg("sqlite table registry lock poisoned"))?;
        Ok(tables.keys().any(|name| name.eq_ignore_ascii_case(table)))
    }

    fn schema(&self, table: &str) -> Result<Arc<TableSchema>> {
        self.tables
            .read()
            .map_err(|_| Error::msg("sqlite table registry lock poisoned"))?
            .get(table)
            .cloned()
            .ok_or_else(|| {
                Error::permanent(format!(
                    "sqlite database {}: table {table} was not declared in this run",
                    self.name
                ))
            })
    }
}

/// The table sink of a database; its child-handler factory gives every
/// declared table a row handler over the database's one row sink.
pub(crate) fn table_sink(db: Arc<Database>) -> TargetActionSink<TableAction> {
    let rows = row_sink(Arc::clone(&db));
    let factory_db = Arc::clone(&db);
    TargetActionSink::from_async_fn_with_child_handler(
        move |actions: Vec<TargetAction<TableAction>>| {
            let db = Arc::clone(&db);
            async move { apply_tables(&db, actions).await }
        },
        move |action: &TableAction| {
            let schema = action.schema.clone().ok_or_else(|| {
                Error::permanent(format!(
                    "sqlite table {}: a deleted table has no rows",
                    action.table
                ))
            })?;
            let schema = Arc::new(schema);
            let mut tables = factory_db
                .tables
                .write()
                .map_err(|_| Error::msg("sqlite table registry lock poisoned"))?;
            tables.insert(action.table.clone(), Arc::clone(&schema));
            drop(tables);
            Ok(ChildTargetDef::new::<RowSpec, _>(SqliteRowHandler::new(
                action.table.clone(),
                schema,
                rows.clone(),
            )))
        },
    )
}

fn row_sink(db: Arc<Database>) -> TargetActionSink<RowWrite> {
    TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<RowWrite>>| {
        let db = Arc::clone(&db);
        async move { apply_rows(&db, actions).await }
    })
}

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

async fn apply_tables(db: &Database, actions: Vec<TargetAction<TableAction>>) -> Result<()> {
    check_tables_exist(db, &actions).await?;
    if actions.iter().all(|a| {
        let a = TableAction::of(a);
        a.ddl.is_empty() && a.claim.is_none()
    }) {
        return Ok(());
    }
    let context =
        |what: &str, table: &str| format!("sqlite database {}, table {table}: {what}", db.name);
    let begin = |e| db_error(e, &format!("sqlite database {}: begin", db.name));
    let mut conn = db.pool.acquire().await.map_err(begin)?;
    let claims = actions.iter().any(|a| TableAction::of(a).claim.is_some());
    let registry = claims && owners::attach(&mut conn).await?;
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(begin)?;
    let database = format!("sqlite database {}", db.name);
    for action in actions.iter().filter(|_| registry) {
        let dropping = matches!(action, TargetAction::Delete(_));
        let action = TableAction::of(action);
        // A drop of a table declared in this run under another spelling
        // (see below) leaves the table, and its registration.
        let kept = dropping && db.declared_in_any_spelling(&action.table)?;
        if let Some(claim) = action.claim.as_ref().filter(|_| !kept) {
            owners::settle(&mut tx, &database, &action.table, claim, dropping).await?;
        }
    }
    for action in &actions {
        let dropping = matches!(action, TargetAction::Delete(_));
        let action = TableAction::of(action);
        // The same table to SQLite, declared in this run (under a key of a
        // ledger from before keys were lower case): it stays.
        if dropping && db.declared_in_any_spelling(&action.table)? {
            continue;
        }
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

/// Checks that each table declared with nothing to change (a refresh of
/// an unchanged table, or one the user owns) is still there: its rows are
/// recorded as present, so a table dropped by hand is an error saying
/// what to do, never an empty table created in its place.
async fn check_tables_exist(db: &Database, actions: &[TargetAction<TableAction>]) -> Result<()> {
    for action in actions {
        // A first declaration has no rows recorded yet.
        let TargetAction::Update(t) = action else {
            continue;
        };
        if !t.ddl.is_empty() {
            continue;
        }
        let exists: Option<i64> = sqlx::query_scalar(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1 COLLATE NOCASE",
        )
        .bind(&t.table)
        .fetch_optional(&db.pool)
        .await
        .map_err(|e| {
            db_error(
                e,
                &format!("sqlite database {}, table {}: check", db.name, t.table),
            )
        })?;
        if exists.is_none() {
            return Err(missing_table(&db.name, &t.table));
        }
    }
    Ok(())
}

/// The error of a declared table that is not in the database though
/// weir tracks it: it is not created again empty under rows recorded as
/// written.
pub(crate) fn missing_table(database: &str, table: &str) -> Error {
    Error::permanent(format!(
        "sqlite database {database} has no table {table}, though it is declared and weir tracks it (dropped by hand? a table declared as the user's is never created by weir): restore it, or delete what weir tracks of it (`weir drop`, or App::drop_state) and run again"
    ))
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

/// The writes of one sink call to one table.
struct TableWrites {
    schema: Arc<TableSchema>,
    /// The positions of the primary key's columns among the columns.
    key_positions: Vec<usize>,
    rank: u32,
    upserts: Vec<Vec<SqlValue>>,
    deletes: Vec<Vec<SqlValue>>,
    /// The keys of the rows above while grouping: a row's older actions
    /// are dropped. Emptied once the call's actions are grouped.
    seen: FxHashSet<StableKey>,
    /// While grouping: the rows kept, with their keys, to be sorted.
    keyed: Vec<(bool, StableKey, Vec<SqlValue>)>,
}

impl TableWrites {
    fn new(schema: Arc<TableSchema>, rank: u32) -> Self {
        let key_positions = schema
            .primary_key()
            .iter()
            .filter_map(|k| schema.columns().iter().position(|c| &c.name == k))
            .collect();
        Self {
            schema,
            key_positions,
            rank,
            upserts: Vec::new(),
            deletes: Vec::new(),
            seen: FxHashSet::default(),
            keyed: Vec::new(),
        }
    }

    /// The primary key of an upserted row (`values` holds every column)
    /// or of a delete (`values` holds the key).
    fn row_key(&self, values: &[SqlValue], is_delete: bool) -> StableKey {
        if is_delete {
            key_of(values)
        } else {
            key_of(self.key_positions.iter().filter_map(|&i| values.get(i)))
        }
    }
}

/// Groups a call's actions by table (see [`group_by_table`]) and records
/// the ranks it saw.
fn group(
    db: &Database,
    actions: Vec<TargetAction<RowWrite>>,
) -> Result<BTreeMap<String, TableWrites>> {
    let ranks = db
        .ranks
        .lock()
        .map(|r| r.clone())
        .map_err(|_| Error::msg("sqlite rank registry lock poisoned"))?;
    let (tables, new_ranks) = group_by_table(actions, &ranks, |t| db.schema(t))?;
    if !new_ranks.is_empty() {
        let mut ranks = db
            .ranks
            .lock()
            .map_err(|_| Error::msg("sqlite rank registry lock poisoned"))?;
        ranks.extend(new_ranks);
    }
    Ok(tables)
}

/// The tables' writes of a call, and the ranks seen in its upserts that
/// differ from `ranks`.
type Grouped = (BTreeMap<String, TableWrites>, Vec<(String, u32)>);

/// Groups a call's actions by table. When one row appears more than once
/// in a call, the last action wins (the engine orders one row's actions, so
/// the last is the newest). A table's rows are written in key order: a call
/// may carry several components' rows, interleaved, and SQLite writes rows
/// in key order much faster than rows spread over its B-tree. A table's
/// rank is the one its upserts carry, else the one in `ranks` (deletes
/// carry none).
fn group_by_table(
    actions: Vec<TargetAction<RowWrite>>,
    ranks: &HashMap<String, u32>,
    schema_of: impl Fn(&str) -> Result<Arc<TableSchema>>,
) -> Result<Grouped> {
    let mut tables: BTreeMap<String, TableWrites> = BTreeMap::new();
    let mut new_ranks = Vec::new();
    // Most calls write one table: room for all of the call's rows at once.
    let rows = actions.len();
    for action in actions.into_iter().rev() {
        let (is_delete, write) = match action {
            TargetAction::Create(w) | TargetAction::Update(w) => (false, w),
            TargetAction::Delete(w) => (true, w),
        };
        let writes = match tables.get_mut(&*write.table) {
            Some(writes) => writes,
            None => {
                let schema = schema_of(&write.table)?;
                let rank = ranks.get(&*write.table).copied().unwrap_or(0);
                let mut writes = TableWrites::new(schema, rank);
                writes.seen.reserve(rows);
                writes.keyed.reserve(rows);
                tables.entry(write.table.to_string()).or_insert(writes)
            }
        };
        let key = writes.row_key(&write.values, is_delete);
        if !writes.seen.insert(key.clone()) {
            continue; // an older action of the same row
        }
        if !is_delete && writes.rank != write.rank {
            writes.rank = write.rank;
            new_ranks.push((write.table.to_string(), write.rank));
        }
        writes.keyed.push((is_delete, key, write.values));
    }
    for writes in tables.values_mut() {
        let mut keyed = std::mem::take(&mut writes.keyed);
        // Keys are unique here. Rows came newest first, in runs (one per
        // component), which this sort finds and merges.
        keyed.sort_by(|a, b| a.1.cmp(&b.1));
        for (is_delete, _, values) in keyed {
            if is_delete {
                writes.deletes.push(values);
            } else {
                writes.upserts.push(values);
            }
        }
        writes.seen = FxHashSet::default();
    }
    Ok((tables, new_ranks))
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
    let sql = if is_delete {
        ddl::delete(table, &writes.schema, 1)
    } else {
        ddl::upsert(table, &writes.schema, 1)
    };
    for row in rows {
        if let Err(e) = run_chunk(tx, &sql, std::slice::from_ref(row)).await {
            if is_constraint(&e) {
                return Some(writes.row_key(row, is_delete));
            }
        }
    }
    None
}

async fn write_rows(
    tx: &mut Tx<'_>,
    db: &Database,
    table: &str,
    writes: &TableWrites,
    is_delete: bool,
) -> Result<()> {
    let rows = if is_delete {
        &writes.deletes
    } else {
        &writes.upserts
    };
    if rows.is_empty() {
        return Ok(());
    }
    let width = if is_delete {
        writes.schema.primary_key().len()
    } else {
        writes.schema.columns().len()
    };
    let per_statement = ddl::rows_per_statement(width);
    let statement = |n: usize| {
        if is_delete {
            ddl::delete(table, &writes.schema, n)
        } else {
            ddl::upsert(table, &writes.schema, n)
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
async fn has_foreign_keys(tx: &mut Tx<'_>, db: &Database) -> Result<bool> {
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

async fn apply_rows(db: &Database, actions: Vec<TargetAction<RowWrite>>) -> Result<()> {
    let tally = Tally::of(&actions, |a| &a.table);
    let span = SQLITE.call_span(&db.name, &tally, actions.len());
    write_actions(db, actions).instrument(span).await?;
    tally.record(SQLITE);
    Ok(())
}

/// Groups a call's actions by table and writes them in one transaction.
async fn write_actions(db: &Database, actions: Vec<TargetAction<RowWrite>>) -> Result<()> {
    let tables = group(db, actions)?;
    let mut order: Vec<(&String, &TableWrites)> = tables.iter().collect();
    order.sort_by_key(|(name, w)| (w.rank, name.as_str()));
    let mut tx = db
        .pool
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(|e| db_error(e, &format!("sqlite database {}: begin", db.name)))?;
    if has_foreign_keys(&mut tx, db).await? {
        let context = format!("sqlite database {}: defer foreign keys", db.name);
        execute(&mut tx, "PRAGMA defer_foreign_keys = ON", &context).await?;
    }
    for (table, writes) in order.iter().rev().filter(|(_, w)| !w.deletes.is_empty()) {
        let delete = write_rows(&mut tx, db, table, writes, true);
        SQLITE.timed(table, "delete", delete).await?;
    }
    for (table, writes) in order.iter().filter(|(_, w)| !w.upserts.is_empty()) {
        let upsert = write_rows(&mut tx, db, table, writes, false);
        SQLITE.timed(table, "upsert", upsert).await?;
    }
    let commit = async {
        tx.commit().await.map_err(|e| {
            let names: Vec<&str> = order.iter().map(|(t, _)| t.as_str()).collect();
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

    fn text(s: &str) -> SqlValue {
        SqlValue::Text(s.into())
    }

    /// A table keyed by (`org`, `id`), with a `body` between them.
    fn keyed_by_two() -> Result<Arc<TableSchema>> {
        Ok(Arc::new(
            TableSchema::builder()
                .column("org", crate::sql::ColumnType::Text)
                .column("body", crate::sql::ColumnType::Text)
                .column("id", crate::sql::ColumnType::BigInt)
                .primary_key(["org", "id"])
                .build()?,
        ))
    }

    fn write(values: Vec<SqlValue>) -> RowWrite {
        RowWrite {
            table: "t".into(),
            rank: 0,
            values,
        }
    }

    #[test]
    fn the_last_action_of_a_row_in_a_call_wins_and_a_delete_matches_its_upsert() -> Result<()> {
        let schema = keyed_by_two()?;
        let actions = vec![
            TargetAction::Create(write(vec![text("o"), text("old"), SqlValue::Int(1)])),
            TargetAction::Create(write(vec![text("o"), text("kept"), SqlValue::Int(2)])),
            TargetAction::Update(write(vec![text("o"), text("new"), SqlValue::Int(1)])),
            // A delete carries the key values only, in key order.
            TargetAction::Delete(write(vec![text("o"), SqlValue::Int(2)])),
            TargetAction::Create(write(vec![text("p"), text("x"), SqlValue::Int(2)])),
        ];
        let (tables, new_ranks) =
            group_by_table(actions, &HashMap::new(), |_| Ok(Arc::clone(&schema)))?;
        assert!(new_ranks.is_empty());
        let t = tables.get("t").ok_or_else(|| Error::msg("no table t"))?;
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
        let schema = keyed_by_two()?;
        let row = |k: &str, n: i64| write(vec![text(k), text("b"), SqlValue::Int(n)]);
        let actions = vec![
            TargetAction::Create(row("b", 1)),
            TargetAction::Delete(write(vec![text("c"), SqlValue::Int(0)])),
            TargetAction::Create(row("a", 2)),
            TargetAction::Update(row("a", 1)),
            TargetAction::Delete(write(vec![text("a"), SqlValue::Int(0)])),
            TargetAction::Create(row("b", 0)),
        ];
        let (tables, _) = group_by_table(actions, &HashMap::new(), |_| Ok(Arc::clone(&schema)))?;
        let t = tables.get("t").ok_or_else(|| Error::msg("no table t"))?;
        let keys = |rows: &[Vec<SqlValue>], is_delete: bool| -> Vec<StableKey> {
            rows.iter().map(|r| t.row_key(r, is_delete)).collect()
        };
        assert_eq!(
            keys(&t.upserts, false),
            vec![
                StableKey::Array(vec![StableKey::Str("a".into()), StableKey::Int(1)].into()),
                StableKey::Array(vec![StableKey::Str("a".into()), StableKey::Int(2)].into()),
                StableKey::Array(vec![StableKey::Str("b".into()), StableKey::Int(0)].into()),
                StableKey::Array(vec![StableKey::Str("b".into()), StableKey::Int(1)].into()),
            ]
        );
        assert_eq!(
            keys(&t.deletes, true),
            vec![
                StableKey::Array(vec![StableKey::Str("a".into()), StableKey::Int(0)].into()),
                StableKey::Array(vec![StableKey::Str("c".into()), StableKey::Int(0)].into()),
            ]
        );
        Ok(())
    }

    #[test]
    fn an_upserts_key_is_the_key_of_the_delete_of_the_same_row() -> Result<()> {
        let schema = keyed_by_two()?;
        let writes = TableWrites::new(schema, 0);
        assert_eq!(
            writes.row_key(&[text("o"), text("body"), SqlValue::Int(7)], false),
            writes.row_key(&[text("o"), SqlValue::Int(7)], true)
        );
        Ok(())
    }

    #[test]
    fn a_tables_rank_comes_from_its_upserts_or_else_from_the_ranks_seen_before() -> Result<()> {
        let schema = keyed_by_two()?;
        let ranks = HashMap::from([("t".to_string(), 2)]);
        let delete = || TargetAction::Delete(write(vec![text("o"), SqlValue::Int(1)]));
        let (tables, new_ranks) =
            group_by_table(vec![delete()], &ranks, |_| Ok(Arc::clone(&schema)))?;
        assert_eq!(tables.get("t").map(|t| t.rank), Some(2));
        assert!(new_ranks.is_empty());
        let mut upsert = write(vec![text("o"), text("b"), SqlValue::Int(3)]);
        upsert.rank = 1;
        let (tables, new_ranks) =
            group_by_table(vec![delete(), TargetAction::Create(upsert)], &ranks, |_| {
                Ok(Arc::clone(&schema))
            })?;
        assert_eq!(tables.get("t").map(|t| t.rank), Some(1));
        assert_eq!(new_ranks, vec![("t".to_string(), 1)]);
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
