//! Running a component and mounting its children, memoized or not.

use rustc_hash::FxHashSet as HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;

use crate::error::{ComponentFailure, Error, Result};
use crate::ledger::record::LedgerOp;
use crate::model::StableKey;
use crate::run::lock;

use super::finish::finish;
use super::ComponentState;

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
pub(super) async fn record_failure(state: &ComponentState, err: &Error) {
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
pub(super) fn mounted_children_op(state: &ComponentState) -> Option<LedgerOp> {
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
    parent.run.engine.tasks.track(&joined);
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
        let task = run.engine.user.spawn(async move {
            if let Some(memo_fn) = memo {
                if memoized(&child, &*memo_fn, &item) {
                    return Ok(());
                }
            }
            run_component(child, move |ctx| f(ctx, item)).await
        });
        run.engine.tasks.track(&task);
        handles.push((path, task));
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
