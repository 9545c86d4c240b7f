//! A component's actions on their way to the sinks, and how the component
//! waits for them to land.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::group::PartitionId;
use crate::ledger::record::Intent;
use crate::model::sink::EncodedAction;
use crate::model::StableKey;
use crate::sync::lock;

/// An action on its way to a sink, with what the ledger needs to know.
pub(crate) struct PlannedAction {
    pub action: EncodedAction,
    pub key: StableKey,
    /// The record to persist as possible before the action is applied;
    /// `None` when the possible records do not change.
    pub intent: Option<Intent>,
    /// A container's refresh: an update that changes no record. It is
    /// applied, but not counted as an action.
    pub refresh: bool,
}

/// Waits for the acknowledgements of a unit's actions (one component's
/// wave, or its orphan deletes), from any number of sink actors.
///
/// What is to follow the unit's success can be handed to it
/// ([`UnitWaiter::on_landed`]): the acknowledgement of its last action runs
/// it, on the thread that acknowledges, without waking the waiter. A
/// component's commit goes to the ledger that way as soon as its actions
/// have landed, and the component is woken once, when it is committed.
pub(crate) struct UnitWaiter(Arc<Waiter>);

/// What follows a unit whose actions all landed without a failure.
pub(crate) type OnLanded = Box<dyn FnOnce() + Send>;

struct Waiter {
    /// In a worker group, the partition of the unit's component: its
    /// sink calls are fenced with that partition's epoch.
    partition: Option<PartitionId>,
    /// Actions dispatched and not acknowledged yet.
    pending: AtomicUsize,
    /// Live `UnitRef`s: when none is left, nothing more can be acknowledged.
    senders: AtomicUsize,
    failure: Mutex<Option<Error>>,
    notify: tokio::sync::Notify,
    /// Run once every action landed without a failure; dropped unrun
    /// when one failed, the sinks stopped, or the waiter is gone.
    on_landed: Mutex<Option<OnLanded>>,
    /// Nobody waits any more: the component was cancelled. Its actions
    /// not applied yet are dropped rather than applied.
    abandoned: std::sync::atomic::AtomicBool,
}

impl UnitWaiter {
    /// A waiter for the actions of a component of `partition` (in a worker
    /// group; `None` outside one).
    pub(crate) fn in_partition(partition: Option<PartitionId>) -> Self {
        Self(Arc::new(Waiter {
            partition,
            pending: AtomicUsize::new(0),
            senders: AtomicUsize::new(0),
            failure: Mutex::new(None),
            notify: tokio::sync::Notify::new(),
            on_landed: Mutex::new(None),
            abandoned: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// Counts `n` more actions to wait for, before they are dispatched.
    pub(super) fn add_pending(&self, n: usize) {
        self.0.pending.fetch_add(n, Ordering::SeqCst);
    }

    pub(super) fn unit(&self, provider: Arc<str>, label: Arc<str>) -> UnitRef {
        self.0.senders.fetch_add(1, Ordering::SeqCst);
        UnitRef {
            waiter: Arc::clone(&self.0),
            provider,
            label,
        }
    }

    /// Hands the unit what follows its success, once every action is
    /// dispatched: the acknowledgement of the last one runs it (and wakes
    /// nobody). If every action has been acknowledged already, it runs
    /// now. If one failed, or the sinks stopped, it is dropped unrun:
    /// [`UnitWaiter::wait`] then returns why.
    pub(crate) fn on_landed(&self, then: OnLanded) {
        *lock(&self.0.on_landed) = Some(then);
        if self.0.pending.load(Ordering::SeqCst) == 0 || self.0.senders.load(Ordering::SeqCst) == 0
        {
            self.0.settle();
        }
    }

    /// Waits until every dispatched action is acknowledged; returns the
    /// first failure (or a shutdown error if a sink stopped without answering).
    pub(crate) async fn wait(&self) -> Option<Error> {
        loop {
            let notified = self.0.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.0.pending.load(Ordering::SeqCst) == 0 {
                return lock(&self.0.failure).take();
            }
            if self.0.senders.load(Ordering::SeqCst) == 0 {
                // A unit reference acknowledges before it is dropped: the
                // last acknowledgement may have landed between the two
                // reads above, and no other can come now.
                if self.0.pending.load(Ordering::SeqCst) == 0 {
                    return lock(&self.0.failure).take();
                }
                return Some(
                    lock(&self.0.failure)
                        .take()
                        .unwrap_or_else(|| Error::Shutdown("a sink actor stopped".into())),
                );
            }
            notified.await;
        }
    }
}

impl Drop for UnitWaiter {
    /// Once the waiter is gone (its component ended, or was cancelled),
    /// what the sinks still hold of the unit is dropped, not applied.
    fn drop(&mut self) {
        self.0.abandoned.store(true, Ordering::SeqCst);
        drop(lock(&self.0.on_landed).take());
    }
}

impl Waiter {
    /// Runs what follows the unit's success if every action landed
    /// without a failure; drops it if one failed or no action can land
    /// any more. Returns whether it ran.
    fn settle(&self) -> bool {
        let Some(then) = lock(&self.on_landed).take() else {
            return false;
        };
        let landed = self.pending.load(Ordering::SeqCst) == 0 && lock(&self.failure).is_none();
        if landed {
            then();
        }
        landed
    }
}

/// A unit's handle in the sinks, to acknowledge its actions.
pub(crate) struct UnitRef {
    waiter: Arc<Waiter>,
    /// The provider whose actions these are, to name in errors.
    pub provider: Arc<str>,
    /// Its root provider's name, the metrics label.
    pub label: Arc<str>,
}

impl UnitRef {
    /// In a worker group, the partition of the unit's component.
    pub(crate) fn partition(&self) -> Option<PartitionId> {
        self.waiter.partition
    }

    /// Whether the unit's component stopped waiting for these actions (it
    /// was cancelled): they must not be applied any more.
    pub(crate) fn abandoned(&self) -> bool {
        self.waiter.abandoned.load(Ordering::SeqCst)
    }

    /// Acknowledges `actions` of the unit's actions with their result.
    pub(crate) fn ack(&self, actions: usize, result: Result<()>) {
        if let Err(e) = result {
            lock(&self.waiter.failure).get_or_insert(e);
        }
        let before = self.waiter.pending.fetch_sub(actions, Ordering::SeqCst);
        if before <= actions && !self.waiter.settle() {
            self.waiter.notify.notify_waiters();
        }
    }
}

impl Clone for UnitRef {
    fn clone(&self) -> Self {
        self.waiter.senders.fetch_add(1, Ordering::SeqCst);
        Self {
            waiter: Arc::clone(&self.waiter),
            provider: Arc::clone(&self.provider),
            label: Arc::clone(&self.label),
        }
    }
}

impl Drop for UnitRef {
    fn drop(&mut self) {
        if self.waiter.senders.fetch_sub(1, Ordering::SeqCst) == 1 && !self.waiter.settle() {
            self.waiter.notify.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// A waiter of `n` dispatched actions, with one unit reference.
    fn dispatched(n: usize) -> (UnitWaiter, UnitRef) {
        let waiter = UnitWaiter::in_partition(None);
        waiter.add_pending(n);
        let unit = waiter.unit("p".into(), "p".into());
        (waiter, unit)
    }

    /// What follows, noting that it ran; and a receiver closed once it is
    /// dropped, run or not.
    fn follower() -> (
        OnLanded,
        Arc<AtomicBool>,
        tokio::sync::oneshot::Receiver<()>,
    ) {
        let ran = Arc::new(AtomicBool::new(false));
        let (alive, dropped) = tokio::sync::oneshot::channel::<()>();
        let noted = Arc::clone(&ran);
        let then: OnLanded = Box::new(move || {
            noted.store(true, Ordering::SeqCst);
            drop(alive);
        });
        (then, ran, dropped)
    }

    #[test]
    fn what_follows_a_unit_runs_when_its_last_action_is_acknowledged() {
        let (waiter, unit) = dispatched(3);
        let (then, ran, _dropped) = follower();
        waiter.on_landed(then);
        unit.ack(2, Ok(()));
        assert!(
            !ran.load(Ordering::SeqCst),
            "ran before the last action landed"
        );
        unit.ack(1, Ok(()));
        assert!(ran.load(Ordering::SeqCst));
    }

    #[test]
    fn what_follows_a_unit_that_landed_already_runs_when_it_is_handed_over() {
        let (waiter, unit) = dispatched(1);
        unit.ack(1, Ok(()));
        let (then, ran, _dropped) = follower();
        waiter.on_landed(then);
        assert!(ran.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn what_follows_a_unit_with_a_failed_action_is_dropped_unrun_and_the_failure_waited_for()
    {
        let (waiter, unit) = dispatched(2);
        let (then, ran, dropped) = follower();
        waiter.on_landed(then);
        unit.ack(1, Err(Error::msg("refused")));
        unit.ack(1, Ok(()));
        assert!(!ran.load(Ordering::SeqCst));
        assert!(dropped.await.is_err(), "what follows was kept");
        let failure = waiter.wait().await.map(|e| e.to_string());
        assert!(failure.is_some_and(|e| e.contains("refused")));
    }

    #[tokio::test]
    async fn what_follows_a_unit_whose_sinks_stopped_answering_is_dropped_unrun() {
        let (waiter, unit) = dispatched(1);
        let (then, ran, dropped) = follower();
        waiter.on_landed(then);
        drop(unit);
        assert!(!ran.load(Ordering::SeqCst));
        assert!(dropped.await.is_err());
        assert!(matches!(waiter.wait().await, Some(Error::Shutdown(_))));
    }

    #[tokio::test]
    async fn what_follows_a_unit_whose_waiter_is_gone_is_dropped_unrun() {
        let (waiter, unit) = dispatched(1);
        let (then, ran, dropped) = follower();
        waiter.on_landed(then);
        drop(waiter);
        assert!(dropped.await.is_err());
        unit.ack(1, Ok(()));
        assert!(!ran.load(Ordering::SeqCst));
        assert!(unit.abandoned());
    }
}
