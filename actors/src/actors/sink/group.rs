//! A component's actions grouped by sink, to be sent to the sink actors.

use std::sync::Arc;

use super::unit::{PlannedAction, UnitWaiter};
use super::ApplyActions;
use crate::actors::list_index::ListIndex;
use crate::model::sink::SinkCore;
use crate::run::Run;

/// The actions of one unit, grouped by sink identity, ready to dispatch.
#[derive(Default)]
pub(crate) struct SinkGroups {
    groups: Vec<SinkGroup>,
    /// The groups' positions, by sink identity.
    by_sink: ListIndex<u64>,
    total: usize,
    /// The room the first group's list starts with (later groups, of
    /// other sinks, start empty).
    room: usize,
}

struct SinkGroup {
    core: Arc<SinkCore>,
    provider: Arc<str>,
    label: Arc<str>,
    actions: Vec<PlannedAction>,
}

impl SinkGroups {
    /// Groups whose first list starts with room for `room` actions: a
    /// unit that knows about how many it has (usually all for one sink)
    /// saves the list's regrowth and copies.
    pub(crate) fn with_room(room: usize) -> Self {
        Self {
            room,
            ..Self::default()
        }
    }

    pub(crate) fn add(
        &mut self,
        core: &Arc<SinkCore>,
        provider: &Arc<str>,
        label: &Arc<str>,
        action: PlannedAction,
    ) {
        self.total += 1;
        let sink_of = |g: &SinkGroup| g.core.id;
        let at = match self.by_sink.position(&self.groups, core.id, sink_of) {
            Some(at) => at,
            None => {
                self.groups.push(SinkGroup {
                    core: Arc::clone(core),
                    provider: Arc::clone(provider),
                    label: Arc::clone(label),
                    actions: Vec::with_capacity(std::mem::take(&mut self.room)),
                });
                self.by_sink.pushed(&self.groups, sink_of);
                self.groups.len() - 1
            }
        };
        if let Some(group) = self.groups.get_mut(at) {
            group.actions.push(action);
        }
    }

    /// The number of actions gathered.
    pub(crate) fn len(&self) -> usize {
        self.total
    }

    /// Sends every group to its sink actor, to be acknowledged to `waiter`.
    pub(crate) fn dispatch(self, run: &Run, waiter: &UnitWaiter) {
        waiter.add_pending(self.total);
        for group in self.groups {
            run.sink(&group.core).send(ApplyActions {
                unit: waiter.unit(group.provider, group.label),
                actions: group.actions,
            });
        }
    }
}
