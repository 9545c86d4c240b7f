//! What a JetStream message becomes: a [`Change`] with its key, ordinal
//! and tombstone rule, and the handle it is settled with.

use async_nats::jetstream;
use async_nats::{HeaderMap, Subject};
use weir_actors::source::Change;
use weir_actors::{Error, Result};

/// A message as a component receives it: its subject, payload, stream
/// sequence and headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JetStreamMessage {
    /// The subject the message was published to.
    pub subject: String,
    /// The payload (never empty: an empty payload is a tombstone).
    pub payload: Vec<u8>,
    /// The message's stream sequence (also the change's ordinal).
    pub sequence: u64,
    /// The headers, one pair per value, in no particular order.
    pub headers: Vec<(String, String)>,
}

impl JetStreamMessage {
    /// The value of the header `name` (its first one), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The handle a message is settled with: its acknowledgement subject,
/// and what a dead-letter copy needs.
#[derive(Debug)]
pub struct JetStreamAck {
    pub(super) reply: Subject,
    pub(super) subject: String,
    pub(super) sequence: u64,
    /// The message itself, kept only when released messages are copied
    /// to a dead-letter subject.
    pub(super) kept: Option<async_nats::Message>,
}

impl JetStreamAck {
    /// The stream sequence of the message.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// The subject the message was published to.
    pub fn subject(&self) -> &str {
        &self.subject
    }
}

/// How messages become changes: which header holds the key, which marks
/// a tombstone, and whether messages are kept for a dead-letter copy.
#[derive(Clone, Debug)]
pub(super) struct Mapping {
    pub key_header: Option<String>,
    pub delete_header: String,
    pub keep_for_dead_letter: bool,
}

impl Mapping {
    /// The change a delivered message stands for.
    pub fn change(
        &self,
        message: jetstream::Message,
    ) -> Result<Change<JetStreamMessage, JetStreamAck>> {
        let (sequence, delivered) = delivery_of(&message)?;
        let message = message.message;
        let reply = message.reply.clone().ok_or_else(|| {
            Error::msg(format!(
                "a message on `{}` has no acknowledgement subject",
                message.subject
            ))
        })?;
        let subject = message.subject.to_string();
        let key = self.key_of(&subject, message.headers.as_ref());
        let tombstone = self.is_tombstone(&message);
        let payload = JetStreamMessage {
            subject: subject.clone(),
            payload: message.payload.to_vec(),
            sequence,
            headers: headers_of(message.headers.as_ref()),
        };
        let ack = JetStreamAck {
            reply,
            subject,
            sequence,
            kept: self.keep_for_dead_letter.then_some(message),
        };
        let change = if tombstone {
            Change::delete(key, sequence, ack)
        } else {
            Change::upsert(key, sequence, payload, ack)
        };
        Ok(change.delivered(delivered))
    }

    /// The item's key: the configured header's value, or the subject's last
    /// token. A message without the header (or with an empty one) is keyed
    /// by its whole subject, with a warning: it is applied, not dropped.
    pub fn key_of(&self, subject: &str, headers: Option<&HeaderMap>) -> String {
        let Some(name) = &self.key_header else {
            return last_token(subject).to_string();
        };
        match headers
            .and_then(|h| h.get(name.as_str()))
            .map(|v| v.as_str())
        {
            Some(key) if !key.is_empty() => key.to_string(),
            _ => {
                tracing::warn!(
                    subject,
                    header = name.as_str(),
                    "a message has no key header: it is keyed by its whole subject"
                );
                subject.to_string()
            }
        }
    }

    /// Whether the message deletes its key: an empty payload, or the delete
    /// header present.
    fn is_tombstone(&self, message: &async_nats::Message) -> bool {
        message.payload.is_empty()
            || message
                .headers
                .as_ref()
                .is_some_and(|h| h.get(self.delete_header.as_str()).is_some())
    }
}

/// The last token of a subject (`orders.k17` → `k17`).
pub(super) fn last_token(subject: &str) -> &str {
    subject.rsplit('.').next().unwrap_or(subject)
}

/// The stream sequence and delivery count of a message, from its
/// acknowledgement subject.
fn delivery_of(message: &jetstream::Message) -> Result<(u64, u32)> {
    let info = message.info().map_err(|e| {
        Error::msg(format!(
            "a message on `{}` is not a JetStream delivery: {e}",
            message.subject
        ))
    })?;
    let delivered = u32::try_from(info.delivered.max(1)).unwrap_or(u32::MAX);
    Ok((info.stream_sequence, delivered))
}

/// The headers as pairs, one per value.
fn headers_of(headers: Option<&HeaderMap>) -> Vec<(String, String)> {
    let Some(headers) = headers else {
        return Vec::new();
    };
    headers
        .iter()
        .flat_map(|(name, values)| {
            let name: &str = name.as_ref();
            values
                .iter()
                .map(move |v| (name.to_string(), v.as_str().to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_the_last_token_of_the_subject() {
        assert_eq!(last_token("orders.k17"), "k17");
        assert_eq!(last_token("k17"), "k17");
        assert_eq!(last_token("a.b.c"), "c");
    }
}
