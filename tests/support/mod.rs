//! Shared helpers for the integration tests: a recording row handler in
//! the shape of the reference design's test connector, and app builders.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use weir::prelude::*;

/// One row mutation. `value: None` is a delete.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RowAction {
    pub key: String,
    pub value: Option<String>,
}

/// What a recording sink saw: one entry per call, each a list of
/// `"<verb> <key>[=<value>]"`.
#[derive(Clone, Default)]
pub struct Log {
    pub calls: Arc<Mutex<Vec<Vec<String>>>>,
}

impl Log {
    pub fn calls(&self) -> Vec<Vec<String>> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }
    pub fn entries(&self) -> Vec<String> {
        let mut all: Vec<String> = self.calls().into_iter().flatten().collect();
        all.sort();
        all
    }
    pub fn call_count(&self) -> usize {
        self.calls().len()
    }
    pub fn clear(&self) {
        if let Ok(mut c) = self.calls.lock() {
            c.clear();
        }
    }
}

pub fn key_str(key: &StableKey) -> String {
    match key {
        StableKey::Str(s) => s.to_string(),
        other => other.to_string(),
    }
}

/// A store that a recording sink writes to: the external system.
#[derive(Clone, Default)]
pub struct Store {
    pub rows: Arc<Mutex<BTreeMap<String, String>>>,
}

impl Store {
    pub fn snapshot(&self) -> BTreeMap<String, String> {
        self.rows.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

/// Decides whether a call fails: given the call number (from 0) and the
/// keys in it.
pub type FailFn = Arc<dyn Fn(usize, &[String]) -> Option<String> + Send + Sync>;

/// A sink that logs each call, applies it to `store`, and fails calls for
/// which `fail` returns a message (applying nothing of that call).
pub fn recording_sink(log: Log, store: Store, fail: Option<FailFn>) -> TargetActionSink<RowAction> {
    let counter = Arc::new(AtomicUsize::new(0));
    TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<RowAction>>| {
        let log = log.clone();
        let store = store.clone();
        let fail = fail.clone();
        let n = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            let keys: Vec<String> = actions.iter().map(|a| a.inner().key.clone()).collect();
            if let Some(f) = &fail {
                if let Some(msg) = f(n, &keys) {
                    return Err(Error::msg(msg));
                }
            }
            let mut entries = Vec::new();
            let mut rows = store.rows.lock().map_err(|_| Error::msg("poisoned"))?;
            for action in actions {
                let (verb, row) = match action {
                    TargetAction::Create(r) => ("create", r),
                    TargetAction::Update(r) => ("update", r),
                    TargetAction::Delete(r) => ("delete", r),
                };
                match &row.value {
                    Some(v) => {
                        rows.insert(row.key.clone(), v.clone());
                        entries.push(format!("{verb} {}={v}", row.key));
                    }
                    None => {
                        rows.remove(&row.key);
                        entries.push(format!("{verb} {}", row.key));
                    }
                }
            }
            drop(rows);
            log.calls
                .lock()
                .map_err(|_| Error::msg("poisoned"))?
                .push(entries);
            Ok(())
        }
    })
}

/// A flat row handler with full CRUD and no-change detection; the tracking
/// record is the row value itself.
#[derive(Clone)]
pub struct RowHandler {
    pub sink: TargetActionSink<RowAction>,
    pub reconcile_calls: Arc<AtomicUsize>,
}

impl RowHandler {
    pub fn new(sink: TargetActionSink<RowAction>) -> Self {
        Self {
            sink,
            reconcile_calls: Arc::new(AtomicUsize::new(0)),
        }
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
    pub fn handler(&self) -> RowHandler {
        RowHandler::new(recording_sink(
            self.log.clone(),
            self.store.clone(),
            self.fail.clone(),
        ))
    }
}

/// An app on a ledger in `dir`, with quick retries for tests.
pub async fn app(dir: &Path) -> Result<App> {
    app_with(dir, |b| b).await
}

pub async fn app_with(dir: &Path, f: impl FnOnce(AppBuilder) -> AppBuilder) -> Result<App> {
    let builder = App::builder("test")
        .ledger_path(dir.join("ledger"))
        .shards(3)
        .retry_policy(RetryPolicy {
            max_attempts: 4,
            initial_backoff: std::time::Duration::from_millis(5),
            max_backoff: std::time::Duration::from_millis(20),
            call_timeout: Some(std::time::Duration::from_secs(10)),
        });
    f(builder).build().await
}

/// Declares `rows` as flat states of provider `name` in the component `ctx`.
pub fn declare_rows(
    ctx: &Ctx,
    name: &str,
    handler: RowHandler,
    rows: &[(&str, &str)],
) -> Result<()> {
    let provider = register_root_target_states_provider(ctx, name, handler)?;
    for (k, v) in rows {
        declare_target_state(ctx, provider.target_state(*k, v.to_string()))?;
    }
    Ok(())
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
