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

/// The writer timeouts, each set (`SET LOCAL`) to the text `ms` of the
/// query it is selected from.
macro_rules! set_timeouts_to_ms {
    () => {
        "set_config('lock_timeout', ms, true),
         set_config('statement_timeout', ms, true),
         set_config('idle_in_transaction_session_timeout', ms, true)"
    };
}

/// Locks the group's row (`FOR NO KEY UPDATE`: assignments, joins,
/// releases and leaves of a group take turns) and reads its settings.
///
/// The transaction first gets the writer timeouts (see
/// [`set_writer_timeouts`]) for the group's lease TTL, in the query that
/// reads it without the lock: a member paused while it holds the lock
/// (stopped, or cut off from the database) has its connection ended by the
/// server within half the TTL, and a member waiting for the lock gives up
/// after as long, with an error, rather than waiting for as long as the
/// other stays paused.
pub(super) async fn lock_group(conn: &mut PgConnection, group: &str) -> Result<Option<Settings>> {
    let exists = sqlx::query(concat!(
        "SELECT ",
        set_timeouts_to_ms!(),
        " FROM (SELECT GREATEST(lease_ttl_ms / 2, 1)::text AS ms
                  FROM weir.worker_group WHERE group_name = $1) AS ttl"
    ))
    .bind(group)
    .fetch_optional(&mut *conn)
    .await?;
    if exists.is_none() {
        return Ok(None);
    }
    let row: Option<(i32, i64)> = sqlx::query_as(
        "SELECT partitions, lease_ttl_ms FROM weir.worker_group
          WHERE group_name = $1 FOR NO KEY UPDATE",
    )
    .bind(group)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(Settings::from_row))
}

/// Sets the writer timeouts of the transaction (`SET LOCAL`) to half the
/// lease TTL (`lock_timeout`, `statement_timeout`,
/// `idle_in_transaction_session_timeout`), so that a member paused inside
/// it holds the rows it locked for a bounded time only.
pub(super) async fn set_writer_timeouts(conn: &mut PgConnection, ttl: Duration) -> Result<()> {
    let ms = (ttl / 2).as_millis().max(1).to_string();
    sqlx::query(concat!(
        "SELECT ",
        set_timeouts_to_ms!(),
        " FROM (SELECT $1::text AS ms) AS ttl"
    ))
    .bind(ms)
    .execute(&mut *conn)
    .await?;
    Ok(())
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
