//! The transaction protocol's engines: the [`coordinator`] of one transaction, the
//! [`resolution`] of a record its failed coordinator left open, and the data they share
//! ([`types`]). [`crate::txn`] is their runtime.

pub mod coordinator;
pub mod resolution;
pub mod types;
