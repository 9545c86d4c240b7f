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

use super::component::{guarded, resolve_provider};
use super::ledger::LedgerHandle;
use super::reconciler::{
    shard_of, shard_stopped, FilterOrphans, Orphan, OrphanOutcome, ReconcileOrphans,
};
use super::sink::{PlannedAction, SinkGroups, UnitWaiter};
use crate::error::{ComponentFailure, Error, Result};
use crate::ledger::record::{Intent, LedgerOp};
use crate::ledger::Ledger;
use crate::model::erased::ErasedOutput;
use crate::model::keycode;
use crate::model::provider::ProviderPath;
use crate::model::provider::{ChildGeneration, ProviderCore};
use crate::model::sink::EncodedAction;
use crate::model::{ActionKind, ComponentPath, StableKey};
use crate::run::{PreviewAction, Run};
use crate::sync::lock;

/// Reads the states of removed components and of everything below them.
fn expand_removed(
    ledger: &Ledger,
    roots: Vec<ComponentPath>,
) -> Result<(Vec<ComponentPath>, Vec<Orphan>)> {
    let mut removed = Vec::new();
    let mut orphans = Vec::new();
    let mut queue = roots;
    while let Some(path) = queue.pop() {
        let key = keycode::component_key_shared(path.segments());
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
///
/// In `drop_state`, every state is deleted, including those below
/// containers whose delete leaves their contents (a table the user owns):
/// their children are deleted one by one first ([`abandoned_children`]).
/// A state whose provider the `drop_state` call did not register is left
/// tracked, and named in the error.
pub(crate) async fn finish_run(run: &Arc<Run>) -> Result<()> {
    let (removed, orphans) = gather_orphans(run).await?;
    let survivors = filter_declared(run, orphans).await?;
    let (top, below) = split_topmost(survivors);
    let unregistered = unregistered_providers(run, &top);
    let outcomes = reconcile_orphans(run, top).await?;
    let (children, outcomes) = if run.dropping {
        abandoned_children(run, outcomes, below).await?
    } else {
        (Vec::new(), outcomes)
    };
    if run.preview {
        note_preview(run, children.iter().chain(&outcomes));
        return Ok(());
    }
    let contents_deleted = children.is_empty() || apply_orphans(run, children).await?;
    let outcomes = if contents_deleted {
        outcomes
    } else {
        // Some contents could not be deleted: their containers stay.
        outcomes
            .into_iter()
            .filter(|(o, _, _, _)| o.entry.child_gen.is_none())
            .collect()
    };
    apply_orphans(run, outcomes).await?;
    forget_removed(run, removed).await?;
    match unregistered {
        Some(err) if run.dropping => Err(err),
        _ => Ok(()),
    }
}

/// The states of the run's removed components (and everything below
/// them), and those its components no longer declare.
async fn gather_orphans(run: &Run) -> Result<(Vec<ComponentPath>, Vec<Orphan>)> {
    let roots = std::mem::take(&mut *lock(&run.removed));
    let ledger = run.engine.ledger.clone();
    let (removed, mut orphans) = run
        .engine
        .user
        .spawn_blocking(move || expand_removed(&ledger, roots))
        .await
        .map_err(|e| Error::Shutdown(format!("reading removed components failed: {e}")))??;
    orphans.extend(std::mem::take(&mut *lock(&run.orphans)));
    Ok((removed, orphans))
}

/// Lists the actions of a preview.
fn note_preview<'a>(run: &Run, outcomes: impl Iterator<Item = &'a OrphanOutcome>) {
    let mut preview = lock(&run.preview_actions);
    for (orphan, provider, key, result) in outcomes {
        if let Ok(Some(out)) = result {
            preview.push(PreviewAction {
                provider: provider.path.name.to_string(),
                key: key.clone(),
                kind: out.kind,
                component: orphan.component_path.clone(),
            });
        }
    }
}

/// The error naming the providers of orphans that no provider registered
/// in this run can delete (they stay tracked), if there are any.
fn unregistered_providers(run: &Run, orphans: &[Orphan]) -> Option<Error> {
    let mut missing: BTreeMap<String, usize> = BTreeMap::new();
    for o in orphans {
        let Some((enc, _)) = keycode::split_state_path(&o.entry.path) else {
            continue;
        };
        if run.provider(enc).is_none() {
            let name = ProviderPath::name_of(enc).unwrap_or_else(|| "(undecodable)".into());
            *missing.entry(name).or_default() += 1;
        }
    }
    if missing.is_empty() {
        return None;
    }
    let list: Vec<String> = missing
        .iter()
        .map(|(name, n)| format!("{name} ({n} state(s))"))
        .collect();
    Some(Error::Usage(format!(
        "target states of provider(s) {} were not deleted, since this run did not register them (their handlers are needed to delete them): register them in the drop_state call and run it again; they stay tracked meanwhile",
        list.join(", ")
    )))
}

/// In `drop_state`: for each container whose delete leaves its contents
/// (no destructive invalidation: a table the user owns), resolves its
/// child handler from the delete action and reconciles the states below
/// it with `None`, at every depth. Returns those outcomes, to apply first,
/// and the outcomes given.
async fn abandoned_children(
    run: &Run,
    outcomes: Vec<OrphanOutcome>,
    mut below: Vec<Orphan>,
) -> Result<(Vec<OrphanOutcome>, Vec<OrphanOutcome>)> {
    let mut children: Vec<OrphanOutcome> = Vec::new();
    let mut inside = take_abandoned_contents(run, &outcomes, &mut below)?;
    while !inside.is_empty() {
        let (top, deeper) = split_topmost(inside);
        below.extend(deeper);
        let level = reconcile_orphans(run, top).await?;
        inside = take_abandoned_contents(run, &level, &mut below)?;
        children.extend(level);
    }
    // Deepest first: a container's contents before the container.
    children.reverse();
    Ok((children, outcomes))
}

/// Takes from `below` the states below each container of `level` whose
/// delete leaves its contents, once its child handler is resolved.
fn take_abandoned_contents(
    run: &Run,
    level: &[OrphanOutcome],
    below: &mut Vec<Orphan>,
) -> Result<Vec<Orphan>> {
    let mut inside = Vec::new();
    for (orphan, provider, key, result) in level {
        if below.is_empty() || !resolve_abandoned(run, orphan, provider, key, result)? {
            continue;
        }
        let (under, rest): (Vec<Orphan>, Vec<Orphan>) = std::mem::take(below)
            .into_iter()
            .partition(|o| keycode::is_below(&o.entry.path, &orphan.entry.path));
        *below = rest;
        inside.extend(under);
    }
    Ok(inside)
}

/// Whether `orphan` is a container whose delete leaves its contents (no
/// destructive invalidation); if so, resolves the provider of its children
/// with the handler its sink's factory builds from the delete action.
fn resolve_abandoned(
    run: &Run,
    orphan: &Orphan,
    provider: &Arc<ProviderCore>,
    key: &StableKey,
    result: &Result<Option<ErasedOutput>>,
) -> Result<bool> {
    let Ok(Some(out)) = result else {
        return Ok(false);
    };
    let Some(child_gen) = orphan.entry.child_gen else {
        return Ok(false);
    };
    if out.kind != ActionKind::Delete || out.child_invalidation.is_some() {
        return Ok(false);
    }
    let Some(factory) = out.sink.child_handler.as_ref() else {
        return Ok(false);
    };
    let wrap = |cause: Error| {
        Error::Reconcile {
        provider: provider.path.name.to_string(),
        key: key.clone(),
        cause: Box::new(Error::Usage(format!(
            "its contents must be deleted one by one, but its sink's child-handler factory failed on its delete action: {cause}"
        ))),
    }
    };
    let def = guarded(|| factory(&out.action)).map_err(wrap)?;
    let core = Arc::new(ProviderCore::new(provider.path.child(key), run.id));
    resolve_provider(run, &core, def.handler, child_gen)?;
    Ok(true)
}

/// Applies the deletes of `outcomes`, grouped in units by the component
/// that owned the states, each committed as soon as its deletes are done
/// (so that a crash later in the run does not make the next run repeat
/// them). Returns whether every unit succeeded.
async fn apply_orphans(run: &Run, outcomes: Vec<OrphanOutcome>) -> Result<bool> {
    let units = group_units(outcomes);
    run.activity.enter();
    let mut waiting: HashMap<Vec<u8>, UnitWaiter> = HashMap::new();
    for (component, unit) in &units {
        if unit.error.is_none() {
            let waiter = UnitWaiter::in_partition(run.partition_of(component));
            dispatch_unit(run, unit, &waiter);
            waiting.insert(component.clone(), waiter);
        }
    }
    run.activity.leave();
    let mut all_ok = true;
    let mut commits = Vec::new();
    for (component, unit) in units {
        let failure = match (unit.error, waiting.remove(&component)) {
            (Some(e), _) => Some(e),
            (None, Some(waiter)) => waiter.wait().await,
            (None, None) => None,
        };
        all_ok &= failure.is_none();
        let ops = unit_ops(run, &component, unit.path, unit.items, failure);
        if !ops.is_empty() {
            commits.push(run.engine.ledger_handle.commit_start(ops)?);
        }
    }
    for commit in commits {
        LedgerHandle::committed(commit).await?;
    }
    Ok(all_ok)
}

/// Groups orphan outcomes into units by the component that owned them.
fn group_units(outcomes: Vec<OrphanOutcome>) -> BTreeMap<Vec<u8>, Unit> {
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
    units
}

/// Sends a unit's deletes to their sinks.
fn dispatch_unit(run: &Run, unit: &Unit, waiter: &UnitWaiter) {
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
    groups.dispatch(run, waiter);
}

/// What a unit commits: its states removed, or (when its deletes failed)
/// kept as maybe missing with the component's failure.
fn unit_ops(
    run: &Run,
    component: &[u8],
    path: ComponentPath,
    items: Vec<UnitItem>,
    failure: Option<Error>,
) -> Vec<LedgerOp> {
    let mut ops = Vec::new();
    let Some(err) = failure else {
        if let Some(memo) = run.take_deferred_memo(component) {
            ops.push(LedgerOp::SetMemo {
                component: component.to_vec(),
                memo: Some(memo),
            });
        }
        for (orphan, _, _, out) in items {
            if let Some(out) = &out {
                run.counters.count_action(out.kind, 1);
            }
            ops.push(LedgerOp::Remove {
                component: component.to_vec(),
                path: orphan.entry.path.to_vec(),
            });
            if orphan.entry.child_gen.is_some() {
                ops.push(LedgerOp::DropDescendants {
                    path: orphan.entry.path.to_vec(),
                });
            }
        }
        return ops;
    };
    for (orphan, _, _, out) in items {
        if out.is_some() {
            ops.push(LedgerOp::Fold(delete_intent(&orphan)));
        }
    }
    ops.push(LedgerOp::SetFailure {
        component: component.to_vec(),
        failure: Some(err.to_string()),
    });
    run.fail(ComponentFailure::new(
        path,
        &Error::Usage(format!(
            "deleting target states it no longer declares failed: {err}"
        )),
    ));
    ops
}

/// Forgets the removed components (children first), and the run's intents
/// once nothing of them is still needed.
async fn forget_removed(run: &Run, removed: Vec<ComponentPath>) -> Result<()> {
    let mut ops: Vec<LedgerOp> = Vec::new();
    // Children were found after their parents: forget them first.
    {
        let mut declared_last = lock(&run.engine.declared_last);
        for path in removed.into_iter().rev() {
            // In a worker group the root's child list is not recorded
            // (its children span members).
            let parent = path
                .parent()
                .filter(|p| run.group.is_none() || !p.segments().is_empty())
                .and_then(|p| {
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

/// A delete of a unit: the orphan, its provider and key, and the action.
type UnitItem = (Orphan, Arc<ProviderCore>, StableKey, Option<ErasedOutput>);

struct Unit {
    path: ComponentPath,
    items: Vec<UnitItem>,
    error: Option<Error>,
}

fn delete_intent(orphan: &Orphan) -> Intent {
    Intent {
        component: Arc::clone(&orphan.component),
        path: Arc::from(orphan.entry.path.as_slice()),
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

/// Splits orphans into those with no orphan above them, and those below
/// one of them: a deleted container takes care of its children and
/// attachments.
fn split_topmost(mut orphans: Vec<Orphan>) -> (Vec<Orphan>, Vec<Orphan>) {
    orphans.sort_by(|a, b| a.entry.path.cmp(&b.entry.path));
    let mut top: Vec<Orphan> = Vec::with_capacity(orphans.len());
    let mut below = Vec::new();
    for o in orphans {
        if let Some(last) = top.last() {
            if o.entry.path == last.entry.path || keycode::is_below(&o.entry.path, &last.entry.path)
            {
                below.push(o);
                continue;
            }
        }
        top.push(o);
    }
    (top, below)
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
