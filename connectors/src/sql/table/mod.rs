//! The SQL table target, shared by the PostgreSQL and SQLite connectors.
//!
//! A table is a container target state keyed by `[database, table]`;
//! its rows are its children, keyed by primary key and tracked by a
//! fingerprint of their values. What does not depend on the database
//! engine lives here:
//!
//! - [`handler`]: the table handler, whose `reconcile` plans a table's DDL;
//! - [`plan`]: schema evolution, as idempotent DDL steps;
//! - [`keys`]: row keys back to typed primary key values, for deletes.
//!
//! Each dialect (`postgres`, `sqlite`) keeps what really differs: the SQL
//! text of its types and statements, how it binds a batch of rows (arrays
//! and `UNNEST` against multi-row `VALUES`), its transactions and locks,
//! and how it carries out a DDL step (PostgreSQL's `IF [NOT] EXISTS`,
//! SQLite's look at the table's columns first).

pub(crate) mod handler;
pub(crate) mod keys;
pub(crate) mod plan;
