//! Finding a declared state's previous records: in the component's own
//! entry, or with another component that held it.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use super::message::ShardDecl;
use crate::actors::guard::guarded;
use crate::error::{Error, Result};
use crate::ledger::record::{ComponentEntry, PrevView, StateEntry};
use crate::ledger::stored::StoredEntry;
use crate::ledger::Ledger;
use crate::model::erased::ErasedOutput;
use crate::model::provider::{ChildGeneration, ProviderCore};

/// The number of states in a component's entry.
pub(super) fn state_count(entry: &Option<StoredEntry>) -> usize {
    entry.as_ref().map_or(0, |e| e.states.len())
}

/// Finds a state held by another component, through the owner index.
pub(super) fn lookup_elsewhere(
    ledger: &Ledger,
    own: &[u8],
    path: &[u8],
    cache: &mut HashMap<Arc<[u8]>, Option<ComponentEntry>>,
) -> Result<Option<(Arc<[u8]>, StateEntry)>> {
    for owner in ledger.owner_candidates(path) {
        if owner.as_ref() == own {
            continue;
        }
        if !cache.contains_key(&owner) {
            let entry = ledger.component(&owner)?;
            cache.insert(Arc::clone(&owner), entry);
        }
        let found = cache
            .get(&owner)
            .and_then(|e| e.as_ref())
            .and_then(|e| e.find(path).ok().and_then(|i| e.states.get(i).cloned()));
        if let Some(state) = found {
            return Ok(Some((owner, state)));
        }
    }
    Ok(None)
}

/// The previous records and "may be missing" flag of a state, after the
/// container generation rules: records written before a destructive
/// invalidation are gone; records written before a lossy one may be missing.
pub(super) fn effective_prev<'a>(
    provider: &ProviderCore,
    prev: Option<PrevView<'a>>,
    trusted: Option<ChildGeneration>,
) -> (Vec<&'a [u8]>, bool) {
    let Some(prev) = prev else {
        return (Vec::new(), false);
    };
    let gen = trusted.unwrap_or_else(|| {
        provider
            .resolved
            .get()
            .map(|r| r.generation)
            .unwrap_or_default()
    });
    if prev.gen < gen.destructive_floor {
        return (Vec::new(), false);
    }
    let missing = prev.may_be_missing || prev.gen < gen.current;
    (prev.records, missing)
}

pub(super) fn reconcile_declared(
    d: &mut ShardDecl,
    provider: &ProviderCore,
    prev: Option<PrevView<'_>>,
) -> Result<Option<ErasedOutput>> {
    let Some(resolved) = provider.resolved.get() else {
        return Err(Error::Usage(format!(
            "provider {} is not resolved: its container produced no action",
            provider.path.name
        )));
    };
    let (records, missing) = effective_prev(provider, prev, None);
    let desired = d.value.hand_on();
    guarded(|| {
        resolved
            .handler
            .reconcile(d.key.clone(), Some(desired), &records, missing)
    })
    .map_err(|cause| Error::Reconcile {
        provider: provider.path.name.to_string(),
        key: d.key.clone(),
        cause: Box::new(cause),
    })
}
