//! The weir engine: declarative target states on actors, with a sled ledger.
//!
//! # Layers
//!
//! The engine is laid out in layers, each meant to use only those below it:
//!
//! 1. [`model`]: keys, handlers, actions, sinks, providers, fingerprints and
//!    the `statediff` helpers: what a connector author needs.
//! 2. `ledger`: the sled store of what earlier runs created (key layout,
//!    records, format version, the intent journal; crate-private).
//! 3. `actors`: the reconciler shards, the sink actors and the ledger
//!    actor, which a component talks to by messages, with the engine's
//!    task tracking (`actors::tasks`) and panic guard (`actors::guard`);
//!    the worker group's membership, changelog mirror and restore
//!    ([`group`]); and the pipeline that starts and stops them
//!    (crate-private).
//! 4. `run`: the shared state of one run; then the component runtime
//!    (running a component's code, reconciling, applying and committing
//!    it) and the end of a run (`actors::cleanup`).
//! 5. `app`, `ctx`, `scoped`, `live`, `declare`, [`source`]: the API a user
//!    holds ([`App`], [`Ctx`], [`declare_target_state`], sources, live
//!    mode).
//!
//! Beside them: `sync` and `shutdown` (a poison-tolerant lock, the
//! shutdown handle), which any layer may use; [`metrics`] (the metric
//! catalogue); `fault` (crash-test hooks, public and active only with the
//! `fault-injection` feature, for weir's own tests). No module imports one
//! that imports it back: `.ci/import-cycles` fails CI on a cycle (the
//! model's types that refer to each other, handlers, sinks and child
//! handlers with their types erased, live together in one module).
//!
//! Users depend on the `weir` facade crate, which re-exports all of this.

/// Crash-test hooks: public only with the `fault-injection` feature,
/// which only weir's own tests turn on.
#[cfg(feature = "fault-injection")]
pub mod fault;
#[cfg(not(feature = "fault-injection"))]
#[allow(dead_code)]
pub(crate) mod fault;
pub mod metrics;
pub mod model;
mod owner;

mod actors;
mod app;
mod config;
mod ctx;
mod declare;
mod error;
pub mod group;
mod interned;
mod ledger;
mod live;
mod run;
mod scope;
mod scoped;
mod shutdown;
pub mod source;
mod sync;

pub use app::{App, AppBuilder, FailedComponent, LedgerReport, DEFAULT_LEDGER_DIR};
pub use config::{
    BatchPolicy, RetryPolicy, DEFAULT_CALL_TIMEOUT, DEFAULT_INITIAL_BACKOFF, DEFAULT_LINGER,
    DEFAULT_MAX_ACTIONS, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_BACKOFF,
    DEFAULT_MAX_INFLIGHT_COMPONENTS, DEFAULT_QUARANTINE_AFTER, DEFAULT_RECONCILE_CHUNK,
};
pub use ctx::{ContextKey, Ctx};
pub use declare::{
    declare_target_state, declare_target_state_with_child, mount_target,
    register_root_target_states_provider,
};
pub use error::{ComponentFailure, Error, ErrorKind, Result};
pub use group::{Fence, PartitionId};
pub use ledger::DEFAULT_LEDGER_CACHE_BYTES;
pub use live::{ChangeFeed, PreviewReport, RunReport, ShutdownHandle, WatchEvent};
pub use model::statediff;
pub use model::{
    ActionKind, ChildTargetDef, ComponentPath, Fingerprint, IntoStableKey, StableKey, TargetAction,
    TargetActionSink, TargetChildInvalidation, TargetHandler, TargetReconcileOutput, TargetState,
    TargetStateProvider,
};
pub use owner::Owner;
pub use run::{PreviewAction, UpdateStats};
pub use scope::RunScope;
pub use scoped::Scoped;

/// Everything a user or connector author needs, in one import.
pub mod prelude {
    pub use crate::model::statediff;
    pub use crate::{
        declare_target_state, declare_target_state_with_child, mount_target,
        register_root_target_states_provider, ActionKind, App, AppBuilder, BatchPolicy, ChangeFeed,
        ChildTargetDef, ComponentFailure, ComponentPath, ContextKey, Ctx, Error, FailedComponent,
        Fingerprint, IntoStableKey, PreviewAction, Result, RetryPolicy, RunReport, RunScope,
        ShutdownHandle, StableKey, TargetAction, TargetActionSink, TargetChildInvalidation,
        TargetHandler, TargetReconcileOutput, TargetState, TargetStateProvider, UpdateStats,
        WatchEvent,
    };
}
