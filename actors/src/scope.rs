//! Runs restricted to some root-level components: [`RunScope`] and
//! [`App::scoped`].
//!
//! A scoped run runs the root component's code as usual, but only the
//! root-level components (those mounted directly under the root with
//! [`Ctx::mount`] or [`Ctx::mount_each`]) whose keys are in the scope run.
//! The others are neither run nor deleted: `mount_each` skips their items,
//! `mount` of one returns an error for which
//! [`Error::is_out_of_scope`](crate::Error::is_out_of_scope) is true, and
//! the end of the run does not take them for removed. Everything below a
//! root-level component lives and dies with it. What the root declares
//! itself (tables, containers mounted with
//! [`mount_target`](crate::mount_target)) is always in scope.
//!
//! Retrying just the components that failed is one use
//! ([`App::failed_components`] gives their paths); a member of a worker
//! group running only the partitions it holds is another.

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use crate::app::{App, Mode};
use crate::ctx::Ctx;
use crate::error::Result;
use crate::live::RunReport;
use crate::model::{IntoStableKey, StableKey};
use crate::run::{PreviewAction, UpdateStats};

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

/// An [`App`] whose runs cover only the root-level components of a
/// [`RunScope`] (see [`App::scoped`]).
#[derive(Debug)]
pub struct Scoped<'a> {
    app: &'a App,
    scope: RunScope,
}

impl App {
    /// This App, with runs restricted to the root-level components of
    /// `scope`: the others are neither run nor deleted (see the
    /// [module](crate::RunScope)'s rules).
    ///
    /// ```
    /// use weir_actors::{App, Result, RunScope};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<()> {
    /// let dir = tempfile::tempdir()?;
    /// let app = App::builder("docs").ledger_path(dir.path()).build().await?;
    /// let files = ["a.md", "b.md"];
    /// // Only b.md runs; a.md is neither run nor deleted.
    /// let stats = app
    ///     .scoped(RunScope::keys(["b.md"]))
    ///     .run(move |ctx| async move {
    ///         ctx.mount_each(files, |f| f.to_string(), |_ctx, _f| async { Ok(()) })
    ///             .await
    ///     })
    ///     .await?;
    /// assert_eq!(stats.components, 2); // the root and b.md
    /// # Ok(())
    /// # }
    /// ```
    pub fn scoped(&self, scope: RunScope) -> Scoped<'_> {
        Scoped { app: self, scope }
    }
}

impl Scoped<'_> {
    /// [`App::update`], within the scope.
    ///
    /// # Errors
    /// As [`App::update`].
    pub async fn update<F, Fut, T>(&self, f: F) -> Result<T>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let scope = Some(self.scope.clone());
        let (value, _, _) = self.app.execute(f, Mode::Apply, scope).await?;
        Ok(value)
    }

    /// [`App::run`], within the scope.
    ///
    /// # Errors
    /// As [`App::run`].
    pub async fn run<F, Fut>(&self, f: F) -> Result<UpdateStats>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        let scope = Some(self.scope.clone());
        let (_, stats, _) = self.app.execute(f, Mode::Apply, scope).await?;
        Ok(stats)
    }

    /// [`App::run_report`], within the scope.
    ///
    /// # Errors
    /// As [`App::run_report`].
    pub async fn run_report<F, Fut>(&self, f: F) -> Result<RunReport>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        let scope = Some(self.scope.clone());
        let (stats, failures) = self.app.execute_collecting(f, scope).await?;
        Ok(RunReport { stats, failures })
    }

    /// [`App::preview`], within the scope.
    ///
    /// # Errors
    /// As [`App::preview`].
    pub async fn preview<F, Fut, T>(&self, f: F) -> Result<Vec<PreviewAction>>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let scope = Some(self.scope.clone());
        let (_, _, actions) = self.app.execute(f, Mode::Preview, scope).await?;
        Ok(actions)
    }
}
