//! Black-box acceptance tests of the engine's contract (`API.md`, its 14
//! guarantees, and the README's "What weir guarantees" and "Reliability"),
//! written against the public API only, with in-memory targets of our own.
//!
//! Each test names the behaviour it checks. The external system is an
//! in-memory map; the sink records every call it gets (including failed
//! ones) so that each key's applications can be counted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use weir::prelude::*;

const LIMIT: Duration = Duration::from_secs(60);
const KV: &str = "acc/kv";
const TABLES: &str = "acc/tables";

// ---------------------------------------------------------------------------
// Helpers: an in-memory key-value target.
// ---------------------------------------------------------------------------

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn bounded<T>(fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(LIMIT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("the engine did not finish within {LIMIT:?}"),
    }
}

fn k(s: &str) -> StableKey {
    s.into_stable_key()
}

fn rows(pairs: &[(&str, &str)]) -> Vec<(StableKey, String)> {
    pairs.iter().map(|(a, b)| (k(a), b.to_string())).collect()
}

fn smap(pairs: &[(&str, &str)]) -> BTreeMap<StableKey, String> {
    pairs.iter().map(|(a, b)| (k(a), b.to_string())).collect()
}

/// One mutation of the key-value target. `value: None` is a delete.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
struct Put {
    key: StableKey,
    value: Option<String>,
}

fn verb<A>(a: &TargetAction<A>) -> &'static str {
    match a {
        TargetAction::Create(_) => "create",
        TargetAction::Update(_) => "update",
        TargetAction::Delete(_) => "delete",
    }
}

fn payload<A>(a: TargetAction<A>) -> A {
    match a {
        TargetAction::Create(x) | TargetAction::Update(x) | TargetAction::Delete(x) => x,
    }
}

/// One applied action, as the external system saw it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Applied {
    verb: &'static str,
    key: StableKey,
    value: Option<String>,
}

fn ap(verb: &'static str, key: &str, value: Option<&str>) -> Applied {
    Applied {
        verb,
        key: k(key),
        value: value.map(str::to_string),
    }
}

/// What one `reconcile` call received.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    key: StableKey,
    desired: Option<String>,
    prev: Vec<String>,
    missing: bool,
}

type FailFn = Arc<dyn Fn(&[StableKey]) -> Option<Error> + Send + Sync>;

/// The external system plus everything its sink and handler saw.
#[derive(Clone, Default)]
struct Ext {
    store: Arc<Mutex<BTreeMap<StableKey, String>>>,
    /// Successful calls, each the list of actions applied.
    applied: Arc<Mutex<Vec<Vec<Applied>>>>,
    /// Every call (failed ones too), each the list of keys it carried.
    attempts: Arc<Mutex<Vec<Vec<StableKey>>>>,
    fail: Arc<Mutex<Option<FailFn>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Ext {
    fn new() -> Self {
        Self::default()
    }

    fn sink(&self) -> TargetActionSink<Put> {
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
                let mut store = lock(&ext.store);
                let mut call = Vec::new();
                for a in actions {
                    let v = verb(&a);
                    let p = payload(a);
                    match &p.value {
                        Some(val) => {
                            store.insert(p.key.clone(), val.clone());
                        }
                        None => {
                            store.remove(&p.key);
                        }
                    }
                    call.push(Applied {
                        verb: v,
                        key: p.key,
                        value: p.value,
                    });
                }
                drop(store);
                lock(&ext.applied).push(call);
                Ok(())
            }
        })
    }

    fn handler(&self) -> Kv {
        Kv {
            sink: self.sink(),
            seen: self.seen.clone(),
        }
    }

    /// Calls carrying any of `keys` fail (retriably), applying nothing.
    fn fail_keys(&self, keys: &[StableKey]) {
        let keys: BTreeSet<StableKey> = keys.iter().cloned().collect();
        *lock(&self.fail) = Some(Arc::new(move |call: &[StableKey]| {
            call.iter()
                .find(|c| keys.contains(c))
                .map(|c| Error::msg(format!("the target rejects key {c}")))
        }));
    }

    fn fail_with(&self, f: impl Fn(&[StableKey]) -> Option<Error> + Send + Sync + 'static) {
        *lock(&self.fail) = Some(Arc::new(f));
    }

    fn heal(&self) {
        *lock(&self.fail) = None;
    }

    fn store(&self) -> BTreeMap<StableKey, String> {
        lock(&self.store).clone()
    }

    /// Every applied action since the last `clear`, sorted.
    fn applied(&self) -> Vec<Applied> {
        let mut all: Vec<Applied> = lock(&self.applied).iter().flatten().cloned().collect();
        all.sort();
        all
    }

    fn calls(&self) -> usize {
        lock(&self.applied).len()
    }

    fn attempts(&self) -> Vec<Vec<StableKey>> {
        lock(&self.attempts).clone()
    }

    fn seen(&self, key: &StableKey) -> Vec<Seen> {
        lock(&self.seen)
            .iter()
            .filter(|s| &s.key == key)
            .cloned()
            .collect()
    }

    fn clear(&self) {
        lock(&self.applied).clear();
        lock(&self.attempts).clear();
        lock(&self.seen).clear();
    }
}

/// The reference design's row handler over `Put`: full CRUD with no-change
/// detection; the tracking record is the value. The value `"!err"` makes
/// `reconcile` fail.
struct Kv {
    sink: TargetActionSink<Put>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

fn kv_reconcile(
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
struct KvNum {
    sink: TargetActionSink<Put>,
    seen: Arc<Mutex<Vec<Seen>>>,
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

fn fast_retry(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_backoff: Duration::from_millis(2),
        max_backoff: Duration::from_millis(10),
        call_timeout: Some(Duration::from_secs(20)),
    }
}

async fn open_with(dir: &Path, f: impl FnOnce(AppBuilder) -> AppBuilder) -> Result<App> {
    let b = App::builder("accept")
        .ledger_path(dir.join("ledger"))
        .shards(3)
        .retry_policy(fast_retry(4));
    bounded(f(b).build()).await
}

async fn open(dir: &Path) -> Result<App> {
    open_with(dir, |b| b).await
}

type Comps = Vec<(StableKey, Vec<(StableKey, String)>)>;

fn comps(list: &[(&str, &[(&str, &str)])]) -> Comps {
    list.iter().map(|(c, r)| (k(c), rows(r))).collect()
}

/// One run: the root registers the kv provider and mounts one child
/// component per entry of `comps`, each declaring its rows.
async fn run_comps(app: &App, ext: &Ext, comps: Comps) -> Result<UpdateStats> {
    let handler = ext.handler();
    bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        ctx.mount_each(
            comps,
            |(c, _): &(StableKey, Vec<(StableKey, String)>)| c.clone(),
            move |c, (_, rows)| {
                let p = p.clone();
                async move {
                    for (key, v) in rows {
                        declare_target_state(&c, p.target_state(key, v))?;
                    }
                    Ok(())
                }
            },
        )
        .await
    }))
    .await
}

/// As `run_comps`, with failed components reported rather than an error.
async fn report_comps(app: &App, ext: &Ext, comps: Comps) -> Result<RunReport> {
    let handler = ext.handler();
    bounded(app.run_report(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
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
    }))
    .await
}

/// One run: the root declares `rows` itself.
async fn run_flat(app: &App, ext: &Ext, rows: Vec<(StableKey, String)>) -> Result<UpdateStats> {
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

fn failed_paths(err: &Error) -> Vec<String> {
    let mut v: Vec<String> = err
        .failed_components()
        .iter()
        .map(|f| f.path.to_string())
        .collect();
    v.sort();
    v
}

fn expect_err<T: std::fmt::Debug>(r: Result<T>) -> Error {
    match r {
        Ok(v) => panic!("expected the run to fail, it returned {v:?}"),
        Err(e) => e,
    }
}

fn report_paths(r: &RunReport) -> Vec<String> {
    let mut v: Vec<String> = r.failures.iter().map(|f| f.path.to_string()).collect();
    v.sort();
    v
}

// ---------------------------------------------------------------------------
// Helpers: a container target ("tables") whose rows are kv states.
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
struct Spec {
    generation: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
struct TableAct {
    name: String,
    /// Destructive change: the table is dropped and created again.
    recreate: bool,
    /// Lossy change: every row's value is damaged.
    lossy: bool,
}

struct Table {
    sink: TargetActionSink<TableAct>,
    invalidation: Option<TargetChildInvalidation>,
}

impl TargetHandler<Spec> for Table {
    type TrackingRecord = Spec;
    type Action = TableAct;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<Spec>,
        prev: Vec<Spec>,
        _missing: bool,
    ) -> Result<Option<TargetReconcileOutput<TableAct, Spec>>> {
        let name = match &key {
            StableKey::Str(s) => s.to_string(),
            other => other.to_string(),
        };
        match desired {
            Some(spec) => {
                let changed = !prev.is_empty() && !prev.contains(&spec);
                let inv = if changed { self.invalidation } else { None };
                let act = TableAct {
                    name,
                    recreate: inv == Some(TargetChildInvalidation::Destructive),
                    lossy: inv == Some(TargetChildInvalidation::Lossy),
                };
                let action = if prev.is_empty() {
                    TargetAction::Create(act)
                } else {
                    TargetAction::Update(act)
                };
                Ok(Some(TargetReconcileOutput {
                    action,
                    sink: self.sink.clone(),
                    tracking_record: Some(spec),
                    child_invalidation: inv,
                }))
            }
            None => Ok(Some(TargetReconcileOutput {
                action: TargetAction::Delete(TableAct {
                    name,
                    recreate: false,
                    lossy: false,
                }),
                sink: self.sink.clone(),
                tracking_record: None,
                child_invalidation: Some(TargetChildInvalidation::Destructive),
            })),
        }
    }
}

/// One table's world: the table log and its rows (an `Ext`).
#[derive(Clone, Default)]
struct Tables {
    log: Arc<Mutex<Vec<String>>>,
    rows: Ext,
    factory_calls: Arc<AtomicUsize>,
}

impl Tables {
    fn handler(&self, invalidation: Option<TargetChildInvalidation>) -> Table {
        self.handler_impl(invalidation, None)
    }

    /// As `handler`, with rows whose handler has an "index" attachment
    /// recorded in `att` (dropped with the table).
    fn handler_with_index(
        &self,
        invalidation: Option<TargetChildInvalidation>,
        att: &Ext,
    ) -> Table {
        self.handler_impl(invalidation, Some(att.clone()))
    }

    fn handler_impl(
        &self,
        invalidation: Option<TargetChildInvalidation>,
        att: Option<Ext>,
    ) -> Table {
        let log = self.log.clone();
        let store = self.rows.store.clone();
        let att_store = att.as_ref().map(|a| a.store.clone());
        let row_sink = self.rows.sink();
        let seen = self.rows.seen.clone();
        let factory_calls = self.factory_calls.clone();
        let sink = TargetActionSink::from_async_fn_with_child_handler(
            move |actions: Vec<TargetAction<TableAct>>| {
                let log = log.clone();
                let store = store.clone();
                let att_store = att_store.clone();
                async move {
                    for a in actions {
                        let v = verb(&a);
                        let t = payload(a);
                        let mut rows = lock(&store);
                        if v == "delete" || t.recreate {
                            rows.clear();
                            if let Some(att) = &att_store {
                                lock(att).clear();
                            }
                        }
                        if t.lossy {
                            for val in rows.values_mut() {
                                *val = "<lost>".to_string();
                            }
                        }
                        let what = match (v, t.recreate, t.lossy) {
                            ("delete", _, _) => "drop",
                            (_, true, _) => "recreate",
                            (_, _, true) => "alter",
                            ("create", _, _) => "create",
                            _ => "ensure",
                        };
                        lock(&log).push(format!("{what} {}", t.name));
                    }
                    Ok(())
                }
            },
            move |_: &TableAct| {
                factory_calls.fetch_add(1, Ordering::SeqCst);
                Ok(match &att {
                    None => ChildTargetDef::new::<String, _>(Kv {
                        sink: row_sink.clone(),
                        seen: seen.clone(),
                    }),
                    Some(att) => ChildTargetDef::new::<String, _>(Main {
                        sink: row_sink.clone(),
                        seen: seen.clone(),
                        att: att.clone(),
                    }),
                })
            },
        );
        Table { sink, invalidation }
    }

    fn log(&self) -> Vec<String> {
        lock(&self.log).clone()
    }

    fn clear(&self) {
        lock(&self.log).clear();
        self.rows.clear();
    }
}

/// One run: the root mounts table "t" at `generation` (or declares no table
/// when `None`) and mounts one component per entry of `comps`, each
/// declaring its rows into the table. Components whose only row value is
/// `"!code-fails"` fail in their own code after declaring the rest.
async fn run_table(
    app: &App,
    tables: &Tables,
    invalidation: Option<TargetChildInvalidation>,
    generation: Option<u32>,
    comps: Comps,
) -> Result<RunReport> {
    let handler = tables.handler(invalidation);
    bounded(app.run_report(move |ctx| async move {
        let tp = register_root_target_states_provider(&ctx, TABLES, handler)?;
        let Some(g) = generation else {
            return Ok(());
        };
        let rows: TargetStateProvider<String> =
            mount_target(&ctx, tp.target_state("t", Spec { generation: g })).await?;
        ctx.mount_each(
            comps,
            |(c, _): &(StableKey, Vec<(StableKey, String)>)| c.clone(),
            move |c, (_, list)| {
                let rows = rows.clone();
                async move {
                    let mut fail = false;
                    for (key, v) in list {
                        if v == "!code-fails" {
                            fail = true;
                            continue;
                        }
                        declare_target_state(&c, rows.target_state(key, v))?;
                    }
                    if fail {
                        return Err(Error::msg("the row component's own code failed"));
                    }
                    Ok(())
                }
            },
        )
        .await
    }))
    .await
}

// ---------------------------------------------------------------------------
// Keys.
// ---------------------------------------------------------------------------

fn every_key_kind() -> Vec<StableKey> {
    let u = uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
    let s = |x: &str| StableKey::Str(Arc::from(x));
    let arr = |xs: Vec<StableKey>| StableKey::Array(Arc::from(xs));
    vec![
        StableKey::Null,
        StableKey::Bool(false),
        StableKey::Bool(true),
        StableKey::Int(0),
        StableKey::Int(-1),
        StableKey::Int(1),
        StableKey::Int(i64::MIN),
        StableKey::Int(i64::MAX),
        s(""),
        s("a"),
        s("a\0"),
        s("a\0b"),
        s("a\u{1}"),
        s("ü/\u{1F600} \"quoted\" \\ /x"),
        StableKey::Bytes(Arc::from(Vec::<u8>::new())),
        StableKey::Bytes(Arc::from(vec![0u8])),
        StableKey::Bytes(Arc::from(vec![0u8, 255, 0])),
        StableKey::Bytes(Arc::from(vec![255u8])),
        StableKey::Uuid(u),
        StableKey::Uuid(uuid::Uuid::nil()),
        StableKey::Symbol(Arc::from("sym")),
        StableKey::Symbol(Arc::from("")),
        arr(vec![]),
        arr(vec![StableKey::Null]),
        arr(vec![arr(vec![])]),
        arr(vec![s("a")]),
        arr(vec![s("a"), StableKey::Null]),
        arr(vec![s("a"), s("")]),
        ("a", (1i64, "b")).into_stable_key(),
        ("a", 1i64, "b", (2i64, (3i64, "c"))).into_stable_key(),
        (("x", "y"), ("z", StableKey::Null)).into_stable_key(),
        u64::MAX.into_stable_key(),
        (i64::MAX as u64 + 1).into_stable_key(),
        arr(vec![
            s("a"),
            StableKey::Bytes(Arc::from(vec![1u8])),
            StableKey::Uuid(u),
            StableKey::Symbol(Arc::from("s")),
            StableKey::Bool(true),
            StableKey::Null,
            StableKey::Int(-5),
        ]),
    ]
}

#[tokio::test]
async fn every_stable_key_kind_reaches_handler_and_sink_exactly_and_reruns_silently() -> Result<()>
{
    let keys = every_key_kind();
    let distinct: BTreeSet<StableKey> = keys.iter().cloned().collect();
    assert_eq!(
        distinct.len(),
        keys.len(),
        "the test's keys must be distinct"
    );
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    let decl: Vec<(StableKey, String)> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| (key.clone(), format!("v{i}")))
        .collect();
    let stats = run_flat(&app, &ext, decl.clone()).await?;
    assert_eq!(stats.created, keys.len() as u64);
    let expected: BTreeMap<StableKey, String> = decl.iter().cloned().collect();
    assert_eq!(ext.store(), expected);
    let seen: BTreeSet<StableKey> = lock(&ext.seen).iter().map(|s| s.key.clone()).collect();
    assert_eq!(
        seen, distinct,
        "the handler must get each key exactly as declared"
    );

    ext.clear();
    let stats = run_flat(&app, &ext, decl).await?;
    assert_eq!(
        ext.calls(),
        0,
        "an unchanged rerun calls no sink: {:?}",
        ext.applied()
    );
    assert_eq!(stats.unchanged, keys.len() as u64);
    assert_eq!((stats.created, stats.updated, stats.deleted), (0, 0, 0));
    Ok(())
}

#[tokio::test]
async fn every_stable_key_kind_survives_reopening_and_is_deleted_by_its_exact_key() -> Result<()> {
    let keys = every_key_kind();
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    let decl: Vec<(StableKey, String)> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| (key.clone(), format!("v{i}")))
        .collect();
    {
        let app = open(dir.path()).await?;
        run_flat(&app, &ext, decl.clone()).await?;
    }
    // Reopen: a no-change run still calls no sink (every key is found).
    let app = open_with(dir.path(), |b| b.shards(1)).await?;
    ext.clear();
    run_flat(&app, &ext, decl.clone()).await?;
    assert_eq!(ext.calls(), 0, "{:?}", ext.applied());
    drop(app);

    // Reopen again and keep only the odd ones: the even ones are deleted,
    // each by its exact key.
    let app = open_with(dir.path(), |b| b.shards(5)).await?;
    ext.clear();
    let kept: Vec<(StableKey, String)> = decl.iter().skip(1).step_by(2).cloned().collect();
    let stats = run_flat(&app, &ext, kept.clone()).await?;
    let mut expected_deletes: Vec<Applied> = decl
        .iter()
        .step_by(2)
        .map(|(key, _)| Applied {
            verb: "delete",
            key: key.clone(),
            value: None,
        })
        .collect();
    expected_deletes.sort();
    assert_eq!(ext.applied(), expected_deletes);
    assert_eq!(stats.deleted, expected_deletes.len() as u64);
    assert_eq!(ext.store(), kept.into_iter().collect::<BTreeMap<_, _>>());
    Ok(())
}

#[tokio::test]
async fn keys_that_print_alike_are_distinct_target_states() -> Result<()> {
    let s = |x: &str| StableKey::Str(Arc::from(x));
    let arr = |xs: Vec<StableKey>| StableKey::Array(Arc::from(xs));
    let keys = vec![
        s("1"),
        StableKey::Int(1),
        StableKey::Symbol(Arc::from("1")),
        StableKey::Bytes(Arc::from(b"1".to_vec())),
        arr(vec![s("1")]),
        arr(vec![StableKey::Int(1)]),
        s("@1"),
        s("[\"a\",1]"),
        arr(vec![s("a"), StableKey::Int(1)]),
        s("[a,1]"),
        s("null"),
        StableKey::Null,
        s("true"),
        StableKey::Bool(true),
        s("0x31"),
        s("a/b"),
        arr(vec![s("a"), s("b")]),
        arr(vec![arr(vec![s("a")]), s("b")]),
        arr(vec![s("a"), arr(vec![s("b")])]),
    ];
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    let decl: Vec<(StableKey, String)> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| (key.clone(), format!("v{i}")))
        .collect();
    let stats = run_flat(&app, &ext, decl.clone()).await?;
    assert_eq!(stats.created, keys.len() as u64);
    assert_eq!(ext.store().len(), keys.len());

    // Drop every third: exactly those are deleted, the rest untouched.
    ext.clear();
    let kept: Vec<(StableKey, String)> = decl
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 0)
        .map(|(_, x)| x.clone())
        .collect();
    run_flat(&app, &ext, kept.clone()).await?;
    let mut expected: Vec<Applied> = decl
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 == 0)
        .map(|(_, (key, _))| Applied {
            verb: "delete",
            key: key.clone(),
            value: None,
        })
        .collect();
    expected.sort();
    assert_eq!(ext.applied(), expected);
    assert_eq!(ext.store(), kept.into_iter().collect::<BTreeMap<_, _>>());
    Ok(())
}

#[tokio::test]
async fn tuple_keys_are_their_array_form_and_integer_kinds_agree() -> Result<()> {
    let s = |x: &str| StableKey::Str(Arc::from(x));
    let arr = |xs: Vec<StableKey>| StableKey::Array(Arc::from(xs));
    assert_eq!(
        ("a", 1i64).into_stable_key(),
        arr(vec![s("a"), StableKey::Int(1)])
    );
    assert_eq!(
        ("a", (1i32, ("b", 2u32))).into_stable_key(),
        arr(vec![
            s("a"),
            arr(vec![
                StableKey::Int(1),
                arr(vec![s("b"), StableKey::Int(2)])
            ])
        ])
    );
    for key in [
        1i32.into_stable_key(),
        1u32.into_stable_key(),
        1u64.into_stable_key(),
        1i64.into_stable_key(),
    ] {
        assert_eq!(key, StableKey::Int(1));
    }
    assert_eq!((-7i32).into_stable_key(), StableKey::Int(-7));
    assert_eq!(
        (i64::MAX as u64).into_stable_key(),
        StableKey::Int(i64::MAX)
    );
    let big = (i64::MAX as u64 + 1).into_stable_key();
    assert!(matches!(big, StableKey::Bytes(_)), "{big:?}");
    assert_ne!(big, u64::MAX.into_stable_key());
    assert_eq!(String::from("x").into_stable_key(), k("x"));
    assert_eq!((&String::from("x")).into_stable_key(), k("x"));

    // Declared as a tuple, then as its array form: one state, unchanged.
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    run_flat(
        &app,
        &ext,
        vec![(("t", 9i64).into_stable_key(), "v".into())],
    )
    .await?;
    ext.clear();
    let stats = run_flat(
        &app,
        &ext,
        vec![(arr(vec![s("t"), StableKey::Int(9)]), "v".into())],
    )
    .await?;
    assert_eq!(ext.calls(), 0, "{:?}", ext.applied());
    assert_eq!(stats.unchanged, 1);
    Ok(())
}

#[tokio::test]
async fn stable_key_display_is_human_readable() {
    assert_eq!(k("a").to_string(), "\"a\"");
    assert_eq!(StableKey::Int(42).to_string(), "42");
    assert_eq!(("a", 1i64).into_stable_key().to_string(), "[\"a\",1]");
    assert_eq!(StableKey::Symbol(Arc::from("sym")).to_string(), "@sym");
}

#[tokio::test]
async fn one_key_declared_twice_through_different_integer_types_is_a_duplicate() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    let handler = ext.handler();
    let r = bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        ctx.mount_each(
            vec!["dup", "ok"],
            |c| *c,
            move |c, name| {
                let p = p.clone();
                async move {
                    if name == "dup" {
                        declare_target_state(&c, p.target_state(5i32, "a".to_string()))?;
                        declare_target_state(&c, p.target_state(5u64, "b".to_string()))?;
                    } else {
                        declare_target_state(&c, p.target_state(6i64, "c".to_string()))?;
                    }
                    Ok(())
                }
            },
        )
        .await
    }))
    .await;
    let err = expect_err(r);
    assert_eq!(failed_paths(&err), vec!["/dup"], "{err}");
    assert!(
        err.to_string().contains('5'),
        "the error names the key: {err}"
    );
    assert_eq!(
        ext.store(),
        [(StableKey::Int(6), "c".to_string())].into_iter().collect()
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Ownership transfer (guarantee 4) and duplicates (11).
// ---------------------------------------------------------------------------

#[tokio::test]
async fn two_components_swapping_their_states_lose_nothing_and_each_is_deleted_once() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    run_comps(
        &app,
        &ext,
        comps(&[("A", &[("x", "1")]), ("B", &[("y", "1")])]),
    )
    .await?;
    ext.clear();
    run_comps(
        &app,
        &ext,
        comps(&[("A", &[("y", "1")]), ("B", &[("x", "1")])]),
    )
    .await?;
    assert!(
        ext.applied().iter().all(|a| a.verb != "delete"),
        "a swap deletes nothing: {:?}",
        ext.applied()
    );
    assert_eq!(ext.store(), smap(&[("x", "1"), ("y", "1")]));

    // Each state has one owner now: removing both deletes each once.
    ext.clear();
    run_comps(&app, &ext, comps(&[("A", &[]), ("B", &[])])).await?;
    assert_eq!(
        ext.applied(),
        vec![ap("delete", "x", None), ap("delete", "y", None)]
    );
    ext.clear();
    run_comps(&app, &ext, comps(&[])).await?;
    assert_eq!(ext.calls(), 0, "{:?}", ext.applied());
    Ok(())
}

#[tokio::test]
async fn a_state_moving_with_a_new_value_is_exactly_one_update() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    run_comps(&app, &ext, comps(&[("A", &[("x", "1"), ("a", "1")])])).await?;
    ext.clear();
    let stats = run_comps(
        &app,
        &ext,
        comps(&[("A", &[("a", "1")]), ("B", &[("x", "2")])]),
    )
    .await?;
    assert_eq!(ext.applied(), vec![ap("update", "x", Some("2"))]);
    assert_eq!(
        (stats.created, stats.updated, stats.deleted, stats.unchanged),
        (0, 1, 0, 1)
    );
    assert_eq!(ext.store(), smap(&[("a", "1"), ("x", "2")]));
    Ok(())
}

#[tokio::test]
async fn a_state_moving_out_of_a_removed_subtree_into_a_new_one_is_kept() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    // Nested: /p/c declares x; then /p goes away and /q/d declares x.
    async fn nested(app: &App, ext: &Ext, outer: &'static str, inner: &'static str) -> Result<()> {
        let handler = ext.handler();
        bounded(app.run(move |ctx| async move {
            let p = register_root_target_states_provider(&ctx, KV, handler)?;
            ctx.mount(outer, move |c| async move {
                c.mount(inner, move |c| async move {
                    declare_target_state(&c, p.target_state("x", "1".to_string()))
                })
                .await
            })
            .await
        }))
        .await?;
        Ok(())
    }
    nested(&app, &ext, "p", "c").await?;
    ext.clear();
    nested(&app, &ext, "q", "d").await?;
    assert!(
        ext.applied().iter().all(|a| a.verb != "delete"),
        "{:?}",
        ext.applied()
    );
    assert_eq!(ext.store(), smap(&[("x", "1")]));
    ext.clear();
    run_comps(&app, &ext, comps(&[])).await?;
    assert_eq!(ext.applied(), vec![ap("delete", "x", None)]);
    Ok(())
}

#[tokio::test]
async fn a_state_moving_back_and_forth_across_reopens_is_never_lost_or_deleted_twice() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    let steps: Vec<(Comps, BTreeMap<StableKey, String>)> = vec![
        (
            comps(&[("A", &[("x", "1")]), ("B", &[])]),
            smap(&[("x", "1")]),
        ),
        (
            comps(&[("A", &[]), ("B", &[("x", "1")])]),
            smap(&[("x", "1")]),
        ),
        (
            comps(&[("A", &[("x", "2")]), ("B", &[])]),
            smap(&[("x", "2")]),
        ),
        (comps(&[("B", &[("x", "3")])]), smap(&[("x", "3")])),
    ];
    for (i, (c, want)) in steps.into_iter().enumerate() {
        let app = open_with(dir.path(), |b| b.shards(1 + i % 3)).await?;
        ext.clear();
        run_comps(&app, &ext, c).await?;
        assert!(
            ext.applied().iter().all(|a| a.verb != "delete"),
            "step {i}: {:?}",
            ext.applied()
        );
        assert_eq!(ext.store(), want, "step {i}");
    }
    let app = open(dir.path()).await?;
    ext.clear();
    run_comps(&app, &ext, comps(&[("A", &[]), ("B", &[])])).await?;
    assert_eq!(ext.applied(), vec![ap("delete", "x", None)]);
    Ok(())
}

#[tokio::test]
async fn a_state_taken_while_its_old_owner_fails_is_not_deleted_when_the_old_owner_recovers(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    report_comps(
        &app,
        &ext,
        comps(&[("A", &[("a", "1"), ("x", "1")]), ("B", &[])]),
    )
    .await?;
    // A fails in its own code; B takes x with a new value.
    ext.clear();
    let r = report_comps(
        &app,
        &ext,
        comps(&[
            ("A", &[("a", "1"), ("z", "!code-fails")]),
            ("B", &[("x", "2")]),
        ]),
    )
    .await?;
    assert_eq!(report_paths(&r), vec!["/A"]);
    assert_eq!(ext.store(), smap(&[("a", "1"), ("x", "2")]));
    // A succeeds again without x: x belongs to B and stays.
    ext.clear();
    let r = report_comps(
        &app,
        &ext,
        comps(&[("A", &[("a", "1")]), ("B", &[("x", "2")])]),
    )
    .await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(
        ext.store(),
        smap(&[("a", "1"), ("x", "2")]),
        "{:?}",
        ext.applied()
    );
    assert_eq!(ext.calls(), 0, "{:?}", ext.applied());
    // B drops it: one delete.
    ext.clear();
    report_comps(&app, &ext, comps(&[("A", &[("a", "1")]), ("B", &[])])).await?;
    assert_eq!(ext.applied(), vec![ap("delete", "x", None)]);
    Ok(())
}

#[tokio::test]
async fn a_duplicate_declaration_leaves_the_components_earlier_states_as_they_were() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    run_comps(
        &app,
        &ext,
        comps(&[("A", &[("x", "1"), ("y", "1")]), ("B", &[("b", "1")])]),
    )
    .await?;
    ext.clear();
    let err = expect_err(
        run_comps(
            &app,
            &ext,
            comps(&[("A", &[("x", "2"), ("x", "3")]), ("B", &[("b", "2")])]),
        )
        .await,
    );
    assert_eq!(failed_paths(&err), vec!["/A"], "{err}");
    let text = err.to_string();
    assert!(text.contains("\"x\""), "the error names the key: {text}");
    assert!(text.contains(KV), "the error names the provider: {text}");
    assert_eq!(
        ext.store(),
        smap(&[("b", "2"), ("x", "1"), ("y", "1")]),
        "A applies and deletes nothing; B lands"
    );
    ext.clear();
    run_comps(
        &app,
        &ext,
        comps(&[("A", &[("x", "2")]), ("B", &[("b", "2")])]),
    )
    .await?;
    assert_eq!(
        ext.applied(),
        vec![ap("delete", "y", None), ap("update", "x", Some("2"))]
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Components.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_parent_failing_after_its_children_committed_keeps_its_own_states_and_old_children(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    async fn go(
        app: &App,
        ext: &Ext,
        own: &'static str,
        kids: Vec<(&'static str, &'static str)>,
        fail: bool,
    ) -> Result<RunReport> {
        let handler = ext.handler();
        bounded(app.run_report(move |ctx| async move {
            let p = register_root_target_states_provider(&ctx, KV, handler)?;
            ctx.mount_each(
                vec!["p"],
                |c| *c,
                move |c, _| {
                    let p = p.clone();
                    let kids = kids.clone();
                    async move {
                        declare_target_state(&c, p.target_state("p0", own.to_string()))?;
                        let pk = p.clone();
                        c.mount_each(
                            kids,
                            |(name, _)| *name,
                            move |c, (name, v)| {
                                let p = pk.clone();
                                async move {
                                    declare_target_state(
                                        &c,
                                        p.target_state(format!("{name}x"), v.to_string()),
                                    )
                                }
                            },
                        )
                        .await?;
                        if fail {
                            return Err(Error::msg("p broke after its children"));
                        }
                        Ok(())
                    }
                },
            )
            .await
        }))
        .await
    }
    go(&app, &ext, "1", vec![("c1", "1"), ("old", "1")], false).await?;
    assert_eq!(
        ext.store(),
        smap(&[("c1x", "1"), ("oldx", "1"), ("p0", "1")])
    );
    ext.clear();
    let r = go(&app, &ext, "2", vec![("c1", "2"), ("c2", "1")], true).await?;
    assert_eq!(report_paths(&r), vec!["/p"]);
    assert!(r.failures[0].cause.contains("p broke"), "{:?}", r.failures);
    assert_eq!(
        ext.store(),
        smap(&[("c1x", "2"), ("c2x", "1"), ("oldx", "1"), ("p0", "1")]),
        "children commit on their own; the failed parent applies and deletes nothing"
    );
    ext.clear();
    let r = go(&app, &ext, "2", vec![("c1", "2"), ("c2", "1")], false).await?;
    assert!(r.failures.is_empty());
    assert_eq!(
        ext.applied(),
        vec![ap("delete", "oldx", None), ap("update", "p0", Some("2"))]
    );
    Ok(())
}

#[tokio::test]
async fn component_keys_with_slashes_do_not_collide_with_nested_components() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    async fn go(app: &App, ext: &Ext, flat: bool, nested: bool) -> Result<()> {
        let handler = ext.handler();
        bounded(app.run(move |ctx| async move {
            let p = register_root_target_states_provider(&ctx, KV, handler)?;
            if flat {
                let p = p.clone();
                ctx.mount("a/b", move |c| async move {
                    declare_target_state(&c, p.target_state("flat", "1".to_string()))
                })
                .await?;
            }
            if nested {
                ctx.mount("a", move |c| async move {
                    c.mount("b", move |c| async move {
                        declare_target_state(&c, p.target_state("nested", "1".to_string()))
                    })
                    .await
                })
                .await?;
            }
            Ok(())
        }))
        .await?;
        Ok(())
    }
    go(&app, &ext, true, true).await?;
    assert_eq!(ext.store(), smap(&[("flat", "1"), ("nested", "1")]));
    ext.clear();
    go(&app, &ext, true, true).await?;
    assert_eq!(ext.calls(), 0, "{:?}", ext.applied());
    go(&app, &ext, false, true).await?;
    assert_eq!(ext.applied(), vec![ap("delete", "flat", None)]);
    ext.clear();
    go(&app, &ext, true, false).await?;
    assert_eq!(
        ext.applied(),
        vec![
            ap("create", "flat", Some("1")),
            ap("delete", "nested", None)
        ]
    );
    Ok(())
}

#[tokio::test]
async fn component_keys_of_different_kinds_are_different_components() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    let s = |x: &str| StableKey::Str(Arc::from(x));
    let all = vec![
        s("1"),
        StableKey::Int(1),
        StableKey::Symbol(Arc::from("1")),
        StableKey::Bytes(Arc::from(b"1".to_vec())),
        StableKey::Array(Arc::from(vec![s("1")])),
        StableKey::Null,
        s(""),
        ("1", 1i64).into_stable_key(),
    ];
    let mk = |keys: &[StableKey]| -> Comps {
        keys.iter()
            .enumerate()
            .map(|(i, c)| (c.clone(), vec![(StableKey::Int(i as i64), format!("v{i}"))]))
            .collect()
    };
    let stats = run_comps(&app, &ext, mk(&all)).await?;
    assert_eq!(stats.created, all.len() as u64);
    // Remove only the Int(1) component (index 1).
    ext.clear();
    let mut fewer = mk(&all);
    fewer.remove(1);
    run_comps(&app, &ext, fewer).await?;
    assert_eq!(
        ext.applied(),
        vec![Applied {
            verb: "delete",
            key: StableKey::Int(1),
            value: None
        }]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_inflight_components_of_one_runs_nested_mounts_without_deadlock() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open_with(dir.path(), |b| b.max_inflight_components(1)).await?;
    let ext = Ext::new();
    let handler = ext.handler();
    bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        ctx.mount_each(
            vec![0i64, 1, 2],
            |i| *i,
            move |c, i| {
                let p = p.clone();
                async move {
                    let pg = p.clone();
                    c.mount("g", move |g| async move {
                        declare_target_state(&g, pg.target_state(("g", i), "v".to_string()))
                    })
                    .await?;
                    let pe = p.clone();
                    c.mount_each(
                        vec![10i64, 11],
                        |j| *j,
                        move |e, j| {
                            let p = pe.clone();
                            async move {
                                declare_target_state(&e, p.target_state((i, j), "v".to_string()))
                            }
                        },
                    )
                    .await
                }
            },
        )
        .await
    }))
    .await?;
    assert_eq!(ext.store().len(), 9);
    Ok(())
}

// ---------------------------------------------------------------------------
// Containers (guarantees 8 and 9).
// ---------------------------------------------------------------------------

#[tokio::test]
async fn rows_declared_by_other_components_are_created_again_after_a_destructive_change(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let t = Tables::default();
    let inv = Some(TargetChildInvalidation::Destructive);
    let cs = || comps(&[("c1", &[("a", "1")]), ("c2", &[("b", "1")])]);
    run_table(&app, &t, inv, Some(1), cs()).await?;
    assert_eq!(t.rows.store(), smap(&[("a", "1"), ("b", "1")]));
    t.clear();
    let r = run_table(
        &app,
        &t,
        inv,
        Some(2),
        comps(&[("c1", &[("a", "1")]), ("c2", &[])]),
    )
    .await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(t.log(), vec!["recreate t"]);
    assert_eq!(
        t.rows.applied(),
        vec![ap("create", "a", Some("1"))],
        "a's record was dropped so it is created; b's too, so no delete is needed"
    );
    assert_eq!(t.rows.store(), smap(&[("a", "1")]));
    t.clear();
    run_table(&app, &t, inv, Some(2), cs()).await?;
    assert_eq!(t.rows.applied(), vec![ap("create", "b", Some("1"))]);
    Ok(())
}

#[tokio::test]
async fn rows_declared_by_other_components_are_reapplied_after_a_lossy_change() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let t = Tables::default();
    let inv = Some(TargetChildInvalidation::Lossy);
    let cs = || comps(&[("c1", &[("a", "1")]), ("c2", &[("b", "1")])]);
    run_table(&app, &t, inv, Some(1), cs()).await?;
    t.clear();
    let r = run_table(
        &app,
        &t,
        inv,
        Some(2),
        comps(&[("c1", &[("a", "1")]), ("c2", &[])]),
    )
    .await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(t.log(), vec!["alter t"]);
    assert_eq!(
        t.rows.applied(),
        vec![ap("delete", "b", None), ap("update", "a", Some("1"))]
    );
    assert_eq!(t.rows.store(), smap(&[("a", "1")]));
    t.clear();
    run_table(
        &app,
        &t,
        inv,
        Some(2),
        comps(&[("c1", &[("a", "1")]), ("c2", &[])]),
    )
    .await?;
    assert_eq!(t.rows.calls(), 0, "{:?}", t.rows.applied());
    Ok(())
}

#[tokio::test]
async fn rows_are_left_alone_by_a_container_change_without_invalidation() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let t = Tables::default();
    let cs = || comps(&[("c1", &[("a", "1")]), ("c2", &[("b", "1")])]);
    run_table(&app, &t, None, Some(1), cs()).await?;
    t.clear();
    run_table(&app, &t, None, Some(2), cs()).await?;
    assert_eq!(t.log(), vec!["ensure t"]);
    assert_eq!(t.rows.calls(), 0, "{:?}", t.rows.applied());
    for key in ["a", "b"] {
        let seen = t.rows.seen(&k(key));
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].prev, vec!["1".to_string()]);
        assert!(!seen[0].missing);
    }
    Ok(())
}

#[tokio::test]
async fn a_row_component_failing_in_the_run_of_a_destructive_change_gets_its_rows_back_later(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let t = Tables::default();
    let inv = Some(TargetChildInvalidation::Destructive);
    let cs = || comps(&[("c1", &[("a", "1")]), ("c2", &[("b", "1")])]);
    run_table(&app, &t, inv, Some(1), cs()).await?;
    t.clear();
    // The table is recreated (every row is gone) while c2's code fails.
    let r = run_table(
        &app,
        &t,
        inv,
        Some(2),
        comps(&[
            ("c1", &[("a", "1")]),
            ("c2", &[("b", "1"), ("z", "!code-fails")]),
        ]),
    )
    .await?;
    assert_eq!(report_paths(&r), vec!["/c2"]);
    assert_eq!(t.rows.store(), smap(&[("a", "1")]));
    // c2 works again: its row must be created again, the table lost it.
    t.clear();
    let r = run_table(&app, &t, inv, Some(2), cs()).await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(
        t.rows.store(),
        smap(&[("a", "1"), ("b", "1")]),
        "row b was lost by the recreate and never written again; reconcile saw {:?}",
        t.rows.seen(&k("b"))
    );
    Ok(())
}

#[tokio::test]
async fn a_row_component_failing_in_the_run_of_a_lossy_change_gets_its_rows_reapplied_later(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let t = Tables::default();
    let inv = Some(TargetChildInvalidation::Lossy);
    let cs = || comps(&[("c1", &[("a", "1")]), ("c2", &[("b", "1")])]);
    run_table(&app, &t, inv, Some(1), cs()).await?;
    t.clear();
    let r = run_table(
        &app,
        &t,
        inv,
        Some(2),
        comps(&[
            ("c1", &[("a", "1")]),
            ("c2", &[("b", "1"), ("z", "!code-fails")]),
        ]),
    )
    .await?;
    assert_eq!(report_paths(&r), vec!["/c2"]);
    assert_eq!(t.rows.store(), smap(&[("a", "1"), ("b", "<lost>")]));
    t.clear();
    let r = run_table(&app, &t, inv, Some(2), cs()).await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(
        t.rows.store(),
        smap(&[("a", "1"), ("b", "1")]),
        "row b was damaged by the lossy change and never reapplied; reconcile saw {:?}",
        t.rows.seen(&k("b"))
    );
    Ok(())
}

#[tokio::test]
async fn a_container_dropped_and_declared_again_creates_its_rows_afresh() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let t = Tables::default();
    let cs = || comps(&[("c1", &[("a", "1")]), ("c2", &[("b", "1")])]);
    run_table(&app, &t, None, Some(1), cs()).await?;
    t.clear();
    // The table and the components declaring its rows go away together:
    // only the table's own delete runs (guarantee 9).
    let r = run_table(&app, &t, None, None, vec![]).await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(t.log(), vec!["drop t"]);
    assert_eq!(t.rows.calls(), 0, "{:?}", t.rows.applied());
    assert!(
        t.rows.seen(&k("a")).is_empty(),
        "rows are not reconciled one by one"
    );
    assert!(t.rows.store().is_empty());
    // Declared again: the rows' records went with the table.
    t.clear();
    run_table(&app, &t, None, Some(1), cs()).await?;
    assert_eq!(
        t.rows.applied(),
        vec![ap("create", "a", Some("1")), ap("create", "b", Some("1"))]
    );
    assert_eq!(t.rows.store(), smap(&[("a", "1"), ("b", "1")]));
    Ok(())
}

#[tokio::test]
async fn a_container_dropped_across_a_reopen_forgets_its_rows() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let t = Tables::default();
    let cs = || comps(&[("c1", &[("a", "1")]), ("c2", &[("b", "1")])]);
    {
        let app = open(dir.path()).await?;
        run_table(&app, &t, None, Some(1), cs()).await?;
    }
    {
        let app = open(dir.path()).await?;
        t.clear();
        run_table(&app, &t, None, None, vec![]).await?;
        assert_eq!(t.log(), vec!["drop t"]);
        assert_eq!(t.rows.calls(), 0, "{:?}", t.rows.applied());
    }
    let app = open(dir.path()).await?;
    t.clear();
    run_table(&app, &t, None, Some(1), cs()).await?;
    assert_eq!(t.rows.store(), smap(&[("a", "1"), ("b", "1")]));
    t.clear();
    run_table(&app, &t, None, None, vec![]).await?;
    assert_eq!(t.log(), vec!["drop t"]);
    assert_eq!(t.rows.calls(), 0, "{:?}", t.rows.applied());
    Ok(())
}

// ---------------------------------------------------------------------------
// Attachments (guarantee 10).
// ---------------------------------------------------------------------------

struct Main {
    sink: TargetActionSink<Put>,
    seen: Arc<Mutex<Vec<Seen>>>,
    att: Ext,
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

#[tokio::test]
async fn attachment_states_follow_their_declaring_component_and_are_updated_and_deleted(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let main = Ext::new();
    let att = Ext::new();
    // comps: name -> Some(index value) declares an attachment state too.
    async fn go(
        app: &App,
        main: &Ext,
        att: &Ext,
        list: Vec<(&'static str, Option<&'static str>)>,
    ) -> Result<()> {
        let handler = Main {
            sink: main.sink(),
            seen: main.seen.clone(),
            att: att.clone(),
        };
        bounded(app.run(move |ctx| async move {
            let p = register_root_target_states_provider(&ctx, "acc/main", handler)?;
            ctx.mount_each(
                list,
                |(n, _)| *n,
                move |c, (n, idx)| {
                    let p = p.clone();
                    async move {
                        declare_target_state(&c, p.target_state(n, "row".to_string()))?;
                        if let Some(v) = idx {
                            let a: TargetStateProvider<String> = p.attachment(&c, "index")?;
                            declare_target_state(
                                &c,
                                a.target_state(format!("{n}-idx"), v.to_string()),
                            )?;
                        }
                        Ok(())
                    }
                },
            )
            .await
        }))
        .await?;
        Ok(())
    }
    go(&app, &main, &att, vec![("c", Some("1")), ("d", Some("1"))]).await?;
    assert_eq!(att.store(), smap(&[("c-idx", "1"), ("d-idx", "1")]));
    att.clear();
    go(&app, &main, &att, vec![("c", Some("2")), ("d", Some("1"))]).await?;
    assert_eq!(att.applied(), vec![ap("update", "c-idx", Some("2"))]);
    // c goes away, d stops asking for the attachment at all.
    att.clear();
    main.clear();
    go(&app, &main, &att, vec![("d", None)]).await?;
    assert_eq!(
        att.applied(),
        vec![ap("delete", "c-idx", None), ap("delete", "d-idx", None)]
    );
    assert_eq!(main.applied(), vec![ap("delete", "c", None)]);
    Ok(())
}

// ---------------------------------------------------------------------------
// Sink failures, retries and possible records (guarantees 6, 7, 13, 14).
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_key_failing_in_a_batch_shared_by_many_components_fails_only_its_component() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    let n = 40;
    let make = |v: &str| -> Comps {
        (0..n)
            .map(|c| {
                (
                    format!("c{c:02}").into_stable_key(),
                    (0..3)
                        .map(|r| (format!("c{c:02}/k{r}").into_stable_key(), v.to_string()))
                        .collect(),
                )
            })
            .collect()
    };
    let poison = k("c07/k1");
    ext.fail_keys(std::slice::from_ref(&poison));
    let err = expect_err(run_comps(&app, &ext, make("1")).await);
    assert_eq!(failed_paths(&err), vec!["/c07"], "{err}");
    // Every healthy key landed exactly once.
    let mut per_key: BTreeMap<StableKey, usize> = BTreeMap::new();
    for a in ext.applied() {
        *per_key.entry(a.key).or_default() += 1;
    }
    for c in 0..n {
        for r in 0..3 {
            let key = format!("c{c:02}/k{r}").into_stable_key();
            let got = per_key.get(&key).copied().unwrap_or(0);
            if c == 7 {
                assert!(key != poison || got == 0);
                assert!(got <= 1, "{key} applied {got} times");
            } else {
                assert_eq!(got, 1, "{key} applied {got} times");
            }
        }
    }
    // The next run, healed, does only c07's states.
    ext.heal();
    ext.clear();
    run_comps(&app, &ext, make("1")).await?;
    let touched: BTreeSet<String> = ext.applied().iter().map(|a| a.key.to_string()).collect();
    assert!(touched.contains("\"c07/k1\""), "{touched:?}");
    assert!(
        touched.iter().all(|key| key.starts_with("\"c07/")),
        "only the failed component's states are applied again: {touched:?}"
    );
    ext.clear();
    run_comps(&app, &ext, make("1")).await?;
    assert_eq!(ext.calls(), 0);
    Ok(())
}

#[tokio::test]
async fn retry_policy_max_attempts_is_the_number_of_calls_for_a_failing_component() -> Result<()> {
    for max in [1u32, 2, 3, 5] {
        let dir = tempfile::tempdir()?;
        let app = open_with(dir.path(), |b| b.retry_policy(fast_retry(max))).await?;
        let ext = Ext::new();
        ext.fail_with(|_| Some(Error::msg("down")));
        let err = expect_err(run_flat(&app, &ext, rows(&[("x", "1")])).await);
        assert_eq!(failed_paths(&err), vec!["/"], "{err}");
        assert_eq!(
            ext.attempts().len(),
            max as usize,
            "max_attempts = {max}: {:?}",
            ext.attempts()
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_sink_failing_twice_lands_with_three_attempts_and_fails_with_two() -> Result<()> {
    for (max, ok) in [(3u32, true), (2, false)] {
        let dir = tempfile::tempdir()?;
        let app = open_with(dir.path(), |b| b.retry_policy(fast_retry(max))).await?;
        let ext = Ext::new();
        let n = Arc::new(AtomicUsize::new(0));
        ext.fail_with(move |_| {
            (n.fetch_add(1, Ordering::SeqCst) < 2).then(|| Error::msg("transient"))
        });
        let r = run_flat(&app, &ext, rows(&[("x", "1")])).await;
        assert_eq!(r.is_ok(), ok, "max_attempts {max}: {r:?}");
        assert_eq!(ext.attempts().len(), max as usize);
        if ok {
            assert_eq!(r?.created, 1);
            assert_eq!(ext.store(), smap(&[("x", "1")]));
        } else {
            assert!(ext.store().is_empty());
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_permanent_error_is_tried_once_whatever_max_attempts() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open_with(dir.path(), |b| b.retry_policy(fast_retry(6))).await?;
    let ext = Ext::new();
    ext.fail_with(|_| Some(Error::permanent("constraint violated")));
    let err = expect_err(run_flat(&app, &ext, rows(&[("x", "1")])).await);
    assert!(err.to_string().contains("constraint violated"), "{err}");
    assert_eq!(ext.attempts().len(), 1);
    Ok(())
}

#[tokio::test]
async fn possible_records_accumulate_over_failed_updates_across_reopens_until_one_lands(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    let x = k("x");
    {
        let app = open(dir.path()).await?;
        run_flat(&app, &ext, rows(&[("x", "1")])).await?;
        ext.fail_keys(std::slice::from_ref(&x));
        expect_err(run_flat(&app, &ext, rows(&[("x", "2")])).await);
    }
    {
        let app = open(dir.path()).await?;
        ext.clear();
        expect_err(run_flat(&app, &ext, rows(&[("x", "3")])).await);
        let seen = ext.seen(&x);
        assert!(!seen.is_empty());
        assert_eq!(
            seen[0].prev,
            vec!["1".to_string(), "2".to_string()],
            "{seen:?}"
        );
        assert!(seen[0].missing, "{seen:?}");
    }
    let app = open(dir.path()).await?;
    ext.heal();
    ext.clear();
    run_flat(&app, &ext, rows(&[("x", "3")])).await?;
    let seen = ext.seen(&x);
    assert_eq!(
        seen[0].prev,
        vec!["1".to_string(), "2".to_string(), "3".to_string()],
        "every value the target may hold is a possible record: {seen:?}"
    );
    assert!(seen[0].missing);
    assert_eq!(ext.applied(), vec![ap("update", "x", Some("3"))]);
    // Landed: the records collapse to the one applied.
    ext.clear();
    run_flat(&app, &ext, rows(&[("x", "3")])).await?;
    let seen = ext.seen(&x);
    assert_eq!(seen[0].prev, vec!["3".to_string()]);
    assert!(!seen[0].missing);
    assert_eq!(ext.calls(), 0);
    Ok(())
}

#[tokio::test]
async fn a_failed_create_is_deleted_after_a_reopen_once_no_longer_declared() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    {
        let app = open(dir.path()).await?;
        ext.fail_keys(&[k("y")]);
        expect_err(run_flat(&app, &ext, rows(&[("y", "1"), ("z", "1")])).await);
    }
    ext.heal();
    ext.clear();
    let app = open(dir.path()).await?;
    run_flat(&app, &ext, rows(&[("z", "1")])).await?;
    let seen = ext.seen(&k("y"));
    assert_eq!(
        seen.len(),
        1,
        "the failed create is reconciled with None: {seen:?}"
    );
    assert_eq!(seen[0].desired, None);
    assert!(
        seen[0].missing || seen[0].prev == vec!["1".to_string()],
        "{seen:?}"
    );
    let on_y: Vec<Applied> = ext
        .applied()
        .into_iter()
        .filter(|a| a.key == k("y"))
        .collect();
    assert_eq!(on_y, vec![ap("delete", "y", None)]);
    assert_eq!(ext.store(), smap(&[("z", "1")]));
    ext.clear();
    run_flat(&app, &ext, rows(&[("z", "1")])).await?;
    assert_eq!(ext.calls(), 0, "{:?}", ext.applied());
    assert!(ext.seen(&k("y")).is_empty(), "y is forgotten once deleted");
    Ok(())
}

#[tokio::test]
async fn failed_deletes_are_retried_and_a_redeclared_state_is_applied_afresh_after_reopen(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    {
        let app = open(dir.path()).await?;
        run_flat(&app, &ext, rows(&[("x", "1"), ("y", "1"), ("z", "1")])).await?;
        ext.fail_keys(&[k("x"), k("y")]);
        ext.clear();
        expect_err(run_flat(&app, &ext, rows(&[("z", "1")])).await);
        assert_eq!(ext.store(), smap(&[("x", "1"), ("y", "1"), ("z", "1")]));
    }
    ext.heal();
    ext.clear();
    let app = open(dir.path()).await?;
    // x comes back with its old value: it may be missing, so it is applied.
    run_flat(&app, &ext, rows(&[("x", "1"), ("z", "1")])).await?;
    assert_eq!(
        ext.applied(),
        vec![ap("delete", "y", None), ap("update", "x", Some("1"))]
    );
    assert_eq!(ext.store(), smap(&[("x", "1"), ("z", "1")]));
    ext.clear();
    run_flat(&app, &ext, rows(&[("x", "1"), ("z", "1")])).await?;
    assert_eq!(ext.calls(), 0, "{:?}", ext.applied());
    Ok(())
}

#[tokio::test]
async fn a_removed_component_whose_deletes_failed_is_cleaned_up_after_a_reopen() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    {
        let app = open(dir.path()).await?;
        run_comps(
            &app,
            &ext,
            comps(&[("A", &[("a", "1")]), ("B", &[("b", "1")])]),
        )
        .await?;
        ext.fail_keys(&[k("a")]);
        expect_err(run_comps(&app, &ext, comps(&[("B", &[("b", "1")])])).await);
        assert_eq!(ext.store(), smap(&[("a", "1"), ("b", "1")]));
    }
    ext.heal();
    ext.clear();
    let app = open(dir.path()).await?;
    run_comps(&app, &ext, comps(&[("B", &[("b", "1")])])).await?;
    assert_eq!(ext.applied(), vec![ap("delete", "a", None)]);
    ext.clear();
    run_comps(&app, &ext, comps(&[("B", &[("b", "1")])])).await?;
    assert_eq!(ext.calls(), 0, "{:?}", ext.applied());
    Ok(())
}

#[tokio::test]
async fn a_sink_failure_error_names_the_provider_the_key_and_the_component() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    let key = ("k", 7i64).into_stable_key();
    let bad = key.clone();
    ext.fail_with(move |keys| {
        keys.contains(&bad)
            .then(|| Error::msg("rejected by the target"))
    });
    let handler = ext.handler();
    let kk = key.clone();
    let r = bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        ctx.mount("outer", move |c| async move {
            let p2 = p.clone();
            c.mount_each(
                vec!["alpha", "beta"],
                |n| *n,
                move |c, n| {
                    let p = p2.clone();
                    let kk = kk.clone();
                    async move {
                        if n == "alpha" {
                            declare_target_state(&c, p.target_state(kk, "v".to_string()))
                        } else {
                            declare_target_state(&c, p.target_state("fine", "v".to_string()))
                        }
                    }
                },
            )
            .await
        })
        .await
    }))
    .await;
    let err = expect_err(r);
    assert_eq!(failed_paths(&err), vec!["/outer/alpha"], "{err}");
    let cause = &err.failed_components()[0].cause;
    for part in [KV, "[\"k\",7]"] {
        assert!(cause.contains(part), "the cause names {part}: {cause}");
    }
    let text = err.to_string();
    assert!(text.contains("/outer/alpha"), "{text}");
    assert_eq!(ext.store(), smap(&[("fine", "v")]));
    Ok(())
}

#[tokio::test]
async fn a_handler_error_names_the_provider_the_key_and_the_full_path() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    let handler = ext.handler();
    let r = bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        let p2 = p.clone();
        ctx.mount(7i64, move |c| async move {
            c.mount(StableKey::Symbol(Arc::from("in")), move |c| async move {
                declare_target_state(&c, p2.target_state(42i64, "!err".to_string()))
            })
            .await
        })
        .await
        .ok();
        declare_target_state(&ctx, p.target_state("root", "v".to_string()))
    }))
    .await;
    let err = expect_err(r);
    let paths = failed_paths(&err);
    assert!(paths.iter().any(|p| p.contains("in")), "{err}");
    let f = err
        .failed_components()
        .iter()
        .find(|f| f.path.to_string().contains("in"))
        .expect("the inner component fails");
    assert!(f.path.to_string().starts_with("/7/"), "{}", f.path);
    for part in [KV, "42", "refuses"] {
        assert!(
            f.cause.contains(part),
            "the cause names {part}: {}",
            f.cause
        );
    }
    assert_eq!(ext.store(), smap(&[("root", "v")]));
    Ok(())
}

// ---------------------------------------------------------------------------
// Preview (applies nothing, writes no ledger).
// ---------------------------------------------------------------------------

fn preview_summary(actions: &[PreviewAction]) -> Vec<(String, StableKey, &'static str)> {
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

async fn preview_comps(app: &App, ext: &Ext, comps: Comps) -> Result<Vec<PreviewAction>> {
    let handler = ext.handler();
    bounded(app.preview(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        ctx.mount_each(
            comps,
            |(c, _): &(StableKey, Vec<(StableKey, String)>)| c.clone(),
            move |c, (_, rows)| {
                let p = p.clone();
                async move {
                    for (key, v) in rows {
                        declare_target_state(&c, p.target_state(key, v))?;
                    }
                    Ok(())
                }
            },
        )
        .await
    }))
    .await
}

#[tokio::test]
async fn a_preview_lists_moves_as_updates_and_removed_components_as_deletes_and_applies_nothing(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    run_comps(
        &app,
        &ext,
        comps(&[("A", &[("x", "1"), ("y", "1")]), ("B", &[("z", "1")])]),
    )
    .await?;
    let next = || comps(&[("A", &[("y", "1")]), ("C", &[("x", "2"), ("w", "1")])]);
    let want = vec![
        (KV.to_string(), k("w"), "create"),
        (KV.to_string(), k("x"), "update"),
        (KV.to_string(), k("z"), "delete"),
    ];
    for _ in 0..2 {
        ext.clear();
        let p = preview_comps(&app, &ext, next()).await?;
        assert_eq!(preview_summary(&p), want);
        assert!(ext.attempts().is_empty(), "a preview calls no sink");
        assert_eq!(ext.store(), smap(&[("x", "1"), ("y", "1"), ("z", "1")]));
    }
    ext.clear();
    run_comps(&app, &ext, next()).await?;
    assert_eq!(
        ext.applied(),
        vec![
            ap("create", "w", Some("1")),
            ap("delete", "z", None),
            ap("update", "x", Some("2")),
        ]
    );
    let p = preview_comps(&app, &ext, next()).await?;
    assert!(p.is_empty(), "{p:?}");
    Ok(())
}

#[tokio::test]
async fn a_preview_after_a_failed_run_keeps_the_possible_records_for_the_next_run() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    run_flat(&app, &ext, rows(&[("x", "1")])).await?;
    ext.fail_keys(&[k("x")]);
    expect_err(run_flat(&app, &ext, rows(&[("x", "2")])).await);
    ext.heal();
    ext.clear();
    let handler = ext.handler();
    let p = bounded(app.preview(|ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        declare_target_state(&ctx, p.target_state("x", "2".to_string()))
    }))
    .await?;
    assert_eq!(
        preview_summary(&p),
        vec![(KV.to_string(), k("x"), "update")]
    );
    assert!(ext.attempts().is_empty());
    ext.clear();
    run_flat(&app, &ext, rows(&[("x", "2")])).await?;
    let seen = ext.seen(&k("x"));
    assert!(
        seen[0].missing,
        "the preview must not confirm the failed update: {seen:?}"
    );
    assert_eq!(ext.applied(), vec![ap("update", "x", Some("2"))]);
    Ok(())
}

#[tokio::test]
async fn previews_on_a_fresh_ledger_record_nothing_for_a_later_app() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    let decl = || comps(&[("A", &[("a", "1")]), ("B", &[("b", "1"), ("c", "1")])]);
    {
        let app = open(dir.path()).await?;
        for _ in 0..2 {
            let p = preview_comps(&app, &ext, decl()).await?;
            assert_eq!(preview_summary(&p).len(), 3);
            assert!(preview_summary(&p)
                .iter()
                .all(|(_, _, kind)| *kind == "create"));
        }
    }
    let app = open(dir.path()).await?;
    let stats = run_comps(&app, &ext, decl()).await?;
    assert_eq!(stats.created, 3);
    assert_eq!(
        ext.applied(),
        vec![
            ap("create", "a", Some("1")),
            ap("create", "b", Some("1")),
            ap("create", "c", Some("1")),
        ]
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// drop_state.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn drop_state_deletes_nested_states_and_a_container_alone_and_counts_exactly() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    let t = Tables::default();
    async fn full(app: &App, ext: &Ext, t: &Tables) -> Result<UpdateStats> {
        let handler = ext.handler();
        let th = t.handler(None);
        bounded(app.run(move |ctx| async move {
            let p = register_root_target_states_provider(&ctx, KV, handler)?;
            let tp = register_root_target_states_provider(&ctx, TABLES, th)?;
            declare_target_state(&ctx, p.target_state("r", "1".to_string()))?;
            let rows: TargetStateProvider<String> =
                mount_target(&ctx, tp.target_state("t", Spec { generation: 1 })).await?;
            let pa = p.clone();
            ctx.mount("a", move |c| async move {
                declare_target_state(&c, pa.target_state("a", "1".to_string()))?;
                c.mount("b", move |c| async move {
                    declare_target_state(&c, pa.target_state("b", "1".to_string()))
                })
                .await
            })
            .await?;
            ctx.mount("rows", move |c| async move {
                declare_target_state(&c, rows.target_state("row1", "1".to_string()))?;
                declare_target_state(&c, rows.target_state("row2", "1".to_string()))
            })
            .await
        }))
        .await
    }
    async fn drop_all(app: &App, ext: &Ext, t: &Tables) -> Result<UpdateStats> {
        let handler = ext.handler();
        let th = t.handler(None);
        bounded(app.drop_state(move |ctx| async move {
            register_root_target_states_provider(&ctx, KV, handler)?;
            register_root_target_states_provider(&ctx, TABLES, th)?;
            Ok(())
        }))
        .await
    }
    full(&app, &ext, &t).await?;
    assert_eq!(t.rows.store().len(), 2);
    ext.clear();
    t.clear();
    let stats = drop_all(&app, &ext, &t).await?;
    assert_eq!(
        ext.applied(),
        vec![
            ap("delete", "a", None),
            ap("delete", "b", None),
            ap("delete", "r", None)
        ]
    );
    assert_eq!(t.log(), vec!["drop t"]);
    assert_eq!(t.rows.calls(), 0, "rows go with their table");
    assert_eq!(stats.deleted, 4, "{stats:?}");
    assert_eq!((stats.created, stats.updated), (0, 0));
    // Nothing is tracked any more.
    ext.clear();
    t.clear();
    let stats = drop_all(&app, &ext, &t).await?;
    assert_eq!((ext.calls(), t.log().len(), stats.deleted), (0, 0, 0));
    // And everything is created again by a full run.
    let stats = full(&app, &ext, &t).await?;
    assert_eq!(ext.store(), smap(&[("a", "1"), ("b", "1"), ("r", "1")]));
    assert_eq!(t.rows.store(), smap(&[("row1", "1"), ("row2", "1")]));
    assert_eq!(stats.created, 6, "{stats:?}");
    Ok(())
}

#[tokio::test]
async fn a_drop_state_whose_sink_fails_for_one_key_leaves_only_it_for_the_next_drop() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    run_comps(
        &app,
        &ext,
        comps(&[
            ("A", &[("a", "1")]),
            ("B", &[("b", "1")]),
            ("C", &[("c", "1")]),
        ]),
    )
    .await?;
    async fn drop_all(app: &App, ext: &Ext) -> Result<UpdateStats> {
        let handler = ext.handler();
        bounded(app.drop_state(move |ctx| async move {
            register_root_target_states_provider(&ctx, KV, handler)?;
            Ok(())
        }))
        .await
    }
    ext.fail_keys(&[k("b")]);
    let err = expect_err(drop_all(&app, &ext).await);
    assert!(err.to_string().contains("\"b\""), "{err}");
    assert_eq!(ext.store(), smap(&[("b", "1")]));
    ext.heal();
    ext.clear();
    let stats = drop_all(&app, &ext).await?;
    assert_eq!(ext.applied(), vec![ap("delete", "b", None)]);
    assert_eq!(stats.deleted, 1);
    ext.clear();
    let stats = drop_all(&app, &ext).await?;
    assert_eq!((ext.calls(), stats.deleted), (0, 0));
    Ok(())
}

// ---------------------------------------------------------------------------
// UpdateStats.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn update_stats_are_exact_with_moves_removals_and_failed_components() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    let r = report_comps(
        &app,
        &ext,
        comps(&[
            ("A", &[("a1", "1"), ("a2", "1")]),
            ("B", &[("b1", "1")]),
            ("C", &[("c1", "1")]),
        ]),
    )
    .await?;
    let s = &r.stats;
    assert_eq!(
        (
            s.created,
            s.updated,
            s.deleted,
            s.unchanged,
            s.failed_components
        ),
        (4, 0, 0, 0, 0)
    );
    // a1 changes, a2 moves to B unchanged, C is removed, D fails in its code.
    let r = report_comps(
        &app,
        &ext,
        comps(&[
            ("A", &[("a1", "2")]),
            ("B", &[("b1", "1"), ("a2", "1")]),
            ("D", &[("d1", "1"), ("zz", "!code-fails")]),
        ]),
    )
    .await?;
    let s = &r.stats;
    assert_eq!(report_paths(&r), vec!["/D"]);
    assert_eq!(
        (
            s.created,
            s.updated,
            s.deleted,
            s.unchanged,
            s.failed_components
        ),
        (0, 1, 1, 2, 1),
        "{s:?}"
    );
    // A sink failure: B's update does not land and must not be counted.
    ext.fail_keys(&[k("b1")]);
    let r = report_comps(
        &app,
        &ext,
        comps(&[
            ("A", &[("a1", "2")]),
            ("B", &[("b1", "2"), ("a2", "1")]),
            ("D", &[("d1", "1")]),
        ]),
    )
    .await?;
    let s = &r.stats;
    assert_eq!(report_paths(&r), vec!["/B"]);
    assert_eq!(
        (s.created, s.updated, s.deleted, s.failed_components),
        (1, 0, 0, 1),
        "only what landed is counted: {s:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Batching and sink identity (guarantee 5).
// ---------------------------------------------------------------------------

#[tokio::test]
async fn one_sink_shared_by_providers_of_different_value_types_gets_their_actions_together(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    let sink = ext.sink();
    let text = Kv {
        sink: sink.clone(),
        seen: ext.seen.clone(),
    };
    let num = KvNum {
        sink,
        seen: ext.seen.clone(),
    };
    bounded(app.run(move |ctx| async move {
        let pt = register_root_target_states_provider(&ctx, "acc/text", text)?;
        let pn = register_root_target_states_provider(&ctx, "acc/num", num)?;
        ctx.mount_each(
            0..10i64,
            |i| *i,
            move |c, i| {
                let pt = pt.clone();
                let pn = pn.clone();
                async move {
                    declare_target_state(&c, pt.target_state(("t", i), format!("t{i}")))?;
                    declare_target_state(&c, pn.target_state(("n", i), i * 100))
                }
            },
        )
        .await
    }))
    .await?;
    let sizes: Vec<usize> = lock(&ext.applied).iter().map(Vec::len).collect();
    assert_eq!(
        sizes,
        vec![20],
        "one sink identity: one call for both providers"
    );
    assert_eq!(
        ext.store().get(&("n", 3i64).into_stable_key()),
        Some(&"300".to_string())
    );
    Ok(())
}

#[tokio::test]
async fn batch_policy_of_one_action_sends_every_action_alone() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open_with(dir.path(), |b| {
        b.batch_policy(BatchPolicy {
            max_actions: 1,
            linger: Duration::from_millis(1),
        })
    })
    .await?;
    let ext = Ext::new();
    let c: Comps = (0..6)
        .map(|i| {
            (
                StableKey::Int(i),
                vec![
                    (("a", i).into_stable_key(), "1".into()),
                    (("b", i).into_stable_key(), "1".into()),
                ],
            )
        })
        .collect();
    run_comps(&app, &ext, c).await?;
    let sizes: Vec<usize> = lock(&ext.applied).iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![1; 12]);
    Ok(())
}

// ---------------------------------------------------------------------------
// The App: reopening, concurrency, cancellation, shards.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_dropped_and_reopened_repeatedly_with_other_shard_counts_keeps_its_records(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    let decl = || -> Comps {
        (0..20)
            .map(|c| {
                (
                    StableKey::Int(c),
                    (0..5)
                        .map(|r| ((c, r).into_stable_key(), format!("{c}.{r}")))
                        .collect(),
                )
            })
            .collect()
    };
    for (i, shards) in [4usize, 1, 7, 2, 1].into_iter().enumerate() {
        let app = open_with(dir.path(), |b| b.shards(shards)).await?;
        ext.clear();
        let stats = run_comps(&app, &ext, decl()).await?;
        if i == 0 {
            assert_eq!(stats.created, 100);
        } else {
            assert_eq!(
                ext.calls(),
                0,
                "reopen {i} with {shards} shards: {:?}",
                ext.applied()
            );
            assert_eq!(stats.unchanged, 100);
        }
        if i % 2 == 0 {
            // Dropped on another thread.
            std::thread::spawn(move || drop(app))
                .join()
                .map_err(|_| Error::msg("drop panicked"))?;
        } else {
            drop(app);
        }
    }
    let app = open_with(dir.path(), |b| b.shards(3)).await?;
    ext.clear();
    let stats = run_comps(&app, &ext, vec![]).await?;
    assert_eq!(stats.deleted, 100);
    assert!(ext.store().is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runs_on_one_app_apply_each_change_once() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = Arc::new(open(dir.path()).await?);
    let ext = Ext::new();
    let decl = || -> Comps {
        (0..30)
            .map(|c| {
                (
                    StableKey::Int(c),
                    vec![(StableKey::Int(c), "v".to_string())],
                )
            })
            .collect()
    };
    let (a, b) = tokio::join!(run_comps(&app, &ext, decl()), run_comps(&app, &ext, decl()));
    let (a, b) = (a?, b?);
    assert_eq!(a.created + b.created, 30, "{a:?} {b:?}");
    assert_eq!(a.unchanged + b.unchanged, 30);
    let creates = ext.applied().iter().filter(|x| x.verb == "create").count();
    assert_eq!(creates, 30);
    // A run and a preview at once.
    let other = || -> Comps {
        (0..30)
            .map(|c| {
                (
                    StableKey::Int(c),
                    vec![(StableKey::Int(c), "w".to_string())],
                )
            })
            .collect()
    };
    ext.clear();
    let (r, p) = tokio::join!(
        run_comps(&app, &ext, other()),
        preview_comps(&app, &ext, other())
    );
    r?;
    let p = p?;
    assert!(
        p.len() == 30 || p.is_empty(),
        "the preview sees the state before or after: {}",
        p.len()
    );
    assert_eq!(ext.applied().len(), 30);
    ext.clear();
    run_comps(&app, &ext, other()).await?;
    assert_eq!(ext.calls(), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cancelled_midway_leaves_the_app_usable_and_converging() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    let handler = ext.handler();
    // Components that take a while; the run is dropped after 100 ms.
    let slow = app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        ctx.mount_each(
            0..20i64,
            |i| *i,
            move |c, i| {
                let p = p.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(20 * (i as u64 % 10))).await;
                    declare_target_state(&c, p.target_state(i, "old".to_string()))
                }
            },
        )
        .await
    });
    let cancelled = tokio::time::timeout(Duration::from_millis(100), slow).await;
    assert!(
        cancelled.is_err(),
        "the run should still be running at 100 ms"
    );
    let decl = || -> Comps {
        (0..20)
            .map(|c| {
                (
                    StableKey::Int(c),
                    vec![(StableKey::Int(c), "new".to_string())],
                )
            })
            .collect()
    };
    run_comps(&app, &ext, decl()).await?;
    // Let whatever the cancelled run left behind finish.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let want: BTreeMap<StableKey, String> = (0..20)
        .map(|c| (StableKey::Int(c), "new".to_string()))
        .collect();
    let mut problems = Vec::new();
    let after_new = ext.store();
    if after_new != want {
        problems.push(format!(
            "after the cancelled run and a complete run declaring \"new\", the target holds \
             {after_new:?}; applied: {:?}",
            ext.applied()
        ));
    }
    // Two more complete runs: the target must converge, and then stay.
    for i in 0..2 {
        ext.clear();
        run_comps(&app, &ext, decl()).await?;
        if ext.store() != want {
            problems.push(format!(
                "after clean run {} the target still holds {:?} (applied {:?})",
                i + 1,
                ext.store(),
                ext.applied()
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// A scenario of several runs; returns, per run, what was applied and the
/// counts.
async fn scenario(shards: usize) -> Result<Vec<(Vec<Applied>, (u64, u64, u64, u64, u64))>> {
    let dir = tempfile::tempdir()?;
    let app = open_with(dir.path(), |b| b.shards(shards)).await?;
    let ext = Ext::new();
    let gen = |round: i64| -> Comps {
        (0..25i64)
            .filter(|c| !(round >= 2 && c % 5 == 0))
            .map(|c| {
                let n = if round >= 1 && c % 3 == 0 { 2 } else { 4 };
                (
                    StableKey::Int(c),
                    (0..n)
                        .map(|r| {
                            // In round 3 the rows of c and c+1 swap owners.
                            let owner = if round >= 3 { c ^ 1 } else { c };
                            let v = if round >= 1 && r == 0 {
                                format!("{round}")
                            } else {
                                "0".into()
                            };
                            ((owner, r).into_stable_key(), v)
                        })
                        .collect(),
                )
            })
            .collect()
    };
    let mut out = Vec::new();
    for round in 0..5i64 {
        ext.clear();
        if round == 4 {
            ext.fail_keys(&[(7i64, 0i64).into_stable_key()]);
        } else {
            ext.heal();
        }
        let r = report_comps(&app, &ext, gen(round)).await?;
        let s = &r.stats;
        out.push((
            ext.applied(),
            (
                s.created,
                s.updated,
                s.deleted,
                s.unchanged,
                s.failed_components,
            ),
        ));
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shard_and_many_shards_apply_the_same_actions_and_count_the_same() -> Result<()> {
    let one = scenario(1).await?;
    let many = scenario(6).await?;
    assert_eq!(one.len(), many.len());
    for (i, (a, b)) in one.iter().zip(many.iter()).enumerate() {
        assert_eq!(a, b, "run {i} differs between 1 and 6 shards");
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Providers not registered in a run; drop_state without a provider.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn states_of_a_provider_not_registered_in_a_run_stay_tracked_until_it_is_registered_again(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    // The provider is registered by the components themselves.
    async fn go(
        app: &App,
        ext: &Ext,
        list: Vec<(&'static str, &'static str)>,
        root_registers: bool,
    ) -> Result<()> {
        let handler = Arc::new(Mutex::new(Some(ext.handler())));
        let ext2 = ext.clone();
        bounded(app.run(move |ctx| async move {
            if root_registers {
                let h = lock(&handler).take().expect("one handler");
                register_root_target_states_provider(&ctx, KV, h)?;
            }
            ctx.mount_each(
                list,
                |(c, _)| *c,
                move |c, (_, key)| {
                    let ext = ext2.clone();
                    async move {
                        let p = register_root_target_states_provider(&c, KV, ext.handler())?;
                        declare_target_state(&c, p.target_state(key, "1".to_string()))
                    }
                },
            )
            .await
        }))
        .await?;
        Ok(())
    }
    go(&app, &ext, vec![("A", "a"), ("B", "b")], false).await?;
    assert_eq!(ext.store(), smap(&[("a", "1"), ("b", "1")]));
    // B is removed; A still registers the provider: b is deleted.
    ext.clear();
    go(&app, &ext, vec![("A", "a")], false).await?;
    assert_eq!(ext.applied(), vec![ap("delete", "b", None)]);
    // Nobody registers the provider: its handler cannot be reached, so a is
    // left in place (and must stay tracked).
    ext.clear();
    let r = go(&app, &ext, vec![], false).await;
    assert_eq!(ext.store(), smap(&[("a", "1")]), "{r:?}");
    // Registered again without declaring a: a is deleted now.
    ext.clear();
    go(&app, &ext, vec![], true).await?;
    assert_eq!(
        ext.store(),
        BTreeMap::new(),
        "a state left in place while its provider was not registered must still be \\
         tracked and deleted once the provider is back; applied {:?}",
        ext.applied()
    );
    Ok(())
}

#[tokio::test]
async fn a_drop_state_that_does_not_register_a_provider_leaves_its_states_for_a_later_drop(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let one = Ext::new();
    let two = Ext::new();
    let (h1, h2) = (one.handler(), two.handler());
    bounded(app.run(move |ctx| async move {
        let p1 = register_root_target_states_provider(&ctx, "acc/one", h1)?;
        let p2 = register_root_target_states_provider(&ctx, "acc/two", h2)?;
        declare_target_state(&ctx, p1.target_state("a", "1".to_string()))?;
        declare_target_state(&ctx, p2.target_state("b", "1".to_string()))
    }))
    .await?;
    let h1 = one.handler();
    let r = bounded(app.drop_state(move |ctx| async move {
        register_root_target_states_provider(&ctx, "acc/one", h1)?;
        Ok(())
    }))
    .await;
    assert!(one.store().is_empty(), "{r:?}");
    assert_eq!(two.store(), smap(&[("b", "1")]));
    let (h1, h2) = (one.handler(), two.handler());
    let r = bounded(app.drop_state(move |ctx| async move {
        register_root_target_states_provider(&ctx, "acc/one", h1)?;
        register_root_target_states_provider(&ctx, "acc/two", h2)?;
        Ok(())
    }))
    .await;
    assert!(
        two.store().is_empty(),
        "b must still be tracked and dropped once its provider is registered: {r:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Bad input: values, records, attachments, keys.
// ---------------------------------------------------------------------------

/// A value whose serialization fails when `refuse` is set.
struct Touchy {
    refuse: bool,
}

impl Serialize for Touchy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        if self.refuse {
            Err(serde::ser::Error::custom("Touchy refuses to be serialized"))
        } else {
            s.serialize_str("touchy")
        }
    }
}

impl<'de> Deserialize<'de> for Touchy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        String::deserialize(d).map(|_| Touchy { refuse: false })
    }
}

struct TouchyKv(Kv);

impl TargetHandler<Touchy> for TouchyKv {
    type TrackingRecord = String;
    type Action = Put;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<Touchy>,
        prev: Vec<String>,
        missing: bool,
    ) -> Result<Option<TargetReconcileOutput<Put, String>>> {
        self.0
            .reconcile(key, desired.map(|_| "touchy".to_string()), prev, missing)
    }
}

#[tokio::test]
async fn a_value_that_cannot_be_serialized_is_an_error_naming_its_key() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    let handler = TouchyKv(ext.handler());
    let r = bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        ctx.mount_each(
            vec!["bad", "good"],
            |c| *c,
            move |c, name| {
                let p = p.clone();
                async move {
                    let refuse = name == "bad";
                    declare_target_state(
                        &c,
                        p.target_state(format!("{name}-key"), Touchy { refuse }),
                    )
                }
            },
        )
        .await
    }))
    .await;
    let err = expect_err(r);
    assert_eq!(failed_paths(&err), vec!["/bad"], "{err}");
    let cause = &err.failed_components()[0].cause;
    assert!(
        cause.contains("bad-key"),
        "the error names the key: {cause}"
    );
    assert_eq!(ext.store(), smap(&[("good-key", "touchy")]));
    Ok(())
}

/// The kv target with numeric tracking records: a later version of a
/// connector whose record type changed.
struct NumRecords(Ext);

impl TargetHandler<String> for NumRecords {
    type TrackingRecord = u64;
    type Action = Put;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<String>,
        prev: Vec<u64>,
        missing: bool,
    ) -> Result<Option<TargetReconcileOutput<Put, u64>>> {
        let _ = (prev, missing);
        Ok(Some(TargetReconcileOutput {
            action: TargetAction::Update(Put {
                key,
                value: desired.clone(),
            }),
            sink: self.0.sink(),
            tracking_record: desired.map(|d| d.len() as u64),
            child_invalidation: None,
        }))
    }
}

#[tokio::test]
async fn a_tracking_record_of_another_type_is_an_error_naming_provider_and_key() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    let other = Ext::new();
    run_flat(&app, &ext, rows(&[("x", "1")])).await?;
    let h = NumRecords(ext.clone());
    let o = other.handler();
    let r = bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, h)?;
        let po = register_root_target_states_provider(&ctx, "acc/other", o)?;
        ctx.mount("m", move |c| async move {
            declare_target_state(&c, p.target_state("x", "2".to_string()))
        })
        .await
        .ok();
        ctx.mount("o", move |c| async move {
            declare_target_state(&c, po.target_state("o", "1".to_string()))
        })
        .await
    }))
    .await;
    let err = expect_err(r);
    assert!(failed_paths(&err).contains(&"/m".to_string()), "{err}");
    let text = err.to_string();
    for part in [KV, "\"x\""] {
        assert!(text.contains(part), "the error names {part}: {text}");
    }
    assert_eq!(other.store(), smap(&[("o", "1")]));
    assert_eq!(ext.store(), smap(&[("x", "1")]));
    Ok(())
}

#[tokio::test]
async fn asking_for_an_attachment_with_the_wrong_value_type_is_an_error() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let main = Ext::new();
    let att = Ext::new();
    let handler = Main {
        sink: main.sink(),
        seen: main.seen.clone(),
        att: att.clone(),
    };
    let r = bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, "acc/main", handler)?;
        declare_target_state(&ctx, p.target_state("row", "v".to_string()))?;
        let wrong: Result<TargetStateProvider<i64>> = p.attachment(&ctx, "index");
        match wrong {
            Ok(a) => declare_target_state(&ctx, a.target_state("i", 5)),
            Err(e) => Err(e),
        }
    }))
    .await;
    let err = expect_err(r);
    assert!(
        err.to_string().contains("index"),
        "the error names the attachment: {err}"
    );
    assert!(att.store().is_empty());
    Ok(())
}

/// A kv target that keys the store by the key's text, so that the action
/// does not carry the (possibly very deep) key itself.
struct TextKv(Kv);

impl TargetHandler<String> for TextKv {
    type TrackingRecord = String;
    type Action = Put;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<String>,
        prev: Vec<String>,
        missing: bool,
    ) -> Result<Option<TargetReconcileOutput<Put, String>>> {
        let depth = {
            let mut d = 0;
            let mut k = &key;
            while let StableKey::Array(items) = k {
                d += 1;
                match items.first() {
                    Some(inner) => k = inner,
                    None => break,
                }
            }
            d
        };
        self.0.reconcile(
            StableKey::Str(Arc::from(format!("depth{depth}"))),
            desired,
            prev,
            missing,
        )
    }
}

fn nested_key(depth: usize) -> StableKey {
    let mut key = StableKey::Int(0);
    for _ in 0..depth {
        key = StableKey::Array(Arc::from(vec![key]));
    }
    key
}

async fn run_deep(app: &App, ext: &Ext, depths: Vec<usize>) -> Result<RunReport> {
    let handler = TextKv(ext.handler());
    bounded(app.run_report(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        ctx.mount_each(depths, |d| *d as i64, move |c, d| {
            let p = p.clone();
            async move { declare_target_state(&c, p.target_state(nested_key(d), "v".to_string())) }
        })
        .await
    }))
    .await
}

#[tokio::test]
async fn a_key_nested_two_hundred_deep_is_tracked_across_a_reopen() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    {
        let app = open(dir.path()).await?;
        let r = run_deep(&app, &ext, vec![1, 200]).await?;
        assert!(r.failures.is_empty(), "{:?}", r.failures);
        assert_eq!(ext.store(), smap(&[("depth1", "v"), ("depth200", "v")]));
    }
    let app = open(dir.path()).await?;
    ext.clear();
    run_deep(&app, &ext, vec![1, 200]).await?;
    assert_eq!(ext.calls(), 0, "{:?}", ext.applied());
    run_deep(&app, &ext, vec![1]).await?;
    assert_eq!(ext.applied(), vec![ap("delete", "depth200", None)]);
    Ok(())
}

#[tokio::test]
async fn a_key_nested_a_thousand_deep_fails_cleanly_or_works_and_never_crashes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    {
        let app = open(dir.path()).await?;
        // (Deeper keys overflow a 2 MiB test thread in std's own clone and
        // drop in debug builds, so 1,000 is as deep as is fair.)
        let r = run_deep(&app, &ext, vec![1, 1000]).await?;
        assert!(
            report_paths(&r).iter().all(|p| p == "/1000"),
            "only the deep one may fail: {:?}",
            r.failures
        );
        assert_eq!(ext.store().get(&k("depth1")), Some(&"v".to_string()));
    }
    // The ledger opens again and the next run is sane.
    let app = open(dir.path()).await?;
    ext.clear();
    let r = run_deep(&app, &ext, vec![1]).await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(ext.store(), smap(&[("depth1", "v")]));
    Ok(())
}

// ---------------------------------------------------------------------------
// More failure interplay.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_state_moved_into_a_component_whose_apply_failed_is_deleted_once_nobody_declares_it(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    run_comps(
        &app,
        &ext,
        comps(&[("A", &[("x", "1")]), ("K", &[("k", "1")])]),
    )
    .await?;
    // A is removed; B takes x with a new value, and the sink rejects it.
    ext.fail_keys(&[k("x")]);
    let err = expect_err(
        run_comps(
            &app,
            &ext,
            comps(&[("B", &[("x", "2")]), ("K", &[("k", "1")])]),
        )
        .await,
    );
    assert_eq!(failed_paths(&err), vec!["/B"], "{err}");
    assert_eq!(ext.store(), smap(&[("k", "1"), ("x", "1")]));
    // Nobody declares x any more: it is deleted, once.
    ext.heal();
    ext.clear();
    run_comps(&app, &ext, comps(&[("K", &[("k", "1")])])).await?;
    assert_eq!(ext.applied(), vec![ap("delete", "x", None)]);
    ext.clear();
    run_comps(&app, &ext, comps(&[("K", &[("k", "1")])])).await?;
    assert_eq!(ext.calls(), 0, "{:?}", ext.applied());
    assert_eq!(ext.store(), smap(&[("k", "1")]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_whose_code_panics_fails_alone_and_keeps_its_earlier_states() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    async fn go(
        app: &App,
        ext: &Ext,
        list: Vec<(&'static str, &'static str)>,
    ) -> Result<RunReport> {
        let handler = ext.handler();
        bounded(app.run_report(move |ctx| async move {
            let p = register_root_target_states_provider(&ctx, KV, handler)?;
            ctx.mount_each(
                list,
                |(c, _)| *c,
                move |c, (name, v)| {
                    let p = p.clone();
                    async move {
                        if v == "panic" {
                            panic!("user code panics in {name}");
                        }
                        declare_target_state(&c, p.target_state(format!("{name}x"), v.to_string()))
                    }
                },
            )
            .await
        }))
        .await
    }
    go(&app, &ext, vec![("A", "1"), ("B", "1")]).await?;
    ext.clear();
    let r = go(&app, &ext, vec![("A", "panic"), ("B", "2")]).await?;
    assert_eq!(report_paths(&r), vec!["/A"]);
    assert_eq!(ext.store(), smap(&[("Ax", "1"), ("Bx", "2")]));
    ext.clear();
    let r = go(&app, &ext, vec![("B", "2")]).await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(ext.applied(), vec![ap("delete", "Ax", None)]);
    Ok(())
}

#[tokio::test]
async fn a_preview_with_a_failing_component_records_no_failure_in_the_ledger() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let ext = Ext::new();
    run_comps(
        &app,
        &ext,
        comps(&[("A", &[("a", "1")]), ("B", &[("b", "1")])]),
    )
    .await?;
    ext.clear();
    let handler = ext.handler();
    let r = bounded(app.preview(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        ctx.mount_each(
            vec!["A", "B"],
            |c| *c,
            move |c, name| {
                let p = p.clone();
                async move {
                    if name == "A" {
                        return Err(Error::msg("A fails in the preview"));
                    }
                    declare_target_state(&c, p.target_state("b", "2".to_string()))
                }
            },
        )
        .await
    }))
    .await;
    let err = expect_err(r);
    assert_eq!(failed_paths(&err), vec!["/A"], "{err}");
    let report = app.inspect().await?;
    assert!(
        report.failures.is_empty(),
        "a preview writes nothing to the ledger, yet it holds failures {:?}",
        report.failures
    );
    assert!(ext.attempts().is_empty());
    Ok(())
}

/// A sink over `ext` whose calls carrying the value `"old"` first announce
/// themselves on `entered` and then wait for `gate`.
fn gated_sink(
    ext: &Ext,
    entered: Arc<tokio::sync::Notify>,
    gate: Arc<tokio::sync::Semaphore>,
) -> TargetActionSink<Put> {
    let inner = ext.sink();
    let _ = inner;
    let ext = ext.clone();
    TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<Put>>| {
        let ext = ext.clone();
        let entered = entered.clone();
        let gate = gate.clone();
        async move {
            let old = actions.iter().any(|a| match a {
                TargetAction::Create(p) | TargetAction::Update(p) | TargetAction::Delete(p) => {
                    p.value.as_deref() == Some("old")
                }
            });
            if old {
                entered.notify_one();
                let _permit = gate
                    .acquire()
                    .await
                    .map_err(|e| Error::msg(e.to_string()))?;
            }
            let mut store = lock(&ext.store);
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
            lock(&ext.applied).push(call);
            Ok(())
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_call_of_a_cancelled_run_finishing_late_leaves_no_lasting_divergence() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let app = Arc::new(open(dir.path()).await?);
    let ext = Ext::new();
    run_flat(&app, &ext, rows(&[("x", "v0")])).await?;

    // Run 1 declares "old"; its sink call hangs until the gate opens, and
    // the run's future is dropped meanwhile (a caller's timeout).
    let entered = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let handler = Kv {
        sink: gated_sink(&ext, entered.clone(), gate.clone()),
        seen: ext.seen.clone(),
    };
    let run1 = app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, handler)?;
        declare_target_state(&ctx, p.target_state("x", "old".to_string()))
    });
    let wait_entered = entered.notified();
    tokio::select! {
        r = run1 => panic!("run 1 should hang in its sink, it returned {r:?}"),
        _ = wait_entered => {}
    }
    // Run 2 declares "new"; give it a moment, then let run 1's call finish.
    let app2 = Arc::clone(&app);
    let ext2 = ext.clone();
    let run2 = tokio::spawn(async move { run_flat(&app2, &ext2, rows(&[("x", "new")])).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let run2_done_before_release = run2.is_finished();
    gate.add_permits(1);
    let r2 = bounded(run2).await.map_err(|e| Error::msg(e.to_string()))?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Whatever happened, one more clean run must leave the target at "new".
    ext.clear();
    let r3 = run_flat(&app, &ext, rows(&[("x", "new")])).await;
    assert_eq!(
        ext.store(),
        smap(&[("x", "new")]),
        "run 2 finished before the release: {run2_done_before_release}, run 2: {r2:?}, \
         run 3: {r3:?}, run 3 reconcile saw {:?}",
        ext.seen(&k("x"))
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// More containers: nested containers, attachments of rows, failing
// components, two components mounting one container.
// ---------------------------------------------------------------------------

/// A database container whose children are tables (containers of rows).
#[derive(Clone, Default)]
struct Db {
    log: Arc<Mutex<Vec<String>>>,
    tables: Tables,
}

impl Db {
    fn handler(&self, invalidation: Option<TargetChildInvalidation>) -> Table {
        let log = self.log.clone();
        let rows = self.tables.rows.store.clone();
        let tables = self.tables.clone();
        let sink = TargetActionSink::from_async_fn_with_child_handler(
            move |actions: Vec<TargetAction<TableAct>>| {
                let log = log.clone();
                let rows = rows.clone();
                async move {
                    for a in actions {
                        let v = verb(&a);
                        let t = payload(a);
                        if v == "delete" || t.recreate {
                            // Every table and row of the database is gone.
                            lock(&rows).clear();
                        }
                        let what = match (v, t.recreate) {
                            ("delete", _) => "drop",
                            (_, true) => "recreate",
                            ("create", _) => "create",
                            _ => "ensure",
                        };
                        lock(&log).push(format!("{what} {}", t.name));
                    }
                    Ok(())
                }
            },
            move |_: &TableAct| Ok(ChildTargetDef::new::<Spec, _>(tables.handler(None))),
        );
        Table { sink, invalidation }
    }
}

async fn run_db(
    app: &App,
    db: &Db,
    invalidation: Option<TargetChildInvalidation>,
    generation: Option<u32>,
    comps: Comps,
) -> Result<RunReport> {
    let handler = db.handler(invalidation);
    bounded(app.run_report(move |ctx| async move {
        let dp = register_root_target_states_provider(&ctx, "acc/db", handler)?;
        let Some(g) = generation else {
            return Ok(());
        };
        let tables: TargetStateProvider<Spec> =
            mount_target(&ctx, dp.target_state("main", Spec { generation: g })).await?;
        let rows: TargetStateProvider<String> =
            mount_target(&ctx, tables.target_state("t", Spec { generation: 1 })).await?;
        ctx.mount_each(
            comps,
            |(c, _): &(StableKey, Vec<(StableKey, String)>)| c.clone(),
            move |c, (_, list)| {
                let rows = rows.clone();
                async move {
                    for (key, v) in list {
                        declare_target_state(&c, rows.target_state(key, v))?;
                    }
                    Ok(())
                }
            },
        )
        .await
    }))
    .await
}

#[tokio::test]
async fn a_destructive_change_of_an_outer_container_recreates_inner_containers_and_their_rows(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let db = Db::default();
    let inv = Some(TargetChildInvalidation::Destructive);
    let cs = || comps(&[("c1", &[("a", "1")]), ("c2", &[("b", "1")])]);
    let r = run_db(&app, &db, inv, Some(1), cs()).await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(db.tables.rows.store(), smap(&[("a", "1"), ("b", "1")]));
    lock(&db.log).clear();
    db.tables.clear();
    let r = run_db(&app, &db, inv, Some(2), cs()).await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(lock(&db.log).clone(), vec!["recreate main"]);
    assert_eq!(
        db.tables.log(),
        vec!["create t"],
        "the table's record went with the database, so it is created again"
    );
    let after_change = (
        db.tables.rows.store(),
        db.tables.rows.applied(),
        db.tables.rows.seen(&k("a")),
    );
    // One more run with nothing changed.
    db.tables.clear();
    run_db(&app, &db, inv, Some(2), cs()).await?;
    assert_eq!(
        db.tables.rows.store(),
        smap(&[("a", "1"), ("b", "1")]),
        "the rows went with the database and must be created again; after the change the \
         rows were {:?}, applied {:?}, row a's reconcile saw {:?}; a further run saw {:?}",
        after_change.0,
        after_change.1,
        after_change.2,
        db.tables.rows.seen(&k("a"))
    );
    assert_eq!(after_change.0, smap(&[("a", "1"), ("b", "1")]));
    Ok(())
}

#[tokio::test]
async fn an_outer_container_dropped_and_declared_again_creates_everything_below_afresh(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let db = Db::default();
    let cs = || comps(&[("c1", &[("a", "1")]), ("c2", &[("b", "1")])]);
    run_db(&app, &db, None, Some(1), cs()).await?;
    lock(&db.log).clear();
    db.tables.clear();
    let r = run_db(&app, &db, None, None, vec![]).await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(lock(&db.log).clone(), vec!["drop main"]);
    assert!(
        db.tables.log().is_empty(),
        "only the database's own delete runs"
    );
    assert_eq!(db.tables.rows.calls(), 0);
    lock(&db.log).clear();
    db.tables.clear();
    run_db(&app, &db, None, Some(1), cs()).await?;
    assert_eq!(db.tables.log(), vec!["create t"]);
    assert_eq!(db.tables.rows.store(), smap(&[("a", "1"), ("b", "1")]));
    Ok(())
}

async fn run_indexed_table(
    app: &App,
    t: &Tables,
    att: &Ext,
    generation: Option<u32>,
) -> Result<RunReport> {
    let handler = t.handler_with_index(Some(TargetChildInvalidation::Destructive), att);
    bounded(app.run_report(move |ctx| async move {
        let tp = register_root_target_states_provider(&ctx, TABLES, handler)?;
        let Some(g) = generation else {
            return Ok(());
        };
        let rows: TargetStateProvider<String> =
            mount_target(&ctx, tp.target_state("t", Spec { generation: g })).await?;
        ctx.mount("c1", move |c| async move {
            declare_target_state(&c, rows.target_state("a", "1".to_string()))?;
            let idx: TargetStateProvider<String> = rows.attachment(&c, "index")?;
            declare_target_state(&c, idx.target_state("i", "spec".to_string()))
        })
        .await
    }))
    .await
}

#[tokio::test]
async fn attachments_of_a_containers_rows_are_created_again_after_a_destructive_change(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let t = Tables::default();
    let att = Ext::new();
    let r = run_indexed_table(&app, &t, &att, Some(1)).await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(att.store(), smap(&[("i", "spec")]));
    att.clear();
    t.clear();
    let r = run_indexed_table(&app, &t, &att, Some(2)).await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(t.log(), vec!["recreate t"]);
    assert_eq!(t.rows.store(), smap(&[("a", "1")]));
    assert_eq!(
        att.store(),
        smap(&[("i", "spec")]),
        "the index went with the recreated table and must be created again; applied {:?}",
        att.applied()
    );
    // Dropped with its table, and created afresh when the table comes back.
    att.clear();
    t.clear();
    run_indexed_table(&app, &t, &att, None).await?;
    assert_eq!(t.log(), vec!["drop t"]);
    assert_eq!(att.calls(), 0, "{:?}", att.applied());
    run_indexed_table(&app, &t, &att, Some(2)).await?;
    assert_eq!(att.store(), smap(&[("i", "spec")]), "{:?}", att.applied());
    Ok(())
}

async fn run_table_in_one_component(
    app: &App,
    t: &Tables,
    generation: u32,
    list: Vec<(&'static str, &'static str)>,
    fail: bool,
) -> Result<RunReport> {
    let handler = t.handler(Some(TargetChildInvalidation::Destructive));
    bounded(app.run_report(move |ctx| async move {
        let tp = register_root_target_states_provider(&ctx, TABLES, handler)?;
        ctx.mount("C", move |c| async move {
            let rows: TargetStateProvider<String> =
                declare_target_state_with_child(&c, tp.target_state("t", Spec { generation }))?;
            for (key, v) in list {
                declare_target_state(&c, rows.target_state(key, v.to_string()))?;
            }
            if fail {
                return Err(Error::msg("C fails after declaring"));
            }
            Ok(())
        })
        .await
        .ok();
        Ok(())
    }))
    .await
}

#[tokio::test]
async fn a_container_change_declared_by_a_component_that_fails_applies_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let t = Tables::default();
    let r = run_table_in_one_component(&app, &t, 1, vec![("a", "1"), ("b", "1")], false).await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(t.rows.store(), smap(&[("a", "1"), ("b", "1")]));
    t.clear();
    let r = run_table_in_one_component(&app, &t, 2, vec![("a", "2")], true).await?;
    assert_eq!(report_paths(&r), vec!["/C"]);
    assert!(
        t.log().is_empty(),
        "the failed component applies nothing: {:?}",
        t.log()
    );
    assert_eq!(t.rows.store(), smap(&[("a", "1"), ("b", "1")]));
    t.clear();
    let r = run_table_in_one_component(&app, &t, 2, vec![("a", "2")], false).await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(t.log(), vec!["recreate t"]);
    assert_eq!(t.rows.applied(), vec![ap("create", "a", Some("2"))]);
    assert_eq!(t.rows.store(), smap(&[("a", "2")]));
    Ok(())
}

#[tokio::test]
async fn two_components_mounting_one_container_is_a_duplicate_failing_one_of_them() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let t = Tables::default();
    let handler = t.handler(None);
    let r = bounded(app.run_report(move |ctx| async move {
        let tp = register_root_target_states_provider(&ctx, TABLES, handler)?;
        ctx.mount_each(
            vec!["X", "Y"],
            |c| *c,
            move |c, name| {
                let tp = tp.clone();
                async move {
                    let rows: TargetStateProvider<String> =
                        mount_target(&c, tp.target_state("t", Spec { generation: 1 })).await?;
                    declare_target_state(&c, rows.target_state(name, "1".to_string()))
                }
            },
        )
        .await
    }))
    .await?;
    // The loser and its mount_target child fail; the winner does not.
    let paths = report_paths(&r);
    assert!(!paths.is_empty());
    let loser = if paths[0].starts_with("/X") {
        "/X"
    } else {
        "/Y"
    };
    assert!(
        paths.iter().all(|p| p.starts_with(loser)),
        "{:?}",
        r.failures
    );
    assert!(
        r.failures.iter().all(|f| f.cause.contains("\"t\"")),
        "{:?}",
        r.failures
    );
    let winner = if loser == "/X" { "Y" } else { "X" };
    assert_eq!(t.rows.store(), smap(&[(winner, "1")]));
    Ok(())
}

#[tokio::test]
async fn a_row_moving_to_another_component_during_a_destructive_change_is_created_again(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let t = Tables::default();
    let inv = Some(TargetChildInvalidation::Destructive);
    run_table(
        &app,
        &t,
        inv,
        Some(1),
        comps(&[("c1", &[("a", "1")]), ("c2", &[])]),
    )
    .await?;
    t.clear();
    let r = run_table(
        &app,
        &t,
        inv,
        Some(2),
        comps(&[("c1", &[]), ("c2", &[("a", "1")])]),
    )
    .await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(t.log(), vec!["recreate t"]);
    assert_eq!(
        t.rows.store(),
        smap(&[("a", "1")]),
        "applied {:?}, a's reconcile saw {:?}",
        t.rows.applied(),
        t.rows.seen(&k("a"))
    );
    Ok(())
}

// A container and its rows sharing one sink identity.

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
enum Act {
    Table {
        name: String,
        recreate: bool,
    },
    Row {
        key: StableKey,
        value: Option<String>,
    },
}

#[derive(Clone, Default)]
struct SharedDb {
    tables: Arc<Mutex<BTreeSet<String>>>,
    rows: Arc<Mutex<BTreeMap<StableKey, String>>>,
    calls: Arc<Mutex<Vec<Vec<String>>>>,
}

struct SharedTable {
    sink: TargetActionSink<Act>,
    invalidation: Option<TargetChildInvalidation>,
}

struct SharedRows {
    sink: TargetActionSink<Act>,
}

impl TargetHandler<Spec> for SharedTable {
    type TrackingRecord = Spec;
    type Action = Act;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<Spec>,
        prev: Vec<Spec>,
        _missing: bool,
    ) -> Result<Option<TargetReconcileOutput<Act, Spec>>> {
        let name = key.to_string();
        Ok(Some(match desired {
            Some(spec) => {
                let changed = !prev.is_empty() && !prev.contains(&spec);
                let inv = if changed { self.invalidation } else { None };
                let act = Act::Table {
                    name,
                    recreate: inv == Some(TargetChildInvalidation::Destructive),
                };
                TargetReconcileOutput {
                    action: if prev.is_empty() {
                        TargetAction::Create(act)
                    } else {
                        TargetAction::Update(act)
                    },
                    sink: self.sink.clone(),
                    tracking_record: Some(spec),
                    child_invalidation: inv,
                }
            }
            None => TargetReconcileOutput {
                action: TargetAction::Delete(Act::Table {
                    name,
                    recreate: false,
                }),
                sink: self.sink.clone(),
                tracking_record: None,
                child_invalidation: Some(TargetChildInvalidation::Destructive),
            },
        }))
    }
}

impl TargetHandler<String> for SharedRows {
    type TrackingRecord = String;
    type Action = Act;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<String>,
        prev: Vec<String>,
        missing: bool,
    ) -> Result<Option<TargetReconcileOutput<Act, String>>> {
        let action = match &desired {
            Some(v) if !missing && !prev.is_empty() && prev.iter().all(|p| p == v) => {
                return Ok(None)
            }
            Some(v) if prev.is_empty() => TargetAction::Create(Act::Row {
                key,
                value: Some(v.clone()),
            }),
            Some(v) => TargetAction::Update(Act::Row {
                key,
                value: Some(v.clone()),
            }),
            None if prev.is_empty() && !missing => return Ok(None),
            None => TargetAction::Delete(Act::Row { key, value: None }),
        };
        Ok(Some(TargetReconcileOutput {
            action,
            sink: self.sink.clone(),
            tracking_record: desired,
            child_invalidation: None,
        }))
    }
}

impl SharedDb {
    /// One sink for the table and its rows; a row written while its table
    /// does not exist fails the call ("no such table").
    fn handler(&self, invalidation: Option<TargetChildInvalidation>) -> SharedTable {
        let cell: Arc<std::sync::OnceLock<TargetActionSink<Act>>> = Arc::default();
        let db = self.clone();
        let cell2 = Arc::clone(&cell);
        let sink = TargetActionSink::from_async_fn_with_child_handler(
            move |actions: Vec<TargetAction<Act>>| {
                let db = db.clone();
                async move {
                    let mut tables = lock(&db.tables);
                    let mut rows = lock(&db.rows);
                    let mut log = Vec::new();
                    for a in actions {
                        let v = verb(&a);
                        match payload(a) {
                            Act::Table { name, recreate } => {
                                if v == "delete" || recreate {
                                    tables.remove(&name);
                                    rows.clear();
                                }
                                if v != "delete" {
                                    tables.insert(name.clone());
                                }
                                log.push(format!(
                                    "{v} table{} {name}",
                                    if recreate { " (recreate)" } else { "" }
                                ));
                            }
                            Act::Row { key, value } => {
                                if tables.is_empty() {
                                    return Err(Error::permanent(format!(
                                        "no such table for row {key}"
                                    )));
                                }
                                log.push(format!("{v} row {key}"));
                                match value {
                                    Some(val) => rows.insert(key, val),
                                    None => rows.remove(&key),
                                };
                            }
                        }
                    }
                    lock(&db.calls).push(log);
                    Ok(())
                }
            },
            move |_: &Act| {
                let sink = cell2
                    .get()
                    .cloned()
                    .ok_or_else(|| Error::msg("the shared sink is not set"))?;
                Ok(ChildTargetDef::new::<String, _>(SharedRows { sink }))
            },
        );
        let _ = cell.set(sink.clone());
        SharedTable { sink, invalidation }
    }
}

async fn run_shared(
    app: &App,
    db: &SharedDb,
    generation: Option<u32>,
    list: Vec<(&'static str, &'static str)>,
) -> Result<RunReport> {
    let handler = db.handler(Some(TargetChildInvalidation::Destructive));
    bounded(app.run_report(move |ctx| async move {
        let tp = register_root_target_states_provider(&ctx, TABLES, handler)?;
        if let Some(g) = generation {
            let rows: TargetStateProvider<String> = declare_target_state_with_child(
                &ctx,
                tp.target_state("t", Spec { generation: g }),
            )?;
            for (key, v) in list {
                declare_target_state(&ctx, rows.target_state(key, v.to_string()))?;
            }
        }
        Ok(())
    }))
    .await
}

#[tokio::test]
async fn a_container_sharing_its_sink_with_its_rows_is_applied_before_them() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let db = SharedDb::default();
    let r = run_shared(&app, &db, Some(1), vec![("a", "1"), ("b", "1")]).await?;
    assert!(
        r.failures.is_empty(),
        "rows were applied before their table: {:?}; calls {:?}",
        r.failures,
        lock(&db.calls)
    );
    assert_eq!(lock(&db.rows).clone(), smap(&[("a", "1"), ("b", "1")]));
    // A destructive change: the table is recreated, then the rows again.
    lock(&db.calls).clear();
    let r = run_shared(&app, &db, Some(2), vec![("a", "1"), ("b", "2")]).await?;
    assert!(
        r.failures.is_empty(),
        "{:?}; calls {:?}",
        r.failures,
        lock(&db.calls)
    );
    assert_eq!(
        lock(&db.rows).clone(),
        smap(&[("a", "1"), ("b", "2")]),
        "calls {:?}",
        lock(&db.calls)
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Crashes (guarantee 7): the process is killed at the engine's fault points
// (`WEIR_FAULT_KILL`, the root package's tests build the engine with them)
// during a run with moves, removals and a destructive container change; a
// file-backed store survives the kill; after recovery a clean run converges
// and a further run calls no sink.
// ---------------------------------------------------------------------------

const CRASH_DIR: &str = "ACCEPT_CRASH_DIR";
const CRASH_POINTS: [&str; 4] = [
    "reconcile.batch",
    "sink.before_apply",
    "sink.after_apply",
    "ledger.group_commit",
];

/// An external system that lives in a file: each sink call appends its
/// lines in one write.
#[derive(Clone)]
struct FileStore {
    path: std::path::PathBuf,
}

impl FileStore {
    fn append(&self, text: String) -> Result<()> {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        f.write_all(text.as_bytes())?;
        Ok(())
    }

    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.path)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The table (if any) and the rows (kv rows and table rows), replayed
    /// from the file.
    fn state(&self) -> (bool, BTreeMap<String, String>) {
        let mut table = false;
        let mut kv = BTreeMap::new();
        let mut trows = BTreeMap::new();
        for line in self.lines() {
            let parts: Vec<&str> = line.splitn(3, ' ').collect();
            match parts.as_slice() {
                ["set", key, value] => {
                    kv.insert(key.to_string(), value.to_string());
                }
                ["del", key] => {
                    kv.remove(*key);
                }
                ["tset", key, value] => {
                    trows.insert(key.to_string(), value.to_string());
                }
                ["tdel", key] => {
                    trows.remove(*key);
                }
                ["table", "create" | "ensure"] => table = true,
                ["table", "recreate"] => {
                    table = true;
                    trows.clear();
                }
                ["table", "drop"] => {
                    table = false;
                    trows.clear();
                }
                _ => {}
            }
        }
        kv.extend(trows);
        (table, kv)
    }

    fn row_sink(&self) -> TargetActionSink<Put> {
        self.row_sink_with("")
    }

    fn row_sink_with(&self, prefix: &'static str) -> TargetActionSink<Put> {
        let fs = self.clone();
        TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<Put>>| {
            let fs = fs.clone();
            async move {
                let mut text = String::new();
                for a in actions {
                    let p = payload(a);
                    let key = match &p.key {
                        StableKey::Str(s) => s.to_string(),
                        other => other.to_string(),
                    };
                    match p.value {
                        Some(v) => text.push_str(&format!("{prefix}set {key} {v}\n")),
                        None => text.push_str(&format!("{prefix}del {key}\n")),
                    }
                }
                fs.append(text)
            }
        })
    }

    fn kv(&self) -> Kv {
        Kv {
            sink: self.row_sink(),
            seen: Arc::default(),
        }
    }

    fn table(&self) -> Table {
        let fs = self.clone();
        let rows = self.row_sink_with("t");
        let sink = TargetActionSink::from_async_fn_with_child_handler(
            move |actions: Vec<TargetAction<TableAct>>| {
                let fs = fs.clone();
                async move {
                    let mut text = String::new();
                    for a in actions {
                        let v = verb(&a);
                        let t = payload(a);
                        let what = match (v, t.recreate) {
                            ("delete", _) => "drop",
                            (_, true) => "recreate",
                            ("create", _) => "create",
                            _ => "ensure",
                        };
                        text.push_str(&format!("table {what}\n"));
                    }
                    fs.append(text)
                }
            },
            move |_: &TableAct| {
                Ok(ChildTargetDef::new::<String, _>(Kv {
                    sink: rows.clone(),
                    seen: Arc::default(),
                }))
            },
        );
        Table {
            sink,
            invalidation: Some(TargetChildInvalidation::Destructive),
        }
    }
}

/// The declarations of each phase: (table generation, components with
/// their kv rows, components with their table rows).
type Phase = (
    u32,
    Vec<(&'static str, Vec<(&'static str, &'static str)>)>,
    Vec<(&'static str, Vec<(&'static str, &'static str)>)>,
);

fn crash_phase(phase: u8) -> Phase {
    if phase == 0 {
        let kv: Vec<_> = (0..12)
            .map(|c| {
                let name: &'static str = Box::leak(format!("k{c:02}").into_boxed_str());
                let rows: Vec<(&'static str, &'static str)> = (0..3)
                    .map(|r| {
                        let key: &'static str = Box::leak(format!("{name}.{r}").into_boxed_str());
                        (key, "v0")
                    })
                    .collect();
                (name, rows)
            })
            .collect();
        let table = vec![
            ("t1", vec![("ra", "1"), ("rb", "1")]),
            ("t2", vec![("rc", "1")]),
        ];
        (1, kv, table)
    } else {
        // Every other component changes its first row; k00's rows move to
        // k01; k02..k04 are removed; a new component appears; the table is
        // recreated (destructive) and t2's row moves to t1.
        let (_, kv0, _) = crash_phase(0);
        let mut kv: Vec<(&'static str, Vec<(&'static str, &'static str)>)> = Vec::new();
        let moved = kv0[0].1.clone();
        for (i, (name, rows)) in kv0.into_iter().enumerate() {
            match i {
                0 => kv.push((name, vec![])),
                1 => {
                    let mut rows = rows;
                    rows.extend(moved.iter().map(|(k, _)| (*k, "v1")));
                    kv.push((name, rows));
                }
                2..=4 => {}
                _ => {
                    let rows = rows
                        .into_iter()
                        .enumerate()
                        .map(|(r, (k, v))| (k, if r == 0 && i % 2 == 1 { "v1" } else { v }))
                        .collect();
                    kv.push((name, rows));
                }
            }
        }
        kv.push(("k99", vec![("k99.0", "v1")]));
        let table = vec![("t1", vec![("ra", "1"), ("rc", "2")]), ("t2", vec![])];
        (2, kv, table)
    }
}

fn crash_expected() -> (bool, BTreeMap<String, String>) {
    let (_, kv, table) = crash_phase(1);
    let mut rows = BTreeMap::new();
    for (_, list) in kv.into_iter().chain(table) {
        for (k, v) in list {
            rows.insert(k.to_string(), v.to_string());
        }
    }
    (true, rows)
}

async fn crash_run(app: &App, fs: &FileStore, phase: u8) -> Result<UpdateStats> {
    let (generation, kv, table) = crash_phase(phase);
    let kvh = fs.kv();
    let th = fs.table();
    bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, kvh)?;
        let tp = register_root_target_states_provider(&ctx, TABLES, th)?;
        let rows: TargetStateProvider<String> =
            mount_target(&ctx, tp.target_state("t", Spec { generation })).await?;
        ctx.mount_each(
            kv,
            |(c, _)| *c,
            move |c, (_, list)| {
                let p = p.clone();
                async move {
                    for (k, v) in list {
                        declare_target_state(&c, p.target_state(k, v.to_string()))?;
                    }
                    Ok(())
                }
            },
        )
        .await?;
        ctx.mount_each(
            table,
            |(c, _)| *c,
            move |c, (_, list)| {
                let rows = rows.clone();
                async move {
                    for (k, v) in list {
                        declare_target_state(&c, rows.target_state(k, v.to_string()))?;
                    }
                    Ok(())
                }
            },
        )
        .await
    }))
    .await
}

async fn open_crash_app(dir: &Path) -> Result<App> {
    open_with(dir, |b| {
        b.batch_policy(BatchPolicy {
            max_actions: 4,
            linger: Duration::from_millis(2),
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_killed_at_any_fault_point_converges_exactly_on_the_next_clean_run() -> Result<()> {
    if let Some(dir) = std::env::var_os(CRASH_DIR) {
        // The child: run phase 1 and (unless killed) exit normally.
        let dir = std::path::PathBuf::from(dir);
        let fs = FileStore {
            path: dir.join("store.log"),
        };
        let app = open_crash_app(&dir).await?;
        crash_run(&app, &fs, 1).await?;
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    let mut problems = Vec::new();
    let mut fired = 0;
    let mut plans = 0;
    for point in CRASH_POINTS {
        for n in [1u32, 2, 3, 5, 8] {
            plans += 1;
            let dir = tempfile::tempdir()?;
            let fs = FileStore {
                path: dir.path().join("store.log"),
            };
            {
                let app = open_crash_app(dir.path()).await?;
                crash_run(&app, &fs, 0).await?;
            }
            let status = std::process::Command::new(&exe)
                .args([
                    "a_run_killed_at_any_fault_point_converges_exactly_on_the_next_clean_run",
                    "--exact",
                    "--test-threads=1",
                ])
                .env(CRASH_DIR, dir.path())
                .env("WEIR_FAULT_KILL", format!("{point}:{n}"))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()?;
            if status.code().is_none() {
                fired += 1;
            }
            let app = open_crash_app(dir.path()).await?;
            let r = crash_run(&app, &fs, 1).await;
            if let Err(e) = &r {
                problems.push(format!(
                    "{point}:{n}: the clean run after the crash failed: {e}"
                ));
                continue;
            }
            let got = fs.state();
            let want = crash_expected();
            if got != want {
                let missing: Vec<_> = want
                    .1
                    .iter()
                    .filter(|(k, v)| got.1.get(*k) != Some(v))
                    .collect();
                let extra: Vec<_> = got.1.keys().filter(|k| !want.1.contains_key(*k)).collect();
                problems.push(format!(
                    "{point}:{n} (killed: {}): after a clean run, table {} (want {}), wrong or missing rows {missing:?}, extra rows {extra:?}",
                    status.code().is_none(),
                    got.0,
                    want.0
                ));
            }
            let before = fs.lines().len();
            let r = crash_run(&app, &fs, 1).await;
            let after = fs.lines().len();
            if r.is_err() || after != before {
                problems.push(format!(
                    "{point}:{n}: a further run was not silent: {r:?}, new lines {:?}",
                    &fs.lines()[before..]
                ));
            }
        }
    }
    eprintln!("crash harness: {fired} of {plans} kills fired");
    assert!(fired * 2 >= plans, "only {fired} of {plans} kills fired");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

// ---------------------------------------------------------------------------
// Splitting with several poisoned components and small batches; settings;
// preview of a destructive change.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_poisoned_components_in_small_batches_fail_alone_and_the_rest_land_once(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open_with(dir.path(), |b| {
        b.batch_policy(BatchPolicy {
            max_actions: 7,
            linger: Duration::from_millis(5),
        })
        .shards(4)
    })
    .await?;
    let ext = Ext::new();
    let poisoned: BTreeSet<i64> = [3, 41, 42, 97].into_iter().collect();
    let bad: Vec<StableKey> = poisoned
        .iter()
        .map(|c| (*c, 1i64).into_stable_key())
        .collect();
    let bad_set: BTreeSet<StableKey> = bad.iter().cloned().collect();
    // Permanent for two of them, retriable for the others.
    ext.fail_with(move |keys| {
        keys.iter().find(|k| bad_set.contains(k)).map(|k| {
            if matches!(k, StableKey::Array(a) if a[0] == StableKey::Int(41) || a[0] == StableKey::Int(3)) {
                Error::permanent(format!("constraint on {k}"))
            } else {
                Error::msg(format!("transient on {k}"))
            }
        })
    });
    let c: Comps = (0..100i64)
        .map(|c| {
            (
                StableKey::Int(c),
                (0..3i64)
                    .map(|r| ((c, r).into_stable_key(), "v".to_string()))
                    .collect(),
            )
        })
        .collect();
    let err = expect_err(run_comps(&app, &ext, c.clone()).await);
    let want: Vec<String> = poisoned.iter().map(|c| format!("/{c}")).collect();
    let mut want = want;
    want.sort();
    assert_eq!(failed_paths(&err), want, "{err}");
    let mut per_key: BTreeMap<StableKey, usize> = BTreeMap::new();
    for a in ext.applied() {
        *per_key.entry(a.key).or_default() += 1;
    }
    for cc in 0..100i64 {
        for r in 0..3i64 {
            let key = (cc, r).into_stable_key();
            let got = per_key.get(&key).copied().unwrap_or(0);
            if poisoned.contains(&cc) {
                assert!(got <= 1, "{key}: {got}");
            } else {
                assert_eq!(got, 1, "{key} applied {got} times");
            }
        }
    }
    assert!(lock(&ext.applied).iter().all(|call| call.len() <= 7));
    ext.heal();
    ext.clear();
    run_comps(&app, &ext, c.clone()).await?;
    let comps_touched: BTreeSet<StableKey> = ext
        .applied()
        .into_iter()
        .map(|a| match a.key {
            StableKey::Array(items) => items[0].clone(),
            other => other,
        })
        .collect();
    let want: BTreeSet<StableKey> = poisoned.iter().map(|c| StableKey::Int(*c)).collect();
    assert_eq!(comps_touched, want);
    ext.clear();
    run_comps(&app, &ext, c).await?;
    assert_eq!(ext.calls(), 0);
    Ok(())
}

#[tokio::test]
async fn invalid_settings_are_errors_naming_the_setting_and_missing_ledger_dirs_are_created(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cases: Vec<(&str, AppBuilder)> = vec![
        (
            "shards",
            App::builder("x")
                .ledger_path(dir.path().join("l1"))
                .shards(0),
        ),
        (
            "max_inflight_components",
            App::builder("x")
                .ledger_path(dir.path().join("l2"))
                .max_inflight_components(0),
        ),
        (
            "max_actions",
            App::builder("x")
                .ledger_path(dir.path().join("l3"))
                .batch_policy(BatchPolicy {
                    max_actions: 0,
                    linger: Duration::from_millis(1),
                }),
        ),
        (
            "max_attempts",
            App::builder("x")
                .ledger_path(dir.path().join("l4"))
                .retry_policy(RetryPolicy {
                    max_attempts: 0,
                    ..RetryPolicy::default()
                }),
        ),
    ];
    for (what, builder) in cases {
        match builder.build().await {
            Ok(_) => panic!("{what} = 0 was accepted"),
            Err(e) => assert!(e.to_string().contains(what), "the error names {what}: {e}"),
        }
    }
    // A ledger path below directories that do not exist yet is created.
    let deep = dir.path().join("a").join("b").join("ledger");
    {
        let app = App::builder("x").ledger_path(&deep).build().await?;
        let ext = Ext::new();
        run_flat(&app, &ext, rows(&[("x", "1")])).await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_ledger_path_that_is_a_regular_file_is_refused_with_an_error_naming_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // A ledger path that is a regular file is refused, naming it.
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"hello")?;
    match App::builder("x").ledger_path(&file).build().await {
        Ok(_) => panic!("a regular file was accepted as a ledger directory"),
        Err(e) => assert!(
            e.to_string().contains("not-a-dir"),
            "the error names the path: {e}"
        ),
    }
    Ok(())
}

#[tokio::test]
async fn a_preview_of_a_destructive_change_changes_nothing_and_the_run_still_recreates(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    let t = Tables::default();
    let inv = Some(TargetChildInvalidation::Destructive);
    let cs = || comps(&[("c1", &[("a", "1")]), ("c2", &[("b", "1")])]);
    run_table(&app, &t, inv, Some(1), cs()).await?;
    t.clear();
    for _ in 0..2 {
        let handler = t.handler(inv);
        let p = bounded(app.preview(move |ctx| async move {
            let tp = register_root_target_states_provider(&ctx, TABLES, handler)?;
            let rows: TargetStateProvider<String> =
                mount_target(&ctx, tp.target_state("t", Spec { generation: 2 })).await?;
            ctx.mount_each(
                vec!["c1", "c2"],
                |c| *c,
                move |c, name| {
                    let rows = rows.clone();
                    async move {
                        let key = if name == "c1" { "a" } else { "b" };
                        declare_target_state(&c, rows.target_state(key, "1".to_string()))
                    }
                },
            )
            .await
        }))
        .await?;
        let mut summary: Vec<(StableKey, &str)> = preview_summary(&p)
            .into_iter()
            .map(|(_, key, kind)| (key, kind))
            .collect();
        summary.sort();
        assert_eq!(
            summary,
            vec![(k("a"), "create"), (k("b"), "create"), (k("t"), "update")],
            "{p:?}"
        );
        assert!(t.log().is_empty());
        assert_eq!(t.rows.calls(), 0);
    }
    run_table(&app, &t, inv, Some(2), cs()).await?;
    assert_eq!(t.log(), vec!["recreate t"]);
    assert_eq!(
        t.rows.applied(),
        vec![ap("create", "a", Some("1")), ap("create", "b", Some("1"))]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_dropped_right_after_a_cancelled_run_reopens_at_once_and_converges() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ext = Ext::new();
    {
        let app = open(dir.path()).await?;
        run_flat(&app, &ext, rows(&[("x", "v0")])).await?;
        let handler = ext.handler();
        let slow = app.run(move |ctx| async move {
            let p = register_root_target_states_provider(&ctx, KV, handler)?;
            ctx.mount_each(
                0..10i64,
                |i| *i,
                move |c, i| {
                    let p = p.clone();
                    async move {
                        tokio::time::sleep(Duration::from_millis(30 * i as u64)).await;
                        declare_target_state(&c, p.target_state(i, "old".to_string()))
                    }
                },
            )
            .await
        });
        let cancelled = tokio::time::timeout(Duration::from_millis(100), slow).await;
        assert!(cancelled.is_err());
        // The App is dropped here, while the cancelled run's components
        // are still sleeping.
    }
    let first = open(dir.path()).await;
    if let Err(first_err) = &first {
        // How long until it opens?
        let start = std::time::Instant::now();
        let later = loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if open(dir.path()).await.is_ok() {
                break Some(start.elapsed());
            }
            if start.elapsed() > Duration::from_secs(5) {
                break None;
            }
        };
        panic!(
            "dropping the App did not release its ledger: reopening at once failed \
             ({first_err}); it opened again after {later:?} (None = still locked after 5 s)"
        );
    }
    let app = first?;
    let want: Vec<(StableKey, String)> = (0..10)
        .map(|i| (StableKey::Int(i), "new".to_string()))
        .collect();
    run_flat(&app, &ext, want.clone()).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    ext.clear();
    run_flat(&app, &ext, want.clone()).await?;
    assert_eq!(
        ext.store(),
        want.into_iter().collect::<BTreeMap<_, _>>(),
        "applied by the last run: {:?}",
        ext.applied()
    );
    Ok(())
}
