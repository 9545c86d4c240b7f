//! Failures: batching across components, split retries, transient and
//! permanent sink errors, possible records after failed updates and
//! crashes, removed components whose deletions fail, panicking and hanging
//! sinks, the ledger's lock and corruption checks, and the defaults.

mod support;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::FutureExt;
use support::*;
use weir::prelude::*;

/// The provider every test declares its rows through.
const PROVIDER: &str = "test/rows";

/// The longest any single engine call may take before a test calls it hung.
const LIMIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Awaits `fut` for at most `limit`; a hang becomes an error.
async fn within<F: Future>(limit: Duration, fut: F) -> Result<F::Output> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| Error::msg(format!("no answer within {limit:?}: the engine hung")))
}

/// The error of `r`, or an error saying that `what` unexpectedly succeeded.
fn expect_err<T: std::fmt::Debug>(r: Result<T>, what: &str) -> Result<Error> {
    err_or(r, |v| format!("{what}: expected an error, got Ok({v:?})"))
}

/// Child components by key, each with the rows it declares.
type Components = Vec<(String, Vec<(String, String)>)>;

/// One run: the root registers the provider with `handler` and mounts one
/// child component per entry of `comps`, each declaring its rows.
async fn run_components<H>(app: &App, handler: H, comps: Components) -> Result<UpdateStats>
where
    H: TargetHandler<String, TrackingRecord = String, Action = RowAction>,
{
    let run = app.run(move |ctx| async move {
        let provider = register_root_target_states_provider::<String, H>(&ctx, PROVIDER, handler)?;
        ctx.mount_each(
            comps,
            |(key, _): &(String, Vec<(String, String)>)| key.clone(),
            move |c, (_, rows)| {
                let provider = provider.clone();
                async move { declare_into(&c, &provider, rows) }
            },
        )
        .await
    });
    within(LIMIT, run).await?
}

/// One run: the root component declares `rows` itself.
async fn run_rows<H>(app: &App, handler: H, rows: &[(&str, &str)]) -> Result<UpdateStats>
where
    H: TargetHandler<String, TrackingRecord = String, Action = RowAction>,
{
    let rows = owned(rows);
    let run = app.run(move |ctx| async move { declare_each(&ctx, PROVIDER, handler, rows) });
    within(LIMIT, run).await?
}

/// A fail function that fails every call containing `key`.
fn fail_on_key(key: &'static str) -> FailFn {
    Arc::new(move |_, keys: &[String]| {
        keys.iter()
            .any(|k| k == key)
            .then(|| format!("the target rejects {key}"))
    })
}

/// A fail function that fails every call.
fn fail_always() -> FailFn {
    Arc::new(|_, _: &[String]| Some("the target is down".to_string()))
}

/// A fail function that fails the first `n` calls, and counts all calls.
fn fail_first(n: usize, calls: Arc<AtomicUsize>) -> FailFn {
    Arc::new(move |call, _: &[String]| {
        calls.fetch_add(1, Ordering::SeqCst);
        (call < n).then(|| format!("transient outage (call {call})"))
    })
}

/// What a call of a [`scripted_sink`] does.
enum Step {
    /// Apply the actions to the store and log them.
    Apply,
    /// Fail with this error, applying nothing.
    Fail(Error),
    /// Run this future instead of applying.
    Instead(BoxFuture<'static, Result<()>>),
}

/// Decides, from the call number (from 0) and the keys in it, what a call does.
type Script = Arc<dyn Fn(usize, &[String]) -> Step + Send + Sync>;

/// A sink that counts its calls in `calls` and does what `script` says.
fn scripted_sink(
    log: Log,
    store: Store,
    calls: Arc<AtomicUsize>,
    script: Script,
) -> TargetActionSink<RowAction> {
    TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<RowAction>>| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        let keys: Vec<String> = actions.iter().map(|a| a.inner().key.clone()).collect();
        let step = script(n, &keys);
        let log = log.clone();
        let store = store.clone();
        async move {
            match step {
                Step::Apply => apply_rows(&log, &store, actions),
                Step::Fail(e) => Err(e),
                Step::Instead(f) => f.await,
            }
        }
    })
}

/// How many log entries name `key` (as `"<verb> <key>"` or `"<verb> <key>=..."`).
fn entries_for(log: &Log, key: &str) -> usize {
    log.entries().iter().filter(|e| entry_key(e) == key).count()
}

/// The key of a log entry.
fn entry_key(entry: &str) -> &str {
    let rest = entry.split_once(' ').map_or(entry, |(_, r)| r);
    rest.split_once('=').map_or(rest, |(k, _)| k)
}

// ---------------------------------------------------------------------------
// 1. Batching (guarantee 5)
// ---------------------------------------------------------------------------

fn twenty_components_of_five_rows() -> Components {
    (0..20)
        .map(|c| {
            (
                format!("c{c}"),
                (0..5)
                    .map(|r| (format!("c{c}-r{r}"), "v".to_string()))
                    .collect(),
            )
        })
        .collect()
}

#[tokio::test]
async fn actions_of_components_finishing_together_reach_their_sink_in_one_call() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let stats = run_components(&app, rig.handler(), twenty_components_of_five_rows()).await?;
    assert_eq!(stats.created, 100);
    let sizes: Vec<usize> = rig.log.calls().iter().map(Vec::len).collect();
    assert_eq!(
        sizes,
        vec![100],
        "with the default BatchPolicy, 20 components x 5 rows should share one sink call"
    );
    assert_eq!(rig.store.snapshot().len(), 100);
    Ok(())
}

#[tokio::test]
async fn batch_policy_max_actions_bounds_every_sink_call() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app_with(dir.path(), |b| {
        b.batch_policy(BatchPolicy {
            max_actions: 30,
            linger: Duration::from_millis(20),
        })
    })
    .await?;
    let rig = Rig::new();
    run_components(&app, rig.handler(), twenty_components_of_five_rows()).await?;
    let sizes: Vec<usize> = rig.log.calls().iter().map(Vec::len).collect();
    assert!(
        sizes.iter().all(|&n| n <= 30),
        "a call exceeds max_actions = 30: {sizes:?}"
    );
    assert_eq!(sizes.iter().sum::<usize>(), 100, "{sizes:?}");
    assert!(
        sizes.len() >= 4,
        "100 actions need at least 4 calls: {sizes:?}"
    );
    assert_eq!(rig.store.snapshot().len(), 100);
    Ok(())
}

// ---------------------------------------------------------------------------
// 2. A poisoned component among many (guarantee 6)
// ---------------------------------------------------------------------------

fn fifty_components_one_poisoned() -> Components {
    (0..50)
        .map(|c| {
            let rows = if c == 17 {
                vec![
                    ("c17-a".to_string(), "v".to_string()),
                    ("poison".to_string(), "v".to_string()),
                ]
            } else {
                vec![
                    (format!("c{c}-a"), "v".to_string()),
                    (format!("c{c}-b"), "v".to_string()),
                ]
            };
            (format!("c{c}"), rows)
        })
        .collect()
}

#[tokio::test]
async fn a_failing_sink_call_is_split_so_only_the_poisoned_component_fails() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::failing(fail_on_key("poison"));
    let err = expect_err(
        run_components(&app, rig.handler(), fifty_components_one_poisoned()).await,
        "a run with a poisoned component",
    )?;
    assert_eq!(failed_paths(&err), vec!["/c17"], "{err}");
    let text = err.to_string();
    assert!(text.contains("/c17"), "{text}");
    assert!(text.contains("the target rejects poison"), "{text}");

    // Every good key was applied exactly once, by a successful call.
    let store = rig.store.snapshot();
    for c in (0..50).filter(|c| *c != 17) {
        for suffix in ["a", "b"] {
            let key = format!("c{c}-{suffix}");
            assert_eq!(store.get(&key).map(String::as_str), Some("v"), "{key}");
            assert_eq!(
                entries_for(&rig.log, &key),
                1,
                "{key}: {:?}",
                rig.log.calls()
            );
        }
    }
    // Nothing of the poisoned component was applied.
    assert!(!store.contains_key("poison"));
    assert!(!store.contains_key("c17-a"));
    assert_eq!(store.len(), 98);

    // The next run retries only the poisoned component.
    let healthy = Rig::new();
    let stats = run_components(&app, healthy.handler(), fifty_components_one_poisoned()).await?;
    let keys: Vec<String> = healthy
        .log
        .entries()
        .iter()
        .map(|e| entry_key(e).to_string())
        .collect();
    assert!(keys.iter().any(|k| k == "poison"), "{keys:?}");
    assert!(
        keys.iter().all(|k| k == "poison" || k == "c17-a"),
        "the healthy run touched other components: {keys:?}"
    );
    assert_eq!(stats.unchanged, 98);
    assert_eq!(
        healthy.store.snapshot().get("poison").map(String::as_str),
        Some("v")
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// 3. Transient failures under the default RetryPolicy
// ---------------------------------------------------------------------------

async fn default_app(dir: &Path) -> Result<App> {
    App::builder("failures-defaults")
        .ledger_path(dir.join("ledger"))
        .build()
        .await
}

#[tokio::test]
async fn transient_sink_failures_are_retried_until_every_row_lands() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = default_app(dir.path()).await?;
    let calls = Arc::new(AtomicUsize::new(0));
    let rig = Rig::failing(fail_first(2, Arc::clone(&calls)));
    let comps: Components = (0..10)
        .map(|c| {
            (
                format!("c{c}"),
                (0..3)
                    .map(|r| (format!("c{c}-r{r}"), "v".to_string()))
                    .collect(),
            )
        })
        .collect();
    let stats = run_components(&app, rig.handler(), comps).await?;
    assert_eq!(stats.created, 30);
    assert_eq!(stats.failed_components, 0);
    assert_eq!(rig.store.snapshot().len(), 30);
    assert!(calls.load(Ordering::SeqCst) >= 3);
    Ok(())
}

#[tokio::test]
async fn a_single_component_survives_two_consecutive_failed_calls_by_default() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = default_app(dir.path()).await?;
    let calls = Arc::new(AtomicUsize::new(0));
    let rig = Rig::failing(fail_first(2, Arc::clone(&calls)));
    let stats = run_rows(&app, rig.handler(), &[("a", "1"), ("b", "2"), ("c", "3")]).await?;
    assert_eq!(stats.created, 3);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "two failures, then success"
    );
    assert_eq!(rig.log.call_count(), 1);
    assert_eq!(
        rig.store.snapshot(),
        map(&[("a", "1"), ("b", "2"), ("c", "3")])
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// 4. Permanent errors are not retried
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_permanent_sink_error_is_not_retried() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let calls = Arc::new(AtomicUsize::new(0));
    let sink = scripted_sink(
        Log::default(),
        Store::default(),
        Arc::clone(&calls),
        Arc::new(|_, _: &[String]| {
            Step::Fail(Error::permanent("duplicate key violates unique constraint"))
        }),
    );
    let err = expect_err(
        run_rows(&app, RowHandler::new(sink), &[("a", "1"), ("b", "2")]).await,
        "a run whose sink fails permanently",
    )?;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "a permanent error was retried"
    );
    assert_eq!(failed_paths(&err), vec!["/"], "{err}");
    assert!(err.to_string().contains("unique constraint"), "{err}");
    Ok(())
}

// ---------------------------------------------------------------------------
// 5. Possible records after a failed update (guarantee 6)
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_failed_update_leaves_old_and_new_records_as_possible() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;

    let rig = Rig::new();
    run_rows(&app, rig.handler(), &[("a", "1")]).await?;
    assert_eq!(rig.store.snapshot(), map(&[("a", "1")]));

    let broken = Rig::failing(fail_always());
    let err = expect_err(
        run_rows(&app, broken.handler(), &[("a", "2")]).await,
        "an update through a failing sink",
    )?;
    assert_eq!(failed_paths(&err), vec!["/"], "{err}");

    let healthy = Rig::new();
    let handler = RowHandler::watched(healthy.sink());
    run_rows(&app, handler.clone(), &[("a", "2")]).await?;
    let seen = handler.seen("a");
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].desired.as_deref(), Some("2"));
    assert_eq!(seen[0].prev, vec!["1", "2"], "{seen:?}");
    assert!(seen[0].prev_may_be_missing, "{seen:?}");
    assert_eq!(healthy.log.entries(), vec!["update a=2"]);

    let again = Rig::new();
    let stats = run_rows(&app, again.handler(), &[("a", "2")]).await?;
    assert_eq!(again.log.call_count(), 0, "{:?}", again.log.calls());
    assert_eq!(stats.unchanged, 1);
    Ok(())
}

// ---------------------------------------------------------------------------
// 6. A crash between apply and commit (guarantee 7)
// ---------------------------------------------------------------------------

const CRASH_TEST: &str = "a_crash_between_apply_and_commit_leaves_old_and_attempted_records";
const CRASH_CHILD_ENV: &str = "WEIR_CRASH_CHILD";
const CRASH_DIR_ENV: &str = "WEIR_CRASH_DIR";
const CRASH_CODE: i32 = 3;

/// Ends the process at once, as a crash would: no destructor, no commit.
fn crash(code: i32) -> Result<()> {
    std::process::exit(code)
}

/// The child process: one update whose sink applies, then dies.
async fn crash_child(dir: PathBuf) -> Result<()> {
    let app = app(&dir).await?;
    let applied = dir.join("applied.txt");
    let sink = scripted_sink(
        Log::default(),
        Store::default(),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(move |_, keys: &[String]| {
            let applied = applied.clone();
            let keys = keys.join(",");
            Step::Instead(
                async move {
                    std::fs::write(&applied, keys)?;
                    crash(CRASH_CODE)
                }
                .boxed(),
            )
        }),
    );
    run_rows(&app, RowHandler::new(sink), &[("a", "2"), ("b", "new")]).await?;
    Err(Error::msg("the crashing sink was never called"))
}

#[tokio::test]
async fn a_crash_between_apply_and_commit_leaves_old_and_attempted_records() -> Result<()> {
    if std::env::var_os(CRASH_CHILD_ENV).is_some() {
        let dir = std::env::var_os(CRASH_DIR_ENV)
            .ok_or_else(|| Error::msg("the crash child needs WEIR_CRASH_DIR"))?;
        return crash_child(PathBuf::from(dir)).await;
    }
    let dir = tempfile::tempdir()?;

    // Run 1: a=1 is committed.
    {
        let app = app(dir.path()).await?;
        run_rows(&app, Rig::new().handler(), &[("a", "1")]).await?;
    }

    // Run 2, in a child process: a=2 and b=new are applied, then it dies.
    let out = std::fs::File::create(dir.path().join("child.out"))?;
    let err = out.try_clone()?;
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(["--exact", CRASH_TEST, "--nocapture", "--test-threads=1"])
        .env(CRASH_CHILD_ENV, "1")
        .env(CRASH_DIR_ENV, dir.path())
        .stdout(out)
        .stderr(err)
        .spawn()?;
    let waited = within(Duration::from_secs(120), async {
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok::<_, Error>(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let status = match waited {
        Ok(status) => status?,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    let output = std::fs::read_to_string(dir.path().join("child.out")).unwrap_or_default();
    assert_eq!(
        status.code(),
        Some(CRASH_CODE),
        "the child did not crash in its sink; its output:\n{output}"
    );
    let applied = std::fs::read_to_string(dir.path().join("applied.txt"))?;
    assert!(applied.contains('a') && applied.contains('b'), "{applied}");

    // Run 3: the same ledger; a=2 is declared again, b is not declared.
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let handler = RowHandler::watched(rig.sink());
    run_rows(&app, handler.clone(), &[("a", "2")]).await?;

    let a = handler.seen("a");
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(
        a[0].prev,
        vec!["1", "2"],
        "both records are possible: {a:?}"
    );
    assert!(a[0].prev_may_be_missing, "{a:?}");

    let b = handler.seen("b");
    assert_eq!(
        b.len(),
        1,
        "b, created by the crashed run, was not reconciled: {b:?}"
    );
    assert_eq!(b[0].desired, None, "{b:?}");
    assert!(
        b[0].prev.iter().any(|r| r == "new") || b[0].prev_may_be_missing,
        "{b:?}"
    );
    assert_eq!(
        rig.log.entries(),
        vec!["delete b", "update a=2"],
        "{:?}",
        rig.log.calls()
    );

    // Run 4: everything is committed, nothing is left over.
    let quiet = Rig::new();
    let stats = run_rows(&app, quiet.handler(), &[("a", "2")]).await?;
    assert_eq!(quiet.log.call_count(), 0, "{:?}", quiet.log.calls());
    assert_eq!(stats.unchanged, 1);
    Ok(())
}

// ---------------------------------------------------------------------------
// 7. Removed components whose deletions fail (guarantee 14)
// ---------------------------------------------------------------------------

fn one_row_each(names: &[&str]) -> Components {
    names
        .iter()
        .map(|n| (n.to_string(), vec![(format!("row-{n}"), "v".to_string())]))
        .collect()
}

#[tokio::test]
async fn a_removed_component_whose_deletions_fail_is_deleted_on_the_next_run() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    run_components(&app, rig.handler(), one_row_each(&["x", "y"])).await?;
    assert_eq!(rig.store.snapshot(), map(&[("row-x", "v"), ("row-y", "v")]));

    // Run 2: y is no longer mounted, and deleting its row fails.
    let broken = Rig {
        store: rig.store.clone(),
        ..Rig::failing(fail_on_key("row-y"))
    };
    let err = expect_err(
        run_components(&app, broken.handler(), one_row_each(&["x"])).await,
        "a run whose deletions fail",
    )?;
    assert_eq!(failed_paths(&err), vec!["/y"], "{err}");
    assert!(rig.store.snapshot().contains_key("row-y"));

    // Run 3: y is still not mounted; the deletion is retried.
    let healthy = Rig {
        store: rig.store.clone(),
        ..Rig::new()
    };
    run_components(&app, healthy.handler(), one_row_each(&["x"])).await?;
    assert_eq!(
        healthy.log.entries(),
        vec!["delete row-y"],
        "the failed deletion was not retried"
    );
    assert_eq!(rig.store.snapshot(), map(&[("row-x", "v")]));

    // Run 4: nothing left.
    let quiet = Rig::new();
    run_components(&app, quiet.handler(), one_row_each(&["x"])).await?;
    assert_eq!(quiet.log.call_count(), 0, "{:?}", quiet.log.calls());
    Ok(())
}

#[tokio::test]
async fn a_removed_component_that_comes_back_after_failed_deletions_is_applied_afresh() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    run_components(&app, rig.handler(), one_row_each(&["x", "y"])).await?;

    let broken = Rig {
        store: rig.store.clone(),
        ..Rig::failing(fail_on_key("row-y"))
    };
    let err = expect_err(
        run_components(&app, broken.handler(), one_row_each(&["x"])).await,
        "a run whose deletions fail",
    )?;
    assert_eq!(failed_paths(&err), vec!["/y"], "{err}");

    // Run 3: y comes back with the same value: it may be missing, so it is
    // written again.
    let healthy = Rig {
        store: rig.store.clone(),
        ..Rig::new()
    };
    let handler = RowHandler::watched(healthy.sink());
    run_components(&app, handler.clone(), one_row_each(&["x", "y"])).await?;
    let y = handler.seen("row-y");
    assert_eq!(y.len(), 1, "{y:?}");
    assert!(y[0].prev_may_be_missing, "{y:?}");
    let entries = healthy.log.entries();
    assert!(
        entries == vec!["update row-y=v"] || entries == vec!["create row-y=v"],
        "{entries:?}"
    );
    assert_eq!(rig.store.snapshot(), map(&[("row-x", "v"), ("row-y", "v")]));

    // Run 4: committed.
    let quiet = Rig::new();
    run_components(&app, quiet.handler(), one_row_each(&["x", "y"])).await?;
    assert_eq!(quiet.log.call_count(), 0, "{:?}", quiet.log.calls());
    Ok(())
}

// ---------------------------------------------------------------------------
// 8. Panicking sinks and failing handlers
// ---------------------------------------------------------------------------

fn ten_components_one_with_boom() -> Components {
    (0..10)
        .map(|c| {
            let mut rows = vec![(format!("c{c}-r"), "v".to_string())];
            if c == 4 {
                rows.push(("boom".to_string(), "v".to_string()));
            }
            (format!("c{c}"), rows)
        })
        .collect()
}

/// Checks that only `/c4` failed, with an error naming the provider and
/// `boom`, and that every other component's row landed.
fn assert_only_boom_failed(err: &Error, store: &Store) {
    assert_eq!(failed_paths(err), vec!["/c4"], "{err}");
    let text = err.to_string();
    assert!(
        text.contains(PROVIDER),
        "the error names no provider: {text}"
    );
    assert!(text.contains("boom"), "the error names no key: {text}");
    let rows = store.snapshot();
    for c in (0..10).filter(|c| *c != 4) {
        assert!(rows.contains_key(&format!("c{c}-r")), "c{c}: {rows:?}");
    }
    assert!(!rows.contains_key("boom"));
}

#[tokio::test]
async fn a_sink_future_that_panics_fails_only_the_components_in_that_call() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let (log, store) = (Log::default(), Store::default());
    let sink = scripted_sink(
        log.clone(),
        store.clone(),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(|_, keys: &[String]| {
            if keys.iter().any(|k| k == "boom") {
                Step::Instead(async { panic!("the sink blew up") }.boxed())
            } else {
                Step::Apply
            }
        }),
    );
    let err = expect_err(
        run_components(&app, RowHandler::new(sink), ten_components_one_with_boom()).await,
        "a run with a panicking sink",
    )?;
    assert_only_boom_failed(&err, &store);
    Ok(())
}

#[tokio::test]
async fn a_sink_function_that_panics_before_returning_its_future_fails_only_its_components(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let (log, store) = (Log::default(), Store::default());
    let sink = scripted_sink(
        log.clone(),
        store.clone(),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(|_, keys: &[String]| {
            if keys.iter().any(|k| k == "boom") {
                panic!("the sink function blew up");
            }
            Step::Apply
        }),
    );
    let err = expect_err(
        run_components(&app, RowHandler::new(sink), ten_components_one_with_boom()).await,
        "a run with a sink function that panics",
    )?;
    assert_only_boom_failed(&err, &store);
    Ok(())
}

#[tokio::test]
async fn a_handler_error_fails_only_its_component_and_names_provider_key_and_path() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let comps: Components = (0..6)
        .map(|c| {
            let value = if c == 2 { "!reconcile-error" } else { "v" };
            (
                format!("c{c}"),
                vec![(format!("c{c}-r"), value.to_string())],
            )
        })
        .collect();
    let err = expect_err(
        run_components(&app, rig.handler(), comps).await,
        "a run whose handler fails",
    )?;
    assert_eq!(failed_paths(&err), vec!["/c2"], "{err}");
    let text = err.to_string();
    assert!(text.contains(PROVIDER), "{text}");
    assert!(text.contains("c2-r"), "{text}");
    assert!(text.contains("/c2"), "{text}");
    let cause = &err.failed_components()[0].cause;
    assert!(
        cause.contains(PROVIDER) && cause.contains("c2-r"),
        "{cause}"
    );
    let rows = rig.store.snapshot();
    assert_eq!(rows.len(), 5, "{rows:?}");
    assert!(!rows.contains_key("c2-r"));
    Ok(())
}

// ---------------------------------------------------------------------------
// 9. A hanging sink
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_hanging_sink_call_times_out_and_the_run_fails_in_bounded_time() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app_with(dir.path(), |b| {
        b.retry_policy(RetryPolicy {
            max_attempts: 2,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(20),
            call_timeout: Some(Duration::from_millis(100)),
        })
    })
    .await?;
    let calls = Arc::new(AtomicUsize::new(0));
    let sink = scripted_sink(
        Log::default(),
        Store::default(),
        Arc::clone(&calls),
        Arc::new(|_, _: &[String]| Step::Instead(futures::future::pending().boxed())),
    );
    let started = Instant::now();
    let handler = RowHandler::new(sink);
    let run =
        app.run(move |ctx| async move { declare_rows(&ctx, PROVIDER, handler, &[("a", "1")]) });
    let result = within(Duration::from_secs(10), run).await?;
    let err = expect_err(result, "a run whose sink hangs")?;
    assert_eq!(failed_paths(&err), vec!["/"], "{err}");
    let n = calls.load(Ordering::SeqCst);
    assert!((1..=2).contains(&n), "{n} calls with max_attempts = 2");
    assert!(started.elapsed() < Duration::from_secs(10));
    Ok(())
}

/// An app whose sink calls time out after 100 ms, tried twice.
async fn app_timing_out(dir: &Path) -> Result<App> {
    app_with(dir, |b| {
        b.retry_policy(RetryPolicy {
            max_attempts: 2,
            initial_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(10),
            call_timeout: Some(Duration::from_millis(100)),
        })
    })
    .await
}

/// Held by a sink call that takes a while to let go when it is cancelled
/// (blocking clean-up in a destructor); says when it has.
struct SlowToStop(Arc<AtomicBool>);

impl Drop for SlowToStop {
    fn drop(&mut self) {
        std::thread::sleep(Duration::from_millis(300));
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_call_has_stopped_before_its_keys_are_called_again() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app_timing_out(dir.path()).await?;
    let stopped = Arc::new(AtomicBool::new(false));
    let beside = Arc::new(AtomicBool::new(false));
    let (stop, seen) = (Arc::clone(&stopped), Arc::clone(&beside));
    let store = Store::default();
    let sink = scripted_sink(
        Log::default(),
        store.clone(),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(move |n, _: &[String]| {
            if n == 0 {
                // Hangs past the timeout, then is slow to stop.
                let guard = SlowToStop(Arc::clone(&stop));
                return Step::Instead(
                    async move {
                        let _guard = guard;
                        futures::future::pending::<()>().await;
                        Ok(())
                    }
                    .boxed(),
                );
            }
            if !stop.load(Ordering::SeqCst) {
                seen.store(true, Ordering::SeqCst);
            }
            Step::Apply
        }),
    );
    let handler = RowHandler::new(sink);
    let run =
        app.run(move |ctx| async move { declare_rows(&ctx, PROVIDER, handler, &[("a", "1")]) });
    within(Duration::from_secs(10), run).await??;
    assert!(stopped.load(Ordering::SeqCst));
    assert!(
        !beside.load(Ordering::SeqCst),
        "the retry on key a ran while the timed-out call still held it"
    );
    assert!(store.snapshot().contains_key("a"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_completes_while_being_cancelled_counts_as_done() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app_timing_out(dir.path()).await?;
    let calls = Arc::new(AtomicUsize::new(0));
    let store = Store::default();
    let rows = Arc::clone(&store.rows);
    let sink = scripted_sink(
        Log::default(),
        store.clone(),
        Arc::clone(&calls),
        Arc::new(move |_, _: &[String]| {
            let rows = Arc::clone(&rows);
            // Blocks past the timeout (nothing can cancel it meanwhile),
            // then applies and succeeds.
            Step::Instead(
                async move {
                    std::thread::sleep(Duration::from_millis(300));
                    rows.lock()
                        .map_err(|_| Error::msg("poisoned"))?
                        .insert("a".into(), "1".into());
                    Ok(())
                }
                .boxed(),
            )
        }),
    );
    let handler = RowHandler::new(sink);
    let run =
        app.run(move |ctx| async move { declare_rows(&ctx, PROVIDER, handler, &[("a", "1")]) });
    within(Duration::from_secs(10), run).await??;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "a call that applied its actions was reported as timed out and called again"
    );
    assert_eq!(store.snapshot(), map(&[("a", "1")]));
    Ok(())
}

// ---------------------------------------------------------------------------
// 10. The ledger
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_reopened_ledger_remembers_what_was_created() -> Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        run_rows(&app, rig.handler(), &[("a", "1"), ("b", "2")]).await?;
        assert_eq!(rig.log.call_count(), 1);
    }
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let stats = run_rows(&app, rig.handler(), &[("a", "1"), ("b", "2")]).await?;
    assert_eq!(rig.log.call_count(), 0, "{:?}", rig.log.calls());
    assert_eq!(stats.unchanged, 2);
    Ok(())
}

#[tokio::test]
async fn a_second_app_on_an_open_ledger_is_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let first = app(dir.path()).await?;
    let err = expect_err(app(dir.path()).await, "a second App on an open ledger")?;
    assert!(matches!(err, Error::LedgerLocked { .. }), "{err:?}");
    assert!(err.to_string().contains("already open"), "{err}");
    drop(first);
    let again = app(dir.path()).await?;
    run_rows(&again, Rig::new().handler(), &[("a", "1")]).await?;
    Ok(())
}

/// Every file below `dir`, recursively.
fn files_below(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut queue = vec![dir.to_path_buf()];
    while let Some(d) = queue.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                queue.push(path);
            } else {
                out.push(path);
            }
        }
    }
    Ok(out)
}

/// Deterministic pseudo-random bytes (xorshift64).
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[tokio::test]
async fn a_corrupt_ledger_is_refused_with_an_error_not_a_panic() -> Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let app = app(dir.path()).await?;
        run_rows(&app, Rig::new().handler(), &[("a", "1"), ("b", "2")]).await?;
    }
    let ledger = dir.path().join("ledger");
    let files = files_below(&ledger.join("sled"))?;
    assert!(
        !files.is_empty(),
        "no sled files under {}",
        ledger.display()
    );
    for (i, file) in files.iter().enumerate() {
        let len = std::fs::metadata(file)?.len().clamp(64, 1 << 20) as usize;
        std::fs::write(file, noise(len, 0x9E37_79B9_7F4A_7C15 ^ i as u64))?;
    }
    let base = dir.path().to_path_buf();
    let joined = within(LIMIT, tokio::spawn(async move { app(&base).await })).await?;
    let built = match joined {
        Ok(r) => r,
        Err(e) if e.is_panic() => {
            return Err(Error::msg("opening a corrupt ledger panicked"));
        }
        Err(e) => return Err(Error::msg(format!("the build task failed: {e}"))),
    };
    let err = expect_err(built, "opening a corrupt ledger")?;
    let text = err.to_string();
    assert!(
        text.contains("corrupt") || text.contains(&ledger.display().to_string()),
        "{text}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// 11. Defaults
// ---------------------------------------------------------------------------

#[test]
fn default_policies_survive_two_failures_and_batch_at_least_a_hundred_actions() {
    assert!(RetryPolicy::default().max_attempts >= 3);
    assert!(BatchPolicy::default().max_actions >= 100);
}
