//! A direct reader of stored component entries.
//!
//! A component entry is read whole each time a component is reconciled or
//! committed, and a large one holds hundreds of thousands of states.
//! Decoding it through serde costs about a thousand instructions per state;
//! this reads the same MessagePack layout directly and only locates each
//! state's parts, at a fraction of that. Anything it does not expect makes
//! it give up (`None`), and the caller decodes with serde instead, which
//! reads every layout serde can and reports what is wrong.
//!
//! The layout, as `rmp_serde` writes [`ComponentEntry`](super::record::ComponentEntry)
//! (structs as arrays): `[states, failure]`, each state
//! `[path, [record, ...], may_be_missing, gen, child_gen]` with the path and
//! records as binary strings, `gen` an unsigned integer, `child_gen` nil or
//! `[current, destructive_floor]`, and `failure` nil or a string.

use std::ops::Range;

use crate::model::provider::ChildGeneration;

/// One state of a scanned entry: where its path and records lie in the
/// entry's bytes, and its other fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StateSpans {
    /// The whole encoded state.
    pub whole: Range<usize>,
    pub path: Range<usize>,
    /// The first record (most states have exactly one), then the others.
    pub first: Option<Range<usize>>,
    pub more: Vec<Range<usize>>,
    pub may_be_missing: bool,
    pub gen: u64,
    pub child_gen: Option<ChildGeneration>,
}

/// A scanned entry: its states, and why the component failed if it did.
pub(crate) type Scanned = (Vec<StateSpans>, Option<String>);

/// Scans an entry, or `None` if it is not in the expected layout.
pub(crate) fn scan_entry(raw: &[u8]) -> Option<Scanned> {
    let mut r = Reader { raw, pos: 0 };
    if r.array_len()? != 2 {
        return None;
    }
    let scanned = r.states_and_failure()?;
    (r.pos == raw.len()).then_some(scanned)
}

/// The number of states of an entry in weir's layout, read from its
/// header alone; `None` for another layout.
pub(crate) fn entry_len(raw: &[u8]) -> Option<usize> {
    let mut r = Reader { raw, pos: 0 };
    if r.array_len()? != 2 {
        return None;
    }
    r.array_len()
}

/// A scanned delta (see [`delta`](super::delta)): the states it adds or
/// replaces, the component's failure, and the paths it removes.
pub(crate) type ScannedDelta = (Vec<StateSpans>, Option<String>, Vec<Range<usize>>);

/// Scans a delta, `[states, failure, [removed path, ...]]`, or `None` if it
/// is not in that layout.
pub(crate) fn scan_delta(raw: &[u8]) -> Option<ScannedDelta> {
    let mut r = Reader { raw, pos: 0 };
    if r.array_len()? != 3 {
        return None;
    }
    let (states, failure) = r.states_and_failure()?;
    let n = r.array_len()?;
    // Each removed path takes at least 2 bytes.
    let mut removed = Vec::with_capacity(n.min(raw.len() / 2));
    for _ in 0..n {
        removed.push(r.bin()?);
    }
    (r.pos == raw.len()).then_some((states, failure, removed))
}

impl StateSpans {
    /// The same spans, `by` bytes further on.
    pub(crate) fn shifted(mut self, by: usize) -> StateSpans {
        let shift = |r: &mut Range<usize>| *r = r.start + by..r.end + by;
        shift(&mut self.whole);
        shift(&mut self.path);
        if let Some(first) = &mut self.first {
            shift(first);
        }
        for r in &mut self.more {
            shift(r);
        }
        self
    }
}

/// Writes a MessagePack array header for `len` items, in the shortest
/// form, as `rmp_serde` does.
pub(crate) fn write_array_len(out: &mut Vec<u8>, len: usize) {
    match (u8::try_from(len), u16::try_from(len)) {
        (Ok(n), _) if n < 16 => out.push(0x90 | n),
        (_, Ok(n)) => {
            out.push(0xdc);
            out.extend_from_slice(&n.to_be_bytes());
        }
        _ => {
            out.push(0xdd);
            // Entries never hold 2^32 states.
            let n = u32::try_from(len).unwrap_or(u32::MAX);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
}

struct Reader<'a> {
    raw: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    /// The array of states next, then the failure (nil or a string).
    fn states_and_failure(&mut self) -> Option<Scanned> {
        let n = self.array_len()?;
        // Each state takes at least 7 bytes: never reserve more than fits.
        let mut states = Vec::with_capacity(n.min(self.raw.len() / 7));
        for _ in 0..n {
            states.push(self.state()?);
        }
        let failure = if self.nil() {
            None
        } else {
            Some(self.str()?.to_string())
        };
        Some((states, failure))
    }

    fn byte(&mut self) -> Option<u8> {
        let b = *self.raw.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    fn be(&mut self, n: usize) -> Option<u64> {
        let bytes = self.raw.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(bytes.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn len(&mut self, bytes: usize) -> Option<usize> {
        usize::try_from(self.be(bytes)?).ok()
    }

    /// Consumes a nil if one is next.
    fn nil(&mut self) -> bool {
        if self.raw.get(self.pos) == Some(&0xc0) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn array_len(&mut self) -> Option<usize> {
        match self.byte()? {
            m @ 0x90..=0x9f => Some(usize::from(m & 0x0f)),
            0xdc => self.len(2),
            0xdd => self.len(4),
            _ => None,
        }
    }

    /// The span of the binary string next.
    fn bin(&mut self) -> Option<Range<usize>> {
        let len = match self.byte()? {
            0xc4 => self.len(1)?,
            0xc5 => self.len(2)?,
            0xc6 => self.len(4)?,
            _ => return None,
        };
        self.span(len)
    }

    fn span(&mut self, len: usize) -> Option<Range<usize>> {
        let start = self.pos;
        let end = start.checked_add(len)?;
        if end > self.raw.len() {
            return None;
        }
        self.pos = end;
        Some(start..end)
    }

    fn str(&mut self) -> Option<&str> {
        let len = match self.byte()? {
            m @ 0xa0..=0xbf => usize::from(m & 0x1f),
            0xd9 => self.len(1)?,
            0xda => self.len(2)?,
            0xdb => self.len(4)?,
            _ => return None,
        };
        let span = self.span(len)?;
        std::str::from_utf8(self.raw.get(span)?).ok()
    }

    fn bool(&mut self) -> Option<bool> {
        match self.byte()? {
            0xc2 => Some(false),
            0xc3 => Some(true),
            _ => None,
        }
    }

    fn uint(&mut self) -> Option<u64> {
        match self.byte()? {
            m @ 0x00..=0x7f => Some(u64::from(m)),
            0xcc => self.be(1),
            0xcd => self.be(2),
            0xce => self.be(4),
            0xcf => self.be(8),
            _ => None,
        }
    }

    fn state(&mut self) -> Option<StateSpans> {
        let start = self.pos;
        if self.array_len()? != 5 {
            return None;
        }
        let path = self.bin()?;
        let records = self.array_len()?;
        let mut first = None;
        let mut more = Vec::new();
        for i in 0..records {
            let record = self.bin()?;
            if i == 0 {
                first = Some(record);
            } else {
                more.push(record);
            }
        }
        let may_be_missing = self.bool()?;
        let gen = self.uint()?;
        let child_gen = if self.nil() {
            None
        } else {
            if self.array_len()? != 2 {
                return None;
            }
            Some(ChildGeneration {
                current: self.uint()?,
                destructive_floor: self.uint()?,
            })
        };
        Some(StateSpans {
            whole: start..self.pos,
            path,
            first,
            more,
            may_be_missing,
            gen,
            child_gen,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Error, Result};
    use crate::ledger::buf;
    use crate::ledger::record::{ComponentEntry, StateEntry};

    fn state(path: &[u8], records: &[&[u8]], gen: u64, child: Option<(u64, u64)>) -> StateEntry {
        StateEntry {
            path: buf(path),
            records: records.iter().map(|r| buf(r)).collect(),
            may_be_missing: gen % 2 == 1,
            gen,
            child_gen: child.map(|(current, destructive_floor)| ChildGeneration {
                current,
                destructive_floor,
            }),
        }
    }

    /// Every state of `entry`, rebuilt from the scan of its encoding.
    fn rebuilt(raw: &[u8], states: &[StateSpans]) -> Vec<StateEntry> {
        let part = |r: &Range<usize>| buf(raw.get(r.clone()).unwrap_or_default());
        states
            .iter()
            .map(|s| StateEntry {
                path: part(&s.path),
                records: s.first.iter().chain(&s.more).map(part).collect(),
                may_be_missing: s.may_be_missing,
                gen: s.gen,
                child_gen: s.child_gen,
            })
            .collect()
    }

    #[test]
    fn a_scanned_entry_has_the_states_and_failure_serde_encoded() -> Result<()> {
        let long_path = vec![7u8; 70_000];
        let long_failure = "x".repeat(300);
        let mut states = vec![
            state(b"a", &[b"r1"], 0, None),
            state(b"b", &[], 1, Some((3, 2))),
            state(b"c", &[b"r1", b"r2", b"r3"], 200, None),
            state(
                &long_path,
                &[&[1u8; 300]],
                u64::MAX,
                Some((u64::MAX, 70_000)),
            ),
        ];
        // More than 15 and more than 65 535 states: every array length form.
        for i in 0..70_000u32 {
            states.push(state(&i.to_be_bytes(), &[b"r"], u64::from(i), None));
        }
        for (states, failure) in [
            (states.clone(), None),
            (states[..3].to_vec(), Some("it broke".to_string())),
            (Vec::new(), Some(long_failure)),
        ] {
            let entry = ComponentEntry { states, failure };
            let raw = rmp_serde::to_vec(&entry)?;
            let (spans, failure) =
                scan_entry(&raw).ok_or_else(|| Error::msg("the scan gave up"))?;
            assert_eq!(failure, entry.failure);
            let back = rebuilt(&raw, &spans);
            assert_eq!(back.len(), entry.states.len());
            for (s, e) in spans.iter().zip(&entry.states) {
                assert_eq!(
                    raw.get(s.whole.clone()),
                    Some(rmp_serde::to_vec(e)?.as_slice())
                );
            }
            for (b, e) in back.iter().zip(&entry.states) {
                assert_eq!(
                    (&b.path, &b.records, b.may_be_missing, b.gen, b.child_gen),
                    (&e.path, &e.records, e.may_be_missing, e.gen, e.child_gen)
                );
            }
        }
        Ok(())
    }

    #[test]
    fn a_delta_scans_as_serde_encodes_it_and_not_when_cut_short() -> Result<()> {
        let states = vec![
            state(b"a", &[b"r1"], 0, None),
            state(b"b", &[b"r2", b"r3"], 3, Some((1, 0))),
        ];
        let removed = vec![buf(b"x"), buf(&[9u8; 300])];
        let raw = rmp_serde::to_vec(&(&states, Some("it broke"), &removed))?;
        let (spans, failure, gone) =
            scan_delta(&raw).ok_or_else(|| Error::msg("the scan gave up"))?;
        assert_eq!(rebuilt(&raw, &spans), states);
        assert_eq!(failure.as_deref(), Some("it broke"));
        let gone: Vec<&[u8]> = gone.iter().filter_map(|r| raw.get(r.clone())).collect();
        let removed: Vec<&[u8]> = removed.iter().map(|r| r.as_slice()).collect();
        assert_eq!(gone, removed);
        for cut in 0..raw.len() {
            assert_eq!(
                scan_delta(raw.get(..cut).unwrap_or_default()),
                None,
                "{cut}"
            );
        }
        // An entry is not a delta, nor a delta an entry.
        assert_eq!(
            scan_delta(&rmp_serde::to_vec(&ComponentEntry::default())?),
            None
        );
        assert_eq!(scan_entry(&raw), None);
        Ok(())
    }

    #[test]
    fn a_scan_gives_up_on_anything_cut_short_or_unexpected() -> Result<()> {
        let entry = ComponentEntry {
            states: vec![state(b"a", &[b"r1"], 4, Some((1, 0)))],
            failure: Some("f".into()),
        };
        let raw = rmp_serde::to_vec(&entry)?;
        for cut in 0..raw.len() {
            assert_eq!(
                scan_entry(raw.get(..cut).unwrap_or_default()),
                None,
                "{cut}"
            );
        }
        let mut longer = raw.clone();
        longer.push(0xc0);
        assert_eq!(scan_entry(&longer), None);
        // An entry encoded with field names (a map) is left to serde.
        let named = rmp_serde::to_vec_named(&entry)?;
        assert_eq!(scan_entry(&named), None);
        Ok(())
    }
}
