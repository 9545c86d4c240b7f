//! The ledger records a component commits, and the intents written
//! before its actions are applied.

use rustc_hash::FxHashSet as HashSet;
use std::sync::Arc;

use crate::actors::reconciler::{Found, Orphan};
use crate::error::Result;
use crate::ledger::buf;
use crate::ledger::record::{
    encode_new_entry, Intent, LedgerOp, RecordsOut, StateEntry, StateEntryOut,
};
use crate::model::action::ActionCounts;
use crate::model::erased::ErasedOutput;
use crate::model::keycode::stable_hash;
use crate::model::provider::{ChildGeneration, ProviderCore};
use crate::model::{ActionKind, StableKey};
use crate::sync::lock;

use super::waves::{Outcomes, Reconciled};
use super::{ComponentState, Declaration};

/// What a component commits when all its actions landed, and what it
/// counts: states unchanged, and actions by kind.
pub(super) struct SuccessRecords {
    pub(super) ops: Vec<LedgerOp>,
    pub(super) unchanged: u64,
    pub(super) actions: ActionCounts,
}

/// The records a component commits if every action it dispatched lands:
/// final records, ownership moves (a fresh component's whole entry at
/// once). Pure: nothing is counted or written here.
pub(super) fn success_records(
    state: &ComponentState,
    decls: &[Declaration],
    results: &Outcomes,
    fresh: bool,
) -> Result<SuccessRecords> {
    let mut records = Records {
        own: &state.key,
        fresh,
        ops: Vec::with_capacity(if fresh { 0 } else { results.len() }),
        new_entry: NewEntry::with_room(if fresh { results.len() } else { 0 }),
        unchanged: 0,
        actions: ActionCounts::default(),
    };
    for (i, r) in results.iter() {
        let Some(d) = decls.get(i) else {
            continue;
        };
        match r.output() {
            None => records.unchanged_state(d, r),
            Some(_) if is_refresh(d, r) => records.unchanged += 1,
            Some(out) => records.applied(d, r, out),
        }
    }
    let Records {
        own,
        mut ops,
        new_entry,
        unchanged,
        actions,
        ..
    } = records;
    if let Some(put) = new_entry.into_op(own.to_vec())? {
        ops.push(put);
    }
    Ok(SuccessRecords {
        ops,
        unchanged,
        actions,
    })
}

/// The records of a successful component, gathered outcome by outcome.
struct Records<'a> {
    /// The component's key.
    own: &'a Arc<[u8]>,
    /// It has no entry yet: its states go into one new entry.
    fresh: bool,
    ops: Vec<LedgerOp>,
    new_entry: NewEntry<'a>,
    unchanged: u64,
    actions: ActionCounts,
}

impl<'a> Records<'a> {
    /// A state that needs no action: it only moves here, if another
    /// component held it.
    fn unchanged_state(&mut self, d: &'a Declaration, r: &'a Reconciled) {
        self.unchanged += 1;
        let (Some(from), Some(prev)) = (r.moved_from(), &r.prev) else {
            return;
        };
        if self.fresh {
            self.new_entry.push(
                d,
                StateEntryOut {
                    path: serde_bytes::Bytes::new(&prev.path),
                    records: RecordsOut::Many(&prev.records),
                    may_be_missing: prev.may_be_missing,
                    gen: prev.gen,
                    child_gen: prev.child_gen,
                },
            );
        } else {
            self.ops.push(LedgerOp::Put {
                component: self.own.to_vec(),
                entry: prev.clone(),
                index_owner: true,
                container: container_of(d),
            });
        }
        self.moved(from, d);
    }

    /// The state leaves the component that held it, which must run again.
    fn moved(&mut self, from: &[u8], d: &Declaration) {
        self.ops.push(LedgerOp::Remove {
            component: from.to_vec(),
            path: d.path.to_vec(),
        });
        self.ops.push(forget_memo(from));
    }

    /// A state whose action was applied: its new record, or its deletion.
    fn applied(&mut self, d: &'a Declaration, r: &'a Reconciled, out: &'a ErasedOutput) {
        self.actions.add(out.kind);
        match &out.record {
            Some(record) => self.written(d, r, record),
            None => {
                if let Some(loc) = r.location(self.own) {
                    self.ops.push(LedgerOp::Remove {
                        component: loc.to_vec(),
                        path: d.path.to_vec(),
                    });
                }
                if r.prev.as_ref().is_some_and(|p| p.child_gen.is_some()) {
                    self.ops.push(LedgerOp::DropDescendants {
                        path: d.path.to_vec(),
                    });
                }
            }
        }
    }

    /// A state written with `record`.
    fn written(&mut self, d: &'a Declaration, r: &'a Reconciled, record: &'a [u8]) {
        let gen = generation(&d.provider).current;
        let child_gen = r
            .child_gen
            .or_else(|| r.prev.as_ref().and_then(|p| p.child_gen));
        let moved_from = r.moved_from();
        if self.fresh {
            // No entry of its own to compare with.
            self.new_entry.push(
                d,
                StateEntryOut {
                    path: serde_bytes::Bytes::new(&d.path),
                    records: RecordsOut::One(serde_bytes::Bytes::new(record)),
                    may_be_missing: false,
                    gen,
                    child_gen,
                },
            );
        } else {
            let entry = StateEntry {
                path: buf(&d.path),
                records: vec![buf(record)],
                may_be_missing: false,
                gen,
                child_gen,
            };
            let same = moved_from.is_none() && r.prev.as_ref() == Some(&entry);
            // New here, or moved here: the component is not indexed as the
            // state's owner nor noted as a holder of its container yet.
            // (A state its entry holds already was both when it came.)
            let new_here = matches!(r.location, Found::Nowhere) || moved_from.is_some();
            if !same {
                self.ops.push(LedgerOp::Put {
                    component: self.own.to_vec(),
                    entry,
                    index_owner: new_here,
                    container: new_here.then(|| container_of(d)).flatten(),
                });
            }
        }
        if let Some(from) = moved_from {
            self.moved(from, d);
        }
    }
}

/// A state of a [`NewEntry`], with its path (to index) and container.
struct NewState<'a> {
    entry: StateEntryOut<'a>,
    path: &'a Arc<[u8]>,
    container: Option<&'a [u8]>,
}

/// The states of a fresh component's first entry, borrowed from its
/// declarations and outcomes, encoded in one go (no per-state copies).
struct NewEntry<'a> {
    states: Vec<NewState<'a>>,
    /// About how many bytes the encoded entry takes.
    size: usize,
}

impl<'a> NewEntry<'a> {
    /// An entry with room for `states` states.
    fn with_room(states: usize) -> Self {
        Self {
            states: Vec::with_capacity(states),
            size: 0,
        }
    }

    fn push(&mut self, d: &'a Declaration, entry: StateEntryOut<'a>) {
        self.size += entry.path.len() + entry.records.len() + 48;
        self.states.push(NewState {
            entry,
            path: &d.path,
            container: d.provider.path.container.as_deref(),
        });
    }

    /// The op that writes the whole entry (states sorted by path, the first
    /// of two with one path kept), or `None` when there is no state.
    fn into_op(mut self, own: Vec<u8>) -> Result<Option<LedgerOp>> {
        if self.states.is_empty() {
            return Ok(None);
        }
        self.states.sort_by(|a, b| a.entry.path.cmp(b.entry.path));
        self.states.dedup_by(|a, b| a.entry.path == b.entry.path);
        let mut containers: Vec<Vec<u8>> = Vec::new();
        for s in &self.states {
            // The states of one container come in runs: keep one each.
            let new_run = |c: &&[u8]| containers.last().map(Vec::as_slice) != Some(*c);
            if let Some(c) = s.container.filter(new_run) {
                containers.push(c.to_vec());
            }
        }
        containers.sort();
        containers.dedup();
        let indexed = self.states.iter().map(|s| stable_hash(s.path)).collect();
        let encoded = encode_new_entry(self.states.iter().map(|s| &s.entry), self.size + 16)?;
        Ok(Some(LedgerOp::PutEntry {
            component: own,
            encoded,
            indexed,
            containers,
        }))
    }
}

/// Whether a container's action only refreshes it: an update whose record
/// is the one committed, with no child invalidation, by its owner. A
/// container's handler answers with an action on every run (its child
/// handler is built from it). Such an answer is applied (its sink may
/// check that the container is still there), but it needs no intent,
/// writes no record, counts as unchanged (as a `None` from a leaf would),
/// and is left out of a preview. When it fails, the component fails and
/// the container's records stay as they were: a refresh changes none.
pub(super) fn is_refresh(d: &Declaration, r: &Reconciled) -> bool {
    let (Some(out), Some(prev)) = (r.output(), &r.prev) else {
        return false;
    };
    d.child.is_some()
        && out.kind == ActionKind::Update
        && out.child_invalidation.is_none()
        && !prev.may_be_missing
        && prev.gen == generation(&d.provider).current
        && matches!(r.location, Found::Own)
        && match (&out.record, prev.records.as_slice()) {
            (Some(record), [committed]) => committed.as_slice() == &record[..],
            _ => false,
        }
}

/// A component that lost a state to another one no longer declares what
/// its memo key stands for: it must run again.
fn forget_memo(component: &[u8]) -> LedgerOp {
    LedgerOp::SetMemo {
        component: component.to_vec(),
        memo: None,
    }
}

/// The children mounted now that the last run's list lacks. Children no
/// longer mounted stay listed until the end of the run has cleaned them up
/// (a failed cleanup is then retried by the next run).
pub(super) fn children_change(
    state: &ComponentState,
    prev: &[StableKey],
) -> Option<Vec<StableKey>> {
    let children = lock(&state.children);
    let prev_set: HashSet<&StableKey> = prev.iter().collect();
    let added: Vec<StableKey> = children
        .keys()
        .iter()
        .filter(|k| !prev_set.contains(k))
        .cloned()
        .collect();
    (!added.is_empty()).then_some(added)
}

/// Whether a child of the last run is not mounted in this one.
pub(super) fn removes_children(state: &ComponentState, prev_children: &[StableKey]) -> bool {
    let children = lock(&state.children);
    prev_children.iter().any(|k| !children.contains(k))
}

/// After a success: children no longer mounted are removed, and states no
/// longer declared become orphans, deleted at the end of the run.
pub(super) fn note_children_and_orphans(
    state: &ComponentState,
    prev_children: &[StableKey],
    orphans: Vec<StateEntry>,
) {
    let run = &state.run;
    {
        let children = lock(&state.children);
        let mut removed = lock(&run.removed);
        // A scoped run's root keeps its children outside the scope.
        let root = state.path.is_root();
        for k in prev_children {
            if !children.contains(k) && (!root || run.in_scope(k)) {
                removed.push(state.path.child(k.clone()));
            }
        }
    }
    if !orphans.is_empty() {
        let mut all = lock(&run.orphans);
        all.extend(orphans.into_iter().map(|entry| Orphan {
            component: Arc::clone(&state.key),
            component_path: state.path.clone(),
            entry,
        }));
    }
}

fn generation(provider: &ProviderCore) -> ChildGeneration {
    provider
        .resolved
        .get()
        .map(|r| r.generation)
        .unwrap_or_default()
}

/// The intent to persist before applying a declared state's action, or
/// `None` when the state's possible records would not change.
pub(super) fn intent_for(
    state: &ComponentState,
    d: &Declaration,
    r: &Reconciled,
) -> Option<Intent> {
    let out = r.output()?;
    if let Some(prev) = &r.prev {
        let gen_same = r.child_gen.is_none() || r.child_gen == prev.child_gen;
        let covered = match &out.record {
            Some(rec) => prev.records.iter().any(|p| p.as_slice() == &rec[..]),
            None => prev.may_be_missing,
        };
        if covered && gen_same && prev.gen == generation(&d.provider).current {
            return None;
        }
    }
    Some(full_intent(state, d, r))
}

pub(super) fn full_intent(state: &ComponentState, d: &Declaration, r: &Reconciled) -> Intent {
    Intent {
        component: Arc::clone(r.location(&state.key).unwrap_or(&state.key)),
        path: Arc::clone(&d.path),
        record: r.output().and_then(|o| o.record.clone()),
        gen: generation(&d.provider).current,
        child_gen: r.child_gen,
        container: d.provider.path.container.clone(),
    }
}

fn container_of(d: &Declaration) -> Option<Vec<u8>> {
    d.provider.path.container.as_ref().map(|c| c.to_vec())
}
