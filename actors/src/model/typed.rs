//! Typed handlers behind the erased interface: [`TypedHandler`] decodes
//! what the engine passes a handler and encodes what it returns.

use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::encode;
use super::erased::{ChildTargetDef, DeclaredValue, ErasedHandler, ErasedOutput, TypedAction};
use super::handler::{TargetHandler, TargetReconcileOutput};
use super::key::StableKey;
use crate::error::Result;

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
        let record = tracking_record.as_ref().map(encode::to_arc).transpose()?;
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

    fn unchanged_needs_nothing(&self) -> bool {
        self.handler.unchanged_needs_nothing()
    }

    fn value_type(&self) -> &'static str {
        std::any::type_name::<V>()
    }
}
