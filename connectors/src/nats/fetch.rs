//! Pull requests: the messages ready now, or the first one to arrive.

use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::Message;
use futures::StreamExt;
use weir_actors::Result;

use super::connect::Place;

/// How long past its own expiry a pull request's answer is awaited before
/// it is given up (the server ends every request; this only covers a lost
/// connection).
const ANSWER_GRACE: Duration = Duration::from_secs(10);

/// Up to `max` messages the server can deliver at once, without waiting
/// for new ones (after `pause` if the server answers with an error).
pub(super) async fn ready(
    consumer: &PullConsumer,
    max: usize,
    pause: Duration,
    place: &Place,
) -> Result<Vec<Message>> {
    let batch = consumer
        .fetch()
        .max_messages(max)
        .messages()
        .await
        .map_err(|e| place.error("cannot request messages", e))?;
    collect(batch, ANSWER_GRACE, pause, place).await
}

/// The first message to become deliverable within `wait`, if any.
pub(super) async fn first_within(
    consumer: &PullConsumer,
    wait: Duration,
    place: &Place,
) -> Result<Vec<Message>> {
    let batch = consumer
        .batch()
        .max_messages(1)
        .expires(wait)
        .messages()
        .await
        .map_err(|e| place.error("cannot request messages", e))?;
    collect(batch, wait + ANSWER_GRACE, wait, place).await
}

/// The messages of one pull request's answer. The server can end an
/// answer with an error status (such as 409 when the consumer has as many
/// messages awaiting acknowledgement as it allows): the messages received
/// before it are kept; with none, the error is logged and, after `pause`,
/// no message is returned, so that the caller asks again.
async fn collect<S>(
    mut batch: S,
    within: Duration,
    pause: Duration,
    place: &Place,
) -> Result<Vec<Message>>
where
    S: futures::Stream<Item = std::result::Result<Message, async_nats::Error>> + Unpin,
{
    let mut messages = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let next = match tokio::time::timeout_at(deadline, batch.next()).await {
            Ok(next) => next,
            Err(_) => {
                tracing::warn!("{place}: a pull request was not answered in {within:?}");
                return Ok(messages);
            }
        };
        match next {
            None => return Ok(messages),
            Some(Ok(message)) => messages.push(message),
            Some(Err(e)) => {
                tracing::warn!("{place}: a pull request ended early: {e}");
                if messages.is_empty() {
                    tokio::time::sleep(pause).await;
                }
                return Ok(messages);
            }
        }
    }
}
