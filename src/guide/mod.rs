//! The user guide: the `weir` command, embedding the engine, and how it
//! works, one module per topic.
//!
//! These modules hold no code, only documentation (their text is in
//! `src/guide/*.md`). Their Rust examples are doctests, run by
//! `cargo test --doc`.
//!
//! - [`command`]: the `weir` command: sync a directory, dry runs, retries,
//!   dropping, PostgreSQL.
//! - [`embedding`]: weir in your program: handlers, sinks, providers,
//!   components.
//! - [`memoization`]: memoization, live mode, retrying failed components,
//!   quarantine, dropping everything.
//! - [`scaling_out`]: worker groups: one sync run by several processes.
//! - [`sources`]: syncing tables and streams, at least once and idempotent.
//! - [`guarantees`]: what weir guarantees, how reliable it is, and how that
//!   is tested.
//! - [`architecture`]: the actors, the threads, and the ledger.
//! - [`connectors`]: local directories, SQLite, PostgreSQL, NATS JetStream.
//! - [`metrics`]: the metric catalogue, Prometheus and Grafana.
//! - [`performance`]: the benchmarks and their measurements.
//! - [`layout`]: the repository's packages and directories.

#[doc = include_str!("command.md")]
pub mod command {}

#[doc = include_str!("embedding.md")]
pub mod embedding {}

#[doc = include_str!("memoization.md")]
pub mod memoization {}

#[doc = include_str!("scaling_out.md")]
pub mod scaling_out {}

#[doc = include_str!("sources.md")]
pub mod sources {}

#[doc = include_str!("guarantees.md")]
pub mod guarantees {}

#[doc = include_str!("architecture.md")]
pub mod architecture {}

#[doc = include_str!("connectors.md")]
pub mod connectors {}

#[doc = include_str!("metrics.md")]
pub mod metrics {}

#[doc = include_str!("performance.md")]
pub mod performance {}

#[doc = include_str!("layout.md")]
pub mod layout {}
