//! One database's two sinks, kept by the app: one for its tables' DDL and
//! one for the rows of all its tables.

use std::sync::Arc;

use weir_actors::statediff::ManagedBy;
use weir_actors::{ChildTargetDef, ContextKey, Ctx, Error, Result, TargetAction, TargetActionSink};

use super::actions::{RowWrite, TableAction};
use super::dialect::{Database, Dialect, Table};
use super::rows::RowHandler;
use crate::sql::Row;

/// A database and its two sinks: one for its tables' DDL and one for the
/// rows of all its tables, so that rows of every table batch together and
/// are applied in one transaction per sink call.
pub(crate) struct Shared<D: Dialect> {
    /// The database.
    pub db: Arc<Database<D>>,
    /// The tables' sink; its child-handler factory gives each declared
    /// table a row handler over the row sink.
    pub table_sink: TargetActionSink<TableAction>,
    /// The rows' sink.
    pub row_sink: TargetActionSink<RowWrite>,
}

impl<D: Dialect> Shared<D> {
    fn new(name: &str, pool: D::Pool) -> Self {
        let db = Arc::new(Database::new(name, pool));
        let for_rows = Arc::clone(&db);
        let row_sink = TargetActionSink::from_async_fn(move |actions| {
            D::apply_rows(Arc::clone(&for_rows), actions)
        })
        .concurrent_calls(D::ROW_SINK_CONCURRENT_CALLS);
        let row_sink = fenced::<D, _>(row_sink);
        let for_tables = Arc::clone(&db);
        let for_children = Arc::clone(&db);
        let rows = row_sink.clone();
        let table_sink = TargetActionSink::from_async_fn_with_child_handler(
            move |actions| apply_tables(Arc::clone(&for_tables), actions),
            move |action: &TableAction| rows_of(&for_children, action, &rows),
        );
        Self {
            db,
            table_sink: fenced::<D, _>(table_sink),
            row_sink,
        }
    }
}

/// Applies a call's table actions, once the tables that must be there
/// are.
async fn apply_tables<D: Dialect>(
    db: Arc<Database<D>>,
    actions: Vec<TargetAction<TableAction>>,
) -> Result<()> {
    check_tables_exist(&db, &actions).await?;
    D::apply_tables(db, actions).await
}

/// Checks that each table declared with nothing to change (a refresh of
/// an unchanged table, or one the user owns) is still there: its rows are
/// recorded as present, so a table dropped by hand is an error saying what
/// to do, never an empty table created in its place. (A first declaration
/// has no rows recorded yet.)
async fn check_tables_exist<D: Dialect>(
    db: &Database<D>,
    actions: &[TargetAction<TableAction>],
) -> Result<()> {
    for action in actions {
        let TargetAction::Update(t) = action else {
            continue;
        };
        if t.ddl.is_empty() && !D::table_exists(db, &t.table).await? {
            return Err(Error::permanent(format!(
                "{} database {} has no table {}, though it is declared and weir tracks it (dropped by hand? a table declared as the user's is never created by weir): restore it, or delete what weir tracks of it (`weir drop`, or App::drop_state) and run again",
                D::NAME,
                db.name,
                t.table
            )));
        }
    }
    Ok(())
}

/// The sink, checking the fence of each call if the dialect does.
fn fenced<D: Dialect, A>(sink: TargetActionSink<A>) -> TargetActionSink<A> {
    if D::CHECKS_FENCE {
        sink.checks_fence()
    } else {
        sink
    }
}

/// The rows' handler of the table of `action`, built by the table sink's
/// child-handler factory. A table not declared in this run (its rows are
/// deleted by `drop_state`) is recorded from the action's schema.
fn rows_of<D: Dialect>(
    db: &Database<D>,
    action: &TableAction,
    rows: &TargetActionSink<RowWrite>,
) -> Result<ChildTargetDef> {
    let schema = action.schema.as_ref().ok_or_else(|| {
        Error::Usage(format!(
            "{} table {}: a dropped table has no rows",
            D::NAME,
            action.table
        ))
    })?;
    if db.table(&action.table).is_none() {
        let table = Table::new(&action.table, schema, ManagedBy::User)?;
        db.set_table(Arc::new(table));
    }
    Ok(ChildTargetDef::new::<Row, _>(RowHandler::<D>::new(
        &action.table,
        schema,
        rows.clone(),
    )))
}

/// The shared state of `db` for the app of `ctx`: one per app and
/// `ContextKey` name, kept by the app ([`Ctx::app_state`]) so that every
/// component's rows of that database meet in the same sinks, and two apps
/// never share them.
///
/// # Errors
/// When `db` was not provided to the app.
pub(crate) fn shared<D: Dialect>(ctx: &Ctx, db: &ContextKey<D::Pool>) -> Result<Arc<Shared<D>>> {
    let pool = ctx.get_key(db)?;
    Ok(ctx.app_state(db.name(), || Shared::new(db.name(), pool.clone())))
}
