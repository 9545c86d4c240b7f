//! Actions: what a handler asks a sink to do ([`TargetAction`], its
//! [`ActionKind`]), and how a container's change affects its children
//! ([`TargetChildInvalidation`]).

use serde::{Deserialize, Serialize};

/// One operation on the external system, with its kind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TargetAction<A> {
    /// The state did not exist and is created.
    Create(A),
    /// The state exists (or may) and is brought up to date.
    Update(A),
    /// The state is removed.
    Delete(A),
}

impl<A> TargetAction<A> {
    /// The kind of the action.
    pub fn kind(&self) -> ActionKind {
        match self {
            TargetAction::Create(_) => ActionKind::Create,
            TargetAction::Update(_) => ActionKind::Update,
            TargetAction::Delete(_) => ActionKind::Delete,
        }
    }

    /// The action's payload.
    pub fn inner(&self) -> &A {
        match self {
            TargetAction::Create(a) | TargetAction::Update(a) | TargetAction::Delete(a) => a,
        }
    }

    /// The action's payload, by value.
    pub fn into_inner(self) -> A {
        match self {
            TargetAction::Create(a) | TargetAction::Update(a) | TargetAction::Delete(a) => a,
        }
    }

    /// An action of `kind` with `payload`.
    pub fn with_kind(kind: ActionKind, a: A) -> Self {
        match kind {
            ActionKind::Create => TargetAction::Create(a),
            ActionKind::Update => TargetAction::Update(a),
            ActionKind::Delete => TargetAction::Delete(a),
        }
    }
}

/// The kind of a [`TargetAction`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ActionKind {
    /// A create.
    Create,
    /// An update.
    Update,
    /// A delete.
    Delete,
}

impl ActionKind {
    /// A lowercase name, for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::Create => "create",
            ActionKind::Update => "update",
            ActionKind::Delete => "delete",
        }
    }
}

/// Actions counted by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ActionCounts {
    created: u64,
    updated: u64,
    deleted: u64,
}

impl ActionCounts {
    /// Counts one action of `kind`.
    pub(crate) fn add(&mut self, kind: ActionKind) {
        match kind {
            ActionKind::Create => self.created += 1,
            ActionKind::Update => self.updated += 1,
            ActionKind::Delete => self.deleted += 1,
        }
    }

    /// The kinds counted, with their counts.
    pub(crate) fn counted(&self) -> impl Iterator<Item = (ActionKind, u64)> {
        [
            (ActionKind::Create, self.created),
            (ActionKind::Update, self.updated),
            (ActionKind::Delete, self.deleted),
        ]
        .into_iter()
        .filter(|&(_, n)| n > 0)
    }
}

/// How a change of a container affects its children.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TargetChildInvalidation {
    /// The container was rebuilt: children's records are dropped and the
    /// children are created again.
    Destructive,
    /// The container may have lost data: children are reconciled with
    /// `prev_may_be_missing = true`, so they are written again.
    Lossy,
}

#[cfg(test)]
mod tests {
    use super::{ActionCounts, ActionKind};

    #[test]
    fn action_counts_list_each_kind_counted_with_its_count_and_no_other() {
        let mut counts = ActionCounts::default();
        for kind in [ActionKind::Delete, ActionKind::Create, ActionKind::Delete] {
            counts.add(kind);
        }
        let counted: Vec<_> = counts.counted().collect();
        assert_eq!(counted, [(ActionKind::Create, 1), (ActionKind::Delete, 2)]);
        assert_eq!(ActionCounts::default().counted().count(), 0);
    }
}
