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
