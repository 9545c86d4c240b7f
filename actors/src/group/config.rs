//! The configuration of a worker group, as a builder gives it to an App.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::coordinator::Coordinator;

/// The default time the first members of a group wait for others to join
/// before the first assignment (Kafka's `group.initial.rebalance.delay.ms`).
pub const DEFAULT_JOIN_DELAY: Duration = Duration::from_secs(1);

/// The fewest rows a member appends to a partition's changelog before it
/// asks its coordinator to compact it, by default.
pub const DEFAULT_COMPACT_AFTER_ROWS: u64 = 1000;

/// Makes an [`App`](crate::App) a member of a worker group (see
/// [`AppBuilder::worker_group`](crate::AppBuilder::worker_group) and the
/// [module docs](crate::group)).
///
/// ```
/// # use std::sync::Arc;
/// # use std::time::Duration;
/// # use weir_actors::group::{Coordinator, WorkerGroup};
/// fn group(coordinator: Arc<dyn Coordinator>) -> WorkerGroup {
///     WorkerGroup::new("docs-sync", coordinator)
///         .partitions(64)
///         .lease_ttl(Duration::from_secs(10))
///         .member_id("host-a:4242")
/// }
/// ```
#[derive(Clone)]
#[must_use]
pub struct WorkerGroup {
    pub(crate) name: String,
    pub(crate) coordinator: Arc<dyn Coordinator>,
    pub(crate) partitions: Option<u32>,
    pub(crate) lease_ttl: Option<Duration>,
    pub(crate) member_id: Option<String>,
    pub(crate) join_delay: Duration,
    pub(crate) compact_after_rows: u64,
}

impl WorkerGroup {
    /// Membership of the group `name`, coordinated by `coordinator` (for
    /// PostgreSQL: `weir::connectors::postgres::PostgresCoordinator`).
    pub fn new(name: impl Into<String>, coordinator: Arc<dyn Coordinator>) -> Self {
        Self {
            name: name.into(),
            coordinator,
            partitions: None,
            lease_ttl: None,
            member_id: None,
            join_delay: DEFAULT_JOIN_DELAY,
            compact_after_rows: DEFAULT_COMPACT_AFTER_ROWS,
        }
    }

    /// The partition count: a new group is created with it; an existing
    /// group must have it (an error otherwise). Default: the group's own,
    /// or 64 for a new group.
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.partitions = Some(partitions);
        self
    }

    /// The lease TTL a new group is created with (an existing group keeps
    /// its own). Default: 10 s. The membership is renewed every third of
    /// it by a task on the App's runtime: code that blocks the runtime's
    /// threads for longer than the TTL makes the member lose its
    /// partitions (its writes are then refused).
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = Some(ttl);
        self
    }

    /// This member's id, unique among the group's live members. Default:
    /// the host name and the process id.
    pub fn member_id(mut self, id: impl Into<String>) -> Self {
        self.member_id = Some(id.into());
        self
    }

    /// The fewest rows this member appends to a partition's changelog
    /// before it asks the coordinator to compact it (default
    /// [`DEFAULT_COMPACT_AFTER_ROWS`]); it waits at least as many as the
    /// changelog held after its last compaction, so that the log has
    /// outgrown the snapshot. A partition's changelog so holds at most
    /// about twice its components' records, plus this many rows, plus the
    /// intents of calls in flight.
    pub fn compact_after_rows(mut self, rows: u64) -> Self {
        self.compact_after_rows = rows.max(1);
        self
    }

    /// How long the first members wait for others before the first
    /// assignment, each join extending it (default: 1 s).
    pub fn join_delay(mut self, delay: Duration) -> Self {
        self.join_delay = delay;
        self
    }

    /// The group's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Debug for WorkerGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerGroup")
            .field("name", &self.name)
            .field("partitions", &self.partitions)
            .field("lease_ttl", &self.lease_ttl)
            .field("member_id", &self.member_id)
            .field("join_delay", &self.join_delay)
            .finish_non_exhaustive()
    }
}

/// The default member id: the host name and the process id.
pub(crate) fn default_member_id() -> String {
    format!("{}:{}", crate::owner::host_name(), std::process::id())
}
