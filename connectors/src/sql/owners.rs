//! The registry of table owners, shared by the SQL connectors.
//!
//! Every table weir creates is registered in its own database with its
//! [`Owner`]: the worker group, or the ledger, of the app that created it.
//! Two owners of one table would undo each other's work (each deletes the
//! rows it does not track; one's schema change or drop destroys the
//! other's rows), so every action on a system-managed table first settles
//! its registration, in the transaction of its DDL:
//!
//! - a table with no registration is registered to the acting owner (a
//!   new table, or one created before the registry existed);
//! - a table registered to the acting owner goes on;
//! - a table registered to another owner is refused with a permanent
//!   error naming that owner, and nothing is changed, unless the app was
//!   built with [`AppBuilder::adopt_tables`](weir_actors::AppBuilder::adopt_tables):
//!   the acting owner then takes it over (its old owner's ledger is lost),
//!   with a warning;
//! - a table dropped by its owner loses its registration with it. A drop
//!   by another owner is refused like any other action;
//! - a registration whose table no longer exists (dropped by hand) guards
//!   nothing: it goes to the next owner that creates the table.
//!
//! Tables the user manages ([`ManagedBy::User`](weir_actors::statediff::ManagedBy))
//! are not registered: weir never creates, alters or drops them.
//!
//! The registry is `weir.table_owner` in PostgreSQL (a schema of weir's
//! own, beside the worker groups' tables), keyed by each table's
//! schema-qualified name; for SQLite, the table `table_owner` of a small
//! database beside the file, attached as schema `weir` (see
//! `crate::sqlite::owners`), never among the user's tables.

use serde::{Deserialize, Serialize};
use weir_actors::{Error, Owner, Result};

/// What a table action asks of the registry: the acting owner, and
/// whether it may take the table over from another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Claim {
    pub owner: Owner,
    pub adopt: bool,
}

/// What to do about a table's registration.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// No owner is registered: register the acting one.
    Register,
    /// The acting owner is registered: nothing to do.
    Ours,
    /// Another owner is registered, and the table is adopted: replace it.
    Adopt(Owner),
}

/// Judges `claim` against the owner registered for `table` (`found`) in
/// the database named `database`, where the table `exists` or not.
///
/// # Errors
/// A permanent error naming both owners when another owner holds the
/// table and the claim does not adopt it.
pub(crate) fn judge(
    database: &str,
    table: &str,
    claim: &Claim,
    found: Option<Owner>,
    exists: bool,
) -> Result<Verdict> {
    match found {
        None => Ok(Verdict::Register),
        // Nothing left to guard: the table was dropped (by hand).
        Some(found) if !exists && found.key() != claim.owner.key() => Ok(Verdict::Adopt(found)),
        Some(found) if found.key() == claim.owner.key() => Ok(Verdict::Ours),
        Some(found) if claim.adopt => {
            tracing::warn!(
                "{database}: taking table {table} over from {found}, as asked (adopt): rows it wrote that are not declared again stay, since {} does not know them",
                claim.owner
            );
            Ok(Verdict::Adopt(found))
        }
        Some(found) => Err(refused(database, table, &found, &claim.owner)),
    }
}

/// The error of an action on a table another owner manages.
pub(crate) fn refused(database: &str, table: &str, found: &Owner, ours: &Owner) -> Error {
    Error::permanent(format!(
        "{database}: table {table} is managed by {found}, not by this app ({ours}); nothing was changed. Two owners of one table would undo each other's work. If {found} is lost for good, take the table over explicitly: build the app with AppBuilder::adopt_tables (weir sync --adopt)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(owner: &Owner, adopt: bool) -> Claim {
        Claim {
            owner: owner.clone(),
            adopt,
        }
    }

    #[test]
    fn an_unregistered_table_is_registered_and_a_table_of_ones_own_goes_on() {
        let me = Owner::ledger("a", "host:/a");
        assert_eq!(
            judge("db", "t", &claim(&me, false), None, true).ok(),
            Some(Verdict::Register)
        );
        let found = Owner::from_parts(me.key(), "an older description");
        assert_eq!(
            judge("db", "t", &claim(&me, false), Some(found), true).ok(),
            Some(Verdict::Ours)
        );
    }

    #[test]
    fn a_table_of_another_owner_is_refused_naming_both_unless_adopted() {
        let me = Owner::ledger("a", "host:/a");
        let other = Owner::group("g");
        let err = judge("db", "t", &claim(&me, false), Some(other.clone()), true)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("worker group g"), "{err}");
        assert!(err.contains("the ledger a at host:/a"), "{err}");
        assert!(err.contains("adopt"), "{err}");
        assert_eq!(
            judge("db", "t", &claim(&me, true), Some(other.clone()), true).ok(),
            Some(Verdict::Adopt(other))
        );
    }

    #[test]
    fn the_registration_of_a_table_that_no_longer_exists_goes_to_the_next_owner() {
        let me = Owner::ledger("a", "host:/a");
        let other = Owner::group("g");
        assert_eq!(
            judge("db", "t", &claim(&me, false), Some(other.clone()), false).ok(),
            Some(Verdict::Adopt(other))
        );
    }
}
