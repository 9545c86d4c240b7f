//! Sinks that allow concurrent calls (`TargetActionSink::concurrent_calls`):
//! the engine runs up to that many calls at once, never two carrying the
//! same key, and a default sink still gets one call at a time.

mod support;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;
use weir::prelude::*;

/// What a sink saw: how many calls ran at most at once, and every key a
/// call carried while another running call carried it too.
#[derive(Default)]
struct Calls {
    running: usize,
    most: usize,
    keys: HashSet<String>,
    overlaps: Vec<String>,
    applied: usize,
}

/// A sink whose calls take a while, recording what ran at once.
fn slow_sink(calls: &Arc<Mutex<Calls>>) -> TargetActionSink<RowAction> {
    let calls = Arc::clone(calls);
    TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<RowAction>>| {
        let calls = Arc::clone(&calls);
        async move {
            let keys: Vec<String> = actions
                .iter()
                .map(|a| match a {
                    TargetAction::Create(r) | TargetAction::Update(r) | TargetAction::Delete(r) => {
                        r.key.clone()
                    }
                })
                .collect();
            {
                let mut c = calls.lock().map_err(|_| Error::msg("poisoned"))?;
                c.running += 1;
                c.most = c.most.max(c.running);
                for k in &keys {
                    if !c.keys.insert(k.clone()) {
                        c.overlaps.push(k.clone());
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
            let mut c = calls.lock().map_err(|_| Error::msg("poisoned"))?;
            c.running -= 1;
            c.applied += keys.len();
            for k in &keys {
                c.keys.remove(k);
            }
            Ok(())
        }
    })
}

/// One action per sink call, sent at once.
async fn one_action_per_call(dir: &std::path::Path) -> Result<App> {
    app_with(dir, |b| {
        b.batch_policy(BatchPolicy {
            max_actions: 1,
            linger: Duration::from_millis(1),
        })
    })
    .await
}

/// Registers two targets, `test/a` and `test/b`, on one sink, and
/// declares each pair's first row through `a`, then its second through `b`.
fn declare_on_two_targets(
    ctx: &Ctx,
    sink: TargetActionSink<RowAction>,
    pairs: Vec<((String, String), (String, String))>,
) -> Result<()> {
    let a = register_root_target_states_provider::<String, _>(
        ctx,
        "test/a",
        RowHandler::new(sink.clone()),
    )?;
    let b =
        register_root_target_states_provider::<String, _>(ctx, "test/b", RowHandler::new(sink))?;
    for (first, second) in pairs {
        declare_into(ctx, &a, [first])?;
        declare_into(ctx, &b, [second])?;
    }
    Ok(())
}

fn keys(n: usize) -> Vec<(String, String)> {
    (0..n).map(|i| (format!("k{i}"), format!("v{i}"))).collect()
}

#[tokio::test]
async fn a_sink_allowing_two_calls_gets_two_at_once_and_a_default_sink_one_at_a_time() -> Result<()>
{
    for allowed in [None, Some(2)] {
        let dir = tempfile::tempdir()?;
        let app = one_action_per_call(dir.path()).await?;
        let calls = Arc::new(Mutex::new(Calls::default()));
        let sink = match allowed {
            Some(n) => slow_sink(&calls).concurrent_calls(n),
            None => slow_sink(&calls),
        };
        let stats = app
            .run(move |ctx| async move {
                declare_each(&ctx, "test/row", RowHandler::new(sink), keys(6))
            })
            .await?;
        assert_eq!(stats.created, 6, "{allowed:?}");
        let c = calls.lock().map_err(|_| Error::msg("poisoned"))?;
        assert_eq!(c.applied, 6, "{allowed:?}");
        assert_eq!(c.most, allowed.unwrap_or(1), "calls at once, {allowed:?}");
    }
    Ok(())
}

#[tokio::test]
async fn calls_running_at_once_never_carry_the_same_key() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = one_action_per_call(dir.path()).await?;
    let calls = Arc::new(Mutex::new(Calls::default()));
    // Two targets share the sink and declare the same keys, one after the
    // other: each key comes to the sink twice in a row, in calls that must
    // not overlap.
    let sink = slow_sink(&calls).concurrent_calls(4);
    let pairs = keys(4)
        .into_iter()
        .map(|(k, v)| ((k.clone(), v.clone()), (k, v)));
    let stats = app
        .run(move |ctx| async move { declare_on_two_targets(&ctx, sink, pairs.collect()) })
        .await?;
    assert_eq!(stats.created, 8);
    let c = calls.lock().map_err(|_| Error::msg("poisoned"))?;
    assert_eq!(c.applied, 8);
    assert!(
        c.overlaps.is_empty(),
        "keys in two calls at once: {:?}",
        c.overlaps
    );
    assert!(c.most >= 2, "the calls ran one at a time ({})", c.most);
    Ok(())
}

#[tokio::test]
async fn a_call_waiting_to_be_retried_is_not_overtaken_by_a_later_action_on_its_key() -> Result<()>
{
    for allowed in [1, 2] {
        let dir = tempfile::tempdir()?;
        let app = one_action_per_call(dir.path()).await?;
        let applied: Arc<Mutex<Vec<String>>> = Arc::default();
        let failed_once = Arc::new(Mutex::new(false));
        let (log, failed) = (Arc::clone(&applied), Arc::clone(&failed_once));
        // The first call for "a" fails once, with a retriable error.
        let sink = TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<RowAction>>| {
            let (log, failed) = (Arc::clone(&log), Arc::clone(&failed));
            async move {
                for a in &actions {
                    let (TargetAction::Create(r)
                    | TargetAction::Update(r)
                    | TargetAction::Delete(r)) = a;
                    let value = r.value.clone().unwrap_or_default();
                    let mut failed = failed.lock().map_err(|_| Error::msg("poisoned"))?;
                    if value == "a" && !*failed {
                        *failed = true;
                        return Err(Error::msg("transient failure"));
                    }
                    log.lock()
                        .map_err(|_| Error::msg("poisoned"))?
                        .push(format!("{}={value}", r.key));
                }
                Ok(())
            }
        })
        .concurrent_calls(allowed);
        // Two targets on the sink declare one key, "a" first.
        let stats = app
            .run(move |ctx| async move {
                let pair = (
                    ("k0".to_string(), "a".to_string()),
                    ("k0".into(), "b".into()),
                );
                declare_on_two_targets(&ctx, sink, vec![pair])
            })
            .await?;
        assert_eq!(stats.created, 2, "concurrency {allowed}");
        let applied = applied.lock().map_err(|_| Error::msg("poisoned"))?.clone();
        assert_eq!(applied, ["k0=a", "k0=b"], "concurrency {allowed}");
    }
    Ok(())
}
