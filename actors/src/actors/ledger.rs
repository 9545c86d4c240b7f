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
use crate::ledger::record::{Intent, LedgerOp};
use crate::ledger::Ledger;

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
        self.send(LedgerMsg::Commit {
            ops,
            reply: Some(reply),
        })?;
        Ok(rx)
    }

    /// Waits for a commit started with [`LedgerHandle::commit_start`].
    pub(crate) async fn committed(rx: oneshot::Receiver<Result<()>>) -> Result<()> {
        rx.await.map_err(|_| gone())?
    }

    fn send(&self, msg: LedgerMsg) -> Result<()> {
        self.tx.send(msg).map_err(|_| gone())
    }
}

fn gone() -> Error {
    Error::Shutdown("the ledger actor has stopped".into())
}

/// The running ledger actor; stopping it joins its thread.
pub(crate) struct LedgerActor {
    tx: Sender<LedgerMsg>,
    thread: Option<JoinHandle<()>>,
}

impl LedgerActor {
    pub(crate) fn start(ledger: Ledger) -> Result<(LedgerActor, LedgerHandle)> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("weir-ledger".into())
            .spawn(move || run(ledger, rx))?;
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

fn run(ledger: Ledger, rx: Receiver<LedgerMsg>) {
    let mut next_intent_id: u64 = 1;
    while let Ok(first) = rx.recv() {
        let msgs = gather(first, &rx);
        let group_started = std::time::Instant::now();
        let mut shutdown = false;
        let mut intent_replies = Vec::new();
        let mut commits: Vec<(Vec<LedgerOp>, CommitReply)> = Vec::new();
        let mut recoveries = Vec::new();
        for msg in msgs {
            match msg {
                LedgerMsg::WriteIntents { intents, reply } => {
                    let id = next_intent_id;
                    next_intent_id += 1;
                    let res = ledger.put_intents(id, &intents).map(|()| id);
                    intent_replies.push((reply, res));
                }
                LedgerMsg::Commit { ops, reply } => commits.push((ops, reply)),
                // After what was queued before it, which it may fold.
                LedgerMsg::RecoverLeftovers { reply } => recoveries.push(reply),
                LedgerMsg::Shutdown => shutdown = true,
            }
        }
        let (lists, replies): (Vec<_>, Vec<_>) = commits.into_iter().unzip();
        let applied = apply_group(&ledger, lists);
        crate::fault::point(crate::fault::LEDGER_GROUP_COMMIT);
        // Intents alone live in the journal: the store has nothing new.
        let flushed = if replies.is_empty() {
            ledger.sync_intents()
        } else {
            ledger.flush()
        };
        metrics::counter!(crate::metrics::LEDGER_COMMITS).increment(1);
        metrics::histogram!(crate::metrics::LEDGER_COMMIT_DURATION)
            .record(group_started.elapsed().as_secs_f64());
        for (reply, applied) in replies.into_iter().zip(applied) {
            let res = match (applied, &flushed) {
                (Err(e), _) => Err(Error::msg(format!("ledger write failed: {e}"))),
                (_, Err(e)) => Err(Error::msg(format!("ledger flush failed: {e}"))),
                _ => Ok(()),
            };
            if let Some(reply) = reply {
                let _ = reply.send(res);
            }
        }
        for (reply, res) in intent_replies {
            let res = match (&flushed, res) {
                (Err(e), Ok(_)) => Err(Error::msg(format!("ledger flush failed: {e}"))),
                (_, r) => r,
            };
            let _ = reply.send(res);
        }
        for reply in recoveries {
            let _ = reply.send(ledger.recover_leftovers());
        }
        if shutdown {
            break;
        }
    }
    let _ = ledger.flush();
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
/// A lone commit is applied as it is; a group's ops are copied first, to
/// have them for the fallback (group commits carry many small components'
/// ops: a large component's commit usually comes alone).
pub(crate) fn apply_group(ledger: &Ledger, mut commits: Vec<Vec<LedgerOp>>) -> Vec<Result<()>> {
    let count = commits.len();
    if count <= 1 {
        let ops = commits.pop().unwrap_or_default();
        return vec![if ops.is_empty() {
            Ok(())
        } else {
            ledger.apply(ops)
        }];
    }
    let all: Vec<LedgerOp> = commits.iter().flatten().cloned().collect();
    if all.is_empty() || ledger.apply(all).is_ok() {
        return (0..count).map(|_| Ok(())).collect();
    }
    commits
        .into_iter()
        .map(|ops| {
            if ops.is_empty() {
                Ok(())
            } else {
                ledger.apply(ops)
            }
        })
        .collect()
}
