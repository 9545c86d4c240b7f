//! What each component declared at its last clean commit, as a digest kept
//! in memory.
//!
//! A component whose declarations are those its last clean commit recorded
//! has nothing to reconcile, apply or commit. The component computes the
//! digest of its declarations and looks it up here (see
//! `actors::component::unchanged`); on a match it skips the shards, the
//! sinks and the commit.
//!
//! A digest stands for "the component's entry is what its own last clean
//! commit left", so it must go whenever anything else changes the entry.
//! Every ledger commit goes through one path ([`Ledger::apply`]), which
//! forgets the digest of each component an op names (a memo key aside:
//! it is not the entry) before the op is applied, and all of them on an op
//! that reaches components it does not name (dropping what is below a
//! container). The component sets its digest only after its own commit
//! returned, so its own ops cannot forget it afterwards.
//!
//! Digests live in memory only: a ledger opens with none, and a process's
//! first run of each component takes the full path once. They are keyed by
//! a hash of the component key; the digest itself covers the key, so two
//! components whose keys hash alike never match each other's.

use rustc_hash::FxHashMap as HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::record::LedgerOp;
use super::Ledger;
use crate::model::keycode;
use crate::sync::lock;

/// A digest of a component's declarations (see the module docs): 64 bits
/// of a BLAKE3 hash. Two different sets of declarations of a component
/// digest alike with a chance of 2^-64 per comparison; 128 bits would
/// double the map's memory (about 2 MB per 100k components) for nothing
/// measurable.
pub(crate) type Digest = u64;

/// The number of independently locked parts of the map: components on
/// different runtime threads rarely wait for each other.
const PARTS: usize = 16;

/// The digests of components' declarations at their last clean commit.
#[derive(Default)]
pub(crate) struct Digests {
    parts: [Mutex<HashMap<u64, Digest>>; PARTS],
    /// Whether a digest was ever recorded: until then, forgetting one (for
    /// every op the ledger thread applies) costs a load, not a hash and a
    /// lock. Never reset, so that no digest recorded meanwhile is missed.
    recorded: AtomicBool,
}

impl Digests {
    fn part(&self, hash: u64) -> &Mutex<HashMap<u64, Digest>> {
        &self.parts[(hash % PARTS as u64) as usize]
    }

    /// The digest recorded for `component`, if any.
    pub(crate) fn get(&self, component: &[u8]) -> Option<Digest> {
        let hash = keycode::stable_hash(component);
        lock(self.part(hash)).get(&hash).copied()
    }

    /// Records `digest` for `component`.
    pub(crate) fn set(&self, component: &[u8], digest: Digest) {
        self.recorded.store(true, Ordering::SeqCst);
        let hash = keycode::stable_hash(component);
        lock(self.part(hash)).insert(hash, digest);
    }

    /// Forgets the digest of `component`.
    pub(crate) fn forget(&self, component: &[u8]) {
        if !self.recorded.load(Ordering::SeqCst) {
            return;
        }
        let hash = keycode::stable_hash(component);
        let mut part = lock(self.part(hash));
        if !part.is_empty() {
            part.remove(&hash);
        }
    }

    /// Forgets every digest.
    pub(crate) fn forget_all(&self) {
        for part in &self.parts {
            lock(part).clear();
        }
    }
}

impl Ledger {
    /// What `component` declared at its last clean commit, if the ledger
    /// knows it (see the module docs).
    pub(crate) fn declared_digest(&self, component: &[u8]) -> Option<Digest> {
        self.digests.get(component)
    }

    /// Records what `component` declared at the clean commit it just made
    /// (or, having nothing to commit, found it had made).
    pub(crate) fn record_declared_digest(&self, component: &[u8], digest: Digest) {
        self.digests.set(component, digest);
    }

    /// Forgets the declaration digests of the components `op` may change
    /// the entry of (all of them, for an op that reaches components it
    /// does not name).
    pub(super) fn forget_digests(&self, op: &LedgerOp) {
        match op {
            LedgerOp::DropDescendants { .. } => self.digests.forget_all(),
            // A memo key is not the entry.
            LedgerOp::SetMemo { .. } => {}
            _ => {
                for component in op.component().into_iter().chain(op.parent()) {
                    self.digests.forget(component);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_is_found_for_its_component_until_forgotten() {
        let digests = Digests::default();
        digests.forget(b"a");
        digests.set(b"a", 7);
        digests.set(b"b", 8);
        assert_eq!(digests.get(b"a"), Some(7));
        digests.forget(b"a");
        assert_eq!(digests.get(b"a"), None);
        assert_eq!(digests.get(b"b"), Some(8));
        digests.forget_all();
        assert_eq!(digests.get(b"b"), None);
    }
}
