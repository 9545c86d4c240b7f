//! Scaling a worker group out: the throughput of two members against one,
//! and the time a member takes over a killed member's partitions.
//!
//! `cargo bench --bench scale_out` runs a CPU-bound job (each item a
//! component that hashes 16 KiB with blake3 `WEIR_BENCH_ROUNDS` times,
//! default 800, and writes one row to PostgreSQL) as a worker group of 16
//! partitions, lease TTL 2 s, with real member processes: this binary run
//! again with `WEIR_BENCH_MEMBER` set (see [`member`]). Each member is
//! pinned to one core (`taskset -c N`), runs a one-thread tokio runtime
//! and one reconciler shard, and has a ledger of its own. Components hash
//! on a blocking thread, one at a time: the member's one runtime thread
//! then stays free for the heartbeat (hashing on it, a member lost its
//! lease mid-sync).
//!
//! - **one / two members**: `WEIR_BENCH_ITEMS` items (default 1 600),
//!   synced from scratch by one member, and by two started together (the
//!   order alternates between repeats), each a one-shot sync: a member
//!   runs passes until every partition completed one begun after it
//!   joined. The time is from the first run's start to the first moment a
//!   member saw the group synced (each member's own clock, read with
//!   `SystemTime`); the processes' wall time (start, join delay, leave
//!   included) is printed beside it. Ratio = one member's time / two
//!   members' time (throughput of two over one). Goal: 1.7 or more.
//!   Before each, the same hashing without weir, in one process and in
//!   two (each pinned, half the items each), gives what the machine
//!   itself scales to. Each run prints the members' runs, when they
//!   joined, how far apart their first runs started, their items and
//!   partitions, and the CPU time of the members, PostgreSQL and other
//!   processes.
//! - **takeover**: two members run passes every third of the TTL (as a
//!   live `weir sync --group` does) over 64 items and one "pulse" row per
//!   partition that each pass rewrites with its member's id. Once the
//!   group is settled, the member holding the root partition is killed
//!   (SIGKILL) at a random point of its heartbeat period; the time is from
//!   the kill to the first poll of PostgreSQL (every 10 ms) that finds
//!   every partition it held owned by the survivor, with a pass completed
//!   that began after the kill (`weir.partition_pass`) and every pulse row
//!   of its data partitions rewritten by the survivor. Goal: lease TTL +
//!   1 s or less.
//!
//! `WEIR_BENCH_JOIN_DELAY_MS` sets the join delay (default 1000, weir's
//! default); `WEIR_BENCH_PENDING_WAIT_MS` how long a member waits after a
//! run that waited for the root partition's holder (default 50). Before
//! each measurement the bench waits (up to a minute) for other processes
//! to leave the cores idle, and notes it when they do not.
//!
//! Everything repeats `WEIR_BENCH_REPEAT` times (default 3); the table at
//! the end gives medians (ratios: the median of each repeat's ratio).
//! Missed goals print `GOAL ... MISSED` and do not fail the bench; errors
//! do. It creates a scratch database (`weir_bench_scale_out_<pid>`) on
//! `WEIR_TEST_POSTGRES_URL`, else `postgres://postgres@127.0.0.1:5432/test`,
//! else `postgres://root@127.0.0.1:5432/test`, and drops it at the end;
//! without a server it prints `SKIPPED` and exits successfully. It needs
//! two cores and `taskset`.

#[path = "shared/median.rs"]
mod median;

#[cfg(not(feature = "bench-system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use median::median;
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use weir::connectors::postgres::{self, PostgresCoordinator};
use weir::connectors::sql::{ColumnType, TableSchema};
use weir::group::{Coordinator, WorkerGroup};
use weir::prelude::*;
use weir::Owner;

/// Data partitions of every group.
const PARTITIONS: u32 = 16;
/// The lease TTL of every group.
const LEASE_TTL: Duration = Duration::from_secs(2);
/// How long a one-shot member waits between passes while others finish
/// theirs (as `weir sync --group`).
const PASS_WAIT: Duration = Duration::from_millis(500);
/// Items of the takeover workload.
const TAKEOVER_ITEMS: u64 = 64;
/// The longest a member process lives, whatever happens to the bench.
const MEMBER_LIFETIME: Duration = Duration::from_secs(600);
/// How often the bench reads PostgreSQL while it waits for a takeover.
const TAKEOVER_POLL: Duration = Duration::from_millis(10);
/// The bytes hashed per round of an item's work.
const BLOCK: usize = 16 * 1024;

// ------------------------------------------------------------ the workload

/// An item's work: `rounds` blake3 hashes of a 16 KiB block, each round's
/// digest written into the block for the next. Returns the last digest.
fn work(item: u64, rounds: u32) -> blake3::Hash {
    let mut block = vec![0u8; BLOCK];
    for (i, b) in block.iter_mut().enumerate() {
        *b = (i as u64).wrapping_mul(31).wrapping_add(item) as u8;
    }
    let mut hash = blake3::hash(&block);
    for _ in 0..rounds {
        if let Some(head) = block.get_mut(..32) {
            head.copy_from_slice(hash.as_bytes());
        }
        hash = blake3::hash(&block);
    }
    hash
}

fn item_key(item: u64) -> String {
    format!("item-{item:05}")
}

#[derive(Serialize)]
struct ItemRow {
    id: String,
    partition: i32,
    digest: String,
    writer: String,
}

#[derive(Serialize)]
struct PulseRow {
    id: String,
    partition: i32,
    writer: String,
    run: i64,
}

fn items_schema() -> Result<TableSchema> {
    TableSchema::builder()
        .column("id", ColumnType::Text)
        .column("partition", ColumnType::Integer)
        .column("digest", ColumnType::Text)
        .column("writer", ColumnType::Text)
        .primary_key(["id"])
        .build()
}

fn pulse_schema() -> Result<TableSchema> {
    TableSchema::builder()
        .column("id", ColumnType::Text)
        .column("partition", ColumnType::Integer)
        .column("writer", ColumnType::Text)
        .column("run", ColumnType::BigInt)
        .primary_key(["id"])
        .build()
}

fn partition_of(key: &str) -> i32 {
    let n = weir::group::partition_of(&key.to_string().into_stable_key(), PARTITIONS);
    i32::try_from(n).unwrap_or(-2)
}

/// One root-level key per data partition, for the pulse rows: the first
/// `pulse-N` that falls in each.
fn pulse_keys() -> Vec<(String, i32)> {
    let mut found: BTreeMap<i32, String> = BTreeMap::new();
    let mut n = 0u64;
    while found.len() < PARTITIONS as usize && n < 100_000 {
        let key = format!("pulse-{n}");
        found.entry(partition_of(&key)).or_insert(key);
        n += 1;
    }
    found.into_iter().map(|(p, k)| (k, p)).collect()
}

fn db() -> ContextKey<PgPool> {
    ContextKey::new("pg")
}

/// The CPU time this process used, user and system, in seconds (from
/// `/proc/self/stat`, at 100 ticks a second).
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    // Fields 14 and 15 (utime, stime); the text after the name starts at
    // field 3.
    let fields: Vec<f64> = after_name
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse().ok())
        .collect();
    fields.iter().sum::<f64>() / 100.0
}

/// The CPU time all cores spent busy since boot, in seconds (`/proc/stat`:
/// everything but idle and iowait).
fn machine_busy_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return f64::NAN;
    };
    let ticks: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|f| f.parse().ok())
        .collect();
    let idle: f64 = ticks.get(3..5).map_or(0.0, |t| t.iter().sum());
    (ticks.iter().sum::<f64>() - idle) / 100.0
}

/// The CPU time PostgreSQL's processes used, in seconds: each live one's,
/// plus what the postmaster reaped of its ended backends.
fn postgres_cpu_secs() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return f64::NAN;
    };
    let mut ticks = 0.0;
    for entry in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if !head.ends_with("(postgres") {
            continue;
        }
        // utime, stime, cutime, cstime: fields 14 to 17.
        ticks += rest
            .split_whitespace()
            .skip(11)
            .take(4)
            .filter_map(|f| f.parse::<f64>().ok())
            .sum::<f64>();
    }
    ticks / 100.0
}

/// Waits (at most `limit`) until the machine is quiet: other processes
/// using less than a tenth of a core over half a second. Returns the cores
/// they used in the last half second.
async fn wait_quiet(limit: Duration) -> f64 {
    let deadline = Instant::now() + limit;
    loop {
        let before = machine_busy_secs();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let cores = (machine_busy_secs() - before) / 0.5;
        if cores < 0.1 || Instant::now() > deadline {
            return cores;
        }
    }
}

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

// ------------------------------------------------------------ a member

/// What a member process is told, as JSON in `WEIR_BENCH_MEMBER`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct MemberConfig {
    id: String,
    url: String,
    group: String,
    ledger: PathBuf,
    table: String,
    /// The pulse table: set for a member that runs passes until `stop`
    /// exists (the takeover); unset for a one-shot member.
    pulse_table: Option<String>,
    stop: PathBuf,
    items: u64,
    rounds: u32,
    /// How long to wait after a run that waited for the root holder.
    pending_wait_ms: u64,
    join_delay_ms: u64,
}

/// A member: joins, runs passes, prints `EVENT` lines on stdout, leaves.
///
/// - `EVENT start <ns>` as it starts;
/// - `EVENT joined <ns>` once the App is built (joined, join delay over);
/// - `EVENT run <start ns> <end ns> <ok|pending> <data partitions held>
///   <components run> <memoized>` per run;
/// - `EVENT synced <ns>` when a one-shot member sees the group synced;
/// - `EVENT done <partitions synced>` and `EVENT cpu <secs>` before it
///   exits.
fn member(config: MemberConfig) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let born = Instant::now();
        println!("EVENT start {}", now_ns());
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(10))
            .connect(&config.url)
            .await
            .map_err(|e| Error::msg(format!("member {}: {e}", config.id)))?;
        let coordinator = Arc::new(PostgresCoordinator::new(pool.clone()));
        let group = WorkerGroup::new(config.group.as_str(), coordinator)
            .partitions(PARTITIONS)
            .lease_ttl(LEASE_TTL)
            .join_delay(Duration::from_millis(config.join_delay_ms))
            .member_id(config.id.as_str());
        let app = App::builder("scale-out")
            .ledger_path(&config.ledger)
            .provide_key(&db(), pool.clone())
            .shards(1)
            .worker_group(group)
            .build()
            .await?;
        println!("EVENT joined {}", now_ns());
        let wait = if config.pulse_table.is_some() {
            // A live member's tick (`weir sync --group --live`).
            LEASE_TTL / 3
        } else {
            PASS_WAIT
        };
        // The hashing runs on a blocking thread, one item at a time (the
        // member has one core): on the runtime's one thread, each ready
        // component's 3 ms of hashing would run before the heartbeat's
        // next step, and the member lost its lease (see PERFORMANCE.md).
        let cpu = Arc::new(tokio::sync::Semaphore::new(1));
        let mut run_no = 0i64;
        loop {
            run_no += 1;
            let start = now_ns();
            let outcome = run_once(&app, &config, &cpu, run_no).await;
            let end = now_ns();
            let held = app
                .group_status()
                .await?
                .map(|s| {
                    s.partition_states
                        .iter()
                        .filter(|p| p.owner.as_deref() == Some(config.id.as_str()))
                        .map(|p| p.partition.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "-".to_string());
            let (state, ran, memoized) = match outcome {
                Ok(stats) => ("ok", stats.components, stats.memoized),
                Err(e) if e.is_root_pending() => ("pending", 0, 0),
                Err(e) => return Err(e),
            };
            println!("EVENT run {start} {end} {state} {held} {ran} {memoized}");
            let wait = if state == "pending" {
                Duration::from_millis(config.pending_wait_ms)
            } else {
                wait
            };
            if config.pulse_table.is_none() && app.group_synced().await? {
                println!("EVENT synced {}", now_ns());
                break;
            }
            if config.stop.exists() || born.elapsed() > MEMBER_LIFETIME {
                break;
            }
            tokio::time::sleep(wait).await;
        }
        let synced: Vec<String> = app.synced_partitions().iter().map(u32::to_string).collect();
        app.leave_group().await?;
        println!("EVENT done {}", synced.join(","));
        println!("EVENT cpu {:.3}", cpu_secs());
        pool.close().await;
        Ok(())
    })
}

/// One run: the tables, one memoized component per item, and (for a
/// member that runs until stopped) one pulse component per partition.
async fn run_once(
    app: &App,
    config: &MemberConfig,
    cpu: &Arc<tokio::sync::Semaphore>,
    run_no: i64,
) -> Result<UpdateStats> {
    let (config, cpu) = (config.clone(), Arc::clone(cpu));
    app.run(move |ctx| async move {
        let items =
            postgres::mount_table_target(&ctx, &db(), &config.table, items_schema()?).await?;
        let pulses = match &config.pulse_table {
            Some(table) => {
                Some(postgres::mount_table_target(&ctx, &db(), table, pulse_schema()?).await?)
            }
            None => None,
        };
        let memo = items.memo_key();
        let (rounds, writer) = (config.rounds, config.id.clone());
        ctx.mount_each_memo(
            0..config.items,
            |i| item_key(*i),
            move |i| Ok((*i, rounds, memo.clone())),
            move |ctx, i| {
                let (items, writer, cpu) = (items.clone(), writer.clone(), Arc::clone(&cpu));
                async move {
                    let permit = cpu
                        .acquire_owned()
                        .await
                        .map_err(|e| Error::msg(format!("the hashing semaphore: {e}")))?;
                    let digest = tokio::task::spawn_blocking(move || {
                        let digest = work(i, rounds);
                        drop(permit);
                        digest
                    })
                    .await
                    .map_err(|e| Error::msg(format!("hashing item {i} stopped: {e}")))?;
                    let id = item_key(i);
                    let row = ItemRow {
                        partition: partition_of(&id),
                        digest: digest.to_hex().to_string(),
                        writer,
                        id,
                    };
                    items.declare_row(&ctx, &row)
                }
            },
        )
        .await?;
        if let Some(pulses) = pulses {
            let writer = config.id.clone();
            ctx.mount_each(
                pulse_keys(),
                |(key, _)| key.clone(),
                move |ctx, (id, partition)| {
                    let (pulses, writer) = (pulses.clone(), writer.clone());
                    async move {
                        let row = PulseRow {
                            id,
                            partition,
                            writer,
                            run: run_no,
                        };
                        pulses.declare_row(&ctx, &row)
                    }
                },
            )
            .await?;
        }
        Ok(())
    })
    .await
}

// ------------------------------------------------------------ the bench

/// A member process, killed (by its pid) and reaped when dropped.
struct Proc {
    id: String,
    child: Child,
    out: PathBuf,
    err: PathBuf,
    exited: Option<std::process::ExitStatus>,
}

impl Proc {
    /// Waits at most `limit` for the process to exit.
    async fn wait(&mut self, limit: Duration) -> Result<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                self.exited = Some(status);
                return Ok(status);
            }
            if Instant::now() > deadline {
                return Err(Error::msg(format!(
                    "member {} still runs after {limit:?}\n{}",
                    self.id,
                    self.output()
                )));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// SIGKILL, then reaps it.
    fn kill(&mut self) -> Result<()> {
        if self.exited.is_none() {
            self.child.kill()?;
            self.exited = Some(self.child.wait()?);
        }
        Ok(())
    }

    fn output(&self) -> String {
        let out = std::fs::read_to_string(&self.out).unwrap_or_default();
        let err = std::fs::read_to_string(&self.err).unwrap_or_default();
        format!("--- member {} stdout\n{out}--- stderr\n{err}", self.id)
    }

    fn events(&self) -> Events {
        Events::parse(&std::fs::read_to_string(&self.out).unwrap_or_default())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// Starts member `config.id` pinned to `core`.
fn spawn(exe: &Path, dir: &Path, core: usize, config: &MemberConfig) -> Result<Proc> {
    let json = serde_json::to_string(config).map_err(Error::msg)?;
    spawn_with(exe, dir, core, &config.id, ("WEIR_BENCH_MEMBER", &json))
}

/// Starts this binary as `id`, pinned to `core`, with `env` set; its
/// output goes to files in `dir`.
fn spawn_with(exe: &Path, dir: &Path, core: usize, id: &str, env: (&str, &str)) -> Result<Proc> {
    let out = dir.join(format!("{id}.out"));
    let err = dir.join(format!("{id}.err"));
    let child = Command::new("taskset")
        .arg("-c")
        .arg(core.to_string())
        .arg(exe)
        .env(env.0, env.1)
        .stdin(Stdio::null())
        .stdout(File::create(&out)?)
        .stderr(File::create(&err)?)
        .spawn()?;
    Ok(Proc {
        id: id.to_string(),
        child,
        out,
        err,
        exited: None,
    })
}

/// One run of a member, from its `EVENT run` line.
#[derive(Clone, Debug)]
struct RunEvent {
    start: i128,
    end: i128,
    state: String,
    held: BTreeSet<String>,
    components: u64,
}

/// What a member printed.
#[derive(Debug, Default)]
struct Events {
    start: Option<i128>,
    joined: Option<i128>,
    runs: Vec<RunEvent>,
    synced: Option<i128>,
    cpu: Option<f64>,
    raw: Option<(i128, i128)>,
}

impl Events {
    fn parse(text: &str) -> Events {
        let mut events = Events::default();
        for line in text.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields.as_slice() {
                ["EVENT", "start", ns] => events.start = ns.parse().ok(),
                ["EVENT", "joined", ns] => events.joined = ns.parse().ok(),
                ["EVENT", "synced", ns] => events.synced = ns.parse().ok(),
                ["EVENT", "cpu", secs] => events.cpu = secs.parse().ok(),
                ["EVENT", "raw", start, end] => {
                    events.raw = start.parse().ok().zip(end.parse().ok());
                }
                ["EVENT", "run", start, end, state, rest @ ..] => {
                    let (held, components) = match rest {
                        [held, ran, _] => (*held, ran.parse().unwrap_or(0)),
                        _ => ("-", 0),
                    };
                    events.runs.push(RunEvent {
                        start: start.parse().unwrap_or(0),
                        end: end.parse().unwrap_or(0),
                        state: (*state).to_string(),
                        held: held
                            .split(',')
                            .filter(|s| !s.is_empty() && *s != "-")
                            .map(str::to_string)
                            .collect(),
                        components,
                    });
                }
                _ => {}
            }
        }
        events
    }
}

/// A member's runs, from `origin`: `+0.52s ok 2.10s (801 components)`,
/// consecutive runs that waited for the root holder as one item.
fn describe_runs(runs: &[RunEvent], origin: i128) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending: Vec<&RunEvent> = Vec::new();
    let flush = |pending: &mut Vec<&RunEvent>, out: &mut Vec<String>| {
        if let (Some(first), Some(last)) = (pending.first(), pending.last()) {
            out.push(format!(
                "{} run(s) waiting for the root holder from {:+.2}s to {:+.2}s",
                pending.len(),
                secs(first.start - origin),
                secs(last.end - origin)
            ));
        }
        pending.clear();
    };
    for r in runs {
        if r.state == "pending" {
            pending.push(r);
            continue;
        }
        flush(&mut pending, &mut out);
        out.push(format!(
            "{:+.2}s {} {:.2}s ({} components)",
            secs(r.start - origin),
            r.state,
            secs(r.end - r.start),
            r.components
        ));
    }
    flush(&mut pending, &mut out);
    out
}

fn secs(ns: i128) -> f64 {
    ns as f64 / 1e9
}

/// Everything a run of the bench shares.
struct Bench {
    exe: PathBuf,
    url: String,
    pool: PgPool,
    items: u64,
    rounds: u32,
    pending_wait_ms: u64,
    join_delay_ms: u64,
    scratch: tempfile::TempDir,
}

/// One measurement of the one-shot sync by `n` members.
struct Throughput {
    /// From the first run's start to the group synced.
    work_secs: f64,
    /// From starting the processes to their exit.
    wall_secs: f64,
    /// Items written per member.
    split: BTreeMap<String, i64>,
    /// Data partitions per member (of the rows it wrote).
    partitions: BTreeMap<String, i64>,
    /// How far apart the members' first runs started.
    skew_secs: f64,
    /// The CPU time of the members, of PostgreSQL, and of other processes
    /// (this bench's own included) while they ran.
    member_cpu_secs: f64,
    postgres_cpu_secs: f64,
    others_cpu_secs: f64,
    /// Per member: when it joined, its runs and when it saw the group
    /// synced, from the first run's start.
    detail: Vec<String>,
}

/// One measurement of the hashing alone, in `n` processes.
struct Raw {
    secs: f64,
    cpu_secs: f64,
    /// The CPU time other processes used while it ran.
    others_cpu_secs: f64,
}

/// One takeover.
struct Takeover {
    secs: f64,
    rows_secs: f64,
    lease_left_secs: f64,
    victim_partitions: usize,
    /// The survivor's run that took the partitions over: its start and
    /// end, from the kill.
    run_window: Option<(f64, f64)>,
}

impl Bench {
    fn config(&self, id: &str, group: &str, table: &str, dir: &Path) -> MemberConfig {
        MemberConfig {
            id: id.to_string(),
            url: self.url.clone(),
            group: group.to_string(),
            ledger: dir.join(format!("{id}.ledger")),
            table: table.to_string(),
            pulse_table: None,
            stop: dir.join(format!("{id}.stop")),
            items: self.items,
            rounds: self.rounds,
            pending_wait_ms: self.pending_wait_ms,
            join_delay_ms: self.join_delay_ms,
        }
    }

    /// Waits for other processes to leave the cores alone (at most a
    /// minute), and says so when they do not.
    async fn quiet(&self) {
        let cores = wait_quiet(Duration::from_secs(60)).await;
        if cores >= 0.1 {
            println!("note: other processes use {cores:.1} cores; measuring anyway");
        }
    }

    /// Drops a group, its tables and its leases.
    async fn drop_group(&self, group: &str) -> Result<()> {
        postgres::drop_tables_of(&self.pool, &Owner::group(group)).await?;
        PostgresCoordinator::new(self.pool.clone())
            .drop_group(group)
            .await
    }

    /// The items' hashing alone, split evenly over `n` processes pinned
    /// to one core each: what the machine itself gives.
    async fn raw(&self, n: usize) -> Result<Raw> {
        let dir = tempfile::tempdir_in(self.scratch.path())?;
        self.quiet().await;
        let busy_before = machine_busy_secs();
        let mut procs = Vec::new();
        let per = self.items.div_ceil(n as u64);
        for m in 0..n {
            let from = per * m as u64;
            let to = (from + per).min(self.items);
            let spec = format!("{from},{to},{}", self.rounds);
            procs.push(spawn_with(
                &self.exe,
                dir.path(),
                m,
                &format!("raw{m}"),
                ("WEIR_BENCH_RAW", &spec),
            )?);
        }
        let limit = Duration::from_secs(120 + self.items * u64::from(self.rounds) / 1000);
        let mut spans = Vec::new();
        let mut cpu_secs = 0.0;
        for p in &mut procs {
            let status = p.wait(limit).await?;
            let events = p.events();
            match (status.success(), events.raw) {
                (true, Some(span)) => spans.push(span),
                _ => {
                    return Err(Error::msg(format!(
                        "{} failed: {status}\n{}",
                        p.id,
                        p.output()
                    )))
                }
            }
            cpu_secs += events.cpu.unwrap_or(f64::NAN);
        }
        let machine = machine_busy_secs() - busy_before;
        let start = spans.iter().map(|s| s.0).min().unwrap_or(0);
        let end = spans.iter().map(|s| s.1).max().unwrap_or(0);
        Ok(Raw {
            secs: secs(end - start),
            cpu_secs,
            others_cpu_secs: machine - cpu_secs,
        })
    }

    async fn throughput(&self, members: usize, rep: usize) -> Result<Throughput> {
        let group = format!("scale_{members}m_r{rep}");
        let table = format!("scale_out_items_{members}m_r{rep}");
        let dir = tempfile::tempdir_in(self.scratch.path())?;
        self.quiet().await;
        let busy_before = machine_busy_secs();
        let postgres_before = postgres_cpu_secs();
        let started = Instant::now();
        let mut procs = Vec::new();
        for m in 0..members {
            let config = self.config(&format!("m{m}"), &group, &table, dir.path());
            procs.push(spawn(&self.exe, dir.path(), m, &config)?);
        }
        let limit = Duration::from_secs(120 + self.items * u64::from(self.rounds) / 1000);
        for p in &mut procs {
            let status = p.wait(limit).await?;
            if !status.success() {
                return Err(Error::msg(format!(
                    "member {} failed: {status}\n{}",
                    p.id,
                    p.output()
                )));
            }
        }
        let wall_secs = started.elapsed().as_secs_f64();
        let machine_cpu_secs = machine_busy_secs() - busy_before;
        let postgres_cpu_secs = postgres_cpu_secs() - postgres_before;
        let events: Vec<(String, Events)> =
            procs.iter().map(|p| (p.id.clone(), p.events())).collect();
        let first_runs: Vec<i128> = events
            .iter()
            .filter_map(|(_, e)| e.runs.first().map(|r| r.start))
            .collect();
        let synced = events.iter().filter_map(|(_, e)| e.synced).min();
        let (Some(&first_start), Some(&last_first), Some(synced)) =
            (first_runs.iter().min(), first_runs.iter().max(), synced)
        else {
            let outputs: Vec<String> = procs.iter().map(Proc::output).collect();
            return Err(Error::msg(format!(
                "no run or no synced event\n{}",
                outputs.join("\n")
            )));
        };
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(&format!(
            "SELECT writer, count(*), count(DISTINCT partition) FROM \"{table}\"
              GROUP BY writer ORDER BY writer"
        ))
        .fetch_all(&self.pool)
        .await?;
        let total: i64 = rows.iter().map(|(_, n, _)| n).sum();
        if total != i64::try_from(self.items).unwrap_or(-1) {
            return Err(Error::msg(format!(
                "{total} rows written, {} items",
                self.items
            )));
        }
        let member_cpu_secs: f64 = events.iter().filter_map(|(_, e)| e.cpu).sum();
        let mut detail = Vec::new();
        for (id, e) in &events {
            let runs = describe_runs(&e.runs, first_start);
            let at = |t: Option<i128>| t.map_or(f64::NAN, |t| secs(t - first_start));
            detail.push(format!(
                "{id}: started {:+.2}s, joined {:+.2}s, synced {:+.2}s, {:.2}s of CPU; runs: {}",
                at(e.start),
                at(e.joined),
                at(e.synced),
                e.cpu.unwrap_or(f64::NAN),
                runs.join("; ")
            ));
        }
        drop(procs);
        self.drop_group(&group).await?;
        Ok(Throughput {
            work_secs: secs(synced - first_start),
            wall_secs,
            split: rows.iter().map(|(w, n, _)| (w.clone(), *n)).collect(),
            partitions: rows.iter().map(|(w, _, p)| (w.clone(), *p)).collect(),
            skew_secs: secs(last_first - first_start),
            member_cpu_secs,
            postgres_cpu_secs,
            others_cpu_secs: machine_cpu_secs - member_cpu_secs - postgres_cpu_secs,
            detail,
        })
    }

    async fn takeover(&self, rep: usize) -> Result<Takeover> {
        let group = format!("scale_takeover_r{rep}");
        let table = format!("scale_out_takeover_items_r{rep}");
        let pulse = format!("scale_out_takeover_pulse_r{rep}");
        let dir = tempfile::tempdir_in(self.scratch.path())?;
        self.quiet().await;
        let mut procs = Vec::new();
        for m in 0..2 {
            let mut config = self.config(&format!("m{m}"), &group, &table, dir.path());
            config.items = TAKEOVER_ITEMS;
            config.pulse_table = Some(pulse.clone());
            procs.push(spawn(&self.exe, dir.path(), m, &config)?);
        }
        let result = self.kill_one(&group, &pulse, &mut procs).await;
        // The survivor leaves once it sees its stop file.
        for p in &mut procs {
            if p.exited.is_none() {
                File::create(dir.path().join(format!("{}.stop", p.id)))?;
            }
        }
        for p in &mut procs {
            if p.exited.is_none() {
                let status = p.wait(Duration::from_secs(30)).await?;
                if !status.success() {
                    return Err(Error::msg(format!(
                        "member {} failed: {status}\n{}",
                        p.id,
                        p.output()
                    )));
                }
            }
        }
        drop(procs);
        self.drop_group(&group).await?;
        result
    }

    /// Waits until the group is settled (every partition completed a pass
    /// and is held by a live member, 8 each), kills the root holder, and
    /// times its partitions' takeover.
    async fn kill_one(&self, group: &str, pulse: &str, procs: &mut [Proc]) -> Result<Takeover> {
        let settled = Instant::now() + Duration::from_secs(120);
        let owners = loop {
            let rows: Vec<(i32, Option<String>, Option<i64>)> = sqlx::query_as(
                "SELECT p.partition, CASE WHEN m.member_id IS NULL THEN NULL ELSE p.owner END,
                        pp.completed_pass
                   FROM weir.partition p
                   JOIN weir.partition_pass pp USING (group_name, partition)
                   LEFT JOIN weir.member m ON m.group_name = p.group_name
                        AND m.member_id = p.owner AND m.incarnation = p.owner_incarnation
                        AND m.expires_at > clock_timestamp()
                  WHERE p.group_name = $1",
            )
            .bind(group)
            .fetch_all(&self.pool)
            .await?;
            let pulses: i64 = sqlx::query_scalar(&format!(
                "SELECT count(*) FROM \"{pulse}\" WHERE to_regclass($1) IS NOT NULL"
            ))
            .bind(pulse)
            .fetch_one(&self.pool)
            .await
            .unwrap_or(0);
            let mut per: BTreeMap<String, Vec<i32>> = BTreeMap::new();
            for (p, owner, completed) in &rows {
                if let (Some(o), Some(_)) = (owner, completed) {
                    per.entry(o.clone()).or_default().push(*p);
                }
            }
            let data = |v: &Vec<i32>| v.iter().filter(|p| **p >= 0).count();
            let even = per.len() == 2
                && per.values().all(|v| data(v) == PARTITIONS as usize / 2)
                && rows.len() == PARTITIONS as usize + 1
                && rows.iter().all(|(_, o, c)| o.is_some() && c.is_some());
            if even && pulses == i64::from(PARTITIONS) {
                break per;
            }
            if Instant::now() > settled {
                let outputs: Vec<String> = procs.iter().map(Proc::output).collect();
                return Err(Error::msg(format!(
                    "the takeover group did not settle: {per:?}, {pulses} pulse rows\n{}",
                    outputs.join("\n")
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let Some((victim, dead)) = owners
            .iter()
            .find(|(_, parts)| parts.contains(&-1))
            .map(|(o, p)| (o.clone(), p.clone()))
        else {
            return Err(Error::msg("no member holds the root partition"));
        };
        let Some(survivor) = owners.keys().find(|o| **o != victim).cloned() else {
            return Err(Error::msg("no survivor"));
        };
        // A random point of the victim's heartbeat period (a third of the
        // TTL).
        let jitter = LEASE_TTL.mul_f64(fastrand::f64() / 3.0);
        tokio::time::sleep(jitter).await;
        let lease_left: f64 = sqlx::query_scalar(
            "SELECT EXTRACT(EPOCH FROM expires_at - clock_timestamp())::float8
               FROM weir.member WHERE group_name = $1 AND member_id = $2",
        )
        .bind(group)
        .bind(&victim)
        .fetch_one(&self.pool)
        .await?;
        let Some(proc) = procs.iter_mut().find(|p| p.id == victim) else {
            return Err(Error::msg(format!("no process of member {victim}")));
        };
        let killed = Instant::now();
        let killed_ns = now_ns();
        proc.kill()?;
        // Any pass later than this began after the victim died.
        let pass_at_kill: i64 = sqlx::query_scalar("SELECT last_value FROM weir.pass_seq")
            .fetch_one(&self.pool)
            .await?;
        let dead_data: Vec<i32> = dead.iter().copied().filter(|p| *p >= 0).collect();
        let limit = killed + LEASE_TTL * 10 + Duration::from_secs(30);
        let mut rows_at = None;
        let took = loop {
            let passed: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM weir.partition p
                   JOIN weir.partition_pass pp USING (group_name, partition)
                  WHERE p.group_name = $1 AND p.partition = ANY($2)
                    AND p.owner = $3 AND pp.completed_pass > $4",
            )
            .bind(group)
            .bind(&dead)
            .bind(&survivor)
            .bind(pass_at_kill)
            .fetch_one(&self.pool)
            .await?;
            let rewritten: i64 = sqlx::query_scalar(&format!(
                "SELECT count(*) FROM \"{pulse}\" WHERE partition = ANY($1) AND writer = $2"
            ))
            .bind(&dead_data)
            .bind(&survivor)
            .fetch_one(&self.pool)
            .await?;
            let elapsed = killed.elapsed().as_secs_f64();
            if rows_at.is_none() && rewritten == dead_data.len() as i64 {
                rows_at = Some(elapsed);
            }
            if rows_at.is_some() && passed == dead.len() as i64 {
                break elapsed;
            }
            if Instant::now() > limit {
                let outputs: Vec<String> = procs.iter().map(Proc::output).collect();
                return Err(Error::msg(format!(
                    "partitions {dead:?} of {victim} not taken over after {elapsed:.1}s ({passed} passes, {rewritten} pulse rows)\n{}",
                    outputs.join("\n")
                )));
            }
            tokio::time::sleep(TAKEOVER_POLL).await;
        };
        // The survivor's run that took them over: the first one begun
        // after the kill that holds the root.
        let events = procs
            .iter()
            .find(|p| p.id == survivor)
            .map(Proc::events)
            .unwrap_or_default();
        let run_window = events
            .runs
            .iter()
            .find(|r| r.start > killed_ns && r.held.contains("root"))
            .map(|r| (secs(r.start - killed_ns), secs(r.end - killed_ns)));
        Ok(Takeover {
            secs: took,
            rows_secs: rows_at.unwrap_or(took),
            lease_left_secs: lease_left,
            victim_partitions: dead_data.len(),
            run_window,
        })
    }
}

/// The first server that answers, as (URL, pool).
async fn server() -> Option<(String, PgPool)> {
    let urls: Vec<String> = match std::env::var("WEIR_TEST_POSTGRES_URL") {
        Ok(url) => vec![url],
        Err(_) => vec![
            "postgres://postgres@127.0.0.1:5432/test".into(),
            "postgres://root@127.0.0.1:5432/test".into(),
        ],
    };
    for url in urls {
        let connect = PgPoolOptions::new().max_connections(2).connect(&url);
        if let Ok(Ok(pool)) = tokio::time::timeout(Duration::from_secs(10), connect).await {
            return Some((url, pool));
        }
    }
    None
}

/// `url` with its database replaced by `database`.
fn with_database(url: &str, database: &str) -> Result<String> {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let path = url
        .get(scheme_end..)
        .and_then(|rest| rest.find('/'))
        .map(|i| i + scheme_end)
        .ok_or_else(|| Error::msg(format!("{url}: no database in the URL")))?;
    let query = url.get(path..).and_then(|p| p.find('?')).map(|i| i + path);
    let head = url.get(..path).unwrap_or(url);
    let tail = query.and_then(|q| url.get(q..)).unwrap_or("");
    Ok(format!("{head}/{database}{tail}"))
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn goal(met: bool) -> &'static str {
    if met {
        "GOAL MET"
    } else {
        "GOAL MISSED"
    }
}

async fn measure(bench: &Bench, repeat: usize) -> Result<()> {
    let (mut one, mut two, mut takeovers) = (Vec::new(), Vec::new(), Vec::new());
    let (mut raw_one, mut raw_two) = (Vec::new(), Vec::new());
    for rep in 0..repeat {
        // Alternate the order, so that neither always runs on a machine
        // the other just warmed up (or heated).
        let order: [usize; 2] = if rep % 2 == 0 { [1, 2] } else { [2, 1] };
        for members in order {
            let r = bench.raw(members).await?;
            println!(
                "run {rep} hashing alone in {members} process(es): {:.2}s ({:.0} items/s), {:.2}s of CPU; other processes {:.2}s",
                r.secs,
                bench.items as f64 / r.secs,
                r.cpu_secs,
                r.others_cpu_secs,
            );
            let t = bench.throughput(members, rep).await?;
            println!(
                "run {rep} {members} member(s): {:.2}s from the first run to synced ({:.0} items/s), first runs {:.2}s apart, processes {:.2}s; items per member {:?}, data partitions per member {:?}; CPU: members {:.2}s, PostgreSQL {:.2}s, other processes {:.2}s",
                t.work_secs,
                bench.items as f64 / t.work_secs,
                t.skew_secs,
                t.wall_secs,
                t.split,
                t.partitions,
                t.member_cpu_secs,
                t.postgres_cpu_secs,
                t.others_cpu_secs,
            );
            for line in &t.detail {
                println!("    {line}");
            }
            if members == 1 {
                raw_one.push(r);
                one.push(t);
            } else {
                raw_two.push(r);
                two.push(t);
            }
        }
        let t = bench.takeover(rep).await?;
        let window = t
            .run_window
            .map_or("not found".to_string(), |(s, e)| format!("{s:.2}-{e:.2}s"));
        println!(
            "run {rep} takeover: {:.2}s from the kill to {} partitions (root included) committed by the survivor (pulse rows at {:.2}s); the victim's lease had {:.2}s left; the survivor's takeover run {window} after the kill",
            t.secs,
            t.victim_partitions + 1,
            t.rows_secs,
            t.lease_left_secs,
        );
        takeovers.push(t);
    }
    let ratios = |a: &[Throughput], b: &[Throughput], f: fn(&Throughput) -> f64| {
        median(a.iter().zip(b).map(|(a, b)| f(a) / f(b)))
    };
    let one_secs = median(one.iter().map(|t| t.work_secs));
    let two_secs = median(two.iter().map(|t| t.work_secs));
    let ratio = ratios(&one, &two, |t| t.work_secs);
    let wall_ratio = ratios(&one, &two, |t| t.wall_secs);
    let raw_one_secs = median(raw_one.iter().map(|r| r.secs));
    let raw_two_secs = median(raw_two.iter().map(|r| r.secs));
    let raw_ratio = median(raw_one.iter().zip(&raw_two).map(|(a, b)| a.secs / b.secs));
    let takeover = median(takeovers.iter().map(|t| t.secs));
    let ttl = LEASE_TTL.as_secs_f64();
    let workload = format!(
        "{} items x {} blake3 rounds of 16 KiB, P={PARTITIONS}, join delay {:.2}s",
        bench.items,
        bench.rounds,
        bench.join_delay_ms as f64 / 1000.0
    );
    println!();
    println!("| workload | one member (s) | two members (s) | ratio two/one | hashing alone, one / two processes (s) | its ratio | takeover (s) | TTL + 1 s |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    println!(
        "| {workload} | {one_secs:.2} | {two_secs:.2} | {ratio:.2} | {raw_one_secs:.2} / {raw_two_secs:.2} | {raw_ratio:.2} | {takeover:.2} | {:.1} |",
        ttl + 1.0
    );
    println!(
        "RESULT scale_out items={} rounds={} one_secs={one_secs:.3} two_secs={two_secs:.3} ratio={ratio:.3} processes_ratio={wall_ratio:.3} raw_one_secs={raw_one_secs:.3} raw_two_secs={raw_two_secs:.3} raw_ratio={raw_ratio:.3} takeover_secs={takeover:.3} ttl_secs={ttl:.1}",
        bench.items, bench.rounds
    );
    println!(
        "{}: throughput of two members / one = {ratio:.2} (goal >= 1.7; the hashing alone in two processes / one: {raw_ratio:.2})",
        goal(ratio >= 1.7)
    );
    println!(
        "{}: takeover {takeover:.2}s (goal <= TTL + 1 s = {:.1}s)",
        goal(takeover <= ttl + 1.0),
        ttl + 1.0
    );
    Ok(())
}

/// The hashing alone, without weir: items `from..to`, then `EVENT raw
/// <start ns> <end ns>`.
fn raw(spec: &str) -> Result<()> {
    let bad = || Error::msg(format!("WEIR_BENCH_RAW={spec}: expected FROM,TO,ROUNDS"));
    let fields: Vec<u64> = spec.split(',').filter_map(|f| f.parse().ok()).collect();
    let [from, to, rounds] = fields.as_slice() else {
        return Err(bad());
    };
    let rounds = u32::try_from(*rounds).map_err(|_| bad())?;
    let start = now_ns();
    for i in *from..*to {
        std::hint::black_box(work(i, rounds));
    }
    println!("EVENT raw {start} {}", now_ns());
    println!("EVENT cpu {:.3}", cpu_secs());
    Ok(())
}

fn main() -> Result<()> {
    if let Ok(spec) = std::env::var("WEIR_BENCH_RAW") {
        return raw(&spec);
    }
    if let Ok(json) = std::env::var("WEIR_BENCH_MEMBER") {
        let config: MemberConfig = serde_json::from_str(&json).map_err(Error::msg)?;
        return member(config);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let Some((url, admin)) = server().await else {
            println!("SKIPPED: no PostgreSQL server; set WEIR_TEST_POSTGRES_URL");
            return Ok(());
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cores < 2 {
            return Err(Error::msg("scale_out needs two cores, one per member"));
        }
        let taskset = Command::new("taskset")
            .arg("-c")
            .arg("0")
            .arg("true")
            .status();
        if !taskset.is_ok_and(|s| s.success()) {
            return Err(Error::msg("scale_out pins members with taskset, which did not run"));
        }
        let items = env_or("WEIR_BENCH_ITEMS", 1_600u64);
        let rounds = env_or("WEIR_BENCH_ROUNDS", 800u32);
        let repeat = env_or("WEIR_BENCH_REPEAT", 3usize).max(1);
        let join_delay_ms = env_or("WEIR_BENCH_JOIN_DELAY_MS", 1000u64);
        println!(
            "{items} items of {rounds} blake3 rounds, {PARTITIONS} partitions, lease TTL {:.1}s, join delay {:.2}s, {cores} cores, {repeat} repeats",
            LEASE_TTL.as_secs_f64(),
            join_delay_ms as f64 / 1000.0,
        );
        let database = format!("weir_bench_scale_out_{}", std::process::id());
        sqlx::query(&format!("CREATE DATABASE \"{database}\""))
            .execute(&admin)
            .await?;
        let result = async {
            let url = with_database(&url, &database)?;
            let pool = PgPoolOptions::new()
                .max_connections(4)
                .connect(&url)
                .await
                .map_err(|e| Error::msg(format!("{url}: {e}")))?;
            let bench = Bench {
                exe: std::env::current_exe()?,
                url,
                pool,
                items,
                rounds,
                pending_wait_ms: env_or("WEIR_BENCH_PENDING_WAIT_MS", 50),
                join_delay_ms,
                scratch: tempfile::tempdir()?,
            };
            // Interrupted, the members are killed (dropping the measurement
            // drops their processes) and the scratch database is dropped.
            let result = tokio::select! {
                result = measure(&bench, repeat) => result,
                _ = tokio::signal::ctrl_c() => Err(Error::msg("interrupted")),
            };
            bench.pool.close().await;
            result
        }
        .await;
        let dropped = sqlx::query(&format!("DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"))
            .execute(&admin)
            .await;
        result?;
        dropped?;
        Ok(())
    })
}
