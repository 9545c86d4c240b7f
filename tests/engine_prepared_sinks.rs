//! Prepared sinks (`TargetActionSink::from_async_fn_with_prepare`): the engine
//! prepares the next batch while the one before it is applied, applies
//! batches in order, and a batch that fails, or fails to prepare, is split
//! and prepared again like any other, so only the bad component fails.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use support::*;
use weir::prelude::*;

/// The provider every test declares its rows through.
const PROVIDER: &str = "test/rows";

/// The longest a test waits for anything before calling the engine hung.
const LIMIT: Duration = Duration::from_secs(30);

/// What a prepared sink saw, in order.
#[derive(Default)]
struct Seen {
    /// The keys of each batch prepared, in the order prepared.
    prepared: Vec<Vec<String>>,
    /// The keys of each batch applied, in the order applied.
    applied: Vec<Vec<String>>,
    /// While the first batch was being applied, how many batches had been
    /// prepared.
    prepared_during_first_apply: usize,
}

fn keys_of(actions: &[TargetAction<RowAction>]) -> Vec<String> {
    actions.iter().map(|a| a.inner().key.clone()).collect()
}

fn lock(seen: &Mutex<Seen>) -> Result<std::sync::MutexGuard<'_, Seen>> {
    seen.lock().map_err(|_| Error::msg("poisoned"))
}

/// A prepared sink that records what it prepares and applies; `prepare`
/// runs `check` first (to fail or panic on some keys), and `apply` fails
/// batches with `fail_apply_on`. With `wait`, its first apply waits (up to
/// a few seconds) for a second batch to be prepared.
fn recording_sink(
    seen: &Arc<Mutex<Seen>>,
    check: fn(&[String]) -> Result<()>,
    fail_apply_on: Option<&'static str>,
    wait: bool,
) -> TargetActionSink<RowAction> {
    let preparing = Arc::clone(seen);
    let applying = Arc::clone(seen);
    TargetActionSink::from_async_fn_with_prepare(
        move |actions: Vec<TargetAction<RowAction>>| -> Result<Vec<String>> {
            let keys = keys_of(&actions);
            check(&keys)?;
            lock(&preparing)?.prepared.push(keys.clone());
            Ok(keys)
        },
        move |keys: Vec<String>| {
            let seen = Arc::clone(&applying);
            async move {
                let first = lock(&seen)?.applied.is_empty();
                if wait && first {
                    let deadline = Instant::now() + Duration::from_secs(5);
                    while lock(&seen)?.prepared.len() < 2 && Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    let mut s = lock(&seen)?;
                    s.prepared_during_first_apply = s.prepared.len();
                }
                if let Some(bad) = fail_apply_on.filter(|bad| keys.iter().any(|k| k == bad)) {
                    return Err(Error::permanent(format!("the target rejects {bad}")));
                }
                lock(&seen)?.applied.push(keys);
                Ok(())
            }
        },
    )
}

fn accept(_: &[String]) -> Result<()> {
    Ok(())
}

/// One component declaring `k0`..`k5`, two actions per sink call.
async fn six_rows_in_three_calls(sink: TargetActionSink<RowAction>) -> Result<UpdateStats> {
    let dir = tempfile::tempdir()?;
    let app = app_with(dir.path(), |b| {
        b.batch_policy(BatchPolicy {
            max_actions: 2,
            linger: Duration::from_millis(1),
        })
    })
    .await?;
    let rows: Vec<(String, String)> = (0..6).map(|i| (format!("k{i}"), "v".into())).collect();
    let run = app
        .run(move |ctx| async move { declare_each(&ctx, PROVIDER, RowHandler::new(sink), rows) });
    tokio::time::timeout(LIMIT, run)
        .await
        .map_err(|_| Error::msg("the run hung"))?
}

#[tokio::test]
async fn a_prepared_sink_prepares_the_next_batch_while_the_one_before_it_is_applied() -> Result<()>
{
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stats = six_rows_in_three_calls(recording_sink(&seen, accept, None, true)).await?;
    assert_eq!(stats.created, 6);
    let s = lock(&seen)?;
    assert_eq!(s.applied.len(), 3, "calls: {:?}", s.applied);
    assert!(
        s.prepared_during_first_apply >= 2,
        "the second batch was not prepared while the first was applied"
    );
    // Every batch prepared once, and applied in the order prepared.
    assert_eq!(s.prepared, s.applied);
    let mut keys: Vec<String> = s.applied.iter().flatten().cloned().collect();
    keys.sort();
    assert_eq!(keys, (0..6).map(|i| format!("k{i}")).collect::<Vec<_>>());
    Ok(())
}

/// Ten child components of one row each, `c4` declaring `boom`, whose
/// actions reach the sink in one batch; the run's error.
async fn ten_components_one_with_boom(sink: TargetActionSink<RowAction>) -> Result<Error> {
    let dir = tempfile::tempdir()?;
    let app = app_with(dir.path(), |b| {
        b.batch_policy(BatchPolicy {
            max_actions: 100,
            linger: Duration::from_millis(200),
        })
    })
    .await?;
    let comps: Vec<(String, String)> = (0..10)
        .map(|c| {
            let row = if c == 4 {
                "boom".to_string()
            } else {
                format!("c{c}-r")
            };
            (format!("c{c}"), row)
        })
        .collect();
    let run = app.run(move |ctx| async move {
        let provider = register_root_target_states_provider::<String, RowHandler>(
            &ctx,
            PROVIDER,
            RowHandler::new(sink),
        )?;
        ctx.mount_each(
            comps,
            |(key, _): &(String, String)| key.clone(),
            move |c, (_, row)| {
                let provider = provider.clone();
                async move { declare_into(&c, &provider, [(row, "v")]) }
            },
        )
        .await
    });
    let result = tokio::time::timeout(LIMIT, run)
        .await
        .map_err(|_| Error::msg("the run hung"))?;
    err_or(result, |stats| {
        format!("a run with a bad component succeeded: {stats:?}")
    })
}

/// Checks that only `/c4` failed, with `cause` in its error, and that
/// every other component's row was applied exactly once.
fn assert_only_boom_failed(err: &Error, seen: &Mutex<Seen>, cause: &str) -> Result<()> {
    assert_eq!(failed_paths(err), vec!["/c4"], "{err}");
    assert!(err.to_string().contains(cause), "{err}");
    let s = lock(seen)?;
    let mut applied: Vec<String> = s.applied.iter().flatten().cloned().collect();
    applied.sort();
    let mut expected: Vec<String> = (0..10)
        .filter(|c| *c != 4)
        .map(|c| format!("c{c}-r"))
        .collect();
    expected.sort();
    assert_eq!(applied, expected, "calls: {:?}", s.applied);
    Ok(())
}

#[tokio::test]
async fn a_failed_prepared_call_is_split_and_its_parts_prepared_again_so_only_the_bad_component_fails(
) -> Result<()> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let err =
        ten_components_one_with_boom(recording_sink(&seen, accept, Some("boom"), false)).await?;
    assert_only_boom_failed(&err, &seen, "the target rejects boom")?;
    let s = lock(&seen)?;
    // The whole batch was prepared (ahead), then its parts, down to the
    // bad component's alone.
    assert_eq!(
        s.prepared.first().map(Vec::len),
        Some(10),
        "{:?}",
        s.prepared
    );
    assert!(
        s.prepared.iter().any(|keys| keys == &["boom"]),
        "the bad component's part was never prepared alone: {:?}",
        s.prepared
    );
    Ok(())
}

#[tokio::test]
async fn a_batch_that_fails_to_prepare_fails_only_the_component_that_made_it_fail() -> Result<()> {
    fn refuse_boom(keys: &[String]) -> Result<()> {
        if keys.iter().any(|k| k == "boom") {
            return Err(Error::permanent("cannot prepare boom"));
        }
        Ok(())
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let err = ten_components_one_with_boom(recording_sink(&seen, refuse_boom, None, false)).await?;
    assert_only_boom_failed(&err, &seen, "cannot prepare boom")
}

#[tokio::test]
async fn a_prepare_that_panics_fails_only_the_component_that_made_it_panic() -> Result<()> {
    fn panic_on_boom(keys: &[String]) -> Result<()> {
        assert!(!keys.iter().any(|k| k == "boom"), "the preparation blew up");
        Ok(())
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let err =
        ten_components_one_with_boom(recording_sink(&seen, panic_on_boom, None, false)).await?;
    assert_only_boom_failed(&err, &seen, "the preparation blew up")
}

/// An action that knows whether it was decoded from its MessagePack bytes
/// (its handler makes it with `decoded: false`).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Put {
    key: String,
    #[serde(skip, default = "decoded")]
    decoded: bool,
}

fn decoded() -> bool {
    true
}

struct PutHandler {
    sink: TargetActionSink<Put>,
}

impl TargetHandler<String> for PutHandler {
    type TrackingRecord = String;
    type Action = Put;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<String>,
        _prev: Vec<String>,
        _prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<Put, String>>> {
        let Some(value) = desired else {
            return Ok(None);
        };
        Ok(Some(TargetReconcileOutput {
            action: TargetAction::Create(Put {
                key: key_str(&key),
                decoded: false,
            }),
            sink: self.sink.clone(),
            tracking_record: Some(value),
            child_invalidation: None,
        }))
    }
}

#[tokio::test]
async fn a_prepared_sink_first_prepares_actions_as_returned_and_a_retry_prepares_them_decoded(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    // Whether each preparation's actions were decoded, in order.
    let preparations: Arc<Mutex<Vec<Vec<bool>>>> = Arc::default();
    let applies = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sink = {
        let preparations = Arc::clone(&preparations);
        let applies = Arc::clone(&applies);
        TargetActionSink::from_async_fn_with_prepare(
            move |actions: Vec<TargetAction<Put>>| -> Result<usize> {
                let decoded = actions.iter().map(|a| a.inner().decoded).collect();
                preparations
                    .lock()
                    .map_err(|_| Error::msg("poisoned"))?
                    .push(decoded);
                Ok(actions.len())
            },
            move |_: usize| {
                let first = applies.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
                async move {
                    if first {
                        return Err(Error::msg("the target is busy, try again"));
                    }
                    Ok(())
                }
            },
        )
    };
    let stats = app
        .run(move |ctx| async move {
            let provider = register_root_target_states_provider::<String, PutHandler>(
                &ctx,
                PROVIDER,
                PutHandler { sink },
            )?;
            declare_into(&ctx, &provider, [("a", "1"), ("b", "2")])
        })
        .await?;
    assert_eq!(stats.created, 2);
    let preparations = preparations
        .lock()
        .map_err(|_| Error::msg("poisoned"))?
        .clone();
    assert_eq!(
        preparations,
        vec![vec![false, false], vec![true, true]],
        "the first preparation gets the handler's values, the retry's decoded ones"
    );
    Ok(())
}
