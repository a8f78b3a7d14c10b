//! Every decision of the store without I/O. An engine takes what its runtime saw (an `Event`)
//! and returns what to do next (a `Command`); the runtime, the [`Store`](crate::Store), executes the
//! commands on a fabric and feeds their outcomes back. The pure functions beside them decide
//! where copies live ([`placement`], [`layout`]) and which copy a recovery sends where
//! ([`plan`]). Nothing here touches a fabric, a thread or the clock: the same engines run on
//! MPI and on a seeded simulated world.

pub mod attempt;
pub mod layout;
pub mod placement;
pub mod plan;
pub mod repair;
pub mod txn;
