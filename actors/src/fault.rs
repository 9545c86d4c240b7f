//! Fault injection for crash tests: named points in the engine where a test
//! can have the process killed with `SIGKILL`.
//!
//! Everything here does nothing unless the crate is built with the cargo
//! feature `fault-injection` (off by default; the `weir` package turns it on
//! for its own tests only). Without the feature, the points compile to
//! nothing.
//!
//! With the feature, every point counts its hits, and the environment
//! variable [`KILL_ENV`] (`WEIR_FAULT_KILL=<point>:<n>`, for example
//! `WEIR_FAULT_KILL=sink.after_apply:3`) kills the process with `SIGKILL` on
//! the `n`-th hit (counted from 1) of that point, as a crash would: no
//! destructor runs, nothing more is written. The points are:
//!
//! - [`RECONCILE_BATCH`]: a reconciler shard starts handling a component's
//!   batch of declarations (before it reads the ledger or calls a handler);
//! - [`SINK_BEFORE_APPLY`]: a sink actor is about to call the sink, its
//!   intents already durable;
//! - [`SINK_AFTER_APPLY`]: the sink call returned `Ok`, and nothing of it is
//!   reported or committed yet (a crash between apply and commit);
//! - [`LEDGER_GROUP_COMMIT`]: the ledger actor has applied a group commit's
//!   sled batch and not flushed it yet.

/// The environment variable naming the point to kill at and its hit
/// number: `<point>:<n>`.
pub const KILL_ENV: &str = "WEIR_FAULT_KILL";

/// A reconciler shard starts handling a component's batch.
pub const RECONCILE_BATCH: &str = "reconcile.batch";
/// A sink is about to be called (its intents are durable).
pub const SINK_BEFORE_APPLY: &str = "sink.before_apply";
/// A sink call returned `Ok`; its result is neither reported nor committed.
pub const SINK_AFTER_APPLY: &str = "sink.after_apply";
/// A group commit's sled batch is applied and not flushed yet.
pub const LEDGER_GROUP_COMMIT: &str = "ledger.group_commit";

/// Every point, in the order of `hits` (with the feature).
pub const POINTS: [&str; 4] = [
    RECONCILE_BATCH,
    SINK_BEFORE_APPLY,
    SINK_AFTER_APPLY,
    LEDGER_GROUP_COMMIT,
];

/// Marks the point `name` (one of [`POINTS`]): counts the hit and, on the
/// hit that [`KILL_ENV`] names, kills the process. Nothing without the
/// `fault-injection` feature.
#[inline(always)]
pub(crate) fn point(name: &'static str) {
    #[cfg(feature = "fault-injection")]
    active::hit(name);
    #[cfg(not(feature = "fault-injection"))]
    let _ = name;
}

/// The hits of each point in this process so far, in the order of
/// [`POINTS`].
#[cfg(feature = "fault-injection")]
pub fn hits() -> Vec<(&'static str, u64)> {
    active::hits()
}

#[cfg(feature = "fault-injection")]
mod active {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    use super::{KILL_ENV, POINTS};

    static HITS: [AtomicU64; POINTS.len()] = [const { AtomicU64::new(0) }; POINTS.len()];
    /// The point index and hit number to kill at, read once.
    static KILL_AT: OnceLock<Option<(usize, u64)>> = OnceLock::new();

    fn kill_at() -> Option<(usize, u64)> {
        *KILL_AT.get_or_init(|| {
            let spec = std::env::var(KILL_ENV).ok()?;
            let parsed = spec.rsplit_once(':').and_then(|(name, n)| {
                let idx = POINTS.iter().position(|p| *p == name)?;
                let n = n.parse::<u64>().ok().filter(|n| *n > 0)?;
                Some((idx, n))
            });
            if parsed.is_none() {
                // A crash test with a bad spec must not pass by not crashing.
                eprintln!(
                    "weir fault injection: {KILL_ENV}={spec:?} is not <point>:<n> with n >= 1 \
                     and a point among {POINTS:?}; aborting"
                );
                std::process::abort();
            }
            parsed
        })
    }

    pub(super) fn hit(name: &'static str) {
        let Some(idx) = POINTS.iter().position(|p| *p == name) else {
            return;
        };
        let Some(counter) = HITS.get(idx) else {
            return;
        };
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        if kill_at() == Some((idx, n)) {
            kill(name, n);
        }
    }

    pub(super) fn hits() -> Vec<(&'static str, u64)> {
        POINTS
            .iter()
            .zip(HITS.iter())
            .map(|(p, h)| (*p, h.load(Ordering::SeqCst)))
            .collect()
    }

    /// Kills this process with `SIGKILL` (through `kill -9`, so no libc is
    /// needed); aborts if that did not work.
    fn kill(name: &str, n: u64) -> ! {
        let pid = std::process::id();
        eprintln!(
            "weir fault injection: SIGKILL at {name} hit {n} (pid {pid}; hits so far: {:?})",
            hits()
        );
        let sent = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
        if sent.is_ok_and(|s| s.success()) {
            // The signal is on its way: this thread goes no further.
            std::thread::sleep(std::time::Duration::from_secs(5));
        }
        std::process::abort();
    }
}
