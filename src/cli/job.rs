//! The main job: each file is one component declaring its row in
//! `documents` and its chunks in `chunks`.

use std::sync::Arc;

use serde::Serialize;
use weir::connectors::localfs::SourceFile;
use weir::connectors::sql::{ColumnType, TableSchema};
use weir::connectors::{postgres, sqlite};
use weir::{Ctx, Error, Fingerprint, Result};

use super::chunk::{chunk_text, MAX_CHUNK_BYTES};
use super::progress::Progress;
use super::target::{Database, POSTGRES, SQLITE};

/// The version of what this job declares for a file. Bump it when that
/// changes (a column, the chunker): every file is then processed again.
pub const LOGIC_VERSION: u32 = 1;
/// The table of files.
pub const DOCUMENTS: &str = "documents";
/// The table of chunks of files' text.
pub const CHUNKS: &str = "chunks";
/// Every table weir creates.
pub const TABLES: [&str; 2] = [DOCUMENTS, CHUNKS];
/// Files larger than this are fingerprinted by streaming and recorded
/// without their content, line count or chunks, so that a large binary in
/// the tree costs no memory.
pub const MAX_CONTENT_BYTES: u64 = 4 * 1024 * 1024;

/// One row of `documents`.
#[derive(Serialize)]
struct Document<'a> {
    path: &'a str,
    size: i64,
    fingerprint: String,
    modified: Option<String>,
    line_count: Option<i64>,
    content: Option<&'a str>,
}

/// One row of `chunks`.
#[derive(Serialize)]
struct Chunk<'a> {
    path: &'a str,
    chunk_index: i32,
    text: &'a str,
}

fn documents_schema() -> Result<TableSchema> {
    TableSchema::builder()
        .column("path", ColumnType::Text)
        .column("size", ColumnType::BigInt)
        .column("fingerprint", ColumnType::Text)
        .nullable_column("modified", ColumnType::Timestamp)
        .nullable_column("line_count", ColumnType::BigInt)
        .nullable_column("content", ColumnType::Text)
        .primary_key(["path"])
        .build()
}

fn chunks_schema() -> Result<TableSchema> {
    TableSchema::builder()
        .column("path", ColumnType::Text)
        .column("chunk_index", ColumnType::Integer)
        .column("text", ColumnType::Text)
        .primary_key(["path", "chunk_index"])
        .build()
}

/// The two tables, in either database.
#[derive(Clone)]
enum Tables {
    Sqlite {
        documents: sqlite::TableTarget,
        chunks: sqlite::TableTarget,
    },
    Postgres {
        documents: postgres::TableTarget,
        chunks: postgres::TableTarget,
    },
}

impl Tables {
    /// Declares both tables (created, or altered, at once).
    async fn mount(ctx: &Ctx, db: &Database) -> Result<Tables> {
        Ok(match db {
            Database::Sqlite(_) => {
                let key = SQLITE.sqlite();
                let documents =
                    sqlite::mount_table_target(ctx, &key, DOCUMENTS, documents_schema()?).await?;
                let chunks = sqlite::mount_table_target(ctx, &key, CHUNKS, chunks_schema()?)
                    .await?
                    .depends_on(&documents);
                Tables::Sqlite { documents, chunks }
            }
            Database::Postgres(_) => {
                let key = POSTGRES.postgres();
                let documents =
                    postgres::mount_table_target(ctx, &key, DOCUMENTS, documents_schema()?).await?;
                let chunks = postgres::mount_table_target(ctx, &key, CHUNKS, chunks_schema()?)
                    .await?
                    .depends_on(&documents);
                Tables::Postgres { documents, chunks }
            }
        })
    }

    /// Changes when either table is rebuilt: files must declare again.
    fn memo_key(&self) -> String {
        match self {
            Tables::Sqlite { documents, chunks } => {
                format!("{}+{}", documents.memo_key(), chunks.memo_key())
            }
            Tables::Postgres { documents, chunks } => {
                format!("{}+{}", documents.memo_key(), chunks.memo_key())
            }
        }
    }

    fn document(&self, ctx: &Ctx, row: &Document<'_>) -> Result<()> {
        match self {
            Tables::Sqlite { documents, .. } => documents.declare_row(ctx, row),
            Tables::Postgres { documents, .. } => documents.declare_row(ctx, row),
        }
    }

    fn chunk(&self, ctx: &Ctx, row: &Chunk<'_>) -> Result<()> {
        match self {
            Tables::Sqlite { chunks, .. } => chunks.declare_row(ctx, row),
            Tables::Postgres { chunks, .. } => chunks.declare_row(ctx, row),
        }
    }
}

/// Registers the database's tables without declaring any, so that a drop
/// can delete them.
pub fn register(ctx: &Ctx, db: &Database) -> Result<()> {
    match db {
        Database::Sqlite(_) => sqlite::register_database(ctx, &SQLITE.sqlite()),
        Database::Postgres(_) => postgres::register_database(ctx, &POSTGRES.postgres()),
    }
}

/// The root component: the tables, then one memoized component per file.
pub async fn sync_files(
    ctx: Ctx,
    db: Database,
    files: Vec<SourceFile>,
    progress: Progress,
) -> Result<()> {
    let tables = Tables::mount(&ctx, &db).await?;
    let tables_memo: Arc<str> = Arc::from(tables.memo_key());
    let unreadable_dirs: Vec<String> = files
        .iter()
        .filter(|f| f.is_unlisted_dir())
        .map(|f| format!("{} ({})", f.key(), f.error().unwrap_or_default()))
        .collect();
    let checked = progress.clone();
    ctx.mount_each_memo(
        files,
        |file| file.key().to_string(),
        move |file: &SourceFile| {
            checked.checked();
            let modified = file.modified().map(rfc3339);
            Ok((
                file.fingerprint()?,
                file.size(),
                modified,
                LOGIC_VERSION,
                tables_memo.to_string(),
            ))
        },
        move |ctx, file| {
            let tables = tables.clone();
            let progress = progress.clone();
            async move {
                let result = sync_file(&ctx, &tables, &file);
                progress.processed(result.is_ok());
                result
            }
        },
    )
    .await?;
    if unreadable_dirs.is_empty() {
        return Ok(());
    }
    // The files under a directory that cannot be listed are not seen, and
    // would be taken for deleted: failing here keeps every file this run
    // did not see (the files it did see are committed all the same).
    Err(Error::msg(format!(
        "{} could not be read: {}; files that disappeared are not deleted until it can be, so that nothing under it is lost (fix its permissions, or leave it out with --exclude)",
        if unreadable_dirs.len() == 1 {
            "a directory"
        } else {
            "directories"
        },
        unreadable_dirs.join(", ")
    )))
}

/// Declares one file's document row and chunk rows.
fn sync_file(ctx: &Ctx, tables: &Tables, file: &SourceFile) -> Result<()> {
    if file.size() > MAX_CONTENT_BYTES {
        return tables.document(
            ctx,
            &Document {
                path: file.key(),
                size: i64::try_from(file.size()).unwrap_or(i64::MAX),
                fingerprint: file.fingerprint()?.to_string(),
                modified: file.modified().map(rfc3339),
                line_count: None,
                content: None,
            },
        );
    }
    let bytes = file.read()?;
    // Text with NUL bytes is binary in all but name.
    let text = std::str::from_utf8(&bytes)
        .ok()
        .filter(|t| !t.contains('\0'));
    tables.document(
        ctx,
        &Document {
            path: file.key(),
            size: i64::try_from(bytes.len()).unwrap_or(i64::MAX),
            fingerprint: Fingerprint::from_bytes(&bytes).to_string(),
            modified: file.modified().map(rfc3339),
            line_count: text.map(|t| i64::try_from(t.lines().count()).unwrap_or(i64::MAX)),
            content: text,
        },
    )?;
    if let Some(text) = text {
        for (i, chunk) in chunk_text(text, MAX_CHUNK_BYTES).iter().enumerate() {
            tables.chunk(
                ctx,
                &Chunk {
                    path: file.key(),
                    chunk_index: i32::try_from(i).unwrap_or(i32::MAX),
                    text: chunk,
                },
            )?;
        }
    }
    Ok(())
}

fn rfc3339(t: std::time::SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}
