//! Model-based property test of the engine: random sequences of runs, each
//! a plan of components (mounted with `mount_each` under the root) that
//! declare rows through one shared root provider, with sink calls failing
//! for some keys. After every run, every component that did not fail must
//! have exactly its declared rows in the external store; after a final
//! clean run of the last plan, the store must equal exactly that plan's rows.
//!
//! `tests/engine_model_containers` extends this model to nested
//! containers, child invalidations, container generations, and failing
//! components.
//!
//! `PROPTEST_CASES` raises the number of cases (default 256); the seed is
//! fixed unless `PROPTEST_RNG_SEED` gives another.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use support::*;
use weir::prelude::*;

/// The provider every component declares its rows through.
const ROWS: &str = "model/row";
const COMPONENTS: usize = 5;
const KEYS: usize = 10;
const VALUES: usize = 4;
const MAX_RUNS: usize = 5;
/// How long one run may take before it counts as a hang.
const RUN_LIMIT: Duration = Duration::from_secs(10);

/// One run: which component declares which key with which value (a key is
/// declared by at most one component), which components are mounted, and
/// which keys make any sink call containing them fail.
#[derive(Clone)]
struct Plan {
    /// component index -> (key index -> value index); every mounted
    /// component is present, possibly with no rows.
    comps: BTreeMap<usize, BTreeMap<usize, usize>>,
    failing: BTreeSet<usize>,
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{")?;
        for (i, (c, rows)) in self.comps.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "c{c}: [")?;
            for (j, (k, v)) in rows.iter().enumerate() {
                if j > 0 {
                    write!(f, " ")?;
                }
                write!(f, "k{k}=v{v}")?;
            }
            write!(f, "]")?;
        }
        if !self.failing.is_empty() {
            let keys: Vec<String> = self.failing.iter().map(|k| format!("k{k}")).collect();
            write!(f, " | failing: {}", keys.join(" "))?;
        }
        write!(f, "}}")
    }
}

impl Plan {
    /// The rows a component declares, as store entries.
    fn rows_of(&self, c: usize) -> Vec<(String, String)> {
        self.comps
            .get(&c)
            .map(|rows| {
                rows.iter()
                    .map(|(k, v)| (format!("k{k}"), format!("v{v}")))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every declared row of this plan.
    fn all_rows(&self) -> BTreeMap<String, String> {
        self.comps.keys().flat_map(|c| self.rows_of(*c)).collect()
    }

    fn without_failures(&self) -> Plan {
        Plan {
            comps: self.comps.clone(),
            failing: BTreeSet::new(),
        }
    }
}

fn plan_strategy() -> impl Strategy<Value = Plan> {
    (
        // per key: not declared, or (component, value)
        prop::collection::vec(
            prop::option::weighted(0.7, (0..COMPONENTS, 0..VALUES)),
            KEYS,
        ),
        // components mounted even without rows
        prop::collection::vec(prop::bool::weighted(0.3), COMPONENTS),
        prop::option::weighted(0.5, prop::collection::btree_set(0..KEYS, 1..=3)),
    )
        .prop_map(|(assign, mounted, failing)| {
            let mut comps: BTreeMap<usize, BTreeMap<usize, usize>> = BTreeMap::new();
            for (c, m) in mounted.iter().enumerate() {
                if *m {
                    comps.entry(c).or_default();
                }
            }
            for (k, a) in assign.iter().enumerate() {
                if let Some((c, v)) = a {
                    comps.entry(*c).or_default().insert(k, *v);
                }
            }
            Plan {
                comps,
                failing: failing.unwrap_or_default(),
            }
        })
}

/// One test case: the retry policy's attempts and the sequence of runs.
#[derive(Clone, Debug)]
struct Case {
    max_attempts: u32,
    /// Declarations a component sends to the reconcilers while it runs.
    reconcile_chunk: usize,
    /// Actions per sink call (a component dispatches a batch at a time).
    max_actions: usize,
    runs: Vec<Plan>,
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (
        1u32..=2,
        prop_oneof![Just(1usize), Just(2), Just(3), Just(4096)],
        prop_oneof![Just(1usize), Just(2), Just(4096)],
        prop::collection::vec(plan_strategy(), 1..=MAX_RUNS),
    )
        .prop_map(|(max_attempts, reconcile_chunk, max_actions, runs)| Case {
            max_attempts,
            reconcile_chunk,
            max_actions,
            runs,
        })
}

fn fail(msg: impl fmt::Display) -> TestCaseError {
    TestCaseError::fail(msg.to_string())
}

/// Runs `plan` once: the root registers the provider and mounts one
/// component per entry of the plan with `mount_each`. Returns the paths of
/// the failed components (empty when the run succeeded).
async fn run_plan(
    app: &App,
    handler: &RowHandler,
    failing_now: &Arc<Mutex<BTreeSet<String>>>,
    plan: &Plan,
) -> std::result::Result<BTreeSet<String>, TestCaseError> {
    {
        let mut f = failing_now.lock().map_err(|_| fail("poisoned"))?;
        *f = plan.failing.iter().map(|k| format!("k{k}")).collect();
    }
    let items: Vec<(usize, Vec<(String, String)>)> =
        plan.comps.keys().map(|c| (*c, plan.rows_of(*c))).collect();
    let handler = handler.clone();
    let fut = app.run(move |ctx| async move {
        let provider =
            register_root_target_states_provider::<String, RowHandler>(&ctx, ROWS, handler)?;
        ctx.mount_each(
            items,
            |(c, _)| format!("c{c}"),
            move |c, (_, rows)| {
                let p = provider.clone();
                async move { declare_into(&c, &p, rows) }
            },
        )
        .await
    });
    let result = tokio::time::timeout(RUN_LIMIT, fut).await.map_err(|_| {
        fail(format!(
            "the run of {plan:?} did not finish within {RUN_LIMIT:?}"
        ))
    })?;
    match result {
        Ok(_) => Ok(BTreeSet::new()),
        Err(e) => {
            let failed: BTreeSet<String> = e
                .failed_components()
                .iter()
                .map(|f| f.path.to_string())
                .collect();
            if failed.is_empty() {
                return Err(fail(format!(
                    "the run of {plan:?} failed without failed components: {e}"
                )));
            }
            Ok(failed)
        }
    }
}

async fn check_case(case: Case) -> std::result::Result<(), TestCaseError> {
    let dir = tempfile::tempdir().map_err(fail)?;
    let attempts = case.max_attempts;
    let chunk = case.reconcile_chunk;
    let max_actions = case.max_actions;
    let app = app_with(dir.path(), move |b| {
        b.reconcile_chunk(chunk)
            .batch_policy(BatchPolicy {
                max_actions,
                linger: Duration::from_millis(5),
            })
            .retry_policy(RetryPolicy {
                max_attempts: attempts,
                initial_backoff: Duration::from_millis(1),
                max_backoff: Duration::from_millis(2),
                call_timeout: Some(Duration::from_secs(5)),
            })
    })
    .await
    .map_err(fail)?;

    let failing_now: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let failing_in = Arc::clone(&failing_now);
    let fail_fn: FailFn = Arc::new(move |_n, keys: &[String]| {
        let failing = failing_in.lock().ok()?;
        keys.iter()
            .find(|k| failing.contains(*k))
            .map(|k| format!("the sink refuses {k}"))
    });
    let rig = Rig::failing(fail_fn);
    let handler = rig.handler();

    let Some(last) = case.runs.last().cloned() else {
        return Ok(());
    };
    let mut runs = case.runs.clone();
    runs.push(last.without_failures());
    let final_index = runs.len() - 1;

    for (i, plan) in runs.iter().enumerate() {
        let failed = run_plan(&app, &handler, &failing_now, plan).await?;
        let store = rig.store.snapshot();
        if i == final_index {
            prop_assert!(
                failed.is_empty(),
                "final clean run {:?} (run {}) failed components {:?}",
                plan,
                i,
                failed
            );
            prop_assert_eq!(
                &store,
                &plan.all_rows(),
                "after the final clean run {:?} the store is not exactly its rows",
                plan
            );
        } else {
            for c in plan.comps.keys() {
                if failed.contains(&format!("/c{c}")) {
                    continue;
                }
                for (k, v) in plan.rows_of(*c) {
                    prop_assert_eq!(
                        store.get(&k),
                        Some(&v),
                        "run {} {:?}: c{} did not fail (failed: {:?}) but row {} is not {} in store {:?}",
                        i,
                        plan,
                        c,
                        failed,
                        k,
                        v,
                        store
                    );
                }
            }
        }
    }
    drop(app);
    Ok(())
}

proptest! {
    #![proptest_config(model_test_config(256))]

    #[test]
    fn store_follows_the_declared_rows(case in case_strategy()) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(fail)?;
        rt.block_on(check_case(case))?;
    }
}
