//! More containers: nested containers, attachments of rows, failing
//! components, two components mounting one container, and a container
//! sharing its sink with its rows.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use weir::prelude::*;

use crate::support::*;

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
    let r = run_db(&app, &db, inv, Some(1), two_comps_one_row_each()).await?;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(db.tables.rows.store(), smap(&[("a", "1"), ("b", "1")]));
    lock(&db.log).clear();
    db.tables.clear();
    let r = run_db(&app, &db, inv, Some(2), two_comps_one_row_each()).await?;
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
    run_db(&app, &db, inv, Some(2), two_comps_one_row_each()).await?;
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
    run_db(&app, &db, None, Some(1), two_comps_one_row_each()).await?;
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
    run_db(&app, &db, None, Some(1), two_comps_one_row_each()).await?;
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
    let (_dir, app, t) = fresh_tables().await?;
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
    assert_no_calls(&att);
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
    let (_dir, app, t) = fresh_tables().await?;
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
    let (_dir, app, t) = fresh_tables().await?;
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
    let (_dir, app, t) = fresh_tables().await?;
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
