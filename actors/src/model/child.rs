//! Child target definitions: the handler of a container's children.

use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use super::erased::ChildTargetDef;
use super::handler::TargetHandler;
use super::typed::TypedHandler;

impl ChildTargetDef {
    /// Wraps a typed handler for child states of value type `V`.
    pub fn new<V, H>(handler: H) -> Self
    where
        V: Serialize + DeserializeOwned + Send + 'static,
        H: TargetHandler<V>,
    {
        Self {
            handler: Arc::new(TypedHandler::<V, H>::new(handler)),
        }
    }
}

impl fmt::Debug for ChildTargetDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChildTargetDef")
            .field("value_type", &self.handler.value_type())
            .finish()
    }
}
