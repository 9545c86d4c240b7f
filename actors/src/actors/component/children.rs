//! The children a component mounted in a run: in mounting order, each
//! once.

use std::hash::BuildHasher;

use hashbrown::hash_table::Entry;
use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;

use crate::error::{Error, Result};
use crate::model::StableKey;

/// The keys of the children a component mounted in a run, in the order
/// it mounted them, each once.
///
/// The keys are held once, in a list; the table that finds a key holds
/// only positions in it (four bytes a slot rather than a key's 24), which
/// matters for a root that mounts a child per item of a large source.
#[derive(Default)]
pub(crate) struct ChildSet {
    keys: Vec<StableKey>,
    positions: HashTable<u32>,
}

impl ChildSet {
    /// The keys, in mounting order.
    pub(crate) fn keys(&self) -> &[StableKey] {
        &self.keys
    }

    /// Whether `key` was mounted.
    pub(crate) fn contains(&self, key: &StableKey) -> bool {
        let keys = &self.keys;
        self.positions
            .find(hash(key), |&at| keys.get(at as usize) == Some(key))
            .is_some()
    }

    /// Adds `key`; `Ok(false)` if it was mounted already. A component
    /// cannot mount more than `u32::MAX` children in one run.
    pub(crate) fn insert(&mut self, key: &StableKey) -> Result<bool> {
        let at = u32::try_from(self.keys.len()).map_err(|_| {
            Error::Usage(format!(
                "more than {} children mounted in one run",
                u32::MAX
            ))
        })?;
        let keys = &self.keys;
        let entry = self.positions.entry(
            hash(key),
            |&i| keys.get(i as usize) == Some(key),
            |&i| keys.get(i as usize).map_or(0, hash),
        );
        match entry {
            Entry::Occupied(_) => Ok(false),
            Entry::Vacant(slot) => {
                slot.insert(at);
                self.keys.push(key.clone());
                Ok(true)
            }
        }
    }
}

fn hash(key: &StableKey) -> u64 {
    FxBuildHasher.hash_one(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> StableKey {
        StableKey::Str(format!("k{i}").into())
    }

    #[test]
    fn children_are_kept_in_mounting_order_each_once_and_found_again() -> Result<()> {
        let mut set = ChildSet::default();
        for i in (0..1000).rev() {
            assert!(set.insert(&key(i))?, "{i} is new");
        }
        for i in 0..1000 {
            assert!(!set.insert(&key(i))?, "{i} was mounted");
            assert!(set.contains(&key(i)));
        }
        assert!(!set.contains(&key(1000)));
        let expected: Vec<StableKey> = (0..1000).rev().map(key).collect();
        assert_eq!(set.keys(), expected.as_slice());
        Ok(())
    }

    #[test]
    fn keys_of_other_kinds_with_the_same_text_are_distinct_children() -> Result<()> {
        let mut set = ChildSet::default();
        assert!(set.insert(&StableKey::Str("1".into()))?);
        assert!(set.insert(&StableKey::Int(1))?);
        assert!(set.insert(&StableKey::Symbol("1".into()))?);
        assert_eq!(set.keys().len(), 3);
        assert!(set.contains(&StableKey::Int(1)));
        assert!(!set.contains(&StableKey::Int(2)));
        Ok(())
    }
}
