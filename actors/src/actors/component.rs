//! The component actor: runs a component's user code on the user's runtime,
//! then reconciles its declarations (one message per shard per wave),
//! dispatches the actions to the sink actors, and commits its records.
//!
//! A component is a task of its own with private state (its declarations,
//! its children) that talks to the other actors only by messages; it is
//! not an actix actor because it must run on the user's runtime, where user
//! code and its resources live.

use rustc_hash::FxHashSet as HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use super::reconciler::{
    shard_of, shard_stopped, Chunk, EarlyGate, Found, Orphan, ReconcileBatch, ShardBatch,
    ShardReply,
};
use super::sink::{PlannedAction, SinkGroups, UnitWaiter};
use crate::error::{ComponentFailure, Error, Result};
use crate::ledger::buf;
use crate::ledger::record::{
    ComponentEntryOut, Intent, LedgerOp, RecordsOut, StateEntry, StateEntryOut,
};
use crate::ledger::stored::{StoredEntry, StoredState};
use crate::model::erased::{ErasedHandler, ErasedOutput};
use crate::model::provider::{ChildGeneration, DeclaredValue, ProviderCore, Resolved};
use crate::model::sink::EncodedAction;
use crate::model::{ActionKind, ComponentPath, StableKey, TargetChildInvalidation};
use crate::run::{lock, PreviewAction, Run};

/// One declared target state.
pub(crate) struct Declaration {
    pub path: Arc<[u8]>,
    pub key: StableKey,
    pub provider: Arc<ProviderCore>,
    /// The value; an exact one is taken by the message that sends the
    /// declaration to its shard.
    pub value: DeclaredValue,
    /// The provider of the state's children, resolved when it reconciles.
    pub child: Option<Arc<ProviderCore>>,
}

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

#[derive(Default)]
struct ChildSet {
    keys: Vec<StableKey>,
    set: HashSet<StableKey>,
}

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
}

/// The declarations from which a component's count is kept for its next
/// run (see `Engine::declared_last`).
const SIZE_HINT_FROM: usize = 1024;

impl ComponentState {
    pub(crate) fn new(run: Arc<Run>, path: ComponentPath) -> Arc<Self> {
        let key: Arc<[u8]> = Arc::from(crate::model::keycode::component_key(path.segments()));
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
        })
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
        let run = &self.run;
        let (tx, rx) = oneshot::channel();
        if let Some(g) = run.metrics.queue_depth.get(s) {
            g.increment(1.0);
        }
        if let Some(shard) = run.engine.shards.get(s) {
            shard.do_send(ReconcileBatch {
                run_id: run.id,
                component: Arc::clone(&self.key),
                component_path: self.path.clone(),
                decls: batch.decls,
                providers: batch.providers,
                home,
                chunk,
                reply: tx,
            });
        }
        rx
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
        if !children.set.insert(key.clone()) {
            return Err(Error::Usage(format!(
                "component {} mounts child {key} twice in one run",
                self.path
            )));
        }
        children.keys.push(key.clone());
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
        self.run.activity.enter();
    }
}

/// Runs a component: its code, then its reconciliation and commit.
/// Failures are recorded in the run and returned.
///
/// The caller counts the component as active (`activity.enter()`) before
/// it is spawned, so that a sink never sees the run idle between the spawn
/// of a component and its first poll.
pub(crate) async fn run_component<F, Fut, T>(state: Arc<ComponentState>, f: F) -> Result<T>
where
    F: FnOnce(crate::ctx::Ctx) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let run = Arc::clone(&state.run);
    run.counters
        .components
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    run.metrics.inflight.increment(1.0);
    let ctx = crate::ctx::Ctx::from_state(Arc::clone(&state));
    let outcome = AssertUnwindSafe(f(ctx)).catch_unwind().await;
    state.close();
    let result = match outcome {
        // Boxed: the commit state machine is large, and a task that never
        // gets there (a memoized or failed component) should not carry it.
        Ok(Ok(value)) => match AssertUnwindSafe(Box::pin(finish(&state)))
            .catch_unwind()
            .await
        {
            Ok(done) => done.map(|()| value),
            Err(panic) => {
                let e = Error::msg(format!(
                    "component panicked while committing: {}",
                    panic_text(&*panic)
                ));
                record_failure(&state, &e).await;
                Err(e)
            }
        },
        Ok(Err(e)) => {
            run.activity.leave();
            record_failure(&state, &e).await;
            Err(e)
        }
        Err(panic) => {
            run.activity.leave();
            let e = Error::msg(format!("component code panicked: {}", panic_text(&*panic)));
            record_failure(&state, &e).await;
            Err(e)
        }
    };
    lock(&state.permit).take();
    run.metrics.inflight.decrement(1.0);
    if result.is_ok() {
        run.metrics.components_ok.increment(1);
    } else {
        run.metrics.components_failed.increment(1);
    }
    if let Err(e) = &result {
        run.fail(ComponentFailure::new(state.path.clone(), e));
    }
    result
}

pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_string())
}

/// Remembers in the ledger that the component failed; its states stay as
/// they were.
async fn record_failure(state: &ComponentState, err: &Error) {
    if state.run.preview {
        return;
    }
    let mut ops = vec![LedgerOp::SetFailure {
        component: state.key.to_vec(),
        failure: Some(err.to_string()),
    }];
    ops.extend(mounted_children_op(state));
    // The failure itself is reported to the caller; a ledger error here
    // only loses the note, which the next run rewrites.
    let _ = state.run.engine.ledger_handle.commit(ops).await;
}

/// Lists the children mounted in this run in the component's child list,
/// so that they are found again even when the component fails.
fn mounted_children_op(state: &ComponentState) -> Option<LedgerOp> {
    let children = lock(&state.children);
    (!children.keys.is_empty()).then(|| LedgerOp::AddChildren {
        component: state.key.to_vec(),
        children: children.keys.clone(),
    })
}

/// Mounts one child component and waits until it has committed.
pub(crate) async fn mount<F, Fut, T>(
    parent: &Arc<ComponentState>,
    key: StableKey,
    f: F,
) -> Result<T>
where
    F: FnOnce(crate::ctx::Ctx) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    T: Send + 'static,
{
    if parent.run.engine.shutdown.is_requested() {
        return Err(interrupted(parent));
    }
    parent.add_child(&key)?;
    let child = ComponentState::new(Arc::clone(&parent.run), parent.path.child(key));
    let path = child.path.clone();
    let had_slot = parent.release_slot();
    parent.run.activity.enter();
    let joined = parent.run.engine.user.spawn(run_component(child, f));
    parent.run.activity.leave();
    let joined = joined.await;
    parent.resume(had_slot).await;
    match joined {
        Ok(r) => r,
        Err(e) => Err(Error::Shutdown(format!(
            "component {path} was cancelled: {e}"
        ))),
    }
}

/// Computes an item's memo key, encoded; `None` when it has none.
pub(crate) type MemoFn<T> = Arc<dyn Fn(&T) -> Option<Vec<u8>> + Send + Sync>;

/// Mounts one child component per item, runs them concurrently (bounded by
/// `max_inflight_components`), and waits until each has committed or failed.
///
/// With `memo`, a child whose memo key equals the one recorded by its last
/// successful commit is skipped: its code does not run and its states stay
/// as they are.
pub(crate) async fn mount_each<I, T, K, KF, F, Fut>(
    parent: &Arc<ComponentState>,
    items: I,
    key_fn: KF,
    memo: Option<MemoFn<T>>,
    f: F,
) -> Result<()>
where
    I: IntoIterator<Item = T>,
    T: Send + 'static,
    KF: Fn(&T) -> K,
    K: crate::model::IntoStableKey,
    F: Fn(crate::ctx::Ctx, T) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send + 'static,
{
    let items: Vec<(StableKey, T)> = items
        .into_iter()
        .map(|item| (key_fn(&item).into_stable_key(), item))
        .collect();
    {
        let mut seen = HashSet::default();
        let children = lock(&parent.children);
        for (k, _) in &items {
            if !seen.insert(k) || children.set.contains(k) {
                return Err(Error::Usage(format!(
                    "component {} mounts child {k} twice in one run",
                    parent.path
                )));
            }
        }
    }
    let run = Arc::clone(&parent.run);
    let shutdown = run.engine.shutdown.clone();
    if shutdown.is_requested() {
        return Err(interrupted(parent));
    }
    for (k, _) in &items {
        parent.add_child(k)?;
    }
    let f = Arc::new(f);
    let had_slot = parent.release_slot();
    let mut handles = Vec::with_capacity(items.len());
    let mut parent_active = true;
    let mut interrupted = false;
    for (key, item) in items {
        let permit = match Arc::clone(&run.inflight).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                // Wait for a slot without counting as active.
                if parent_active {
                    parent_active = false;
                    run.activity.leave();
                }
                match Arc::clone(&run.inflight).acquire_owned().await {
                    Ok(p) => p,
                    Err(_) => break,
                }
            }
        };
        if shutdown.is_requested() {
            interrupted = true;
            break;
        }
        let child = ComponentState::new(Arc::clone(&run), parent.path.child(key));
        *lock(&child.permit) = Some(permit);
        let f = Arc::clone(&f);
        run.activity.enter();
        let path = child.path.clone();
        let memo = memo.clone();
        handles.push((
            path,
            run.engine.user.spawn(async move {
                if let Some(memo_fn) = memo {
                    if memoized(&child, &*memo_fn, &item) {
                        return Ok(());
                    }
                }
                run_component(child, move |ctx| f(ctx, item)).await
            }),
        ));
    }
    if parent_active {
        run.activity.leave();
    }
    for (path, h) in handles {
        // Failures are recorded in the run by the child itself; a task
        // that died without reporting is reported here.
        if let Err(e) = h.await {
            run.fail(ComponentFailure::new(
                path,
                &Error::msg(format!("the component task died: {e}")),
            ));
        }
    }
    parent.resume(had_slot).await;
    if interrupted {
        return Err(self::interrupted(parent));
    }
    Ok(())
}

/// The error of a component whose mounting was cut short by a shutdown
/// request. The component fails even if its code goes on: committing it
/// would delete the children it did not reach (and record its memo key).
fn interrupted(parent: &ComponentState) -> Error {
    let err = Error::Interrupted(parent.path.clone());
    parent.poison(&err);
    err
}

/// Decides whether a memoized child can be skipped. When it can, it is
/// accounted for as done; otherwise its new memo key is kept for its commit.
fn memoized<T>(
    child: &Arc<ComponentState>,
    memo_fn: &(dyn Fn(&T) -> Option<Vec<u8>> + Send + Sync),
    item: &T,
) -> bool {
    // A panicking memo function only costs the memoization: the child
    // runs, and meets the problem itself.
    let computed = std::panic::catch_unwind(AssertUnwindSafe(|| memo_fn(item)));
    let Ok(Some(memo)) = computed else {
        return false;
    };
    let run = &child.run;
    let unchanged = matches!(run.engine.ledger.memo(&child.key), Ok(Some(stored)) if stored.as_ref() == memo.as_slice());
    if unchanged {
        run.counters
            .memoized
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        run.metrics.components_memoized.increment(1);
        lock(&child.permit).take();
        run.activity.leave();
        return true;
    }
    let _ = child.memo.set(memo);
    false
}

/// What reconciliation found for one declaration.
struct Reconciled {
    location: Option<Arc<[u8]>>,
    prev: Option<StateEntry>,
    output: Option<ErasedOutput>,
    /// For containers: the generation given to the children.
    child_gen: Option<ChildGeneration>,
}

/// What reconciliation found, by declaration index. Most declarations of
/// a re-run have no outcome (the shards only count the states that need
/// nothing), so outcomes are kept as the shards' replies bring them, with
/// a slot per declaration that points to its own, rather than in a slot of
/// an outcome's size per declaration: that was 200 bytes each, 20 MB to
/// allocate and clear for a 100k-state component, 6-7 ms after its code
/// returned. Each reply's outcomes stay in a part of their own, sized once:
/// one list grown reply by reply would copy a first run's outcomes again.
struct Outcomes {
    /// Per declaration, where its outcome is: part and position.
    slot: Vec<(usize, usize)>,
    /// The replies' outcomes, each with its declaration's index.
    parts: Vec<Vec<(usize, Reconciled)>>,
}

/// The slot of a declaration without an outcome.
const NO_OUTCOME: (usize, usize) = (usize::MAX, usize::MAX);

impl Outcomes {
    fn new(declarations: usize) -> Self {
        Self {
            slot: vec![NO_OUTCOME; declarations],
            parts: Vec::new(),
        }
    }

    /// Records a reply's outcomes, by declaration index (an index out of
    /// range is dropped: every index comes from the component's own list).
    fn add(&mut self, outcomes: Vec<(usize, Reconciled)>) {
        let part = self.parts.len();
        for (at, (idx, _)) in outcomes.iter().enumerate() {
            if let Some(slot) = self.slot.get_mut(*idx) {
                *slot = (part, at);
            }
        }
        self.parts.push(outcomes);
    }

    fn get(&self, idx: usize) -> Option<&Reconciled> {
        let &(part, at) = self.slot.get(idx)?;
        self.parts.get(part)?.get(at).map(|(_, r)| r)
    }

    fn get_mut(&mut self, idx: usize) -> Option<&mut Reconciled> {
        let &(part, at) = self.slot.get(idx)?;
        self.parts.get_mut(part)?.get_mut(at).map(|(_, r)| r)
    }

    /// How many declarations have an outcome.
    fn len(&self) -> usize {
        self.parts.iter().map(Vec::len).sum()
    }

    /// The outcomes with their declaration's index, in declaration order.
    fn iter(&self) -> impl Iterator<Item = (usize, &Reconciled)> + '_ {
        self.slot
            .iter()
            .enumerate()
            .filter_map(|(idx, &(part, at))| Some((idx, &self.parts.get(part)?.get(at)?.1)))
    }
}

/// Leaves the run's activity once.
struct ActiveGuard<'a> {
    run: &'a Run,
    active: bool,
}

impl ActiveGuard<'_> {
    fn leave(&mut self) {
        if self.active {
            self.active = false;
            self.run.activity.leave();
        }
    }
}

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

/// Reconciles, applies and commits what the component declared.
async fn finish(state: &Arc<ComponentState>) -> Result<()> {
    let run = &state.run;
    let mut active = ActiveGuard { run, active: true };
    let (mut decls, paths, errors, early) = {
        let mut d = lock(&state.decls);
        (
            std::mem::take(&mut d.list),
            std::mem::take(&mut d.paths),
            std::mem::take(&mut d.errors),
            std::mem::take(&mut d.early),
        )
    };
    run.metrics.declarations.increment(decls.len() as u64);
    state.note_declared(decls.len());
    if let Some(first) = errors.first() {
        let e = Error::Usage(first.clone());
        active.leave();
        record_failure(state, &e).await;
        return Err(e);
    }
    let reconciled = match reconcile_waves(state, &mut decls, paths, early).await {
        Ok(r) => r,
        Err(e) => {
            active.leave();
            record_failure(state, &e).await;
            return Err(e);
        }
    };
    let Reconciliation {
        mut results,
        unchanged: unchanged_own,
        waves,
        orphans,
        prev_children,
        prev_failure,
        fresh,
    } = reconciled;

    if run.preview {
        let mut preview = lock(&run.preview_actions);
        for (i, r) in results.iter() {
            if let (Some(out), Some(d)) = (r.output.as_ref(), decls.get(i)) {
                if is_refresh(state, d, r) {
                    continue;
                }
                preview.push(PreviewAction {
                    provider: d.provider.path.name.to_string(),
                    key: d.key.clone(),
                    kind: out.kind,
                    component: state.path.clone(),
                });
            }
        }
        drop(preview);
        note_children_and_orphans(state, &prev_children, orphans);
        return Ok(());
    }

    // Apply wave by wave: containers before their children.
    let waiter = UnitWaiter::new();
    let mut attempted: Vec<usize> = Vec::new();
    let mut failure: Option<Error> = None;
    let mut records: Option<Result<SuccessRecords>> = None;
    // A large wave goes to the sinks a batch at a time, so that the first
    // sink calls start while the rest is being planned.
    let batch = run.engine.config.batch.max_actions.max(1);
    for (w, wave) in waves.iter().enumerate() {
        // A fresh component has an action for every state: its sink
        // group starts with room for a batch of them. Another's waves
        // hold its unchanged states too, so its groups grow as needed.
        let room = |left: usize| if fresh { left.min(batch) } else { 0 };
        let mut groups = SinkGroups::with_room(room(wave.len()));
        for (n, &i) in wave.iter().enumerate() {
            let (Some(r), Some(d)) = (results.get_mut(i), decls.get(i)) else {
                continue;
            };
            let typed = r.output.as_mut().and_then(|o| o.typed.take());
            let r = &*r;
            let Some(out) = &r.output else { continue };
            if is_refresh(state, d, r) {
                continue;
            }
            let planned = PlannedAction {
                action: EncodedAction {
                    kind: out.kind,
                    bytes: Arc::clone(&out.action),
                    typed,
                },
                key: d.key.clone(),
                intent: intent_for(state, d, r),
            };
            groups.add(
                &out.sink,
                &d.provider.path.name,
                &d.provider.path.root,
                planned,
            );
            attempted.push(i);
            if groups.len() >= batch {
                let left = wave.len() - n - 1;
                std::mem::replace(&mut groups, SinkGroups::with_room(room(left)))
                    .dispatch(run, &waiter);
            }
        }
        groups.dispatch(run, &waiter);
        active.leave();
        if w + 1 == waves.len() {
            // What to commit if every action lands, worked out while the
            // sinks apply the last wave.
            records = Some(success_records(state, &decls, &results, fresh));
        }
        failure = waiter.wait().await;
        if failure.is_some() {
            break;
        }
    }
    active.leave();

    if let Some(err) = failure {
        let mut ops: Vec<LedgerOp> = attempted
            .iter()
            .filter_map(|&i| {
                let r = results.get(i)?;
                let d = decls.get(i)?;
                Some(LedgerOp::Fold(
                    intent_for(state, d, r).unwrap_or_else(|| full_intent(state, d, r)),
                ))
            })
            .collect();
        ops.push(LedgerOp::SetFailure {
            component: state.key.to_vec(),
            failure: Some(err.to_string()),
        });
        ops.extend(mounted_children_op(state));
        for (i, r) in results.iter() {
            if let Some(d) = decls.get(i).filter(|d| d.child.is_some()) {
                let committed = r
                    .prev
                    .as_ref()
                    .and_then(|p| p.child_gen)
                    .unwrap_or_default();
                run.note_failed_container(&d.path, committed);
            }
        }
        run.engine.ledger_handle.commit(ops).await?;
        return Err(err);
    }

    // Success: final records, ownership moves, children and failure notes.
    let SuccessRecords {
        mut ops,
        unchanged,
        actions,
    } = match records {
        Some(r) => r?,
        None => success_records(state, &decls, &results, fresh)?,
    };
    run.counters.unchanged.fetch_add(
        unchanged + unchanged_own,
        std::sync::atomic::Ordering::Relaxed,
    );
    for (kind, n) in actions {
        run.counters.count_action(kind, n);
    }
    let own = state.key.to_vec();
    if let Some(children) = children_change(state, &prev_children) {
        ops.push(LedgerOp::AddChildren {
            component: own.clone(),
            children,
        });
    }
    if prev_failure.is_some() {
        ops.push(LedgerOp::SetFailure {
            component: own.clone(),
            failure: None,
        });
    }
    if let Some(memo) = state.memo.get() {
        // States it no longer declares, and children it no longer mounts,
        // are deleted only at the end of the run: until that has happened,
        // its memo key does not describe what exists, so it is not
        // recorded (the next run runs the component again and records it).
        let pending = !orphans.is_empty() || removes_children(state, &prev_children);
        ops.push(LedgerOp::SetMemo {
            component: own,
            memo: (!pending).then(|| memo.clone()),
        });
    }
    if !ops.is_empty() {
        run.engine.ledger_handle.commit(ops).await?;
    }
    note_children_and_orphans(state, &prev_children, orphans);
    free_later(run, (decls, results));
    Ok(())
}

/// The number of declarations from which a component's are freed on a
/// blocking thread rather than where it commits.
const FREE_LATER_FROM: usize = 10_000;

/// Frees a committed component's declarations and reconcile outcomes. For
/// a large component that is hundreds of thousands of deallocations (11-15
/// ms per 100k states on a first load, measured with `postgres_sync`),
/// which would otherwise delay reporting the component done; a blocking
/// thread of the user's runtime does it instead.
fn free_later(run: &Run, (decls, results): (Vec<Declaration>, Outcomes)) {
    if decls.len() >= FREE_LATER_FROM {
        drop(
            run.engine
                .user
                .spawn_blocking(move || drop((decls, results))),
        );
    }
}

/// What a component commits when all its actions landed, and what it
/// counts: states unchanged, and actions by kind.
struct SuccessRecords {
    ops: Vec<LedgerOp>,
    unchanged: u64,
    actions: Vec<(ActionKind, u64)>,
}

/// The records a component commits if every action it dispatched lands:
/// final records, ownership moves (a fresh component's whole entry at
/// once). Pure: nothing is counted or written here.
fn success_records(
    state: &ComponentState,
    decls: &[Declaration],
    results: &Outcomes,
    fresh: bool,
) -> Result<SuccessRecords> {
    let own = state.key.to_vec();
    let mut ops = Vec::with_capacity(if fresh { 0 } else { results.len() });
    // A fresh component's states, borrowed, for its whole entry.
    let mut new_entry = NewEntry::with_room(if fresh { results.len() } else { 0 });
    let mut unchanged = 0u64;
    let mut actions: Vec<(ActionKind, u64)> = Vec::new();
    for (i, r) in results.iter() {
        let Some(d) = decls.get(i) else {
            continue;
        };
        let moved_from = r.location.as_ref().filter(|l| l.as_ref() != own.as_slice());
        match &r.output {
            None => {
                unchanged += 1;
                if let (Some(from), Some(prev)) = (&moved_from, &r.prev) {
                    if fresh {
                        new_entry.push(
                            d,
                            StateEntryOut {
                                path: serde_bytes::Bytes::new(&prev.path),
                                records: RecordsOut::Many(&prev.records),
                                may_be_missing: prev.may_be_missing,
                                gen: prev.gen,
                                child_gen: prev.child_gen,
                            },
                        );
                    } else {
                        ops.push(LedgerOp::Put {
                            component: own.clone(),
                            entry: prev.clone(),
                            index_owner: true,
                            container: container_of(d),
                        });
                    }
                    ops.push(LedgerOp::Remove {
                        component: from.to_vec(),
                        path: d.path.to_vec(),
                    });
                    ops.push(forget_memo(from));
                }
            }
            Some(_) if is_refresh(state, d, r) => unchanged += 1,
            Some(out) => {
                match actions.iter_mut().find(|(k, _)| *k == out.kind) {
                    Some((_, n)) => *n += 1,
                    None => actions.push((out.kind, 1)),
                }
                match &out.record {
                    Some(record) => {
                        let gen = generation(&d.provider).current;
                        let child_gen = r
                            .child_gen
                            .or_else(|| r.prev.as_ref().and_then(|p| p.child_gen));
                        if fresh {
                            // No entry of its own to compare with.
                            new_entry.push(
                                d,
                                StateEntryOut {
                                    path: serde_bytes::Bytes::new(&d.path),
                                    records: RecordsOut::One(serde_bytes::Bytes::new(record)),
                                    may_be_missing: false,
                                    gen,
                                    child_gen,
                                },
                            );
                        } else {
                            let entry = StateEntry {
                                path: buf(&d.path),
                                records: vec![buf(record)],
                                may_be_missing: false,
                                gen,
                                child_gen,
                            };
                            let same = moved_from.is_none() && r.prev.as_ref() == Some(&entry);
                            if !same {
                                ops.push(LedgerOp::Put {
                                    component: own.clone(),
                                    entry,
                                    index_owner: r.location.is_none() || moved_from.is_some(),
                                    container: container_of(d),
                                });
                            }
                        }
                        if let Some(from) = &moved_from {
                            ops.push(LedgerOp::Remove {
                                component: from.to_vec(),
                                path: d.path.to_vec(),
                            });
                            ops.push(forget_memo(from));
                        }
                    }
                    None => {
                        if let Some(loc) = &r.location {
                            ops.push(LedgerOp::Remove {
                                component: loc.to_vec(),
                                path: d.path.to_vec(),
                            });
                        }
                        if r.prev.as_ref().is_some_and(|p| p.child_gen.is_some()) {
                            ops.push(LedgerOp::DropDescendants {
                                path: d.path.to_vec(),
                            });
                        }
                    }
                }
            }
        }
    }
    if let Some(put) = new_entry.into_op(own)? {
        ops.push(put);
    }
    Ok(SuccessRecords {
        ops,
        unchanged,
        actions,
    })
}

/// A state of a [`NewEntry`], with its path (to index) and container.
struct NewState<'a> {
    entry: StateEntryOut<'a>,
    path: &'a Arc<[u8]>,
    container: Option<&'a [u8]>,
}

/// The states of a fresh component's first entry, borrowed from its
/// declarations and outcomes, encoded in one go (no per-state copies).
struct NewEntry<'a> {
    states: Vec<NewState<'a>>,
    /// About how many bytes the encoded entry takes.
    size: usize,
}

impl<'a> NewEntry<'a> {
    /// An entry with room for `states` states.
    fn with_room(states: usize) -> Self {
        Self {
            states: Vec::with_capacity(states),
            size: 0,
        }
    }

    fn push(&mut self, d: &'a Declaration, entry: StateEntryOut<'a>) {
        self.size += entry.path.len() + 48;
        self.states.push(NewState {
            entry,
            path: &d.path,
            container: d.provider.path.container.as_deref(),
        });
    }

    /// The op that writes the whole entry (states sorted by path, the first
    /// of two with one path kept), or `None` when there is no state.
    fn into_op(mut self, own: Vec<u8>) -> Result<Option<LedgerOp>> {
        if self.states.is_empty() {
            return Ok(None);
        }
        self.states.sort_by(|a, b| a.entry.path.cmp(b.entry.path));
        self.states.dedup_by(|a, b| a.entry.path == b.entry.path);
        let mut containers: Vec<Vec<u8>> = Vec::new();
        for s in &self.states {
            // The states of one container come in runs: keep one each.
            let new_run = |c: &&[u8]| containers.last().map(Vec::as_slice) != Some(*c);
            if let Some(c) = s.container.filter(new_run) {
                containers.push(c.to_vec());
            }
        }
        containers.sort();
        containers.dedup();
        let indexed = self.states.iter().map(|s| Arc::clone(s.path)).collect();
        let states: Vec<StateEntryOut<'a>> = self.states.into_iter().map(|s| s.entry).collect();
        let mut encoded = Vec::with_capacity(self.size + 16);
        rmp_serde::encode::write(
            &mut encoded,
            &ComponentEntryOut {
                states: &states,
                failure: None,
            },
        )?;
        Ok(Some(LedgerOp::PutEntry {
            component: own,
            encoded,
            indexed,
            containers,
        }))
    }
}

/// Whether a container's action only refreshes it: an update whose record
/// is the one committed, with no child invalidation, by its owner. A
/// container's handler must answer with an action on every run (its child
/// handler is built from it); such an answer is not applied and counts as
/// unchanged, as a `None` from a leaf would.
fn is_refresh(state: &ComponentState, d: &Declaration, r: &Reconciled) -> bool {
    let (Some(out), Some(prev)) = (&r.output, &r.prev) else {
        return false;
    };
    d.child.is_some()
        && out.kind == ActionKind::Update
        && out.child_invalidation.is_none()
        && !prev.may_be_missing
        && prev.gen == generation(&d.provider).current
        && r.location.as_deref() == Some(&*state.key)
        && match (&out.record, prev.records.as_slice()) {
            (Some(record), [committed]) => committed.as_slice() == record.as_slice(),
            _ => false,
        }
}

/// A component that lost a state to another one no longer declares what
/// its memo key stands for: it must run again.
fn forget_memo(component: &[u8]) -> LedgerOp {
    LedgerOp::SetMemo {
        component: component.to_vec(),
        memo: None,
    }
}

/// The children mounted now that the last run's list lacks. Children no
/// longer mounted stay listed until the end of the run has cleaned them up
/// (a failed cleanup is then retried by the next run).
fn children_change(state: &ComponentState, prev: &[StableKey]) -> Option<Vec<StableKey>> {
    let children = lock(&state.children);
    let prev_set: HashSet<&StableKey> = prev.iter().collect();
    let added: Vec<StableKey> = children
        .keys
        .iter()
        .filter(|k| !prev_set.contains(k))
        .cloned()
        .collect();
    (!added.is_empty()).then_some(added)
}

/// Whether a child of the last run is not mounted in this one.
fn removes_children(state: &ComponentState, prev_children: &[StableKey]) -> bool {
    let children = lock(&state.children);
    prev_children.iter().any(|k| !children.set.contains(k))
}

/// After a success: children no longer mounted are removed, and states no
/// longer declared become orphans, deleted at the end of the run.
fn note_children_and_orphans(
    state: &ComponentState,
    prev_children: &[StableKey],
    orphans: Vec<StateEntry>,
) {
    let run = &state.run;
    {
        let children = lock(&state.children);
        let mut removed = lock(&run.removed);
        for k in prev_children {
            if !children.set.contains(k) {
                removed.push(state.path.child(k.clone()));
            }
        }
    }
    if !orphans.is_empty() {
        let mut all = lock(&run.orphans);
        all.extend(orphans.into_iter().map(|entry| Orphan {
            component: Arc::clone(&state.key),
            component_path: state.path.clone(),
            entry,
        }));
    }
}

fn generation(provider: &ProviderCore) -> ChildGeneration {
    provider
        .resolved
        .get()
        .map(|r| r.generation)
        .unwrap_or_default()
}

/// The intent to persist before applying a declared state's action, or
/// `None` when the state's possible records would not change.
fn intent_for(state: &ComponentState, d: &Declaration, r: &Reconciled) -> Option<Intent> {
    let out = r.output.as_ref()?;
    if let Some(prev) = &r.prev {
        let gen_same = r.child_gen.is_none() || r.child_gen == prev.child_gen;
        let covered = match &out.record {
            Some(rec) => prev.records.iter().any(|p| p.as_slice() == rec.as_slice()),
            None => prev.may_be_missing,
        };
        if covered && gen_same && prev.gen == generation(&d.provider).current {
            return None;
        }
    }
    Some(full_intent(state, d, r))
}

fn full_intent(state: &ComponentState, d: &Declaration, r: &Reconciled) -> Intent {
    let component = r.location.as_deref().unwrap_or(&state.key);
    Intent {
        component: buf(component),
        path: buf(&d.path),
        record: r.output.as_ref().and_then(|o| o.record.as_deref().map(buf)),
        gen: generation(&d.provider).current,
        child_gen: r.child_gen,
        container: d.provider.path.container.as_deref().map(buf),
    }
}

fn container_of(d: &Declaration) -> Option<Vec<u8>> {
    d.provider.path.container.as_ref().map(|c| c.to_vec())
}

struct Reconciliation {
    /// The declarations' outcomes; none for one that needed nothing in
    /// the component's own entry (counted in `unchanged` instead).
    results: Outcomes,
    /// Declarations found unchanged in the component's own entry, which
    /// the shards count rather than answer one by one.
    unchanged: u64,
    waves: Vec<Vec<usize>>,
    orphans: Vec<StateEntry>,
    prev_children: Vec<StableKey>,
    prev_failure: Option<String>,
    /// The component has no ledger entry yet.
    fresh: bool,
}

/// Reconciles declarations in waves: first those whose provider is
/// resolved, then the children of the containers resolved by that wave.
/// `paths` are what `declare` kept to refuse duplicates: when the
/// declarations did not match every state the component's entry holds,
/// the others are found with them in the home shard's reading of the
/// entry.
async fn reconcile_waves(
    state: &Arc<ComponentState>,
    decls: &mut [Declaration],
    paths: Seen,
    early: Early,
) -> Result<Reconciliation> {
    let run = &state.run;
    let shards = &run.engine.shards;
    let n = shards.len();
    // The home shard reads the whole entry once: it hands its reading back
    // (to find the states the component no longer declares in) and reads
    // its child list. Taking the
    // shard of the first declaration as home means a component whose states
    // all live on one shard sends one message.
    let home = decls
        .first()
        .map_or_else(|| shard_of(&state.key, n), |d| shard_of(&d.path, n));
    let sent_early = |i: usize| early.sent.get(i).copied().unwrap_or(false);
    let mut done: Vec<bool> = (0..decls.len()).map(sent_early).collect();
    let chunked = |s: usize| early.shards.get(s).copied().unwrap_or(false);
    let mut early_replies = early.replies;
    let mut out = Reconciliation {
        results: Outcomes::new(decls.len()),
        unchanged: 0,
        waves: Vec::new(),
        orphans: Vec::new(),
        prev_children: Vec::new(),
        prev_failure: None,
        fresh: false,
    };
    let mut first = true;
    // The home shard's reading of the component's entry.
    let mut home_entry = None;
    // The entry's states, and how many the declarations found there.
    let (mut stored, mut matched) = (0, 0);
    loop {
        let ready: Vec<usize> = (0..decls.len())
            .filter(|&i| !done[i] && decls[i].provider.resolved.get().is_some())
            .collect();
        if !first && ready.is_empty() {
            break;
        }
        let mut per_shard = ShardBatch::for_shards(n, ready.len());
        for &i in &ready {
            done[i] = true;
            let Some(d) = decls.get_mut(i) else {
                continue;
            };
            if let Some(batch) = per_shard.get_mut(shard_of(&d.path, n)) {
                batch.push(i, d);
            }
        }
        // The first wave also takes the declarations sent early.
        let wave: Vec<usize> = if first {
            (0..decls.len())
                .filter(|&i| sent_early(i) || ready.binary_search(&i).is_ok())
                .collect()
        } else {
            ready
        };
        let mut replies: Vec<(bool, oneshot::Receiver<ShardReply>)> = Vec::new();
        if first {
            replies.extend(early_replies.drain(..).map(|rx| (false, rx)));
        }
        for (s, batch) in per_shard.into_iter().enumerate() {
            let is_home = first && s == home;
            // A shard sent chunks early gets a last message, which lets
            // go of the entry it kept.
            let last = first && chunked(s);
            if batch.is_empty() && !is_home && !last {
                continue;
            }
            let chunk = if last { Chunk::Last } else { Chunk::Only };
            let reply = state.send_batch(s, batch, is_home, chunk);
            replies.push((is_home, reply));
        }
        let mut errors: Vec<Error> = Vec::new();
        for (is_home, rx) in replies {
            let reply = rx.await.map_err(shard_stopped)?;
            if let Some(e) = reply.error {
                return Err(e);
            }
            matched += reply.matched;
            out.unchanged += reply.unchanged as u64;
            if first && is_home {
                out.prev_children = reply.prev_children;
                // The entry as the home shard read it: its state count,
                // failure, and whether there is one.
                let own = reply.entry.as_deref().and_then(Option::as_ref);
                stored = own.map_or(0, |e| e.states.len());
                out.prev_failure = own.and_then(|e| e.failure.clone());
                out.fresh = own.is_none();
                home_entry = reply.entry;
            }
            let mut found = Vec::with_capacity(reply.outcomes.len());
            for o in reply.outcomes {
                match o.result {
                    Err(e) => errors.push(e),
                    Ok(output) => found.push((
                        o.idx,
                        Reconciled {
                            location: match o.location {
                                Found::Nowhere => None,
                                Found::Own => Some(Arc::clone(&state.key)),
                                Found::In(component) => Some(component),
                            },
                            prev: o.prev,
                            output,
                            child_gen: None,
                        },
                    )),
                }
            }
            out.results.add(found);
            // States another component declared first.
            for (idx, first_by) in reply.duplicates {
                if let Some(d) = decls.get(idx) {
                    errors.push(Error::DuplicateDeclaration {
                        provider: d.provider.path.name.to_string(),
                        key: d.key.clone(),
                        first_by: Some(first_by),
                    });
                }
            }
        }
        if let Some(e) = errors.into_iter().next() {
            return Err(e);
        }
        for &i in &wave {
            let d = &decls[i];
            let (Some(child), Some(r)) = (&d.child, out.results.get_mut(i)) else {
                continue;
            };
            r.child_gen = resolve_child(run, d, child, r)?;
        }
        out.waves.push(wave);
        first = false;
    }
    if let Some(i) = done.iter().position(|d| !d) {
        let d = &decls[i];
        return Err(Error::Reconcile {
            provider: d.provider.path.name.to_string(),
            key: d.key.clone(),
            cause: Box::new(Error::Usage(
                "its provider never resolved: the container's handler returned no Create or Update action"
                    .into(),
            )),
        });
    }
    if matched != stored {
        // The entry as the home shard read it in this run, which the
        // declarations were matched against. States can have left it
        // since: taken over by components that declared them in this run
        // (as orphans, `FilterOrphans` drops them before anything is
        // deleted), or dropped below a container deleted or rebuilt (their
        // records are then below the container's generation, or their
        // provider unresolved: nothing to delete). Either way the orphan's
        // removal from the entry changes nothing, but the component's memo
        // is not recorded in such a run (it runs again next time). None
        // entered it: only the component's own commit, after this, adds
        // to it.
        let Some(entry) = home_entry else {
            return Err(Error::msg(format!(
                "component {}: its home shard gave no reading of its entry",
                state.path
            )));
        };
        if let Some(entry) = entry.as_ref() {
            out.orphans = paths.orphans_in(decls, entry);
        }
    }
    Ok(out)
}

/// Builds a container's child handler from its action and resolves the
/// child provider. Returns the generation given to the children.
fn resolve_child(
    run: &Run,
    d: &Declaration,
    child: &Arc<ProviderCore>,
    r: &Reconciled,
) -> Result<Option<ChildGeneration>> {
    let Some(out) = &r.output else {
        return Ok(None);
    };
    if out.kind == ActionKind::Delete {
        return Ok(None);
    }
    let wrap = |cause: Error| Error::Reconcile {
        provider: d.provider.path.name.to_string(),
        key: d.key.clone(),
        cause: Box::new(cause),
    };
    let factory = out.sink.child_handler.as_ref().ok_or_else(|| {
        wrap(Error::Usage(
            "declared with a child, but its sink has no child handler (use TargetActionSink::from_async_fn_with_child_handler)".into(),
        ))
    })?;
    let def = guarded(|| factory(&out.action)).map_err(wrap)?;
    let prev = r
        .prev
        .as_ref()
        .and_then(|p| p.child_gen)
        .unwrap_or_default();
    let gen = match out.child_invalidation {
        Some(TargetChildInvalidation::Destructive) => ChildGeneration {
            current: prev.current + 1,
            destructive_floor: prev.current + 1,
        },
        Some(TargetChildInvalidation::Lossy) => ChildGeneration {
            current: prev.current + 1,
            destructive_floor: prev.destructive_floor,
        },
        None => prev,
    };
    resolve_provider(run, child, def.handler, gen).map_err(wrap)?;
    Ok(Some(gen))
}

/// Runs a connector callback, turning a panic into an error.
pub(crate) fn guarded<T>(call: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(AssertUnwindSafe(call)) {
        Ok(result) => result,
        Err(payload) => Err(Error::permanent(format!(
            "the handler panicked: {}",
            panic_text(&*payload)
        ))),
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

#[cfg(test)]
mod tests {
    use super::not_among;

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
