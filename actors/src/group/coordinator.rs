//! The coordination service of a worker group, as the engine sees it:
//! membership, leases and epochs, passes, and the durable copy of each
//! partition's ledger. `weir-connectors` implements it on PostgreSQL
//! (`weir::connectors::postgres::PostgresCoordinator`).
//!
//! Every method is one short transaction (or a few) of the service's; the
//! engine calls them from its member task, never from a component. The
//! methods that write for a partition take its epoch and are fenced: they
//! fail with [`Error::Fenced`](crate::Error::Fenced) once a newer epoch
//! exists, and write nothing.

use std::fmt;
use std::time::Duration;

use futures::future::BoxFuture;

use super::partition::PartitionId;
use crate::error::Result;

/// The epoch of a partition's lease: it grows at every change of owner.
pub type Epoch = i64;

/// A number from the group's pass sequence (see the module docs' Passes).
pub type Pass = i64;

/// What a member asks for when it joins.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct JoinRequest {
    /// The group's name.
    pub group: String,
    /// The member's id, unique among the group's live members.
    pub member: String,
    /// The partition count the member expects; `None` takes the group's
    /// (a new group gets [`DEFAULT_PARTITIONS`](super::DEFAULT_PARTITIONS)).
    pub partitions: Option<u32>,
    /// The lease TTL to create a new group with; `None` takes the group's
    /// (a new group gets [`DEFAULT_LEASE_TTL`](super::DEFAULT_LEASE_TTL)).
    pub lease_ttl: Option<Duration>,
    /// What identifies the member's process to people (host and pid).
    pub host: String,
}

impl JoinRequest {
    /// A request to join `group` as `member`, with the group's settings.
    pub fn new(group: impl Into<String>, member: impl Into<String>) -> Self {
        Self {
            group: group.into(),
            member: member.into(),
            partitions: None,
            lease_ttl: None,
            host: String::new(),
        }
    }
}

/// What joining gave.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Joined {
    /// The group's partition count.
    pub partitions: u32,
    /// The group's lease TTL.
    pub lease_ttl: Duration,
    /// The pass number taken when the member joined: a one-shot member is
    /// done once every partition completed a later pass.
    pub join_pass: Pass,
    /// Whether the member is the first live one (the group was empty): it
    /// waits the join delay before the first assignment.
    pub first: bool,
}

impl Joined {
    /// What joining gave: the group's partition count and lease TTL, the
    /// pass taken at the join, and whether the member is the first live
    /// one. For implementations of [`Coordinator`].
    pub fn new(partitions: u32, lease_ttl: Duration, join_pass: Pass, first: bool) -> Self {
        Self {
            partitions,
            lease_ttl,
            join_pass,
            first,
        }
    }
}

/// Where a partition is, as the assignment sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionState {
    /// The partition.
    pub partition: PartitionId,
    /// Its owner, if it has one whose membership has not expired.
    pub owner: Option<String>,
    /// The member the assignment gives it to.
    pub target: Option<String>,
    /// Its epoch.
    pub epoch: Epoch,
    /// The last pass that began on it and committed.
    pub completed_pass: Option<Pass>,
}

impl PartitionState {
    /// A partition's state: its live owner, its target owner, its epoch
    /// and its last completed pass. For implementations of
    /// [`Coordinator`].
    pub fn new(
        partition: PartitionId,
        owner: Option<String>,
        target: Option<String>,
        epoch: Epoch,
        completed_pass: Option<Pass>,
    ) -> Self {
        Self {
            partition,
            owner,
            target,
            epoch,
            completed_pass,
        }
    }
}

/// A live member of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemberState {
    /// Its id.
    pub member: String,
    /// Its host and pid.
    pub host: String,
    /// How long until its membership expires, unless renewed.
    pub expires_in: Duration,
}

impl MemberState {
    /// A live member: its id, its host and pid, and how long until its
    /// membership expires. For implementations of [`Coordinator`].
    pub fn new(member: impl Into<String>, host: impl Into<String>, expires_in: Duration) -> Self {
        Self {
            member: member.into(),
            host: host.into(),
            expires_in,
        }
    }
}

/// A group as the service holds it: for [`App::group_status`](crate::App)
/// and `weir inspect --group`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupStatus {
    /// The group's name.
    pub group: String,
    /// Its partition count.
    pub partitions: u32,
    /// Its lease TTL.
    pub lease_ttl: Duration,
    /// Its live members, sorted by id.
    pub members: Vec<MemberState>,
    /// Every partition (the root first), with owner, target and epoch.
    pub partition_states: Vec<PartitionState>,
}

impl GroupStatus {
    /// A group's status: its name, partition count and lease TTL, its live
    /// members (sorted by id) and every partition's state (the root
    /// first). For implementations of [`Coordinator`].
    pub fn new(
        group: impl Into<String>,
        partitions: u32,
        lease_ttl: Duration,
        members: Vec<MemberState>,
        partition_states: Vec<PartitionState>,
    ) -> Self {
        Self {
            group: group.into(),
            partitions,
            lease_ttl,
            members,
            partition_states,
        }
    }
}

/// What a changelog row holds: the whole record of a component after a
/// commit, its removal, or the intents of a sink call about to be made.
/// The payloads are the engine's own encoding; the service stores them.
#[derive(Clone, PartialEq, Eq)]
pub enum LogEntry {
    /// The component's whole record, as committed.
    Record {
        /// The encoded component key.
        component: Vec<u8>,
        /// The engine's encoding of the record.
        record: Vec<u8>,
    },
    /// The component's record was removed.
    Removed {
        /// The encoded component key.
        component: Vec<u8>,
    },
    /// Intents about to be acted on, for one component.
    Intents {
        /// The encoded component key.
        component: Vec<u8>,
        /// The engine's encoding of the intents.
        intents: Vec<u8>,
    },
}

impl fmt::Debug for LogEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, component, len) = match self {
            LogEntry::Record { component, record } => ("Record", component, record.len()),
            LogEntry::Removed { component } => ("Removed", component, 0),
            LogEntry::Intents { component, intents } => ("Intents", component, intents.len()),
        };
        write!(f, "{kind}({} key bytes, {len} bytes)", component.len())
    }
}

impl LogEntry {
    /// The component the entry is about.
    pub fn component(&self) -> &[u8] {
        match self {
            LogEntry::Record { component, .. }
            | LogEntry::Removed { component }
            | LogEntry::Intents { component, .. } => component,
        }
    }
}

/// A partition's ledger as the changelog holds it: the latest record of
/// each component (removed ones left out), and the intents appended after
/// the latest record of their component (the others were collapsed by
/// that record), in the order they were appended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Restored {
    /// `(component, record)` pairs, sorted by component.
    pub records: Vec<(Vec<u8>, Vec<u8>)>,
    /// `(component, intents)` pairs, in append order.
    pub intents: Vec<(Vec<u8>, Vec<u8>)>,
    /// Changelog rows read (snapshot and log), for metrics.
    pub rows: u64,
}

impl Restored {
    /// A partition's ledger as read from its changelog: the latest record
    /// of each component (sorted by component), the intents not collapsed
    /// yet (in append order), and the rows read. For implementations of
    /// [`Coordinator`].
    pub fn new(
        records: Vec<(Vec<u8>, Vec<u8>)>,
        intents: Vec<(Vec<u8>, Vec<u8>)>,
        rows: u64,
    ) -> Self {
        Self {
            records,
            intents,
            rows,
        }
    }
}

/// The coordination service of a worker group.
///
/// # Guarantees the engine relies on
///
/// - Time is the service's own clock: expiries are computed and compared
///   there, never on members' clocks.
/// - [`acquire`](Coordinator::acquire) returns a new epoch only when the
///   partition is free or its owner's membership expired, and only once
///   every write of the earlier epoch has committed or can no longer
///   commit: after it, every fenced method, and every target write
///   checked with [`Fence`](super::Fence), of an older epoch fails with
///   `Error::Fenced`.
/// - A heartbeat never renews an expired membership.
/// - [`append`](Coordinator::append) keeps the order of a partition's
///   entries: [`restore`](Coordinator::restore) gives each component's
///   latest record.
pub trait Coordinator: Send + Sync + 'static {
    /// Joins the group (creating it, with its tables, if needed).
    ///
    /// # Errors
    /// When the group exists with another partition count than
    /// `request.partitions`; when another live member has the same id;
    /// when the service cannot be reached.
    fn join(&self, request: &JoinRequest) -> BoxFuture<'_, Result<Joined>>;

    /// Renews the member's membership. `Ok(false)`: it had expired (the
    /// member must drop its partitions and join again).
    ///
    /// # Errors
    /// When the service cannot be reached.
    fn heartbeat<'a>(&'a self, group: &'a str, member: &'a str) -> BoxFuture<'a, Result<bool>>;

    /// Recomputes the group's target assignment (balanced, sticky; see the
    /// module docs) and returns every partition's state.
    ///
    /// # Errors
    /// When the service cannot be reached.
    fn assign<'a>(
        &'a self,
        group: &'a str,
        member: &'a str,
    ) -> BoxFuture<'a, Result<Vec<PartitionState>>>;

    /// Takes `partition` for `member` if it is its target and free (or its
    /// owner's membership expired): announces, then bumps the epoch, and
    /// returns it. `Ok(None)`: not this member's to take now.
    ///
    /// # Errors
    /// When the service cannot be reached.
    fn acquire<'a>(
        &'a self,
        group: &'a str,
        member: &'a str,
        partition: PartitionId,
    ) -> BoxFuture<'a, Result<Option<Epoch>>>;

    /// Gives partitions up (between runs, after their commits).
    ///
    /// # Errors
    /// When the service cannot be reached.
    fn release<'a>(
        &'a self,
        group: &'a str,
        member: &'a str,
        partitions: &'a [PartitionId],
    ) -> BoxFuture<'a, Result<()>>;

    /// Leaves the group: releases every partition and the membership.
    ///
    /// # Errors
    /// When the service cannot be reached.
    fn leave<'a>(&'a self, group: &'a str, member: &'a str) -> BoxFuture<'a, Result<()>>;

    /// Takes a pass number for a run of `partitions` and records it as
    /// their running pass (fenced).
    ///
    /// # Errors
    /// `Error::Fenced` for a partition whose epoch is not the one given;
    /// when the service cannot be reached.
    fn begin_pass<'a>(
        &'a self,
        group: &'a str,
        partitions: &'a [(PartitionId, Epoch)],
    ) -> BoxFuture<'a, Result<Pass>>;

    /// Records `pass` as completed for `partitions` (fenced).
    ///
    /// # Errors
    /// As [`begin_pass`](Coordinator::begin_pass).
    fn complete_pass<'a>(
        &'a self,
        group: &'a str,
        partitions: &'a [(PartitionId, Epoch)],
        pass: Pass,
    ) -> BoxFuture<'a, Result<()>>;

    /// Whether every partition (the root included) completed a pass later
    /// than `pass`.
    ///
    /// # Errors
    /// When the service cannot be reached.
    fn all_completed_after<'a>(&'a self, group: &'a str, pass: Pass)
        -> BoxFuture<'a, Result<bool>>;

    /// Appends entries to a partition's changelog, in order (fenced).
    ///
    /// # Errors
    /// As [`begin_pass`](Coordinator::begin_pass).
    fn append<'a>(
        &'a self,
        group: &'a str,
        partition: PartitionId,
        epoch: Epoch,
        entries: Vec<LogEntry>,
    ) -> BoxFuture<'a, Result<()>>;

    /// Reads a partition's ledger from its changelog.
    ///
    /// # Errors
    /// When the service cannot be reached.
    fn restore<'a>(
        &'a self,
        group: &'a str,
        partition: PartitionId,
    ) -> BoxFuture<'a, Result<Restored>>;

    /// Folds a partition's log into its snapshot when the log has grown
    /// past the bound of the module docs (fenced); returns the rows the
    /// changelog holds after it.
    ///
    /// # Errors
    /// As [`begin_pass`](Coordinator::begin_pass).
    fn compact<'a>(
        &'a self,
        group: &'a str,
        partition: PartitionId,
        epoch: Epoch,
    ) -> BoxFuture<'a, Result<u64>>;

    /// The group as the service holds it.
    ///
    /// # Errors
    /// When the group does not exist or the service cannot be reached.
    fn status<'a>(&'a self, group: &'a str) -> BoxFuture<'a, Result<GroupStatus>>;

    /// Removes the group: its members, leases, epochs, passes and
    /// changelog.
    ///
    /// # Errors
    /// When the service cannot be reached.
    fn drop_group<'a>(&'a self, group: &'a str) -> BoxFuture<'a, Result<()>>;
}
