//! What the two sinks of a database are asked to do: a table action (its
//! registration and DDL) and a row write.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use weir_actors::TargetAction;

use super::plan::DdlStep;
use crate::sql::owners::Claim;
use crate::sql::{SqlValue, TableSchema};

/// What the table sink does to one table: settle its registration
/// (`claim`, for a table weir manages), then run its DDL steps (none when
/// it is unchanged, or the user manages it). `schema` is set for a
/// declared table (the child-handler factory builds the rows' handler
/// from it) and for a table the user manages that is no longer declared
/// (`drop_state` deletes its rows one by one through that handler); it is
/// unset when weir drops the table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TableAction {
    /// The table's name.
    pub table: String,
    /// Its schema (see above).
    pub schema: Option<TableSchema>,
    /// The DDL, in order.
    pub ddl: Vec<DdlStep>,
    /// The registration to settle first (a table weir manages).
    pub claim: Option<Claim>,
}

impl TableAction {
    /// The action of `action`, whatever its kind.
    pub(crate) fn of(action: &TargetAction<TableAction>) -> &TableAction {
        match action {
            TargetAction::Create(a) | TargetAction::Update(a) | TargetAction::Delete(a) => a,
        }
    }
}

/// What the row sink does: upsert the row `values` (create, update), or
/// delete the row whose primary key values are `values` (delete).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct RowWrite {
    /// The table (shared by the table's row actions).
    pub table: Arc<str>,
    /// Every column's value on an upsert, the key's on a delete.
    pub values: Vec<SqlValue>,
}
