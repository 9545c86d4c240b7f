//! The in-memory owner index: which component holds each target state.
//!
//! It is derived from the component entries (rebuilt when the ledger opens)
//! and kept up to date by every commit, so the ledger writes nothing per
//! state to maintain it. It maps a 64-bit hash of each state path to the
//! components holding a state with that hash; a lookup returns candidates
//! that the caller confirms in their entries, so hash collisions cost a
//! read, never a wrong answer. About 40 bytes per state.

use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use crate::interned::Interned;
use crate::model::keycode::stable_hash;

enum Slot {
    One(u32),
    Many(Vec<u32>),
}

#[derive(Default)]
pub(crate) struct OwnerIndex {
    slots: HashMap<u64, Slot>,
    /// The components, each interned once; a slot names them by position.
    components: Interned<Arc<[u8]>>,
}

impl OwnerIndex {
    fn intern(&mut self, component: &[u8]) -> u32 {
        let (at, _) = self
            .components
            .insert_with(component, || Arc::from(component));
        id_of(at)
    }

    pub(crate) fn add(&mut self, path: &[u8], component: &[u8]) {
        let id = self.intern(component);
        self.add_id(stable_hash(path), id);
    }

    /// Adds `component` as a holder of each path of which `hashes` holds
    /// the [`stable_hash`]: worked out where the paths were at hand (a
    /// component's thread, as it encodes its entry), so that the ledger's
    /// thread reads none of them.
    pub(crate) fn add_all(&mut self, component: &[u8], hashes: &[u64]) {
        let id = self.intern(component);
        self.slots.reserve(hashes.len());
        for &h in hashes {
            self.add_id(h, id);
        }
    }

    fn add_id(&mut self, h: u64, id: u32) {
        match self.slots.get_mut(&h) {
            None => {
                self.slots.insert(h, Slot::One(id));
            }
            Some(Slot::One(existing)) => {
                if *existing != id {
                    let first = *existing;
                    self.slots.insert(h, Slot::Many(vec![first, id]));
                }
            }
            Some(Slot::Many(ids)) => {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
    }

    /// Removes one holder of `path`. A colliding path held by the same
    /// component keeps the slot only if still needed; a stale candidate is
    /// harmless since lookups confirm in the entry.
    pub(crate) fn remove(&mut self, path: &[u8], component: &[u8]) {
        let Some(id) = self.components.position(component).map(id_of) else {
            return;
        };
        let h = stable_hash(path);
        let empty = match self.slots.get_mut(&h) {
            Some(Slot::One(existing)) => *existing == id,
            Some(Slot::Many(ids)) => {
                ids.retain(|i| *i != id);
                ids.is_empty()
            }
            None => false,
        };
        if empty {
            self.slots.remove(&h);
        }
    }

    /// The components that may hold `path`.
    pub(crate) fn candidates(&self, path: &[u8]) -> Vec<Arc<[u8]>> {
        let ids: &[u32] = match self.slots.get(&stable_hash(path)) {
            None => &[],
            Some(Slot::One(id)) => std::slice::from_ref(id),
            Some(Slot::Many(ids)) => ids,
        };
        ids.iter()
            .filter_map(|id| self.components.get(*id as usize).cloned())
            .collect()
    }
}

/// The id of the component at position `at`. Ids are 32 bits, as the
/// slots hold them: the index is not built for more than `u32::MAX`
/// components (hundreds of gigabytes of their keys).
fn id_of(at: usize) -> u32 {
    at as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_return_the_holders_of_a_path() {
        let mut index = OwnerIndex::default();
        index.add(b"p1", b"c1");
        index.add(b"p2", b"c2");
        index.add(b"p1", b"c3");
        let got: Vec<Vec<u8>> = index.candidates(b"p1").iter().map(|c| c.to_vec()).collect();
        assert_eq!(got, vec![b"c1".to_vec(), b"c3".to_vec()]);
        index.remove(b"p1", b"c1");
        index.remove(b"p1", b"c3");
        assert!(index.candidates(b"p1").is_empty());
        assert_eq!(index.candidates(b"p2").len(), 1);
    }

    #[test]
    fn adding_a_components_paths_at_once_is_adding_them_one_by_one() {
        let paths: Vec<Vec<u8>> = (0..50).map(|i| format!("p{i}").into_bytes()).collect();
        let mut at_once = OwnerIndex::default();
        at_once.add(b"p7", b"other");
        let hashes: Vec<u64> = paths.iter().map(|p| stable_hash(p)).collect();
        at_once.add_all(b"c", &hashes);
        let mut one_by_one = OwnerIndex::default();
        one_by_one.add(b"p7", b"other");
        for p in &paths {
            one_by_one.add(p, b"c");
        }
        for p in paths
            .iter()
            .map(Vec::as_slice)
            .chain([b"p7".as_slice(), b"p50"])
        {
            assert_eq!(at_once.candidates(p), one_by_one.candidates(p));
        }
        assert_eq!(at_once.candidates(b"p7").len(), 2);
        assert_eq!(at_once.candidates(b"p3").len(), 1);
    }
}
