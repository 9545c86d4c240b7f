//! The table of documents the PostgreSQL benchmarks write: an id, a title,
//! a body, a score and a version.

use weir::connectors::sql::{ColumnType, TableSchema};
use weir::Result;

/// The documents table's schema, keyed by `id`.
pub fn schema() -> Result<TableSchema> {
    TableSchema::builder()
        .column("id", ColumnType::BigInt)
        .column("title", ColumnType::Text)
        .column("body", ColumnType::Text)
        .column("score", ColumnType::Double)
        .column("version", ColumnType::BigInt)
        .primary_key(["id"])
        .build()
}
