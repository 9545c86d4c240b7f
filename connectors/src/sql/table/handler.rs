//! The table handler, shared by the dialects: a table is a container
//! target state keyed by `[database, table]`; its `reconcile` plans the
//! table's DDL ([`plan`](super::plan)) from the schemas weir recorded, and
//! the dialect's table sink carries it out.

use std::collections::HashSet;
use std::marker::PhantomData;
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use weir_actors::statediff::{resolve_system_transition, ManagedBy, MutualTrackingRecord};
use weir_actors::{
    Error, Owner, Result, StableKey, TargetAction, TargetActionSink, TargetChildInvalidation,
    TargetHandler, TargetReconcileOutput,
};

use super::actions::TableAction;
use super::dialect::Dialect;
use super::plan::{plan, DdlStep, TablePlan};
use crate::sql::owners::Claim;
use crate::sql::TableSchema;

/// What a table target state declares: the table's name, schema and owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TableSpec {
    /// The table's name as declared (a dialect whose names ignore case
    /// keys it in lower case).
    pub table: String,
    /// The declared schema.
    pub schema: TableSchema,
    /// Who manages the table.
    pub managed_by: ManagedBy,
    /// Whether this app takes the table over from another owner.
    pub adopt: bool,
}

/// A table's tracking record: its schema and who manages it.
pub(crate) type TableRecord = MutualTrackingRecord<TableSchema>;

/// The handler of one database's tables (its root provider's handler).
/// One is registered per run.
pub(crate) struct TableHandler<D> {
    /// The database's table sink.
    sink: TargetActionSink<TableAction>,
    /// The owner of the app: the tables it creates are registered to it.
    owner: Owner,
    /// The names, as keyed (`Dialect::key_name`), of the tables declared
    /// in this run.
    declared: Mutex<HashSet<String>>,
    dialect: PhantomData<fn() -> D>,
}

impl<D: Dialect> TableHandler<D> {
    /// The handler of a database's tables, in this run.
    pub(crate) fn new(sink: TargetActionSink<TableAction>, owner: Owner) -> Self {
        Self {
            sink,
            owner,
            declared: Mutex::new(HashSet::new()),
            dialect: PhantomData,
        }
    }

    fn claim(&self, adopt: bool) -> Claim {
        Claim {
            owner: self.owner.clone(),
            adopt,
        }
    }

    fn output(
        &self,
        action: TargetAction<TableAction>,
        tracking_record: Option<TableRecord>,
        child_invalidation: Option<TargetChildInvalidation>,
    ) -> Option<TargetReconcileOutput<TableAction, TableRecord>> {
        Some(TargetReconcileOutput {
            action,
            sink: self.sink.clone(),
            tracking_record,
            child_invalidation,
        })
    }

    /// The table name in a table key `[database, table]`.
    fn table_of(&self, key: &StableKey) -> Result<String> {
        if let StableKey::Array(parts) = key {
            if let [StableKey::Str(_), StableKey::Str(table)] = parts.as_ref() {
                return Ok(table.to_string());
            }
        }
        Err(Error::permanent(format!(
            "{} table key {key} is not [database, table]; it was not declared by this connector",
            D::NAME
        )))
    }

    /// A declared table. A container always answers while declared: the
    /// child-handler factory builds the rows' handler from its action.
    fn declared(
        &self,
        spec: TableSpec,
        prev: &[TableRecord],
        prev_may_be_missing: bool,
    ) -> Option<TargetReconcileOutput<TableAction, TableRecord>> {
        let keyed = D::key_name(&spec.table).into_owned();
        self.declared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(keyed);
        let TablePlan {
            steps,
            invalidation,
        } = match spec.managed_by {
            // The user owns the table: weir writes rows, never DDL.
            ManagedBy::User => TablePlan::default(),
            ManagedBy::System => {
                let system: Vec<&TableSchema> = prev
                    .iter()
                    .filter(|r| r.managed_by == ManagedBy::System)
                    .map(|r| &r.record)
                    .collect();
                plan(&system, &spec.schema, prev_may_be_missing, !prev.is_empty())
            }
        };
        let record = MutualTrackingRecord::new(spec.schema.clone(), spec.managed_by);
        let claim = (spec.managed_by == ManagedBy::System).then(|| self.claim(spec.adopt));
        let action = TableAction {
            table: spec.table,
            schema: Some(spec.schema),
            ddl: steps,
            claim,
        };
        let action = if prev.is_empty() {
            TargetAction::Create(action)
        } else {
            TargetAction::Update(action)
        };
        self.output(action, Some(record), invalidation)
    }

    /// A table no longer declared: dropped when weir manages it, abandoned
    /// with its rows when the user does (or no record shows weir created
    /// it).
    fn undeclared(
        &self,
        table: String,
        prev: Vec<TableRecord>,
        prev_may_be_missing: bool,
    ) -> Option<TargetReconcileOutput<TableAction, TableRecord>> {
        if prev.is_empty() && !prev_may_be_missing {
            return None;
        }
        let schema = prev.first().map(|p| p.record.clone());
        let (ddl, claim, invalidation) =
            match resolve_system_transition(None, prev, prev_may_be_missing) {
                None => return self.abandoned(table, schema),
                // The table this run declares under a key of an earlier
                // build (one that did not yet key names as the dialect
                // does, such as in lower case): the same table, just
                // written. It stays, registration and all; the rows its
                // old key tracked that the run does not declare are left.
                Some(_) if self.declared_under_another_key(&table) => {
                    (Vec::new(), None, TargetChildInvalidation::Destructive)
                }
                Some(_) => (
                    vec![DdlStep::DropTable],
                    Some(self.claim(false)),
                    TargetChildInvalidation::Destructive,
                ),
            };
        let action = TableAction {
            table,
            schema: None,
            ddl,
            claim,
        };
        self.output(TargetAction::Delete(action), None, Some(invalidation))
    }

    /// A table the user manages, no longer declared: abandoned, rows and
    /// all, and forgotten. Its schema lets `drop_state` delete its rows one
    /// by one through the row handler built from it.
    fn abandoned(
        &self,
        table: String,
        schema: Option<TableSchema>,
    ) -> Option<TargetReconcileOutput<TableAction, TableRecord>> {
        let action = TableAction {
            table,
            schema,
            ddl: Vec::new(),
            claim: None,
        };
        self.output(TargetAction::Delete(action), None, None)
    }

    /// Whether `table`, keyed under its own name, is keyed otherwise today
    /// and declared under that key in this run.
    fn declared_under_another_key(&self, table: &str) -> bool {
        let keyed = D::key_name(table);
        keyed != table
            && self
                .declared
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(keyed.as_ref())
    }
}

impl<D: Dialect> TargetHandler<TableSpec> for TableHandler<D> {
    type TrackingRecord = TableRecord;
    type Action = TableAction;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<TableSpec>,
        prev: Vec<TableRecord>,
        prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<TableAction, TableRecord>>> {
        Ok(match desired {
            Some(spec) => self.declared(spec, &prev, prev_may_be_missing),
            None => self.undeclared(self.table_of(&key)?, prev, prev_may_be_missing),
        })
    }
}
