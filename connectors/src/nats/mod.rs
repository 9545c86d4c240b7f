//! The NATS JetStream source: a stream read through a durable pull
//! consumer, each message a change that
//! [`App::consume`](weir_actors::App::consume) applies, then acknowledges.
//!
//! # How messages map to changes
//!
//! - **Key**: the last token of the message's subject (`orders.k17` →
//!   `k17`), or the value of [`JetStreamOptions::key_header`] when set. A
//!   message without that header (or with an empty value) is keyed by its
//!   whole subject, with a warning: it is applied, never dropped, and the
//!   key shows where it came from.
//! - **Ordinal**: the message's stream sequence, so a redelivered or
//!   replayed message never rolls a key back.
//! - **Tombstone**: an empty payload, or the
//!   [delete header](JetStreamOptions::delete_header) (`Weir-Delete` by
//!   default) present: the key's target states are deleted.
//! - **Deliveries**: the server's count of deliveries of the message, so
//!   that [`ConsumeOptions::max_deliveries`] counts what the server counts
//!   (across restarts too).
//!
//! # Acknowledgements
//!
//! The consumer is durable, pulls, and acknowledges each message
//! explicitly; it is created (from the stream's first message) if missing,
//! reused otherwise, so a restart goes on where the last run left off.
//!
//! - A message is **acknowledged after commit**: once its component's
//!   target writes and the ledger's commit have succeeded. The
//!   acknowledgements of a batch are published and flushed together,
//!   without waiting for answers: a lost one redelivers a message already
//!   applied, which is then acknowledged and ignored (its ordinal is not
//!   newer). Naks and terms await the server's confirmation, so that a
//!   release is known to have happened.
//! - While a batch runs longer than [`ConsumeOptions::keep_alive`], an
//!   **in-progress** notice (`+WPI`) is sent for each of its messages, so
//!   the server does not redeliver them after its acknowledgement wait.
//! - A message whose component failed is **negatively acknowledged with a
//!   delay** (the consume's backoff): the server redelivers it then.
//! - After [`ConsumeOptions::max_deliveries`] deliveries it is
//!   **terminated** (`+TERM`), so the stream moves on; with a
//!   [dead-letter subject](JetStreamOptions::dead_letter_subject) a copy
//!   is published there first, with headers `Weir-Failure` (the
//!   component's error), `Weir-Subject` and `Weir-Sequence`. The copy is
//!   published with core NATS: capture the subject with a stream to keep
//!   the copies.
//! - A message whose run was interrupted by a shutdown, or whose key's
//!   partition is not held by this member of a worker group, is negatively
//!   acknowledged without delay, so it is redelivered at once.
//! - Fetching is cancel-safe: the pull request being read is kept by the
//!   source and read on at the next call, and a source dropped with one
//!   open negatively acknowledges what still arrives for it (in a task of
//!   the current tokio runtime, until the request expires). Only a process
//!   that stops before then leaves messages to the server's
//!   acknowledgement wait.
//!
//! # Bounded and live reads
//!
//! By default the source reads up to the stream's last message at connect
//! time: [`next_batch`](Source::next_batch) returns `None` once every
//! message up to it is acknowledged or terminated (the consumer's
//! acknowledgement floor), waiting for redeliveries that are still due.
//! Once every message was delivered and only acknowledgements are
//! outstanding (the last batch's are published without awaiting the
//! server's answer, see above), it asks again after [`SETTLING_WAIT`],
//! doubled each time, up to the fetch wait: it ends within milliseconds
//! of them landing.
//! With [`follow(true)`](JetStreamOptions::follow) it waits for new
//! messages until the app shuts down, one pull request of
//! [`fetch_wait`](JetStreamOptions::fetch_wait) at a time; a message
//! arriving meanwhile is returned at once.
//!
//! A batch holds at most `max_in_flight` messages; the next is fetched
//! while one runs, and a batch is acknowledged while the next runs, so at
//! most twice as many are unacknowledged at once
//! (`ConsumeOptions::read_ahead`). A fetch cut short (the run ended first,
//! or the app shuts down) keeps its pull requests in the source, read on
//! at the next call; once `App::consume` returns, the requests still open
//! are handed back ([`Source::release`]): what still arrives for them is
//! negatively acknowledged at once, for the next reader.
//! [`lag`](Source::lag) is the consumer's count of messages not yet
//! delivered plus those awaiting acknowledgement (in a worker group,
//! summed over the consumers read). Reading it is a request to the server
//! for each consumer, so while full batches follow each other it is read
//! at most once every [`LAG_REFRESH`] and the last reading is reported in
//! between; after a batch that was not full (the source caught up) it is
//! read again at once.
//!
//! # Worker groups
//!
//! Outside a group the source reads through its one consumer. In a member
//! of a [worker group](weir_actors::group), once
//! [`App::consume`](weir_actors::App::consume) has told it the partitions
//! the member holds ([`Source::assign`]), it reads through **one durable
//! consumer per partition held**, named after the consumer with `-pN`
//! appended (`weir-p3`), created if missing with the same settings
//! (explicit acknowledgements, from the stream's first message). Every
//! member gives the same [consumer name](JetStreamOptions::consumer): a
//! partition's consumer holds that partition's position, so a partition
//! moving to another member moves its unacknowledged messages with it and
//! nothing is skipped.
//!
//! - Each partition's consumer reads the whole stream. A message whose
//!   key's partition ([`partition_of`](weir_actors::group::partition_of),
//!   the key taken as above) is another is **acknowledged at once** on
//!   that consumer and not returned: that partition's consumer delivers it
//!   to its holder. This filter is on the client, and costs one delivery
//!   of each message per partition: a group of `P` partitions reads the
//!   stream `P` times in all, whatever its member count. A publisher
//!   could avoid it only with server-side partitioning equal to weir's
//!   function; JetStream's subject-mapped partitions (`partition()`) are
//!   not, since they hash with FNV-1a alone. The consumers overlap, so the
//!   stream cannot use the work-queue retention policy.
//! - Reads go round the consumers of the partitions held, up to
//!   `max_in_flight` messages in all; a bounded read ends once every one
//!   of them has reached the stream's last sequence at connect time.
//! - When the partitions held change, the consumers of those no longer
//!   held leave the read set: their open pull requests, and the messages
//!   received but not yet returned, are handed back at once (negative
//!   acknowledgements without delay).
//! - A change whose partition moved between the fetch and the run
//!   ([`Outcome::NotHeld`](weir_actors::source::Outcome::NotHeld)) is
//!   negatively acknowledged without delay, never acknowledged: its
//!   partition's new holder receives it through the same consumer.
//! - A read that waits a whole [fetch wait](JetStreamOptions::fetch_wait)
//!   without a message returns an empty batch, so that the member's next
//!   (empty) run takes up partitions assigned to it meanwhile.
//! - [`lag`](Source::lag) sums the consumers read.
//!
//! # Example
//!
//! ```no_run
//! use weir_actors::source::ConsumeOptions;
//! use weir_actors::{App, Result};
//! use weir_connectors::nats::{JetStreamOptions, JetStreamSource};
//!
//! # async fn example(app: App) -> Result<()> {
//! let options = JetStreamOptions::new("nats://app:secret@127.0.0.1:4222", "orders")
//!     .consumer("orders-to-postgres")
//!     .dead_letter_subject("orders.dead");
//! let mut source = JetStreamSource::connect(options).await?;
//! let report = app
//!     .consume(&mut source, ConsumeOptions::default(), |ctx, batch| async move {
//!         // Declare tables here, then one component per key:
//!         ctx.mount_source(batch, |_ctx, item| async move {
//!             let _order: &[u8] = &item.payload.payload;
//!             Ok(())
//!         })
//!         .await
//!     })
//!     .await?;
//! println!("{} messages applied", report.acknowledged);
//! # Ok(())
//! # }
//! ```
//!
//! [`ConsumeOptions::keep_alive`]: weir_actors::source::ConsumeOptions::keep_alive
//! [`ConsumeOptions::max_deliveries`]: weir_actors::source::ConsumeOptions::max_deliveries

mod connect;
pub use connect::{without_password, MAX_ACK_PENDING};
mod fetch;
mod message;
mod options;
mod read;
mod settle;

use std::time::{Duration, Instant};

use async_nats::jetstream::stream::Stream;
use async_nats::jetstream::Message;
use async_nats::Client;
use weir_actors::source::{Assignment, Batch, Change, Settled, Source};
use weir_actors::Result;

use connect::Place;
use message::Mapping;
use read::{Partition, Progress, ReadContext, ReadSet, Reader};
use settle::Settler;

pub use message::{JetStreamAck, JetStreamMessage};
pub use options::{JetStreamOptions, DEFAULT_CONSUMER, DEFAULT_DELETE_HEADER, DEFAULT_FETCH_WAIT};
pub use settle::{FAILURE_HEADER, SEQUENCE_HEADER, SUBJECT_HEADER};

/// A NATS JetStream stream read through a durable pull consumer (in a
/// worker group, one per partition held): a [`Source`] of changes. See the
/// [module](self) for how messages map to changes and how they are
/// acknowledged.
pub struct JetStreamSource {
    name: String,
    place: Place,
    client: Client,
    stream: Stream,
    mapping: Mapping,
    follow: bool,
    fetch_wait: Duration,
    dead_letter: Option<String>,
    /// The stream's last sequence at connect time: where a bounded read
    /// ends.
    end: u64,
    /// The consumers read, with their open pull requests and what was
    /// received but not yet returned.
    read: ReadSet,
    /// In a worker group: the partitions read, as last assigned.
    assignment: Option<Assignment>,
    /// The last reading of the lag, and when it was taken.
    lag: Option<(Instant, u64)>,
    /// How long a bounded read waits next while only acknowledgements are
    /// outstanding.
    settling: Settling,
}

/// The wait of a bounded read whose messages were all delivered but not
/// all acknowledged yet: its own acknowledgements, published without
/// awaiting the server's answer, may still be on their way (the consumer's
/// state, read at once, does not show them yet), or messages await their
/// redelivery. It waits [`SETTLING_WAIT`] for a message at first, doubled
/// each time nothing came, up to the fetch wait: a read whose last
/// acknowledgements are in flight ends within milliseconds of them, not a
/// whole fetch wait later, and one waiting for a redelivery due in a
/// minute does not ask the server every few milliseconds meanwhile.
#[derive(Debug, Default)]
struct Settling {
    waited: Option<Duration>,
}

/// The first wait of a bounded read whose acknowledgements are settling.
pub const SETTLING_WAIT: Duration = Duration::from_millis(10);

impl Settling {
    /// The next wait, at most `fetch_wait`.
    fn next_wait(&mut self, fetch_wait: Duration) -> Duration {
        let wait = self
            .waited
            .map_or(SETTLING_WAIT, |w| w.saturating_mul(2))
            .min(fetch_wait);
        self.waited = Some(wait);
        wait
    }
}

/// While full batches follow each other, how often the lag is read from
/// the server (see the module docs).
pub const LAG_REFRESH: Duration = Duration::from_secs(1);

impl Drop for JetStreamSource {
    /// Hands the messages of pull requests still open, and those received
    /// but not returned, back to the server at once, so that they are
    /// redelivered without waiting for the acknowledgement wait.
    fn drop(&mut self) {
        self.read.hand_back();
    }
}

impl std::fmt::Debug for JetStreamSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamSource")
            .field("place", &self.place)
            .field("follow", &self.follow)
            .field("end", &self.end)
            .field("assignment", &self.assignment)
            .finish_non_exhaustive()
    }
}

impl JetStreamSource {
    /// Connects to the server, finds the stream and creates its durable
    /// pull consumer if missing (or reuses it).
    ///
    /// # Errors
    /// When the server cannot be reached or refuses the credentials, the
    /// stream does not exist, or the consumer cannot be created or is not
    /// an explicitly acknowledging pull consumer; each error names the
    /// server (without its password), the stream and the consumer.
    pub async fn connect(options: JetStreamOptions) -> Result<Self> {
        let place = Place::of(&options);
        let client = connect::client(&options, &place).await?;
        let context = async_nats::jetstream::new(client.clone());
        let mut stream = connect::stream(&context, &place).await?;
        let end = stream
            .info()
            .await
            .map_err(|e| place.error("cannot read the stream's state", e))?
            .state
            .last_sequence;
        let consumer = connect::consumer(&stream, &place).await?;
        let mapping = Mapping {
            key_header: options.key_header.clone(),
            delete_header: options.delete_header.clone(),
            keep_for_dead_letter: options.dead_letter_subject.is_some(),
        };
        Ok(Self {
            name: format!("nats:{}", options.stream),
            read: ReadSet::new(vec![Reader::new(place.clone(), consumer, None)]),
            place,
            client,
            stream,
            mapping,
            follow: options.follow,
            fetch_wait: options.fetch_wait,
            dead_letter: options.dead_letter_subject,
            end,
            assignment: None,
            lag: None,
            settling: Settling::default(),
        })
    }

    /// The source's name in logs and metrics: `nats:STREAM`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name of the durable consumer of partition `n` in a worker
    /// group: the consumer's name with `-pN` appended (`weir-p3`).
    pub fn partition_consumer(&self, n: u32) -> String {
        partition_consumer(&self.place.consumer, n)
    }

    /// The next messages: those ready now, or else (in follow mode, or
    /// while a bounded read still awaits redeliveries) the first to arrive
    /// within a fetch wait, with those ready after it. `None` when a
    /// bounded read is done.
    ///
    /// Cancel-safe: the pull requests being read, and the messages received
    /// so far, are kept in the source, and read on at the next call.
    async fn next_messages(&mut self, max: usize) -> Result<Option<Vec<Message>>> {
        let cx = ReadContext {
            client: &self.client,
            stream: &self.stream,
            mapping: &self.mapping,
            fetch_wait: self.fetch_wait,
        };
        loop {
            let mut received = self.read.drain_open(&cx).await;
            received += self.read.fetch_ready(max, &cx).await?;
            if !self.read.pending.is_empty() {
                return Ok(Some(std::mem::take(&mut self.read.pending)));
            }
            if received > 0 {
                // Only messages of other partitions: ask again at once.
                continue;
            }
            let wait = if self.follow {
                self.fetch_wait
            } else {
                match self.read.progress_to(cx.stream, self.end).await? {
                    Progress::Reached => return Ok(None),
                    Progress::AwaitingAcks => self.settling.next_wait(self.fetch_wait),
                    Progress::Deliverable => self.fetch_wait,
                }
            };
            if self.read.wait_first(wait, &cx).await? > 0 {
                self.settling = Settling::default();
                self.read.fetch_ready(max, &cx).await?;
                if !self.read.pending.is_empty() {
                    return Ok(Some(std::mem::take(&mut self.read.pending)));
                }
            } else if self.assignment.is_some() {
                // Idle in a worker group: an empty batch, whose empty run
                // takes up the partitions assigned to this member meanwhile.
                return Ok(Some(Vec::new()));
            }
        }
    }

    /// Reads from the consumers of the partitions assigned: those already
    /// read are kept, those of partitions no longer held are dropped (their
    /// open requests handed back), the others are created if missing.
    async fn read_partitions(&mut self, assignment: &Assignment) -> Result<()> {
        let wanted =
            |p: &Partition| p.of == assignment.partitions && assignment.held.contains(&p.number);
        let read = |number: u32| {
            self.read.readers.iter().any(|r| {
                r.partition
                    .is_some_and(|p| wanted(&p) && p.number == number)
            })
        };
        let mut added = Vec::new();
        for number in assignment.held.iter().copied().filter(|&n| !read(n)) {
            let mut place = self.place.clone();
            place.consumer = partition_consumer(&self.place.consumer, number);
            let consumer = connect::consumer(&self.stream, &place).await?;
            let partition = Partition {
                number,
                of: assignment.partitions,
            };
            added.push(Reader::new(place, consumer, Some(partition)));
        }
        let mut readers = added;
        for mut reader in std::mem::take(&mut self.read.readers) {
            match reader.partition {
                Some(p) if wanted(&p) => readers.push(reader),
                _ => reader.hand_back(),
            }
        }
        // Received but not yet returned: handed back, whichever partition.
        fetch::hand_back_all(std::mem::take(&mut self.read.pending));
        readers.sort_by_key(|r| r.partition.map(|p| p.number));
        self.read = ReadSet::new(readers);
        Ok(())
    }

    fn changes(
        &self,
        messages: Vec<Message>,
    ) -> Result<Vec<Change<JetStreamMessage, JetStreamAck>>> {
        messages
            .into_iter()
            .map(|m| self.mapping.change(m))
            .collect()
    }

    fn settler(&self) -> Settler<'_> {
        Settler {
            client: &self.client,
            dead_letter: self.dead_letter.as_deref(),
            place: &self.place,
        }
    }
}

/// The name of partition `n`'s durable consumer: `{consumer}-p{n}`.
fn partition_consumer(consumer: &str, n: u32) -> String {
    format!("{consumer}-p{n}")
}

impl Source for JetStreamSource {
    type Payload = JetStreamMessage;
    type Ack = JetStreamAck;

    fn name(&self) -> &str {
        &self.name
    }

    async fn next_batch(
        &mut self,
        max: usize,
    ) -> Result<Option<Batch<JetStreamMessage, JetStreamAck>>> {
        let max = max.max(1);
        let Some(messages) = self.next_messages(max).await? else {
            self.lag = None;
            return Ok(None);
        };
        if messages.len() < max {
            // Caught up: the next reading of the lag is taken afresh.
            self.lag = None;
        }
        Ok(Some(Batch::Changes(self.changes(messages)?)))
    }

    async fn settle(&mut self, settled: Vec<Settled<JetStreamAck>>) -> Result<()> {
        // A read ahead that waited for these acknowledgements doubled its
        // wait meanwhile: the next waits briefly again.
        self.settling = Settling::default();
        self.settler().settle(settled).await
    }

    async fn keep_alive(&mut self, acks: &[&JetStreamAck]) -> Result<()> {
        self.settler().in_progress(acks).await
    }

    async fn assign(&mut self, assignment: &Assignment) -> Result<()> {
        if self.assignment.as_ref() == Some(assignment) {
            return Ok(());
        }
        self.assignment = None;
        self.lag = None;
        self.read_partitions(assignment).await?;
        self.assignment = Some(assignment.clone());
        Ok(())
    }

    async fn release(&mut self) {
        self.read.hand_back();
    }

    async fn lag(&mut self) -> Option<u64> {
        if let Some((read_at, lag)) = self.lag {
            if read_at.elapsed() < LAG_REFRESH {
                return Some(lag);
            }
        }
        match self.read.lag(&self.stream).await {
            Ok(lag) => {
                self.lag = Some((Instant::now(), lag));
                Some(lag)
            }
            Err(e) => {
                tracing::debug!("{e}");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_settling_read_waits_briefly_at_first_then_doubles_up_to_the_fetch_wait() {
        let mut settling = Settling::default();
        let fetch_wait = Duration::from_millis(100);
        let waits: Vec<u64> = (0..6)
            .map(|_| settling.next_wait(fetch_wait).as_millis() as u64)
            .collect();
        assert_eq!(waits, [10, 20, 40, 80, 100, 100]);
    }
}
