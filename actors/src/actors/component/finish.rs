//! What a component does once its code returns: reconcile, apply, commit.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::actors::ledger::gone;
use crate::actors::sink::{PlannedAction, SinkGroups, UnitWaiter};
use crate::actors::tasks::free_elsewhere;
use crate::error::{Error, Result};
use crate::ledger::digest::Digest;
use crate::ledger::record::LedgerOp;
use crate::model::action::ActionCounts;
use crate::model::sink::EncodedAction;
use crate::run::PreviewAction;
use crate::sync::lock;

use super::failed::{mounted_children_op, record_failure};
use super::records::{
    children_change, full_intent, intent_for, is_refresh, note_children_and_orphans,
    removes_children, success_records, SuccessRecords,
};
use super::unchanged;
use super::waves::{reconcile_waves, Outcomes, Reconciliation};
use super::{ComponentState, Declaration, Early, Seen};

/// Reconciles, applies and commits what the component declared.
pub(super) async fn finish(state: &Arc<ComponentState>) -> Result<()> {
    let run = &state.run;
    let (mut decls, paths, errors, early) = take_declarations(state);
    let digest = unchanged::digest(state, &decls, &early);
    let reconciled = match errors.first() {
        Some(first) => Err(Error::Usage(first.clone())),
        None if digest.is_some_and(|d| unchanged::is_unchanged(state, d)) => {
            return finish_unchanged(state, &decls).await;
        }
        None => reconcile_waves(state, &mut decls, paths, early).await,
    };
    let mut reconciled = match reconciled {
        Ok(r) => r,
        Err(e) => {
            state.leave_activity();
            record_failure(state, &e).await;
            return Err(e);
        }
    };
    if let Some(group) = run.group.as_ref().filter(|_| state.is_group_root()) {
        reconciled.prev_children =
            crate::group::run::held_root_children(&run.engine, &group.holding).await?;
    }
    if state.read_only_root() && !run.preview {
        return finish_read_only_root(state, &decls, reconciled);
    }
    if run.preview {
        note_preview(state, &decls, &reconciled.results);
        note_children_and_orphans(state, &reconciled.prev_children, reconciled.orphans);
        return Ok(());
    }
    let Applied {
        failure,
        attempted,
        committed,
    } = if reconciled.results.len() == 0 {
        // Every declaration found unchanged: nothing to dispatch or wait for.
        Applied::default()
    } else {
        apply_waves(state, &decls, &mut reconciled).await
    };
    state.leave_activity();
    if let Some(err) = failure {
        let ops = failed_apply_ops(
            state,
            &decls,
            &reconciled.results,
            &attempted,
            err.to_string(),
        );
        run.engine.ledger_handle.commit(ops).await?;
        return Err(err);
    }
    let commit = match committed {
        Some(done) => done?,
        None => {
            let commit = success_commit(state, &decls, &reconciled)?;
            commit_now(state, commit).await?
        }
    };
    after_commit(state, decls, reconciled, &commit, digest);
    Ok(())
}

/// Commits a component with no action to wait for, at once.
async fn commit_now(state: &ComponentState, mut commit: SuccessCommit) -> Result<SuccessCommit> {
    commit_final(state, std::mem::take(&mut commit.ops)).await?;
    Ok(commit)
}

/// Sends the component's final commit from its task and waits until it
/// is durable.
async fn commit_final(state: &ComponentState, ops: Vec<LedgerOp>) -> Result<()> {
    let (reply, written) = oneshot::channel();
    if !send_final(state, ops, reply) {
        // Only its cancel guard sends first, once the task is dropped.
        return Err(Error::Cancelled(state.path.clone()));
    }
    written.await.map_err(|_| gone())?
}

/// Sends the component's final commit, unless its failure was sent (it
/// was cancelled); `reply` answers once it is durable, and is dropped
/// unanswered if it was not sent or the ledger has stopped. Returns
/// whether it was sent. With no ops there is nothing to send: `reply`
/// answers at once.
fn send_final(
    state: &ComponentState,
    ops: Vec<LedgerOp>,
    reply: oneshot::Sender<Result<()>>,
) -> bool {
    if ops.is_empty() {
        let _ = reply.send(Ok(()));
        return true;
    }
    let ledger = &state.run.engine.ledger_handle;
    state.final_commit.send_once(|| {
        let _ = ledger.commit_replying(ops, reply);
    })
}

/// What follows a component's successful commit: it is counted, what the
/// end of the run deletes is noted, and the digest of its declarations is
/// recorded when nothing is left pending (see [`unchanged`]).
fn after_commit(
    state: &ComponentState,
    decls: Vec<Declaration>,
    reconciled: Reconciliation,
    commit: &SuccessCommit,
    digest: Option<Digest>,
) {
    count_success(state, commit);
    let Reconciliation {
        results,
        orphans,
        prev_children,
        ..
    } = reconciled;
    let pending = !orphans.is_empty() || !prev_children.is_empty();
    unchanged::record(state, digest, pending);
    note_children_and_orphans(state, &prev_children, orphans);
    // A large component's declarations and outcomes take 11-15 ms per
    // 100k states to free (a first load, measured with `postgres_sync`).
    free_elsewhere(&state.run.engine.user, decls.len(), (decls, results));
}

/// Finishes a component found unchanged (see [`unchanged`]): it claims its
/// states for this run, counts them unchanged, and records its memo key if
/// it has one.
async fn finish_unchanged(state: &ComponentState, decls: &[Declaration]) -> Result<()> {
    let claimed = unchanged::claim(state, decls);
    state.leave_activity();
    if let Err(e) = claimed {
        record_failure(state, &e).await;
        return Err(e);
    }
    let run = &state.run;
    run.counters
        .unchanged
        .fetch_add(decls.len() as u64, Ordering::Relaxed);
    state.found_unchanged.store(true, Ordering::Relaxed);
    if let Some(memo) = memo_op(state, false, false) {
        commit_final(state, vec![memo]).await?;
    }
    Ok(())
}

/// The component's declarations, the paths kept to refuse duplicates,
/// the errors its declarations met, and what it sent early; counted.
fn take_declarations(state: &ComponentState) -> (Vec<Declaration>, Seen, Vec<String>, Early) {
    let taken = {
        let mut d = lock(&state.decls);
        (
            std::mem::take(&mut d.list),
            std::mem::take(&mut d.paths),
            std::mem::take(&mut d.errors),
            std::mem::take(&mut d.early),
        )
    };
    state
        .run
        .metrics
        .declarations
        .increment(taken.0.len() as u64);
    state.note_declared(taken.0.len());
    taken
}

/// In a member that does not hold the root partition, a root component
/// applies nothing: it fails while the holder has not applied what it
/// declares (see [`root_actions_pending`]).
fn finish_read_only_root(
    state: &ComponentState,
    decls: &[Declaration],
    reconciled: Reconciliation,
) -> Result<()> {
    state.leave_activity();
    let orphans = reconciled.orphans.len();
    if let Some(detail) = root_actions_pending(state, decls, &reconciled.results, orphans) {
        return Err(Error::RootPending {
            group: state.run.engine.group_name().unwrap_or_default(),
            detail,
        });
    }
    note_children_and_orphans(state, &reconciled.prev_children, Vec::new());
    Ok(())
}

/// A successful component's commit, worked out before it is sent, and
/// what is counted once it is durable.
struct SuccessCommit {
    /// Its final records, ownership moves, children, failure note and
    /// memo key.
    ops: Vec<LedgerOp>,
    /// Declarations found unchanged, by the shards or by the records.
    unchanged: u64,
    /// Actions applied, by kind.
    actions: ActionCounts,
    /// Its memo key waits for the end of the run (see [`defer_memo`]).
    defer_memo: bool,
}

/// The commit of a component whose actions all land: its records, its
/// new children, the end of its last failure, its memo key. Pure: nothing
/// is counted or written here (see [`count_success`]).
fn success_commit(
    state: &ComponentState,
    decls: &[Declaration],
    reconciled: &Reconciliation,
) -> Result<SuccessCommit> {
    let SuccessRecords {
        mut ops,
        unchanged,
        actions,
    } = success_records(state, decls, &reconciled.results, reconciled.fresh)?;
    let prev_children = &reconciled.prev_children;
    let own = || state.key.to_vec();
    if let Some(children) = children_change(state, prev_children).filter(|_| !state.is_group_root())
    {
        ops.push(LedgerOp::AddChildren {
            component: own(),
            children,
        });
    }
    if reconciled.prev_failure.is_some() {
        ops.push(LedgerOp::SetFailure {
            component: own(),
            failure: None,
        });
    }
    let orphans = !reconciled.orphans.is_empty();
    let removes = removes_children(state, prev_children);
    let changed = !ops.is_empty();
    ops.extend(memo_op(state, orphans || removes, changed));
    Ok(SuccessCommit {
        ops,
        unchanged: unchanged + reconciled.unchanged,
        actions,
        defer_memo: orphans && !removes,
    })
}

/// Counts a committed component's states and actions; keeps its memo key
/// for the end of the run if its orphans' deletes are all it waits for.
fn count_success(state: &ComponentState, commit: &SuccessCommit) {
    let counters = &state.run.counters;
    counters
        .unchanged
        .fetch_add(commit.unchanged, Ordering::Relaxed);
    for (kind, n) in commit.actions.counted() {
        counters.count_action(kind, n);
    }
    if commit.defer_memo {
        defer_memo(state);
    }
}

/// What applying a component's waves came to.
#[derive(Default)]
struct Applied {
    /// The first failure, which stopped the waves.
    failure: Option<Error>,
    /// The declarations whose actions were dispatched (refreshes aside).
    attempted: Vec<usize>,
    /// The commit sent once the last wave landed (its counts, or why it
    /// could not be worked out or written); `None` if a wave failed.
    committed: Option<Result<SuccessCommit>>,
}

/// Applies the actions of `waves` wave by wave (containers before their
/// children), a batch of actions at a time.
async fn apply_waves(
    state: &Arc<ComponentState>,
    decls: &[Declaration],
    reconciled: &mut Reconciliation,
) -> Applied {
    let run = &state.run;
    let waves = std::mem::take(&mut reconciled.waves);
    let fresh = reconciled.fresh;
    let waiter = UnitWaiter::in_partition(run.partition_of(&state.key));
    let mut out = Applied::default();
    // A large wave goes to the sinks a batch at a time, so that the first
    // sink calls start while the rest is being planned.
    let batch = run.engine.config.batch.max_actions.max(1);
    for (w, wave) in waves.iter().enumerate() {
        // A fresh component has an action for every state: its sink
        // group starts with room for a batch of them. Another's waves
        // hold its unchanged states too, so its groups grow as needed.
        let room = |left: usize| if fresh { left.min(batch) } else { 0 };
        let mut groups = SinkGroups::with_room(room(wave.len()));
        for (n, &i) in wave.iter().enumerate() {
            let (Some(r), Some(d)) = (reconciled.results.get_mut(i), decls.get(i)) else {
                continue;
            };
            let typed = r.output_mut().and_then(|o| o.typed.take());
            let r = &*r;
            let Some(out_action) = r.output() else {
                continue;
            };
            // A container's refresh is applied like any action: its sink
            // is called on every run that returns one (it needs no intent:
            // its records do not change, and it counts as unchanged).
            let refresh = is_refresh(d, r);
            let planned = PlannedAction {
                action: EncodedAction {
                    kind: out_action.kind,
                    bytes: Arc::clone(&out_action.action),
                    typed,
                },
                key: d.key.clone(),
                intent: intent_for(state, d, r),
                refresh,
            };
            groups.add(
                &out_action.sink,
                &d.provider.path.name,
                &d.provider.path.root,
                planned,
            );
            if !refresh {
                out.attempted.push(i);
            }
            if groups.len() >= batch {
                let left = wave.len() - n - 1;
                std::mem::replace(&mut groups, SinkGroups::with_room(room(left)))
                    .dispatch(run, &waiter);
            }
        }
        groups.dispatch(run, &waiter);
        state.leave_activity();
        if w + 1 == waves.len() {
            // Worked out while the sinks apply the last wave, sent by the
            // one that lands its last action. Handed over only now that
            // every batch of the wave is dispatched: between two batches
            // the unit's pending count may touch zero.
            let commit = success_commit(state, decls, reconciled);
            return commit_on_landing(state, &waiter, commit, out).await;
        }
        out.failure = waiter.wait().await;
        if out.failure.is_some() {
            break;
        }
    }
    out
}

/// Hands a component's commit to the sinks applying its last wave: the
/// one that acknowledges its last action sends it to the ledger, and the
/// component is woken once, when it is durable or when an action failed.
async fn commit_on_landing(
    state: &Arc<ComponentState>,
    waiter: &UnitWaiter,
    commit: Result<SuccessCommit>,
    mut out: Applied,
) -> Applied {
    let mut commit = match commit {
        Ok(commit) => commit,
        Err(e) => {
            out.failure = waiter.wait().await;
            out.committed = Some(Err(e));
            return out;
        }
    };
    let ops = std::mem::take(&mut commit.ops);
    let (reply, written) = oneshot::channel();
    let component = Arc::clone(state);
    waiter.on_landed(Box::new(move || {
        send_final(&component, ops, reply);
    }));
    match written.await {
        Ok(result) => out.committed = Some(result.map(|()| commit)),
        // Not landed: why (or the ledger had stopped).
        Err(_) => match waiter.wait().await {
            Some(failure) => out.failure = Some(failure),
            None => out.committed = Some(Err(gone())),
        },
    }
    out
}

/// Keeps the memo key of a successful component whose only pending work is
/// deleting the states it no longer declares: the end of the run records
/// it once those deletes have succeeded (see
/// [`Run::take_deferred_memo`](crate::run::Run::take_deferred_memo)).
fn defer_memo(state: &ComponentState) {
    if let Some(memo) = state.memo.get() {
        state.run.defer_memo(state.key.to_vec(), memo.clone());
    }
}

/// The change to a successful component's memo key, if any. States it no
/// longer declares, and children it no longer mounts (`pending`), are
/// deleted only at the end of the run: until that has happened, its memo
/// key does not describe what exists, so it is not recorded (the next run
/// runs the component again and records it). Run without a memo key, a
/// component that changed anything (`changed`, or `pending`) forgets the
/// one an earlier run recorded, which no longer describes it.
fn memo_op(state: &ComponentState, pending: bool, changed: bool) -> Option<LedgerOp> {
    let memo = match state.memo.get() {
        Some(memo) => (!pending).then(|| memo.clone()),
        None if pending || changed => None,
        None => return None,
    };
    Some(LedgerOp::SetMemo {
        component: state.key.to_vec(),
        memo,
    })
}

/// After a failed apply, what to commit: the intents of the actions
/// attempted folded in as possible records, the failure and the children
/// mounted. Notes the containers among the declarations as failed in this
/// run (their children keep their records, and may be missing).
fn failed_apply_ops(
    state: &ComponentState,
    decls: &[Declaration],
    results: &Outcomes,
    attempted: &[usize],
    cause: String,
) -> Vec<LedgerOp> {
    let run = &state.run;
    let mut ops: Vec<LedgerOp> = attempted
        .iter()
        .filter_map(|&i| {
            let r = results.get(i)?;
            let d = decls.get(i)?;
            Some(LedgerOp::Fold(
                intent_for(state, d, r).unwrap_or_else(|| full_intent(state, d, r)),
            ))
        })
        .collect();
    ops.push(LedgerOp::SetFailure {
        component: state.key.to_vec(),
        failure: Some(cause),
    });
    ops.extend(mounted_children_op(state));
    for (i, r) in results.iter() {
        if let Some(d) = decls.get(i).filter(|d| d.child.is_some()) {
            let committed = r
                .prev
                .as_ref()
                .and_then(|p| p.child_gen)
                .unwrap_or_default();
            run.note_failed_container(&d.path, committed);
        }
    }
    ops
}

/// In a preview: the actions the component's declarations would take
/// (a container's refresh is none).
fn note_preview(state: &ComponentState, decls: &[Declaration], results: &Outcomes) {
    let run = &state.run;
    let mut preview = lock(&run.preview_actions);
    for (i, r) in results.iter() {
        if let (Some(out), Some(d)) = (r.output(), decls.get(i)) {
            if is_refresh(d, r) {
                continue;
            }
            preview.push(PreviewAction {
                provider: d.provider.path.name.to_string(),
                key: d.key.clone(),
                kind: out.kind,
                component: state.path.clone(),
            });
        }
    }
}

/// In a member that does not hold the root partition: what the
/// component's declarations of root states would need done against the
/// holder's records (`None`: nothing; a container's refresh is nothing).
fn root_actions_pending(
    state: &ComponentState,
    decls: &[super::Declaration],
    results: &Outcomes,
    orphans: usize,
) -> Option<String> {
    let needed: Vec<String> = results
        .iter()
        .filter_map(|(i, r)| {
            let d = decls.get(i)?;
            let out = r.output()?;
            (!is_refresh(d, r)).then(|| {
                format!(
                    "{} {} of {}",
                    out.kind.as_str(),
                    d.key,
                    d.provider.path.name
                )
            })
        })
        .take(3)
        .collect();
    match (needed.is_empty(), orphans) {
        (true, 0) => None,
        (true, n) => Some(format!(
            "component {} no longer declares {n} root state(s)",
            state.path
        )),
        (false, _) => Some(format!(
            "component {} declares root states that need an action ({})",
            state.path,
            needed.join(", ")
        )),
    }
}
