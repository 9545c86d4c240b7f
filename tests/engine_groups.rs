//! Worker groups through the API, with the real PostgreSQL coordinator:
//! members of one process split the partitions, and a rolling update (two
//! versions of the code declaring different schemas of one table)
//! converges on the root holder's declaration without a member ever
//! writing rows against a schema it does not know.

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod pg;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use sqlx::PgPool;
use weir::connectors::postgres::{self, PostgresCoordinator};
use weir::connectors::sql::{ColumnType, TableSchema};
use weir::group::WorkerGroup;
use weir::prelude::*;

const ITEMS: u32 = 24;

fn db() -> ContextKey<PgPool> {
    ContextKey::new("pg")
}

use pg::unique;

/// The two versions of the code: v2 adds a nullable column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

#[derive(Serialize)]
struct RowV1 {
    id: String,
    title: String,
}

#[derive(Serialize)]
struct RowV2 {
    id: String,
    title: String,
    extra: Option<i64>,
}

fn schema(version: Version) -> Result<TableSchema> {
    let builder = TableSchema::builder()
        .column("id", ColumnType::Text)
        .column("title", ColumnType::Text);
    let builder = match version {
        Version::V1 => builder,
        Version::V2 => builder.nullable_column("extra", ColumnType::BigInt),
    };
    builder.primary_key(["id"]).build()
}

async fn member(pool: &PgPool, ledger: &Path, group: &str, id: &str) -> Result<App> {
    let coordinator = Arc::new(PostgresCoordinator::new(pool.clone()));
    let group = WorkerGroup::new(group, coordinator)
        .partitions(4)
        .lease_ttl(Duration::from_secs(2))
        .join_delay(Duration::from_millis(50))
        .member_id(id);
    App::builder("groups")
        .ledger_path(ledger)
        .provide_key(&db(), pool.clone())
        .worker_group(group)
        .build()
        .await
}

/// One run of `version`'s code: the table, then one component per item.
async fn run(app: &App, table: &str, version: Version) -> Result<UpdateStats> {
    let table = table.to_string();
    app.run(move |ctx| async move {
        let target = postgres::mount_table_target(&ctx, &db(), &table, schema(version)?).await?;
        ctx.mount_each(
            (0..ITEMS).map(|i| format!("k{i:02}")),
            |k| k.clone(),
            move |ctx, id| {
                let target = target.clone();
                async move {
                    let title = format!("title of {id}");
                    match version {
                        Version::V1 => target.declare_row(&ctx, &RowV1 { id, title }),
                        Version::V2 => target.declare_row(
                            &ctx,
                            &RowV2 {
                                id,
                                title,
                                extra: Some(2),
                            },
                        ),
                    }
                }
            },
        )
        .await
    })
    .await
}

async fn ids(pool: &PgPool, table: &str) -> BTreeSet<String> {
    sqlx::query_scalar(&format!("SELECT id FROM \"{table}\""))
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

async fn columns(pool: &PgPool, table: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT column_name::text FROM information_schema.columns WHERE table_name = $1 ORDER BY ordinal_position",
    )
    .bind(table)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_waits_for_the_root_holders_schema_and_converges_when_the_old_member_leaves(
) -> Result<()> {
    let Some((_, pool)) = pg::server(8).await.map_err(Error::msg)? else {
        return Ok(());
    };
    let group = unique("rolling");
    let table = unique("rolling_docs");
    let dir = tempfile::tempdir()?;

    // The old version alone: it holds every partition and the root.
    let old = member(&pool, &dir.path().join("old"), &group, "old").await?;
    run(&old, &table, Version::V1).await?;
    assert_eq!(ids(&pool, &table).await.len(), ITEMS as usize);

    // The new version joins: it is given data partitions, not the root,
    // which the old member hands over after its next run.
    let new = member(&pool, &dir.path().join("new"), &group, "new").await?;
    let _ = run(&new, &table, Version::V2).await;
    run(&old, &table, Version::V1).await?;
    let err = run(&new, &table, Version::V2)
        .await
        .expect_err("a schema the root holder did not apply waits");
    assert!(err.is_root_pending(), "{err}");
    let status = new.group_status().await?.expect("a group member");
    assert_eq!(status.members.len(), 2, "{status:?}");
    let owned = |member: &str| {
        status
            .partition_states
            .iter()
            .filter(|p| p.owner.as_deref() == Some(member))
            .count()
    };
    assert!(owned("new") >= 1, "{status:?}");
    assert_eq!(
        new.synced_partitions(),
        Vec::<u32>::new(),
        "a run that waited for the root holder completed no pass"
    );
    assert_eq!(
        columns(&pool, &table).await,
        ["id", "title"],
        "the new member changed nothing of the table"
    );
    // The old version goes on with the partitions it still holds.
    run(&old, &table, Version::V1).await?;

    // The old member stops: the new one takes the root over, applies its
    // schema, and writes every row with it.
    old.leave_group().await?;
    drop(old);
    let mut last = None;
    for _ in 0..20 {
        match run(&new, &table, Version::V2).await {
            Ok(_) if new.group_synced().await? => {
                last = None;
                break;
            }
            Ok(_) => last = None,
            Err(e) if e.is_root_pending() => last = Some(e),
            Err(e) => return Err(e),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(last.is_none(), "still waiting: {last:?}");
    assert_eq!(columns(&pool, &table).await, ["id", "title", "extra"]);
    let with_extra: i64 =
        sqlx::query_scalar(&format!("SELECT count(*) FROM \"{table}\" WHERE extra = 2"))
            .fetch_one(&pool)
            .await?;
    assert_eq!(with_extra, i64::from(ITEMS));
    new.leave_group().await?;
    Ok(())
}

async fn changelog_rows(pool: &PgPool, group: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM weir.changelog WHERE group_name = $1),
                (SELECT count(*) FROM weir.snapshot WHERE group_name = $1)",
    )
    .bind(group)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// One run declaring every item with `title`.
async fn run_titled(app: &App, table: &str, title: &str) -> Result<UpdateStats> {
    let (table, title) = (table.to_string(), title.to_string());
    app.run(move |ctx| async move {
        let target =
            postgres::mount_table_target(&ctx, &db(), &table, schema(Version::V1)?).await?;
        ctx.mount_each(
            (0..ITEMS).map(|i| format!("k{i:02}")),
            |k| k.clone(),
            move |ctx, id| {
                let (target, title) = (target.clone(), title.clone());
                async move { target.declare_row(&ctx, &RowV1 { id, title }) }
            },
        )
        .await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_changelog_is_compacted_as_it_grows_and_a_new_member_restores_it_exactly(
) -> Result<()> {
    let Some((_, pool)) = pg::server(8).await.map_err(Error::msg)? else {
        return Ok(());
    };
    let group = unique("compact");
    let table = unique("compact_docs");
    let dir = tempfile::tempdir()?;
    let compacting = |ledger: &str, id: &str| {
        let coordinator = Arc::new(PostgresCoordinator::new(pool.clone()).compact_min_rows(10));
        let group = WorkerGroup::new(group.as_str(), coordinator)
            .partitions(4)
            .lease_ttl(Duration::from_secs(2))
            .join_delay(Duration::from_millis(50))
            .member_id(id)
            .compact_after_rows(20);
        App::builder("groups")
            .ledger_path(dir.path().join(ledger))
            .provide_key(&db(), pool.clone())
            .worker_group(group)
            .build()
    };
    let first = compacting("first", "first").await?;
    const RUNS: i64 = 12;
    for n in 0..RUNS {
        let stats = run_titled(&first, &table, &format!("version {n}")).await?;
        assert_eq!(stats.failed_components, 0, "{stats:?}");
    }
    let (log, snapshot) = changelog_rows(&pool, &group).await;
    assert!(snapshot > 0, "nothing was ever compacted");
    // Each run wrote every component's record: without compaction the
    // log would hold them all. Compacted, it holds about twice the
    // components, plus the threshold per partition (5 partitions).
    let bound = 2 * (i64::from(ITEMS) + 2) + 5 * 20 + 5 * 20;
    assert!(
        log + snapshot <= bound,
        "log {log} + snapshot {snapshot} rows exceed {bound}"
    );
    // Every run appended every component's record at least.
    assert!(
        RUNS * i64::from(ITEMS) > bound,
        "the test appends too little"
    );

    // A member with an empty ledger takes every partition over from the
    // compacted changelog, and finds nothing to change.
    first.leave_group().await?;
    drop(first);
    let second = compacting("second", "second").await?;
    let stats = run_titled(&second, &table, &format!("version {}", RUNS - 1)).await?;
    assert_eq!(
        (stats.created, stats.updated, stats.deleted),
        (0, 0, 0),
        "{stats:?}"
    );
    let rows: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM \"{table}\" WHERE title = 'version {}'",
        RUNS - 1
    ))
    .fetch_one(&pool)
    .await?;
    assert_eq!(rows, i64::from(ITEMS));
    second.leave_group().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_joining_while_a_paused_peer_holds_the_groups_row_waits_and_joins() -> Result<()> {
    let Some((_, pool)) = pg::server(8).await.map_err(Error::msg)? else {
        return Ok(());
    };
    let group = unique("held_row");
    let dir = tempfile::tempdir()?;
    let first = member(&pool, &dir.path().join("first"), &group, "first").await?;

    // A peer stopped inside a transaction that locked the group's row: it
    // holds it for longer than a joiner's statements wait (half the lease
    // TTL of 2 s), then lets go, as the server does when it ends a paused
    // member's connection.
    let mut peer = pool.begin().await?;
    sqlx::query("SELECT 1 FROM weir.worker_group WHERE group_name = $1 FOR UPDATE")
        .bind(&group)
        .execute(&mut *peer)
        .await?;
    let held = Duration::from_millis(2500);
    let release = tokio::spawn(async move {
        tokio::time::sleep(held).await;
        peer.rollback().await
    });

    let started = std::time::Instant::now();
    let second = member(&pool, &dir.path().join("second"), &group, "second").await?;
    release.await.map_err(Error::msg)??;
    assert!(
        started.elapsed() >= held,
        "joined in {:?}, while the row was held",
        started.elapsed()
    );
    let status = second.group_status().await?.expect("a group member");
    assert_eq!(status.members.len(), 2, "{status:?}");
    second.leave_group().await?;
    first.leave_group().await?;
    Ok(())
}
