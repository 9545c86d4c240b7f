//! Membership: joining (creating the group), renewing, giving partitions
//! up, leaving, and the group's status.

use std::time::Duration;

use sqlx::{PgConnection, PgPool};
use weir_actors::group::{
    GroupStatus, JoinRequest, Joined, MemberState, DEFAULT_LEASE_TTL, DEFAULT_PARTITIONS,
};
use weir_actors::{Error, PartitionId, Result};

use super::assign::partition_states;
use super::settings::{lock_group, no_group, Settings};

/// The partition count and TTL (ms) a request creates a group with.
fn requested(request: &JoinRequest) -> Result<(i32, i64)> {
    let group = &request.group;
    let partitions = request.partitions.unwrap_or(DEFAULT_PARTITIONS);
    let partitions = i32::try_from(partitions)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| {
            Error::Usage(format!(
                "worker group {group}: {partitions} partitions asked for; a group has from 1 to {} partitions",
                i32::MAX
            ))
        })?;
    let ttl = request.lease_ttl.unwrap_or(DEFAULT_LEASE_TTL);
    let ttl_ms = i64::try_from(ttl.as_millis())
        .ok()
        .filter(|ms| *ms > 0)
        .ok_or_else(|| {
            Error::Usage(format!(
                "worker group {group}: a lease TTL of {ttl:?} asked for; it must be at least a millisecond"
            ))
        })?;
    Ok((partitions, ttl_ms))
}

/// Creates the group with its partitions (the root, numbered -1, and
/// 0 to P - 1), their fences (epoch 0) and passes, unless it exists.
async fn create_group(
    conn: &mut PgConnection,
    group: &str,
    partitions: i32,
    ttl_ms: i64,
) -> Result<()> {
    let created = sqlx::query(
        "INSERT INTO weir.worker_group (group_name, partitions, lease_ttl_ms) VALUES ($1, $2, $3)
         ON CONFLICT (group_name) DO NOTHING",
    )
    .bind(group)
    .bind(partitions)
    .bind(ttl_ms)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if created == 0 {
        return Ok(());
    }
    for statement in [
        "INSERT INTO weir.partition (group_name, partition)
         SELECT $1, generate_series(-1, $2 - 1)",
        "INSERT INTO weir.fence (group_name, partition, epoch)
         SELECT $1, generate_series(-1, $2 - 1), 0",
        "INSERT INTO weir.partition_pass (group_name, partition)
         SELECT $1, generate_series(-1, $2 - 1)",
    ] {
        sqlx::query(statement)
            .bind(group)
            .bind(partitions)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Joins the group (see [`Coordinator::join`]): creates it if needed,
/// refuses another partition count or a live member of the same id, and
/// writes the membership with a new incarnation.
///
/// [`Coordinator::join`]: weir_actors::group::Coordinator::join
pub(super) async fn join(pool: &PgPool, request: &JoinRequest) -> Result<Joined> {
    let (group, member) = (request.group.as_str(), request.member.as_str());
    let (partitions, ttl_ms) = requested(request)?;
    let mut tx = pool.begin().await?;
    create_group(&mut tx, group, partitions, ttl_ms).await?;
    let settings = lock_group(&mut tx, group)
        .await?
        .ok_or_else(|| no_group(group))?;
    if let Some(asked) = request.partitions.filter(|p| *p != settings.partitions) {
        return Err(Error::Usage(format!(
            "worker group {group} has {} partitions, but member {member} asks for {asked}: a group's partition count is fixed when it is created (drop the group to change it, or ask for {})",
            settings.partitions, settings.partitions
        )));
    }
    let (same_live, others_live): (bool, bool) = sqlx::query_as(
        "SELECT COALESCE(bool_or(member_id = $2), false), COALESCE(bool_or(member_id <> $2), false)
           FROM weir.member WHERE group_name = $1 AND expires_at > clock_timestamp()",
    )
    .bind(group)
    .bind(member)
    .fetch_one(&mut *tx)
    .await?;
    if same_live {
        return Err(Error::msg(format!(
            "worker group {group} has a live member {member} already: give each member its own id (a member that just died is forgotten once its lease TTL of {:?} has run out)",
            settings.lease_ttl
        )));
    }
    sqlx::query(
        "INSERT INTO weir.member (group_name, member_id, incarnation, host, joined_at, expires_at)
         SELECT $1, $2, nextval('weir.incarnation_seq'), $3, clock_timestamp(),
                clock_timestamp() + g.lease_ttl_ms * interval '1 millisecond'
           FROM weir.worker_group g WHERE g.group_name = $1
         ON CONFLICT (group_name, member_id) DO UPDATE
            SET incarnation = EXCLUDED.incarnation, host = EXCLUDED.host,
                joined_at = EXCLUDED.joined_at, expires_at = EXCLUDED.expires_at",
    )
    .bind(group)
    .bind(member)
    .bind(&request.host)
    .execute(&mut *tx)
    .await?;
    let join_pass: i64 = sqlx::query_scalar("SELECT nextval('weir.pass_seq')")
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Joined::new(
        settings.partitions,
        settings.lease_ttl,
        join_pass,
        !others_live,
    ))
}

/// Renews a membership from the database's clock; `false` when it had
/// expired (or does not exist): an expired row is never renewed.
pub(super) async fn heartbeat(pool: &PgPool, group: &str, member: &str) -> Result<bool> {
    let renewed = sqlx::query(
        "UPDATE weir.member m
            SET expires_at = clock_timestamp() + g.lease_ttl_ms * interval '1 millisecond'
           FROM weir.worker_group g
          WHERE m.group_name = $1 AND m.member_id = $2 AND m.expires_at > clock_timestamp()
            AND g.group_name = m.group_name",
    )
    .bind(group)
    .bind(member)
    .execute(pool)
    .await?
    .rows_affected();
    Ok(renewed == 1)
}

/// Clears `member`'s ownership of `partitions` (their epochs stay: the
/// next owner bumps them).
pub(super) async fn release(
    pool: &PgPool,
    group: &str,
    member: &str,
    partitions: &[PartitionId],
) -> Result<()> {
    if partitions.is_empty() {
        return Ok(());
    }
    let ids: Vec<i32> = partitions.iter().map(|p| p.as_i32()).collect();
    let mut tx = pool.begin().await?;
    if lock_group(&mut tx, group).await?.is_none() {
        return Ok(());
    }
    sqlx::query(
        "UPDATE weir.partition SET owner = NULL, owner_incarnation = NULL
          WHERE group_name = $1 AND owner = $2 AND partition = ANY($3)",
    )
    .bind(group)
    .bind(member)
    .bind(&ids)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Releases every partition of `member`, clears it as a target, and
/// deletes its membership, in one transaction.
pub(super) async fn leave(pool: &PgPool, group: &str, member: &str) -> Result<()> {
    let mut tx = pool.begin().await?;
    if lock_group(&mut tx, group).await?.is_none() {
        return Ok(());
    }
    sqlx::query(
        "UPDATE weir.partition
            SET owner = CASE WHEN owner = $2 THEN NULL ELSE owner END,
                owner_incarnation = CASE WHEN owner = $2 THEN NULL ELSE owner_incarnation END,
                target = CASE WHEN target = $2 THEN NULL ELSE target END
          WHERE group_name = $1 AND (owner = $2 OR target = $2)",
    )
    .bind(group)
    .bind(member)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM weir.member WHERE group_name = $1 AND member_id = $2")
        .bind(group)
        .bind(member)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// The group as the tables hold it: settings, live members (sorted by
/// id, bytewise) and every partition's state (the root first).
pub(super) async fn status(pool: &PgPool, group: &str) -> Result<GroupStatus> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let settings: Option<(i32, i64)> = sqlx::query_as(
        "SELECT partitions, lease_ttl_ms FROM weir.worker_group WHERE group_name = $1",
    )
    .bind(group)
    .fetch_optional(&mut *tx)
    .await?;
    let settings = Settings::from_row(settings.ok_or_else(|| no_group(group))?);
    let members: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT member_id, host,
                ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint
           FROM weir.member
          WHERE group_name = $1 AND expires_at > clock_timestamp()
          ORDER BY member_id COLLATE \"C\"",
    )
    .bind(group)
    .fetch_all(&mut *tx)
    .await?;
    let states = partition_states(&mut tx, group).await?;
    tx.commit().await?;
    let members = members
        .into_iter()
        .map(|(id, host, ms)| {
            MemberState::new(
                id,
                host,
                Duration::from_millis(u64::try_from(ms).unwrap_or(0)),
            )
        })
        .collect();
    Ok(GroupStatus::new(
        group,
        settings.partitions,
        settings.lease_ttl,
        members,
        states,
    ))
}
