//! The target assignment: balanced over the live members, sticky.
//!
//! Data partitions are shared out so that the live members, sorted by id,
//! get `⌈P/n⌉` or `⌊P/n⌋` each. A partition's current member is its
//! target if that member is live, else its owner if live. The `P mod n`
//! larger quotas go to the members that hold the most now (ties: the
//! first by id), each member keeps its partitions up to its quota (the
//! lowest-numbered first), and only the rest move, to the members below
//! their quota, in id order. So a join or a leave moves only what must
//! move.
//!
//! The root partition is not counted in the quotas (it carries the root
//! component's own target states, not a share of the data): it stays
//! with its current member while that one is live, else goes to the live
//! member with the fewest data partitions (ties: the first by id).

use sqlx::PgConnection;
use weir_actors::group::PartitionState;
use weir_actors::{PartitionId, Result};

use super::settings::{lock_group, no_group};

/// A partition's row: number, live owner, target, epoch, completed pass.
type StateRow = (i32, Option<String>, Option<String>, i64, Option<i64>);

/// Every partition's state, the root first: its owner when the owner's
/// membership (of the incarnation that took it) is live, its target, its
/// epoch and its last completed pass.
pub(super) async fn partition_states(
    conn: &mut PgConnection,
    group: &str,
) -> Result<Vec<PartitionState>> {
    let rows: Vec<StateRow> = sqlx::query_as(
        "SELECT p.partition, CASE WHEN o.member_id IS NULL THEN NULL ELSE p.owner END,
                p.target, f.epoch, pp.completed_pass
           FROM weir.partition p
           JOIN weir.fence f ON f.group_name = p.group_name AND f.partition = p.partition
           LEFT JOIN weir.partition_pass pp
             ON pp.group_name = p.group_name AND pp.partition = p.partition
           LEFT JOIN weir.member o
             ON o.group_name = p.group_name AND o.member_id = p.owner
            AND o.incarnation = p.owner_incarnation AND o.expires_at > clock_timestamp()
          WHERE p.group_name = $1
          ORDER BY p.partition",
    )
    .bind(group)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(partition, owner, target, epoch, completed)| {
            let partition = PartitionId::from_i32(partition)?;
            Some(PartitionState::new(
                partition, owner, target, epoch, completed,
            ))
        })
        .collect())
}

/// Recomputes the group's targets under the lock on its row, writes the
/// ones that changed, and returns every partition's state.
pub(super) async fn assign(conn: &mut PgConnection, group: &str) -> Result<Vec<PartitionState>> {
    if lock_group(conn, group).await?.is_none() {
        return Err(no_group(group));
    }
    let mut live: Vec<String> = sqlx::query_scalar(
        "SELECT member_id FROM weir.member
          WHERE group_name = $1 AND expires_at > clock_timestamp()",
    )
    .bind(group)
    .fetch_all(&mut *conn)
    .await?;
    live.sort_unstable();
    let mut states = partition_states(conn, group).await?;
    let targets = targets(&live, &states);
    let mut ids = Vec::new();
    let mut changed = Vec::new();
    for (state, target) in states.iter_mut().zip(targets) {
        if state.target != target {
            ids.push(state.partition.as_i32());
            changed.push(target.clone());
            state.target = target;
        }
    }
    if !ids.is_empty() {
        sqlx::query(
            "UPDATE weir.partition p SET target = t.target
               FROM unnest($2::integer[], $3::text[]) AS t(partition, target)
              WHERE p.group_name = $1 AND p.partition = t.partition",
        )
        .bind(group)
        .bind(&ids)
        .bind(&changed)
        .execute(&mut *conn)
        .await?;
    }
    Ok(states)
}

/// The target of each partition of `states` (in the same order), given the
/// live members sorted by id.
pub(super) fn targets(live: &[String], states: &[PartitionState]) -> Vec<Option<String>> {
    let index =
        |name: Option<&str>| name.and_then(|n| live.binary_search_by(|m| m.as_str().cmp(n)).ok());
    let current: Vec<Option<usize>> = states
        .iter()
        .map(|s| index(s.target.as_deref()).or_else(|| index(s.owner.as_deref())))
        .collect();
    let data: Vec<usize> = (0..states.len())
        .filter(|&i| {
            matches!(
                states.get(i).map(|s| s.partition),
                Some(PartitionId::Data(_))
            )
        })
        .collect();
    let data_current: Vec<Option<usize>> = data
        .iter()
        .map(|&i| current.get(i).copied().flatten())
        .collect();
    let shared = balance(live.len(), &data_current);
    let mut out: Vec<Option<usize>> = vec![None; states.len()];
    let mut load = vec![0usize; live.len()];
    for (&i, member) in data.iter().zip(&shared) {
        if let (Some(slot), Some(m)) = (out.get_mut(i), member) {
            *slot = Some(*m);
            if let Some(l) = load.get_mut(*m) {
                *l += 1;
            }
        }
    }
    let least_loaded = (0..live.len()).min_by_key(|&m| (load.get(m).copied(), m));
    for (i, state) in states.iter().enumerate() {
        if state.partition == PartitionId::Root {
            if let Some(slot) = out.get_mut(i) {
                *slot = current.get(i).copied().flatten().or(least_loaded);
            }
        }
    }
    out.into_iter()
        .map(|m| m.and_then(|m| live.get(m).cloned()))
        .collect()
}

/// Shares `current.len()` partitions out to `members` members: each
/// partition's current member (an index) keeps it within its quota, the
/// rest go to the members below theirs. `None` only when there are no
/// members.
fn balance(members: usize, current: &[Option<usize>]) -> Vec<Option<usize>> {
    if members == 0 {
        return vec![None; current.len()];
    }
    let (base, extra) = (current.len() / members, current.len() % members);
    let mut held = vec![0usize; members];
    for m in current.iter().flatten() {
        if let Some(h) = held.get_mut(*m) {
            *h += 1;
        }
    }
    let mut order: Vec<usize> = (0..members).collect();
    order.sort_by_key(|&m| (std::cmp::Reverse(held.get(m).copied()), m));
    let mut quota = vec![base; members];
    for m in order.into_iter().take(extra) {
        if let Some(q) = quota.get_mut(m) {
            *q += 1;
        }
    }
    let mut kept = vec![0usize; members];
    let mut out: Vec<Option<usize>> = Vec::with_capacity(current.len());
    for member in current {
        let keep = member.filter(|&m| kept.get(m) < quota.get(m));
        if let Some(k) = keep.and_then(|m| kept.get_mut(m)) {
            *k += 1;
        }
        out.push(keep);
    }
    let mut next = 0;
    for slot in out.iter_mut().filter(|s| s.is_none()) {
        while next < members && kept.get(next) >= quota.get(next) {
            next += 1;
        }
        if let Some(k) = kept.get_mut(next) {
            *k += 1;
            *slot = Some(next);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(members: usize, shared: &[Option<usize>]) -> Vec<usize> {
        let mut counts = vec![0; members];
        for m in shared.iter().flatten() {
            counts[*m] += 1;
        }
        counts
    }

    #[test]
    fn partitions_are_shared_out_evenly_from_scratch() {
        for (members, want) in [(1, vec![8]), (2, vec![4, 4]), (3, vec![3, 3, 2])] {
            let shared = balance(members, &[None; 8]);
            assert_eq!(counts(members, &shared), want);
        }
        assert_eq!(balance(0, &[None; 3]), vec![None; 3]);
    }

    #[test]
    fn a_new_member_takes_only_what_the_others_have_beyond_their_quota() {
        let before = balance(2, &[None; 8]);
        let after = balance(3, &before);
        let moved: Vec<usize> = (0..8).filter(|&i| before[i] != after[i]).collect();
        assert_eq!(moved.len(), 2, "{before:?} -> {after:?}");
        assert!(moved.iter().all(|&i| after[i] == Some(2)));
        assert_eq!(counts(3, &after), vec![3, 3, 2]);
    }

    #[test]
    fn the_members_holding_more_keep_the_larger_quotas() {
        // Member 2 holds 3 of 8 and member 0 holds 2: member 2 keeps its 3.
        let current = [
            Some(0),
            Some(0),
            Some(1),
            Some(1),
            Some(1),
            Some(2),
            Some(2),
            Some(2),
        ];
        assert_eq!(balance(3, &current), current.to_vec());
    }

    #[test]
    fn the_partitions_of_a_member_that_left_go_to_those_below_quota() {
        let current = [Some(0), Some(1), Some(2), Some(0), Some(1), Some(2)];
        // Member 2 is gone: what it had is free; two members share six.
        let gone: Vec<Option<usize>> = current.iter().map(|m| m.filter(|&m| m < 2)).collect();
        let after = balance(2, &gone);
        assert_eq!(counts(2, &after), vec![3, 3]);
        for i in [0, 1, 3, 4] {
            assert_eq!(after[i], current[i], "partition {i} moved");
        }
    }

    fn state(partition: PartitionId, target: Option<&str>) -> PartitionState {
        PartitionState::new(partition, None, target.map(str::to_string), 0, None)
    }

    #[test]
    fn the_root_stays_with_its_live_member_or_goes_to_the_least_loaded() {
        let live = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let mut states = vec![state(PartitionId::Root, None)];
        states.extend((0..8).map(|n| state(PartitionId::Data(n), None)));
        let targets = targets(&live, &states);
        assert_eq!(targets[0].as_deref(), Some("c"), "{targets:?}");
        states[0] = state(PartitionId::Root, Some("a"));
        assert_eq!(super::targets(&live, &states)[0].as_deref(), Some("a"));
        states[0] = state(PartitionId::Root, Some("gone"));
        assert_eq!(super::targets(&live, &states)[0].as_deref(), Some("c"));
    }
}
