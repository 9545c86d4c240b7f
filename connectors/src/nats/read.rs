//! The read set: the durable consumers a source reads through (one, or in
//! a worker group one per partition held), each with its pull requests.
//!
//! Every pull request is kept in its [`Reader`] while it is read, and every
//! message received is kept in the source until it is returned, so that a
//! read cancelled goes on at the next call and a source dropped hands what
//! it received back to the server.

use async_nats::jetstream::consumer::{Info, PullConsumer};
use async_nats::jetstream::stream::Stream;
use async_nats::jetstream::{AckKind, Message};
use async_nats::Client;
use futures::StreamExt;
use std::time::Duration;
use weir_actors::group::partition_of;
use weir_actors::{IntoStableKey, Result};

use super::connect::Place;
use super::fetch::Pull;
use super::message::Mapping;
use super::settle::CONCURRENT_ACKS;

/// One durable consumer of the read set.
pub(super) struct Reader {
    /// The stream and consumer, as errors name them.
    pub place: Place,
    pub consumer: PullConsumer,
    /// In a worker group: the partition this consumer reads for, and the
    /// group's partition count. A message of another partition is
    /// acknowledged at once on this consumer (that partition's consumer
    /// delivers it to its holder).
    pub partition: Option<Partition>,
    /// A request for the messages ready now, while it is read.
    ready: Option<Pull>,
    /// A request waiting for the first message to arrive, left open until
    /// it is answered or expires.
    waiting: Option<Pull>,
}

/// How far a bounded read is from its end (see [`ReadSet::progress_to`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Progress {
    /// Every message up to the end is acknowledged or terminated.
    Reached,
    /// Every message up to the end was delivered; some are not
    /// acknowledged yet: acknowledgements on their way to the server, or
    /// messages awaiting their redelivery.
    AwaitingAcks,
    /// Some consumer has messages left to deliver.
    Deliverable,
}

/// The partition a consumer reads for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Partition {
    /// The partition's number.
    pub number: u32,
    /// The group's partition count.
    pub of: u32,
}

impl Reader {
    pub fn new(place: Place, consumer: PullConsumer, partition: Option<Partition>) -> Self {
        Self {
            place,
            consumer,
            partition,
            ready: None,
            waiting: None,
        }
    }

    /// Hands the messages of its open requests back to the server at once.
    pub fn hand_back(&mut self) {
        for pull in [self.ready.take(), self.waiting.take()]
            .into_iter()
            .flatten()
        {
            pull.hand_back();
        }
    }

    async fn info(&self, stream: &Stream) -> Result<Info> {
        stream
            .consumer_info(&self.place.consumer)
            .await
            .map_err(|e| self.place.error("cannot read the consumer's state", e))
    }
}

/// The consumers read, and what was received from them but not yet
/// returned.
pub(super) struct ReadSet {
    pub readers: Vec<Reader>,
    /// Messages received and kept (of the right partition), not yet
    /// returned.
    pub pending: Vec<Message>,
    /// Where the next round of requests for ready messages starts, so that
    /// a busy consumer does not starve the others.
    cursor: usize,
}

/// What a read needs from the source around the read set.
pub(super) struct ReadContext<'a> {
    pub client: &'a Client,
    pub stream: &'a Stream,
    pub mapping: &'a Mapping,
    pub fetch_wait: Duration,
}

impl ReadSet {
    pub fn new(readers: Vec<Reader>) -> Self {
        Self {
            readers,
            pending: Vec::new(),
            cursor: 0,
        }
    }

    /// Hands everything open or received back to the server at once.
    pub fn hand_back(&mut self) {
        for reader in &mut self.readers {
            reader.hand_back();
        }
        super::fetch::hand_back_all(std::mem::take(&mut self.pending));
    }

    /// Takes in what the waiting requests received so far, without
    /// waiting, and reads on a request for ready messages left open by a
    /// cancelled call. How many messages were received (kept or not).
    pub async fn drain_open(&mut self, cx: &ReadContext<'_>) -> usize {
        let mut received = 0;
        for i in 0..self.readers.len() {
            let reader = &mut self.readers[i];
            if let Some(pull) = reader.ready.as_mut() {
                let messages = pull.answer(&reader.place).await;
                reader.ready = None;
                received += self.accept(i, messages, cx);
            }
            let reader = &mut self.readers[i];
            if let Some(pull) = reader.waiting.as_mut() {
                let messages = pull.received_now(&reader.place);
                if pull.is_done() {
                    reader.waiting = None;
                }
                received += self.accept(i, messages, cx);
            }
        }
        received
    }

    /// Asks each consumer in turn for the messages ready now, until `max`
    /// are kept. How many messages were received (kept or not).
    pub async fn fetch_ready(&mut self, max: usize, cx: &ReadContext<'_>) -> Result<usize> {
        let n = self.readers.len();
        if n == 0 {
            return Ok(0);
        }
        let start = self.cursor % n;
        self.cursor = (start + 1) % n;
        let mut received = 0;
        for i in (start..n).chain(0..start) {
            if self.pending.len() >= max {
                break;
            }
            let want = max - self.pending.len();
            let reader = &mut self.readers[i];
            let pull = Pull::ready(&reader.consumer, want, cx.fetch_wait, &reader.place).await?;
            let open = reader.ready.insert(pull);
            let messages = open.answer(&reader.place).await;
            reader.ready = None;
            received += self.accept(i, messages, cx);
        }
        Ok(received)
    }

    /// Waits (up to `wait`) for the first message to arrive on any
    /// consumer. How many messages were received (kept or not).
    pub async fn wait_first(&mut self, wait: Duration, cx: &ReadContext<'_>) -> Result<usize> {
        let until = tokio::time::Instant::now() + wait;
        for reader in &mut self.readers {
            // A longer wait left open by a cancelled call (a read ahead
            // whose waits had grown) is handed back, not waited out.
            if reader.waiting.as_ref().is_some_and(|p| p.open_past(until)) {
                if let Some(pull) = reader.waiting.take() {
                    pull.hand_back();
                }
            }
            if reader.waiting.is_none() {
                let pull = Pull::first_within(&reader.consumer, wait, &reader.place).await?;
                reader.waiting = Some(pull);
            }
        }
        loop {
            let answers: Vec<_> = self
                .readers
                .iter_mut()
                .enumerate()
                .filter_map(|(i, reader)| {
                    let Reader { place, waiting, .. } = reader;
                    let pull = waiting.as_mut()?;
                    Some(Box::pin(async move { (i, pull.answer(place).await) }))
                })
                .collect();
            if answers.is_empty() {
                return Ok(0);
            }
            let ((i, messages), _, rest) = futures::future::select_all(answers).await;
            drop(rest);
            for reader in &mut self.readers {
                if reader.waiting.as_ref().is_some_and(Pull::is_done) {
                    reader.waiting = None;
                }
            }
            let received = self.accept(i, messages, cx);
            if received > 0 {
                return Ok(received);
            }
        }
    }

    /// How far the consumers are from `end`: whether every one has
    /// acknowledged (or terminated) every message up to it (or has nothing
    /// left at all), and if not, whether any still has messages to
    /// deliver.
    pub async fn progress_to(&self, stream: &Stream, end: u64) -> Result<Progress> {
        let mut progress = Progress::Reached;
        for reader in &self.readers {
            let info = reader.info(stream).await?;
            let nothing_left = info.num_pending == 0 && info.num_ack_pending == 0;
            if info.ack_floor.stream_sequence >= end || nothing_left {
                continue;
            }
            if info.num_pending > 0 {
                return Ok(Progress::Deliverable);
            }
            progress = Progress::AwaitingAcks;
        }
        Ok(progress)
    }

    /// The messages not yet delivered plus those awaiting acknowledgement,
    /// summed over the consumers.
    pub async fn lag(&self, stream: &Stream) -> Result<u64> {
        let mut lag = 0;
        for reader in &self.readers {
            let info = reader.info(stream).await?;
            lag += info.num_pending + info.num_ack_pending as u64;
        }
        Ok(lag)
    }

    /// Keeps the messages received through reader `i` that belong to its
    /// partition (all of them outside a group), and acknowledges the others
    /// at once. How many were received.
    fn accept(&mut self, i: usize, messages: Vec<Message>, cx: &ReadContext<'_>) -> usize {
        let received = messages.len();
        let Some(partition) = self.readers.get(i).and_then(|r| r.partition) else {
            self.pending.extend(messages);
            return received;
        };
        let (mine, others): (Vec<Message>, Vec<Message>) = messages
            .into_iter()
            .partition(|m| partition_of_message(m, cx.mapping, partition.of) == partition.number);
        self.pending.extend(mine);
        if !others.is_empty() {
            let place = self.readers[i].place.clone();
            // A read cancelled meanwhile (a read ahead, a shutdown) does
            // not cut the acknowledgements short.
            super::fetch::spawn_detached(acknowledge_others(cx.client.clone(), place, others));
        }
        received
    }
}

/// The partition of a message's key, the key taken as for its change.
pub(super) fn partition_of_message(message: &Message, mapping: &Mapping, partitions: u32) -> u32 {
    let key = mapping.key_of(
        message.message.subject.as_str(),
        message.message.headers.as_ref(),
    );
    partition_of(&key.into_stable_key(), partitions)
}

/// Acknowledges messages of other partitions, awaiting the server's
/// confirmations. A lost acknowledgement only means a redelivery, filtered
/// again: it is logged, not returned.
async fn acknowledge_others(client: Client, place: Place, messages: Vec<Message>) {
    let (client, place) = (&client, &place);
    let acks = futures::stream::iter(messages)
        .map(|m| async move {
            let Some(reply) = m.message.reply.clone() else {
                return;
            };
            if let Err(e) = client.request(reply, AckKind::Ack.into()).await {
                tracing::debug!(
                    "{place}: acknowledging a message of another partition failed: {e}"
                );
            }
        })
        .buffer_unordered(CONCURRENT_ACKS);
    acks.collect::<Vec<()>>().await;
}
