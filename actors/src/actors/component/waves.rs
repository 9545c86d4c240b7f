//! Reconciling a component's declarations, wave by wave: containers
//! first, then their children.

use std::sync::Arc;

use tokio::sync::oneshot;

use crate::actors::reconciler::{
    shard_of, shard_stopped, Chunk, Gather, Gathered, Outcome, ReplyTo, ShardBatch, ShardReply,
};
use crate::error::{Error, Result};
use crate::ledger::record::StateEntry;
use crate::ledger::stored::StoredEntry;
use crate::model::provider::{ChildGeneration, ProviderCore};
use crate::model::{ActionKind, StableKey, TargetChildInvalidation};
use crate::run::Run;

use super::{guarded, resolve_provider, ComponentState, Declaration, Early, Seen};

/// What reconciliation found for one declaration.
pub(super) type Reconciled = Outcome;

/// What reconciliation found, by declaration index. Most declarations of
/// a re-run have no outcome (the shards only count the states that need
/// nothing), so outcomes are kept as the shards' replies bring them, with
/// a slot per declaration that points to its own, rather than in a slot of
/// an outcome's size per declaration: that was 200 bytes each, 20 MB to
/// allocate and clear for a 100k-state component, 6-7 ms after its code
/// returned. Each reply's outcomes stay in a part of their own, sized once:
/// one list grown reply by reply would copy a first run's outcomes again.
pub(super) struct Outcomes {
    /// Per declaration, where its outcome is: part and position. Sized
    /// for every declaration once a reply brings an outcome (most
    /// components of a run with nothing to do get none).
    slot: Vec<(usize, usize)>,
    declarations: usize,
    /// The replies' outcomes, each with its declaration's index.
    parts: Vec<Vec<Reconciled>>,
}

/// The slot of a declaration without an outcome.
const NO_OUTCOME: (usize, usize) = (usize::MAX, usize::MAX);

impl Outcomes {
    fn new(declarations: usize) -> Self {
        Self {
            slot: Vec::new(),
            declarations,
            parts: Vec::new(),
        }
    }

    /// Records a reply's outcomes, by declaration index (an index out of
    /// range is dropped: every index comes from the component's own list).
    fn add(&mut self, outcomes: Vec<Reconciled>) {
        if outcomes.is_empty() {
            return;
        }
        if self.slot.is_empty() {
            self.slot = vec![NO_OUTCOME; self.declarations];
        }
        let part = self.parts.len();
        for (at, outcome) in outcomes.iter().enumerate() {
            if let Some(slot) = self.slot.get_mut(outcome.idx) {
                *slot = (part, at);
            }
        }
        self.parts.push(outcomes);
    }

    pub(super) fn get(&self, idx: usize) -> Option<&Reconciled> {
        let &(part, at) = self.slot.get(idx)?;
        self.parts.get(part)?.get(at)
    }

    pub(super) fn get_mut(&mut self, idx: usize) -> Option<&mut Reconciled> {
        let &(part, at) = self.slot.get(idx)?;
        self.parts.get_mut(part)?.get_mut(at)
    }

    /// How many declarations have an outcome.
    pub(super) fn len(&self) -> usize {
        self.parts.iter().map(Vec::len).sum()
    }

    /// The outcomes with their declaration's index, in declaration order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (usize, &Reconciled)> + '_ {
        self.slot
            .iter()
            .enumerate()
            .filter_map(|(idx, &(part, at))| Some((idx, self.parts.get(part)?.get(at)?)))
    }
}

pub(super) struct Reconciliation {
    /// The declarations' outcomes; none for one that needed nothing in
    /// the component's own entry (counted in `unchanged` instead).
    pub(super) results: Outcomes,
    /// Declarations found unchanged in the component's own entry, which
    /// the shards count rather than answer one by one.
    pub(super) unchanged: u64,
    pub(super) waves: Vec<Vec<usize>>,
    pub(super) orphans: Vec<StateEntry>,
    pub(super) prev_children: Vec<StableKey>,
    pub(super) prev_failure: Option<String>,
    /// The component has no ledger entry yet.
    pub(super) fresh: bool,
}

/// Reconciles declarations in waves: first those whose provider is
/// resolved, then the children of the containers resolved by that wave.
/// `paths` are what `declare` kept to refuse duplicates: when the
/// declarations did not match every state the component's entry holds,
/// the others are found with them in the home shard's reading of the
/// entry.
pub(super) async fn reconcile_waves(
    state: &Arc<ComponentState>,
    decls: &mut [Declaration],
    paths: Seen,
    early: Early,
) -> Result<Reconciliation> {
    let mut waves = Waves::new(state, decls, early);
    while let Some((wave, replies)) = waves.send_next(state, decls) {
        waves.gather(decls, replies).await?;
        for &i in &wave {
            let d = &decls[i];
            let (Some(child), Some(r)) = (&d.child, waves.out.results.get_mut(i)) else {
                continue;
            };
            r.child_gen = resolve_child(&state.run, d, child, r)?;
        }
        waves.out.waves.push(wave);
    }
    if let Some(i) = (0..decls.len()).find(|&i| !waves.is_done(i)) {
        let d = &decls[i];
        return Err(Error::Reconcile {
            provider: d.provider.path.name.to_string(),
            key: d.key.clone(),
            cause: Box::new(Error::Usage(
                "its provider never resolved: the container's handler returned no Create or Update action"
                    .into(),
            )),
        });
    }
    waves.find_orphans(state, decls, paths)
}

/// The reconciliation of one component's declarations, wave by wave.
struct Waves {
    out: Reconciliation,
    /// The shard that reads the component's whole entry.
    home: usize,
    /// Per declaration: sent to its shard (early, or in a wave); those
    /// past its end were not (it is sized at the first one sent).
    done: Vec<bool>,
    /// Per declaration: sent early, while the code ran; those past its end
    /// were not (it is empty when none was).
    sent_early: Vec<bool>,
    /// Per shard: sent chunks early (it gets a last message).
    chunked: Vec<bool>,
    /// The replies to the chunks sent early, awaited with the first wave.
    early_replies: Vec<oneshot::Receiver<ShardReply>>,
    first: bool,
    /// The home shard's reading of the component's entry.
    home_entry: Option<Arc<Option<StoredEntry>>>,
    /// The entry's states, and how many the declarations found there.
    stored: usize,
    matched: usize,
}

/// A wave's declarations, and the replies of the shards they went to.
type SentWave = (Vec<usize>, Replies);

/// The replies a wave waits for: those of the chunks sent early, each on
/// its own, and those of the wave's messages (the home shard's marked),
/// gathered into one when there are several, so that the component is
/// woken once for them.
struct Replies {
    /// The replies to the chunks sent while the code ran (first wave).
    early: Vec<oneshot::Receiver<ShardReply>>,
    /// Per message of the wave, in the order sent: to the home shard.
    homes: Vec<bool>,
    /// The wave's replies; `None` when it sent no message.
    wave: Option<WaveReplies>,
}

/// The replies to a wave's messages.
enum WaveReplies {
    /// Its one message's.
    One(oneshot::Receiver<ShardReply>),
    /// Its messages', handed over together by the last shard to answer.
    Gathered(Gathered),
}

impl Replies {
    /// Every reply, the home shard's marked, in the order sent.
    async fn all(self) -> Result<Vec<(bool, ShardReply)>> {
        let mut all = Vec::with_capacity(self.early.len() + self.homes.len());
        for rx in self.early {
            all.push((false, rx.await.map_err(shard_stopped)?));
        }
        let wave = match self.wave {
            None => Vec::new(),
            Some(WaveReplies::One(rx)) => {
                let is_home = self.homes.first().copied().unwrap_or(false);
                all.push((is_home, rx.await.map_err(shard_stopped)?));
                return Ok(all);
            }
            Some(WaveReplies::Gathered(rx)) => rx.await.map_err(shard_stopped)?,
        };
        for (is_home, reply) in self.homes.into_iter().zip(wave) {
            let reply =
                reply.ok_or_else(|| Error::Shutdown("a shard's reply went missing".into()))?;
            all.push((is_home, reply));
        }
        Ok(all)
    }
}

impl Waves {
    /// Whether declaration `i` was sent to its shard.
    fn is_done(&self, i: usize) -> bool {
        self.done.get(i).copied().unwrap_or(false)
    }

    /// Whether declaration `i` was sent while the code ran.
    fn was_sent_early(&self, i: usize) -> bool {
        self.sent_early.get(i).copied().unwrap_or(false)
    }

    fn new(state: &ComponentState, decls: &[Declaration], early: Early) -> Self {
        let n = state.run.engine.shards.len();
        // The home shard reads the whole entry once: it hands its reading
        // back (to find the states the component no longer declares in)
        // and reads its child list. Taking the shard of the first
        // declaration as home means a component whose states all live on
        // one shard sends one message.
        let home = decls
            .first()
            .map_or_else(|| shard_of(&state.key, n), |d| shard_of(&d.path, n));
        Self {
            out: Reconciliation {
                results: Outcomes::new(decls.len()),
                unchanged: 0,
                waves: Vec::new(),
                orphans: Vec::new(),
                prev_children: Vec::new(),
                prev_failure: None,
                fresh: false,
            },
            home,
            done: early.sent.clone(),
            sent_early: early.sent,
            chunked: early.shards,
            early_replies: early.replies,
            first: true,
            home_entry: None,
            stored: 0,
            matched: 0,
        }
    }

    /// Sends the next wave (the declarations whose provider is resolved
    /// and that were not sent yet) to their shards; `None` when there is
    /// none. The first wave is always sent: it also takes the declarations
    /// sent early, and the home shard's reading.
    fn send_next(&mut self, state: &ComponentState, decls: &mut [Declaration]) -> Option<SentWave> {
        let n = state.run.engine.shards.len();
        let ready: Vec<usize> = (0..decls.len())
            .filter(|&i| !self.is_done(i) && decls[i].provider.resolved.get().is_some())
            .collect();
        if !self.first && ready.is_empty() {
            return None;
        }
        let mut per_shard = ShardBatch::for_shards(n, ready.len());
        if !ready.is_empty() {
            self.done.resize(decls.len(), false);
        }
        for &i in &ready {
            if let Some(done) = self.done.get_mut(i) {
                *done = true;
            }
            let Some(d) = decls.get_mut(i) else {
                continue;
            };
            if let Some(batch) = per_shard.get_mut(shard_of(&d.path, n)) {
                batch.push(i, d);
            }
        }
        let first = std::mem::replace(&mut self.first, false);
        let early = if first {
            std::mem::take(&mut self.early_replies)
        } else {
            Vec::new()
        };
        // The first wave also takes the declarations sent early, if any.
        let wave: Vec<usize> = if first && !self.sent_early.is_empty() {
            (0..decls.len())
                .filter(|&i| self.was_sent_early(i) || ready.binary_search(&i).is_ok())
                .collect()
        } else {
            ready
        };
        let mut messages = Vec::new();
        for (s, batch) in per_shard.into_iter().enumerate() {
            let is_home = first && s == self.home;
            // A shard sent chunks early gets a last message, which lets
            // go of the entry it kept.
            let last = first && self.chunked.get(s).copied().unwrap_or(false);
            if batch.is_empty() && !is_home && !last {
                continue;
            }
            let chunk = if last { Chunk::Last } else { Chunk::Only };
            messages.push((s, batch, is_home, chunk));
        }
        let replies = send_wave(state, early, messages);
        Some((wave, replies))
    }

    /// Takes a wave's replies in: the outcomes, the home shard's reading,
    /// and the first error (a handler's, or a state another component
    /// declared first).
    async fn gather(&mut self, decls: &[Declaration], replies: Replies) -> Result<()> {
        let mut errors: Vec<Error> = Vec::new();
        for (is_home, reply) in replies.all().await? {
            if let Some(e) = reply.error {
                return Err(e);
            }
            self.matched += reply.matched;
            self.out.unchanged += reply.unchanged as u64;
            if is_home {
                self.out.prev_children = reply.prev_children;
                // The entry as the home shard read it: its state count,
                // failure, and whether there is one.
                let own = reply.entry.as_deref().and_then(Option::as_ref);
                self.stored = own.map_or(0, |e| e.states.len());
                self.out.prev_failure = own.and_then(|e| e.failure.clone());
                self.out.fresh = own.is_none();
                self.home_entry = reply.entry;
            }
            let mut outcomes = reply.outcomes;
            // A failed outcome fails the component: the reconciliation
            // is then dropped, and what the error leaves in its place
            // never read.
            for o in outcomes.iter_mut().filter(|o| o.result.is_err()) {
                if let Err(e) = std::mem::replace(&mut o.result, Ok(None)) {
                    errors.push(e);
                }
            }
            self.out.results.add(outcomes);
            // States another component declared first.
            for (idx, first_by) in reply.duplicates {
                if let Some(d) = decls.get(idx) {
                    errors.push(Error::DuplicateDeclaration {
                        provider: d.provider.path.name.to_string(),
                        key: d.key.clone(),
                        first_by: Some(first_by),
                    });
                }
            }
        }
        match errors.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The reconciliation, with the states of the entry that no
    /// declaration matched: the component's orphans.
    fn find_orphans(
        mut self,
        state: &ComponentState,
        decls: &[Declaration],
        paths: Seen,
    ) -> Result<Reconciliation> {
        if self.matched == self.stored {
            return Ok(self.out);
        }
        // The entry as the home shard read it in this run, which the
        // declarations were matched against. States can have left it
        // since: taken over by components that declared them in this run
        // (as orphans, `FilterOrphans` drops them before anything is
        // deleted), or dropped below a container deleted or rebuilt (their
        // records are then below the container's generation, or their
        // provider unresolved: nothing to delete). Either way the orphan's
        // removal from the entry changes nothing, but the component's memo
        // is not recorded in such a run (it runs again next time). None
        // entered it: only the component's own commit, after this, adds
        // to it.
        let Some(entry) = self.home_entry else {
            return Err(Error::msg(format!(
                "component {}: its home shard gave no reading of its entry",
                state.path
            )));
        };
        if let Some(entry) = entry.as_ref() {
            self.out.orphans = paths.orphans_in(decls, entry);
        }
        Ok(self.out)
    }
}

/// Sends a wave's messages, one per shard, with their replies gathered
/// when there are several (a lone message, as every message of a component
/// of one state is, keeps its own channel, which costs less).
fn send_wave(
    state: &ComponentState,
    early: Vec<oneshot::Receiver<ShardReply>>,
    messages: Vec<(usize, ShardBatch, bool, Chunk)>,
) -> Replies {
    let homes: Vec<bool> = messages.iter().map(|(_, _, home, _)| *home).collect();
    let wave = match messages.len() {
        0 => None,
        1 => messages.into_iter().next().map(|(s, batch, home, chunk)| {
            WaveReplies::One(state.send_batch(s, batch, home, chunk))
        }),
        n => {
            let (gather, gathered) = Gather::new(n);
            for (position, (s, batch, home, chunk)) in messages.into_iter().enumerate() {
                let reply = ReplyTo::Gathered(Arc::clone(&gather), position);
                state.send_batch_to(s, batch, home, chunk, reply);
            }
            Some(WaveReplies::Gathered(gathered))
        }
    };
    Replies { early, homes, wave }
}

/// The generation of a container with none of its own (new, or declared
/// again after it was dropped): above any it had before, so that no record
/// left from an earlier life of the container is trusted and its
/// [`memo_key`](crate::TargetStateProvider::memo_key) is one it never gave
/// before. Each earlier generation was given, or moved on, in a run that
/// then committed it: the ledger's commit count has passed them all. (In a
/// worker group, records restored from another member's changelog may
/// carry generations above this ledger's count; a container dropped there
/// and declared again here could then repeat one, which only costs the
/// memo keys' distinctness, as the records below it went with the drop.)
fn new_container_generation(run: &Run) -> ChildGeneration {
    let floor = run.engine.ledger.commits() + 1;
    ChildGeneration {
        current: floor,
        destructive_floor: floor,
    }
}

/// Builds a container's child handler from its action and resolves the
/// child provider. Returns the generation given to the children: the
/// stored one, moved on by the action's invalidation, by a destructive
/// change of the container above that took this container's records, or
/// (lossy) by anything that left this container maybe missing.
fn resolve_child(
    run: &Run,
    d: &Declaration,
    child: &Arc<ProviderCore>,
    r: &Reconciled,
) -> Result<Option<ChildGeneration>> {
    let Some(out) = r.output() else {
        return Ok(None);
    };
    if out.kind == ActionKind::Delete {
        return Ok(None);
    }
    let wrap = |cause: Error| Error::Reconcile {
        provider: d.provider.path.name.to_string(),
        key: d.key.clone(),
        cause: Box::new(cause),
    };
    let factory = out.sink.child_handler.as_ref().ok_or_else(|| {
        wrap(Error::Usage(
            "declared with a child, but its sink has no child handler (use TargetActionSink::from_async_fn_with_child_handler)".into(),
        ))
    })?;
    let def = guarded(|| factory(&out.action)).map_err(wrap)?;
    let Some(prev) = r.prev.as_ref().and_then(|p| p.child_gen) else {
        let gen = new_container_generation(run);
        resolve_provider(run, child, def.handler, gen).map_err(wrap)?;
        return Ok(Some(gen));
    };
    // A container whose own records went with a destructive change of the
    // container above it is new: whatever its children's records say, they
    // went with it.
    let outer = d
        .provider
        .resolved
        .get()
        .map(|resolved| resolved.generation)
        .unwrap_or_default();
    let wiped = r
        .prev
        .as_ref()
        .is_some_and(|p| p.gen < outer.destructive_floor);
    // One that may be missing (a lossy change above it, or an action of
    // it that failed or was cut short) may have lost its children too:
    // they are reconciled as maybe missing, at any depth.
    let missing = r
        .prev
        .as_ref()
        .is_some_and(|p| p.may_be_missing || p.gen < outer.current);
    let invalidation = match (wiped, missing, out.child_invalidation) {
        (true, _, _) | (_, _, Some(TargetChildInvalidation::Destructive)) => {
            Some(TargetChildInvalidation::Destructive)
        }
        (false, true, _) => Some(TargetChildInvalidation::Lossy),
        (false, false, own) => own,
    };
    let gen = match invalidation {
        Some(TargetChildInvalidation::Destructive) => ChildGeneration {
            current: prev.current + 1,
            destructive_floor: prev.current + 1,
        },
        Some(TargetChildInvalidation::Lossy) => ChildGeneration {
            current: prev.current + 1,
            destructive_floor: prev.destructive_floor,
        },
        None => prev,
    };
    resolve_provider(run, child, def.handler, gen).map_err(wrap)?;
    Ok(Some(gen))
}
