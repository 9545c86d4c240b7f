//! The `weir` command line: arguments, logging and the subcommands.

mod chunk;
mod drop;
mod dry_run;
mod group;
mod inspect;
mod job;
mod progress;
mod records;
mod signal;
mod sync;
mod table;
mod target;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Everything went well.
pub const EXIT_OK: u8 = 0;
/// The run finished, but some files failed (they are listed).
pub const EXIT_FAILED_FILES: u8 = 1;
/// The command could not run: bad arguments, an unreachable database, a
/// locked ledger.
pub const EXIT_ERROR: u8 = 2;
/// Interrupted by Ctrl-C or SIGTERM; what finished is committed.
pub const EXIT_INTERRUPTED: u8 = 130;

/// weir keeps a database equal to a directory: one row per file in
/// `documents`, its text split into `chunks`. It writes only what changed
/// since the last sync, and deletes what disappeared.
#[derive(Debug, Parser)]
#[command(name = "weir", version)]
pub struct Cli {
    /// Log more (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Sync a directory into the database (once, or continuously with --live).
    Sync(Box<SyncArgs>),
    /// Show what the ledger tracks: target states, failed files, size.
    Inspect(InspectArgs),
    /// Sync again just the files that failed in the last sync.
    Retry(RetryArgs),
    /// Delete everything weir created in the database, and forget it.
    Drop(DropArgs),
}

/// Where the ledger lives.
#[derive(Debug, Args)]
struct LedgerArg {
    /// The ledger directory: what weir created, so that the next sync only
    /// writes what changed.
    #[arg(long, default_value = ".weir", value_name = "DIR")]
    ledger: PathBuf,
}

/// Where the rows go.
#[derive(Debug, Args)]
struct IntoArg {
    /// The database: sqlite://FILE (created if missing) or
    /// postgres://USER@HOST:PORT/DATABASE.
    #[arg(long = "into", default_value = "sqlite://weir.db", value_name = "URL")]
    into: String,
}

/// Membership of a worker group: several `weir sync` processes, on one
/// machine or many, split the work.
#[derive(Debug, Default, Args)]
pub(crate) struct GroupArg {
    /// Run as a member of the worker group NAME: processes syncing the
    /// same directory into the same PostgreSQL database with the same
    /// group split the files between them by partition, take over the
    /// files of a member that died, and never write for a partition they
    /// lost. Each member keeps its own --ledger. PostgreSQL only.
    #[arg(long, value_name = "NAME")]
    pub group: Option<String>,
    /// The partition count of a new group (an existing group must have it;
    /// default 64).
    #[arg(long, requires = "group", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub partitions: Option<u32>,
    /// The lease TTL of a new group, in seconds, decimals allowed (default
    /// 10; from 0.5 to 3600): how long a member that stopped answering
    /// keeps its partitions.
    #[arg(long, requires = "group", value_name = "SECS", value_parser = parse_lease_ttl)]
    pub lease_ttl: Option<std::time::Duration>,
    /// This member's id, unique among the group's live members (default:
    /// the host name and the process id).
    #[arg(long, requires = "group", value_name = "ID")]
    pub member_id: Option<String>,
}

/// Parses `--lease-ttl`: seconds, decimals allowed, from 0.5 to 3600.
fn parse_lease_ttl(text: &str) -> Result<std::time::Duration, String> {
    let secs: f64 = text
        .parse()
        .map_err(|_| format!("{text} is not a number of seconds"))?;
    if !(0.5..=3600.0).contains(&secs) {
        return Err(format!(
            "{text}: the lease TTL must be from 0.5 to 3600 seconds"
        ));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

#[derive(Debug, Args)]
struct SyncArgs {
    /// What to sync: a directory; a PostgreSQL table,
    /// postgres://USER@HOST:PORT/DB?table=NAME (also schema=, key=COL,COL
    /// and ordinal=COL for the incremental mode); or a NATS JetStream
    /// stream, nats://[USER:PASS@]HOST:PORT/STREAM. Items of a table or a
    /// stream become rows of the table --table (key, value, source,
    /// position).
    #[arg(value_name = "SOURCE")]
    dir: PathBuf,
    #[command(flatten)]
    into: IntoArg,
    #[command(flatten)]
    ledger: LedgerArg,
    /// Keep running: watch the directory and sync each change.
    #[arg(long)]
    live: bool,
    /// Print what a sync would do (per table: rows to create, update and
    /// delete, and tables to create, alter or drop), writing nothing: not
    /// the database, not the ledger. Once only: not with --live.
    #[arg(long, conflicts_with_all = ["live", "metrics", "group"])]
    dry_run: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (ADDR defaults to
    /// the loopback address 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:9464")]
    metrics: Option<SocketAddr>,
    /// Only sync files matching this glob (relative to DIR, e.g. "**/*.md"). Repeatable.
    #[arg(long, value_name = "GLOB")]
    include: Vec<String>,
    /// Skip files and directories matching this glob. Repeatable.
    #[arg(long, value_name = "GLOB")]
    exclude: Vec<String>,
    /// Sync files that .gitignore files exclude, too.
    #[arg(long)]
    no_gitignore: bool,
    /// In live mode, wait this long for a burst of changes to settle.
    #[arg(long, default_value_t = 200, value_name = "MS")]
    debounce_ms: u64,
    #[command(flatten)]
    group: GroupArg,
    /// Take over the tables another ledger (or worker group) manages,
    /// for when that ledger is lost for good: without it, such tables are
    /// refused. Rows the lost ledger wrote for files that are gone stay,
    /// since no ledger knows them.
    #[arg(long, conflicts_with = "dry_run")]
    adopt: bool,
    /// The table the items of a PostgreSQL or NATS source go to (default
    /// records).
    #[arg(long, value_name = "NAME")]
    table: Option<String>,
    /// The durable JetStream consumer to read with: its position is where
    /// the next sync starts.
    #[arg(long, value_name = "NAME", default_value = records::DEFAULT_CONSUMER)]
    consumer: String,
    /// A NATS credentials file (.creds) to connect with.
    #[arg(long, value_name = "FILE")]
    creds: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct InspectArgs {
    #[command(flatten)]
    ledger: LedgerArg,
    /// Show the worker group NAME instead of a ledger: its members, and
    /// each partition's owner, epoch and lease (with --into postgres://...).
    #[arg(long, value_name = "NAME", conflicts_with = "failed")]
    group: Option<String>,
    #[command(flatten)]
    into: IntoArg,
    /// List only the files that failed in the last sync: why, and how many
    /// syncs in a row they have failed.
    #[arg(long)]
    failed: bool,
}

#[derive(Debug, Args)]
struct RetryArgs {
    /// The directory that was synced.
    #[arg(default_value = ".")]
    dir: PathBuf,
    #[command(flatten)]
    into: IntoArg,
    #[command(flatten)]
    ledger: LedgerArg,
    /// Sync files that .gitignore files exclude, too (as the sync did).
    #[arg(long)]
    no_gitignore: bool,
}

#[derive(Debug, Args)]
struct DropArgs {
    #[command(flatten)]
    into: IntoArg,
    #[command(flatten)]
    ledger: LedgerArg,
    /// Remove the worker group NAME instead of what a ledger tracks: its
    /// tables and their rows, its leases, its changelog and its
    /// registration. Its members must be stopped first.
    #[arg(long, value_name = "NAME")]
    group: Option<String>,
    /// Do not ask for confirmation.
    #[arg(long)]
    yes: bool,
}

/// Logs to stderr: info by default, more with -v; RUST_LOG overrides.
pub fn init_logging(verbose: u8) {
    let default = match verbose {
        // PostgreSQL's notices ("already exists, skipping") are noise.
        0 => "info,sqlx::postgres::notice=warn",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .without_time()
        .try_init();
}

/// `weir sync`: a stream or table source, a directory's preview, or a
/// directory's sync.
async fn sync_command(args: SyncArgs) -> weir::Result<u8> {
    if let Some(source) = records::parse(&args.dir.to_string_lossy())? {
        if args.dry_run {
            return Err(weir::Error::msg(
                "--dry-run previews a directory's sync; a PostgreSQL or NATS source is not previewed",
            ));
        }
        return records::run(args, source).await;
    }
    records::check_directory_args(&args)?;
    let prepared = sync::prepare(&args).await?;
    if args.dry_run {
        return dry_run::run(&args, prepared).await;
    }
    sync::run(args, prepared).await
}

/// Runs the command; returns the process exit code.
pub async fn run(cli: Cli) -> u8 {
    let result = match cli.command {
        Command::Sync(args) => sync_command(*args).await,
        Command::Inspect(args) => inspect::run(args).await,
        Command::Retry(args) => sync::retry(args).await,
        Command::Drop(args) => drop::run(args).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_ERROR
        }
    }
}
