//! Runs restricted to some root-level components: [`RunScope`] (and
//! [`App::scoped`](crate::App::scoped), which runs within one).
//!
//! A scoped run runs the root component's code as usual, but only the
//! root-level components (those mounted directly under the root with
//! [`Ctx::mount`](crate::Ctx::mount) or [`Ctx::mount_each`](crate::Ctx::mount_each)) whose keys are in the scope run.
//! The others are neither run nor deleted: `mount_each` skips their items,
//! `mount` of one returns an error for which
//! [`Error::is_out_of_scope`](crate::Error::is_out_of_scope) is true, and
//! the end of the run does not take them for removed. Everything below a
//! root-level component lives and dies with it. What the root declares
//! itself (tables, containers mounted with
//! [`mount_target`](crate::mount_target)) is always in scope.
//!
//! Retrying just the components that failed is one use
//! ([`App::failed_components`](crate::App::failed_components) gives their paths); a member of a worker
//! group running only the partitions it holds is another.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use crate::model::{IntoStableKey, StableKey};

/// The root-level components a run covers: a set of keys, or a predicate
/// over keys. Cheap to clone.
///
/// ```
/// use weir_actors::{IntoStableKey, RunScope, StableKey};
///
/// let scope = RunScope::keys(["a.md", "b.md"]);
/// assert!(scope.contains(&"a.md".into_stable_key()));
/// assert!(!scope.contains(&"c.md".into_stable_key()));
/// let even = RunScope::filter(|k| matches!(k, StableKey::Int(i) if i % 2 == 0));
/// assert!(even.contains(&StableKey::Int(4)));
/// ```
#[derive(Clone)]
pub struct RunScope(Arc<Inner>);

enum Inner {
    Keys(HashSet<StableKey>),
    Filter(Box<dyn Fn(&StableKey) -> bool + Send + Sync>),
}

impl RunScope {
    /// The root-level components with these keys.
    pub fn keys<K: IntoStableKey>(keys: impl IntoIterator<Item = K>) -> Self {
        Self(Arc::new(Inner::Keys(
            keys.into_iter()
                .map(IntoStableKey::into_stable_key)
                .collect(),
        )))
    }

    /// The root-level components whose keys `f` accepts. `f` is called
    /// for every root-level component mounted; keep it cheap.
    pub fn filter(f: impl Fn(&StableKey) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(Inner::Filter(Box::new(f))))
    }

    /// Whether the root-level component `key` is in the scope.
    pub fn contains(&self, key: &StableKey) -> bool {
        match &*self.0 {
            Inner::Keys(keys) => keys.contains(key),
            Inner::Filter(f) => f(key),
        }
    }
}

impl fmt::Debug for RunScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.0 {
            Inner::Keys(keys) => f.debug_tuple("RunScope::keys").field(&keys.len()).finish(),
            Inner::Filter(_) => f.write_str("RunScope::filter(..)"),
        }
    }
}
