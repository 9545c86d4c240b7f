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

use rustc_hash::FxHashMap as HashMap;
use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use actix::{Actor, Context, Handler, Message};
use tokio::sync::oneshot;

use super::component::guarded;
use crate::error::{Error, Result};
use crate::ledger::record::{ComponentEntry, PrevView, StateEntry};
use crate::ledger::stored::{StoredEntry, StoredState};
use crate::ledger::Ledger;
use crate::model::erased::ErasedOutput;
use crate::model::keycode;
use crate::model::provider::{ChildGeneration, DeclaredValue, ProviderCore};
use crate::model::{ComponentPath, StableKey};

/// The error of a shard that dropped a reply it owed (it stopped).
pub(crate) fn shard_stopped(_: oneshot::error::RecvError) -> Error {
    Error::Shutdown("a reconciler shard stopped".into())
}

/// Which shard owns an encoded state path.
pub(crate) fn shard_of(path: &[u8], shards: usize) -> usize {
    (keycode::stable_hash(path) % shards.max(1) as u64) as usize
}

/// One declared state, sent to its shard.
pub(crate) struct ShardDecl {
    /// The index of the declaration in its component.
    pub idx: usize,
    pub path: Arc<[u8]>,
    pub key: StableKey,
    /// Its provider: an index into its batch's `providers`.
    pub provider: usize,
    pub value: DeclaredValue,
    /// Whether the state is a container (it has children): its outcome
    /// is sent even when it needs nothing, since a component that fails
    /// notes its containers, by their outcomes, for its children's cleanup.
    pub container: bool,
}

/// A component's declarations bound for one shard, with the providers
/// they name, each once: the shard does not touch a provider's reference
/// count per state (a count shared with the declaring thread, which would
/// bounce between cores).
#[derive(Default)]
pub(crate) struct ShardBatch {
    pub decls: Vec<ShardDecl>,
    pub providers: Vec<Arc<ProviderCore>>,
    /// The providers' positions, by address.
    by_address: HashMap<usize, usize>,
}

impl ShardBatch {
    /// Batches for `shards` shards, sized for `decls` declarations spread
    /// over them.
    pub(crate) fn for_shards(shards: usize, decls: usize) -> Vec<ShardBatch> {
        let each = decls / shards.max(1);
        // Paths hash evenly: a little over the mean is enough.
        let capacity = each + each / 8 + 8;
        (0..shards)
            .map(|_| ShardBatch {
                decls: Vec::with_capacity(capacity),
                ..ShardBatch::default()
            })
            .collect()
    }

    /// Adds declaration `idx` of a component; it takes the declared value,
    /// which a declaration is sent with once.
    pub(crate) fn push(&mut self, idx: usize, d: &mut super::component::Declaration) {
        // A component's declarations usually name one provider: the one
        // added last is checked before the index.
        let provider = match self.providers.last() {
            Some(last) if Arc::ptr_eq(last, &d.provider) => self.providers.len() - 1,
            _ => {
                let providers = &mut self.providers;
                *self
                    .by_address
                    .entry(Arc::as_ptr(&d.provider) as usize)
                    .or_insert_with(|| {
                        providers.push(Arc::clone(&d.provider));
                        providers.len() - 1
                    })
            }
        };
        self.decls.push(ShardDecl {
            idx,
            path: Arc::clone(&d.path),
            key: d.key.clone(),
            provider,
            value: d.value.hand_on(),
            container: d.child.is_some(),
        });
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.decls.is_empty()
    }
}

/// Where a shard found a declared state's previous entry.
pub(crate) enum Found {
    /// Nowhere: the state is new.
    Nowhere,
    /// In the declaring component's own entry. (Not a clone of the
    /// component's key: shards would bump its shared reference count for
    /// every state, from two cores at once.)
    Own,
    /// In the entry of another component (the state moves from it).
    In(Arc<[u8]>),
}

/// What a shard found for one declared state.
pub(crate) struct Outcome {
    pub idx: usize,
    /// The component whose entry held the state, if any.
    pub location: Found,
    /// The state's entry as it was.
    pub prev: Option<StateEntry>,
    pub result: Result<Option<ErasedOutput>>,
}

/// Reconcile a component's declarations that route to this shard.
pub(crate) struct ReconcileBatch {
    pub run_id: u64,
    pub component: Arc<[u8]>,
    pub component_path: ComponentPath,
    pub decls: Vec<ShardDecl>,
    /// The providers the declarations name (by index).
    pub providers: Vec<Arc<ProviderCore>>,
    /// Whether this is the component's home shard in this run: it also
    /// reports the component's child list and hands back its reading of
    /// the component's entry.
    pub home: bool,
    /// Where this message stands among the component's messages to this
    /// shard in this run.
    pub chunk: Chunk,
    pub reply: oneshot::Sender<ShardReply>,
}

/// Where a message stands among a component's messages to one shard.
pub(crate) enum Chunk {
    /// The only one: the shard reads the component's entry for it.
    Only,
    /// A chunk sent while the component's code runs: more follow, so the
    /// shard keeps the entry it read. Through the gate it says when the
    /// chunk was handled, or that it should send no more.
    More(Arc<EarlyGate>),
    /// The last after chunks: the component reached its commit. The shard
    /// claims the chunks' states and lets go of the entry it kept.
    Last,
}

impl Message for ReconcileBatch {
    type Result = ();
}

/// A shard's answer to a [`ReconcileBatch`].
#[derive(Default)]
pub(crate) struct ShardReply {
    pub outcomes: Vec<Outcome>,
    /// Declarations whose state another component declared first in this
    /// run (by index), with that component: each a duplicate declaration.
    pub duplicates: Vec<(usize, ComponentPath)>,
    /// How many of the declarations found their state in the component's
    /// own entry. Paths are unique in an entry and among a component's
    /// declarations, so when a component's replies add up to the states
    /// its entry holds, it declared every one of them again.
    pub matched: usize,
    /// How many of those needed nothing (the handler returned no action)
    /// and are not containers. They get no outcome: the component would
    /// only count them, and most states of a re-run are such.
    pub unchanged: usize,
    /// The home shard's view of the component: its children.
    pub prev_children: Vec<StableKey>,
    /// The home shard's reading of the component's entry (`None` inside
    /// when it has none), from which the component takes its state count
    /// and failure, and in which it finds the states it no longer
    /// declares.
    pub entry: Option<Arc<Option<StoredEntry>>>,
    /// A ledger read failed: the component cannot be reconciled.
    pub error: Option<Error>,
}

/// Paces the chunks a running component sends to the shards.
#[derive(Default)]
pub(crate) struct EarlyGate {
    /// Set by a shard that cannot keep the component's entry: each further
    /// chunk would cost a full read of it, so the rest waits for the commit.
    pub stop: AtomicBool,
    /// Chunks sent and not handled yet.
    pub outstanding: AtomicUsize,
}

impl ShardReply {
    /// The reply of a shard that could not read the ledger.
    fn failed(e: Error) -> Self {
        ShardReply {
            error: Some(e),
            ..ShardReply::default()
        }
    }
}

/// A state that is no longer declared, to be deleted at the end of a run.
#[derive(Clone, Debug)]
pub(crate) struct Orphan {
    pub component: Arc<[u8]>,
    pub component_path: ComponentPath,
    pub entry: StateEntry,
}

/// Drops orphans that a component declared in this run (they moved).
pub(crate) struct FilterOrphans {
    pub run_id: u64,
    pub orphans: Vec<Orphan>,
    pub reply: oneshot::Sender<Vec<Orphan>>,
}

impl Message for FilterOrphans {
    type Result = ();
}

/// Reconciles orphans with `desired = None`.
pub(crate) struct ReconcileOrphans {
    /// Each orphan with its provider, key, and the generation to judge it
    /// by when its container failed in this run.
    pub orphans: Vec<(
        Orphan,
        Arc<ProviderCore>,
        StableKey,
        Option<ChildGeneration>,
    )>,
    /// Each orphan back, in the same order, with its provider, key and
    /// outcome.
    pub reply: oneshot::Sender<Vec<OrphanOutcome>>,
}

/// An orphan reconciled: its provider, key and outcome.
pub(crate) type OrphanOutcome = (
    Orphan,
    Arc<ProviderCore>,
    StableKey,
    Result<Option<ErasedOutput>>,
);

impl Message for ReconcileOrphans {
    type Result = ();
}

/// Forget the run's bookkeeping.
pub(crate) struct EndRun {
    pub run_id: u64,
}

impl Message for EndRun {
    type Result = ();
}

pub(crate) struct ReconcilerActor {
    /// The shard index, as a metrics label.
    label: String,
    /// Metric handles of the current run.
    metrics: Option<crate::metrics::ShardMetrics>,
    ledger: Ledger,
    /// Per run: each declared path and the component that declared it.
    declared: HashMap<u64, RunDeclared>,
    /// How many paths the last run that ended declared here: a new run's
    /// map starts that large instead of growing (and rehashing) to it.
    last_declared: usize,
    /// The entries of components reconciled in several messages, by
    /// component, with the run they were read in.
    entries: HashMap<Arc<[u8]>, KeptEntry>,
    /// The states in `entries`, bounded by [`MAX_CACHED_STATES`].
    cached_states: usize,
    /// Per run and component: states sent in chunks, not claimed yet.
    pending: HashMap<u64, HashMap<Arc<[u8]>, Vec<Claim>>>,
}

/// A state a component declared in a chunk, to claim at its commit.
struct Claim {
    path: Arc<[u8]>,
    idx: usize,
}

/// A component's entry as read in a run (`None`: it has none yet).
type KeptEntry = (u64, Arc<Option<StoredEntry>>);

/// The most states a shard keeps decoded for components reconciled in
/// several messages: beyond it, such a component's entry is read again
/// for each message rather than kept (many large components running at
/// once would otherwise hold the whole ledger in memory).
const MAX_CACHED_STATES: usize = 1 << 20;

impl ReconcilerActor {
    pub(crate) fn new(index: usize, ledger: Ledger) -> Self {
        Self {
            label: index.to_string(),
            metrics: None,
            ledger,
            declared: HashMap::default(),
            last_declared: 0,
            entries: HashMap::default(),
            cached_states: 0,
            pending: HashMap::default(),
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
    /// and decoded on its first message, kept until its last.
    fn chunked_entry(&mut self, msg: &ReconcileBatch) -> Result<Arc<Option<StoredEntry>>> {
        if let Some((run_id, entry)) = self.entries.get(&msg.component) {
            if *run_id == msg.run_id {
                return Ok(Arc::clone(entry));
            }
        }
        // Kept from another run: stale.
        self.forget_entry(&msg.component);
        let entry = Arc::new(self.ledger.stored(&msg.component)?);
        let Chunk::More(gate) = &msg.chunk else {
            return Ok(entry);
        };
        let size = state_count(&entry);
        if self.cached_states + size <= MAX_CACHED_STATES {
            self.cached_states += size;
            self.entries
                .insert(Arc::clone(&msg.component), (msg.run_id, Arc::clone(&entry)));
        } else {
            gate.stop.store(true, Ordering::SeqCst);
        }
        Ok(entry)
    }

    /// Lets go of a component's kept entry.
    fn forget_entry(&mut self, component: &[u8]) {
        if let Some((_, entry)) = self.entries.remove(component) {
            self.cached_states = self.cached_states.saturating_sub(state_count(&entry));
        }
    }

    /// Reconciles `decls` against the component's entry (`None`: it has
    /// none yet), and for the home shard, reports the component's
    /// children.
    fn reconcile_states(
        &mut self,
        msg: &ReconcileBatch,
        decls: Vec<ShardDecl>,
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
        let declared_now = declared_in(&mut self.declared, self.last_declared, msg.run_id);
        let me = declared_now.component(msg);
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
        let mut pending = Vec::with_capacity(if claim_later { decls.len() } else { 0 });
        let mut others: HashMap<Arc<[u8]>, Option<ComponentEntry>> = HashMap::default();
        // Where the next declaration's state is looked for first: states
        // are sorted by path, and declarations often come in that order.
        let mut cursor = Cursor::default();
        for mut d in decls {
            let Some(provider) = msg.providers.get(d.provider) else {
                reply.outcomes.push(Outcome {
                    idx: d.idx,
                    location: Found::Nowhere,
                    prev: None,
                    result: Err(Error::Usage(format!(
                        "declaration {} of component {} names no provider of its batch",
                        d.idx, msg.component_path
                    ))),
                });
                continue;
            };
            let first = if claim_later {
                declared_now.paths.get(&d.path).copied()
            } else {
                match declared_now.paths.entry(Arc::clone(&d.path)) {
                    Entry::Occupied(first) => Some(*first.get()),
                    Entry::Vacant(slot) => {
                        slot.insert(me);
                        None
                    }
                }
            };
            if let Some(first) = first {
                reply.duplicates.push((d.idx, declared_now.path_of(first)));
                continue;
            }
            if claim_later {
                pending.push(Claim {
                    path: Arc::clone(&d.path),
                    idx: d.idx,
                });
            }
            let found = cursor.find(own_states, |s| s.path(base).cmp(d.path.as_ref()));
            let outcome = match found {
                Ok(i) => {
                    let Some(state) = own_states.get(i) else {
                        continue;
                    };
                    reply.matched += 1;
                    let result = reconcile_declared(&mut d, provider, Some(state.view(base)));
                    if matches!(result, Ok(None)) && !d.container {
                        reply.unchanged += 1;
                        continue;
                    }
                    // The component needs the previous entry only to commit a change.
                    let prev = matches!(result, Ok(Some(_))).then(|| state.to_entry(base));
                    Outcome {
                        idx: d.idx,
                        location: Found::Own,
                        prev,
                        result,
                    }
                }
                Err(_) => {
                    match lookup_elsewhere(&self.ledger, &msg.component, &d.path, &mut others) {
                        Ok(found) => {
                            let (location, prev) = found
                                .map_or((Found::Nowhere, None), |(c, e)| (Found::In(c), Some(e)));
                            let result = reconcile_declared(
                                &mut d,
                                provider,
                                prev.as_ref().map(PrevView::from),
                            );
                            Outcome {
                                idx: d.idx,
                                location,
                                prev,
                                result,
                            }
                        }
                        Err(e) => Outcome {
                            idx: d.idx,
                            location: Found::Nowhere,
                            prev: None,
                            result: Err(e),
                        },
                    }
                }
            };
            reply.outcomes.push(outcome);
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
        let declared_now = declared_in(&mut self.declared, self.last_declared, msg.run_id);
        let me = declared_now.component(msg);
        let mut duplicates = Vec::new();
        for claim in claims {
            match declared_now.paths.entry(claim.path) {
                Entry::Occupied(first) => duplicates.push((claim.idx, *first.get())),
                Entry::Vacant(slot) => {
                    slot.insert(me);
                }
            }
        }
        duplicates
            .into_iter()
            .map(|(idx, first)| (idx, declared_now.path_of(first)))
            .collect()
    }
}

/// The paths declared on a shard in one run.
struct RunDeclared {
    /// Each path, with the position in `components` of the component
    /// that declared it (not a clone of its path, whose reference count
    /// every shard would bump for every state).
    paths: HashMap<Arc<[u8]>, usize>,
    /// The components that declared paths here, each once.
    components: Vec<ComponentPath>,
    /// Their positions, by component key.
    by_key: HashMap<Arc<[u8]>, usize>,
}

impl RunDeclared {
    /// The position of the component `msg` comes from, added if new.
    fn component(&mut self, msg: &ReconcileBatch) -> usize {
        if let Some(&i) = self.by_key.get(&msg.component) {
            return i;
        }
        let i = self.components.len();
        self.components.push(msg.component_path.clone());
        self.by_key.insert(Arc::clone(&msg.component), i);
        i
    }

    /// The path of the component at position `i`.
    fn path_of(&self, i: usize) -> ComponentPath {
        self.components.get(i).cloned().unwrap_or_default()
    }
}

/// The paths declared in `run_id` so far; a new run's map is sized for
/// `expected` paths.
fn declared_in(
    declared: &mut HashMap<u64, RunDeclared>,
    expected: usize,
    run_id: u64,
) -> &mut RunDeclared {
    declared.entry(run_id).or_insert_with(|| RunDeclared {
        paths: HashMap::with_capacity_and_hasher(expected, Default::default()),
        components: Vec::new(),
        by_key: HashMap::default(),
    })
}

/// The number of states in a component's entry.
fn state_count(entry: &Option<StoredEntry>) -> usize {
    entry.as_ref().map_or(0, |e| e.states.len())
}

/// Finds a state held by another component, through the owner index.
fn lookup_elsewhere(
    ledger: &Ledger,
    own: &[u8],
    path: &[u8],
    cache: &mut HashMap<Arc<[u8]>, Option<ComponentEntry>>,
) -> Result<Option<(Arc<[u8]>, StateEntry)>> {
    for owner in ledger.owner_candidates(path) {
        if owner.as_ref() == own {
            continue;
        }
        if !cache.contains_key(&owner) {
            let entry = ledger.component(&owner)?;
            cache.insert(Arc::clone(&owner), entry);
        }
        let found = cache
            .get(&owner)
            .and_then(|e| e.as_ref())
            .and_then(|e| e.find(path).ok().and_then(|i| e.states.get(i).cloned()));
        if let Some(state) = found {
            return Ok(Some((owner, state)));
        }
    }
    Ok(None)
}

/// The previous records and "may be missing" flag of a state, after the
/// container generation rules: records written before a destructive
/// invalidation are gone; records written before a lossy one may be missing.
pub(crate) fn effective_prev<'a>(
    provider: &ProviderCore,
    prev: Option<PrevView<'a>>,
    trusted: Option<ChildGeneration>,
) -> (Vec<&'a [u8]>, bool) {
    let Some(prev) = prev else {
        return (Vec::new(), false);
    };
    let gen = trusted.unwrap_or_else(|| {
        provider
            .resolved
            .get()
            .map(|r| r.generation)
            .unwrap_or_default()
    });
    if prev.gen < gen.destructive_floor {
        return (Vec::new(), false);
    }
    let missing = prev.may_be_missing || prev.gen < gen.current;
    (prev.records, missing)
}

fn reconcile_declared(
    d: &mut ShardDecl,
    provider: &ProviderCore,
    prev: Option<PrevView<'_>>,
) -> Result<Option<ErasedOutput>> {
    let Some(resolved) = provider.resolved.get() else {
        return Err(Error::Usage(format!(
            "provider {} is not resolved: its container produced no action",
            provider.path.name
        )));
    };
    let (records, missing) = effective_prev(provider, prev, None);
    let desired = d.value.hand_on();
    guarded(|| {
        resolved
            .handler
            .reconcile(d.key.clone(), Some(desired), &records, missing)
    })
    .map_err(|cause| Error::Reconcile {
        provider: provider.path.name.to_string(),
        key: d.key.clone(),
        cause: Box::new(cause),
    })
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
        let _ = msg.reply.send(reply);
    }
}

impl Handler<FilterOrphans> for ReconcilerActor {
    type Result = ();

    fn handle(&mut self, msg: FilterOrphans, _ctx: &mut Context<Self>) {
        let declared = self.declared.get(&msg.run_id);
        let kept = msg
            .orphans
            .into_iter()
            .filter(|o| declared.is_none_or(|d| !d.paths.contains_key(o.entry.path.as_slice())))
            .collect();
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
        if let Some(declared) = self.declared.remove(&msg.run_id) {
            self.last_declared = declared.paths.len();
        }
        self.pending.remove(&msg.run_id);
        // An App's runs follow one another: whatever is kept is this run's.
        self.entries.clear();
        self.cached_states = 0;
    }
}

/// Finds a shard's declarations in a component's sorted states, one after
/// another, from where the last one was found.
///
/// Declarations that come in path order are found a few states apart (the
/// states in between belong to other shards), so while they do the search
/// gallops from just after the last state found ([`find_from`]): a
/// comparison or two, where a binary search of 100k states takes about 17,
/// each a likely cache miss. Declarations in no order (keys such as UUIDs)
/// would make the gallop cost up to twice a binary search, so once one is
/// found farther from the last than the square root of the number of
/// states (where a gallop stops paying), the cursor checks only the state
/// after the last one and otherwise searches the whole slice, until a
/// declaration is found near the last again. Unchanged runs of 100k
/// SQLite rows declared in shuffled order (medians of alternating sets):
/// 370-480 ms with a gallop every time against 220-285 ms with a binary
/// search; 191-216 ms with this cursor against 198-237 ms, in a later set.
struct Cursor {
    /// Just after the last state found.
    next: usize,
    /// Whether the last state found was near the one before it (closer
    /// than the square root of the number of states).
    in_order: bool,
}

impl Default for Cursor {
    /// A cursor at the start, taking declarations to be in order: the
    /// first one is galloped to from the first state.
    fn default() -> Self {
        Self {
            next: 0,
            in_order: true,
        }
    }
}

impl Cursor {
    fn find<T>(
        &mut self,
        sorted: &[T],
        cmp: impl Fn(&T) -> std::cmp::Ordering,
    ) -> std::result::Result<usize, usize> {
        let found = if self.in_order {
            find_from(sorted, self.next, cmp)
        } else {
            match sorted.get(self.next) {
                Some(item) if cmp(item).is_eq() => Ok(self.next),
                _ => sorted.binary_search_by(cmp),
            }
        };
        if let Ok(i) = found {
            // Galloping `d` states costs about 2·log2(d) comparisons, a
            // binary search log2(n): worth it while d² < n.
            self.in_order = i
                .checked_sub(self.next)
                .is_some_and(|d| d.saturating_mul(d) < sorted.len());
            self.next = i + 1;
        }
        found
    }
}

/// Searches `sorted` like [`slice::binary_search_by`] (`cmp` orders an
/// item against the one sought), starting at `from`: it looks at `from`,
/// then gallops forward (steps of 1, 2, 4, ...) and binary-searches the
/// part it brackets. Anything before `from` is found by a binary search
/// of that part.
fn find_from<T>(
    sorted: &[T],
    from: usize,
    cmp: impl Fn(&T) -> std::cmp::Ordering,
) -> std::result::Result<usize, usize> {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let search = |lo: usize, hi: usize| match sorted.get(lo..hi) {
        Some(part) => match part.binary_search_by(&cmp) {
            Ok(i) => Ok(lo + i),
            Err(i) => Err(lo + i),
        },
        None => sorted.binary_search_by(&cmp),
    };
    let Some(first) = sorted.get(from) else {
        return search(0, sorted.len());
    };
    match cmp(first) {
        Equal => return Ok(from),
        Greater => return search(0, from),
        Less => {}
    }
    // `sorted[lo]` is before the item sought.
    let mut lo = from;
    let mut step = 1;
    loop {
        let hi = lo.saturating_add(step);
        let Some(item) = sorted.get(hi) else {
            return search(lo + 1, sorted.len());
        };
        match cmp(item) {
            Equal => return Ok(hi),
            Greater => return search(lo + 1, hi),
            Less => {
                lo = hi;
                step = step.saturating_mul(2);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{find_from, Cursor};
    use std::cell::Cell;

    /// Finds each of `sought` with one cursor, returning the comparisons
    /// each took (and checking what it found).
    fn comparisons(sorted: &[usize], sought: &[usize]) -> Vec<usize> {
        let mut cursor = Cursor::default();
        sought
            .iter()
            .map(|x| {
                let n = Cell::new(0);
                let found = cursor.find(sorted, |y| {
                    n.set(n.get() + 1);
                    y.cmp(x)
                });
                assert_eq!(found, sorted.binary_search(x), "{x}");
                n.get()
            })
            .collect()
    }

    #[test]
    fn declarations_in_order_take_a_few_comparisons_and_shuffled_ones_no_more_than_a_search() {
        let sorted: Vec<usize> = (0..100_000).collect();
        // Every other state, in order, as one of two shards sees them.
        let in_order: Vec<usize> = (0..100_000).step_by(2).collect();
        let worst = comparisons(&sorted, &in_order).into_iter().skip(1).max();
        assert!(worst.is_some_and(|n| n <= 3), "worst {worst:?}");
        // Every 32nd, as one of 32 shards sees them: still a gallop (a
        // binary search takes 19 here).
        let sparse: Vec<usize> = (0..100_000).step_by(32).collect();
        let worst = comparisons(&sorted, &sparse).into_iter().skip(1).max();
        assert!(worst.is_some_and(|n| n <= 12), "worst {worst:?}");
        // The same states in no order: on average no more than a look at
        // the state after the last one found and a binary search (19).
        let mut shuffled = in_order.clone();
        shuffled.sort_by_key(|x| (*x as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mean = |counts: Vec<usize>| counts.iter().sum::<usize>() as f64 / counts.len() as f64;
        let cursor = mean(comparisons(&sorted, &shuffled));
        let search = mean(
            shuffled
                .iter()
                .map(|x| {
                    let n = Cell::new(1);
                    let _ = sorted.binary_search_by(|y| {
                        n.set(n.get() + 1);
                        y.cmp(x)
                    });
                    n.get()
                })
                .collect(),
        );
        // (Galloping from the last one every time took 25 on average.)
        assert!(cursor <= search + 0.1, "cursor {cursor}, search {search}");
    }

    #[test]
    fn a_search_from_any_start_finds_what_a_binary_search_finds() {
        for len in 0..40usize {
            // Even numbers only, so that odd ones are absent.
            let sorted: Vec<usize> = (0..len).map(|i| i * 2).collect();
            for from in 0..len + 3 {
                for sought in 0..len * 2 + 3 {
                    let expected = sorted.binary_search(&sought);
                    let found = find_from(&sorted, from, |x| x.cmp(&sought));
                    assert_eq!(found, expected, "len {len}, from {from}, sought {sought}");
                }
            }
        }
    }
}
