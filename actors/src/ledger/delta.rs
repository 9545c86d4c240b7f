//! Deltas: the changes to a large component entry, stored beside it.
//!
//! A component's states live in one value, read and written whole. For a
//! large component changed a little in each run, writing that value again
//! is most of a commit: 100k states are about 8 MB, rewritten for 1 000
//! changed rows. So a commit to an entry whose own value is at least
//! [`MIN_OWN`] bytes writes a *delta* under a key of its own instead, and
//! leaves the value as it is: the states added or replaced since the value
//! was written, the component's failure, and the paths removed from the
//! value. Each commit writes the whole delta again, with all changes since
//! the value was written; once it would be more than a [`MAX_SHARE`]th of
//! the value, the commit writes the merged entry as the value again and
//! deletes the delta. Readers merge the delta in
//! ([`StoredEntry::parse`](super::stored::StoredEntry::parse)). Whatever a
//! commit writes of a value and its delta, it writes in one sled batch (or
//! transaction), under the lock that readers of entries take.
//!
//! A delta is MessagePack, as `rmp_serde` would write
//! `(Vec<StateEntry>, Option<String>, Vec<ByteBuf>)`: `[states, failure,
//! [removed path, ...]]`, its states sorted by path.

use std::ops::Range;

use rustc_hash::FxHashMap;

use super::record::StateEntry;
use super::scan::{write_array_len, StateSpans};
use super::stored::{DeltaBase, EntryBytes};
use super::Ledger;
use crate::error::Result;

/// The smallest own value that takes deltas: smaller entries are written
/// whole, which costs little.
pub(crate) const MIN_OWN: usize = 64 * 1024;
/// A delta is kept while it is at most this fraction (1/n) of the value.
pub(crate) const MAX_SHARE: usize = 8;

/// A part of an encoded list of states: states copied as stored, or a new
/// one.
enum Piece<'a> {
    /// Stored states lying next to each other, copied as one run.
    Stored(Range<usize>),
    /// A state encoded anew.
    New(&'a StateEntry),
}

/// States, sorted by path, as pieces to encode.
pub(crate) struct Pieces<'a> {
    pieces: Vec<Piece<'a>>,
    /// How many states they hold.
    pub states: usize,
}

impl<'a> Pieces<'a> {
    /// `stored` (sorted by path, spans in `bytes`) edited by `upserts` (the
    /// standing ones, sorted by path) and `removes`: each state left alone
    /// copied as stored, those next to each other in one run.
    pub(crate) fn merge(
        stored: &[StateSpans],
        bytes: EntryBytes<'_>,
        upserts: &'a [StateEntry],
        removes: &FxHashMap<Vec<u8>, u64>,
    ) -> Pieces<'a> {
        let mut pieces: Vec<Piece<'a>> = Vec::with_capacity(2 * upserts.len() + 1);
        let mut states = 0;
        let mut new = upserts.iter().peekable();
        for s in stored {
            let path = s.path(bytes);
            while let Some(n) = new.next_if(|n| n.path.as_slice() < path) {
                pieces.push(Piece::New(n));
                states += 1;
            }
            if new.peek().is_some_and(|n| n.path.as_slice() == path)
                || (!removes.is_empty() && removes.contains_key(path))
            {
                continue;
            }
            states += 1;
            match pieces.last_mut() {
                Some(Piece::Stored(run)) if run.end == s.whole.start => run.end = s.whole.end,
                _ => pieces.push(Piece::Stored(s.whole.clone())),
            }
        }
        for n in new {
            pieces.push(Piece::New(n));
            states += 1;
        }
        Pieces { pieces, states }
    }

    /// About how many bytes they take encoded.
    fn size(&self) -> usize {
        self.pieces
            .iter()
            .map(|p| match p {
                Piece::Stored(run) => run.len(),
                Piece::New(s) => {
                    s.path.len() + s.records.iter().map(|r| r.len() + 5).sum::<usize>() + 24
                }
            })
            .sum()
    }

    /// Appends them to `out` as a MessagePack array. `ledger` names the
    /// store in the error for a span outside the stored bytes (never made
    /// by the scanner).
    pub(crate) fn write(
        &self,
        out: &mut Vec<u8>,
        bytes: EntryBytes<'_>,
        ledger: &Ledger,
    ) -> Result<()> {
        write_array_len(out, self.states);
        for piece in &self.pieces {
            match piece {
                Piece::Stored(span) => {
                    let stored = bytes.get(span.clone()).ok_or_else(|| {
                        ledger.corrupt(format!(
                            "a component entry's states at bytes {span:?} lie outside its stored bytes"
                        ))
                    })?;
                    out.extend_from_slice(stored);
                }
                Piece::New(state) => rmp_serde::encode::write(out, *state)?,
            }
        }
        Ok(())
    }
}

/// The delta that records the entry `base` starts from edited by `upserts`
/// (the standing ones,
/// sorted by path) and `removes`, with `failure`; `None` when the entry
/// should be written whole instead: its own value is small, the delta
/// would be too large a share of it, or no state might be left.
///
/// Its cost follows the size of the edit and of the delta, not of the
/// entry: it never looks through the entry's states.
pub(crate) fn encode(
    base: &DeltaBase<'_>,
    upserts: &[StateEntry],
    removes: &FxHashMap<Vec<u8>, u64>,
    failure: &Option<String>,
    ledger: &Ledger,
) -> Result<Option<Vec<u8>>> {
    let own = base.own_len;
    // Only an edit removing as many states as the entry holds can leave
    // it empty, which deletes it: write such an edit whole.
    if own < MIN_OWN || removes.len() >= base.min_states {
        return Ok(None);
    }
    let limit = own / MAX_SHARE;
    let bytes = base.bytes;
    let upserted = |p: &[u8]| {
        upserts
            .binary_search_by(|u| u.path.as_slice().cmp(p))
            .is_ok()
    };
    // Paths removed from the own value: the delta's earlier ones, unless
    // written again, and the states this edit removes (a path the entry
    // does not hold is passed over when read).
    let mut removed: Vec<&[u8]> = base
        .removed
        .iter()
        .filter_map(|r| bytes.get(r.clone()))
        .chain(removes.keys().map(Vec::as_slice))
        .filter(|p| !upserted(p))
        .collect();
    // The delta's states: its earlier ones, unless replaced or removed,
    // and the upserts.
    let pieces = Pieces::merge(base.added, bytes, upserts, removes);
    let size = pieces.size() + removed.iter().map(|p| p.len() + 5).sum::<usize>();
    if size > limit {
        return Ok(None);
    }
    removed.sort_unstable();
    removed.dedup();
    let mut out = Vec::with_capacity(size + 16);
    out.push(0x93);
    pieces.write(&mut out, bytes, ledger)?;
    rmp_serde::encode::write(&mut out, failure)?;
    write_array_len(&mut out, removed.len());
    for path in removed {
        rmp_serde::encode::write(&mut out, serde_bytes::Bytes::new(path))?;
    }
    Ok((out.len() <= limit).then_some(out))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::sync::Arc;

    use super::super::record::{ComponentEntry, Intent, LedgerOp};
    use super::super::{buf, key, P_COMPONENT, P_DELTA};
    use super::*;
    use crate::error::Error;

    const COMPONENT: &[u8] = b"big";

    /// What the component's entry should be.
    #[derive(Default)]
    struct Model {
        states: BTreeMap<Vec<u8>, StateEntry>,
        failure: Option<String>,
    }

    impl Model {
        fn entry(&self) -> ComponentEntry {
            ComponentEntry {
                states: self.states.values().cloned().collect(),
                failure: self.failure.clone(),
            }
        }
    }

    fn state(path: &[u8], record: &str) -> StateEntry {
        StateEntry {
            path: buf(path),
            records: vec![buf(record.as_bytes())],
            ..StateEntry::default()
        }
    }

    fn path(i: usize) -> Vec<u8> {
        format!("target/table/row-{i:06}").into_bytes()
    }

    fn put(s: StateEntry) -> LedgerOp {
        LedgerOp::Put {
            component: COMPONENT.to_vec(),
            entry: s,
            index_owner: false,
            container: None,
        }
    }

    fn remove(path: &[u8]) -> LedgerOp {
        LedgerOp::Remove {
            component: COMPONENT.to_vec(),
            path: path.to_vec(),
        }
    }

    /// A ledger holding `n` states of the component, written whole.
    fn large(dir: &Path, n: usize, model: &mut Model) -> Result<Ledger> {
        let ledger = Ledger::open(dir, 1 << 20)?;
        for i in 0..n {
            let s = state(&path(i), &format!("first record of row {i}"));
            model.states.insert(s.path.to_vec(), s);
        }
        ledger.apply(vec![LedgerOp::PutEntry {
            component: COMPONENT.to_vec(),
            encoded: rmp_serde::to_vec(&model.entry())?.into(),
            indexed: Vec::new(),
            containers: Vec::new(),
        }])?;
        Ok(ledger)
    }

    /// The component's own value, which is large: in the tree of large
    /// values, and not in the first.
    fn own(ledger: &Ledger) -> Result<Option<sled::IVec>> {
        let k = key(P_COMPONENT, COMPONENT);
        assert_eq!(
            ledger.tree.get(&k)?,
            None,
            "a large value in the first tree"
        );
        Ok(ledger.entries.get(&k)?)
    }

    fn delta(ledger: &Ledger) -> Result<Option<sled::IVec>> {
        Ok(ledger.tree.get(key(P_DELTA, COMPONENT))?)
    }

    fn check(ledger: &Ledger, model: &Model, when: &str) -> Result<()> {
        let read = ledger
            .component(COMPONENT)?
            .ok_or_else(|| Error::msg(format!("{when}: the entry is gone")))?;
        let want = model.entry();
        assert_eq!(read.failure, want.failure, "{when}");
        assert_eq!(read.states.len(), want.states.len(), "{when}");
        assert!(read.states == want.states, "{when}: the states differ");
        Ok(())
    }

    #[test]
    fn a_large_entry_changed_a_little_keeps_its_value_and_reads_back_through_its_delta(
    ) -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut model = Model::default();
        let ledger = large(dir.path(), 3000, &mut model)?;
        let before = own(&ledger)?;
        assert!(before.as_ref().is_some_and(|v| v.len() >= MIN_OWN));
        let mut ops = Vec::new();
        for i in (0..3000).step_by(100) {
            let s = state(&path(i), "changed");
            model.states.insert(s.path.to_vec(), s.clone());
            ops.push(put(s));
        }
        for i in (50..3000).step_by(300) {
            model.states.remove(&path(i));
            ops.push(remove(&path(i)));
        }
        let s = state(&path(5000), "new");
        model.states.insert(s.path.to_vec(), s.clone());
        ops.push(put(s));
        ledger.apply(ops)?;
        assert_eq!(own(&ledger)?, before, "the value was written again");
        let written = delta(&ledger)?.map_or(0, |d| d.len());
        assert!(
            written > 0 && written <= before.map_or(0, |v| v.len()) / MAX_SHARE,
            "a delta of {written} bytes"
        );
        // In the layout the module documents: 30 changed states and a new
        // one, and 10 removed paths.
        let raw = delta(&ledger)?.unwrap_or_default();
        let (states, failure, removed): (
            Vec<StateEntry>,
            Option<String>,
            Vec<serde_bytes::ByteBuf>,
        ) = rmp_serde::from_slice(&raw).map_err(|e| Error::msg(e.to_string()))?;
        assert_eq!((states.len(), failure, removed.len()), (31, None, 10));
        check(&ledger, &model, "after the delta")?;
        drop(ledger);
        check(&Ledger::open(dir.path(), 1 << 20)?, &model, "reopened")
    }

    #[test]
    fn random_edits_of_a_large_entry_read_back_as_made_through_deltas_folds_and_reopening(
    ) -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut model = Model::default();
        let mut ledger = large(dir.path(), 2500, &mut model)?;
        let mut rng = fastrand::Rng::with_seed(7);
        let (mut deltas, mut folds) = (0, 0);
        for round in 0..80 {
            let had = delta(&ledger)?.is_some();
            let mut ops = Vec::new();
            // Mostly small edits, now and then a large one.
            let edits = if rng.u8(..) < 20 {
                600
            } else {
                rng.usize(0..40)
            };
            for _ in 0..edits {
                let p = path(rng.usize(0..3200));
                if rng.u8(0..3) == 0 {
                    model.states.remove(&p);
                    ops.push(remove(&p));
                } else {
                    let s = state(&p, &format!("round {round}"));
                    model.states.insert(p, s.clone());
                    ops.push(put(s));
                }
            }
            if rng.u8(0..8) == 0 {
                // A crash's intent, folded as a possible record: the entry
                // is then edited as a whole.
                let p = path(rng.usize(0..3200));
                let record = buf(format!("intent {round}").as_bytes());
                let s = model.states.entry(p.clone()).or_insert_with(|| StateEntry {
                    path: buf(&p),
                    ..StateEntry::default()
                });
                if !s.records.contains(&record) {
                    s.records.push(record.clone());
                }
                s.may_be_missing = true;
                ops.push(LedgerOp::Fold(Intent {
                    component: Arc::from(COMPONENT),
                    path: Arc::from(p.as_slice()),
                    record: Some(Arc::from(record.as_slice())),
                    gen: 0,
                    child_gen: None,
                    container: None,
                }));
            }
            if rng.u8(0..10) == 0 {
                model.failure = rng.bool().then(|| format!("failed in round {round}"));
                ops.push(LedgerOp::SetFailure {
                    component: COMPONENT.to_vec(),
                    failure: model.failure.clone(),
                });
            }
            ledger.apply(ops)?;
            let has = delta(&ledger)?.is_some();
            deltas += usize::from(has);
            folds += usize::from(had && !has);
            check(&ledger, &model, &format!("round {round}"))?;
            if round % 10 == 9 {
                drop(ledger);
                ledger = Ledger::open(dir.path(), 1 << 20)?;
                check(&ledger, &model, &format!("reopened after round {round}"))?;
            }
        }
        assert!(deltas > 30 && folds > 3, "{deltas} deltas, {folds} folds");
        Ok(())
    }

    #[test]
    fn a_large_entry_emptied_leaves_no_delta_to_haunt_its_next_entry() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut model = Model::default();
        let ledger = large(dir.path(), 3000, &mut model)?;
        ledger.apply(vec![put(state(&path(1), "changed"))])?;
        assert!(delta(&ledger)?.is_some());
        let all: Vec<Vec<u8>> = model.states.keys().cloned().collect();
        ledger.apply(all.iter().map(|p| remove(p)))?;
        assert!(ledger.component(COMPONENT)?.is_none());
        assert!(delta(&ledger)?.is_none(), "the delta outlived its entry");
        assert!(
            ledger.entries.is_empty(),
            "the large value outlived its entry"
        );
        // Written again whole, as a new component is: nothing of the old
        // delta comes back.
        let again = Model {
            states: [(path(1), state(&path(1), "anew"))].into_iter().collect(),
            failure: None,
        };
        ledger.apply(vec![LedgerOp::PutEntry {
            component: COMPONENT.to_vec(),
            encoded: rmp_serde::to_vec(&again.entry())?.into(),
            indexed: Vec::new(),
            containers: Vec::new(),
        }])?;
        check(&ledger, &again, "written again")?;
        drop(ledger);
        check(&Ledger::open(dir.path(), 1 << 20)?, &again, "reopened")
    }

    #[test]
    fn a_large_value_moves_to_the_first_tree_when_it_shrinks_and_back_when_it_grows() -> Result<()>
    {
        let dir = tempfile::tempdir()?;
        let mut model = Model::default();
        let mut ledger = large(dir.path(), 3000, &mut model)?;
        let k = key(P_COMPONENT, COMPONENT);
        assert!(own(&ledger)?.is_some());
        let gone: Vec<Vec<u8>> = model.states.keys().skip(10).cloned().collect();
        for p in &gone {
            model.states.remove(p);
        }
        ledger.apply(gone.iter().map(|p| remove(p)))?;
        assert!(
            ledger.entries.get(&k)?.is_none(),
            "a small value left large"
        );
        assert!(ledger.tree.get(&k)?.is_some());
        check(&ledger, &model, "shrunk")?;
        let mut ops = Vec::new();
        for i in 0..3000 {
            let s = state(&path(i), "grown again");
            model.states.insert(s.path.to_vec(), s.clone());
            ops.push(put(s));
        }
        ledger.apply(ops)?;
        assert!(own(&ledger)?.is_some());
        check(&ledger, &model, "grown")?;
        drop(ledger);
        ledger = Ledger::open(dir.path(), 1 << 20)?;
        check(&ledger, &model, "reopened")?;
        assert_eq!(ledger.counts()?, (1, 3000));
        Ok(())
    }

    #[test]
    fn an_entry_moving_between_the_trees_is_never_read_as_missing() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut model = Model::default();
        let ledger = large(dir.path(), 1400, &mut model)?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (ledger, stop) = (ledger.clone(), std::sync::Arc::clone(&stop));
            std::thread::spawn(move || -> Result<usize> {
                let mut missing = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    missing += usize::from(ledger.stored(COMPONENT)?.is_none());
                }
                Ok(missing)
            })
        };
        // Removing 400 states and putting them back moves the value below
        // 64 KiB and above it again, written whole each time.
        let moved: Vec<Vec<u8>> = (1000..1400).map(path).collect();
        let k = key(P_COMPONENT, COMPONENT);
        for round in 0..150 {
            ledger.apply(moved.iter().map(|p| remove(p)))?;
            if round == 0 {
                assert!(ledger.entries.get(&k)?.is_none() && ledger.tree.get(&k)?.is_some());
            }
            ledger.apply(
                moved
                    .iter()
                    .map(|p| put(state(p, &format!("round {round}")))),
            )?;
        }
        assert!(own(&ledger)?.is_some());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let missing = reader
            .join()
            .map_err(|_| Error::msg("the reader panicked"))??;
        assert_eq!(missing, 0, "reads that found no entry");
        Ok(())
    }

    #[test]
    fn a_delta_that_does_not_decode_is_reported_as_corrupt() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let ledger = large(dir.path(), 3000, &mut Model::default())?;
        ledger.apply(vec![put(state(&path(1), "changed"))])?;
        ledger
            .tree
            .insert(key(P_DELTA, COMPONENT), &b"\x93 not a delta"[..])?;
        match ledger.component(COMPONENT) {
            Err(Error::LedgerCorrupt { detail, .. }) => {
                assert!(detail.contains("delta"), "{detail}");
                Ok(())
            }
            other => Err(Error::msg(format!("expected corruption, got {other:?}"))),
        }
    }
}
