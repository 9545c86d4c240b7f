//! Reconciling a component's declarations, wave by wave: containers
//! first, then their children.

use std::sync::Arc;

use tokio::sync::oneshot;

use crate::actors::reconciler::{shard_of, shard_stopped, Chunk, Found, ShardBatch, ShardReply};
use crate::error::{Error, Result};
use crate::ledger::record::StateEntry;
use crate::model::erased::ErasedOutput;
use crate::model::provider::{ChildGeneration, ProviderCore};
use crate::model::{ActionKind, StableKey, TargetChildInvalidation};
use crate::run::Run;

use super::{guarded, resolve_provider, ComponentState, Declaration, Early, Seen};

/// What reconciliation found for one declaration.
pub(super) struct Reconciled {
    pub(super) location: Option<Arc<[u8]>>,
    pub(super) prev: Option<StateEntry>,
    pub(super) output: Option<ErasedOutput>,
    /// For containers: the generation given to the children.
    pub(super) child_gen: Option<ChildGeneration>,
}

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
    parts: Vec<Vec<(usize, Reconciled)>>,
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
    fn add(&mut self, outcomes: Vec<(usize, Reconciled)>) {
        if outcomes.is_empty() {
            return;
        }
        if self.slot.is_empty() {
            self.slot = vec![NO_OUTCOME; self.declarations];
        }
        let part = self.parts.len();
        for (at, (idx, _)) in outcomes.iter().enumerate() {
            if let Some(slot) = self.slot.get_mut(*idx) {
                *slot = (part, at);
            }
        }
        self.parts.push(outcomes);
    }

    pub(super) fn get(&self, idx: usize) -> Option<&Reconciled> {
        let &(part, at) = self.slot.get(idx)?;
        self.parts.get(part)?.get(at).map(|(_, r)| r)
    }

    pub(super) fn get_mut(&mut self, idx: usize) -> Option<&mut Reconciled> {
        let &(part, at) = self.slot.get(idx)?;
        self.parts.get_mut(part)?.get_mut(at).map(|(_, r)| r)
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
            .filter_map(|(idx, &(part, at))| Some((idx, &self.parts.get(part)?.get(at)?.1)))
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
    let run = &state.run;
    let shards = &run.engine.shards;
    let n = shards.len();
    // The home shard reads the whole entry once: it hands its reading back
    // (to find the states the component no longer declares in) and reads
    // its child list. Taking the
    // shard of the first declaration as home means a component whose states
    // all live on one shard sends one message.
    let home = decls
        .first()
        .map_or_else(|| shard_of(&state.key, n), |d| shard_of(&d.path, n));
    let sent_early = |i: usize| early.sent.get(i).copied().unwrap_or(false);
    let mut done: Vec<bool> = (0..decls.len()).map(sent_early).collect();
    let chunked = |s: usize| early.shards.get(s).copied().unwrap_or(false);
    let mut early_replies = early.replies;
    let mut out = Reconciliation {
        results: Outcomes::new(decls.len()),
        unchanged: 0,
        waves: Vec::new(),
        orphans: Vec::new(),
        prev_children: Vec::new(),
        prev_failure: None,
        fresh: false,
    };
    let mut first = true;
    // The home shard's reading of the component's entry.
    let mut home_entry = None;
    // The entry's states, and how many the declarations found there.
    let (mut stored, mut matched) = (0, 0);
    loop {
        let ready: Vec<usize> = (0..decls.len())
            .filter(|&i| !done[i] && decls[i].provider.resolved.get().is_some())
            .collect();
        if !first && ready.is_empty() {
            break;
        }
        let mut per_shard = ShardBatch::for_shards(n, ready.len());
        for &i in &ready {
            done[i] = true;
            let Some(d) = decls.get_mut(i) else {
                continue;
            };
            if let Some(batch) = per_shard.get_mut(shard_of(&d.path, n)) {
                batch.push(i, d);
            }
        }
        // The first wave also takes the declarations sent early.
        let wave: Vec<usize> = if first {
            (0..decls.len())
                .filter(|&i| sent_early(i) || ready.binary_search(&i).is_ok())
                .collect()
        } else {
            ready
        };
        let mut replies: Vec<(bool, oneshot::Receiver<ShardReply>)> = Vec::new();
        if first {
            replies.extend(early_replies.drain(..).map(|rx| (false, rx)));
        }
        for (s, batch) in per_shard.into_iter().enumerate() {
            let is_home = first && s == home;
            // A shard sent chunks early gets a last message, which lets
            // go of the entry it kept.
            let last = first && chunked(s);
            if batch.is_empty() && !is_home && !last {
                continue;
            }
            let chunk = if last { Chunk::Last } else { Chunk::Only };
            let reply = state.send_batch(s, batch, is_home, chunk);
            replies.push((is_home, reply));
        }
        let mut errors: Vec<Error> = Vec::new();
        for (is_home, rx) in replies {
            let reply = rx.await.map_err(shard_stopped)?;
            if let Some(e) = reply.error {
                return Err(e);
            }
            matched += reply.matched;
            out.unchanged += reply.unchanged as u64;
            if first && is_home {
                out.prev_children = reply.prev_children;
                // The entry as the home shard read it: its state count,
                // failure, and whether there is one.
                let own = reply.entry.as_deref().and_then(Option::as_ref);
                stored = own.map_or(0, |e| e.states.len());
                out.prev_failure = own.and_then(|e| e.failure.clone());
                out.fresh = own.is_none();
                home_entry = reply.entry;
            }
            let mut found = Vec::with_capacity(reply.outcomes.len());
            for o in reply.outcomes {
                match o.result {
                    Err(e) => errors.push(e),
                    Ok(output) => found.push((
                        o.idx,
                        Reconciled {
                            location: match o.location {
                                Found::Nowhere => None,
                                Found::Own => Some(Arc::clone(&state.key)),
                                Found::In(component) => Some(component),
                            },
                            prev: o.prev,
                            output,
                            child_gen: None,
                        },
                    )),
                }
            }
            out.results.add(found);
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
        if let Some(e) = errors.into_iter().next() {
            return Err(e);
        }
        for &i in &wave {
            let d = &decls[i];
            let (Some(child), Some(r)) = (&d.child, out.results.get_mut(i)) else {
                continue;
            };
            r.child_gen = resolve_child(run, d, child, r)?;
        }
        out.waves.push(wave);
        first = false;
    }
    if let Some(i) = done.iter().position(|d| !d) {
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
    if matched != stored {
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
        let Some(entry) = home_entry else {
            return Err(Error::msg(format!(
                "component {}: its home shard gave no reading of its entry",
                state.path
            )));
        };
        if let Some(entry) = entry.as_ref() {
            out.orphans = paths.orphans_in(decls, entry);
        }
    }
    Ok(out)
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
    let Some(out) = &r.output else {
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
