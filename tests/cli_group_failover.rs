//! Worker groups failing over, end to end, with real `weir sync --group`
//! processes on one PostgreSQL database: a member killed mid-sync, a
//! member with an empty ledger taking over changed files, a member paused
//! past its lease that wakes up, and members joining and leaving a live
//! group. Each time the tables end equal to the tree, nothing unchanged
//! is written again, and nothing stale is written at all.
//!
//! Besides the tables, the tests read the coordinator's own tables
//! (schema `weir`: `partition`, `fence`, `fence_intent`, `member`,
//! `partition_pass`, `changelog`, `snapshot`) to see who holds what, and
//! check at every read that no partition is ever held by two members at
//! the same epoch.

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli;
mod cmd;
mod pg;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use weir::IntoStableKey;

use cli::group::{expected, file_name, generate, Group, Member};
use cli::{Env, PgDatabase, TestResult};

/// The arguments of a live member.
const LIVE: [&str; 3] = ["--live", "--debounce-ms", "100"];

/// How often the tests read the tables while waiting.
const POLL: Duration = Duration::from_millis(50);

/// How often the tests read the coordinator's tables to catch a member
/// mid-sync.
const FAST_POLL: Duration = Duration::from_millis(5);

/// How long a test may wait in all: each wait is cut short by what is
/// left of it, so that a test ends (passing or failing) within 90 s
/// however slow the machine.
const TEST_LIMIT: Duration = Duration::from_secs(85);

/// When a test must be done by (see [`TEST_LIMIT`]).
struct Deadline(Instant);

impl Deadline {
    fn start() -> Deadline {
        Deadline(Instant::now() + TEST_LIMIT)
    }

    /// `secs` seconds, or what is left before the deadline if less.
    fn within(&self, secs: u64) -> Duration {
        Duration::from_secs(secs).min(self.0.saturating_duration_since(Instant::now()))
    }
}

/// Writes `files` text files of about 35 KB (20 paragraphs: 20 chunks
/// each) at the paths of [`generate`]: a tree that takes a member long
/// enough to be caught mid-sync.
fn generate_large(env: &Env, files: usize) {
    for i in 0..files {
        let paragraphs: Vec<String> = (0..20)
            .map(|j| format!("paragraph {j} of file {i}; ").repeat(70))
            .collect();
        env.put(&file_name(i), paragraphs.join("\n\n"));
    }
}

/// The data partition of the file at `path` (relative to the tree) in a
/// group of `partitions`: each file is a component keyed by its path.
fn partition_of(path: &str, partitions: u32) -> i32 {
    let n = weir::group::partition_of(&path.into_stable_key(), partitions);
    i32::try_from(n).unwrap()
}

/// `0..n` as the partition numbers of the coordinator's tables.
fn data_partitions(n: u32) -> BTreeSet<i32> {
    (0..i32::try_from(n).unwrap()).collect()
}

/// Asserts that `chunks` holds chunks of exactly the files `documents`
/// holds, each numbered from 0 without a gap: no chunk of a deleted file
/// is left behind.
async fn assert_chunks_follow_documents(pg: &PgDatabase) {
    let docs = pg.docs().await;
    let chunks = pg.chunks().await;
    let with_chunks: BTreeSet<&String> = chunks.keys().collect();
    let files: BTreeSet<&String> = docs.keys().collect();
    assert_eq!(with_chunks, files, "the files of chunks and of documents");
    for (path, list) in &chunks {
        let indexes: Vec<i64> = list.iter().map(|(i, _)| *i).collect();
        let contiguous: Vec<i64> = (0..i64::try_from(list.len()).unwrap()).collect();
        assert_eq!(indexes, contiguous, "the chunks of {path}");
    }
}

/// The outputs of `members`, to show when a check fails.
fn outputs<'a>(members: impl IntoIterator<Item = &'a Member>) -> String {
    members
        .into_iter()
        .map(Member::output)
        .collect::<Vec<_>>()
        .join("\n")
}

// ------------------------------------------------ the coordinator's tables

/// A partition as the coordinator's tables hold it.
#[derive(Clone, Debug)]
struct Partition {
    /// Its number: -1 for the root partition, 0 to P - 1 for data.
    number: i32,
    /// Its owner, whether or not the owner's membership is live.
    owner: Option<String>,
    /// The incarnation of the owner's membership that took it.
    incarnation: Option<i64>,
    /// The member the assignment gives it to.
    target: Option<String>,
    /// Its epoch: the one a takeover announced, if newer than the fence
    /// row's (a takeover records its owner, announces the next epoch, and
    /// only then bumps the fence row): the epoch its owner writes under.
    epoch: i64,
    /// Whether its owner's membership (of that incarnation) is live.
    live: bool,
    /// The pass of the run that last began on it.
    running: Option<i64>,
    /// The last pass completed on it.
    completed: Option<i64>,
    /// Whether its changelog (or the snapshot it is compacted into) has
    /// rows: its owner wrote for it.
    logged: bool,
}

impl Partition {
    /// Its owner when the owner's lease holds.
    fn live_owner(&self) -> Option<&str> {
        self.owner.as_deref().filter(|_| self.live)
    }
}

/// A membership.
#[derive(Clone, Debug)]
struct Membership {
    id: String,
    incarnation: i64,
    live: bool,
}

/// The group as the coordinator's tables hold it at one instant.
#[derive(Clone, Debug, Default)]
struct GroupState {
    /// Every partition, the root first.
    partitions: Vec<Partition>,
    /// Every membership row, live or expired.
    members: Vec<Membership>,
}

impl GroupState {
    /// The partitions (the root's included) whose lease `id` holds.
    fn held_by(&self, id: &str) -> BTreeSet<i32> {
        self.partitions
            .iter()
            .filter(|p| p.live_owner() == Some(id))
            .map(|p| p.number)
            .collect()
    }

    /// The data partitions whose lease `id` holds.
    fn data_held_by(&self, id: &str) -> BTreeSet<i32> {
        self.held_by(id).into_iter().filter(|n| *n >= 0).collect()
    }

    /// The membership of `id`.
    fn member(&self, id: &str) -> Option<&Membership> {
        self.members.iter().find(|m| m.id == id)
    }

    /// The ids of the live members.
    fn live_members(&self) -> BTreeSet<&str> {
        self.members
            .iter()
            .filter(|m| m.live)
            .map(|m| m.id.as_str())
            .collect()
    }

    /// Whether `id` holds the lease of every partition, the root's too.
    fn all_held_by(&self, id: &str) -> bool {
        !self.partitions.is_empty() && self.partitions.iter().all(|p| p.live_owner() == Some(id))
    }

    /// A member caught mid-sync: it holds a data partition whose pass it
    /// began and has not completed, and it already wrote for it.
    fn mid_sync(&self) -> Option<String> {
        self.partitions
            .iter()
            .find(|p| p.number >= 0 && p.running.is_some() && p.completed.is_none() && p.logged)
            .and_then(|p| p.live_owner().map(str::to_string))
    }

    /// Whether `ids` are the live members, each holding an equal share
    /// of the data partitions, each partition with its target as owner.
    fn balanced(&self, ids: &[&str]) -> bool {
        let data: Vec<&Partition> = self.partitions.iter().filter(|p| p.number >= 0).collect();
        let share = data.len() / ids.len();
        self.live_members() == ids.iter().copied().collect()
            && ids.iter().all(|id| self.data_held_by(id).len() == share)
            && data
                .iter()
                .all(|p| p.live_owner().is_some() && p.target.as_deref() == p.live_owner())
    }
}

/// A partition's row as [`Observer::state`] reads it.
type PartitionRow = (
    i32,
    Option<String>,
    Option<i64>,
    Option<String>,
    i64,
    bool,
    Option<i64>,
    Option<i64>,
    bool,
);

/// Reads the coordinator's tables of one group in the test's database,
/// and checks at each read that no partition is held by two members
/// (two owners, or two incarnations of one) at the same epoch over the
/// whole test: an epoch is one owner's.
struct Observer {
    pool: PgPool,
    group: String,
    /// The live owner and incarnation seen at each partition and epoch.
    holders: BTreeMap<(i32, i64), (String, i64)>,
}

impl Observer {
    async fn new(pg: &PgDatabase, group: &str) -> Observer {
        Observer {
            pool: pg.pool().await,
            group: group.to_string(),
            holders: BTreeMap::new(),
        }
    }

    /// The group now: empty until a member has created it.
    async fn state(&mut self) -> GroupState {
        let state = self.read().await.unwrap_or_default();
        for p in &state.partitions {
            let (Some(owner), Some(incarnation)) = (p.live_owner(), p.incarnation) else {
                continue;
            };
            let holder = (owner.to_string(), incarnation);
            let seen = self
                .holders
                .entry((p.number, p.epoch))
                .or_insert_with(|| holder.clone());
            assert_eq!(
                *seen, holder,
                "partition {} was held at epoch {} by two members",
                p.number, p.epoch
            );
        }
        state
    }

    /// Reads the group in one snapshot; an error before a member created
    /// the tables.
    async fn read(&self) -> Result<GroupState, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
        let rows: Vec<PartitionRow> = sqlx::query_as(
            "SELECT p.partition, p.owner, p.owner_incarnation, p.target,
                    GREATEST(f.epoch, i.pending_epoch),
                    m.member_id IS NOT NULL, pp.running_pass, pp.completed_pass,
                    EXISTS (SELECT 1 FROM weir.changelog c
                             WHERE c.group_name = p.group_name AND c.partition = p.partition)
                    OR EXISTS (SELECT 1 FROM weir.snapshot s
                                WHERE s.group_name = p.group_name AND s.partition = p.partition)
               FROM weir.partition p
               JOIN weir.fence f ON f.group_name = p.group_name AND f.partition = p.partition
               LEFT JOIN weir.fence_intent i
                 ON i.group_name = p.group_name AND i.partition = p.partition
               LEFT JOIN weir.partition_pass pp
                 ON pp.group_name = p.group_name AND pp.partition = p.partition
               LEFT JOIN weir.member m
                 ON m.group_name = p.group_name AND m.member_id = p.owner
                AND m.incarnation = p.owner_incarnation AND m.expires_at > now()
              WHERE p.group_name = $1
              ORDER BY p.partition",
        )
        .bind(&self.group)
        .fetch_all(&mut *tx)
        .await?;
        let members: Vec<(String, i64, bool)> = sqlx::query_as(
            "SELECT member_id, incarnation, expires_at > now()
               FROM weir.member WHERE group_name = $1 ORDER BY member_id",
        )
        .bind(&self.group)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let partitions = rows
            .into_iter()
            .map(
                |(number, owner, incarnation, target, epoch, live, running, completed, logged)| {
                    Partition {
                        number,
                        owner,
                        incarnation,
                        target,
                        epoch,
                        live,
                        running,
                        completed,
                        logged,
                    }
                },
            )
            .collect();
        let members = members
            .into_iter()
            .map(|(id, incarnation, live)| Membership {
                id,
                incarnation,
                live,
            })
            .collect();
        Ok(GroupState {
            partitions,
            members,
        })
    }

    /// Reads the group every `every` until `check` holds of it, for at
    /// most `limit`: the state that passed, or `None`.
    async fn until(
        &mut self,
        limit: Duration,
        every: Duration,
        mut check: impl FnMut(&GroupState) -> bool,
    ) -> Option<GroupState> {
        let start = Instant::now();
        while start.elapsed() < limit {
            let state = self.state().await;
            if check(&state) {
                return Some(state);
            }
            tokio::time::sleep(every).await;
        }
        None
    }

    /// Waits up to `limit` for `documents` to hold every file of the tree
    /// with its fingerprint, and nothing else (the whole rows are compared
    /// once the members stopped), reading the group (and checking it) at
    /// each poll: whether it did.
    async fn until_synced(&mut self, env: &Env, limit: Duration) -> bool {
        let start = Instant::now();
        let tree: BTreeMap<String, String> = expected(&env.tree)
            .into_iter()
            .map(|(path, doc)| (path, doc.fingerprint))
            .collect();
        while start.elapsed() < limit {
            self.state().await;
            let rows: Result<Vec<(String, String)>, sqlx::Error> =
                sqlx::query_as("SELECT path, fingerprint FROM documents")
                    .fetch_all(&self.pool)
                    .await;
            if rows.is_ok_and(|rows| rows.into_iter().collect::<BTreeMap<_, _>>() == tree) {
                return true;
            }
            tokio::time::sleep(POLL).await;
        }
        false
    }

    /// The last pass number taken.
    async fn last_pass(&self) -> i64 {
        sqlx::query_scalar("SELECT last_value FROM weir.pass_seq")
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    async fn close(self) {
        self.pool.close().await;
    }
}

/// Each row of `query` (a key and the row's `xmin` as text) by key: the
/// version of each row, which changes whenever the row is written again.
async fn row_versions(pool: &PgPool, query: &str) -> BTreeMap<String, String> {
    let rows: Vec<(String, String)> = sqlx::query_as(query).fetch_all(pool).await.unwrap();
    rows.into_iter().collect()
}

// ------------------------------------------------------------------ tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_with_sigkill_mid_sync_leaves_its_partitions_to_the_two_others_which_sync_the_whole_tree(
) -> TestResult {
    PgDatabase::around("failover_kill", async |pg| {
        let deadline = Deadline::start();
        let env = Env::new();
        generate_large(&env, 600);
        let group = Group {
            name: "kill",
            partitions: 12,
            lease_ttl: 3,
        };
        let mut members: Vec<Member> = (0..3)
            .map(|n| Member::start(&env, &pg.url, &group, n, &[]))
            .collect();
        let mut observer = Observer::new(pg, group.name).await;

        // Caught mid-sync: it began a pass of its partitions and wrote
        // for one of them, but completed none.
        let caught = observer
            .until(deadline.within(60), FAST_POLL, |s| s.mid_sync().is_some())
            .await
            .unwrap_or_else(|| panic!("no member was caught mid-sync\n{}", outputs(&members)));
        let victim_id = caught.mid_sync().unwrap();
        let at = members.iter().position(|m| m.id == victim_id).unwrap();
        let mut victim = members.remove(at);
        victim.kill();
        let held = caught.data_held_by(&victim_id);
        // Nobody can take its partitions over before its lease (3 s) runs
        // out: what the tables show now is what it left.
        let left = observer.state().await;
        assert!(
            left.partitions
                .iter()
                .any(|p| held.contains(&p.number) && p.completed.is_none()),
            "{victim_id} completed its pass before it was killed: {left:?}"
        );

        let mut synced = BTreeSet::new();
        for member in &mut members {
            let status = member.wait(deadline.within(70));
            assert_eq!(
                status.and_then(|s| s.code()),
                Some(0),
                "{}",
                member.output()
            );
            let mine = cli::group::synced_in(&member.stdout())
                .unwrap_or_else(|| panic!("no partitions line\n{}", member.output()));
            synced.extend(mine);
        }
        let all: BTreeSet<u32> = (0..group.partitions).collect();
        assert_eq!(synced, all, "{}", outputs(&members));
        // The survivors ran the victim's partitions: their lines name
        // them.
        assert!(held
            .iter()
            .all(|p| synced.contains(&u32::try_from(*p).unwrap())));
        assert_eq!(pg.docs().await, expected(&env.tree));
        assert_chunks_follow_documents(pg).await;
        observer.close().await;
        TestResult::Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_an_empty_ledger_takes_over_deleted_and_edited_files_and_writes_no_unchanged_row_again(
) -> TestResult {
    PgDatabase::around("failover_restore", async |pg| {
        const FILES: usize = 200;
        let deadline = Deadline::start();
        let env = Env::new();
        generate(&env, FILES);
        let group = Group {
            name: "restore",
            partitions: 12,
            lease_ttl: 3,
        };
        let all: BTreeSet<u32> = (0..group.partitions).collect();

        // A syncs alone, and leaves (a one-shot sync's end).
        let mut a = Member::start(&env, &pg.url, &group, 0, &[]);
        let status = a.wait(deadline.within(60));
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", a.output());
        assert_eq!(
            cli::group::synced_in(&a.stdout()),
            Some(all.clone()),
            "{}",
            a.output()
        );
        assert_eq!(pg.docs().await, expected(&env.tree));

        let pool = pg.pool().await;
        let documents = "SELECT path, xmin::text FROM documents";
        let chunks = "SELECT path || '#' || chunk_index, xmin::text FROM chunks";
        let docs_before = row_versions(&pool, documents).await;
        let chunks_before = row_versions(&pool, chunks).await;
        assert_eq!(docs_before.len(), FILES);

        let mut deleted = BTreeSet::new();
        let mut edited = BTreeSet::new();
        for i in 0..FILES {
            let name = file_name(i);
            match i % 10 {
                0 => {
                    std::fs::remove_file(env.path(&name)).unwrap();
                    deleted.insert(name);
                }
                1 => {
                    env.put(&name, format!("edited {i}\n"));
                    edited.insert(name);
                }
                _ => {}
            }
        }

        // B, with a ledger of its own that does not exist yet, takes every
        // partition over: it restores what A tracked from the changelog.
        assert!(!env.tmp.path().join("ledger-1").exists());
        let mut b = Member::start(&env, &pg.url, &group, 1, &[]);
        let status = b.wait(deadline.within(60));
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", b.output());
        assert_eq!(
            cli::group::synced_in(&b.stdout()),
            Some(all),
            "{}",
            b.output()
        );
        assert_eq!(pg.docs().await, expected(&env.tree));
        assert_chunks_follow_documents(pg).await;

        let docs_after = row_versions(&pool, documents).await;
        let chunks_after = row_versions(&pool, chunks).await;
        pool.close().await;
        let file_of = |key: &str| key.split('#').next().unwrap().to_string();
        for path in &deleted {
            assert!(!docs_after.contains_key(path), "{path} was deleted");
        }
        for path in &edited {
            assert_ne!(
                docs_after.get(path),
                docs_before.get(path),
                "{path} was edited"
            );
        }
        let rewritten: Vec<&String> = docs_before
            .iter()
            .filter(|(path, _)| !deleted.contains(*path) && !edited.contains(*path))
            .filter(|(path, xmin)| docs_after.get(*path) != Some(xmin))
            .map(|(path, _)| path)
            .collect();
        assert!(
            rewritten.is_empty(),
            "rows of unchanged files were written again: {rewritten:?}\n{}",
            b.output()
        );
        let rewritten: Vec<&String> = chunks_before
            .iter()
            .filter(|(key, _)| {
                let file = file_of(key);
                !deleted.contains(&file) && !edited.contains(&file)
            })
            .filter(|(key, xmin)| chunks_after.get(*key) != Some(xmin))
            .map(|(key, _)| key)
            .collect();
        assert!(
            rewritten.is_empty(),
            "chunks of unchanged files were written again: {rewritten:?}\n{}",
            b.output()
        );
        TestResult::Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_paused_past_its_lease_is_fenced_when_it_resumes_and_writes_nothing_stale(
) -> TestResult {
    PgDatabase::around("failover_zombie", async |pg| {
        const FILES: usize = 600;
        let deadline = Deadline::start();
        let env = Env::new();
        generate_large(&env, FILES);
        let group = Group {
            name: "zombie",
            partitions: 12,
            lease_ttl: 3,
        };
        let mut members: Vec<Member> = (0..2)
            .map(|n| Member::start(&env, &pg.url, &group, n, &LIVE))
            .collect();
        let mut observer = Observer::new(pg, group.name).await;

        // Paused mid-sync, holding partitions it began to write for.
        let caught = observer
            .until(deadline.within(60), FAST_POLL, |s| s.mid_sync().is_some())
            .await
            .unwrap_or_else(|| panic!("no member was caught mid-sync\n{}", outputs(&members)));
        let zombie_id = caught.mid_sync().unwrap();
        let at = members.iter().position(|m| m.id == zombie_id).unwrap();
        let mut zombie = members.remove(at);
        let mut survivor = members.remove(0);
        zombie.signal("STOP");
        let held = caught.data_held_by(&zombie_id);
        let incarnation = caught.member(&zombie_id).unwrap().incarnation;

        // Its lease runs out (3 s); the survivor takes every partition
        // over and syncs the whole tree.
        let taken = observer
            .until(deadline.within(60), POLL, |s| {
                s.all_held_by(&survivor.id) && !s.member(&zombie_id).is_some_and(|m| m.live)
            })
            .await;
        assert!(
            taken.is_some(),
            "the survivor did not take the paused member's partitions over\n{}",
            survivor.output()
        );
        assert!(
            observer.until_synced(&env, deadline.within(60)).await,
            "the survivor did not sync the tree\n{}",
            survivor.output()
        );

        // Files are deleted, among them files of the paused member's
        // partitions: every other file of its partitions, and every third
        // of the others.
        let mut deleted = BTreeSet::new();
        for i in 0..FILES {
            let name = file_name(i);
            let its = held.contains(&partition_of(&name, group.partitions));
            if (its && i % 2 == 0) || (!its && i % 3 == 0) {
                std::fs::remove_file(env.path(&name)).unwrap();
                deleted.insert(name);
            }
        }
        assert!(
            deleted
                .iter()
                .any(|f| held.contains(&partition_of(f, group.partitions))),
            "no deleted file is in the paused member's partitions {held:?}"
        );
        assert!(
            observer.until_synced(&env, deadline.within(30)).await,
            "the survivor did not delete the rows of the deleted files\n{}",
            survivor.output()
        );

        // It resumes: its writes for the partitions it lost are refused;
        // it joins again (a new incarnation), is given partitions back,
        // and completes a pass of them.
        let before = observer.last_pass().await;
        zombie.signal("CONT");
        let back = observer
            .until(deadline.within(60), POLL, |s| {
                s.member(&zombie_id)
                    .is_some_and(|m| m.live && m.incarnation > incarnation)
                    && s.partitions.iter().any(|p| {
                        p.number >= 0
                            && p.live_owner() == Some(zombie_id.as_str())
                            && p.completed.is_some_and(|c| c > before)
                    })
            })
            .await;
        assert!(
            back.is_some(),
            "the resumed member did not join again and sync partitions\n{}",
            outputs([&zombie, &survivor])
        );
        assert!(
            observer.until_synced(&env, deadline.within(30)).await,
            "the tables did not end equal to the tree\n{}",
            outputs([&zombie, &survivor])
        );

        let zombie_status = zombie.terminate(deadline.within(30));
        let survivor_status = survivor.terminate(deadline.within(30));
        assert_eq!(
            zombie_status.and_then(|s| s.code()),
            Some(0),
            "{}",
            zombie.output()
        );
        assert_eq!(
            survivor_status.and_then(|s| s.code()),
            Some(0),
            "{}",
            survivor.output()
        );
        // Both stopped: nothing can be written any more. No deleted file
        // came back, and the tables are the tree.
        let docs = pg.docs().await;
        let back: Vec<&String> = deleted.iter().filter(|f| docs.contains_key(*f)).collect();
        assert!(back.is_empty(), "rows of deleted files came back: {back:?}");
        assert_eq!(docs, expected(&env.tree));
        assert_chunks_follow_documents(pg).await;
        // It said that its partitions were taken over.
        let stderr = zombie.stderr();
        assert!(
            stderr.contains("were taken over by another member"),
            "the resumed member did not report its lost partitions: {stderr}"
        );
        observer.close().await;
        TestResult::Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_joining_a_live_group_gets_half_the_partitions_and_one_leaving_with_sigterm_hands_its_own_over_at_once(
) -> TestResult {
    PgDatabase::around("failover_rebalance", async |pg| {
        const FILES: usize = 120;
        let deadline = Deadline::start();
        let env = Env::new();
        generate(&env, FILES);
        // A long TTL: a takeover by expiry would take 30 s.
        let group = Group {
            name: "rebalance",
            partitions: 8,
            lease_ttl: 30,
        };
        let mut a = Member::start(&env, &pg.url, &group, 0, &LIVE);
        let mut observer = Observer::new(pg, group.name).await;
        assert!(
            observer.until_synced(&env, deadline.within(60)).await,
            "{}",
            a.output()
        );
        let alone = observer.state().await;
        assert!(alone.all_held_by(&a.id), "{alone:?}");

        // B joins: the split becomes 4 and 4.
        let mut b = Member::start(&env, &pg.url, &group, 1, &LIVE);
        let ids = [a.id.as_str(), b.id.as_str()];
        let balanced = observer
            .until(deadline.within(60), POLL, |s| s.balanced(&ids))
            .await;
        assert!(
            balanced.is_some(),
            "the group did not split its partitions between its two members: {:?}\n{}",
            observer.state().await,
            outputs([&a, &b])
        );

        // Changes in every partition are synced by the two.
        for i in (0..FILES).step_by(3) {
            env.put(&file_name(i), format!("edited {i}\n"));
        }
        std::fs::remove_file(env.path(&file_name(1))).unwrap();
        env.put("added.md", "added\n");
        assert!(
            observer.until_synced(&env, deadline.within(30)).await,
            "{}",
            outputs([&a, &b])
        );

        // A leaves with SIGTERM: it releases its partitions as it exits,
        // and B takes them over long before A's lease could run out.
        let status = a.terminate(deadline.within(30));
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", a.output());
        let taken = observer
            .until(deadline.within(20), POLL, |s| {
                s.all_held_by(&b.id) && s.live_members() == BTreeSet::from([b.id.as_str()])
            })
            .await;
        assert!(
            taken.is_some(),
            "B did not hold every partition within 20 s of A's exit (a takeover on A's lease expiry would take 30 s): {:?}\n{}",
            observer.state().await,
            outputs([&a, &b])
        );
        assert_eq!(
            taken.unwrap().data_held_by(&b.id),
            data_partitions(group.partitions)
        );

        for i in (0..FILES).step_by(5) {
            env.put(&file_name(i), format!("edited again {i}\n"));
        }
        env.put("added later.md", "added later\n");
        assert!(
            observer.until_synced(&env, deadline.within(30)).await,
            "{}",
            b.output()
        );
        let status = b.terminate(deadline.within(30));
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", b.output());
        assert_eq!(pg.docs().await, expected(&env.tree));
        assert_chunks_follow_documents(pg).await;
        observer.close().await;
        TestResult::Ok(())
    })
    .await
}
