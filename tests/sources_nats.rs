//! The NATS JetStream source (`weir_connectors::nats`) against a real
//! server at 127.0.0.1:4222 with JetStream: each test makes a stream of
//! its own, consumes it into a recording sink with `App::consume`, and
//! deletes the stream at the end.

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use async_nats::HeaderMap;
use futures::StreamExt;
use support::*;
use weir::connectors::nats::{JetStreamOptions, JetStreamSource};
use weir::prelude::*;
use weir::source::{ConsumeOptions, ConsumeReport};

const NATS_URL: &str = "nats://127.0.0.1:4222";
const ROWS: &str = "test/row";

/// A stream of this test's own, named after the test: its subjects are
/// `<name>.<key>`.
struct TestStream {
    js: jetstream::Context,
    name: String,
}

impl TestStream {
    async fn new(label: &str) -> Self {
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

    fn subject(&self, key: &str) -> String {
        format!("{}.{key}", self.name)
    }

    /// Publishes `payload` to `<name>.<key>` and awaits the stream's ack.
    async fn publish(&self, key: &str, payload: &str) {
        self.publish_with(key, payload, HeaderMap::new()).await;
    }

    async fn publish_with(&self, key: &str, payload: &str, headers: HeaderMap) {
        self.js
            .publish_with_headers(self.subject(key), headers, payload.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    fn options(&self) -> JetStreamOptions {
        JetStreamOptions::new(NATS_URL, &self.name)
    }

    async fn source(&self, options: JetStreamOptions) -> JetStreamSource {
        JetStreamSource::connect(options).await.unwrap()
    }

    async fn consumer_info(&self, consumer: &str) -> consumer::Info {
        let stream = self.js.get_stream(&self.name).await.unwrap();
        stream.consumer_info(consumer).await.unwrap()
    }

    /// Every message was settled: none awaits delivery or acknowledgement.
    async fn assert_all_settled(&self, consumer: &str) {
        let info = self.consumer_info(consumer).await;
        assert_eq!(info.num_pending, 0, "messages not yet delivered");
        assert_eq!(info.num_ack_pending, 0, "messages not acknowledged");
    }

    async fn delete(self) {
        self.js.delete_stream(&self.name).await.unwrap();
    }
}

/// Consumes `source` into the rig's rows: each message declares the row
/// `key = payload`; a message whose payload is `poison` fails.
async fn consume(
    app: &App,
    source: &mut JetStreamSource,
    rig: &Rig,
    options: ConsumeOptions,
) -> Result<ConsumeReport> {
    let handler = rig.handler();
    app.consume(source, options, move |ctx, batch| {
        let handler = handler.clone();
        async move {
            let rows = register_root_target_states_provider::<String, _>(&ctx, ROWS, handler)?;
            ctx.mount_source(batch, move |ctx, item| {
                let rows = rows.clone();
                async move {
                    let value = String::from_utf8(item.payload.payload).unwrap();
                    if value == "poison" {
                        return Err(Error::msg(format!("cannot read {value}")));
                    }
                    declare_target_state(&ctx, rows.target_state(key_str(&item.key), value))
                }
            })
            .await
        }
    })
    .await
}

fn quick() -> ConsumeOptions {
    ConsumeOptions::default().backoff(Duration::from_millis(20), Duration::from_millis(80))
}

#[tokio::test]
async fn every_key_lands_with_its_latest_payload_and_every_message_is_acknowledged() {
    let s = TestStream::new("latest").await;
    for (k, v) in [
        ("k1", "a1"),
        ("k2", "b1"),
        ("k1", "a2"),
        ("k3", "c1"),
        ("k2", "b2"),
    ] {
        s.publish(k, v).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let app = app(dir.path()).await.unwrap();
    let rig = Rig::new();
    let mut source = s.source(s.options()).await;
    assert_eq!(source.name(), format!("nats:{}", s.name));

    let report = consume(&app, &mut source, &rig, quick().max_in_flight(2))
        .await
        .unwrap();

    assert_eq!(
        rig.store.snapshot(),
        map(&[("k1", "a2"), ("k2", "b2"), ("k3", "c1")])
    );
    assert_eq!(report.received, 5);
    assert_eq!(report.acknowledged, 5);
    assert_eq!(report.batches, 3);
    s.assert_all_settled("weir").await;
    s.delete().await;
}

#[tokio::test]
async fn an_empty_payload_or_the_delete_header_deletes_the_row() {
    let s = TestStream::new("tombstones").await;
    for (k, v) in [("k1", "a"), ("k2", "b"), ("k3", "c")] {
        s.publish(k, v).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let app = app(dir.path()).await.unwrap();
    let rig = Rig::new();
    let mut source = s.source(s.options()).await;
    consume(&app, &mut source, &rig, quick()).await.unwrap();
    assert_eq!(rig.store.snapshot().len(), 3);

    s.publish("k1", "").await;
    let mut headers = HeaderMap::new();
    headers.insert("Weir-Delete", "1");
    s.publish_with("k2", "still a payload", headers).await;
    let mut source = s.source(s.options()).await;
    let report = consume(&app, &mut source, &rig, quick()).await.unwrap();

    assert_eq!(rig.store.snapshot(), map(&[("k3", "c")]));
    assert_eq!(report.acknowledged, 2);
    assert_eq!(report.stats.deleted, 2);
    s.assert_all_settled("weir").await;
    s.delete().await;
}

#[tokio::test]
async fn a_poison_message_is_retried_then_released_to_the_dead_letter_subject_and_the_rest_lands() {
    let s = TestStream::new("poison").await;
    let dead = format!("dead.{}", s.name);
    let client = async_nats::connect(NATS_URL).await.unwrap();
    let mut dead_letters = client.subscribe(dead.clone()).await.unwrap();
    client.flush().await.unwrap();
    s.publish("k1", "a").await;
    s.publish("bad", "poison").await;
    s.publish("k2", "b").await;
    let dir = tempfile::tempdir().unwrap();
    let app = app(dir.path()).await.unwrap();
    let rig = Rig::new();
    let mut source = s.source(s.options().dead_letter_subject(&dead)).await;

    let started = Instant::now();
    let report = consume(&app, &mut source, &rig, quick().max_deliveries(3))
        .await
        .unwrap();

    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(rig.store.snapshot(), map(&[("k1", "a"), ("k2", "b")]));
    assert_eq!(report.dead_lettered, 1);
    assert_eq!(report.retried, 2);
    assert_eq!(report.acknowledged, 2);
    s.assert_all_settled("weir").await;
    let copy = tokio::time::timeout(Duration::from_secs(2), dead_letters.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&copy.payload[..], b"poison");
    let headers = copy.headers.unwrap();
    let header = |name: &str| headers.get(name).unwrap().as_str().to_string();
    assert!(header("Weir-Failure").contains("cannot read poison"));
    assert_eq!(header("Weir-Subject"), s.subject("bad"));
    assert_eq!(header("Weir-Sequence"), "2");
    s.delete().await;
}

#[tokio::test]
async fn replaying_the_whole_stream_with_a_new_consumer_changes_nothing() {
    let s = TestStream::new("replay").await;
    for (k, v) in [("k1", "a"), ("k2", "b"), ("k1", "c"), ("k3", "")] {
        s.publish(k, v).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let app = app(dir.path()).await.unwrap();
    let rig = Rig::new();
    let mut first = s.source(s.options().consumer("first")).await;
    consume(&app, &mut first, &rig, quick()).await.unwrap();
    assert_eq!(rig.store.snapshot(), map(&[("k1", "c"), ("k2", "b")]));
    rig.log.clear();

    let mut replay = s.source(s.options().consumer("replay")).await;
    let report = consume(&app, &mut replay, &rig, quick().max_in_flight(1))
        .await
        .unwrap();

    assert_eq!(rig.log.call_count(), 0, "{:?}", rig.log.calls());
    assert_eq!(report.acknowledged, 4);
    s.assert_all_settled("replay").await;
    s.delete().await;
}

#[tokio::test]
async fn nothing_is_acknowledged_before_commit_and_a_later_consume_lands_everything() {
    let s = TestStream::new("no_ack").await;
    for (k, v) in [("k1", "a"), ("k2", "b"), ("k3", "c")] {
        s.publish(k, v).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let down = Arc::new(AtomicBool::new(true));
    let fail: FailFn = {
        let down = Arc::clone(&down);
        Arc::new(move |_, _| {
            down.load(Ordering::SeqCst)
                .then(|| "the sink is down".to_string())
        })
    };
    let rig = Rig::failing(fail);
    {
        let app = app(dir.path()).await.unwrap();
        let mut source = s.source(s.options()).await;
        let shutdown = app.shutdown_handle();
        let stop_after_a_redelivery = async {
            wait_for(|| async { s.consumer_info("weir").await.num_redelivered > 0 }).await;
            shutdown.shutdown();
        };
        let (report, ()) = tokio::join!(
            consume(&app, &mut source, &rig, quick().max_deliveries(1000)),
            stop_after_a_redelivery
        );
        let report = report.unwrap();
        assert_eq!(report.acknowledged, 0);
        assert!(report.retried > 0, "{report:?}");
        assert!(rig.store.snapshot().is_empty());
        let info = s.consumer_info("weir").await;
        assert_eq!(info.ack_floor.stream_sequence, 0, "nothing is acknowledged");
        assert_eq!(info.num_pending + info.num_ack_pending as u64, 3);
    }

    down.store(false, Ordering::SeqCst);
    let app = app(dir.path()).await.unwrap();
    let mut source = s.source(s.options()).await;
    consume(&app, &mut source, &rig, quick()).await.unwrap();

    assert_eq!(
        rig.store.snapshot(),
        map(&[("k1", "a"), ("k2", "b"), ("k3", "c")])
    );
    s.assert_all_settled("weir").await;
    s.delete().await;
}

#[tokio::test]
async fn in_follow_mode_a_message_published_after_the_start_lands_within_a_second() {
    let s = TestStream::new("follow").await;
    s.publish("k1", "a").await;
    let dir = tempfile::tempdir().unwrap();
    let app = app(dir.path()).await.unwrap();
    let rig = Rig::new();
    let options = s
        .options()
        .follow(true)
        .fetch_wait(Duration::from_millis(300));
    let mut source = s.source(options).await;
    let shutdown = app.shutdown_handle();
    let publish_later = async {
        wait_for(|| async { rig.store.snapshot().contains_key("k1") }).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        s.publish("k2", "b").await;
        let published = Instant::now();
        wait_for(|| async { rig.store.snapshot().contains_key("k2") }).await;
        let latency = published.elapsed();
        shutdown.shutdown();
        latency
    };

    let (report, latency) = tokio::join!(consume(&app, &mut source, &rig, quick()), publish_later);

    assert!(latency < Duration::from_secs(1), "landed after {latency:?}");
    assert_eq!(report.unwrap().acknowledged, 2);
    assert_eq!(rig.store.snapshot(), map(&[("k1", "a"), ("k2", "b")]));
    s.assert_all_settled("weir").await;
    s.delete().await;
}

#[tokio::test]
async fn a_missing_stream_is_an_error_naming_it_and_the_server_without_the_password() {
    let err = JetStreamSource::connect(JetStreamOptions::new(
        "nats://app:secret@127.0.0.1:4222",
        "weir_no_such_stream",
    ))
    .await
    .unwrap_err()
    .to_string();
    // The server runs without authentication: it accepts any user.
    assert!(!err.contains("secret"), "{err}");
    assert!(
        err.contains("weir_no_such_stream") && err.contains("127.0.0.1:4222"),
        "{err}"
    );
}

/// Polls `check` every 10 ms until it holds (for at most 10 seconds).
async fn wait_for<F, Fut>(check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
