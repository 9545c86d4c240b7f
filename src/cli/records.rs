//! `weir sync SOURCE` for sources other than a directory: a PostgreSQL
//! table (`postgres://…?table=NAME`) or a NATS JetStream stream
//! (`nats://HOST:PORT/STREAM`). Each item becomes one row of a table
//! (`records` by default) with the columns `key`, `value`, `source` and
//! `position`.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use sqlx::postgres::PgPoolOptions;
use url::Url;
use weir::connectors::nats::{
    without_password, JetStreamMessage, JetStreamOptions, JetStreamSource,
};
use weir::connectors::postgres::{SourceRow, TableSource, TableSourceOptions};
use weir::connectors::sql::{ColumnType, TableSchema};
use weir::source::{ConsumeOptions, ConsumeReport, Source, SourceBatch, SourceItem};
use weir::{Ctx, Error, Result, StableKey};

use super::table::Table;
use super::target::{self, Database};
use super::{SyncArgs, EXIT_FAILED_FILES, EXIT_INTERRUPTED, EXIT_OK};

/// The version of what a record row holds. Bump it when that changes:
/// every item is then applied again (from a listing, or a replay).
const RECORDS_VERSION: u32 = 1;
/// The table of records, unless `--table` names another.
pub const DEFAULT_TABLE: &str = "records";

/// A source named on the command line, other than a directory.
#[derive(Debug)]
pub enum StreamSource {
    /// A PostgreSQL table.
    Postgres {
        /// The connection URL, without weir's query parameters.
        url: String,
        /// The table and its options.
        options: TableSourceOptions,
        /// `schema.table`, for messages.
        display: String,
    },
    /// A NATS JetStream stream.
    Nats {
        /// The server's URL (with credentials, if any).
        url: String,
        /// The stream's name.
        stream: String,
    },
}

/// The source named by `source`, when it is a URL rather than a directory.
///
/// # Errors
/// A `postgres://` URL without `table`, with an unknown parameter, or a
/// `nats://` URL without a stream.
pub fn parse(source: &str) -> Result<Option<StreamSource>> {
    if source.starts_with("postgres://") || source.starts_with("postgresql://") {
        return parse_postgres(source).map(Some);
    }
    if source.starts_with("nats://") {
        return parse_nats(source).map(Some);
    }
    Ok(None)
}

/// `postgres://…?table=NAME[&schema=S][&key=C1,C2][&ordinal=C][&notify=1]`:
/// weir's parameters are taken out; the others stay for the connection.
fn parse_postgres(source: &str) -> Result<StreamSource> {
    let mut url = Url::parse(source)
        .map_err(|e| Error::msg(format!("{} is not a URL: {e}", target::redact(source))))?;
    let mut options = SourceParams::default();
    let mut kept = Vec::new();
    for (name, value) in url.query_pairs() {
        if !options.take(&name, &value) {
            kept.push((name.into_owned(), value.into_owned()));
        }
    }
    url.set_query(None);
    if !kept.is_empty() {
        url.query_pairs_mut().extend_pairs(kept);
    }
    let Some(table) = options.table.take().filter(|t| !t.is_empty()) else {
        return Err(Error::msg(format!(
            "{}: a PostgreSQL source needs the table to read: add ?table=NAME (and optionally schema=, key=, ordinal=, notify=1)",
            target::redact(source)
        )));
    };
    Ok(StreamSource::Postgres {
        url: url.to_string(),
        display: match &options.schema {
            Some(s) => format!("{s}.{table}"),
            None => table.clone(),
        },
        options: options.into_options(table),
    })
}

/// weir's query parameters of a PostgreSQL source URL.
#[derive(Default)]
struct SourceParams {
    table: Option<String>,
    schema: Option<String>,
    key: Option<String>,
    ordinal: Option<String>,
    notify: bool,
}

impl SourceParams {
    /// Takes the parameter if it is weir's; whether it was.
    fn take(&mut self, name: &str, value: &str) -> bool {
        let value = Some(value.to_string());
        match name {
            "table" => self.table = value,
            "schema" => self.schema = value,
            "key" => self.key = value,
            "ordinal" => self.ordinal = value,
            "notify" => {
                self.notify = matches!(value.as_deref(), Some("" | "1" | "true" | "on" | "yes"))
            }
            _ => return false,
        }
        true
    }

    fn into_options(self, table: String) -> TableSourceOptions {
        let mut options = TableSourceOptions::new(table).notify(self.notify);
        if let Some(s) = self.schema {
            options = options.schema(s);
        }
        if let Some(k) = self.key {
            options = options.key(k.split(',').map(str::trim).filter(|c| !c.is_empty()));
        }
        if let Some(o) = self.ordinal {
            options = options.ordinal(o);
        }
        options
    }
}

/// `nats://[USER:PASS@]HOST:PORT/STREAM`.
fn parse_nats(source: &str) -> Result<StreamSource> {
    let bad = || {
        Error::msg(format!(
            "{}: name the JetStream stream to read: nats://HOST:PORT/STREAM",
            without_password(source)
        ))
    };
    let mut url = Url::parse(source).map_err(|_| bad())?;
    let stream: Vec<String> = url
        .path_segments()
        .into_iter()
        .flatten()
        .filter(|s| !s.is_empty())
        .map(|s| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    let [stream] = <[String; 1]>::try_from(stream).map_err(|_| bad())?;
    url.set_path("");
    Ok(StreamSource::Nats {
        url: url.to_string(),
        stream,
    })
}

/// One row of the records table.
#[derive(Serialize)]
struct Record<'a> {
    key: &'a str,
    value: &'a serde_json::Value,
    source: &'a str,
    position: Option<&'a str>,
}

fn records_schema() -> Result<TableSchema> {
    TableSchema::builder()
        .column("key", ColumnType::Text)
        .column("value", ColumnType::Json)
        .column("source", ColumnType::Text)
        .nullable_column("position", ColumnType::Text)
        .primary_key(["key"])
        .build()
}

/// What a source's payload becomes in the records table.
trait ToRecord: Send + 'static {
    /// The `key` column's text.
    fn key_text(&self, key: &StableKey) -> String;
    /// The `value` column.
    fn value(&self) -> serde_json::Value;
    /// The `position` column.
    fn position(&self, ordinal: Option<u64>) -> Option<String>;
}

impl ToRecord for SourceRow {
    fn key_text(&self, _key: &StableKey) -> String {
        self.key_text.clone()
    }
    fn value(&self) -> serde_json::Value {
        self.value.clone()
    }
    fn position(&self, _ordinal: Option<u64>) -> Option<String> {
        self.ordinal.clone()
    }
}

impl ToRecord for JetStreamMessage {
    fn key_text(&self, key: &StableKey) -> String {
        match key {
            StableKey::Str(s) => s.to_string(),
            other => other.to_string(),
        }
    }
    /// The payload as JSON; a payload that is not JSON as a JSON string.
    fn value(&self) -> serde_json::Value {
        serde_json::from_slice(&self.payload).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(&self.payload).into_owned())
        })
    }
    fn position(&self, _ordinal: Option<u64>) -> Option<String> {
        Some(self.sequence.to_string())
    }
}

/// Syncs a stream source into the records table: once up to where the
/// source stood when it started, or, with `--live`, until stopped.
pub async fn run(args: SyncArgs, source: StreamSource) -> Result<u8> {
    if let (Some(group), StreamSource::Postgres { display, .. }) = (&args.group.group, &source) {
        return Err(Error::msg(format!(
            "worker group {group}: the command splits a directory or a JetStream stream between the members of a group; PostgreSQL table {display} is synced by one process (in a program, App::consume reads a table in a worker group)"
        )));
    }
    let db = Database::parse(&args.into.into)?;
    let table = args
        .table
        .clone()
        .unwrap_or_else(|| DEFAULT_TABLE.to_string());
    if let Some(addr) = args.metrics {
        weir::metrics::install_prometheus(addr)?;
        tracing::info!("serving Prometheus metrics on http://{addr}/metrics");
    }
    let target =
        target::open_tables(&db, &args.ledger.ledger, &args.group, args.adopt, &[&table]).await?;
    let signals = tokio::spawn(super::signal::stop_on_signal(target.app.shutdown_handle()));
    let result = match source {
        StreamSource::Postgres {
            url,
            options,
            display: table_name,
        } => {
            let pool = source_pool(&url).await?;
            let options = options.follow(args.live);
            tracing::info!(
                "syncing PostgreSQL table {table_name} into {}",
                db.display()
            );
            let mut source = TableSource::connect(pool, options).await?;
            consume(&target, &mut source, &db, &table).await
        }
        StreamSource::Nats { url, stream } => {
            let mut options = JetStreamOptions::new(url, stream.clone())
                .consumer(args.consumer.clone())
                .follow(args.live);
            if let Some(creds) = &args.creds {
                options = options.creds_file(creds.clone());
            }
            tracing::info!("syncing JetStream stream {stream} into {}", db.display());
            let mut source = JetStreamSource::connect(options).await?;
            consume(&target, &mut source, &db, &table).await
        }
    };
    signals.abort();
    let interrupted = target.app.shutdown_handle().is_requested();
    target.close().await;
    let report = result?;
    Ok(summarize(&report, &db, &table, interrupted))
}

/// A small pool to read the source table with.
async fn source_pool(url: &str) -> Result<sqlx::PgPool> {
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect(url)
        .await
        .map_err(|e| {
            Error::msg(format!(
                "cannot connect to the source database {}: {e}",
                target::redact(url)
            ))
        })
}

/// Consumes `source` into the records table `table`.
async fn consume<S>(
    target: &target::Target,
    source: &mut S,
    db: &Database,
    table: &str,
) -> Result<ConsumeReport>
where
    S: Source,
    S::Payload: ToRecord,
{
    let name: Arc<str> = Arc::from(source.name());
    let db = db.clone();
    let table: Arc<str> = Arc::from(table);
    target
        .app
        .consume_reporting(
            source,
            ConsumeOptions::default(),
            move |ctx, batch| {
                let db = db.clone();
                let table = Arc::clone(&table);
                let name = Arc::clone(&name);
                async move { sync_batch(ctx, batch, &db, &table, name).await }
            },
            progress_logger(),
        )
        .await
}

/// The root of one batch's run: the table, then one component per item.
async fn sync_batch<P: ToRecord>(
    ctx: Ctx,
    batch: SourceBatch<P>,
    db: &Database,
    table: &str,
    name: Arc<str>,
) -> Result<()> {
    let records = Table::mount(&ctx, db, table, records_schema()?).await?;
    let salt = format!("{}+{RECORDS_VERSION}", records.memo_key());
    ctx.mount_source(batch.salt(salt), move |ctx, item: SourceItem<P>| {
        let records = records.clone();
        let name = Arc::clone(&name);
        async move {
            let key = item.payload.key_text(&item.key);
            let value = item.payload.value();
            let position = item.payload.position(item.ordinal);
            records.declare_row(
                &ctx,
                &Record {
                    key: &key,
                    value: &value,
                    source: &name,
                    position: position.as_deref(),
                },
            )
        }
    })
    .await
}

/// How often the totals are logged while a sync runs.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Logs the totals after a batch, at most every [`PROGRESS_EVERY`] (each
/// batch at debug level).
fn progress_logger() -> impl FnMut(&ConsumeReport) + Send {
    let mut last = std::time::Instant::now();
    move |report: &ConsumeReport| {
        let line = format!(
            "batch {}: {} items, {} acknowledged, {} retried, {} dead-lettered",
            report.batches,
            report.received + report.listed,
            report.acknowledged,
            report.retried,
            report.dead_lettered
        );
        if last.elapsed() >= PROGRESS_EVERY {
            last = std::time::Instant::now();
            tracing::info!("{line}");
        } else {
            tracing::debug!("{line}");
        }
    }
}

/// Prints what the sync did; returns the exit code.
fn summarize(report: &ConsumeReport, db: &Database, table: &str, interrupted: bool) -> u8 {
    let s = &report.stats;
    println!(
        "synced {} items into {table} of {} in {:.2}s: {} acknowledged, {} retried, {} dead-lettered; rows: {} created, {} updated, {} deleted, {} unchanged, {} skipped",
        report.received + report.listed,
        db.display(),
        s.elapsed.as_secs_f64(),
        report.acknowledged,
        report.retried,
        report.dead_lettered,
        s.created,
        s.updated,
        s.deleted,
        s.unchanged,
        s.memoized,
    );
    let failed: Vec<_> = report
        .failures
        .iter()
        .filter(|f| !f.is_root_pending())
        .collect();
    for f in failed.iter().take(MAX_FAILURES_SHOWN) {
        eprintln!(
            "failed: {}: {}",
            f.path.to_string().trim_start_matches('/'),
            f.cause
        );
    }
    if failed.len() > MAX_FAILURES_SHOWN {
        eprintln!(
            "failed: {} more (RUST_LOG=debug lists each)",
            failed.len() - MAX_FAILURES_SHOWN
        );
        for f in &failed[MAX_FAILURES_SHOWN..] {
            tracing::debug!("failed: {}: {}", f.path, f.cause);
        }
    }
    if interrupted {
        eprintln!("interrupted: what was acknowledged is committed; the rest is delivered again by the next sync");
        return EXIT_INTERRUPTED;
    }
    if failed.is_empty() && report.dead_lettered == 0 {
        EXIT_OK
    } else {
        EXIT_FAILED_FILES
    }
}

/// Options that only a stream source takes, refused with a directory.
pub fn check_directory_args(args: &SyncArgs) -> Result<()> {
    let stream_only = [
        ("--table", args.table.is_some()),
        ("--creds", args.creds.is_some()),
        ("--consumer", args.consumer != DEFAULT_CONSUMER),
    ];
    match stream_only.iter().find(|(_, set)| *set) {
        Some((flag, _)) => Err(Error::msg(format!(
            "{flag} applies to a PostgreSQL or NATS source, not to a directory ({})",
            args.dir.display()
        ))),
        None => Ok(()),
    }
}

/// The most failed items the summary lists one by one.
const MAX_FAILURES_SHOWN: usize = 20;

/// The JetStream consumer's name, unless `--consumer` names another.
pub const DEFAULT_CONSUMER: &str = "weir";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_postgres_source_url_gives_its_table_options_and_keeps_the_other_parameters() {
        let parsed = parse(
            "postgres://u@h:5432/db?table=orders&schema=shop&key=id%2Cregion&sslmode=disable",
        );
        assert!(
            matches!(&parsed, Ok(Some(StreamSource::Postgres { url, display, .. }))
                if url == "postgres://u@h:5432/db?sslmode=disable" && display == "shop.orders"),
            "{parsed:?}"
        );
    }

    #[test]
    fn a_postgres_source_url_without_a_table_is_an_error_saying_so() {
        let err = parse("postgres://u:secret@h/db")
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("?table=NAME") && !e.contains("secret")),
            "{err:?}"
        );
    }

    #[test]
    fn a_nats_source_url_names_server_and_stream() {
        let parsed = parse("nats://u:p@127.0.0.1:4222/ORDERS");
        assert!(
            matches!(&parsed, Ok(Some(StreamSource::Nats { url, stream }))
                if url == "nats://u:p@127.0.0.1:4222" && stream == "ORDERS"),
            "{parsed:?}"
        );
        assert!(parse("nats://127.0.0.1:4222").is_err());
        assert!(matches!(parse("some/dir"), Ok(None)));
    }
}
