//! Passes: numbers from `weir.pass_seq`, recorded per partition as the
//! running pass when a run begins and as the completed one once it has
//! committed.

use std::time::Duration;

use sqlx::PgPool;
use weir_actors::group::{Epoch, Pass};
use weir_actors::{PartitionId, Result};

use super::lease::begin_fenced;

/// The partition numbers of `partitions`.
fn ids(partitions: &[(PartitionId, Epoch)]) -> Vec<i32> {
    partitions.iter().map(|(p, _)| p.as_i32()).collect()
}

/// Takes a pass number and records it as the running pass of
/// `partitions`, if their epochs are current.
pub(super) async fn begin_pass(
    pool: &PgPool,
    group: &str,
    ttl: Option<Duration>,
    partitions: &[(PartitionId, Epoch)],
) -> Result<Pass> {
    let mut tx = begin_fenced(pool, group, ttl, partitions).await?;
    let pass: i64 = sqlx::query_scalar("SELECT nextval('weir.pass_seq')")
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query(
        "UPDATE weir.partition_pass SET running_pass = $3
          WHERE group_name = $1 AND partition = ANY($2)",
    )
    .bind(group)
    .bind(ids(partitions))
    .bind(pass)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(pass)
}

/// Records `pass` as the completed pass of `partitions` (never going back
/// to an earlier one), if their epochs are current.
pub(super) async fn complete_pass(
    pool: &PgPool,
    group: &str,
    ttl: Option<Duration>,
    partitions: &[(PartitionId, Epoch)],
    pass: Pass,
) -> Result<()> {
    let mut tx = begin_fenced(pool, group, ttl, partitions).await?;
    sqlx::query(
        "UPDATE weir.partition_pass SET completed_pass = GREATEST(completed_pass, $3)
          WHERE group_name = $1 AND partition = ANY($2)",
    )
    .bind(group)
    .bind(ids(partitions))
    .bind(pass)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Whether every partition of the group, the root included, completed a
/// pass later than `pass` (`false` for a group that does not exist).
pub(super) async fn all_completed_after(pool: &PgPool, group: &str, pass: Pass) -> Result<bool> {
    let all: Option<bool> = sqlx::query_scalar(
        "SELECT count(*) > 0 AND bool_and(COALESCE(completed_pass > $2, false))
           FROM weir.partition_pass WHERE group_name = $1",
    )
    .bind(group)
    .bind(pass)
    .fetch_one(pool)
    .await?;
    Ok(all.unwrap_or(false))
}
