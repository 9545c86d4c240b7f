//! Settling: acknowledgements awaited from the server, redeliveries with a
//! delay, releases with a dead-letter copy, in-progress notices.

use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::Client;
use futures::StreamExt;
use weir_actors::source::{Outcome, Settled};
use weir_actors::Result;

use super::connect::Place;
use super::message::JetStreamAck;

/// How many acknowledgements (and naks, terms) are awaited at once.
pub(super) const CONCURRENT_ACKS: usize = 256;

/// The header of a dead-letter copy that names the failure.
pub const FAILURE_HEADER: &str = "Weir-Failure";
/// The header of a dead-letter copy that names the original subject.
pub const SUBJECT_HEADER: &str = "Weir-Subject";
/// The header of a dead-letter copy that gives the original stream
/// sequence.
pub const SEQUENCE_HEADER: &str = "Weir-Sequence";

/// What settles a batch: the connection, the dead-letter subject, and the
/// place errors name.
pub(super) struct Settler<'a> {
    pub client: &'a Client,
    pub dead_letter: Option<&'a str>,
    pub place: &'a Place,
}

impl Settler<'_> {
    /// Settles every change: acknowledgements are published and flushed
    /// (a lost one only redelivers a change already applied, which is then
    /// ignored as older than what was applied); the others (naks, terms)
    /// await the server's confirmation, so that a release is known to have
    /// happened. The first failure is returned once all were tried.
    pub async fn settle(&self, settled: Vec<Settled<JetStreamAck>>) -> Result<()> {
        let copied = self.copy_dead_letters(&settled).await?;
        let (acks, others): (Vec<_>, Vec<_>) =
            settled.into_iter().partition(|s| s.outcome.is_ack());
        let published = self.publish_acks(&acks).await;
        let results: Vec<Result<()>> = futures::stream::iter(others)
            .map(|s| self.settle_one(s))
            .buffer_unordered(CONCURRENT_ACKS)
            .collect()
            .await;
        if copied || !acks.is_empty() {
            self.flush().await?;
        }
        published?;
        results.into_iter().collect()
    }

    /// Publishes the acknowledgements of applied changes, without waiting
    /// for answers.
    async fn publish_acks(&self, acks: &[Settled<JetStreamAck>]) -> Result<()> {
        for s in acks {
            self.client
                .publish(s.ack.reply.clone(), AckKind::Ack.into())
                .await
                .map_err(|e| {
                    self.place
                        .error(&format!("cannot acknowledge message {}", s.ack.sequence), e)
                })?;
        }
        Ok(())
    }

    /// Tells the server what became of one message, and awaits its answer.
    async fn settle_one(&self, settled: Settled<JetStreamAck>) -> Result<()> {
        let kind = ack_kind(&settled.outcome);
        let reply = settled.ack.reply.clone();
        self.client
            .request(reply, kind.into())
            .await
            .map(|_| ())
            .map_err(|e| {
                self.place.error(
                    &format!(
                        "the server did not confirm the settlement of message {} ({kind:?})",
                        settled.ack.sequence
                    ),
                    e,
                )
            })
    }

    /// Publishes a copy of each released message to the dead-letter
    /// subject, if there is one. Whether any was published.
    async fn copy_dead_letters(&self, settled: &[Settled<JetStreamAck>]) -> Result<bool> {
        let Some(subject) = self.dead_letter else {
            return Ok(false);
        };
        let mut copied = false;
        for s in settled {
            if let Outcome::DeadLetter { reason } = &s.outcome {
                self.copy_dead_letter(subject, &s.ack, reason).await?;
                copied = true;
            }
        }
        Ok(copied)
    }

    async fn copy_dead_letter(
        &self,
        subject: &str,
        ack: &JetStreamAck,
        reason: &str,
    ) -> Result<()> {
        let (payload, original) = match &ack.kept {
            Some(m) => (m.payload.clone(), m.headers.clone()),
            None => (Vec::new().into(), None),
        };
        let mut headers = original.unwrap_or_default();
        headers.insert(FAILURE_HEADER, one_line(reason).as_str());
        headers.insert(SUBJECT_HEADER, ack.subject.as_str());
        headers.insert(SEQUENCE_HEADER, ack.sequence.to_string().as_str());
        let published = self
            .client
            .publish_with_headers(subject.to_string(), headers, payload)
            .await;
        published.map_err(|e| {
            self.place.error(
                &format!(
                    "cannot publish message {} to the dead-letter subject `{subject}`",
                    ack.sequence
                ),
                e,
            )
        })
    }

    async fn flush(&self) -> Result<()> {
        self.client.flush().await.map_err(|e| {
            self.place.error(
                "cannot flush the acknowledgements and dead-letter copies",
                e,
            )
        })
    }

    /// Tells the server that these messages are still being worked on, so
    /// that it does not redeliver them yet.
    pub async fn in_progress(&self, acks: &[&JetStreamAck]) -> Result<()> {
        for ack in acks {
            self.client
                .publish(ack.reply.clone(), AckKind::Progress.into())
                .await
                .map_err(|e| self.place.error("cannot report work in progress", e))?;
        }
        self.client
            .flush()
            .await
            .map_err(|e| self.place.error("cannot report work in progress", e))
    }
}

/// What the server is told for an outcome.
///
/// - `Ack`: acknowledged.
/// - `Retry`: negatively acknowledged with the delay, so that the server
///   redelivers it then.
/// - `DeadLetter`: terminated (after its copy, if any), so that the server
///   never delivers it again.
/// - `NotHeld`: negatively acknowledged without delay, never acknowledged:
///   its key's partition moved to another member of the worker group
///   between the fetch and the run, and the consumer it came through is
///   that partition's, which its new holder reads. Handed back, it is
///   redelivered to the new holder at once.
/// - `Interrupted` (and any later outcome): negatively acknowledged without
///   delay, to be redelivered at once.
fn ack_kind(outcome: &Outcome) -> AckKind {
    match outcome {
        Outcome::Ack => AckKind::Ack,
        Outcome::Retry { delay } => AckKind::Nak(Some(at_least_a_millisecond(*delay))),
        Outcome::DeadLetter { .. } => AckKind::Term,
        _ => AckKind::Nak(None),
    }
}

/// A zero delay would be sent as no delay at all; keep it a delay.
fn at_least_a_millisecond(d: Duration) -> Duration {
    d.max(Duration::from_millis(1))
}

/// A header value holds one line.
fn one_line(s: &str) -> String {
    s.replace(['\r', '\n'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn told(outcome: Outcome) -> String {
        format!("{:?}", ack_kind(&outcome))
    }

    #[test]
    fn a_change_of_a_partition_not_held_is_handed_back_never_acknowledged() {
        let at_once = format!("{:?}", AckKind::Nak(None));
        assert_eq!(told(Outcome::NotHeld), at_once);
        assert_eq!(told(Outcome::Interrupted), at_once);
        assert_eq!(told(Outcome::Ack), format!("{:?}", AckKind::Ack));
    }

    #[test]
    fn a_retry_is_handed_back_with_at_least_a_millisecond_of_delay_and_a_release_terminates() {
        let retry = Outcome::Retry {
            delay: Duration::ZERO,
        };
        let a_millisecond = AckKind::Nak(Some(Duration::from_millis(1)));
        assert_eq!(told(retry), format!("{a_millisecond:?}"));
        let release = Outcome::DeadLetter {
            reason: "bad".into(),
        };
        assert_eq!(told(release), format!("{:?}", AckKind::Term));
    }
}
