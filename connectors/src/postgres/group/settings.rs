//! A group's settings row: reading it, locked or not, and the error of a
//! group that does not exist.

use std::time::Duration;

use sqlx::{PgConnection, PgPool};
use weir_actors::{Error, Result};

/// A group's settings as stored: partition count, lease TTL in ms.
pub(super) struct Settings {
    pub partitions: u32,
    pub lease_ttl: Duration,
}

impl Settings {
    pub(super) fn from_row((partitions, ttl_ms): (i32, i64)) -> Self {
        Self {
            partitions: u32::try_from(partitions).unwrap_or(0),
            lease_ttl: Duration::from_millis(u64::try_from(ttl_ms).unwrap_or(0)),
        }
    }
}

/// The error of a group that does not exist.
pub(super) fn no_group(group: &str) -> Error {
    Error::permanent(format!(
        "worker group {group} does not exist (no member joined it, or it was dropped)"
    ))
}

/// Locks the group's row (`FOR NO KEY UPDATE`: assignments, joins,
/// releases and leaves of a group take turns) and reads its settings.
pub(super) async fn lock_group(conn: &mut PgConnection, group: &str) -> Result<Option<Settings>> {
    let row: Option<(i32, i64)> = sqlx::query_as(
        "SELECT partitions, lease_ttl_ms FROM weir.worker_group
          WHERE group_name = $1 FOR NO KEY UPDATE",
    )
    .bind(group)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(Settings::from_row))
}

/// The group's settings, unlocked.
pub(super) async fn settings(pool: &PgPool, group: &str) -> Result<Option<Settings>> {
    let row: Option<(i32, i64)> = sqlx::query_as(
        "SELECT partitions, lease_ttl_ms FROM weir.worker_group WHERE group_name = $1",
    )
    .bind(group)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(Settings::from_row))
}
