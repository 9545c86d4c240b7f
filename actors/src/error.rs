//! The error type of weir.

use std::fmt;

use crate::model::key::StableKey;
use crate::model::path::ComponentPath;

/// The result type of weir.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A component that failed in an update, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ComponentFailure {
    /// The path of the failed component.
    pub path: ComponentPath,
    /// What went wrong, as a sentence.
    pub cause: String,
    /// Whether retrying the same work later may succeed.
    pub retriable: bool,
    /// How many runs in a row the component has failed, this one
    /// included (1 unless the ledger counted earlier failed runs).
    pub failed_runs: u32,
    /// Whether it waits for the root partition's holder of its worker
    /// group ([`Error::is_root_pending`]).
    root_pending: bool,
}

impl ComponentFailure {
    pub(crate) fn new(path: ComponentPath, error: &Error) -> Self {
        Self {
            path,
            cause: error.to_string(),
            retriable: error.is_retriable(),
            failed_runs: 1,
            root_pending: error.is_root_pending(),
        }
    }

    /// Whether the component did not run because its member of a worker
    /// group waits for the root partition's holder (see
    /// [`Error::is_root_pending`]): not a failure of its own.
    pub fn is_root_pending(&self) -> bool {
        self.root_pending
    }
}

impl fmt::Display for ComponentFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "component {}: {}", self.path, self.cause)
    }
}

/// The kind of an [`Error`], to tell failures apart without matching strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A failure described by a message (user code, a sink, a handler).
    Other,
    /// A failure that retrying cannot fix (a constraint violation, bad input).
    Permanent,
    /// An I/O error.
    Io,
    /// The ledger could not be read or written.
    Ledger,
    /// A value, record or action could not be encoded or decoded.
    Codec,
    /// A database driver error.
    Database,
    /// Invalid configuration or usage of the API.
    Usage,
    /// One or more components failed during an update.
    ComponentsFailed,
    /// The engine is shutting down or has shut down.
    Shutdown,
    /// A component was cancelled: the future of its mount or run was dropped.
    Cancelled,
    /// A root-level component outside the run's scope (or of a partition
    /// this member of a worker group does not hold) was mounted.
    OutOfScope,
    /// A write for partitions another member of the worker group took over.
    Fenced,
}

impl ErrorKind {
    /// The kind's name in snake case (`database`, `permanent`), as metric
    /// labels and logs give it.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Other => "other",
            ErrorKind::Permanent => "permanent",
            ErrorKind::Io => "io",
            ErrorKind::Ledger => "ledger",
            ErrorKind::Codec => "codec",
            ErrorKind::Database => "database",
            ErrorKind::Usage => "usage",
            ErrorKind::ComponentsFailed => "components_failed",
            ErrorKind::Shutdown => "shutdown",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::OutOfScope => "out_of_scope",
            ErrorKind::Fenced => "fenced",
        }
    }
}

/// Everything that can go wrong in weir.
///
/// Every error names what failed: the key, the provider, the component or the
/// ledger path. Use [`Error::kind`] and [`Error::is_retriable`] to classify.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A failure described by a message; retriable unless made with [`Error::permanent`].
    #[error("{message}")]
    Message {
        /// The message.
        message: String,
        /// Whether retrying may succeed.
        retriable: bool,
    },
    /// An I/O error.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The sled store behind the ledger failed.
    #[error("ledger storage error: {0}")]
    Storage(#[from] sled::Error),
    /// A value could not be encoded with MessagePack.
    #[error("cannot encode value: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
    /// A value could not be decoded from MessagePack.
    #[error("cannot decode value: {0}")]
    Decode(#[from] rmp_serde::decode::Error),
    /// A database driver error.
    #[cfg(feature = "sqlx")]
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The same target state was declared twice in one run.
    #[error("target state {key} of provider {provider} is declared twice in this run{}", first_by.as_ref().map(|p| format!(" (first by component {p})")).unwrap_or_default())]
    DuplicateDeclaration {
        /// The provider path.
        provider: String,
        /// The key declared twice.
        key: StableKey,
        /// The component that declared it first, when known.
        first_by: Option<ComponentPath>,
    },
    /// A handler's `reconcile` (or a child-handler factory) failed for a key.
    #[error("provider {provider}, key {key}: {cause}")]
    Reconcile {
        /// The provider path.
        provider: String,
        /// The key being reconciled.
        key: StableKey,
        /// Why it failed.
        #[source]
        cause: Box<Error>,
    },
    /// A sink call failed for the actions of a component.
    #[error("sink {sink} failed applying {actions} action(s) (keys {keys}): {cause}")]
    Sink {
        /// The sink, named by the providers whose actions it applies.
        sink: String,
        /// How many actions the failed call carried for this component.
        actions: usize,
        /// The first keys of the failed actions.
        keys: String,
        /// Why it failed.
        #[source]
        cause: Box<Error>,
    },
    /// One or more components failed; every other component was committed.
    #[error("{} component(s) failed: {}", .0.len(), .0.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("; "))]
    ComponentsFailed(Vec<ComponentFailure>),
    /// The ledger is in use by another `App` (in this process or another).
    #[error("ledger at {path} is already open in another App or process; close it (drop the App, stop the other process) and try again")]
    LedgerLocked {
        /// The ledger directory.
        path: String,
    },
    /// The ledger was written by an incompatible version of weir.
    #[error("ledger at {path} has format version {found}, but this build of weir reads version {supported}; use a matching weir version or remove the ledger (weir will then forget what it created)")]
    LedgerVersion {
        /// The ledger directory.
        path: String,
        /// The version found.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The ledger's content is damaged.
    #[error("ledger at {path} is corrupt ({detail}); restore it from a backup, or remove it and clean up the targets by hand: weir will not treat it as empty")]
    LedgerCorrupt {
        /// The ledger directory.
        path: String,
        /// What is wrong.
        detail: String,
    },
    /// The API was used in a way it does not support.
    #[error("{0}")]
    Usage(String),
    /// A context key was read but never provided.
    #[error("context key `{0}` was not provided to the App (use AppBuilder::provide_key)")]
    MissingContextKey(String),
    /// The engine stopped before the work completed.
    #[error("the weir engine has shut down: {0}")]
    Shutdown(String),
    /// A shutdown was requested (see [`App::shutdown_handle`](crate::App::shutdown_handle))
    /// while this component was mounting children: the children that had
    /// started were run and committed, the others were not started.
    #[error("component {0} was interrupted by a shutdown request before all its children ran; what finished is committed, the next run does the rest")]
    Interrupted(ComponentPath),
    /// The future of this component's `mount`, or of its run, was dropped
    /// before it committed: its code was stopped, nothing of it was
    /// committed, and its earlier target states stay as they were. Sink
    /// calls it had started finished and are recorded as possible.
    #[error("component {0} was cancelled (the future of its mount or run was dropped) before it committed; its earlier target states stay as they were")]
    Cancelled(ComponentPath),
    /// A root-level component outside the run's scope (see
    /// [`App::scoped`](crate::App::scoped)) was mounted: it is neither run
    /// nor deleted in this run.
    #[error("component {0} is outside the scope of this run: it is neither run nor deleted")]
    OutOfScope(ComponentPath),
    /// A root-level component of a partition this member of a worker
    /// group does not hold was mounted: another member runs it.
    #[error("component {path} is in partition {partition}, which this member of worker group {group} does not hold: another member runs it")]
    NotHeld {
        /// The worker group.
        group: String,
        /// The component.
        path: ComponentPath,
        /// Its partition.
        partition: u32,
    },
    /// A write for partitions of a worker group was refused: another member
    /// took them over (a newer epoch exists). Nothing of it was written,
    /// and this member no longer writes for them.
    #[error("worker group {group}: partition(s) {} were taken over by another member (a newer epoch exists); nothing was written for them", crate::group::list(partitions))]
    Fenced {
        /// The worker group.
        group: String,
        /// The partitions taken over.
        partitions: Vec<crate::group::PartitionId>,
    },
    /// A member of a worker group that does not hold the root partition
    /// declares root states (tables, say) that would need an action
    /// against what the root's holder applied: during a rolling update,
    /// another version of the code declares them otherwise. The root
    /// holder's declaration wins; this member writes nothing until they
    /// agree, and its next run tries again.
    #[error("worker group {group}: {detail}, which differs from what the member holding the root partition applied; the holder's declaration wins, so this member writes nothing until they agree (during a rolling update: until every member runs the same version)")]
    RootPending {
        /// The worker group.
        group: String,
        /// What this member declares that would need an action.
        detail: String,
    },
}

impl Error {
    /// An error with a message. It counts as retriable: a sink failing with it
    /// is retried under the [`RetryPolicy`](crate::RetryPolicy).
    pub fn msg(message: impl fmt::Display) -> Self {
        Error::Message {
            message: message.to_string(),
            retriable: true,
        }
    }

    /// An error that retrying cannot fix: a sink failing with it is not
    /// retried, only split to find the components concerned.
    pub fn permanent(message: impl fmt::Display) -> Self {
        Error::Message {
            message: message.to_string(),
            retriable: false,
        }
    }

    /// Whether this is the error of a `mount` of a root-level component
    /// outside the run's scope ([`App::scoped`](crate::App::scoped)): the
    /// component was neither run nor deleted.
    pub fn is_out_of_scope(&self) -> bool {
        matches!(self, Error::OutOfScope(_) | Error::NotHeld { .. })
    }

    /// Whether this is the error of a `mount` of a root-level component of
    /// a partition this member of a worker group does not hold: another
    /// member runs it, and nothing of it was run or deleted here.
    pub fn is_not_held(&self) -> bool {
        matches!(self, Error::NotHeld { .. })
    }

    /// Whether this member of a worker group waits for the root partition's
    /// holder, whose declaration of a root state differs from its own
    /// (see [`Error::RootPending`]); for a run whose components failed,
    /// whether each of them failed only so.
    pub fn is_root_pending(&self) -> bool {
        match self {
            Error::RootPending { .. } => true,
            Error::ComponentsFailed(failures) => {
                !failures.is_empty() && failures.iter().all(ComponentFailure::is_root_pending)
            }
            Error::Sink { cause, .. } | Error::Reconcile { cause, .. } => cause.is_root_pending(),
            _ => false,
        }
    }

    /// Whether a write was refused because another member of the worker
    /// group took its partitions over (see [`Fence`](crate::Fence)).
    pub fn is_fenced(&self) -> bool {
        match self {
            Error::Fenced { .. } => true,
            Error::Sink { cause, .. } | Error::Reconcile { cause, .. } => cause.is_fenced(),
            _ => false,
        }
    }

    /// The components that failed, when this error reports failed components;
    /// empty otherwise.
    pub fn failed_components(&self) -> &[ComponentFailure] {
        match self {
            Error::ComponentsFailed(failures) => failures,
            _ => &[],
        }
    }

    /// What kind of error this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Message {
                retriable: false, ..
            } => ErrorKind::Permanent,
            Error::Message { .. } => ErrorKind::Other,
            Error::Io(_) => ErrorKind::Io,
            Error::Storage(_)
            | Error::LedgerLocked { .. }
            | Error::LedgerVersion { .. }
            | Error::LedgerCorrupt { .. } => ErrorKind::Ledger,
            Error::Encode(_) | Error::Decode(_) => ErrorKind::Codec,
            #[cfg(feature = "sqlx")]
            Error::Database(_) => ErrorKind::Database,
            Error::DuplicateDeclaration { .. } | Error::Usage(_) | Error::MissingContextKey(_) => {
                ErrorKind::Usage
            }
            Error::Reconcile { cause, .. } | Error::Sink { cause, .. } => cause.kind(),
            Error::ComponentsFailed(_) => ErrorKind::ComponentsFailed,
            Error::Shutdown(_) | Error::Interrupted(_) => ErrorKind::Shutdown,
            Error::Cancelled(_) => ErrorKind::Cancelled,
            Error::OutOfScope(_) | Error::NotHeld { .. } => ErrorKind::OutOfScope,
            Error::Fenced { .. } | Error::RootPending { .. } => ErrorKind::Fenced,
        }
    }

    /// Whether retrying the same work may succeed (a transient failure).
    pub fn is_retriable(&self) -> bool {
        match self {
            Error::Message { retriable, .. } => *retriable,
            Error::Io(_) | Error::Storage(_) => true,
            #[cfg(feature = "sqlx")]
            Error::Database(e) => sqlx_is_retriable(e),
            Error::Reconcile { cause, .. } | Error::Sink { cause, .. } => cause.is_retriable(),
            Error::ComponentsFailed(failures) => failures.iter().all(|f| f.retriable),
            Error::Interrupted(_) | Error::Cancelled(_) | Error::RootPending { .. } => true,
            _ => false,
        }
    }
}

#[cfg(feature = "sqlx")]
fn sqlx_is_retriable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().as_deref().is_some_and(sqlstate_is_transient),
        _ => false,
    }
}

/// Whether a database error's code (a PostgreSQL SQLSTATE, or SQLite's
/// numeric result code) names a failure that retrying may fix: a lost
/// connection, a timeout, a serialization failure, a deadlock, too many
/// connections, a busy database. Constraint violations, bad values and
/// schema mismatches (undefined tables or columns, wrong types) are
/// permanent: the same statement fails the same way.
#[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
pub(crate) fn sqlstate_is_transient(code: &str) -> bool {
    // A SQLSTATE has five characters; SQLite's codes (extended ones
    // included) have at most four digits.
    if code.len() < 5 {
        // SQLITE_BUSY, SQLITE_LOCKED, SQLITE_IOERR, SQLITE_PROTOCOL.
        return code
            .parse::<i32>()
            .is_ok_and(|sqlite| matches!(sqlite & 0xff, 5 | 6 | 10 | 15));
    }
    // Class 08: connection exception; 40001 serialization failure; 40P01
    // deadlock; 53300 too many connections (and the rest of class 53,
    // insufficient resources); 57014 cancelled (statement timeout); 57P0x
    // the server shutting down or restarting; 55P03 lock not available
    // (lock timeout); 58xxx system errors (i/o).
    code.starts_with("08")
        || code.starts_with("53")
        || code.starts_with("58")
        || matches!(
            code,
            "40001" | "40P01" | "57014" | "57P01" | "57P02" | "57P03" | "57P05" | "55P03"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msg_errors_are_retriable_and_permanent_ones_are_not() {
        assert!(Error::msg("boom").is_retriable());
        assert!(!Error::permanent("bad row").is_retriable());
        assert_eq!(Error::permanent("x").kind(), ErrorKind::Permanent);
    }

    #[test]
    fn database_codes_of_lost_connections_timeouts_and_conflicts_are_transient() {
        for code in [
            "08006", "08001", "40001", "40P01", "53300", "57014", "57P01", "55P03", "58030", "5",
            "517", "6", "10",
        ] {
            assert!(sqlstate_is_transient(code), "{code}");
        }
    }

    #[test]
    fn database_codes_of_constraints_bad_values_and_schema_mismatches_are_permanent() {
        // Unique, foreign key, not null and check violations; invalid
        // text, numeric overflow; undefined table and column, datatype
        // mismatch; SQLite's constraint, mismatch and "no such table"
        // (a generic error).
        for code in [
            "23505", "23503", "23502", "23514", "22P02", "22003", "42P01", "42703", "42804",
            "2067", "19", "20", "1",
        ] {
            assert!(!sqlstate_is_transient(code), "{code}");
        }
    }

    #[test]
    fn components_failed_lists_each_path_and_cause() {
        let failure = ComponentFailure::new(
            ComponentPath::root().child(StableKey::Str("doc".into())),
            &Error::msg("bad input"),
        );
        let err = Error::ComponentsFailed(vec![failure]);
        assert_eq!(err.failed_components().len(), 1);
        let text = err.to_string();
        assert!(text.contains("/doc"), "{text}");
        assert!(text.contains("bad input"), "{text}");
        assert!(Error::msg("x").failed_components().is_empty());
    }
}
