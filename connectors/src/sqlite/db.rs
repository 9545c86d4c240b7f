//! The SQLite dialect of the shared table target (`crate::sql::table`)
//! (its trait implementation is in `dialect`).

use crate::sql::table::dialect::{Database, Table};

/// The SQLite dialect.
pub(crate) struct Sqlite;

/// A SQLite database of an app, and a table declared in it.
pub(crate) type SqDatabase = Database<Sqlite>;
pub(crate) type SqTable = Table<Sqlite>;
