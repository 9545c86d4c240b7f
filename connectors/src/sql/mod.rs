//! What the SQL connectors share: table schemas, identifiers, typed values.
//!
//! - [`schema`]: [`TableSchema`] (columns, types, nullability, composite
//!   primary key) and how two schemas differ.
//! - [`ident`]: identifier validation and quoting: names are checked once,
//!   then always quoted; values are always bound, never interpolated.
//! - [`value`]: turning any `Serialize` row (a struct, or a map of column
//!   names to values) into typed [`SqlValue`]s, rejecting what a database
//!   cannot store faithfully (NaN and infinite floats, NUL bytes in text).

pub mod ident;
pub mod schema;
pub mod value;

pub use ident::{quote_identifier, validate_identifier};
pub use schema::{Column, ColumnType, SchemaChange, TableSchema, TableSchemaBuilder};
pub use value::{Row, SqlValue};
