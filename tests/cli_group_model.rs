//! A model-based test of the leases and epochs of worker groups: random
//! schedules of joins, leaves (SIGTERM), kills (SIGKILL) and pauses
//! (SIGSTOP past the lease TTL, then SIGCONT) of real `weir sync --live
//! --group` processes sharing one PostgreSQL database, interleaved with
//! edits, additions and deletions of files.
//!
//! # Schedules
//!
//! A schedule is drawn from a seed, up front, by a model of the members
//! (stopped, running, paused) and of the tree: its steps only depend on
//! the seed, so a failing schedule is replayed with
//! `WEIR_GROUP_MODEL_SEED=<seed>` (which runs that one schedule instead of
//! [`SCHEDULES`] random ones). The seed and the steps are printed. Four
//! member ids share eight partitions with a 2 s lease TTL; a member id
//! that is started again reuses its ledger (a restarted process on the
//! same disk), once its previous process has exited and its membership
//! has ended. A schedule ends with every paused member resumed and at
//! least one member running.
//!
//! # What is checked
//!
//! 1. **The final state is exact.** Once the schedule is over, the group
//!    must settle within a bounded wait: every partition (the root's too)
//!    held by a running member, its target, and `documents` equal to the
//!    tree. The members then stop with SIGTERM (exit code 0, as must every
//!    member that was told to leave), and `documents` must hold exactly
//!    the tree's files, whole rows compared, and `chunks` exactly the rows
//!    a plain `weir sync` of the final tree writes into SQLite.
//! 2. **No two members ever commit under one partition's epoch**, checked
//!    on the commits themselves. Before any member starts, the test's
//!    fresh database gets an event trigger that puts row triggers on the
//!    tables as the members create them, and each process is started
//!    with `PGOPTIONS=-c weir_model.tag=member-N.K`, a setting of every
//!    connection it opens (both of its pools) naming the process. Then:
//!    - every bump of an epoch (`weir.fence`, the second half of a
//!      takeover) records the partition, the new epoch and the process
//!      that took it (`weir_model.take`);
//!    - every row written to `documents`, `chunks`, `weir.changelog`,
//!      `weir.snapshot`, `weir.partition_pass` and `weir.table_owner`,
//!      and every DDL command on a table of `public`, records in the same
//!      transaction the writing process, the fence rows that transaction
//!      holds locked (`pgrowlocks`: those its fence check locked `FOR
//!      SHARE`) and the epochs of the fence rows as it reads them
//!      (`weir_model.commit`). A rolled-back transaction records nothing,
//!      so the records are the commits.
//!
//!    The test then asserts, of every commit: it was made by a member
//!    process; it held the fence row of the partition it wrote for (the
//!    partition of the row's file, or the row's `partition` column); the
//!    epoch of each fence row it held was taken by the same process; and
//!    so no partition and epoch has commits of two processes.
//!
//!    This is sufficient: a fence row a transaction holds `FOR SHARE`
//!    cannot be updated before the transaction ends, so the epoch it reads
//!    in a trigger is the one it checked and commits under; and an epoch
//!    comes from a sequence, taken once. Two processes committing under one
//!    partition's epoch would show as a commit whose epoch was taken by
//!    another process (or never taken), and a write that skipped the
//!    fence, as a commit not holding its partition's fence row. A process
//!    is one run of one member id, so a member restarted under its id, or
//!    a paused one that wakes up, is told apart from its earlier self.
//! 3. While the schedule runs, the coordinator's tables are read every
//!    100 ms, and no partition may show two live owners (or two
//!    incarnations of one) at one epoch; no member running may exit on
//!    its own, and no member may panic.
//! 4. The check of the commits is checked too: at the end of each
//!    schedule a probe connection (no member) commits a changelog row under
//!    the epoch of a member, holding the fence row as a member would, and
//!    an update of `documents` holding no fence row; both must be
//!    reported.
//!
//! # Limits
//!
//! Replaying a seed replays the steps, not their timing: the processes
//! run in real time. A leave waits until the member watches the tree (it
//! handles SIGTERM from then on). The recording needs
//! a superuser (an event trigger) and the `pgrowlocks` extension
//! (PostgreSQL's contrib). A schedule that would start with less than
//! [`SCHEDULE_LEFT`] left of [`TEST_LIMIT`] (a very slow machine) is
//! skipped, and says so.

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli;
mod cmd;
mod pg;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::process::ExitStatus;
use std::time::{Duration, Instant, SystemTime};

use futures::FutureExt;
use sqlx::PgPool;
use weir::IntoStableKey;

use cli::group::{expected, file_name, member_id, Group, Member};
use cli::{Env, PgDatabase, TestResult};

/// The member ids a schedule uses: `member-0` to `member-3`.
const MEMBERS: usize = 4;

/// The group's partitions.
const PARTITIONS: u32 = 8;

/// The group's lease TTL, in seconds.
const LEASE_TTL: u64 = 2;

/// The arguments of a live member.
const LIVE: [&str; 3] = ["--live", "--debounce-ms", "100"];

/// The files of the tree a schedule starts with.
const FILES: usize = 120;

/// The schedules of a run, each with a seed of its own.
const SCHEDULES: usize = 3;

/// How long the steps of a schedule last, as the model counts time (its
/// waits): the run takes a little longer.
const SPAN: Duration = Duration::from_secs(10);

/// The variable that replays one schedule: its seed.
const SEED_VAR: &str = "WEIR_GROUP_MODEL_SEED";

/// How often the coordinator's tables are read while a schedule runs.
const POLL: Duration = Duration::from_millis(100);

/// How long the whole test may take: each wait is cut short by what is
/// left, so that a run ends (passing or failing) in time.
const TEST_LIMIT: Duration = Duration::from_secs(85);

/// The time a schedule needs at least: a later one is skipped (and says
/// so) when less is left of [`TEST_LIMIT`].
const SCHEDULE_LEFT: Duration = Duration::from_secs(25);

/// When the test must be done by (see [`TEST_LIMIT`]).
#[derive(Clone, Copy)]
struct Deadline(Instant);

impl Deadline {
    /// `limit`, or what is left before the deadline if less.
    fn within(self, limit: Duration) -> Duration {
        limit.min(self.0.saturating_duration_since(Instant::now()))
    }
}

// ------------------------------------------------------------- schedules

/// A step of a schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    /// Start member `n` (it joins the group).
    Join(usize),
    /// Send SIGTERM to member `n` (it leaves, releasing its partitions).
    Leave(usize),
    /// Send SIGKILL to member `n` (running or paused).
    Kill(usize),
    /// Send SIGSTOP to member `n`; a [`Step::Resume`] follows once more
    /// than the lease TTL has passed.
    Pause(usize),
    /// Send SIGCONT to member `n`.
    Resume(usize),
    /// Write new contents into these files.
    Edit(Vec<usize>),
    /// Create these files.
    Add(Vec<usize>),
    /// Delete these files.
    Delete(Vec<usize>),
    /// Let the members work.
    Wait(Duration),
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let files = |list: &[usize]| {
            list.iter()
                .map(|i| format!("f{i}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        match self {
            Step::Join(n) => write!(f, "join {}", member_id(*n)),
            Step::Leave(n) => write!(f, "leave {} (SIGTERM)", member_id(*n)),
            Step::Kill(n) => write!(f, "kill {} (SIGKILL)", member_id(*n)),
            Step::Pause(n) => write!(f, "pause {} (SIGSTOP)", member_id(*n)),
            Step::Resume(n) => write!(f, "resume {} (SIGCONT)", member_id(*n)),
            Step::Edit(list) => write!(f, "edit {}", files(list)),
            Step::Add(list) => write!(f, "add {}", files(list)),
            Step::Delete(list) => write!(f, "delete {}", files(list)),
            Step::Wait(d) => write!(f, "wait {} ms", d.as_millis()),
        }
    }
}

/// A member as the model sees it while drawing a schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Planned {
    Stopped,
    Running,
    /// Paused, to be resumed once the model's clock reaches this.
    Paused(Duration),
}

/// The kinds of steps drawn, with their weights.
#[derive(Clone, Copy)]
enum Kind {
    Join,
    Leave,
    Kill,
    Pause,
    Edit,
    Add,
    Delete,
    Wait,
}

/// `k` distinct elements of `from`, drawn with `rng`, sorted.
fn pick(rng: &mut fastrand::Rng, from: &BTreeSet<usize>, k: usize) -> Vec<usize> {
    let mut pool: Vec<usize> = from.iter().copied().collect();
    rng.shuffle(&mut pool);
    pool.truncate(k);
    pool.sort_unstable();
    pool
}

/// The schedule of `seed`: a pure function of it.
fn schedule(seed: u64) -> Vec<Step> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut members = [Planned::Stopped; MEMBERS];
    let mut files: BTreeSet<usize> = (0..FILES).collect();
    let mut next_file = FILES;
    let mut clock = Duration::ZERO;
    let mut steps = Vec::new();
    let first = rng.usize(..MEMBERS);
    members[first] = Planned::Running;
    steps.push(Step::Join(first));
    while clock < SPAN {
        for (n, member) in members.iter_mut().enumerate() {
            if matches!(*member, Planned::Paused(at) if at <= clock) {
                *member = Planned::Running;
                steps.push(Step::Resume(n));
            }
        }
        let with = |state: fn(&Planned) -> bool| -> Vec<usize> {
            (0..MEMBERS).filter(|n| state(&members[*n])).collect()
        };
        let stopped = with(|m| *m == Planned::Stopped);
        let running = with(|m| *m == Planned::Running);
        let paused = with(|m| matches!(m, Planned::Paused(_)));
        let mut kinds: Vec<(u32, Kind)> = vec![(2, Kind::Edit), (1, Kind::Add), (3, Kind::Wait)];
        if files.len() > FILES / 2 {
            kinds.push((1, Kind::Delete));
        }
        if !stopped.is_empty() {
            kinds.push((if running.len() < 2 { 4 } else { 1 }, Kind::Join));
        }
        if !running.is_empty() {
            kinds.push((1, Kind::Leave));
            if paused.len() < 2 {
                kinds.push((1, Kind::Pause));
            }
        }
        if !running.is_empty() || !paused.is_empty() {
            kinds.push((1, Kind::Kill));
        }
        let total: u32 = kinds.iter().map(|(w, _)| w).sum();
        let mut draw = rng.u32(..total);
        let kind = kinds
            .iter()
            .find(|(w, _)| {
                if draw < *w {
                    true
                } else {
                    draw -= w;
                    false
                }
            })
            .map(|(_, k)| *k)
            .unwrap();
        let step = match kind {
            Kind::Join => {
                let n = stopped[rng.usize(..stopped.len())];
                members[n] = Planned::Running;
                Step::Join(n)
            }
            Kind::Leave => {
                let n = running[rng.usize(..running.len())];
                members[n] = Planned::Stopped;
                Step::Leave(n)
            }
            Kind::Kill => {
                let alive: Vec<usize> = running.iter().chain(&paused).copied().collect();
                let n = alive[rng.usize(..alive.len())];
                members[n] = Planned::Stopped;
                Step::Kill(n)
            }
            Kind::Pause => {
                let n = running[rng.usize(..running.len())];
                let paused_for =
                    Duration::from_secs(LEASE_TTL) + Duration::from_millis(rng.u64(500..=2500));
                members[n] = Planned::Paused(clock + paused_for);
                Step::Pause(n)
            }
            Kind::Edit => {
                let k = rng.usize(1..=8);
                Step::Edit(pick(&mut rng, &files, k))
            }
            Kind::Add => {
                let k = rng.usize(1..=4);
                let added: Vec<usize> = (next_file..next_file + k).collect();
                next_file += k;
                files.extend(&added);
                Step::Add(added)
            }
            Kind::Delete => {
                let k = rng.usize(1..=4);
                let deleted = pick(&mut rng, &files, k);
                for i in &deleted {
                    files.remove(i);
                }
                Step::Delete(deleted)
            }
            Kind::Wait => {
                let d = Duration::from_millis(rng.u64(100..=1500));
                clock += d;
                Step::Wait(d)
            }
        };
        steps.push(step);
    }
    for (n, member) in members.iter_mut().enumerate() {
        if matches!(member, Planned::Paused(_)) {
            *member = Planned::Running;
            steps.push(Step::Resume(n));
        }
    }
    if !members.contains(&Planned::Running) {
        steps.push(Step::Join(rng.usize(..MEMBERS)));
    }
    steps
}

/// The seeds of this run: the one of [`SEED_VAR`] alone, or
/// [`SCHEDULES`] seeds drawn from the clock.
fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var(SEED_VAR) {
        let seed = seed.trim();
        let parsed = match seed.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => seed.parse(),
        };
        return vec![parsed.unwrap_or_else(|e| panic!("{SEED_VAR}={seed}: {e}"))];
    }
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let mut rng = fastrand::Rng::with_seed(u64::try_from(nanos % u128::from(u64::MAX)).unwrap());
    (0..SCHEDULES).map(|_| rng.u64(..)).collect()
}

// ------------------------------------------------------- recorded commits

/// What the test installs in its fresh database before any member runs:
/// the tables of takes and commits, and the triggers that fill them (see
/// the module docs). The event trigger puts the row triggers on the
/// tables as the members create them, in the transaction creating them,
/// so that no write escapes.
const RECORDING: &str = r#"
CREATE SCHEMA weir_model;
CREATE EXTENSION pgrowlocks SCHEMA weir_model;

CREATE TABLE weir_model.take (
    id bigserial PRIMARY KEY,
    partition integer NOT NULL,
    epoch bigint NOT NULL,
    previous bigint NOT NULL,
    tag text,
    at timestamptz NOT NULL DEFAULT clock_timestamp());

CREATE TABLE weir_model.commit (
    id bigserial PRIMARY KEY,
    tag text,
    tbl text NOT NULL,
    op text NOT NULL,
    key text,
    partition integer,
    locked integer[] NOT NULL,
    parts integer[] NOT NULL,
    epochs bigint[] NOT NULL,
    xact xid8 NOT NULL DEFAULT pg_current_xact_id(),
    at timestamptz NOT NULL DEFAULT clock_timestamp());

CREATE FUNCTION weir_model.record(p_tbl text, p_op text, p_key text, p_part integer)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO weir_model.commit (tag, tbl, op, key, partition, locked, parts, epochs)
    SELECT nullif(current_setting('weir_model.tag', true), ''), p_tbl, p_op, p_key, p_part,
           (SELECT coalesce(array_agg(f.partition ORDER BY f.partition), '{}')
              FROM weir_model.pgrowlocks('weir.fence') l
              JOIN weir.fence f ON f.ctid = l.locked_row
             WHERE pg_backend_pid() = ANY (l.pids)),
           e.parts, e.epochs
      FROM (SELECT coalesce(array_agg(partition ORDER BY partition), '{}') AS parts,
                   coalesce(array_agg(epoch ORDER BY partition), '{}') AS epochs
              FROM weir.fence) e;
END $$;

CREATE FUNCTION weir_model.on_row() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r jsonb;
BEGIN
    IF TG_OP = 'DELETE' THEN
        r := to_jsonb(OLD);
    ELSE
        r := to_jsonb(NEW);
    END IF;
    PERFORM weir_model.record(TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, TG_OP,
                              coalesce(r->>'path', r->>'table_name'),
                              (r->>'partition')::integer);
    RETURN NULL;
END $$;

CREATE FUNCTION weir_model.on_take() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.epoch <> OLD.epoch THEN
        INSERT INTO weir_model.take (partition, epoch, previous, tag)
        VALUES (NEW.partition, NEW.epoch, OLD.epoch,
                nullif(current_setting('weir_model.tag', true), ''));
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION weir_model.on_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
        CONTINUE WHEN c.command_tag = 'CREATE TRIGGER';
        IF c.command_tag = 'CREATE TABLE' THEN
            IF c.object_identity IN ('public.documents', 'public.chunks', 'weir.changelog',
                                     'weir.snapshot', 'weir.table_owner') THEN
                EXECUTE format('CREATE OR REPLACE TRIGGER weir_model_commit
                                AFTER INSERT OR UPDATE OR DELETE ON %s
                                FOR EACH ROW EXECUTE FUNCTION weir_model.on_row()',
                               c.object_identity);
            ELSIF c.object_identity = 'weir.partition_pass' THEN
                EXECUTE 'CREATE OR REPLACE TRIGGER weir_model_commit
                         AFTER UPDATE ON weir.partition_pass
                         FOR EACH ROW EXECUTE FUNCTION weir_model.on_row()';
            ELSIF c.object_identity = 'weir.fence' THEN
                EXECUTE 'CREATE OR REPLACE TRIGGER weir_model_take
                         AFTER UPDATE ON weir.fence
                         FOR EACH ROW EXECUTE FUNCTION weir_model.on_take()';
            END IF;
        END IF;
        IF c.schema_name = 'public' THEN
            PERFORM weir_model.record('ddl', c.command_tag, c.object_identity, NULL);
        END IF;
    END LOOP;
END $$;

CREATE EVENT TRIGGER weir_model_ddl ON ddl_command_end
    EXECUTE FUNCTION weir_model.on_ddl();
"#;

/// A recorded commit: a row of `weir_model.commit`.
type CommitRow = (
    i64,
    Option<String>,
    String,
    String,
    Option<String>,
    Option<i32>,
    Vec<i32>,
    Vec<i32>,
    Vec<i64>,
);

/// The data partition of the file at `path` (relative to the tree): each
/// file is a component keyed by its path.
fn partition_of(path: &str) -> i32 {
    let n = weir::group::partition_of(&path.into_stable_key(), PARTITIONS);
    i32::try_from(n).unwrap()
}

/// What the recorded commits showed.
#[derive(Debug, Default)]
struct Commits {
    /// Commits checked.
    commits: usize,
    /// Epochs taken.
    takes: usize,
    /// The partitions and epochs committed under, each with the process
    /// that did.
    epochs: BTreeMap<(i32, i64), BTreeSet<String>>,
    /// Commits by table.
    tables: BTreeMap<String, usize>,
    /// What is wrong, at most a few dozen lines.
    violations: Vec<String>,
}

impl Commits {
    fn violation(&mut self, line: String) {
        if self.violations.len() < 40 {
            self.violations.push(line);
        }
    }
}

/// Reads the takes and commits recorded, and checks every commit (see
/// the module docs).
async fn check_commits(pool: &PgPool) -> Commits {
    let takes: Vec<(i32, i64, Option<String>)> =
        sqlx::query_as("SELECT partition, epoch, tag FROM weir_model.take ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    let rows: Vec<CommitRow> = sqlx::query_as(
        "SELECT id, tag, tbl, op, key, partition, locked, parts, epochs
           FROM weir_model.commit ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut out = Commits {
        commits: rows.len(),
        takes: takes.len(),
        ..Commits::default()
    };
    let mut taker: BTreeMap<(i32, i64), Option<String>> = BTreeMap::new();
    for (partition, epoch, tag) in takes {
        if let Some(earlier) = taker.insert((partition, epoch), tag.clone()) {
            out.violation(format!(
                "epoch {epoch} of partition {partition} was taken twice: by {earlier:?} and {tag:?}"
            ));
        }
    }
    for (id, tag, table, op, key, partition, locked, parts, epochs) in rows {
        *out.tables.entry(table.clone()).or_default() += 1;
        let what = format!("commit #{id} ({op} {table} {key:?})");
        let Some(tag) = tag else {
            out.violation(format!("{what} was made by a connection of no member"));
            continue;
        };
        let epoch_of = |p: i32| {
            parts
                .iter()
                .position(|q| *q == p)
                .and_then(|at| epochs.get(at).copied())
        };
        let written = match (table.as_str(), partition) {
            (_, Some(p)) => Some(p),
            ("public.documents" | "public.chunks", None) => {
                Some(partition_of(key.as_deref().unwrap_or_default()))
            }
            _ => None,
        };
        if let Some(p) = written {
            if !locked.contains(&p) {
                out.violation(format!(
                    "{what} by {tag} wrote for partition {p} without holding its fence row (held: {locked:?})"
                ));
            }
            if let Some(e) = epoch_of(p) {
                out.epochs.entry((p, e)).or_default().insert(tag.clone());
            }
        } else if locked.is_empty() {
            out.violation(format!("{what} by {tag} held no fence row"));
        }
        for p in locked.iter().copied().chain(written) {
            let Some(e) = epoch_of(p) else {
                out.violation(format!("{what} by {tag}: partition {p} has no fence row"));
                continue;
            };
            match taker.get(&(p, e)) {
                Some(Some(by)) if *by == tag => {}
                Some(by) => out.violation(format!(
                    "{what} by {tag} committed under epoch {e} of partition {p}, which {} took",
                    by.as_deref().unwrap_or("a connection of no member")
                )),
                None => out.violation(format!(
                    "{what} by {tag} committed under epoch {e} of partition {p}, which nobody took"
                )),
            }
        }
    }
    let doubles: Vec<String> = out
        .epochs
        .iter()
        .filter(|(_, tags)| tags.len() > 1)
        .map(|((p, e), tags)| format!("partition {p} epoch {e}: commits of {tags:?}"))
        .collect();
    for line in doubles {
        out.violation(line);
    }
    out
}

// ------------------------------------------------ the coordinator's tables

/// A partition's row as [`Watch::read`] reads it: number, owner, its
/// incarnation, target, epoch (the announced one if newer), whether the
/// owner's membership is live.
type PartitionRow = (i32, Option<String>, Option<i64>, Option<String>, i64, bool);

/// Reads the group's partitions, and checks at each read that no
/// partition is held by two members (two owners, or two incarnations of
/// one) at one epoch over the whole schedule.
struct Watch {
    pool: PgPool,
    group: String,
    holders: BTreeMap<(i32, i64), (String, i64)>,
    reads: usize,
    /// The first partition seen held by two members at one epoch.
    conflict: Option<String>,
}

impl Watch {
    /// The partitions now (none until a member created the group); sets
    /// [`Watch::conflict`] when one is held by two members at one epoch.
    async fn read(&mut self) -> Vec<PartitionRow> {
        let rows: Vec<PartitionRow> = sqlx::query_as(
            "SELECT p.partition, p.owner, p.owner_incarnation, p.target,
                    GREATEST(f.epoch, i.pending_epoch), m.member_id IS NOT NULL
               FROM weir.partition p
               JOIN weir.fence f ON f.group_name = p.group_name AND f.partition = p.partition
               LEFT JOIN weir.fence_intent i
                 ON i.group_name = p.group_name AND i.partition = p.partition
               LEFT JOIN weir.member m
                 ON m.group_name = p.group_name AND m.member_id = p.owner
                AND m.incarnation = p.owner_incarnation AND m.expires_at > now()
              WHERE p.group_name = $1
              ORDER BY p.partition",
        )
        .bind(&self.group)
        .fetch_all(&self.pool)
        .await
        .unwrap_or_default();
        self.reads += 1;
        for (partition, owner, incarnation, _, epoch, live) in &rows {
            let (Some(owner), Some(incarnation), true) = (owner, incarnation, live) else {
                continue;
            };
            let holder = (owner.clone(), *incarnation);
            let seen = self
                .holders
                .entry((*partition, *epoch))
                .or_insert_with(|| holder.clone());
            if *seen != holder && self.conflict.is_none() {
                self.conflict = Some(format!(
                    "partition {partition} was held at epoch {epoch} by two members: {seen:?} and {holder:?}"
                ));
            }
        }
        rows
    }

    /// The ids of the live members.
    async fn members(&self) -> BTreeSet<String> {
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT member_id FROM weir.member
              WHERE group_name = $1 AND expires_at > clock_timestamp()",
        )
        .bind(&self.group)
        .fetch_all(&self.pool)
        .await
        .unwrap_or_default();
        ids.into_iter().collect()
    }

    /// Whether `id` has a live membership.
    async fn is_member(&self, id: &str) -> bool {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM weir.member
                             WHERE group_name = $1 AND member_id = $2
                               AND expires_at > clock_timestamp())",
        )
        .bind(&self.group)
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .unwrap_or(false)
    }
}

// ------------------------------------------------------------- the run

/// What the test expects of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Running: it must not exit on its own.
    Running,
    /// Stopped with SIGSTOP.
    Paused,
    /// Sent SIGTERM: it must exit with code 0.
    Leaving,
    /// Killed with SIGKILL.
    Killed,
}

/// A member process of the schedule.
struct Process {
    member: Member,
    /// The `weir_model.tag` of its connections: `member-N.K`, its K-th start.
    tag: String,
    fate: Fate,
    /// Its exit status once seen.
    status: Option<ExitStatus>,
}

/// The last `n` characters of `text`.
fn tail(text: &str, n: usize) -> &str {
    let start = text.len().saturating_sub(n);
    let start = (start..=text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    &text[start..]
}

/// A schedule running on a tree and a database.
struct Run<'a> {
    env: &'a Env,
    url: &'a str,
    /// The seed of a random schedule; `None` for a fixed one.
    seed: Option<u64>,
    deadline: Deadline,
    start: Instant,
    watch: Watch,
    /// Every process started, in order.
    processes: Vec<Process>,
    /// The process of each member id, the last one started.
    current: [Option<usize>; MEMBERS],
    /// Starts of each member id.
    starts: [usize; MEMBERS],
    /// What was done, with when.
    log: Vec<String>,
    /// Edits made: each writes new contents.
    edits: usize,
}

impl Run<'_> {
    fn group(&self) -> Group<'static> {
        Group {
            name: "model",
            partitions: PARTITIONS,
            lease_ttl: LEASE_TTL,
        }
    }

    fn note(&mut self, line: String) {
        let line = format!("{:>7.2}s {line}", self.start.elapsed().as_secs_f64());
        eprintln!("{line}");
        self.log.push(line);
    }

    /// Fails the test, showing the seed, what was done and the members'
    /// output.
    fn fail(&self, what: &str) -> ! {
        let outputs: Vec<String> = self
            .processes
            .iter()
            .map(|p| {
                format!(
                    "--- {} ({:?}, {:?})\nstdout: {}\nstderr (end): {}",
                    p.tag,
                    p.fate,
                    p.status,
                    tail(&p.member.stdout(), 2000),
                    tail(&p.member.stderr(), 6000)
                )
            })
            .collect();
        panic!(
            "{what}\n{}run:\n{}\n{}",
            self.seed.map_or_else(String::new, |seed| format!(
                "seed {seed} (replay with {SEED_VAR}={seed})\n"
            )),
            self.log.join("\n"),
            outputs.join("\n")
        );
    }

    fn process(&mut self, n: usize) -> &mut Process {
        let at = self.current[n].expect("the member was started");
        &mut self.processes[at]
    }

    /// The group's partitions now (see [`Watch::read`]); fails when one
    /// was seen held by two members at one epoch.
    async fn read_group(&mut self) -> Vec<PartitionRow> {
        let rows = self.watch.read().await;
        if let Some(conflict) = self.watch.conflict.take() {
            self.fail(&conflict);
        }
        rows
    }

    /// Checks that no running process exited on its own, and sees the
    /// exit of those told to leave.
    fn check_processes(&mut self) {
        let mut died = None;
        for p in &mut self.processes {
            if p.status.is_some() || matches!(p.fate, Fate::Killed | Fate::Paused) {
                continue;
            }
            if let Some(status) = p.member.try_wait() {
                p.status = Some(status);
                if p.fate == Fate::Running {
                    died = Some(format!("{} exited on its own: {status}", p.tag));
                }
            }
        }
        if let Some(what) = died {
            self.fail(&what);
        }
    }

    /// Waits `d`, reading the group every [`POLL`].
    async fn wait(&mut self, d: Duration) {
        let end = Instant::now() + self.deadline.within(d);
        loop {
            self.read_group().await;
            self.check_processes();
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            tokio::time::sleep(left.min(POLL)).await;
        }
    }

    /// Starts member `n`, once its previous process has exited and its
    /// membership ended (a member id is refused while it is live).
    async fn join(&mut self, n: usize) {
        if let Some(at) = self.current[n] {
            if self.processes[at].status.is_none() {
                let limit = self.deadline.within(Duration::from_secs(20));
                let status = self.processes[at].member.wait(limit);
                self.processes[at].status = status;
                if status.is_none() {
                    let tag = self.processes[at].tag.clone();
                    self.fail(&format!("{tag} did not exit within {limit:?} of SIGTERM"));
                }
            }
            let id = member_id(n);
            let limit = Duration::from_secs(LEASE_TTL * 3);
            let waited = Instant::now();
            while self.watch.is_member(&id).await {
                if waited.elapsed() > self.deadline.within(limit) {
                    self.fail(&format!("the membership of {id} did not end"));
                }
                self.read_group().await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let tag = format!("{}.{}", member_id(n), self.starts[n]);
        self.starts[n] += 1;
        let options = format!("-c weir_model.tag={tag}");
        let member = Member::start_env(
            self.env,
            self.url,
            &self.group(),
            n,
            &LIVE,
            &[("PGOPTIONS", &options)],
        );
        self.note(format!("started {tag} (pid {})", member.pid()));
        self.current[n] = Some(self.processes.len());
        self.processes.push(Process {
            member,
            tag,
            fate: Fate::Running,
            status: None,
        });
    }

    /// Waits (up to 15 s) for member `n` to log that it watches the
    /// tree: it handles SIGTERM from then on. Before, SIGTERM ends it as
    /// SIGKILL would, which a leave is not meant to test.
    async fn until_watching(&mut self, n: usize) {
        let limit = self.deadline.within(Duration::from_secs(15));
        let start = Instant::now();
        while !self.process(n).member.stderr().contains("watching ") {
            if start.elapsed() > limit {
                let tag = self.process(n).tag.clone();
                self.fail(&format!("{tag} did not start watching within {limit:?}"));
            }
            self.read_group().await;
            self.check_processes();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn contents(&mut self, i: usize) -> String {
        self.edits += 1;
        format!(
            "file {i}, version {}\n\nsecond paragraph of {i}\n",
            self.edits
        )
    }

    async fn step(&mut self, step: &Step) {
        if !matches!(step, Step::Wait(_)) {
            self.note(step.to_string());
        }
        match step {
            Step::Join(n) => self.join(*n).await,
            Step::Leave(n) => {
                self.until_watching(*n).await;
                let p = self.process(*n);
                p.member.signal("TERM");
                p.fate = Fate::Leaving;
            }
            Step::Kill(n) => {
                let p = self.process(*n);
                p.member.kill();
                p.fate = Fate::Killed;
                p.status = p.member.try_wait();
            }
            Step::Pause(n) => {
                let p = self.process(*n);
                p.member.signal("STOP");
                p.fate = Fate::Paused;
            }
            Step::Resume(n) => {
                let p = self.process(*n);
                p.member.signal("CONT");
                p.fate = Fate::Running;
            }
            Step::Edit(files) | Step::Add(files) => {
                for i in files {
                    let contents = self.contents(*i);
                    self.env.put(&file_name(*i), contents);
                }
            }
            Step::Delete(files) => {
                for i in files {
                    std::fs::remove_file(self.env.path(&file_name(*i))).unwrap();
                }
            }
            Step::Wait(d) => self.wait(*d).await,
        }
    }

    /// The ids of the members running.
    fn running(&self) -> BTreeSet<String> {
        self.processes
            .iter()
            .filter(|p| p.fate == Fate::Running)
            .map(|p| p.member.id.clone())
            .collect()
    }

    /// Waits for the processes told to leave to exit, each with code 0.
    fn await_leavers(&mut self) {
        for at in 0..self.processes.len() {
            let p = &mut self.processes[at];
            if p.fate != Fate::Leaving || p.status.is_some() {
                continue;
            }
            p.status = p.member.wait(self.deadline.within(Duration::from_secs(20)));
        }
        let bad: Vec<String> = self
            .processes
            .iter()
            .filter(|p| p.fate == Fate::Leaving && p.status.and_then(|s| s.code()) != Some(0))
            .map(|p| format!("{}: {:?}", p.tag, p.status))
            .collect();
        if !bad.is_empty() {
            self.fail(&format!(
                "members told to leave did not exit with 0: {bad:?}"
            ));
        }
    }

    /// Waits (bounded) for the group to settle: every partition held by a
    /// running member, its target, and `documents` equal to the tree.
    async fn settle(&mut self, pg: &PgDatabase, limit: Duration) -> Option<Duration> {
        let start = Instant::now();
        let running = self.running();
        let tree: BTreeMap<String, String> = expected(&self.env.tree)
            .into_iter()
            .map(|(path, doc)| (path, doc.fingerprint))
            .collect();
        let limit = self.deadline.within(limit);
        while start.elapsed() < limit {
            self.check_processes();
            let rows = self.read_group().await;
            let watching = self
                .processes
                .iter()
                .all(|p| p.fate != Fate::Running || p.member.stderr().contains("watching "));
            let members = self.watch.members().await;
            let held = watching
                && members == running
                && rows.len() == usize::try_from(PARTITIONS).unwrap() + 1
                && rows.iter().all(|(_, owner, _, target, _, live)| {
                    *live && owner.as_ref().is_some_and(|o| running.contains(o)) && target == owner
                });
            if held {
                let docs: Result<Vec<(String, String)>, sqlx::Error> =
                    sqlx::query_as("SELECT path, fingerprint FROM documents")
                        .fetch_all(&self.watch.pool)
                        .await;
                if docs.is_ok_and(|d| d.into_iter().collect::<BTreeMap<_, _>>() == tree)
                    && pg.docs().await == expected(&self.env.tree)
                {
                    return Some(start.elapsed());
                }
            }
            tokio::time::sleep(POLL).await;
        }
        None
    }

    /// Stops the running members with SIGTERM: each must exit with 0.
    async fn stop_all(&mut self) {
        for n in 0..MEMBERS {
            let Some(at) = self.current[n] else {
                continue;
            };
            if self.processes[at].fate != Fate::Running {
                continue;
            }
            self.until_watching(n).await;
            let p = &mut self.processes[at];
            p.member.signal("TERM");
            p.fate = Fate::Leaving;
        }
        self.await_leavers();
    }

    /// Whether a member panicked.
    fn panics(&self) -> Vec<String> {
        self.processes
            .iter()
            .filter(|p| {
                let stderr = p.member.stderr();
                stderr.contains("panicked") || stderr.contains("RUST_BACKTRACE")
            })
            .map(|p| p.tag.clone())
            .collect()
    }
}

/// A tree of [`FILES`] files in a new temporary directory.
fn tree() -> Env {
    let env = Env::new();
    for i in 0..FILES {
        env.put(
            &file_name(i),
            format!("file {i}\n\nsecond paragraph of {i}\n"),
        );
    }
    env
}

/// Installs the recording of takes and commits ([`RECORDING`]) in `pg`,
/// before any member runs: a pool on it.
async fn record(pg: &PgDatabase) -> Result<PgPool, sqlx::Error> {
    let pool = pg.pool().await;
    sqlx::raw_sql(RECORDING).execute(&pool).await?;
    Ok(pool)
}

/// Runs the schedule of `seed` on a fresh tree and database `pg`.
async fn run_schedule(pg: &PgDatabase, seed: u64, deadline: Deadline) -> TestResult {
    let steps = schedule(seed);
    eprintln!(
        "schedule of seed {seed} (replay with {SEED_VAR}={seed}), {} steps:",
        steps.len()
    );
    for step in &steps {
        eprintln!("  {step}");
    }
    let env = tree();
    let pool = record(pg).await?;
    let mut run = Run::new(&env, pg, Some(seed), deadline).await;
    for step in &steps {
        run.step(step).await;
    }
    run.finish(pg, &pool).await;
    pool.close().await;
    Ok(())
}

impl<'a> Run<'a> {
    /// A run on the tree of `env` and the database `pg`, with no member
    /// yet.
    async fn new(
        env: &'a Env,
        pg: &'a PgDatabase,
        seed: Option<u64>,
        deadline: Deadline,
    ) -> Run<'a> {
        Run {
            env,
            url: &pg.url,
            seed,
            deadline,
            start: Instant::now(),
            watch: Watch {
                pool: pg.pool().await,
                group: "model".into(),
                holders: BTreeMap::new(),
                reads: 0,
                conflict: None,
            },
            processes: Vec::new(),
            current: [None; MEMBERS],
            starts: [0; MEMBERS],
            log: Vec::new(),
            edits: 0,
        }
    }

    /// Once the steps are done: the group settles, the members stop, and
    /// the tables and the commits recorded in `pool` are checked (see the
    /// module docs); fails the test otherwise.
    async fn finish(mut self, pg: &PgDatabase, pool: &PgPool) {
        self.note("schedule done; settling".into());

        // What `chunks` must hold: a plain sync of the final tree into SQLite.
        cli::ok(&self.env.sync(&[]));
        let reference_chunks = self.env.chunks().await;

        self.await_leavers();
        let Some(took) = self.settle(pg, Duration::from_secs(30)).await else {
            let rows = self.read_group().await;
            let docs = pg.docs().await;
            let tree = expected(&self.env.tree);
            let missing: Vec<&String> = tree.keys().filter(|k| !docs.contains_key(*k)).collect();
            let extra: Vec<&String> = docs.keys().filter(|k| !tree.contains_key(*k)).collect();
            let stale: Vec<&String> = tree
                .iter()
                .filter(|(k, d)| docs.get(*k).is_some_and(|have| have != *d))
                .map(|(k, _)| k)
                .collect();
            let running = self.running();
            self.fail(&format!(
                "the group did not settle: partitions {rows:?}\nrunning {running:?}\nmissing {missing:?}\nextra {extra:?}\nstale {stale:?}"
            ));
        };
        self.note(format!("settled in {:.2}s", took.as_secs_f64()));
        self.stop_all().await;
        self.note("members stopped".into());

        // Nothing can write any more: the tables must be the tree.
        let docs = pg.docs().await;
        if docs != expected(&self.env.tree) {
            self.fail("documents is not the tree once the members stopped");
        }
        let chunks = pg.chunks().await;
        if chunks != reference_chunks {
            let differ: Vec<&String> = chunks
                .keys()
                .chain(reference_chunks.keys())
                .filter(|k| chunks.get(*k) != reference_chunks.get(*k))
                .collect();
            self.fail(&format!("chunks differ from a plain sync's for {differ:?}"));
        }
        let panics = self.panics();
        if !panics.is_empty() {
            self.fail(&format!("members panicked: {panics:?}"));
        }

        let commits = check_commits(pool).await;
        let summary = format!(
            "{} commits under {} partition epochs of {} taken, by table {:?}; {} reads of the group",
            commits.commits,
            commits.epochs.len(),
            commits.takes,
            commits.tables,
            self.watch.reads
        );
        self.note(summary);
        if !commits.violations.is_empty() {
            self.fail(&format!(
                "the commits break the fencing:\n{}",
                commits.violations.join("\n")
            ));
        }
        // The recording saw what the members did: the triggers were in place.
        for table in ["public.documents", "public.chunks", "weir.changelog"] {
            if commits.tables.get(table).copied().unwrap_or(0) == 0 {
                self.fail(&format!("no commit to {table} was recorded"));
            }
        }
        if commits.takes <= usize::try_from(PARTITIONS).unwrap() {
            self.fail(&format!("only {} epochs were taken", commits.takes));
        }
        // The check is checked: a commit under a member's epoch by another
        // connection, and a write holding no fence row, are both reported.
        probe(pool).await;
        let probed = check_commits(pool).await;
        let caught = |what: &str| {
            probed
                .violations
                .iter()
                .any(|v| v.contains("by probe") && v.contains(what))
        };
        if !caught("which member-") || !caught("without holding its fence row") {
            self.fail(&format!(
                "the check of the commits missed the probe's: {:?}",
                probed.violations
            ));
        }
        self.watch.pool.close().await;
    }
}

/// Commits what the check of the commits must report, as the connection
/// `probe` (no member): a changelog row of partition 0 under the epoch
/// of its last owner, its fence row held as a member holds it, and an
/// update of a `documents` row holding no fence row.
async fn probe(pool: &PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    sqlx::raw_sql(
        "SET weir_model.tag = 'probe';
         BEGIN;
         SELECT epoch FROM weir.fence WHERE group_name = 'model' AND partition = 0 FOR SHARE;
         INSERT INTO weir.changelog (group_name, partition, seq, pos, kind, component, entry)
         VALUES ('model', 0, nextval('weir.changelog_seq'), 0, 1, '\\x00', '\\x00');
         COMMIT;
         BEGIN;
         UPDATE documents SET content = content WHERE path = (SELECT min(path) FROM documents);
         COMMIT;
         RESET weir_model.tag;",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
}

/// [`PgDatabase::around`], where a panic of `body` (a failed check) still
/// drops the database, once the members are killed: the panic goes on
/// once it is dropped.
async fn around(test: &str, body: impl AsyncFnOnce(&PgDatabase) -> TestResult) -> TestResult {
    let mut panicked = None;
    let outcome = PgDatabase::around(test, async |pg| {
        match AssertUnwindSafe(body(pg)).catch_unwind().await {
            Ok(outcome) => outcome,
            Err(panic) => {
                panicked = Some(panic);
                Ok(())
            }
        }
    })
    .await;
    if let Some(panic) = panicked {
        std::panic::resume_unwind(panic);
    }
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_schedules_of_joins_leaves_kills_and_pauses_end_exact_and_never_commit_one_epoch_twice(
) -> TestResult {
    let deadline = Deadline(Instant::now() + TEST_LIMIT);
    let seeds = seeds();
    eprintln!("seeds: {seeds:?}");
    for (i, seed) in seeds.into_iter().enumerate() {
        let left = deadline.within(TEST_LIMIT);
        if left < SCHEDULE_LEFT {
            eprintln!(
                "schedule {i} (seed {seed}) skipped: {:.1}s left of the test's {TEST_LIMIT:?} (a slow machine)",
                left.as_secs_f64()
            );
            continue;
        }
        around(&format!("group_model_{i}"), async |pg| {
            run_schedule(pg, seed, deadline).await
        })
        .await?;
    }
    Ok(())
}

#[test]
fn a_schedule_is_a_function_of_its_seed_and_ends_with_a_member_running() {
    for seed in 0..200 {
        let steps = schedule(seed);
        assert_eq!(steps, schedule(seed));
        let mut state = [Planned::Stopped; MEMBERS];
        for step in &steps {
            match step {
                Step::Join(n) => {
                    assert_eq!(state[*n], Planned::Stopped, "seed {seed}: {step}");
                    state[*n] = Planned::Running;
                }
                Step::Leave(n) | Step::Pause(n) => {
                    assert_eq!(state[*n], Planned::Running, "seed {seed}: {step}");
                    state[*n] = if matches!(step, Step::Pause(_)) {
                        Planned::Paused(Duration::ZERO)
                    } else {
                        Planned::Stopped
                    };
                }
                Step::Kill(n) => {
                    assert_ne!(state[*n], Planned::Stopped, "seed {seed}: {step}");
                    state[*n] = Planned::Stopped;
                }
                Step::Resume(n) => {
                    assert!(
                        matches!(state[*n], Planned::Paused(_)),
                        "seed {seed}: {step}"
                    );
                    state[*n] = Planned::Running;
                }
                _ => {}
            }
        }
        assert!(state.contains(&Planned::Running), "seed {seed}");
        assert!(!state.iter().any(|s| matches!(s, Planned::Paused(_))));
    }
}

// ------------------------------------------------ schedules that fail now

/// Makes the creation of `documents` take `SECONDS` (a `pg_sleep` in an
/// event trigger at the end of its `CREATE TABLE`, in the creating
/// transaction): a window, otherwise a few milliseconds wide, in which
/// the root partition's holder created no table yet, to stop a member in.
const SLOW_DOCUMENTS: &str = r#"
CREATE FUNCTION weir_model.slow_documents() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
        IF c.command_tag = 'CREATE TABLE' AND c.object_identity = 'public.documents' THEN
            PERFORM pg_sleep(SECONDS);
        END IF;
    END LOOP;
END $$;
CREATE EVENT TRIGGER weir_model_slow_documents ON ddl_command_end
    EXECUTE FUNCTION weir_model.slow_documents();
"#;

impl Run<'_> {
    /// Waits (up to 20 s) for a member's connection to sleep in the creation
    /// of `documents` (see [`SLOW_DOCUMENTS`]).
    async fn until_creating_documents(&mut self) {
        let start = Instant::now();
        loop {
            let sleeping: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                                 WHERE datname = current_database() AND wait_event = 'PgSleep')",
            )
            .fetch_one(&self.watch.pool)
            .await
            .unwrap();
            if sleeping {
                self.note("a member is creating documents".into());
                return;
            }
            if start.elapsed() > self.deadline.within(Duration::from_secs(20)) {
                self.fail("no member began to create documents");
            }
            self.read_group().await;
            self.check_processes();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends SIGTERM to member `n` once it watches the tree, whatever its
    /// runs did.
    async fn leave_now(&mut self, n: usize) {
        self.until_watching(n).await;
        self.note(format!("leave {} (SIGTERM)", member_id(n)));
        let p = self.process(n);
        p.member.signal("TERM");
        p.fate = Fate::Leaving;
    }

    /// The tables of `public`, sorted.
    async fn tables(&self) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT table_name::text FROM information_schema.tables
              WHERE table_schema = 'public' ORDER BY 1",
        )
        .fetch_all(&self.watch.pool)
        .await
        .unwrap()
    }
}

/// A member told to leave (SIGTERM) while it creates the tables, as the
/// root partition's holder, finishes creating `documents` and exits
/// without creating `chunks`; started again on its ledger, it creates
/// `chunks` and goes on (a table the ledger never tracked is not one
/// dropped by hand). The slow creation of `documents` makes the leave
/// land between the two tables' creations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_left_while_it_created_the_tables_starts_again_on_its_ledger() -> TestResult {
    around("group_model_partial_tables", async |pg| {
        let deadline = Deadline(Instant::now() + TEST_LIMIT);
        let env = tree();
        let pool = record(pg).await?;
        sqlx::raw_sql(&SLOW_DOCUMENTS.replace("SECONDS", "3"))
            .execute(&pool)
            .await?;
        let mut run = Run::new(&env, pg, None, deadline).await;
        run.step(&Step::Join(0)).await;
        run.until_creating_documents().await;
        run.leave_now(0).await;
        run.await_leavers();
        let tables = run.tables().await;
        if tables != ["documents"] {
            run.fail(&format!(
                "the premise failed: the tables are {tables:?}, not documents alone"
            ));
        }
        run.step(&Step::Join(0)).await;
        run.step(&Step::Edit(vec![1, 2, 3])).await;
        run.step(&Step::Wait(Duration::from_secs(3))).await;
        run.finish(pg, &pool).await;
        pool.close().await;
        TestResult::Ok(())
    })
    .await
}

/// A live member that is not the root partition's holder waits for the
/// holder to create the tables (its runs are "root-pending", by design);
/// stopped with SIGTERM during that wait, it exits with code 0: waiting
/// for the holder is not a failed file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_member_stopped_while_it_waits_for_the_root_holder_exits_with_0() -> TestResult {
    around("group_model_root_pending", async |pg| {
        let deadline = Deadline(Instant::now() + TEST_LIMIT);
        let env = tree();
        let pool = record(pg).await?;
        sqlx::raw_sql(&SLOW_DOCUMENTS.replace("SECONDS", "8"))
            .execute(&pool)
            .await?;
        let mut run = Run::new(&env, pg, None, deadline).await;
        run.step(&Step::Join(0)).await;
        run.until_creating_documents().await;
        run.step(&Step::Join(1)).await;
        let start = Instant::now();
        while !run.process(1).member.stderr().contains("declaration wins") {
            if start.elapsed() > Duration::from_secs(15) {
                run.fail("the premise failed: member-1 never waited for the root holder");
            }
            run.read_group().await;
            run.check_processes();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        run.note("member-1 waits for the root holder".into());
        run.leave_now(1).await;
        run.await_leavers();
        run.finish(pg, &pool).await;
        pool.close().await;
        TestResult::Ok(())
    })
    .await
}
