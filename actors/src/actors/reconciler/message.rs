//! The messages a shard answers, and what they carry.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};

use actix::Message;
use tokio::sync::oneshot;

use crate::actors::list_index::ListIndex;
use crate::error::{Error, Result};
use crate::ledger::record::StateEntry;
use crate::ledger::stored::StoredEntry;
use crate::model::erased::ErasedOutput;
use crate::model::provider::{ChildGeneration, DeclaredValue, ProviderCore};
use crate::model::{ComponentPath, StableKey};
use crate::sync::lock;

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
    by_address: ListIndex<usize>,
}

/// The fewest declarations for which each shard's list is sized ahead.
const SIZED_FROM: usize = 64;

impl ShardBatch {
    /// Batches for `shards` shards, sized for `decls` declarations spread
    /// over them.
    pub(crate) fn for_shards(shards: usize, decls: usize) -> Vec<ShardBatch> {
        let each = decls / shards.max(1);
        // Paths hash evenly: a little over the mean is enough. A few
        // declarations are not sized for: most shards get none, and an
        // empty list allocates nothing.
        let capacity = if decls < SIZED_FROM {
            0
        } else {
            each + each / 8 + 8
        };
        (0..shards)
            .map(|_| ShardBatch {
                decls: Vec::with_capacity(capacity),
                ..ShardBatch::default()
            })
            .collect()
    }

    /// Adds declaration `idx` of a component; it takes the declared value,
    /// which a declaration is sent with once.
    pub(crate) fn push(&mut self, idx: usize, d: &mut Declaration) {
        // A component's declarations usually name one provider: the one
        // added last is checked before the index.
        let provider = match self.providers.last() {
            Some(last) if Arc::ptr_eq(last, &d.provider) => self.providers.len() - 1,
            _ => self.provider_index(&d.provider),
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

    /// The position of `provider` in the batch's list, added if new.
    fn provider_index(&mut self, provider: &Arc<ProviderCore>) -> usize {
        let address = |p: &Arc<ProviderCore>| Arc::as_ptr(p) as usize;
        if let Some(i) = self
            .by_address
            .position(&self.providers, address(provider), address)
        {
            return i;
        }
        self.providers.push(Arc::clone(provider));
        self.by_address.pushed(&self.providers, address);
        self.providers.len() - 1
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

/// What a shard found for one declared state. The component keeps its
/// shards' outcomes as their replies bring them, without copying them.
pub(crate) struct Outcome {
    pub idx: usize,
    /// The component whose entry held the state, if any.
    pub location: Found,
    /// The state's entry as it was.
    pub prev: Option<StateEntry>,
    pub result: Result<Option<ErasedOutput>>,
    /// For a container: the generation its children are given, worked
    /// out by the component once the shard answered (`None` from it).
    pub child_gen: Option<ChildGeneration>,
}

impl Outcome {
    /// The handler's output, when it answered with one.
    pub(crate) fn output(&self) -> Option<&ErasedOutput> {
        self.result.as_ref().ok()?.as_ref()
    }

    /// The handler's output, when it answered with one.
    pub(crate) fn output_mut(&mut self) -> Option<&mut ErasedOutput> {
        self.result.as_mut().ok()?.as_mut()
    }

    /// The component whose entry held the state, `own` being the one that
    /// declared it; `None` for a new state.
    pub(crate) fn location<'a>(&'a self, own: &'a Arc<[u8]>) -> Option<&'a Arc<[u8]>> {
        match &self.location {
            Found::Nowhere => None,
            Found::Own => Some(own),
            Found::In(component) => Some(component),
        }
    }

    /// The other component whose entry held the state, if one did: the
    /// state moves from it. (A shard looks in other components' entries
    /// only for a state the declaring one's does not hold.)
    pub(crate) fn moved_from(&self) -> Option<&Arc<[u8]>> {
        match &self.location {
            Found::In(component) => Some(component),
            Found::Nowhere | Found::Own => None,
        }
    }
}

/// Reconcile a component's declarations that route to this shard.
pub(crate) struct ReconcileBatch {
    pub run_id: u64,
    pub component: Arc<[u8]>,
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
    pub reply: ReplyTo,
}

/// Where a shard's answer to a [`ReconcileBatch`] goes.
pub(crate) enum ReplyTo {
    /// The message's own channel.
    One(oneshot::Sender<ShardReply>),
    /// Its place among the replies of the messages a component sent
    /// together, which it takes at once ([`Gather`]).
    Gathered(Arc<Gather>, usize),
}

impl ReplyTo {
    /// Hands `reply` over.
    pub(crate) fn send(self, reply: ShardReply) {
        match self {
            ReplyTo::One(tx) => {
                let _ = tx.send(reply);
            }
            ReplyTo::Gathered(gather, position) => gather.deliver(position, reply),
        }
    }
}

/// The replies of messages a component sent to several shards at once,
/// handed to it together when the last one comes: the component is woken
/// once rather than once per shard. A message dropped unanswered (its
/// shard stopped) drops its share; once every share is gone the channel
/// closes, and the component sees its shards stopped.
pub(crate) struct Gather(Mutex<Gathering>);

/// The replies kept so far, and where they go once the last one comes.
struct Gathering {
    replies: Vec<Option<ShardReply>>,
    remaining: usize,
    done: Option<oneshot::Sender<Vec<Option<ShardReply>>>>,
}

/// The replies of a [`Gather`], in the order of their messages.
pub(crate) type Gathered = oneshot::Receiver<Vec<Option<ShardReply>>>;

impl Gather {
    /// A gathering of `n` replies, and where they arrive together.
    pub(crate) fn new(n: usize) -> (Arc<Self>, Gathered) {
        let (tx, rx) = oneshot::channel();
        let gathering = Gathering {
            replies: (0..n).map(|_| None).collect(),
            remaining: n,
            done: Some(tx),
        };
        (Arc::new(Gather(Mutex::new(gathering))), rx)
    }

    /// Keeps the reply of the message at `position`; the last one hands
    /// them all over.
    fn deliver(&self, position: usize, reply: ShardReply) {
        let handed = {
            let mut g = lock(&self.0);
            if let Some(slot) = g.replies.get_mut(position) {
                *slot = Some(reply);
            }
            g.remaining = g.remaining.saturating_sub(1);
            if g.remaining == 0 {
                g.done
                    .take()
                    .map(|done| (done, std::mem::take(&mut g.replies)))
            } else {
                None
            }
        };
        if let Some((done, replies)) = handed {
            let _ = done.send(replies);
        }
    }
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
    pub(super) fn failed(e: Error) -> Self {
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

/// One declared target state.
pub(crate) struct Declaration {
    pub path: Arc<[u8]>,
    pub key: StableKey,
    pub provider: Arc<ProviderCore>,
    /// The value; an exact one is taken by the message that sends the
    /// declaration to its shard.
    pub value: DeclaredValue,
    /// The provider of the state's children, resolved when it reconciles.
    pub child: Option<Arc<ProviderCore>>,
}

#[cfg(test)]
mod tests {
    use super::{Gather, ReplyTo, ShardReply};
    use std::sync::Arc;

    fn reply(matched: usize) -> ShardReply {
        ShardReply {
            matched,
            ..ShardReply::default()
        }
    }

    #[tokio::test]
    async fn gathered_replies_arrive_together_in_the_order_of_their_messages() {
        let (gather, mut gathered) = Gather::new(3);
        ReplyTo::Gathered(Arc::clone(&gather), 2).send(reply(2));
        ReplyTo::Gathered(Arc::clone(&gather), 0).send(reply(0));
        assert!(gathered.try_recv().is_err(), "one reply is still to come");
        ReplyTo::Gathered(gather, 1).send(reply(1));
        let matched: Vec<Option<usize>> = gathered
            .await
            .map(|all| all.iter().map(|r| r.as_ref().map(|r| r.matched)).collect())
            .unwrap_or_default();
        assert_eq!(matched, [Some(0), Some(1), Some(2)]);
    }

    #[tokio::test]
    async fn a_share_dropped_unanswered_closes_the_gathering() {
        let (gather, gathered) = Gather::new(2);
        let answered = ReplyTo::Gathered(Arc::clone(&gather), 0);
        let dropped = ReplyTo::Gathered(gather, 1);
        answered.send(reply(0));
        drop(dropped);
        assert!(
            gathered.await.is_err(),
            "the component sees its shard stopped"
        );
    }
}
