//! The SQL table target, shared by the PostgreSQL and SQLite connectors.
//!
//! A table is a container target state keyed by `[database, table]`;
//! its rows are its children, keyed by primary key and tracked by a
//! fingerprint of their values. What does not depend on the database
//! engine lives here:
//!
//! - [`target`]: declaring tables and rows (what each dialect's
//!   `TableTarget`, `mount_table_target` and `declare_table_target` do);
//! - [`sinks`]: one database's two sinks (one for DDL, one for the rows of
//!   all its tables), kept by the app;
//! - [`actions`]: what those sinks are asked to do;
//! - [`dialect`]: what each dialect supplies, and a database's declared
//!   tables as its sinks know them;
//! - [`handler`]: the table handler, whose `reconcile` plans a table's DDL;
//! - [`plan`]: schema evolution, as idempotent DDL steps;
//! - [`rows`]: the rows' handler, and the grouping of a sink call's rows
//!   by table (one action per key, parents' tables first);
//! - [`keys`]: row keys back to typed primary key values, for deletes.
//!
//! Each dialect (`postgres`, `sqlite`) implements [`dialect::Dialect`]:
//! only what really differs. Its name rules (SQLite ignores the case of
//! names), the SQL text of its types and statements, how it binds a batch
//! of rows (PostgreSQL's arrays and `UNNEST`, SQLite's multi-row
//! `VALUES`), its transactions and locks, and how it carries out a DDL
//! step (PostgreSQL's `IF [NOT] EXISTS`, SQLite's look at the table's
//! columns first).

pub(crate) mod actions;
pub(crate) mod dialect;
pub(crate) mod handler;
pub(crate) mod keys;
pub(crate) mod plan;
pub(crate) mod rows;
pub(crate) mod sinks;
pub(crate) mod target;
