//! Action sinks: where actions are applied, batched by sink identity.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use futures::FutureExt;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::action::TargetAction;
use super::erased::ChildTargetDef;
use super::erased::{ApplyFn, ChildFn};
use crate::error::{Error, Result};

pub(crate) use super::erased::{EncodedAction, SinkCore};

static NEXT_SINK_ID: AtomicU64 = AtomicU64::new(1);

/// Applies actions of type `A` to an external system.
///
/// The engine gathers the actions returned with one sink (or a clone of it)
/// across components and calls it with them in batches. Every
/// `from_async_fn*` call creates a new identity; clones share it. A sink may
/// see an action again after a failed call is retried: keep actions
/// idempotent. The first call that carries an action gets it as the
/// handler's `reconcile` returned it; a retried call gets it decoded from
/// its MessagePack encoding, so an action type must decode back to an
/// equal value.
pub struct TargetActionSink<A> {
    pub(crate) core: Arc<SinkCore>,
    _action: PhantomData<fn(A)>,
}

impl<A> Clone for TargetActionSink<A> {
    fn clone(&self) -> Self {
        Self {
            core: Arc::clone(&self.core),
            _action: PhantomData,
        }
    }
}

impl<A> fmt::Debug for TargetActionSink<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TargetActionSink")
            .field("id", &self.core.id)
            .finish()
    }
}

fn decode_actions<A: DeserializeOwned + 'static>(
    actions: Vec<EncodedAction>,
) -> Result<Vec<TargetAction<A>>> {
    actions
        .into_iter()
        .map(|a| {
            let payload: A = match a.typed.map(|t| t.downcast::<A>()) {
                Some(Ok(typed)) => *typed,
                _ => rmp_serde::from_slice(&a.bytes)?,
            };
            Ok(TargetAction::with_kind(a.kind, payload))
        })
        .collect()
}

fn make_apply<A, F, Fut>(apply: F) -> Box<ApplyFn>
where
    A: Serialize + DeserializeOwned + Send + 'static,
    F: Fn(Vec<TargetAction<A>>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    Box::new(
        move |encoded: Vec<EncodedAction>| match decode_actions::<A>(encoded) {
            Ok(actions) => apply(actions).boxed(),
            Err(e) => futures::future::ready(Err(e)).boxed(),
        },
    )
}

impl<A> TargetActionSink<A>
where
    A: Serialize + DeserializeOwned + Send + 'static,
{
    /// A sink that applies batches of actions with `apply`.
    pub fn from_async_fn<F, Fut>(apply: F) -> Self
    where
        F: Fn(Vec<TargetAction<A>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        Self::from_core(SinkCore {
            id: NEXT_SINK_ID.fetch_add(1, Ordering::Relaxed),
            apply: make_apply(apply),
            child_handler: None,
            concurrency: AtomicUsize::new(1),
            checks_fence: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// A container sink: `apply` applies the actions, and `child_handler`
    /// builds the handler of a created or updated container's children from
    /// its action. The factory is called before `apply`, and in a preview in
    /// its place, so it must be free of side effects.
    pub fn from_async_fn_with_child_handler<F, Fut, C>(apply: F, child_handler: C) -> Self
    where
        F: Fn(Vec<TargetAction<A>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
        C: Fn(&A) -> Result<ChildTargetDef> + Send + Sync + 'static,
    {
        let child: Box<ChildFn> = Box::new(move |bytes: &[u8]| {
            let action: A = rmp_serde::from_slice(bytes)?;
            child_handler(&action)
        });
        Self::from_core(SinkCore {
            id: NEXT_SINK_ID.fetch_add(1, Ordering::Relaxed),
            apply: make_apply(apply),
            child_handler: Some(child),
            concurrency: AtomicUsize::new(1),
            checks_fence: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn from_core(core: SinkCore) -> Self {
        Self {
            core: Arc::new(core),
            _action: PhantomData,
        }
    }
}

impl<A> TargetActionSink<A> {
    /// Lets the engine run up to `calls` calls of this sink at once
    /// (default 1: one call at a time). Calls that run together never
    /// carry actions on the same key, and a call waiting to be retried
    /// keeps its place (no later call on its keys, and none beyond the
    /// limit, starts meanwhile). The sink may then apply calls as
    /// independent transactions, for example on several connections of a
    /// pool, while the external system works on more than one batch. Only
    /// for sinks whose calls are independent of each other. Applies to the
    /// identity: clones included. `0` counts as 1.
    pub fn concurrent_calls(self, calls: usize) -> Self {
        self.core.concurrency.store(calls.max(1), Ordering::Relaxed);
        self
    }

    /// Declares that this sink checks the [`Fence`](crate::Fence) of each
    /// call in the transaction it writes with, failing with
    /// [`Fence::fenced`](crate::Fence::fenced) when a partition moved on
    /// (see [`crate::group`]). In a worker group the engine refuses to
    /// call a sink that does not: a paused member could otherwise write
    /// stale data. Applies to the identity: clones included.
    pub fn checks_fence(self) -> Self {
        self.core.checks_fence.store(true, Ordering::Relaxed);
        self
    }

    /// Whether two sinks share one identity (one is a clone of the other).
    pub fn same_identity(&self, other: &Self) -> bool {
        self.core.id == other.core.id
    }
}

/// Builds the error for a sink whose call panicked.
pub(crate) fn panic_error(detail: &str) -> Error {
    Error::permanent(format!("sink panicked: {detail}"))
}
