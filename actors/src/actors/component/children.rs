//! The children a component mounted in a run: in mounting order, each
//! once.

use crate::interned::Interned;
use crate::model::StableKey;

/// The keys of the children a component mounted in a run, in the order
/// it mounted them, each once (held once: see [`Interned`]).
#[derive(Default)]
pub(crate) struct ChildSet {
    keys: Interned<StableKey>,
}

impl ChildSet {
    /// The keys, in mounting order.
    pub(crate) fn keys(&self) -> &[StableKey] {
        self.keys.values()
    }

    /// Whether `key` was mounted.
    pub(crate) fn contains(&self, key: &StableKey) -> bool {
        self.keys.position(key).is_some()
    }

    /// Adds `key`; `false` if it was mounted already.
    pub(crate) fn insert(&mut self, key: &StableKey) -> bool {
        self.keys.insert_with(key, || key.clone()).1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> StableKey {
        StableKey::Str(format!("k{i}").into())
    }

    #[test]
    fn children_are_kept_in_mounting_order_each_once_and_found_again() {
        let mut set = ChildSet::default();
        for i in (0..1000).rev() {
            assert!(set.insert(&key(i)), "{i} is new");
        }
        for i in 0..1000 {
            assert!(!set.insert(&key(i)), "{i} was mounted");
            assert!(set.contains(&key(i)));
        }
        assert!(!set.contains(&key(1000)));
        let expected: Vec<StableKey> = (0..1000).rev().map(key).collect();
        assert_eq!(set.keys(), expected.as_slice());
    }

    #[test]
    fn keys_of_other_kinds_with_the_same_text_are_distinct_children() {
        let mut set = ChildSet::default();
        assert!(set.insert(&StableKey::Str("1".into())));
        assert!(set.insert(&StableKey::Int(1)));
        assert!(set.insert(&StableKey::Symbol("1".into())));
        assert_eq!(set.keys().len(), 3);
        assert!(set.contains(&StableKey::Int(1)));
        assert!(!set.contains(&StableKey::Int(2)));
    }
}
