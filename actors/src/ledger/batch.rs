//! Applying a commit's ops to the store atomically: one sled batch, or one
//! transaction over both trees when it writes large entries too.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::collections::BTreeSet;
use std::sync::Arc;

use super::edit::{Encoded, EntryEdit};
use super::memo::{MemoChanges, MemoWrites};
use super::record::ComponentRecord;
use super::record::{ComponentEntry, Intent, LedgerOp, StateEntry};
use super::stored::{ShallowEntry, StoredEntry};
use super::{
    buf, container_key, delta, encode, key, pack, split_container_key, LayoutChanges, Ledger,
    PACK_MIN, P_CHILDREN, P_COMPONENT, P_CONTAINER, P_DELTA, P_FAILED_RUNS, P_PACK, SEQ_KEY,
};
use crate::error::{Error, Result};
use crate::model::{keycode, StableKey};

impl Ledger {
    /// Applies ops atomically (one sled batch, or one transaction when
    /// they write both trees). Does not flush.
    pub(crate) fn apply(&self, ops: impl IntoIterator<Item = LedgerOp>) -> Result<()> {
        self.apply_noting(ops, false).map(|_| ())
    }

    /// [`Ledger::apply`], returning the components whose records the ops
    /// changed (for the changelog of a worker group's partitions).
    #[allow(dead_code)] // Used by the member runtime of worker groups.
    pub(crate) fn apply_touching(
        &self,
        ops: impl IntoIterator<Item = LedgerOp>,
    ) -> Result<BTreeSet<Vec<u8>>> {
        self.apply_noting(ops, true)
    }

    fn apply_noting(
        &self,
        ops: impl IntoIterator<Item = LedgerOp>,
        note: bool,
    ) -> Result<BTreeSet<Vec<u8>>> {
        let mut b = BatchBuilder {
            note,
            touched: BTreeSet::new(),
            ledger: self,
            entries: HashMap::default(),
            index_adds: Vec::new(),
            index_removes: Vec::new(),
            forget_intents: Vec::new(),
            containers: HashMap::default(),
            children: HashMap::default(),
            child_removals: HashMap::default(),
            raw_puts: HashMap::default(),
            large: sled::Batch::default(),
            large_used: false,
            layout_changes: LayoutChanges::default(),
            memos: MemoWrites::default(),
            keys: 0,
            bytes: 0,
            batch: sled::Batch::default(),
        };
        for op in ops {
            self.forget_digests(&op);
            b.touch(&op);
            b.op(op)?;
        }
        let touched = std::mem::take(&mut b.touched);
        b.finish()?;
        Ok(touched)
    }
}

/// Paths a component comes to hold: (component, paths).
type IndexRun = (Vec<u8>, Vec<u64>);

struct BatchBuilder<'a> {
    ledger: &'a Ledger,
    /// Whether to note the components whose records the ops change.
    note: bool,
    /// The components whose records the ops change.
    touched: BTreeSet<Vec<u8>>,
    entries: HashMap<Vec<u8>, EntryEdit>,
    /// Owner index additions, applied once the batch is written: runs of
    /// paths a component comes to hold, in the order of the ops.
    index_adds: Vec<IndexRun>,
    /// Owner index removals, (path, component), applied before additions.
    index_removes: Vec<(Vec<u8>, Vec<u8>)>,
    /// Intent batches to forget once the batch is durable.
    forget_intents: Vec<u64>,
    /// `d` keys (container, component) to make sure exist, each with
    /// whether it may exist already: such a key is looked up before it is
    /// written, as rewriting one costs sled more than the lookup. The key
    /// of a component that had no entry is written at once.
    containers: HashMap<Vec<u8>, bool>,
    children: HashMap<Vec<u8>, Vec<StableKey>>,
    /// Children to drop from each parent's list, applied once at the end.
    child_removals: HashMap<Vec<u8>, HashSet<StableKey>>,
    /// Whole entries already encoded by their component, stored as given.
    raw_puts: HashMap<Vec<u8>, sled::IVec>,
    /// Keys written or removed, and bytes written, for metrics.
    keys: u64,
    bytes: u64,
    batch: sled::Batch,
    /// Writes to the tree of large values, and whether there are any.
    large: sled::Batch,
    large_used: bool,
    /// What the batch changes in the ledger's [`Layout`](super::Layout).
    layout_changes: LayoutChanges,
    /// The memo keys this batch writes and forgets.
    memos: MemoWrites,
}

impl BatchBuilder<'_> {
    /// Notes the components `op` changes (those below a dropped container
    /// are noted as they are found).
    fn touch(&mut self, op: &LedgerOp) {
        if !self.note {
            return;
        }
        if let Some(parent) = op.parent() {
            self.touched.insert(parent.to_vec());
        }
        let Some(component) = op.component() else {
            return;
        };
        if !self.touched.contains(component) {
            self.touched.insert(component.to_vec());
        }
    }

    fn edit(&mut self, component: &[u8]) -> Result<&mut EntryEdit> {
        if !self.entries.contains_key(component) {
            let edit = match self.raw_puts.remove(component) {
                Some(raw) => {
                    let given = StoredEntry::parse(self.ledger, raw, None)?;
                    EntryEdit::read(given, false)
                }
                None => match self.ledger.stored_bytes(component)? {
                    Some((own, delta)) => {
                        match ShallowEntry::read(self.ledger, own.clone(), delta.clone())? {
                            Some(shallow) => EntryEdit::read_shallow(shallow),
                            None => {
                                EntryEdit::read(StoredEntry::parse(self.ledger, own, delta)?, true)
                            }
                        }
                    }
                    None => EntryEdit::new(ComponentEntry::default()),
                },
            };
            self.entries.insert(component.to_vec(), edit);
        }
        self.entries
            .get_mut(component)
            .ok_or_else(|| Error::Shutdown("ledger entry vanished".into()))
    }

    /// Whether the component's entry already holds exactly what `intent`
    /// says, committed: the record as its only one (or, for a delete, no
    /// state at all), not possibly missing, under the same generations.
    /// Then the action was applied and its commit landed, and folding the
    /// intent would only make the next run redo it. (An intent that equals
    /// the committed state is never written for an action still to apply:
    /// such an action needs none.)
    ///
    /// The intent names the component that held the state when the action
    /// was planned; a state that moved is committed in its new owner, so the
    /// other components the owner index names are looked at too.
    fn already_committed(&mut self, intent: &Intent) -> Result<bool> {
        let mut holders: Vec<Arc<[u8]>> = vec![Arc::clone(&intent.component)];
        holders.extend(self.ledger.owner_candidates(&intent.path));
        for holder in holders {
            let entry = self.entry(&holder)?;
            let Ok(i) = entry.find(&intent.path) else {
                continue;
            };
            // Held: a delete did not land; a write landed if the state holds
            // exactly its record.
            let Some(record) = &intent.record else {
                return Ok(false);
            };
            return Ok(entry.states.get(i).is_some_and(|s| {
                !s.may_be_missing
                    && s.records.len() == 1
                    && s.records
                        .first()
                        .is_some_and(|r| r.as_slice() == &record[..])
                    && s.gen == intent.gen
                    && (intent.child_gen.is_none() || s.child_gen == intent.child_gen)
            }));
        }
        // Held by no one: a delete landed; a write did not.
        Ok(intent.record.is_none())
    }

    /// The component's entry with every recorded edit applied.
    fn entry(&mut self, component: &[u8]) -> Result<&mut ComponentEntry> {
        let ledger = self.ledger;
        let edit = self.edit(component)?;
        edit.materialize(ledger)?;
        Ok(&mut edit.base)
    }

    /// A component's child list as this batch leaves it.
    fn children_of(&mut self, component: &[u8]) -> Result<&Vec<StableKey>> {
        if !self.children.contains_key(component) {
            let list = self.ledger.children(component)?;
            self.children.insert(component.to_vec(), list);
        }
        self.children
            .get(component)
            .ok_or_else(|| Error::Shutdown("ledger child list vanished".into()))
    }

    fn put(&mut self, k: Vec<u8>, v: impl Into<sled::IVec>) {
        let v = v.into();
        self.keys += 1;
        self.bytes += (k.len() + v.len()) as u64;
        self.batch.insert(k, v);
    }

    /// Writes a component's own value: to the tree of large values when it
    /// is large (deleting its key in the first tree, which may hold a
    /// smaller value or a tombstone), else to the first tree (deleting
    /// its key in the other when `was_large`).
    fn put_own(&mut self, component: &[u8], value: impl Into<sled::IVec>, was_large: bool) {
        let k = key(P_COMPONENT, component);
        let value: sled::IVec = value.into();
        if value.len() >= delta::MIN_OWN {
            // Counted as a key written here, and one removed by `del`.
            self.keys += 1;
            self.bytes += (k.len() + value.len()) as u64;
            self.del(k.clone());
            self.large.insert(k, value);
            self.large_used = true;
            self.layout_changes.large.push((component.to_vec(), true));
            self.layout_changes.own.push((component.to_vec(), false));
        } else {
            if was_large {
                self.keys += 1;
                self.large.remove(k.clone());
                self.large_used = true;
                self.layout_changes.large.push((component.to_vec(), false));
            }
            self.keys += 1;
            self.bytes += (k.len() + value.len()) as u64;
            self.batch.insert(k, value);
            self.layout_changes.own.push((component.to_vec(), true));
        }
    }

    fn del(&mut self, k: impl Into<sled::IVec>) {
        self.keys += 1;
        self.batch.remove(k);
    }

    fn index_add(&mut self, component: &[u8], path: &[u8]) {
        let path = keycode::stable_hash(path);
        match self.index_adds.last_mut() {
            Some((last, paths)) if last.as_slice() == component => paths.push(path),
            _ => self.index_adds.push((component.to_vec(), vec![path])),
        }
    }

    fn note_container(&mut self, container: Option<&[u8]>, component: &[u8]) {
        self.note_holder(container, component, true);
    }

    /// Notes `component` as a holder of `container`; `may_exist`: whether
    /// the note may be written already.
    fn note_holder(&mut self, container: Option<&[u8]>, component: &[u8], may_exist: bool) {
        if let Some(c) = container {
            let noted = self
                .containers
                .entry(container_key(c, component))
                .or_insert(false);
            *noted |= may_exist;
        }
    }

    fn op(&mut self, op: LedgerOp) -> Result<()> {
        match op {
            LedgerOp::Put {
                component,
                entry,
                index_owner,
                container,
            } => {
                if index_owner {
                    self.index_add(&component, &entry.path);
                }
                self.note_container(container.as_deref(), &component);
                self.edit(&component)?.upsert(entry);
            }
            LedgerOp::PutEntry {
                component,
                encoded,
                indexed,
                containers,
            } => self.put_entry(component, encoded, indexed, containers)?,
            LedgerOp::Remove { component, path } => {
                self.edit(&component)?.remove(&path);
                self.index_removes.push((path, component));
            }
            LedgerOp::Recover(intent) => {
                if !self.already_committed(&intent)? {
                    self.fold(intent)?;
                }
            }
            LedgerOp::Fold(intent) => self.fold(intent)?,
            LedgerOp::DropDescendants { path } => self.drop_descendants(&path)?,
            LedgerOp::AddChildren {
                component,
                children,
            } => {
                self.children_of(&component)?;
                if let Some(list) = self.children.get_mut(&component) {
                    let known: HashSet<StableKey> = list.iter().cloned().collect();
                    list.extend(children.into_iter().filter(|k| !known.contains(k)));
                }
            }
            LedgerOp::SetFailure { component, failure } => {
                if failure.is_some() {
                    // A failed component is never memoized.
                    self.memos.forget(self.ledger, &component);
                } else {
                    self.del(key(P_FAILED_RUNS, &component));
                }
                self.edit(&component)?.base.failure = failure;
            }
            LedgerOp::CountFailedRun { component } => {
                let runs = self.ledger.failed_runs(&component)? + 1;
                self.put(key(P_FAILED_RUNS, &component), runs.to_be_bytes().to_vec());
            }
            LedgerOp::SetMemo { component, memo } => self.set_memo(&component, memo),
            LedgerOp::RemoveComponent { component, parent } => {
                self.remove_component(component, parent)?
            }
            LedgerOp::DeleteIntents { id } => self.forget_intents.push(id),
            LedgerOp::Forget { component } => self.forget(&component)?,
            LedgerOp::Restore { component, record } => self.restore(component, *record)?,
        }
        Ok(())
    }

    /// A component's whole entry, encoded by the component: kept as given,
    /// unless the batch edited the entry already (then merged into it).
    fn put_entry(
        &mut self,
        component: Vec<u8>,
        encoded: sled::IVec,
        indexed: Vec<u64>,
        containers: Vec<Vec<u8>>,
    ) -> Result<()> {
        self.index_adds.push((component.clone(), indexed));
        // A component giving its entry whole had none, so it holds no
        // container yet (a note left by an earlier entry is only written
        // again).
        for c in containers {
            self.note_holder(Some(&c), &component, false);
        }
        if self.entries.contains_key(&component) {
            // Edited earlier in this batch: merge instead.
            let entry: ComponentEntry = self.ledger.decode(&encoded, "a component entry")?;
            let edit = self.edit(&component)?;
            for s in entry.states {
                edit.upsert(s);
            }
        } else {
            self.raw_puts.insert(component, encoded);
        }
        Ok(())
    }

    /// Folds an intent into its component's entry as a possible record:
    /// the state may be missing, and keeps every record it may have.
    fn fold(&mut self, intent: Intent) -> Result<()> {
        // The component's states may now differ from what its memo key
        // stands for: it must run again.
        self.memos.forget(self.ledger, &intent.component);
        self.note_container(intent.container.as_deref(), &intent.component);
        let entry = self.entry(&intent.component)?;
        match entry.find(&intent.path) {
            Ok(i) => {
                if let Some(s) = entry.states.get_mut(i) {
                    fold_into(s, &intent);
                }
            }
            Err(i) => {
                entry.states.insert(
                    i,
                    StateEntry {
                        path: buf(&intent.path),
                        records: intent.record.iter().map(|r| buf(r)).collect(),
                        may_be_missing: true,
                        gen: intent.gen,
                        child_gen: intent.child_gen,
                    },
                );
                self.index_add(&intent.component, &intent.path);
            }
        }
        Ok(())
    }

    /// Drops the states below a container at `path`, in every component
    /// that holds some, and the container's `d` keys.
    fn drop_descendants(&mut self, path: &[u8]) -> Result<()> {
        let holders = self.holders_below(path)?;
        if self.note {
            self.touched.extend(holders.iter().cloned());
        }
        for component in holders {
            let entry = self.entry(&component)?;
            let mut gone = Vec::new();
            entry.states.retain(|s| {
                let below = keycode::is_below(&s.path, path);
                if below {
                    gone.push(s.path.to_vec());
                }
                !below
            });
            for p in gone {
                self.index_removes.push((p, component.clone()));
            }
        }
        Ok(())
    }

    /// The components holding states at or below the container at `path`
    /// (stored, or noted in this batch), sorted; their `d` keys go.
    fn holders_below(&mut self, path: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut holders: Vec<Vec<u8>> = Vec::new();
        // The container itself, or one below it (a byte prefix can also
        // be another key: see `keycode::is_below`).
        let at_or_below = |rest: &[u8]| {
            split_container_key(rest).is_some_and(|(container, _)| {
                container == path || keycode::is_below(container, path)
            })
        };
        for item in self.ledger.tree.scan_prefix(key(P_CONTAINER, path)) {
            let (k, _) = item?;
            let rest = k.get(1..).unwrap_or_default();
            if !at_or_below(rest) {
                continue;
            }
            if let Some((_, component)) = split_container_key(rest) {
                holders.push(component.to_vec());
            }
            self.del(k);
        }
        let pending: Vec<Vec<u8>> = self
            .containers
            .keys()
            .filter(|k| k.get(1..).is_some_and(at_or_below))
            .cloned()
            .collect();
        for k in pending {
            if let Some((_, component)) = k.get(1..).and_then(split_container_key) {
                holders.push(component.to_vec());
            }
            self.containers.remove(&k);
        }
        holders.sort();
        holders.dedup();
        Ok(holders)
    }

    /// Records or forgets a component's memo key.
    fn set_memo(&mut self, component: &[u8], memo: Option<Vec<u8>>) {
        match memo {
            Some(m) => self.memos.put(component, m),
            None => self.memos.forget(self.ledger, component),
        }
    }

    /// Removes a component that holds no state and has no child left:
    /// its failure, memo key, failed-run count and child list go, and it
    /// leaves its parent's child list at the end of the batch.
    fn remove_component(
        &mut self,
        component: Vec<u8>,
        parent: Option<(Vec<u8>, StableKey)>,
    ) -> Result<()> {
        let entry = self.entry(&component)?;
        if !entry.states.is_empty() {
            return Ok(());
        }
        self.children_of(&component)?;
        let pending = self.child_removals.get(&component);
        let left = self
            .children
            .get(&component)
            .is_some_and(|list| list.iter().any(|k| !pending.is_some_and(|p| p.contains(k))));
        if left {
            return Ok(());
        }
        self.edit(&component)?.base.failure = None;
        self.memos.forget(self.ledger, &component);
        self.del(key(P_FAILED_RUNS, &component));
        self.children.insert(component.clone(), Vec::new());
        self.child_removals.remove(&component);
        if let Some((parent, key)) = parent {
            self.children_of(&parent)?;
            self.child_removals.entry(parent).or_default().insert(key);
        }
        Ok(())
    }

    /// Drops every state (and its index entries), the failure, the
    /// children, the memo key and the failed-run count of a component.
    fn forget(&mut self, component: &[u8]) -> Result<()> {
        let entry = self.entry(component)?;
        let paths: Vec<Vec<u8>> = entry.states.iter().map(|s| s.path.to_vec()).collect();
        entry.failure = None;
        let edit = self.edit(component)?;
        for path in &paths {
            edit.remove(path);
        }
        for path in paths {
            self.index_removes.push((path, component.to_vec()));
        }
        self.children.insert(component.to_vec(), Vec::new());
        self.memos.forget(self.ledger, component);
        self.del(key(P_FAILED_RUNS, component));
        Ok(())
    }

    /// Replaces everything of a component with `record`.
    fn restore(&mut self, component: Vec<u8>, record: ComponentRecord) -> Result<()> {
        self.forget(&component)?;
        let containers = record.containers();
        let ComponentRecord {
            entry,
            children,
            memo,
            failed_runs,
        } = record;
        for c in &containers {
            self.note_container(Some(c), &component);
        }
        let paths: Vec<Vec<u8>> = entry.states.iter().map(|s| s.path.to_vec()).collect();
        let edit = self.edit(&component)?;
        for s in entry.states {
            edit.upsert(s);
        }
        for path in paths {
            self.index_add(&component, &path);
        }
        self.entry(&component)?.failure = entry.failure;
        self.children.insert(component.clone(), children);
        if let Some(memo) = memo {
            self.set_memo(&component, Some(memo.into_vec()));
        }
        if failed_runs > 0 {
            self.put(
                key(P_FAILED_RUNS, &component),
                failed_runs.to_be_bytes().to_vec(),
            );
        }
        Ok(())
    }

    fn finish(mut self) -> Result<()> {
        for (parent, gone) in std::mem::take(&mut self.child_removals) {
            if let Some(list) = self.children.get_mut(&parent) {
                list.retain(|k| !gone.contains(k));
            }
        }
        let unpacked = self.write_edited_entries()?;
        let new_pack = self.write_new_entries();
        self.delete_emptied_packs(&unpacked);
        self.write_child_lists()?;
        let containers = std::mem::take(&mut self.containers);
        for (k, may_exist) in containers {
            if !may_exist || !self.ledger.tree.contains_key(&k)? {
                self.put(k, Vec::new());
            }
        }
        let memos = self.write_memos();
        let seq = self.apply_to_store(&unpacked, new_pack, memos)?;
        self.ledger
            .seq
            .store(seq, std::sync::atomic::Ordering::SeqCst);
        self.update_owner_index();
        // Forgotten at the flush that makes this batch durable.
        self.ledger.journal()?.forget_later(&self.forget_intents);
        metrics::counter!(crate::metrics::LEDGER_RECORDS).increment(self.keys);
        metrics::counter!(crate::metrics::LEDGER_WRITTEN_BYTES).increment(self.bytes);
        Ok(())
    }

    /// Writes the entries of new components, given whole, and those of
    /// packed components edited by the batch: packed together when there
    /// are enough (large ones go to their own tree). Returns the new pack,
    /// with its members.
    fn write_new_entries(&mut self) -> Option<NewPack> {
        let raw: Vec<(Vec<u8>, sled::IVec)> =
            std::mem::take(&mut self.raw_puts).into_iter().collect();
        // An entry given whole replaces any delta (none is expected: only a
        // component without an entry gives its entry whole).
        let with_delta: Vec<Vec<u8>> = {
            let layout = self.ledger.layout();
            raw.iter()
                .filter(|(component, _)| layout.deltas.contains(component))
                .map(|(component, _)| component.clone())
                .collect()
        };
        for component in with_delta {
            self.del(key(P_DELTA, &component));
            self.layout_changes.deltas.push((component, false));
        }
        let (large, mut raw): (Vec<_>, Vec<_>) = raw
            .into_iter()
            .partition(|(_, v)| v.len() >= delta::MIN_OWN);
        for (component, value) in large {
            self.put_own(&component, value, false);
        }
        if raw.len() < PACK_MIN {
            for (component, value) in raw {
                self.put_own(&component, value, false);
            }
            return None;
        }
        // Each component once (the puts were keyed by it): no order of
        // equal keys to keep.
        raw.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let id = self.ledger.packs_mut().take_id();
        let bytes = sled::IVec::from(pack::encode(&raw));
        self.put(key(P_PACK, &id.to_be_bytes()), bytes.clone());
        Some(NewPack {
            id,
            members: raw.into_iter().map(|(c, _)| c).collect(),
            bytes,
        })
    }

    /// Writes the entries the batch edited: a packed one moves to the
    /// batch's new pack (written by [`Self::write_new_entries`], after
    /// this), any other gets a key of its own or a delta beside it; a
    /// deleted one leaves a tombstone, so that no pack that still holds an
    /// old copy brings it back. Returns the components that left their
    /// pack.
    fn write_edited_entries(&mut self) -> Result<Vec<Vec<u8>>> {
        let mut entries = std::mem::take(&mut self.entries);
        let next_id = self.ledger.packs().next_id;
        let mut unpacked: Vec<Vec<u8>> = Vec::new();
        for (component, edit) in entries.iter_mut() {
            let packed = self.ledger.pack_of(component).is_some();
            if packed {
                unpacked.push(component.clone());
            }
            let was_large = edit.own_len >= delta::MIN_OWN;
            let whole = match edit.encoded(self.ledger, !packed)? {
                // Repacked: a key of its own would cost a sled write each.
                Encoded::Whole(encoded) if packed && encoded.len() < delta::MIN_OWN => {
                    self.raw_puts.insert(component.clone(), encoded.into());
                    None
                }
                Encoded::Whole(encoded) => Some(encoded),
                Encoded::Empty => Some(pack::tombstone(next_id)),
                Encoded::Delta(delta) => {
                    self.put(key(P_DELTA, component), delta);
                    if !edit.had_delta {
                        self.layout_changes.deltas.push((component.clone(), true));
                    }
                    None
                }
            };
            if let Some(value) = whole {
                self.put_own(component, value, was_large);
                if edit.had_delta {
                    self.del(key(P_DELTA, component));
                    self.layout_changes.deltas.push((component.clone(), false));
                }
            }
        }
        Ok(unpacked)
    }

    /// Writes the batch's memo keys (see [`memo`](super::memo)); returns
    /// what to note in the memo index once the batch is applied.
    fn write_memos(&mut self) -> MemoChanges {
        let memos = std::mem::take(&mut self.memos);
        let ledger = self.ledger;
        memos.write(ledger, |k, v| match v {
            Some(v) => self.put(k, v),
            None => self.del(k),
        })
    }

    /// Deletes the packs that `unpacked` leaves without a live member.
    fn delete_emptied_packs(&mut self, unpacked: &[Vec<u8>]) {
        let emptied = self.ledger.packs().emptied_by(unpacked);
        for id in &emptied {
            self.del(key(P_PACK, &id.to_be_bytes()));
        }
    }

    /// Writes the child lists the batch changed (an empty one is deleted).
    fn write_child_lists(&mut self) -> Result<()> {
        let children = std::mem::take(&mut self.children);
        for (component, children) in children {
            let k = key(P_CHILDREN, &component);
            if children.is_empty() {
                self.del(k);
            } else {
                self.put(k, encode(&children)?);
            }
            self.layout_changes
                .parents
                .push((component, !children.is_empty()));
        }
        Ok(())
    }

    /// Applies the batch to the store, counted as one more commit (one
    /// transaction when it writes the tree of large values too), and notes
    /// what it changed in the ledger's layout and packs (`unpacked` left
    /// their packs, `new_pack` holds its members now) before readers of
    /// entries may go on: none finds a component in a pack the batch
    /// deleted. Returns the commit count, which moves in memory only once
    /// the batch is applied, so that `weir.seq` never leads the store.
    fn apply_to_store(
        &mut self,
        unpacked: &[Vec<u8>],
        new_pack: Option<NewPack>,
        memos: MemoChanges,
    ) -> Result<u64> {
        let seq = self.ledger.seq.load(std::sync::atomic::Ordering::SeqCst) + 1;
        self.batch.insert(SEQ_KEY, &seq.to_be_bytes());
        let ledger = self.ledger;
        // Readers of entries wait, so that none reads an entry from before
        // this batch with a delta from after it, or the reverse.
        let mut layout = ledger.layout_mut();
        // Readers of memo keys wait too, when the batch changes some: none
        // finds one in a pack the batch deleted.
        let mut memo_index = (!memos.is_empty()).then(|| ledger.memos_mut());
        let first = std::mem::take(&mut self.batch);
        if self.large_used {
            use sled::Transactional;
            let large = std::mem::take(&mut self.large);
            (&*ledger.tree, &ledger.entries)
                .transaction(|(tree, entries)| {
                    tree.apply_batch(&first)?;
                    entries.apply_batch(&large)?;
                    Ok(())
                })
                .map_err(|e: sled::transaction::TransactionError<()>| match e {
                    sled::transaction::TransactionError::Storage(e) => Error::from(e),
                    sled::transaction::TransactionError::Abort(()) => {
                        Error::msg("a ledger commit was aborted")
                    }
                })?;
        } else {
            ledger.tree.apply_batch(first)?;
        }
        layout.note(std::mem::take(&mut self.layout_changes));
        if let Some(index) = memo_index.as_mut() {
            memos.note(index);
        }
        drop(memo_index);
        self.update_packs(unpacked, new_pack);
        drop(layout);
        Ok(seq)
    }

    /// Once the batch is applied: the packs' members.
    fn update_packs(&self, unpacked: &[Vec<u8>], new_pack: Option<NewPack>) {
        let mut packs = self.ledger.packs_mut();
        for c in unpacked {
            packs.unpack(c);
        }
        if let Some(NewPack { id, members, bytes }) = new_pack {
            for c in members {
                packs.add(c, id);
            }
            packs.keep_recent(id, bytes);
        }
    }

    /// Once the batch is applied: the owner index.
    fn update_owner_index(&self) {
        let mut index = self.ledger.index_mut();
        for (path, component) in &self.index_removes {
            index.remove(path, component);
        }
        for (component, paths) in &self.index_adds {
            index.add_all(component, paths);
        }
    }
}

/// The pack a batch writes: its id, its members, and its bytes as written.
struct NewPack {
    id: u64,
    members: Vec<Vec<u8>>,
    bytes: sled::IVec,
}

/// Folds an intent into the state it names: its record joins the state's
/// possible records, the state may be missing, and its generations never
/// fall below the intent's.
fn fold_into(s: &mut StateEntry, intent: &Intent) {
    if let Some(r) = &intent.record {
        if !s.records.iter().any(|have| have.as_slice() == &r[..]) {
            s.records.push(buf(r));
        }
    }
    s.may_be_missing = true;
    // The record may have been written under the newer parent generation:
    // never let it fall below a floor.
    s.gen = s.gen.max(intent.gen);
    if let Some(cg) = intent.child_gen {
        // The container change may or may not have happened: children may
        // be missing (a lossy bump), but their records are kept.
        let old = s.child_gen.unwrap_or_default();
        s.child_gen = Some(crate::model::provider::ChildGeneration {
            current: old.current.max(cg.current),
            destructive_floor: old.destructive_floor,
        });
    }
}
