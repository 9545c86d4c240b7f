//! The pipeline supervisor: starts the actors of an `App` and stops them.
//!
//! weir runs its own actix `System` on a dedicated thread, with one arbiter
//! (thread) per reconciler shard and one for the sink actors; the ledger
//! actor has a thread of its own. User code and sink calls run on the
//! user's tokio runtime, captured when the `App` is built. Stopping the
//! engine stops every arbiter, joins every thread and closes the ledger.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use actix::{Actor, Addr, Arbiter, ArbiterHandle, System};

use super::ledger::{LedgerActor, LedgerHandle};
use super::reconciler::ReconcilerActor;
use crate::config::{BatchPolicy, RetryPolicy};
use crate::error::{Error, Result};
use crate::group::member::Member;
use crate::ledger::Ledger;

/// Settings fixed when the engine starts.
#[derive(Clone, Debug)]
pub(crate) struct EngineConfig {
    pub shards: usize,
    /// Declarations a component sends to the reconcilers while its code
    /// still runs, per message.
    pub reconcile_chunk: usize,
    pub max_inflight: usize,
    pub batch: BatchPolicy,
    pub retry: RetryPolicy,
    /// Failed runs in a row from which a component is quarantined.
    pub quarantine_after: u32,
    /// Whether connectors take over tables another owner registered.
    pub adopt_tables: bool,
}

struct ActixParts {
    system: System,
    arbiters: Vec<Arbiter>,
    thread: JoinHandle<()>,
}

/// The tasks an App spawned on the user's runtime for its runs (the runs
/// themselves, their components, their sink calls): aborted when the App
/// stops, so that a run left behind (its future was dropped) neither
/// outlives the App nor keeps its ledger open.
#[derive(Clone, Default)]
pub(crate) struct Tasks(Arc<Mutex<TaskList>>);

#[derive(Default)]
struct TaskList {
    handles: Vec<tokio::task::AbortHandle>,
    /// The length at which finished tasks are dropped from the list next.
    prune_at: usize,
}

/// The fewest tasks kept before finished ones are dropped from the list.
const TASKS_PRUNED_FROM: usize = 1024;

impl Tasks {
    /// Keeps `task` to abort when the App stops.
    pub(crate) fn track<T>(&self, task: &tokio::task::JoinHandle<T>) {
        let mut list = self.lock();
        if list.handles.len() >= list.prune_at.max(TASKS_PRUNED_FROM) {
            list.handles.retain(|h| !h.is_finished());
            list.prune_at = 2 * list.handles.len();
        }
        list.handles.push(task.abort_handle());
    }

    /// Aborts every task still running.
    pub(crate) fn abort_all(&self) {
        let handles = std::mem::take(&mut self.lock().handles);
        for handle in handles {
            handle.abort();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TaskList> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Work of an App's runs still going on the user's runtime (component
/// tasks, sink calls), counted, so that a run can wait until what an
/// earlier, cancelled run left has stopped: its components' tasks are
/// aborted and end at once, its sink calls finish (bounded by
/// `RetryPolicy::call_timeout`).
#[derive(Clone, Default)]
pub(crate) struct InFlight(Arc<InFlightInner>);

#[derive(Default)]
struct InFlightInner {
    count: AtomicU64,
    idle: tokio::sync::Notify,
}

/// One piece of work counted by [`InFlight`], until it is dropped.
pub(crate) struct InFlightToken(Arc<InFlightInner>);

impl InFlight {
    /// Counts one more piece of work, until the token is dropped.
    pub(crate) fn token(&self) -> InFlightToken {
        self.0.count.fetch_add(1, Ordering::SeqCst);
        InFlightToken(Arc::clone(&self.0))
    }

    /// Waits until no work is counted.
    pub(crate) async fn idle(&self) {
        loop {
            let notified = self.0.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.0.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for InFlightToken {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// A task that is aborted when its handle is dropped before it ended: the
/// components a cancelled component mounted stop with it.
pub(crate) struct AbortOnDrop<T>(pub(crate) tokio::task::JoinHandle<T>);

impl<T> std::future::Future for AbortOnDrop<T> {
    type Output = std::result::Result<T, tokio::task::JoinError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The running engine of one `App`.
pub(crate) struct Engine {
    pub ledger: Ledger,
    pub ledger_handle: LedgerHandle,
    pub shards: Vec<Addr<ReconcilerActor>>,
    pub sink_arbiter: ArbiterHandle,
    pub user: tokio::runtime::Handle,
    /// What runs spawned on `user`, to abort when the engine stops.
    pub tasks: Tasks,
    /// The component tasks and sink calls still going: a run starts once
    /// none is left (those of a cancelled run).
    pub work: InFlight,
    /// The App's membership of a worker group, if it has one.
    pub member: Option<Arc<Member>>,
    /// The owner of what the app creates, worked out on first use (it
    /// reads the ledger's identity and the host name).
    owner: std::sync::OnceLock<crate::Owner>,
    pub config: EngineConfig,
    pub keys: HashMap<String, Arc<dyn Any + Send + Sync>>,
    pub next_run: AtomicU64,
    /// Updates of one App run one at a time.
    pub run_lock: tokio::sync::Mutex<()>,
    /// Set when the app is asked to stop: runs stop mounting components.
    pub shutdown: crate::live::ShutdownHandle,
    /// How many states each large component declared in its last run, by
    /// component key: its next run sizes its declaration list and path set
    /// for that many at once, instead of growing them (and rehashing every
    /// path) step by step.
    pub declared_last: Mutex<HashMap<Arc<[u8]>, usize>>,
    /// State that connectors keep for the life of the App, by type and
    /// name ([`Ctx::app_state`](crate::Ctx::app_state)).
    pub app_states: AppStates,
    ledger_actor: Mutex<Option<LedgerActor>>,
    actix: Mutex<Option<ActixParts>>,
}

type Started = (
    Vec<Addr<ReconcilerActor>>,
    ArbiterHandle,
    Vec<Arbiter>,
    System,
);

/// Values kept for the life of an App, by type and name.
#[derive(Default)]
pub(crate) struct AppStates(Mutex<HashMap<(std::any::TypeId, String), Arc<dyn Any + Send + Sync>>>);

impl AppStates {
    /// The value of type `T` named `name`, made by `init` the first time.
    pub fn get_or_init<T: Send + Sync + 'static>(
        &self,
        name: &str,
        init: impl FnOnce() -> T,
    ) -> Arc<T> {
        let mut states = crate::run::lock(&self.0);
        let id = (std::any::TypeId::of::<T>(), name.to_string());
        if let Some(state) = states
            .get(&id)
            .and_then(|s| Arc::clone(s).downcast::<T>().ok())
        {
            return state;
        }
        let state = Arc::new(init());
        states.insert(id, Arc::clone(&state) as Arc<dyn Any + Send + Sync>);
        state
    }
}

impl Engine {
    /// The owner of what this engine's app creates: its worker group, or
    /// its ledger.
    pub(crate) fn owner(&self) -> crate::Result<crate::Owner> {
        if let Some(owner) = self.owner.get() {
            return Ok(owner.clone());
        }
        let owner = self.find_owner()?;
        Ok(self.owner.get_or_init(|| owner).clone())
    }

    fn find_owner(&self) -> crate::Result<crate::Owner> {
        if let Some(name) = self.group_name() {
            return Ok(crate::Owner::group(&name));
        }
        let dir = self.ledger.dir();
        let path = std::fs::canonicalize(dir)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| dir.to_string());
        let location = format!("{}:{path}", crate::owner::host_name());
        Ok(crate::Owner::ledger(&self.ledger.id()?, &location))
    }

    pub(crate) fn group_name(&self) -> Option<String> {
        self.member.as_ref().map(|m| m.group.name().to_string())
    }

    pub(crate) fn start(
        ledger: Ledger,
        config: EngineConfig,
        user: tokio::runtime::Handle,
        keys: HashMap<String, Arc<dyn Any + Send + Sync>>,
        member: Option<Arc<Member>>,
    ) -> Result<Engine> {
        let mirror = member
            .as_ref()
            .map(|m| crate::group::mirror::start(Arc::clone(m), &user));
        let (ledger_actor, ledger_handle) = LedgerActor::start(ledger.clone(), mirror)?;
        let (tx, rx) = std::sync::mpsc::channel::<Started>();
        let shard_count = config.shards;
        let shard_ledger = ledger.clone();
        let thread = std::thread::Builder::new()
            .name("weir-actix".into())
            .spawn(move || {
                let sys = actix::System::new();
                sys.block_on(async move {
                    let mut arbiters = Vec::with_capacity(shard_count + 1);
                    let mut shards = Vec::with_capacity(shard_count);
                    for i in 0..shard_count {
                        let arbiter = Arbiter::new();
                        let ledger = shard_ledger.clone();
                        shards.push(ReconcilerActor::start_in_arbiter(
                            &arbiter.handle(),
                            move |_| ReconcilerActor::new(i, ledger),
                        ));
                        arbiters.push(arbiter);
                    }
                    drop(shard_ledger);
                    let sink_arbiter = Arbiter::new();
                    let sink_handle = sink_arbiter.handle();
                    arbiters.push(sink_arbiter);
                    let _ = tx.send((shards, sink_handle, arbiters, System::current()));
                });
                let _ = sys.run();
            })?;
        let (shards, sink_arbiter, arbiters, system) = rx
            .recv()
            .map_err(|_| Error::Shutdown("the actor system failed to start".into()))?;
        Ok(Engine {
            ledger,
            ledger_handle,
            shards,
            sink_arbiter,
            user,
            tasks: Tasks::default(),
            work: InFlight::default(),
            member,
            owner: std::sync::OnceLock::new(),
            config,
            keys,
            next_run: AtomicU64::new(1),
            run_lock: tokio::sync::Mutex::new(()),
            declared_last: Mutex::new(HashMap::new()),
            app_states: AppStates::default(),
            shutdown: crate::live::ShutdownHandle::new(),
            ledger_actor: Mutex::new(Some(ledger_actor)),
            actix: Mutex::new(Some(ActixParts {
                system,
                arbiters,
                thread,
            })),
        })
    }

    pub(crate) fn next_run_id(&self) -> u64 {
        self.next_run.fetch_add(1, Ordering::Relaxed)
    }

    /// Stops every actor and thread. Idempotent.
    pub(crate) fn stop(&self) {
        let parts = match self.actix.lock() {
            Ok(mut p) => p.take(),
            Err(p) => p.into_inner().take(),
        };
        if let Some(parts) = parts {
            for arbiter in &parts.arbiters {
                arbiter.stop();
            }
            for arbiter in parts.arbiters {
                let _ = arbiter.join();
            }
            parts.system.stop();
            let _ = parts.thread.join();
        }
        let actor = match self.ledger_actor.lock() {
            Ok(mut a) => a.take(),
            Err(p) => p.into_inner().take(),
        };
        if let Some(mut actor) = actor {
            actor.stop();
        }
        // A run left behind (its future was dropped) can no longer commit:
        // its tasks are aborted, so that they let go of the ledger. Nothing
        // writes the ledger any more: another App may open it, even before
        // those tasks are dropped.
        self.tasks.abort_all();
        self.ledger.release_lock();
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}
