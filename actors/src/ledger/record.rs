//! What the ledger stores, and the operations that change it.

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use crate::model::provider::ChildGeneration;
use crate::model::StableKey;

/// The tracking state of one target state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StateEntry {
    /// The encoded target-state path (provider path + key).
    pub path: ByteBuf,
    /// Possible tracking records: one once committed, several after an
    /// interrupted or failed update.
    pub records: Vec<ByteBuf>,
    /// The state may not exist in the external system.
    pub may_be_missing: bool,
    /// The generation of the parent container the records were written under.
    pub gen: u64,
    /// For containers: the generation their children are judged against.
    pub child_gen: Option<ChildGeneration>,
}

/// What reconcile needs of a state's previous entry, borrowed.
pub(crate) struct PrevView<'a> {
    pub records: Vec<&'a [u8]>,
    pub may_be_missing: bool,
    pub gen: u64,
}

impl<'a> From<&'a StateEntry> for PrevView<'a> {
    fn from(s: &'a StateEntry) -> Self {
        PrevView {
            records: s.records.iter().map(|r| r.as_slice()).collect(),
            may_be_missing: s.may_be_missing,
            gen: s.gen,
        }
    }
}

/// Everything the ledger keeps for one component, read and written in one go.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct ComponentEntry {
    /// The component's states, sorted by path.
    pub states: Vec<StateEntry>,
    /// Why the component failed in its last run, if it did.
    pub failure: Option<String>,
}

/// A state entry to encode, borrowing its parts: it encodes exactly as the
/// [`StateEntry`] with the same fields (a new component's entry is encoded
/// from its declarations without copying each state first).
#[derive(Serialize)]
pub(crate) struct StateEntryOut<'a> {
    pub path: &'a serde_bytes::Bytes,
    pub records: RecordsOut<'a>,
    pub may_be_missing: bool,
    pub gen: u64,
    pub child_gen: Option<ChildGeneration>,
}

/// The records of a [`StateEntryOut`]: encodes as a list of byte strings.
pub(crate) enum RecordsOut<'a> {
    One(&'a serde_bytes::Bytes),
    Many(&'a [ByteBuf]),
}

impl Serialize for RecordsOut<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RecordsOut::One(record) => s.collect_seq(std::iter::once(record)),
            RecordsOut::Many(records) => s.collect_seq(records.iter()),
        }
    }
}

/// A component entry to encode from borrowed states: encodes exactly as a
/// [`ComponentEntry`] with those states and no failure.
#[derive(Serialize)]
pub(crate) struct ComponentEntryOut<'a> {
    pub states: &'a [StateEntryOut<'a>],
    pub failure: Option<&'a str>,
}

impl ComponentEntry {
    pub(crate) fn find(&self, path: &[u8]) -> Result<usize, usize> {
        self.states
            .binary_search_by(|s| s.path.as_slice().cmp(path))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.states.is_empty() && self.failure.is_none()
    }
}

/// A record written before an action is applied: the state may now be in
/// its new form. Folded into the component entry on failure or recovery.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Intent {
    /// The component whose entry holds (or will hold) the state.
    pub component: ByteBuf,
    pub path: ByteBuf,
    /// The record after the action; `None` for a delete.
    pub record: Option<ByteBuf>,
    pub gen: u64,
    pub child_gen: Option<ChildGeneration>,
    /// The container the state is below, if any.
    pub container: Option<ByteBuf>,
}

/// One change to the ledger. The ledger actor applies a list of them
/// atomically, many lists per sled batch.
#[derive(Clone, Debug)]
pub(crate) enum LedgerOp {
    /// Set a state's entry in a component (and index the component as its owner).
    Put {
        component: Vec<u8>,
        entry: StateEntry,
        /// Index the component as the state's owner (new here or moved here).
        index_owner: bool,
        /// The container the state is below, to note the component as one
        /// of its holders: given for a state new to the component (one its
        /// entry holds already was noted when it came, and the note goes
        /// only with the container's descendants).
        container: Option<Vec<u8>>,
    },
    /// Set the whole entry of a component that had none, already encoded.
    PutEntry {
        component: Vec<u8>,
        /// Shared, so that a group commit's ops copy cheaply (see
        /// `apply_group`).
        encoded: std::sync::Arc<[u8]>,
        /// The paths of its states, to index.
        indexed: Vec<std::sync::Arc<[u8]>>,
        /// The containers its states are below.
        containers: Vec<Vec<u8>>,
    },
    /// Remove a state from a component's entry.
    Remove { component: Vec<u8>, path: Vec<u8> },
    /// Merge a possible new record into a state: the state may now be in
    /// either form, or missing.
    Fold(Intent),
    /// An intent left by a crash: folded, unless the entry shows that its
    /// action was applied and committed.
    Recover(Intent),
    /// Remove every state below a container (its children and attachments),
    /// wherever they are owned.
    DropDescendants { path: Vec<u8> },
    /// Add child components to a component's list (those not listed yet).
    /// Children leave the list only through `RemoveComponent`, once cleaned.
    AddChildren {
        component: Vec<u8>,
        children: Vec<StableKey>,
    },
    /// Count one more run in a row that a component failed (cleared, with
    /// the count, by `SetFailure { failure: None }`).
    CountFailedRun { component: Vec<u8> },
    /// Record or clear a component's failure.
    SetFailure {
        component: Vec<u8>,
        failure: Option<String>,
    },
    /// Record (or forget) the memo key of a component that committed.
    SetMemo {
        component: Vec<u8>,
        memo: Option<Vec<u8>>,
    },
    /// Forget a component that is no longer mounted, once it holds no
    /// state and has no children left; then drop it from its parent's
    /// child list. Apply children before parents.
    RemoveComponent {
        component: Vec<u8>,
        parent: Option<(Vec<u8>, StableKey)>,
    },
    /// Delete an intent batch whose components are all resolved.
    DeleteIntents { id: u64 },
    /// Forget everything of a component (a partition this member of a
    /// worker group no longer holds, or about to be restored).
    #[allow(dead_code)] // Made by the member runtime of worker groups.
    Forget { component: Vec<u8> },
    /// Replace everything of a component with a record (restored from its
    /// partition's changelog).
    #[allow(dead_code)] // Made by the member runtime of worker groups.
    Restore {
        component: Vec<u8>,
        record: Box<ComponentRecord>,
    },
}

impl LedgerOp {
    /// Whether applying the op decodes nothing stored, so that only the
    /// store itself can make it fail: a new entry given whole (merged, if
    /// the batch edited the component already, by decoding the bytes it
    /// carries), a memo key, forgetting intents.
    pub(crate) fn decodes_nothing_stored(&self) -> bool {
        matches!(
            self,
            LedgerOp::PutEntry { .. } | LedgerOp::SetMemo { .. } | LedgerOp::DeleteIntents { .. }
        )
    }

    /// The component the op names, if it names one (dropping what is
    /// below a container reaches components it does not name).
    pub(crate) fn component(&self) -> Option<&[u8]> {
        Some(match self {
            LedgerOp::Put { component, .. }
            | LedgerOp::PutEntry { component, .. }
            | LedgerOp::Remove { component, .. }
            | LedgerOp::AddChildren { component, .. }
            | LedgerOp::CountFailedRun { component }
            | LedgerOp::SetFailure { component, .. }
            | LedgerOp::SetMemo { component, .. }
            | LedgerOp::RemoveComponent { component, .. }
            | LedgerOp::Forget { component }
            | LedgerOp::Restore { component, .. } => component,
            LedgerOp::Fold(intent) | LedgerOp::Recover(intent) => &intent.component,
            LedgerOp::DropDescendants { .. } | LedgerOp::DeleteIntents { .. } => return None,
        })
    }

    /// The parent whose child list the op changes besides its component's
    /// (removing a component drops it from its parent's list).
    pub(crate) fn parent(&self) -> Option<&[u8]> {
        match self {
            LedgerOp::RemoveComponent {
                parent: Some((parent, _)),
                ..
            } => Some(parent),
            _ => None,
        }
    }
}

/// Everything the ledger keeps for one component: its entry (states and
/// failure), its children, its memo key and its failed-run count.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct ComponentRecord {
    pub entry: ComponentEntry,
    pub children: Vec<crate::model::StableKey>,
    pub memo: Option<ByteBuf>,
    pub failed_runs: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_encoded_from_borrowed_states_is_the_entry_encoded_whole(
    ) -> Result<(), rmp_serde::encode::Error> {
        let child_gen = Some(ChildGeneration::default());
        let states = vec![
            StateEntry {
                path: ByteBuf::from(b"p1".to_vec()),
                records: vec![ByteBuf::from(b"r1".to_vec())],
                may_be_missing: false,
                gen: 3,
                child_gen,
            },
            StateEntry {
                path: ByteBuf::from(b"p2".to_vec()),
                records: vec![ByteBuf::from(b"a".to_vec()), ByteBuf::from(b"b".to_vec())],
                may_be_missing: true,
                gen: 0,
                child_gen: None,
            },
        ];
        let whole = rmp_serde::to_vec(&ComponentEntry {
            states: states.clone(),
            failure: None,
        })?;
        let out = [
            StateEntryOut {
                path: serde_bytes::Bytes::new(b"p1"),
                records: RecordsOut::One(serde_bytes::Bytes::new(b"r1")),
                may_be_missing: false,
                gen: 3,
                child_gen,
            },
            StateEntryOut {
                path: serde_bytes::Bytes::new(b"p2"),
                records: RecordsOut::Many(&states[1].records),
                may_be_missing: true,
                gen: 0,
                child_gen: None,
            },
        ];
        let borrowed = rmp_serde::to_vec(&ComponentEntryOut {
            states: &out,
            failure: None,
        })?;
        assert_eq!(borrowed, whole);
        Ok(())
    }
}
