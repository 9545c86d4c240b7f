//! Memo keys, packed.
//!
//! A component's memo key (what its last successful run was memoized by,
//! a change's ordinal for a stream) is read when its parent mounts it again
//! and written by its commit. Commits write many at once (a stream's batch,
//! a directory's files), and a sled key of their own each would cost a
//! sled insert each, which copies the node the key lands in: about as much
//! as the rest of such a commit. So the memo keys a commit writes are
//! packed into one value, `q` + pack id, as small entries are (see
//! [`pack`]): an index in memory names the pack holding each component's
//! memo key, and the packs written last are kept in memory.
//!
//! - A memo key written again moves to the commit's pack: when the ledger
//!   opens, the newest pack holding a component gives its memo key.
//! - A memo key forgotten leaves a tombstone, `n` + component path,
//!   holding the id of the next pack: older packs (the one it was in, or
//!   one still holding a copy it moved out of) no longer give that
//!   component a memo key.
//! - A pack left with no live member is deleted with the commit that
//!   empties it; opening the ledger deletes the tombstones that hide
//!   nothing.
//!
//! Ledgers of format 3 and before hold each memo key under a key of its
//! own (`o` + component path); opening one moves them into packs, a few
//! thousand a batch, each batch writing a pack and deleting its keys at
//! once, so that an opening cut short goes on where it stopped.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::{key, pack, Ledger, P_MEMO};
use crate::error::Result;

/// A pack of memo keys: `q` + pack id, u64 BE.
pub(super) const P_MEMO_PACK: u8 = b'q';
/// A forgotten memo key's tombstone: `n` + component path, the id of the
/// first pack that may give the component a memo key again, u64 BE.
pub(super) const P_MEMO_GONE: u8 = b'n';
/// Memo keys of an earlier format moved into one pack.
const CONVERTED_PER_PACK: usize = 4096;

fn pack_key(id: u64) -> Vec<u8> {
    key(P_MEMO_PACK, &id.to_be_bytes())
}

impl Ledger {
    /// The memo key a component committed with in its last successful
    /// run, if it was mounted with one and has not failed or been
    /// interrupted since.
    pub(crate) fn memo(&self, component: &[u8]) -> Result<Option<sled::IVec>> {
        // Held while the pack is read: a commit that moves the memo key
        // and deletes its pack waits.
        let memos = self.memos();
        let pack = match memos.find_member(component) {
            None => return Ok(None),
            Some((_, Some(bytes))) => bytes,
            Some((id, None)) => self
                .tree
                .get(pack_key(id))?
                .ok_or_else(|| self.corrupt("a pack of memo keys is missing"))?,
        };
        let (off, len) = pack::find(&pack, component)
            .ok_or_else(|| self.corrupt("a pack of memo keys lacks a member"))?;
        Ok(Some(pack.subslice(off, len)))
    }

    /// Every component with a memo key.
    pub(super) fn memo_members(&self) -> Vec<Vec<u8>> {
        self.memos().members.keys().cloned().collect()
    }

    /// Moves the memo keys of an earlier format into packs, then finds
    /// the live members of every pack; deletes the packs with no live
    /// member and the tombstones that hide nothing.
    pub(super) fn load_memos(&self) -> Result<()> {
        self.convert_memo_keys()?;
        let mut tombstones = HashMap::new();
        for item in self.tree.scan_prefix([P_MEMO_GONE]) {
            let (k, v) = item?;
            tombstones.insert(k.get(1..).unwrap_or_default().to_vec(), self.pack_id(&v)?);
        }
        let mut index = pack::PackIndex::default();
        // The tombstones that hide a copy: the others are useless.
        let mut hiding = HashSet::new();
        let mut keys = Vec::new();
        // Packs come in ascending id: a member found again is the newer.
        for item in self.tree.scan_prefix([P_MEMO_PACK]) {
            let (k, v) = item?;
            let id = self.pack_id(k.get(1..).unwrap_or_default())?;
            index.next_id = index.next_id.max(id + 1);
            keys.push((id, k));
            for (component, _, _) in pack::records(&v) {
                match tombstones.get(component) {
                    Some(&gone) if gone > id => {
                        hiding.insert(component.to_vec());
                    }
                    _ => index.add(component.to_vec(), id),
                }
            }
        }
        let mut gc = sled::Batch::default();
        let mut dirty = index.collect_dead(keys, &mut gc);
        for (component, gone) in tombstones {
            index.next_id = index.next_id.max(gone);
            if !hiding.contains(&component) {
                gc.remove(key(P_MEMO_GONE, &component));
                dirty = true;
            }
        }
        if dirty {
            self.tree.apply_batch(gc)?;
            self.tree.flush()?;
        }
        *self.memos_mut() = index;
        Ok(())
    }

    /// A pack id as stored: 8 bytes, big-endian.
    fn pack_id(&self, raw: &[u8]) -> Result<u64> {
        let raw: [u8; 8] = raw
            .try_into()
            .map_err(|_| self.corrupt("a pack id of memo keys is malformed"))?;
        Ok(u64::from_be_bytes(raw))
    }

    /// Moves the memo keys of an earlier format (`o`) into packs.
    fn convert_memo_keys(&self) -> Result<()> {
        // After the packs written already (an opening cut short wrote some).
        let first = match self.tree.scan_prefix([P_MEMO_PACK]).next_back() {
            Some(item) => self.pack_id(item?.0.get(1..).unwrap_or_default())? + 1,
            None => 0,
        };
        let mut id = first;
        loop {
            let chunk = self
                .tree
                .scan_prefix([P_MEMO])
                .take(CONVERTED_PER_PACK)
                .collect::<std::result::Result<Vec<_>, _>>()?;
            if chunk.is_empty() {
                break;
            }
            let members: Vec<(Vec<u8>, sled::IVec)> = chunk
                .iter()
                .map(|(k, v)| (k.get(1..).unwrap_or_default().to_vec(), v.clone()))
                .collect();
            let mut batch = sled::Batch::default();
            batch.insert(pack_key(id), pack::encode(&members));
            for (k, _) in chunk {
                batch.remove(k);
            }
            self.tree.apply_batch(batch)?;
            id += 1;
        }
        if id > first {
            self.tree.flush()?;
        }
        Ok(())
    }
}

/// The memo keys a commit writes and forgets.
#[derive(Default)]
pub(super) struct MemoWrites {
    puts: BTreeMap<Vec<u8>, Vec<u8>>,
    gone: BTreeSet<Vec<u8>>,
}

/// What a commit changes in the index of memo packs once it is applied.
#[derive(Default)]
pub(super) struct MemoChanges {
    /// The pack written, with its members and its bytes.
    pack: Option<(u64, Vec<Vec<u8>>, sled::IVec)>,
    /// Members forgotten.
    gone: Vec<Vec<u8>>,
}

impl MemoWrites {
    /// Records `memo` as the component's memo key.
    pub(super) fn put(&mut self, component: &[u8], memo: Vec<u8>) {
        self.gone.remove(component);
        self.puts.insert(component.to_vec(), memo);
    }

    /// Forgets the component's memo key, if it has one.
    pub(super) fn forget(&mut self, ledger: &Ledger, component: &[u8]) {
        self.puts.remove(component);
        if ledger.memos().members.contains_key(component) {
            self.gone.insert(component.to_vec());
        }
    }

    /// Hands `write` the sled writes of the commit (a value to put, or
    /// `None` to delete the key): its pack, the packs it empties, the
    /// tombstones of the memo keys it forgets.
    /// Returns the index changes to make once they are applied.
    pub(super) fn write(
        self,
        ledger: &Ledger,
        mut write: impl FnMut(Vec<u8>, Option<sled::IVec>),
    ) -> MemoChanges {
        if self.puts.is_empty() && self.gone.is_empty() {
            return MemoChanges::default();
        }
        let emptied = ledger
            .memos()
            .emptied_by(self.puts.keys().chain(&self.gone));
        for id in emptied {
            write(pack_key(id), None);
        }
        let pack = (!self.puts.is_empty()).then(|| {
            let id = ledger.memos_mut().take_id();
            let members: Vec<(Vec<u8>, Vec<u8>)> = self.puts.into_iter().collect();
            let bytes = sled::IVec::from(pack::encode(&members));
            write(pack_key(id), Some(bytes.clone()));
            (id, members.into_iter().map(|(c, _)| c).collect(), bytes)
        });
        // Even when its pack goes: an older pack may hold a stale copy.
        let next = sled::IVec::from(&ledger.memos().next_id.to_be_bytes());
        for c in &self.gone {
            write(key(P_MEMO_GONE, c), Some(next.clone()));
        }
        MemoChanges {
            pack,
            gone: self.gone.into_iter().collect(),
        }
    }
}

impl MemoChanges {
    /// Whether the commit changes no memo key.
    pub(super) fn is_empty(&self) -> bool {
        self.pack.is_none() && self.gone.is_empty()
    }

    /// Notes the commit's changes in the index (held for writing since
    /// before the commit was applied, so that no reader finds a member in
    /// a pack the commit deleted).
    pub(super) fn note(self, memos: &mut pack::PackIndex) {
        for c in &self.gone {
            memos.unpack(c);
        }
        if let Some((id, members, bytes)) = self.pack {
            for c in members {
                memos.add(c, id);
            }
            memos.keep_recent(id, bytes);
        }
    }
}
