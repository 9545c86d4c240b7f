//! Long-running use: shutdown requests, run reports and live mode
//! ([`App::watch`]).

use std::future::Future;
use std::sync::Arc;

use crate::app::App;
use crate::ctx::Ctx;
use crate::error::{ComponentFailure, Error, Result};
use crate::run::{PreviewAction, UpdateStats};

pub use crate::shutdown::ShutdownHandle;

/// What one update did: its statistics and the components that failed.
///
/// Returned by [`App::run_report`], which, unlike [`App::run`], reports
/// failed components here instead of as an error, so a caller gets the
/// statistics of a run in which some components failed.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct RunReport {
    /// What the update did.
    pub stats: UpdateStats,
    /// The components that failed, with their causes.
    pub failures: Vec<ComponentFailure>,
}

/// What a preview found: the actions an update would take, and the
/// components that would fail (see [`App::preview_report`]).
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct PreviewReport {
    /// The actions of the components that would not fail.
    pub actions: Vec<PreviewAction>,
    /// The components that would fail, with their causes.
    pub failures: Vec<ComponentFailure>,
}

/// A source of change notifications for [`App::watch`]: each `Some` means
/// "something may have changed, run again"; `None` means the feed ended.
///
/// A feed should debounce: wait for a burst of changes to settle and
/// report it once.
pub trait ChangeFeed: Send {
    /// Waits for the next batch of changes. Returns a short description of
    /// what changed (for logs), or `None` when no more changes will come.
    fn next_change(&mut self) -> impl Future<Output = Option<Vec<String>>> + Send;
}

/// What [`App::watch`] reports after each run.
#[derive(Debug)]
#[non_exhaustive]
pub enum WatchEvent {
    /// A run finished. `changes` lists what triggered it (empty for the
    /// first run).
    Ran {
        /// The changes that triggered the run.
        changes: Vec<String>,
        /// What the run did.
        report: RunReport,
    },
    /// A run failed as a whole (not just some of its components); live mode
    /// goes on and tries again on the next change.
    Failed {
        /// The changes that triggered the run.
        changes: Vec<String>,
        /// Why it failed.
        error: Error,
    },
}

impl App {
    /// A handle that asks this app to stop (see [`ShutdownHandle`]).
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.engine.shutdown.clone()
    }

    /// Like [`App::run`], but components that fail are listed in the
    /// report rather than turned into an error.
    ///
    /// # Errors
    /// Only when the run as a whole fails: a ledger error, or the root
    /// component's own code failing is reported as a failure, not an error.
    pub async fn run_report<F, Fut>(&self, f: F) -> Result<RunReport>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        let (stats, failures) = self.execute_collecting(f, None).await?;
        Ok(RunReport { stats, failures })
    }

    /// Like [`App::preview`], with the failed components listed beside
    /// the actions the others would take, instead of an error that drops
    /// those actions.
    ///
    /// # Errors
    /// As [`App::run_report`].
    pub async fn preview_report<F, Fut>(&self, f: F) -> Result<PreviewReport>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        let (actions, failures) = self.preview_collecting(f).await?;
        Ok(PreviewReport { actions, failures })
    }

    /// Live mode: runs `f` as an update, then again each time `feed`
    /// reports a change, until the feed ends or a shutdown is requested
    /// (see [`App::shutdown_handle`]); `on_event` hears about each run.
    ///
    /// Each run is a whole update: use [`Ctx::mount_each_memo`] in `f` so
    /// that only the components whose items changed run again, while items
    /// that disappeared are reconciled away as in any update.
    ///
    /// A shutdown requested during a run lets the components already
    /// running finish and commit, then returns.
    ///
    /// # Errors
    /// Never for a failed run (that is reported to `on_event`); only when
    /// the app's engine has stopped.
    pub async fn watch<C, F, Fut, E>(&self, mut feed: C, f: F, mut on_event: E) -> Result<()>
    where
        C: ChangeFeed,
        F: Fn(Ctx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
        E: FnMut(WatchEvent) + Send,
    {
        let f = Arc::new(f);
        let shutdown = self.shutdown_handle();
        // Exported from the start, at zero.
        metrics::counter!(crate::metrics::LIVE_CHANGES).increment(0);
        let mut changes = Vec::new();
        loop {
            let run_f = Arc::clone(&f);
            let event = match self.run_report(move |ctx| run_f(ctx)).await {
                Ok(report) => WatchEvent::Ran {
                    changes: std::mem::take(&mut changes),
                    report,
                },
                Err(Error::Shutdown(detail)) => return Err(Error::Shutdown(detail)),
                Err(error) => WatchEvent::Failed {
                    changes: std::mem::take(&mut changes),
                    error,
                },
            };
            on_event(event);
            if shutdown.is_requested() {
                return Ok(());
            }
            tokio::select! {
                next = feed.next_change() => match next {
                    Some(c) => {
                        metrics::counter!(crate::metrics::LIVE_CHANGES).increment(1);
                        changes = c;
                    }
                    None => return Ok(()),
                },
                () = shutdown.requested() => return Ok(()),
            }
        }
    }
}
