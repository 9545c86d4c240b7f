//! Handlers with their types erased, as the engine calls them.

use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::child::ChildTargetDef;
use super::encode;
use super::handler::{ActionKind, TargetChildInvalidation, TargetHandler, TargetReconcileOutput};
use super::key::StableKey;
use super::provider::DeclaredValue;
use super::sink::{SinkCore, TypedAction};
use crate::error::Result;

/// The output of a reconcile, encoded.
pub(crate) struct ErasedOutput {
    pub kind: ActionKind,
    pub action: Arc<[u8]>,
    /// The action's payload as the handler returned it, for the first
    /// sink call that carries it.
    pub typed: Option<TypedAction>,
    pub sink: Arc<SinkCore>,
    pub record: Option<Vec<u8>>,
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

    /// The name of the value type, to check typed providers against it.
    fn value_type(&self) -> &'static str;
}

pub(crate) struct TypedHandler<V, H> {
    handler: H,
    _value: PhantomData<fn(V)>,
}

impl<V, H> TypedHandler<V, H> {
    pub(crate) fn new(handler: H) -> Self {
        Self {
            handler,
            _value: PhantomData,
        }
    }
}

impl<V, H> ErasedHandler for TypedHandler<V, H>
where
    V: Serialize + DeserializeOwned + Send + 'static,
    H: TargetHandler<V>,
{
    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<DeclaredValue>,
        prev: &[&[u8]],
        prev_may_be_missing: bool,
    ) -> Result<Option<ErasedOutput>> {
        let desired: Option<V> = desired.map(DeclaredValue::into_value).transpose()?;
        let prev = prev
            .iter()
            .map(|r| rmp_serde::from_slice::<H::TrackingRecord>(r))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let Some(out) = self
            .handler
            .reconcile(key, desired, prev, prev_may_be_missing)?
        else {
            return Ok(None);
        };
        let TargetReconcileOutput {
            action,
            sink,
            tracking_record,
            child_invalidation,
        } = out;
        let kind = action.kind();
        let bytes = encode::to_arc(action.inner())?;
        let record = tracking_record.as_ref().map(encode::to_vec).transpose()?;
        let typed: TypedAction = Box::new(action.into_inner());
        Ok(Some(ErasedOutput {
            kind,
            action: bytes,
            typed: Some(typed),
            // Moved, not cloned: the sink's reference count is shared by
            // every shard, and each touch of it from another core costs.
            sink: sink.core,
            record,
            child_invalidation,
        }))
    }

    fn attachments(&self) -> Result<Vec<(String, ChildTargetDef)>> {
        self.handler.attachments()
    }

    fn value_type(&self) -> &'static str {
        std::any::type_name::<V>()
    }
}
