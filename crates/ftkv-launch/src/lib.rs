//! Launching ftkv's jobs: `mpirun --with-ft ulfm` on this machine, on a real hostfile or on
//! hosts simulated with network namespaces; the jobs' output by rank, the ranks' errors said
//! once each, their timeouts and the end of every process they started; the limits a job must
//! fit; one interrupt handler. Used by the `ftkv` command, the benchmarks, the chaos campaign
//! and the multi-rank tests. No MPI is linked here: jobs are separate processes.

#![forbid(unsafe_code)]

pub mod args;
pub mod cluster;
pub mod env;
pub mod interrupt;
pub mod launch;
pub mod progress;
pub mod rank_errors;
pub mod records;
