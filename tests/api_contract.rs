//! The public API contract (`API.md`), pinned at compile time.
//!
//! Every name and signature the contract lists is used here the way a user
//! would use it, through `weir::...` and `weir::prelude::*` only: coerced to
//! an explicit `fn` pointer type, built with a struct literal, matched
//! exhaustively or checked against the trait bounds the contract promises.
//! If a name, a path, a generic parameter, a bound, an argument type or a
//! return type drifts, this file stops compiling. The futures of the async
//! API are checked to be `Send` in generic functions that are never run.
//! A few cheap runtime checks (no database) follow.

use std::collections::BTreeSet;
use std::fmt::{Debug, Display};
use std::future::{Future, Ready};
use std::hash::Hash;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use weir::connectors::sql::TableSchema;
use weir::connectors::{localfs, postgres, sqlite};
use weir::prelude::*;

// ---------------------------------------------------------------------------
// Bound helpers.
// ---------------------------------------------------------------------------

/// "A value type" in the contract's words.
trait ValueType: Serialize + DeserializeOwned + Send + 'static {}
impl<T: Serialize + DeserializeOwned + Send + 'static> ValueType for T {}

fn assert_send<T: Send>(_: &T) {}
fn assert_clone<T: Clone>() {}
fn assert_copy<T: Copy>() {}
fn assert_debug<T: Debug>() {}
fn assert_display<T: Display>() {}
fn assert_eq_hash<T: PartialEq + Eq + Hash>() {}
fn assert_ord<T: Ord>() {}
fn assert_send_sync<T: Send + Sync>() {}
fn assert_static<T: 'static>() {}
fn assert_serde<T: Serialize + DeserializeOwned>() {}
fn assert_std_error<T: std::error::Error + Send + Sync + 'static>() {}
fn assert_into_stable_key<T: IntoStableKey>() {}
fn assert_default<T: Default>() {}

/// A value type that is deliberately neither `Clone` nor `Debug`.
#[derive(Serialize, Deserialize)]
struct Opaque(u32);

// ---------------------------------------------------------------------------
// Paths: every name is at `weir::Name` and in `weir::prelude`, and both are
// the same item.
// ---------------------------------------------------------------------------

macro_rules! same_type_at_root_and_in_prelude {
    ($($name:ident $(<$($arg:ty),+>)?),+ $(,)?) => {
        $(
            let _: Option<weir::$name $(<$($arg),+>)?> =
                None::<weir::prelude::$name $(<$($arg),+>)?>;
        )+
    };
}

fn names_are_at_the_root_and_in_the_prelude() {
    same_type_at_root_and_in_prelude!(
        StableKey,
        Error,
        TargetAction<u8>,
        TargetReconcileOutput<u8, u16>,
        TargetChildInvalidation,
        TargetActionSink<u8>,
        ChildTargetDef,
        TargetStateProvider<u8>,
        TargetState<u8>,
        App,
        AppBuilder,
        Ctx,
        ContextKey<u8>,
        UpdateStats,
        ComponentPath,
        ComponentFailure,
        PreviewAction,
        ActionKind,
        BatchPolicy,
        RetryPolicy,
    );
    let _: Option<weir::Result<u8>> = None::<weir::prelude::Result<u8>>;
    let _: fn(&Ctx, TargetState<u8>) -> weir::Result<()> = weir::declare_target_state::<u8>;
    let _: fn(&Ctx, TargetState<u8>) -> weir::Result<()> =
        weir::prelude::declare_target_state::<u8>;
    let _: fn(&Ctx, TargetState<u8>) -> weir::Result<TargetStateProvider<u16>> =
        weir::prelude::declare_target_state_with_child::<u8, u16>;
    let _ = weir::prelude::mount_target::<u8, u16>;
    let _ = weir::prelude::register_root_target_states_provider::<Doc, DocHandler>;
    traits_are_at_the_root_and_in_the_prelude::<Doc, DocHandler, i64>();
}

fn traits_are_at_the_root_and_in_the_prelude<V, H, K>()
where
    V: ValueType,
    H: weir::TargetHandler<V> + weir::prelude::TargetHandler<V>,
    K: weir::IntoStableKey + weir::prelude::IntoStableKey,
{
}

// ---------------------------------------------------------------------------
// Keys.
// ---------------------------------------------------------------------------

fn stable_key_traits() {
    assert_clone::<StableKey>();
    assert_debug::<StableKey>();
    assert_eq_hash::<StableKey>();
    assert_ord::<StableKey>();
    assert_serde::<StableKey>();
    assert_display::<StableKey>();
    assert_send_sync::<StableKey>();
}

/// Exhaustive (no wildcard: `StableKey` is not `#[non_exhaustive]`), with
/// the payload types of the contract.
fn stable_key_variant(key: &StableKey) -> &'static str {
    match key {
        StableKey::Null => "null",
        StableKey::Bool(b) => {
            let _: &bool = b;
            "bool"
        }
        StableKey::Int(i) => {
            let _: &i64 = i;
            "int"
        }
        StableKey::Str(s) => {
            let _: &Arc<str> = s;
            "str"
        }
        StableKey::Bytes(b) => {
            let _: &Arc<[u8]> = b;
            "bytes"
        }
        StableKey::Uuid(u) => {
            let _: &uuid::Uuid = u;
            "uuid"
        }
        StableKey::Symbol(s) => {
            let _: &Arc<str> = s;
            "symbol"
        }
        StableKey::Array(items) => {
            let _: &Arc<[StableKey]> = items;
            "array"
        }
    }
}

fn into_stable_key_impls() {
    let _: fn(StableKey) -> StableKey = <StableKey as IntoStableKey>::into_stable_key;
    assert_into_stable_key::<StableKey>();
    assert_into_stable_key::<&'static str>();
    assert_into_stable_key::<String>();
    assert_into_stable_key::<&'static String>();
    assert_into_stable_key::<i64>();
    assert_into_stable_key::<i32>();
    assert_into_stable_key::<u32>();
    assert_into_stable_key::<u64>();
    assert_into_stable_key::<uuid::Uuid>();
    assert_into_stable_key::<(i64,)>();
    assert_into_stable_key::<(&'static str, i64)>();
    assert_into_stable_key::<(String, u64, uuid::Uuid)>();
    assert_into_stable_key::<(StableKey, i32, u32, (&'static String, i64))>();
}

// ---------------------------------------------------------------------------
// Errors.
// ---------------------------------------------------------------------------

fn error_api() {
    assert_std_error::<weir::Error>();
    assert_debug::<weir::Error>();
    assert_display::<weir::Error>();
    let _: fn(&'static str) -> weir::Error = weir::Error::msg;
    let _: fn(String) -> weir::Error = weir::Error::msg;
    let _: fn(&weir::Error) -> &[ComponentFailure] = weir::Error::failed_components;
    let _: fn(std::io::Error) -> weir::Error = weir::Error::from;
    let _: fn(sled::Error) -> weir::Error = weir::Error::from;
    let _: fn(sqlx::Error) -> weir::Error = weir::Error::from;
}

fn error_msg_takes_any_display<D: Display>(message: D) -> weir::Error {
    weir::Error::msg(message)
}

fn result_is_std_result_with_weir_error<T>(
    r: std::result::Result<T, weir::Error>,
) -> weir::Result<T> {
    r
}

/// `From` for the rmp-serde encode and decode errors.
fn rmp_serde_encode_error_converts(e: rmp_serde::encode::Error) -> weir::Error {
    e.into()
}

fn rmp_serde_decode_error_converts(e: rmp_serde::decode::Error) -> weir::Error {
    e.into()
}

fn component_failure_fields(f: &ComponentFailure) -> (&ComponentPath, &String) {
    let ComponentFailure { path, cause, .. } = f;
    (path, cause)
}

// ---------------------------------------------------------------------------
// Target handlers, actions, sinks.
// ---------------------------------------------------------------------------

fn handler_trait<V: ValueType, H: TargetHandler<V>>() {
    assert_send_sync::<H>();
    assert_static::<H>();
    assert_serde::<H::TrackingRecord>();
    assert_send_sync::<H::TrackingRecord>();
    assert_static::<H::TrackingRecord>();
    assert_serde::<H::Action>();
    assert_static::<H::Action>();
    fn action_is_send<A: Send>() {}
    action_is_send::<H::Action>();
    type Output<H, V> = TargetReconcileOutput<
        <H as TargetHandler<V>>::Action,
        <H as TargetHandler<V>>::TrackingRecord,
    >;
    type Reconcile<H, V> = fn(
        &H,
        StableKey,
        Option<V>,
        Vec<<H as TargetHandler<V>>::TrackingRecord>,
        bool,
    ) -> weir::Result<Option<Output<H, V>>>;
    type Attachments = weir::Result<Vec<(String, ChildTargetDef)>>;
    let _: Reconcile<H, V> = <H as TargetHandler<V>>::reconcile;
    let _: fn(&H) -> Attachments = <H as TargetHandler<V>>::attachments;
    let _: fn(H) -> ChildTargetDef = ChildTargetDef::new::<V, H>;
}

/// Exhaustive, so neither enum may grow or become `#[non_exhaustive]`.
fn target_action_payload<A>(action: TargetAction<A>) -> (ActionKind, A) {
    match action {
        TargetAction::Create(a) => (ActionKind::Create, a),
        TargetAction::Update(a) => (ActionKind::Update, a),
        TargetAction::Delete(a) => (ActionKind::Delete, a),
    }
}

fn action_kind_name(kind: ActionKind) -> &'static str {
    match kind {
        ActionKind::Create => "create",
        ActionKind::Update => "update",
        ActionKind::Delete => "delete",
    }
}

fn invalidation_name(inv: TargetChildInvalidation) -> &'static str {
    match inv {
        TargetChildInvalidation::Destructive => "destructive",
        TargetChildInvalidation::Lossy => "lossy",
    }
}

fn child_invalidation_traits() {
    assert_clone::<TargetChildInvalidation>();
    assert_copy::<TargetChildInvalidation>();
    assert_debug::<TargetChildInvalidation>();
    assert_eq_hash::<TargetChildInvalidation>();
    // So that a handler's test can `unwrap_err()` or print what it returned.
    assert_debug::<TargetReconcileOutput<String, u64>>();
    assert_debug::<TargetAction<String>>();
}

/// A struct literal with exactly the four public fields, and the fields
/// read back with their types.
fn reconcile_output<A, R>(
    action: TargetAction<A>,
    sink: TargetActionSink<A>,
    tracking_record: Option<R>,
    child_invalidation: Option<TargetChildInvalidation>,
) -> TargetReconcileOutput<A, R> {
    let out = TargetReconcileOutput {
        action,
        sink,
        tracking_record,
        child_invalidation,
    };
    let TargetReconcileOutput {
        action,
        sink,
        tracking_record,
        child_invalidation,
    } = out;
    let _: &TargetAction<A> = &action;
    let _: &TargetActionSink<A> = &sink;
    let _: &Option<R> = &tracking_record;
    let _: &Option<TargetChildInvalidation> = &child_invalidation;
    TargetReconcileOutput {
        action,
        sink,
        tracking_record,
        child_invalidation,
    }
}

/// `Clone` by hand: no `A: Clone` needed (`Opaque` is not `Clone`).
fn sinks_and_providers_clone_without_clone_values() {
    assert_clone::<TargetActionSink<Opaque>>();
    assert_clone::<TargetStateProvider<Opaque>>();
    assert_send_sync::<TargetStateProvider<Opaque>>();
    assert_clone::<ChildTargetDef>();
}

fn sink_constructors<A, F, Fut, C>()
where
    A: ValueType,
    F: Fn(Vec<TargetAction<A>>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = weir::Result<()>> + Send + 'static,
    C: Fn(&A) -> weir::Result<ChildTargetDef> + Send + Sync + 'static,
{
    let _: fn(F) -> TargetActionSink<A> = TargetActionSink::<A>::from_async_fn::<F, Fut>;
    let _: fn(F, C) -> TargetActionSink<A> =
        TargetActionSink::<A>::from_async_fn_with_child_handler::<F, Fut, C>;
}

// ---------------------------------------------------------------------------
// Declaring.
// ---------------------------------------------------------------------------

fn declaring<V: ValueType, C: ValueType, W: ValueType, H: TargetHandler<V>>() {
    let _: fn(&Ctx, &str, H) -> weir::Result<TargetStateProvider<V>> =
        weir::register_root_target_states_provider::<V, H>;
    let _: fn(&Ctx, TargetState<V>) -> weir::Result<()> = weir::declare_target_state::<V>;
    let _: fn(&Ctx, TargetState<V>) -> weir::Result<TargetStateProvider<C>> =
        weir::declare_target_state_with_child::<V, C>;
    let _: fn(&TargetStateProvider<V>, String, V) -> TargetState<V> =
        TargetStateProvider::<V>::target_state;
    type PairKey = (i64, u64);
    let _: fn(&TargetStateProvider<V>, PairKey, V) -> TargetState<V> =
        TargetStateProvider::<V>::target_state;
    let _: fn(&TargetStateProvider<V>, &'static str, V) -> TargetState<V> =
        TargetStateProvider::<V>::target_state;
    let _: fn(&TargetStateProvider<V>, &Ctx, &str) -> weir::Result<TargetStateProvider<W>> =
        TargetStateProvider::<V>::attachment::<W>;
    let _: fn(&TargetStateProvider<V>) -> String = TargetStateProvider::<V>::memo_key;
    assert_clone::<TargetStateProvider<V>>();
    assert_send_sync::<TargetStateProvider<V>>();
}

async fn mount_target_future<V: ValueType, C: ValueType>(
    ctx: &Ctx,
    state: TargetState<V>,
) -> weir::Result<TargetStateProvider<C>> {
    let fut = weir::mount_target::<V, C>(ctx, state);
    assert_send(&fut);
    fut.await
}

// ---------------------------------------------------------------------------
// App and Ctx.
// ---------------------------------------------------------------------------

fn app_and_builder() {
    let _: fn(&str) -> AppBuilder = App::builder;
    let _: fn(&App) -> &str = App::name;
    let _: fn(AppBuilder, PathBuf) -> AppBuilder = AppBuilder::ledger_path;
    let _: fn(AppBuilder, String) -> AppBuilder = AppBuilder::ledger_path;
    let _: fn(AppBuilder, &'static Path) -> AppBuilder = AppBuilder::ledger_path;
    let _: fn(AppBuilder, usize) -> AppBuilder = AppBuilder::shards;
    let _: fn(AppBuilder, usize) -> AppBuilder = AppBuilder::max_inflight_components;
    let _: fn(AppBuilder, BatchPolicy) -> AppBuilder = AppBuilder::batch_policy;
    let _: fn(AppBuilder, RetryPolicy) -> AppBuilder = AppBuilder::retry_policy;
}

fn provide_key<T: Send + Sync + 'static>() {
    let _: fn(AppBuilder, &ContextKey<T>, T) -> AppBuilder = AppBuilder::provide_key::<T>;
}

fn ledger_path_takes_any_into_pathbuf<P: Into<PathBuf>>(b: AppBuilder, p: P) -> AppBuilder {
    b.ledger_path(p)
}

fn ctx_and_context_keys<T: Send + Sync + 'static>() {
    assert_clone::<Ctx>();
    assert_send_sync::<Ctx>();
    let _: fn(&Ctx) -> &ComponentPath = Ctx::path;
    let _: for<'a, 'b> fn(&'a Ctx, &'b ContextKey<T>) -> weir::Result<&'a T> = Ctx::get_key::<T>;
    let _: fn(&str) -> ContextKey<T> = ContextKey::<T>::new;
    let _: fn(&ContextKey<T>) -> &str = ContextKey::<T>::name;
    assert_display::<ComponentPath>();
}

async fn build_future(builder: AppBuilder) -> weir::Result<App> {
    let fut = builder.build();
    assert_send(&fut);
    fut.await
}

async fn update_future<F, Fut, T>(app: &App, f: F) -> weir::Result<T>
where
    F: FnOnce(Ctx) -> Fut + Send + 'static,
    Fut: Future<Output = weir::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let fut = app.update(f);
    assert_send(&fut);
    fut.await
}

async fn run_future<F, Fut>(app: &App, f: F) -> weir::Result<UpdateStats>
where
    F: FnOnce(Ctx) -> Fut + Send + 'static,
    Fut: Future<Output = weir::Result<()>> + Send + 'static,
{
    let fut = app.run(f);
    assert_send(&fut);
    fut.await
}

async fn preview_future<F, Fut, T>(app: &App, f: F) -> weir::Result<Vec<PreviewAction>>
where
    F: FnOnce(Ctx) -> Fut + Send + 'static,
    Fut: Future<Output = weir::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let fut = app.preview(f);
    assert_send(&fut);
    fut.await
}

async fn drop_state_future<F, Fut>(app: &App, f: F) -> weir::Result<UpdateStats>
where
    F: FnOnce(Ctx) -> Fut + Send + 'static,
    Fut: Future<Output = weir::Result<()>> + Send + 'static,
{
    let fut = app.drop_state(f);
    assert_send(&fut);
    fut.await
}

async fn mount_future<K, F, Fut, T>(ctx: &Ctx, key: K, f: F) -> weir::Result<T>
where
    K: IntoStableKey + Send,
    F: FnOnce(Ctx) -> Fut + Send + 'static,
    Fut: Future<Output = weir::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let fut = ctx.mount(key, f);
    assert_send(&fut);
    fut.await
}

async fn mount_each_future<I, T, K, KF, F, Fut>(
    ctx: &Ctx,
    items: I,
    key_fn: KF,
    f: F,
) -> weir::Result<()>
where
    I: IntoIterator<Item = T> + Send,
    T: Send + 'static,
    KF: Fn(&T) -> K + Send,
    K: IntoStableKey,
    F: Fn(Ctx, T) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = weir::Result<()>> + Send + 'static,
{
    let fut = ctx.mount_each(items, key_fn, f);
    assert_send(&fut);
    fut.await
}

fn update_stats_fields(s: &UpdateStats) -> (u64, u64, u64, u64, u64, Duration) {
    let UpdateStats {
        created,
        updated,
        deleted,
        unchanged,
        failed_components,
        elapsed,
        ..
    } = s;
    (
        *created,
        *updated,
        *deleted,
        *unchanged,
        *failed_components,
        *elapsed,
    )
}

fn preview_action_fields(a: &PreviewAction) -> (&String, &StableKey, ActionKind) {
    let PreviewAction {
        provider,
        key,
        kind,
        ..
    } = a;
    (provider, key, *kind)
}

/// Struct literals with exactly the contract's fields, and `Default`.
fn policies() -> (BatchPolicy, RetryPolicy) {
    assert_default::<BatchPolicy>();
    assert_default::<RetryPolicy>();
    let batch = BatchPolicy {
        max_actions: 64_usize,
        linger: Duration::from_millis(5),
    };
    let retry = RetryPolicy {
        max_attempts: 4_u32,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(10),
        call_timeout: Some(Duration::from_secs(30)),
    };
    (batch, retry)
}

// ---------------------------------------------------------------------------
// Connectors: what exists (API.md names the modules only).
// ---------------------------------------------------------------------------

#[derive(Serialize)]
struct DocRow {
    id: String,
    body: String,
}

fn postgres_row_by_reference<'r>(_: &'r DocRow) {
    let _: fn(&postgres::TableTarget, &Ctx, &'r DocRow) -> weir::Result<()> =
        postgres::TableTarget::declare_row::<&'r DocRow>;
}

fn postgres_connector() {
    type Pg = sqlx::PgPool;
    let _: fn(&Ctx, &ContextKey<Pg>, &str, TableSchema) -> weir::Result<postgres::TableTarget> =
        postgres::declare_table_target;
    // A row by value (`declare_row(&ctx, row)`) or by reference.
    let _: fn(&postgres::TableTarget, &Ctx, DocRow) -> weir::Result<()> =
        postgres::TableTarget::declare_row::<DocRow>;
    let _ = postgres_row_by_reference;
    let _: fn(postgres::TableTarget, &postgres::TableTarget) -> postgres::TableTarget =
        postgres::TableTarget::depends_on;
    assert_clone::<postgres::TableTarget>();
    assert_send_sync::<postgres::TableTarget>();
    let _ = managed_by_name(postgres::ManagedBy::System);
}

async fn postgres_mount_future(
    ctx: &Ctx,
    db: &ContextKey<sqlx::PgPool>,
    schema: TableSchema,
) -> weir::Result<postgres::TableTarget> {
    let fut = postgres::mount_table_target(ctx, db, "docs", schema);
    assert_send(&fut);
    fut.await
}

fn sqlite_row_by_reference<'r>(_: &'r DocRow) {
    let _: fn(&sqlite::TableTarget, &Ctx, &'r DocRow) -> weir::Result<()> =
        sqlite::TableTarget::declare_row::<&'r DocRow>;
}

fn sqlite_connector() {
    type Lite = sqlx::SqlitePool;
    let _: fn(&Ctx, &ContextKey<Lite>, &str, TableSchema) -> weir::Result<sqlite::TableTarget> =
        sqlite::declare_table_target;
    // A row by value (`declare_row(&ctx, row)`) or by reference.
    let _: fn(&sqlite::TableTarget, &Ctx, DocRow) -> weir::Result<()> =
        sqlite::TableTarget::declare_row::<DocRow>;
    let _ = sqlite_row_by_reference;
    let _: fn(sqlite::TableTarget, &sqlite::TableTarget) -> sqlite::TableTarget =
        sqlite::TableTarget::depends_on;
    assert_clone::<sqlite::TableTarget>();
    assert_send_sync::<sqlite::TableTarget>();
    let _ = managed_by_name(sqlite::ManagedBy::User);
}

async fn sqlite_mount_future(
    ctx: &Ctx,
    db: &ContextKey<sqlx::SqlitePool>,
    schema: TableSchema,
) -> weir::Result<sqlite::TableTarget> {
    let fut = sqlite::mount_table_target(ctx, db, "docs", schema);
    assert_send(&fut);
    fut.await
}

fn managed_by_name(m: postgres::ManagedBy) -> &'static str {
    match m {
        postgres::ManagedBy::System => "system",
        postgres::ManagedBy::User => "user",
    }
}

fn localfs_connector() {
    let _: fn(&Ctx, PathBuf) -> weir::Result<localfs::DirTarget> = localfs::declare_dir_target;
    let _: fn(&localfs::DirTarget, &Ctx, &'static str, Vec<u8>) -> weir::Result<()> =
        localfs::DirTarget::declare_file;
    let _: fn(&localfs::DirTarget, &Ctx, PathBuf, &'static [u8]) -> weir::Result<()> =
        localfs::DirTarget::declare_file;
    let _: fn(&localfs::DirTarget, &Ctx, String, String) -> weir::Result<()> =
        localfs::DirTarget::declare_file;
    assert_clone::<localfs::DirTarget>();
    assert_send_sync::<localfs::DirTarget>();
}

/// `mount_dir_target` is async and returns `Result<DirTarget>`.
async fn localfs_mount_future(ctx: &Ctx, path: PathBuf) -> weir::Result<localfs::DirTarget> {
    let fut = localfs::mount_dir_target(ctx, path);
    assert_send(&fut);
    fut.await
}

// ---------------------------------------------------------------------------
// A handler written exactly as the contract describes, used at runtime.
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Doc {
    body: String,
}

/// Deliberately not `Clone`.
#[derive(Debug, Serialize, Deserialize)]
struct DocAction {
    key: String,
    body: Option<String>,
}

type Store = Arc<Mutex<Vec<String>>>;

struct DocHandler {
    sink: TargetActionSink<DocAction>,
}

impl DocHandler {
    /// A handler whose sink logs every call and every action into `log`.
    fn logging(log: &Store) -> Self {
        let log = Arc::clone(log);
        let sink = TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<DocAction>>| {
            let log = Arc::clone(&log);
            async move {
                let mut log = log
                    .lock()
                    .map_err(|_| weir::Error::msg("the log is poisoned"))?;
                log.push(format!("call of {}", actions.len()));
                for action in actions {
                    let (kind, a) = target_action_payload(action);
                    log.push(format!("{} {}", action_kind_name(kind), a.key));
                }
                Ok(())
            }
        });
        Self { sink }
    }
}

impl TargetHandler<Doc> for DocHandler {
    type TrackingRecord = String;
    type Action = DocAction;

    fn reconcile(
        &self,
        key: StableKey,
        desired_target_state: Option<Doc>,
        prev_possible_records: Vec<String>,
        prev_may_be_missing: bool,
    ) -> weir::Result<Option<TargetReconcileOutput<DocAction, String>>> {
        let desired = desired_target_state.map(|d| d.body);
        let key = key.to_string();
        let action = match &desired {
            None if prev_possible_records.is_empty() && !prev_may_be_missing => return Ok(None),
            None => TargetAction::Delete(DocAction { key, body: None }),
            Some(body)
                if !prev_may_be_missing
                    && !prev_possible_records.is_empty()
                    && prev_possible_records.iter().all(|r| r == body) =>
            {
                return Ok(None)
            }
            Some(body) if prev_possible_records.is_empty() => TargetAction::Create(DocAction {
                key,
                body: Some(body.clone()),
            }),
            Some(body) => TargetAction::Update(DocAction {
                key,
                body: Some(body.clone()),
            }),
        };
        Ok(Some(reconcile_output(
            action,
            self.sink.clone(),
            desired,
            None,
        )))
    }
}

/// A container handler that overrides `attachments` and builds its sink
/// with a child-handler factory: it must compile against the contract.
struct FolderHandler {
    sink: TargetActionSink<String>,
}

impl FolderHandler {
    fn new(log: &Store) -> Self {
        let for_children = Arc::clone(log);
        let sink = TargetActionSink::from_async_fn_with_child_handler(
            |_actions: Vec<TargetAction<String>>| async { Ok(()) },
            move |_folder: &String| -> weir::Result<ChildTargetDef> {
                Ok(ChildTargetDef::new::<Doc, _>(DocHandler::logging(
                    &for_children,
                )))
            },
        );
        Self { sink }
    }
}

impl TargetHandler<String> for FolderHandler {
    type TrackingRecord = String;
    type Action = String;

    fn reconcile(
        &self,
        _key: StableKey,
        desired_target_state: Option<String>,
        prev_possible_records: Vec<String>,
        _prev_may_be_missing: bool,
    ) -> weir::Result<Option<TargetReconcileOutput<String, String>>> {
        let action = match desired_target_state.clone() {
            Some(name) if prev_possible_records.is_empty() => TargetAction::Create(name),
            Some(name) => TargetAction::Update(name),
            None => TargetAction::Delete(String::new()),
        };
        Ok(Some(TargetReconcileOutput {
            action,
            sink: self.sink.clone(),
            tracking_record: desired_target_state,
            child_invalidation: Some(TargetChildInvalidation::Lossy),
        }))
    }

    fn attachments(&self) -> weir::Result<Vec<(String, ChildTargetDef)>> {
        let log = Store::default();
        Ok(vec![(
            "notes".to_string(),
            ChildTargetDef::new::<Doc, DocHandler>(DocHandler::logging(&log)),
        )])
    }
}

/// Declares `docs` under the root provider `contract/doc`.
fn declare_docs(ctx: &Ctx, log: &Store, docs: &[(&str, &str)]) -> weir::Result<()> {
    let provider = register_root_target_states_provider::<Doc, DocHandler>(
        ctx,
        "contract/doc",
        DocHandler::logging(log),
    )?;
    for (key, body) in docs {
        let state = provider.target_state(
            *key,
            Doc {
                body: (*body).to_string(),
            },
        );
        declare_target_state(ctx, state)?;
    }
    Ok(())
}

fn entries(log: &Store) -> Vec<String> {
    log.lock().map(|l| l.clone()).unwrap_or_default()
}

fn clear(log: &Store) {
    if let Ok(mut l) = log.lock() {
        l.clear();
    }
}

// ---------------------------------------------------------------------------
// Tests.
// ---------------------------------------------------------------------------

type Ok0 = Ready<weir::Result<()>>;
type OkU8 = Ready<weir::Result<u8>>;

#[test]
fn every_contract_item_has_the_contract_signature() {
    // Instantiating the generic pins is what makes them count as used; the
    // checks themselves happened when this file compiled.
    names_are_at_the_root_and_in_the_prelude();
    stable_key_traits();
    into_stable_key_impls();
    error_api();
    child_invalidation_traits();
    sinks_and_providers_clone_without_clone_values();
    app_and_builder();
    postgres_connector();
    sqlite_connector();
    localfs_connector();
    handler_trait::<Doc, DocHandler>();
    handler_trait::<String, FolderHandler>();
    let folders = FolderHandler::new(&Store::default());
    assert_eq!(folders.attachments().map(|a| a.len()).ok(), Some(1));
    declaring::<Doc, String, Opaque, DocHandler>();
    sink_constructors::<
        DocAction,
        fn(Vec<TargetAction<DocAction>>) -> Ok0,
        Ok0,
        fn(&DocAction) -> weir::Result<ChildTargetDef>,
    >();
    provide_key::<Opaque>();
    ctx_and_context_keys::<Opaque>();
    let _ = ledger_path_takes_any_into_pathbuf::<&Path>;
    let _ = error_msg_takes_any_display::<u64>;
    let _ = result_is_std_result_with_weir_error::<u8>;
    let _ = rmp_serde_encode_error_converts;
    let _ = rmp_serde_decode_error_converts;
    let _ = component_failure_fields;
    let _ = update_stats_fields;
    let _ = preview_action_fields;
    let _ = invalidation_name;
    let _ = stable_key_variant;
    let _ = target_action_payload::<Opaque>;
    let _ = mount_target_future::<Doc, Opaque>;
    let _ = build_future;
    let _ = update_future::<fn(Ctx) -> OkU8, OkU8, u8>;
    let _ = run_future::<fn(Ctx) -> Ok0, Ok0>;
    let _ = preview_future::<fn(Ctx) -> OkU8, OkU8, u8>;
    let _ = drop_state_future::<fn(Ctx) -> Ok0, Ok0>;
    let _ = mount_future::<&str, fn(Ctx) -> OkU8, OkU8, u8>;
    let _ = mount_each_future::<Vec<u32>, u32, u32, fn(&u32) -> u32, fn(Ctx, u32) -> Ok0, Ok0>;
    let _ = postgres_mount_future;
    let _ = sqlite_mount_future;
    let _ = localfs_mount_future;
    assert_debug::<UpdateStats>();
    assert_debug::<PreviewAction>();
    assert_debug::<ComponentFailure>();
    assert_debug::<ComponentPath>();
}

#[test]
fn stable_keys_display_as_the_contract_shows() {
    assert_eq!("a".into_stable_key().to_string(), "\"a\"");
    assert_eq!(42i64.into_stable_key().to_string(), "42");
    assert_eq!(("a", 1i64).into_stable_key().to_string(), "[\"a\",1]");
    assert_eq!(StableKey::Symbol(Arc::from("sym")).to_string(), "@sym");
}

#[test]
fn every_listed_type_converts_to_the_expected_key() {
    let owned = String::from("k");
    let str_key = StableKey::Str(Arc::from("k"));
    assert_eq!("k".into_stable_key(), str_key);
    assert_eq!((&owned).into_stable_key(), str_key);
    assert_eq!(owned.into_stable_key(), str_key);
    assert_eq!(str_key.clone().into_stable_key(), str_key);
    assert_eq!(7i64.into_stable_key(), StableKey::Int(7));
    assert_eq!((-7i32).into_stable_key(), StableKey::Int(-7));
    assert_eq!(
        u32::MAX.into_stable_key(),
        StableKey::Int(i64::from(u32::MAX))
    );
    assert_eq!(7u64.into_stable_key(), StableKey::Int(7));
    let id = uuid::Uuid::from_u128(0x1234);
    assert_eq!(id.into_stable_key(), StableKey::Uuid(id));
    let four = ("a", 1i64, 2u32, id).into_stable_key();
    assert_eq!(stable_key_variant(&four), "array");
    assert_eq!(
        four,
        StableKey::Array(Arc::from(vec![
            StableKey::Str(Arc::from("a")),
            StableKey::Int(1),
            StableKey::Int(2),
            StableKey::Uuid(id),
        ]))
    );
}

#[test]
fn u64_values_above_i64_max_become_bytes_never_a_wrapped_int() {
    let max = i64::MAX as u64;
    assert_eq!(max.into_stable_key(), StableKey::Int(i64::MAX));
    for big in [max + 1, u64::MAX] {
        let key = big.into_stable_key();
        assert_eq!(stable_key_variant(&key), "bytes", "{big} became {key:?}");
    }
    assert_ne!(u64::MAX.into_stable_key(), (-1i64).into_stable_key());
    assert_ne!((max + 1).into_stable_key(), i64::MIN.into_stable_key());
}

#[test]
fn stable_keys_order_hash_and_round_trip_through_serde() -> weir::Result<()> {
    let keys = [
        StableKey::Null,
        StableKey::Bool(true),
        StableKey::Int(-3),
        "s".into_stable_key(),
        StableKey::Bytes(Arc::from(&b"xy"[..])),
        uuid::Uuid::nil().into_stable_key(),
        StableKey::Symbol(Arc::from("sym")),
        ("a", (1i64, "b")).into_stable_key(),
    ];
    let set: BTreeSet<StableKey> = keys.iter().cloned().collect();
    assert_eq!(set.len(), keys.len());
    for key in &keys {
        let json = serde_json::to_string(key).map_err(weir::Error::msg)?;
        let back: StableKey = serde_json::from_str(&json).map_err(weir::Error::msg)?;
        assert_eq!(&back, key, "{json}");
    }
    Ok(())
}

#[test]
fn default_policies_exist_and_retries_survive_two_consecutive_failures() {
    let batch = BatchPolicy::default();
    assert!(batch.max_actions >= 1);
    let retry = RetryPolicy::default();
    assert!(retry.max_attempts >= 3, "{retry:?}");
    assert!(retry.initial_backoff <= retry.max_backoff, "{retry:?}");
    let (batch, retry) = policies();
    assert_eq!(batch.max_actions, 64);
    assert_eq!(retry.max_attempts, 4);
}

#[test]
fn errors_from_messages_list_no_failed_components() {
    let e = weir::Error::msg("boom");
    assert!(e.to_string().contains("boom"));
    assert!(e.failed_components().is_empty());
    let decode = rmp_serde::from_slice::<String>(&[0xc0])
        .map_err(rmp_serde_decode_error_converts)
        .err();
    assert!(decode.is_some_and(|e| !e.to_string().is_empty()));
    let io: weir::Error = std::io::Error::other("disk").into();
    assert!(io.to_string().contains("disk"), "{io}");
    let _: weir::Result<u8> = result_is_std_result_with_weir_error(Ok(1));
    assert!(error_msg_takes_any_display(7u64).to_string().contains('7'));
}

#[test]
fn context_keys_keep_their_name_and_invalidations_their_identity() {
    let key = ContextKey::<Opaque>::new("main_db");
    assert_eq!(key.name(), "main_db");
    assert_eq!(invalidation_name(TargetChildInvalidation::Lossy), "lossy");
    assert_ne!(
        TargetChildInvalidation::Destructive,
        TargetChildInvalidation::Lossy
    );
    let sink = DocHandler::logging(&Store::default()).sink;
    let _same: TargetActionSink<DocAction> = sink.clone();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_written_to_the_contract_creates_keeps_previews_and_drops_its_state(
) -> weir::Result<()> {
    let dir = tempfile::tempdir()?;
    let greeting = ContextKey::<String>::new("greeting");
    let app = build_future(
        ledger_path_takes_any_into_pathbuf(App::builder("contract"), dir.path())
            .shards(2)
            .max_inflight_components(8)
            .batch_policy(BatchPolicy::default())
            .retry_policy(RetryPolicy::default())
            .provide_key(&greeting, "hello".to_string()),
    )
    .await?;
    assert_eq!(app.name(), "contract");
    let log = Store::default();

    // Paths display as "/a/b", and context values reach components.
    let (path, hello) = update_future(&app, move |ctx| async move {
        mount_future(&ctx, "a", move |ctx| async move {
            mount_future(&ctx, "b", move |ctx| async move {
                Ok((ctx.path().to_string(), ctx.get_key(&greeting)?.clone()))
            })
            .await
        })
        .await
    })
    .await?;
    assert_eq!(path, "/a/b");
    assert_eq!(hello, "hello");

    let l = Arc::clone(&log);
    let stats = run_future(&app, move |ctx| async move {
        declare_docs(&ctx, &l, &[("x", "1")])
    })
    .await?;
    assert_eq!(update_stats_fields(&stats).0, 1, "{stats:?}");
    assert_eq!(entries(&log), vec!["call of 1", "create \"x\""]);

    clear(&log);
    let l = Arc::clone(&log);
    let stats = run_future(&app, move |ctx| async move {
        declare_docs(&ctx, &l, &[("x", "1")])
    })
    .await?;
    assert_eq!(stats.unchanged, 1, "{stats:?}");
    assert!(entries(&log).is_empty(), "{:?}", entries(&log));

    let l = Arc::clone(&log);
    let preview = preview_future(&app, move |ctx| async move {
        declare_docs(&ctx, &l, &[("x", "2")])
    })
    .await?;
    assert_eq!(preview.len(), 1, "{preview:?}");
    let (provider, key, kind) = preview_action_fields(&preview[0]);
    assert_eq!(provider, "contract/doc");
    assert_eq!(key, &"x".into_stable_key());
    assert_eq!(kind, ActionKind::Update);
    assert!(entries(&log).is_empty(), "a preview applies nothing");

    let l = Arc::clone(&log);
    let stats =
        drop_state_future(&app, move |ctx| async move { declare_docs(&ctx, &l, &[]) }).await?;
    assert_eq!(stats.deleted, 1, "{stats:?}");
    assert_eq!(entries(&log), vec!["call of 1", "delete \"x\""]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_component_is_listed_by_path_and_cause_while_the_others_commit() -> weir::Result<()>
{
    let dir = tempfile::tempdir()?;
    let app = build_future(App::builder("contract-failures").ledger_path(dir.path())).await?;
    let log = Store::default();
    let l = Arc::clone(&log);
    let result = run_future(&app, move |ctx| async move {
        mount_each_future(
            &ctx,
            vec!["good", "bad"],
            |name: &&str| name.to_string(),
            move |ctx, name| {
                let l = Arc::clone(&l);
                async move {
                    if name == "bad" {
                        return Err(weir::Error::msg("refused on purpose"));
                    }
                    declare_docs(&ctx, &l, &[(name, "1")])
                }
            },
        )
        .await
    })
    .await;
    let Err(err) = result else {
        panic!("a failed child must make the run fail");
    };
    let failures = err.failed_components();
    assert_eq!(failures.len(), 1, "{err}");
    let (path, cause) = component_failure_fields(&failures[0]);
    assert_eq!(path.to_string(), "/bad");
    assert!(cause.contains("refused on purpose"), "{cause}");
    let text = err.to_string();
    assert!(
        text.contains("/bad") && text.contains("refused on purpose"),
        "{text}"
    );
    assert_eq!(entries(&log), vec!["call of 1", "create \"good\""]);
    Ok(())
}

// ---------------------------------------------------------------------------
// Additions to the contract: worker groups, table owners, error classes.
// ---------------------------------------------------------------------------

#[allow(dead_code)]
fn worker_group_api(coordinator: Arc<dyn weir::group::Coordinator>, pool: sqlx::PgPool) {
    let group: weir::group::WorkerGroup = weir::group::WorkerGroup::new("g", coordinator)
        .partitions(64)
        .lease_ttl(Duration::from_secs(10))
        .member_id("host:1")
        .join_delay(Duration::from_secs(1))
        .compact_after_rows(1000);
    let _: AppBuilder = App::builder("a").worker_group(group).adopt_tables(true);
    let _: Arc<dyn weir::group::Coordinator> = Arc::new(postgres::PostgresCoordinator::new(pool));
    let _: fn(&App) -> weir::Result<weir::Owner> = App::owner;
    let _: fn(&Ctx) -> weir::Result<weir::Owner> = Ctx::owner;
    let _: fn(&App) -> Vec<u32> = App::synced_partitions;
    let _: fn(&weir::Error) -> bool = weir::Error::is_not_held;
    let _: fn(&weir::Error) -> bool = weir::Error::is_fenced;
    let _: fn(&weir::Error) -> bool = weir::Error::is_root_pending;
    let _: fn(&ComponentFailure) -> bool = ComponentFailure::is_root_pending;
    let _: fn(&str) -> weir::Owner = weir::Owner::group;
    assert_send_sync::<weir::Fence>();
    assert_eq_hash::<weir::PartitionId>();
    assert_eq_hash::<weir::Owner>();
}

#[allow(dead_code)]
fn group_futures_are_send(app: &App) {
    assert_send(&app.group_status());
    assert_send(&app.group_synced());
    assert_send(&app.leave_group());
}

#[test]
fn an_owner_is_its_key_and_shows_its_description() {
    let owner = weir::Owner::group("docs");
    assert_eq!(owner.key(), "group:docs");
    assert_eq!(owner.to_string(), "worker group docs");
    let ledger = weir::Owner::ledger("1234", "host:/var/lib/weir");
    assert_eq!(ledger.key(), "ledger:1234");
    assert_eq!(
        ledger.description(),
        "the ledger 1234 at host:/var/lib/weir"
    );
}

// ---------------------------------------------------------------------------
// Additions to the contract: sources.
// ---------------------------------------------------------------------------

#[allow(dead_code)]
fn source_api(app: &App, ctx: &Ctx) {
    use weir::source::{
        Assignment, Batch, Change, ConsumeOptions, ConsumeReport, Listed, Listing, Outcome,
        Settled, Source, SourceBatch, SourceItem,
    };
    let options = ConsumeOptions::default()
        .max_in_flight(100)
        .max_deliveries(3)
        .backoff(Duration::from_millis(10), Duration::from_secs(1))
        .keep_alive(Duration::from_secs(1));
    let _: usize = options.max_in_flight;
    let listing: Listing<String> = Listing::new(vec![
        Listed::new("a", Some(b"v1".to_vec()), "a".to_string()),
        Listed::lazy("b", b"v1".to_vec()),
    ])
    .salt("t1");
    let batch: SourceBatch<String> = SourceBatch::from(listing).salt("more");
    let _: usize = batch.len();
    assert_send(
        &ctx.mount_source(batch, |_ctx, item: SourceItem<String>| async move {
            let _: (weir::StableKey, Option<u64>, String) = (item.key, item.ordinal, item.payload);
            Ok(())
        }),
    );
    let change: Change<String, u64> = Change::upsert("k", 1, "p".to_string(), 7).delivered(2);
    let _: Change<String, u64> = Change::delete("k", 2, 8);
    let _: Batch<String, u64> = Batch::Changes(vec![change]);
    let settled = Settled {
        ack: 7u64,
        outcome: Outcome::Retry {
            delay: Duration::from_secs(1),
        },
    };
    assert!(!settled.outcome.is_ack());
    let _: Option<Assignment> = app.assignment();
    let _ = |r: ConsumeReport| {
        (
            r.received,
            r.listed,
            r.acknowledged,
            r.retried,
            r.dead_lettered,
        )
    };
    fn consume_is_send<S: Source + 'static>(app: &App, source: &'static mut S) {
        assert_send(
            &app.consume(source, ConsumeOptions::default(), |ctx, batch| async move {
                ctx.mount_source(batch, |_ctx, _item| async { Ok(()) })
                    .await
            }),
        );
    }
}
