//! One update run: its registry of providers, sinks, failures and statistics.

use rustc_hash::FxHashMap as HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::Actor;

use crate::actors::pipeline::Engine;
use crate::actors::reconciler::Orphan;
use crate::actors::sink::{Activity, SinkActor, SinkEnv, SinkHandle};
use crate::error::ComponentFailure;
use crate::model::provider::{ChildGeneration, ProviderCore};
use crate::model::sink::SinkCore;
use crate::model::{ActionKind, ComponentPath, StableKey};

use crate::sync::lock;

/// What an update did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UpdateStats {
    /// Target states created.
    pub created: u64,
    /// Target states updated.
    pub updated: u64,
    /// Target states deleted.
    pub deleted: u64,
    /// Declared target states whose reconcile returned `None`.
    pub unchanged: u64,
    /// Components that failed.
    pub failed_components: u64,
    /// How long the update took.
    pub elapsed: Duration,
    /// Failed components that have failed
    /// [`quarantine_after`](crate::AppBuilder::quarantine_after) runs in a
    /// row or more, this one included.
    pub quarantined: u64,
    /// Components that ran (including the root).
    pub components: u64,
    /// Components skipped because their memo key was unchanged (see
    /// [`Ctx::mount_each_memo`](crate::Ctx::mount_each_memo)); their target
    /// states were kept as they were.
    pub memoized: u64,
}

/// An action a preview found, without applying it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PreviewAction {
    /// The provider of the target state.
    pub provider: String,
    /// The key of the target state.
    pub key: StableKey,
    /// What would be done.
    pub kind: ActionKind,
    /// The component that declared (or last owned) the state.
    pub component: ComponentPath,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub created: AtomicU64,
    pub updated: AtomicU64,
    pub deleted: AtomicU64,
    pub unchanged: AtomicU64,
    pub components: AtomicU64,
    pub memoized: AtomicU64,
}

impl Counters {
    pub(crate) fn count_action(&self, kind: ActionKind, n: u64) {
        let c = match kind {
            ActionKind::Create => &self.created,
            ActionKind::Update => &self.updated,
            ActionKind::Delete => &self.deleted,
        };
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// The shared state of one run.
pub(crate) struct Run {
    pub id: u64,
    pub engine: Arc<Engine>,
    pub preview: bool,
    /// `App::drop_state`: nothing may be declared.
    pub dropping: bool,
    /// Resolved providers by encoded path: root providers, children of
    /// containers and attachments. Orphans find their handler here.
    pub providers: Mutex<HashMap<Arc<[u8]>, Arc<ProviderCore>>>,
    sinks: Mutex<HashMap<u64, Arc<SinkHandle>>>,
    pub activity: Arc<Activity>,
    pub intent_ids: Arc<Mutex<Vec<u64>>>,
    pub failures: Mutex<Vec<ComponentFailure>>,
    pub counters: Counters,
    /// States no longer declared by components that succeeded.
    pub orphans: Mutex<Vec<Orphan>>,
    /// Components no longer mounted by a parent that succeeded.
    pub removed: Mutex<Vec<ComponentPath>>,
    pub preview_actions: Mutex<Vec<PreviewAction>>,
    /// Containers whose component failed in this run, with the generation
    /// their children had before: the run's new generation is not trusted.
    failed_containers: Mutex<HashMap<Arc<[u8]>, ChildGeneration>>,
    pub metrics: crate::metrics::RunMetrics,
    pub inflight: Arc<tokio::sync::Semaphore>,
    /// Components of this run cancelled before they committed: their
    /// intents outlive the run (see [`Run::note_cancelled`]).
    cancelled: AtomicU64,
    /// Memo keys recorded once the component's orphans are deleted.
    deferred_memos: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    /// The root-level components this run covers; all when `None`.
    pub scope: Option<crate::scope::RunScope>,
    /// In a worker group: what the member holds for this run.
    pub group: Option<crate::group::run::GroupRun>,
}

impl Run {
    pub(crate) fn new(
        engine: Arc<Engine>,
        preview: bool,
        dropping: bool,
        scope: Option<crate::scope::RunScope>,
        group: Option<crate::group::run::GroupRun>,
    ) -> Arc<Run> {
        let metrics = crate::metrics::RunMetrics::new(engine.config.shards);
        let inflight = Arc::new(tokio::sync::Semaphore::new(
            engine.config.max_inflight.max(1),
        ));
        Arc::new(Run {
            id: engine.next_run_id(),
            engine,
            preview,
            dropping,
            providers: Mutex::new(HashMap::default()),
            sinks: Mutex::new(HashMap::default()),
            activity: Arc::new(Activity::new()),
            intent_ids: Arc::new(Mutex::new(Vec::new())),
            failures: Mutex::new(Vec::new()),
            counters: Counters::default(),
            orphans: Mutex::new(Vec::new()),
            removed: Mutex::new(Vec::new()),
            preview_actions: Mutex::new(Vec::new()),
            failed_containers: Mutex::new(HashMap::default()),
            metrics,
            inflight,
            cancelled: AtomicU64::new(0),
            deferred_memos: Mutex::new(HashMap::default()),
            scope,
            group,
        })
    }

    /// Keeps a successful component's memo key until the states it no
    /// longer declares are deleted, at the end of the run.
    pub(crate) fn defer_memo(&self, component: Vec<u8>, memo: Vec<u8>) {
        lock(&self.deferred_memos).insert(component, memo);
    }

    /// The memo key kept for `component` by [`Run::defer_memo`], once its
    /// orphans are deleted.
    pub(crate) fn take_deferred_memo(&self, component: &[u8]) -> Option<Vec<u8>> {
        lock(&self.deferred_memos).remove(component)
    }

    /// Notes a component cancelled before it committed. Sink calls it
    /// started may still be going: the run's intents are then left in the
    /// journal, and the next run folds them in once those calls ended.
    pub(crate) fn note_cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the root-level component `key` is in this run's scope.
    pub(crate) fn in_scope(&self, key: &StableKey) -> bool {
        self.scope.as_ref().is_none_or(|s| s.contains(key))
    }

    /// In a worker group, the partition of a component (by its key).
    pub(crate) fn partition_of(&self, component: &[u8]) -> Option<crate::group::PartitionId> {
        let group = self.group.as_ref()?;
        Some(crate::group::member::component_partition(
            component,
            group.holding.partitions,
        ))
    }

    /// Whether this run may apply what is in the root partition: outside
    /// a worker group, or for the member holding it.
    pub(crate) fn root_writable(&self) -> bool {
        self.group.as_ref().is_none_or(|g| g.holding.root())
    }

    /// Whether this run may write the ledger records of `component`: all
    /// but those of the root partition in a member that does not hold it.
    pub(crate) fn may_write(&self, component: &[u8]) -> bool {
        self.root_writable()
            || self.partition_of(component) != Some(crate::group::PartitionId::Root)
    }

    /// Whether a component of this run was cancelled before it committed.
    pub(crate) fn had_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed) > 0
    }

    /// The sink actor of a sink identity, started on first use.
    pub(crate) fn sink(&self, core: &Arc<SinkCore>) -> Arc<SinkHandle> {
        let mut sinks = lock(&self.sinks);
        if let Some(handle) = sinks.get(&core.id) {
            // Not the handle's address: cloning one allocates.
            return Arc::clone(handle);
        }
        let env = SinkEnv {
            ledger: self.engine.ledger_handle.clone(),
            user: self.engine.user.clone(),
            tasks: self.engine.tasks.clone(),
            work: self.engine.work.clone(),
            batch: self.engine.config.batch,
            retry: self.engine.config.retry,
            activity: Arc::clone(&self.activity),
            intent_ids: Arc::clone(&self.intent_ids),
            member: self.engine.member.clone(),
        };
        let core = Arc::clone(core);
        let id = core.id;
        let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let for_actor = Arc::clone(&queued);
        let addr = SinkActor::start_in_arbiter(&self.engine.sink_arbiter, move |_| {
            SinkActor::new(core, env, for_actor)
        });
        self.activity.register(addr.clone());
        let handle = Arc::new(SinkHandle { addr, queued });
        sinks.insert(id, Arc::clone(&handle));
        handle
    }

    pub(crate) fn note_failed_container(&self, path: &Arc<[u8]>, committed: ChildGeneration) {
        lock(&self.failed_containers).insert(Arc::clone(path), committed);
    }

    /// The generation to judge the children of `provider` by: its own,
    /// unless its container failed in this run, in which case the children
    /// keep their records and only may be missing.
    pub(crate) fn trusted_generation(&self, provider: &ProviderCore) -> Option<ChildGeneration> {
        let container = provider.path.container.as_ref()?;
        let committed = *lock(&self.failed_containers).get(container)?;
        let current = provider
            .resolved
            .get()
            .map(|r| r.generation)
            .unwrap_or_default();
        Some(ChildGeneration {
            current: committed.current.max(current.current),
            destructive_floor: committed.destructive_floor,
        })
    }

    /// Forgets the run's sink actors, so they stop once idle.
    pub(crate) fn release_sinks(&self) {
        lock(&self.sinks).clear();
        self.activity.clear();
    }

    pub(crate) fn fail(&self, failure: ComponentFailure) {
        lock(&self.failures).push(failure);
    }

    pub(crate) fn register_provider(&self, core: &Arc<ProviderCore>) {
        lock(&self.providers).insert(Arc::clone(&core.path.enc), Arc::clone(core));
    }

    pub(crate) fn provider(&self, enc: &[u8]) -> Option<Arc<ProviderCore>> {
        lock(&self.providers).get(enc).cloned()
    }
}
