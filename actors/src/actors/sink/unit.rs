//! A component's actions on their way to the sinks, and how the component
//! waits for them to land.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::group::PartitionId;
use crate::ledger::record::Intent;
use crate::model::sink::EncodedAction;
use crate::model::StableKey;

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
pub(crate) struct UnitWaiter(Arc<Waiter>);

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

    /// Waits until every dispatched action is acknowledged; returns the
    /// first failure (or a shutdown error if a sink stopped without answering).
    pub(crate) async fn wait(&self) -> Option<Error> {
        loop {
            let notified = self.0.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.0.pending.load(Ordering::SeqCst) == 0 {
                return take(&self.0.failure);
            }
            if self.0.senders.load(Ordering::SeqCst) == 0 {
                // A unit reference acknowledges before it is dropped: the
                // last acknowledgement may have landed between the two
                // reads above, and no other can come now.
                if self.0.pending.load(Ordering::SeqCst) == 0 {
                    return take(&self.0.failure);
                }
                return Some(
                    take(&self.0.failure)
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
    }
}

fn take(m: &Mutex<Option<Error>>) -> Option<Error> {
    match m.lock() {
        Ok(mut g) => g.take(),
        Err(p) => p.into_inner().take(),
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
            match self.waiter.failure.lock() {
                Ok(mut f) => {
                    f.get_or_insert(e);
                }
                Err(p) => {
                    p.into_inner().get_or_insert(e);
                }
            }
        }
        let before = self.waiter.pending.fetch_sub(actions, Ordering::SeqCst);
        if before <= actions {
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
        if self.waiter.senders.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.waiter.notify.notify_waiters();
        }
    }
}
