//! One call of a sink function, and the backoff between retries.

use std::sync::Arc;
use std::time::Duration;

use super::SinkEnv;
use crate::config::{doubled, RetryPolicy};
use crate::error::{Error, Result};
use crate::group::Fence;
use crate::model::sink::{panic_error, EncodedAction, SinkCore};

/// The delay before retry number `attempt` (1-based): exponential, capped,
/// with "equal jitter" (between half and all of the exponential delay).
pub(crate) fn backoff(policy: &RetryPolicy, attempt: u32) -> Duration {
    let capped = doubled(
        policy.initial_backoff,
        policy.max_backoff,
        attempt.saturating_sub(1),
    );
    let half = capped / 2;
    half + half.mul_f64(fastrand::f64())
}

pub(super) async fn call_sink(
    core: Arc<SinkCore>,
    env: &SinkEnv,
    actions: Vec<EncodedAction>,
    fence: Option<Fence>,
) -> Result<()> {
    // The user's function runs on the user's runtime, inside the task, so
    // that even a panic before it returns a future is caught there. The
    // task bounds itself by the call timeout and counts as work a later
    // run waits for: it goes on even when its run was cancelled.
    let limit = env.retry.call_timeout;
    let token = env.work.token();
    let handle = env.user.spawn(async move {
        let _counted = token;
        // The fence is current from before the user's function is called.
        let call = Fence::scope(fence, async move { (core.apply)(actions).await });
        match limit {
            Some(limit) => tokio::time::timeout(limit, call).await.map_err(|_| {
                Error::msg(format!(
                    "sink call timed out after {} ms",
                    limit.as_millis()
                ))
            })?,
            None => call.await,
        }
    });
    env.tasks.track(&handle);
    // The call's keys are released when this returns: a call timed out has
    // let go of them by then (its future is dropped at its next await;
    // blocking code holds them until it returns).
    match handle.await {
        Ok(res) => res,
        Err(e) if e.is_panic() => {
            let payload = e.into_panic();
            let detail = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".to_string());
            Err(panic_error(&detail))
        }
        Err(_) => Err(Error::Shutdown("the sink call was cancelled".into())),
    }
}
