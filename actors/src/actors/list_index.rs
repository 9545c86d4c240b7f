//! Positions of a list's items by a key: a short list is searched, a long
//! one gets a map. The lists a component builds per shard or per sink
//! (providers, sink groups) hold one or two items almost always, and a
//! map allocated per component cost more than the search.

use std::hash::Hash;

use rustc_hash::FxHashMap;

/// The most items searched in the list; beyond, a map is kept.
const SEARCHED: usize = 8;

/// The index of a list whose items have a key (`key_of`), kept beside it.
pub(crate) struct ListIndex<K> {
    map: Option<FxHashMap<K, usize>>,
}

impl<K> Default for ListIndex<K> {
    fn default() -> Self {
        Self { map: None }
    }
}

impl<K: Copy + Eq + Hash> ListIndex<K> {
    /// The position in `list` of the item whose key is `key`.
    pub(crate) fn position<T>(
        &self,
        list: &[T],
        key: K,
        key_of: impl Fn(&T) -> K,
    ) -> Option<usize> {
        match &self.map {
            Some(map) => map.get(&key).copied(),
            None => list.iter().position(|item| key_of(item) == key),
        }
    }

    /// Notes the item just pushed at the end of `list`.
    pub(crate) fn pushed<T>(&mut self, list: &[T], key_of: impl Fn(&T) -> K) {
        match &mut self.map {
            Some(map) => {
                if let Some(last) = list.last() {
                    map.insert(key_of(last), list.len() - 1);
                }
            }
            None if list.len() > SEARCHED => {
                let map = list
                    .iter()
                    .enumerate()
                    .map(|(i, item)| (key_of(item), i))
                    .collect();
                self.map = Some(map);
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ListIndex;

    #[test]
    fn items_are_found_by_key_before_and_after_the_list_gets_a_map() {
        let mut list: Vec<u32> = Vec::new();
        let mut index = ListIndex::default();
        let key = |item: &u32| u64::from(*item) * 10;
        for n in 0..40u32 {
            assert_eq!(index.position(&list, key(&n), key), None);
            list.push(n);
            index.pushed(&list, key);
            for m in 0..=n {
                assert_eq!(index.position(&list, key(&m), key), Some(m as usize));
            }
        }
    }
}
