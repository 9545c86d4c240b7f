//! Child invalidation reaches every depth: after a `Lossy` change of an
//! outer container, every state below it (nested containers and their
//! rows) is reconciled as possibly missing; after a `Destructive` one,
//! everything below is created again. Checked with containers nested two
//! and three deep.

mod support;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use support::*;
use weir::prelude::*;

async fn bounded<T>(fut: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .map_err(|_| Error::msg("timed out after 60s"))?
}

/// What a container's reconcile was given, and what its sink applied.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ContainerCall {
    level: u32,
    prev_empty: bool,
    prev_may_be_missing: bool,
}

#[derive(Clone, Default)]
struct Recorder {
    containers: Arc<Mutex<Vec<ContainerCall>>>,
    applied: Arc<Mutex<Vec<String>>>,
    rows: Arc<Mutex<Vec<Seen>>>,
    row_log: Log,
    row_store: Store,
}

impl Recorder {
    fn clear(&self) {
        for list in [&self.applied] {
            if let Ok(mut l) = list.lock() {
                l.clear();
            }
        }
        if let Ok(mut l) = self.containers.lock() {
            l.clear();
        }
        if let Ok(mut l) = self.rows.lock() {
            l.clear();
        }
        self.row_log.clear();
    }

    fn containers(&self) -> Vec<ContainerCall> {
        self.containers
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default()
    }

    fn applied(&self) -> Vec<String> {
        self.applied.lock().map(|c| c.clone()).unwrap_or_default()
    }

    fn rows(&self) -> Vec<Seen> {
        let mut rows = self.rows.lock().map(|c| c.clone()).unwrap_or_default();
        rows.sort_by(|a, b| a.key.cmp(&b.key));
        rows
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct LevelAction {
    level: u32,
    kind: String,
}

/// A container at `level` (1 is the outermost) of `depth` nested
/// containers: its children are the next level's containers, or rows
/// below the innermost. Its value is a generation; a changed generation
/// answers with `invalidation`.
struct Level {
    level: u32,
    depth: u32,
    invalidation: Option<TargetChildInvalidation>,
    rec: Recorder,
}

impl Level {
    fn sink(&self) -> TargetActionSink<LevelAction> {
        let applied = Arc::clone(&self.rec.applied);
        let (level, depth, rec) = (self.level, self.depth, self.rec.clone());
        TargetActionSink::from_async_fn_with_child_handler(
            move |actions: Vec<TargetAction<LevelAction>>| {
                let applied = Arc::clone(&applied);
                async move {
                    let mut applied = applied.lock().map_err(|_| Error::msg("poisoned"))?;
                    for a in actions {
                        let (TargetAction::Create(a)
                        | TargetAction::Update(a)
                        | TargetAction::Delete(a)) = a;
                        applied.push(format!("{} level{}", a.kind, a.level));
                    }
                    Ok(())
                }
            },
            move |_: &LevelAction| {
                if level < depth {
                    Ok(ChildTargetDef::new::<u32, _>(Level {
                        level: level + 1,
                        depth,
                        invalidation: None,
                        rec: rec.clone(),
                    }))
                } else {
                    let sink = recording_sink(rec.row_log.clone(), rec.row_store.clone(), None);
                    Ok(ChildTargetDef::new::<String, _>(RowHandler::watched_into(
                        sink, &rec.rows,
                    )))
                }
            },
        )
    }
}

impl TargetHandler<u32> for Level {
    type TrackingRecord = u32;
    type Action = LevelAction;

    fn reconcile(
        &self,
        _key: StableKey,
        desired: Option<u32>,
        prev: Vec<u32>,
        prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<LevelAction, u32>>> {
        self.rec
            .containers
            .lock()
            .map_err(|_| Error::msg("poisoned"))?
            .push(ContainerCall {
                level: self.level,
                prev_empty: prev.is_empty(),
                prev_may_be_missing,
            });
        let Some(generation) = desired else {
            return Ok(Some(TargetReconcileOutput {
                action: TargetAction::Delete(LevelAction {
                    level: self.level,
                    kind: "drop".into(),
                }),
                sink: self.sink(),
                tracking_record: None,
                child_invalidation: Some(TargetChildInvalidation::Destructive),
            }));
        };
        let changed = !prev.is_empty() && !prev.contains(&generation);
        let (action, kind) = if prev.is_empty() {
            (TargetAction::Create as fn(LevelAction) -> _, "create")
        } else {
            (TargetAction::Update as fn(LevelAction) -> _, "ensure")
        };
        Ok(Some(TargetReconcileOutput {
            action: action(LevelAction {
                level: self.level,
                kind: kind.into(),
            }),
            sink: self.sink(),
            tracking_record: Some(generation),
            child_invalidation: changed.then_some(self.invalidation).flatten(),
        }))
    }
}

/// Mounts `depth` nested containers (the outermost at `generation`, the
/// others at 1) and declares rows `a` and `b` below the innermost.
async fn sync(
    app: &App,
    rec: &Recorder,
    depth: u32,
    generation: u32,
    invalidation: TargetChildInvalidation,
) -> Result<UpdateStats> {
    let outer = Level {
        level: 1,
        depth,
        invalidation: Some(invalidation),
        rec: rec.clone(),
    };
    bounded(app.run(move |ctx| async move {
        let root = register_root_target_states_provider(&ctx, "levels", outer)?;
        let mut provider: TargetStateProvider<u32> =
            mount_target(&ctx, root.target_state("c1", generation)).await?;
        for level in 2..depth {
            provider = mount_target(&ctx, provider.target_state(format!("c{level}"), 1)).await?;
        }
        let rows: TargetStateProvider<String> =
            mount_target(&ctx, provider.target_state(format!("c{depth}"), 1)).await?;
        declare_into(&ctx, &rows, [("a", "1"), ("b", "2")])
    }))
    .await
}

/// Runs the outer container at generation 1, then at 2 (the change under
/// test), then at 2 again; returns the recorder as the change left it.
async fn change_outer(
    depth: u32,
    invalidation: TargetChildInvalidation,
) -> Result<(
    Recorder,
    Vec<ContainerCall>,
    Vec<String>,
    Vec<Seen>,
    Vec<String>,
)> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rec = Recorder::default();
    sync(&app, &rec, depth, 1, invalidation).await?;
    rec.clear();
    sync(&app, &rec, depth, 2, invalidation).await?;
    let seen = (
        rec.containers(),
        rec.applied(),
        rec.rows(),
        rec.row_log.entries(),
    );
    // A further unchanged run writes no row.
    rec.clear();
    sync(&app, &rec, depth, 2, invalidation).await?;
    assert_eq!(
        rec.row_log.call_count(),
        0,
        "depth {depth}: a run after the change wrote rows again: {:?}",
        rec.row_log.entries()
    );
    Ok((rec, seen.0, seen.1, seen.2, seen.3))
}

async fn a_lossy_change_marks_everything_below_maybe_missing(depth: u32) -> Result<()> {
    let (_, containers, _, rows, row_log) =
        change_outer(depth, TargetChildInvalidation::Lossy).await?;
    for call in containers.iter().filter(|c| c.level > 1) {
        assert!(
            !call.prev_empty && call.prev_may_be_missing,
            "depth {depth}: the container at level {} was not reconciled as maybe missing: {containers:?}",
            call.level
        );
    }
    assert_eq!(
        containers.iter().filter(|c| c.level > 1).count(),
        depth as usize - 1,
        "depth {depth}: {containers:?}"
    );
    assert_eq!(rows.len(), 2, "depth {depth}: {rows:?}");
    for row in &rows {
        assert!(
            row.prev_may_be_missing && !row.prev.is_empty(),
            "depth {depth}: row {} was not reconciled as maybe missing with its records: {rows:?}",
            row.key
        );
    }
    assert_eq!(
        row_log,
        strings(&["update a=1", "update b=2"]),
        "depth {depth}: the rows are written again as updates"
    );
    Ok(())
}

async fn a_destructive_change_creates_everything_below_again(depth: u32) -> Result<()> {
    let (_, containers, applied, rows, row_log) =
        change_outer(depth, TargetChildInvalidation::Destructive).await?;
    for call in containers.iter().filter(|c| c.level > 1) {
        assert!(
            call.prev_empty,
            "depth {depth}: the container at level {} still saw its records: {containers:?}",
            call.level
        );
    }
    for level in 2..=depth {
        assert!(
            applied.contains(&format!("create level{level}")),
            "depth {depth}: level {level} was not created again: {applied:?}"
        );
    }
    for row in &rows {
        assert!(
            row.prev.is_empty(),
            "depth {depth}: row {} still saw its records: {rows:?}",
            row.key
        );
    }
    assert_eq!(
        row_log,
        strings(&["create a=1", "create b=2"]),
        "depth {depth}: the rows are created again"
    );
    Ok(())
}

#[tokio::test]
async fn a_lossy_change_two_containers_deep_reconciles_the_inner_container_and_its_rows_as_maybe_missing(
) -> Result<()> {
    a_lossy_change_marks_everything_below_maybe_missing(2).await
}

#[tokio::test]
async fn a_lossy_change_three_containers_deep_reconciles_every_level_and_the_rows_as_maybe_missing(
) -> Result<()> {
    a_lossy_change_marks_everything_below_maybe_missing(3).await
}

#[tokio::test]
async fn a_destructive_change_two_containers_deep_creates_the_inner_container_and_its_rows_again(
) -> Result<()> {
    a_destructive_change_creates_everything_below_again(2).await
}

#[tokio::test]
async fn a_destructive_change_three_containers_deep_creates_every_level_and_the_rows_again(
) -> Result<()> {
    a_destructive_change_creates_everything_below_again(3).await
}
