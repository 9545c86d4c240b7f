//! A container target ("tables") whose rows are kv states.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use weir::prelude::*;

use super::*;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Spec {
    pub(crate) generation: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct TableAct {
    pub(crate) name: String,
    /// Destructive change: the table is dropped and created again.
    pub(crate) recreate: bool,
    /// Lossy change: every row's value is damaged.
    pub(crate) lossy: bool,
}

pub(crate) struct Table {
    pub(crate) sink: TargetActionSink<TableAct>,
    pub(crate) invalidation: Option<TargetChildInvalidation>,
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
pub(crate) struct Tables {
    pub(crate) log: Arc<Mutex<Vec<String>>>,
    pub(crate) rows: Ext,
    pub(crate) factory_calls: Arc<AtomicUsize>,
}

impl Tables {
    pub(crate) fn handler(&self, invalidation: Option<TargetChildInvalidation>) -> Table {
        self.handler_impl(invalidation, None)
    }

    /// As `handler`, with rows whose handler has an "index" attachment
    /// recorded in `att` (dropped with the table).
    pub(crate) fn handler_with_index(
        &self,
        invalidation: Option<TargetChildInvalidation>,
        att: &Ext,
    ) -> Table {
        self.handler_impl(invalidation, Some(att.clone()))
    }

    pub(crate) fn handler_impl(
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

    pub(crate) fn log(&self) -> Vec<String> {
        lock(&self.log).clone()
    }

    pub(crate) fn clear(&self) {
        lock(&self.log).clear();
        self.rows.clear();
    }
}

/// One run: the root mounts table "t" at `generation` (or declares no table
/// when `None`) and mounts one component per entry of `comps`, each
/// declaring its rows into the table. Components whose only row value is
/// `"!code-fails"` fail in their own code after declaring the rest.
pub(crate) async fn run_table(
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

/// The usual rows of the container tests: component c1 declares a = 1 and
/// c2 declares b = 1.
pub(crate) fn two_comps_one_row_each() -> Comps {
    comps(&[("c1", &[("a", "1")]), ("c2", &[("b", "1")])])
}

/// A fresh ledger directory, an App on it, and an empty table world. Keep
/// the directory alive for as long as the App is used.
pub(crate) async fn fresh_tables() -> Result<(tempfile::TempDir, App, Tables)> {
    let dir = tempfile::tempdir()?;
    let app = open(dir.path()).await?;
    Ok((dir, app, Tables::default()))
}
