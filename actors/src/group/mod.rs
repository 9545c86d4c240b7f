//! Worker groups: one job scaled out over processes and machines, which
//! split its partitions between them and hand them over safely,
//! coordinated through the PostgreSQL database the job writes to.
//!
//! A group is what Kafka Connect calls a worker group and Kafka Streams an
//! application: members join and leave; each partition of the work is
//! owned by one member at a time, under a lease; a member that takes a
//! partition over restores the partition's state from a changelog, and a
//! member that lost one (it paused, or lost its connection) can no longer
//! write for it, because every write carries the epoch of its lease and
//! the database refuses an old one. This module holds the engine's side:
//! the partition function, the member's state machine, the scope of its
//! runs, fencing tokens for sinks, and the mirror of its ledger. The
//! PostgreSQL side (the tables, the transactions) is a [`Coordinator`],
//! implemented by `weir-connectors`.
//!
//! # Partitions
//!
//! A group has a fixed number of partitions `P` (64 by default), stored
//! with the group; a member asking for another `P` is refused. Each
//! component mounted directly under the root belongs to partition
//! `stable_hash(key) mod P` (the hash of its encoded key, the one the
//! ledger and the shards use), and everything below it to the same one.
//! A member runs only the components of the partitions it holds: its runs
//! are scoped (see [`RunScope`](crate::RunScope)), so `mount_each` skips
//! the others, `mount` of one returns an error for which
//! [`Error::is_not_held`](crate::Error::is_not_held) is true, and none of
//! them is deleted. Guarantees 4 (a state moving between components) and
//! 11 (a duplicate declaration) hold within a partition: two partitions
//! may be run by two members at once, each knowing only its own.
//!
//! What the root component declares itself (tables, the containers of
//! `mount_target`) belongs to the *root partition*, which has a lease, an
//! epoch and a changelog like the others. Only its holder applies root
//! actions; every other member replays the root partition's changelog
//! before each run and compares: when its own declaration of a root state
//! needs no action against the holder's records, it goes on (its rows are
//! written against the schema the holder applied); when it would need
//! one (a rolling update: another version of the code declares another
//! schema), it runs nothing that run and reports that it waits for the
//! root. So **the root holder's declaration wins**; members with another
//! one wait, without failing or crash-looping, until the holder's
//! declaration matches theirs (they were all updated) or one of them holds
//! the root. No member writes rows against a schema it does not know.
//!
//! # Membership and leases
//!
//! Members heartbeat: each renews its own member row (`expires_at`, from
//! the database's clock) every third of the lease TTL (10 s by default,
//! stored with the group), on a connection of its own. A partition's
//! lease is its owner's membership: it holds while the owner's member row
//! has not expired. The epoch of each partition lives in another row (the
//! fence row), which only writers lock and only a takeover updates, so a
//! renewal never waits behind the member's own writers. A renewal of an
//! expired row is refused: the member then drops every partition and
//! joins again, as a new member.
//!
//! Assignment is computed by any member, under a lock on the group's row,
//! into a target owner per partition, as Kafka's newer consumer protocol
//! does (a declared target, which members converge on): the live members,
//! sorted, get `⌈P/n⌉` or `⌊P/n⌋` partitions each; a partition stays with
//! its owner while the owner is live and within its quota (sticky), so a
//! join or a leave moves only what must move. A group whose first members
//! start together waits a short join delay before the first assignment,
//! extended while more members join, as Kafka's
//! `group.initial.rebalance.delay.ms`. Rebalancing is cooperative: a
//! member gives a partition up only between runs, once what it started is
//! committed, then clears its ownership; the target owner acquires a
//! partition that is free, or whose owner's membership expired. A member
//! that exits cleanly (SIGTERM, Ctrl-C, the end of a one-shot sync)
//! releases its partitions and its membership at once; one that dies
//! loses them when its membership expires.
//!
//! # Fencing
//!
//! A lease alone does not make a paused process safe: it can wake up
//! after its lease expired and write. So every write a member makes for a
//! partition carries the partition's epoch, and the database checks it in
//! the same transaction:
//!
//! ```sql
//! SELECT 1 FROM weir.fence f
//!  WHERE f.group_name = $1 AND f.partition = $2 AND f.epoch = $3
//!    AND NOT EXISTS (SELECT 1 FROM weir.fence_intent i
//!                     WHERE i.group_name = $1 AND i.partition = $2
//!                       AND i.pending_epoch > $3)
//!  FOR SHARE OF f
//! ```
//!
//! No row means fenced: the transaction rolls back and the member drops
//! the partition. `FOR SHARE` (not `FOR KEY SHARE`) conflicts with the
//! takeover's update of the epoch, so a takeover waits for the writers in
//! flight and every writer that starts after it sees the new epoch: the
//! old owner's commits all come before the new owner's first write. A
//! takeover first announces the epoch it is about to take (the intent row,
//! which writers read but never lock, so that a stream of share lockers
//! cannot starve the update), then bumps the epoch. The coordinator's own
//! fenced transactions set `idle_in_transaction_session_timeout`,
//! `statement_timeout` and `lock_timeout` below the TTL; whatever still
//! holds the fence row when the taker has waited that long (a writer of a
//! paused member, say) has its backend terminated (`pg_blocking_pids`),
//! so that a paused member holds the fence row for a bounded time only.
//!
//! The engine gives each sink call a [`Fence`]: the group, and the
//! partitions and epochs of the components whose actions the call
//! carries. A sink that writes to PostgreSQL checks all of them in its
//! transaction (the PostgreSQL connector does); a fenced call fails with
//! [`Error::Fenced`](crate::Error::Fenced), its components of fenced
//! partitions are dropped without retry, and the others are retried as
//! usual. In a group, a sink that cannot be fenced (a SQLite file, a
//! local directory) is refused.
//!
//! # The ledger follows its partition
//!
//! sled stays each member's local store. The durable copy of each
//! partition's tracking lives in PostgreSQL, as a changelog of records:
//! the intents of a sink call, appended (fenced) before the call, and,
//! after each commit, the whole record of each component it changed (its
//! states, children, memo key, failure), or its removal. A member that
//! acquires a partition drops whatever its local copy held for it and
//! restores it from the changelog: the latest record of each component
//! (from the compacted snapshot and the log after it) and the intents no
//! record collapsed yet, folded in as possible records, as after a crash.
//! So the new owner has the partition's complete tracking on another
//! machine, with no shared disk: nothing it inherits is orphaned, and
//! nothing unchanged is written again.
//!
//! Compaction keeps the changelog bounded: after a run, once its owner has
//! appended to a partition's changelog at least as many rows as it held
//! when last compacted or restored, and at least a thousand
//! ([`WorkerGroup::compact_after_rows`]), it asks the coordinator to fold
//! the log into the snapshot (the latest record per component; removed
//! components and collapsed intents go), in one fenced transaction. A
//! partition's changelog therefore holds at most about twice one row per
//! component, plus a thousand, plus the intents of calls in flight.
//!
//! # Passes
//!
//! A one-shot sync in a group works in passes numbered by a PostgreSQL
//! sequence, not by clocks: a member joins with the sequence's next value,
//! each run of a partition takes a new value when it starts and records
//! it as the partition's completed pass when it has committed. A one-shot
//! member exits once every partition's completed pass began after it
//! joined, whoever ran it: N members started together all exit after one
//! complete sync, even when some of them die.
//!
//! # Without a group
//!
//! None of this runs: the engine behaves as it always did.

mod config;
mod coordinator;
mod fence;
pub(crate) mod member;
pub(crate) mod mirror;
mod partition;
pub(crate) mod restore;
pub(crate) mod run;

pub use config::{WorkerGroup, DEFAULT_COMPACT_AFTER_ROWS, DEFAULT_JOIN_DELAY};
pub use coordinator::{
    Coordinator, Epoch, GroupStatus, JoinRequest, Joined, LogEntry, MemberState, PartitionState,
    Pass, Restored,
};
pub use fence::Fence;
pub use partition::{partition_of, PartitionId};

/// The default partition count of a new group.
pub const DEFAULT_PARTITIONS: u32 = 64;
/// The default lease TTL of a new group.
pub const DEFAULT_LEASE_TTL: std::time::Duration = std::time::Duration::from_secs(10);

/// `3, 7, root`: partitions for messages.
pub(crate) fn list(partitions: &[PartitionId]) -> String {
    partitions
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
