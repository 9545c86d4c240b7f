//! The pipeline supervisor: starts the actors of an `App` and stops them.
//!
//! weir runs its own actix `System` on a dedicated thread, with one arbiter
//! (thread) per reconciler shard and one for the sink actors; the ledger
//! actor has a thread of its own. Those threads run as batch work (see
//! [`threads`](super::threads)). User code and sink calls run on the
//! user's tokio runtime, captured when the `App` is built. Stopping the
//! engine stops every arbiter, joins every thread and closes the ledger.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use actix::{Actor, Addr, Arbiter, ArbiterHandle, System};

use super::ledger::{LedgerActor, LedgerHandle};
use super::reconciler::{Claims, ReconcilerActor, SharedReads};
pub(crate) use super::tasks::{AbortOnDrop, InFlight, Tasks};
use super::threads::run_as_batch_work;
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

/// The running engine of one `App`.
pub(crate) struct Engine {
    pub ledger: Ledger,
    pub ledger_handle: LedgerHandle,
    pub shards: Vec<Addr<ReconcilerActor>>,
    /// Each shard's claims: which component declared each state in the
    /// current run (see [`Claims`]).
    pub claims: Vec<Arc<Claims>>,
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
    pub shutdown: crate::shutdown::ShutdownHandle,
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
        let mut states = crate::sync::lock(&self.0);
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
        let claims: Vec<Arc<Claims>> = (0..shard_count).map(|_| Arc::default()).collect();
        let shard_claims = claims.clone();
        let reads = Arc::new(SharedReads::default());
        let shard_ledger = ledger.clone();
        let shard_user = user.clone();
        let thread = std::thread::Builder::new()
            .name("weir-actix".into())
            .spawn(move || {
                let sys = actix::System::new();
                sys.block_on(async move {
                    let mut arbiters = Vec::with_capacity(shard_count + 1);
                    let mut shards = Vec::with_capacity(shard_count);
                    for (i, claims) in shard_claims.into_iter().enumerate() {
                        let arbiter = Arbiter::new();
                        arbiter.spawn_fn(run_as_batch_work);
                        let (ledger, user) = (shard_ledger.clone(), shard_user.clone());
                        let reads = Arc::clone(&reads);
                        shards.push(ReconcilerActor::start_in_arbiter(
                            &arbiter.handle(),
                            move |_| ReconcilerActor::new(i, ledger, claims, reads, user),
                        ));
                        arbiters.push(arbiter);
                    }
                    drop(shard_ledger);
                    let sink_arbiter = Arbiter::new();
                    sink_arbiter.spawn_fn(run_as_batch_work);
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
            claims,
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
            shutdown: crate::shutdown::ShutdownHandle::new(),
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
