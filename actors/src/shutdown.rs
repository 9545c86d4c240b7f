//! Asking an App to stop: [`ShutdownHandle`].

use std::sync::Arc;

use tokio::sync::watch;

/// Asks an [`App`](crate::App) to stop, from anywhere (a signal handler, another task).
///
/// Once requested, a running update stops starting new components: the
/// components already running finish and commit, the ones not started are
/// left for the next run, and their parent fails with
/// [`Error::Interrupted`](crate::Error::Interrupted) (so nothing it no longer reached is deleted).
/// [`App::watch`](crate::App::watch) returns after its current run. A request cannot be taken
/// back: the app is shutting down.
///
/// Cheap to clone; every clone controls the same app.
#[derive(Clone, Debug)]
pub struct ShutdownHandle {
    requested: Arc<watch::Sender<bool>>,
}

impl ShutdownHandle {
    /// A handle not yet requested.
    pub(crate) fn new() -> Self {
        Self {
            requested: Arc::new(watch::Sender::new(false)),
        }
    }

    /// Requests the shutdown.
    pub fn shutdown(&self) {
        self.requested.send_replace(true);
    }

    /// Whether a shutdown was requested.
    pub fn is_requested(&self) -> bool {
        *self.requested.borrow()
    }

    /// Waits until a shutdown is requested (at once when it already was).
    pub async fn requested(&self) {
        let mut rx = self.requested.subscribe();
        // The sender lives in `self`, so the channel cannot close here.
        let _ = rx.wait_for(|requested| *requested).await;
    }
}
