//! The actors of the engine. Messages are crate-private.
//!
//! - [`component`]: runs user code and drives a component through
//!   reconcile, apply and commit;
//! - [`reconciler`]: the shards that own target states;
//! - [`sink`]: batches actions per sink identity, splits and retries;
//! - [`ledger`]: the single writer of the sled ledger;
//! - [`cleanup`]: deletes what is no longer declared at the end of a run;
//! - [`pipeline`]: starts and stops all of them;
//! - [`threads`]: how their threads are scheduled.

pub(crate) mod cleanup;
pub(crate) mod component;
pub(crate) mod guard;
pub(crate) mod ledger;
mod list_index;
pub(crate) mod pipeline;
pub(crate) mod reconciler;
pub(crate) mod sink;
pub(crate) mod tasks;
pub(crate) mod threads;
