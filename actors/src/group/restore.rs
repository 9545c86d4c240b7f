//! Bringing a partition's local copy in line with its changelog: forget
//! it (a partition given up), or restore it (a partition taken over, or
//! the root partition replayed by a member that does not hold it).

use std::time::Instant;

use super::member::{component_partition, Member};
use super::partition::PartitionId;
use crate::actors::ledger::LedgerHandle;
use crate::error::{Error, Result};
use crate::ledger::record::ComponentRecord;
use crate::ledger::record::{Intent, LedgerOp};
use crate::ledger::Ledger;

/// The local components of `partition`.
async fn local_components(
    ledger: &Ledger,
    user: &tokio::runtime::Handle,
    partitions: u32,
    partition: PartitionId,
) -> Result<Vec<Vec<u8>>> {
    let ledger = ledger.clone();
    user.spawn_blocking(move || {
        ledger.component_keys(|c| component_partition(c, partitions) == partition)
    })
    .await
    .map_err(|e| Error::Shutdown(format!("listing a partition's components stopped: {e}")))?
}

/// Forgets the local copy of `partition` (given up): nothing of it can
/// mislead this member once another one owns it.
pub(crate) async fn forget_partition(
    ledger: &Ledger,
    handle: &LedgerHandle,
    user: &tokio::runtime::Handle,
    partitions: u32,
    partition: PartitionId,
) -> Result<()> {
    let local = local_components(ledger, user, partitions, partition).await?;
    if local.is_empty() {
        return Ok(());
    }
    let ops = local
        .into_iter()
        .map(|component| LedgerOp::Forget { component })
        .collect();
    handle.commit_local(ops).await
}

/// Replaces the local copy of `partition` with what its changelog holds:
/// the latest record of each component, and the intents no record
/// collapsed, folded in as possible records (as after a crash). `reason`
/// labels the restore's metrics ([`crate::metrics::RESTORE_TAKEOVER`] or
/// [`crate::metrics::RESTORE_ROOT_REPLAY`]). Returns the changelog rows
/// read.
pub(crate) async fn restore_partition(
    ledger: &Ledger,
    handle: &LedgerHandle,
    user: &tokio::runtime::Handle,
    member: &Member,
    partition: PartitionId,
    reason: &'static str,
) -> Result<u64> {
    let started = Instant::now();
    let partitions = member.partitions().unwrap_or(1);
    let local = local_components(ledger, user, partitions, partition).await?;
    let restored = member
        .group
        .coordinator
        .restore(&member.group.name, partition)
        .await?;
    let mut ops: Vec<LedgerOp> = local
        .into_iter()
        .map(|component| LedgerOp::Forget { component })
        .collect();
    for (component, bytes) in restored.records {
        let record: ComponentRecord = decode(&bytes, "a component record")?;
        ops.push(LedgerOp::Restore {
            component,
            record: Box::new(record),
        });
    }
    for (_, bytes) in restored.intents {
        let intents: Vec<Intent> = decode(&bytes, "intents")?;
        ops.extend(intents.into_iter().map(LedgerOp::Recover));
    }
    if !ops.is_empty() {
        handle.commit_local(ops).await?;
    }
    metrics::histogram!(crate::metrics::GROUP_RESTORE_DURATION, "reason" => reason)
        .record(started.elapsed().as_secs_f64());
    metrics::counter!(crate::metrics::GROUP_RESTORED_ROWS, "reason" => reason)
        .increment(restored.rows);
    Ok(restored.rows)
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T> {
    rmp_serde::from_slice(bytes).map_err(|e| {
        Error::msg(format!(
            "a partition's changelog holds {what} this build cannot read: {e}"
        ))
    })
}
