//! Black-box acceptance tests of the engine's contract (`API.md`, its 14
//! guarantees, and the guide's guarantees and reliability, `weir::guide::guarantees`),
//! written against the public API only, with in-memory targets of our own.
//!
//! Each test names the behaviour it checks. The external system is an
//! in-memory map; the sink records every call it gets (including failed
//! ones) so that each key's applications can be counted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

mod app;
mod bad_input;
mod components;
mod containers;
mod crash;
mod failures;
mod keys;
mod nested_containers;
mod ownership;
mod preview_and_drop;
mod stats_and_batching;
