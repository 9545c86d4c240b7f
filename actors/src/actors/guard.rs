//! Code the engine calls but does not trust: a panic in a handler, a
//! sink or a component's code becomes an error naming what panicked.

use std::panic::AssertUnwindSafe;

use crate::error::{Error, Result};

/// Runs a connector callback, turning a panic into an error.
pub(crate) fn guarded<T>(call: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(AssertUnwindSafe(call)) {
        Ok(result) => result,
        Err(payload) => Err(Error::permanent(format!(
            "the handler panicked: {}",
            panic_text(&*payload)
        ))),
    }
}

/// The message of a panic's payload.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_string())
}
