//! Helpers that turn the inputs of a `reconcile` call into a decision.
//!
//! `TargetHandler::reconcile` receives the desired value of a target state,
//! the tracking records that may describe what was written before, and a flag
//! saying whether those records may be incomplete. Most connectors make the
//! same decision from them, packaged here:
//!
//! - [`TrackingRecordTransition`] bundles the desired tracking record (or
//!   `None` when the target state is no longer declared), the previous
//!   records, and `prev_may_be_missing`.
//! - [`diff`] compares them and returns `None` (nothing to do) or a
//!   [`DiffAction`]: [`Insert`](DiffAction::Insert) when nothing was there
//!   before, [`Replace`](DiffAction::Replace) when a previous record differs
//!   from the desired one, [`Upsert`](DiffAction::Upsert) when every previous
//!   record matches but the target may be missing, and
//!   [`Delete`](DiffAction::Delete) when the target state is gone.
//! - [`MutualTrackingRecord`] and [`resolve_system_transition`] handle
//!   targets that are either created by weir ([`ManagedBy::System`]) or by the
//!   user ([`ManagedBy::User`]): weir only ever acts on the former.
//! - [`CompositeTrackingRecord`] and [`diff_composite`] handle containers
//!   made of a main part and keyed sub-parts (a table's primary key and its
//!   columns): they return one action for the main part and one per changed
//!   sub-part, and [`CompositeDiff::child_invalidation`] tells how the change
//!   affects the container's children (its rows).
//!
//! A typical `reconcile`:
//!
//! ```text
//! let transition = TrackingRecordTransition::new(desired_record, prev_possible_records, prev_may_be_missing);
//! match diff(Some(&transition)) {
//!     None => Ok(None),
//!     Some(DiffAction::Insert | DiffAction::Upsert) => /* write */,
//!     Some(DiffAction::Replace) => /* overwrite, cleaning up what the previous records describe */,
//!     Some(DiffAction::Delete) => /* remove */,
//! }
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::model::action::{ActionKind, TargetChildInvalidation};

/// The inputs of one reconcile decision for a target state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrackingRecordTransition<R> {
    /// The tracking record the target should end up with; `None` when the
    /// target state is no longer declared and should go away.
    pub desired: Option<R>,
    /// The tracking records of what may have been written before. There can be
    /// several when an earlier update did not finish; empty when nothing is
    /// known to have been written.
    pub prev: Vec<R>,
    /// Whether the target may be absent or differ from what `prev` describes
    /// (an earlier write may have been lost), so that an unchanged record must
    /// still be written again.
    pub prev_may_be_missing: bool,
}

impl<R> TrackingRecordTransition<R> {
    /// Bundles the inputs of a reconcile call.
    pub fn new(desired: Option<R>, prev: Vec<R>, prev_may_be_missing: bool) -> Self {
        Self {
            desired,
            prev,
            prev_may_be_missing,
        }
    }
}

/// What a connector has to do to bring a target to its desired state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DiffAction {
    /// Create the target: nothing is known to have been written before.
    Insert,
    /// Write the target again although every previous record matches the
    /// desired one, because the target may be missing.
    Upsert,
    /// Overwrite the target: a previous record differs from the desired one.
    Replace,
    /// Remove the target: it is no longer declared.
    Delete,
}

impl DiffAction {
    /// The kind of target action that carries this out: `Insert` creates,
    /// `Upsert` and `Replace` update, `Delete` deletes.
    pub fn action_kind(self) -> ActionKind {
        match self {
            DiffAction::Insert => ActionKind::Create,
            DiffAction::Upsert | DiffAction::Replace => ActionKind::Update,
            DiffAction::Delete => ActionKind::Delete,
        }
    }
}

/// Decides between `None` and a [`DiffAction`] for one desired value and the
/// previous values; the rule of [`diff`].
fn decide<'a, T: PartialEq + 'a>(
    desired: Option<&T>,
    mut prev: impl Iterator<Item = &'a T>,
    prev_may_be_missing: bool,
) -> Option<DiffAction> {
    match desired {
        Some(desired) => {
            let mut any_prev = false;
            for record in prev {
                if record != desired {
                    return Some(DiffAction::Replace);
                }
                any_prev = true;
            }
            if !any_prev {
                Some(DiffAction::Insert)
            } else if prev_may_be_missing {
                Some(DiffAction::Upsert)
            } else {
                None
            }
        }
        None => {
            if prev_may_be_missing || prev.next().is_some() {
                Some(DiffAction::Delete)
            } else {
                None
            }
        }
    }
}

/// Decides what to do for a transition; `None` means nothing has to be done.
///
/// - No transition (`None`): `None`.
/// - A desired record and no previous record: [`DiffAction::Insert`], whether
///   or not the previous records may be missing.
/// - A desired record that some previous record differs from:
///   [`DiffAction::Replace`].
/// - A desired record equal to every previous record: `None`, or
///   [`DiffAction::Upsert`] when `prev_may_be_missing` is set.
/// - No desired record: [`DiffAction::Delete`] when there is a previous record
///   or `prev_may_be_missing` is set, `None` otherwise (nothing was written,
///   so there is nothing to remove).
pub fn diff<R: PartialEq>(transition: Option<&TrackingRecordTransition<R>>) -> Option<DiffAction> {
    let transition = transition?;
    decide(
        transition.desired.as_ref(),
        transition.prev.iter(),
        transition.prev_may_be_missing,
    )
}

/// Who owns a target: weir, or the user.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ManagedBy {
    /// Weir created the target and maintains it: it writes, replaces and
    /// deletes it as the declarations change.
    #[default]
    System,
    /// The user created the target (a table, a topic, an index) and owns it:
    /// weir neither creates, alters nor removes it.
    User,
}

/// A tracking record together with who manages the target it describes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MutualTrackingRecord<R> {
    /// The connector's own tracking record.
    pub record: R,
    /// Who manages the target.
    pub managed_by: ManagedBy,
}

impl<R> MutualTrackingRecord<R> {
    /// Pairs a tracking record with who manages its target.
    pub fn new(record: R, managed_by: ManagedBy) -> Self {
        Self { record, managed_by }
    }
}

/// Keeps the part of a transition that weir manages, for a target that the
/// user may own.
///
/// Returns `None` when weir must leave the target alone, and otherwise the
/// transition of the system-managed records only, ready for [`diff`] or
/// [`diff_composite`]:
///
/// - Desired and managed by the user: `None`. This holds whatever the previous
///   records say: when the user takes over a target weir used to manage,
///   weir releases it without deleting it.
/// - Previous records managed by the user are dropped: they describe
///   something weir never wrote. So moving a target from user to system
///   management gives a transition with no previous record, which [`diff`]
///   turns into [`DiffAction::Insert`]; the sink should expect the target to
///   exist already.
/// - Not desired any more, with no system-managed previous record: `None`,
///   even when `prev_may_be_missing` is set. Weir cannot show it ever owned
///   the target, so it abandons it rather than deleting it.
/// - Otherwise (desired and managed by the system, or not desired with a
///   system-managed previous record): the
///   transition with the desired record, the system-managed previous records
///   and `prev_may_be_missing` unchanged. When not desired, [`diff`] turns it
///   into [`DiffAction::Delete`].
pub fn resolve_system_transition<R>(
    desired: Option<MutualTrackingRecord<R>>,
    prev: Vec<MutualTrackingRecord<R>>,
    prev_may_be_missing: bool,
) -> Option<TrackingRecordTransition<R>> {
    let desired = match desired {
        Some(MutualTrackingRecord {
            managed_by: ManagedBy::User,
            ..
        }) => return None,
        Some(record) => Some(record.record),
        None => None,
    };
    let prev: Vec<R> = prev
        .into_iter()
        .filter(|record| record.managed_by == ManagedBy::System)
        .map(|record| record.record)
        .collect();
    // Not declared any more and never managed by weir (no system record):
    // abandon it, even if it may be missing. weir never destroys what it
    // cannot show it owned.
    if desired.is_none() && prev.is_empty() {
        return None;
    }
    Some(TrackingRecordTransition::new(
        desired,
        prev,
        prev_may_be_missing,
    ))
}

/// A tracking record of a container made of a main part and keyed sub-parts.
///
/// For a table, `main` is the primary key specification (changing it means
/// recreating the table) and `parts` maps each column name to its
/// specification (columns can be added, altered or dropped one by one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompositeTrackingRecord<M, K: Ord, P> {
    /// The part whose change rebuilds the whole container.
    pub main: M,
    /// The parts that change independently, by key.
    pub parts: BTreeMap<K, P>,
}

impl<M, K: Ord, P> CompositeTrackingRecord<M, K, P> {
    /// Builds a composite tracking record.
    pub fn new(main: M, parts: BTreeMap<K, P>) -> Self {
        Self { main, parts }
    }
}

/// The result of [`diff_composite`]: an action for the main part, and one for
/// each sub-part that needs one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompositeDiff<K> {
    /// What to do with the main part; `None` when it is unchanged.
    pub main: Option<DiffAction>,
    /// What to do with each sub-part, by key; sub-parts with nothing to do
    /// are absent.
    pub parts: BTreeMap<K, DiffAction>,
}

impl<K> CompositeDiff<K> {
    /// How this change affects the container's children (a table's rows).
    ///
    /// - Main part replaced (the container is rebuilt, say a table dropped
    ///   and created again): [`TargetChildInvalidation::Destructive`].
    /// - Main part unchanged or upserted, and some sub-part deleted, replaced
    ///   or upserted (say a column dropped or its type changed), which may
    ///   lose data held by the children: [`TargetChildInvalidation::Lossy`].
    /// - Otherwise (only new sub-parts inserted, or the whole container
    ///   inserted or deleted): `None`.
    pub fn child_invalidation(&self) -> Option<TargetChildInvalidation> {
        match self.main {
            Some(DiffAction::Replace) => Some(TargetChildInvalidation::Destructive),
            None | Some(DiffAction::Upsert)
                if self
                    .parts
                    .values()
                    .any(|action| *action != DiffAction::Insert) =>
            {
                Some(TargetChildInvalidation::Lossy)
            }
            _ => None,
        }
    }
}

/// Decides what to do for a composite transition: for the main part, and for
/// each sub-part separately.
///
/// Returns `None` when there is no transition, or when neither the main part
/// nor any sub-part needs an action. Otherwise:
///
/// - `main` is [`diff`] applied to the `main` fields of the desired and
///   previous records.
/// - `parts` holds, for every key present in the desired record or in any
///   previous record, [`diff`] applied to the sub-parts under that key: the
///   desired record's sub-part (if any) against the sub-parts of the previous
///   records that have the key. A previous record that lacks the key while
///   another has it means the sub-part may be missing from the target, so
///   the sub-part is diffed as if `prev_may_be_missing` were set (giving
///   [`DiffAction::Upsert`] rather than `None` when the others match).
///   Keys whose diff is `None` are left out.
///
/// Sub-parts are diffed independently of the main part: when `main` is
/// [`DiffAction::Replace`] the connector usually rebuilds the container
/// with every desired sub-part, whatever `parts` says.
pub fn diff_composite<M: PartialEq, K: Ord + Clone, P: PartialEq>(
    transition: Option<&TrackingRecordTransition<CompositeTrackingRecord<M, K, P>>>,
) -> Option<CompositeDiff<K>> {
    let transition = transition?;
    let desired = transition.desired.as_ref();
    let prev = &transition.prev;

    let main = decide(
        desired.map(|record| &record.main),
        prev.iter().map(|record| &record.main),
        transition.prev_may_be_missing,
    );

    let keys: BTreeSet<&K> = desired
        .into_iter()
        .chain(prev.iter())
        .flat_map(|record| record.parts.keys())
        .collect();
    let mut parts = BTreeMap::new();
    for key in keys {
        let lacking = prev.iter().any(|record| !record.parts.contains_key(key));
        let action = decide(
            desired.and_then(|record| record.parts.get(key)),
            prev.iter().filter_map(|record| record.parts.get(key)),
            transition.prev_may_be_missing || lacking,
        );
        if let Some(action) = action {
            parts.insert(key.clone(), action);
        }
    }

    if main.is_none() && parts.is_empty() {
        return None;
    }
    Some(CompositeDiff { main, parts })
}

#[cfg(test)]
mod tests {
    use super::*;
    use DiffAction::{Delete, Insert, Replace, Upsert};

    fn t<R>(
        desired: Option<R>,
        prev: Vec<R>,
        prev_may_be_missing: bool,
    ) -> TrackingRecordTransition<R> {
        TrackingRecordTransition::new(desired, prev, prev_may_be_missing)
    }

    // ---- diff ----

    #[test]
    fn no_transition_means_nothing_to_do() {
        assert_eq!(diff::<u32>(None), None);
    }

    #[test]
    fn a_desired_record_without_previous_records_is_inserted() {
        assert_eq!(diff(Some(&t(Some(1), vec![], false))), Some(Insert));
    }

    #[test]
    fn a_desired_record_without_previous_records_is_inserted_even_if_they_may_be_missing() {
        assert_eq!(diff(Some(&t(Some(1), vec![], true))), Some(Insert));
    }

    #[test]
    fn unchanged_records_need_nothing() {
        assert_eq!(diff(Some(&t(Some(1), vec![1], false))), None);
        assert_eq!(diff(Some(&t(Some(1), vec![1, 1], false))), None);
    }

    #[test]
    fn unchanged_records_that_may_be_missing_are_upserted() {
        assert_eq!(diff(Some(&t(Some(1), vec![1], true))), Some(Upsert));
        assert_eq!(diff(Some(&t(Some(1), vec![1, 1], true))), Some(Upsert));
    }

    #[test]
    fn a_changed_record_is_replaced() {
        assert_eq!(diff(Some(&t(Some(2), vec![1], false))), Some(Replace));
        assert_eq!(diff(Some(&t(Some(2), vec![1], true))), Some(Replace));
    }

    #[test]
    fn a_record_differing_from_any_one_previous_record_is_replaced() {
        assert_eq!(diff(Some(&t(Some(2), vec![2, 1], false))), Some(Replace));
        assert_eq!(diff(Some(&t(Some(2), vec![1, 2], false))), Some(Replace));
    }

    #[test]
    fn an_undeclared_record_with_previous_records_is_deleted() {
        assert_eq!(diff(Some(&t(None, vec![1], false))), Some(Delete));
        assert_eq!(diff(Some(&t(None, vec![1, 2], true))), Some(Delete));
    }

    #[test]
    fn an_undeclared_record_that_may_be_missing_is_deleted() {
        assert_eq!(diff(Some(&t::<u32>(None, vec![], true))), Some(Delete));
    }

    #[test]
    fn an_undeclared_record_never_written_needs_nothing() {
        assert_eq!(diff(Some(&t::<u32>(None, vec![], false))), None);
    }

    // ---- resolve_system_transition ----

    fn sys<R>(record: R) -> MutualTrackingRecord<R> {
        MutualTrackingRecord::new(record, ManagedBy::System)
    }

    fn user<R>(record: R) -> MutualTrackingRecord<R> {
        MutualTrackingRecord::new(record, ManagedBy::User)
    }

    #[test]
    fn managed_by_defaults_to_system() {
        assert_eq!(ManagedBy::default(), ManagedBy::System);
    }

    #[test]
    fn a_user_managed_target_is_left_alone() {
        assert_eq!(
            resolve_system_transition(Some(user(1)), vec![], false),
            None
        );
        assert_eq!(
            resolve_system_transition(Some(user(1)), vec![user(1)], true),
            None
        );
        assert_eq!(
            resolve_system_transition(Some(user(2)), vec![user(1)], false),
            None
        );
    }

    #[test]
    fn a_target_taken_over_by_the_user_is_released_without_deletion() {
        assert_eq!(
            resolve_system_transition(Some(user(1)), vec![sys(1)], false),
            None
        );
        assert_eq!(
            resolve_system_transition(Some(user(1)), vec![sys(2)], true),
            None
        );
    }

    #[test]
    fn a_system_managed_target_keeps_its_transition() {
        let resolved = resolve_system_transition(Some(sys(2)), vec![sys(1)], true);
        assert_eq!(resolved, Some(t(Some(2), vec![1], true)));
        assert_eq!(diff(resolved.as_ref()), Some(Replace));
    }

    #[test]
    fn an_unchanged_system_managed_target_needs_nothing() {
        let resolved = resolve_system_transition(Some(sys(1)), vec![sys(1)], false);
        assert_eq!(resolved, Some(t(Some(1), vec![1], false)));
        assert_eq!(diff(resolved.as_ref()), None);
    }

    #[test]
    fn user_managed_previous_records_are_dropped() {
        let resolved =
            resolve_system_transition(Some(sys(1)), vec![user(9), sys(1), user(8)], false);
        assert_eq!(resolved, Some(t(Some(1), vec![1], false)));
        assert_eq!(diff(resolved.as_ref()), None);
    }

    #[test]
    fn a_target_handed_from_the_user_to_the_system_is_inserted() {
        let resolved = resolve_system_transition(Some(sys(1)), vec![user(1)], false);
        assert_eq!(resolved, Some(t(Some(1), vec![], false)));
        assert_eq!(diff(resolved.as_ref()), Some(Insert));
    }

    #[test]
    fn an_undeclared_system_managed_target_is_deleted() {
        let resolved = resolve_system_transition(None, vec![sys(1), user(2)], false);
        assert_eq!(resolved, Some(t(None, vec![1], false)));
        assert_eq!(diff(resolved.as_ref()), Some(Delete));
    }

    #[test]
    fn an_undeclared_user_managed_target_is_abandoned() {
        assert_eq!(resolve_system_transition(None, vec![user(1)], false), None);
        assert_eq!(resolve_system_transition::<u32>(None, vec![], false), None);
    }

    #[test]
    fn an_undeclared_user_target_that_may_be_missing_is_still_abandoned() {
        assert_eq!(resolve_system_transition(None, vec![user(1)], true), None);
        assert_eq!(resolve_system_transition::<i32>(None, vec![], true), None);
    }

    #[test]
    fn an_undeclared_system_target_that_may_be_missing_is_deleted() {
        let resolved = resolve_system_transition(None, vec![sys(1), user(2)], true);
        assert_eq!(resolved, Some(t(None, vec![1], true)));
        assert_eq!(diff(resolved.as_ref()), Some(Delete));
    }

    #[test]
    fn mutual_tracking_records_round_trip_through_message_pack(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let records = vec![sys(String::from("a")), user(String::from("b"))];
        let decoded: Vec<MutualTrackingRecord<String>> =
            rmp_serde::from_slice(&rmp_serde::to_vec(&records)?)?;
        assert_eq!(decoded, records);
        Ok(())
    }

    // ---- diff_composite ----

    type Table = CompositeTrackingRecord<&'static str, &'static str, &'static str>;

    fn table(pk: &'static str, columns: &[(&'static str, &'static str)]) -> Table {
        CompositeTrackingRecord::new(pk, columns.iter().copied().collect())
    }

    /// The main action and the part actions in key order.
    type Summary = (Option<DiffAction>, Vec<(&'static str, DiffAction)>);

    fn composite(transition: TrackingRecordTransition<Table>) -> Option<Summary> {
        diff_composite(Some(&transition)).map(|d| (d.main, d.parts.into_iter().collect()))
    }

    #[test]
    fn no_composite_transition_means_nothing_to_do() {
        assert_eq!(diff_composite::<u8, u8, u8>(None), None);
    }

    #[test]
    fn an_unchanged_composite_needs_nothing() {
        let rec = table("id", &[("a", "int"), ("b", "text")]);
        assert_eq!(composite(t(Some(rec.clone()), vec![rec], false)), None);
    }

    #[test]
    fn a_new_composite_inserts_its_main_part_and_every_sub_part() {
        let rec = table("id", &[("a", "int"), ("b", "text")]);
        assert_eq!(
            composite(t(Some(rec), vec![], false)),
            Some((Some(Insert), vec![("a", Insert), ("b", Insert)]))
        );
    }

    #[test]
    fn an_unchanged_composite_that_may_be_missing_upserts_everything() {
        let rec = table("id", &[("a", "int")]);
        assert_eq!(
            composite(t(Some(rec.clone()), vec![rec], true)),
            Some((Some(Upsert), vec![("a", Upsert)]))
        );
    }

    #[test]
    fn an_undeclared_composite_deletes_its_main_part_and_every_sub_part() {
        let old = table("id", &[("a", "int")]);
        let older = table("id", &[("b", "text")]);
        assert_eq!(
            composite(t(None, vec![old, older], false)),
            Some((Some(Delete), vec![("a", Delete), ("b", Delete)]))
        );
    }

    #[test]
    fn an_undeclared_composite_never_written_needs_nothing() {
        assert_eq!(composite(t(None, vec![], false)), None);
    }

    #[test]
    fn an_added_sub_part_is_inserted() {
        let old = table("id", &[("a", "int")]);
        let new = table("id", &[("a", "int"), ("b", "text")]);
        assert_eq!(
            composite(t(Some(new), vec![old], false)),
            Some((None, vec![("b", Insert)]))
        );
    }

    #[test]
    fn a_removed_sub_part_is_deleted() {
        let old = table("id", &[("a", "int"), ("b", "text")]);
        let new = table("id", &[("a", "int")]);
        assert_eq!(
            composite(t(Some(new), vec![old], false)),
            Some((None, vec![("b", Delete)]))
        );
    }

    #[test]
    fn a_changed_sub_part_is_replaced() {
        let old = table("id", &[("a", "int"), ("b", "text")]);
        let new = table("id", &[("a", "bigint"), ("b", "text")]);
        assert_eq!(
            composite(t(Some(new), vec![old], false)),
            Some((None, vec![("a", Replace)]))
        );
    }

    #[test]
    fn a_changed_main_part_is_replaced_independently_of_sub_parts() {
        let old = table("id", &[("a", "int")]);
        let new = table("id, a", &[("a", "int")]);
        assert_eq!(
            composite(t(Some(new), vec![old], false)),
            Some((Some(Replace), vec![]))
        );
    }

    #[test]
    fn a_sub_part_some_previous_records_lack_is_upserted() {
        let with_b = table("id", &[("a", "int"), ("b", "text")]);
        let without_b = table("id", &[("a", "int")]);
        assert_eq!(
            composite(t(Some(with_b.clone()), vec![with_b, without_b], false)),
            Some((None, vec![("b", Upsert)]))
        );
    }

    #[test]
    fn a_sub_part_some_previous_records_lack_and_another_differs_on_is_replaced() {
        let desired = table("id", &[("b", "text")]);
        let changed = table("id", &[("b", "int")]);
        let without_b = table("id", &[]);
        assert_eq!(
            composite(t(Some(desired), vec![changed, without_b], false)),
            Some((None, vec![("b", Replace)]))
        );
    }

    #[test]
    fn a_sub_part_dropped_by_only_some_previous_records_is_deleted() {
        let with_b = table("id", &[("a", "int"), ("b", "text")]);
        let without_b = table("id", &[("a", "int")]);
        assert_eq!(
            composite(t(Some(without_b.clone()), vec![without_b, with_b], false)),
            Some((None, vec![("b", Delete)]))
        );
    }

    #[test]
    fn sub_parts_of_several_previous_records_are_diffed_key_by_key() {
        let desired = table("id", &[("a", "int"), ("c", "text")]);
        let prev1 = table("id", &[("a", "int"), ("b", "text")]);
        let prev2 = table("id", &[("a", "bigint")]);
        assert_eq!(
            composite(t(Some(desired), vec![prev1, prev2], false)),
            Some((None, vec![("a", Replace), ("b", Delete), ("c", Insert)]))
        );
    }

    #[test]
    fn composite_tracking_records_round_trip_through_message_pack(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let rec: CompositeTrackingRecord<String, String, u32> = CompositeTrackingRecord::new(
            "id".into(),
            [("a".to_string(), 1), ("b".to_string(), 2)]
                .into_iter()
                .collect(),
        );
        let decoded: CompositeTrackingRecord<String, String, u32> =
            rmp_serde::from_slice(&rmp_serde::to_vec(&rec)?)?;
        assert_eq!(decoded, rec);
        Ok(())
    }

    // ---- child_invalidation ----

    fn cdiff(
        main: Option<DiffAction>,
        parts: &[(&'static str, DiffAction)],
    ) -> CompositeDiff<&'static str> {
        CompositeDiff {
            main,
            parts: parts.iter().copied().collect(),
        }
    }

    #[test]
    fn a_replaced_main_part_destroys_the_children() {
        assert_eq!(
            cdiff(Some(Replace), &[]).child_invalidation(),
            Some(TargetChildInvalidation::Destructive)
        );
        assert_eq!(
            cdiff(Some(Replace), &[("a", Insert), ("b", Delete)]).child_invalidation(),
            Some(TargetChildInvalidation::Destructive)
        );
    }

    #[test]
    fn only_inserted_sub_parts_leave_the_children_alone() {
        assert_eq!(
            cdiff(None, &[("a", Insert), ("b", Insert)]).child_invalidation(),
            None
        );
        assert_eq!(
            cdiff(Some(Upsert), &[("a", Insert)]).child_invalidation(),
            None
        );
        assert_eq!(cdiff(None, &[]).child_invalidation(), None);
    }

    #[test]
    fn deleted_replaced_or_upserted_sub_parts_make_the_children_lossy() {
        for action in [Delete, Replace, Upsert] {
            assert_eq!(
                cdiff(None, &[("a", Insert), ("b", action)]).child_invalidation(),
                Some(TargetChildInvalidation::Lossy)
            );
            assert_eq!(
                cdiff(Some(Upsert), &[("b", action)]).child_invalidation(),
                Some(TargetChildInvalidation::Lossy)
            );
        }
    }

    #[test]
    fn an_inserted_or_deleted_container_leaves_the_children_alone() {
        assert_eq!(
            cdiff(Some(Insert), &[("a", Insert)]).child_invalidation(),
            None
        );
        assert_eq!(
            cdiff(Some(Delete), &[("a", Delete)]).child_invalidation(),
            None
        );
    }

    #[test]
    fn a_composite_diff_reports_child_invalidation_end_to_end() {
        let old = table("id", &[("a", "int"), ("b", "text")]);
        let dropped_b = table("id", &[("a", "int")]);
        let new_pk = table("id, a", &[("a", "int"), ("b", "text")]);
        let added_c = table("id", &[("a", "int"), ("b", "text"), ("c", "text")]);
        let invalidation = |new: &Table| {
            diff_composite(Some(&t(Some(new.clone()), vec![old.clone()], false)))
                .and_then(|d| d.child_invalidation())
        };
        assert_eq!(
            invalidation(&dropped_b),
            Some(TargetChildInvalidation::Lossy)
        );
        assert_eq!(
            invalidation(&new_pk),
            Some(TargetChildInvalidation::Destructive)
        );
        assert_eq!(invalidation(&added_c), None);
    }
}
