//! Leases and fencing: the fence check of a writer's transaction, and the
//! takeover of a partition (announce the epoch, wait for the writers in
//! flight, bump it).

use std::future::Future;
use std::time::Duration;

use sqlx::{Connection, PgConnection, PgPool, Postgres, Transaction};
use weir_actors::group::Epoch;
use weir_actors::{Error, Fence, PartitionId, Result};

use super::settings::set_writer_timeouts;

/// The design's fence query, for every `(partition, epoch)` at once: the
/// pairs whose epoch is current and that no takeover announced a newer
/// epoch for. Their fence rows are locked `FOR SHARE` until the end of the
/// transaction, so a takeover's bump waits for it.
const FENCE_QUERY: &str = "SELECT w.partition, w.epoch
    FROM unnest($2::integer[], $3::bigint[]) AS w(partition, epoch)
    JOIN weir.fence f
      ON f.group_name = $1 AND f.partition = w.partition AND f.epoch = w.epoch
   WHERE NOT EXISTS (SELECT 1 FROM weir.fence_intent i
                      WHERE i.group_name = $1 AND i.partition = w.partition
                        AND i.pending_epoch > w.epoch)
     FOR SHARE OF f";

/// Checks, in the caller's transaction, that every partition of `fence`
/// is still held under its epoch, and locks their fence rows (`FOR
/// SHARE`) until the transaction ends: a member taking one of them over
/// waits for the transaction, and every transaction checking after the
/// takeover announced itself is refused. Call it in the transaction that
/// writes, before its commit.
///
/// The transaction should be short: a takeover waits for it as long as
/// the group's lease TTL (or the taker's
/// [`takeover_wait`](super::PostgresCoordinator::takeover_wait)), then
/// terminates its backend. Setting `lock_timeout`, `statement_timeout`
/// and `idle_in_transaction_session_timeout` below the TTL on the writer's
/// connection keeps a paused writer from holding a fence row that long.
///
/// ```no_run
/// use weir_actors::{Fence, Result};
/// use weir_connectors::postgres::check_fence;
///
/// async fn write(pool: &sqlx::PgPool) -> Result<()> {
///     let mut tx = pool.begin().await?;
///     if let Some(fence) = Fence::current() {
///         check_fence(&mut tx, &fence).await?;
///     }
///     sqlx::query("INSERT INTO docs (id) VALUES ($1)")
///         .bind("a")
///         .execute(&mut *tx)
///         .await?;
///     tx.commit().await?;
///     Ok(())
/// }
/// ```
///
/// # Errors
/// [`Fence::fenced`] naming the partitions another member took over (a
/// newer epoch exists, or is announced); a database error when the query
/// fails (a missing `weir` schema: the database is not the group's).
pub async fn check_fence(conn: &mut PgConnection, fence: &Fence) -> Result<()> {
    let stale = stale_partitions(conn, fence.group(), fence.partitions()).await?;
    if stale.is_empty() {
        Ok(())
    } else {
        Err(fence.fenced(&stale))
    }
}

/// The partitions of `partitions` whose epoch is no longer current, sorted;
/// the fence rows of the others are locked `FOR SHARE`.
pub(super) async fn stale_partitions(
    conn: &mut PgConnection,
    group: &str,
    partitions: &[(PartitionId, Epoch)],
) -> Result<Vec<PartitionId>> {
    if partitions.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<i32> = partitions.iter().map(|(p, _)| p.as_i32()).collect();
    let epochs: Vec<i64> = partitions.iter().map(|(_, e)| *e).collect();
    let current: Vec<(i32, i64)> = sqlx::query_as(FENCE_QUERY)
        .bind(group)
        .bind(&ids)
        .bind(&epochs)
        .fetch_all(&mut *conn)
        .await?;
    let mut stale: Vec<PartitionId> = partitions
        .iter()
        .filter(|(p, e)| !current.contains(&(p.as_i32(), *e)))
        .map(|(p, _)| *p)
        .collect();
    stale.sort_unstable();
    stale.dedup();
    Ok(stale)
}

/// Begins a transaction of the coordinator's that writes for
/// `partitions`: with the writer timeouts (when the TTL is known) and the
/// fence checked.
///
/// # Errors
/// `Error::Fenced` naming the stale partitions; database errors.
pub(super) async fn begin_fenced(
    pool: &PgPool,
    group: &str,
    ttl: Option<Duration>,
    partitions: &[(PartitionId, Epoch)],
) -> Result<Transaction<'static, Postgres>> {
    let mut tx = pool.begin().await?;
    if let Some(ttl) = ttl {
        set_writer_timeouts(&mut tx, ttl).await?;
    }
    let stale = stale_partitions(&mut tx, group, partitions).await?;
    if !stale.is_empty() {
        return Err(Error::Fenced {
            group: group.to_string(),
            partitions: stale,
        });
    }
    Ok(tx)
}

/// A partition's row as a takeover reads it (locked), with its fence.
struct Claim {
    target: Option<String>,
    owner: Option<String>,
    owner_incarnation: Option<i64>,
    owner_live: bool,
    /// The taker's incarnation, if its membership is live.
    me: Option<i64>,
}

/// The columns of a [`Claim`], in order.
type ClaimRow = (
    Option<String>,
    Option<String>,
    Option<i64>,
    bool,
    Option<i64>,
);

impl Claim {
    fn from_row((target, owner, owner_incarnation, owner_live, me): ClaimRow) -> Self {
        Self {
            target,
            owner,
            owner_incarnation,
            owner_live,
            me,
        }
    }

    /// Whether `member` (of incarnation `me`) may take the partition: it
    /// is its target, and it is free, or its owner's membership expired,
    /// or `member` owns it already (an acquire that failed half-way).
    fn takeable(&self, member: &str) -> bool {
        let Some(me) = self.me else {
            return false;
        };
        let own = self.owner.as_deref() == Some(member) && self.owner_incarnation == Some(me);
        self.target.as_deref() == Some(member) && (!self.owner_live || own)
    }
}

/// Takes `partition` for `member` (see [`Coordinator::acquire`]): claims
/// it and announces the next epoch (committed, so that writers read it),
/// then bumps the epoch, waiting for the writers that locked the fence
/// row before the announcement and terminating their backends once it
/// waited `wait`.
///
/// [`Coordinator::acquire`]: weir_actors::group::Coordinator::acquire
pub(super) async fn acquire(
    pool: &PgPool,
    group: &str,
    member: &str,
    partition: PartitionId,
    wait: Duration,
) -> Result<Option<Epoch>> {
    match announce(pool, group, member, partition).await? {
        Some(pending) => bump(pool, group, partition, pending, wait).await,
        None => Ok(None),
    }
}

/// Claims the partition (its owner becomes `member`) and announces the
/// epoch it is about to take, in one transaction; `None` when it is not
/// `member`'s to take.
async fn announce(
    pool: &PgPool,
    group: &str,
    member: &str,
    partition: PartitionId,
) -> Result<Option<Epoch>> {
    let mut tx = pool.begin().await?;
    let claim: Option<ClaimRow> = sqlx::query_as(
        "SELECT p.target, p.owner, p.owner_incarnation, o.member_id IS NOT NULL AS owner_live,
                me.incarnation AS me
           FROM weir.partition p
           LEFT JOIN weir.member o
             ON o.group_name = p.group_name AND o.member_id = p.owner
            AND o.incarnation = p.owner_incarnation AND o.expires_at > clock_timestamp()
           LEFT JOIN weir.member me
             ON me.group_name = p.group_name AND me.member_id = $3
            AND me.expires_at > clock_timestamp()
          WHERE p.group_name = $1 AND p.partition = $2
            FOR UPDATE OF p",
    )
    .bind(group)
    .bind(partition.as_i32())
    .bind(member)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(claim) = claim.map(Claim::from_row) else {
        return Err(Error::permanent(format!(
            "worker group {group} has no partition {partition} (does the group exist?)"
        )));
    };
    if !claim.takeable(member) {
        return Ok(None);
    }
    // From the sequence: past every epoch and announcement before it.
    let pending: i64 = sqlx::query_scalar(
        "INSERT INTO weir.fence_intent (group_name, partition, pending_epoch)
         VALUES ($1, $2, nextval('weir.epoch_seq'))
         ON CONFLICT (group_name, partition) DO UPDATE SET pending_epoch = EXCLUDED.pending_epoch
         RETURNING pending_epoch",
    )
    .bind(group)
    .bind(partition.as_i32())
    .fetch_one(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE weir.partition SET owner = $3, owner_incarnation = $4
          WHERE group_name = $1 AND partition = $2",
    )
    .bind(group)
    .bind(partition.as_i32())
    .bind(member)
    .bind(claim.me)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Some(pending))
}

/// Sets the partition's epoch to `pending`, once the writers holding its
/// fence row committed or were terminated. `None` when the epoch is past
/// `pending` already (another member took it over meanwhile).
async fn bump(
    pool: &PgPool,
    group: &str,
    partition: PartitionId,
    pending: Epoch,
    wait: Duration,
) -> Result<Option<Epoch>> {
    let mut conn = pool.acquire().await?;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *conn)
        .await?;
    let mut tx = conn.begin().await?;
    let bumped = {
        let update = sqlx::query_scalar::<_, i64>(
            "UPDATE weir.fence SET epoch = $3
              WHERE group_name = $1 AND partition = $2 AND epoch < $3
             RETURNING epoch",
        )
        .bind(group)
        .bind(partition.as_i32())
        .bind(pending)
        .fetch_optional(&mut *tx);
        wait_terminating_blockers(pool, pid, wait, update).await?
    };
    tx.commit().await?;
    Ok(bumped)
}

/// Awaits `statement`, running on the backend `pid`; every `wait` it is
/// still waiting, terminates the backends blocking it (`pg_blocking_pids`:
/// the writers holding the fence row, which the announcement already
/// fenced).
async fn wait_terminating_blockers<T>(
    pool: &PgPool,
    pid: i32,
    wait: Duration,
    statement: impl Future<Output = std::result::Result<T, sqlx::Error>>,
) -> Result<T> {
    let wait = wait.max(Duration::from_millis(10));
    let mut statement = std::pin::pin!(statement);
    loop {
        tokio::select! {
            done = &mut statement => return Ok(done?),
            () = tokio::time::sleep(wait) => terminate_blockers(pool, pid).await,
        }
    }
}

/// Terminates the backends blocking the backend `pid`. A failure (the
/// coordinator's role may not signal them, the server cannot be reached)
/// leaves the takeover waiting for them to end by themselves: their
/// writer timeouts, or the connection's loss.
async fn terminate_blockers(pool: &PgPool, pid: i32) {
    let terminated =
        sqlx::query("SELECT pg_terminate_backend(b) FROM unnest(pg_blocking_pids($1)) AS b")
            .bind(pid)
            .execute(pool)
            .await;
    // Nothing to do with a failure but wait longer (see above).
    drop(terminated);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(target: &str, owner: Option<(&str, i64)>, owner_live: bool, me: Option<i64>) -> Claim {
        Claim {
            target: Some(target.to_string()),
            owner: owner.map(|(o, _)| o.to_string()),
            owner_incarnation: owner.map(|(_, i)| i),
            owner_live,
            me,
        }
    }

    #[test]
    fn a_partition_is_takeable_by_its_target_when_free_expired_or_already_its_own() {
        assert!(claim("a", None, false, Some(1)).takeable("a"));
        assert!(claim("a", Some(("b", 2)), false, Some(1)).takeable("a"));
        assert!(claim("a", Some(("a", 1)), true, Some(1)).takeable("a"));
    }

    #[test]
    fn a_partition_is_not_takeable_from_a_live_owner_by_another_target_or_a_dead_member() {
        assert!(!claim("a", Some(("b", 2)), true, Some(1)).takeable("a"));
        assert!(!claim("b", None, false, Some(1)).takeable("a"));
        assert!(!claim("a", None, false, None).takeable("a"));
        // An owner of the same id but of another incarnation is not its own.
        assert!(!claim("a", Some(("a", 0)), true, Some(1)).takeable("a"));
    }
}
