//! What the SQL connectors share: table schemas, identifiers, typed values.
//!
//! - [`schema`]: [`TableSchema`] (columns, types, nullability, composite
//!   primary key) and how two schemas differ.
//! - [`ident`]: identifier validation and quoting: names are checked once,
//!   then always quoted; values are always bound, never interpolated.
//! - [`value`]: turning any `Serialize` row (a struct, or a map of column
//!   names to values) into typed [`SqlValue`]s, rejecting what a database
//!   cannot store faithfully (NaN and infinite floats, NUL bytes in text)
//!   and values nested too deeply to convert safely ([`value::MAX_NESTING`]).

mod depth;
pub(crate) mod fingerprint;
mod flat;
pub mod ident;
pub(crate) mod msgpack;
pub(crate) mod owners;
pub mod schema;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) mod table;
pub mod value;

pub use ident::{quote_identifier, validate_identifier};
pub use schema::on_conflict_update;

use weir_actors::statediff::ManagedBy;
use weir_actors::{PreviewAction, StableKey};

/// What an action listed by `App::preview` does to a SQL table target
/// (see `sqlite::previewed_table` and `postgres::previewed_table`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PreviewedTable {
    /// The table itself would be created, altered or dropped (the action's
    /// kind says which). It holds the table's name as keyed (in lower case
    /// for SQLite).
    Table(String),
    /// A row of the table would be written or deleted: the action's key is
    /// the row's key. It holds the table's name as given.
    Row(String),
}

/// Which table an action of the table provider named `tables_provider`
/// (of the database keyed `db`) is about: the table itself when the
/// action is the provider's (its key is `[db, table]`), a row when it is
/// of the provider of one of `tables`' rows (a child provider is named
/// after its container: the container provider's name, `/`, the
/// container's key; `table_key` gives a table's key).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn previewed_table(
    tables_provider: &str,
    db: &str,
    tables: &[&str],
    table_key: impl Fn(&str) -> StableKey,
    action: &PreviewAction,
) -> Option<PreviewedTable> {
    if action.provider == tables_provider {
        let StableKey::Array(key) = &action.key else {
            return None;
        };
        return match &key[..] {
            [StableKey::Str(d), StableKey::Str(table)] if **d == *db => {
                Some(PreviewedTable::Table(table.to_string()))
            }
            _ => None,
        };
    }
    let rows = action
        .provider
        .strip_prefix(tables_provider)?
        .strip_prefix('/')?;
    tables
        .iter()
        .find(|table| table_key(table).to_string() == rows)
        .map(|table| PreviewedTable::Row(table.to_string()))
}

/// How a table target is declared (shared by the SQL connectors).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableOptions {
    /// Who owns the table: weir ([`ManagedBy::System`], the default: weir
    /// creates, alters and drops it) or the user ([`ManagedBy::User`]: weir
    /// only writes rows, and leaves the table and its rows in place when it
    /// is no longer declared).
    pub managed_by: ManagedBy,
}

impl TableOptions {
    /// Options with `managed_by`.
    #[must_use]
    pub fn managed_by(mut self, managed_by: ManagedBy) -> Self {
        self.managed_by = managed_by;
        self
    }
}
pub use schema::{Column, ColumnType, SchemaChange, TableSchema, TableSchemaBuilder};
pub use value::{Row, SqlValue};
