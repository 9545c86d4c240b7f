//! A component found unchanged: it declares exactly what its last clean
//! commit recorded, so it has nothing to reconcile, apply or commit.
//!
//! Most components of a re-run are such. On the full path each still sends
//! its declarations to their shards, which read its entry from the ledger,
//! ask each state's handler, and answer that nothing needs doing. Here a
//! component instead computes a digest of its declarations (the component
//! key, and each state's path and encoded value) and
//! compares it with the digest the ledger keeps in memory of its last clean
//! commit (see [`digest`](crate::ledger::digest)). On a match it only
//! claims its states in the shards' claims, so that another component
//! declaring one of them in the same run still meets a duplicate
//! declaration, and counts them unchanged.
//!
//! What a match proves: the ledger's entry of the component is what its
//! last clean commit left (any other change to it forgot the digest), and
//! that commit recorded the outcome of the same declarations. The handlers were then asked about these values
//! and their records were brought in line. Asked again with the records
//! they produced, a handler whose
//! [`unchanged_needs_nothing`](crate::TargetHandler::unchanged_needs_nothing)
//! is true has nothing to do, by its own word; any other handler is asked
//! on every run (what it does with an unchanged value is its own affair:
//! it may, say, check the records it is given), so its states never take
//! this path.
//!
//! What a component must be for the digest to be kept or used (else it
//! takes the full path, which is always correct):
//! - every handler of its states says an unchanged state needs nothing,
//!   and is a root provider's: a container's child handler is built from
//!   the container's action in each run, and may judge the same records
//!   differently after a change that leaves the generation alone (a
//!   column added, say), as may an attachment's;
//! - every value declared encoded ([`TargetStateProvider::target_state`](crate::TargetStateProvider::target_state)):
//!   an exact value ([`target_state_exact`](crate::TargetStateProvider::target_state_exact))
//!   has no bytes to digest;
//! - no container among its states (a container's refresh action reaches
//!   its sink on every run that returns one), and every provider resolved;
//! - no children, mounted now or recorded: unmounted children are deleted
//!   through the component's commit;
//! - no declarations sent to the shards while its code ran, no preview
//!   run, no worker group (a member's ledger is also written from its
//!   partitions' changelogs).
//!
//! The digest is recorded only after a commit that left nothing pending:
//! no state it no longer declares (deleted at the end of the run), no
//! child no longer mounted, no failure.

use crate::actors::reconciler::shard_of;
use crate::error::{Error, Result};
use crate::ledger::digest::Digest;
use crate::model::erased::DeclaredValue;
use crate::model::provider::ProviderPath;
use crate::sync::lock;

use super::{ComponentState, Declaration, Early};

/// The digest of a component's declarations, or `None` when the component
/// is not one whose declarations can be found unchanged (see the module
/// docs).
pub(super) fn digest(
    state: &ComponentState,
    decls: &[Declaration],
    early: &Early,
) -> Option<Digest> {
    let run = &state.run;
    if run.preview || run.group.is_some() || early.seen > 0 || has_children(state) {
        return None;
    }
    // Most components are not eligible (their handlers ask on every run):
    // they are turned away before anything is hashed.
    if !decls.iter().all(eligible) {
        return None;
    }
    let hash = blake3::hash(&digest_input(&state.key, decls));
    let (first, _) = hash.as_bytes().split_first_chunk::<8>()?;
    Some(Digest::from_le_bytes(*first))
}

/// What a component's digest hashes: its key, then each encoded
/// declaration's path and value, each framed by its length so that no two
/// lists of byte strings give the same bytes. Gathered into one buffer and
/// hashed at once: feeding the hasher each short string in turn cost four
/// times as much.
fn digest_input(key: &[u8], decls: &[Declaration]) -> Vec<u8> {
    let encoded = || {
        decls.iter().filter_map(|d| match &d.value {
            DeclaredValue::Encoded(value) => Some((&d.path[..], &value[..])),
            DeclaredValue::Exact(_) => None,
        })
    };
    let frame = std::mem::size_of::<u64>();
    let len = frame
        + key.len()
        + encoded()
            .map(|(path, value)| 2 * frame + path.len() + value.len())
            .sum::<usize>();
    let mut input = Vec::with_capacity(len);
    framed(&mut input, key);
    for (path, value) in encoded() {
        framed(&mut input, path);
        framed(&mut input, value);
    }
    input
}

/// Whether a declaration can be found unchanged: an encoded value, not a
/// container, of a root provider whose handler says that an unchanged
/// state needs nothing.
fn eligible(d: &Declaration) -> bool {
    matches!(d.value, DeclaredValue::Encoded(_))
        && d.child.is_none()
        && is_root(&d.provider.path)
        && d.provider
            .resolved
            .get()
            .is_some_and(|r| r.handler.unchanged_needs_nothing())
}

/// Whether a provider is a root provider: its handler is the one the
/// user registered. A container's child provider gets a handler built
/// from the container's action in each run, and an attachment one its
/// handler gives: either may judge the same records differently from one
/// run to the next, which only asking it would show.
fn is_root(path: &ProviderPath) -> bool {
    path.container.is_none() && path.name == path.root
}

/// Appends `bytes` after their length.
fn framed(input: &mut Vec<u8>, bytes: &[u8]) {
    input.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    input.extend_from_slice(bytes);
}

/// Whether the component mounted children in this run.
fn has_children(state: &ComponentState) -> bool {
    !lock(&state.children).keys().is_empty()
}

/// Whether the ledger's digest of the component's last clean commit is
/// `digest`.
pub(super) fn is_unchanged(state: &ComponentState, digest: Digest) -> bool {
    state.run.engine.ledger.declared_digest(&state.key) == Some(digest)
}

/// Claims the component's states in the shards' claims of this run; a
/// state another component declared first is a duplicate declaration (the
/// first one found is returned, once every other state is claimed, as the
/// shards do on the full path).
pub(super) fn claim(state: &ComponentState, decls: &[Declaration]) -> Result<()> {
    let run = &state.run;
    let claims = &run.engine.claims;
    let mut duplicate = None;
    for d in decls {
        let Some(shard) = claims.get(shard_of(&d.path, claims.len())) else {
            return Err(Error::msg(format!(
                "component {}: no shard claims the state {} of {}",
                state.path, d.key, d.provider.path.name
            )));
        };
        let mut locked = shard.lock();
        let declared = locked.run(run.id);
        let me = declared.component(&state.key);
        if let Some(first) = declared.claim(me, &d.path) {
            duplicate.get_or_insert_with(|| Error::DuplicateDeclaration {
                provider: d.provider.path.name.to_string(),
                key: d.key.clone(),
                first_by: Some(declared.path_of(first)),
            });
        }
    }
    duplicate.map_or(Ok(()), Err)
}

/// Records the digest of a component that committed with nothing left
/// pending: no state it no longer declares, no child it no longer mounts
/// (`pending`).
pub(super) fn record(state: &ComponentState, digest: Option<Digest>, pending: bool) {
    if pending {
        return;
    }
    if let Some(digest) = digest {
        state
            .run
            .engine
            .ledger
            .record_declared_digest(&state.key, digest);
    }
}

#[cfg(test)]
mod tests {
    use super::framed;

    fn input(strings: &[&[u8]]) -> Vec<u8> {
        let mut input = Vec::new();
        for s in strings {
            framed(&mut input, s);
        }
        input
    }

    #[test]
    fn byte_strings_split_differently_give_different_digest_inputs() {
        assert_ne!(input(&[b"ab", b"c"]), input(&[b"a", b"bc"]));
        assert_ne!(input(&[b"abc", b""]), input(&[b"", b"abc"]));
        assert_eq!(input(&[b"ab", b"c"]), input(&[b"ab", b"c"]));
    }
}
