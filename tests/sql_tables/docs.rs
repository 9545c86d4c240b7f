//! The rows most SQL table tests write: documents keyed by `id`, with a
//! title and a nullable number.

use serde::Serialize;
use weir::connectors::sql::{ColumnType, TableSchema};
use weir::Result;

/// A document row.
#[derive(Clone, Debug, Serialize)]
pub struct Doc {
    pub id: String,
    pub title: String,
    pub n: Option<i64>,
}

/// The document `id`.
pub fn doc(id: &str, title: &str, n: Option<i64>) -> Doc {
    Doc {
        id: id.into(),
        title: title.into(),
        n,
    }
}

/// The documents' table: `id` (the key), `title`, nullable `n`.
pub fn docs_schema() -> Result<TableSchema> {
    TableSchema::builder()
        .column("id", ColumnType::Text)
        .column("title", ColumnType::Text)
        .nullable_column("n", ColumnType::BigInt)
        .primary_key(["id"])
        .build()
}
