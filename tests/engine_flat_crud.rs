//! Flat target states: create, update, delete, and the no-change path.

mod support;

use support::*;
use weir::prelude::*;

async fn sync(app: &App, rig: &Rig, rows: Vec<(String, String)>) -> Result<UpdateStats> {
    let handler = rig.handler();
    app.run(move |ctx| async move { declare_each(&ctx, "test/row", handler, rows) })
        .await
}

#[tokio::test]
async fn rows_are_created_updated_and_deleted_to_match_declarations() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();

    let stats = sync(&app, &rig, owned(&[("a", "1"), ("b", "2")])).await?;
    assert_eq!(stats.created, 2);
    assert_eq!(rig.store.snapshot(), map(&[("a", "1"), ("b", "2")]));

    rig.log.clear();
    let stats = sync(&app, &rig, owned(&[("a", "1"), ("b", "3"), ("c", "4")])).await?;
    assert_eq!((stats.created, stats.updated, stats.unchanged), (1, 1, 1));
    assert_eq!(rig.log.entries(), vec!["create c=4", "update b=3"]);

    rig.log.clear();
    let stats = sync(&app, &rig, owned(&[("c", "4")])).await?;
    assert_eq!(stats.deleted, 2);
    assert_eq!(rig.log.entries(), vec!["delete a", "delete b"]);
    assert_eq!(rig.store.snapshot(), map(&[("c", "4")]));
    Ok(())
}

#[tokio::test]
async fn an_unchanged_rerun_calls_no_sink() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    sync(&app, &rig, owned(&[("a", "1"), ("b", "2")])).await?;
    rig.log.clear();
    let stats = sync(&app, &rig, owned(&[("a", "1"), ("b", "2")])).await?;
    assert_eq!(rig.log.call_count(), 0);
    assert_eq!(stats.unchanged, 2);
    assert_eq!((stats.created, stats.updated, stats.deleted), (0, 0, 0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_on_a_multi_thread_runtime_too() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    sync(&app, &rig, owned(&[("a", "1")])).await?;
    assert_eq!(rig.store.snapshot(), map(&[("a", "1")]));
    Ok(())
}
