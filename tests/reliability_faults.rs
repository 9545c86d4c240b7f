//! Reliability under faults: a sink failing a tenth of its calls at random,
//! PostgreSQL connections killed in the middle of a run, and one poisoned
//! component among ten thousand.
//!
//! The PostgreSQL test uses the server at `WEIR_TEST_POSTGRES_URL`, else
//! `postgres://postgres@127.0.0.1:5432/test`; without one it prints
//! `SKIPPED` and passes, except under `CI=true`, where it fails. The random
//! failures are seeded (`WEIR_TEST_SEED`, printed; see `chaos/mod.rs`).

mod chaos;
mod pg;
mod support;

use std::collections::BTreeMap;
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chaos::{chaos_sink, desired, grid, Chaos};
use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Row as _};
use support::*;
use weir::connectors::postgres;
use weir::connectors::sql::{ColumnType, TableSchema};
use weir::prelude::*;

/// The longest one run may take before the test calls it hung.
const LIMIT: Duration = Duration::from_secs(120);

/// Awaits `fut` for at most [`LIMIT`]; a hang becomes an error.
async fn bounded<T>(fut: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(LIMIT, fut)
        .await
        .map_err(|_| Error::msg(format!("no answer within {LIMIT:?}: the run hung")))?
}

/// Child components by key, each with the rows it declares.
type Components = Vec<(String, Vec<(String, String)>)>;

/// One run: the root registers the provider with `handler` and mounts one
/// child component per entry of `comps`, each declaring its rows.
async fn run_components(app: &App, handler: RowHandler, comps: Components) -> Result<UpdateStats> {
    bounded(app.run(move |ctx| async move {
        let provider =
            register_root_target_states_provider::<String, _>(&ctx, "chaos/rows", handler)?;
        ctx.mount_each(
            comps,
            |(key, _): &(String, Vec<(String, String)>)| key.clone(),
            move |c, (_, rows)| {
                let provider = provider.clone();
                async move { declare_into(&c, &provider, rows) }
            },
        )
        .await
    }))
    .await
}

// ---------------------------------------------------------------------------
// A sink failing 10 % of its calls
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_lands_in_one_run_when_the_sink_fails_a_tenth_of_its_calls_at_random(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    // The default RetryPolicy. Sink calls hold one component's 100 actions
    // each, so that there are at least 50 calls (with the default batch
    // size, 5,000 actions take two calls, and a 10 % failure rate would
    // usually fail none) and every failure is retried, not split.
    let app = App::builder("chaos")
        .ledger_path(dir.path().join("ledger"))
        .batch_policy(BatchPolicy {
            max_actions: 100,
            ..BatchPolicy::default()
        })
        .build()
        .await?;
    let chaos = Chaos::from_env(100);
    let rig = Rig::new();
    let handler = RowHandler::new(chaos_sink(
        Arc::clone(&chaos),
        rig.log.clone(),
        rig.store.clone(),
    ));
    let comps = grid(50, 100);
    let want = desired(&comps);
    assert_eq!(want.len(), 5_000);

    let started = Instant::now();
    let stats = run_components(&app, handler.clone(), comps.clone()).await?;
    eprintln!(
        "one run: {} sink calls, {} failed, in {:?}",
        chaos.calls(),
        chaos.failed(),
        started.elapsed()
    );
    assert_eq!(stats.created, 5_000, "{stats:?}");
    assert_eq!(stats.failed_components, 0, "{stats:?}");
    assert!(
        chaos.failed() > 0,
        "the seed made no call fail: the test proved nothing"
    );
    assert_eq!(
        rig.store.snapshot(),
        want,
        "the store holds exactly the rows"
    );

    // Everything is recorded as done: the next run calls no sink.
    let calls = chaos.calls();
    let again = run_components(&app, handler, comps).await?;
    assert_eq!(again.unchanged, 5_000, "{again:?}");
    assert_eq!(chaos.calls(), calls, "an unchanged run called the sink");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_every_default_policy_a_sink_failing_a_tenth_of_its_calls_lands_every_row_in_one_run(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = App::builder("chaos-defaults")
        .ledger_path(dir.path().join("ledger"))
        .build()
        .await?;
    // Calls now carry many components: a failed one is split, and only the
    // calls of single components are retried. With few calls, a run may see
    // no failure at all, so this runs ten seeds (derived from the printed
    // one) and checks the outcome of each.
    let base = Chaos::from_env(100).seed;
    let mut failed = 0;
    for round in 0..10u64 {
        let chaos = Chaos::with_seed(base.wrapping_add(round), 100);
        let rig = Rig::new();
        let handler = RowHandler::new(chaos_sink(
            Arc::clone(&chaos),
            rig.log.clone(),
            rig.store.clone(),
        ));
        let comps: Components = grid(50, 100)
            .into_iter()
            .map(|(c, rows)| {
                let rows = rows
                    .into_iter()
                    .map(|(k, v)| (format!("{round}-{k}"), v))
                    .collect();
                (format!("{round}-{c}"), rows)
            })
            .collect();
        let want = desired(&comps);
        let stats = run_components(&app, handler, comps).await?;
        failed += chaos.failed();
        assert_eq!(stats.created, 5_000, "seed {:#x}: {stats:?}", chaos.seed);
        // The rows of earlier rounds were deleted along with their
        // components (the root no longer mounts them).
        assert_eq!(stats.deleted, if round == 0 { 0 } else { 5_000 });
        assert_eq!(rig.store.snapshot(), want, "seed {:#x}", chaos.seed);
    }
    eprintln!("default policies: {failed} failed calls over ten runs");
    Ok(())
}

// ---------------------------------------------------------------------------
// PostgreSQL connections killed mid-run
// ---------------------------------------------------------------------------

fn pg() -> ContextKey<PgPool> {
    ContextKey::new("pg")
}

/// The test server's URL and an administrative pool on it, or `None`
/// (after a loud message) when there is none and `CI` is not `true`.
async fn server() -> Result<Option<(String, PgPool)>> {
    pg::server(2).await.map_err(Error::msg)
}

/// A name unique to this test run (tables, application names).
fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{what}_{:x}_{:x}", std::process::id(), nanos)
}

#[derive(Clone, Debug, Serialize)]
struct Doc {
    id: String,
    body: String,
}

/// One run: mounts `table` and declares `comps` rows in each of as many
/// components.
async fn sync_pg(app: &App, table: &str, comps: usize, rows: usize) -> Result<UpdateStats> {
    let table = table.to_string();
    bounded(app.run(move |ctx| async move {
        let schema = TableSchema::builder()
            .column("id", ColumnType::Text)
            .column("body", ColumnType::Text)
            .primary_key(["id"])
            .build()?;
        let target = postgres::mount_table_target(&ctx, &pg(), &table, schema).await?;
        ctx.mount_each(
            0..comps,
            |c| format!("c{c:03}"),
            move |ctx, c| {
                let target = target.clone();
                async move {
                    for r in 0..rows {
                        target.declare_row(
                            &ctx,
                            &Doc {
                                id: format!("c{c:03}-r{r:03}"),
                                body: format!("body of {c}/{r}"),
                            },
                        )?;
                    }
                    Ok(())
                }
            },
        )
        .await
    }))
    .await
}

/// `id -> body` of the test table.
async fn pg_rows(pool: &PgPool, table: &str) -> Result<BTreeMap<String, String>> {
    let rows = sqlx::query(&format!("SELECT id, body FROM \"{table}\""))
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|r| Ok((r.try_get("id")?, r.try_get("body")?)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_sync_whose_connections_are_killed_mid_run_fails_retriably_and_converges_on_the_next_run(
) -> Result<()> {
    let Some((url, admin)) = server().await? else {
        return Ok(());
    };
    let table = unique("killed");
    let app_name = unique("weir_kill_test");
    // weir's pool carries an application name of its own, so that only
    // this test's connections are killed.
    let options = PgConnectOptions::from_str(&url)?.application_name(&app_name);
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await?;
    let dir = tempfile::tempdir()?;
    let app = App::builder("pg-kill")
        .ledger_path(dir.path().join("ledger"))
        .provide_key(&pg(), pool.clone())
        .build()
        .await?;
    let (comps, rows) = (200, 100);

    // Kill every connection of the pool every 5 ms (`WEIR_TEST_KILL_EVERY_MS`)
    // while the first run writes its rows: often enough that some sink calls
    // fail even after their retries.
    let every = Duration::from_millis(
        std::env::var("WEIR_TEST_KILL_EVERY_MS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(5),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let killer = {
        let stop = Arc::clone(&stop);
        let admin = admin.clone();
        let app_name = app_name.clone();
        let table = table.clone();
        tokio::spawn(async move {
            let mut killed = 0u64;
            let mut rounds = 0u64;
            // Fire once the table exists, so that rows are written under
            // fire (killing from the start mostly fails the table's
            // creation, and nothing else happens).
            while !stop.load(Ordering::SeqCst) {
                let exists: std::result::Result<Option<String>, sqlx::Error> =
                    sqlx::query_scalar("SELECT to_regclass($1)::text")
                        .bind(format!("public.\"{table}\""))
                        .fetch_one(&admin)
                        .await;
                if matches!(exists, Ok(Some(_))) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            while !stop.load(Ordering::SeqCst) {
                let res: std::result::Result<Vec<bool>, sqlx::Error> = sqlx::query_scalar(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid() \
                     AND application_name = $1",
                )
                .bind(&app_name)
                .fetch_all(&admin)
                .await;
                rounds += 1;
                killed += res
                    .map(|v| v.into_iter().filter(|k| *k).count() as u64)
                    .unwrap_or(0);
                tokio::time::sleep(every).await;
            }
            (rounds, killed)
        })
    };
    let started = Instant::now();
    let first = sync_pg(&app, &table, comps, rows).await;
    stop.store(true, Ordering::SeqCst);
    let (rounds, killed) = killer.await.map_err(Error::msg)?;
    eprintln!(
        "first run under fire ({killed} connections killed in {rounds} rounds, {:?}): {}",
        started.elapsed(),
        match &first {
            Ok(stats) => format!("completed: {stats:?}"),
            Err(e) => format!("failed: {e}"),
        }
    );
    assert!(
        killed > 0,
        "no connection was killed: the test proved nothing"
    );
    if let Err(err) = &first {
        let failures = err.failed_components();
        assert!(
            !failures.is_empty(),
            "a run error that names no component: {err}"
        );
        for f in failures {
            assert!(
                f.retriable,
                "a killed connection made a permanent failure of {}: {}",
                f.path, f.cause
            );
        }
        assert!(err.is_retriable(), "{err}");
        assert!(!err.to_string().contains("panicked"), "{err}");
    }

    // The next run, left alone, converges exactly.
    let second = sync_pg(&app, &table, comps, rows).await?;
    eprintln!("second run: {second:?}");
    assert_eq!(second.failed_components, 0);
    let want: BTreeMap<String, String> = (0..comps)
        .flat_map(|c| {
            (0..rows).map(move |r| (format!("c{c:03}-r{r:03}"), format!("body of {c}/{r}")))
        })
        .collect();
    let got = pg_rows(&admin, &table).await?;
    assert_eq!(got.len(), want.len());
    assert!(got == want, "the table differs from the declared rows");
    let third = sync_pg(&app, &table, comps, rows).await?;
    assert_eq!(
        (third.created, third.updated, third.deleted),
        (0, 0, 0),
        "{third:?}"
    );

    drop(app);
    pool.close().await;
    sqlx::raw_sql(&format!("DROP TABLE IF EXISTS \"{table}\" CASCADE"))
        .execute(&admin)
        .await?;
    Ok(())
}

// ---------------------------------------------------------------------------
// One poisoned component in ten thousand
// ---------------------------------------------------------------------------

/// What the components did: code runs, and the path of the poisoned one.
#[derive(Default)]
struct Poison {
    runs: AtomicUsize,
    poisoned: Mutex<Option<String>>,
    /// The item whose code fails, while set.
    active: Mutex<Option<u32>>,
}

/// One run of 10,000 memoized components, each declaring one row; the item
/// in `poison.active` returns an error.
async fn sync_poisoned(app: &App, rig: &Rig, poison: &Arc<Poison>) -> Result<UpdateStats> {
    let handler = rig.handler();
    let poison = Arc::clone(poison);
    bounded(app.run(move |ctx| async move {
        let rows = register_root_target_states_provider::<String, _>(&ctx, "poison/rows", handler)?;
        ctx.mount_each_memo(
            0..10_000u32,
            |i| format!("item{i:05}"),
            |i| Ok(*i),
            move |ctx, i| {
                let rows = rows.clone();
                let poison = Arc::clone(&poison);
                async move {
                    poison.runs.fetch_add(1, Ordering::SeqCst);
                    let active = *poison.active.lock().map_err(|_| Error::msg("poisoned"))?;
                    if active == Some(i) {
                        *poison.poisoned.lock().map_err(|_| Error::msg("poisoned"))? =
                            Some(ctx.path().to_string());
                        return Err(Error::msg(format!("item {i} is poisoned")));
                    }
                    declare_target_state(
                        &ctx,
                        rows.target_state(format!("row{i:05}"), format!("v{i}")),
                    )
                }
            },
        )
        .await
    }))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_poisoned_component_in_ten_thousand_fails_alone_is_listed_and_is_the_only_one_run_again(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let poison = Arc::new(Poison::default());
    *poison.active.lock().map_err(|_| Error::msg("poisoned"))? = Some(4242);

    let started = Instant::now();
    let err = err_or(sync_poisoned(&app, &rig, &poison).await, |s| {
        format!("a run with a poisoned component succeeded: {s:?}")
    })?;
    eprintln!("first run of 10,000 components: {:?}", started.elapsed());
    let poisoned_path = poison
        .poisoned
        .lock()
        .map_err(|_| Error::msg("poisoned"))?
        .clone()
        .ok_or_else(|| Error::msg("the poisoned component never ran"))?;
    assert_eq!(failed_paths(&err), vec![poisoned_path.clone()], "{err}");
    assert!(err.to_string().contains("item 4242 is poisoned"), "{err}");
    assert_eq!(poison.runs.load(Ordering::SeqCst), 10_000);
    let store = rig.store.snapshot();
    assert_eq!(store.len(), 9_999, "every other row landed");
    assert!(!store.contains_key("row04242"));

    let report = app.inspect().await?;
    let listed: Vec<String> = report.failures.iter().map(|(p, _)| p.to_string()).collect();
    assert_eq!(listed, vec![poisoned_path.clone()], "{:?}", report.failures);
    assert!(
        report.failures[0].1.contains("poisoned"),
        "{:?}",
        report.failures
    );

    // Poison removed: only the failed component runs again.
    *poison.active.lock().map_err(|_| Error::msg("poisoned"))? = None;
    poison.runs.store(0, Ordering::SeqCst);
    let started = Instant::now();
    let stats = sync_poisoned(&app, &rig, &poison).await?;
    eprintln!("second run: {stats:?} in {:?}", started.elapsed());
    assert_eq!(
        poison.runs.load(Ordering::SeqCst),
        1,
        "only the failed component ran"
    );
    assert_eq!(stats.memoized, 9_999, "{stats:?}");
    assert_eq!(stats.created, 1, "{stats:?}");
    let store = rig.store.snapshot();
    assert_eq!(store.len(), 10_000);
    assert_eq!(store.get("row04242").map(String::as_str), Some("v4242"));
    assert!(app.inspect().await?.failures.is_empty());
    Ok(())
}
