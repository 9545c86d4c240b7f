//! Target handlers: the reconcile logic a connector implements.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::child::ChildTargetDef;
use super::key::StableKey;
use super::sink::TargetActionSink;
use crate::error::Result;

/// The reconcile logic of one kind of target state.
///
/// # Guarantees
/// - `reconcile` is called once per declared target state per run, and once
///   with `desired_target_state = None` for a state no longer declared.
/// - All calls for one target state happen on one reconciler shard, never
///   concurrently.
///
/// # Assumptions
/// - `reconcile` is pure: it compares and returns an action; all I/O happens
///   in the [`TargetActionSink`]. It may be called again for the same state
///   when the engine retries; only the committed attempt is applied.
/// - A container handler returns `Some` output with a `Create` or `Update`
///   action whenever the state is declared: the sink's child-handler factory
///   builds the child handler from that action.
pub trait TargetHandler<V>: Send + Sync + 'static
where
    V: Serialize + DeserializeOwned + Send + 'static,
{
    /// What is stored in the ledger to detect changes on the next run.
    type TrackingRecord: Serialize + DeserializeOwned + Send + Sync + 'static;
    /// What the sink applies to the external system. Encoded when
    /// returned, and decoded for retried sink calls: it must decode back
    /// to an equal value.
    type Action: Serialize + DeserializeOwned + Send + 'static;

    /// Compares the desired state with the records of earlier runs and returns
    /// the action to take, or `None` when nothing needs to change.
    ///
    /// `prev_possible_records` may hold several records after an interrupted
    /// or failed update; `prev_may_be_missing` says the state may not exist
    /// in the external system at all.
    ///
    /// # Errors
    /// An error fails the component that declared (or owned) the state.
    fn reconcile(
        &self,
        key: StableKey,
        desired_target_state: Option<V>,
        prev_possible_records: Vec<Self::TrackingRecord>,
        prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<Self::Action, Self::TrackingRecord>>>;

    /// The attachment types this handler supports, with their handlers. The
    /// engine registers them eagerly, so an attachment no longer declared is
    /// cleaned up even in a run that never asks for it.
    ///
    /// # Errors
    /// An error fails the resolution of the provider.
    fn attachments(&self) -> Result<Vec<(String, ChildTargetDef)>> {
        Ok(Vec::new())
    }
}

/// One operation on the external system, with its kind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TargetAction<A> {
    /// The state did not exist and is created.
    Create(A),
    /// The state exists (or may) and is brought up to date.
    Update(A),
    /// The state is removed.
    Delete(A),
}

impl<A> TargetAction<A> {
    /// The kind of the action.
    pub fn kind(&self) -> ActionKind {
        match self {
            TargetAction::Create(_) => ActionKind::Create,
            TargetAction::Update(_) => ActionKind::Update,
            TargetAction::Delete(_) => ActionKind::Delete,
        }
    }

    /// The action's payload.
    pub fn inner(&self) -> &A {
        match self {
            TargetAction::Create(a) | TargetAction::Update(a) | TargetAction::Delete(a) => a,
        }
    }

    /// The action's payload, by value.
    pub fn into_inner(self) -> A {
        match self {
            TargetAction::Create(a) | TargetAction::Update(a) | TargetAction::Delete(a) => a,
        }
    }

    /// An action of `kind` with `payload`.
    pub fn with_kind(kind: ActionKind, a: A) -> Self {
        match kind {
            ActionKind::Create => TargetAction::Create(a),
            ActionKind::Update => TargetAction::Update(a),
            ActionKind::Delete => TargetAction::Delete(a),
        }
    }
}

/// The kind of a [`TargetAction`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ActionKind {
    /// A create.
    Create,
    /// An update.
    Update,
    /// A delete.
    Delete,
}

impl ActionKind {
    /// A lowercase name, for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::Create => "create",
            ActionKind::Update => "update",
            ActionKind::Delete => "delete",
        }
    }
}

/// How a change of a container affects its children.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TargetChildInvalidation {
    /// The container was rebuilt: children's records are dropped and the
    /// children are created again.
    Destructive,
    /// The container may have lost data: children are reconciled with
    /// `prev_may_be_missing = true`, so they are written again.
    Lossy,
}

/// What `reconcile` returns when an action is needed.
#[derive(Debug)]
pub struct TargetReconcileOutput<A, R> {
    /// The action to apply.
    pub action: TargetAction<A>,
    /// The sink that applies it.
    pub sink: TargetActionSink<A>,
    /// The record to keep once the action is applied; `None` means the state
    /// no longer exists.
    pub tracking_record: Option<R>,
    /// For containers: how this change affects the children.
    pub child_invalidation: Option<TargetChildInvalidation>,
}
