//! Crash recovery against PostgreSQL: a 20,000-row sync is killed with
//! `SIGKILL` at seeded points and restarted on the same ledger and table,
//! each time; after a final clean run the table must hold exactly the
//! declared rows (none missing, none left over, none twice), and the ledger
//! must agree with it: one more run changes nothing, and the ledger tracks
//! one state per row and no failure.
//!
//! # How it works
//!
//! Each test is both the driver and the program under test: the driver
//! re-executes this test binary (`--exact <test>`) with
//! `WEIR_CRASH_PG_CHILD=<phase>`, and the child syncs the rows of that phase
//! (200 components of 100 rows) into its table, then writes what it did as
//! JSON. The kills come from the engine's fault-injection hooks
//! (`weir_actors::fault`, cargo feature `fault-injection`, on for this
//! package's tests): `WEIR_FAULT_KILL=<point>:<n>` kills the child on the
//! `n`-th hit of a point:
//!
//! - `reconcile.batch`: a shard starts reconciling a component's batch;
//! - `sink.before_apply`: a sink call is about to be made (intents durable);
//! - `sink.after_apply`: the call returned `Ok`, nothing of it is committed;
//! - `ledger.group_commit`: a group commit is applied to sled, not flushed.
//!
//! The plan is 20 kills per scenario, five at each point, in a seeded order
//! and at seeded hit numbers. Each run after a kill has less left to do
//! (what was committed is not done again), so the hit numbers are drawn
//! below what a restarted run still reaches (see [`Scenario::caps`]), and
//! the kills walk through the sync; each kill's line shows how many rows
//! still differ from the declarations before and after it, and the hits
//! of every point when it died. A kill that does not fire (the run got
//! through) is printed; that run is checked like a final one, and the
//! scenario starts over with a new table and ledger, so that the next
//! kills still cut into work. At least three quarters of a drawn plan must
//! fire.
//!
//! The scenarios: an initial sync of 20,000 rows; from a synced table, a
//! run that deletes half of them (the even rows of components 0..100 are
//! kept, the odd components of 100..200 are no longer mounted); from a
//! synced table, a nullable column added and every row declared again with
//! a value for it.
//!
//! # Replay
//!
//! The driver prints `seed=<n>` and its plan, `<point>:<hit>,...`.
//! `WEIR_CRASH_SEED=<n>` draws the same plan again; `WEIR_CRASH_PLAN=<plan>`
//! runs a plan as given (for every scenario of the run, so pick the test
//! with `--exact`). Timing is not replayed: where in the data a hit falls
//! can vary a little between runs.
//!
//! The server is `WEIR_TEST_POSTGRES_URL`, else
//! `postgres://postgres@127.0.0.1:5432/test`; without one the tests print
//! `SKIPPED` and pass, except under `CI=true`, where they fail.

mod pg;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Row as _};
use weir::connectors::postgres::mount_table_target;
use weir::connectors::sql::{ColumnType, TableSchema};
use weir::prelude::*;
use weir_actors::fault;

// ---------------------------------------------------------------------------
// The data: a deterministic function of the phase
// ---------------------------------------------------------------------------

/// Components per run.
const COMPONENTS: i64 = 200;
/// Rows per component.
const ROWS_PER_COMPONENT: i64 = 100;
/// Actions per sink call: small enough for many calls (and group commits)
/// per run.
const MAX_ACTIONS: usize = 500;

/// What the child declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Rows 0..20,000 with their first values.
    Initial,
    /// Half of them: the even rows of components 0..100, and every row of
    /// the even components 100..200 (the odd ones are no longer mounted).
    DeleteHalf,
    /// Every row, with a value for a nullable column `extra` added to the
    /// table.
    AddColumn,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Initial => "initial",
            Phase::DeleteHalf => "delete-half",
            Phase::AddColumn => "add-column",
        }
    }

    fn parse(s: &str) -> Result<Phase> {
        [Phase::Initial, Phase::DeleteHalf, Phase::AddColumn]
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| Error::msg(format!("unknown phase {s:?}")))
    }

    fn mounts(self, component: i64) -> bool {
        match self {
            Phase::DeleteHalf => component < COMPONENTS / 2 || component % 2 == 0,
            Phase::Initial | Phase::AddColumn => true,
        }
    }

    fn declares(self, component: i64, row: i64) -> bool {
        match self {
            Phase::DeleteHalf if component < COMPONENTS / 2 => row % 2 == 0,
            _ => self.mounts(component),
        }
    }

    fn components(self) -> Vec<i64> {
        (0..COMPONENTS).filter(|c| self.mounts(*c)).collect()
    }

    fn rows(self, component: i64) -> Vec<DataRow> {
        let first = component * ROWS_PER_COMPONENT;
        (first..first + ROWS_PER_COMPONENT)
            .filter(|r| self.declares(component, *r))
            .map(|id| DataRow {
                id,
                comp: component,
                val: format!("row {id}, first value"),
                extra: (self == Phase::AddColumn).then(|| format!("extra {id}")),
            })
            .collect()
    }

    fn schema(self) -> Result<TableSchema> {
        let b = TableSchema::builder()
            .column("id", ColumnType::BigInt)
            .column("comp", ColumnType::BigInt)
            .column("val", ColumnType::Text);
        let b = match self {
            Phase::AddColumn => b.nullable_column("extra", ColumnType::Text),
            Phase::Initial | Phase::DeleteHalf => b,
        };
        b.primary_key(["id"]).build()
    }

    fn columns(self) -> Vec<String> {
        let mut cols = vec!["id", "comp", "val"];
        if self == Phase::AddColumn {
            cols.push("extra");
        }
        cols.into_iter().map(String::from).collect()
    }

    /// The table's content this phase declares.
    fn desired(self) -> Table {
        self.components()
            .into_iter()
            .flat_map(|c| self.rows(c))
            .map(|r| (r.id, (r.comp, r.val, r.extra)))
            .collect()
    }
}

/// One row as declared (`extra` is ignored by a table without the column).
#[derive(Clone, Debug, Serialize)]
struct DataRow {
    id: i64,
    comp: i64,
    val: String,
    extra: Option<String>,
}

/// A table's content: `id -> (comp, val, extra)`.
type Table = BTreeMap<i64, (i64, String, Option<String>)>;

// ---------------------------------------------------------------------------
// The child: one run of a phase
// ---------------------------------------------------------------------------

const CHILD_ENV: &str = "WEIR_CRASH_PG_CHILD";
const LEDGER_ENV: &str = "WEIR_CRASH_PG_LEDGER";
const TABLE_ENV: &str = "WEIR_CRASH_PG_TABLE";
const URL_ENV: &str = "WEIR_CRASH_PG_URL";
const OUT_ENV: &str = "WEIR_CRASH_PG_OUT";

fn db() -> ContextKey<PgPool> {
    ContextKey::new("crash_pg")
}

/// What a child run that was not killed did, as it writes it.
#[derive(Debug, Default, Serialize, Deserialize)]
struct ChildReport {
    created: u64,
    updated: u64,
    deleted: u64,
    unchanged: u64,
    failed_components: u64,
    elapsed_ms: u64,
    /// States the ledger tracks, in all and by provider.
    target_states: u64,
    providers: Vec<(String, u64)>,
    /// Failed components the ledger remembers.
    failures: Vec<String>,
    /// Hits of each fault point during the run.
    hits: Vec<(String, u64)>,
}

fn env(name: &str) -> Result<String> {
    std::env::var(name).map_err(|_| Error::msg(format!("the crash child needs {name}")))
}

/// The child: runs the phase once and writes its report, or dies trying.
async fn child(phase: &str) -> Result<()> {
    let phase = Phase::parse(phase)?;
    let table = env(TABLE_ENV)?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&env(URL_ENV)?)
        .await?;
    let app = App::builder("crash-pg")
        .ledger_path(env(LEDGER_ENV)?)
        .provide_key(&db(), pool)
        .batch_policy(BatchPolicy {
            max_actions: MAX_ACTIONS,
            ..BatchPolicy::default()
        })
        .build()
        .await?;
    let stats = app
        .run(move |ctx| async move {
            let rows = mount_table_target(&ctx, &db(), &table, phase.schema()?).await?;
            ctx.mount_each(
                phase.components(),
                |c| *c,
                move |ctx, c| {
                    let rows = rows.clone();
                    async move {
                        for row in phase.rows(c) {
                            rows.declare_row(&ctx, &row)?;
                        }
                        Ok(())
                    }
                },
            )
            .await
        })
        .await?;
    let ledger = app.inspect().await?;
    let report = ChildReport {
        created: stats.created,
        updated: stats.updated,
        deleted: stats.deleted,
        unchanged: stats.unchanged,
        failed_components: stats.failed_components,
        elapsed_ms: stats.elapsed.as_millis() as u64,
        target_states: ledger.target_states,
        providers: ledger.providers,
        failures: ledger
            .failures
            .iter()
            .map(|(path, cause)| format!("{path}: {cause}"))
            .collect(),
        hits: fault::hits()
            .into_iter()
            .map(|(p, n)| (p.to_string(), n))
            .collect(),
    };
    std::fs::write(
        env(OUT_ENV)?,
        serde_json::to_vec(&report).map_err(Error::msg)?,
    )?;
    Ok(())
}

/// Runs the child instead of the test when this process is one.
async fn as_child() -> Option<Result<()>> {
    let phase = std::env::var(CHILD_ENV).ok()?;
    Some(child(&phase).await)
}

// ---------------------------------------------------------------------------
// The driver
// ---------------------------------------------------------------------------

/// A kill: the point's `hit`-th hit.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Kill {
    point: &'static str,
    hit: u64,
}

impl std::fmt::Display for Kill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.point, self.hit)
    }
}

fn plan_text(plan: &[Kill]) -> String {
    plan.iter()
        .map(Kill::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_plan(text: &str) -> Result<Vec<Kill>> {
    text.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            let (name, hit) = s
                .trim()
                .rsplit_once(':')
                .ok_or_else(|| Error::msg(format!("{s:?} is not <point>:<hit>")))?;
            let point = fault::POINTS
                .into_iter()
                .find(|p| *p == name)
                .ok_or_else(|| Error::msg(format!("unknown point {name:?}")))?;
            let hit = hit
                .parse()
                .map_err(|_| Error::msg(format!("bad hit number in {s:?}")))?;
            Ok(Kill { point, hit })
        })
        .collect()
}

/// The default seed; `WEIR_CRASH_SEED` overrides it.
const DEFAULT_SEED: u64 = 0x5eed_c4a5_4001;

fn seed() -> Result<u64> {
    match std::env::var("WEIR_CRASH_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .map_err(|_| Error::msg(format!("WEIR_CRASH_SEED={s:?} is not a number"))),
        Err(_) => Ok(DEFAULT_SEED),
    }
}

/// The highest hit number drawn for each point: `(point, cap)`. A kill
/// must fire in a run that has only part of the work left, so the caps
/// are well below the hits of a full run (see [`Scenario::caps`]).
type Caps = [(&'static str, u64); 4];

/// `kills` kills, an equal share at each point, in a seeded order, each at
/// a seeded hit number between 1 and the point's cap.
fn draw_plan(seed: u64, salt: u64, kills: usize, caps: &Caps) -> Vec<Kill> {
    let mut rng = fastrand::Rng::with_seed(seed ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut plan: Vec<Kill> = (0..kills)
        .map(|i| {
            let (point, cap) = caps[i % caps.len()];
            Kill {
                point,
                hit: rng.u64(1..=cap.max(1)),
            }
        })
        .collect();
    rng.shuffle(&mut plan);
    plan
}

/// How a child run ended.
enum Outcome {
    /// Killed by `SIGKILL`, with the hook's hit counts at that moment.
    Killed(String),
    /// Finished its run.
    Finished(ChildReport),
}

/// One scenario's ledger, table and server.
struct Rig {
    test: &'static str,
    pool: PgPool,
    url: String,
    dir: PathBuf,
    table: String,
    runs: u32,
    /// Bumped when the scenario starts over, with a new ledger.
    generation: u32,
}

impl Rig {
    /// Runs the child once for `phase`, killed at `kill` if given.
    async fn child(&mut self, phase: Phase, kill: Option<&Kill>) -> Result<Outcome> {
        self.runs += 1;
        let log = self.dir.join(format!("child-{}.log", self.runs));
        let out = self.dir.join(format!("child-{}.json", self.runs));
        let log_file = std::fs::File::create(&log)?;
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(["--exact", self.test, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, phase.name())
            .env(LEDGER_ENV, self.ledger())
            .env(TABLE_ENV, &self.table)
            .env(URL_ENV, &self.url)
            .env(OUT_ENV, &out)
            .env_remove(fault::KILL_ENV)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        if let Some(k) = kill {
            cmd.env(fault::KILL_ENV, k.to_string());
        }
        let mut proc = cmd.spawn()?;
        let deadline = Instant::now() + Duration::from_secs(180);
        let status = loop {
            if let Some(status) = proc.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                let _ = proc.kill();
                let _ = proc.wait();
                return Err(self.failed(&log, "the child hung (no exit within 180 s)"));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        if status.signal() == Some(9) {
            // The hook's last words: where it killed, and the hits so far.
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            let hits = said
                .lines()
                .find_map(|l| l.split_once("hits so far: "))
                .map(|(_, h)| h.trim_end_matches(')').to_string())
                .unwrap_or_else(|| "(not killed by the hook)".into());
            return Ok(Outcome::Killed(hits));
        }
        if !status.success() {
            return Err(self.failed(&log, &format!("the child failed ({status})")));
        }
        let report = std::fs::read(&out)
            .map_err(|e| self.failed(&log, &format!("the child wrote no report ({e})")))?;
        Ok(Outcome::Finished(
            serde_json::from_slice(&report).map_err(Error::msg)?,
        ))
    }

    fn ledger(&self) -> PathBuf {
        self.dir.join(format!("ledger-{}", self.generation))
    }

    /// Forgets everything: drops the table and takes a new ledger.
    async fn start_over(&mut self) -> Result<()> {
        self.drop_table().await?;
        self.generation += 1;
        Ok(())
    }

    fn failed(&self, log: &Path, what: &str) -> Error {
        let output = std::fs::read_to_string(log).unwrap_or_default();
        let tail: String = output
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        Error::msg(format!("{what}; its output ends with:\n{tail}"))
    }

    /// A run that must finish, with no failed component.
    async fn clean(&mut self, phase: Phase) -> Result<ChildReport> {
        match self.child(phase, None).await? {
            Outcome::Finished(r) if r.failed_components == 0 => Ok(r),
            Outcome::Finished(r) => Err(Error::msg(format!(
                "a clean {} run had failed components: {r:?}",
                phase.name()
            ))),
            Outcome::Killed(_) => Err(Error::msg("a run without fault was killed")),
        }
    }

    /// The table's content, with `extra` as NULL while it does not exist;
    /// also its row count and distinct keys.
    async fn content(&self) -> Result<(Table, i64, i64)> {
        let t = &self.table;
        let exists: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
            .bind(format!("public.\"{t}\""))
            .fetch_one(&self.pool)
            .await?;
        if exists.is_none() {
            return Ok((Table::new(), 0, 0));
        }
        let rows = sqlx::query(&format!(
            "SELECT id, comp, val, to_jsonb(t) ->> 'extra' AS extra FROM \"{t}\" t ORDER BY id"
        ))
        .fetch_all(&self.pool)
        .await?;
        let mut table = Table::new();
        for r in &rows {
            table.insert(
                r.try_get("id")?,
                (r.try_get("comp")?, r.try_get("val")?, r.try_get("extra")?),
            );
        }
        let (count, distinct): (i64, i64) =
            sqlx::query_as(&format!("SELECT count(*), count(DISTINCT id) FROM \"{t}\""))
                .fetch_one(&self.pool)
                .await?;
        Ok((table, count, distinct))
    }

    async fn columns(&self) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT column_name::text FROM information_schema.columns \
             WHERE table_schema = 'public' AND table_name = $1 ORDER BY ordinal_position",
        )
        .bind(&self.table)
        .fetch_all(&self.pool)
        .await?)
    }

    /// How many rows differ from what `phase` declares.
    async fn differing(&self, phase: Phase) -> Result<usize> {
        let (table, _, _) = self.content().await?;
        Ok(diff(&table, &phase.desired()).count())
    }

    async fn drop_table(&self) -> Result<()> {
        sqlx::raw_sql(&format!("DROP TABLE IF EXISTS \"{}\" CASCADE", self.table))
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

/// A row that differs: missing, left over, or with other values.
enum Difference<'a> {
    Missing(i64),
    LeftOver(i64),
    Changed {
        id: i64,
        found: &'a (i64, String, Option<String>),
        declared: &'a (i64, String, Option<String>),
    },
}

impl std::fmt::Display for Difference<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Difference::Missing(id) => write!(f, "row {id} is missing"),
            Difference::LeftOver(id) => write!(f, "row {id} should have been deleted"),
            Difference::Changed {
                id,
                found,
                declared,
            } => write!(f, "row {id} is {found:?}, {declared:?} is declared"),
        }
    }
}

fn diff<'a>(found: &'a Table, declared: &'a Table) -> impl Iterator<Item = Difference<'a>> {
    let missing = declared
        .keys()
        .filter(|id| !found.contains_key(id))
        .map(|id| Difference::Missing(*id));
    let left_over = found
        .keys()
        .filter(|id| !declared.contains_key(id))
        .map(|id| Difference::LeftOver(*id));
    let changed = declared.iter().filter_map(|(id, d)| {
        let f = found.get(id)?;
        (f != d).then_some(Difference::Changed {
            id: *id,
            found: f,
            declared: d,
        })
    });
    missing.chain(left_over).chain(changed)
}

/// A server for the tests and its URL, or `None` (after a loud message)
/// when there is none and `CI` is not `true`.
async fn server() -> Result<Option<(PgPool, String)>> {
    Ok(pg::server(2)
        .await
        .map_err(Error::msg)?
        .map(|(url, pool)| (pool, url)))
}

/// A table name unique to this test and this process.
use pg::unique;

/// One crash scenario.
struct Scenario {
    /// The test function's name, to re-execute it.
    test: &'static str,
    /// A short name, for table names and messages.
    name: &'static str,
    /// Synced cleanly before the kills, if any.
    before: Option<Phase>,
    /// The phase the killed runs (and the final clean run) declare.
    phase: Phase,
    kills: usize,
    /// See [`Caps`]. Calibrated on the hits of clean and killed runs of the
    /// phase (printed by the driver). A full initial (or add-column) run
    /// has 402 reconcile batches, 45 to 48 sink calls and 70 to 100 group
    /// commits, and a restarted run only what is left: 400 / 8 / 8 / 12.
    /// A delete-half run has 302 reconcile batches and 20 sink calls of
    /// deletes, which every restarted run makes again (a run's deletions
    /// are committed together at its end), but intents are written only
    /// once per state, so a restarted run has as few as one group commit
    /// (the final one): 300 / 16 / 16 / 3.
    caps: Caps,
}

impl Scenario {
    async fn run(self) -> Result<()> {
        let Some((pool, url)) = server().await? else {
            return Ok(());
        };
        let seed = seed()?;
        let plan = match std::env::var("WEIR_CRASH_PLAN") {
            Ok(text) => parse_plan(&text)?,
            Err(_) => draw_plan(seed, self.salt(), self.kills, &self.caps),
        };
        let dir = tempfile::tempdir()?;
        let mut rig = Rig {
            test: self.test,
            pool,
            url,
            dir: dir.path().to_path_buf(),
            table: unique(&format!("crash_{}", self.name)),
            runs: 0,
            generation: 0,
        };
        println!(
            "crash scenario {}: seed={seed} (replay: WEIR_CRASH_SEED={seed}) table={} plan={}",
            self.name,
            rig.table,
            plan_text(&plan)
        );
        let result = self.drive(&mut rig, &plan).await;
        let dropped = rig.drop_table().await;
        if let Err(e) = result {
            let kept = dir.keep();
            return Err(Error::msg(format!(
                "crash scenario {} failed (seed={seed}, plan={}; ledger and child logs kept in {}): {e}",
                self.name,
                plan_text(&plan),
                kept.display()
            )));
        }
        dropped
    }

    fn salt(&self) -> u64 {
        self.name
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
    }

    /// Brings a new table and ledger to where the kills start.
    async fn prepare(&self, rig: &mut Rig) -> Result<()> {
        if let Some(before) = self.before {
            rig.clean(before).await?;
            verify(rig, before).await?;
        }
        Ok(())
    }

    async fn drive(&self, rig: &mut Rig, plan: &[Kill]) -> Result<()> {
        let started = Instant::now();
        self.prepare(rig).await?;
        let mut fired: BTreeMap<&str, (u32, u32)> = BTreeMap::new();
        let mut left = rig.differing(self.phase).await?;
        for (i, kill) in plan.iter().enumerate() {
            let outcome = rig.child(self.phase, Some(kill)).await?;
            let now = rig.differing(self.phase).await?;
            let tally = fired.entry(kill.point).or_default();
            tally.1 += 1;
            let what = match &outcome {
                Outcome::Killed(hits) => {
                    tally.0 += 1;
                    format!("killed (hits {hits})")
                }
                Outcome::Finished(r) => {
                    format!("NOT KILLED: the run finished first (hits {:?})", r.hits)
                }
            };
            println!(
                "  kill {:>2}/{}: {kill:<24} rows differing: {left:>5} -> {now:>5}; {what}",
                i + 1,
                plan.len()
            );
            left = now;
            if let Outcome::Finished(_) = outcome {
                // The run got through despite the kills before it: check
                // it, then start over so the next kills have work to cut.
                verify(rig, self.phase).await?;
                println!(
                    "  the run finished and checks out; starting over with a new table and ledger"
                );
                rig.start_over().await?;
                self.prepare(rig).await?;
                left = rig.differing(self.phase).await?;
            }
        }
        let last = rig.clean(self.phase).await?;
        println!(
            "  clean run: created={} updated={} deleted={} unchanged={} in {} ms; hits {:?}",
            last.created, last.updated, last.deleted, last.unchanged, last.elapsed_ms, last.hits
        );
        let summary: Vec<String> = fired
            .iter()
            .map(|(p, (k, n))| format!("{p} {k}/{n}"))
            .collect();
        println!("  kills that fired: {}", summary.join(", "));
        verify(rig, self.phase).await?;
        let total: u32 = fired.values().map(|(k, _)| k).sum();
        let given = std::env::var_os("WEIR_CRASH_PLAN").is_some();
        if !given && (total as usize) * 4 < plan.len() * 3 {
            return Err(Error::msg(format!(
                "only {total} of {} kills fired ({}): the hit numbers need calibrating",
                plan.len(),
                summary.join(", ")
            )));
        }
        println!(
            "crash scenario {} passed in {:.1} s",
            self.name,
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

/// After a clean run of `phase`: the table holds exactly its rows and
/// columns, one more run changes nothing, and the ledger tracks one state
/// per row (plus the table) and no failure.
async fn verify(rig: &mut Rig, phase: Phase) -> Result<()> {
    let declared = phase.desired();
    let (table, count, distinct) = rig.content().await?;
    let differences: Vec<Difference<'_>> = diff(&table, &declared).collect();
    if !differences.is_empty() {
        return Err(Error::msg(format!(
            "after a clean run of {}, {} rows differ from the declarations; the first ones: {}",
            phase.name(),
            differences.len(),
            differences
                .iter()
                .take(10)
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        )));
    }
    if count != declared.len() as i64 || distinct != count {
        return Err(Error::msg(format!(
            "the table has {count} rows ({distinct} distinct keys), {} are declared",
            declared.len()
        )));
    }
    let columns = rig.columns().await?;
    if columns != phase.columns() {
        return Err(Error::msg(format!(
            "the table's columns are {columns:?}, {:?} are declared",
            phase.columns()
        )));
    }
    let again = rig.clean(phase).await?;
    if (again.created, again.updated, again.deleted) != (0, 0, 0)
        || again.unchanged != declared.len() as u64 + 1
    {
        return Err(Error::msg(format!(
            "the ledger does not match the table: a run after the clean one did {again:?}"
        )));
    }
    let rows_tracked: u64 = again
        .providers
        .iter()
        .filter(|(p, _)| p.contains('/') && p.contains(rig.table.as_str()))
        .map(|(_, n)| n)
        .sum();
    if again.target_states != declared.len() as u64 + 1
        || rows_tracked != declared.len() as u64
        || !again.failures.is_empty()
    {
        return Err(Error::msg(format!(
            "the ledger tracks {} states ({rows_tracked} rows) and failures {:?}, \
             for {} declared rows and their table; providers {:?}",
            again.target_states,
            again.failures,
            declared.len(),
            again.providers
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The scenarios
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initial_sync_killed_at_twenty_points_ends_with_exactly_the_declared_rows() -> Result<()>
{
    if let Some(child) = as_child().await {
        return child;
    }
    Scenario {
        test: "an_initial_sync_killed_at_twenty_points_ends_with_exactly_the_declared_rows",
        name: "initial",
        before: None,
        phase: Phase::Initial,
        kills: 20,
        caps: [
            (fault::RECONCILE_BATCH, 400),
            (fault::SINK_BEFORE_APPLY, 8),
            (fault::SINK_AFTER_APPLY, 8),
            (fault::LEDGER_GROUP_COMMIT, 12),
        ],
    }
    .run()
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_half_the_rows_killed_at_twenty_points_leaves_exactly_the_other_half() -> Result<()>
{
    if let Some(child) = as_child().await {
        return child;
    }
    Scenario {
        test: "deleting_half_the_rows_killed_at_twenty_points_leaves_exactly_the_other_half",
        name: "delete_half",
        before: Some(Phase::Initial),
        phase: Phase::DeleteHalf,
        kills: 20,
        caps: [
            (fault::RECONCILE_BATCH, 300),
            (fault::SINK_BEFORE_APPLY, 16),
            (fault::SINK_AFTER_APPLY, 16),
            (fault::LEDGER_GROUP_COMMIT, 3),
        ],
    }
    .run()
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_a_column_killed_at_twenty_points_ends_with_every_row_in_the_new_shape() -> Result<()>
{
    if let Some(child) = as_child().await {
        return child;
    }
    Scenario {
        test: "adding_a_column_killed_at_twenty_points_ends_with_every_row_in_the_new_shape",
        name: "add_column",
        before: Some(Phase::Initial),
        phase: Phase::AddColumn,
        kills: 20,
        caps: [
            (fault::RECONCILE_BATCH, 400),
            (fault::SINK_BEFORE_APPLY, 8),
            (fault::SINK_AFTER_APPLY, 8),
            (fault::LEDGER_GROUP_COMMIT, 12),
        ],
    }
    .run()
    .await
}
