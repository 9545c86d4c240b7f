//! The run's activity: when nothing is left to do, sinks flush what they
//! hold instead of waiting for their batches to fill.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::{Flush, SinkActor};

/// How many components are still producing declarations or reconciling;
/// when it drops to zero nothing more is coming and sinks flush at once.
pub(crate) struct Activity {
    count: AtomicUsize,
    sinks: Mutex<Vec<actix::Addr<SinkActor>>>,
}

impl Activity {
    pub(crate) fn new() -> Self {
        Self {
            count: AtomicUsize::new(0),
            sinks: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn enter(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn leave(&self) {
        if self.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            let sinks = match self.sinks.lock() {
                Ok(s) => s.clone(),
                Err(p) => p.into_inner().clone(),
            };
            for s in sinks {
                s.do_send(Flush);
            }
        }
    }

    pub(super) fn idle(&self) -> bool {
        self.count.load(Ordering::SeqCst) == 0
    }

    /// Drops the sink addresses (at the end of a run).
    pub(crate) fn clear(&self) {
        match self.sinks.lock() {
            Ok(mut s) => s.clear(),
            Err(p) => p.into_inner().clear(),
        }
    }

    pub(crate) fn register(&self, sink: actix::Addr<SinkActor>) {
        match self.sinks.lock() {
            Ok(mut s) => s.push(sink),
            Err(p) => p.into_inner().push(sink),
        }
    }
}
