//! The engine's tasks: those it spawned on the user's runtime, kept to
//! abort ([`Tasks`]), the work in flight a run waits for ([`InFlight`]),
//! and a task aborted when its handle is dropped ([`AbortOnDrop`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The tasks an App spawned on the user's runtime for its runs (the runs
/// themselves, their components, their sink calls): aborted when the App
/// stops, so that a run left behind (its future was dropped) neither
/// outlives the App nor keeps its ledger open.
#[derive(Clone, Default)]
pub(crate) struct Tasks(Arc<Mutex<TaskList>>);

#[derive(Default)]
struct TaskList {
    handles: Vec<tokio::task::AbortHandle>,
    /// The length at which finished tasks are dropped from the list next.
    prune_at: usize,
}

/// The fewest tasks kept before finished ones are dropped from the list.
const TASKS_PRUNED_FROM: usize = 1024;

impl Tasks {
    /// Keeps `task` to abort when the App stops.
    pub(crate) fn track<T>(&self, task: &tokio::task::JoinHandle<T>) {
        let mut list = self.lock();
        if list.handles.len() >= list.prune_at.max(TASKS_PRUNED_FROM) {
            list.handles.retain(|h| !h.is_finished());
            list.prune_at = 2 * list.handles.len();
        }
        list.handles.push(task.abort_handle());
    }

    /// Aborts every task still running.
    pub(crate) fn abort_all(&self) {
        let handles = std::mem::take(&mut self.lock().handles);
        for handle in handles {
            handle.abort();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TaskList> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Work of an App's runs still going on the user's runtime (component
/// tasks, sink calls), counted, so that a run can wait until what an
/// earlier, cancelled run left has stopped: its components' tasks are
/// aborted and end at once, its sink calls finish (bounded by
/// `RetryPolicy::call_timeout`).
#[derive(Clone, Default)]
pub(crate) struct InFlight(Arc<InFlightInner>);

#[derive(Default)]
struct InFlightInner {
    count: AtomicU64,
    idle: tokio::sync::Notify,
}

/// One piece of work counted by [`InFlight`], until it is dropped.
pub(crate) struct InFlightToken(Arc<InFlightInner>);

impl InFlight {
    /// Counts one more piece of work, until the token is dropped.
    pub(crate) fn token(&self) -> InFlightToken {
        self.0.count.fetch_add(1, Ordering::SeqCst);
        InFlightToken(Arc::clone(&self.0))
    }

    /// Waits until no work is counted.
    pub(crate) async fn idle(&self) {
        loop {
            let notified = self.0.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.0.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for InFlightToken {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// A task that is aborted when its handle is dropped before it ended: the
/// components a cancelled component mounted stop with it.
pub(crate) struct AbortOnDrop<T>(pub(crate) tokio::task::JoinHandle<T>);

impl<T> std::future::Future for AbortOnDrop<T> {
    type Output = std::result::Result<T, tokio::task::JoinError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
