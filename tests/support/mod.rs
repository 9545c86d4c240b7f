//! Shared helpers for the integration tests: a recording row handler in
//! the shape of the reference design's test connector, the reference
//! design's container handler, app builders, declaring helpers, small
//! assertion helpers, and the configuration of the model-based property
//! tests. Logs, stores and recording sinks are in `record`, re-exported
//! here.

#![allow(dead_code)]

mod record;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use weir::prelude::*;

pub use record::*;

/// One row mutation. `value: None` is a delete.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RowAction {
    pub key: String,
    pub value: Option<String>,
}

pub fn key_str(key: &StableKey) -> String {
    match key {
        StableKey::Str(s) => s.to_string(),
        other => other.to_string(),
    }
}

/// A flat row handler with full CRUD and no-change detection; the tracking
/// record is the row value itself. A watched one also remembers what each
/// `reconcile` call received, in `seen` (which several handlers may share).
#[derive(Clone)]
pub struct RowHandler {
    pub sink: TargetActionSink<RowAction>,
    pub reconcile_calls: Arc<AtomicUsize>,
    pub seen: Option<Arc<Mutex<Vec<Seen>>>>,
    /// What `unchanged_needs_nothing` answers (false unless set).
    pub unchanged_needs_nothing: bool,
}

impl RowHandler {
    pub fn new(sink: TargetActionSink<RowAction>) -> Self {
        Self {
            sink,
            reconcile_calls: Arc::new(AtomicUsize::new(0)),
            seen: None,
            unchanged_needs_nothing: false,
        }
    }

    /// The same handler, saying that an unchanged state needs nothing (its
    /// `reconcile` returns `None` for a value equal to its only record), so
    /// that components declaring what they declared before skip it.
    pub fn saying_unchanged_needs_nothing(self) -> Self {
        Self {
            unchanged_needs_nothing: true,
            ..self
        }
    }

    /// A handler that records its reconcile calls in a list of its own.
    pub fn watched(sink: TargetActionSink<RowAction>) -> Self {
        Self::watched_into(sink, &Arc::default())
    }

    /// A handler that records its reconcile calls in `seen`.
    pub fn watched_into(sink: TargetActionSink<RowAction>, seen: &Arc<Mutex<Vec<Seen>>>) -> Self {
        Self {
            seen: Some(Arc::clone(seen)),
            ..Self::new(sink)
        }
    }

    /// The recorded reconcile calls for `key`.
    pub fn seen(&self, key: &str) -> Vec<Seen> {
        self.seen
            .as_ref()
            .and_then(|seen| {
                seen.lock()
                    .map(|s| s.iter().filter(|x| x.key == key).cloned().collect())
                    .ok()
            })
            .unwrap_or_default()
    }

    fn record(
        &self,
        key: &StableKey,
        desired: &Option<String>,
        prev: &[String],
        prev_may_be_missing: bool,
    ) -> Result<()> {
        let Some(seen) = &self.seen else {
            return Ok(());
        };
        let mut sorted = prev.to_vec();
        sorted.sort();
        seen.lock().map_err(|_| Error::msg("poisoned"))?.push(Seen {
            key: key_str(key),
            desired: desired.clone(),
            prev: sorted,
            prev_may_be_missing,
        });
        Ok(())
    }
}

impl TargetHandler<String> for RowHandler {
    type TrackingRecord = String;
    type Action = RowAction;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<String>,
        prev: Vec<String>,
        prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<RowAction, String>>> {
        self.record(&key, &desired, &prev, prev_may_be_missing)?;
        self.reconcile_calls.fetch_add(1, Ordering::SeqCst);
        let k = key_str(&key);
        match desired {
            Some(value) => {
                if value == "!reconcile-error" {
                    return Err(Error::msg("the handler refuses this value"));
                }
                let unchanged =
                    !prev_may_be_missing && !prev.is_empty() && prev.iter().all(|p| *p == value);
                if unchanged {
                    return Ok(None);
                }
                let row = RowAction {
                    key: k,
                    value: Some(value.clone()),
                };
                let action = if prev.is_empty() {
                    TargetAction::Create(row)
                } else {
                    TargetAction::Update(row)
                };
                Ok(Some(TargetReconcileOutput {
                    action,
                    sink: self.sink.clone(),
                    tracking_record: Some(value),
                    child_invalidation: None,
                }))
            }
            None => {
                if prev.is_empty() && !prev_may_be_missing {
                    return Ok(None);
                }
                Ok(Some(TargetReconcileOutput {
                    action: TargetAction::Delete(RowAction {
                        key: k,
                        value: None,
                    }),
                    sink: self.sink.clone(),
                    tracking_record: None,
                    child_invalidation: None,
                }))
            }
        }
    }
    fn unchanged_needs_nothing(&self) -> bool {
        self.unchanged_needs_nothing
    }
}

/// A recording setup: log, store and a handler over them.
#[derive(Clone, Default)]
pub struct Rig {
    pub log: Log,
    pub store: Store,
    pub fail: Option<FailFn>,
}

impl Rig {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn failing(fail: FailFn) -> Self {
        Self {
            fail: Some(fail),
            ..Self::default()
        }
    }
    /// A recording sink over this rig's log and store.
    pub fn sink(&self) -> TargetActionSink<RowAction> {
        recording_sink(self.log.clone(), self.store.clone(), self.fail.clone())
    }
    pub fn handler(&self) -> RowHandler {
        RowHandler::new(self.sink())
    }
}

/// A table's tracking record: the declared spec itself.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TableSpec {
    pub generation: String,
}

pub fn spec(generation: &str) -> TableSpec {
    TableSpec {
        generation: generation.to_string(),
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TableAction {
    pub name: String,
    /// Drop and create again: the rows are gone.
    pub recreate: bool,
    pub drop: bool,
}

/// The reference design's container handler: always an action while
/// declared; `invalidation` when the spec changed (a destructive one
/// recreates the table); a destructive delete.
pub struct TableHandler {
    pub sink: TargetActionSink<TableAction>,
    pub invalidation: Option<TargetChildInvalidation>,
}

impl TableHandler {
    pub fn new(
        sink: TargetActionSink<TableAction>,
        invalidation: Option<TargetChildInvalidation>,
    ) -> Self {
        Self { sink, invalidation }
    }
}

impl TargetHandler<TableSpec> for TableHandler {
    type TrackingRecord = TableSpec;
    type Action = TableAction;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<TableSpec>,
        prev: Vec<TableSpec>,
        _prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<TableAction, TableSpec>>> {
        let name = key_str(&key);
        match desired {
            Some(spec) => {
                let changed = !prev.is_empty() && !prev.contains(&spec);
                let invalidation = changed.then_some(self.invalidation).flatten();
                let table = TableAction {
                    name,
                    recreate: invalidation == Some(TargetChildInvalidation::Destructive),
                    drop: false,
                };
                let action = if prev.is_empty() {
                    TargetAction::Create(table)
                } else {
                    TargetAction::Update(table)
                };
                Ok(Some(TargetReconcileOutput {
                    action,
                    sink: self.sink.clone(),
                    tracking_record: Some(spec),
                    child_invalidation: invalidation,
                }))
            }
            None => Ok(Some(TargetReconcileOutput {
                action: TargetAction::Delete(TableAction {
                    name,
                    recreate: false,
                    drop: true,
                }),
                sink: self.sink.clone(),
                tracking_record: None,
                child_invalidation: Some(TargetChildInvalidation::Destructive),
            })),
        }
    }
}

/// An app on a ledger in `dir`, with quick retries for tests.
pub async fn app(dir: &Path) -> Result<App> {
    app_with(dir, |b| b).await
}

pub async fn app_with(dir: &Path, f: impl FnOnce(AppBuilder) -> AppBuilder) -> Result<App> {
    // Small reconcile chunks: components of more than two declarations
    // send some to the reconcilers while they run.
    let builder = App::builder("test")
        .ledger_path(dir.join("ledger"))
        .shards(3)
        .reconcile_chunk(2)
        .retry_policy(RetryPolicy {
            max_attempts: 4,
            initial_backoff: std::time::Duration::from_millis(5),
            max_backoff: std::time::Duration::from_millis(20),
            call_timeout: Some(std::time::Duration::from_secs(10)),
        });
    f(builder).build().await
}

/// Declares each `(key, value)` of `rows` through `provider` in `ctx`.
pub fn declare_into<K, V>(
    ctx: &Ctx,
    provider: &TargetStateProvider<String>,
    rows: impl IntoIterator<Item = (K, V)>,
) -> Result<()>
where
    K: IntoStableKey,
    V: Into<String>,
{
    for (k, v) in rows {
        declare_target_state(ctx, provider.target_state(k, v.into()))?;
    }
    Ok(())
}

/// Registers the provider `name` with `handler` in `ctx` and declares each
/// `(key, value)` of `rows` through it.
pub fn declare_each<H, K, V>(
    ctx: &Ctx,
    name: &str,
    handler: H,
    rows: impl IntoIterator<Item = (K, V)>,
) -> Result<()>
where
    H: TargetHandler<String>,
    K: IntoStableKey,
    V: Into<String>,
{
    let provider = register_root_target_states_provider::<String, H>(ctx, name, handler)?;
    declare_into(ctx, &provider, rows)
}

/// Declares `rows` as flat states of provider `name` in the component `ctx`.
pub fn declare_rows(
    ctx: &Ctx,
    name: &str,
    handler: impl TargetHandler<String>,
    rows: &[(&str, &str)],
) -> Result<()> {
    declare_each(ctx, name, handler, rows.iter().copied())
}

pub fn owned(rows: &[(&str, &str)]) -> Vec<(String, String)> {
    rows.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn map(rows: &[(&str, &str)]) -> BTreeMap<String, String> {
    rows.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The paths of the failed components of an error, sorted.
pub fn failed_paths(err: &Error) -> Vec<String> {
    let mut paths: Vec<String> = err
        .failed_components()
        .iter()
        .map(|f| f.path.to_string())
        .collect();
    paths.sort();
    paths
}

/// The error of `result`; if it succeeded, an error whose message
/// `unexpected` makes from the value.
pub fn err_or<T>(result: Result<T>, unexpected: impl FnOnce(T) -> String) -> Result<Error> {
    match result {
        Ok(v) => Err(Error::msg(unexpected(v))),
        Err(e) => Ok(e),
    }
}

/// The configuration of a model-based property test: `default_cases`
/// cases unless `PROPTEST_CASES` gives another number, and a fixed seed
/// unless `PROPTEST_RNG_SEED` gives one, so that a run is reproducible. No
/// failure persistence: a failing case is reported with its minimal input.
pub fn model_test_config(default_cases: u32) -> proptest::test_runner::Config {
    use proptest::test_runner::{Config, RngSeed};
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_cases);
    let base = Config::default();
    let rng_seed = match base.rng_seed {
        RngSeed::Random => RngSeed::Fixed(0x5745_4952),
        fixed => fixed,
    };
    Config {
        cases,
        rng_seed,
        failure_persistence: None,
        ..base
    }
}
