//! What a member of a worker group does around its runs: join, heartbeat,
//! converge on its assignment between runs (release, acquire, restore),
//! replay the root partition, and count its passes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::config::WorkerGroup;
use super::coordinator::{Epoch, Pass};
use super::member::{component_partition, Holding, Member};
use super::partition::PartitionId;
use super::restore::{forget_partition, restore_partition};
use crate::actors::pipeline::Engine;
use crate::config::doubled;
use crate::error::{ComponentFailure, Error, ErrorKind, Result};
use crate::model::{keycode, StableKey};

/// What a member holds for one run, and the pass it runs.
#[derive(Clone, Debug)]
pub(crate) struct GroupRun {
    pub holding: Holding,
    pub pass: Pass,
}

impl GroupRun {
    /// The partitions and epochs the run covers.
    fn partitions(&self) -> Vec<(PartitionId, Epoch)> {
        self.holding.held.iter().map(|(p, e)| (*p, *e)).collect()
    }
}

/// Joins the group of an App being built. A failure that retrying may
/// fix is retried (see [`join_retry_delay`]): a peer paused inside a
/// transaction that holds the group's row makes joins time out until the
/// server ends its connection, which takes up to half the lease TTL.
pub(crate) async fn join(group: WorkerGroup) -> Result<Arc<Member>> {
    let member = Arc::new(Member::new(group));
    let started = tokio::time::Instant::now();
    let mut attempt = 0;
    loop {
        let joined = async {
            member.ensure_joined().await?;
            settle_joins(&member).await
        };
        let Err(e) = joined.await else {
            return Ok(member);
        };
        let ttl = member.group.lease_ttl.unwrap_or(super::DEFAULT_LEASE_TTL);
        let Some(delay) = join_retry_delay(&e, attempt, started.elapsed(), ttl) else {
            return Err(e);
        };
        tracing::warn!(
            group = %member.group.name(),
            member = %member.id,
            "joining the worker group failed (retrying in {} ms): {e}",
            delay.as_millis()
        );
        tokio::time::sleep(delay).await;
        attempt += 1;
    }
}

/// How many lease TTLs a member keeps retrying to join.
const JOIN_RETRY_TTLS: u32 = 3;

/// How long to wait before joining again after `e`, the failure of
/// attempt `attempt` (from 0), `elapsed` after the first began; `None`
/// gives up. Only failures that retrying may fix (timeouts, lost
/// connections, conflicts) are retried, with a delay doubling from 50 ms
/// up to a quarter of the lease TTL, for [`JOIN_RETRY_TTLS`] lease TTLs.
fn join_retry_delay(e: &Error, attempt: u32, elapsed: Duration, ttl: Duration) -> Option<Duration> {
    let stopping = matches!(e.kind(), ErrorKind::Shutdown | ErrorKind::Cancelled);
    if stopping || !e.is_retriable() || elapsed >= ttl * JOIN_RETRY_TTLS {
        return None;
    }
    let first = Duration::from_millis(50);
    Some(doubled(first, (ttl / 4).max(first), attempt))
}

/// How many join delays a member waits at most for others to join.
const MAX_JOIN_DELAYS: u32 = 5;

/// Waits before the first assignment while members join: until no member
/// joined for a join delay (up to [`MAX_JOIN_DELAYS`] in all), renewing
/// the membership as it waits. Members started together then split the
/// work from their first run, rather than the first taking everything and
/// giving most of it up again, and all of them start one join delay after
/// the last joined, rather than each one delay after its own join.
async fn settle_joins(member: &Member) -> Result<()> {
    let delay = member.group.join_delay;
    if delay.is_zero() {
        return Ok(());
    }
    let coordinator = &member.group.coordinator;
    let poll = (delay / 10).clamp(Duration::from_millis(20), Duration::from_millis(250));
    let renew = member.lease_ttl().unwrap_or(delay) / 3;
    let started = tokio::time::Instant::now();
    let give_up = started + delay * MAX_JOIN_DELAYS;
    let mut seen = coordinator.status(&member.group.name).await?.members.len();
    let (mut quiet_since, mut renewed) = (started, started);
    loop {
        let now = tokio::time::Instant::now();
        if now >= quiet_since + delay || now >= give_up {
            return Ok(());
        }
        tokio::time::sleep(poll.min(quiet_since + delay - now)).await;
        if renewed.elapsed() >= renew {
            member.heartbeat().await?;
            renewed = tokio::time::Instant::now();
        }
        let members = coordinator.status(&member.group.name).await?.members.len();
        if members != seen {
            seen = members;
            quiet_since = tokio::time::Instant::now();
        }
    }
}

/// Renews the membership every third of the lease TTL until the App
/// stops; a renewal of an expired membership drops every partition.
pub(crate) fn start_heartbeat(engine: &Arc<Engine>, member: Arc<Member>) {
    let period = member.lease_ttl().unwrap_or(Duration::from_secs(10)) / 3;
    let task = engine.user.spawn(async move {
        loop {
            tokio::time::sleep(period).await;
            if let Err(e) = member.heartbeat().await {
                // Counted as a missed renewal: the lease runs out unless a
                // later one lands.
                let _ = e;
            }
        }
    });
    engine.tasks.track(&task);
}

/// Converges on the member's assignment before a run: gives up what is no
/// longer its own (forgetting its local copy), takes what is (restoring
/// it from the changelog), replays the root partition unless it holds it,
/// and begins a pass of what it holds.
pub(crate) async fn before_run(engine: &Engine, member: &Member) -> Result<GroupRun> {
    let (rejoined, _) = member.ensure_joined().await?;
    if rejoined {
        forget_every_data_partition(engine, member).await?;
    }
    let partitions = member.partitions().unwrap_or(1);
    let states = member
        .group
        .coordinator
        .assign(&member.group.name, &member.id)
        .await?;
    let held = member.holding();
    let mine: BTreeSet<PartitionId> = states
        .iter()
        .filter(|s| s.target.as_deref() == Some(member.id.as_str()))
        .map(|s| s.partition)
        .collect();
    let give_up: Vec<PartitionId> = held
        .held
        .keys()
        .filter(|p| !mine.contains(p))
        .copied()
        .collect();
    if !give_up.is_empty() {
        release(engine, member, &give_up, partitions).await?;
    }
    let mut changed = !give_up.is_empty();
    for p in mine.iter().filter(|p| !held.held.contains_key(p)) {
        let taken = member
            .group
            .coordinator
            .acquire(&member.group.name, &member.id, *p)
            .await?;
        if let Some(epoch) = taken {
            let rows = restore_partition(
                &engine.ledger,
                &engine.ledger_handle,
                &engine.user,
                member,
                *p,
                crate::metrics::RESTORE_TAKEOVER,
            )
            .await?;
            member.hold(*p, epoch, rows);
            metrics::counter!(crate::metrics::GROUP_TAKEOVERS).increment(1);
            changed = true;
        }
    }
    if changed {
        metrics::counter!(crate::metrics::GROUP_REBALANCES).increment(1);
    }
    let holding = member.holding();
    if !holding.root() {
        restore_partition(
            &engine.ledger,
            &engine.ledger_handle,
            &engine.user,
            member,
            PartitionId::Root,
            crate::metrics::RESTORE_ROOT_REPLAY,
        )
        .await?;
    }
    let run = GroupRun { holding, pass: 0 };
    let pass = if run.holding.held.is_empty() {
        0
    } else {
        member
            .group
            .coordinator
            .begin_pass(&member.group.name, &run.partitions())
            .await?
    };
    Ok(GroupRun { pass, ..run })
}

/// Gives partitions up: forgets their local copy, then releases them.
async fn release(
    engine: &Engine,
    member: &Member,
    give_up: &[PartitionId],
    partitions: u32,
) -> Result<()> {
    member.drop_partitions(give_up);
    for p in give_up {
        forget_partition(
            &engine.ledger,
            &engine.ledger_handle,
            &engine.user,
            partitions,
            *p,
        )
        .await?;
    }
    member
        .group
        .coordinator
        .release(&member.group.name, &member.id, give_up)
        .await
}

/// Forgets the local copy of every data partition (the membership had
/// expired: another member may own any of them now).
async fn forget_every_data_partition(engine: &Engine, member: &Member) -> Result<()> {
    let partitions = member.partitions().unwrap_or(1);
    for n in 0..partitions {
        forget_partition(
            &engine.ledger,
            &engine.ledger_handle,
            &engine.user,
            partitions,
            PartitionId::Data(n),
        )
        .await?;
    }
    Ok(())
}

/// Ends a run's pass: the partitions still held under the run's epochs
/// completed it, unless the run did not reach its components: the root
/// failed, or it waited for the root partition's holder. (A pass with
/// components that failed on their own is complete: they failed in it.)
pub(crate) async fn after_run(
    member: &Member,
    run: &GroupRun,
    failures: &[ComponentFailure],
) -> Result<()> {
    let still: Vec<(PartitionId, Epoch)> = run
        .partitions()
        .into_iter()
        .filter(|(p, e)| member.epoch(*p) == Some(*e))
        .collect();
    let not_reached = failures
        .iter()
        .any(|f| f.is_root_pending() || f.path.is_root());
    if still.is_empty() || run.pass == 0 || not_reached {
        return Ok(());
    }
    member
        .group
        .coordinator
        .complete_pass(&member.group.name, &still, run.pass)
        .await?;
    let data: Vec<u32> = still
        .iter()
        .filter_map(|(p, _)| match p {
            PartitionId::Data(n) => Some(*n),
            PartitionId::Root => None,
        })
        .collect();
    member.note_synced(&data);
    compact_due(member).await;
    Ok(())
}

/// Compacts the changelogs of the partitions held that grew enough (see
/// [`WorkerGroup::compact_after_rows`]). A compaction that fails (fenced: the
/// partition was taken over; or the database could not be reached) is
/// only logged: the changelog stays whole, and the next run tries again.
async fn compact_due(member: &Member) {
    for (partition, epoch) in member.compaction_due() {
        let group = &member.group;
        match group
            .coordinator
            .compact(&group.name, partition, epoch)
            .await
        {
            Ok(rows) => member.compacted(partition, epoch, rows),
            Err(e) => tracing::warn!(
                group = %group.name(),
                "compacting the changelog of partition {partition} failed (the next run tries again): {e}"
            ),
        }
    }
}

/// The root-level components of the partitions held, as the local ledger
/// knows them: in a group, what the root mounted last time (its child list
/// spans members, so it is not recorded). The root's own containers
/// (mounted by `mount_target`) count when the root partition is held.
pub(crate) async fn held_root_children(
    engine: &Engine,
    holding: &Holding,
) -> Result<Vec<StableKey>> {
    let partitions = holding.partitions;
    let held: BTreeSet<PartitionId> = holding.held.keys().copied().collect();
    let ledger = engine.ledger.clone();
    let keys = engine
        .user
        .spawn_blocking(move || {
            ledger.component_keys(|c| match component_partition(c, partitions) {
                p @ PartitionId::Data(_) => held.contains(&p),
                // The root's own containers (`mount_target`): its holder's.
                PartitionId::Root => held.contains(&PartitionId::Root),
            })
        })
        .await
        .map_err(|e| crate::Error::Shutdown(format!("listing held components stopped: {e}")))??;
    let mut out: Vec<StableKey> = keys
        .iter()
        .filter_map(|k| keycode::decode_component(k)?.into_iter().next())
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// Leaves the group: releases every partition and the membership.
pub(crate) async fn leave(member: &Member) -> Result<()> {
    member.forget_membership();
    member
        .group
        .coordinator
        .leave(&member.group.name, &member.id)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(2);

    #[test]
    fn a_join_that_timed_out_is_retried_with_a_growing_delay_capped_at_a_quarter_of_the_ttl() {
        let timeout = Error::Io(std::io::Error::from(std::io::ErrorKind::TimedOut));
        let delays: Vec<_> = (0..8)
            .map(|attempt| join_retry_delay(&timeout, attempt, Duration::ZERO, TTL))
            .collect();
        assert_eq!(delays[0], Some(Duration::from_millis(50)));
        assert_eq!(delays[1], Some(Duration::from_millis(100)));
        assert_eq!(delays[7], Some(TTL / 4));
        assert!(delays.windows(2).all(|w| w[0] <= w[1]), "{delays:?}");
    }

    #[test]
    fn a_join_is_given_up_after_three_ttls_or_on_a_failure_retrying_cannot_fix() {
        let timeout = Error::Io(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert_eq!(join_retry_delay(&timeout, 3, TTL * 3, TTL), None);
        assert!(join_retry_delay(&timeout, 3, TTL * 3 - Duration::from_millis(1), TTL).is_some());
        assert_eq!(
            join_retry_delay(&Error::permanent("bad group"), 0, Duration::ZERO, TTL),
            None
        );
        assert_eq!(
            join_retry_delay(&Error::Usage("x".into()), 0, Duration::ZERO, TTL),
            None
        );
        assert_eq!(
            join_retry_delay(&Error::Shutdown("stop".into()), 0, Duration::ZERO, TTL),
            None
        );
    }
}
