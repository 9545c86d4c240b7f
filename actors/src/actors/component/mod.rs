//! The component actor: runs a component's user code on the user's runtime,
//! then reconciles its declarations (one message per shard per wave),
//! dispatches the actions to the sink actors, and commits its records:
//! the commit is handed to the sinks with its last wave, and the sink
//! that lands the last action sends it to the ledger, so that the
//! component is woken once more, when its commit is durable.
//!
//! A component is a task of its own with private state (its declarations,
//! its children) that talks to the other actors only by messages; it is
//! not an actix actor because it must run on the user's runtime, where user
//! code and its resources live.
//!
//! - this file: a component's state and its declarations;
//! - [`mount`](mod@mount): running a component's code, and mounting its children;
//! - [`waves`]: reconciling the declarations with the shards;
//! - [`finish`]: applying the actions and committing, once the code returned;
//! - [`failed`]: what a failed component commits;
//! - [`records`]: what the commit writes to the ledger, and the intents
//!   written before the actions are applied;
//! - [`unchanged`]: a component that declares what its last clean commit
//!   recorded, which skips all of that.

use rustc_hash::FxHashSet as HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, OwnedSemaphorePermit};

use self::children::ChildSet;
use super::reconciler::{
    shard_of, Chunk, EarlyGate, ReconcileBatch, ReplyTo, ShardBatch, ShardReply,
};
use crate::error::{Error, Result};
use crate::ledger::record::StateEntry;
use crate::ledger::stored::{StoredEntry, StoredState};
use crate::model::erased::ErasedHandler;
use crate::model::provider::{ChildGeneration, ProviderCore, Resolved};
use crate::model::{ComponentPath, StableKey};
use crate::run::Run;
use crate::sync::lock;

mod children;
mod failed;
mod finish;
mod mount;
mod records;
mod unchanged;
mod waves;

pub(crate) use crate::actors::guard::guarded;
pub(crate) use mount::{mount, mount_each, run_component, Memo, MemoFn};

pub(crate) use crate::actors::reconciler::Declaration;

#[derive(Default)]
struct DeclSet {
    list: Vec<Declaration>,
    paths: Seen,
    errors: Vec<String>,
    early: Early,
}

/// The paths of a component's declarations, to refuse a second
/// declaration of one state.
#[derive(Default)]
enum Seen {
    /// Each path so far was greater than the one before, as when rows are
    /// read in key order: a path greater than the last cannot be one
    /// declared before, so nothing is kept (the list holds the paths, in
    /// order). Checking a path costs one comparison with the list's last,
    /// where a set of 100k paths costs two cache misses.
    #[default]
    Ascending,
    /// A path came out of order: all of them, hashed.
    Hashed(HashSet<Arc<[u8]>>),
}

impl Seen {
    /// Notes `path`, declared after those of `list`; false if it was
    /// declared before. `expected` sizes the set, should one be needed.
    fn insert(&mut self, path: &Arc<[u8]>, list: &[Declaration], expected: usize) -> bool {
        match self {
            Seen::Ascending => {
                if list.last().is_none_or(|last| last.path < *path) {
                    return true;
                }
                let mut set = HashSet::with_capacity_and_hasher(
                    expected.max(list.len() + 1),
                    Default::default(),
                );
                set.extend(list.iter().map(|d| Arc::clone(&d.path)));
                let fresh = set.insert(Arc::clone(path));
                *self = Seen::Hashed(set);
                fresh
            }
            Seen::Hashed(set) => set.insert(Arc::clone(path)),
        }
    }

    /// The states of `entry` whose paths are not among those of `list`
    /// (the declarations whose paths these are).
    fn orphans_in(&self, list: &[Declaration], entry: &StoredEntry) -> Vec<StateEntry> {
        let base = entry.bytes();
        let path = |s: &StoredState| s.path(base);
        let orphans = match self {
            // The entry's states are sorted by path too: one walk over both.
            Seen::Ascending => not_among(&entry.states, path, list.iter().map(|d| &*d.path)),
            Seen::Hashed(set) => entry
                .states
                .iter()
                .filter(|s| !set.contains(path(s)))
                .collect(),
        };
        orphans.into_iter().map(|s| s.to_entry(base)).collect()
    }
}

/// The items of `sorted` (in increasing order of `path`) whose paths are
/// not among `declared` (in increasing order too).
fn not_among<'a, 'p, T>(
    sorted: &'a [T],
    path: impl Fn(&'a T) -> &'a [u8],
    declared: impl Iterator<Item = &'p [u8]>,
) -> Vec<&'a T> {
    let mut declared = declared.peekable();
    sorted
        .iter()
        .filter(|s| {
            let p = path(s);
            while declared.next_if(|&d| d < p).is_some() {}
            declared.next_if(|&d| d == p).is_none()
        })
        .collect()
}

/// Declarations sent to the reconcilers while the component's code still
/// runs, in chunks (see [`AppBuilder::reconcile_chunk`](crate::AppBuilder::reconcile_chunk)).
/// Reconciling only reads: nothing is applied before the code returns.
#[derive(Default)]
struct Early {
    /// How many declarations of the list were looked at.
    seen: usize,
    /// For each declaration looked at: whether it was sent (its provider
    /// was resolved; the others wait for the commit).
    sent: Vec<bool>,
    /// The shards that were sent a chunk.
    shards: Vec<bool>,
    /// The shards' answers, awaited at the commit.
    replies: Vec<oneshot::Receiver<ShardReply>>,
    /// Shared with the shards: paces the chunks.
    gate: Arc<EarlyGate>,
}

/// Chunks a component may have unhandled per shard: beyond, it declares on
/// and sends a larger chunk later.
const OUTSTANDING_PER_SHARD: usize = 2;

/// The private state of one component in one run.
pub(crate) struct ComponentState {
    pub run: Arc<Run>,
    pub path: ComponentPath,
    pub key: Arc<[u8]>,
    decls: Mutex<DeclSet>,
    children: Mutex<ChildSet>,
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    /// The memo key to record when the component commits (mounted with
    /// [`Ctx::mount_each_memo`](crate::Ctx::mount_each_memo)).
    memo: std::sync::OnceLock<Vec<u8>>,
    /// Set when the component's code has returned: a `Ctx` kept beyond
    /// that declares and mounts nothing (see [`ComponentState::close`]).
    finished: std::sync::atomic::AtomicBool,
    /// How many states it declared in its last run, if it was large (see
    /// `Engine::declared_last`).
    declared_last: usize,
    /// Whether it counts in the run's activity (see [`Activity`](crate::actors::sink::Activity)):
    /// producing declarations or reconciling, not waiting.
    active: std::sync::atomic::AtomicBool,
    /// Whether its final commit was sent to the ledger.
    final_commit: FinalCommit,
    /// Set when it finished as found unchanged (see [`unchanged`]), for
    /// the outcome it is counted under.
    found_unchanged: std::sync::atomic::AtomicBool,
}

/// The declarations from which a component's count is kept for its next
/// run (see `Engine::declared_last`).
const SIZE_HINT_FROM: usize = 1024;

impl ComponentState {
    /// Whether a child with this key is in the run's scope: always, but
    /// for the root's children in a scoped run.
    pub(crate) fn child_in_scope(&self, key: &StableKey) -> bool {
        !self.path.segments().is_empty() || self.run.in_scope(key)
    }

    /// Whether the memo key recorded by the child `key`'s last successful
    /// commit is `memo`.
    pub(crate) fn stored_memo_is(&self, key: &StableKey, memo: &[u8]) -> bool {
        let child = crate::model::keycode::component_key(self.path.child(key.clone()).segments());
        matches!(self.run.engine.ledger.memo(&child), Ok(Some(stored)) if stored.as_ref() == memo)
    }

    /// In a worker group, whether this is the root component: its
    /// children span members, so its child list is not recorded (each
    /// member finds the children of the partitions it holds in its
    /// ledger).
    pub(crate) fn is_group_root(&self) -> bool {
        self.run.group.is_some() && self.path.segments().is_empty()
    }

    /// In a worker group, whether this component is in the root
    /// partition and this member does not hold it: it reads what the
    /// holder applied, and writes nothing.
    pub(crate) fn read_only_root(&self) -> bool {
        self.run.partition_of(&self.key) == Some(crate::group::PartitionId::Root)
            && !self.run.root_writable()
    }

    pub(crate) fn new(run: Arc<Run>, path: ComponentPath) -> Arc<Self> {
        let key = crate::model::keycode::component_key_shared(path.segments());
        let declared_last = lock(&run.engine.declared_last)
            .get(&key)
            .copied()
            .unwrap_or(0);
        let decls = DeclSet {
            list: Vec::with_capacity(declared_last),
            ..DeclSet::default()
        };
        Arc::new(Self {
            run,
            path,
            key,
            decls: Mutex::new(decls),
            children: Mutex::new(ChildSet::default()),
            permit: Mutex::new(None),
            memo: std::sync::OnceLock::new(),
            finished: std::sync::atomic::AtomicBool::new(false),
            declared_last,
            active: std::sync::atomic::AtomicBool::new(false),
            final_commit: FinalCommit::default(),
            found_unchanged: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Counts the component in the run's activity (once).
    pub(crate) fn enter_activity(&self) {
        if !self.active.swap(true, Ordering::SeqCst) {
            self.run.activity.enter();
        }
    }

    /// Stops counting the component in the run's activity (once).
    pub(crate) fn leave_activity(&self) {
        if self.active.swap(false, Ordering::SeqCst) {
            self.run.activity.leave();
        }
    }

    /// Keeps how many states the component declared for its next run's
    /// sizing, if it is large (or was).
    fn note_declared(&self, count: usize) {
        if count < SIZE_HINT_FROM && self.declared_last == 0 {
            return;
        }
        let mut last = lock(&self.run.engine.declared_last);
        if count >= SIZE_HINT_FROM {
            last.insert(Arc::clone(&self.key), count);
        } else {
            last.remove(&self.key);
        }
    }

    /// Marks the component's code as returned (whatever it returned).
    /// Under the children's lock, and before the commit takes the
    /// declarations under theirs, so no declaration or child gets in after.
    fn close(&self) {
        let _children = lock(&self.children);
        self.finished.store(true, Ordering::SeqCst);
    }

    /// The error of a `Ctx` used after its component's code returned.
    fn finished_error(&self, what: std::fmt::Arguments<'_>) -> Option<Error> {
        self.finished.load(Ordering::SeqCst).then(|| {
            Error::Usage(format!(
                "component {} has finished: a Ctx kept after its code returned cannot {what}",
                self.path
            ))
        })
    }

    /// Records a declaration; a second declaration of one state fails the
    /// component (and is returned as an error).
    pub(crate) fn declare(&self, decl: Declaration) -> Result<()> {
        let mut decls = lock(&self.decls);
        let what = format_args!("declare {} {}", decl.provider.path.name, decl.key);
        if let Some(err) = self.finished_error(what) {
            return Err(err);
        }
        let DeclSet { list, paths, .. } = &mut *decls;
        if !paths.insert(&decl.path, list, self.declared_last) {
            let err = Error::DuplicateDeclaration {
                provider: decl.provider.path.name.to_string(),
                key: decl.key,
                first_by: Some(self.path.clone()),
            };
            decls.errors.push(err.to_string());
            return Err(err);
        }
        decls.list.push(decl);
        if decls.list.len() - decls.early.seen >= self.run.engine.config.reconcile_chunk {
            self.send_early(&mut decls);
        }
        Ok(())
    }

    /// Sends the declarations not looked at yet whose provider is resolved
    /// to their shards, one message per shard.
    fn send_early(&self, decls: &mut DeclSet) {
        let n = self.run.engine.shards.len();
        let gate = &decls.early.gate;
        if gate.stop.load(Ordering::SeqCst)
            || gate.outstanding.load(Ordering::SeqCst) >= OUTSTANDING_PER_SHARD * n
        {
            return;
        }
        let DeclSet { list, early, .. } = decls;
        let fresh = list.len().saturating_sub(early.seen);
        let mut per_shard = ShardBatch::for_shards(n, fresh);
        early.sent.reserve(fresh);
        for (idx, d) in list.iter_mut().enumerate().skip(early.seen) {
            let ready = d.provider.resolved.get().is_some();
            early.sent.push(ready);
            if let (true, Some(batch)) = (ready, per_shard.get_mut(shard_of(&d.path, n))) {
                batch.push(idx, d);
            }
        }
        early.seen = list.len();
        early.shards.resize(n, false);
        for (s, batch) in per_shard.into_iter().enumerate() {
            if batch.is_empty() {
                continue;
            }
            early.gate.outstanding.fetch_add(1, Ordering::SeqCst);
            let chunk = Chunk::More(Arc::clone(&early.gate));
            early.replies.push(self.send_batch(s, batch, false, chunk));
            if let Some(sent) = early.shards.get_mut(s) {
                *sent = true;
            }
        }
    }

    /// Sends shard `s` a batch of this component's declarations; the home
    /// shard also reports the component's children and hands back its
    /// reading of the component's entry.
    fn send_batch(
        &self,
        s: usize,
        batch: ShardBatch,
        home: bool,
        chunk: Chunk,
    ) -> oneshot::Receiver<ShardReply> {
        let (tx, rx) = oneshot::channel();
        self.send_batch_to(s, batch, home, chunk, ReplyTo::One(tx));
        rx
    }

    /// Sends `batch` to shard `s`, its reply to go to `reply`.
    fn send_batch_to(&self, s: usize, batch: ShardBatch, home: bool, chunk: Chunk, reply: ReplyTo) {
        let run = &self.run;
        if let Some(g) = run.metrics.queue_depth.get(s) {
            g.increment(1.0);
        }
        if let Some(shard) = run.engine.shards.get(s) {
            shard.do_send(ReconcileBatch {
                run_id: run.id,
                component: Arc::clone(&self.key),
                decls: batch.decls,
                providers: batch.providers,
                home,
                chunk,
                reply,
            });
        }
    }

    /// Records an error that fails the component even if user code ignores it.
    pub(crate) fn poison(&self, err: &Error) {
        lock(&self.decls).errors.push(err.to_string());
    }

    /// Registers a child component key; an error if it was mounted already.
    fn add_child(&self, key: &StableKey) -> Result<()> {
        let mut children = lock(&self.children);
        if let Some(err) = self.finished_error(format_args!("mount child {key}")) {
            return Err(err);
        }
        if !children.insert(key) {
            return Err(Error::Usage(format!(
                "component {} mounts child {key} twice in one run",
                self.path
            )));
        }
        Ok(())
    }

    /// Gives back the component's slot while it waits for its children,
    /// so they can run. Returns whether it had one.
    fn release_slot(&self) -> bool {
        lock(&self.permit).take().is_some()
    }

    /// Takes a slot again after the children are done, and counts as
    /// active again.
    async fn resume(&self, had_slot: bool) {
        if had_slot {
            if let Ok(p) = Arc::clone(&self.run.inflight).acquire_owned().await {
                *lock(&self.permit) = Some(p);
            }
        }
        self.enter_activity();
    }
}

/// Resolves a provider with its handler and registers its attachments.
pub(crate) fn resolve_provider(
    run: &Run,
    core: &Arc<ProviderCore>,
    handler: Arc<dyn ErasedHandler>,
    generation: ChildGeneration,
) -> Result<()> {
    let mut attachments = std::collections::HashMap::new();
    for (name, def) in guarded(|| handler.attachments())? {
        let att = Arc::new(ProviderCore::new(core.path.attachment(&name), run.id));
        resolve_provider(run, &att, def.handler, generation)?;
        attachments.insert(name, att);
    }
    if core
        .resolved
        .set(Resolved {
            handler,
            attachments,
            generation,
        })
        .is_ok()
    {
        run.register_provider(core);
    }
    Ok(())
}

/// Whether a component's final commit was sent. Its success (sent by its
/// task, or by the sink landing its last action) and, once it is
/// cancelled, its failure (sent by its cancel guard) both go through
/// [`FinalCommit::send_once`]: the first sends, and exactly one is
/// written.
#[derive(Default)]
struct FinalCommit(Mutex<bool>);

impl FinalCommit {
    /// Runs `send` unless a caller did before; returns whether it ran. The
    /// decision and the send are one step under a lock, so that a caller
    /// that finds the commit sent returns only once it is in the ledger's
    /// queue, ahead of anything sent after.
    fn send_once(&self, send: impl FnOnce()) -> bool {
        let mut sent = lock(&self.0);
        if *sent {
            return false;
        }
        *sent = true;
        send();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::{not_among, FinalCommit};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_final_commit_is_sent_once_and_a_second_sender_returns_after_the_first_sent(
    ) -> Result<(), String> {
        let commit = Arc::new(FinalCommit::default());
        let sends = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let (entered, in_send) = std::sync::mpsc::channel();
        let first = {
            let (commit, sends, done) =
                (Arc::clone(&commit), Arc::clone(&sends), Arc::clone(&done));
            std::thread::spawn(move || {
                commit.send_once(|| {
                    let _ = entered.send(());
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    sends.fetch_add(1, Ordering::SeqCst);
                    done.store(true, Ordering::SeqCst);
                })
            })
        };
        in_send.recv().map_err(|e| e.to_string())?;
        let second = commit.send_once(|| {
            sends.fetch_add(1, Ordering::SeqCst);
        });
        assert!(!second, "the second sender sent too");
        assert!(
            done.load(Ordering::SeqCst),
            "the second sender returned before the first had sent"
        );
        assert!(first.join().map_err(|_| "the first sender panicked")?);
        assert_eq!(sends.load(Ordering::SeqCst), 1);
        Ok(())
    }

    #[test]
    fn the_paths_not_declared_are_found_by_one_walk_over_both_sorted_lists() {
        let path = |i: u32| -> Vec<u8> { format!("p{i:05}").into_bytes() };
        let stored: Vec<Vec<u8>> = (0..2_000).filter(|i| i % 7 != 0).map(path).collect();
        let mut rng = fastrand::Rng::with_seed(7);
        for round in 0..50 {
            // Some stored paths, some never stored, before, among and
            // after the stored ones; sometimes none.
            let declared: Vec<Vec<u8>> = (0..2_100)
                .filter(|_| round % 10 != 0 && rng.u8(..) < 200)
                .map(path)
                .collect();
            let set: std::collections::BTreeSet<&Vec<u8>> = declared.iter().collect();
            let expected: Vec<&Vec<u8>> = stored.iter().filter(|p| !set.contains(p)).collect();
            let found = not_among(
                &stored,
                |p| p.as_slice(),
                declared.iter().map(|p| p.as_slice()),
            );
            assert_eq!(found, expected, "round {round}");
        }
    }
}
