//! Schema evolution: what DDL takes a table from what weir recorded of it
//! to what is declared, and what that does to its rows.
//!
//! The plan is made in the table handler's `reconcile` (pure: from the
//! tracking records only) as a list of [`DdlStep`]s, which each dialect's
//! table sink carries out. Every step is idempotent: it may run against
//! the table in any of its possible previous forms (several after an
//! interrupted run), and again after a retry.
//!
//! | change (see [`SchemaChange`]) | steps | rows |
//! |---|---|---|
//! | none | none | untouched |
//! | nullable columns added | add them | untouched |
//! | columns dropped, retyped or added as NOT NULL | drop, drop and add, add | all written again (`Lossy`) |
//! | primary key changed | drop the table, create it | all created again (`Destructive`) |
//! | a table that may be missing | create it if missing first | all written again (`Lossy`) |
//! | new, or taken over from the user | create it if missing, add every declared column it lacks | all written again when taken over (`Lossy`) |
//! | no longer declared, weir's | drop it | gone (`Destructive`) |

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use weir_actors::TargetChildInvalidation;

use crate::sql::{Column, SchemaChange, TableSchema};

/// One idempotent DDL step on a table (see the module's documentation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum DdlStep {
    /// Create the table with the declared schema, unless it exists.
    CreateIfMissing,
    /// Drop the table, if it exists.
    DropTable,
    /// Add a column, unless the table has one of that name. Each dialect
    /// says how a NOT NULL column is added to a table with rows.
    AddColumn(Column),
    /// Drop a column, if the table has it.
    DropColumn(String),
}

/// The DDL of a declared table weir manages, and what it does to the rows.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct TablePlan {
    /// The steps, in order.
    pub steps: Vec<DdlStep>,
    /// What the steps do to the rows weir wrote.
    pub invalidation: Option<TargetChildInvalidation>,
}

/// The plan for a table declared with `new`, whose records weir holds are
/// the schemas `prev` (none: a new table, or one taken over from the user;
/// `taken_over` says which).
pub(crate) fn plan(
    prev: &[&TableSchema],
    new: &TableSchema,
    prev_may_be_missing: bool,
    taken_over: bool,
) -> TablePlan {
    if prev.is_empty() {
        return adopt(new, taken_over);
    }
    let mut add: BTreeMap<String, Column> = BTreeMap::new();
    let mut retype: BTreeMap<String, Column> = BTreeMap::new();
    let mut drop: BTreeSet<String> = BTreeSet::new();
    let mut invalidation = None;
    for old in prev {
        let change = old.diff(new);
        invalidation = worse(invalidation, change.child_invalidation());
        match change {
            SchemaChange::Same => {}
            SchemaChange::AddNullable(columns) => {
                add.extend(columns.into_iter().map(|c| (c.name.clone(), c)));
            }
            SchemaChange::Alter {
                add: a,
                drop: d,
                retype: r,
            } => {
                add.extend(a.into_iter().map(|c| (c.name.clone(), c)));
                drop.extend(d);
                retype.extend(r.into_iter().map(|c| (c.name.clone(), c)));
            }
            SchemaChange::Rebuild => return rebuild(),
        }
    }
    let mut steps = Vec::new();
    if prev_may_be_missing {
        // Created if it is missing: its rows may be missing too, so they
        // are written again.
        steps.push(DdlStep::CreateIfMissing);
        invalidation = worse(invalidation, Some(TargetChildInvalidation::Lossy));
    }
    steps.extend(drop.into_iter().map(DdlStep::DropColumn));
    for column in retype.values() {
        steps.push(DdlStep::DropColumn(column.name.clone()));
        steps.push(DdlStep::AddColumn(column.clone()));
    }
    steps.extend(
        add.into_values()
            .filter(|c| !retype.contains_key(&c.name))
            .map(DdlStep::AddColumn),
    );
    TablePlan {
        steps,
        invalidation,
    }
}

/// A table weir starts managing, which may exist already (new to weir, or
/// taken over from the user): created if missing, with every declared
/// column it lacks added. Rows the user wrote into a table taken over may
/// lack what weir would write: they are written again.
fn adopt(new: &TableSchema, taken_over: bool) -> TablePlan {
    let mut steps = vec![DdlStep::CreateIfMissing];
    steps.extend(
        new.columns()
            .iter()
            .filter(|c| !new.is_key(&c.name))
            .cloned()
            .map(DdlStep::AddColumn),
    );
    TablePlan {
        steps,
        invalidation: taken_over.then_some(TargetChildInvalidation::Lossy),
    }
}

/// A new primary key: the table is dropped and created again.
fn rebuild() -> TablePlan {
    TablePlan {
        steps: vec![DdlStep::DropTable, DdlStep::CreateIfMissing],
        invalidation: Some(TargetChildInvalidation::Destructive),
    }
}

/// The worse of two invalidations.
fn worse(
    a: Option<TargetChildInvalidation>,
    b: Option<TargetChildInvalidation>,
) -> Option<TargetChildInvalidation> {
    use TargetChildInvalidation::{Destructive, Lossy};
    match (a, b) {
        (Some(Destructive), _) | (_, Some(Destructive)) => Some(Destructive),
        (Some(Lossy), _) | (_, Some(Lossy)) => Some(Lossy),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::ColumnType;
    use weir_actors::Result;

    fn schema(extra: bool, key: &str) -> Result<TableSchema> {
        let b = TableSchema::builder()
            .column("id", ColumnType::Text)
            .column("n", ColumnType::BigInt)
            .nullable_column("meta", ColumnType::Json);
        let b = if extra {
            b.nullable_column("extra", ColumnType::BigInt)
        } else {
            b
        };
        b.primary_key([key]).build()
    }

    fn column(name: &str, ty: ColumnType) -> Column {
        Column {
            name: name.to_string(),
            ty,
            nullable: true,
        }
    }

    #[test]
    fn an_unchanged_schema_needs_no_ddl_unless_the_table_may_be_missing() -> Result<()> {
        let s = schema(false, "id")?;
        assert_eq!(plan(&[&s], &s, false, false), TablePlan::default());
        assert_eq!(
            plan(&[&s], &s, true, false),
            TablePlan {
                steps: vec![DdlStep::CreateIfMissing],
                invalidation: Some(TargetChildInvalidation::Lossy),
            }
        );
        Ok(())
    }

    #[test]
    fn changes_from_several_possible_schemas_are_merged_idempotently() -> Result<()> {
        let (old, new) = (schema(false, "id")?, schema(true, "id")?);
        let extra = column("extra", ColumnType::BigInt);
        assert_eq!(
            plan(&[&old, &new], &new, false, false),
            TablePlan {
                steps: vec![DdlStep::AddColumn(extra)],
                invalidation: None,
            }
        );
        assert_eq!(
            plan(&[&new], &old, false, false),
            TablePlan {
                steps: vec![DdlStep::DropColumn("extra".into())],
                invalidation: Some(TargetChildInvalidation::Lossy),
            }
        );
        Ok(())
    }

    #[test]
    fn a_retyped_column_is_dropped_and_added_again_and_the_rows_rewritten() -> Result<()> {
        let old = schema(true, "id")?;
        let new = TableSchema::builder()
            .column("id", ColumnType::Text)
            .column("n", ColumnType::BigInt)
            .nullable_column("meta", ColumnType::Json)
            .nullable_column("extra", ColumnType::Text)
            .primary_key(["id"])
            .build()?;
        assert_eq!(
            plan(&[&old], &new, false, false),
            TablePlan {
                steps: vec![
                    DdlStep::DropColumn("extra".into()),
                    DdlStep::AddColumn(column("extra", ColumnType::Text)),
                ],
                invalidation: Some(TargetChildInvalidation::Lossy),
            }
        );
        Ok(())
    }

    #[test]
    fn a_new_primary_key_rebuilds_the_table_whatever_else_changed() -> Result<()> {
        let (old, new) = (schema(false, "id")?, schema(true, "n")?);
        assert_eq!(plan(&[&old, &new], &new, true, false), rebuild());
        Ok(())
    }

    #[test]
    fn a_new_table_is_created_with_its_columns_and_a_taken_over_one_rewrites_its_rows() -> Result<()>
    {
        let s = schema(false, "id")?;
        let steps = vec![
            DdlStep::CreateIfMissing,
            DdlStep::AddColumn(Column {
                name: "n".into(),
                ty: ColumnType::BigInt,
                nullable: false,
            }),
            DdlStep::AddColumn(column("meta", ColumnType::Json)),
        ];
        assert_eq!(
            plan(&[], &s, false, false),
            TablePlan {
                steps: steps.clone(),
                invalidation: None,
            }
        );
        assert_eq!(
            plan(&[], &s, false, true),
            TablePlan {
                steps,
                invalidation: Some(TargetChildInvalidation::Lossy),
            }
        );
        Ok(())
    }
}
