//! Which component declared each state in a run, per shard.
//!
//! Two components declaring one state is an error of the second. Each
//! shard keeps the paths declared on it in the current run; a component
//! claims a path there when its declaration is reconciled, and finds out
//! then whether another claimed it first.
//!
//! Until a second component declares on a shard in a run, the one that
//! does keeps its paths in a plain list: nothing is hashed or looked up
//! per state, as nothing can be a duplicate of a state the same component
//! declared (it refuses those itself). The second component turns the
//! list into a table, and from then on every claim is looked up. One
//! component declaring many states (a file of rows, a table's snapshot)
//! so claims them at the cost of a list.
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

use crate::interned::Interned;
use crate::model::{keycode, ComponentPath};
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
    /// list or table starts that large instead of growing to it.
    last_declared: usize,
}

/// The paths declared on a shard in one run.
#[derive(Default)]
pub(crate) struct RunDeclared {
    /// The paths, with the component that declared each.
    paths: Paths,
    /// The keys of the components that declared paths here, each once.
    /// A component's path is decoded from its key only to name it in an
    /// error: the claims of a run keep no path of a component that ended.
    components: Interned<Arc<[u8]>>,
}

/// The paths declared on a shard in one run, with the position in
/// [`RunDeclared::components`] of the component that declared each (not a
/// clone of its path, whose reference count every shard would bump for
/// every state).
#[derive(Default)]
struct Paths {
    /// While a single component has declared paths here: its position,
    /// and its paths.
    single: Option<(usize, Vec<Arc<[u8]>>)>,
    /// Once several have: each path, with the component that declared it.
    table: HashMap<Arc<[u8]>, usize>,
    /// How many paths the list or the table starts with room for.
    expected: usize,
}

impl Paths {
    /// Claims `path` for the component at position `me`; the position of
    /// the component that claimed it first, if another did.
    fn claim(&mut self, me: usize, path: Arc<[u8]>) -> Option<usize> {
        match &mut self.single {
            Some((only, list)) if *only == me => {
                list.push(path);
                return None;
            }
            None if self.table.is_empty() => {
                let mut list = Vec::with_capacity(self.expected);
                list.push(path);
                self.single = Some((me, list));
                return None;
            }
            _ => {}
        }
        match self.table().entry(path) {
            Entry::Occupied(first) => Some(*first.get()),
            Entry::Vacant(slot) => {
                slot.insert(me);
                None
            }
        }
    }

    /// The position of the component other than `me` (if `me` is one that
    /// declared here) that claimed `path`, if one did.
    fn claimed_by_other(&mut self, me: Option<usize>, path: &[u8]) -> Option<usize> {
        match &self.single {
            // Only `me` declared here: no other did.
            Some((only, _)) if Some(*only) == me => return None,
            None if self.table.is_empty() => return None,
            _ => {}
        }
        let first = *self.table().get(path)?;
        (Some(first) != me).then_some(first)
    }

    /// The paths as a table: made from the list when a second component
    /// claims or asks.
    fn table(&mut self) -> &mut HashMap<Arc<[u8]>, usize> {
        if let Some((only, list)) = self.single.take() {
            self.table.reserve(self.expected.max(list.len()));
            self.table.extend(list.into_iter().map(|p| (p, only)));
        }
        &mut self.table
    }

    fn len(&self) -> usize {
        self.table.len() + self.single.as_ref().map_or(0, |(_, list)| list.len())
    }
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
            paths: Paths {
                expected,
                ..Paths::default()
            },
            ..RunDeclared::default()
        })
    }

    /// The paths declared in `run_id`, if any were.
    pub(crate) fn get_mut(&mut self, run_id: u64) -> Option<&mut RunDeclared> {
        self.runs.get_mut(&run_id)
    }

    /// Forgets a run that ended; its claims are returned, for the caller
    /// to free once it let go of the lock.
    pub(crate) fn end(&mut self, run_id: u64) -> Option<RunDeclared> {
        let declared = self.runs.remove(&run_id)?;
        self.last_declared = declared.paths.len();
        Some(declared)
    }
}

impl RunDeclared {
    /// The position of the component with key `key`, added if new.
    pub(crate) fn component(&mut self, key: &Arc<[u8]>) -> usize {
        self.components.insert_with(&**key, || Arc::clone(key)).0
    }

    /// How many paths were claimed.
    pub(crate) fn len(&self) -> usize {
        self.paths.len()
    }

    /// The path of the component at position `i`.
    pub(crate) fn path_of(&self, i: usize) -> ComponentPath {
        self.components
            .get(i)
            .and_then(|key| keycode::decode_component_path(key))
            .unwrap_or_default()
    }

    /// Claims `path` for the component at position `me`; the position of
    /// the component that claimed it first, if another did.
    pub(crate) fn claim(&mut self, me: usize, path: &Arc<[u8]>) -> Option<usize> {
        self.paths.claim(me, Arc::clone(path))
    }

    /// [`claim`](Self::claim), taking the path.
    pub(crate) fn claim_owned(&mut self, me: usize, path: Arc<[u8]>) -> Option<usize> {
        self.paths.claim(me, path)
    }

    /// The position of the component other than the one at position `me`
    /// that claimed `path`, if one did.
    pub(crate) fn claimed_by_other(&mut self, me: usize, path: &[u8]) -> Option<usize> {
        self.paths.claimed_by_other(Some(me), path)
    }

    /// The position of the component other than the one keyed `key` that
    /// claimed `path`, if one did.
    pub(crate) fn claimed_by_other_than(&mut self, key: &[u8], path: &[u8]) -> Option<usize> {
        let me = self.components.position(key);
        self.paths.claimed_by_other(me, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::StableKey;

    fn component(name: &str) -> (Arc<[u8]>, ComponentPath) {
        let path = ComponentPath::root().child(StableKey::Str(Arc::from(name)));
        (keycode::component_key_shared(path.segments()), path)
    }

    #[test]
    fn a_path_claimed_by_one_component_is_refused_to_another_in_the_same_run_only() {
        let claims = Claims::default();
        let (a, a_path) = component("a");
        let (b, _) = component("b");
        let p: Arc<[u8]> = Arc::from(&b"p"[..]);
        {
            let mut locked = claims.lock();
            let run = locked.run(1);
            let me = run.component(&a);
            assert_eq!(run.claim(me, &p), None);
            let other = run.component(&b);
            let first = run.claim(other, &p);
            assert_eq!(first.map(|i| run.path_of(i)), Some(a_path.clone()));
            assert_eq!(run.claimed_by_other(other, &p), Some(me));
            assert_eq!(run.claimed_by_other(me, &p), None);
        }
        let mut locked = claims.lock();
        locked.end(1);
        let run = locked.run(2);
        let other = run.component(&b);
        assert_eq!(
            run.claim(other, &p),
            None,
            "a new run starts with no claims"
        );
    }

    #[test]
    fn paths_one_component_listed_are_found_once_a_second_component_declares() {
        let claims = Claims::default();
        let (a, _) = component("a");
        let (b, _) = component("b");
        let paths: Vec<Arc<[u8]>> = (0..100)
            .map(|i| Arc::from(format!("p{i}").as_bytes()))
            .collect();
        let mut locked = claims.lock();
        let run = locked.run(1);
        let me = run.component(&a);
        for p in &paths {
            assert_eq!(run.claim(me, p), None);
        }
        assert_eq!(run.claimed_by_other(me, &paths[7]), None, "its own");
        assert_eq!(
            run.claimed_by_other_than(&component("c").0, &paths[7]),
            Some(me),
            "asked for a component that declared nothing here"
        );
        let other = run.component(&b);
        assert_eq!(run.claim(other, &paths[42]), Some(me));
        assert_eq!(run.claim(other, &Arc::from(&b"q"[..])), None);
        assert_eq!(run.claimed_by_other(other, &paths[0]), Some(me));
        assert_eq!(run.claimed_by_other(me, &paths[0]), None);
    }
}
