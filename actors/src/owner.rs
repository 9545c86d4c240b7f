//! Who owns what an app creates in an external system.
//!
//! Two apps with separate ledgers that manage one table would undo each
//! other: each deletes the rows it does not track, and the second one's
//! schema change or drop destroys the first one's data. Connectors that
//! create tables register each with its owner in the table's own database
//! (the PostgreSQL and SQLite connectors do), and refuse to manage a table
//! registered to another owner. An app's owner is its worker group when it
//! has one (every member manages the group's tables), and otherwise its
//! ledger, named by an identity the ledger was given when it was created.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The owner of the tables (and other containers) an app creates: its
/// worker group, or its ledger. See [`App::owner`](crate::App::owner).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Owner {
    key: String,
    description: String,
}

impl Owner {
    /// The owner that is the ledger with identity `id`, found at
    /// `location` (a host and a path, to tell people where it is).
    pub fn ledger(id: &str, location: &str) -> Self {
        Self {
            key: format!("ledger:{id}"),
            description: format!("the ledger {id} at {location}"),
        }
    }

    /// The owner that is the worker group `name`.
    pub fn group(name: &str) -> Self {
        Self {
            key: format!("group:{name}"),
            description: format!("worker group {name}"),
        }
    }

    /// An owner as a registry stored it: its key and its description.
    pub fn from_parts(key: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            description: description.into(),
        }
    }

    /// What identifies the owner (`ledger:<uuid>` or `group:<name>`): two
    /// owners are the same exactly when their keys are equal.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The owner for people: `worker group NAME`, or `the ledger <uuid> at
    /// HOST:PATH`.
    pub fn description(&self) -> &str {
        &self.description
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.description)
    }
}

/// The host name, for telling people where a ledger or a member is.
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_string())
}
