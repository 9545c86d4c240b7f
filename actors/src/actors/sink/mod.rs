//! The sink actor: one per sink identity per run. It gathers the actions of
//! many components, applies them in batches, and on failure splits a batch
//! along component boundaries and retries, so that only the components
//! whose actions really fail, fail.
//!
//! This file holds the actor: its batches, splits and retries. A
//! component's actions reach it grouped by sink ([`group`]) and are
//! acknowledged to the component's waiter ([`unit`](mod@unit)); [`call`] makes one
//! call of the sink function, and [`activity`] tells the sinks when the
//! run has nothing more coming.

mod activity;
mod call;
mod group;
mod unit;

pub(crate) use activity::Activity;
pub(crate) use call::backoff;
use call::call_sink;
pub(crate) use group::SinkGroups;
pub(crate) use unit::{PlannedAction, UnitRef, UnitWaiter};

use std::collections::VecDeque;
use std::hash::BuildHasher;

use rustc_hash::{FxBuildHasher, FxHashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, ActorFutureExt, AsyncContext, Context, Handler, Message, WrapFuture};
use tracing::Instrument;

use crate::actors::ledger::LedgerHandle;
use crate::config::{BatchPolicy, RetryPolicy};
use crate::error::{Error, Result};
use crate::group::Fence;
use crate::ledger::record::Intent;
use crate::model::action::ActionCounts;
use crate::model::sink::{EncodedAction, SinkCore};

/// One unit's actions in a sink.
struct Part {
    unit: UnitRef,
    actions: Vec<PlannedAction>,
    /// Failed calls of this part alone.
    attempts: u32,
}

struct Batch {
    parts: Vec<Part>,
}

/// A new batch waiting for its intents, then for its turn to be applied.
struct Staged {
    batch: Batch,
    /// The result of writing its intents, once there is one.
    intents: Option<Result<()>>,
}

/// Everything a sink actor needs from its run.
#[derive(Clone)]
pub(crate) struct SinkEnv {
    pub ledger: LedgerHandle,
    pub user: tokio::runtime::Handle,
    /// Where the sink calls spawned on `user` are kept, to abort.
    pub tasks: crate::actors::tasks::Tasks,
    /// The App's work in flight, which sink calls count in.
    pub work: crate::actors::tasks::InFlight,
    pub batch: BatchPolicy,
    pub retry: RetryPolicy,
    pub activity: Arc<Activity>,
    /// Intent batch ids written in this run, deleted when the run ends.
    pub intent_ids: Arc<Mutex<Vec<u64>>>,
    /// In a worker group, the App's membership: each call is fenced with
    /// the epochs of the partitions its actions are written for.
    pub member: Option<Arc<crate::group::member::Member>>,
}

/// The address of a sink actor, counting the messages on their way to it.
#[derive(Clone)]
pub(crate) struct SinkHandle {
    pub addr: actix::Addr<SinkActor>,
    pub queued: Arc<AtomicUsize>,
}

impl SinkHandle {
    pub(crate) fn send(&self, msg: ApplyActions) {
        self.queued.fetch_add(1, Ordering::SeqCst);
        self.addr.do_send(msg);
    }
}

/// Apply these actions of a unit.
pub(crate) struct ApplyActions {
    pub unit: UnitRef,
    pub actions: Vec<PlannedAction>,
}

impl Message for ApplyActions {
    type Result = ();
}

/// Nothing more is coming for now: flush what is pending.
pub(crate) struct Flush;

impl Message for Flush {
    type Result = ();
}

pub(crate) struct SinkActor {
    core: Arc<SinkCore>,
    env: SinkEnv,
    /// `ApplyActions` messages sent but not handled yet.
    queued: Arc<AtomicUsize>,
    pending: VecDeque<Part>,
    pending_actions: usize,
    /// Halves of split batches, and parts whose retry is due, run before
    /// new ones.
    ready: VecDeque<Batch>,
    /// The next new batch, whose intents are being written while the
    /// batch before it is applied.
    staged: Option<Staged>,
    /// Calls running now.
    in_flight: usize,
    /// The keys (hashed, with how many holders each) of the calls running
    /// now, when calls may overlap, and of the parts waiting for their
    /// retry's backoff: no other call on them starts meanwhile, so one
    /// key's actions are applied in order. A part waiting for its backoff
    /// holds only its keys, not a call slot: other components' batches go
    /// on.
    busy: FxHashMap<u64, u32>,
    /// Calls running that were started alone (with no keys recorded):
    /// nothing starts beside them.
    alone: usize,
    /// The next batch could not start beside the calls running now: wait
    /// for one of them to end before trying again.
    blocked: bool,
    linger_expired: bool,
    linger_armed: bool,
    /// Sink labels whose failure series were exported (at zero) already.
    exported: std::collections::HashSet<String>,
}

impl SinkActor {
    pub(crate) fn new(core: Arc<SinkCore>, env: SinkEnv, queued: Arc<AtomicUsize>) -> Self {
        Self {
            core,
            env,
            queued,
            pending: VecDeque::new(),
            pending_actions: 0,
            ready: VecDeque::new(),
            staged: None,
            in_flight: 0,
            busy: FxHashMap::default(),
            alone: 0,
            blocked: false,
            linger_expired: false,
            linger_armed: false,
            exported: std::collections::HashSet::new(),
        }
    }

    fn max_actions(&self) -> usize {
        self.env.batch.max_actions.max(1)
    }

    /// How many calls may run at once.
    fn concurrency(&self) -> usize {
        self.core.concurrency.load(Ordering::Relaxed).max(1)
    }

    /// Reserves the keys of `batch` for a call that starts now, if it may:
    /// below the sink's concurrency, and sharing no key with a call already
    /// running or a part waiting for its retry (so one key's actions are
    /// applied in order). Returns the hashed keys to release when the call
    /// is over: none when the call runs alone (calls one at a time).
    fn claim(&mut self, batch: &Batch) -> Option<Vec<u64>> {
        let limit = self.concurrency();
        if self.in_flight >= limit || self.alone > 0 {
            // Full, or a call started alone runs (the concurrency was
            // raised since): nothing joins it.
            return None;
        }
        if limit == 1 && self.busy.is_empty() {
            self.alone += 1;
            return Some(Vec::new());
        }
        let keys = keys_of(&batch.parts);
        if keys.iter().any(|k| self.busy.contains_key(k)) {
            return None;
        }
        if limit == 1 {
            self.alone += 1;
            return Some(Vec::new());
        }
        self.reserve(&keys);
        Some(keys)
    }

    fn reserve(&mut self, keys: &[u64]) {
        for &k in keys {
            *self.busy.entry(k).or_insert(0) += 1;
        }
    }

    fn unreserve(&mut self, keys: &[u64]) {
        for k in keys {
            if let std::collections::hash_map::Entry::Occupied(mut e) = self.busy.entry(*k) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
    }

    /// Ends a call: frees its slot and its keys.
    fn release(&mut self, keys: Vec<u64>) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.blocked = false;
        if keys.is_empty() {
            self.alone = self.alone.saturating_sub(1);
        }
        self.unreserve(&keys);
    }

    /// Ends the call of a part that will be retried after `delay`: its
    /// slot is free at once for other batches, its keys stay reserved
    /// until the retry is due, and it then goes first in line.
    fn wait_for_retry(
        &mut self,
        part: Batch,
        claimed: Vec<u64>,
        delay: Duration,
        ctx: &mut Context<Self>,
    ) {
        self.release(claimed);
        let keys = keys_of(&part.parts);
        self.reserve(&keys);
        ctx.run_later(delay, move |act, ctx| {
            act.unreserve(&keys);
            act.blocked = false;
            act.ready.push_front(part);
            act.maybe_flush(ctx);
        });
    }

    /// Moves batches along the pipeline: a new batch is staged (its
    /// intents written) as soon as it is due, even while calls run;
    /// batches start in order, retried and split ones first, then the
    /// staged one once its intents are durable, each when the sink's
    /// concurrency and the keys of the calls running allow.
    fn maybe_flush(&mut self, ctx: &mut Context<Self>) {
        loop {
            self.start_due(ctx);
            if self.staged.is_some() || self.pending.is_empty() {
                return;
            }
            let full = self.pending_actions >= self.max_actions();
            // Idle: no component can produce more, and every message
            // already sent to this sink has been handled.
            let idle = self.env.activity.idle() && self.queued.load(Ordering::SeqCst) == 0;
            if !(full || self.linger_expired || idle) {
                if !self.linger_armed {
                    self.linger_armed = true;
                    ctx.run_later(self.env.batch.linger, |act, ctx| {
                        act.linger_armed = false;
                        act.linger_expired = true;
                        act.maybe_flush(ctx);
                    });
                }
                return;
            }
            let batch = self.take_batch();
            if !batch.parts.is_empty() {
                self.stage(batch, ctx);
            }
        }
    }

    /// Starts what may start now: split halves first, then the staged
    /// batch once its intents are durable.
    fn start_due(&mut self, ctx: &mut Context<Self>) {
        while !self.blocked {
            if let Some(batch) = self.ready.pop_front() {
                if let Some(batch) = self.try_start(batch, ctx) {
                    self.ready.push_front(batch);
                }
                continue;
            }
            match self.staged.take() {
                // Without durable intents, applying could orphan what it
                // creates: apply nothing, fail the batch.
                Some(Staged {
                    batch,
                    intents: Some(Err(e)),
                }) => self.fail_all(batch, e),
                Some(Staged {
                    batch,
                    intents: Some(Ok(())),
                }) => {
                    if let Some(batch) = self.try_start(batch, ctx) {
                        self.staged = Some(Staged {
                            batch,
                            intents: Some(Ok(())),
                        });
                    }
                }
                other => {
                    self.staged = other;
                    break;
                }
            }
        }
    }

    /// Takes whole pending parts, up to `max_actions` actions (at least one part).
    fn take_batch(&mut self) -> Batch {
        let max = self.max_actions();
        let mut parts = Vec::new();
        let mut size = 0;
        while let Some(part) = self.pending.front() {
            if !parts.is_empty() && size + part.actions.len() > max {
                break;
            }
            let Some(part) = self.pending.pop_front() else {
                break;
            };
            self.pending_actions -= part.actions.len();
            if part.unit.abandoned() {
                // Its component was cancelled: nothing of it is applied.
                continue;
            }
            size += part.actions.len();
            parts.push(part);
        }
        if self.pending.is_empty() {
            self.linger_expired = false;
        }
        Batch { parts }
    }

    /// Starts writing a new batch's intents (once per batch: split halves
    /// and retried parts carry none) and keeps the batch until it can be
    /// applied.
    fn stage(&mut self, mut batch: Batch, ctx: &mut Context<Self>) {
        let intents: Vec<Intent> = batch
            .parts
            .iter_mut()
            .flat_map(|p| p.actions.iter_mut().filter_map(|a| a.intent.take()))
            .collect();
        if intents.is_empty() {
            self.staged = Some(Staged {
                batch,
                intents: Some(Ok(())),
            });
            return;
        }
        self.staged = Some(Staged {
            batch,
            intents: None,
        });
        let env = self.env.clone();
        let write = async move {
            let id = env.ledger.write_intents(intents).await?;
            match env.intent_ids.lock() {
                Ok(mut ids) => ids.push(id),
                Err(p) => p.into_inner().push(id),
            }
            Ok(())
        };
        ctx.spawn(write.into_actor(self).map(|res: Result<()>, act, ctx| {
            if let Some(staged) = &mut act.staged {
                staged.intents = Some(res);
            }
            act.maybe_flush(ctx);
        }));
    }

    /// Starts a batch whose intents are durable if the calls running allow
    /// it; else gives it back and waits for one of them to end.
    fn try_start(&mut self, batch: Batch, ctx: &mut Context<Self>) -> Option<Batch> {
        match self.claim(&batch) {
            Some(keys) => {
                self.start(batch, keys, ctx);
                None
            }
            None => {
                self.blocked = true;
                Some(batch)
            }
        }
    }

    /// Applies a batch whose intents are durable and whose keys are
    /// claimed.
    fn start(&mut self, batch: Batch, claimed: Vec<u64>, ctx: &mut Context<Self>) {
        self.in_flight += 1;
        self.call(batch, claimed, ctx);
    }

    /// Calls the sink with a batch that holds a call slot and its keys,
    /// and, once the call is over, acknowledges, splits or retries it.
    fn call(&mut self, mut batch: Batch, claimed: Vec<u64>, ctx: &mut Context<Self>) {
        // The actions of cancelled components are not applied any more.
        batch.parts.retain(|p| !p.unit.abandoned());
        if batch.parts.is_empty() {
            self.release(claimed);
            return;
        }
        let fence = match self.fence_of(&batch) {
            Ok(fence) => fence,
            Err(refused) => {
                self.fail_unfenced(batch, &refused);
                self.release(claimed);
                return;
            }
        };
        let env = self.env.clone();
        let core = Arc::clone(&self.core);
        let actions: Vec<EncodedAction> = batch
            .parts
            .iter_mut()
            .flat_map(|p| p.actions.iter_mut().map(|a| a.action.for_call()))
            .collect();
        let label = self.label(&batch);
        metrics::histogram!(crate::metrics::SINK_BATCH_SIZE, "sink" => label.clone())
            .record(actions.len() as f64);
        // A sink's failure series exist from its first call, at zero, so
        // that dashboards show 0 rather than no data.
        if !self.exported.contains(&label) {
            for name in [
                crate::metrics::SINK_FAILURES,
                crate::metrics::SINK_RETRIES,
                crate::metrics::SINK_SPLITS,
            ] {
                metrics::counter!(name, "sink" => label.clone()).increment(0);
            }
            self.exported.insert(label.clone());
        }
        // The connector's own span (its tables) opens inside this one.
        let span = tracing::debug_span!(
            "sink_call",
            sink = %label,
            components = batch.parts.len(),
            actions = actions.len()
        );
        let fut = async move {
            let started = std::time::Instant::now();
            crate::fault::point(crate::fault::SINK_BEFORE_APPLY);
            let res = call_sink(core, &env, actions, fence).await;
            if res.is_ok() {
                crate::fault::point(crate::fault::SINK_AFTER_APPLY);
            }
            metrics::histogram!(crate::metrics::SINK_APPLY_DURATION, "sink" => label.clone())
                .record(started.elapsed().as_secs_f64());
            let outcome = if res.is_ok() { "ok" } else { "failed" };
            metrics::counter!(crate::metrics::SINK_CALLS, "sink" => label, "outcome" => outcome)
                .increment(1);
            res
        }
        .instrument(span);
        ctx.spawn(fut.into_actor(self).map(move |res, act, ctx| {
            match act.finish(batch, res) {
                Some((part, delay)) => act.wait_for_retry(part, claimed, delay, ctx),
                None => act.release(claimed),
            }
            act.maybe_flush(ctx);
        }));
    }

    /// In a worker group, the fence of a call of `batch`: the partitions
    /// of its components with the epochs held now. A sink that does not
    /// check fences is refused there (the error to fail the batch with).
    fn fence_of(&self, batch: &Batch) -> std::result::Result<Option<Fence>, String> {
        let Some(member) = &self.env.member else {
            return Ok(None);
        };
        if !self.core.checks_fence.load(Ordering::Relaxed) {
            return Err(format!(
                "in worker group {}, every sink must check its calls' fence (TargetActionSink::checks_fence), so that a member that lost a partition writes nothing for it; this one does not: write to PostgreSQL, or make the sink check Fence::current()",
                member.group.name()
            ));
        }
        Ok(Some(member.fence(
            batch.parts.iter().filter_map(|p| p.unit.partition()),
        )))
    }

    /// Fails every part of a batch with a sink that cannot be fenced,
    /// without calling it.
    fn fail_unfenced(&mut self, batch: Batch, refused: &str) {
        for part in batch.parts {
            part.unit.ack(
                part.actions.len(),
                Err(Error::Sink {
                    sink: part.unit.provider.to_string(),
                    actions: part.actions.len(),
                    keys: String::new(),
                    cause: Box::new(Error::permanent(refused)),
                }),
            );
        }
    }

    /// Settles a call refused by the fence: the parts of the partitions
    /// taken over are dropped (their member no longer holds them, and
    /// their new owner runs them), the others go on as a batch of their
    /// own, without counting an attempt.
    fn drop_fenced(&mut self, batch: Batch, err: &Error) {
        let stale = fenced_partitions(err);
        let member = self.env.member.clone();
        if let Some(member) = &member {
            member.drop_partitions(&stale);
        }
        let group = member
            .as_ref()
            .map_or_else(String::new, |m| m.group.name().to_string());
        let (dropped, kept): (Vec<Part>, Vec<Part>) = batch.parts.into_iter().partition(|p| {
            stale.is_empty() || p.unit.partition().is_none_or(|q| stale.contains(&q))
        });
        metrics::counter!(crate::metrics::GROUP_FENCED_WRITES).increment(dropped.len() as u64);
        for part in dropped {
            let partitions = part.unit.partition().into_iter().collect();
            part.unit.ack(
                part.actions.len(),
                Err(Error::Fenced {
                    group: group.clone(),
                    partitions,
                }),
            );
        }
        if !kept.is_empty() {
            self.ready.push_front(Batch { parts: kept });
        }
    }

    /// Fails every part of a batch without retrying.
    fn fail_all(&mut self, batch: Batch, err: Error) {
        for part in batch.parts {
            part.unit.ack(
                part.actions.len(),
                Err(Error::Sink {
                    sink: part.unit.provider.to_string(),
                    actions: part.actions.len(),
                    keys: String::new(),
                    cause: Box::new(Error::msg(format!(
                        "the ledger could not record the intended changes, nothing was applied: {err}"
                    ))),
                }),
            );
        }
    }

    /// The metrics label of a batch: its first unit's root provider.
    fn label(&self, batch: &Batch) -> String {
        batch
            .parts
            .first()
            .map_or_else(String::new, |p| p.unit.label.to_string())
    }

    /// Settles a call's batch: acknowledges it, or splits it (the halves
    /// go first in `ready`), or returns its one part with the delay after
    /// which to call again, or fails it.
    fn finish(&mut self, mut batch: Batch, res: Result<()>) -> Option<(Batch, Duration)> {
        let label = self.label(&batch);
        let err = match res {
            Ok(()) => {
                let mut kinds = ActionCounts::default();
                for part in &batch.parts {
                    for a in part.actions.iter().filter(|a| !a.refresh) {
                        kinds.add(a.action.kind);
                    }
                }
                for (kind, n) in kinds.counted() {
                    metrics::counter!(crate::metrics::ACTIONS, "provider" => label.clone(), "kind" => kind.as_str())
                        .increment(n);
                }
                for part in batch.parts {
                    part.unit.ack(part.actions.len(), Ok(()));
                }
                return None;
            }
            Err(e) => e,
        };
        if err.is_fenced() {
            self.drop_fenced(batch, &err);
            return None;
        }
        if batch.parts.len() > 1 {
            metrics::counter!(crate::metrics::SINK_SPLITS, "sink" => label).increment(1);
            // Split along component boundaries and try each half.
            let second = batch.parts.split_off(batch.parts.len() / 2);
            self.ready.push_front(Batch { parts: second });
            self.ready.push_front(batch);
            return None;
        }
        let mut part = batch.parts.pop()?;
        part.attempts += 1;
        let retry = &self.env.retry;
        if err.is_retriable() && part.attempts < retry.max_attempts {
            metrics::counter!(crate::metrics::SINK_RETRIES, "sink" => label).increment(1);
            let delay = backoff(retry, part.attempts);
            return Some((Batch { parts: vec![part] }, delay));
        }
        let keys = part
            .actions
            .iter()
            .take(3)
            .map(|a| a.key.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let more = if part.actions.len() > 3 { ", ..." } else { "" };
        metrics::counter!(crate::metrics::SINK_FAILURES, "sink" => label).increment(1);
        part.unit.ack(
            part.actions.len(),
            Err(Error::Sink {
                sink: part.unit.provider.to_string(),
                actions: part.actions.len(),
                keys: format!("{keys}{more}"),
                cause: Box::new(err),
            }),
        );
        None
    }
}

/// The partitions a fenced write names as taken over (empty: all of the
/// call's).
fn fenced_partitions(err: &Error) -> Vec<crate::group::PartitionId> {
    match err {
        Error::Fenced { partitions, .. } => partitions.clone(),
        Error::Sink { cause, .. } | Error::Reconcile { cause, .. } => fenced_partitions(cause),
        _ => Vec::new(),
    }
}

/// The hashed keys of the actions of `parts`.
fn keys_of(parts: &[Part]) -> Vec<u64> {
    parts
        .iter()
        .flat_map(|p| p.actions.iter())
        .map(|a| FxBuildHasher.hash_one(&a.key))
        .collect()
}

impl Actor for SinkActor {
    type Context = Context<Self>;
}

impl Handler<ApplyActions> for SinkActor {
    type Result = ();

    fn handle(&mut self, msg: ApplyActions, ctx: &mut Context<Self>) {
        self.queued.fetch_sub(1, Ordering::SeqCst);
        if msg.actions.is_empty() {
            self.maybe_flush(ctx);
            return;
        }
        self.pending_actions += msg.actions.len();
        // Parts never exceed one call, so batches take whole parts.
        let max = self.max_actions();
        if msg.actions.len() <= max {
            self.pending.push_back(Part {
                unit: msg.unit,
                actions: msg.actions,
                attempts: 0,
            });
        } else {
            let mut actions = msg.actions.into_iter();
            loop {
                let chunk: Vec<PlannedAction> = actions.by_ref().take(max).collect();
                if chunk.is_empty() {
                    break;
                }
                self.pending.push_back(Part {
                    unit: msg.unit.clone(),
                    actions: chunk,
                    attempts: 0,
                });
            }
        }
        self.maybe_flush(ctx);
    }
}

impl Handler<Flush> for SinkActor {
    type Result = ();

    fn handle(&mut self, _msg: Flush, ctx: &mut Context<Self>) {
        self.maybe_flush(ctx);
    }
}
