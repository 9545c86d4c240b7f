//! A component's actions grouped by sink, to be sent to the sink actors.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use super::unit::{PlannedAction, UnitWaiter};
use super::ApplyActions;
use crate::model::sink::SinkCore;
use crate::run::Run;

/// The actions of one unit, grouped by sink identity, ready to dispatch.
#[derive(Default)]
pub(crate) struct SinkGroups {
    groups: Vec<SinkGroup>,
    /// The groups' positions by sink identity, once there are more than
    /// [`GROUPS_SEARCHED`] (fewer are searched in the list: most units
    /// write to one or two sinks, and a map per unit was an allocation
    /// per component).
    by_sink: Option<HashMap<u64, usize>>,
    total: usize,
    /// The room the first group's list starts with (later groups, of
    /// other sinks, start empty).
    room: usize,
}

/// The most groups found by searching the list.
const GROUPS_SEARCHED: usize = 8;

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
        let at = match self.position(core.id) {
            Some(at) => at,
            None => {
                let room = std::mem::take(&mut self.room);
                self.add_group(SinkGroup {
                    core: Arc::clone(core),
                    provider: Arc::clone(provider),
                    label: Arc::clone(label),
                    actions: Vec::with_capacity(room),
                })
            }
        };
        if let Some(group) = self.groups.get_mut(at) {
            group.actions.push(action);
        }
    }

    /// The position of the group of sink `id`, if there is one.
    fn position(&self, id: u64) -> Option<usize> {
        match &self.by_sink {
            Some(by_sink) => by_sink.get(&id).copied(),
            None => self.groups.iter().position(|g| g.core.id == id),
        }
    }

    /// Adds a group, returning its position.
    fn add_group(&mut self, group: SinkGroup) -> usize {
        let at = self.groups.len();
        if let Some(by_sink) = &mut self.by_sink {
            by_sink.insert(group.core.id, at);
        }
        self.groups.push(group);
        if self.by_sink.is_none() && self.groups.len() > GROUPS_SEARCHED {
            self.by_sink = Some(
                self.groups
                    .iter()
                    .enumerate()
                    .map(|(i, g)| (g.core.id, i))
                    .collect(),
            );
        }
        at
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
