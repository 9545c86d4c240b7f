//! Recording helpers: what sinks applied (`Log`, `Store`), a recording row
//! sink, and what a watched `RowHandler` saw in each `reconcile` call.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use weir::prelude::*;

use super::RowAction;

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
    /// Records one call's entries.
    pub fn push_call(&self, entries: Vec<String>) -> Result<()> {
        self.calls
            .lock()
            .map_err(|_| Error::msg("poisoned"))?
            .push(entries);
        Ok(())
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

/// `"create"`, `"update"` or `"delete"`.
pub fn verb_of<A>(action: &TargetAction<A>) -> &'static str {
    match action {
        TargetAction::Create(_) => "create",
        TargetAction::Update(_) => "update",
        TargetAction::Delete(_) => "delete",
    }
}

/// Applies row actions to `store` and logs them as one call of `log`.
pub fn apply_rows(log: &Log, store: &Store, actions: Vec<TargetAction<RowAction>>) -> Result<()> {
    apply_rows_observed(log, store, actions, |_| Ok(()))
}

/// As [`apply_rows`], also handing each entry to `observe` as it is applied
/// (with the store still locked); an error from `observe` stops the call
/// before it is logged.
pub fn apply_rows_observed(
    log: &Log,
    store: &Store,
    actions: Vec<TargetAction<RowAction>>,
    mut observe: impl FnMut(&str) -> Result<()>,
) -> Result<()> {
    let mut entries = Vec::new();
    let mut rows = store.rows.lock().map_err(|_| Error::msg("poisoned"))?;
    for action in actions {
        let verb = verb_of(&action);
        let row = action.into_inner();
        let entry = match &row.value {
            Some(v) => {
                rows.insert(row.key.clone(), v.clone());
                format!("{verb} {}={v}", row.key)
            }
            None => {
                rows.remove(&row.key);
                format!("{verb} {}", row.key)
            }
        };
        observe(&entry)?;
        entries.push(entry);
    }
    drop(rows);
    log.push_call(entries)
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
            apply_rows(&log, &store, actions)
        }
    })
}

/// What one `reconcile` call of a watched `RowHandler` received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub key: String,
    pub desired: Option<String>,
    /// The previous records, sorted.
    pub prev: Vec<String>,
    pub prev_may_be_missing: bool,
}
