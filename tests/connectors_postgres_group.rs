//! The PostgreSQL coordinator of worker groups against a real server.
//!
//! The server is found as in `tests/pg/mod.rs`; when none answers, each
//! test prints `SKIPPED` and passes, except under `CI=true`. Every test
//! uses a group of its own (test name + a unique suffix), so tests run in
//! parallel, and drops it at the end. Expiries are waited for on the
//! database's clock, with lease TTLs of two seconds.

mod pg;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::{Connection, PgPool};
use weir::connectors::postgres::{check_fence, PostgresCoordinator};
use weir::group::{Coordinator, Epoch, JoinRequest, Joined, LogEntry, PartitionState};
use weir::{Error, Fence, PartitionId, Result};

// ---------------------------------------------------------------------------
// Support
// ---------------------------------------------------------------------------

/// A pool on the test server, or `None` (after a loud message) when there
/// is none and `CI` is not `true`.
async fn server() -> Result<Option<PgPool>> {
    Ok(pg::server(8)
        .await
        .map_err(Error::msg)?
        .map(|(_, pool)| pool))
}

/// A group name unique to this test and this process.
use pg::unique;

/// The lease TTL of groups whose members expire in a test.
const SHORT_TTL: Duration = Duration::from_secs(2);
const MINUTE: Duration = Duration::from_secs(60);

async fn join(
    coordinator: &PostgresCoordinator,
    group: &str,
    member: &str,
    partitions: u32,
    ttl: Duration,
) -> Result<Joined> {
    let mut request = JoinRequest::new(group, member);
    request.partitions = Some(partitions);
    request.lease_ttl = Some(ttl);
    request.host = format!("test:{member}");
    coordinator.join(&request).await
}

/// Each member's data partitions in the targets of `states`.
fn targets(states: &[PartitionState]) -> BTreeMap<String, Vec<u32>> {
    let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for s in states {
        if let (PartitionId::Data(n), Some(target)) = (s.partition, &s.target) {
            out.entry(target.clone()).or_default().push(n);
        }
    }
    out
}

fn root(states: &[PartitionState]) -> Option<&PartitionState> {
    states.iter().find(|s| s.partition == PartitionId::Root)
}

/// Acquires every partition `states` targets at `member`, with their epochs.
async fn acquire_targets(
    coordinator: &PostgresCoordinator,
    group: &str,
    member: &str,
    states: &[PartitionState],
) -> Result<BTreeMap<PartitionId, Epoch>> {
    let mut held = BTreeMap::new();
    for s in states
        .iter()
        .filter(|s| s.target.as_deref() == Some(member))
    {
        let epoch = coordinator.acquire(group, member, s.partition).await?;
        let epoch =
            epoch.ok_or_else(|| Error::msg(format!("{member} could not take {}", s.partition)))?;
        held.insert(s.partition, epoch);
    }
    Ok(held)
}

/// Waits, on the database's clock, until `member`'s membership expired,
/// renewing those of `alive` meanwhile.
async fn until_expired(
    pool: &PgPool,
    coordinator: &PostgresCoordinator,
    group: &str,
    member: &str,
    alive: &[&str],
) -> Result<()> {
    for _ in 0..300 {
        let expired: bool = sqlx::query_scalar(
            "SELECT COALESCE((SELECT expires_at <= clock_timestamp() FROM weir.member
                               WHERE group_name = $1 AND member_id = $2), true)",
        )
        .bind(group)
        .bind(member)
        .fetch_one(pool)
        .await?;
        if expired {
            return Ok(());
        }
        for other in alive {
            assert!(
                coordinator.heartbeat(group, other).await?,
                "{other} expired"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(Error::msg(format!("member {member} never expired")))
}

/// The epoch in the fence row, as another transaction sees it.
async fn fence_epoch(pool: &PgPool, group: &str, partition: PartitionId) -> Result<Epoch> {
    Ok(
        sqlx::query_scalar("SELECT epoch FROM weir.fence WHERE group_name = $1 AND partition = $2")
            .bind(group)
            .bind(partition.as_i32())
            .fetch_one(pool)
            .await?,
    )
}

fn bytes(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

fn record(component: &str, record: &str) -> LogEntry {
    LogEntry::Record {
        component: bytes(component),
        record: bytes(record),
    }
}

fn intents(component: &str, intents: &str) -> LogEntry {
    LogEntry::Intents {
        component: bytes(component),
        intents: bytes(intents),
    }
}

fn removed(component: &str) -> LogEntry {
    LogEntry::Removed {
        component: bytes(component),
    }
}

fn pairs(list: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    list.iter().map(|(c, v)| (bytes(c), bytes(v))).collect()
}

// ---------------------------------------------------------------------------
// Membership and assignment
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_second_join_with_another_partition_count_is_refused_naming_the_group_and_both_counts(
) -> Result<()> {
    let Some(pool) = server().await? else {
        return Ok(());
    };
    let coordinator = PostgresCoordinator::new(pool);
    let group = unique("partition_count");
    let first = join(&coordinator, &group, "a", 8, MINUTE).await?;
    assert_eq!((first.partitions, first.lease_ttl), (8, MINUTE));
    assert!(first.first);

    let refused = join(&coordinator, &group, "b", 16, SHORT_TTL).await;
    let err = refused
        .err()
        .ok_or_else(|| Error::msg("a join with 16 partitions was let in"))?;
    let text = err.to_string();
    assert!(
        text.contains(&group) && text.contains('8') && text.contains("16"),
        "{text}"
    );

    // With the group's own count (or none) it joins, with the group's TTL.
    let mut request = JoinRequest::new(&group, "c");
    request.lease_ttl = Some(SHORT_TTL);
    let other = coordinator.join(&request).await?;
    assert_eq!((other.partitions, other.lease_ttl), (8, MINUTE));
    assert!(!other.first);
    assert!(other.join_pass > first.join_pass);
    let status = coordinator.status(&group).await?;
    let members: Vec<&str> = status.members.iter().map(|m| m.member.as_str()).collect();
    assert_eq!(members, ["a", "c"]);
    coordinator.drop_group(&group).await
}

#[tokio::test]
async fn a_live_member_id_cannot_join_twice() -> Result<()> {
    let Some(pool) = server().await? else {
        return Ok(());
    };
    let coordinator = PostgresCoordinator::new(pool);
    let group = unique("same_id");
    join(&coordinator, &group, "a", 4, MINUTE).await?;
    let again = join(&coordinator, &group, "a", 4, MINUTE).await;
    let err = again
        .err()
        .ok_or_else(|| Error::msg("a second live a was let in"))?;
    assert!(err.to_string().contains("live member a"), "{err}");
    coordinator.drop_group(&group).await
}

#[tokio::test]
async fn dropping_a_group_removes_it_and_a_join_creates_it_afresh() -> Result<()> {
    let Some(pool) = server().await? else {
        return Ok(());
    };
    let coordinator = PostgresCoordinator::new(pool.clone());
    let group = unique("drop");
    join(&coordinator, &group, "a", 4, MINUTE).await?;
    let states = coordinator.assign(&group, "a").await?;
    let held = acquire_targets(&coordinator, &group, "a", &states).await?;
    coordinator
        .append(
            &group,
            PartitionId::Data(0),
            held[&PartitionId::Data(0)],
            vec![record("x", "1")],
        )
        .await?;
    coordinator.drop_group(&group).await?;

    assert!(coordinator.status(&group).await.is_err());
    let left: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM weir.changelog WHERE group_name = $1)
              + (SELECT count(*) FROM weir.fence WHERE group_name = $1)
              + (SELECT count(*) FROM weir.partition WHERE group_name = $1)",
    )
    .bind(&group)
    .fetch_one(&pool)
    .await?;
    assert_eq!(left, 0);
    let again = join(&coordinator, &group, "a", 2, MINUTE).await?;
    assert_eq!(again.partitions, 2);
    assert!(coordinator
        .restore(&group, PartitionId::Data(0))
        .await?
        .records
        .is_empty());
    coordinator.drop_group(&group).await
}

#[tokio::test]
async fn assignment_is_balanced_for_one_two_and_three_members_of_eight_partitions() -> Result<()> {
    let Some(pool) = server().await? else {
        return Ok(());
    };
    let coordinator = PostgresCoordinator::new(pool);
    let group = unique("balanced");
    for (members, want) in [
        (vec!["a"], vec![8]),
        (vec!["a", "b"], vec![4, 4]),
        (vec!["a", "b", "c"], vec![2, 3, 3]),
    ] {
        let newest = members[members.len() - 1];
        join(&coordinator, &group, newest, 8, MINUTE).await?;
        let states = coordinator.assign(&group, newest).await?;
        assert_eq!(states.len(), 9, "the root and eight data partitions");
        assert_eq!(states[0].partition, PartitionId::Root);
        let shared = targets(&states);
        let mut counts: Vec<usize> = shared.values().map(Vec::len).collect();
        counts.sort_unstable();
        assert_eq!(counts, want, "{shared:?}");
        assert!(shared.keys().all(|m| members.contains(&m.as_str())));
        let root_target = root(&states).and_then(|s| s.target.as_deref());
        assert!(
            root_target.is_some_and(|t| members.contains(&t)),
            "{root_target:?}"
        );
    }
    coordinator.drop_group(&group).await
}

#[tokio::test]
async fn a_third_member_takes_only_the_partitions_that_must_move() -> Result<()> {
    let Some(pool) = server().await? else {
        return Ok(());
    };
    let coordinator = PostgresCoordinator::new(pool);
    let group = unique("sticky");
    join(&coordinator, &group, "a", 8, MINUTE).await?;
    join(&coordinator, &group, "b", 8, MINUTE).await?;
    let before = coordinator.assign(&group, "a").await?;
    // Owners as well as targets: a and b hold what they were given.
    acquire_targets(&coordinator, &group, "a", &before).await?;
    acquire_targets(&coordinator, &group, "b", &before).await?;
    // Assigning again changes nothing.
    assert_eq!(
        coordinator.assign(&group, "b").await?,
        coordinator.assign(&group, "a").await?
    );

    join(&coordinator, &group, "c", 8, MINUTE).await?;
    let after = coordinator.assign(&group, "c").await?;
    let moved: Vec<PartitionId> = before
        .iter()
        .zip(&after)
        .filter(|(b, a)| b.target != a.target)
        .map(|(b, _)| b.partition)
        .collect();
    let to_c = targets(&after).get("c").cloned().unwrap_or_default();
    assert!(to_c.len() == 2 || to_c.len() == 3, "{to_c:?}");
    assert_eq!(moved.len(), to_c.len(), "moved {moved:?}, c got {to_c:?}");
    for state in after.iter().filter(|s| moved.contains(&s.partition)) {
        assert_eq!(state.target.as_deref(), Some("c"), "{state:?}");
        // Its owner keeps it until it gives it up between runs.
        assert!(
            state.owner.as_deref().is_some_and(|o| o != "c"),
            "{state:?}"
        );
        assert_eq!(
            coordinator.acquire(&group, "c", state.partition).await?,
            None
        );
    }
    assert_eq!(
        root(&before).map(|r| &r.target),
        root(&after).map(|r| &r.target)
    );
    coordinator.drop_group(&group).await
}

#[tokio::test]
async fn a_member_that_leaves_gives_its_partitions_back_at_once() -> Result<()> {
    let Some(pool) = server().await? else {
        return Ok(());
    };
    let coordinator = PostgresCoordinator::new(pool);
    let group = unique("leave");
    join(&coordinator, &group, "a", 4, MINUTE).await?;
    join(&coordinator, &group, "b", 4, MINUTE).await?;
    let states = coordinator.assign(&group, "a").await?;
    acquire_targets(&coordinator, &group, "a", &states).await?;
    let of_b = acquire_targets(&coordinator, &group, "b", &states).await?;
    assert!(!of_b.is_empty());

    coordinator.leave(&group, "b").await?;
    // With a TTL of a minute, only the leave can have freed them.
    let states = coordinator.assign(&group, "a").await?;
    assert!(
        states.iter().all(|s| s.target.as_deref() == Some("a")),
        "{states:?}"
    );
    for (partition, old) in &of_b {
        let epoch = coordinator.acquire(&group, "a", *partition).await?;
        assert!(
            epoch.is_some_and(|e| e > *old),
            "{partition}: {epoch:?} after {old}"
        );
    }
    let status = coordinator.status(&group).await?;
    assert_eq!(status.members.len(), 1);
    assert!(status
        .partition_states
        .iter()
        .all(|s| s.owner.as_deref() == Some("a")));
    assert!(!coordinator.heartbeat(&group, "b").await?);
    coordinator.drop_group(&group).await
}

#[tokio::test]
async fn a_heartbeat_of_an_expired_member_is_refused() -> Result<()> {
    let Some(pool) = server().await? else {
        return Ok(());
    };
    let coordinator = PostgresCoordinator::new(pool.clone());
    let group = unique("expired_heartbeat");
    join(&coordinator, &group, "a", 2, SHORT_TTL).await?;
    let states = coordinator.assign(&group, "a").await?;
    acquire_targets(&coordinator, &group, "a", &states).await?;
    assert!(coordinator.heartbeat(&group, "a").await?);

    until_expired(&pool, &coordinator, &group, "a", &[]).await?;
    assert!(!coordinator.heartbeat(&group, "a").await?);
    // Expired, it owns nothing, and it is no member.
    let status = coordinator.status(&group).await?;
    assert!(status.members.is_empty());
    assert!(status.partition_states.iter().all(|s| s.owner.is_none()));
    // Joining again makes it a member anew, without its old leases.
    join(&coordinator, &group, "a", 2, SHORT_TTL).await?;
    assert!(coordinator.heartbeat(&group, "a").await?);
    let status = coordinator.status(&group).await?;
    assert!(status.partition_states.iter().all(|s| s.owner.is_none()));
    coordinator.drop_group(&group).await
}

// ---------------------------------------------------------------------------
// Leases and fencing
// ---------------------------------------------------------------------------

#[tokio::test]
async fn an_expired_members_partitions_can_be_acquired_and_their_epoch_grows() -> Result<()> {
    let Some(pool) = server().await? else {
        return Ok(());
    };
    let coordinator = PostgresCoordinator::new(pool.clone());
    let group = unique("expired_acquire");
    join(&coordinator, &group, "a", 2, SHORT_TTL).await?;
    let states = coordinator.assign(&group, "a").await?;
    let of_a = acquire_targets(&coordinator, &group, "a", &states).await?;
    assert_eq!(of_a.len(), 3, "the root and both data partitions");

    join(&coordinator, &group, "b", 2, SHORT_TTL).await?;
    // b is no target of a's partitions yet (see the sticky test for a
    // target that may not take a live owner's partition).
    for partition in of_a.keys() {
        assert_eq!(coordinator.acquire(&group, "b", *partition).await?, None);
    }

    until_expired(&pool, &coordinator, &group, "a", &["b"]).await?;
    let states = coordinator.assign(&group, "b").await?;
    assert!(
        states.iter().all(|s| s.target.as_deref() == Some("b")),
        "{states:?}"
    );
    assert!(states.iter().all(|s| s.owner.is_none()), "{states:?}");
    assert!(coordinator.heartbeat(&group, "b").await?);
    let of_b = acquire_targets(&coordinator, &group, "b", &states).await?;
    for (partition, old) in &of_a {
        assert!(
            of_b[partition] > *old,
            "{partition}: {} after {old}",
            of_b[partition]
        );
        assert_eq!(
            fence_epoch(&pool, &group, *partition).await?,
            of_b[partition]
        );
    }
    coordinator.drop_group(&group).await
}

#[tokio::test]
async fn an_append_with_a_stale_epoch_is_refused_as_fenced() -> Result<()> {
    let Some(pool) = server().await? else {
        return Ok(());
    };
    let coordinator = PostgresCoordinator::new(pool);
    let group = unique("stale_append");
    join(&coordinator, &group, "a", 1, MINUTE).await?;
    let states = coordinator.assign(&group, "a").await?;
    let p = PartitionId::Data(0);
    let old = acquire_targets(&coordinator, &group, "a", &states).await?[&p];
    coordinator.release(&group, "a", &[p]).await?;
    let new = coordinator.acquire(&group, "a", p).await?;
    let new = new.ok_or_else(|| Error::msg("a released partition could not be taken again"))?;
    assert!(new > old);

    let refused = coordinator
        .append(&group, p, old, vec![record("x", "stale")])
        .await;
    let err = refused
        .err()
        .ok_or_else(|| Error::msg("a stale append was let in"))?;
    assert!(err.is_fenced(), "{err}");
    assert!(
        matches!(&err, Error::Fenced { partitions, .. } if partitions == &[p]),
        "{err}"
    );
    for refused in [
        coordinator
            .begin_pass(&group, &[(p, old)])
            .await
            .map(|_| ()),
        coordinator.complete_pass(&group, &[(p, old)], 1).await,
        coordinator.compact(&group, p, old).await.map(|_| ()),
    ] {
        assert!(refused.as_ref().is_err_and(Error::is_fenced), "{refused:?}");
    }
    assert!(coordinator.restore(&group, p).await?.records.is_empty());

    coordinator
        .append(&group, p, new, vec![record("x", "current")])
        .await?;
    let restored = coordinator.restore(&group, p).await?;
    assert_eq!(restored.records, pairs(&[("x", "current")]));
    coordinator.drop_group(&group).await
}

#[tokio::test]
async fn check_fence_in_a_users_transaction_refuses_a_stale_epoch_and_accepts_the_current(
) -> Result<()> {
    let Some(pool) = server().await? else {
        return Ok(());
    };
    let coordinator = PostgresCoordinator::new(pool.clone());
    let group = unique("check_fence");
    join(&coordinator, &group, "a", 4, MINUTE).await?;
    let states = coordinator.assign(&group, "a").await?;
    let held = acquire_targets(&coordinator, &group, "a", &states).await?;
    let (root, zero) = (held[&PartitionId::Root], held[&PartitionId::Data(0)]);

    let current = Fence::new(
        group.as_str(),
        vec![(PartitionId::Root, root), (PartitionId::Data(0), zero)],
    );
    let mut tx = pool.begin().await?;
    check_fence(&mut tx, &current).await?;
    tx.commit().await?;

    let stale = Fence::new(
        group.as_str(),
        vec![
            (PartitionId::Root, root),
            (PartitionId::Data(0), zero - 1),
            (PartitionId::Data(3), -1),
        ],
    );
    let mut tx = pool.begin().await?;
    let err = check_fence(&mut tx, &stale)
        .await
        .err()
        .ok_or_else(|| Error::msg("a stale fence passed"))?;
    tx.rollback().await?;
    assert!(err.is_fenced(), "{err}");
    let want = vec![PartitionId::Data(0), PartitionId::Data(3)];
    assert!(
        matches!(&err, Error::Fenced { partitions, .. } if *partitions == want),
        "{err}"
    );
    assert!(err.to_string().contains(&group), "{err}");
    coordinator.drop_group(&group).await
}

#[tokio::test]
async fn a_member_waits_for_the_groups_lock_at_most_half_the_lease_ttl_while_a_paused_one_holds_it(
) -> Result<()> {
    let Some(pool) = server().await? else {
        return Ok(());
    };
    let coordinator = PostgresCoordinator::new(pool.clone());
    let group = unique("lock_waits");
    join(&coordinator, &group, "a", 2, SHORT_TTL).await?;
    // A member paused inside one of the group's transactions: it holds
    // the group's row, and sends nothing more.
    let mut paused = pool.acquire().await?.detach();
    sqlx::query("BEGIN").execute(&mut paused).await?;
    sqlx::query("SELECT 1 FROM weir.worker_group WHERE group_name = $1 FOR NO KEY UPDATE")
        .bind(&group)
        .execute(&mut paused)
        .await?;
    for what in ["assign", "leave"] {
        let started = std::time::Instant::now();
        let waited = async {
            match what {
                "assign" => coordinator.assign(&group, "a").await.map(|_| ()),
                _ => coordinator.leave(&group, "a").await,
            }
        };
        let outcome = tokio::time::timeout(Duration::from_secs(30), waited)
            .await
            .map_err(|_| {
                Error::msg(format!(
                    "{what} still waits for the group's lock after 30 s"
                ))
            })?;
        assert!(outcome.is_err(), "{what} went through a locked row");
        assert!(
            started.elapsed() < SHORT_TTL,
            "{what} gave up after {:?}",
            started.elapsed()
        );
    }
    sqlx::Connection::close(paused).await?;
    coordinator.leave(&group, "a").await?;
    assert!(coordinator.status(&group).await?.members.is_empty());
    coordinator.drop_group(&group).await
}

/// A writer's transaction holding the fence of `partition` under `epoch`,
/// with a row of `table` written in it, uncommitted; and its backend's id.
async fn hold_fence(
    pool: &PgPool,
    group: &str,
    partition: PartitionId,
    epoch: Epoch,
    table: &str,
) -> Result<(sqlx::PgConnection, i32)> {
    let mut conn = pool.acquire().await?.detach();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await?;
    sqlx::query("BEGIN").execute(&mut conn).await?;
    check_fence(&mut conn, &Fence::new(group, vec![(partition, epoch)])).await?;
    sqlx::query(&format!("INSERT INTO {table} (id) VALUES (1)"))
        .execute(&mut conn)
        .await?;
    Ok((conn, pid))
}

/// Waits until a backend is blocked by the backend `blocker`.
async fn until_blocked_by(pool: &PgPool, blocker: i32) -> Result<()> {
    for _ in 0..300 {
        let blocked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
        )
        .bind(blocker)
        .fetch_one(pool)
        .await?;
        if blocked > 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(Error::msg("the takeover never waited for the writer"))
}

/// A group whose member `a` held partition 0 under the returned epoch and
/// expired, and whose member `b` is its target now; and a table for a
/// writer's rows.
async fn expired_owner(
    pool: &PgPool,
    coordinator: &PostgresCoordinator,
    group: &str,
) -> Result<(Epoch, String)> {
    let table = format!("weir_test_{}", group.replace(['-', '.'], "_"));
    sqlx::query(&format!("CREATE TABLE {table} (id integer)"))
        .execute(pool)
        .await?;
    join(coordinator, group, "a", 1, SHORT_TTL).await?;
    let states = coordinator.assign(group, "a").await?;
    let epoch = acquire_targets(coordinator, group, "a", &states).await?[&PartitionId::Data(0)];
    Ok((epoch, table))
}

#[tokio::test]
async fn a_takeover_waits_for_a_writer_holding_the_fence_whose_commit_lands_first() -> Result<()> {
    let Some(pool) = server().await? else {
        return Ok(());
    };
    let group = unique("takeover_waits");
    let coordinator = Arc::new(PostgresCoordinator::new(pool.clone()).takeover_wait(MINUTE));
    let p = PartitionId::Data(0);
    let (old, table) = expired_owner(&pool, &coordinator, &group).await?;
    let (mut writer, writer_pid) = hold_fence(&pool, &group, p, old, &table).await?;

    join(&coordinator, &group, "b", 1, SHORT_TTL).await?;
    until_expired(&pool, &coordinator, &group, "a", &["b"]).await?;
    coordinator.assign(&group, "b").await?;
    assert!(coordinator.heartbeat(&group, "b").await?);
    let taker = Arc::clone(&coordinator);
    let (g, taking) = (group.clone(), p);
    let takeover = tokio::spawn(async move { taker.acquire(&g, "b", taking).await });

    until_blocked_by(&pool, writer_pid).await?;
    assert!(!takeover.is_finished());
    // The new epoch is not visible while the writer holds the fence...
    assert_eq!(fence_epoch(&pool, &group, p).await?, old);
    // ... and a writer that checks after the announcement is refused at once.
    let mut late = pool.begin().await?;
    let refused = check_fence(&mut late, &Fence::new(group.as_str(), vec![(p, old)])).await;
    assert!(refused.is_err_and(|e| e.is_fenced()));
    late.rollback().await?;

    sqlx::query("COMMIT").execute(&mut writer).await?;
    let new = takeover.await.map_err(Error::msg)??;
    let new = new.ok_or_else(|| Error::msg("b did not take partition 0"))?;
    assert!(new > old);
    assert_eq!(fence_epoch(&pool, &group, p).await?, new);
    let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(&pool)
        .await?;
    assert_eq!(rows, 1, "the writer's commit landed");
    writer.close().await?;
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await?;
    coordinator.drop_group(&group).await
}

#[tokio::test]
async fn a_takeover_ends_a_writer_that_holds_the_fence_past_the_wait() -> Result<()> {
    let Some(pool) = server().await? else {
        return Ok(());
    };
    let group = unique("takeover_ends");
    let coordinator =
        PostgresCoordinator::new(pool.clone()).takeover_wait(Duration::from_millis(300));
    let p = PartitionId::Data(0);
    let (old, table) = expired_owner(&pool, &coordinator, &group).await?;
    let (mut writer, _) = hold_fence(&pool, &group, p, old, &table).await?;

    join(&coordinator, &group, "b", 1, SHORT_TTL).await?;
    until_expired(&pool, &coordinator, &group, "a", &["b"]).await?;
    coordinator.assign(&group, "b").await?;
    assert!(coordinator.heartbeat(&group, "b").await?);
    let new = coordinator.acquire(&group, "b", p).await?;
    assert!(new.is_some_and(|new| new > old), "{new:?}");

    let commit = sqlx::query("COMMIT").execute(&mut writer).await;
    assert!(
        commit.is_err(),
        "the paused writer's commit landed after the takeover"
    );
    let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(&pool)
        .await?;
    assert_eq!(rows, 0);
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await?;
    coordinator.drop_group(&group).await
}

// ---------------------------------------------------------------------------
// The changelog
// ---------------------------------------------------------------------------

#[tokio::test]
async fn restore_gives_the_latest_record_per_component_and_pending_intents_before_and_after_compaction(
) -> Result<()> {
    let Some(pool) = server().await? else {
        return Ok(());
    };
    let coordinator = PostgresCoordinator::new(pool.clone()).compact_min_rows(1);
    let group = unique("restore");
    join(&coordinator, &group, "a", 1, MINUTE).await?;
    let states = coordinator.assign(&group, "a").await?;
    let p = PartitionId::Data(0);
    let epoch = acquire_targets(&coordinator, &group, "a", &states).await?[&p];
    for batch in [
        vec![intents("a", "i1"), record("a", "a1"), intents("b", "i2")],
        vec![record("b", "b1"), record("c", "c1"), intents("c", "i3")],
        vec![record("a", "a2"), removed("c"), intents("a", "i4")],
        vec![intents("d", "i5")],
    ] {
        coordinator.append(&group, p, epoch, batch).await?;
    }
    let want_records = pairs(&[("a", "a2"), ("b", "b1")]);
    let want_intents = pairs(&[("a", "i4"), ("d", "i5")]);
    let restored = coordinator.restore(&group, p).await?;
    assert_eq!(restored.records, want_records);
    assert_eq!(restored.intents, want_intents);
    assert_eq!(restored.rows, 10);

    // Below the default bound nothing is folded.
    let small = PostgresCoordinator::new(pool.clone());
    assert_eq!(small.compact(&group, p, epoch).await?, 10);
    // Folded: two records in the snapshot, two pending intents in the log.
    assert_eq!(coordinator.compact(&group, p, epoch).await?, 4);
    let restored = coordinator.restore(&group, p).await?;
    assert_eq!(restored.records, want_records);
    assert_eq!(restored.intents, want_intents);
    assert_eq!(restored.rows, 4);

    // The log after the snapshot collapses what the snapshot kept pending.
    let batch = vec![record("d", "d1"), removed("a"), intents("b", "i6")];
    coordinator.append(&group, p, epoch, batch).await?;
    let want_records = pairs(&[("b", "b1"), ("d", "d1")]);
    let want_intents = pairs(&[("b", "i6")]);
    let restored = coordinator.restore(&group, p).await?;
    assert_eq!(
        (&restored.records, &restored.intents),
        (&want_records, &want_intents)
    );
    assert_eq!(coordinator.compact(&group, p, epoch).await?, 3);
    let restored = coordinator.restore(&group, p).await?;
    assert_eq!(
        (&restored.records, &restored.intents),
        (&want_records, &want_intents)
    );
    // Other partitions see none of it.
    assert_eq!(
        coordinator.restore(&group, PartitionId::Root).await?.rows,
        0
    );
    coordinator.drop_group(&group).await
}

// ---------------------------------------------------------------------------
// Passes
// ---------------------------------------------------------------------------

#[tokio::test]
async fn all_completed_after_is_false_until_every_partition_completed_a_pass_begun_after_the_join(
) -> Result<()> {
    let Some(pool) = server().await? else {
        return Ok(());
    };
    let coordinator = PostgresCoordinator::new(pool);
    let group = unique("passes");
    let a = join(&coordinator, &group, "a", 2, MINUTE).await?;
    assert!(!coordinator.all_completed_after(&group, a.join_pass).await?);
    let states = coordinator.assign(&group, "a").await?;
    let held: Vec<(PartitionId, Epoch)> = acquire_targets(&coordinator, &group, "a", &states)
        .await?
        .into_iter()
        .collect();
    let earlier = coordinator.begin_pass(&group, &held).await?;
    coordinator.complete_pass(&group, &held, earlier).await?;
    assert!(coordinator.all_completed_after(&group, a.join_pass).await?);

    // b joins after that pass: it is not done until a later one completes
    // on every partition, the root included.
    let b = join(&coordinator, &group, "b", 2, MINUTE).await?;
    assert!(b.join_pass > earlier);
    assert!(!coordinator.all_completed_after(&group, b.join_pass).await?);
    let (root_and_0, one) = (&held[..2], &held[2..]);
    assert_eq!(root_and_0[0].0, PartitionId::Root);
    let pass = coordinator.begin_pass(&group, root_and_0).await?;
    let last = coordinator.begin_pass(&group, one).await?;
    assert!(pass > b.join_pass && last > pass);
    coordinator.complete_pass(&group, root_and_0, pass).await?;
    assert!(!coordinator.all_completed_after(&group, b.join_pass).await?);
    // A pass completed under a stale epoch does not count.
    let stale: Vec<(PartitionId, Epoch)> = one.iter().map(|(p, e)| (*p, e - 1)).collect();
    assert!(coordinator
        .complete_pass(&group, &stale, last)
        .await
        .is_err_and(|e| e.is_fenced()));
    assert!(!coordinator.all_completed_after(&group, b.join_pass).await?);
    coordinator.complete_pass(&group, one, last).await?;
    assert!(coordinator.all_completed_after(&group, b.join_pass).await?);
    assert!(!coordinator.all_completed_after(&group, last).await?);
    let status = coordinator.status(&group).await?;
    let completed: Vec<Option<i64>> = status
        .partition_states
        .iter()
        .map(|s| s.completed_pass)
        .collect();
    assert_eq!(completed, [Some(pass), Some(pass), Some(last)]);
    coordinator.drop_group(&group).await
}
