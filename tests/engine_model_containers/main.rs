//! Model-based property test of the engine with containers: random
//! sequences of runs, each a plan of components (mounted with `mount_each`
//! under the root), checked after every run against a model that predicts
//! the external system's exact state, or the precise set of states the
//! engine may legitimately leave. (`tests/engine_model.rs` is the flat
//! model: rows through one root provider, and failing sinks.)
//!
//! What the generator produces (`plan`), and the model covers (`model`):
//!
//! - rows declared at the root, through one root provider;
//! - containers mounted with `mount_target` (`A`, `B`, `C`), each holding
//!   rows and up to two nested containers (`A/x`, `A/y`) with rows of their
//!   own: two levels. One handler serves every level (`rig`): each level
//!   has a container sink of its own, whose child-handler factory builds
//!   the next level's handler, and the rows of every container share one
//!   sink. The external store holds every level (`k1`, `A`, `A/k1`, `A/x`,
//!   `A/x/k1`; a container's value there is its generation);
//! - a container's generation changing between runs, its handler answering
//!   with `Destructive` (the sink drops everything below the container in
//!   the store, at any depth: the engine must create every row and nested
//!   container below again) or `Lossy` (the sink drops a pseudo-random
//!   subset of everything below: the engine must write all of it again);
//!   and the child provider's generation this moves on, seen through its
//!   `memo_key()`: it must change (to a key the container never gave) when
//!   the generation surely moved on (a new container, a changed one, one
//!   left maybe missing by a failed action, or below a container whose
//!   generation moved on), and must stay when nothing could move it;
//! - containers no longer declared (deleted with everything below; only
//!   the topmost of nested orphans is deleted), and declared again; rows
//!   and containers moving between components;
//! - sink calls failing for some paths: rows at any level, and containers
//!   (a failing container fails its `mount_target`, its refresh, and its
//!   delete). Where the engine may or may not have applied an action (the
//!   actions of a component whose commit failed: batching decides which of
//!   them shared the failing call), the model allows both values, and the
//!   observed store resolves the choice for the next run;
//! - components whose code returns `Err`: before mounting anything, after
//!   mounting their containers, or after declaring their rows. Such a
//!   component applies and deletes nothing of its own (API guarantee 13),
//!   while what its `mount_target` calls committed stays committed;
//! - the engine's settings: retry attempts, declarations sent to the
//!   reconcilers while a component runs, actions per sink call.
//!
//! The model simulates what the engine tracks (which component holds each
//! state, whether its records still count below a destroyed or new
//! container, a container's possible records, and whether its child
//! generation is clean), and predicts each run from the failures the run
//! reports: a component reported failed must have a reason to fail (a
//! failing path among its rows or deletions, or its code's `Err`), and one
//! whose code returned `Err` must be reported failed. After a final clean
//! run of the last plan (no failing paths or components), the store must
//! equal exactly that plan.
//!
//! Not covered here: `declare_target_state_with_child`, attachments,
//! crashes and cancellation (other tests cover those).
//!
//! `PROPTEST_CASES` raises the number of cases (default 96); the seed is
//! fixed unless `PROPTEST_RNG_SEED` gives another.

#[path = "../support/mod.rs"]
mod support;

mod model;
mod plan;
mod rig;

use std::collections::BTreeSet;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use support::*;
use weir::prelude::*;

use model::Model;
use plan::{case_strategy, Case, DEFAULT_CASES};
use rig::{fail, run_plan, Rigs};

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
    let rigs = Rigs::new();

    let Some(last) = case.runs.last() else {
        return Ok(());
    };
    let mut runs = case.runs.clone();
    runs.push(last.clean());
    let final_index = runs.len() - 1;

    let mut model = Model::default();
    for (i, plan) in runs.iter().enumerate() {
        let reported = run_plan(&app, &rigs, plan).await?;
        let failed: BTreeSet<usize> = reported.keys().copied().collect();
        let store = rigs.ext.store.snapshot();
        let memo_keys = rigs.keys.take()?;
        let next = model
            .after(plan, &failed, &memo_keys, &store)
            .map_err(|e| {
                let causes: Vec<&String> = reported.values().flatten().collect();
                fail(format!(
                    "run {i} of {plan:?}: failed {failed:?}\n  {e}\n  store before: {:?}\n  store after: {store:?}\n  reported failures: {causes:#?}",
                    model.store()
                ))
            })?;
        model = next;
        if i == final_index {
            prop_assert!(
                failed.is_empty(),
                "final clean run {:?} (run {}) failed components: {:?}",
                plan,
                i,
                reported
            );
            prop_assert_eq!(
                &store,
                &plan.expected_store(),
                "after the final clean run {:?} the store is not exactly its plan",
                plan
            );
        }
    }
    drop(app);
    Ok(())
}

proptest! {
    #![proptest_config(model_test_config(DEFAULT_CASES))]

    #[test]
    fn the_store_follows_the_model_with_containers(case in case_strategy()) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(fail)?;
        rt.block_on(check_case(case))?;
    }
}
