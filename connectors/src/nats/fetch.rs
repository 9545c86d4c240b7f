//! Pull requests: the messages ready now, or the first one to arrive.
//!
//! A pull request's answer is read into a [`Pull`] that the source keeps,
//! so that reading it is cancel-safe: a read cancelled (by a shutdown)
//! goes on at the next call, and a source dropped with a request still
//! open hands the messages that still arrive back to the server at once
//! (a negative acknowledgement without delay), rather than leaving them to
//! the consumer's acknowledgement wait.

use std::time::Duration;

use async_nats::jetstream::consumer::pull::Batch;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{AckKind, Message};
use futures::{FutureExt, StreamExt};
use weir_actors::Result;

use super::connect::Place;

/// How long past its own expiry a pull request's answer is awaited before
/// it is given up (the server ends every request; this only covers a lost
/// connection).
const ANSWER_GRACE: Duration = Duration::from_secs(10);

/// An open pull request: its answer so far.
pub(super) struct Pull {
    batch: Batch,
    received: Vec<Message>,
    deadline: tokio::time::Instant,
    /// How long to wait before asking again after an error status.
    pause: Duration,
    /// Whether the answer has ended: nothing more arrives for it.
    done: bool,
}

impl Pull {
    /// Asks for up to `max` messages the server can deliver at once,
    /// without waiting for new ones.
    pub async fn ready(
        consumer: &PullConsumer,
        max: usize,
        pause: Duration,
        place: &Place,
    ) -> Result<Self> {
        let batch = consumer
            .fetch()
            .max_messages(max)
            .messages()
            .await
            .map_err(|e| place.error("cannot request messages", e))?;
        Ok(Self::of(batch, ANSWER_GRACE, pause))
    }

    /// Asks for the first message to become deliverable within `wait`.
    pub async fn first_within(
        consumer: &PullConsumer,
        wait: Duration,
        place: &Place,
    ) -> Result<Self> {
        let batch = consumer
            .batch()
            .max_messages(1)
            .expires(wait)
            .messages()
            .await
            .map_err(|e| place.error("cannot request messages", e))?;
        Ok(Self::of(batch, wait + ANSWER_GRACE, wait))
    }

    fn of(batch: Batch, within: Duration, pause: Duration) -> Self {
        Self {
            batch,
            received: Vec::new(),
            deadline: tokio::time::Instant::now() + within,
            pause,
            done: false,
        }
    }

    /// Whether the server may keep the request open past `t` (its answer
    /// is awaited [`ANSWER_GRACE`] past its expiry).
    pub fn open_past(&self, t: tokio::time::Instant) -> bool {
        !self.done && self.deadline > t + ANSWER_GRACE
    }

    /// Whether the answer has ended (what it received may still be
    /// taken).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// What was received so far, without waiting: the request stays open
    /// (unless its answer has ended, see [`Pull::is_done`]).
    pub fn received_now(&mut self, place: &Place) -> Vec<Message> {
        while !self.done {
            if tokio::time::Instant::now() >= self.deadline {
                tracing::warn!("{place}: a pull request was not answered in time");
                self.done = true;
                break;
            }
            match self.batch.next().now_or_never() {
                None => break,
                Some(None) => self.done = true,
                Some(Some(Ok(message))) => self.received.push(message),
                Some(Some(Err(e))) => {
                    tracing::warn!("{place}: a pull request ended early: {e}");
                    self.done = true;
                }
            }
        }
        std::mem::take(&mut self.received)
    }

    /// Reads the answer to its end. Cancel-safe: what was received is kept
    /// for the next call.
    ///
    /// The server can end an answer with an error status (such as 409 when
    /// the consumer has as many messages awaiting acknowledgement as it
    /// allows): the messages received before it are kept; with none, the
    /// error is logged and, after a pause, no message is returned, so that
    /// the caller asks again.
    pub async fn answer(&mut self, place: &Place) -> Vec<Message> {
        if self.done {
            return std::mem::take(&mut self.received);
        }
        let messages = self.read_to_its_end(place).await;
        self.done = true;
        messages
    }

    async fn read_to_its_end(&mut self, place: &Place) -> Vec<Message> {
        loop {
            let next = match tokio::time::timeout_at(self.deadline, self.batch.next()).await {
                Ok(next) => next,
                Err(_) => {
                    tracing::warn!("{place}: a pull request was not answered in time");
                    return std::mem::take(&mut self.received);
                }
            };
            match next {
                None => return std::mem::take(&mut self.received),
                Some(Ok(message)) => self.received.push(message),
                Some(Err(e)) => {
                    tracing::warn!("{place}: a pull request ended early: {e}");
                    if self.received.is_empty() {
                        tokio::time::sleep(self.pause).await;
                    }
                    return std::mem::take(&mut self.received);
                }
            }
        }
    }

    /// Hands back what was received and what still arrives until the
    /// request ends, in a task of the current runtime (if there is one).
    pub fn hand_back(self) {
        if self.done && self.received.is_empty() {
            return;
        }
        spawn_detached(async move {
            let Self {
                mut batch,
                received,
                deadline,
                done,
                ..
            } = self;
            let mut last = None;
            for message in received {
                nak(&message).await;
                last = Some(message);
            }
            if !done {
                while let Ok(Some(Ok(message))) =
                    tokio::time::timeout_at(deadline, batch.next()).await
                {
                    nak(&message).await;
                    last = Some(message);
                }
            }
            flush_through(last).await;
        });
    }
}

/// Hands messages back to the server at once, in a task of the current
/// runtime (if there is one).
pub(super) fn hand_back_all(messages: Vec<Message>) {
    if messages.is_empty() {
        return;
    }
    spawn_detached(async move {
        let mut last = None;
        for message in messages {
            nak(&message).await;
            last = Some(message);
        }
        flush_through(last).await;
    });
}

/// Runs `work` in a task of the current runtime, so that a caller
/// cancelled (or dropped) meanwhile does not cut it short; outside a
/// runtime it is left undone (messages then wait for the consumer's
/// acknowledgement wait).
pub(super) fn spawn_detached(work: impl std::future::Future<Output = ()> + Send + 'static) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        drop(runtime.spawn(work));
    }
}

/// Flushes the connection `message` came through, so that the handed-back
/// messages reach the server even when the source's client is dropped
/// right after (its connection would close with them still buffered, and
/// they would wait for the acknowledgement wait instead).
async fn flush_through(message: Option<Message>) {
    if let Some(message) = message {
        if let Err(e) = message.context.client().flush().await {
            tracing::debug!("flushing the acknowledgements of a closed source failed: {e}");
        }
    }
}

/// Asks the server to redeliver a message at once (best effort: otherwise
/// it is redelivered after the acknowledgement wait).
pub(super) async fn nak(message: &Message) {
    if let Err(e) = message.ack_with(AckKind::Nak(None)).await {
        tracing::debug!("handing back a message of a closed source failed: {e}");
    }
}
