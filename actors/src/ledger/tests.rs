//! The ledger's unit tests: entry edits, commits, intents and recovery.

use super::edit::{Encoded, EntryEdit};
use super::record::{ComponentEntry, Intent, LedgerOp, StateEntry};
use super::stored::StoredEntry;
use super::*;
use crate::error::{Error, Result};
use crate::model::provider::ChildGeneration;
use std::path::Path;

fn state(path: &str, record: &str) -> StateEntry {
    StateEntry {
        path: buf(path.as_bytes()),
        records: vec![buf(record.as_bytes())],
        ..StateEntry::default()
    }
}

fn paths(e: &ComponentEntry) -> Vec<String> {
    e.states
        .iter()
        .map(|s| String::from_utf8_lossy(&s.path).into_owned())
        .collect()
}

#[test]
fn entry_edits_merge_upserts_and_removals_in_order() {
    let base = ComponentEntry {
        states: vec![state("b", "1"), state("d", "1"), state("f", "1")],
        failure: None,
    };
    let mut edit = EntryEdit::new(base);
    edit.upsert(state("a", "2"));
    edit.upsert(state("d", "2"));
    edit.remove(b"f");
    edit.upsert(state("g", "2"));
    edit.remove(b"g");
    edit.remove(b"b");
    edit.upsert(state("b", "3"));
    edit.apply_edits();
    assert_eq!(paths(&edit.base), vec!["a", "b", "d"]);
    let d = &edit.base.states[2];
    assert_eq!(d.records, vec![buf(b"2")]);
    assert_eq!(edit.base.states[1].records, vec![buf(b"3")]);
}

/// An edited entry's whole encoding (`None`: empty).
type Whole = Option<Vec<u8>>;

/// The edit of `base` as if read from the store.
fn as_stored(ledger: &Ledger, base: &ComponentEntry) -> Result<EntryEdit> {
    let stored = StoredEntry::parse(ledger, sled::IVec::from(encode(base)?), None)?;
    Ok(EntryEdit::read(stored, true))
}

/// The whole encoding of an edited entry.
fn whole(ledger: &Ledger, edit: &mut EntryEdit) -> Result<Whole> {
    match edit.encoded(ledger, false)? {
        Encoded::Whole(v) => Ok(Some(v)),
        Encoded::Empty => Ok(None),
        Encoded::Delta(_) => Err(Error::msg("a delta where none may be written")),
    }
}

/// The same edits on an entry kept as stored and on one decoded.
fn edit_both(
    ledger: &Ledger,
    base: &ComponentEntry,
    edits: impl Fn(&mut EntryEdit),
) -> Result<(Whole, Whole)> {
    let mut stored = as_stored(ledger, base)?;
    assert!(stored.stored.is_some(), "an entry weir wrote scans");
    let mut owned = EntryEdit::new(base.clone());
    edits(&mut stored);
    edits(&mut owned);
    Ok((whole(ledger, &mut stored)?, whole(ledger, &mut owned)?))
}

#[test]
fn an_entry_edited_as_stored_encodes_to_the_bytes_of_the_decoded_one() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    let mut container = state("c", "1");
    container.child_gen = Some(ChildGeneration {
        current: 3,
        destructive_floor: 1,
    });
    container.records.push(buf(b"old"));
    container.may_be_missing = true;
    let mut states = vec![state("a", "1"), state("b", "1"), container, state("d", "1")];
    // Enough states for a 16-bit array length.
    states.extend((0..40).map(|i| state(&format!("m{i:03}"), "1")));
    for failure in [None, Some("it broke".to_string())] {
        let base = ComponentEntry {
            states: states.clone(),
            failure: failure.clone(),
        };
        let (stored, owned) = edit_both(&ledger, &base, |e| {
            e.upsert(state("b", "2"));
            e.upsert(state("bb", "2"));
            e.remove(b"d");
            e.upsert(state("e", "2"));
            e.remove(b"e");
            e.remove(b"a");
            e.upsert(state("a", "3"));
            e.upsert(state("z", "1"));
            e.upsert(state("z", "2"));
            e.remove(b"m005");
        })?;
        assert!(stored.is_some());
        assert_eq!(stored, owned);
        // Untouched, and with every state removed.
        let (stored, owned) = edit_both(&ledger, &base, |_| {})?;
        assert_eq!(stored, owned);
        assert_eq!(stored, Some(encode(&base)?));
        let (stored, owned) = edit_both(&ledger, &base, |e| {
            for s in &states {
                e.remove(&s.path);
            }
        })?;
        assert_eq!(stored, owned);
        assert_eq!(stored.is_none(), failure.is_none());
    }
    Ok(())
}

#[test]
fn a_stored_state_outside_its_entrys_bytes_is_refused_as_corrupt_not_dropped() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    let base = ComponentEntry {
        states: vec![state("a", "1"), state("b", "1")],
        failure: None,
    };
    let mut edit = as_stored(&ledger, &base)?;
    let Some(last) = edit.stored.as_mut().and_then(|s| s.states.last_mut()) else {
        return Err(Error::msg("the entry did not scan"));
    };
    last.whole = last.whole.start..last.whole.end + 100;
    edit.upsert(state("c", "1"));
    match whole(&ledger, &mut edit) {
        Err(Error::LedgerCorrupt { detail, .. }) => {
            assert!(detail.contains("outside"), "{detail}");
            Ok(())
        }
        other => Err(Error::msg(format!(
            "expected a corrupt ledger, got {other:?}"
        ))),
    }
}

fn fresh(component: &str, path: &str) -> LedgerOp {
    fresh_below(component, None, path)
}

/// A new component `component` with one state `path`, below `container`
/// if given, given whole.
fn fresh_below(component: &str, container: Option<&str>, path: &str) -> LedgerOp {
    let entry = ComponentEntry {
        states: vec![state(path, "r")],
        failure: None,
    };
    LedgerOp::PutEntry {
        component: component.as_bytes().to_vec(),
        encoded: rmp_serde::to_vec(&entry).unwrap_or_default().into(),
        indexed: vec![keycode::stable_hash(path.as_bytes())],
        containers: container
            .map(|c| c.as_bytes().to_vec())
            .into_iter()
            .collect(),
    }
}

/// New components `c0`, `c1`, ... each with one state `p0`, `p1`, ...
fn fresh_components(n: usize) -> Vec<LedgerOp> {
    (0..n)
        .map(|i| fresh(&format!("c{i}"), &format!("p{i}")))
        .collect()
}

/// The components of [`fresh_components`] written again, record `r2`.
fn rewritten_components(n: usize) -> Vec<LedgerOp> {
    (0..n)
        .map(|i| rewrite(&format!("c{i}"), &format!("p{i}"), "r2"))
        .collect()
}

fn has(ledger: &Ledger, component: &str) -> bool {
    ledger
        .component(component.as_bytes())
        .ok()
        .flatten()
        .is_some_and(|e| !e.states.is_empty())
}

fn remove(component: &str, path: &str) -> LedgerOp {
    LedgerOp::Remove {
        component: component.as_bytes().to_vec(),
        path: path.as_bytes().to_vec(),
    }
}

fn recovered(component: &str, path: &str, record: Option<&str>) -> LedgerOp {
    LedgerOp::Recover(intent(component, path, record))
}

fn intent(component: &str, path: &str, record: Option<&str>) -> Intent {
    Intent {
        component: Arc::from(component.as_bytes()),
        path: Arc::from(path.as_bytes()),
        record: record.map(|r| Arc::from(r.as_bytes())),
        gen: 0,
        child_gen: None,
        container: None,
    }
}

/// The ledger in `dir` opened again after `first` ran on it, then was
/// dropped without any other clean-up.
fn reopened(dir: &Path, first: impl FnOnce(&Ledger) -> Result<()>) -> Result<Ledger> {
    first(&Ledger::open(dir, 1 << 20)?)?;
    Ledger::open(dir, 1 << 20)
}

/// The length of the intent journal in `dir`.
fn journal_len(dir: &Path) -> Result<u64> {
    Ok(std::fs::metadata(dir.join(journal::JOURNAL_FILE))?.len())
}

fn state_of(ledger: &Ledger, component: &str, path: &str) -> Option<StateEntry> {
    ledger
        .component(component.as_bytes())
        .ok()
        .flatten()
        .and_then(|e| {
            e.states
                .into_iter()
                .find(|s| s.path.as_slice() == path.as_bytes())
        })
}

#[test]
fn an_intent_whose_commit_landed_is_not_folded_back() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    // Committed: c holds p with record r; q was deleted.
    ledger.apply(vec![fresh("c", "p")])?;
    ledger.apply(vec![
        recovered("c", "p", Some("r")),
        recovered("c", "q", None),
    ])?;
    let p = state_of(&ledger, "c", "p");
    assert!(p.as_ref().is_some_and(|s| !s.may_be_missing), "{p:?}");
    assert!(
        state_of(&ledger, "c", "q").is_none(),
        "no phantom for a committed delete"
    );
    Ok(())
}

#[test]
fn intents_left_in_the_journal_by_a_crash_are_folded_when_the_ledger_opens() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // Dropped without deleting its intents: as after a crash.
    let ledger = reopened(dir.path(), |ledger| {
        ledger.put_intents(1, &[intent("c", "p", Some("r"))])?;
        ledger.sync_intents()
    })?;
    let p = state_of(&ledger, "c", "p");
    assert!(
        p.as_ref()
            .is_some_and(|s| s.may_be_missing && s.records == vec![buf(b"r")]),
        "{p:?}"
    );
    assert_eq!(journal_len(dir.path())?, 0, "emptied once folded");
    Ok(())
}

#[test]
fn intents_an_earlier_build_kept_in_the_store_are_folded_and_deleted() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = reopened(dir.path(), |ledger| {
        let batch = vec![intent("c", "p", Some("r"))];
        ledger
            .tree
            .insert(key(P_INTENT, &7u64.to_be_bytes()), encode(&batch)?)?;
        ledger.tree.flush()?;
        Ok(())
    })?;
    assert!(state_of(&ledger, "c", "p").is_some_and(|s| s.may_be_missing));
    assert_eq!(ledger.tree.scan_prefix([P_INTENT]).count(), 0);
    Ok(())
}

#[test]
fn a_runs_intents_are_forgotten_only_at_the_flush_after_their_deletion() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    ledger.put_intents(1, &[intent("c", "p", Some("r"))])?;
    ledger.sync_intents()?;
    assert!(journal_len(dir.path())? > 0);
    ledger.apply(vec![LedgerOp::DeleteIntents { id: 1 }])?;
    assert!(
        journal_len(dir.path())? > 0,
        "kept until the deleting commit is durable"
    );
    ledger.flush()?;
    assert_eq!(journal_len(dir.path())?, 0);
    Ok(())
}

fn set_memo(component: &str, memo: &str) -> LedgerOp {
    LedgerOp::SetMemo {
        component: component.as_bytes().to_vec(),
        memo: Some(memo.as_bytes().to_vec()),
    }
}

fn forget_memo(component: &str) -> LedgerOp {
    LedgerOp::SetMemo {
        component: component.as_bytes().to_vec(),
        memo: None,
    }
}

#[test]
fn a_memo_key_is_forgotten_by_a_later_commit_without_one_also_after_reopening() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = reopened(dir.path(), |ledger| {
        ledger.apply(vec![fresh("a", "p"), fresh("b", "q"), set_memo("a", "m1")])?;
        ledger.apply(vec![set_memo("b", "m2")])?;
        ledger.apply(vec![forget_memo("b")])?;
        assert!(ledger.memo(b"b")?.is_none(), "b's memo key is forgotten");
        ledger.flush()
    })?;
    assert!(ledger.memo(b"a")?.is_some());
    ledger.apply(vec![forget_memo("a")])?;
    assert!(
        ledger.memo(b"a")?.is_none(),
        "a memo key found when the ledger opened is forgotten"
    );
    Ok(())
}

/// How many keys the ledger's first tree holds under `prefix`.
fn keys_under(ledger: &Ledger, prefix: u8) -> usize {
    ledger.tree.scan_prefix([prefix]).count()
}

fn memo_of(ledger: &Ledger, component: &str) -> Result<Option<Vec<u8>>> {
    Ok(ledger.memo(component.as_bytes())?.map(|m| m.to_vec()))
}

#[test]
fn memo_keys_committed_together_share_one_pack_and_read_back_also_after_reopening() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = reopened(dir.path(), |ledger| {
        ledger.apply((0..50).map(|i| set_memo(&format!("c{i:02}"), &format!("m{i}"))))?;
        assert_eq!(keys_under(ledger, memo::P_MEMO_PACK), 1);
        assert_eq!(memo_of(ledger, "c07")?, Some(b"m7".to_vec()));
        ledger.flush()
    })?;
    for i in 0..50 {
        assert_eq!(
            memo_of(&ledger, &format!("c{i:02}"))?,
            Some(format!("m{i}").into_bytes())
        );
    }
    assert_eq!(memo_of(&ledger, "c50")?, None);
    Ok(())
}

#[test]
fn a_memo_key_written_again_moves_to_the_new_pack_and_the_emptied_pack_is_deleted() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = reopened(dir.path(), |ledger| {
        ledger.apply(vec![set_memo("a", "1"), set_memo("b", "1")])?;
        ledger.apply(vec![set_memo("a", "2")])?;
        assert_eq!(
            keys_under(ledger, memo::P_MEMO_PACK),
            2,
            "b keeps the first"
        );
        ledger.apply(vec![set_memo("b", "2")])?;
        assert_eq!(
            keys_under(ledger, memo::P_MEMO_PACK),
            2,
            "the first is gone"
        );
        ledger.flush()
    })?;
    assert_eq!(memo_of(&ledger, "a")?, Some(b"2".to_vec()));
    assert_eq!(memo_of(&ledger, "b")?, Some(b"2".to_vec()));
    Ok(())
}

#[test]
fn a_memo_key_forgotten_from_a_pack_others_still_hold_stays_forgotten_after_reopening() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let ledger = reopened(dir.path(), |ledger| {
        ledger.apply(vec![
            set_memo("a", "1"),
            set_memo("b", "1"),
            set_memo("c", "1"),
        ])?;
        ledger.apply(vec![forget_memo("b")])?;
        assert_eq!(keys_under(ledger, memo::P_MEMO_GONE), 1, "b's tombstone");
        ledger.flush()
    })?;
    assert_eq!(memo_of(&ledger, "b")?, None, "the pack's copy stays hidden");
    assert_eq!(memo_of(&ledger, "a")?, Some(b"1".to_vec()));
    ledger.apply(vec![set_memo("b", "2")])?;
    ledger.flush()?;
    drop(ledger);
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    assert_eq!(memo_of(&ledger, "b")?, Some(b"2".to_vec()), "newer than it");
    Ok(())
}

#[test]
fn a_memo_key_forgotten_with_the_pack_it_moved_to_stays_forgotten_though_an_older_pack_holds_it(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = reopened(dir.path(), |ledger| {
        ledger.apply(vec![set_memo("a", "1"), set_memo("b", "1")])?;
        // a moves to a pack of its own; the first keeps b, and a copy of a.
        ledger.apply(vec![set_memo("a", "2")])?;
        ledger.apply(vec![forget_memo("a")])?;
        assert_eq!(keys_under(ledger, memo::P_MEMO_PACK), 1, "a's pack emptied");
        ledger.flush()
    })?;
    assert_eq!(
        memo_of(&ledger, "a")?,
        None,
        "the first pack's copy is stale"
    );
    assert_eq!(memo_of(&ledger, "b")?, Some(b"1".to_vec()));
    Ok(())
}

#[test]
fn a_memo_key_forgotten_then_written_again_after_the_ledger_reopened_twice_is_read_back(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = reopened(dir.path(), |ledger| {
        ledger.apply(vec![set_memo("a", "1"), set_memo("b", "1")])?;
        ledger.apply(vec![forget_memo("a")])?;
        ledger.flush()
    })?;
    drop(ledger);
    let ledger = reopened(dir.path(), |ledger| {
        assert_eq!(memo_of(ledger, "a")?, None);
        ledger.apply(vec![set_memo("a", "2")])?;
        ledger.flush()
    })?;
    assert_eq!(memo_of(&ledger, "a")?, Some(b"2".to_vec()));
    assert_eq!(memo_of(&ledger, "b")?, Some(b"1".to_vec()));
    Ok(())
}

#[test]
fn a_tombstone_is_collected_once_only_packs_newer_than_it_hold_its_component() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = reopened(dir.path(), |ledger| {
        ledger.apply(vec![set_memo("a", "1"), set_memo("b", "1")])?;
        ledger.apply(vec![forget_memo("a")])?;
        ledger.apply(vec![set_memo("a", "2")])?;
        ledger.flush()
    })?;
    assert_eq!(
        keys_under(&ledger, memo::P_MEMO_GONE),
        1,
        "the first pack holds a"
    );
    // b leaves the first pack, which goes: only a newer pack holds a.
    ledger.apply(vec![set_memo("b", "2")])?;
    ledger.flush()?;
    drop(ledger);
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    assert_eq!(keys_under(&ledger, memo::P_MEMO_GONE), 0);
    assert_eq!(memo_of(&ledger, "a")?, Some(b"2".to_vec()));
    assert_eq!(memo_of(&ledger, "b")?, Some(b"2".to_vec()));
    Ok(())
}

#[test]
fn tombstones_of_memo_keys_that_hide_nothing_are_collected_when_the_ledger_opens() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = reopened(dir.path(), |ledger| {
        ledger.apply(vec![set_memo("a", "1"), set_memo("b", "1")])?;
        ledger.apply(vec![forget_memo("a")])?;
        ledger.apply(vec![forget_memo("b")])?;
        assert_eq!(keys_under(ledger, memo::P_MEMO_PACK), 0, "emptied, deleted");
        assert_eq!(keys_under(ledger, memo::P_MEMO_GONE), 2, "now useless");
        ledger.flush()
    })?;
    assert_eq!(keys_under(&ledger, memo::P_MEMO_GONE), 0);
    assert_eq!(memo_of(&ledger, "a")?, None);
    Ok(())
}

#[test]
fn memo_keys_of_an_earlier_format_move_into_packs_when_the_ledger_opens() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = reopened(dir.path(), |ledger| {
        // As a format 3 ledger held them: a key of its own each, more than
        // one pack's worth.
        for i in 0..5000 {
            ledger.tree.insert(
                key(P_MEMO, format!("c{i:04}").as_bytes()),
                format!("m{i}").as_bytes(),
            )?;
        }
        ledger.flush()
    })?;
    assert_eq!(keys_under(&ledger, P_MEMO), 0);
    assert_eq!(keys_under(&ledger, memo::P_MEMO_PACK), 2);
    for i in [0, 4095, 4096, 4999] {
        assert_eq!(
            memo_of(&ledger, &format!("c{i:04}"))?,
            Some(format!("m{i}").into_bytes())
        );
    }
    ledger.apply(vec![forget_memo("c4096")])?;
    assert_eq!(memo_of(&ledger, "c4096")?, None);
    Ok(())
}

#[test]
fn memo_keys_of_an_earlier_format_join_packs_already_written_without_taking_their_ids() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let ledger = reopened(dir.path(), |ledger| {
        ledger.apply(vec![set_memo("a", "packed")])?;
        // As an opening cut short while it moved memo keys would leave it.
        ledger
            .tree
            .insert(key(P_MEMO, b"b"), b"legacy".as_slice())?;
        ledger.flush()
    })?;
    assert_eq!(keys_under(&ledger, P_MEMO), 0);
    assert_eq!(keys_under(&ledger, memo::P_MEMO_PACK), 2);
    assert_eq!(memo_of(&ledger, "a")?, Some(b"packed".to_vec()));
    assert_eq!(memo_of(&ledger, "b")?, Some(b"legacy".to_vec()));
    Ok(())
}

#[test]
fn a_folded_intent_forgets_the_memo_of_its_component_and_a_committed_one_keeps_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    ledger.apply(vec![
        fresh("a", "p"),
        fresh("b", "q"),
        set_memo("a", "m1"),
        set_memo("b", "m2"),
    ])?;
    ledger.apply(vec![
        recovered("a", "p", Some("r")),
        recovered("b", "q", Some("changed")),
    ])?;
    assert!(ledger.memo(b"a")?.is_some(), "a's intent had committed");
    assert!(ledger.memo(b"b")?.is_none(), "b may differ from its memo");
    // A failure forgets the memo too.
    ledger.apply(vec![LedgerOp::SetFailure {
        component: b"a".to_vec(),
        failure: Some("boom".into()),
    }])?;
    assert!(ledger.memo(b"a")?.is_none());
    Ok(())
}

#[test]
fn an_intent_for_a_state_that_moved_and_committed_in_its_new_owner_is_not_folded_back() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    // p moved from a to b, and b's commit landed (p committed as "r").
    ledger.apply(vec![fresh("b", "p")])?;
    ledger.apply(vec![recovered("a", "p", Some("r"))])?;
    assert!(
        state_of(&ledger, "a", "p").is_none(),
        "a does not get p back"
    );
    let p = state_of(&ledger, "b", "p");
    assert!(p.as_ref().is_some_and(|s| !s.may_be_missing), "{p:?}");
    Ok(())
}

#[test]
fn an_intent_whose_commit_did_not_land_is_folded_as_a_possible_record() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    ledger.apply(vec![fresh("c", "p")])?;
    // An update to r2, a delete of p's sibling that exists, a create.
    ledger.apply(vec![
        recovered("c", "p", Some("r2")),
        recovered("c", "new", Some("n")),
    ])?;
    let p = state_of(&ledger, "c", "p").ok_or_else(|| Error::msg("p is kept"))?;
    assert!(p.may_be_missing);
    assert_eq!(p.records.len(), 2);
    let created = state_of(&ledger, "c", "new")
        .ok_or_else(|| Error::msg("the attempted create is tracked"))?;
    assert!(created.may_be_missing);
    ledger.apply(vec![recovered("c", "p", None)])?;
    let p = state_of(&ledger, "c", "p")
        .ok_or_else(|| Error::msg("an attempted delete keeps the state"))?;
    assert!(p.may_be_missing);
    Ok(())
}

/// Opens a ledger in `dir`, commits `n` batches, flushes and closes it.
fn commit_batches(dir: &Path, n: usize) -> Result<()> {
    let ledger = Ledger::open(dir, 1 << 20)?;
    for i in 0..n {
        ledger.apply(vec![fresh(&format!("c{i}"), &format!("p{i}"))])?;
        ledger.flush()?;
    }
    Ok(())
}

fn refusal(dir: &Path) -> String {
    match Ledger::open(dir, 1 << 20) {
        Ok(_) => "opened".to_string(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn every_commit_is_counted_and_a_reopened_ledger_keeps_counting() -> Result<()> {
    let dir = tempfile::tempdir()?;
    commit_batches(dir.path(), 3)?;
    assert_eq!(
        std::fs::read_to_string(dir.path().join(SEQ_FILE))?.trim(),
        "3"
    );
    commit_batches(dir.path(), 2)?;
    assert_eq!(
        std::fs::read_to_string(dir.path().join(SEQ_FILE))?.trim(),
        "5"
    );
    Ok(())
}

#[test]
fn a_store_that_lost_flushed_commits_is_refused_as_corrupt() -> Result<()> {
    let dir = tempfile::tempdir()?;
    commit_batches(dir.path(), 3)?;
    // As if the store had rolled back to an earlier state.
    std::fs::write(dir.path().join(SEQ_FILE), "9\n")?;
    let err = refusal(dir.path());
    assert!(
        err.contains("is corrupt") && err.contains("lost writes"),
        "{err}"
    );
    Ok(())
}

#[test]
fn an_empty_store_of_a_ledger_that_was_written_is_refused_as_corrupt() -> Result<()> {
    let dir = tempfile::tempdir()?;
    commit_batches(dir.path(), 2)?;
    std::fs::remove_dir_all(dir.path().join("sled"))?;
    let err = refusal(dir.path());
    assert!(err.contains("is corrupt") && err.contains("empty"), "{err}");
    Ok(())
}

#[test]
fn a_ledger_without_a_commit_count_file_opens_and_gets_one() -> Result<()> {
    let dir = tempfile::tempdir()?;
    commit_batches(dir.path(), 2)?;
    // As written by a build before the count existed, or lost in a crash.
    std::fs::remove_file(dir.path().join(SEQ_FILE))?;
    commit_batches(dir.path(), 1)?;
    assert_eq!(
        std::fs::read_to_string(dir.path().join(SEQ_FILE))?.trim(),
        "3"
    );
    Ok(())
}

#[test]
fn a_ledger_of_the_format_before_deltas_opens_with_its_entries_and_is_marked_current() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let ledger = reopened(dir.path(), |ledger| {
        ledger.apply(vec![fresh("c", "p")])?;
        ledger.tree.insert(FORMAT_KEY, &1u32.to_be_bytes())?;
        ledger.flush()
    })?;
    assert!(state_of(&ledger, "c", "p").is_some());
    assert_eq!(
        ledger.tree.get(FORMAT_KEY)?.as_deref(),
        Some(&FORMAT_VERSION.to_be_bytes()[..])
    );
    Ok(())
}

#[test]
fn packed_entries_are_read_back_and_survive_reopening() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = reopened(dir.path(), |ledger| {
        ledger.apply(fresh_components(10))?;
        assert!(
            ledger.pack_of(b"c3").is_some(),
            "ten new entries are packed"
        );
        assert!(has(ledger, "c3"));
        assert_eq!(ledger.owner_candidates(b"p3").len(), 1);
        ledger.flush()
    })?;
    for i in 0..10 {
        assert!(has(&ledger, &format!("c{i}")), "c{i} after reopening");
    }
    assert_eq!(ledger.counts()?, (10, 10));
    assert_eq!(ledger.owner_candidates(b"p7").len(), 1);
    Ok(())
}

#[test]
fn a_deleted_packed_component_does_not_come_back_and_can_be_created_again() -> Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        ledger.apply(fresh_components(5))?;
        // c1 is rewritten (moves out of the pack), then deleted.
        ledger.apply(vec![LedgerOp::Put {
            component: b"c1".to_vec(),
            entry: state("p1", "r2"),
            index_owner: false,
            container: None,
        }])?;
        ledger.apply(vec![remove("c1", "p1")])?;
        // c2 is deleted straight out of the pack.
        ledger.apply(vec![remove("c2", "p2")])?;
        assert!(!has(&ledger, "c1") && !has(&ledger, "c2"));
        ledger.flush()?;
    }
    {
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        assert!(!has(&ledger, "c1"), "c1 came back from its pack");
        assert!(!has(&ledger, "c2"), "c2 came back from its pack");
        assert!(has(&ledger, "c0") && has(&ledger, "c4"));
        // c2 is created again in a newer pack.
        ledger.apply(
            ["c2", "x1", "x2", "x3"]
                .iter()
                .map(|c| fresh(c, &format!("q{c}"))),
        )?;
        assert!(has(&ledger, "c2"));
        ledger.flush()?;
    }
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    assert!(
        has(&ledger, "c2"),
        "a newer pack wins over an older tombstone"
    );
    assert!(!has(&ledger, "c1"));
    Ok(())
}

fn rewrite(component: &str, path: &str, record: &str) -> LedgerOp {
    LedgerOp::Put {
        component: component.to_string().into_bytes(),
        entry: state(path, record),
        index_owner: false,
        container: None,
    }
}

fn record_of(ledger: &Ledger, component: &str, path: &str) -> Option<Vec<u8>> {
    let s = state_of(ledger, component, path)?;
    s.records.first().map(|r| r.to_vec())
}

fn pack_count(ledger: &Ledger) -> usize {
    ledger.tree.scan_prefix([P_PACK]).count()
}

#[test]
fn components_with_values_of_their_own_are_read_back_before_and_after_reopening() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let check = |ledger: &Ledger| {
        // Too few to pack: each has a key of its own.
        assert_eq!(ledger.pack_of(b"alone"), None);
        assert_eq!(record_of(ledger, "alone", "p").as_deref(), Some(&b"r2"[..]));
        // Packed, then deleted: a tombstone of its own hides the pack.
        assert!(ledger.pack_of(b"c0").is_none() && !has(ledger, "c0"));
        assert_eq!(record_of(ledger, "c1", "p1").as_deref(), Some(&b"r"[..]));
        assert!(!has(ledger, "never"));
    };
    let ledger = reopened(dir.path(), |ledger| {
        assert!(!has(ledger, "alone"));
        ledger.apply(vec![fresh("alone", "p")])?;
        ledger.apply(vec![rewrite("alone", "p", "r2")])?;
        ledger.apply(fresh_components(4))?;
        ledger.apply(vec![remove("c0", "p0")])?;
        check(ledger);
        Ok(())
    })?;
    check(&ledger);
    Ok(())
}

#[test]
fn entries_of_many_packs_read_back_as_written_from_memory_or_from_the_store() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    let name = |round: usize, i: usize| format!("r{round}c{i}");
    // More packs than are kept in memory: the oldest are read from sled.
    let rounds = 80;
    for round in 0..rounds {
        let ops: Vec<LedgerOp> = (0..5).map(|i| fresh(&name(round, i), "p")).collect();
        ledger.apply(ops)?;
    }
    // The first round's components move to a new pack; theirs goes.
    let moved: Vec<LedgerOp> = (0..5).map(|i| rewrite(&name(0, i), "p", "r2")).collect();
    ledger.apply(moved)?;
    for round in 0..rounds {
        let want = if round == 0 { "r2" } else { "r" };
        for i in 0..5 {
            let got = record_of(&ledger, &name(round, i), "p");
            assert_eq!(got.as_deref(), Some(want.as_bytes()), "{}", name(round, i));
        }
    }
    Ok(())
}

#[test]
fn packed_components_written_again_together_move_to_a_new_pack_not_to_keys_of_their_own(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = reopened(dir.path(), |ledger| {
        ledger.apply(fresh_components(6))?;
        let first = ledger.pack_of(b"c0");
        ledger.apply(rewritten_components(5))?;
        let second = ledger.pack_of(b"c0");
        assert!(
            second.is_some() && second != first,
            "c0 moved to a new pack"
        );
        assert_eq!(ledger.pack_of(b"c5"), first, "c5 stays in its pack");
        assert!(
            ledger.tree.get(key(P_COMPONENT, b"c0"))?.is_none(),
            "c0 has no key of its own"
        );
        assert_eq!(record_of(ledger, "c0", "p0").as_deref(), Some(&b"r2"[..]));
        assert_eq!(pack_count(ledger), 2);
        ledger.flush()
    })?;
    for i in 0..5 {
        assert_eq!(
            record_of(&ledger, &format!("c{i}"), &format!("p{i}")).as_deref(),
            Some(&b"r2"[..]),
            "c{i} is read from the newer pack after reopening"
        );
    }
    assert!(has(&ledger, "c5"));
    assert_eq!(ledger.counts()?, (6, 6));
    // The older pack's only live member moves out: the pack goes.
    ledger.apply(vec![rewrite("c5", "p5", "r2")])?;
    assert_eq!(pack_count(&ledger), 1, "the older pack held only c5");
    assert_eq!(record_of(&ledger, "c5", "p5").as_deref(), Some(&b"r2"[..]));
    Ok(())
}

#[test]
fn a_reader_never_misses_a_component_while_commits_move_its_pack() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    ledger.apply(fresh_components(8))?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (ledger, stop) = (ledger.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut missed = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                missed += (0..8).filter(|i| !has(&ledger, &format!("c{i}"))).count();
            }
            missed
        })
    };
    // Each commit moves all eight to a new pack and deletes the last one.
    for _ in 0..300 {
        ledger.apply(rewritten_components(8))?;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let missed = reader
        .join()
        .map_err(|_| Error::msg("the reader panicked"))?;
    assert_eq!(missed, 0, "reads that found no entry");
    Ok(())
}

#[test]
fn a_pack_whose_members_all_moved_to_a_newer_one_is_collected_when_the_ledger_opens() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let ledger = reopened(dir.path(), |ledger| {
        ledger.apply(fresh_components(4))?;
        let first = ledger
            .pack_of(b"c0")
            .map(|id| key(P_PACK, &id.to_be_bytes()));
        let old = first
            .as_ref()
            .and_then(|k| ledger.tree.get(k).ok().flatten());
        ledger.apply(rewritten_components(4))?;
        assert_eq!(pack_count(ledger), 1, "the emptied pack is deleted");
        // As left by a build that did not delete it.
        if let (Some(k), Some(v)) = (first, old) {
            ledger.tree.insert(k, v)?;
        }
        assert_eq!(pack_count(ledger), 2);
        ledger.flush()
    })?;
    assert_eq!(pack_count(&ledger), 1, "the older pack is collected");
    assert_eq!(record_of(&ledger, "c3", "p3").as_deref(), Some(&b"r2"[..]));
    Ok(())
}

#[test]
fn packs_without_live_members_and_useless_tombstones_are_collected() -> Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        ledger.apply(fresh_components(4))?;
        ledger.apply((0..4).map(|i| remove(&format!("c{i}"), &format!("p{i}"))))?;
        ledger.flush()?;
    }
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    assert_eq!(
        ledger.tree.scan_prefix([P_PACK]).count(),
        0,
        "the empty pack is gone"
    );
    assert_eq!(
        ledger.tree.scan_prefix([P_COMPONENT]).count(),
        0,
        "tombstones that hide nothing are gone"
    );
    Ok(())
}

#[test]
fn a_ledger_reopened_while_sled_still_holds_its_lock_waits_for_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    // sled's background work can keep its lock a moment after the
    // ledger is dropped: a clone of the store does the same here.
    let lingering = ledger.tree.clone();
    drop(ledger);
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        drop(lingering);
    });
    let reopened = Ledger::open(dir.path(), 1 << 20);
    let _ = release.join();
    assert!(reopened.is_ok(), "{:?}", reopened.err());
    Ok(())
}

#[test]
fn container_keys_split_back_into_container_and_component() {
    let k = container_key(b"container\x00path", b"comp");
    assert_eq!(
        split_container_key(&k[1..]),
        Some((&b"container\x00path"[..], &b"comp"[..]))
    );
    assert_eq!(split_container_key(b"ab"), None);
}

#[test]
fn a_ledger_exists_once_opened_and_not_in_any_other_directory() -> Result<()> {
    let dir = tempfile::tempdir()?;
    assert!(!Ledger::exists(dir.path())?);
    std::fs::write(dir.path().join("user-file.txt"), "mine")?;
    assert!(!Ledger::exists(dir.path())?);
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    assert!(Ledger::exists(dir.path())?);
    drop(ledger);
    assert!(Ledger::exists(dir.path())?);
    // A ledger of a build that wrote no `weir.seq`: its format version
    // marks it.
    std::fs::remove_file(dir.path().join(SEQ_FILE))?;
    assert!(Ledger::exists(dir.path())?);
    Ok(())
}

/// The refusals of `dir` by `Ledger::exists` and `Ledger::open`.
fn refusals(dir: &Path) -> [String; 2] {
    let exists = match Ledger::exists(dir) {
        Ok(found) => format!("exists: {found}"),
        Err(e) => e.to_string(),
    };
    [exists, refusal(dir)]
}

#[test]
fn a_directory_holding_weir_lock_and_sled_that_is_not_a_ledger_is_refused_naming_it() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("weir.lock"), "")?;
    std::fs::create_dir(dir.path().join("sled"))?;
    let shown = dir.path().display().to_string();

    for err in refusals(dir.path()) {
        assert!(
            err.contains(&format!("{shown} is not a weir ledger")),
            "{err}"
        );
    }
    // Nothing was written into it.
    assert!(!dir.path().join(SEQ_FILE).exists());
    assert_eq!(std::fs::read_dir(dir.path().join("sled"))?.count(), 0);
    Ok(())
}

#[test]
fn a_sled_store_weir_did_not_write_is_refused_as_not_a_ledger_and_keeps_its_data() -> Result<()> {
    for with_data in [false, true] {
        let dir = tempfile::tempdir()?;
        {
            let theirs = sled::open(dir.path().join("sled"))?;
            if with_data {
                theirs.insert(b"theirs", b"1")?;
            }
            theirs.flush()?;
        }
        let shown = dir.path().display().to_string();

        for err in refusals(dir.path()) {
            assert!(
                err.contains(&format!("{shown} is not a weir ledger"))
                    && err.contains("no weir format version"),
                "{err}"
            );
        }
        assert!(!dir.path().join(SEQ_FILE).exists());
        assert!(!dir.path().join("weir.lock").exists());
        let theirs = sled::open(dir.path().join("sled"))?;
        assert_eq!(theirs.get(FORMAT_KEY)?, None);
        assert_eq!(theirs.get(b"theirs")?.is_some(), with_data);
    }
    Ok(())
}

#[test]
fn a_store_whose_sled_lock_is_released_a_moment_later_is_judged_by_its_content() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let theirs = sled::open(dir.path().join("sled"))?;
    theirs.flush()?;
    // sled's lock outlives a store for as long as its threads wind down:
    // here, held for a moment while the directory is looked at.
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        drop(theirs);
    });
    let judged = Ledger::exists(dir.path()).map_err(|e| e.to_string());
    release
        .join()
        .map_err(|_| Error::msg("the thread holding the store panicked"))?;
    let err = judged.err().unwrap_or_default();
    assert!(err.contains("no weir format version"), "{err}");
    Ok(())
}

#[test]
fn a_new_ledger_whose_creation_stopped_before_its_format_version_opens() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // A new ledger writes `weir.seq` first, then its store: a crash may
    // leave both, the store empty.
    std::fs::write(dir.path().join(SEQ_FILE), "0\n")?;
    drop(sled::open(dir.path().join("sled"))?);
    assert!(Ledger::exists(dir.path())?);

    commit_batches(dir.path(), 1)?;
    assert_eq!(
        std::fs::read_to_string(dir.path().join(SEQ_FILE))?.trim(),
        "1"
    );
    Ok(())
}

#[test]
fn a_commit_whose_op_fails_fails_alone_and_the_others_of_its_group_land() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    // A damaged entry: editing it fails to decode it.
    ledger
        .tree
        .insert(key(P_COMPONENT, b"damaged"), &b"\xc1\xc1\xc1"[..])?;
    ledger.layout_mut().own.insert(b"damaged".to_vec());
    let group = vec![
        vec![fresh("first", "a"), set_memo("first", "m")],
        vec![fresh("mixed", "c"), remove("damaged", "x")],
        vec![fresh("last", "b")],
    ];
    let results = crate::actors::ledger::apply_group(&ledger, group, false).0;
    assert!(results[0].is_ok(), "{results:?}");
    assert!(results[1].is_err(), "{results:?}");
    assert!(results[2].is_ok(), "{results:?}");
    assert!(has(&ledger, "first") && has(&ledger, "last"));
    assert!(
        !has(&ledger, "mixed"),
        "a failed commit lands none of its ops"
    );
    Ok(())
}

#[test]
fn a_group_of_new_entries_and_memo_keys_lands_whole_and_notes_every_component() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    let group: Vec<Vec<LedgerOp>> = (0..6)
        .map(|i| {
            let c = format!("c{i}");
            vec![fresh(&c, &format!("p{i}")), set_memo(&c, "m")]
        })
        .collect();
    let (results, touched) = crate::actors::ledger::apply_group(&ledger, group, true);
    assert_eq!(results.len(), 6);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(touched.len(), 6, "{touched:?}");
    for i in 0..6 {
        let c = format!("c{i}");
        assert!(has(&ledger, &c), "{c}");
        assert_eq!(ledger.memo(c.as_bytes())?.as_deref(), Some(&b"m"[..]));
    }
    Ok(())
}

fn add_children(component: &str, children: &[i64]) -> LedgerOp {
    LedgerOp::AddChildren {
        component: component.as_bytes().to_vec(),
        children: children.iter().map(|c| StableKey::Int(*c)).collect(),
    }
}

fn remove_child(parent: &str, child: i64) -> LedgerOp {
    let component = crate::model::keycode::component_key(&[StableKey::Int(child)]);
    LedgerOp::RemoveComponent {
        component,
        parent: Some((parent.as_bytes().to_vec(), StableKey::Int(child))),
    }
}

fn children_of(ledger: &Ledger, component: &str) -> Result<Vec<StableKey>> {
    ledger.children(component.as_bytes())
}

#[test]
fn child_lists_are_read_back_as_commits_add_and_empty_them_and_after_reopening() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = reopened(dir.path(), |ledger| {
        assert!(children_of(ledger, "p")?.is_empty());
        ledger.apply(vec![add_children("p", &[1, 2]), fresh("q", "x")])?;
        assert_eq!(
            children_of(ledger, "p")?,
            vec![StableKey::Int(1), StableKey::Int(2)]
        );
        assert!(children_of(ledger, "q")?.is_empty());
        ledger.apply(vec![remove_child("p", 1), remove_child("p", 2)])?;
        assert!(
            children_of(ledger, "p")?.is_empty(),
            "a list emptied by a commit"
        );
        ledger.apply(vec![add_children("p", &[3]), add_children("q", &[4])])?;
        ledger.flush()
    })?;
    assert_eq!(children_of(&ledger, "p")?, vec![StableKey::Int(3)]);
    assert_eq!(children_of(&ledger, "q")?, vec![StableKey::Int(4)]);
    ledger.apply(vec![remove_child("q", 4)])?;
    ledger.flush()?;
    drop(ledger);
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    assert!(children_of(&ledger, "q")?.is_empty());
    assert_eq!(children_of(&ledger, "p")?, vec![StableKey::Int(3)]);
    Ok(())
}

/// An entry of `n` states of `bytes` bytes each, given whole.
fn sized(component: &str, n: usize, bytes: usize) -> LedgerOp {
    let states: Vec<StateEntry> = (0..n)
        .map(|i| state(&format!("p{i:06}"), &"r".repeat(bytes)))
        .collect();
    let indexed = states
        .iter()
        .map(|s| keycode::stable_hash(&s.path))
        .collect();
    LedgerOp::PutEntry {
        component: component.as_bytes().to_vec(),
        encoded: rmp_serde::to_vec(&ComponentEntry {
            states,
            failure: None,
        })
        .unwrap_or_default()
        .into(),
        indexed,
        containers: Vec::new(),
    }
}

fn state_count(ledger: &Ledger, component: &str) -> Result<usize> {
    Ok(ledger
        .component(component.as_bytes())?
        .map_or(0, |e| e.states.len()))
}

#[test]
fn an_entry_moving_into_and_out_of_the_tree_of_large_values_is_read_back_there_and_after_reopening(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let large = |ledger: &Ledger| -> Result<bool> {
        Ok(ledger.entries.get(key(P_COMPONENT, b"big"))?.is_some())
    };
    let ledger = reopened(dir.path(), |ledger| {
        ledger.apply(vec![sized("big", 200, 1_000)])?;
        assert!(large(ledger)?);
        assert_eq!(state_count(ledger, "big")?, 200);
        ledger.flush()
    })?;
    assert_eq!(state_count(&ledger, "big")?, 200, "large, reopened");
    // All but one removed: a delta beside the large value.
    let removals = (1..200).map(|i| remove("big", &format!("p{i:06}")));
    ledger.apply(removals)?;
    assert_eq!(state_count(&ledger, "big")?, 1);
    ledger.flush()?;
    drop(ledger);
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    assert_eq!(state_count(&ledger, "big")?, 1, "with its delta, reopened");
    // The last removed: the value leaves the tree of large values, and
    // the component, given a small entry again, is read from the first.
    ledger.apply(vec![remove("big", "p000000")])?;
    assert!(!large(&ledger)?);
    assert_eq!(state_count(&ledger, "big")?, 0);
    ledger.apply(vec![sized("big", 3, 10)])?;
    assert!(!large(&ledger)?);
    assert_eq!(state_count(&ledger, "big")?, 3, "small again");
    ledger.apply(vec![sized("other", 100, 1_000)])?;
    ledger.flush()?;
    drop(ledger);
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    assert_eq!(state_count(&ledger, "big")?, 3, "small, reopened");
    assert_eq!(state_count(&ledger, "other")?, 100, "large, reopened");
    Ok(())
}

#[test]
fn a_memo_key_is_forgotten_whether_stored_before_or_written_earlier_in_the_same_commit(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    ledger.apply(vec![set_memo("stored", "m1")])?;
    ledger.apply(vec![
        forget_memo("stored"),
        set_memo("same", "m2"),
        forget_memo("same"),
        forget_memo("never"),
        set_memo("kept", "m3"),
    ])?;
    assert_eq!(ledger.memo(b"stored")?, None);
    assert_eq!(ledger.memo(b"same")?, None);
    assert_eq!(ledger.memo(b"never")?, None);
    assert_eq!(ledger.memo(b"kept")?.as_deref(), Some(&b"m3"[..]));
    Ok(())
}

/// The holder notes (`d` keys) in the store: (container, component).
pub(super) fn container_keys(ledger: &Ledger) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    for k in ledger.tree.scan_prefix([P_CONTAINER]).keys() {
        let k = k?;
        if let Some((container, component)) = k.get(1..).and_then(split_container_key) {
            out.push((container.to_vec(), component.to_vec()));
        }
    }
    Ok(out)
}

/// The components noted as holders of `container`.
fn holders_of(ledger: &Ledger, container: &str) -> Result<Vec<String>> {
    Ok(container_keys(ledger)?
        .into_iter()
        .filter(|(c, _)| c == container.as_bytes())
        .map(|(_, component)| String::from_utf8_lossy(&component).into_owned())
        .collect())
}

#[test]
fn new_components_given_whole_are_noted_as_holders_that_dropping_their_container_reaches(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ledger = Ledger::open(dir.path(), 1 << 20)?;
    // `b` held a state below `t` once: its note is left when its entry
    // goes, and written again when it comes back whole.
    ledger.apply(vec![fresh_below("b", Some("t"), "t/old")])?;
    ledger.apply(vec![remove("b", "t/old")])?;
    assert!(!has(&ledger, "b"));
    assert_eq!(holders_of(&ledger, "t")?, vec!["b"]);
    // Enough new components for a pack, as a group commit writes them.
    let mut ops: Vec<LedgerOp> = (0..PACK_MIN)
        .map(|i| fresh_below(&format!("c{i}"), Some("t"), &format!("t/p{i}")))
        .collect();
    ops.push(fresh_below("b", Some("t"), "t/new"));
    ledger.apply(ops)?;
    let mut expected: Vec<String> = (0..PACK_MIN).map(|i| format!("c{i}")).collect();
    expected.push("b".to_string());
    expected.sort();
    assert_eq!(holders_of(&ledger, "t")?, expected);

    ledger.apply(vec![LedgerOp::DropDescendants {
        path: b"t".to_vec(),
    }])?;
    assert!(!has(&ledger, "b"));
    assert!((0..PACK_MIN).all(|i| !has(&ledger, &format!("c{i}"))));
    assert!(holders_of(&ledger, "t")?.is_empty());
    Ok(())
}
