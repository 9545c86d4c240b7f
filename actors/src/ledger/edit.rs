//! A component entry being edited by a commit.

use rustc_hash::FxHashMap;

use super::record::{ComponentEntry, StateEntry};
use super::stored::{ShallowEntry, StoredEntry};
use super::{delta, encode, Ledger};
use crate::error::{Error, Result};

/// A component entry being edited: upserts and removals are recorded and
/// merged in one pass, so a batch costs O(n + m log m), not O(n * m).
pub(super) struct EntryEdit {
    pub(super) base: ComponentEntry,
    /// The entry as stored, while nothing needed its states copied out
    /// (`base.states` is empty meanwhile; `base.failure` is the entry's).
    /// Encoding the edited entry then copies each state left alone as it
    /// is stored.
    pub(super) stored: Option<StoredEntry>,
    /// The entry as stored, read shallowly (instead of `stored`) while
    /// nothing needed more than a delta against it.
    shallow: Option<ShallowEntry>,
    /// Whether `stored` or `shallow` was read from the store (not given
    /// whole earlier in this batch), so that a delta may be written against
    /// it.
    in_store: bool,
    /// Whether the entry was read with a delta, which writing it whole
    /// (or deleting it) must delete.
    pub(super) had_delta: bool,
    /// The length of the own value it was read from (0: none), which a
    /// large one keeps in the tree of large values.
    pub(super) own_len: usize,
    /// Upserts with their sequence number; the last one of a path wins.
    upserts: Vec<(u64, StateEntry)>,
    /// Removed paths with the sequence number of the removal.
    removes: FxHashMap<Vec<u8>, u64>,
    seq: u64,
}

/// An edited entry, encoded for the store.
pub(super) enum Encoded {
    /// The whole entry, for its own key.
    Whole(Vec<u8>),
    /// A delta against its own value, which stays as stored.
    Delta(Vec<u8>),
    /// No state and no failure: the component's entry is deleted.
    Empty,
}

impl EntryEdit {
    pub(super) fn new(base: ComponentEntry) -> Self {
        Self {
            base,
            stored: None,
            shallow: None,
            in_store: false,
            had_delta: false,
            own_len: 0,
            upserts: Vec::new(),
            removes: FxHashMap::default(),
            seq: 0,
        }
    }

    /// The edit of an entry kept as stored; `in_store` when it was read
    /// from the store.
    pub(super) fn read(mut stored: StoredEntry, in_store: bool) -> Self {
        let mut edit = Self::new(ComponentEntry {
            states: Vec::new(),
            failure: stored.failure.take(),
        });
        edit.in_store = in_store;
        edit.had_delta = stored.has_delta();
        edit.own_len = stored.own_len();
        edit.stored = Some(stored);
        edit
    }

    /// The edit of an entry read shallowly from the store.
    pub(super) fn read_shallow(mut shallow: ShallowEntry) -> Self {
        let mut edit = Self::new(ComponentEntry {
            states: Vec::new(),
            failure: shallow.take_failure(),
        });
        edit.in_store = true;
        edit.had_delta = shallow.has_delta();
        edit.own_len = shallow.delta_base().own_len;
        edit.shallow = Some(shallow);
        edit
    }

    /// Reads in full an entry read shallowly.
    fn deepen(&mut self, ledger: &Ledger) -> Result<()> {
        if let Some(shallow) = self.shallow.take() {
            // Its failure is `base.failure`, perhaps edited since.
            self.stored = Some(shallow.deepen(ledger)?);
        }
        Ok(())
    }

    /// Copies the stored states out into `base`, for edits that need them.
    fn copy_out(&mut self) {
        if let Some(stored) = self.stored.take() {
            let bytes = stored.bytes();
            self.base.states = stored.states.iter().map(|s| s.to_entry(bytes)).collect();
        }
    }

    /// The upserts that stand: the last one of each path, unless a later
    /// removal undid it, sorted by path.
    fn latest_upserts(&mut self) -> Vec<StateEntry> {
        let mut upserts = std::mem::take(&mut self.upserts);
        // Sort by path, then by sequence.
        upserts.sort_by(|a, b| a.1.path.cmp(&b.1.path).then(a.0.cmp(&b.0)));
        let mut latest: Vec<StateEntry> = Vec::with_capacity(upserts.len());
        let mut iter = upserts.into_iter().peekable();
        while let Some((seq, entry)) = iter.next() {
            if iter.peek().is_some_and(|(_, next)| next.path == entry.path) {
                continue;
            }
            if self
                .removes
                .get(entry.path.as_slice())
                .is_some_and(|r| *r > seq)
            {
                continue;
            }
            latest.push(entry);
        }
        latest
    }

    /// The edited entry, encoded: as a delta when `delta_ok` (its own value
    /// is not in a pack) and [`delta::encode`] takes it, else whole. An
    /// entry kept as stored is encoded whole by merging: its states left
    /// alone are copied as stored, the others encoded; the bytes are the
    /// same as encoding the materialized entry. `ledger` names the store in
    /// the error for a span outside the stored bytes (never made by the
    /// scanner).
    pub(super) fn encoded(&mut self, ledger: &Ledger, delta_ok: bool) -> Result<Encoded> {
        if self.stored.is_none() && self.shallow.is_none() {
            self.materialize(ledger)?;
            if self.base.is_empty() {
                return Ok(Encoded::Empty);
            }
            return Ok(Encoded::Whole(encode(&self.base)?));
        }
        let latest = self.latest_upserts();
        let removes = std::mem::take(&mut self.removes);
        if delta_ok && self.in_store {
            let base = match (&self.shallow, &self.stored) {
                (Some(shallow), _) => Some(shallow.delta_base()),
                (None, Some(stored)) => Some(stored.delta_base()),
                (None, None) => None,
            };
            if let Some(base) = base {
                if let Some(d) =
                    delta::encode(&base, &latest, &removes, &self.base.failure, ledger)?
                {
                    return Ok(Encoded::Delta(d));
                }
            }
        }
        self.deepen(ledger)?;
        let Some(stored) = self.stored.take() else {
            return Err(Error::Shutdown("ledger entry vanished".into()));
        };
        let bytes = stored.bytes();
        let pieces = delta::Pieces::merge(&stored.states, bytes, &latest, &removes);
        if pieces.states == 0 && self.base.failure.is_none() {
            return Ok(Encoded::Empty);
        }
        // `[states, failure]`, as rmp_serde writes a ComponentEntry.
        let mut out = Vec::with_capacity(stored.own_len() + 64);
        out.push(0x92);
        pieces.write(&mut out, bytes, ledger)?;
        rmp_serde::encode::write(&mut out, &self.base.failure)?;
        Ok(Encoded::Whole(out))
    }

    pub(super) fn upsert(&mut self, entry: StateEntry) {
        self.seq += 1;
        self.upserts.push((self.seq, entry));
    }

    pub(super) fn remove(&mut self, path: &[u8]) {
        self.seq += 1;
        self.removes.insert(path.to_vec(), self.seq);
    }

    pub(super) fn materialize(&mut self, ledger: &Ledger) -> Result<()> {
        self.deepen(ledger)?;
        self.copy_out();
        self.apply_edits();
        Ok(())
    }

    /// Applies the recorded upserts and removals to `base.states`.
    pub(super) fn apply_edits(&mut self) {
        if self.upserts.is_empty() && self.removes.is_empty() {
            return;
        }
        let latest = self.latest_upserts();
        let removes = std::mem::take(&mut self.removes);
        let old = std::mem::take(&mut self.base.states);
        let mut merged = Vec::with_capacity(old.len() + latest.len());
        let mut new = latest.into_iter().peekable();
        for s in old {
            while let Some(n) = new.next_if(|n| n.path.as_slice() < s.path.as_slice()) {
                merged.push(n);
            }
            if new.peek().is_some_and(|n| n.path == s.path) {
                continue;
            }
            if !removes.contains_key(s.path.as_slice()) {
                merged.push(s);
            }
        }
        merged.extend(new);
        self.base.states = merged;
    }
}
