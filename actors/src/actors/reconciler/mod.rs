//! The reconciler actor: one per shard, owning the target states whose
//! encoded path hashes to it.
//!
//! A component sends one [`ReconcileBatch`] per shard (never one message per
//! state). The shard reads the component's entry from the ledger, finds each
//! state's previous records (following the owner index when the state moved
//! from another component), calls the handler, and replies with the outcomes
//! and how many of the component's stored states they matched. A state
//! found in the component's own entry that needs nothing (and has no
//! children) is only counted, not answered. The component's home shard
//! hands back its reading of the entry: when the matched states are fewer
//! than the states stored, the component finds the ones it no longer
//! declares in it.
//!
//! This file holds the actor and its handlers; [`message`] the messages,
//! [`claims`] which component declared each state in a run (shared with
//! components found unchanged, which claim their states without a
//! message), [`lookup`] the search for a state's previous records,
//! [`cursor`] the cursor that finds declarations in a sorted entry, and
//! [`reads`] the entries of large components, read once for all shards.

mod claims;
mod cursor;
mod lookup;
mod message;
mod reads;
pub(crate) use claims::Claims;
use claims::RunDeclared;
pub(crate) use message::Declaration;
pub(crate) use reads::SharedReads;

use cursor::Cursor;
use lookup::{effective_prev, lookup_elsewhere, reconcile_declared, state_count};
use message::ShardDecl;
pub(crate) use message::{
    Chunk, EarlyGate, EndRun, FilterOrphans, Found, Gather, Gathered, Orphan, OrphanOutcome,
    Outcome, ReconcileBatch, ReconcileOrphans, ReplyTo, ShardBatch, ShardReply,
};

use rustc_hash::FxHashMap as HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use actix::{Actor, Context, Handler};
use tokio::sync::oneshot;

use super::guard::guarded;
use super::tasks::free_elsewhere;
use crate::error::{Error, Result};
use crate::ledger::record::{ComponentEntry, PrevView};
use crate::ledger::stored::{EntryBytes, StoredEntry, StoredState};
use crate::ledger::Ledger;
use crate::model::keycode;
use crate::model::provider::ProviderCore;
use crate::model::ComponentPath;

/// The error of a shard that dropped a reply it owed (it stopped).
pub(crate) fn shard_stopped(_: oneshot::error::RecvError) -> Error {
    Error::Shutdown("a reconciler shard stopped".into())
}

/// Which shard owns an encoded state path.
pub(crate) fn shard_of(path: &[u8], shards: usize) -> usize {
    (keycode::stable_hash(path) % shards.max(1) as u64) as usize
}

pub(crate) struct ReconcilerActor {
    /// The shard index, as a metrics label.
    label: String,
    /// Metric handles of the current run.
    metrics: Option<crate::metrics::ShardMetrics>,
    ledger: Ledger,
    /// Per run: each declared path and the component that declared it.
    claims: Arc<Claims>,
    /// The entries of components reconciled in several messages, by
    /// component, with the run they were read in.
    entries: HashMap<Arc<[u8]>, KeptEntry>,
    /// The readings of such entries, shared with the other shards.
    reads: Arc<SharedReads>,
    /// The states in `entries`, bounded by [`MAX_CACHED_STATES`].
    cached_states: usize,
    /// Per run and component: states sent in chunks, not claimed yet.
    pending: HashMap<u64, HashMap<Arc<[u8]>, Vec<Claim>>>,
    /// The user's runtime, where a large run's bookkeeping is freed when
    /// it ends (see [`free_elsewhere`]).
    user: tokio::runtime::Handle,
}

/// A state a component declared in a chunk, to claim at its commit.
struct Claim {
    path: Arc<[u8]>,
    idx: usize,
}

/// A component's entry as read in a run (`None`: it has none yet).
struct KeptEntry {
    run_id: u64,
    entry: Arc<Option<StoredEntry>>,
    /// Kept so that the other shards share it.
    _reading: Arc<reads::Reading>,
}

/// The most states a shard keeps decoded for components reconciled in
/// several messages: beyond it, such a component's entry is read again
/// for each message rather than kept (many large components running at
/// once would otherwise hold the whole ledger in memory).
const MAX_CACHED_STATES: usize = 1 << 20;

impl ReconcilerActor {
    pub(crate) fn new(
        index: usize,
        ledger: Ledger,
        claims: Arc<Claims>,
        reads: Arc<SharedReads>,
        user: tokio::runtime::Handle,
    ) -> Self {
        Self {
            label: index.to_string(),
            metrics: None,
            ledger,
            claims,
            entries: HashMap::default(),
            reads,
            cached_states: 0,
            pending: HashMap::default(),
            user,
        }
    }

    /// The metric handles for `run_id`, resolved on the run's first batch.
    fn metrics(&mut self, run_id: u64) -> &crate::metrics::ShardMetrics {
        if self.metrics.as_ref().is_none_or(|m| m.run_id != run_id) {
            self.metrics = Some(crate::metrics::ShardMetrics::new(&self.label, run_id));
        }
        self.metrics
            .get_or_insert_with(|| crate::metrics::ShardMetrics::new(&self.label, run_id))
    }

    fn reconcile(&mut self, msg: &ReconcileBatch, decls: Vec<ShardDecl>) -> ShardReply {
        let mut reply = if decls.is_empty() && !msg.home {
            // Nothing to read or reconcile here.
            ShardReply::default()
        } else {
            let entry = if matches!(msg.chunk, Chunk::Only) {
                // Decoded without copying: only what the component needs
                // back (orphans, changed states) is copied.
                self.ledger.stored(&msg.component).map(Arc::new)
            } else {
                self.chunked_entry(msg)
            };
            match entry {
                Ok(entry) => {
                    let mut reply = self.reconcile_states(msg, decls, entry.as_ref().as_ref());
                    if msg.home {
                        reply.entry = Some(entry);
                    }
                    reply
                }
                Err(e) => ShardReply::failed(e),
            }
        };
        if matches!(msg.chunk, Chunk::Last) {
            // Unless it cannot commit, the component claims its chunks' states.
            if reply.error.is_none() {
                let claimed = self.claim_pending(msg);
                reply.duplicates.extend(claimed);
            }
            self.forget_entry(&msg.component);
        }
        reply
    }

    /// The entry of a component that sends this shard several messages in
    /// a run (chunks declared while its code runs, then the rest): read
    /// (or taken from another shard's reading) on its first message, kept
    /// until its last.
    fn chunked_entry(&mut self, msg: &ReconcileBatch) -> Result<Arc<Option<StoredEntry>>> {
        if let Some(kept) = self.entries.get(&msg.component) {
            if kept.run_id == msg.run_id {
                return Ok(Arc::clone(&kept.entry));
            }
        }
        // Kept from another run: stale.
        self.forget_entry(&msg.component);
        let reading = self.reads.reading(msg.run_id, &msg.component);
        let shared = reading.get_or_init(|| self.ledger.stored(&msg.component).ok().map(Arc::new));
        let entry = match shared {
            Some(entry) => Arc::clone(entry),
            None => Arc::new(self.ledger.stored(&msg.component)?),
        };
        let Chunk::More(gate) = &msg.chunk else {
            return Ok(entry);
        };
        let size = state_count(&entry);
        if self.cached_states + size <= MAX_CACHED_STATES {
            self.cached_states += size;
            let kept = KeptEntry {
                run_id: msg.run_id,
                entry: Arc::clone(&entry),
                _reading: reading,
            };
            self.entries.insert(Arc::clone(&msg.component), kept);
        } else {
            gate.stop.store(true, Ordering::SeqCst);
        }
        Ok(entry)
    }

    /// Lets go of a component's kept entry.
    fn forget_entry(&mut self, component: &[u8]) {
        if let Some(kept) = self.entries.remove(component) {
            self.cached_states = self.cached_states.saturating_sub(state_count(&kept.entry));
        }
    }

    /// Reconciles `decls` against the component's entry (`None`: it has
    /// none yet), and for the home shard, reports the component's
    /// children.
    fn reconcile_states(
        &mut self,
        msg: &ReconcileBatch,
        mut decls: Vec<ShardDecl>,
        own: Option<&StoredEntry>,
    ) -> ShardReply {
        let own_states: &[StoredState] = own.map_or(&[], |o| &o.states);
        let base = own.map(StoredEntry::bytes).unwrap_or_default();
        let mut reply = ShardReply::default();
        if msg.home {
            match self.ledger.children(&msg.component) {
                Ok(c) => reply.prev_children = c,
                Err(e) => return ShardReply::failed(e),
            }
        }
        // States sent in chunks while the component's code runs are claimed
        // only once it reaches its commit (its last message): a component
        // whose code then fails claims nothing, as if it had sent nothing.
        let claim_later = matches!(msg.chunk, Chunk::More(_));
        // Sized once when every declaration will have an outcome (the
        // component has no stored state yet): growing them cost more than
        // filling them. Otherwise most declarations of a re-run need
        // nothing and get none, and a few changed ones grow the list.
        if own_states.is_empty() {
            reply.outcomes.reserve_exact(decls.len());
        }
        let mut pending = self.claim_batch(msg, &mut decls, &mut reply, claim_later);
        let mut others: HashMap<Arc<[u8]>, Option<ComponentEntry>> = HashMap::default();
        // Where the next declaration's state is looked for first: states
        // are sorted by path, and declarations often come in that order.
        let mut cursor = Cursor::default();
        for mut d in decls {
            let Some(provider) = msg.providers.get(d.provider) else {
                reply.outcomes.push(no_provider(msg, &d));
                continue;
            };
            let outcome = match cursor.find(own_states, |s| s.path(base).cmp(d.path.as_ref())) {
                Ok(i) => {
                    let Some(state) = own_states.get(i) else {
                        continue;
                    };
                    reply.matched += 1;
                    let outcome = own_outcome(&mut d, provider, state, base);
                    if outcome.is_none() {
                        reply.unchanged += 1;
                    }
                    outcome
                }
                Err(_) => Some(elsewhere_outcome(
                    &self.ledger,
                    msg,
                    &mut d,
                    provider,
                    &mut others,
                )),
            };
            reply.outcomes.extend(outcome);
        }
        if !pending.is_empty() {
            self.pending
                .entry(msg.run_id)
                .or_default()
                .entry(Arc::clone(&msg.component))
                .or_default()
                .append(&mut pending);
        }
        reply
    }

    /// Claims the states a component sent in chunks, now that it reached
    /// its commit; one another component claimed meanwhile is a duplicate,
    /// returned with the component that claimed it.
    fn claim_pending(&mut self, msg: &ReconcileBatch) -> Vec<(usize, ComponentPath)> {
        let claims = self
            .pending
            .get_mut(&msg.run_id)
            .and_then(|by_component| by_component.remove(&msg.component))
            .unwrap_or_default();
        let mut locked = self.claims.lock();
        let declared_now = locked.run(msg.run_id);
        let me = declared_now.component(&msg.component);
        claims
            .into_iter()
            .filter_map(|claim| {
                let first = declared_now.claim_owned(me, claim.path)?;
                Some((claim.idx, declared_now.path_of(first)))
            })
            .collect()
    }

    /// Claims the paths of a batch's declarations (or, for a chunk, checks
    /// them and keeps them to claim at the commit, returned): a declaration
    /// whose state another component declared first in this run is taken
    /// out of `decls` and answered as a duplicate. A declaration naming no
    /// provider of its batch claims nothing (it fails).
    fn claim_batch(
        &self,
        msg: &ReconcileBatch,
        decls: &mut Vec<ShardDecl>,
        reply: &mut ShardReply,
        claim_later: bool,
    ) -> Vec<Claim> {
        let mut pending = Vec::with_capacity(if claim_later { decls.len() } else { 0 });
        let mut locked = self.claims.lock();
        let declared_now = locked.run(msg.run_id);
        let me = declared_now.component(&msg.component);
        decls.retain(|d| {
            if msg.providers.get(d.provider).is_none() {
                return true;
            }
            let first = if claim_later {
                declared_now.claimed_by_other(me, &d.path)
            } else {
                declared_now.claim(me, &d.path)
            };
            if let Some(first) = first {
                reply.duplicates.push((d.idx, declared_now.path_of(first)));
                return false;
            }
            if claim_later {
                pending.push(Claim {
                    path: Arc::clone(&d.path),
                    idx: d.idx,
                });
            }
            true
        });
        pending
    }
}

/// The outcome of a declaration naming no provider of its batch.
fn no_provider(msg: &ReconcileBatch, d: &ShardDecl) -> Outcome {
    Outcome {
        idx: d.idx,
        location: Found::Nowhere,
        prev: None,
        result: Err(Error::Usage(format!(
            "declaration {} of component {} names no provider of its batch",
            d.idx,
            keycode::decode_component_path(&msg.component).unwrap_or_default()
        ))),
        child_gen: None,
    }
}

/// The outcome of a declaration whose state is in the component's own
/// entry; `None` when it needs nothing and has no children (it is only
/// counted).
fn own_outcome(
    d: &mut ShardDecl,
    provider: &ProviderCore,
    state: &StoredState,
    base: EntryBytes<'_>,
) -> Option<Outcome> {
    let result = reconcile_declared(d, provider, Some(state.view(base)));
    if matches!(result, Ok(None)) && !d.container {
        return None;
    }
    // The component needs the previous entry only to commit a change.
    let prev = matches!(result, Ok(Some(_))).then(|| state.to_entry(base));
    Some(Outcome {
        idx: d.idx,
        location: Found::Own,
        prev,
        result,
        child_gen: None,
    })
}

/// The outcome of a declaration whose state is not in the component's own
/// entry: held by another component (it moves), or new.
fn elsewhere_outcome(
    ledger: &Ledger,
    msg: &ReconcileBatch,
    d: &mut ShardDecl,
    provider: &ProviderCore,
    others: &mut HashMap<Arc<[u8]>, Option<ComponentEntry>>,
) -> Outcome {
    match lookup_elsewhere(ledger, &msg.component, &d.path, others) {
        Ok(found) => {
            let (location, prev) =
                found.map_or((Found::Nowhere, None), |(c, e)| (Found::In(c), Some(e)));
            let result = reconcile_declared(d, provider, prev.as_ref().map(PrevView::from));
            Outcome {
                idx: d.idx,
                location,
                prev,
                result,
                child_gen: None,
            }
        }
        Err(e) => Outcome {
            idx: d.idx,
            location: Found::Nowhere,
            prev: None,
            result: Err(e),
            child_gen: None,
        },
    }
}

impl Actor for ReconcilerActor {
    type Context = Context<Self>;
}

impl Handler<ReconcileBatch> for ReconcilerActor {
    type Result = ();

    fn handle(&mut self, mut msg: ReconcileBatch, _ctx: &mut Context<Self>) {
        crate::fault::point(crate::fault::RECONCILE_BATCH);
        let started = std::time::Instant::now();
        let decls = std::mem::take(&mut msg.decls);
        let calls = decls.len() as u64;
        let reply = self.reconcile(&msg, decls);
        if let Chunk::More(gate) = &msg.chunk {
            gate.outstanding.fetch_sub(1, Ordering::SeqCst);
        }
        let m = self.metrics(msg.run_id);
        m.queue_depth.decrement(1.0);
        m.calls.increment(calls);
        m.duration.record(started.elapsed().as_secs_f64());
        msg.reply.send(reply);
    }
}

impl Handler<FilterOrphans> for ReconcilerActor {
    type Result = ();

    fn handle(&mut self, msg: FilterOrphans, _ctx: &mut Context<Self>) {
        let mut locked = self.claims.lock();
        let mut declared = locked.get_mut(msg.run_id);
        let kept = msg
            .orphans
            .into_iter()
            .filter(|o| {
                declared.as_mut().is_none_or(|d| {
                    d.claimed_by_other_than(&o.component, o.entry.path.as_slice())
                        .is_none()
                })
            })
            .collect();
        drop(locked);
        let _ = msg.reply.send(kept);
    }
}

impl Handler<ReconcileOrphans> for ReconcilerActor {
    type Result = ();

    fn handle(&mut self, msg: ReconcileOrphans, _ctx: &mut Context<Self>) {
        let out = msg
            .orphans
            .into_iter()
            .map(|(orphan, provider, key, trusted)| {
                let result = match provider.resolved.get() {
                    Some(resolved) => {
                        let (records, missing) =
                            effective_prev(&provider, Some(PrevView::from(&orphan.entry)), trusted);
                        if records.is_empty() && !missing {
                            Ok(None)
                        } else {
                            guarded(|| {
                                resolved
                                    .handler
                                    .reconcile(key.clone(), None, &records, missing)
                            })
                            .map_err(|cause| Error::Reconcile {
                                provider: provider.path.name.to_string(),
                                key: key.clone(),
                                cause: Box::new(cause),
                            })
                        }
                    }
                    None => Ok(None),
                };
                (orphan, provider, key, result)
            })
            .collect();
        let _ = msg.reply.send(out);
    }
}

impl Handler<EndRun> for ReconcilerActor {
    type Result = ();

    fn handle(&mut self, msg: EndRun, _ctx: &mut Context<Self>) {
        // Freed once the lock is let go, and elsewhere if large: the next
        // run's components may be waiting for the lock, and its first
        // messages for this shard.
        let declared = self.claims.lock().end(msg.run_id);
        let pending = self.pending.remove(&msg.run_id);
        // An App's runs follow one another: whatever is kept is this run's.
        let entries = std::mem::take(&mut self.entries);
        let parts = declared.as_ref().map_or(0, RunDeclared::len) + self.cached_states;
        self.cached_states = 0;
        free_elsewhere(&self.user, parts, (declared, pending, entries));
    }
}
