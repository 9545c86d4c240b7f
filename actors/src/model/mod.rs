//! The declarative model: keys, handlers, actions, sinks and providers.
//!
//! This module depends on nothing else in the engine; a connector author
//! needs only what is here.

pub(crate) mod action;
pub(crate) mod child;
pub(crate) mod encode;
pub(crate) mod erased;
pub mod fingerprint;
pub(crate) mod handler;
pub(crate) mod key;
pub(crate) mod keycode;
pub(crate) mod path;
pub(crate) mod provider;
pub(crate) mod sink;
pub mod statediff;
pub(crate) mod typed;

pub use action::{ActionKind, TargetAction, TargetChildInvalidation};
pub use child::ChildTargetDef;
pub use fingerprint::Fingerprint;
pub use handler::{TargetHandler, TargetReconcileOutput};
pub use key::{IntoStableKey, StableKey};
pub use path::ComponentPath;
pub use provider::{TargetState, TargetStateProvider};
pub use sink::TargetActionSink;
