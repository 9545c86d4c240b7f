//! A JetStream stream of a test's own, on the NATS server the tests run
//! against (`mod nats;` in the test files that need one).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

pub mod server;

use std::sync::atomic::{AtomicU64, Ordering};

use async_nats::jetstream::{self, consumer, stream};
use async_nats::HeaderMap;
use weir::connectors::nats::{JetStreamOptions, JetStreamSource};

/// The NATS server with JetStream the tests use.
pub const NATS_URL: &str = "nats://127.0.0.1:4222";

/// A stream of this test's own, named after the test: its subjects are
/// `<name>.<key>`.
pub struct TestStream {
    pub js: jetstream::Context,
    pub name: String,
}

impl TestStream {
    pub async fn new(label: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "weir_{label}_{}_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        );
        let client = async_nats::connect(NATS_URL).await.unwrap();
        let js = jetstream::new(client);
        js.create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            ..Default::default()
        })
        .await
        .unwrap();
        Self { js, name }
    }

    pub fn subject(&self, key: &str) -> String {
        format!("{}.{key}", self.name)
    }

    /// Publishes `payload` to `<name>.<key>` and awaits the stream's ack.
    pub async fn publish(&self, key: &str, payload: &str) {
        self.publish_with(key, payload, HeaderMap::new()).await;
    }

    pub async fn publish_with(&self, key: &str, payload: &str, headers: HeaderMap) {
        self.js
            .publish_with_headers(self.subject(key), headers, payload.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    pub fn options(&self) -> JetStreamOptions {
        JetStreamOptions::new(NATS_URL, &self.name)
    }

    pub async fn source(&self, options: JetStreamOptions) -> JetStreamSource {
        JetStreamSource::connect(options).await.unwrap()
    }

    pub async fn consumer_info(&self, consumer: &str) -> consumer::Info {
        let stream = self.js.get_stream(&self.name).await.unwrap();
        stream.consumer_info(consumer).await.unwrap()
    }

    /// Every message was settled: none awaits delivery or acknowledgement.
    pub async fn assert_all_settled(&self, consumer: &str) {
        let info = self.consumer_info(consumer).await;
        assert_eq!(info.num_pending, 0, "messages not yet delivered");
        assert_eq!(info.num_ack_pending, 0, "messages not acknowledged");
    }

    pub async fn delete(self) {
        self.js.delete_stream(&self.name).await.unwrap();
    }

    /// The stream's `nats://HOST:PORT/STREAM`, the `weir sync` source.
    pub fn url(&self) -> String {
        format!("{NATS_URL}/{}", self.name)
    }

    /// Publishes `payload` (`None`: a tombstone, with the delete header)
    /// to `<name>.<key>`.
    pub async fn publish_change(&self, key: &str, payload: Option<&str>) {
        self.publish_with(
            key,
            payload.unwrap_or(""),
            tombstone_headers(payload.is_none()),
        )
        .await;
    }

    /// Publishes `messages` (as [`TestStream::publish_change`]) without
    /// waiting for each acknowledgement before the next.
    pub async fn publish_all(&self, messages: &[(String, Option<String>)]) {
        for chunk in messages.chunks(500) {
            let mut acks = Vec::with_capacity(chunk.len());
            for (key, payload) in chunk {
                let headers = tombstone_headers(payload.is_none());
                let body = payload.clone().unwrap_or_default();
                let published = self
                    .js
                    .publish_with_headers(self.subject(key), headers, body.into())
                    .await;
                acks.push(published.unwrap());
            }
            for ack in acks {
                ack.await.unwrap();
            }
        }
    }

    /// The stream sequence below which the consumer `name` acknowledged
    /// everything; 0 before it exists.
    pub async fn ack_floor(&self, name: &str) -> u64 {
        let stream = self.js.get_stream(&self.name).await.unwrap();
        stream
            .consumer_info(name)
            .await
            .map_or(0, |info| info.ack_floor.stream_sequence)
    }
}

/// The headers of a message: the delete header for a tombstone.
fn tombstone_headers(tombstone: bool) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if tombstone {
        headers.insert("Weir-Delete", "1");
    }
    headers
}
