//! The NATS JetStream source (`weir_connectors::nats`) against a real
//! server at 127.0.0.1:4222 with JetStream: each test makes a stream of
//! its own, consumes it into a recording sink with `App::consume`, and
//! deletes the stream at the end. The worker-group tests also need the
//! PostgreSQL coordinator (see `tests/pg`), and drop their group at the
//! end.

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod nats;
mod pg;
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use futures::StreamExt;
use nats::{TestStream, NATS_URL};
use sqlx::PgPool;
use support::*;
use weir::connectors::nats::{JetStreamAck, JetStreamMessage, JetStreamOptions, JetStreamSource};
use weir::connectors::postgres::PostgresCoordinator;
use weir::group::{partition_of, Coordinator, WorkerGroup};
use weir::prelude::*;
use weir::source::{Change, ConsumeOptions, ConsumeReport};

const ROWS: &str = "test/row";

/// Consumes `source` into the rig's rows: each message declares the row
/// `key = payload`; a message whose payload is `poison` fails.
async fn consume(
    app: &App,
    source: &mut JetStreamSource,
    rig: &Rig,
    options: ConsumeOptions,
) -> Result<ConsumeReport> {
    consume_into(app, source, rig.handler(), options).await
}

/// [`consume`] by a member of a worker group. The recording sink lives in
/// this process and no member of these tests pauses past its lease, so it
/// is declared to check fences (the engine calls no other sink in a
/// group).
async fn consume_in_group(
    app: &App,
    source: &mut JetStreamSource,
    rig: &Rig,
    options: ConsumeOptions,
) -> Result<ConsumeReport> {
    let handler = RowHandler::new(rig.sink().checks_fence());
    consume_into(app, source, handler, options).await
}

async fn consume_into(
    app: &App,
    source: &mut JetStreamSource,
    handler: RowHandler,
    options: ConsumeOptions,
) -> Result<ConsumeReport> {
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

/// A fresh stream of 20 messages, every one delivered to a reader (the
/// holder, returned with them) and none acknowledged yet.
async fn twenty_held(
    name: &str,
) -> (
    TestStream,
    JetStreamSource,
    Vec<Change<JetStreamMessage, JetStreamAck>>,
) {
    use weir::source::{Batch, Source};
    let s = TestStream::new(name).await;
    for i in 0..20 {
        s.publish(&format!("k{i}"), &format!("v{i}")).await;
    }
    let mut holder = s.source(s.options()).await;
    let Some(Batch::Changes(held)) = holder.next_batch(100).await.unwrap() else {
        panic!("the holder received no changes");
    };
    assert_eq!(held.len(), 20);
    (s, holder, held)
}

/// A bounded reader of `s` whose fetch wait (30 s) is longer than any
/// test should take.
async fn long_waiting(s: &TestStream) -> JetStreamSource {
    s.source(s.options().fetch_wait(Duration::from_secs(30)))
        .await
}

/// Reads `bounded` while `holder` acknowledges `held` after `delay`:
/// whether the read found the stream done, and how long it took.
async fn read_while_acknowledged_after(
    bounded: &mut JetStreamSource,
    mut holder: JetStreamSource,
    held: Vec<Change<JetStreamMessage, JetStreamAck>>,
    delay: Duration,
) -> (bool, Duration) {
    use weir::source::Source;
    let started = Instant::now();
    let ack_later = async {
        tokio::time::sleep(delay).await;
        holder.settle(all_acknowledged(held)).await.unwrap();
    };
    let (next, ()) = tokio::join!(bounded.next_batch(100), ack_later);
    (next.unwrap().is_none(), started.elapsed())
}

/// A bounded read whose messages were all delivered but not yet all
/// acknowledged (its last acknowledgements may still be on their way to
/// the server) ends as soon as they land, not a whole fetch wait later.
/// Here another reader of the same consumer holds the messages and
/// acknowledges them a moment after the bounded read started waiting;
/// with a fetch wait of 30 s, the read ends within seconds.
#[tokio::test]
async fn a_bounded_read_ends_once_its_last_acknowledgements_land_not_a_fetch_wait_later() {
    let (s, holder, held) = twenty_held("settling").await;
    let mut bounded = long_waiting(&s).await;

    let (ended, took) =
        read_while_acknowledged_after(&mut bounded, holder, held, Duration::from_millis(300)).await;

    assert!(ended, "the read found messages to deliver");
    assert!(
        took < Duration::from_secs(10),
        "the read took {took:?}: it waited out a fetch wait after the acknowledgements landed"
    );
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
async fn a_message_published_after_a_consume_returns_goes_to_the_next_reader_at_once() {
    let s = TestStream::new("released").await;
    s.publish("k1", "v1").await;
    let (dir, next_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first_app = app(dir.path()).await.unwrap();
    let rig = Rig::new();
    // Following with a fetch wait longer than the test: the consume stops
    // while its pull request waits, and the source is kept afterwards.
    let following = s.options().follow(true).fetch_wait(Duration::from_secs(20));
    let mut first = s.source(following).await;
    let shutdown = first_app.shutdown_handle();
    let stop_once_landed = async {
        wait_for(|| async { rig.store.snapshot().contains_key("k1") }).await;
        shutdown.shutdown();
    };
    let (report, ()) = tokio::join!(
        consume(&first_app, &mut first, &rig, quick()),
        stop_once_landed
    );
    report.unwrap();

    s.publish("late", "v1").await;
    let next_app = app(next_dir.path()).await.unwrap();
    let mut next = s.source(s.options()).await;
    let report = tokio::time::timeout(
        Duration::from_secs(10),
        consume(&next_app, &mut next, &rig, quick()),
    )
    .await
    .expect("the late message waited for the acknowledgement wait (30 s): the request the first source left open took it")
    .unwrap();
    assert_eq!(report.acknowledged, 1);
    assert!(rig.store.snapshot().contains_key("late"));
    s.assert_all_settled("weir").await;
    drop(first);
    s.delete().await;
}

/// A read cancelled while it waited for acknowledgements (as a read ahead
/// is, when the run before it ends) leaves a pull request open whose wait
/// had grown to seconds; the next read, once the acknowledgements landed,
/// ends without waiting it out.
#[tokio::test]
async fn a_read_cut_short_while_its_waits_grew_ends_soon_after_the_last_acknowledgements() {
    use weir::source::Source;
    let (s, holder, held) = twenty_held("regrown").await;
    let mut bounded = long_waiting(&s).await;
    // Its waits double from 10 ms: cut 2.7 s in, its last (2.56 s) has
    // about 2.4 s to go.
    let cut = tokio::time::timeout(Duration::from_millis(2700), bounded.next_batch(100)).await;
    assert!(
        cut.is_err(),
        "the read ended while no message was acknowledged"
    );
    bounded.settle(Vec::new()).await.unwrap();

    let (ended, took) =
        read_while_acknowledged_after(&mut bounded, holder, held, Duration::from_millis(200)).await;

    assert!(ended, "the read found messages to deliver");
    assert!(
        took < Duration::from_millis(1500),
        "the read took {took:?}: it waited out the request the cut read left open"
    );
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

const PARTITIONS: u32 = 4;

/// A member `id` of the worker group `group` (4 partitions, a lease TTL
/// of one second), on a ledger in `dir`.
async fn member(pool: &PgPool, dir: &Path, group: &str, id: &str) -> App {
    let coordinator = Arc::new(PostgresCoordinator::new(pool.clone()));
    let group = WorkerGroup::new(group, coordinator)
        .partitions(PARTITIONS)
        .lease_ttl(Duration::from_secs(1))
        .join_delay(Duration::from_millis(50))
        .member_id(id);
    app_with(&dir.join(id), |b| b.worker_group(group))
        .await
        .unwrap()
}

/// Removes the group's rows from the coordinator's tables.
async fn drop_group(pool: &PgPool, group: &str) {
    PostgresCoordinator::new(pool.clone())
        .drop_group(group)
        .await
        .unwrap();
}

fn partition(key: &str) -> u32 {
    partition_of(&key.into_stable_key(), PARTITIONS)
}

/// Publishes two versions of each of `keys` keys (`k00`…), the second
/// `<key>-v2`; returns the rows they should land as.
async fn publish_two_versions(s: &TestStream, keys: usize) -> BTreeMap<String, String> {
    let mut expected = BTreeMap::new();
    for version in 1..=2 {
        for k in 0..keys {
            let key = format!("k{k:02}");
            let value = format!("{key}-v{version}");
            s.publish(&key, &value).await;
            expected.insert(key, value);
        }
    }
    expected
}

/// Whether every partition consumer has every message acknowledged.
async fn every_partition_consumer_settled(s: &TestStream) -> bool {
    let stream = s.js.get_stream(&s.name).await.unwrap();
    for p in 0..PARTITIONS {
        match stream.consumer_info(format!("weir-p{p}")).await {
            Ok(info) if info.num_pending == 0 && info.num_ack_pending == 0 => {}
            _ => return false,
        }
    }
    true
}

fn following(s: &TestStream) -> JetStreamOptions {
    s.options()
        .follow(true)
        .fetch_wait(Duration::from_millis(200))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_members_of_a_group_share_the_stream_and_every_key_lands_once_with_its_latest_payload()
{
    let Some((_, pool)) = pg::server(8).await.unwrap() else {
        return;
    };
    let group = pg::unique("nats_share");
    let s = TestStream::new("group_share").await;
    let expected = publish_two_versions(&s, 24).await;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = tokio::join!(
        member(&pool, dir.path(), &group, "a"),
        member(&pool, dir.path(), &group, "b")
    );
    let rig = Rig::new();
    let mut source_a = s.source(following(&s)).await;
    let mut source_b = s.source(following(&s)).await;
    let (stop_a, stop_b) = (a.shutdown_handle(), b.shutdown_handle());
    let stop_when_done = async {
        wait_long(|| async {
            rig.store.snapshot() == expected && every_partition_consumer_settled(&s).await
        })
        .await;
        stop_a.shutdown();
        stop_b.shutdown();
    };

    let (report_a, report_b, ()) = tokio::join!(
        consume_in_group(&a, &mut source_a, &rig, quick()),
        consume_in_group(&b, &mut source_b, &rig, quick()),
        stop_when_done
    );

    let (report_a, report_b) = (report_a.unwrap(), report_b.unwrap());
    assert_eq!(rig.store.snapshot(), expected);
    assert_eq!(
        report_a.acknowledged + report_b.acknowledged,
        48,
        "each message is applied by one member, once: {report_a:?} {report_b:?}"
    );
    assert!(every_partition_consumer_settled(&s).await);
    a.leave_group().await.unwrap();
    b.leave_group().await.unwrap();
    drop_group(&pool, &group).await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn when_a_member_stops_mid_stream_the_other_takes_its_partitions_over_and_nothing_is_lost() {
    let Some((_, pool)) = pg::server(8).await.unwrap() else {
        return;
    };
    let group = pg::unique("nats_takeover");
    let s = TestStream::new("group_takeover").await;
    let first_half = publish_two_versions(&s, 16).await;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = tokio::join!(
        member(&pool, dir.path(), &group, "a"),
        member(&pool, dir.path(), &group, "b")
    );
    let rig = Rig::new();
    let mut source_a = s.source(following(&s)).await;
    let mut source_b = s.source(following(&s)).await;
    let (stop_a, stop_b) = (a.shutdown_handle(), b.shutdown_handle());
    let mut expected = first_half.clone();
    for k in 0..16 {
        let key = format!("k{k:02}");
        expected.insert(key.clone(), format!("{key}-v3"));
    }
    let a_runs_until_stopped = async {
        let report = consume_in_group(&a, &mut source_a, &rig, quick()).await;
        a.leave_group().await.unwrap();
        report
    };
    let stop_a_mid_stream = async {
        // Both members hold partitions, and some keys landed.
        wait_long(|| async {
            let held = |app: &App| app.assignment().is_some_and(|x| !x.held.is_empty());
            held(&a) && held(&b) && !rig.store.snapshot().is_empty()
        })
        .await;
        stop_a.shutdown();
        // Published once `a` is gone: its partitions' messages are read by
        // `b` only, through the consumers `a` read.
        for k in 0..16 {
            let key = format!("k{k:02}");
            s.publish(&key, &format!("{key}-v3")).await;
        }
        wait_long(|| async {
            rig.store.snapshot() == expected && every_partition_consumer_settled(&s).await
        })
        .await;
        stop_b.shutdown();
    };

    let (report_a, report_b, ()) = tokio::join!(
        a_runs_until_stopped,
        consume_in_group(&b, &mut source_b, &rig, quick()),
        stop_a_mid_stream
    );

    report_a.unwrap();
    report_b.unwrap();
    assert_eq!(rig.store.snapshot(), expected);
    assert_eq!(
        b.assignment().unwrap().held,
        (0..PARTITIONS).collect::<Vec<_>>(),
        "the remaining member holds every partition"
    );
    assert!(every_partition_consumer_settled(&s).await);
    b.leave_group().await.unwrap();
    drop(source_a);
    drop_group(&pool, &group).await;
    s.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_of_another_partition_is_acknowledged_on_the_partition_consumer_and_not_applied()
{
    let Some((_, pool)) = pg::server(8).await.unwrap() else {
        return;
    };
    let group = pg::unique("nats_filter");
    let s = TestStream::new("group_filter").await;
    let everything = publish_two_versions(&s, 24).await;
    let dir = tempfile::tempdir().unwrap();
    let a = member(&pool, dir.path(), &group, "a").await;
    let b = member(&pool, dir.path(), &group, "b").await;
    // Converge on two partitions each, `b` never consuming.
    wait_long(|| async {
        a.run(|_ctx| async { Ok(()) }).await.unwrap();
        b.run(|_ctx| async { Ok(()) }).await.unwrap();
        let count = |app: &App| app.assignment().map_or(0, |x| x.held.len());
        count(&a) == 2 && count(&b) == 2
    })
    .await;
    let held = a.assignment().unwrap().held;
    let rig = Rig::new();
    let mut source = s.source(s.options()).await;

    let report = consume_in_group(&a, &mut source, &rig, quick())
        .await
        .unwrap();

    let mine: BTreeMap<String, String> = everything
        .into_iter()
        .filter(|(k, _)| held.contains(&partition(k)))
        .collect();
    assert!(!mine.is_empty() && mine.len() < 24, "{held:?}");
    assert_eq!(rig.store.snapshot(), mine);
    assert_eq!(report.received, 2 * mine.len() as u64, "{report:?}");
    assert_eq!(report.not_held, 0, "{report:?}");
    let stream = s.js.get_stream(&s.name).await.unwrap();
    for p in 0..PARTITIONS {
        let consumer = source.partition_consumer(p);
        let info = stream.consumer_info(&consumer).await;
        if held.contains(&p) {
            let info = info.unwrap();
            assert_eq!(info.num_pending, 0, "{consumer}");
            assert_eq!(info.num_ack_pending, 0, "{consumer}");
            assert_eq!(info.ack_floor.stream_sequence, 48, "{consumer}");
        } else {
            assert!(info.is_err(), "{consumer} was never read");
        }
    }
    a.leave_group().await.unwrap();
    b.leave_group().await.unwrap();
    drop_group(&pool, &group).await;
    s.delete().await;
}

/// Polls `check` every 10 ms until it holds (for at most 10 seconds).
async fn wait_for<F, Fut>(check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_within(Duration::from_secs(10), check).await;
}

/// Polls `check` until it holds, for at most 30 seconds (a group's
/// members join and split the partitions first).
async fn wait_long<F, Fut>(check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_within(Duration::from_secs(30), check).await;
}

async fn wait_within<F, Fut>(within: Duration, check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Takes the next batch of at most `max` changes and acknowledges them
/// all; how many it held.
async fn take_and_ack(source: &mut JetStreamSource, max: usize) -> usize {
    use weir::source::{Batch, Source};
    let Some(Batch::Changes(changes)) = source.next_batch(max).await.unwrap() else {
        panic!("expected a batch of changes");
    };
    let n = changes.len();
    source.settle(all_acknowledged(changes)).await.unwrap();
    n
}

/// Each change's handle, settled as acknowledged.
fn all_acknowledged<P, A>(
    changes: Vec<weir::source::Change<P, A>>,
) -> Vec<weir::source::Settled<A>> {
    changes
        .into_iter()
        .map(|c| weir::source::Settled {
            ack: c.ack,
            outcome: weir::source::Outcome::Ack,
        })
        .collect()
}

#[tokio::test]
async fn the_lag_is_read_at_most_once_a_second_while_full_batches_follow_and_afresh_once_caught_up()
{
    use weir::connectors::nats::LAG_REFRESH;
    use weir::source::Source;
    let s = TestStream::new("lag").await;
    for i in 0..10 {
        s.publish(&format!("k{i}"), "v").await;
    }
    let mut source = s.source(s.options()).await;
    assert_eq!(source.lag().await, Some(10));

    // A full batch: the reading of a moment ago stands.
    assert_eq!(take_and_ack(&mut source, 4).await, 4);
    assert_eq!(source.lag().await, Some(10));
    tokio::time::sleep(LAG_REFRESH).await;
    assert_eq!(source.lag().await, Some(6));

    // A batch that is not full: caught up, read at once.
    assert_eq!(take_and_ack(&mut source, 100).await, 6);
    wait_for(|| async { s.consumer_info("weir").await.num_ack_pending == 0 }).await;
    assert_eq!(source.lag().await, Some(0));
    s.delete().await;
}
