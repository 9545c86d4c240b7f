//! Shared helpers: an in-memory key-value target whose sink records every
//! call, the runs that declare into it, and error helpers.

mod tables;

pub(crate) use tables::*;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use weir::prelude::*;

pub(crate) const LIMIT: Duration = Duration::from_secs(60);
pub(crate) const KV: &str = "acc/kv";
pub(crate) const TABLES: &str = "acc/tables";

// ---------------------------------------------------------------------------
// Helpers: an in-memory key-value target.
// ---------------------------------------------------------------------------

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) async fn bounded<T>(fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(LIMIT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("the engine did not finish within {LIMIT:?}"),
    }
}

pub(crate) fn k(s: &str) -> StableKey {
    s.into_stable_key()
}

pub(crate) fn rows(pairs: &[(&str, &str)]) -> Vec<(StableKey, String)> {
    pairs.iter().map(|(a, b)| (k(a), b.to_string())).collect()
}

pub(crate) fn smap(pairs: &[(&str, &str)]) -> BTreeMap<StableKey, String> {
    pairs.iter().map(|(a, b)| (k(a), b.to_string())).collect()
}

/// One mutation of the key-value target. `value: None` is a delete.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Put {
    pub(crate) key: StableKey,
    pub(crate) value: Option<String>,
}

pub(crate) fn verb<A>(a: &TargetAction<A>) -> &'static str {
    match a {
        TargetAction::Create(_) => "create",
        TargetAction::Update(_) => "update",
        TargetAction::Delete(_) => "delete",
    }
}

pub(crate) fn payload<A>(a: TargetAction<A>) -> A {
    match a {
        TargetAction::Create(x) | TargetAction::Update(x) | TargetAction::Delete(x) => x,
    }
}

/// One applied action, as the external system saw it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Applied {
    pub(crate) verb: &'static str,
    pub(crate) key: StableKey,
    pub(crate) value: Option<String>,
}

pub(crate) fn ap(verb: &'static str, key: &str, value: Option<&str>) -> Applied {
    Applied {
        verb,
        key: k(key),
        value: value.map(str::to_string),
    }
}

/// What one `reconcile` call received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) key: StableKey,
    pub(crate) desired: Option<String>,
    pub(crate) prev: Vec<String>,
    pub(crate) missing: bool,
}

pub(crate) type FailFn = Arc<dyn Fn(&[StableKey]) -> Option<Error> + Send + Sync>;

/// The external system plus everything its sink and handler saw.
#[derive(Clone, Default)]
pub(crate) struct Ext {
    pub(crate) store: Arc<Mutex<BTreeMap<StableKey, String>>>,
    /// Successful calls, each the list of actions applied.
    pub(crate) applied: Arc<Mutex<Vec<Vec<Applied>>>>,
    /// Every call (failed ones too), each the list of keys it carried.
    pub(crate) attempts: Arc<Mutex<Vec<Vec<StableKey>>>>,
    pub(crate) fail: Arc<Mutex<Option<FailFn>>>,
    pub(crate) seen: Arc<Mutex<Vec<Seen>>>,
}

impl Ext {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn sink(&self) -> TargetActionSink<Put> {
        let ext = self.clone();
        TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<Put>>| {
            let ext = ext.clone();
            async move {
                let keys: Vec<StableKey> = actions
                    .iter()
                    .map(|a| match a {
                        TargetAction::Create(p)
                        | TargetAction::Update(p)
                        | TargetAction::Delete(p) => p.key.clone(),
                    })
                    .collect();
                lock(&ext.attempts).push(keys.clone());
                let fail = lock(&ext.fail).clone();
                if let Some(f) = fail {
                    if let Some(e) = f(&keys) {
                        return Err(e);
                    }
                }
                ext.apply(actions);
                Ok(())
            }
        })
    }

    /// Applies `actions` to the store and records them as one successful
    /// call.
    pub(crate) fn apply(&self, actions: Vec<TargetAction<Put>>) {
        let mut store = lock(&self.store);
        let mut call = Vec::new();
        for a in actions {
            let v = verb(&a);
            let p = payload(a);
            match &p.value {
                Some(val) => store.insert(p.key.clone(), val.clone()),
                None => store.remove(&p.key),
            };
            call.push(Applied {
                verb: v,
                key: p.key,
                value: p.value,
            });
        }
        drop(store);
        lock(&self.applied).push(call);
    }

    pub(crate) fn handler(&self) -> Kv {
        Kv {
            sink: self.sink(),
            seen: self.seen.clone(),
        }
    }

    /// Calls carrying any of `keys` fail (retriably), applying nothing.
    pub(crate) fn fail_keys(&self, keys: &[StableKey]) {
        let keys: BTreeSet<StableKey> = keys.iter().cloned().collect();
        *lock(&self.fail) = Some(Arc::new(move |call: &[StableKey]| {
            call.iter()
                .find(|c| keys.contains(c))
                .map(|c| Error::msg(format!("the target rejects key {c}")))
        }));
    }

    pub(crate) fn fail_with(
        &self,
        f: impl Fn(&[StableKey]) -> Option<Error> + Send + Sync + 'static,
    ) {
        *lock(&self.fail) = Some(Arc::new(f));
    }

    pub(crate) fn heal(&self) {
        *lock(&self.fail) = None;
    }

    pub(crate) fn store(&self) -> BTreeMap<StableKey, String> {
        lock(&self.store).clone()
    }

    /// Every applied action since the last `clear`, sorted.
    pub(crate) fn applied(&self) -> Vec<Applied> {
        let mut all: Vec<Applied> = lock(&self.applied).iter().flatten().cloned().collect();
        all.sort();
        all
    }

    pub(crate) fn calls(&self) -> usize {
        lock(&self.applied).len()
    }

    pub(crate) fn attempts(&self) -> Vec<Vec<StableKey>> {
        lock(&self.attempts).clone()
    }

    pub(crate) fn seen(&self, key: &StableKey) -> Vec<Seen> {
        lock(&self.seen)
            .iter()
            .filter(|s| &s.key == key)
            .cloned()
            .collect()
    }

    pub(crate) fn clear(&self) {
        lock(&self.applied).clear();
        lock(&self.attempts).clear();
        lock(&self.seen).clear();
    }
}

/// The reference design's row handler over `Put`: full CRUD with no-change
/// detection; the tracking record is the value. The value `"!err"` makes
/// `reconcile` fail.
pub(crate) struct Kv {
    pub(crate) sink: TargetActionSink<Put>,
    pub(crate) seen: Arc<Mutex<Vec<Seen>>>,
}

pub(crate) fn kv_reconcile(
    sink: &TargetActionSink<Put>,
    seen: &Mutex<Vec<Seen>>,
    key: StableKey,
    desired: Option<String>,
    prev: Vec<String>,
    missing: bool,
) -> Result<Option<TargetReconcileOutput<Put, String>>> {
    let mut sorted = prev.clone();
    sorted.sort();
    lock(seen).push(Seen {
        key: key.clone(),
        desired: desired.clone(),
        prev: sorted,
        missing,
    });
    let action = match &desired {
        Some(v) if v == "!err" => return Err(Error::msg("the kv handler refuses \"!err\"")),
        Some(v) if !missing && !prev.is_empty() && prev.iter().all(|p| p == v) => return Ok(None),
        Some(v) if prev.is_empty() => TargetAction::Create(Put {
            key,
            value: Some(v.clone()),
        }),
        Some(v) => TargetAction::Update(Put {
            key,
            value: Some(v.clone()),
        }),
        None if prev.is_empty() && !missing => return Ok(None),
        None => TargetAction::Delete(Put { key, value: None }),
    };
    Ok(Some(TargetReconcileOutput {
        action,
        sink: sink.clone(),
        tracking_record: desired,
        child_invalidation: None,
    }))
}

impl TargetHandler<String> for Kv {
    type TrackingRecord = String;
    type Action = Put;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<String>,
        prev: Vec<String>,
        missing: bool,
    ) -> Result<Option<TargetReconcileOutput<Put, String>>> {
        kv_reconcile(&self.sink, &self.seen, key, desired, prev, missing)
    }
}

/// The same target for `i64` values (stored as their decimal text).
pub(crate) struct KvNum {
    pub(crate) sink: TargetActionSink<Put>,
    pub(crate) seen: Arc<Mutex<Vec<Seen>>>,
}

impl TargetHandler<i64> for KvNum {
    type TrackingRecord = String;
    type Action = Put;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<i64>,
        prev: Vec<String>,
        missing: bool,
    ) -> Result<Option<TargetReconcileOutput<Put, String>>> {
        kv_reconcile(
            &self.sink,
            &self.seen,
            key,
            desired.map(|n| n.to_string()),
            prev,
            missing,
        )
    }
}

pub(crate) fn fast_retry(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_backoff: Duration::from_millis(2),
        max_backoff: Duration::from_millis(10),
        call_timeout: Some(Duration::from_secs(20)),
    }
}

pub(crate) async fn open_with(dir: &Path, f: impl FnOnce(AppBuilder) -> AppBuilder) -> Result<App> {
    let b = App::builder("accept")
        .ledger_path(dir.join("ledger"))
        .shards(3)
        .retry_policy(fast_retry(4));
    bounded(f(b).build()).await
}

pub(crate) async fn open(dir: &Path) -> Result<App> {
    open_with(dir, |b| b).await
}

pub(crate) type Comps = Vec<(StableKey, Vec<(StableKey, String)>)>;

pub(crate) fn comps(list: &[(&str, &[(&str, &str)])]) -> Comps {
    list.iter().map(|(c, r)| (k(c), rows(r))).collect()
}

/// Mounts one child component of `ctx` per entry of `comps`, each declaring
/// its rows through `p`. A row whose value is `"!code-fails"` makes its
/// component fail in its own code, before it declares that row or any after
/// it.
pub(crate) async fn mount_comps(
    ctx: &Ctx,
    p: TargetStateProvider<String>,
    comps: Comps,
) -> Result<()> {
    ctx.mount_each(
        comps,
        |(c, _): &(StableKey, Vec<(StableKey, String)>)| c.clone(),
        move |c, (_, rows)| {
            let p = p.clone();
            async move {
                for (key, v) in rows {
                    if v == "!code-fails" {
                        return Err(Error::msg("the component's own code failed"));
                    }
                    declare_target_state(&c, p.target_state(key, v))?;
                }
                Ok(())
            }
        },
    )
    .await
}

/// One run: the root registers the kv provider and mounts one child
/// component per entry of `comps`, each declaring its rows (`mount_comps`).
pub(crate) async fn run_comps(app: &App, ext: &Ext, comps: Comps) -> Result<UpdateStats> {
    let handler = ext.handler();
    bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        mount_comps(&ctx, p, comps).await
    }))
    .await
}

/// As `run_comps`, with failed components reported rather than an error.
pub(crate) async fn report_comps(app: &App, ext: &Ext, comps: Comps) -> Result<RunReport> {
    let handler = ext.handler();
    bounded(app.run_report(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        mount_comps(&ctx, p, comps).await
    }))
    .await
}

/// One run: the root declares `rows` itself.
pub(crate) async fn run_flat(
    app: &App,
    ext: &Ext,
    rows: Vec<(StableKey, String)>,
) -> Result<UpdateStats> {
    let handler = ext.handler();
    bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        for (key, v) in rows {
            declare_target_state(&ctx, p.target_state(key, v))?;
        }
        Ok(())
    }))
    .await
}

/// A fresh ledger directory, an App on it, and an empty target. Keep the
/// directory alive for as long as the App is used.
pub(crate) async fn fresh() -> Result<(tempfile::TempDir, App, Ext)> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    Ok((dir, app, Ext::new()))
}

/// Asserts that nothing reached `ext`'s sink since its last `clear`.
#[track_caller]
pub(crate) fn assert_no_calls(ext: &Ext) {
    assert_eq!(ext.calls(), 0, "{:?}", ext.applied());
}

/// How many times each key was applied since the last `clear`.
pub(crate) fn applications_per_key(ext: &Ext) -> BTreeMap<StableKey, usize> {
    let mut per_key: BTreeMap<StableKey, usize> = BTreeMap::new();
    for a in ext.applied() {
        *per_key.entry(a.key).or_default() += 1;
    }
    per_key
}

/// The counts of a run: created, updated, deleted, unchanged, failed
/// components.
pub(crate) fn counts(s: &UpdateStats) -> (u64, u64, u64, u64, u64) {
    (
        s.created,
        s.updated,
        s.deleted,
        s.unchanged,
        s.failed_components,
    )
}

/// Each key with a distinct value `v0`, `v1`, ... by position.
pub(crate) fn numbered(keys: &[StableKey]) -> Vec<(StableKey, String)> {
    keys.iter()
        .enumerate()
        .map(|(i, key)| (key.clone(), format!("v{i}")))
        .collect()
}

/// `n` components `Int(0..n)`, each declaring one row of its own key with
/// `value`.
pub(crate) fn one_row_each(n: i64, value: &str) -> Comps {
    (0..n)
        .map(|c| {
            (
                StableKey::Int(c),
                vec![(StableKey::Int(c), value.to_string())],
            )
        })
        .collect()
}

pub(crate) fn failed_paths(err: &Error) -> Vec<String> {
    let mut v: Vec<String> = err
        .failed_components()
        .iter()
        .map(|f| f.path.to_string())
        .collect();
    v.sort();
    v
}

pub(crate) fn expect_err<T: std::fmt::Debug>(r: Result<T>) -> Error {
    match r {
        Ok(v) => panic!("expected the run to fail, it returned {v:?}"),
        Err(e) => e,
    }
}

pub(crate) fn report_paths(r: &RunReport) -> Vec<String> {
    let mut v: Vec<String> = r.failures.iter().map(|f| f.path.to_string()).collect();
    v.sort();
    v
}

pub(crate) struct Main {
    pub(crate) sink: TargetActionSink<Put>,
    pub(crate) seen: Arc<Mutex<Vec<Seen>>>,
    pub(crate) att: Ext,
}

impl TargetHandler<String> for Main {
    type TrackingRecord = String;
    type Action = Put;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<String>,
        prev: Vec<String>,
        missing: bool,
    ) -> Result<Option<TargetReconcileOutput<Put, String>>> {
        kv_reconcile(&self.sink, &self.seen, key, desired, prev, missing)
    }

    fn attachments(&self) -> Result<Vec<(String, ChildTargetDef)>> {
        Ok(vec![(
            "index".to_string(),
            ChildTargetDef::new::<String, _>(self.att.handler()),
        )])
    }
}

pub(crate) fn preview_summary(actions: &[PreviewAction]) -> Vec<(String, StableKey, &'static str)> {
    let mut v: Vec<(String, StableKey, &'static str)> = actions
        .iter()
        .map(|a| {
            (
                a.provider.clone(),
                a.key.clone(),
                match a.kind {
                    ActionKind::Create => "create",
                    ActionKind::Update => "update",
                    ActionKind::Delete => "delete",
                },
            )
        })
        .collect();
    v.sort();
    v
}

/// As `run_comps`, as a preview: what the run would do, applying nothing.
pub(crate) async fn preview_comps(
    app: &App,
    ext: &Ext,
    comps: Comps,
) -> Result<Vec<PreviewAction>> {
    let handler = ext.handler();
    bounded(app.preview(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        mount_comps(&ctx, p, comps).await
    }))
    .await
}
