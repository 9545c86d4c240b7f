//! Running a component and mounting its children, memoized or not.

use rustc_hash::FxHashSet as HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use tracing::Instrument;

use futures::FutureExt;
use tokio::sync::OwnedSemaphorePermit;

use crate::error::{ComponentFailure, Error, Result};
use crate::model::{ComponentPath, StableKey};
use crate::run::Run;
use crate::sync::lock;

use super::failed::{failure_ops, record_failure};
use super::finish::finish;
use super::ComponentState;
use crate::actors::guard::panic_text;
use crate::actors::tasks::AbortOnDrop;

/// Runs a component: its code, then its reconciliation and commit.
/// Failures are recorded in the run and returned.
///
/// The caller counts the component as active
/// ([`ComponentState::enter_activity`]) before it is spawned, so that a
/// sink never sees the run idle between the spawn of a component and its
/// first poll.
///
/// Dropped before it ends (its mount or run was cancelled), the
/// component is a failed one: see [`CancelGuard`].
pub(crate) async fn run_component<F, Fut, T>(state: Arc<ComponentState>, f: F) -> Result<T>
where
    F: FnOnce(crate::ctx::Ctx) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    T: Send + 'static,
{
    run_armed(CancelGuard::arm(state), f).await
}

/// [`run_component`], with its cancel guard armed already (when it was
/// spawned).
async fn run_armed<F, Fut, T>(guard: CancelGuard, f: F) -> Result<T>
where
    F: FnOnce(crate::ctx::Ctx) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let state = Arc::clone(&guard.state);
    let run = Arc::clone(&state.run);
    run.counters
        .components
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // Connectors' logs in the component's code name the component.
    let span = tracing::debug_span!("component", path = %state.path);
    let result = code_then_commit(&state, f).instrument(span).await;
    guard.disarm();
    end_component(&state);
    if result.is_ok() {
        let outcome = if state
            .found_unchanged
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            &run.metrics.components_unchanged
        } else {
            &run.metrics.components_ok
        };
        outcome.increment(1);
    } else {
        run.metrics.components_failed.increment(1);
    }
    if let Err(e) = &result {
        run.fail(ComponentFailure::new(state.path.clone(), e));
    }
    result
}

/// Runs the component's code, then (if it returned `Ok`) reconciles,
/// applies and commits; a failure or panic is recorded in the ledger.
async fn code_then_commit<F, Fut, T>(state: &Arc<ComponentState>, f: F) -> Result<T>
where
    F: FnOnce(crate::ctx::Ctx) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let ctx = crate::ctx::Ctx::from_state(Arc::clone(state));
    let outcome = AssertUnwindSafe(f(ctx)).catch_unwind().await;
    state.close();
    let failure = match outcome {
        // Boxed: the commit state machine is large, and a task that never
        // gets there (a memoized or failed component) should not carry it.
        Ok(Ok(value)) => {
            return match AssertUnwindSafe(Box::pin(finish(state)))
                .catch_unwind()
                .await
            {
                Ok(done) => done.map(|()| value),
                Err(panic) => {
                    let e = Error::msg(format!(
                        "component panicked while committing: {}",
                        panic_text(&*panic)
                    ));
                    record_failure(state, &e).await;
                    Err(e)
                }
            };
        }
        Ok(Err(e)) => e,
        Err(panic) => Error::msg(format!("component code panicked: {}", panic_text(&*panic))),
    };
    state.leave_activity();
    record_failure(state, &failure).await;
    Err(failure)
}

/// What every end of a component undoes: its activity, its slot, the
/// in-flight gauge.
fn end_component(state: &ComponentState) {
    state.leave_activity();
    lock(&state.permit).take();
    state.run.metrics.inflight.decrement(1.0);
}

/// Makes a component dropped before it ended (its `mount`'s future or its
/// run's was dropped, or its parent's) a failed component: nothing more
/// of it runs, nothing of it is committed, and its earlier states stay as
/// they were (guarantee 13). Sink calls it already started finish; their
/// intents stay in the journal, and the next run folds them in before it
/// reconciles. Its activity, slot and gauges are given back.
pub(crate) struct CancelGuard {
    state: Arc<ComponentState>,
    armed: bool,
}

impl CancelGuard {
    /// Arms the guard of a component about to run (or be spawned): it
    /// counts as in flight until it ends.
    fn arm(state: Arc<ComponentState>) -> Self {
        state.run.metrics.inflight.increment(1.0);
        Self { state, armed: true }
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let state = &self.state;
        let run = &state.run;
        end_component(state);
        run.metrics.components_failed.increment(1);
        // Unless its commit was sent (the ledger writes it), its failure
        // is, without waiting (nothing can wait here); the ledger writes
        // it before anything sent after it.
        state.final_commit.send_once(|| {
            run.note_cancelled();
            let err = Error::Cancelled(state.path.clone());
            run.fail(ComponentFailure::new(state.path.clone(), &err));
            if run.preview || state.read_only_root() {
                return;
            }
            let _ = run
                .engine
                .ledger_handle
                .commit_start(failure_ops(state, &err));
        });
    }
}

/// Spawns a child component's task on the user's runtime: counted as
/// active and in flight from now, as work the next run waits for, and
/// aborted (a cancelled component) when the returned handle is dropped
/// before it ended.
fn spawn_child<T, Fut>(
    child: Arc<ComponentState>,
    task: impl FnOnce(CancelGuard) -> Fut,
) -> AbortOnDrop<Result<T>>
where
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let engine = Arc::clone(&child.run.engine);
    child.enter_activity();
    let token = engine.work.token();
    let fut = task(CancelGuard::arm(child));
    // The work token goes when the future does: once it completes, or
    // when the task is aborted. (An `async` block awaiting `fut` would
    // hold it twice, as what it captured and as what it awaits: twice the
    // task's size, for every component in flight.)
    let handle = engine.user.spawn(fut.map(move |out| {
        drop(token);
        out
    }));
    engine.tasks.track(&handle);
    AbortOnDrop(handle)
}

/// Mounts one child component and waits until it has committed. A
/// root-level one outside the run's scope is refused unless `unscoped`
/// (the root's own containers, mounted by `mount_target`).
pub(crate) async fn mount<F, Fut, T>(
    parent: &Arc<ComponentState>,
    key: StableKey,
    unscoped: bool,
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
    if !unscoped && parent.path.is_root() && !parent.run.in_scope(&key) {
        let path = parent.path.child(key.clone());
        return Err(match &parent.run.engine.member {
            Some(member) => member.not_held(path, &key),
            None => Error::OutOfScope(path),
        });
    }
    parent.add_child(&key)?;
    let child = ComponentState::new(Arc::clone(&parent.run), parent.path.child(key));
    let path = child.path.clone();
    let had_slot = parent.release_slot();
    // Dropping this future aborts the child (a cancelled component).
    let joined = spawn_child(child, move |guard| run_armed(guard, f));
    parent.leave_activity();
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

/// How a child's memo key is checked against the one its last successful
/// commit recorded.
pub(crate) struct Memo<T> {
    /// The child's memo key.
    pub key: MemoFn<T>,
    /// Whether the recorded key (first) covers the new one (second): the
    /// child is then skipped.
    pub covers: fn(&[u8], &[u8]) -> bool,
}

impl<T> Memo<T> {
    /// Skips a child whose memo key is the one recorded.
    pub(crate) fn equal(key: MemoFn<T>) -> Self {
        Self {
            key,
            covers: |stored, new| stored == new,
        }
    }
}

impl<T> Clone for Memo<T> {
    fn clone(&self) -> Self {
        Self {
            key: Arc::clone(&self.key),
            covers: self.covers,
        }
    }
}

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
    memo: Option<Memo<T>>,
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
    refuse_twice_mounted(parent, &items)?;
    let run = Arc::clone(&parent.run);
    let shutdown = run.engine.shutdown.clone();
    if shutdown.is_requested() {
        return Err(interrupted(parent));
    }
    let items = in_scope(parent, items);
    for (k, _) in &items {
        parent.add_child(k)?;
    }
    let f = Arc::new(f);
    let had_slot = parent.release_slot();
    let mut handles = ChildTasks::default();
    let mut interrupted = false;
    let mut slots = Slots::default();
    let mut left = items.len();
    for (key, item) in items {
        let Some(permit) = slots.next(parent, left).await else {
            break;
        };
        left -= 1;
        if shutdown.is_requested() {
            interrupted = true;
            break;
        }
        let child = ComponentState::new(Arc::clone(&run), parent.path.child(key));
        *lock(&child.permit) = Some(permit);
        let f = Arc::clone(&f);
        let path = child.path.clone();
        let memo = memo.clone();
        // Dropping `handles` (this future was dropped) aborts the
        // children still running (cancelled components).
        let task = spawn_child(child, move |guard| async move {
            if let Some(memo) = memo {
                if memoized(&guard.state, &memo, &item) {
                    let state = Arc::clone(&guard.state);
                    guard.disarm();
                    end_component(&state);
                    return Ok(());
                }
            }
            run_armed(guard, move |ctx| f(ctx, item)).await
        });
        handles.push(path, task, &run).await;
    }
    parent.leave_activity();
    handles.join_all(&run).await;
    parent.resume(had_slot).await;
    if interrupted {
        return Err(self::interrupted(parent));
    }
    Ok(())
}

/// Refuses items of which two have one key, or whose key the parent
/// mounted already in this run.
fn refuse_twice_mounted<T>(parent: &ComponentState, items: &[(StableKey, T)]) -> Result<()> {
    let mut seen = HashSet::default();
    let children = lock(&parent.children);
    for (k, _) in items {
        if !seen.insert(k) || children.contains(k) {
            return Err(Error::Usage(format!(
                "component {} mounts child {k} twice in one run",
                parent.path
            )));
        }
    }
    Ok(())
}

/// The slots a parent takes for its children. When none is free, it waits
/// for several at once (up to [`SLOTS_AWAITED`]), so that a parent of many
/// small children is woken once per few of them that end rather than once
/// per child.
#[derive(Default)]
struct Slots {
    /// Slots taken and not handed to a child yet.
    spare: Option<OwnedSemaphorePermit>,
}

/// The most slots a parent waits for at once.
const SLOTS_AWAITED: usize = 32;

impl Slots {
    /// A slot for the next child, `left` children (this one included)
    /// being left to mount; `None` once the run's slots are closed.
    async fn next(&mut self, parent: &ComponentState, left: usize) -> Option<OwnedSemaphorePermit> {
        if self.spare.is_none() {
            let inflight = &parent.run.inflight;
            if let Ok(p) = Arc::clone(inflight).try_acquire_owned() {
                return Some(p);
            }
            // Wait for slots without counting as active.
            parent.leave_activity();
            let wanted = left
                .min(SLOTS_AWAITED)
                .min(parent.run.engine.config.max_inflight)
                .max(1);
            let wanted = u32::try_from(wanted).unwrap_or(1);
            self.spare = Some(Arc::clone(inflight).acquire_many_owned(wanted).await.ok()?);
        }
        self.take_one()
    }

    /// One of the spare slots.
    fn take_one(&mut self) -> Option<OwnedSemaphorePermit> {
        let spare = self.spare.as_mut()?;
        if spare.num_permits() > 1 {
            return spare.split(1);
        }
        self.spare.take()
    }
}

/// The tasks of a parent's children. Finished ones are reaped as more are
/// spawned: a task's memory (its future and output) is freed only once its
/// handle is dropped, so keeping every handle until the parent ends would
/// hold every finished child of a parent of many until then. Dropping it
/// aborts the children still running (cancelled components).
#[derive(Default)]
struct ChildTasks {
    running: Vec<(ComponentPath, AbortOnDrop<Result<()>>)>,
    /// The count at which finished tasks are reaped next.
    reap_at: usize,
}

/// The fewest child tasks kept before finished ones are reaped.
const CHILD_TASKS_REAPED_FROM: usize = 256;

impl ChildTasks {
    /// Keeps a child's task; reaps the finished ones once there are many:
    /// when a quarter more have been pushed than were running after the
    /// last reaping (at least [`CHILD_TASKS_REAPED_FROM`]). A finished
    /// task's memory is freed only with its handle, so reaping often keeps
    /// few finished ones (a quarter of those running), for a scan of the
    /// running ones every quarter of their count.
    async fn push(&mut self, path: ComponentPath, task: AbortOnDrop<Result<()>>, run: &Run) {
        self.running.push((path, task));
        if self.running.len() >= self.reap_at.max(CHILD_TASKS_REAPED_FROM) {
            let done: Vec<_> = self
                .running
                .extract_if(.., |(_, task)| task.0.is_finished())
                .collect();
            self.reap_at = self.running.len() + self.running.len() / 4;
            for (path, task) in done {
                report_died(run, path, task.await);
            }
        }
    }

    /// Waits for every child still running.
    async fn join_all(self, run: &Run) {
        for (path, task) in self.running {
            report_died(run, path, task.await);
        }
    }
}

/// Failures are recorded in the run by the child itself; a task that died
/// without reporting (it panicked outside its guard, or was aborted) is
/// reported here.
fn report_died(
    run: &Run,
    path: ComponentPath,
    joined: std::result::Result<Result<()>, tokio::task::JoinError>,
) {
    if let Err(e) = joined {
        run.fail(ComponentFailure::new(
            path,
            &Error::msg(format!("the component task died: {e}")),
        ));
    }
}

/// The items whose components are in the run's scope: all, but for the
/// root's children in a scoped run.
fn in_scope<T>(parent: &ComponentState, mut items: Vec<(StableKey, T)>) -> Vec<(StableKey, T)> {
    let run = &parent.run;
    if run.scope.is_some() && parent.path.is_root() {
        items.retain(|(k, _)| run.in_scope(k));
    }
    items
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
fn memoized<T>(child: &Arc<ComponentState>, memo_check: &Memo<T>, item: &T) -> bool {
    // A panicking memo function only costs the memoization: the child
    // runs, and meets the problem itself.
    let computed = std::panic::catch_unwind(AssertUnwindSafe(|| (memo_check.key)(item)));
    let Ok(Some(memo)) = computed else {
        return false;
    };
    let run = &child.run;
    let unchanged = matches!(run.engine.ledger.memo(&child.key), Ok(Some(stored)) if (memo_check.covers)(stored.as_ref(), memo.as_slice()));
    if unchanged {
        run.counters
            .memoized
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        run.metrics.components_memoized.increment(1);
        return true;
    }
    let _ = child.memo.set(memo);
    false
}
