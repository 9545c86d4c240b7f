//! [`Interned`]: values kept once each, in a list, and found by a table of
//! their positions in it.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use hashbrown::hash_table::Entry;
use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;

/// Values kept once each, in the order they were first inserted, each
/// found by its position.
///
/// A value is held once, in the list; the table that finds it holds only
/// its position (eight bytes a slot, rather than a key and a position in
/// a map beside the list). Used where the engine keeps a key per
/// component: the children a component mounted in a run, the components
/// that declared on a shard in a run, the components of the owner index.
#[derive(Debug)]
pub(crate) struct Interned<K> {
    values: Vec<K>,
    positions: HashTable<usize>,
}

impl<K> Default for Interned<K> {
    fn default() -> Self {
        Self {
            values: Vec::new(),
            positions: HashTable::new(),
        }
    }
}

impl<K: Hash + Eq> Interned<K> {
    /// The values, in the order they were first inserted.
    pub(crate) fn values(&self) -> &[K] {
        &self.values
    }

    /// The value at position `at`.
    pub(crate) fn get(&self, at: usize) -> Option<&K> {
        self.values.get(at)
    }

    /// The position of `value`, if it was inserted.
    pub(crate) fn position<Q>(&self, value: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let values = &self.values;
        self.positions
            .find(hash(value), |&at| is_at(values, at, value))
            .copied()
    }

    /// The position of `value`, inserted at the end if it is new, and
    /// whether it was.
    pub(crate) fn insert_with<Q>(&mut self, value: &Q, owned: impl FnOnce() -> K) -> (usize, bool)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let values = &self.values;
        let entry = self.positions.entry(
            hash(value),
            |&at| is_at(values, at, value),
            |&at| values.get(at).map_or(0, |v| hash(v.borrow())),
        );
        match entry {
            Entry::Occupied(at) => (*at.get(), false),
            Entry::Vacant(slot) => {
                let at = self.values.len();
                slot.insert(at);
                self.values.push(owned());
                (at, true)
            }
        }
    }
}

fn hash<Q: Hash + ?Sized>(value: &Q) -> u64 {
    FxBuildHasher.hash_one(value)
}

fn is_at<K: Borrow<Q>, Q: Eq + ?Sized>(values: &[K], at: usize, value: &Q) -> bool {
    values.get(at).is_some_and(|v| v.borrow() == value)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn values_are_kept_once_in_insertion_order_and_found_by_position() {
        let mut interned: Interned<String> = Interned::default();
        for i in (0..1000).rev() {
            let v = format!("v{i}");
            assert_eq!(
                interned.insert_with(v.as_str(), || v.clone()),
                (999 - i, true)
            );
        }
        for i in 0..1000 {
            let v = format!("v{i}");
            assert_eq!(
                interned.insert_with(v.as_str(), || v.clone()),
                (999 - i, false)
            );
            assert_eq!(interned.position(v.as_str()), Some(999 - i));
            assert_eq!(interned.get(999 - i), Some(&v));
        }
        assert_eq!(interned.position("v1000"), None);
        assert_eq!(interned.values().len(), 1000);
        assert_eq!(interned.values()[0], "v999");
    }

    #[test]
    fn shared_byte_keys_are_found_by_their_bytes() {
        let mut interned: Interned<Arc<[u8]>> = Interned::default();
        let key: Arc<[u8]> = Arc::from(&b"component"[..]);
        assert_eq!(interned.insert_with(&*key, || Arc::clone(&key)), (0, true));
        assert_eq!(interned.position(&b"component"[..]), Some(0));
        assert_eq!(interned.position(&b"other"[..]), None);
    }
}
