//! Sources: where the items that components read come from, and how their
//! delivery lines up with what the targets hold.
//!
//! A [`Source`] yields [`Batch`]es of items, each with a stable key, a
//! version or an ordinal, and a payload. weir runs one component per key,
//! so every item is isolated from the others: a bad one fails alone.
//!
//! # Two kinds of batches
//!
//! - A [`Listing`] is everything the source holds (a directory, a table
//!   read from one snapshot). [`Ctx::mount_source`](crate::Ctx::mount_source)
//!   mounts one component per listed key; a key no longer listed is not
//!   mounted, so its component's target states are deleted, as for any
//!   component no longer mounted. A listed item's *version* (a content
//!   fingerprint, an `updated_at`) is its memo key: an item whose version,
//!   and the [`salt`](Listing::salt), are those of its last successful run
//!   is skipped. Payloads may be left out of a listing and loaded, in bulk,
//!   only for the items that must run ([`Load`]).
//! - [`Changes`](Batch::Changes) come from a stream: upserts and tombstones, each with an
//!   *ordinal* (a position that grows for each key, such as a stream
//!   sequence) and an acknowledgement handle. [`App::consume`](crate::App::consume) runs each
//!   batch as one run scoped to the batch's keys, so a run never deletes a
//!   key it did not see: only a tombstone deletes.
//!
//! # Guarantees of a change stream
//!
//! [`App::consume`](crate::App::consume) gives at-least-once delivery, made idempotent by the
//! declarative targets:
//!
//! - **Acknowledged after commit.** A change is acknowledged only after its
//!   component's target writes and its ledger commit have succeeded (for a
//!   tombstone: after the deletes of the states it held).
//! - **Never rolled back.** Each key keeps the last ordinal applied to it,
//!   tombstones included (a deleted key keeps an empty component holding
//!   its ordinal). A change whose ordinal is older than or equal to it is
//!   acknowledged and ignored, so a redelivery or a replay of the whole
//!   stream changes nothing.
//! - **Coalesced.** Several changes of one key in one batch become the
//!   latest; the older ones are settled as it is.
//! - **Poison isolated.** A failed component's change is not acknowledged:
//!   it is handed back for redelivery after a backoff
//!   ([`Outcome::Retry`]). After [`ConsumeOptions::max_deliveries`]
//!   deliveries it is released ([`Outcome::DeadLetter`]) so that the stream
//!   moves on; its component stays recorded as failed (see
//!   [`App::failed_components`](crate::App::failed_components)) until a later change of the key succeeds.
//! - **Kept alive.** While a batch's run takes longer than
//!   [`ConsumeOptions::keep_alive`], [`Source::keep_alive`] tells the
//!   source that its changes are still in progress, so that nothing is
//!   redelivered meanwhile.
//! - **Bounded.** A batch holds at most [`ConsumeOptions::max_in_flight`]
//!   changes. The next batch is read while one runs, and a batch's
//!   changes are settled (once committed) while the next one runs
//!   ([`ConsumeOptions::read_ahead`]), so that the source's round trips
//!   overlap the runs: at most two batches are unacknowledged at once. A
//!   batch read ahead and not run (the app shuts down) is handed back for
//!   redelivery ([`Outcome::Interrupted`]). Where the source counts
//!   deliveries itself (JetStream), a delivery handed back counts towards
//!   [`ConsumeOptions::max_deliveries`] like a failed one; turn
//!   [`ConsumeOptions::read_ahead`] off to keep the changes of a stopping
//!   app to the batch it runs.
//!
//! # Writing a source
//!
//! A source implements [`Source`]: [`next_batch`](Source::next_batch)
//! returns a listing or changes (or `None` once a bounded read is done),
//! [`settle`](Source::settle) acknowledges, redelivers or releases the
//! changes of a batch once its run has committed. A Kafka source fits
//! without changes to the engine:
//!
//! - `next_batch` polls the consumer (rdkafka's `StreamConsumer`, in a
//!   consumer group) for up to `max_in_flight` records; the key is the
//!   record's key, the ordinal its offset (per partition, so the key must
//!   map to one Kafka partition, as Kafka's default partitioner does), a
//!   null value is a tombstone.
//! - The acknowledgement handle is `(partition, offset)`. `settle` marks
//!   them done and commits, for each partition, the offset below the
//!   lowest one not yet done (`commit_offsets`), as Kafka Connect's sink
//!   tasks do: Kafka acknowledges by position, not by message.
//! - Kafka has no per-message redelivery: a `Retry` outcome keeps the
//!   record in the source, which returns it again in a later batch after
//!   the delay (without committing past it); a `DeadLetter` outcome
//!   produces it to a dead-letter topic and lets the offset move on.
//! - A rebalance that revokes a partition settles what is in flight first
//!   (rdkafka's rebalance callback), so a new owner starts from committed
//!   offsets only.
//!
//! # Worker groups
//!
//! In a member of a [worker group](crate::group), every run is scoped to
//! the partitions the member holds. Before each batch, [`App::consume`](crate::App::consume)
//! tells the source which partitions those are ([`Source::assign`]); a
//! member that holds none yet runs an empty run to acquire its share
//! first. A batch read ahead was fetched with the partitions held before
//! it. A change whose key is in a partition the member does not hold
//! (it moved between the fetch and the run) is settled as
//! [`Outcome::NotHeld`], without running it: handed back unacknowledged
//! for the partition's holder.
//!
//! A source splits its reads by partition where it can: one durable
//! consumer per partition, read by the partition's holder only, so that a
//! partition moving to another member moves its unacknowledged messages
//! with it. Server-side partitioning (JetStream's subject-mapped partitions,
//! Kafka's partitions) is used only where its mapping equals
//! [`partition_of`](crate::group::partition_of); otherwise each partition's
//! consumer reads the whole stream and acknowledges at once the messages
//! of other partitions, a filter on the client that costs one delivery of
//! each message per partition (a listing source, such as a table, is read
//! whole by every member and filtered the same way).
//!
//! # Example
//!
//! A source of changes held in memory, consumed into a table of rows:
//!
//! ```
//! use std::collections::VecDeque;
//! use weir_actors::source::{Batch, Change, ConsumeOptions, Settled, Source};
//! use weir_actors::{App, Result};
//!
//! /// Changes held in memory; `None` payloads are tombstones.
//! struct Memory {
//!     pending: VecDeque<(String, u64, Option<String>)>,
//!     acked: Vec<u64>,
//! }
//!
//! impl Source for Memory {
//!     type Payload = String;
//!     type Ack = u64;
//!
//!     fn name(&self) -> &str {
//!         "memory"
//!     }
//!
//!     async fn next_batch(&mut self, max: usize) -> Result<Option<Batch<String, u64>>> {
//!         if self.pending.is_empty() {
//!             return Ok(None); // read to the end: consume returns
//!         }
//!         let n = max.min(self.pending.len());
//!         let changes = self
//!             .pending
//!             .drain(..n)
//!             .map(|(key, seq, payload)| match payload {
//!                 Some(p) => Change::upsert(key, seq, p, seq),
//!                 None => Change::delete(key, seq, seq),
//!             })
//!             .collect();
//!         Ok(Some(Batch::Changes(changes)))
//!     }
//!
//!     async fn settle(&mut self, settled: Vec<Settled<u64>>) -> Result<()> {
//!         for s in settled {
//!             if s.outcome.is_ack() {
//!                 self.acked.push(s.ack);
//!             }
//!         }
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<()> {
//! let dir = tempfile::tempdir()?;
//! let app = App::builder("orders").ledger_path(dir.path()).build().await?;
//! let mut source = Memory {
//!     pending: VecDeque::from([
//!         ("k1".to_string(), 1, Some("a".to_string())),
//!         ("k2".to_string(), 2, Some("b".to_string())),
//!         ("k1".to_string(), 3, None),
//!     ]),
//!     acked: Vec::new(),
//! };
//! let report = app
//!     .consume(&mut source, ConsumeOptions::default(), |ctx, batch| async move {
//!         // Declare tables here, then one component per key:
//!         ctx.mount_source(batch, |_ctx, item| async move {
//!             let _row: &String = &item.payload;
//!             Ok(())
//!         })
//!         .await
//!     })
//!     .await?;
//! assert_eq!(report.acknowledged, 3);
//! source.acked.sort_unstable();
//! assert_eq!(source.acked, vec![1, 2, 3]);
//! # Ok(())
//! # }
//! ```

mod consume;
mod mount;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::model::{IntoStableKey, StableKey};

pub use consume::{ConsumeOptions, ConsumeReport, DEFAULT_MAX_DELIVERIES, DEFAULT_MAX_IN_FLIGHT};
pub use mount::SourceBatch;

/// A source of items: a listing of everything it holds, or a stream of
/// changes with acknowledgements. See the [module](self) for the
/// guarantees [`App::consume`](crate::App::consume) builds on it.
pub trait Source: Send {
    /// What a component receives for an item (a row, a message body).
    type Payload: Send + 'static;
    /// What [`settle`](Source::settle) needs to acknowledge a change (a
    /// message handle, an offset). Listing sources use `()`. `Sync`, so
    /// that [`keep_alive`](Source::keep_alive) can borrow the handles of a
    /// batch while it runs (and `App::consume`'s future stays `Send`).
    type Ack: Send + Sync + 'static;

    /// A short name for logs and metrics (the `source` label).
    fn name(&self) -> &str;

    /// Waits for the next batch: at most `max` changes, or a whole
    /// listing. `Ok(None)` when the source has nothing more to give: a
    /// bounded read reached the position it started at, or a listing
    /// source in one-shot mode already gave its listing.
    ///
    /// Must be cancel-safe: [`App::consume`](crate::App::consume) drops a
    /// call in progress at a shutdown, and while it reads the next batch
    /// ahead of a running one, at each
    /// [`keep_alive`](Source::keep_alive) and once the run ends. The next
    /// call goes on where the dropped one stopped, losing nothing it had
    /// received. An `Ok(None)` returned while a batch runs is not taken as
    /// the end: the source is asked again once that batch is settled (its
    /// changes may be handed back for redelivery).
    ///
    /// # Errors
    /// When the source cannot be read; [`App::consume`](crate::App::consume)
    /// returns the error (changes not settled are redelivered later by the
    /// source itself).
    fn next_batch(
        &mut self,
        max: usize,
    ) -> impl Future<Output = Result<Option<Batch<Self::Payload, Self::Ack>>>> + Send;

    /// Acknowledges, redelivers or releases the changes of a batch, once
    /// the run that applied them has committed.
    ///
    /// # Errors
    /// When the source cannot be told; the changes are then redelivered by
    /// the source, and re-applying them changes nothing.
    fn settle(
        &mut self,
        settled: Vec<Settled<Self::Ack>>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Tells the source that these changes are still being worked on (a
    /// JetStream in-progress acknowledgement), so that it does not
    /// redeliver them. Called every
    /// [`ConsumeOptions::keep_alive`] while a batch runs. The default does
    /// nothing.
    ///
    /// # Errors
    /// Logged, never fatal: the worst outcome is a redelivery.
    fn keep_alive(&mut self, acks: &[&Self::Ack]) -> impl Future<Output = Result<()>> + Send {
        let _ = acks;
        async { Ok(()) }
    }

    /// In a member of a worker group: the partitions the member holds,
    /// called before a fetch whenever they changed (and before the first).
    /// A source split by partition (one durable consumer per partition)
    /// reads from the consumers of these partitions only, and acknowledges
    /// at once a message whose key is in another partition than its
    /// consumer's (the consumer of that partition delivers it to its
    /// holder). The default does nothing: every change is fetched, and
    /// those of partitions not held are settled [`Outcome::NotHeld`].
    ///
    /// # Errors
    /// When the source cannot switch; [`App::consume`](crate::App::consume)
    /// returns the error.
    fn assign(&mut self, assignment: &Assignment) -> impl Future<Output = Result<()>> + Send {
        let _ = assignment;
        async { Ok(()) }
    }

    /// How many changes the source holds beyond those settled (its lag),
    /// when it knows. The default is `None`.
    fn lag(&mut self) -> impl Future<Output = Option<u64>> + Send {
        async { None }
    }

    /// Called once [`App::consume`](crate::App::consume) returns: ends what
    /// the source holds open for reading (such as a pull request a dropped
    /// [`next_batch`](Source::next_batch) left waiting), handing back
    /// what it received and did not return, so that the next reader gets
    /// it at once. The source can be consumed again afterwards. The
    /// default does nothing.
    fn release(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// The partitions of a worker group a member holds (see
/// [`Source::assign`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignment {
    /// The group's partition count.
    pub partitions: u32,
    /// The data partitions this member holds, ascending; the partition of a
    /// key is [`partition_of`](crate::group::partition_of).
    pub held: Vec<u32>,
}

/// What a source gives at once.
pub enum Batch<P, A> {
    /// Everything the source holds: a key not listed is deleted.
    Listing(Listing<P>),
    /// Changes from a stream: keys not in the batch are left alone.
    Changes(Vec<Change<P, A>>),
}

impl<P, A> fmt::Debug for Batch<P, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Batch::Listing(l) => f.debug_tuple("Listing").field(&l.items.len()).finish(),
            Batch::Changes(c) => f.debug_tuple("Changes").field(&c.len()).finish(),
        }
    }
}

/// A complete listing of a source's items.
pub struct Listing<P> {
    /// The items, at most one per key.
    pub items: Vec<Listed<P>>,
    /// Loads the payloads left out of `items`, for the items that must run.
    pub loader: Option<Arc<dyn Load<P>>>,
    /// Mixed into every item's memo key: the version of the code that
    /// reads the items, and the
    /// [`memo_key`](crate::TargetStateProvider::memo_key) of the providers
    /// it declares into (so that a table created again gets its rows
    /// again). Set it with [`Listing::salt`].
    pub salt: String,
}

impl<P> Listing<P> {
    /// A listing of these items, with every payload given.
    pub fn new(items: Vec<Listed<P>>) -> Self {
        Self {
            items,
            loader: None,
            salt: String::new(),
        }
    }

    /// Loads the payloads left out with `loader`, in bulk.
    #[must_use]
    pub fn with_loader(mut self, loader: Arc<dyn Load<P>>) -> Self {
        self.loader = Some(loader);
        self
    }

    /// Mixes `salt` into every item's memo key (see [`Listing::salt`]).
    #[must_use]
    pub fn salt(mut self, salt: impl Into<String>) -> Self {
        self.salt = salt.into();
        self
    }
}

/// One item of a [`Listing`].
#[derive(Clone, Debug)]
pub struct Listed<P> {
    /// The item's key: its component's key.
    pub key: StableKey,
    /// The item's version (a fingerprint, an `updated_at`): an item whose
    /// version is that of its last successful run is skipped. `None`: it
    /// always runs.
    pub version: Option<Vec<u8>>,
    /// The payload, or `None` to have the listing's [`Load`] fetch it when
    /// the item must run.
    pub payload: Option<P>,
}

impl<P> Listed<P> {
    /// An item with its payload.
    pub fn new(key: impl IntoStableKey, version: Option<Vec<u8>>, payload: P) -> Self {
        Self {
            key: key.into_stable_key(),
            version,
            payload: Some(payload),
        }
    }

    /// An item whose payload is loaded only if it must run.
    pub fn lazy(key: impl IntoStableKey, version: Vec<u8>) -> Self {
        Self {
            key: key.into_stable_key(),
            version: Some(version),
            payload: None,
        }
    }
}

/// The future of [`Load::load`]: the payloads of the keys found.
pub type Loading<'a, P> =
    std::pin::Pin<Box<dyn Future<Output = Result<Vec<(StableKey, P)>>> + Send + 'a>>;

/// Loads payloads in bulk (for example `WHERE id = ANY($1)`).
pub trait Load<P>: Send + Sync {
    /// The payloads of `keys`. A key left out of the answer is taken for
    /// gone: its item is not mounted, so its states are deleted.
    fn load(&self, keys: Vec<StableKey>) -> Loading<'_, P>;
}

/// One change from a stream.
#[derive(Debug)]
pub struct Change<P, A> {
    /// The key of the item changed.
    pub key: StableKey,
    /// Grows with each change of a key (a stream sequence, an offset):
    /// a change whose ordinal is not above the last one applied to its key
    /// is ignored.
    pub ordinal: u64,
    /// An upsert with its payload, or a tombstone.
    pub op: ChangeOp<P>,
    /// The handle [`Source::settle`] acknowledges it with.
    pub ack: A,
    /// How many times the source has delivered it, this time included
    /// (1 the first time), when it counts; 0 when it does not, and then
    /// [`App::consume`](crate::App::consume) counts.
    pub deliveries: u32,
}

impl<P, A> Change<P, A> {
    /// An upsert delivered for the first time.
    pub fn upsert(key: impl IntoStableKey, ordinal: u64, payload: P, ack: A) -> Self {
        Self {
            key: key.into_stable_key(),
            ordinal,
            op: ChangeOp::Upsert(payload),
            ack,
            deliveries: 0,
        }
    }

    /// A tombstone delivered for the first time.
    pub fn delete(key: impl IntoStableKey, ordinal: u64, ack: A) -> Self {
        Self {
            key: key.into_stable_key(),
            ordinal,
            op: ChangeOp::Delete,
            ack,
            deliveries: 0,
        }
    }

    /// The same change, delivered `n` times so far.
    #[must_use]
    pub fn delivered(mut self, n: u32) -> Self {
        self.deliveries = n;
        self
    }
}

/// What a change does to its key.
#[derive(Debug)]
pub enum ChangeOp<P> {
    /// The item exists with this payload.
    Upsert(P),
    /// The item is gone: its component's states are deleted.
    Delete,
}

/// An item, as a component mounted by
/// [`Ctx::mount_source`](crate::Ctx::mount_source) receives it.
#[derive(Debug)]
pub struct SourceItem<P> {
    /// The item's key (also its component's key).
    pub key: StableKey,
    /// The change's ordinal; `None` for a listed item.
    pub ordinal: Option<u64>,
    /// The payload.
    pub payload: P,
}

/// A change's acknowledgement handle with what became of it.
#[derive(Debug)]
pub struct Settled<A> {
    /// The handle the change came with.
    pub ack: A,
    /// What the source should do with it.
    pub outcome: Outcome,
}

/// What becomes of a change once its batch's run has committed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Applied and tracked (or ignored as older than what was applied):
    /// acknowledge it.
    Ack,
    /// Its component failed: redeliver it after `delay`.
    Retry {
        /// How long the source should wait before delivering it again.
        delay: Duration,
    },
    /// Its component failed on its last allowed delivery: release it (to a
    /// dead-letter facility where the source has one) so the stream moves
    /// on. Its component stays recorded as failed.
    DeadLetter {
        /// The component's failure.
        reason: String,
    },
    /// Its key belongs to a partition this member of a worker group does
    /// not hold (or no longer holds: the partition moved between the fetch
    /// and the run): not applied here. Hand it back, unacknowledged, for
    /// the partition's holder, without counting a failure.
    NotHeld,
    /// The run stopped (a shutdown) before applying it: redeliver it,
    /// without counting a failure.
    Interrupted,
}

impl Outcome {
    /// Whether the change was applied (or was older than what was).
    pub fn is_ack(&self) -> bool {
        matches!(self, Outcome::Ack)
    }
}
