//! Declaring tables and rows: what each dialect's `TableTarget`,
//! `mount_table_target` and `declare_table_target` do.

use std::sync::Arc;

use serde::Serialize;
use weir_actors::{
    declare_target_state, declare_target_state_with_child, mount_target,
    register_root_target_states_provider, ContextKey, Ctx, Error, PreviewAction, Result, StableKey,
    TargetState, TargetStateProvider,
};

use super::dialect::{Dialect, Table};
use super::handler::{TableHandler, TableSpec};
use super::sinks::{shared, Shared};
use crate::sql::{validate_identifier, PreviewedTable, Row, TableOptions, TableSchema};

/// A declared table, to declare rows into: what each dialect's
/// `TableTarget` holds.
pub(crate) struct TableTarget<D: Dialect> {
    /// Its name and schema, as the row sink knows them.
    table: Arc<Table<D>>,
    shared: Arc<Shared<D>>,
    rows: TargetStateProvider<Row>,
}

impl<D: Dialect> Clone for TableTarget<D> {
    fn clone(&self) -> Self {
        Self {
            table: Arc::clone(&self.table),
            shared: Arc::clone(&self.shared),
            rows: self.rows.clone(),
        }
    }
}

impl<D: Dialect> std::fmt::Debug for TableTarget<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableTarget")
            .field("dialect", &D::NAME)
            .field("db", &self.shared.db.name)
            .field("table", &self.table.name)
            .field("rank", &self.table.rank())
            .finish()
    }
}

/// The key of the table `table` of the database named `db`.
fn table_key<D: Dialect>(db: &str, table: &str) -> StableKey {
    StableKey::Array(Arc::from([
        StableKey::Str(Arc::from(db)),
        StableKey::Str(Arc::from(D::key_name(table).as_ref())),
    ]))
}

/// Which table of `db` an action listed by `App::preview` is about.
pub(crate) fn previewed_table<D: Dialect>(
    db: &ContextKey<D::Pool>,
    tables: &[&str],
    action: &PreviewAction,
) -> Option<PreviewedTable> {
    crate::sql::previewed_table(
        &D::tables_provider_name(db.name()),
        db.name(),
        tables,
        |table| table_key::<D>(db.name(), table),
        action,
    )
}

/// Registers the root provider of the tables of `db` for this run.
///
/// # Errors
/// When `db` was not provided to the app.
pub(crate) fn register_database<D: Dialect>(
    ctx: &Ctx,
    db: &ContextKey<D::Pool>,
) -> Result<(Arc<Shared<D>>, TargetStateProvider<TableSpec>)> {
    let shared = shared::<D>(ctx, db)?;
    let provider = register_root_target_states_provider(
        ctx,
        &D::tables_provider_name(db.name()),
        TableHandler::<D>::new(shared.table_sink.clone(), ctx.owner()?),
    )?;
    Ok((shared, provider))
}

/// A table checked and recorded in its database, with the database's
/// sinks: a [`TableTarget`] once its rows' provider is there.
struct Prepared<D: Dialect> {
    table: Arc<Table<D>>,
    shared: Arc<Shared<D>>,
}

impl<D: Dialect> Prepared<D> {
    fn with_rows(self, rows: TargetStateProvider<Row>) -> TableTarget<D> {
        TableTarget {
            table: self.table,
            shared: self.shared,
            rows,
        }
    }
}

/// Checks a table and records it in its database; returns it with its
/// target state, to declare or mount.
fn prepare<D: Dialect>(
    ctx: &Ctx,
    db: &ContextKey<D::Pool>,
    name: &str,
    schema: TableSchema,
    options: TableOptions,
) -> Result<(Prepared<D>, TargetState<TableSpec>)> {
    validate_identifier("table", name)?;
    // A schema can be deserialized without its builder: check it again.
    for column in schema.columns() {
        validate_identifier("column", &column.name)?;
    }
    D::check_table(name, &schema)?;
    let (shared, provider) = register_database::<D>(ctx, db)?;
    let table = Arc::new(Table::new(name, &schema, options.managed_by)?);
    shared.db.set_table(Arc::clone(&table));
    let state = provider.target_state(
        table_key::<D>(db.name(), name),
        TableSpec {
            table: name.to_string(),
            schema,
            managed_by: options.managed_by,
            adopt: ctx.adopts_tables(),
        },
    );
    Ok((Prepared { table, shared }, state))
}

/// Declares the table `name` of `db` and commits it at once.
///
/// # Errors
/// When a name is not an identifier, the dialect refuses the table, `db`
/// was not provided, or the table could not be created or altered.
pub(crate) async fn mount<D: Dialect>(
    ctx: &Ctx,
    db: &ContextKey<D::Pool>,
    name: &str,
    schema: TableSchema,
    options: TableOptions,
) -> Result<TableTarget<D>> {
    let (prepared, state) = prepare::<D>(ctx, db, name, schema, options)?;
    let rows = mount_target::<TableSpec, Row>(ctx, state).await?;
    Ok(prepared.with_rows(rows))
}

/// Declares the table `name` of `db` in the current component.
///
/// # Errors
/// When a name is not an identifier, the dialect refuses the table, or
/// `db` was not provided.
pub(crate) fn declare<D: Dialect>(
    ctx: &Ctx,
    db: &ContextKey<D::Pool>,
    name: &str,
    schema: TableSchema,
    options: TableOptions,
) -> Result<TableTarget<D>> {
    let (prepared, state) = prepare::<D>(ctx, db, name, schema, options)?;
    let rows = declare_target_state_with_child::<TableSpec, Row>(ctx, state)?;
    Ok(prepared.with_rows(rows))
}

impl<D: Dialect> TableTarget<D> {
    /// Declares a row (see each dialect's `TableTarget::declare_row`).
    ///
    /// # Errors
    /// When the row does not fit the schema, naming the table, the column
    /// and the row's key (it also fails the component); or when the row is
    /// declared twice in the run.
    pub(crate) fn declare_row<R: Serialize>(&self, ctx: &Ctx, row: R) -> Result<()> {
        let row = &row;
        let (name, schema) = (&self.table.name, &self.table.schema);
        let converted = Row::from_serialize(name, schema, row).map_err(|e| {
            let key = self
                .key_of(row)
                .map_or_else(|| "unknown (bad key)".to_string(), |k| k.to_string());
            let err = Error::permanent(format!("{e} (row key {key})"));
            ctx.fail_component(&err);
            err
        })?;
        let key = self.table.row_key(&converted.values, false);
        declare_target_state(ctx, self.rows.target_state_exact(key, converted))
    }

    /// The key of a row that does not convert, when its key columns do.
    fn key_of<R: Serialize>(&self, row: &R) -> Option<StableKey> {
        let schema = &self.table.schema;
        let key_schema = schema
            .primary_key()
            .iter()
            .filter_map(|k| schema.column(k))
            .fold(TableSchema::builder(), |b, c| {
                b.column(&c.name, c.ty.clone())
            })
            .primary_key(schema.primary_key())
            .build()
            .ok()?;
        Row::from_serialize(&self.table.name, &key_schema, row)
            .ok()
            .map(|r| r.key(&key_schema))
    }

    /// Says that this table's rows refer to `parent`'s: within each
    /// transaction, `parent`'s rows are written first and deleted last.
    /// Tables of different databases share no transaction: then nothing.
    #[must_use]
    pub(crate) fn depends_on(self, parent: &TableTarget<D>) -> TableTarget<D> {
        if Arc::ptr_eq(&self.shared, &parent.shared) {
            let rank = parent.table.rank().saturating_add(1);
            self.table
                .rank
                .fetch_max(rank, std::sync::atomic::Ordering::Relaxed);
            // Rows of one call could refer to rows of another call still
            // running: from now on, one call at a time.
            self.shared.row_sink.clone().concurrent_calls(1);
        }
        self
    }

    /// The table's name.
    pub(crate) fn name(&self) -> &str {
        &self.table.name
    }

    /// The table's memo key (see each dialect's `TableTarget::memo_key`).
    pub(crate) fn memo_key(&self) -> String {
        self.rows.memo_key()
    }

    /// The table's schema.
    pub(crate) fn schema(&self) -> &TableSchema {
        &self.table.schema
    }
}
