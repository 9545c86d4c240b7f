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
pub mod schema;
pub mod value;

pub use ident::{on_conflict_update, quote_identifier, validate_identifier};

use weir_actors::statediff::ManagedBy;

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
