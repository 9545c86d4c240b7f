//! The engine side: the external system (one store for every level, and
//! the paths whose sink calls fail), the handler of containers and their
//! contents, the components' code, and running a plan.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use proptest::test_runner::TestCaseError;
use serde::{Deserialize, Serialize};
use weir::prelude::*;

use crate::plan::*;
use crate::support::*;

/// How long one run may take before it counts as a hang.
const RUN_LIMIT: Duration = Duration::from_secs(10);

/// A value declared through the container provider or a container's child
/// provider: a row, or a nested container.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Node {
    Row(String),
    Container {
        generation: u32,
        destructive: bool,
        /// Which of its contents a `Lossy` change loses.
        seed: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum NodeRecord {
    Row(String),
    Container(u32),
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct NodeAction {
    path: String,
    op: NodeOp,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
enum NodeOp {
    /// Write a row.
    Put(String),
    /// Delete a row.
    Remove,
    /// Create the container if missing; its contents stay.
    Ensure(u32),
    /// Drop the container with its contents and create it again.
    Recreate(u32),
    /// A change that loses some of the container's contents.
    Thin { generation: u32, seed: u64 },
    /// Drop the container with its contents.
    Drop,
}

/// The external system: one store for every level (paths like `k1`, `A`,
/// `A/k1`, `A/x`, `A/x/k1`), and the paths whose sink calls fail.
#[derive(Clone, Default)]
pub(crate) struct External {
    pub(crate) store: Store,
    failing: Arc<Mutex<BTreeSet<String>>>,
}

impl External {
    fn set_failing(&self, paths: &BTreeSet<String>) -> std::result::Result<(), TestCaseError> {
        *self.failing.lock().map_err(|_| fail("poisoned"))? = paths.clone();
        Ok(())
    }

    /// The error of a call with a failing path, if it has one.
    fn refusal<'a>(&self, mut paths: impl Iterator<Item = &'a str>) -> Option<String> {
        let failing = self.failing.lock().ok()?;
        paths
            .find(|p| failing.contains(*p))
            .map(|p| format!("the external system refuses {p}"))
    }

    /// Applies a call of node actions, all or nothing.
    fn apply(&self, actions: Vec<TargetAction<NodeAction>>) -> Result<()> {
        if let Some(msg) = self.refusal(actions.iter().map(|a| a.inner().path.as_str())) {
            return Err(Error::msg(msg));
        }
        let mut rows = self.store.rows.lock().map_err(|_| Error::msg("poisoned"))?;
        for action in actions {
            let NodeAction { path, op } = action.into_inner();
            let below = format!("{path}/");
            match op {
                NodeOp::Put(v) => {
                    rows.insert(path, v);
                }
                NodeOp::Remove => {
                    rows.remove(&path);
                }
                NodeOp::Ensure(generation) => {
                    rows.insert(path, marker(generation));
                }
                NodeOp::Recreate(generation) => {
                    rows.retain(|k, _| !k.starts_with(&below));
                    rows.insert(path, marker(generation));
                }
                NodeOp::Thin { generation, seed } => {
                    rows.retain(|k, _| !(k.starts_with(&below) && thinned(seed, k)));
                    rows.insert(path, marker(generation));
                }
                NodeOp::Drop => {
                    rows.retain(|k, _| !k.starts_with(&below));
                    rows.remove(&path);
                }
            }
        }
        Ok(())
    }

    /// The sink of the root rows.
    fn row_sink(&self) -> TargetActionSink<RowAction> {
        let ext = self.clone();
        let fail_fn: FailFn =
            Arc::new(move |_n, keys: &[String]| ext.refusal(keys.iter().map(String::as_str)));
        recording_sink(Log::default(), self.store.clone(), Some(fail_fn))
    }
}

/// The sinks of the node handlers: one per container level, and one for
/// the rows of every container.
struct NodeSinks {
    containers: Vec<TargetActionSink<NodeAction>>,
    rows: TargetActionSink<NodeAction>,
}

/// Builds the node sinks once: each container level's sink has a
/// child-handler factory that builds the handler of the level below.
fn node_sinks(ext: &External) -> Arc<OnceLock<NodeSinks>> {
    let cell: Arc<OnceLock<NodeSinks>> = Arc::new(OnceLock::new());
    let containers = (0..DEPTH)
        .map(|depth| {
            let apply_ext = ext.clone();
            let weak: Weak<OnceLock<NodeSinks>> = Arc::downgrade(&cell);
            TargetActionSink::from_async_fn_with_child_handler(
                move |actions: Vec<TargetAction<NodeAction>>| {
                    let ext = apply_ext.clone();
                    async move { ext.apply(actions) }
                },
                move |action: &NodeAction| {
                    let sinks = weak
                        .upgrade()
                        .ok_or_else(|| Error::msg("the node sinks are gone"))?;
                    Ok(ChildTargetDef::new::<Node, _>(NodeHandler {
                        prefix: Some(action.path.clone()),
                        depth: depth + 1,
                        sinks,
                    }))
                },
            )
        })
        .collect();
    let rows_ext = ext.clone();
    let rows = TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<NodeAction>>| {
        let ext = rows_ext.clone();
        async move { ext.apply(actions) }
    });
    let _ = cell.set(NodeSinks { containers, rows });
    cell
}

/// The handler of the outer containers (at the root, `prefix: None`) and
/// of everything inside a container (rows and nested containers). A
/// container answers with an action on every run it is declared; when its
/// generation is not among its records, with its declared invalidation.
#[derive(Clone)]
struct NodeHandler {
    prefix: Option<String>,
    depth: usize,
    sinks: Arc<OnceLock<NodeSinks>>,
}

type NodeOutput = TargetReconcileOutput<NodeAction, NodeRecord>;

impl TargetHandler<Node> for NodeHandler {
    type TrackingRecord = NodeRecord;
    type Action = NodeAction;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<Node>,
        prev: Vec<NodeRecord>,
        prev_may_be_missing: bool,
    ) -> Result<Option<NodeOutput>> {
        let sinks = self
            .sinks
            .get()
            .ok_or_else(|| Error::msg("the node sinks are not built"))?;
        let name = key_str(&key);
        let path = match &self.prefix {
            Some(p) => format!("{p}/{name}"),
            None => name.clone(),
        };
        let container_sink = || {
            sinks
                .containers
                .get(self.depth)
                .cloned()
                .ok_or_else(|| Error::msg(format!("no container sink at depth {}", self.depth)))
        };
        let kind = |a: NodeAction| {
            if prev.is_empty() {
                TargetAction::Create(a)
            } else {
                TargetAction::Update(a)
            }
        };
        match desired {
            Some(Node::Row(v)) => {
                let record = NodeRecord::Row(v.clone());
                if !prev_may_be_missing && !prev.is_empty() && prev.iter().all(|p| *p == record) {
                    return Ok(None);
                }
                Ok(Some(TargetReconcileOutput {
                    action: kind(NodeAction {
                        path,
                        op: NodeOp::Put(v),
                    }),
                    sink: sinks.rows.clone(),
                    tracking_record: Some(record),
                    child_invalidation: None,
                }))
            }
            Some(Node::Container {
                generation,
                destructive,
                seed,
            }) => {
                let record = NodeRecord::Container(generation);
                let changed = !prev.is_empty() && !prev.contains(&record);
                let invalidation = changed.then_some(if destructive {
                    TargetChildInvalidation::Destructive
                } else {
                    TargetChildInvalidation::Lossy
                });
                let op = match invalidation {
                    Some(TargetChildInvalidation::Destructive) => NodeOp::Recreate(generation),
                    Some(TargetChildInvalidation::Lossy) => NodeOp::Thin { generation, seed },
                    None => NodeOp::Ensure(generation),
                };
                Ok(Some(TargetReconcileOutput {
                    action: kind(NodeAction { path, op }),
                    sink: container_sink()?,
                    tracking_record: Some(record),
                    child_invalidation: invalidation,
                }))
            }
            None => {
                if prev.is_empty() && !prev_may_be_missing {
                    return Ok(None);
                }
                if is_row_key(&name) {
                    Ok(Some(TargetReconcileOutput {
                        action: TargetAction::Delete(NodeAction {
                            path,
                            op: NodeOp::Remove,
                        }),
                        sink: sinks.rows.clone(),
                        tracking_record: None,
                        child_invalidation: None,
                    }))
                } else {
                    Ok(Some(TargetReconcileOutput {
                        action: TargetAction::Delete(NodeAction {
                            path,
                            op: NodeOp::Drop,
                        }),
                        sink: container_sink()?,
                        tracking_record: None,
                        child_invalidation: Some(TargetChildInvalidation::Destructive),
                    }))
                }
            }
        }
    }
}

/// The code of one component: mounts its containers (each committed at
/// once), then declares its rows; returns `Err` where its plan says.
async fn component(
    ctx: Ctx,
    rows: TargetStateProvider<String>,
    containers: TargetStateProvider<Node>,
    plan: CompPlan,
    seed: u64,
    keys: MemoKeys,
) -> Result<()> {
    if plan.fail == Some(FailAt::Start) {
        return Err(Error::msg("the component fails before it mounts anything"));
    }
    let mut inside: Vec<(TargetStateProvider<Node>, String, String)> = Vec::new();
    for (b, c) in &plan.containers {
        let child: TargetStateProvider<Node> = mount_target(
            &ctx,
            containers.target_state(outer_name(*b), c.spec.node(seed)),
        )
        .await?;
        keys.record(outer_name(*b).to_string(), child.memo_key())?;
        for (k, v) in &c.rows {
            inside.push((child.clone(), row_key(*k), value(*v)));
        }
        for (i, inner) in &c.inner {
            let nested: TargetStateProvider<Node> = mount_target(
                &ctx,
                child.target_state(inner_name(*i), inner.spec.node(seed)),
            )
            .await?;
            keys.record(
                format!("{}/{}", outer_name(*b), inner_name(*i)),
                nested.memo_key(),
            )?;
            for (k, v) in &inner.rows {
                inside.push((nested.clone(), row_key(*k), value(*v)));
            }
        }
    }
    if plan.fail == Some(FailAt::AfterMounts) {
        return Err(Error::msg(
            "the component fails after mounting its containers",
        ));
    }
    for (k, v) in &plan.rows {
        declare_target_state(&ctx, rows.target_state(row_key(*k), value(*v)))?;
    }
    for (provider, k, v) in inside {
        declare_target_state(&ctx, provider.target_state(k, Node::Row(v)))?;
    }
    if plan.fail == Some(FailAt::AfterRows) {
        return Err(Error::msg("the component fails after declaring its rows"));
    }
    Ok(())
}

pub(crate) fn fail(msg: impl fmt::Display) -> TestCaseError {
    TestCaseError::fail(msg.to_string())
}

/// The component (`c<i>` under the root) a failed component's path is in:
/// the component itself, or a container component it mounted.
fn component_of(path: &str) -> Option<usize> {
    let first = path.strip_prefix('/')?.split('/').next()?;
    first.strip_prefix('c')?.parse().ok()
}

/// The memo keys of the containers mounted in a run, by path.
#[derive(Clone, Default)]
pub(crate) struct MemoKeys(Arc<Mutex<BTreeMap<String, String>>>);

impl MemoKeys {
    fn record(&self, path: String, key: String) -> Result<()> {
        self.0
            .lock()
            .map_err(|_| Error::msg("poisoned"))?
            .insert(path, key);
        Ok(())
    }

    pub(crate) fn take(&self) -> std::result::Result<BTreeMap<String, String>, TestCaseError> {
        Ok(std::mem::take(
            &mut *self.0.lock().map_err(|_| fail("poisoned"))?,
        ))
    }
}

/// The handlers of a test case, built once.
pub(crate) struct Rigs {
    pub(crate) ext: External,
    rows: RowHandler,
    containers: NodeHandler,
    pub(crate) keys: MemoKeys,
}

impl Rigs {
    pub(crate) fn new() -> Self {
        let ext = External::default();
        let rows = RowHandler::new(ext.row_sink());
        let containers = NodeHandler {
            prefix: None,
            depth: 0,
            sinks: node_sinks(&ext),
        };
        Self {
            ext,
            rows,
            containers,
            keys: MemoKeys::default(),
        }
    }
}

/// The components a run reported failed, with the failures (path and
/// cause) reported in each.
type Failed = BTreeMap<usize, Vec<String>>;

/// Runs `plan` once. Returns the components reported failed.
pub(crate) async fn run_plan(
    app: &App,
    rigs: &Rigs,
    plan: &Plan,
) -> std::result::Result<Failed, TestCaseError> {
    rigs.ext.set_failing(&plan.failing)?;
    let items: Vec<(usize, CompPlan)> = plan.comps.iter().map(|(c, p)| (*c, p.clone())).collect();
    let rows = rigs.rows.clone();
    let containers = rigs.containers.clone();
    let seed = plan.seed;
    let keys = rigs.keys.clone();
    let fut = app.run(move |ctx| async move {
        let rows = register_root_target_states_provider::<String, RowHandler>(&ctx, ROWS, rows)?;
        let containers = register_root_target_states_provider::<Node, NodeHandler>(
            &ctx, CONTAINERS, containers,
        )?;
        ctx.mount_each(
            items,
            |(c, _)| format!("c{c}"),
            move |ctx, (_, plan)| {
                let rows = rows.clone();
                let containers = containers.clone();
                let keys = keys.clone();
                async move { component(ctx, rows, containers, plan, seed, keys).await }
            },
        )
        .await
    });
    let result = tokio::time::timeout(RUN_LIMIT, fut).await.map_err(|_| {
        fail(format!(
            "the run of {plan:?} did not finish within {RUN_LIMIT:?}"
        ))
    })?;
    let Err(e) = result else {
        return Ok(Failed::new());
    };
    let failures = e.failed_components();
    if failures.is_empty() {
        return Err(fail(format!(
            "the run of {plan:?} failed without failed components: {e}"
        )));
    }
    let mut failed = Failed::new();
    for f in failures {
        let path = f.path.to_string();
        match component_of(&path) {
            Some(c) if c < COMPONENTS => {
                failed
                    .entry(c)
                    .or_default()
                    .push(format!("{path}: {}", f.cause));
            }
            _ => {
                return Err(fail(format!(
                    "the run of {plan:?} failed component {path}, which no plan mounts: {}",
                    f.cause
                )))
            }
        }
    }
    Ok(failed)
}
