//! Packs: many new component entries stored in one sled value.
//!
//! sled costs several microseconds per key written, so a group commit that
//! creates many small components writes their entries into one *pack*
//! instead of one key each. A pack is a `u32` count, a table of `u32`
//! record offsets, then the records `[u32 len][component key][u32 len][entry]`
//! sorted by component key; an entry is found by binary search, without
//! decoding the others.
//!
//! A packed component written again moves to the pack of the batch that
//! writes it, with the new entries and the other packed components that
//! batch writes (to a key of its own, `c`, when the batch has too few of
//! them to pack, or its entry has become large); the older pack keeps a
//! stale copy, and the newest pack that holds a component is the one read,
//! also when the ledger is opened again. A pack whose members all moved
//! is deleted. A component that is deleted leaves a `c` value starting
//! with [`TOMBSTONE`] so that no older pack can bring it back; a key of its
//! own that is not a tombstone hides the component in every pack.

use rustc_hash::FxHashMap as HashMap;

/// The first byte of a tombstone (a byte MessagePack never uses, so no
/// entry starts with it), followed by the pack counter when it was written:
/// it hides the component in every older pack.
pub(crate) const TOMBSTONE: u8 = 0xc1;

/// A tombstone written while the next pack id is `next_id`.
pub(crate) fn tombstone(next_id: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(9);
    v.push(TOMBSTONE);
    v.extend_from_slice(&next_id.to_be_bytes());
    v
}

/// The generation of a tombstone, or `None` for an entry.
pub(crate) fn tombstone_generation(value: &[u8]) -> Option<u64> {
    if value.first() != Some(&TOMBSTONE) {
        return None;
    }
    let raw: [u8; 8] = value.get(1..9)?.try_into().ok()?;
    Some(u64::from_be_bytes(raw))
}

/// Encodes entries (sorted by component key) into a pack.
pub(crate) fn encode<V: AsRef<[u8]>>(entries: &[(Vec<u8>, V)]) -> Vec<u8> {
    let size: usize = entries
        .iter()
        .map(|(k, v)| 12 + k.len() + v.as_ref().len())
        .sum();
    let mut out = Vec::with_capacity(4 + size);
    out.extend_from_slice(&(entries.len() as u32).to_be_bytes());
    let mut at = 4 + 4 * entries.len();
    for (k, v) in entries {
        out.extend_from_slice(&(at as u32).to_be_bytes());
        at += 8 + k.len() + v.as_ref().len();
    }
    for (k, v) in entries {
        out.extend_from_slice(&(k.len() as u32).to_be_bytes());
        out.extend_from_slice(k);
        out.extend_from_slice(&(v.as_ref().len() as u32).to_be_bytes());
        out.extend_from_slice(v.as_ref());
    }
    out
}

fn read_u32(bytes: &[u8], at: usize) -> Option<usize> {
    let raw: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
    Some(u32::from_be_bytes(raw) as usize)
}

/// Record `i` of a pack: (component key, entry offset, entry length).
fn record(pack: &[u8], i: usize) -> Option<(&[u8], usize, usize)> {
    let at = read_u32(pack, 4 + 4 * i)?;
    let klen = read_u32(pack, at)?;
    let key = pack.get(at + 4..at + 4 + klen)?;
    let vat = at + 4 + klen;
    let vlen = read_u32(pack, vat)?;
    pack.get(vat + 4..vat + 4 + vlen)?;
    Some((key, vat + 4, vlen))
}

/// The records of a pack: (component key, entry offset, entry length).
/// Stops at the first malformed record.
pub(crate) fn records(pack: &[u8]) -> impl Iterator<Item = (&[u8], usize, usize)> + '_ {
    let count = read_u32(pack, 0).unwrap_or(0);
    (0..count).map_while(move |i| record(pack, i))
}

/// Where a component's entry is in a pack: (offset, length).
pub(crate) fn find(pack: &[u8], component: &[u8]) -> Option<(usize, usize)> {
    let (mut lo, mut hi) = (0, read_u32(pack, 0)?);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let (key, off, len) = record(pack, mid)?;
        match key.cmp(component) {
            std::cmp::Ordering::Equal => return Some((off, len)),
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
        }
    }
    None
}

/// The most packs written last that are kept in memory...
const RECENT_PACKS: usize = 64;
/// ... and the most bytes they take (the newest is always kept): their
/// bytes are shared with sled's page cache only while sled keeps the same
/// copy, so they may add this much to a ledger's memory.
const RECENT_PACK_BYTES: usize = 4 << 20;

/// Which pack holds each packed component, and how many live members each
/// pack has; the packs written last, to read their members without a
/// lookup in sled (a run that follows a commit of many components reads
/// their entries: a stream's next batch, a file's next change).
#[derive(Default)]
pub(crate) struct PackIndex {
    pub members: HashMap<Vec<u8>, u64>,
    pub live: HashMap<u64, usize>,
    pub next_id: u64,
    /// The packs written last (oldest first), as sled holds them: a pack
    /// is never written again under its id, and leaves this list when it
    /// is deleted.
    recent: std::collections::VecDeque<(u64, sled::IVec)>,
    /// The bytes of the `recent` packs.
    recent_bytes: usize,
}

impl PackIndex {
    /// Takes the id of a new pack.
    pub(crate) fn take_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Makes pack `id` the one that holds `component`; the pack that held
    /// it before (an older one) has one live member fewer.
    pub(crate) fn add(&mut self, component: Vec<u8>, id: u64) {
        if let Some(older) = self.members.insert(component, id) {
            self.leave(older);
        }
        *self.live.entry(id).or_default() += 1;
    }

    /// Forgets a member (it moved out or was deleted); returns its pack and
    /// whether that pack has no live member left.
    pub(crate) fn unpack(&mut self, component: &[u8]) -> Option<(u64, bool)> {
        let id = self.members.remove(component)?;
        Some((id, self.leave(id)))
    }

    /// Counts one live member fewer in pack `id`; whether none is left
    /// (the pack is then forgotten).
    fn leave(&mut self, id: u64) -> bool {
        let live = self.live.entry(id).or_insert(1);
        *live = live.saturating_sub(1);
        let empty = *live == 0;
        if empty {
            self.live.remove(&id);
            self.forget_recent(id);
        }
        empty
    }

    /// Keeps the bytes of pack `id`, just written, among the recent ones;
    /// the oldest go past [`RECENT_PACKS`] or [`RECENT_PACK_BYTES`].
    pub(crate) fn keep_recent(&mut self, id: u64, bytes: sled::IVec) {
        self.recent_bytes += bytes.len();
        self.recent.push_back((id, bytes));
        while self.recent.len() > RECENT_PACKS
            || (self.recent_bytes > RECENT_PACK_BYTES && self.recent.len() > 1)
        {
            if let Some((_, old)) = self.recent.pop_front() {
                self.recent_bytes -= old.len();
            }
        }
    }

    /// Drops pack `id` (deleted) from the recent ones.
    fn forget_recent(&mut self, id: u64) {
        if let Some(at) = self.recent.iter().position(|(kept, _)| *kept == id) {
            if let Some((_, old)) = self.recent.remove(at) {
                self.recent_bytes -= old.len();
            }
        }
    }

    /// The packs whose every live member is among `leaving` (members that
    /// move out or are deleted): those to delete with them.
    pub(crate) fn emptied_by<'a>(
        &self,
        leaving: impl IntoIterator<Item = &'a Vec<u8>>,
    ) -> Vec<u64> {
        let mut out: HashMap<u64, usize> = HashMap::default();
        for c in leaving {
            if let Some(id) = self.members.get(c) {
                *out.entry(*id).or_default() += 1;
            }
        }
        out.into_iter()
            .filter(|(id, n)| self.live.get(id).is_none_or(|live| live <= n))
            .map(|(id, _)| id)
            .collect()
    }

    /// Adds to `gc` the removal of each of the pack `keys` (by pack id)
    /// whose pack has no live member; whether there was any.
    pub(crate) fn collect_dead(&self, keys: Vec<(u64, sled::IVec)>, gc: &mut sled::Batch) -> bool {
        let mut any = false;
        for (id, k) in keys {
            if !self.live.contains_key(&id) {
                gc.remove(k);
                any = true;
            }
        }
        any
    }

    /// The pack holding `component` and, if it is a recent one, its bytes.
    pub(crate) fn find_member(&self, component: &[u8]) -> Option<(u64, Option<sled::IVec>)> {
        let id = *self.members.get(component)?;
        let bytes = self.recent.iter().find(|(kept, _)| *kept == id);
        Some((id, bytes.map(|(_, b)| b.clone())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_found_in_a_pack_without_decoding_the_others() {
        let entries = vec![
            (b"a".to_vec(), b"one".to_vec()),
            (b"bb".to_vec(), b"".to_vec()),
            (b"c".to_vec(), b"three".to_vec()),
        ];
        for (k, v) in &entries {
            let (off, len) = find(&encode(&entries), k).unwrap_or((0, 0));
            assert_eq!(&encode(&entries)[off..off + len], v.as_slice());
        }
        let pack = encode(&entries);
        let (off, len) = find(&pack, b"c").unwrap_or((0, 0));
        assert_eq!(&pack[off..off + len], b"three");
        assert_eq!(find(&pack, b"bb").map(|(_, l)| l), Some(0));
        assert_eq!(find(&pack, b"zz"), None);
        assert_eq!(records(&pack).count(), 3);
        assert_eq!(records(&pack[..7]).count(), 0);
    }

    #[test]
    fn only_the_last_packs_written_and_still_live_are_kept_in_memory() {
        let mut index = PackIndex::default();
        for id in 0..=RECENT_PACKS as u64 {
            let member = vec![b'm', id as u8];
            index.add(member.clone(), id);
            index.keep_recent(id, sled::IVec::from(encode(&[(member, b"entry")])));
        }
        let cached = |index: &PackIndex, id: u8| index.find_member(&[b'm', id]);
        // The oldest fell out: its member is found, to be read from sled.
        assert!(matches!(cached(&index, 0), Some((0, None))));
        assert!(matches!(cached(&index, 1), Some((1, Some(_)))));
        // A pack whose last member leaves is deleted: it is not kept.
        let bytes = index.recent_bytes;
        index.add(vec![b'm', 1], RECENT_PACKS as u64);
        assert!(index.recent.iter().all(|(id, _)| *id != 1));
        assert!(index.recent_bytes < bytes);
        assert!(matches!(cached(&index, 1), Some((id, Some(_))) if id == RECENT_PACKS as u64));
        // Past the byte budget, only the newest is kept.
        let large = sled::IVec::from(vec![0; RECENT_PACK_BYTES]);
        index.keep_recent(1000, large);
        assert_eq!(index.recent.len(), 1);
        assert_eq!(index.recent_bytes, RECENT_PACK_BYTES);
        assert_eq!(index.find_member(b"absent").map(|(id, _)| id), None);
    }

    #[test]
    fn unpacking_the_last_member_empties_the_pack() {
        let mut index = PackIndex::default();
        index.members.insert(b"a".to_vec(), 1);
        index.members.insert(b"b".to_vec(), 1);
        index.live.insert(1, 2);
        assert_eq!(index.unpack(b"a"), Some((1, false)));
        assert_eq!(index.unpack(b"b"), Some((1, true)));
        assert_eq!(index.unpack(b"b"), None);
    }
}
