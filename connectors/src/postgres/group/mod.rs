//! Worker groups coordinated through PostgreSQL: [`PostgresCoordinator`],
//! the [`Coordinator`] of `weir_actors::group` (read its module docs
//! first: this is their PostgreSQL side), and [`check_fence`], the fence
//! check of a writer's transaction.
//!
//! # Layout
//!
//! - `schema`: the tables, created on first use.
//! - `member`: joining, heartbeats, releasing, leaving, status.
//! - `assign`: the balanced, sticky target assignment.
//! - `lease`: the fence check and the takeover of a partition.
//! - `changelog`: appends, restore and compaction of a partition's log.
//! - `pass`: pass numbers.
//!
mod assign;
mod changelog;
mod lease;
mod member;
mod pass;
mod schema;
mod settings;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::OnceCell;
use weir_actors::group::{
    Coordinator, Epoch, GroupStatus, JoinRequest, Joined, LogEntry, PartitionState, Pass, Restored,
    DEFAULT_LEASE_TTL,
};
use weir_actors::{PartitionId, Result};

pub use lease::check_fence;

/// The fewest log rows of a partition that a compaction folds into its
/// snapshot, by default (the bound of the design).
pub const DEFAULT_COMPACT_MIN_ROWS: u64 = 1000;

/// The futures of [`Coordinator`]'s methods.
type Fut<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// The [`Coordinator`] of worker groups on a PostgreSQL database: the
/// group's tables in schema `weir`, every method one short transaction
/// (an acquire, two). The design is that of the module docs of
/// `weir_actors::group`; what follows is how it is laid out in tables,
/// and the choices the design leaves open.
///
/// # Tables
///
/// Everything lives in the schema `weir`, created (with its tables and
/// sequences, idempotently, under an advisory lock) the first time a
/// coordinator is used: `worker_group` (partition count, lease TTL),
/// `member` (`expires_at`, from the database's clock, and an incarnation
/// taken at each join), `partition` (owner and its incarnation, target),
/// `fence` (the epoch), `fence_intent` (the epoch a takeover is about to
/// take), `partition_pass`, `changelog` and `snapshot`. A partition is an
/// `integer` column: the root partition is `-1`, data partitions `0` to
/// `P - 1` ([`PartitionId::as_i32`](weir_actors::PartitionId::as_i32)).
///
/// # Choices made here
///
/// - **Epochs** come from one sequence (`weir.epoch_seq`), so they grow
///   at each takeover and are never reused, even by a group dropped and
///   created again under the same name: a member of the old group cannot
///   pass the fence of the new one. A new group's epochs are 0.
/// - **A takeover** is two transactions. The first locks the partition's
///   row, checks that the taker is a live member, its target, and that the
///   partition is free, or its owner's membership (of the incarnation that
///   took it) expired, or it is the taker's own (an earlier acquire that
///   failed half-way); it then records the taker as owner and announces
///   the next epoch in `fence_intent`, and commits, so every writer that
///   checks from then on is refused. The second updates the fence row,
///   which waits for the writers that locked it `FOR SHARE` before the
///   announcement. Each time it has waited
///   [`takeover_wait`](Self::takeover_wait) (by default
///   the group's lease TTL), it terminates the backends blocking it
///   (`pg_terminate_backend` of `pg_blocking_pids`): those are exactly the
///   writers of the old epoch still holding the row, found without relying
///   on an `application_name` the coordinator cannot know for a user's
///   pool. A role that may not signal them leaves the takeover waiting.
///   The pool therefore needs at least two connections.
/// - **Writer timeouts**: the coordinator's own fenced transactions
///   (passes, appends, compaction), and those that take the group's row
///   lock (assignments, joins, releases, leaves), set `lock_timeout`,
///   `statement_timeout` and `idle_in_transaction_session_timeout` to half
///   the lease TTL (`SET LOCAL`): a member paused inside one has its
///   connection ended by the server within half the TTL, and the others
///   give up waiting for it as soon, so that none waits on a paused member
///   for longer than that. [`check_fence`] leaves the caller's connection
///   settings alone.
/// - **Assignment** (see `assign`): the quotas are over the data
///   partitions; the root partition goes with them to one member.
/// - **Compaction** runs when the log holds more rows than the snapshot
///   and at least [`DEFAULT_COMPACT_MIN_ROWS`] (see
///   [`compact_min_rows`](Self::compact_min_rows)); pending
///   intents stay in the log.
///
/// # Example
///
/// ```no_run
/// use std::sync::Arc;
/// use weir_actors::group::WorkerGroup;
/// use weir_actors::{App, Result};
/// use weir_connectors::postgres::PostgresCoordinator;
///
/// # async fn example(pool: sqlx::PgPool) -> Result<()> {
/// let coordinator = Arc::new(PostgresCoordinator::new(pool));
/// let group = WorkerGroup::new("docs-sync", coordinator).partitions(64);
/// # let _ = group;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct PostgresCoordinator {
    pool: PgPool,
    migrated: OnceCell<()>,
    compact_min_rows: u64,
    takeover_wait: Option<Duration>,
    /// The lease TTL of each group seen, for writer timeouts.
    ttls: Mutex<HashMap<String, Duration>>,
}

impl PostgresCoordinator {
    /// A coordinator on `pool` (at least two connections: a takeover uses
    /// a second one to end the writers it waits for). Its tables are
    /// created the first time it is used.
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            migrated: OnceCell::new(),
            compact_min_rows: DEFAULT_COMPACT_MIN_ROWS,
            takeover_wait: None,
            ttls: Mutex::new(HashMap::new()),
        }
    }

    /// The fewest log rows a compaction folds (default
    /// [`DEFAULT_COMPACT_MIN_ROWS`]); the log must also hold more rows
    /// than the snapshot.
    #[must_use]
    pub fn compact_min_rows(mut self, rows: u64) -> Self {
        self.compact_min_rows = rows;
        self
    }

    /// How long a takeover waits for the old owner's writers that hold the
    /// partition's fence row before it terminates their backends, and
    /// again between later attempts (default: the group's lease TTL).
    #[must_use]
    pub fn takeover_wait(mut self, wait: Duration) -> Self {
        self.takeover_wait = Some(wait);
        self
    }

    /// The pool, once the tables exist.
    async fn ready(&self) -> Result<&PgPool> {
        self.migrated
            .get_or_try_init(|| schema::migrate(&self.pool))
            .await?;
        Ok(&self.pool)
    }

    fn remember_ttl(&self, group: &str, ttl: Duration) {
        self.ttls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(group.to_string(), ttl);
    }

    /// The group's lease TTL (`None` for a group that does not exist).
    async fn lease_ttl(&self, group: &str) -> Result<Option<Duration>> {
        let known = self
            .ttls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(group)
            .copied();
        if known.is_some() {
            return Ok(known);
        }
        let settings = settings::settings(self.ready().await?, group).await?;
        let ttl = settings.map(|s| s.lease_ttl);
        if let Some(ttl) = ttl {
            self.remember_ttl(group, ttl);
        }
        Ok(ttl)
    }

    async fn drop_group_now(&self, group: &str) -> Result<()> {
        let pool = self.ready().await?;
        let mut tx = pool.begin().await?;
        for statement in [
            "DELETE FROM weir.changelog WHERE group_name = $1",
            "DELETE FROM weir.snapshot WHERE group_name = $1",
            "DELETE FROM weir.partition_pass WHERE group_name = $1",
            "DELETE FROM weir.fence_intent WHERE group_name = $1",
            "DELETE FROM weir.fence WHERE group_name = $1",
            "DELETE FROM weir.partition WHERE group_name = $1",
            "DELETE FROM weir.member WHERE group_name = $1",
            "DELETE FROM weir.worker_group WHERE group_name = $1",
        ] {
            sqlx::query(statement).bind(group).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        self.ttls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(group);
        Ok(())
    }
}

impl Coordinator for PostgresCoordinator {
    fn join(&self, request: &JoinRequest) -> Fut<'_, Joined> {
        let request = request.clone();
        Box::pin(async move {
            let joined = member::join(self.ready().await?, &request).await?;
            self.remember_ttl(&request.group, joined.lease_ttl);
            Ok(joined)
        })
    }

    fn heartbeat<'a>(&'a self, group: &'a str, member: &'a str) -> Fut<'a, bool> {
        Box::pin(async move { member::heartbeat(self.ready().await?, group, member).await })
    }

    /// The result does not depend on which member asks.
    fn assign<'a>(&'a self, group: &'a str, _member: &'a str) -> Fut<'a, Vec<PartitionState>> {
        Box::pin(async move {
            let mut tx = self.ready().await?.begin().await?;
            let states = assign::assign(&mut tx, group).await?;
            tx.commit().await?;
            Ok(states)
        })
    }

    fn acquire<'a>(
        &'a self,
        group: &'a str,
        member: &'a str,
        partition: PartitionId,
    ) -> Fut<'a, Option<Epoch>> {
        Box::pin(async move {
            let pool = self.ready().await?;
            let wait = match self.takeover_wait {
                Some(wait) => wait,
                None => self.lease_ttl(group).await?.unwrap_or(DEFAULT_LEASE_TTL),
            };
            lease::acquire(pool, group, member, partition, wait).await
        })
    }

    fn release<'a>(
        &'a self,
        group: &'a str,
        member: &'a str,
        partitions: &'a [PartitionId],
    ) -> Fut<'a, ()> {
        Box::pin(
            async move { member::release(self.ready().await?, group, member, partitions).await },
        )
    }

    fn leave<'a>(&'a self, group: &'a str, member: &'a str) -> Fut<'a, ()> {
        Box::pin(async move { member::leave(self.ready().await?, group, member).await })
    }

    fn begin_pass<'a>(
        &'a self,
        group: &'a str,
        partitions: &'a [(PartitionId, Epoch)],
    ) -> Fut<'a, Pass> {
        Box::pin(async move {
            let pool = self.ready().await?;
            let ttl = self.lease_ttl(group).await?;
            pass::begin_pass(pool, group, ttl, partitions).await
        })
    }

    fn complete_pass<'a>(
        &'a self,
        group: &'a str,
        partitions: &'a [(PartitionId, Epoch)],
        pass: Pass,
    ) -> Fut<'a, ()> {
        Box::pin(async move {
            let pool = self.ready().await?;
            let ttl = self.lease_ttl(group).await?;
            pass::complete_pass(pool, group, ttl, partitions, pass).await
        })
    }

    fn all_completed_after<'a>(&'a self, group: &'a str, pass: Pass) -> Fut<'a, bool> {
        Box::pin(async move { pass::all_completed_after(self.ready().await?, group, pass).await })
    }

    fn append<'a>(
        &'a self,
        group: &'a str,
        partition: PartitionId,
        epoch: Epoch,
        entries: Vec<LogEntry>,
    ) -> Fut<'a, ()> {
        Box::pin(async move {
            let pool = self.ready().await?;
            let ttl = self.lease_ttl(group).await?;
            changelog::append(pool, group, ttl, (partition, epoch), entries).await
        })
    }

    fn restore<'a>(&'a self, group: &'a str, partition: PartitionId) -> Fut<'a, Restored> {
        Box::pin(async move { changelog::restore(self.ready().await?, group, partition).await })
    }

    fn compact<'a>(&'a self, group: &'a str, partition: PartitionId, epoch: Epoch) -> Fut<'a, u64> {
        Box::pin(async move {
            let pool = self.ready().await?;
            let ttl = self.lease_ttl(group).await?;
            let min_rows = self.compact_min_rows;
            changelog::compact(pool, group, ttl, (partition, epoch), min_rows).await
        })
    }

    fn status<'a>(&'a self, group: &'a str) -> Fut<'a, GroupStatus> {
        Box::pin(async move { member::status(self.ready().await?, group).await })
    }

    fn drop_group<'a>(&'a self, group: &'a str) -> Fut<'a, ()> {
        Box::pin(self.drop_group_now(group))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coordinator_is_send_and_sync() {
        fn check<T: Send + Sync + 'static>() {}
        check::<PostgresCoordinator>();
    }
}
