//! ftkv's deterministic simulator, apart from the library: the production code runs unchanged
//! on a seeded world that installs itself at run time through the library's one seam to the
//! operating system (`ftkv::rt`), as FoundationDB swaps its network.
//!
//! - [`world`]: every thread of every rank a task of one seeded scheduler, virtual time,
//!   faults at any step, on ftkv's in-process fabric (`ftkv::fabric::local`).
//! - [`store`]: the production store (data path, detector, global recovery, localized repair,
//!   fencing, growth) on the world; [`transactions`]: its transactions there.
//! - [`recovery`]: the global recovery's engine (`ftkv::engine::attempt`) alone on a simulated
//!   ULFM fabric.
//! - [`scenario`]: the drawing of ranks, hosts and kills every model shares.
//! - [`history`] and [`txn_log`]: the oracles every failure test judges by, here and in the
//!   real-MPI chaos campaign.

#![forbid(unsafe_code)]

pub mod history;
pub mod recovery;
pub mod scenario;
pub mod store;
pub mod transactions;
pub mod txn_log;
pub mod world;
