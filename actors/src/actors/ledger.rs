//! The ledger actor: the only writer of the ledger, on its own thread.
//!
//! sled calls block, so they never run on an async worker: writers send
//! [`LedgerMsg`]s through a crossbeam channel and await a oneshot reply. The
//! actor drains everything queued before each write, applies it as one sled
//! batch and flushes once (group commit).

use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::group::mirror::{self, MirrorHook};
use crate::group::PartitionId;
use crate::ledger::record::{Intent, LedgerOp};
use crate::ledger::Ledger;
use std::collections::BTreeSet;

type CommitReply = Option<oneshot::Sender<Result<()>>>;

/// A queue at least this long means the ledger is the bottleneck.
const BUSY_GROUP: usize = 32;
/// How long a busy ledger waits for more messages before writing.
const GROUP_WINDOW: std::time::Duration = std::time::Duration::from_millis(2);

/// The most messages folded into one sled batch.
const MAX_GROUP: usize = 4096;

pub(crate) enum LedgerMsg {
    /// Persist intents durably; replies with the intent batch id.
    WriteIntents {
        intents: Vec<Intent>,
        reply: oneshot::Sender<Result<u64>>,
    },
    /// Apply ops atomically and durably.
    Commit {
        ops: Vec<LedgerOp>,
        reply: Option<oneshot::Sender<Result<()>>>,
    },
    /// Apply ops that bring a partition's local copy in line with its
    /// changelog (in a worker group): never mirrored back to it.
    CommitLocal {
        ops: Vec<LedgerOp>,
        reply: oneshot::Sender<Result<()>>,
    },
    /// Fold the intents left in the journal (by a cancelled run) into
    /// the entries, as opening a ledger does after a crash.
    RecoverLeftovers {
        reply: oneshot::Sender<Result<()>>,
    },
    Shutdown,
}

/// A handle to send work to the ledger actor.
#[derive(Clone)]
pub(crate) struct LedgerHandle {
    tx: Sender<LedgerMsg>,
}

impl LedgerHandle {
    pub(crate) async fn write_intents(&self, intents: Vec<Intent>) -> Result<u64> {
        let (reply, rx) = oneshot::channel();
        self.send(LedgerMsg::WriteIntents { intents, reply })?;
        rx.await.map_err(|_| gone())?
    }

    pub(crate) async fn commit(&self, ops: Vec<LedgerOp>) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        self.send(LedgerMsg::Commit {
            ops,
            reply: Some(reply),
        })?;
        rx.await.map_err(|_| gone())?
    }

    /// Commits ops that bring a partition's local copy in line with its
    /// changelog: they are not mirrored back to it.
    pub(crate) async fn commit_local(&self, ops: Vec<LedgerOp>) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        self.send(LedgerMsg::CommitLocal { ops, reply })?;
        rx.await.map_err(|_| gone())?
    }

    /// Folds the intents left in the journal into the entries.
    pub(crate) async fn recover_leftover_intents(&self) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        self.send(LedgerMsg::RecoverLeftovers { reply })?;
        rx.await.map_err(|_| gone())?
    }

    /// Sends `ops` to be committed at once, without waiting: the returned
    /// receiver answers once they are durable. Commits are applied in the
    /// order they were sent.
    pub(crate) fn commit_start(&self, ops: Vec<LedgerOp>) -> Result<oneshot::Receiver<Result<()>>> {
        let (reply, rx) = oneshot::channel();
        self.commit_replying(ops, reply)?;
        Ok(rx)
    }

    /// Sends `ops` to be committed, without waiting: `reply` answers once
    /// they are durable (and is dropped unanswered if the ledger actor
    /// has stopped).
    pub(crate) fn commit_replying(
        &self,
        ops: Vec<LedgerOp>,
        reply: oneshot::Sender<Result<()>>,
    ) -> Result<()> {
        self.send(LedgerMsg::Commit {
            ops,
            reply: Some(reply),
        })
    }

    /// Waits for a commit started with [`LedgerHandle::commit_start`].
    pub(crate) async fn committed(rx: oneshot::Receiver<Result<()>>) -> Result<()> {
        rx.await.map_err(|_| gone())?
    }

    fn send(&self, msg: LedgerMsg) -> Result<()> {
        self.tx.send(msg).map_err(|_| gone())
    }
}

/// The error of a message the ledger actor was gone for.
pub(crate) fn gone() -> Error {
    Error::Shutdown("the ledger actor has stopped".into())
}

/// The running ledger actor; stopping it joins its thread.
pub(crate) struct LedgerActor {
    tx: Sender<LedgerMsg>,
    thread: Option<JoinHandle<()>>,
}

impl LedgerActor {
    pub(crate) fn start(
        ledger: Ledger,
        mirror: Option<MirrorHook>,
    ) -> Result<(LedgerActor, LedgerHandle)> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("weir-ledger".into())
            .spawn(move || {
                super::threads::run_as_batch_work();
                run(ledger, rx, mirror)
            })?;
        Ok((
            LedgerActor {
                tx: tx.clone(),
                thread: Some(thread),
            },
            LedgerHandle { tx },
        ))
    }

    /// Stops the actor after it has written everything queued, and waits.
    pub(crate) fn stop(&mut self) {
        let _ = self.tx.send(LedgerMsg::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for LedgerActor {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(ledger: Ledger, rx: Receiver<LedgerMsg>, mirror: Option<MirrorHook>) {
    let mut next_intent_id: u64 = 1;
    while let Ok(first) = rx.recv() {
        let msgs = gather(first, &rx);
        let group_started = std::time::Instant::now();
        let mut group = Group::default();
        for msg in msgs {
            match msg {
                LedgerMsg::WriteIntents { intents, reply } => {
                    let id = next_intent_id;
                    next_intent_id += 1;
                    let res = ledger.put_intents(id, &intents).map(|()| id);
                    group.intents.push((reply, res, intents));
                }
                LedgerMsg::Commit { ops, reply } => group.commits.push((ops, reply)),
                LedgerMsg::CommitLocal { ops, reply } => group.local.push((ops, reply)),
                // After what was queued before it, which it may fold.
                LedgerMsg::RecoverLeftovers { reply } => group.recoveries.push(reply),
                LedgerMsg::Shutdown => group.shutdown = true,
            }
        }
        let shutdown = group.shutdown;
        write_group(&ledger, group, mirror.as_ref(), group_started);
        if shutdown {
            break;
        }
    }
    let _ = ledger.flush();
}

/// The messages of one group, by kind.
#[derive(Default)]
struct Group {
    intents: Vec<crate::group::mirror::JournaledIntents>,
    commits: Vec<(Vec<LedgerOp>, CommitReply)>,
    local: Vec<(Vec<LedgerOp>, oneshot::Sender<Result<()>>)>,
    recoveries: Vec<oneshot::Sender<Result<()>>>,
    shutdown: bool,
}

/// Writes a group: its commits in one sled batch (or one by one, should
/// that fail), one flush, then the answers; in a worker group, the
/// answers wait for the changelog (see [`crate::group`]).
fn write_group(
    ledger: &Ledger,
    group: Group,
    mirror: Option<&MirrorHook>,
    started: std::time::Instant,
) {
    let Group {
        intents,
        commits,
        local,
        recoveries,
        ..
    } = group;
    let per_commit: Vec<Vec<PartitionId>> = match mirror {
        Some(hook) => commits
            .iter()
            .map(|(ops, _)| mirror::partitions_of(ops, &hook.member))
            .collect(),
        None => Vec::new(),
    };
    let (lists, replies): (Vec<_>, Vec<_>) = commits.into_iter().unzip();
    let (applied, touched) = apply_group(ledger, lists, mirror.is_some());
    let had_local = !local.is_empty();
    let local_applied: Vec<(oneshot::Sender<Result<()>>, Result<()>)> = local
        .into_iter()
        .map(|(ops, reply)| (reply, ledger.apply(ops)))
        .collect();
    crate::fault::point(crate::fault::LEDGER_GROUP_COMMIT);
    // Intents alone live in the journal: the store has nothing new.
    let flushed = if replies.is_empty() && !had_local {
        ledger.sync_intents()
    } else {
        ledger.flush()
    };
    // Counted before anyone is answered: a caller that reads the metrics
    // once its commit returned sees it.
    metrics::counter!(crate::metrics::LEDGER_COMMITS).increment(1);
    metrics::histogram!(crate::metrics::LEDGER_COMMIT_DURATION)
        .record(started.elapsed().as_secs_f64());
    let commit_result = |applied: Result<()>| match (applied, &flushed) {
        (Err(e), _) => Err(Error::msg(format!("ledger write failed: {e}"))),
        (_, Err(e)) => Err(Error::msg(format!("ledger flush failed: {e}"))),
        _ => Ok(()),
    };
    for (reply, applied) in local_applied {
        let _ = reply.send(commit_result(applied));
    }
    let intent_results = intents_after(intents, &flushed);
    let commit_results: Vec<_> = replies
        .into_iter()
        .zip(applied)
        .map(|(reply, applied)| (reply, commit_result(applied)))
        .collect();
    match mirror {
        Some(hook) => mirror::hand_over(
            hook,
            ledger,
            &touched,
            commit_results.into_iter().zip(per_commit).collect(),
            intent_results,
        ),
        None => answer(commit_results, intent_results),
    }
    for reply in recoveries {
        let _ = reply.send(ledger.recover_leftovers());
    }
}

/// The intents' results once the group was flushed: written intents whose
/// flush failed are not durable.
fn intents_after(
    intents: Vec<crate::group::mirror::JournaledIntents>,
    flushed: &Result<()>,
) -> Vec<crate::group::mirror::JournaledIntents> {
    intents
        .into_iter()
        .map(|(reply, res, list)| {
            let res = match (flushed, res) {
                (Err(e), Ok(_)) => Err(Error::msg(format!("ledger flush failed: {e}"))),
                (_, r) => r,
            };
            (reply, res, list)
        })
        .collect()
}

/// Answers a group's commits and intents (outside a worker group, where
/// nothing waits for a changelog).
fn answer(
    commits: Vec<(CommitReply, Result<()>)>,
    intents: Vec<crate::group::mirror::JournaledIntents>,
) {
    for (reply, res) in commits {
        if let Some(reply) = reply {
            let _ = reply.send(res);
        }
    }
    for (reply, res, _) in intents {
        let _ = reply.send(res);
    }
}

/// The messages of one group: `first`, everything queued behind it and,
/// under load (a long queue), what comes within a short window, so that
/// one flush serves more commits. A lone commit is written at once.
fn gather(first: LedgerMsg, rx: &Receiver<LedgerMsg>) -> Vec<LedgerMsg> {
    let mut msgs = vec![first];
    while msgs.len() < MAX_GROUP {
        match rx.try_recv() {
            Ok(m) => msgs.push(m),
            Err(_) => break,
        }
    }
    if msgs.len() >= BUSY_GROUP {
        let deadline = std::time::Instant::now() + GROUP_WINDOW;
        while msgs.len() < MAX_GROUP {
            match rx.recv_deadline(deadline) {
                Ok(m) => msgs.push(m),
                Err(_) => break,
            }
        }
    }
    msgs
}

/// Applies a group's commits as one sled batch; if that fails, applies
/// each commit on its own (a failed batch writes nothing), so that one
/// commit's failing op fails only that commit. One result per commit, in
/// order.
///
/// A lone commit is applied as it is. A group's ops are copied first, to
/// have them for the fallback (group commits carry many small components'
/// ops: a large component's commit usually comes alone), unless none of
/// them decodes anything stored (new components' entries, memo keys):
/// then only the store can fail the batch, and it would fail each commit
/// alike, so the ops are applied as they are and a failure fails them all.
pub(crate) fn apply_group(
    ledger: &Ledger,
    mut commits: Vec<Vec<LedgerOp>>,
    note: bool,
) -> (Vec<Result<()>>, BTreeSet<Vec<u8>>) {
    // Ops handed on as they are: a group of many commits is not gathered
    // into one list first.
    let apply = |ops: &mut dyn Iterator<Item = LedgerOp>| -> Result<BTreeSet<Vec<u8>>> {
        let mut ops = ops.peekable();
        if ops.peek().is_none() {
            Ok(BTreeSet::new())
        } else if note {
            ledger.apply_touching(ops)
        } else {
            ledger.apply(ops).map(|()| BTreeSet::new())
        }
    };
    let count = commits.len();
    if count <= 1 {
        return match apply(&mut commits.pop().unwrap_or_default().into_iter()) {
            Ok(touched) => (vec![Ok(())], touched),
            Err(e) => (vec![Err(e)], BTreeSet::new()),
        };
    }
    if commits
        .iter()
        .flatten()
        .all(LedgerOp::decodes_nothing_stored)
    {
        return each_commit(count, apply(&mut commits.into_iter().flatten()));
    }
    if let Ok(touched) = apply(&mut commits.iter().flatten().cloned()) {
        return each_commit(count, Ok(touched));
    }
    let mut touched = BTreeSet::new();
    let results = commits
        .into_iter()
        .map(|ops| apply(&mut ops.into_iter()).map(|t| touched.extend(t)))
        .collect();
    (results, touched)
}

/// The results of a group's `count` commits applied as one batch: all
/// succeed or all fail.
fn each_commit(
    count: usize,
    applied: Result<BTreeSet<Vec<u8>>>,
) -> (Vec<Result<()>>, BTreeSet<Vec<u8>>) {
    match applied {
        Ok(touched) => ((0..count).map(|_| Ok(())).collect(), touched),
        Err(e) => {
            let failed = e.to_string();
            let each = (0..count).map(|_| Err(Error::msg(failed.clone())));
            (each.collect(), BTreeSet::new())
        }
    }
}
