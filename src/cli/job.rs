//! The main job: each file is one component declaring its row in
//! `documents` and its chunks in `chunks`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde::Serialize;
use tokio::sync::Semaphore;
use weir::connectors::localfs::SourceFile;
use weir::connectors::sql::{ColumnType, PreviewedTable, TableSchema};
use weir::connectors::{postgres, sqlite};
use weir::source::{Listed, Listing, SourceItem};
use weir::{Ctx, Error, Fingerprint, PreviewAction, Result, ShutdownHandle, StableKey};

use super::chunk::{chunk_text, MAX_CHUNK_BYTES};
use super::progress::Progress;
use super::table::Table;
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

/// The two tables.
#[derive(Clone)]
struct Tables {
    documents: Table,
    chunks: Table,
}

impl Tables {
    /// Declares both tables (created, or altered, at once).
    async fn mount(ctx: &Ctx, db: &Database) -> Result<Tables> {
        let documents = Table::mount(ctx, db, DOCUMENTS, documents_schema()?).await?;
        let chunks = Table::mount(ctx, db, CHUNKS, chunks_schema()?)
            .await?
            .depends_on(&documents);
        Ok(Tables { documents, chunks })
    }

    /// Changes when either table is rebuilt: files must declare again.
    fn memo_key(&self) -> String {
        format!("{}+{}", self.documents.memo_key(), self.chunks.memo_key())
    }

    fn document(&self, ctx: &Ctx, row: &Document<'_>) -> Result<()> {
        self.documents.declare_row(ctx, row)
    }

    fn chunk(&self, ctx: &Ctx, row: &Chunk<'_>) -> Result<()> {
        self.chunks.declare_row(ctx, row)
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

/// Which of the job's tables an action of a preview is about: the table
/// itself, or one of its rows. `None` for another provider's action.
pub fn previewed_table(db: &Database, action: &PreviewAction) -> Option<PreviewedTable> {
    match db {
        Database::Sqlite(_) => sqlite::previewed_table(&SQLITE.sqlite(), &TABLES, action),
        Database::Postgres(_) => postgres::previewed_table(&POSTGRES.postgres(), &TABLES, action),
    }
}

/// A row's key as the user knows it: a document by its file's path, a
/// chunk by its file's path and its index (`docs/a.md#0`).
pub fn key_text(table: &str, key: &StableKey) -> String {
    match (table, key) {
        (_, StableKey::Str(path)) => path.to_string(),
        (CHUNKS, StableKey::Array(parts)) => match &parts[..] {
            [StableKey::Str(path), StableKey::Int(index)] => format!("{path}#{index}"),
            _ => key.to_string(),
        },
        _ => key.to_string(),
    }
}

/// A file of the walk, with its fingerprint when it could be computed.
struct Walked {
    file: SourceFile,
    fingerprint: Option<Fingerprint>,
}

/// How many files are read at once: reads wait on the disk more than on
/// the processor, so twice the cores, and at least four.
fn concurrent_reads() -> usize {
    std::thread::available_parallelism()
        .map_or(4, |n| n.get() * 2)
        .max(4)
}

/// The root component: the tables, then one memoized component per file.
///
/// Files are read and fingerprinted on tokio's blocking threads, a few at
/// a time ([`concurrent_reads`]), never on the threads that run async
/// tasks: a slow file (a network mount, a named pipe put in a file's
/// place) then holds up only its own component.
pub async fn sync_files(
    ctx: Ctx,
    db: Database,
    files: Vec<SourceFile>,
    progress: Progress,
    stop: ShutdownHandle,
) -> Result<()> {
    let tables = Tables::mount(&ctx, &db).await?;
    let tables_memo: Arc<str> = Arc::from(tables.memo_key());
    let unreadable_dirs: Vec<String> = files
        .iter()
        .filter(|f| f.is_unlisted_dir())
        .map(|f| format!("{} ({})", f.key(), f.error().unwrap_or_default()))
        .collect();
    // The memo keys need the fingerprints: computed first, so that
    // computing a memo key reads nothing.
    let files = fingerprint_all(files, &progress, &stop).await?;
    let listing = Listing::new(files.into_iter().map(listed_file).collect())
        .salt(format!("{tables_memo}+{LOGIC_VERSION}"));
    let reads = Arc::new(Semaphore::new(concurrent_reads()));
    ctx.mount_source(listing, move |ctx, item: SourceItem<Walked>| {
        let tables = tables.clone();
        let progress = progress.clone();
        let reads = Arc::clone(&reads);
        async move {
            let result = sync_file(&ctx, &tables, item.payload, &reads).await;
            progress.processed(result.is_ok());
            result
        }
    })
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

/// Fingerprints the files on [`concurrent_reads`] blocking threads (a file
/// whose size and time the fingerprint cache knows is not read), until a
/// shutdown is requested: the files left then have no fingerprint, and the
/// run, interrupted, starts none of them.
async fn fingerprint_all(
    files: Vec<SourceFile>,
    progress: &Progress,
    stop: &ShutdownHandle,
) -> Result<Vec<Walked>> {
    let files: Arc<[SourceFile]> = files.into();
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..concurrent_reads().min(files.len()))
        .map(|_| {
            let files = Arc::clone(&files);
            let next = Arc::clone(&next);
            let progress = progress.clone();
            let stop = stop.clone();
            tokio::task::spawn_blocking(move || {
                let mut done = Vec::new();
                while !stop.is_requested() {
                    let at = next.fetch_add(1, Ordering::Relaxed);
                    let Some(file) = files.get(at) else {
                        break;
                    };
                    if file.error().is_none() {
                        done.push((at, file.fingerprint().ok()));
                    }
                    progress.checked();
                }
                done
            })
        })
        .collect();
    let mut fingerprints: Vec<Option<Fingerprint>> = vec![None; files.len()];
    for worker in workers {
        let done = worker
            .await
            .map_err(|e| Error::msg(format!("fingerprinting the files stopped: {e}")))?;
        for (at, fingerprint) in done {
            if let Some(slot) = fingerprints.get_mut(at) {
                *slot = fingerprint;
            }
        }
    }
    Ok(files
        .iter()
        .cloned()
        .zip(fingerprints)
        .map(|(file, fingerprint)| Walked { file, fingerprint })
        .collect())
}

/// What a file's rows hold, read from it on a blocking thread.
struct Content {
    size: u64,
    fingerprint: Fingerprint,
    /// The text of a UTF-8 file without NUL bytes, not over
    /// [`MAX_CONTENT_BYTES`].
    text: Option<String>,
    chunks: Vec<String>,
}

impl Content {
    /// Reads the file (this blocks): its bytes, or for a file over
    /// [`MAX_CONTENT_BYTES`] only its fingerprint.
    fn read(listed: &Walked) -> Result<Content> {
        let file = &listed.file;
        if file.size() > MAX_CONTENT_BYTES {
            let fingerprint = match listed.fingerprint {
                Some(fingerprint) => fingerprint,
                None => file.fingerprint()?,
            };
            return Ok(Content {
                size: file.size(),
                fingerprint,
                text: None,
                chunks: Vec::new(),
            });
        }
        let bytes = file.read()?;
        let fingerprint = Fingerprint::from_bytes(&bytes);
        let size = bytes.len() as u64;
        // Text with NUL bytes is binary in all but name.
        let text = String::from_utf8(bytes).ok().filter(|t| !t.contains('\0'));
        let chunks = text
            .as_deref()
            .map(|t| chunk_text(t, MAX_CHUNK_BYTES))
            .unwrap_or_default();
        Ok(Content {
            size,
            fingerprint,
            text,
            chunks,
        })
    }
}

/// Declares one file's document row and chunk rows, reading the file on a
/// blocking thread (one of `reads`' permits held meanwhile).
async fn sync_file(ctx: &Ctx, tables: &Tables, listed: Walked, reads: &Semaphore) -> Result<()> {
    let key = listed.file.key().to_string();
    let modified = listed.file.modified().map(rfc3339);
    let content = {
        let _permit = reads
            .acquire()
            .await
            .map_err(|e| Error::msg(format!("cannot read file `{key}`: {e}")))?;
        tokio::task::spawn_blocking(move || Content::read(&listed))
            .await
            .map_err(|e| Error::msg(format!("reading file `{key}` stopped: {e}")))??
    };
    tables.document(
        ctx,
        &Document {
            path: &key,
            size: i64::try_from(content.size).unwrap_or(i64::MAX),
            fingerprint: content.fingerprint.to_string(),
            modified,
            line_count: content
                .text
                .as_deref()
                .map(|t| i64::try_from(t.lines().count()).unwrap_or(i64::MAX)),
            content: content.text.as_deref(),
        },
    )?;
    for (i, chunk) in content.chunks.iter().enumerate() {
        tables.chunk(
            ctx,
            &Chunk {
                path: &key,
                chunk_index: i32::try_from(i).unwrap_or(i32::MAX),
                text: chunk,
            },
        )?;
    }
    Ok(())
}

/// A walked file as a listed item: its version is its fingerprint, size
/// and modification time (none when it could not be fingerprinted: it
/// then runs, and meets the problem itself).
fn listed_file(walked: Walked) -> Listed<Walked> {
    let file = &walked.file;
    let version = walked.fingerprint.map(|fingerprint| {
        let modified = file.modified().map(rfc3339).unwrap_or_default();
        format!("{fingerprint}:{}:{modified}", file.size()).into_bytes()
    });
    let key = file.key().to_string();
    Listed::new(key, version, walked)
}

fn rfc3339(t: std::time::SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use crate::cli::target::SQLITE;

    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    use std::path::Path;
    use std::sync::atomic::AtomicBool;
    use std::sync::mpsc;
    use std::time::Duration;

    use weir::connectors::localfs::{walk_dir, WalkOptions};
    use weir::App;

    /// How long the pipe's writer waits for the runtime to answer before it
    /// counts the runtime as stalled (and writes all the same, so that the
    /// test ends): only a stalled runtime ever takes this long.
    const STALL_LIMIT: Duration = Duration::from_secs(10);

    /// Serves the named pipe at `fifo` until `done`: each time a reader has
    /// it open, asks the runtime through `ask`, waits for the answer on
    /// `answered`, then writes a line and closes it. Returns how many times
    /// the runtime did not answer within [`STALL_LIMIT`].
    fn serve(
        fifo: &Path,
        done: &AtomicBool,
        ask: &tokio::sync::mpsc::UnboundedSender<()>,
        answered: &mpsc::Receiver<()>,
    ) -> usize {
        let mut stalls = 0;
        while !done.load(Ordering::SeqCst) {
            // Opening a pipe for writing without blocking succeeds only
            // while a reader has it open: the reader now waits for data.
            let opened = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(fifo);
            let Ok(mut pipe) = opened else {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            let _ = ask.send(());
            if answered.recv_timeout(STALL_LIMIT).is_err() {
                stalls += 1;
            }
            let _ = pipe.write_all(b"from the pipe\n");
        }
        stalls
    }

    #[test]
    fn a_file_read_that_blocks_leaves_the_runtime_thread_free_for_other_tasks(
    ) -> std::result::Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let tree = tmp.path().join("tree");
        std::fs::create_dir(&tree)?;
        let fifo = tree.join("slow.md");
        std::fs::write(&fifo, "a file when walked\n")?;
        let files = walk_dir(&tree, &WalkOptions::new())?;
        // Then a named pipe: opening and reading it wait for a writer.
        std::fs::remove_file(&fifo)?;
        let made = std::process::Command::new("mkfifo").arg(&fifo).status()?;
        assert!(made.success(), "mkfifo failed");

        // One thread runs every async task: a read on it stalls them all,
        // the task that answers the pipe's writer included.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (ask, mut asked) = tokio::sync::mpsc::unbounded_channel::<()>();
        let (answer, answered) = mpsc::channel::<()>();
        let done = Arc::new(AtomicBool::new(false));
        let writer = {
            let (fifo, done) = (fifo.clone(), Arc::clone(&done));
            std::thread::spawn(move || serve(&fifo, &done, &ask, &answered))
        };
        let db = tmp.path().join("out.db");
        let ledger = tmp.path().join("ledger");
        let synced = runtime.block_on(async move {
            let responder = tokio::spawn(async move {
                while asked.recv().await.is_some() {
                    let _ = answer.send(());
                }
            });
            let pool = sqlite::connect(&db).await?;
            let app = App::builder("weir")
                .ledger_path(ledger)
                .provide_key(&SQLITE.sqlite(), pool)
                .build()
                .await?;
            let stop = app.shutdown_handle();
            let database = Database::Sqlite(db);
            let progress = Progress::new(files.len() as u64);
            let stats = app
                .run(move |ctx| sync_files(ctx, database, files, progress, stop))
                .await;
            responder.abort();
            stats
        });
        done.store(true, Ordering::SeqCst);
        let stalls = writer.join().map_err(|_| "the pipe's writer panicked")?;
        let stats = synced?;
        assert_eq!(stalls, 0, "reading the pipe stalled the runtime's thread");
        assert_eq!(stats.failed_components, 0, "{stats:?}");
        Ok(())
    }
}

/// Connects to the database and opens the ledger for a directory's sync
/// (see [`open_tables`](super::target::open_tables)): the tables are [`TABLES`].
pub async fn open_target(
    into: &super::target::Database,
    ledger: &std::path::Path,
    group: &super::GroupArg,
    adopt: bool,
) -> Result<super::target::Target> {
    super::target::open_tables(into, ledger, group, adopt, &TABLES).await
}

/// Deletes what a directory's sync created in the database (its tables,
/// which take their rows with them), and forgets it.
pub async fn drop_all(target: &super::target::Target) -> Result<weir::UpdateStats> {
    let db = target.into.clone();
    target
        .app
        .drop_state(move |ctx| async move { register(&ctx, &db) })
        .await
}
