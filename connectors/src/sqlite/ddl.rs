//! The SQL text this connector sends: table DDL, multi-row upserts and
//! deletes. Names are validated when a table is declared and always quoted
//! here; values are always bound (`?`), never interpolated.

use super::types::sql_type;
use crate::sql::{quote_identifier, Column, TableSchema};

/// SQLite's bound-variable limit (`SQLITE_MAX_VARIABLE_NUMBER`, 32766 since
/// SQLite 3.32; the bundled SQLite is newer).
pub(crate) const MAX_BIND_VARIABLES: usize = 32_766;

/// The most rows in one `INSERT` or `DELETE` statement, whatever the width.
pub(crate) const MAX_ROWS_PER_STATEMENT: usize = 1_000;

/// How many rows of `width` bound values fit in one statement.
pub(crate) fn rows_per_statement(width: usize) -> usize {
    (MAX_BIND_VARIABLES / width.max(1)).clamp(1, MAX_ROWS_PER_STATEMENT)
}

/// A column's definition in `CREATE TABLE` (without the primary key clause).
fn column_def(column: &Column) -> String {
    let mut def = format!(
        "{} {}",
        quote_identifier(&column.name),
        sql_type(&column.ty)
    );
    if !column.nullable {
        def.push_str(" NOT NULL");
    }
    def
}

/// `CREATE TABLE IF NOT EXISTS` for `schema`.
pub(crate) fn create_table(table: &str, schema: &TableSchema) -> String {
    let mut parts: Vec<String> = schema.columns().iter().map(column_def).collect();
    parts.push(format!(
        "PRIMARY KEY ({})",
        column_list(schema.primary_key())
    ));
    format!(
        "CREATE TABLE IF NOT EXISTS {} ({})",
        quote_identifier(table),
        parts.join(", ")
    )
}

/// `DROP TABLE IF EXISTS`.
pub(crate) fn drop_table(table: &str) -> String {
    format!("DROP TABLE IF EXISTS {}", quote_identifier(table))
}

/// `ALTER TABLE .. ADD COLUMN`. SQLite refuses a NOT NULL column without a
/// default, so one gets its type's zero value as default; the rows are
/// written again anyway (the change is `Lossy`).
pub(crate) fn add_column(table: &str, column: &Column) -> String {
    let mut sql = format!(
        "ALTER TABLE {} ADD COLUMN {}",
        quote_identifier(table),
        column_def(column)
    );
    if !column.nullable {
        sql.push_str(match sql_type(&column.ty) {
            "INTEGER" | "REAL" => " DEFAULT 0",
            "BLOB" => " DEFAULT X''",
            _ => " DEFAULT ''",
        });
    }
    sql
}

/// `ALTER TABLE .. DROP COLUMN` (SQLite 3.35+).
pub(crate) fn drop_column(table: &str, column: &str) -> String {
    format!(
        "ALTER TABLE {} DROP COLUMN {}",
        quote_identifier(table),
        quote_identifier(column)
    )
}

/// `PRAGMA table_info` of a table: its columns as they are.
pub(crate) fn table_info(table: &str) -> String {
    format!("PRAGMA table_info({})", quote_identifier(table))
}

fn column_list<S: AsRef<str>>(names: &[S]) -> String {
    names
        .iter()
        .map(|n| quote_identifier(n.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `(?, ?, ..)` repeated `rows` times, comma-separated.
fn placeholders(rows: usize, width: usize) -> String {
    let mut tuple = String::with_capacity(width * 3 + 2);
    tuple.push('(');
    for i in 0..width {
        if i > 0 {
            tuple.push_str(", ");
        }
        tuple.push('?');
    }
    tuple.push(')');
    let mut out = String::with_capacity(rows * (tuple.len() + 2));
    for i in 0..rows {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&tuple);
    }
    out
}

/// A multi-row upsert of `rows` full rows: `INSERT .. VALUES (..), (..)
/// ON CONFLICT (pk) DO UPDATE SET` every other column (`DO NOTHING` when
/// every column is in the key).
pub(crate) fn upsert(table: &str, schema: &TableSchema, rows: usize) -> String {
    let names: Vec<&str> = schema.columns().iter().map(|c| c.name.as_str()).collect();
    let on_conflict = crate::sql::on_conflict_update(schema, "excluded");
    format!(
        "INSERT INTO {} ({}) VALUES {} ON CONFLICT ({}) {}",
        quote_identifier(table),
        column_list(&names),
        placeholders(rows, names.len()),
        column_list(schema.primary_key()),
        on_conflict
    )
}

/// A multi-row delete by primary key: `DELETE .. WHERE pk IN (?, ..)`, or
/// `WHERE (a, b) IN (VALUES (?, ?), ..)` for a composite key.
pub(crate) fn delete(table: &str, schema: &TableSchema, rows: usize) -> String {
    let key = schema.primary_key();
    if let [single] = key {
        let list = vec!["?"; rows].join(", ");
        return format!(
            "DELETE FROM {} WHERE {} IN ({list})",
            quote_identifier(table),
            quote_identifier(single)
        );
    }
    format!(
        "DELETE FROM {} WHERE ({}) IN (VALUES {})",
        quote_identifier(table),
        column_list(key),
        placeholders(rows, key.len())
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::ColumnType;
    use weir_actors::Result;

    fn schema() -> Result<TableSchema> {
        TableSchema::builder()
            .column("id", ColumnType::Text)
            .column("n", ColumnType::BigInt)
            .nullable_column("body", ColumnType::Json)
            .primary_key(["id", "n"])
            .build()
    }

    #[test]
    fn create_table_quotes_names_and_lists_the_key() -> Result<()> {
        assert_eq!(
            create_table("docs", &schema()?),
            "CREATE TABLE IF NOT EXISTS \"docs\" (\"id\" TEXT NOT NULL, \"n\" INTEGER NOT NULL, \
             \"body\" TEXT, PRIMARY KEY (\"id\", \"n\"))"
        );
        Ok(())
    }

    #[test]
    fn upsert_binds_every_value_and_updates_the_non_key_columns() -> Result<()> {
        let sql = upsert("docs", &schema()?, 2);
        assert_eq!(
            sql,
            "INSERT INTO \"docs\" (\"id\", \"n\", \"body\") VALUES (?, ?, ?), (?, ?, ?) \
             ON CONFLICT (\"id\", \"n\") DO UPDATE SET \"body\" = excluded.\"body\""
        );
        Ok(())
    }

    #[test]
    fn deletes_use_row_values_for_composite_keys() -> Result<()> {
        assert_eq!(
            delete("docs", &schema()?, 2),
            "DELETE FROM \"docs\" WHERE (\"id\", \"n\") IN (VALUES (?, ?), (?, ?))"
        );
        Ok(())
    }

    #[test]
    fn statements_stay_under_the_bind_limit() {
        assert_eq!(rows_per_statement(3), MAX_ROWS_PER_STATEMENT);
        assert_eq!(rows_per_statement(100), 327);
        assert!(rows_per_statement(40_000) >= 1);
    }
}
