//! weir: declarative, incremental ingestion.
//!
//! Components (async functions you write) read source items and *declare
//! target states*: this row should exist in that table, this file in that
//! directory. weir keeps the external systems equal to what was declared:
//! it creates what is new, updates what changed and deletes what is no
//! longer declared, touching nothing else.
//!
//! This crate is a facade: the engine lives in `weir-actors`, the
//! connectors in `weir-connectors` (re-exported as [`connectors`]).
//! Everything is also in [`prelude`].
//!
//! # Guide
//!
//! - [`guide::command`]: the `weir` command: sync a directory into SQLite
//!   or PostgreSQL, dry runs, retries, dropping.
//! - [`guide::embedding`]: weir in your program: a target's handler and
//!   sink, providers, components.
//! - [`guide::memoization`]: memoization, live mode, retrying failed
//!   components, quarantine, dropping everything.
//! - [`guide::scaling_out`]: worker groups: one sync run by several
//!   processes, coordinated through PostgreSQL.
//! - [`guide::sources`]: syncing a PostgreSQL table or a NATS JetStream
//!   stream, at least once and idempotent.
//! - [`guide::guarantees`]: what weir guarantees, how reliable it is, and
//!   how that is tested.
//! - [`guide::architecture`]: components, reconciler shards, sink actors,
//!   and the ledger.
//! - [`guide::connectors`]: local directories, SQLite, PostgreSQL, NATS
//!   JetStream.
//! - [`guide::metrics`]: the metric catalogue, Prometheus and Grafana.
//! - [`guide::performance`]: the benchmarks and their measurements.
//! - [`guide::layout`]: the repository's packages and directories.

pub use weir_actors::*;

pub mod guide;

/// Source and target connectors.
pub use weir_connectors as connectors;

/// Everything a user or connector author needs, in one import.
pub mod prelude {
    pub use weir_actors::prelude::*;
}

#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
