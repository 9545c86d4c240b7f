//! `drop_state` deletes everything weir wrote: the contents of a container
//! whose delete leaves them (a table the user owns) are deleted one by one
//! before the container; a provider the call did not register is named in
//! an error, and its states stay tracked.

mod support;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;
use weir::prelude::*;

async fn bounded<T>(fut: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .map_err(|_| Error::msg("timed out after 60s"))?
}

/// A container the user owns: created and deleted by nobody; its delete
/// leaves its contents (no invalidation). Its sink logs what it was asked.
struct UserTable {
    sink: TargetActionSink<TableAction>,
}

impl TargetHandler<TableSpec> for UserTable {
    type TrackingRecord = TableSpec;
    type Action = TableAction;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<TableSpec>,
        prev: Vec<TableSpec>,
        _prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<TableAction, TableSpec>>> {
        let table = TableAction {
            name: key.to_string(),
            recreate: false,
            drop: false,
        };
        let action = match (&desired, prev.is_empty()) {
            (None, true) => return Ok(None),
            (None, false) => TargetAction::Delete(table),
            (Some(_), true) => TargetAction::Create(table),
            (Some(_), false) => TargetAction::Update(table),
        };
        Ok(Some(TargetReconcileOutput {
            action,
            sink: self.sink.clone(),
            tracking_record: desired,
            child_invalidation: None,
        }))
    }
}

/// The user table's sink (logging `ensure`/`abandon`) and its rows' rig.
fn user_table(log: Arc<Mutex<Vec<String>>>, rows: &Rig) -> UserTable {
    let row_sink = rows.sink();
    let sink = TargetActionSink::from_async_fn_with_child_handler(
        move |actions: Vec<TargetAction<TableAction>>| {
            let log = Arc::clone(&log);
            async move {
                let mut log = log.lock().map_err(|_| Error::msg("poisoned"))?;
                for a in actions {
                    log.push(match a {
                        TargetAction::Delete(_) => "abandon".to_string(),
                        _ => "ensure".to_string(),
                    });
                }
                Ok(())
            }
        },
        move |_: &TableAction| {
            Ok(ChildTargetDef::new::<String, _>(RowHandler::new(
                row_sink.clone(),
            )))
        },
    );
    UserTable { sink }
}

#[tokio::test]
async fn drop_state_deletes_the_rows_weir_wrote_into_a_container_it_does_not_own_then_the_container(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let (log, rows) = (Arc::new(Mutex::new(Vec::new())), Rig::new());
    let handler = user_table(Arc::clone(&log), &rows);
    bounded(app.run(move |ctx| async move {
        let tables = register_root_target_states_provider(&ctx, "tables", handler)?;
        let t: TargetStateProvider<String> =
            mount_target(&ctx, tables.target_state("docs", spec("g1"))).await?;
        ctx.mount("c", move |c| async move {
            declare_into(&c, &t, [("a", "1"), ("b", "2")])
        })
        .await
    }))
    .await?;
    // A row the user wrote there themselves.
    rows.store
        .rows
        .lock()
        .map_err(|_| Error::msg("poisoned"))?
        .insert("mine".into(), "x".into());
    rows.log.clear();

    let handler = user_table(Arc::clone(&log), &rows);
    let stats = bounded(app.drop_state(move |ctx| async move {
        register_root_target_states_provider(&ctx, "tables", handler)?;
        Ok(())
    }))
    .await?;
    assert_eq!(rows.store.snapshot(), map(&[("mine", "x")]));
    assert_eq!(rows.log.entries(), strings(&["delete a", "delete b"]));
    assert_eq!(
        log.lock().map(|l| l.clone()).unwrap_or_default(),
        strings(&["ensure", "abandon"])
    );
    assert_eq!(stats.deleted, 3, "{stats:?}");
    let (_, states, _) = app.ledger_summary().await?;
    assert_eq!(states, 0, "nothing stays tracked");
    Ok(())
}

#[tokio::test]
async fn drop_state_names_a_provider_it_was_not_given_and_keeps_its_states_tracked() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let (kept, dropped) = (Rig::new(), Rig::new());
    let (k, d) = (kept.handler(), dropped.handler());
    bounded(app.run(move |ctx| async move {
        ctx.mount("c", move |c| async move {
            declare_rows(&c, "kept", k, &[("a", "1")])?;
            declare_rows(&c, "dropped", d, &[("b", "1")])
        })
        .await
    }))
    .await?;

    // Only "dropped" is registered.
    let d = dropped.handler();
    let err = bounded(app.drop_state(move |ctx| async move {
        register_root_target_states_provider(&ctx, "dropped", d)?;
        Ok(())
    }))
    .await
    .err()
    .ok_or_else(|| Error::msg("a drop missing a provider must fail"))?;
    let text = err.to_string();
    assert!(text.contains("kept") && text.contains("register"), "{text}");
    assert!(dropped.store.snapshot().is_empty());
    assert_eq!(kept.store.snapshot(), map(&[("a", "1")]));
    let (_, states, _) = app.ledger_summary().await?;
    assert_eq!(states, 1, "the unregistered provider's state stays tracked");

    // Given the provider, a second drop deletes it.
    let k = kept.handler();
    bounded(app.drop_state(move |ctx| async move {
        register_root_target_states_provider(&ctx, "kept", k)?;
        Ok(())
    }))
    .await?;
    assert!(kept.store.snapshot().is_empty());
    let (_, states, _) = app.ledger_summary().await?;
    assert_eq!(states, 0);
    Ok(())
}
