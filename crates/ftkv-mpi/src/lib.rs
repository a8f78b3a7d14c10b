//! Safe, fault-aware bindings to Open MPI 5 with ULFM, the only crate of ftkv with `unsafe` code.
//!
//! - [`Mpi`] initialises MPI with `MPI_THREAD_MULTIPLE` and `MPI_ERRORS_RETURN`; every handle
//!   ([`Comm`], [`Window`]) keeps the runtime alive, and MPI is finalised when the last one goes.
//! - Every MPI return code is checked and becomes a [`MpiError`]: peers' failures are
//!   [`MpiError::ProcFailed`] / [`MpiError::Revoked`], never a panic.
//! - One-sided calls against a dead target may *hang* or *silently succeed* in Open MPI (see
//!   `ftkv probe`); this crate reports what MPI reports and bounds nothing by itself except the
//!   operations that take a deadline. Callers bound the rest (ftkv's watchdog).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod c_abi;
mod comm;
mod error;
pub mod extent;
pub mod failpoint;
mod ffi;
mod hybrid;
pub mod process;
mod remote;
mod request;
mod runtime;
pub mod sched;
mod window;

pub use comm::{
    beside_fault_tolerant_calls, Agreed, Comm, PendingAgreement, Status, ANY_SOURCE, ANY_TAG,
};
pub use error::{MpiError, Result};
pub use hybrid::{HostScope, HostWindow};
pub use request::{RecvRequest, SendRequest};
pub use runtime::{
    default_heartbeat_detector, end_job, fault_tolerant_defaults, shared_memory_capacity, wtime,
    Mpi, DEFAULT_SUSPICION, NOT_FAULT_TOLERANT_COLLECTIVES,
};
pub use window::{LockKind, LockedWindow, RmaScope, TargetLock, Window, WindowKind};
