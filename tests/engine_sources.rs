//! Sources (`weir::source`): `App::consume` over a stream of changes held
//! in memory, and `Ctx::mount_source` over listings, into a recording sink.

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;
use weir::prelude::*;
use weir::source::{
    Batch, Change, ConsumeOptions, ConsumeReport, Listed, Listing, Load, Loading, Outcome, Settled,
    Source, SourceBatch, SourceItem,
};

const ROWS: &str = "test/row";

/// A change as the memory stream holds it: key, sequence, payload (`None`
/// for a tombstone).
type Msg = (String, u64, Option<String>);

/// A stream held in memory. A change handed back for redelivery is queued
/// again (at once: the backoff is the test's to check, in `settled`).
#[derive(Default)]
struct Stream {
    pending: VecDeque<(Msg, u32)>,
    settled: Vec<(u64, Outcome)>,
    fetch_size: Option<usize>,
    keep_alives: usize,
    /// The sequences of each keep-alive call, ascending.
    kept_alive: Vec<Vec<u64>>,
    /// `fetch N` and `settle N` (N: the first sequence), in call order.
    calls: Vec<String>,
    /// Fetches to go before one fails.
    fail_after: Option<usize>,
    /// A pause in each settle, and the components' runs counted after it.
    settle_pause: Option<(Duration, Runs)>,
    /// For each settle: its first sequence and the runs counted after the
    /// pause.
    runs_at_settle: Vec<(u64, usize)>,
}

/// Runs counted by key.
type Runs = Arc<Mutex<BTreeMap<String, usize>>>;

impl Stream {
    fn of(msgs: &[(&str, u64, Option<&str>)]) -> Self {
        let mut s = Stream::default();
        for (k, seq, p) in msgs {
            s.push(k, *seq, *p);
        }
        s
    }

    fn push(&mut self, key: &str, seq: u64, payload: Option<&str>) {
        let msg = (key.to_string(), seq, payload.map(str::to_string));
        self.pending.push_back((msg, 0));
    }

    fn outcomes_of(&self, seq: u64) -> Vec<Outcome> {
        self.settled
            .iter()
            .filter(|(s, _)| *s == seq)
            .map(|(_, o)| o.clone())
            .collect()
    }

    fn acked(&self) -> Vec<u64> {
        let mut acked: Vec<u64> = self
            .settled
            .iter()
            .filter(|(_, o)| o.is_ack())
            .map(|(s, _)| *s)
            .collect();
        acked.sort_unstable();
        acked
    }
}

impl Source for Stream {
    type Payload = String;
    type Ack = (Msg, u32);

    fn name(&self) -> &str {
        "memory"
    }

    async fn next_batch(&mut self, max: usize) -> Result<Option<Batch<String, (Msg, u32)>>> {
        if let Some(left) = self.fail_after.as_mut() {
            if *left == 0 {
                return Err(Error::msg("the stream went away"));
            }
            *left -= 1;
        }
        let n = max
            .min(self.fetch_size.unwrap_or(max))
            .min(self.pending.len());
        if n == 0 {
            return Ok(None);
        }
        let changes = self
            .pending
            .drain(..n)
            .map(|(msg, delivered)| {
                let (key, seq, payload) = msg.clone();
                let ack = (msg, delivered + 1);
                match payload {
                    Some(p) => Change::upsert(key, seq, p, ack),
                    None => Change::delete(key, seq, ack),
                }
                .delivered(delivered + 1)
            })
            .collect::<Vec<Change<String, (Msg, u32)>>>();
        self.calls.push(format!("fetch {}", changes[0].ack.0 .1));
        Ok(Some(Batch::Changes(changes)))
    }

    async fn settle(&mut self, settled: Vec<Settled<(Msg, u32)>>) -> Result<()> {
        if let Some(first) = settled.first() {
            self.calls.push(format!("settle {}", first.ack.0 .1));
            if let Some((pause, runs)) = &self.settle_pause {
                tokio::time::sleep(*pause).await;
                let ran = runs.lock().unwrap().values().sum();
                self.runs_at_settle.push((first.ack.0 .1, ran));
            }
        }
        for Settled { ack, outcome } in settled {
            let (msg, delivered) = ack;
            if matches!(outcome, Outcome::Retry { .. } | Outcome::Interrupted) {
                self.pending.push_back((msg.clone(), delivered));
            }
            self.settled.push((msg.1, outcome));
        }
        Ok(())
    }

    async fn keep_alive(&mut self, acks: &[&(Msg, u32)]) -> Result<()> {
        assert!(!acks.is_empty());
        self.keep_alives += 1;
        let mut seqs: Vec<u64> = acks.iter().map(|(msg, _)| msg.1).collect();
        seqs.sort_unstable();
        self.kept_alive.push(seqs);
        Ok(())
    }
}

/// What the components do: payloads that fail, and runs counted by key.
#[derive(Clone, Default)]
struct Behaviour {
    runs: Runs,
    poison: Arc<Mutex<Vec<String>>>,
    slow: Arc<Mutex<Option<Duration>>>,
    /// Requested by the component of key `a`.
    shutdown: Arc<Mutex<Option<ShutdownHandle>>>,
}

impl Behaviour {
    fn runs_of(&self, key: &str) -> usize {
        self.runs.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

fn quick() -> ConsumeOptions {
    ConsumeOptions::default()
        .backoff(Duration::from_millis(1), Duration::from_millis(4))
        .max_deliveries(3)
}

/// Consumes `stream` into `rig`'s rows: one row `key = payload` per item.
async fn consume(
    app: &App,
    rig: &Rig,
    stream: &mut Stream,
    options: ConsumeOptions,
    b: &Behaviour,
) -> Result<ConsumeReport> {
    let handler = rig.handler();
    let b = b.clone();
    app.consume(stream, options, move |ctx, batch| {
        let handler = handler.clone();
        let b = b.clone();
        async move {
            let rows =
                register_root_target_states_provider::<String, _>(&ctx, ROWS, handler.clone())?;
            ctx.mount_source(batch, move |ctx, item| {
                row_component(ctx, item, rows.clone(), b.clone())
            })
            .await
        }
    })
    .await
}

async fn row_component(
    ctx: Ctx,
    item: SourceItem<String>,
    rows: TargetStateProvider<String>,
    b: Behaviour,
) -> Result<()> {
    let key = key_str(&item.key);
    *b.runs.lock().unwrap().entry(key.clone()).or_default() += 1;
    if b.poison.lock().unwrap().contains(&item.payload) {
        return Err(Error::msg(format!("payload {} is poison", item.payload)));
    }
    if key == "a" {
        if let Some(shutdown) = b.shutdown.lock().unwrap().as_ref() {
            shutdown.shutdown();
        }
    }
    let slow = *b.slow.lock().unwrap();
    if let Some(d) = slow {
        tokio::time::sleep(d).await;
    }
    declare_target_state(&ctx, rows.target_state(key.as_str(), item.payload))
}

#[tokio::test]
async fn changes_land_one_row_per_key_and_are_acknowledged_after_their_run() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let mut stream = Stream::of(&[("a", 1, Some("a1")), ("b", 2, Some("b1")), ("c", 3, None)]);
    let report = consume(&app, &rig, &mut stream, quick(), &Behaviour::default()).await?;
    assert_eq!(rig.store.snapshot(), map(&[("a", "a1"), ("b", "b1")]));
    assert_eq!(stream.acked(), vec![1, 2, 3]);
    assert_eq!((report.received, report.acknowledged), (3, 3));
    Ok(())
}

#[tokio::test]
async fn several_changes_of_one_key_in_a_batch_are_coalesced_to_the_latest() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let b = Behaviour::default();
    let mut stream = Stream::of(&[
        ("a", 1, Some("v1")),
        ("a", 3, Some("v3")),
        ("a", 2, Some("v2")),
    ]);
    consume(&app, &rig, &mut stream, quick(), &b).await?;
    assert_eq!(rig.store.snapshot(), map(&[("a", "v3")]));
    assert_eq!(b.runs_of("a"), 1, "one component run for the three changes");
    assert_eq!(rig.log.call_count(), 1);
    assert_eq!(stream.acked(), vec![1, 2, 3]);
    Ok(())
}

#[tokio::test]
async fn a_change_older_than_what_was_applied_is_acknowledged_and_ignored() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let b = Behaviour::default();
    let mut stream = Stream::of(&[("a", 5, Some("new"))]);
    consume(&app, &rig, &mut stream, quick(), &b).await?;
    rig.log.clear();
    let mut late = Stream::of(&[("a", 4, Some("old")), ("a", 5, Some("new"))]);
    late.fetch_size = Some(1);
    let report = consume(&app, &rig, &mut late, quick(), &b).await?;
    assert_eq!(rig.store.snapshot(), map(&[("a", "new")]));
    assert_eq!(
        rig.log.call_count(),
        0,
        "no sink call for older or equal ordinals"
    );
    assert_eq!(b.runs_of("a"), 1, "the component's code did not run again");
    assert_eq!(report.acknowledged, 2);
    Ok(())
}

#[tokio::test]
async fn a_tombstone_deletes_the_row_and_keeps_its_ordinal_against_older_replays() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let b = Behaviour::default();
    let mut stream = Stream::of(&[("a", 1, Some("a1")), ("b", 2, Some("b1"))]);
    consume(&app, &rig, &mut stream, quick(), &b).await?;
    let mut delete = Stream::of(&[("a", 3, None)]);
    consume(&app, &rig, &mut delete, quick(), &b).await?;
    assert_eq!(rig.store.snapshot(), map(&[("b", "b1")]));
    assert_eq!(delete.acked(), vec![3]);
    // Replaying the whole stream from the start changes nothing.
    rig.log.clear();
    let mut replay = Stream::of(&[("a", 1, Some("a1")), ("b", 2, Some("b1")), ("a", 3, None)]);
    replay.fetch_size = Some(1);
    consume(&app, &rig, &mut replay, quick(), &b).await?;
    assert_eq!(rig.store.snapshot(), map(&[("b", "b1")]));
    assert_eq!(rig.log.call_count(), 0, "a replay makes no sink call");
    assert_eq!(replay.acked(), vec![1, 2, 3]);
    Ok(())
}

#[tokio::test]
async fn a_batch_never_deletes_the_keys_it_did_not_see() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let b = Behaviour::default();
    let mut first = Stream::of(&[("a", 1, Some("a1")), ("b", 2, Some("b1"))]);
    consume(&app, &rig, &mut first, quick(), &b).await?;
    let mut second = Stream::of(&[("c", 3, Some("c1"))]);
    consume(&app, &rig, &mut second, quick(), &b).await?;
    assert_eq!(
        rig.store.snapshot(),
        map(&[("a", "a1"), ("b", "b1"), ("c", "c1")])
    );
    Ok(())
}

#[tokio::test]
async fn a_poison_change_is_retried_then_dead_lettered_while_the_others_land() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let b = Behaviour::default();
    b.poison.lock().unwrap().push("bad".into());
    let mut stream = Stream::of(&[
        ("a", 1, Some("a1")),
        ("p", 2, Some("bad")),
        ("c", 3, Some("c1")),
    ]);
    let report = consume(&app, &rig, &mut stream, quick(), &b).await?;
    assert_eq!(rig.store.snapshot(), map(&[("a", "a1"), ("c", "c1")]));
    let outcomes = stream.outcomes_of(2);
    assert_eq!(
        outcomes.len(),
        3,
        "delivered max_deliveries times: {outcomes:?}"
    );
    assert!(matches!(outcomes[0], Outcome::Retry { delay } if delay == Duration::from_millis(1)));
    assert!(matches!(outcomes[1], Outcome::Retry { delay } if delay == Duration::from_millis(2)));
    assert!(
        matches!(&outcomes[2], Outcome::DeadLetter { reason } if reason.contains("poison")),
        "{outcomes:?}"
    );
    assert_eq!((report.retried, report.dead_lettered), (2, 1));
    assert_eq!(b.runs_of("p"), 3);
    // The released change's component stays recorded as failed.
    let failed = app.failed_components().await?;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].path.to_string().contains('p'));
    Ok(())
}

#[tokio::test]
async fn nothing_is_acknowledged_while_the_target_refuses_the_writes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::failing(Arc::new(|_, _| Some("target down".to_string())));
    let mut stream = Stream::of(&[("a", 1, Some("a1")), ("b", 2, Some("b1"))]);
    let report = consume(
        &app,
        &rig,
        &mut stream,
        quick().max_deliveries(2),
        &Behaviour::default(),
    )
    .await?;
    assert!(stream.acked().is_empty(), "{:?}", stream.settled);
    for seq in [1, 2] {
        let outcomes = stream.outcomes_of(seq);
        assert!(matches!(outcomes[0], Outcome::Retry { .. }), "{outcomes:?}");
        assert!(
            matches!(&outcomes[1], Outcome::DeadLetter { reason } if reason.contains("target down")),
            "{outcomes:?}"
        );
    }
    assert_eq!((report.acknowledged, report.dead_lettered), (0, 2));
    assert!(rig.store.snapshot().is_empty());
    Ok(())
}

#[tokio::test]
async fn a_failed_write_hands_the_change_back_for_redelivery() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    // The sink fails everything until it has been called six times (the
    // engine's own retries of a call included).
    let rig = Rig::failing(Arc::new(move |_, _| {
        (c.fetch_add(1, Ordering::SeqCst) < 6).then(|| "target down".to_string())
    }));
    let mut stream = Stream::of(&[("a", 1, Some("a1"))]);
    let report = consume(
        &app,
        &rig,
        &mut stream,
        quick().max_deliveries(10),
        &Behaviour::default(),
    )
    .await?;
    let outcomes = stream.outcomes_of(1);
    assert!(outcomes.len() >= 2, "{outcomes:?}");
    assert!(outcomes[..outcomes.len() - 1]
        .iter()
        .all(|o| matches!(o, Outcome::Retry { .. })));
    assert_eq!(outcomes.last(), Some(&Outcome::Ack));
    assert_eq!(rig.store.snapshot(), map(&[("a", "a1")]));
    assert_eq!(report.acknowledged, 1);
    Ok(())
}

#[tokio::test]
async fn a_consume_function_that_does_not_mount_its_batch_acknowledges_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let mut stream = Stream::of(&[("a", 1, Some("a1"))]);
    let report = app
        .consume(
            &mut stream,
            quick().max_deliveries(1),
            |_ctx, _batch| async { Ok(()) },
        )
        .await?;
    assert!(stream.acked().is_empty());
    assert_eq!(report.dead_lettered, 1);
    assert!(matches!(
        &stream.outcomes_of(1)[0],
        Outcome::DeadLetter { reason } if reason.contains("mount_source")
    ));
    Ok(())
}

#[tokio::test]
async fn changes_mounted_below_the_root_are_not_acknowledged() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let mut stream = Stream::of(&[("a", 1, Some("a1"))]);
    let report = app
        .consume(
            &mut stream,
            quick().max_deliveries(1),
            |ctx, batch| async move {
                let batch = Mutex::new(Some(batch));
                ctx.mount("below", move |ctx| async move {
                    let batch: SourceBatch<String> = batch.lock().unwrap().take().unwrap();
                    ctx.mount_source(batch, |_ctx, _item| async { Ok(()) })
                        .await
                })
                .await
            },
        )
        .await?;
    assert!(stream.acked().is_empty());
    assert_eq!(report.dead_lettered, 1);
    assert!(!report.failures.is_empty());
    Ok(())
}

#[tokio::test]
async fn a_slow_batch_is_kept_alive_with_the_source() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let b = Behaviour::default();
    *b.slow.lock().unwrap() = Some(Duration::from_millis(120));
    let mut stream = Stream::of(&[("a", 1, Some("a1"))]);
    consume(
        &app,
        &rig,
        &mut stream,
        quick().keep_alive(Duration::from_millis(20)),
        &b,
    )
    .await?;
    assert!(
        stream.keep_alives >= 2,
        "{} keep-alives",
        stream.keep_alives
    );
    assert_eq!(stream.acked(), vec![1]);
    Ok(())
}

/// A stream of `a1` and `b2`, fetched one change a batch.
fn two_batches() -> Stream {
    let mut stream = Stream::of(&[("a", 1, Some("a1")), ("b", 2, Some("b2"))]);
    stream.fetch_size = Some(1);
    stream
}

#[tokio::test]
async fn a_batch_holds_no_more_changes_than_the_app_runs_components_at_once() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app_with(dir.path(), |b| b.max_inflight_components(2)).await?;
    let rig = Rig::new();
    let mut stream = Stream::of(&[
        ("a", 1, Some("a1")),
        ("b", 2, Some("b2")),
        ("c", 3, Some("c3")),
        ("d", 4, Some("d4")),
        ("e", 5, Some("e5")),
    ]);
    let options = quick().max_in_flight(4).read_ahead(false);
    let report = consume(&app, &rig, &mut stream, options, &Behaviour::default()).await?;
    let fetches: Vec<&str> = stream
        .calls
        .iter()
        .map(String::as_str)
        .filter(|c| c.starts_with("fetch"))
        .collect();
    assert_eq!(fetches, ["fetch 1", "fetch 3", "fetch 5"]);
    assert_eq!((report.batches, report.acknowledged), (3, 5));
    assert_eq!(
        rig.store.snapshot(),
        map(&[
            ("a", "a1"),
            ("b", "b2"),
            ("c", "c3"),
            ("d", "d4"),
            ("e", "e5")
        ])
    );
    Ok(())
}

#[tokio::test]
async fn the_next_batch_is_read_while_a_batch_runs_and_only_after_it_without_read_ahead(
) -> Result<()> {
    for (read_ahead, calls) in [
        (true, ["fetch 1", "fetch 2", "settle 1", "settle 2"]),
        (false, ["fetch 1", "settle 1", "fetch 2", "settle 2"]),
    ] {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        let mut stream = two_batches();
        let options = quick().read_ahead(read_ahead);
        let report = consume(&app, &rig, &mut stream, options, &Behaviour::default()).await?;
        assert_eq!(stream.calls, calls, "read ahead: {read_ahead}");
        assert_eq!(rig.store.snapshot(), map(&[("a", "a1"), ("b", "b2")]));
        assert_eq!((report.batches, report.acknowledged), (2, 2));
    }
    Ok(())
}

#[tokio::test]
async fn a_batch_is_settled_while_the_next_runs_and_before_it_without_read_ahead() -> Result<()> {
    for (read_ahead, ran_by_first_settle) in [(true, 2), (false, 1)] {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        let b = Behaviour::default();
        let mut stream = two_batches();
        stream.settle_pause = Some((Duration::from_millis(300), Arc::clone(&b.runs)));
        let options = quick().read_ahead(read_ahead);
        consume(&app, &rig, &mut stream, options, &b).await?;
        assert_eq!(
            stream.runs_at_settle,
            [(1, ran_by_first_settle), (2, 2)],
            "read ahead: {read_ahead}"
        );
        assert_eq!(stream.acked(), vec![1, 2]);
    }
    Ok(())
}

#[tokio::test]
async fn a_batch_read_ahead_is_handed_back_unrun_when_the_app_shuts_down() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let b = Behaviour::default();
    *b.shutdown.lock().unwrap() = Some(app.shutdown_handle());
    let mut stream = two_batches();
    let report = consume(&app, &rig, &mut stream, quick(), &b).await?;
    assert_eq!(stream.calls[..2], ["fetch 1", "fetch 2"]);
    assert_eq!(b.runs_of("b"), 0);
    assert_eq!(stream.outcomes_of(2), vec![Outcome::Interrupted]);
    assert!(!rig.store.snapshot().contains_key("b"));
    assert_eq!(
        stream.pending.len() + stream.acked().len(),
        2,
        "nothing lost"
    );
    assert!(report.interrupted >= 1);
    assert_eq!(report.received, 2);
    Ok(())
}

#[tokio::test]
async fn a_failed_read_ahead_is_returned_once_the_running_batch_is_settled() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let mut stream = two_batches();
    stream.fail_after = Some(1);
    let err = consume(&app, &rig, &mut stream, quick(), &Behaviour::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("the stream went away"), "{err}");
    assert_eq!(stream.calls, ["fetch 1", "settle 1"]);
    assert_eq!(stream.acked(), vec![1]);
    assert_eq!(rig.store.snapshot(), map(&[("a", "a1")]));
    Ok(())
}

#[tokio::test]
async fn the_batch_read_ahead_is_kept_alive_with_the_running_one() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let b = Behaviour::default();
    *b.slow.lock().unwrap() = Some(Duration::from_millis(120));
    let mut stream = two_batches();
    let options = quick().keep_alive(Duration::from_millis(20));
    consume(&app, &rig, &mut stream, options, &b).await?;
    assert!(
        stream.kept_alive.contains(&vec![1, 2]),
        "{:?}",
        stream.kept_alive
    );
    assert_eq!(stream.acked(), vec![1, 2]);
    Ok(())
}

/// A listing's payloads, loaded on demand; counts the keys loaded.
struct Loader {
    rows: BTreeMap<String, String>,
    loaded: Arc<Mutex<Vec<String>>>,
}

impl Load<String> for Loader {
    fn load(&self, keys: Vec<StableKey>) -> Loading<'_, String> {
        Box::pin(async move {
            let mut out = Vec::new();
            for key in keys {
                let k = key_str(&key);
                self.loaded.lock().unwrap().push(k.clone());
                if let Some(v) = self.rows.get(&k) {
                    out.push((key, v.clone()));
                }
            }
            Ok(out)
        })
    }
}

/// Mounts a lazy listing of `rows` (version = the value) into `rig`'s rows;
/// returns the keys loaded.
async fn sync_listing(app: &App, rig: &Rig, rows: &[(&str, &str)]) -> Result<Vec<String>> {
    let loaded = Arc::new(Mutex::new(Vec::new()));
    let loader = Loader {
        rows: map(rows),
        loaded: Arc::clone(&loaded),
    };
    let items: Vec<Listed<String>> = rows
        .iter()
        .map(|(k, v)| Listed::lazy(*k, v.as_bytes().to_vec()))
        .collect();
    let listing = Listing::new(items).with_loader(Arc::new(loader));
    let handler = rig.handler();
    app.run(move |ctx| async move {
        let rows = register_root_target_states_provider::<String, _>(&ctx, ROWS, handler)?;
        ctx.mount_source(listing, move |ctx, item: SourceItem<String>| {
            let rows = rows.clone();
            async move {
                let key = key_str(&item.key);
                declare_target_state(&ctx, rows.target_state(key.as_str(), item.payload))
            }
        })
        .await
    })
    .await?;
    let mut loaded = loaded.lock().unwrap().clone();
    loaded.sort();
    Ok(loaded)
}

#[tokio::test]
async fn a_lazy_listing_loads_only_changed_items_and_deletes_keys_no_longer_listed() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let loaded = sync_listing(&app, &rig, &[("a", "1"), ("b", "1"), ("c", "1")]).await?;
    assert_eq!(loaded, strings(&["a", "b", "c"]));
    let loaded = sync_listing(&app, &rig, &[("a", "1"), ("b", "2"), ("d", "1")]).await?;
    assert_eq!(loaded, strings(&["b", "d"]), "only changed and new items");
    assert_eq!(
        rig.store.snapshot(),
        map(&[("a", "1"), ("b", "2"), ("d", "1")])
    );
    let loaded = sync_listing(&app, &rig, &[("a", "1"), ("b", "2"), ("d", "1")]).await?;
    assert!(loaded.is_empty(), "{loaded:?}");
    Ok(())
}

#[tokio::test]
async fn a_listing_leaving_payloads_out_without_a_loader_is_an_error_naming_an_item() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let listing: Listing<String> = Listing::new(vec![Listed::lazy("k1", b"v".to_vec())]);
    let err = app
        .run(move |ctx| async move {
            ctx.mount_source(listing, |_ctx, _item| async { Ok(()) })
                .await
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("k1"), "{err}");
    Ok(())
}

#[tokio::test]
async fn a_listed_item_with_an_unchanged_version_and_salt_is_skipped() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let runs = Arc::new(AtomicUsize::new(0));
    for (salt, expected) in [("t1", 2), ("t1", 2), ("t2", 4)] {
        let handler = rig.handler();
        let runs2 = Arc::clone(&runs);
        let items = vec![
            Listed::new("a", Some(b"1".to_vec()), "a".to_string()),
            Listed::new("b", Some(b"1".to_vec()), "b".to_string()),
        ];
        app.run(move |ctx| async move {
            let rows = register_root_target_states_provider::<String, _>(&ctx, ROWS, handler)?;
            let batch = SourceBatch::from(Listing::new(items)).salt(salt);
            ctx.mount_source(batch, move |ctx, item: SourceItem<String>| {
                let rows = rows.clone();
                runs2.fetch_add(1, Ordering::SeqCst);
                async move { declare_target_state(&ctx, rows.target_state(item.key, item.payload)) }
            })
            .await
        })
        .await?;
        assert_eq!(runs.load(Ordering::SeqCst), expected, "salt {salt}");
    }
    Ok(())
}
