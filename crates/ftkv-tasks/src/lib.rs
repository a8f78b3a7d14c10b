//! The application ftkv exists for: task-parallel computations with known answers (UTS,
//! N-Queens, Fibonacci) on a work-stealing pool whose workers checkpoint into the store and survive
//! SIGKILLed workers with the exact result ([`pool`]).

#![forbid(unsafe_code)]

pub mod events;
pub mod fib;
pub mod forkjoin;
pub mod global_recovery;
pub mod model;
pub mod nqueens;
pub mod pool;
pub mod problem;
pub mod protocol;
pub mod settle;
#[cfg(feature = "sim")]
pub mod sim_world;
pub mod state;
pub mod uts;
pub mod wavefront;
