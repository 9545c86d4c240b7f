//! A component entry kept as stored, with where each state's parts lie in
//! it.
//!
//! Reconciler shards compare declarations with it, and a ledger commit
//! edits it. Decoding it into owned [`StateEntry`]s would copy each state's
//! path and records into buffers of their own; this keeps the stored bytes
//! (shared, not copied) and the spans of each part instead (see
//! [`scan`](super::scan)).

use super::record::{ComponentEntry, PrevView, StateEntry};
use super::scan::{scan_entry, StateSpans};
use super::{encode, Ledger};
use crate::error::Result;

/// A component entry as stored, and its states' parts located in it.
pub(crate) struct StoredEntry {
    raw: sled::IVec,
    /// The component's states, sorted by path as stored.
    pub states: Vec<StoredState>,
    /// Why the component failed in its last run, if it did.
    pub failure: Option<String>,
}

/// One state of a [`StoredEntry`]: the spans of its path and records in
/// the entry's bytes, and its other fields.
pub(crate) type StoredState = StateSpans;

impl StoredEntry {
    /// Reads the entry `raw`, read with [`Ledger::component_raw`]. An entry
    /// in a layout the scanner does not take (weir writes none) is decoded
    /// with serde and kept re-encoded in weir's layout.
    ///
    /// # Errors
    /// When it does not decode: the ledger is corrupt.
    pub(crate) fn parse(ledger: &Ledger, raw: sled::IVec) -> Result<StoredEntry> {
        if let Some((states, failure)) = scan_entry(&raw) {
            return Ok(StoredEntry {
                raw,
                states,
                failure,
            });
        }
        let entry: ComponentEntry = ledger.decode(&raw, "a component entry")?;
        let raw = sled::IVec::from(encode(&entry)?);
        let (states, failure) = scan_entry(&raw)
            .ok_or_else(|| ledger.corrupt("a re-encoded component entry does not scan"))?;
        Ok(StoredEntry {
            raw,
            states,
            failure,
        })
    }

    /// The entry's bytes, which its states' spans index.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.raw
    }

    /// The entry, copied out.
    pub(crate) fn to_owned_entry(&self) -> ComponentEntry {
        ComponentEntry {
            states: self.states.iter().map(|s| s.to_entry(&self.raw)).collect(),
            failure: self.failure.clone(),
        }
    }
}

impl StateSpans {
    /// The state's path, in `base`, its entry's [`StoredEntry::bytes`].
    pub(crate) fn path<'a>(&self, base: &'a [u8]) -> &'a [u8] {
        // The spans were checked against these bytes when parsed.
        base.get(self.path.clone()).unwrap_or_default()
    }

    fn records<'a>(&'a self, base: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.first
            .iter()
            .chain(&self.more)
            .map(move |r| base.get(r.clone()).unwrap_or_default())
    }

    /// What reconcile needs of the state.
    pub(crate) fn view<'a>(&'a self, base: &'a [u8]) -> PrevView<'a> {
        PrevView {
            records: self.records(base).collect(),
            may_be_missing: self.may_be_missing,
            gen: self.gen,
        }
    }

    /// The state, copied out.
    pub(crate) fn to_entry(&self, base: &[u8]) -> StateEntry {
        StateEntry {
            path: super::buf(self.path(base)),
            records: self.records(base).map(super::buf).collect(),
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
        let stored = StoredEntry::parse(ledger, sled::IVec::from(raw))?;
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
        let err = StoredEntry::parse(&ledger, sled::IVec::from(&b"\xc1 not an entry"[..]))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("component entry"), "{err}");
        Ok(())
    }
}
