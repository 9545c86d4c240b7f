//! Containers, child invalidation, attachments, preview and drop_state:
//! guarantees 8, 9 and 10 of the contract, with the reference design's
//! TableHandler / TableSpec / TableAction / table_sink / MainHandler shapes.

mod support;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;
use weir::prelude::*;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Bounds anything that could hang.
async fn bounded<T>(fut: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .map_err(|_| Error::msg("timed out after 60s"))?
}

/// One ordered list of what every sink of a test applied, across sinks.
#[derive(Clone, Default)]
struct Timeline {
    events: Arc<Mutex<Vec<String>>>,
}

impl Timeline {
    fn push(&self, event: String) -> Result<()> {
        self.events
            .lock()
            .map_err(|_| Error::msg("poisoned"))?
            .push(event);
        Ok(())
    }
    fn events(&self) -> Vec<String> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }
    fn clear(&self) {
        if let Ok(mut e) = self.events.lock() {
            e.clear();
        }
    }
    /// The position of the first event equal to `event`.
    fn position(&self, event: &str) -> Option<usize> {
        self.events().iter().position(|e| e == event)
    }
}

/// A row sink like `support::recording_sink` that also writes each applied
/// action to `timeline` as `"row <verb> <key>[=<value>]"`.
fn row_sink(log: Log, store: Store, timeline: Timeline) -> TargetActionSink<RowAction> {
    TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<RowAction>>| {
        let log = log.clone();
        let store = store.clone();
        let timeline = timeline.clone();
        async move {
            apply_rows_observed(&log, &store, actions, |entry| {
                timeline.push(format!("row {entry}"))
            })
        }
    })
}

/// Everything a container test records: the table sink's log, the rows'
/// log and store, one timeline across both, the child-handler factory's
/// calls, and what the child handler saw.
#[derive(Clone, Default)]
struct TableRig {
    table_log: Log,
    row_log: Log,
    row_store: Store,
    timeline: Timeline,
    factory_calls: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl TableRig {
    fn new() -> Self {
        Self::default()
    }

    /// The reference design's `table_sink`: the callback logs
    /// `"ensure <name>"` / `"drop <name>"`, the factory gives each created or
    /// updated table a child row handler over one shared row sink.
    fn table_sink(&self) -> TargetActionSink<TableAction> {
        let table_log = self.table_log.clone();
        let timeline = self.timeline.clone();
        let rows = row_sink(
            self.row_log.clone(),
            self.row_store.clone(),
            self.timeline.clone(),
        );
        let factory_calls = Arc::clone(&self.factory_calls);
        let seen = Arc::clone(&self.seen);
        TargetActionSink::from_async_fn_with_child_handler(
            move |actions: Vec<TargetAction<TableAction>>| {
                let table_log = table_log.clone();
                let timeline = timeline.clone();
                async move {
                    let mut entries = Vec::new();
                    for action in actions {
                        let entry = match action {
                            TargetAction::Create(t) | TargetAction::Update(t) => {
                                format!("ensure {}", t.name)
                            }
                            TargetAction::Delete(t) => format!("drop {}", t.name),
                        };
                        timeline.push(format!("table {entry}"))?;
                        entries.push(entry);
                    }
                    table_log.push_call(entries)
                }
            },
            move |_: &TableAction| {
                factory_calls.fetch_add(1, Ordering::SeqCst);
                Ok(ChildTargetDef::new::<String, _>(RowHandler::watched_into(
                    rows.clone(),
                    &seen,
                )))
            },
        )
    }

    fn handler(&self, invalidation: Option<TargetChildInvalidation>) -> TableHandler {
        TableHandler::new(self.table_sink(), invalidation)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            table: self.table_log.entries(),
            rows: self.row_log.entries(),
            row_calls: self.row_log.call_count(),
            timeline: self.timeline.events(),
            seen: self.seen(),
        }
    }

    fn clear(&self) {
        self.table_log.clear();
        self.row_log.clear();
        self.timeline.clear();
        self.factory_calls.store(0, Ordering::SeqCst);
        if let Ok(mut s) = self.seen.lock() {
            s.clear();
        }
    }
}

/// What one run of a `TableRig` recorded.
#[derive(Debug)]
struct Snapshot {
    table: Vec<String>,
    rows: Vec<String>,
    row_calls: usize,
    timeline: Vec<String>,
    seen: Vec<Seen>,
}

impl Snapshot {
    fn position(&self, event: &str) -> Option<usize> {
        self.timeline.iter().position(|e| e == event)
    }
}

/// Registers "test/table", mounts the container "docs" with `generation`,
/// declares `rows` in it, and returns the child provider's memo key.
async fn sync_table(
    app: &App,
    rig: &TableRig,
    generation: &str,
    invalidation: Option<TargetChildInvalidation>,
    rows: &[(&str, &str)],
) -> Result<String> {
    let handler = rig.handler(invalidation);
    let rows = owned(rows);
    let spec = spec(generation);
    bounded(app.update(move |ctx| async move {
        let table = register_root_target_states_provider(&ctx, "test/table", handler)?;
        let child: TargetStateProvider<String> =
            mount_target(&ctx, table.target_state("docs", spec)).await?;
        declare_into(&ctx, &child, rows)?;
        Ok(child.memo_key())
    }))
    .await
}

/// Registers "test/table" and declares no container.
async fn sync_no_table(app: &App, rig: &TableRig) -> Result<UpdateStats> {
    let handler = rig.handler(None);
    bounded(app.run(move |ctx| async move {
        register_root_target_states_provider(&ctx, "test/table", handler)?;
        Ok(())
    }))
    .await
}

// ---------------------------------------------------------------------------
// 1. mount_target
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_mounted_container_is_ensured_before_its_rows_are_created_through_the_factory_handler(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = TableRig::new();

    sync_table(&app, &rig, "g1", None, &[("a", "1"), ("b", "2")]).await?;

    assert_eq!(rig.table_log.entries(), strings(&["ensure docs"]));
    assert_eq!(
        rig.row_log.entries(),
        strings(&["create a=1", "create b=2"])
    );
    assert_eq!(rig.row_store.snapshot(), map(&[("a", "1"), ("b", "2")]));
    // The child handler came from the factory of the table's sink.
    assert_eq!(rig.factory_calls.load(Ordering::SeqCst), 1);
    let seen = rig.seen();
    assert_eq!(seen.len(), 2, "the factory's handler reconciled both rows");
    // The container's action was applied before its children's.
    let table_at = rig.timeline.position("table ensure docs");
    let a_at = rig.timeline.position("row create a=1");
    let b_at = rig.timeline.position("row create b=2");
    assert!(table_at.is_some(), "timeline: {:?}", rig.timeline.events());
    assert!(
        table_at < a_at && table_at < b_at,
        "timeline: {:?}",
        rig.timeline.events()
    );
    Ok(())
}

#[tokio::test]
async fn an_unchanged_containers_refresh_reaches_its_sink_on_every_run_and_counts_as_unchanged(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = TableRig::new();
    sync_table(&app, &rig, "g1", None, &[("a", "1")]).await?;

    for run in 0..2 {
        rig.clear();
        let handler = rig.handler(None);
        let stats = bounded(app.run(move |ctx| async move {
            let table = register_root_target_states_provider(&ctx, "test/table", handler)?;
            let child: TargetStateProvider<String> =
                mount_target(&ctx, table.target_state("docs", spec("g1"))).await?;
            declare_into(&ctx, &child, owned(&[("a", "1")]))
        }))
        .await?;
        // The child handler comes from the factory, from the action the
        // container answered with, and that action reaches the sink.
        assert_eq!(rig.factory_calls.load(Ordering::SeqCst), 1, "run {run}");
        assert_eq!(
            rig.table_log.entries(),
            strings(&["ensure docs"]),
            "run {run}"
        );
        assert_eq!(rig.row_log.call_count(), 0, "run {run}: no row action");
        // The refresh counts as unchanged, not as an update.
        assert_eq!(
            (stats.created, stats.updated, stats.deleted, stats.unchanged),
            (0, 0, 0, 2),
            "run {run}: {stats:?}"
        );
    }
    // A changed container is applied too, and its new row created.
    rig.clear();
    sync_table(&app, &rig, "g2", None, &[("a", "1"), ("b", "2")]).await?;
    assert_eq!(rig.table_log.entries(), strings(&["ensure docs"]));
    assert_eq!(rig.row_log.entries(), strings(&["create b=2"]));
    Ok(())
}

#[tokio::test]
async fn a_failed_refresh_fails_its_component_and_leaves_the_containers_records_as_they_were(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = TableRig::new();
    sync_table(&app, &rig, "g1", None, &[("a", "1")]).await?;

    // A table sink that fails every call: the refresh fails.
    let rows = row_sink(Log::default(), Store::default(), Timeline::default());
    let failing = TableHandler::new(
        TargetActionSink::from_async_fn_with_child_handler(
            |_: Vec<TargetAction<TableAction>>| async {
                Err(Error::permanent("the table is gone"))
            },
            move |_: &TableAction| {
                Ok(ChildTargetDef::new::<String, _>(RowHandler::new(
                    rows.clone(),
                )))
            },
        ),
        None,
    );
    let err = bounded(app.run(move |ctx| async move {
        let table = register_root_target_states_provider(&ctx, "test/table", failing)?;
        let _: TargetStateProvider<String> =
            mount_target(&ctx, table.target_state("docs", spec("g1"))).await?;
        Ok(())
    }))
    .await
    .err()
    .ok_or_else(|| Error::msg("a failed refresh must fail the run"))?;
    assert!(err.to_string().contains("the table is gone"), "{err}");

    // The container is not taken for maybe missing: the next run
    // refreshes it and writes no row again.
    rig.clear();
    sync_table(&app, &rig, "g1", None, &[("a", "1")]).await?;
    assert_eq!(rig.table_log.entries(), strings(&["ensure docs"]));
    assert_eq!(rig.row_log.call_count(), 0, "{:?}", rig.row_log.entries());
    Ok(())
}

// ---------------------------------------------------------------------------
// 2. Invalidation modes (guarantee 8)
// ---------------------------------------------------------------------------

/// Run 1 with generation g1, run 2 with g2 (same rows), run 3 as run 2.
/// Returns what run 2 did; checks that run 3 touched no rows.
async fn invalidation_scenario(invalidation: Option<TargetChildInvalidation>) -> Result<Snapshot> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = TableRig::new();
    let rows = [("a", "1"), ("b", "2")];

    sync_table(&app, &rig, "g1", invalidation, &rows).await?;
    assert_eq!(
        rig.row_log.entries(),
        strings(&["create a=1", "create b=2"])
    );

    rig.clear();
    sync_table(&app, &rig, "g2", invalidation, &rows).await?;
    let run2 = rig.snapshot();

    // A third identical run touches no rows.
    rig.clear();
    sync_table(&app, &rig, "g2", invalidation, &rows).await?;
    assert_eq!(
        rig.row_log.call_count(),
        0,
        "a third identical run touched rows: {:?}",
        rig.row_log.entries()
    );
    assert!(
        rig.seen()
            .iter()
            .all(|s| !s.prev_may_be_missing && s.prev.len() == 1),
        "third run: {:?}",
        rig.seen()
    );
    assert_eq!(rig.row_store.snapshot(), map(&rows));
    Ok(run2)
}

#[tokio::test]
async fn a_changed_container_without_invalidation_leaves_its_rows_alone() -> Result<()> {
    let run2 = invalidation_scenario(None).await?;
    assert_eq!(run2.table, strings(&["ensure docs"]));
    assert_eq!(run2.row_calls, 0, "rows: {:?}", run2.rows);
    assert!(
        run2.seen
            .iter()
            .all(|s| !s.prev_may_be_missing && s.prev.len() == 1),
        "seen: {:?}",
        run2.seen
    );
    Ok(())
}

#[tokio::test]
async fn a_destructive_invalidation_drops_the_rows_records_so_they_are_created_again() -> Result<()>
{
    let run2 = invalidation_scenario(Some(TargetChildInvalidation::Destructive)).await?;
    assert_eq!(run2.table, strings(&["ensure docs"]));
    assert_eq!(run2.rows, strings(&["create a=1", "create b=2"]));
    let seen = &run2.seen;
    assert_eq!(seen.len(), 2, "seen: {seen:?}");
    assert!(
        seen.iter().all(|s| s.prev.is_empty()),
        "the children's records were not dropped: {seen:?}"
    );
    let table_at = run2.position("table ensure docs");
    assert!(table_at.is_some() && table_at < run2.position("row create a=1"));
    Ok(())
}

#[tokio::test]
async fn a_lossy_invalidation_marks_the_rows_maybe_missing_so_they_are_updated() -> Result<()> {
    let run2 = invalidation_scenario(Some(TargetChildInvalidation::Lossy)).await?;
    assert_eq!(run2.table, strings(&["ensure docs"]));
    assert_eq!(run2.rows, strings(&["update a=1", "update b=2"]));
    let seen = &run2.seen;
    assert_eq!(seen.len(), 2, "seen: {seen:?}");
    assert!(
        seen.iter()
            .all(|s| s.prev_may_be_missing && s.prev.len() == 1),
        "rows were not marked maybe-missing with their records kept: {seen:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// 3. declare_target_state_with_child
// ---------------------------------------------------------------------------

async fn sync_table_in_one_component(
    app: &App,
    rig: &TableRig,
    rows: &[(&str, &str)],
) -> Result<UpdateStats> {
    let handler = rig.handler(None);
    let rows = owned(rows);
    bounded(app.run(move |ctx| async move {
        let table = register_root_target_states_provider(&ctx, "test/table", handler)?;
        let child: TargetStateProvider<String> =
            declare_target_state_with_child(&ctx, table.target_state("docs", spec("g1")))?;
        declare_into(&ctx, &child, rows)
    }))
    .await
}

#[tokio::test]
async fn a_container_and_its_rows_declared_in_one_component_resolve_at_commit() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = TableRig::new();

    let stats = sync_table_in_one_component(&app, &rig, &[("a", "1"), ("b", "2")]).await?;
    assert_eq!(stats.failed_components, 0);
    assert_eq!(rig.table_log.entries(), strings(&["ensure docs"]));
    assert_eq!(
        rig.row_log.entries(),
        strings(&["create a=1", "create b=2"])
    );
    assert_eq!(rig.factory_calls.load(Ordering::SeqCst), 1);
    let table_at = rig.timeline.position("table ensure docs");
    assert!(table_at.is_some(), "timeline: {:?}", rig.timeline.events());
    assert!(
        table_at < rig.timeline.position("row create a=1")
            && table_at < rig.timeline.position("row create b=2"),
        "rows applied before their table: {:?}",
        rig.timeline.events()
    );

    // The next run resolves again and sees the rows' records.
    rig.clear();
    sync_table_in_one_component(&app, &rig, &[("a", "1"), ("b", "3")]).await?;
    assert_eq!(rig.row_log.entries(), strings(&["update b=3"]));
    assert_eq!(rig.row_store.snapshot(), map(&[("a", "1"), ("b", "3")]));
    Ok(())
}

// ---------------------------------------------------------------------------
// 4. A container no longer declared (guarantee 9)
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_container_no_longer_declared_is_dropped_alone_and_its_rows_are_forgotten() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = TableRig::new();
    let rows = [("a", "1"), ("b", "2")];

    sync_table(&app, &rig, "g1", None, &rows).await?;
    assert_eq!(
        rig.row_log.entries(),
        strings(&["create a=1", "create b=2"])
    );

    rig.clear();
    sync_no_table(&app, &rig).await?;
    assert_eq!(rig.table_log.entries(), strings(&["drop docs"]));
    assert_eq!(
        rig.row_log.call_count(),
        0,
        "rows were reconciled one by one: {:?}",
        rig.row_log.entries()
    );
    assert!(
        rig.seen().is_empty(),
        "the row handler was called: {:?}",
        rig.seen()
    );

    // Declared again with the same rows: the rows' records were dropped, so
    // they are created again.
    rig.clear();
    sync_table(&app, &rig, "g1", None, &rows).await?;
    assert_eq!(rig.table_log.entries(), strings(&["ensure docs"]));
    assert_eq!(
        rig.row_log.entries(),
        strings(&["create a=1", "create b=2"])
    );
    assert!(
        rig.seen().iter().all(|s| s.prev.is_empty()),
        "seen: {:?}",
        rig.seen()
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// 5. Attachments (guarantee 10)
// ---------------------------------------------------------------------------

/// A main handler (CRUD like `RowHandler`) that also exposes an "index"
/// attachment handler.
struct MainHandler {
    sink: TargetActionSink<RowAction>,
    att_log: Log,
    att_store: Store,
}

impl MainHandler {
    fn new(main: &Rig, att: &Rig) -> Self {
        Self {
            sink: recording_sink(main.log.clone(), main.store.clone(), None),
            att_log: att.log.clone(),
            att_store: att.store.clone(),
        }
    }
}

impl TargetHandler<String> for MainHandler {
    type TrackingRecord = String;
    type Action = RowAction;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<String>,
        prev: Vec<String>,
        prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<RowAction, String>>> {
        RowHandler::new(self.sink.clone()).reconcile(key, desired, prev, prev_may_be_missing)
    }

    fn attachments(&self) -> Result<Vec<(String, ChildTargetDef)>> {
        Ok(vec![(
            "index".to_string(),
            ChildTargetDef::new::<String, _>(RowHandler::new(recording_sink(
                self.att_log.clone(),
                self.att_store.clone(),
                None,
            ))),
        )])
    }
}

async fn sync_main(
    app: &App,
    main: &Rig,
    att: &Rig,
    declare_attachment: bool,
) -> Result<UpdateStats> {
    let handler = MainHandler::new(main, att);
    bounded(app.run(move |ctx| async move {
        let provider = register_root_target_states_provider(&ctx, "test/main", handler)?;
        declare_target_state(&ctx, provider.target_state("row", "v1".to_string()))?;
        if declare_attachment {
            let att: TargetStateProvider<String> = provider.attachment(&ctx, "index")?;
            declare_target_state(&ctx, att.target_state("idx", "spec1".to_string()))?;
        }
        Ok(())
    }))
    .await
}

#[tokio::test]
async fn an_attachment_no_longer_declared_is_deleted_even_if_never_asked_for() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let main = Rig::new();
    let att = Rig::new();

    sync_main(&app, &main, &att, true).await?;
    assert_eq!(main.log.entries(), strings(&["create row=v1"]));
    assert_eq!(att.log.entries(), strings(&["create idx=spec1"]));

    main.log.clear();
    att.log.clear();
    sync_main(&app, &main, &att, false).await?;
    assert_eq!(main.log.call_count(), 0, "main: {:?}", main.log.entries());
    assert_eq!(att.log.entries(), strings(&["delete idx"]));
    assert!(att.store.snapshot().is_empty());

    // And it stays deleted.
    att.log.clear();
    sync_main(&app, &main, &att, false).await?;
    assert_eq!(att.log.call_count(), 0, "att: {:?}", att.log.entries());
    Ok(())
}

#[tokio::test]
async fn asking_for_an_unknown_attachment_type_is_an_error_naming_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let main = Rig::new();
    let att = Rig::new();
    let handler = MainHandler::new(&main, &att);
    let (unknown, wrong_type) = bounded(app.update(move |ctx| async move {
        let provider = register_root_target_states_provider(&ctx, "test/main", handler)?;
        let unknown = provider
            .attachment::<String>(&ctx, "no_such_attachment")
            .err()
            .map(|e| e.to_string());
        let wrong_type = provider
            .attachment::<u64>(&ctx, "index")
            .err()
            .map(|e| e.to_string());
        Ok((unknown, wrong_type))
    }))
    .await?;
    let unknown = unknown.ok_or_else(|| Error::msg("an unknown attachment type was accepted"))?;
    assert!(unknown.contains("no_such_attachment"), "error: {unknown}");
    let wrong_type = wrong_type
        .ok_or_else(|| Error::msg("an attachment of the wrong value type was accepted"))?;
    assert!(wrong_type.contains("u64"), "error: {wrong_type}");
    Ok(())
}

// ---------------------------------------------------------------------------
// 6. memo_key
// ---------------------------------------------------------------------------

/// The memo keys of runs with generations g1, g1, g2, g2.
async fn memo_keys(invalidation: Option<TargetChildInvalidation>) -> Result<[String; 4]> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = TableRig::new();
    let rows = [("a", "1")];
    let k1 = sync_table(&app, &rig, "g1", invalidation, &rows).await?;
    let k2 = sync_table(&app, &rig, "g1", invalidation, &rows).await?;
    let k3 = sync_table(&app, &rig, "g2", invalidation, &rows).await?;
    let k4 = sync_table(&app, &rig, "g2", invalidation, &rows).await?;
    Ok([k1, k2, k3, k4])
}

#[tokio::test]
async fn the_memo_key_changes_only_after_a_destructive_or_lossy_invalidation() -> Result<()> {
    for invalidation in [
        Some(TargetChildInvalidation::Destructive),
        Some(TargetChildInvalidation::Lossy),
    ] {
        let [k1, k2, k3, k4] = memo_keys(invalidation).await?;
        assert_eq!(k1, k2, "{invalidation:?}: unchanged run changed the key");
        assert_ne!(k2, k3, "{invalidation:?}: invalidation kept the key");
        assert_eq!(k3, k4, "{invalidation:?}: unchanged run changed the key");
    }
    let [k1, k2, k3, k4] = memo_keys(None).await?;
    assert_eq!(k1, k2);
    assert_eq!(k2, k3, "a change without invalidation changed the key");
    assert_eq!(k3, k4);
    Ok(())
}

#[tokio::test]
async fn a_container_dropped_and_declared_again_gives_a_memo_key_it_never_gave_before() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = TableRig::new();
    let rows = [("a", "1")];
    let mut seen = vec![sync_table(&app, &rig, "g1", None, &rows).await?];
    for _ in 0..2 {
        sync_no_table(&app, &rig).await?;
        seen.push(sync_table(&app, &rig, "g1", None, &rows).await?);
    }
    // Children memoized on the old key would be skipped, and their rows
    // never written into the new table.
    let distinct: std::collections::BTreeSet<&String> = seen.iter().collect();
    assert_eq!(distinct.len(), seen.len(), "{seen:?}");
    Ok(())
}

// ---------------------------------------------------------------------------
// 7. Preview
// ---------------------------------------------------------------------------

fn flat_rows(
    handler: RowHandler,
    rows: Vec<(String, String)>,
) -> impl FnOnce(Ctx) -> std::pin::Pin<Box<dyn Future<Output = Result<()>> + Send>> + Send + 'static
{
    move |ctx| Box::pin(async move { declare_each(&ctx, "test/row", handler, rows) })
}

/// `(provider, key, kind)` of each preview action, sorted.
fn summary(actions: &[PreviewAction]) -> Vec<(String, String, ActionKind)> {
    let mut out: Vec<_> = actions
        .iter()
        .map(|a| (a.provider.clone(), key_str(&a.key), a.kind))
        .collect();
    out.sort();
    out
}

fn expect(items: &[(&str, &str, ActionKind)]) -> Vec<(String, String, ActionKind)> {
    let mut out: Vec<_> = items
        .iter()
        .map(|(p, k, kind)| (p.to_string(), k.to_string(), *kind))
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn a_preview_lists_actions_without_applying_or_recording_them() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    let rows = [("a", "1"), ("b", "2"), ("c", "3")];

    // On an empty ledger: creates only, nothing applied.
    let actions = bounded(app.preview(flat_rows(rig.handler(), owned(&rows)))).await?;
    assert_eq!(
        summary(&actions),
        expect(&[
            ("test/row", "a", ActionKind::Create),
            ("test/row", "b", ActionKind::Create),
            ("test/row", "c", ActionKind::Create),
        ])
    );
    assert_eq!(rig.log.call_count(), 0, "a preview called the sink");
    assert!(rig.store.snapshot().is_empty());

    // No ledger was written: a real run still creates everything.
    let stats = bounded(app.run(flat_rows(rig.handler(), owned(&rows)))).await?;
    assert_eq!(stats.created, 3);
    assert_eq!(
        rig.log.entries(),
        strings(&["create a=1", "create b=2", "create c=3"])
    );

    // A changed declaration: exactly the update and the delete.
    rig.log.clear();
    let changed = [("a", "10"), ("c", "3")];
    let actions = bounded(app.preview(flat_rows(rig.handler(), owned(&changed)))).await?;
    assert_eq!(
        summary(&actions),
        expect(&[
            ("test/row", "a", ActionKind::Update),
            ("test/row", "b", ActionKind::Delete),
        ])
    );
    assert_eq!(rig.log.call_count(), 0, "a preview called the sink");
    assert_eq!(rig.store.snapshot(), map(&rows));

    // The preview changed nothing: the real run does the same work.
    let stats = bounded(app.run(flat_rows(rig.handler(), owned(&changed)))).await?;
    assert_eq!((stats.updated, stats.deleted), (1, 1));
    assert_eq!(rig.log.entries(), strings(&["delete b", "update a=10"]));
    Ok(())
}

#[tokio::test]
async fn a_preview_of_a_container_calls_the_factory_instead_of_applying() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = TableRig::new();
    let handler = rig.handler(None);
    let actions = bounded(app.preview(move |ctx| async move {
        let table = register_root_target_states_provider(&ctx, "test/table", handler)?;
        let child: TargetStateProvider<String> =
            mount_target(&ctx, table.target_state("docs", spec("g1"))).await?;
        for (k, v) in [("a", "1"), ("b", "2")] {
            declare_target_state(&ctx, child.target_state(k, v.to_string()))?;
        }
        Ok(())
    }))
    .await?;

    assert!(
        rig.factory_calls.load(Ordering::SeqCst) >= 1,
        "the child-handler factory was not called in the preview"
    );
    assert_eq!(rig.table_log.call_count(), 0, "the table sink was called");
    assert_eq!(rig.row_log.call_count(), 0, "the row sink was called");
    assert!(rig.row_store.snapshot().is_empty());

    let listed = summary(&actions);
    assert!(
        listed.contains(&(
            "test/table".to_string(),
            "docs".to_string(),
            ActionKind::Create
        )),
        "actions: {listed:?}"
    );
    let row_creates: Vec<&str> = listed
        .iter()
        .filter(|(p, _, kind)| p != "test/table" && *kind == ActionKind::Create)
        .map(|(_, k, _)| k.as_str())
        .collect();
    assert_eq!(row_creates, vec!["a", "b"], "actions: {listed:?}");
    assert_eq!(listed.len(), 3, "actions: {listed:?}");

    // Nothing was recorded: a real run creates the table and the rows.
    sync_table(&app, &rig, "g1", None, &[("a", "1"), ("b", "2")]).await?;
    assert_eq!(rig.table_log.entries(), strings(&["ensure docs"]));
    assert_eq!(
        rig.row_log.entries(),
        strings(&["create a=1", "create b=2"])
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// 8. App::drop_state
// ---------------------------------------------------------------------------

/// The sinks of the drop_state test: flat rows of the root, rows of
/// mount_each children, and a mounted container.
#[derive(Clone, Default)]
struct DropRigs {
    flat: Rig,
    each: Rig,
    table: TableRig,
}

async fn sync_everything(app: &App, rigs: &DropRigs) -> Result<UpdateStats> {
    let flat = rigs.flat.handler();
    let each = rigs.each.handler();
    let table_handler = rigs.table.handler(None);
    bounded(app.run(move |ctx| async move {
        let provider = register_root_target_states_provider(&ctx, "test/row", flat)?;
        declare_target_state(&ctx, provider.target_state("r1", "1".to_string()))?;
        declare_target_state(&ctx, provider.target_state("r2", "2".to_string()))?;
        ctx.mount_each(
            vec!["x".to_string(), "y".to_string()],
            |item| item.clone(),
            move |ctx, item| {
                let each = each.clone();
                async move {
                    let provider = register_root_target_states_provider(&ctx, "test/each", each)?;
                    declare_target_state(&ctx, provider.target_state(item.clone(), item))
                }
            },
        )
        .await?;
        let table = register_root_target_states_provider(&ctx, "test/table", table_handler)?;
        let child: TargetStateProvider<String> =
            mount_target(&ctx, table.target_state("docs", spec("g1"))).await?;
        declare_target_state(&ctx, child.target_state("a", "1".to_string()))?;
        declare_target_state(&ctx, child.target_state("b", "2".to_string()))?;
        Ok(())
    }))
    .await
}

fn clear_drop_rigs(rigs: &DropRigs) {
    rigs.flat.log.clear();
    rigs.each.log.clear();
    rigs.table.clear();
}

fn assert_everything_created(rigs: &DropRigs) {
    assert_eq!(
        rigs.flat.log.entries(),
        strings(&["create r1=1", "create r2=2"])
    );
    assert_eq!(
        rigs.each.log.entries(),
        strings(&["create x=x", "create y=y"])
    );
    assert_eq!(rigs.table.table_log.entries(), strings(&["ensure docs"]));
    assert_eq!(
        rigs.table.row_log.entries(),
        strings(&["create a=1", "create b=2"])
    );
}

#[tokio::test]
async fn drop_state_deletes_every_tracked_state_and_a_later_run_creates_them_again() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rigs = DropRigs::default();

    sync_everything(&app, &rigs).await?;
    assert_everything_created(&rigs);

    clear_drop_rigs(&rigs);
    let flat = rigs.flat.handler();
    let each = rigs.each.handler();
    let table_handler = rigs.table.handler(None);
    let stats = bounded(app.drop_state(move |ctx| async move {
        register_root_target_states_provider(&ctx, "test/row", flat)?;
        register_root_target_states_provider(&ctx, "test/each", each)?;
        register_root_target_states_provider(&ctx, "test/table", table_handler)?;
        Ok(())
    }))
    .await?;
    assert_eq!(
        rigs.flat.log.entries(),
        strings(&["delete r1", "delete r2"])
    );
    assert!(rigs.flat.store.snapshot().is_empty());
    assert_eq!(rigs.each.log.entries(), strings(&["delete x", "delete y"]));
    assert!(rigs.each.store.snapshot().is_empty());
    assert_eq!(rigs.table.table_log.entries(), strings(&["drop docs"]));
    assert_eq!(
        rigs.table.row_log.call_count(),
        0,
        "a dropped container's rows were reconciled one by one: {:?}",
        rigs.table.row_log.entries()
    );
    assert_eq!(stats.deleted, 5, "stats: {stats:?}");
    assert_eq!((stats.created, stats.updated), (0, 0), "stats: {stats:?}");

    // Nothing is tracked any more: the original declarations create all.
    clear_drop_rigs(&rigs);
    let stats = sync_everything(&app, &rigs).await?;
    assert_everything_created(&rigs);
    assert_eq!(stats.created, 7, "stats: {stats:?}");
    Ok(())
}

#[tokio::test]
async fn declaring_inside_drop_state_is_an_error_and_deletes_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    bounded(app.run(flat_rows(rig.handler(), owned(&[("a", "1")])))).await?;
    rig.log.clear();

    let handler = rig.handler();
    let result = bounded(app.drop_state(move |ctx| async move {
        let provider = register_root_target_states_provider(&ctx, "test/row", handler)?;
        // Ignore the error: the engine must still fail the drop.
        let _ = declare_target_state(&ctx, provider.target_state("a", "1".to_string()));
        Ok(())
    }))
    .await;
    assert!(result.is_err(), "declaring in drop_state was accepted");
    assert_eq!(rig.log.call_count(), 0, "log: {:?}", rig.log.entries());
    assert_eq!(rig.store.snapshot(), map(&[("a", "1")]));

    let handler = rig.handler();
    let result = bounded(app.drop_state(move |ctx| async move {
        let provider = register_root_target_states_provider(&ctx, "test/row", handler)?;
        declare_target_state(&ctx, provider.target_state("b", "2".to_string()))
    }))
    .await;
    let err = result
        .err()
        .ok_or_else(|| Error::msg("declaring was accepted"))?;
    assert!(!err.to_string().is_empty());
    assert_eq!(rig.log.call_count(), 0, "log: {:?}", rig.log.entries());
    Ok(())
}

// ---------------------------------------------------------------------------
// 9. A container handler that gives no Create/Update while declared
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum BadAnswer {
    NoAction,
    Delete,
}

/// A container handler that, while declared, answers `None` or a `Delete`.
struct BadTableHandler {
    sink: TargetActionSink<TableAction>,
    answer: BadAnswer,
}

impl TargetHandler<TableSpec> for BadTableHandler {
    type TrackingRecord = TableSpec;
    type Action = TableAction;

    fn reconcile(
        &self,
        key: StableKey,
        _desired: Option<TableSpec>,
        _prev: Vec<TableSpec>,
        _prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<TableAction, TableSpec>>> {
        match self.answer {
            BadAnswer::NoAction => Ok(None),
            BadAnswer::Delete => Ok(Some(TargetReconcileOutput {
                action: TargetAction::Delete(TableAction {
                    name: key_str(&key),
                    recreate: false,
                    drop: true,
                }),
                sink: self.sink.clone(),
                tracking_record: None,
                child_invalidation: None,
            })),
        }
    }
}

async fn bad_container_case(answer: BadAnswer, mounted: bool) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let flat = Rig::new();
    let table = TableRig::new();
    let flat_handler = flat.handler();
    let bad = BadTableHandler {
        sink: table.table_sink(),
        answer,
    };
    let bad = Arc::new(Mutex::new(Some(bad)));
    let result = bounded(app.run(move |ctx| async move {
        let provider = register_root_target_states_provider(&ctx, "test/row", flat_handler)?;
        declare_target_state(&ctx, provider.target_state("root", "1".to_string()))?;
        ctx.mount_each(
            vec!["bad".to_string(), "good".to_string()],
            |item| item.clone(),
            move |ctx, item| {
                let provider = provider.clone();
                let bad = Arc::clone(&bad);
                async move {
                    if item == "good" {
                        return declare_target_state(
                            &ctx,
                            provider.target_state("good", "1".to_string()),
                        );
                    }
                    let handler = bad
                        .lock()
                        .map_err(|_| Error::msg("poisoned"))?
                        .take()
                        .ok_or_else(|| Error::msg("bad handler used twice"))?;
                    let tables =
                        register_root_target_states_provider(&ctx, "test/badtable", handler)?;
                    let state = tables.target_state("docs", spec("g1"));
                    let child: TargetStateProvider<String> = if mounted {
                        mount_target(&ctx, state).await?
                    } else {
                        declare_target_state_with_child(&ctx, state)?
                    };
                    declare_target_state(&ctx, child.target_state("a", "1".to_string()))
                }
            },
        )
        .await
    }))
    .await;

    let case = format!("{answer:?}, mounted={mounted}");
    let err = result
        .err()
        .ok_or_else(|| Error::msg(format!("{case}: the run succeeded")))?;
    let failures = err.failed_components();
    assert_eq!(failures.len(), 1, "{case}: {err}");
    assert_eq!(failures[0].path.to_string(), "/bad", "{case}: {err}");
    assert!(
        failures[0].cause.contains("test/badtable"),
        "{case}: the error does not name the provider: {}",
        failures[0].cause
    );
    assert!(err.to_string().contains("test/badtable"), "{case}: {err}");
    // The children never got a handler.
    assert_eq!(table.row_log.call_count(), 0, "{case}");
    assert!(table.seen().is_empty(), "{case}");
    // The others committed.
    assert_eq!(
        flat.log.entries(),
        strings(&["create good=1", "create root=1"]),
        "{case}"
    );
    Ok(())
}

#[tokio::test]
async fn a_declared_container_whose_handler_gives_no_create_or_update_fails_its_component_only(
) -> Result<()> {
    for answer in [BadAnswer::NoAction, BadAnswer::Delete] {
        for mounted in [false, true] {
            bad_container_case(answer, mounted).await?;
        }
    }
    Ok(())
}
