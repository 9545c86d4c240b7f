//! A component entry kept as stored, with where each state's parts lie in
//! it.
//!
//! Reconciler shards compare declarations with it, and a ledger commit
//! edits it. Decoding it into owned [`StateEntry`]s would copy each state's
//! path and records into buffers of their own; this keeps the stored bytes
//! (shared, not copied) and the spans of each part instead (see
//! [`scan`](super::scan)).

use std::ops::Range;

use super::record::{ComponentEntry, PrevView, StateEntry};
use super::scan::{scan_delta, scan_entry, StateSpans};
use super::{encode, Ledger};
use crate::error::Result;

/// A component entry as stored, and its states' parts located in it: its
/// own value, with the states of its delta, if it has one (see [`delta`](super::delta)),
/// merged in.
pub(crate) struct StoredEntry {
    raw: sled::IVec,
    /// The delta's bytes (empty without one). Spans at or past
    /// `raw.len()` lie in them, `raw.len()` bytes further on.
    delta: sled::IVec,
    /// The delta's states, sorted by path (also merged into `states`).
    added: Vec<StateSpans>,
    /// The paths the delta removes from `raw`'s states.
    removed: Vec<Range<usize>>,
    /// The component's states, sorted by path.
    pub states: Vec<StoredState>,
    /// Why the component failed in its last run, if it did.
    pub failure: Option<String>,
}

/// One state of a [`StoredEntry`]: the spans of its path and records in
/// the entry's bytes, and its other fields.
pub(crate) type StoredState = StateSpans;

/// The bytes a [`StoredEntry`]'s spans index: the entry's own value, then
/// its delta's.
#[derive(Clone, Copy, Default)]
pub(crate) struct EntryBytes<'a> {
    base: &'a [u8],
    delta: &'a [u8],
}

impl<'a> EntryBytes<'a> {
    /// The bytes a span covers; `None` for one outside them, or across the
    /// two parts.
    pub(crate) fn get(self, span: Range<usize>) -> Option<&'a [u8]> {
        match span.start.checked_sub(self.base.len()) {
            Some(start) => self
                .delta
                .get(start..span.end.checked_sub(self.base.len())?),
            None => self.base.get(span),
        }
    }
}

impl<'a> From<&'a [u8]> for EntryBytes<'a> {
    fn from(base: &'a [u8]) -> Self {
        EntryBytes { base, delta: &[] }
    }
}

impl StoredEntry {
    /// Reads the entry `raw` and its delta. An entry in a layout the
    /// scanner does not take (weir writes none) is decoded with serde and
    /// kept re-encoded in weir's layout.
    ///
    /// # Errors
    /// When either does not decode: the ledger is corrupt.
    pub(crate) fn parse(
        ledger: &Ledger,
        raw: sled::IVec,
        delta: Option<sled::IVec>,
    ) -> Result<StoredEntry> {
        let (raw, states, failure) = match scan_entry(&raw) {
            Some((states, failure)) => (raw, states, failure),
            None => {
                let entry: ComponentEntry = ledger.decode(&raw, "a component entry")?;
                let raw = sled::IVec::from(encode(&entry)?);
                let (states, failure) = scan_entry(&raw)
                    .ok_or_else(|| ledger.corrupt("a re-encoded component entry does not scan"))?;
                (raw, states, failure)
            }
        };
        let mut entry = StoredEntry {
            raw,
            delta: sled::IVec::default(),
            added: Vec::new(),
            removed: Vec::new(),
            states,
            failure,
        };
        if let Some(delta) = delta {
            entry.merge(ledger, delta)?;
        }
        Ok(entry)
    }

    /// Merges a delta into the states read from the entry's own value.
    fn merge(&mut self, ledger: &Ledger, delta: sled::IVec) -> Result<()> {
        let bad = || ledger.corrupt("a component entry's delta does not decode");
        let read = read_delta(ledger, &self.raw, &delta)?;
        let added = read.added;
        self.removed = read.removed;
        self.failure = read.failure;
        self.delta = delta;
        let bytes = EntryBytes {
            base: &self.raw,
            delta: &self.delta,
        };
        let path = |s: &StateSpans| bytes.get(s.path.clone());
        let find = |states: &[StateSpans], p: &[u8]| {
            states.binary_search_by(|s| path(s).unwrap_or_default().cmp(p))
        };
        let mut inserted = Vec::new();
        for state in &added {
            match find(&self.states, path(state).ok_or_else(bad)?) {
                Ok(i) => self.states[i] = state.clone(),
                Err(_) => inserted.push(state.clone()),
            }
        }
        self.added = added;
        let mut gone = Vec::new();
        for r in &self.removed {
            if let Ok(i) = find(&self.states, bytes.get(r.clone()).ok_or_else(bad)?) {
                gone.push(i);
            }
        }
        if gone.is_empty() && inserted.is_empty() {
            return Ok(());
        }
        gone.sort_unstable();
        gone.dedup();
        let old = std::mem::take(&mut self.states);
        let mut merged = Vec::with_capacity(old.len() + inserted.len());
        let mut gone = gone.into_iter().peekable();
        let mut inserted = inserted.into_iter().peekable();
        for (i, state) in old.into_iter().enumerate() {
            if gone.next_if_eq(&i).is_some() {
                continue;
            }
            let at = path(&state);
            while let Some(n) = inserted.next_if(|n| path(n) < at) {
                merged.push(n);
            }
            merged.push(state);
        }
        merged.extend(inserted);
        self.states = merged;
        Ok(())
    }

    /// The bytes its states' spans index.
    pub(crate) fn bytes(&self) -> EntryBytes<'_> {
        EntryBytes {
            base: &self.raw,
            delta: &self.delta,
        }
    }

    /// The length of the entry's own value: spans from here on lie in its
    /// delta.
    pub(crate) fn own_len(&self) -> usize {
        self.raw.len()
    }

    /// Whether the entry was read with a delta.
    pub(crate) fn has_delta(&self) -> bool {
        !self.delta.is_empty()
    }

    /// What a delta against the entry's own value starts from.
    pub(crate) fn delta_base(&self) -> DeltaBase<'_> {
        DeltaBase {
            own_len: self.raw.len(),
            min_states: self.states.len(),
            bytes: self.bytes(),
            added: &self.added,
            removed: &self.removed,
        }
    }

    /// The entry, copied out.
    pub(crate) fn to_owned_entry(&self) -> ComponentEntry {
        let bytes = self.bytes();
        ComponentEntry {
            states: self.states.iter().map(|s| s.to_entry(bytes)).collect(),
            failure: self.failure.clone(),
        }
    }
}

/// What a delta against an entry's own value starts from (see
/// [`delta::encode`](super::delta::encode)).
pub(crate) struct DeltaBase<'a> {
    /// The length of the own value.
    pub own_len: usize,
    /// At least how many states the entry holds.
    pub min_states: usize,
    /// The own value's bytes, then the current delta's.
    pub bytes: EntryBytes<'a>,
    /// The current delta's states, sorted by path.
    pub added: &'a [StateSpans],
    /// The paths the current delta removes.
    pub removed: &'a [Range<usize>],
}

/// A delta, scanned, its spans past the own value's bytes.
struct ReadDelta {
    added: Vec<StateSpans>,
    removed: Vec<Range<usize>>,
    failure: Option<String>,
}

/// Scans `delta`, the delta of the entry whose own value is `own`, and
/// checks that its states are sorted by path.
fn read_delta(ledger: &Ledger, own: &[u8], delta: &[u8]) -> Result<ReadDelta> {
    let bad = || ledger.corrupt("a component entry's delta does not decode");
    let (added, failure, removed) = scan_delta(delta).ok_or_else(bad)?;
    let off = own.len();
    let added: Vec<StateSpans> = added.into_iter().map(|s| s.shifted(off)).collect();
    let removed = removed
        .into_iter()
        .map(|r| r.start + off..r.end + off)
        .collect();
    let bytes = EntryBytes { base: own, delta };
    let path = |s: &StateSpans| bytes.get(s.path.clone());
    if added
        .windows(2)
        .any(|w| path(&w[0]).is_none() || path(&w[0]) >= path(&w[1]))
    {
        return Err(bad());
    }
    Ok(ReadDelta {
        added,
        removed,
        failure,
    })
}

/// A component entry as stored, read without locating the states of its
/// own value: what a commit needs to write a delta against it, for the
/// cost of reading the delta alone. [`ShallowEntry::deepen`] reads the
/// rest when a commit needs it.
pub(crate) struct ShallowEntry {
    own: sled::IVec,
    /// How many states the own value holds.
    own_states: usize,
    delta: Option<sled::IVec>,
    read: ReadDelta,
}

impl ShallowEntry {
    /// Reads an entry's own value `own` and its delta shallowly; `None`
    /// when the own value does not tell its number of states and its
    /// failure without a scan (it is not in weir's layout, or it records a
    /// failure and has no delta to override it).
    pub(crate) fn read(
        ledger: &Ledger,
        own: sled::IVec,
        delta: Option<sled::IVec>,
    ) -> Result<Option<ShallowEntry>> {
        let Some(own_states) = super::scan::entry_len(&own) else {
            return Ok(None);
        };
        let read = match &delta {
            Some(d) => read_delta(ledger, &own, d)?,
            // Without a delta, the failure is the own value's last field:
            // nil (0xc0) is a byte no string in UTF-8 ends with.
            None if own.last() == Some(&0xc0) => ReadDelta {
                added: Vec::new(),
                removed: Vec::new(),
                failure: None,
            },
            None => return Ok(None),
        };
        Ok(Some(ShallowEntry {
            own,
            own_states,
            delta,
            read,
        }))
    }

    /// Why the component failed in its last run, if it did.
    pub(crate) fn take_failure(&mut self) -> Option<String> {
        self.read.failure.take()
    }

    /// Whether the entry was read with a delta.
    pub(crate) fn has_delta(&self) -> bool {
        self.delta.is_some()
    }

    /// What a delta against the entry's own value starts from.
    pub(crate) fn delta_base(&self) -> DeltaBase<'_> {
        DeltaBase {
            own_len: self.own.len(),
            // A state the delta removes may be the own value's.
            min_states: self.own_states.saturating_sub(self.read.removed.len()),
            bytes: EntryBytes {
                base: &self.own,
                delta: self.delta.as_deref().unwrap_or_default(),
            },
            added: &self.read.added,
            removed: &self.read.removed,
        }
    }

    /// The entry read in full.
    ///
    /// # Errors
    /// When it does not decode: the ledger is corrupt.
    pub(crate) fn deepen(self, ledger: &Ledger) -> Result<StoredEntry> {
        StoredEntry::parse(ledger, self.own, self.delta)
    }
}

impl StateSpans {
    /// The state's path, in `bytes`, its entry's [`StoredEntry::bytes`].
    pub(crate) fn path<'a>(&self, bytes: EntryBytes<'a>) -> &'a [u8] {
        // The spans were checked against these bytes when parsed.
        bytes.get(self.path.clone()).unwrap_or_default()
    }

    fn records<'a>(&'a self, bytes: EntryBytes<'a>) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.first
            .iter()
            .chain(&self.more)
            .map(move |r| bytes.get(r.clone()).unwrap_or_default())
    }

    /// What reconcile needs of the state.
    pub(crate) fn view<'a>(&'a self, bytes: EntryBytes<'a>) -> PrevView<'a> {
        PrevView {
            records: self.records(bytes).collect(),
            may_be_missing: self.may_be_missing,
            gen: self.gen,
        }
    }

    /// The state, copied out.
    pub(crate) fn to_entry(&self, bytes: EntryBytes<'_>) -> StateEntry {
        StateEntry {
            path: super::buf(self.path(bytes)),
            records: self.records(bytes).map(super::buf).collect(),
            may_be_missing: self.may_be_missing,
            gen: self.gen,
            child_gen: self.child_gen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> ComponentEntry {
        let state = |path: &str, records: &[&str], gen: u64| StateEntry {
            path: super::super::buf(path.as_bytes()),
            records: records
                .iter()
                .map(|r| super::super::buf(r.as_bytes()))
                .collect(),
            may_be_missing: gen == 2,
            gen,
            child_gen: None,
        };
        ComponentEntry {
            states: vec![
                state("a", &["r1"], 1),
                state("b", &[], 2),
                state("c", &["r1", "r2", "r3"], 3),
            ],
            failure: Some("it broke".into()),
        }
    }

    #[test]
    fn a_stored_entry_gives_back_each_state_as_encoded() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        let original = entry();
        // As weir writes entries (scanned), and with field names (decoded
        // with serde, then kept in weir's layout).
        for raw in [
            rmp_serde::to_vec(&original)?,
            rmp_serde::to_vec_named(&original)?,
        ] {
            check_stored(&ledger, &original, raw)?;
        }
        Ok(())
    }

    fn check_stored(ledger: &Ledger, original: &ComponentEntry, raw: Vec<u8>) -> Result<()> {
        let stored = StoredEntry::parse(ledger, sled::IVec::from(raw), None)?;
        let owned = stored.to_owned_entry();
        assert_eq!(owned.failure, original.failure);
        assert_eq!(owned.states.len(), original.states.len());
        for (s, o) in owned.states.iter().zip(&original.states) {
            assert_eq!(
                (&s.path, &s.records, s.may_be_missing, s.gen),
                (&o.path, &o.records, o.may_be_missing, o.gen)
            );
        }
        assert_eq!(stored.failure.as_deref(), Some("it broke"));
        assert_eq!(stored.states.len(), original.states.len());
        let base = stored.bytes();
        for (s, o) in stored.states.iter().zip(&original.states) {
            assert_eq!(s.path(base), o.path.as_slice());
            let copied = s.to_entry(base);
            assert_eq!(copied.path, o.path);
            assert_eq!(copied.records, o.records);
            assert_eq!(copied.may_be_missing, o.may_be_missing);
            assert_eq!(copied.gen, o.gen);
            let view = s.view(base);
            let records: Vec<&[u8]> = o.records.iter().map(|r| r.as_slice()).collect();
            assert_eq!(view.records, records);
            assert_eq!((view.may_be_missing, view.gen), (o.may_be_missing, o.gen));
        }
        Ok(())
    }

    #[test]
    fn a_stored_entry_that_does_not_decode_is_reported_as_corrupt() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        let err = StoredEntry::parse(&ledger, sled::IVec::from(&b"\xc1 not an entry"[..]), None)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("component entry"), "{err}");
        Ok(())
    }
}
