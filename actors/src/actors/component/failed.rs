//! What a failed component commits: the failure, and the children it
//! mounted (so that they are found again); its states stay as they were.

use crate::error::Error;
use crate::ledger::record::LedgerOp;
use crate::sync::lock;

use super::ComponentState;

/// Remembers in the ledger that the component failed; its states stay as
/// they were.
pub(super) async fn record_failure(state: &ComponentState, err: &Error) {
    if state.run.preview || state.read_only_root() {
        return;
    }
    // The failure itself is reported to the caller; a ledger error here
    // only loses the note, which the next run rewrites.
    let _ = state
        .run
        .engine
        .ledger_handle
        .commit(failure_ops(state, err))
        .await;
}

/// The ops that note a component's failure, and the children it mounted.
pub(super) fn failure_ops(state: &ComponentState, err: &Error) -> Vec<LedgerOp> {
    let mut ops = vec![LedgerOp::SetFailure {
        component: state.key.to_vec(),
        failure: Some(err.to_string()),
    }];
    ops.extend(mounted_children_op(state));
    ops
}

/// Lists the children mounted in this run in the component's child list,
/// so that they are found again even when the component fails.
pub(super) fn mounted_children_op(state: &ComponentState) -> Option<LedgerOp> {
    if state.is_group_root() {
        return None;
    }
    let children = lock(&state.children);
    (!children.keys().is_empty()).then(|| LedgerOp::AddChildren {
        component: state.key.to_vec(),
        children: children.keys().to_vec(),
    })
}
