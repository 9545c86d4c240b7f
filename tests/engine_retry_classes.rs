//! Retries by error class, without head-of-line blocking: a failed batch
//! is split at once to isolate its components; a component whose error is
//! permanent is called once on its own and never retried; one whose error
//! is transient waits for its backoff without holding the sink's call
//! slot, so healthy components' actions go on meanwhile (guarantee 16).

mod support;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;
use weir::prelude::*;

async fn bounded<T>(fut: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .map_err(|_| Error::msg("timed out after 60s"))?
}

/// Every call of the sink, as the sorted keys it carried, in call order.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<Vec<String>>>>);

impl Calls {
    fn all(&self) -> Vec<Vec<String>> {
        self.0.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// The positions of the calls that carried exactly `keys`.
    fn alone(&self, keys: &[&str]) -> Vec<usize> {
        self.all()
            .iter()
            .enumerate()
            .filter(|(_, c)| c.iter().map(String::as_str).eq(keys.iter().copied()))
            .map(|(i, _)| i)
            .collect()
    }
}

/// A sink that fails every call carrying `p` permanently, and the first
/// `t_failures` calls carrying `t` (but not `p`) transiently.
fn classed_sink(calls: Calls, t_failures: usize) -> TargetActionSink<RowAction> {
    let t_failed = Arc::new(Mutex::new(0usize));
    TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<RowAction>>| {
        let calls = calls.clone();
        let t_failed = Arc::clone(&t_failed);
        async move {
            let mut keys: Vec<String> = actions.iter().map(|a| a.inner().key.clone()).collect();
            keys.sort();
            calls
                .0
                .lock()
                .map_err(|_| Error::msg("poisoned"))?
                .push(keys.clone());
            if keys.iter().any(|k| k == "p") {
                return Err(Error::permanent("p's row is refused"));
            }
            if keys.iter().any(|k| k == "t") {
                let mut failed = t_failed.lock().map_err(|_| Error::msg("poisoned"))?;
                if *failed < t_failures {
                    *failed += 1;
                    return Err(Error::msg("t's connection dropped"));
                }
            }
            Ok(())
        }
    })
}

async fn retry_app(dir: &std::path::Path, backoff: Duration, attempts: u32) -> Result<App> {
    app_with(dir, |b| {
        b.retry_policy(RetryPolicy {
            max_attempts: attempts,
            initial_backoff: backoff,
            max_backoff: backoff,
            call_timeout: Some(Duration::from_secs(10)),
        })
        .batch_policy(BatchPolicy {
            max_actions: 100,
            linger: Duration::from_millis(200),
        })
    })
    .await
}

/// Runs one component per key, each declaring one row keyed by it.
async fn run_components(
    app: &App,
    sink: TargetActionSink<RowAction>,
    keys: &[&str],
) -> Result<RunReport> {
    let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    let handler = RowHandler::new(sink);
    bounded(app.run_report(move |ctx| async move {
        let rows = register_root_target_states_provider(&ctx, "rows", handler)?;
        ctx.mount_each(
            keys,
            |k: &String| k.clone(),
            move |c, k| {
                let rows = rows.clone();
                async move { declare_target_state(&c, rows.target_state(k.clone(), k)) }
            },
        )
        .await
    }))
    .await
}

fn failed(report: &RunReport) -> Vec<String> {
    let mut paths: Vec<String> = report.failures.iter().map(|f| f.path.to_string()).collect();
    paths.sort();
    paths
}

#[tokio::test]
async fn a_batch_of_a_permanent_a_transient_and_a_healthy_component_fails_only_the_permanent_one_called_once_alone(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    // A backoff far longer than everything else the run does.
    let app = retry_app(dir.path(), Duration::from_secs(2), 3).await?;
    let calls = Calls::default();
    let report = run_components(&app, classed_sink(calls.clone(), 1), &["h", "p", "t"]).await?;

    assert_eq!(failed(&report), vec!["/p"], "{:?}", report.failures);
    let cause = &report.failures[0].cause;
    assert!(cause.contains("p's row is refused"), "{cause}");
    // The permanent one: once on its own, never retried.
    assert_eq!(calls.alone(&["p"]).len(), 1, "calls: {:?}", calls.all());
    // The healthy one landed before the transient one's retry, which
    // waited for its backoff without holding the call slot.
    let h = calls.alone(&["h"]);
    let t = calls.alone(&["t"]);
    assert_eq!(h.len(), 1, "calls: {:?}", calls.all());
    assert_eq!(t.len(), 2, "t failed once, then landed: {:?}", calls.all());
    assert!(
        h[0] < t[1],
        "the healthy call waited for the transient one's retry: {:?}",
        calls.all()
    );
    Ok(())
}

#[tokio::test]
async fn a_component_arriving_while_another_waits_for_its_retry_is_applied_before_that_retry(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = retry_app(dir.path(), Duration::from_secs(2), 3).await?;
    let calls = Calls::default();
    let sink = classed_sink(calls.clone(), 1);
    let handler = RowHandler::new(sink);
    let seen = calls.clone();
    let report = bounded(app.run_report(move |ctx| async move {
        let rows = register_root_target_states_provider(&ctx, "rows", handler)?;
        let first = rows.clone();
        let late = ctx.clone();
        // `t` fails once and waits for its 2 s backoff; `h` comes once
        // `t`'s first call has failed.
        let t = tokio::spawn(async move {
            ctx.mount("t", move |c| async move {
                declare_target_state(&c, first.target_state("t", "t".to_string()))
            })
            .await
        });
        while seen.alone(&["t"]).is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        late.mount("h", move |c| async move {
            declare_target_state(&c, rows.target_state("h", "h".to_string()))
        })
        .await?;
        // `h` is committed, and `t` has not been called again yet.
        if seen.alone(&["t"]).len() != 1 {
            return Err(Error::msg(format!(
                "h landed only after t's retry: {:?}",
                seen.all()
            )));
        }
        t.await.map_err(|e| Error::msg(e.to_string()))?
    }))
    .await?;
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(calls.alone(&["t"]).len(), 2, "{:?}", calls.all());
    Ok(())
}

#[tokio::test]
async fn a_permanent_error_in_a_call_of_one_component_is_not_retried() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = retry_app(dir.path(), Duration::from_millis(5), 5).await?;
    let calls = Calls::default();
    let report = run_components(&app, classed_sink(calls.clone(), 0), &["p"]).await?;
    assert_eq!(failed(&report), vec!["/p"]);
    assert!(!report.failures[0].retriable, "{:?}", report.failures);
    assert_eq!(calls.all(), vec![vec!["p".to_string()]]);
    Ok(())
}

#[tokio::test]
async fn a_transient_error_is_retried_until_the_policy_gives_up() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = retry_app(dir.path(), Duration::from_millis(5), 4).await?;
    let calls = Calls::default();
    let report = run_components(&app, classed_sink(calls.clone(), 100), &["t"]).await?;
    assert_eq!(failed(&report), vec!["/t"]);
    assert!(report.failures[0].retriable, "{:?}", report.failures);
    assert_eq!(calls.alone(&["t"]).len(), 4, "{:?}", calls.all());
    Ok(())
}
