//! What the engine works with, types erased: handlers
//! ([`ErasedHandler`]), the handler of a container's children
//! ([`ChildTargetDef`]), sinks ([`SinkCore`]) with their encoded actions,
//! and declared values ([`DeclaredValue`]). These types refer to each other
//! (a handler's output names its sink, a sink builds child handlers), so
//! they live together; the typed side is built on them ([`typed`](super::typed),
//! [`sink`](super::sink), [`handler`](super::handler)).

use std::fmt;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::de::DeserializeOwned;

use super::action::{ActionKind, TargetChildInvalidation};
use super::key::StableKey;
use crate::error::Result;

/// The output of a reconcile, encoded.
pub(crate) struct ErasedOutput {
    pub kind: ActionKind,
    pub action: Arc<[u8]>,
    /// The action's payload as the handler returned it, for the first
    /// sink call that carries it.
    pub typed: Option<TypedAction>,
    pub sink: Arc<SinkCore>,
    pub record: Option<Arc<[u8]>>,
    pub child_invalidation: Option<TargetChildInvalidation>,
}

/// A handler whose value, record and action types are erased to bytes.
pub(crate) trait ErasedHandler: Send + Sync {
    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<DeclaredValue>,
        prev: &[&[u8]],
        prev_may_be_missing: bool,
    ) -> Result<Option<ErasedOutput>>;

    fn attachments(&self) -> Result<Vec<(String, ChildTargetDef)>>;

    /// See [`TargetHandler::unchanged_needs_nothing`](crate::TargetHandler::unchanged_needs_nothing).
    fn unchanged_needs_nothing(&self) -> bool;

    /// The name of the value type, to check typed providers against it.
    fn value_type(&self) -> &'static str;
}

/// The handler of the child target states of a container (or of an
/// attachment type), with its value type erased.
#[derive(Clone)]
pub struct ChildTargetDef {
    pub(crate) handler: Arc<dyn ErasedHandler>,
}

/// An action as the engine carries it: its kind, its MessagePack bytes,
/// and, until the first sink call that carries it, the value its handler
/// returned (so that call need not decode it; a retried call decodes the
/// bytes).
pub(crate) struct EncodedAction {
    pub kind: ActionKind,
    pub bytes: Arc<[u8]>,
    pub typed: Option<TypedAction>,
}

/// An action's payload as its handler returned it.
pub(crate) type TypedAction = Box<dyn std::any::Any + Send>;

impl EncodedAction {
    /// The action for a sink call: the typed payload goes with the first.
    pub(crate) fn for_call(&mut self) -> EncodedAction {
        EncodedAction {
            kind: self.kind,
            bytes: Arc::clone(&self.bytes),
            typed: self.typed.take(),
        }
    }
}

impl fmt::Debug for EncodedAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncodedAction")
            .field("kind", &self.kind)
            .field("bytes", &self.bytes.len())
            .field("typed", &self.typed.is_some())
            .finish()
    }
}

/// A sink's function: applies a batch of encoded actions.
pub(crate) type ApplyFn =
    dyn Fn(Vec<EncodedAction>) -> BoxFuture<'static, Result<()>> + Send + Sync;
/// A container sink's child-handler factory: the handler of a container's
/// children, from the container's encoded action.
pub(crate) type ChildFn = dyn Fn(&[u8]) -> Result<ChildTargetDef> + Send + Sync;

/// The type-erased part of a sink that the engine works with.
pub(crate) struct SinkCore {
    /// The sink's identity: unique per `from_async_fn*` call, shared by clones.
    pub id: u64,
    pub apply: Box<ApplyFn>,
    pub child_handler: Option<Box<ChildFn>>,
    /// How many calls may run at once (at least 1).
    pub concurrency: AtomicUsize,
    /// Whether the sink checks each call's [`Fence`](crate::Fence) in the
    /// transaction it writes with (required in a worker group).
    pub checks_fence: std::sync::atomic::AtomicBool,
}

impl fmt::Debug for SinkCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkCore")
            .field("id", &self.id)
            .field("has_child_handler", &self.child_handler.is_some())
            .finish()
    }
}

/// A declared value as it was given, type-erased; the handler of its
/// provider downcasts it back.
pub(crate) type TypedValue = Box<dyn std::any::Any + Send + Sync>;

/// A declared value, as its handler will get it.
pub(crate) enum DeclaredValue {
    /// Serialized when declared ([`TargetStateProvider::target_state`]),
    /// decoded for the handler.
    Encoded(Arc<[u8]>),
    /// The value itself ([`TargetStateProvider::target_state_exact`]);
    /// `None` once handed on (a declaration is reconciled once).
    Exact(Option<TypedValue>),
}

impl DeclaredValue {
    /// The value to send on: encoded bytes are shared, an exact value is
    /// taken (leaving `Exact(None)`).
    pub(crate) fn hand_on(&mut self) -> DeclaredValue {
        match self {
            DeclaredValue::Encoded(bytes) => DeclaredValue::Encoded(Arc::clone(bytes)),
            DeclaredValue::Exact(value) => DeclaredValue::Exact(value.take()),
        }
    }

    /// The value as a `V`: decoded, or downcast.
    ///
    /// # Errors
    /// When the bytes do not decode as a `V`, or an exact value is not a
    /// `V` or was handed on already (neither happens: a provider's values
    /// have one type, and a declaration is reconciled once).
    pub(crate) fn into_value<V: DeserializeOwned + 'static>(self) -> crate::Result<V> {
        match self {
            DeclaredValue::Encoded(bytes) => Ok(rmp_serde::from_slice(&bytes)?),
            DeclaredValue::Exact(Some(value)) => value.downcast::<V>().map(|v| *v).map_err(|_| {
                crate::Error::msg(format!(
                    "the declared value is not a {}",
                    std::any::type_name::<V>()
                ))
            }),
            DeclaredValue::Exact(None) => Err(crate::Error::msg(
                "the declared value was handed to its handler already",
            )),
        }
    }
}
