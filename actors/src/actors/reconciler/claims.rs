//! Which component declared each state in a run, per shard.
//!
//! Two components declaring one state is an error of the second. Each
//! shard keeps the paths declared on it in the current run; a component
//! claims a path there when its declaration is reconciled, and finds out
//! then whether another claimed it first.
//!
//! The claims of a shard are shared rather than private to its actor: a
//! component found unchanged (see `component::unchanged`) claims its
//! paths itself, without a message to the shard, and learns at once
//! whether another component declared one of them first. The shard holds
//! the lock only while it claims a batch's paths, never while a handler
//! runs.

use rustc_hash::FxHashMap as HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::model::ComponentPath;
use crate::sync::lock;

/// The claims of one shard, for the runs under way.
#[derive(Default)]
pub(crate) struct Claims {
    inner: Mutex<ClaimsByRun>,
}

/// The claims of one shard, locked: by run.
#[derive(Default)]
pub(crate) struct ClaimsByRun {
    runs: HashMap<u64, RunDeclared>,
    /// How many paths the last run that ended declared here: a new run's
    /// map starts that large instead of growing (and rehashing) to it.
    last_declared: usize,
}

/// The paths declared on a shard in one run.
pub(crate) struct RunDeclared {
    /// Each path, with the position in `components` of the component
    /// that declared it (not a clone of its path, whose reference count
    /// every shard would bump for every state).
    paths: HashMap<Arc<[u8]>, usize>,
    /// The components that declared paths here, each once.
    components: Vec<ComponentPath>,
    /// Their positions, by component key.
    by_key: HashMap<Arc<[u8]>, usize>,
}

impl Claims {
    /// The claims, locked.
    pub(crate) fn lock(&self) -> MutexGuard<'_, ClaimsByRun> {
        lock(&self.inner)
    }
}

impl ClaimsByRun {
    /// The paths declared in `run_id` so far.
    pub(crate) fn run(&mut self, run_id: u64) -> &mut RunDeclared {
        let expected = self.last_declared;
        self.runs.entry(run_id).or_insert_with(|| RunDeclared {
            paths: HashMap::with_capacity_and_hasher(expected, Default::default()),
            components: Vec::new(),
            by_key: HashMap::default(),
        })
    }

    /// The paths declared in `run_id`, if any were.
    pub(crate) fn get(&self, run_id: u64) -> Option<&RunDeclared> {
        self.runs.get(&run_id)
    }

    /// Forgets a run that ended.
    pub(crate) fn end(&mut self, run_id: u64) {
        if let Some(declared) = self.runs.remove(&run_id) {
            self.last_declared = declared.paths.len();
        }
    }
}

impl RunDeclared {
    /// The position of the component with key `key`, added if new.
    pub(crate) fn component(&mut self, key: &Arc<[u8]>, path: &ComponentPath) -> usize {
        if let Some(&i) = self.by_key.get(key) {
            return i;
        }
        let i = self.components.len();
        self.components.push(path.clone());
        self.by_key.insert(Arc::clone(key), i);
        i
    }

    /// The path of the component at position `i`.
    pub(crate) fn path_of(&self, i: usize) -> ComponentPath {
        self.components.get(i).cloned().unwrap_or_default()
    }

    /// Claims `path` for the component at position `me`; the position of
    /// the component that claimed it first, if another did.
    pub(crate) fn claim(&mut self, me: usize, path: &Arc<[u8]>) -> Option<usize> {
        match self.paths.entry(Arc::clone(path)) {
            Entry::Occupied(first) => Some(*first.get()),
            Entry::Vacant(slot) => {
                slot.insert(me);
                None
            }
        }
    }

    /// The position of the component that claimed `path`, if one did.
    pub(crate) fn claimed(&self, path: &[u8]) -> Option<usize> {
        self.paths.get(path).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::StableKey;

    fn component(name: &str) -> (Arc<[u8]>, ComponentPath) {
        let path = ComponentPath::root().child(StableKey::Str(Arc::from(name)));
        (Arc::from(name.as_bytes()), path)
    }

    #[test]
    fn a_path_claimed_by_one_component_is_refused_to_another_in_the_same_run_only() {
        let claims = Claims::default();
        let (a, a_path) = component("a");
        let (b, b_path) = component("b");
        let p: Arc<[u8]> = Arc::from(&b"p"[..]);
        {
            let mut locked = claims.lock();
            let run = locked.run(1);
            let me = run.component(&a, &a_path);
            assert_eq!(run.claim(me, &p), None);
            let other = run.component(&b, &b_path);
            let first = run.claim(other, &p);
            assert_eq!(first.map(|i| run.path_of(i)), Some(a_path.clone()));
        }
        let mut locked = claims.lock();
        locked.end(1);
        let run = locked.run(2);
        let other = run.component(&b, &b_path);
        assert_eq!(
            run.claim(other, &p),
            None,
            "a new run starts with no claims"
        );
    }
}
