//! Progress of a sync: a bar on a terminal, periodic log lines otherwise.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// Counts files checked (memo computed) and processed (code run), shared
/// by the components of one run.
#[derive(Clone)]
pub struct Progress {
    inner: Arc<Inner>,
}

struct Inner {
    bar: Option<ProgressBar>,
    total: u64,
    checked: AtomicU64,
    processed: AtomicU64,
    failed: AtomicU64,
}

impl Progress {
    /// Progress over `total` files: a bar when stderr is a terminal.
    pub fn new(total: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total);
            let style = ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} files ({per_sec}, eta {eta}) {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Progress {
            inner: Arc::new(Inner {
                bar,
                total,
                checked: AtomicU64::new(0),
                processed: AtomicU64::new(0),
                failed: AtomicU64::new(0),
            }),
        }
    }

    /// A file's change detection ran.
    pub fn checked(&self) {
        self.inner.checked.fetch_add(1, Ordering::Relaxed);
        if let Some(bar) = &self.inner.bar {
            bar.inc(1);
        }
    }

    /// A changed file was processed (or failed).
    pub fn processed(&self, ok: bool) {
        self.inner.processed.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.inner.failed.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(bar) = &self.inner.bar {
            let failed = self.inner.failed.load(Ordering::Relaxed);
            let processed = self.inner.processed.load(Ordering::Relaxed);
            bar.set_message(if failed > 0 {
                format!("{processed} changed, {failed} failed")
            } else {
                format!("{processed} changed")
            });
        }
    }

    /// Logs a line every `every` until the run ends, when there is no bar.
    pub fn log_periodically(&self, every: Duration) -> Option<tokio::task::JoinHandle<()>> {
        if self.inner.bar.is_some() {
            return None;
        }
        let this = self.clone();
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                tracing::info!(
                    "{}/{} files checked, {} changed",
                    this.inner.checked.load(Ordering::Relaxed),
                    this.inner.total,
                    this.inner.processed.load(Ordering::Relaxed)
                );
            }
        }))
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.inner.bar {
            bar.finish_and_clear();
        }
    }
}
