//! The engine's tasks: those it spawned on the user's runtime, kept to
//! abort ([`Tasks`]), the work in flight a run waits for ([`InFlight`]),
//! a task aborted when its handle is dropped ([`AbortOnDrop`]), and large
//! values freed on a blocking thread ([`free_elsewhere`]).

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

/// The number of parts (states, paths) from which a value is freed on a
/// blocking thread by [`free_elsewhere`] rather than where it is let go.
pub(crate) const FREE_ELSEWHERE_FROM: usize = 10_000;

/// Frees `value`, of `parts` parts, on a blocking thread of `user` when it
/// has at least [`FREE_ELSEWHERE_FROM`], else here. Freeing a run's or a
/// large component's bookkeeping is hundreds of thousands of
/// deallocations (about 5-20 ms per 100k), which would otherwise hold up
/// what comes next on this thread: a component reported done, the next
/// run's first messages to a shard.
pub(crate) fn free_elsewhere<T: Send + 'static>(
    user: &tokio::runtime::Handle,
    parts: usize,
    value: T,
) {
    if parts >= FREE_ELSEWHERE_FROM {
        drop(user.spawn_blocking(move || drop(value)));
    }
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

#[cfg(test)]
mod tests {
    use super::{free_elsewhere, FREE_ELSEWHERE_FROM};
    use std::sync::{Arc, Mutex};
    use std::thread::ThreadId;
    use std::time::{Duration, Instant};

    /// Notes the thread it is dropped on.
    struct NotesDrop(Arc<Mutex<Option<ThreadId>>>);

    impl Drop for NotesDrop {
        fn drop(&mut self) {
            if let Ok(mut dropped_on) = self.0.lock() {
                *dropped_on = Some(std::thread::current().id());
            }
        }
    }

    fn dropped_on(value: &Arc<Mutex<Option<ThreadId>>>) -> Option<ThreadId> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(id) = *value.lock().ok()? {
                return Some(id);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }

    #[test]
    fn large_values_are_freed_on_a_blocking_thread_and_small_ones_where_they_are_let_go(
    ) -> std::io::Result<()> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()?;
        let here = std::thread::current().id();

        let small = Arc::new(Mutex::new(None));
        free_elsewhere(
            runtime.handle(),
            FREE_ELSEWHERE_FROM - 1,
            NotesDrop(Arc::clone(&small)),
        );
        assert_eq!(
            *small
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?,
            Some(here)
        );

        let large = Arc::new(Mutex::new(None));
        free_elsewhere(
            runtime.handle(),
            FREE_ELSEWHERE_FROM,
            NotesDrop(Arc::clone(&large)),
        );
        let on = dropped_on(&large);
        assert!(on.is_some(), "the large value was never freed");
        assert_ne!(on, Some(here));
        Ok(())
    }
}
