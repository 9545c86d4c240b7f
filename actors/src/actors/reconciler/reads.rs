//! A large component's entry, read once for every shard its chunks reach.
//!
//! A component that declares while its code runs sends every shard chunks
//! of its declarations, and each shard needs the component's stored entry
//! to reconcile them. Reading one is a scan of all its states: for 100k
//! states, several milliseconds and about 10 MB of spans, on each shard,
//! at the moment the component's own thread has the most to do. The
//! shards of an engine share their readings instead: the first shard that
//! needs a component's entry in a run reads it, and a shard that needs it
//! while the reading is kept (until the component's last message) takes
//! it, waiting for it if it is still being read.
//!
//! A shared reading is one a shard could have made itself: a shard reads
//! a component's entry at its first message, whenever that is handled, so
//! the readings of two shards were never of one moment anyway. What the
//! entry changes between readings (a state another component takes over
//! in the run) is met the same way: by the claims of the run.

use rustc_hash::FxHashMap as HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::ledger::stored::StoredEntry;
use crate::sync::lock;

/// A component's entry as read by the first shard that needed it: `None`
/// inside when that reading failed (each shard then reads, and reports,
/// on its own).
pub(crate) type Reading = OnceLock<Option<Arc<Option<StoredEntry>>>>;

/// The readings kept by some shard, by run and component.
#[derive(Default)]
pub(crate) struct SharedReads(Mutex<Listed>);

/// Readings by run and component, each while a shard keeps it, and how
/// many were still kept when those no shard keeps were last let go.
#[derive(Default)]
struct Listed {
    readings: HashMap<(u64, Arc<[u8]>), Weak<Reading>>,
    kept_at_pruning: usize,
}

/// The fewest readings listed from which those no shard keeps are let go.
const PRUNED_FROM: usize = 64;

impl SharedReads {
    /// The reading of `component`'s entry in run `run_id` that a shard
    /// keeps, or a new one to make (and keep while it is needed).
    pub(crate) fn reading(&self, run_id: u64, component: &Arc<[u8]>) -> Arc<Reading> {
        let key = (run_id, Arc::clone(component));
        let mut listed = lock(&self.0);
        if let Some(kept) = listed.readings.get(&key).and_then(Weak::upgrade) {
            return kept;
        }
        // Let go once the list has doubled since: many readings kept at
        // once do not make each new one scan them all.
        if listed.readings.len() >= PRUNED_FROM.max(2 * listed.kept_at_pruning) {
            listed
                .readings
                .retain(|_, reading| reading.strong_count() > 0);
            listed.kept_at_pruning = listed.readings.len();
        }
        let reading = Arc::new(Reading::new());
        listed.readings.insert(key, Arc::downgrade(&reading));
        reading
    }
}

#[cfg(test)]
mod tests {
    use super::SharedReads;
    use std::sync::Arc;

    #[test]
    fn a_reading_is_shared_while_kept_and_made_anew_once_let_go_or_in_another_run() {
        let reads = SharedReads::default();
        let component: Arc<[u8]> = Arc::from(&b"c"[..]);
        let first = reads.reading(1, &component);
        assert!(first.set(None).is_ok());
        let second = reads.reading(1, &component);
        assert!(
            Arc::ptr_eq(&first, &second),
            "a kept reading was not shared"
        );
        let other_run = reads.reading(2, &component);
        assert!(!Arc::ptr_eq(&first, &other_run), "a reading crossed runs");
        let other: Arc<[u8]> = Arc::from(&b"d"[..]);
        assert!(!Arc::ptr_eq(&first, &reads.reading(1, &other)));
        drop((first, second));
        assert!(
            reads.reading(1, &component).get().is_none(),
            "a reading no shard kept was shared"
        );
    }

    #[test]
    fn readings_no_shard_keeps_are_let_go() {
        let reads = SharedReads::default();
        for i in 0..1_000u32 {
            let component: Arc<[u8]> = Arc::from(&i.to_be_bytes()[..]);
            drop(reads.reading(1, &component));
        }
        let listed = reads
            .0
            .lock()
            .map(|l| l.readings.len())
            .unwrap_or(usize::MAX);
        assert!(listed <= super::PRUNED_FROM, "{listed} readings listed");
    }
}
