//! Source and target connectors for weir, one module per external system.
//!
//! Connectors are built on the public model of `weir-actors` only: a
//! [`TargetHandler`](weir_actors::TargetHandler) per kind of target state
//! and a [`TargetActionSink`](weir_actors::TargetActionSink) per external
//! resource.

#[cfg(feature = "sql")]
pub mod sql;

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "localfs"))]
mod observe;

#[cfg(feature = "localfs")]
pub mod localfs;

#[cfg(feature = "sqlite")]
pub mod sqlite;

#[cfg(feature = "postgres")]
pub mod postgres;

#[cfg(feature = "nats")]
pub mod nats;
