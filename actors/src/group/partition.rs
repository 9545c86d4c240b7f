//! Which partition a root-level component belongs to.

use std::fmt;

use crate::model::{keycode, StableKey};

/// A partition of a worker group: one of the `P` data partitions, or the
/// root partition (what the root component declares itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PartitionId {
    /// The root component's own target states (tables, containers).
    Root,
    /// Data partition `n`, from 0 to `P - 1`.
    Data(u32),
}

impl PartitionId {
    /// The partition's number in the group's tables: `-1` for the root.
    pub fn as_i32(self) -> i32 {
        match self {
            PartitionId::Root => -1,
            PartitionId::Data(n) => i32::try_from(n).unwrap_or(i32::MAX),
        }
    }

    /// The partition numbered `n` in the group's tables.
    pub fn from_i32(n: i32) -> Option<Self> {
        match n {
            -1 => Some(PartitionId::Root),
            n => u32::try_from(n).ok().map(PartitionId::Data),
        }
    }
}

impl fmt::Display for PartitionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PartitionId::Root => f.write_str("root"),
            PartitionId::Data(n) => write!(f, "{n}"),
        }
    }
}

/// The data partition of the root-level component `key` in a group of
/// `partitions` partitions: the stable hash (FNV-1a, then a splitmix
/// finaliser) of the key's encoding as a one-segment component path,
/// modulo the partition count. Stable across processes, machines and
/// versions of weir that read the same ledger format.
pub fn partition_of(key: &StableKey, partitions: u32) -> u32 {
    let encoded = keycode::component_key(std::slice::from_ref(key));
    let hash = keycode::stable_hash(&encoded);
    (hash % u64::from(partitions.max(1))) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::IntoStableKey;

    #[test]
    fn keys_spread_over_every_partition_about_evenly() {
        let p = 64u32;
        let mut counts = vec![0u32; p as usize];
        for i in 0..64_000 {
            let key = format!("docs/file-{i}.md").into_stable_key();
            counts[partition_of(&key, p) as usize] += 1;
        }
        let (min, max) = (counts.iter().min(), counts.iter().max());
        assert!(
            matches!((min, max), (Some(&lo), Some(&hi)) if lo > 850 && hi < 1150),
            "{counts:?}"
        );
    }

    #[test]
    fn a_keys_partition_does_not_change_between_builds() {
        // Pinned: a change would move every component of existing groups.
        let keys = ["a.md".into_stable_key(), 42i64.into_stable_key()];
        let got: Vec<u32> = keys.iter().map(|k| partition_of(k, 64)).collect();
        assert_eq!(got, PINNED);
    }

    /// Computed once; see the test above.
    const PINNED: [u32; 2] = [62, 19];

    #[test]
    fn the_root_partition_is_minus_one_in_the_tables_and_back() {
        assert_eq!(PartitionId::Root.as_i32(), -1);
        assert_eq!(PartitionId::from_i32(-1), Some(PartitionId::Root));
        assert_eq!(PartitionId::from_i32(7), Some(PartitionId::Data(7)));
        assert_eq!(PartitionId::from_i32(-2), None);
        assert_eq!(PartitionId::Data(3).to_string(), "3");
    }
}
