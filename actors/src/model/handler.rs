//! Target handlers: the reconcile logic a connector implements.

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::action::{TargetAction, TargetChildInvalidation};
use super::erased::ChildTargetDef;
use super::key::StableKey;
use super::sink::TargetActionSink;
use crate::error::Result;

/// The reconcile logic of one kind of target state.
///
/// # Guarantees
/// - `reconcile` is called once per declared target state per run, and once
///   with `desired_target_state = None` for a state no longer declared; a
///   handler whose [`unchanged_needs_nothing`](Self::unchanged_needs_nothing)
///   is true is not called for the states of a component that declares
///   exactly what its last clean commit recorded.
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

    /// Whether a state declared again with the value of its last applied
    /// action needs nothing from this handler: whenever `record` is the
    /// tracking record `reconcile` returned for `value`,
    /// `reconcile(key, Some(value), vec![record], false)` returns
    /// `Ok(None)`.
    ///
    /// A handler that says so lets weir finish a component whose
    /// declarations (keys, encoded values) are exactly those of its last
    /// clean commit in this process without reconciling them: the
    /// component then costs a digest of its declarations and a lookup in
    /// memory, with no ledger read, no message to the reconciler shards and
    /// no call of `reconcile`. It applies to the states of root providers
    /// ([`register_root_target_states_provider`](crate::register_root_target_states_provider)),
    /// declared with
    /// [`TargetStateProvider::target_state`](crate::TargetStateProvider::target_state),
    /// by components without containers or children; any other change to
    /// the component's records (a failed run, a state taken by another
    /// component) makes it reconcile as usual. The default, `false`, calls
    /// `reconcile` for every declared state on every run.
    ///
    /// The promise covers every handler registered under the provider's
    /// name while the process runs: a handler whose answer depends on
    /// settings that can change between runs (a record that includes a
    /// configured format, say) must not make it, or its states keep the
    /// records of the old settings until their values change.
    fn unchanged_needs_nothing(&self) -> bool {
        false
    }
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
