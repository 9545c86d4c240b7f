//! The durable copy of a member's ledger: what the ledger actor commits
//! for the partitions the member holds is appended to their changelogs,
//! in commit order, fenced by the epochs held; intents before the actions
//! they announce are applied, records after the commits that wrote them.
//!
//! The ledger actor hands each group commit's entries to the mirror task
//! and goes on; the commit's waiter hears back only once the changelog has
//! them. An append of a partition taken over fails the commits that
//! touched it with `Error::Fenced`, and the member gives the partition up.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use std::collections::BTreeSet;

use super::coordinator::LogEntry;
use super::member::{component_partition, Member};
use super::partition::PartitionId;
use crate::config::doubled;
use crate::error::{Error, Result};
use crate::ledger::record::{ComponentRecord, Intent, LedgerOp};
use crate::ledger::Ledger;

/// The entries of a group commit (or of intents) per partition, and who
/// waits for them: each waiter with the partitions its commit touched.
pub(crate) struct MirrorJob {
    pub entries: BTreeMap<PartitionId, Vec<LogEntry>>,
    pub waiters: Vec<(Vec<PartitionId>, Waiter)>,
}

/// Who waits for a mirrored commit or intent batch, and what it hears
/// once the changelog has it.
pub(crate) enum Waiter {
    /// A commit: `Ok(())`.
    Commit(oneshot::Sender<Result<()>>),
    /// An intent batch: its id.
    Intents(oneshot::Sender<Result<u64>>, u64),
}

impl Waiter {
    fn answer(self, result: Result<()>) {
        match self {
            Waiter::Commit(tx) => {
                let _ = tx.send(result);
            }
            Waiter::Intents(tx, id) => {
                let _ = tx.send(result.map(|()| id));
            }
        }
    }
}

/// The mirror's end the ledger actor sends jobs to.
#[derive(Clone)]
pub(crate) struct MirrorHook {
    pub tx: mpsc::UnboundedSender<MirrorJob>,
    pub member: Arc<Member>,
}

/// The partitions of the components a commit's ops name (those below a
/// dropped container are in the container's partition, or in one of the
/// member's own).
pub(crate) fn partitions_of(ops: &[LedgerOp], member: &Member) -> Vec<PartitionId> {
    let partitions = member.partitions().unwrap_or(1);
    let mut out: Vec<PartitionId> = ops
        .iter()
        .filter_map(LedgerOp::component)
        .map(|c| component_partition(c, partitions))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// An intents message of a group, answered locally: its reply channel, the
/// local outcome (the batch's id), and the intents it journaled.
pub(crate) type JournaledIntents = (oneshot::Sender<Result<u64>>, Result<u64>, Vec<Intent>);

/// A commit of a group, answered locally: its reply channel (if it wants
/// one) with the local outcome, and the partitions it wrote.
pub(crate) type CommittedLocally = (
    (Option<oneshot::Sender<Result<()>>>, Result<()>),
    Vec<PartitionId>,
);

/// Hands what a group commit wrote over to the mirror task: the records
/// of the components it touched and the intents it journaled, per
/// partition, and their waiters. What failed locally is answered at once.
pub(crate) fn hand_over(
    hook: &MirrorHook,
    ledger: &Ledger,
    touched: &BTreeSet<Vec<u8>>,
    commits: Vec<CommittedLocally>,
    intents: Vec<JournaledIntents>,
) {
    let partitions = hook.member.partitions().unwrap_or(1);
    let mut job = MirrorJob {
        entries: BTreeMap::new(),
        waiters: Vec::new(),
    };
    // Records first: intents journaled in the same group then stay after
    // them, pending (an intent whose action committed meanwhile is
    // recognised as such when restored).
    let mut unreadable = None;
    for component in touched {
        let record = ledger.record_of(component);
        match record.and_then(|r| record_entry(component.clone(), r.as_ref())) {
            Ok(entry) => job
                .entries
                .entry(component_partition(component, partitions))
                .or_default()
                .push(entry),
            Err(e) => unreadable = Some(e.to_string()),
        }
    }
    for ((reply, result), touched) in commits {
        let Some(reply) = reply else { continue };
        match (result, &unreadable) {
            (Err(e), _) => {
                let _ = reply.send(Err(e));
            }
            (Ok(()), Some(why)) => {
                let _ = reply.send(Err(Error::msg(format!(
                    "a committed record could not be read for the partition's changelog: {why}"
                ))));
            }
            (Ok(()), None) => job.waiters.push((touched, Waiter::Commit(reply))),
        }
    }
    for (reply, result, list) in intents {
        match result {
            Ok(id) => add_intents(&mut job, partitions, reply, id, list),
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }
    if let Err(refused) = hook.tx.send(job) {
        for (_, waiter) in refused.0.waiters {
            waiter.answer(Err(Error::Shutdown(
                "the changelog mirror has stopped".into(),
            )));
        }
    }
}

/// Adds a journaled intent batch (`id`) to the job: its intents, by the
/// partition of their component, and its waiter on those partitions. One
/// that cannot be encoded is answered with the error at once.
fn add_intents(
    job: &mut MirrorJob,
    partitions: u32,
    reply: oneshot::Sender<Result<u64>>,
    id: u64,
    list: Vec<Intent>,
) {
    let mut by_component: BTreeMap<Vec<u8>, Vec<Intent>> = BTreeMap::new();
    for intent in list {
        by_component
            .entry(intent.component.to_vec())
            .or_default()
            .push(intent);
    }
    let mut parts = Vec::new();
    let mut encoded = Vec::new();
    for (component, list) in by_component {
        let partition = component_partition(&component, partitions);
        encoded.push((partition, intents_entry(component, &list)));
        parts.push(partition);
    }
    if let Some(Err(e)) = encoded.iter().find(|(_, e)| e.is_err()).map(|(_, e)| e) {
        let _ = reply.send(Err(Error::msg(format!(
            "intents could not be encoded for the partition's changelog: {e}"
        ))));
        return;
    }
    for (partition, entry) in encoded {
        if let Ok(entry) = entry {
            job.entries.entry(partition).or_default().push(entry);
        }
    }
    parts.sort_unstable();
    parts.dedup();
    job.waiters.push((parts, Waiter::Intents(reply, id)));
}

/// Attempts of one append that fails for a reason retrying may fix.
const ATTEMPTS: u32 = 5;

/// Starts the mirror task on `user`; it ends when every hook is dropped.
pub(crate) fn start(member: Arc<Member>, user: &tokio::runtime::Handle) -> MirrorHook {
    let (tx, mut rx) = mpsc::unbounded_channel::<MirrorJob>();
    let task_member = Arc::clone(&member);
    user.spawn(async move {
        while let Some(job) = rx.recv().await {
            run_job(&task_member, job).await;
        }
    });
    MirrorHook { tx, member }
}

/// Appends a job's entries, partition by partition, and answers its
/// waiters: a waiter fails when a partition its commit touched failed.
async fn run_job(member: &Member, job: MirrorJob) {
    let mut failed: BTreeMap<PartitionId, Error> = BTreeMap::new();
    for (partition, entries) in job.entries {
        if let Err(e) = append(member, partition, entries).await {
            if e.is_fenced() {
                member.drop_partitions(&[partition]);
                metrics::counter!(crate::metrics::GROUP_FENCED_WRITES).increment(1);
            }
            failed.insert(partition, e);
        }
    }
    for (partitions, waiter) in job.waiters {
        let first_failure = partitions.iter().find_map(|p| failed.get(p));
        waiter.answer(match first_failure {
            None => Ok(()),
            Some(e) => Err(copy_error(e)),
        });
    }
}

/// Appends to one partition's changelog under the epoch held, retrying
/// what may pass later.
async fn append(member: &Member, partition: PartitionId, entries: Vec<LogEntry>) -> Result<()> {
    let Some(epoch) = member.epoch(partition) else {
        return Err(Error::Fenced {
            group: member.group.name.clone(),
            partitions: vec![partition],
        });
    };
    let rows = u64::try_from(entries.len()).unwrap_or(u64::MAX);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let result = member
            .group
            .coordinator
            .append(&member.group.name, partition, epoch, entries.clone())
            .await;
        if result.is_ok() {
            member.appended(partition, epoch, rows);
        }
        match result {
            Err(e) if e.is_retriable() && !e.is_fenced() && attempt < ATTEMPTS => {
                let delay = doubled(Duration::from_millis(100), Duration::MAX, attempt - 1);
                tokio::time::sleep(delay).await;
            }
            other => return other,
        }
    }
}

/// An error for each waiter of a failed append (errors do not clone).
fn copy_error(e: &Error) -> Error {
    match e {
        Error::Fenced { group, partitions } => Error::Fenced {
            group: group.clone(),
            partitions: partitions.clone(),
        },
        other if other.is_retriable() => Error::msg(format!(
            "the partition's changelog could not be written: {other}"
        )),
        other => Error::permanent(format!(
            "the partition's changelog could not be written: {other}"
        )),
    }
}

/// The changelog entries of a committed component: its whole record, or
/// its removal.
pub(crate) fn record_entry(
    component: Vec<u8>,
    record: Option<&ComponentRecord>,
) -> Result<LogEntry> {
    Ok(match record {
        Some(record) => LogEntry::Record {
            component,
            record: rmp_serde::to_vec(record)?,
        },
        None => LogEntry::Removed { component },
    })
}

/// The changelog entry of intents about to be acted on, for one component.
pub(crate) fn intents_entry(component: Vec<u8>, intents: &[Intent]) -> Result<LogEntry> {
    Ok(LogEntry::Intents {
        component,
        intents: rmp_serde::to_vec(intents)?,
    })
}
