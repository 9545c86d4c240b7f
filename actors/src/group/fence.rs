//! The fencing token of a sink call: the partitions and epochs it writes
//! for, which a sink checks in its own transaction.

use std::future::Future;
use std::sync::Arc;

use super::coordinator::Epoch;
use super::partition::PartitionId;
use crate::error::Error;

tokio::task_local! {
    static FENCE: Fence;
}

/// The partitions, and the epochs of their leases, that the actions of the
/// sink call running now are written for, in a worker group.
///
/// A sink that writes to a database checks, in the transaction that
/// writes, that each partition's epoch is still the current one, and
/// fails with [`Fence::fenced`] when one is not: a member that lost a
/// partition (it paused past its lease, or lost its connection) then
/// writes nothing stale. The PostgreSQL connector does this
/// (`weir::connectors::postgres::check_fence`); a custom sink does the
/// same against the group's fence table.
///
/// ```
/// use weir_actors::{Fence, Result};
///
/// async fn apply(rows: Vec<String>) -> Result<()> {
///     if let Some(fence) = Fence::current() {
///         // In the write's transaction: check every (partition, epoch) of
///         // `fence.partitions()` against the group's fence rows, and
///         // return `Err(fence.fenced(&stale))` for those that moved on.
///         let _ = fence.partitions();
///     }
///     let _ = rows;
///     Ok(())
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    group: Arc<str>,
    partitions: Arc<[(PartitionId, Epoch)]>,
}

impl Fence {
    /// The fence of a call writing for `partitions` (each with the epoch
    /// it is held under) of the worker group `group`; the list is sorted
    /// and duplicates dropped. The engine makes one per sink call of a
    /// member; a sink's tests, or a [`Coordinator`](super::Coordinator)
    /// checking its own writes, make their own.
    pub fn new(group: impl Into<Arc<str>>, mut partitions: Vec<(PartitionId, Epoch)>) -> Self {
        partitions.sort_unstable();
        partitions.dedup();
        Self {
            group: group.into(),
            partitions: partitions.into(),
        }
    }

    /// The fence of the sink call running on this task, if the App is a
    /// member of a worker group (`None` otherwise: nothing to check).
    pub fn current() -> Option<Fence> {
        FENCE.try_with(Clone::clone).ok()
    }

    /// The group's name.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// Each partition the call writes for, with the epoch this member
    /// holds it under, sorted.
    pub fn partitions(&self) -> &[(PartitionId, Epoch)] {
        &self.partitions
    }

    /// The error of a write refused because `stale` partitions have a
    /// newer epoch: the engine drops their components' actions without
    /// retrying them, and the member gives the partitions up.
    pub fn fenced(&self, stale: &[PartitionId]) -> Error {
        Error::Fenced {
            group: self.group.to_string(),
            partitions: stale.to_vec(),
        }
    }

    /// Runs `f` (a sink call) with `fence` as its [`Fence::current`].
    pub(crate) async fn scope<F: Future>(fence: Option<Fence>, f: F) -> F::Output {
        match fence {
            Some(fence) => FENCE.scope(fence, f).await,
            None => f.await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_sink_call_sees_its_fence_and_code_outside_one_sees_none() {
        let fence = Fence::new(
            Arc::from("g"),
            vec![
                (PartitionId::Data(3), 2),
                (PartitionId::Root, 1),
                (PartitionId::Data(3), 2),
            ],
        );
        assert_eq!(Fence::current(), None);
        let seen = Fence::scope(Some(fence.clone()), async { Fence::current() }).await;
        assert_eq!(
            seen.as_ref().map(Fence::partitions),
            Some(&[(PartitionId::Root, 1), (PartitionId::Data(3), 2)][..])
        );
        let err = fence.fenced(&[PartitionId::Data(3)]);
        assert!(err.is_fenced());
        assert!(err.to_string().contains("3"), "{err}");
        assert!(!err.is_retriable());
    }
}
