//! A member of a worker group: its membership, the partitions it holds,
//! and what it does between runs to converge on its assignment.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::config::{default_member_id, WorkerGroup};
use super::coordinator::{Epoch, JoinRequest, Joined, Pass};
use super::fence::Fence;
use super::partition::{partition_of, PartitionId};
use crate::error::{Error, Result};
use crate::model::{keycode, StableKey};
use crate::scope::RunScope;

/// The membership of an App in a worker group.
pub(crate) struct Member {
    pub(crate) group: WorkerGroup,
    pub(crate) id: String,
    name: Arc<str>,
    state: Mutex<State>,
}

/// What a member knows of itself.
#[derive(Default)]
struct State {
    /// Set once joined; cleared when the membership expired.
    joined: Option<Joined>,
    /// The partitions held, with their epochs.
    held: BTreeMap<PartitionId, Epoch>,
    /// The data partitions this member completed a pass of.
    synced: BTreeSet<u32>,
    /// The rows of the changelog of each partition held, as this member
    /// knows them: read when it acquired the partition, plus the rows it
    /// appended since (only the holder appends).
    changelog_rows: BTreeMap<PartitionId, u64>,
    /// The rows of the changelog of each partition held when it was last
    /// compacted, or restored: what its snapshot may hold at most.
    compacted_rows: BTreeMap<PartitionId, u64>,
}

/// What a member holds for one run.
#[derive(Clone, Debug, Default)]
pub(crate) struct Holding {
    /// The partition count.
    pub partitions: u32,
    /// The partitions held, with their epochs.
    pub held: BTreeMap<PartitionId, Epoch>,
}

impl Holding {
    /// Whether the root partition is held.
    pub(crate) fn root(&self) -> bool {
        self.held.contains_key(&PartitionId::Root)
    }

    /// The data partitions held.
    pub(crate) fn data(&self) -> Vec<u32> {
        self.held
            .keys()
            .filter_map(|p| match p {
                PartitionId::Data(n) => Some(*n),
                PartitionId::Root => None,
            })
            .collect()
    }
}

impl Member {
    pub(crate) fn new(group: WorkerGroup) -> Self {
        let id = group.member_id.clone().unwrap_or_else(default_member_id);
        Self {
            name: Arc::from(group.name.as_str()),
            group,
            id,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Joins the group if not a member (or no longer one: the membership
    /// expired). Returns whether it joined now, and what joining gave.
    pub(crate) async fn ensure_joined(&self) -> Result<(bool, Joined)> {
        if let Some(joined) = self.state().joined.clone() {
            return Ok((false, joined));
        }
        let mut request = JoinRequest::new(self.group.name.clone(), self.id.clone());
        request.partitions = self.group.partitions;
        request.lease_ttl = self.group.lease_ttl;
        request.host = default_member_id();
        let joined = self.group.coordinator.join(&request).await?;
        let mut state = self.state();
        state.held.clear();
        state.joined = Some(joined.clone());
        drop(state);
        self.gauge();
        Ok((true, joined))
    }

    /// The group's partition count, once joined.
    pub(crate) fn partitions(&self) -> Option<u32> {
        self.state().joined.as_ref().map(|j| j.partitions)
    }

    /// The pass this member joined at.
    pub(crate) fn join_pass(&self) -> Option<Pass> {
        self.state().joined.as_ref().map(|j| j.join_pass)
    }

    /// The lease TTL, once joined.
    pub(crate) fn lease_ttl(&self) -> Option<Duration> {
        self.state().joined.as_ref().map(|j| j.lease_ttl)
    }

    /// Renews the membership; when it had expired, every partition is
    /// dropped and the member joins again before its next run.
    pub(crate) async fn heartbeat(&self) -> Result<bool> {
        if self.state().joined.is_none() {
            // Not a member now (it left): the next run joins again.
            return Ok(false);
        }
        let alive = self
            .group
            .coordinator
            .heartbeat(&self.group.name, &self.id)
            .await?;
        if !alive {
            let mut state = self.state();
            state.joined = None;
            state.held.clear();
            drop(state);
            self.gauge();
            metrics::counter!(crate::metrics::GROUP_EXPIRIES).increment(1);
        }
        Ok(alive)
    }

    /// What the member holds now.
    pub(crate) fn holding(&self) -> Holding {
        let state = self.state();
        Holding {
            partitions: state.joined.as_ref().map_or(0, |j| j.partitions),
            held: state.held.clone(),
        }
    }

    /// Notes a partition as held under `epoch` (after an acquire), its
    /// changelog holding `changelog_rows` rows (as its restore read them).
    pub(crate) fn hold(&self, partition: PartitionId, epoch: Epoch, changelog_rows: u64) {
        let mut state = self.state();
        state.held.insert(partition, epoch);
        state.changelog_rows.insert(partition, changelog_rows);
        state.compacted_rows.insert(partition, changelog_rows);
        drop(state);
        self.gauge();
    }

    /// The partitions held whose changelogs grew enough since they were
    /// last compacted or restored to compact them (see
    /// [`WorkerGroup::compact_after_rows`](super::WorkerGroup::compact_after_rows)),
    /// with their epochs.
    pub(crate) fn compaction_due(&self) -> Vec<(PartitionId, Epoch)> {
        let after = self.group.compact_after_rows;
        let state = self.state();
        state
            .held
            .iter()
            .filter(|(p, _)| {
                let rows = state.changelog_rows.get(p).copied().unwrap_or(0);
                let base = state.compacted_rows.get(p).copied().unwrap_or(0);
                rows.saturating_sub(base) >= base.max(after)
            })
            .map(|(p, e)| (*p, *e))
            .collect()
    }

    /// Notes a partition's changelog as compacted under `epoch`, holding
    /// `rows` rows now.
    pub(crate) fn compacted(&self, partition: PartitionId, epoch: Epoch, rows: u64) {
        let mut state = self.state();
        if state.held.get(&partition) != Some(&epoch) {
            return;
        }
        state.changelog_rows.insert(partition, rows);
        state.compacted_rows.insert(partition, rows);
        drop(state);
        self.gauge();
    }

    /// Counts `rows` appended to a partition's changelog under `epoch`, if
    /// the partition is still held under it (a partition acquired again
    /// since read them with its restore).
    pub(crate) fn appended(&self, partition: PartitionId, epoch: Epoch, rows: u64) {
        let mut state = self.state();
        if state.held.get(&partition) != Some(&epoch) {
            return;
        }
        *state.changelog_rows.entry(partition).or_default() += rows;
        drop(state);
        self.gauge();
    }

    /// Forgets partitions (released, or fenced: taken over).
    pub(crate) fn drop_partitions(&self, partitions: &[PartitionId]) {
        let mut state = self.state();
        let mut lost = Vec::new();
        for p in partitions {
            if let Some(epoch) = state.held.remove(p) {
                lost.push(format!("{p} (epoch {epoch})"));
            }
        }
        drop(state);
        if !lost.is_empty() {
            tracing::warn!(
                group = %self.group.name(),
                "lost the lease of partition(s) {}: another member took them over (this member was paused, or cut off from the database, past its lease); their writes were refused and this member no longer runs them",
                lost.join(", ")
            );
        }
        self.gauge();
    }

    /// Forgets the membership (after leaving): the next run joins again.
    pub(crate) fn forget_membership(&self) {
        let mut state = self.state();
        state.joined = None;
        state.held.clear();
        drop(state);
        self.gauge();
    }

    /// The epoch a partition is held under.
    pub(crate) fn epoch(&self, partition: PartitionId) -> Option<Epoch> {
        self.state().held.get(&partition).copied()
    }

    /// Notes data partitions as synced by this member (for the CLI's
    /// closing line).
    pub(crate) fn note_synced(&self, partitions: &[u32]) {
        self.state().synced.extend(partitions.iter().copied());
    }

    /// The data partitions this member synced, sorted.
    pub(crate) fn synced(&self) -> Vec<u32> {
        self.state().synced.iter().copied().collect()
    }

    /// The fence of a sink call carrying actions of `partitions`: their
    /// epochs as held now. A partition no longer held gets epoch -1,
    /// which no fence row has: its write is refused.
    pub(crate) fn fence(&self, partitions: impl IntoIterator<Item = PartitionId>) -> Fence {
        let state = self.state();
        let list = partitions
            .into_iter()
            .map(|p| (p, state.held.get(&p).copied().unwrap_or(-1)))
            .collect();
        Fence::new(Arc::clone(&self.name), list)
    }

    /// The scope of a run: the root-level components of the data
    /// partitions held.
    pub(crate) fn scope(&self, holding: &Holding) -> RunScope {
        let data: BTreeSet<u32> = holding.data().into_iter().collect();
        let partitions = holding.partitions;
        RunScope::filter(move |key| data.contains(&partition_of(key, partitions)))
    }

    /// The error of a `mount` of a root-level component of a partition
    /// not held.
    pub(crate) fn not_held(&self, path: crate::model::ComponentPath, key: &StableKey) -> Error {
        let partition = partition_of(key, self.partitions().unwrap_or(1));
        Error::NotHeld {
            group: self.group.name.clone(),
            path,
            partition,
        }
    }

    /// Sets the gauges of what the member holds: its partitions, and the
    /// rows of their changelogs. Under the state's lock, so that the last
    /// change made is the last value set.
    fn gauge(&self) {
        let mut state = self.state();
        let State {
            held,
            changelog_rows,
            compacted_rows,
            ..
        } = &mut *state;
        changelog_rows.retain(|p, _| held.contains_key(p));
        compacted_rows.retain(|p, _| held.contains_key(p));
        let rows: u64 = changelog_rows.values().sum();
        metrics::gauge!(crate::metrics::GROUP_PARTITIONS_HELD).set(held.len() as f64);
        metrics::gauge!(crate::metrics::GROUP_CHANGELOG_ROWS).set(rows as f64);
    }
}

/// The partition of a component, from its encoded key: the root
/// component, and the containers `mount_target` mounts under the root,
/// are in the root partition; any other component is in the partition of
/// its root-level ancestor's key.
pub(crate) fn component_partition(component: &[u8], partitions: u32) -> PartitionId {
    let Some(segments) = keycode::decode_component(component) else {
        return PartitionId::Root;
    };
    match segments.first() {
        None => PartitionId::Root,
        Some(first) if is_target_key(first) => PartitionId::Root,
        Some(first) => PartitionId::Data(partition_of(first, partitions)),
    }
}

/// Whether a root-level key is one `mount_target` mounts a container
/// under (`[@target, provider, key]`): the root's own.
pub(crate) fn is_target_key(key: &StableKey) -> bool {
    matches!(key, StableKey::Array(parts)
        if matches!(parts.first(), Some(StableKey::Symbol(s)) if &**s == crate::model::path::TARGET_SYMBOL))
}
