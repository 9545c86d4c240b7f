//! The component context handed to user code.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::actors::component::{self, ComponentState};
use crate::error::{Error, Result};
use crate::model::{ComponentPath, IntoStableKey, StableKey};

/// The context of one running component: declare target states through it,
/// mount child components with it, and read context values from it.
///
/// `Ctx` is cheap to clone and `Send + Sync`.
#[derive(Clone)]
pub struct Ctx {
    pub(crate) state: Arc<ComponentState>,
}

impl fmt::Debug for Ctx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ctx")
            .field("path", &self.state.path)
            .finish()
    }
}

impl Ctx {
    pub(crate) fn from_state(state: Arc<ComponentState>) -> Self {
        Self { state }
    }

    /// Runs `f` as the child component `key` of this component and waits
    /// until it has been reconciled, applied and committed.
    ///
    /// # Errors
    /// Returns the child's error when it fails (it is also reported by the
    /// update), or an error when `key` was already mounted in this run, or
    /// (at the root of a scoped run, see [`App::scoped`](crate::App::scoped))
    /// when `key` is outside the scope: then
    /// [`Error::is_out_of_scope`] is true, and the child is neither run nor
    /// deleted.
    pub async fn mount<K, F, Fut, T>(&self, key: K, f: F) -> Result<T>
    where
        K: IntoStableKey,
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        component::mount(&self.state, key.into_stable_key(), false, f).await
    }

    /// [`Ctx::mount`], exempt from the run's scope: for the root's own
    /// containers.
    pub(crate) async fn mount_unscoped<F, Fut, T>(&self, key: StableKey, f: F) -> Result<T>
    where
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        component::mount(&self.state, key, true, f).await
    }

    /// Runs one child component per item, keyed by `key_fn`, concurrently
    /// (at most `max_inflight_components` at once); each commits on its own.
    ///
    /// Returns `Ok` even when some children fail: their failures are
    /// reported by the update at the end.
    ///
    /// # Errors
    /// When two items have the same key, or a key was already mounted in
    /// this run; then no child runs.
    pub async fn mount_each<I, T, K, KF, F, Fut>(&self, items: I, key_fn: KF, f: F) -> Result<()>
    where
        I: IntoIterator<Item = T>,
        T: Send + 'static,
        KF: Fn(&T) -> K,
        K: IntoStableKey,
        F: Fn(Ctx, T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        component::mount_each(&self.state, items, key_fn, None, f).await
    }

    /// Like [`Ctx::mount_each`], skipping the children whose work is known
    /// to be done: for each item, `memo_fn` computes a memo key (any
    /// serializable value; it is fingerprinted). A child whose memo key
    /// equals the one recorded when it last committed successfully is not
    /// run: its code is not called, and its target states (and its own
    /// children) stay exactly as they are, with nothing reconciled, applied
    /// or written to the ledger for it.
    ///
    /// The memo key must capture everything the child's declarations depend
    /// on: the item's content (for a file, its content fingerprint), a
    /// version of the code that you bump when its logic changes, and the
    /// [`memo_key`](crate::TargetStateProvider::memo_key) of every provider
    /// it declares into (so that a table rebuilt after a destructive schema
    /// change gets its rows again). `memo_fn` runs in the child's task,
    /// so computing keys of many items is spread over the runtime's threads.
    ///
    /// A child is never memoized when `memo_fn` returns an error (it then
    /// runs, and meets the problem itself), when it failed in its last run,
    /// when an earlier run was interrupted while applying its actions, or
    /// when another component took over one of its target states.
    ///
    /// # Errors
    /// As [`Ctx::mount_each`].
    pub async fn mount_each_memo<I, T, K, KF, MF, M, F, Fut>(
        &self,
        items: I,
        key_fn: KF,
        memo_fn: MF,
        f: F,
    ) -> Result<()>
    where
        I: IntoIterator<Item = T>,
        T: Send + 'static,
        KF: Fn(&T) -> K,
        K: IntoStableKey,
        MF: Fn(&T) -> Result<M> + Send + Sync + 'static,
        M: serde::Serialize,
        F: Fn(Ctx, T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        let memo: component::MemoFn<T> = Arc::new(move |item: &T| {
            let key = memo_fn(item).ok()?;
            Some(crate::model::Fingerprint::from(&key).as_bytes().to_vec())
        });
        component::mount_each(
            &self.state,
            items,
            key_fn,
            Some(component::Memo::equal(memo)),
            f,
        )
        .await
    }

    /// The value provided for `key` with
    /// [`AppBuilder::provide_key`](crate::AppBuilder::provide_key).
    ///
    /// # Errors
    /// When no value of type `T` was provided under the key's name.
    pub fn get_key<T: Send + Sync + 'static>(&self, key: &ContextKey<T>) -> Result<&T> {
        self.state
            .run
            .engine
            .keys
            .get(key.name())
            .and_then(|v| v.downcast_ref::<T>())
            .ok_or_else(|| Error::MissingContextKey(key.name().to_string()))
    }

    /// State of type `T` kept for the life of this component's App, under
    /// `name`: made by `init` the first time it is asked for, then the same
    /// value for every run and component of the App, and never shared with
    /// another App. Connectors keep in it what their target states share
    /// across components, such as the sinks of one database, so that their
    /// actions are batched together.
    ///
    /// ```
    /// # use weir_actors::{App, Result};
    /// # async fn example(app: App) -> Result<()> {
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// app.run(|ctx| async move {
    ///     let calls = ctx.app_state("calls", || AtomicU64::new(0));
    ///     calls.fetch_add(1, Ordering::Relaxed);
    ///     Ok(())
    /// })
    /// .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn app_state<T: Send + Sync + 'static>(
        &self,
        name: &str,
        init: impl FnOnce() -> T,
    ) -> Arc<T> {
        self.state.run.engine.app_states.get_or_init(name, init)
    }

    /// Marks this component as failed with `error`, even if its code then
    /// returns `Ok`: nothing it declared is applied, and the update reports
    /// it. For connectors whose own checks reject a declaration (a bad row,
    /// an unsafe path), like the engine does for its own.
    pub fn fail_component(&self, error: &Error) {
        self.state.poison(error);
    }

    /// The owner of what this app creates (see [`App::owner`](crate::App::owner)),
    /// which connectors register with the tables they create.
    ///
    /// # Errors
    /// When the ledger cannot be read.
    pub fn owner(&self) -> Result<crate::Owner> {
        self.state.run.engine.owner()
    }

    /// Whether this app takes over tables another owner registered (see
    /// [`AppBuilder::adopt_tables`](crate::AppBuilder::adopt_tables)).
    pub fn adopts_tables(&self) -> bool {
        self.state.run.engine.config.adopt_tables
    }

    /// The path of this component (`/` for the root).
    pub fn path(&self) -> &ComponentPath {
        &self.state.path
    }
}

/// A typed name for a value provided to every component of an `App`, such
/// as a database pool. Its name, not the connection, identifies the
/// external resource in target-state keys, so credentials can change
/// without losing track of what was created.
pub struct ContextKey<T> {
    name: Arc<str>,
    _value: PhantomData<fn() -> T>,
}

impl<T> ContextKey<T> {
    /// A key named `name`.
    pub fn new(name: &str) -> Self {
        Self {
            name: Arc::from(name),
            _value: PhantomData,
        }
    }

    /// The key's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl<T> Clone for ContextKey<T> {
    fn clone(&self) -> Self {
        Self {
            name: Arc::clone(&self.name),
            _value: PhantomData,
        }
    }
}

impl<T> fmt::Debug for ContextKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ContextKey({:?})", self.name)
    }
}
