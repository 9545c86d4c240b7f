//! The end of a run: deleting what is no longer declared.
//!
//! States a successful component stopped declaring, and every state of a
//! component no longer mounted, are deleted once all components of the run
//! have finished, so that a state that moved to another component in the
//! same run is recognised as one state and not deleted. Only the topmost
//! of nested orphans is reconciled: deleting a container drops the records
//! of everything below it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tokio::sync::oneshot;

use super::ledger::LedgerHandle;
use super::reconciler::{
    shard_of, shard_stopped, FilterOrphans, Orphan, OrphanOutcome, ReconcileOrphans,
};
use super::sink::{PlannedAction, SinkGroups, UnitWaiter};
use crate::error::{ComponentFailure, Error, Result};
use crate::ledger::record::{Intent, LedgerOp};
use crate::ledger::{buf, Ledger};
use crate::model::erased::ErasedOutput;
use crate::model::keycode;
use crate::model::provider::{ChildGeneration, ProviderCore};
use crate::model::sink::EncodedAction;
use crate::model::{ComponentPath, StableKey};
use crate::run::{lock, PreviewAction, Run};

/// Reads the states of removed components and of everything below them.
fn expand_removed(
    ledger: &Ledger,
    roots: Vec<ComponentPath>,
) -> Result<(Vec<ComponentPath>, Vec<Orphan>)> {
    let mut removed = Vec::new();
    let mut orphans = Vec::new();
    let mut queue = roots;
    while let Some(path) = queue.pop() {
        let key: Arc<[u8]> = Arc::from(keycode::component_key(path.segments()));
        for child in ledger.children(&key)? {
            queue.push(path.child(child));
        }
        if let Some(entry) = ledger.component(&key)? {
            for state in entry.states {
                orphans.push(Orphan {
                    component: Arc::clone(&key),
                    component_path: path.clone(),
                    entry: state,
                });
            }
        }
        removed.push(path);
    }
    Ok((removed, orphans))
}

/// Deletes the run's orphans and forgets removed components.
pub(crate) async fn finish_run(run: &Arc<Run>) -> Result<()> {
    let roots = std::mem::take(&mut *lock(&run.removed));
    let ledger = run.engine.ledger.clone();
    let (removed, mut orphans) = run
        .engine
        .user
        .spawn_blocking(move || expand_removed(&ledger, roots))
        .await
        .map_err(|e| Error::Shutdown(format!("reading removed components failed: {e}")))??;
    orphans.extend(std::mem::take(&mut *lock(&run.orphans)));

    let survivors = filter_declared(run, orphans).await?;
    let top = topmost(survivors);
    let outcomes = reconcile_orphans(run, top).await?;

    let mut ops: Vec<LedgerOp> = Vec::new();
    if run.preview {
        let mut preview = lock(&run.preview_actions);
        for (orphan, provider, key, result) in &outcomes {
            if let Ok(Some(out)) = result {
                preview.push(PreviewAction {
                    provider: provider.path.name.to_string(),
                    key: key.clone(),
                    kind: out.kind,
                    component: orphan.component_path.clone(),
                });
            }
        }
        return Ok(());
    }

    // Group deletes into units by the component that owned them.
    let mut units: BTreeMap<Vec<u8>, Unit> = BTreeMap::new();
    for (orphan, provider, key, result) in outcomes {
        // Most orphans find their unit there already: a lookup, then, not
        // a new key.
        let unit = match units.get_mut(&*orphan.component) {
            Some(unit) => unit,
            None => units
                .entry(orphan.component.to_vec())
                .or_insert_with(|| Unit {
                    path: orphan.component_path.clone(),
                    items: Vec::new(),
                    error: None,
                }),
        };
        match result {
            Err(e) => {
                unit.error.get_or_insert(e);
            }
            Ok(out) => unit.items.push((orphan, provider, key, out)),
        }
    }
    run.activity.enter();
    let mut waiting: HashMap<Vec<u8>, UnitWaiter> = HashMap::new();
    for (component, unit) in &units {
        if unit.error.is_some() {
            continue;
        }
        let waiter = UnitWaiter::new();
        let mut groups = SinkGroups::default();
        for (orphan, provider, key, out) in &unit.items {
            let Some(out) = out else { continue };
            let planned = PlannedAction {
                action: EncodedAction {
                    kind: out.kind,
                    bytes: Arc::clone(&out.action),
                    typed: None,
                },
                key: key.clone(),
                intent: (!orphan.entry.may_be_missing).then(|| delete_intent(orphan)),
                refresh: false,
            };
            groups.add(&out.sink, &provider.path.name, &provider.path.root, planned);
        }
        groups.dispatch(run, &waiter);
        waiting.insert(component.clone(), waiter);
    }
    run.activity.leave();

    // Each unit is committed as soon as its deletions are done, so that a
    // crash later in the run does not make the next run repeat them.
    let mut commits = Vec::new();
    for (component, unit) in units {
        let failure = match (unit.error, waiting.remove(&component)) {
            (Some(e), _) => Some(e),
            (None, Some(waiter)) => waiter.wait().await,
            (None, None) => None,
        };
        let mut unit_ops = Vec::new();
        match failure {
            None => {
                for (orphan, _, _, out) in unit.items {
                    if let Some(out) = &out {
                        run.counters.count_action(out.kind, 1);
                    }
                    unit_ops.push(LedgerOp::Remove {
                        component: component.clone(),
                        path: orphan.entry.path.to_vec(),
                    });
                    if orphan.entry.child_gen.is_some() {
                        unit_ops.push(LedgerOp::DropDescendants {
                            path: orphan.entry.path.to_vec(),
                        });
                    }
                }
            }
            Some(err) => {
                for (orphan, _, _, out) in unit.items {
                    if out.is_some() {
                        unit_ops.push(LedgerOp::Fold(delete_intent(&orphan)));
                    }
                }
                unit_ops.push(LedgerOp::SetFailure {
                    component: component.clone(),
                    failure: Some(err.to_string()),
                });
                run.fail(ComponentFailure::new(
                    unit.path.clone(),
                    &Error::Usage(format!(
                        "deleting target states it no longer declares failed: {err}"
                    )),
                ));
            }
        }
        if !unit_ops.is_empty() {
            commits.push(run.engine.ledger_handle.commit_start(unit_ops)?);
        }
    }
    for commit in commits {
        LedgerHandle::committed(commit).await?;
    }
    // Children were found after their parents: forget them first.
    {
        let mut declared_last = lock(&run.engine.declared_last);
        for path in removed.into_iter().rev() {
            let parent = path.parent().and_then(|p| {
                let key = path.segments().last()?.clone();
                Some((keycode::component_key(p.segments()), key))
            });
            let component = keycode::component_key(path.segments());
            declared_last.remove(component.as_slice());
            ops.push(LedgerOp::RemoveComponent { component, parent });
        }
    }
    // A cancelled component left intents of calls that may still be
    // going, and commits nothing for them: the journal keeps them for the
    // next run to fold in.
    if !run.had_cancelled() {
        for id in std::mem::take(&mut *lock(&run.intent_ids)) {
            ops.push(LedgerOp::DeleteIntents { id });
        }
    }
    if !ops.is_empty() {
        run.engine.ledger_handle.commit(ops).await?;
    }
    Ok(())
}

struct Unit {
    path: ComponentPath,
    items: Vec<(Orphan, Arc<ProviderCore>, StableKey, Option<ErasedOutput>)>,
    error: Option<Error>,
}

fn delete_intent(orphan: &Orphan) -> Intent {
    Intent {
        component: buf(&orphan.component),
        path: orphan.entry.path.clone(),
        record: None,
        gen: orphan.entry.gen,
        child_gen: orphan.entry.child_gen,
        container: None,
    }
}

/// Drops orphans that some component declared in this run: they moved.
async fn filter_declared(run: &Run, orphans: Vec<Orphan>) -> Result<Vec<Orphan>> {
    if orphans.is_empty() {
        return Ok(orphans);
    }
    let shards = &run.engine.shards;
    let n = shards.len();
    let mut per_shard: Vec<Vec<Orphan>> = (0..n).map(|_| Vec::new()).collect();
    for o in orphans {
        if let Some(v) = per_shard.get_mut(shard_of(&o.entry.path, n)) {
            v.push(o);
        }
    }
    let mut replies = Vec::new();
    for (s, orphans) in per_shard.into_iter().enumerate() {
        if orphans.is_empty() {
            continue;
        }
        let (tx, rx) = oneshot::channel();
        shards[s].do_send(FilterOrphans {
            run_id: run.id,
            orphans,
            reply: tx,
        });
        replies.push(rx);
    }
    let mut kept = Vec::new();
    for rx in replies {
        kept.extend(rx.await.map_err(shard_stopped)?);
    }
    Ok(kept)
}

/// Keeps only orphans with no orphan above them: a deleted container takes
/// care of its children and attachments.
fn topmost(mut orphans: Vec<Orphan>) -> Vec<Orphan> {
    orphans.sort_by(|a, b| a.entry.path.cmp(&b.entry.path));
    let mut out: Vec<Orphan> = Vec::with_capacity(orphans.len());
    for o in orphans {
        if let Some(last) = out.last() {
            if o.entry.path == last.entry.path || keycode::is_below(&o.entry.path, &last.entry.path)
            {
                continue;
            }
        }
        out.push(o);
    }
    out
}

/// An orphan's provider, with the generation its records are judged by
/// when its container failed in this run.
type OrphanProvider = (Arc<ProviderCore>, Option<ChildGeneration>);

/// Reconciles orphans with `desired = None` on their shards. Orphans whose
/// provider was not registered in this run are left in place.
///
/// The outcomes keep the orphans' order (sorted by path, so by key within
/// a provider) rather than coming shard by shard: a sink call then takes a
/// range of keys, not a share of every range. Deleting one row in ten of a
/// SQLite table in three calls rewrote most of its pages three times.
async fn reconcile_orphans(run: &Run, orphans: Vec<Orphan>) -> Result<Vec<OrphanOutcome>> {
    let shards = &run.engine.shards;
    let n = shards.len();
    let count = orphans.len();
    // Per shard: what is sent, and, in the same order, each one's position
    // among the orphans.
    let mut per_shard: Vec<(Vec<_>, Vec<usize>)> = (0..n).map(|_| Default::default()).collect();
    // Sorted by path, orphans come provider by provider: the last one's
    // provider path, provider and generation serve the next while its path
    // is that provider path and a key.
    let mut last: Option<(Vec<u8>, Option<OrphanProvider>)> = None;
    for (position, o) in orphans.into_iter().enumerate() {
        let path = &o.entry.path;
        let below_last = last
            .as_ref()
            .and_then(|(enc, found)| keycode::key_below(path, enc).map(|key| (found.clone(), key)));
        let (found, key) = match below_last {
            Some(same) => same,
            None => {
                let Some((provider_enc, key)) = keycode::split_state_path(path) else {
                    continue;
                };
                let found = run.provider(provider_enc).map(|provider| {
                    let trusted = run.trusted_generation(&provider);
                    (provider, trusted)
                });
                last = Some((provider_enc.to_vec(), found.clone()));
                (found, key)
            }
        };
        let Some((provider, trusted)) = found else {
            continue;
        };
        if let Some((sent, back)) = per_shard.get_mut(shard_of(&o.entry.path, n)) {
            back.push(position);
            sent.push((o, provider, key, trusted));
        }
    }
    let mut replies = Vec::new();
    for (s, (orphans, back)) in per_shard.into_iter().enumerate() {
        if orphans.is_empty() {
            continue;
        }
        let (tx, rx) = oneshot::channel();
        shards[s].do_send(ReconcileOrphans { orphans, reply: tx });
        replies.push((back, rx));
    }
    let mut out: Vec<Option<OrphanOutcome>> = (0..count).map(|_| None).collect();
    for (back, rx) in replies {
        let outcomes = rx.await.map_err(shard_stopped)?;
        for (outcome, position) in outcomes.into_iter().zip(back) {
            if let Some(slot) = out.get_mut(position) {
                *slot = Some(outcome);
            }
        }
    }
    Ok(out.into_iter().flatten().collect())
}
