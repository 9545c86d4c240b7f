//! What the ledger stores, and the operations that change it.

use rmp::Marker;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use std::sync::Arc;

use super::scan::write_array_len;

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
/// from its declarations without copying each state first; see
/// [`encode_new_entry`]).
pub(crate) struct StateEntryOut<'a> {
    pub path: &'a serde_bytes::Bytes,
    pub records: RecordsOut<'a>,
    pub may_be_missing: bool,
    pub gen: u64,
    pub child_gen: Option<ChildGeneration>,
}

impl StateEntryOut<'_> {
    /// Appends the state to `out` as serde encodes it: an array of its
    /// five fields, structs as arrays, byte strings as binaries, integers
    /// in their shortest form.
    fn write_to(&self, out: &mut Vec<u8>) -> Result<(), rmp::encode::ValueWriteError> {
        use rmp::encode::{write_bin, write_uint};
        write_array_len(out, 5);
        write_bin(out, self.path)?;
        match &self.records {
            RecordsOut::One(record) => {
                write_array_len(out, 1);
                write_bin(out, record)?;
            }
            RecordsOut::Many(records) => {
                write_array_len(out, records.len());
                for record in records.iter() {
                    write_bin(out, record)?;
                }
            }
        }
        out.push(if self.may_be_missing {
            Marker::True.to_u8()
        } else {
            Marker::False.to_u8()
        });
        write_uint(out, self.gen)?;
        match self.child_gen {
            None => out.push(Marker::Null.to_u8()),
            Some(ChildGeneration {
                current,
                destructive_floor,
            }) => {
                write_array_len(out, 2);
                write_uint(out, current)?;
                write_uint(out, destructive_floor)?;
            }
        }
        Ok(())
    }
}

/// A component entry of `states` and no failure, encoded, in sled's
/// shared form: the bytes serde gives for the [`ComponentEntry`] of those
/// states, written directly rather than through serde. `size` is about
/// how many bytes they take: a small entry is written into the thread's
/// kept buffer and copied once, a large one into a buffer of its own.
pub(crate) fn encode_new_entry<'a>(
    states: impl ExactSizeIterator<Item = &'a StateEntryOut<'a>>,
    size: usize,
) -> Result<sled::IVec, rmp_serde::encode::Error> {
    if size < crate::model::encode::MAX_KEPT_BUFFER {
        return crate::model::encode::with_buffer(|out| {
            write_new_entry(out, states)?;
            Ok(sled::IVec::from(&out[..]))
        });
    }
    let mut out = Vec::with_capacity(size);
    write_new_entry(&mut out, states)?;
    Ok(sled::IVec::from(out))
}

/// Appends the entry of `states` and no failure to `out`.
fn write_new_entry<'a>(
    out: &mut Vec<u8>,
    states: impl ExactSizeIterator<Item = &'a StateEntryOut<'a>>,
) -> Result<(), rmp::encode::ValueWriteError> {
    write_array_len(out, 2);
    write_array_len(out, states.len());
    for state in states {
        state.write_to(out)?;
    }
    out.push(Marker::Null.to_u8());
    Ok(())
}

/// The records of a [`StateEntryOut`]: encodes as a list of byte strings.
pub(crate) enum RecordsOut<'a> {
    One(&'a serde_bytes::Bytes),
    Many(&'a [ByteBuf]),
}

impl RecordsOut<'_> {
    /// The records' bytes, without their framing.
    pub(crate) fn len(&self) -> usize {
        match self {
            RecordsOut::One(record) => record.len(),
            RecordsOut::Many(records) => records.iter().map(|r| r.len()).sum(),
        }
    }
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
///
/// Its byte strings are shared with the declaration and the outcome they
/// come from (a first run writes an intent for every state it declares),
/// and encoded as MessagePack binaries, as byte buffers are.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Intent {
    /// The component whose entry holds (or will hold) the state.
    #[serde(with = "shared_bytes")]
    pub component: Arc<[u8]>,
    #[serde(with = "shared_bytes")]
    pub path: Arc<[u8]>,
    /// The record after the action; `None` for a delete.
    #[serde(with = "shared_bytes::option")]
    pub record: Option<Arc<[u8]>>,
    pub gen: u64,
    pub child_gen: Option<ChildGeneration>,
    /// The container the state is below, if any.
    #[serde(with = "shared_bytes::option")]
    pub container: Option<Arc<[u8]>>,
}

/// Shared byte strings (`Arc<[u8]>`) encoded as binaries, exactly as a
/// [`ByteBuf`] is (serde's own `Arc<[u8]>` is a sequence of integers).
mod shared_bytes {
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_bytes::ByteBuf;
    use std::sync::Arc;

    pub(super) fn serialize<S: Serializer>(bytes: &Arc<[u8]>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(bytes)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<[u8]>, D::Error> {
        ByteBuf::deserialize(d).map(|b| Arc::from(b.into_vec()))
    }

    /// The same, for an optional one.
    pub(super) mod option {
        use serde::{Deserialize, Deserializer, Serializer};
        use serde_bytes::{ByteBuf, Bytes};
        use std::sync::Arc;

        pub(in super::super) fn serialize<S: Serializer>(
            bytes: &Option<Arc<[u8]>>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match bytes {
                Some(b) => s.serialize_some(Bytes::new(b)),
                None => s.serialize_none(),
            }
        }

        pub(in super::super) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Arc<[u8]>>, D::Error> {
            Option::<ByteBuf>::deserialize(d).map(|b| b.map(|b| Arc::from(b.into_vec())))
        }
    }
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
        /// `apply_group`), and in sled's own shared form, so that a large
        /// entry is written as it is, without a copy on the ledger's thread.
        encoded: sled::IVec,
        /// The [`stable_hash`](crate::model::keycode::stable_hash) of each
        /// of its states' paths, to index.
        indexed: Vec<u64>,
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

    /// A random state: paths, records and integers around the sizes where
    /// MessagePack's encodings change.
    /// (Records of 70 000 bytes only where `large` says so.)
    fn random_state(rng: &mut fastrand::Rng, i: usize, large: bool) -> StateEntry {
        let bytes = |rng: &mut fastrand::Rng| -> ByteBuf {
            let len = match rng.u8(0..20) {
                0 if large => 70_000,
                1 => rng.usize(250..300),
                _ => rng.usize(0..40),
            };
            ByteBuf::from(vec![rng.u8(..); len])
        };
        let int = |rng: &mut fastrand::Rng| -> u64 {
            *[
                0,
                1,
                127,
                128,
                255,
                256,
                65_535,
                65_536,
                5_000_000_000,
                u64::MAX,
            ]
            .get(rng.usize(0..10))
            .unwrap_or(&0)
        };
        StateEntry {
            path: ByteBuf::from(format!("p{i:08}").into_bytes()),
            records: (0..rng.usize(0..4)).map(|_| bytes(rng)).collect(),
            may_be_missing: rng.bool(),
            gen: int(rng),
            child_gen: rng.bool().then(|| ChildGeneration {
                current: int(rng),
                destructive_floor: int(rng),
            }),
        }
    }

    #[test]
    fn a_new_entry_encoded_directly_is_the_entry_serde_encodes(
    ) -> Result<(), rmp_serde::encode::Error> {
        let mut rng = fastrand::Rng::with_seed(11);
        for count in [0, 1, 15, 16, 300, 70_000] {
            let states: Vec<StateEntry> = (0..count)
                .map(|i| random_state(&mut rng, i, count <= 300))
                .collect();
            let whole = rmp_serde::to_vec(&ComponentEntry {
                states: states.clone(),
                failure: None,
            })?;
            let out: Vec<StateEntryOut<'_>> = states
                .iter()
                .map(|s| StateEntryOut {
                    path: serde_bytes::Bytes::new(&s.path),
                    // One record either way: borrowed alone, or as a list.
                    records: match s.records.as_slice() {
                        [one] if s.gen % 2 == 0 => RecordsOut::One(serde_bytes::Bytes::new(one)),
                        many => RecordsOut::Many(many),
                    },
                    may_be_missing: s.may_be_missing,
                    gen: s.gen,
                    child_gen: s.child_gen,
                })
                .collect();
            // Sized small and large: through the kept buffer, and not.
            for size in [16, crate::model::encode::MAX_KEPT_BUFFER] {
                let direct = encode_new_entry(out.iter(), size)?;
                assert!(*direct == *whole, "{count} states encode differently");
            }
        }
        Ok(())
    }

    /// An intent as earlier builds encoded it, with byte buffers.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct BufferedIntent {
        component: ByteBuf,
        path: ByteBuf,
        record: Option<ByteBuf>,
        gen: u64,
        child_gen: Option<ChildGeneration>,
        container: Option<ByteBuf>,
    }

    #[test]
    fn an_intent_with_shared_bytes_encodes_as_one_with_byte_buffers_and_reads_it_back(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let child_gen = Some(ChildGeneration {
            current: 3,
            destructive_floor: 1,
        });
        for (record, container) in [(Some(&b"r1"[..]), Some(&b"c"[..])), (None, None)] {
            let shared = Intent {
                component: Arc::from(&b"comp"[..]),
                path: Arc::from(&b"p1"[..]),
                record: record.map(Arc::from),
                gen: 7,
                child_gen,
                container: container.map(Arc::from),
            };
            let buffered = BufferedIntent {
                component: ByteBuf::from(&b"comp"[..]),
                path: ByteBuf::from(&b"p1"[..]),
                record: record.map(ByteBuf::from),
                gen: 7,
                child_gen,
                container: container.map(ByteBuf::from),
            };
            let bytes = rmp_serde::to_vec(&buffered)?;
            assert_eq!(rmp_serde::to_vec(&shared)?, bytes);
            let read: Intent = rmp_serde::from_slice(&bytes)?;
            assert_eq!(&*read.component, b"comp");
            assert_eq!(&*read.path, b"p1");
            assert_eq!(read.record.as_deref(), record);
            assert_eq!(read.container.as_deref(), container);
            assert_eq!((read.gen, read.child_gen), (7, child_gen));
        }
        Ok(())
    }
}
