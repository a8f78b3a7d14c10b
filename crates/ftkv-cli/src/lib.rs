//! Library half of the `ftkv` command: launching jobs under Open MPI's `mpirun` (also used by the
//! multi-rank tests) and the subcommands' implementations.

pub mod args;
pub mod bench;
pub mod bench_recovery;
pub mod bench_store;
pub mod chaos;
pub mod cluster;
pub mod env;
pub mod interrupt;
pub mod launch;
pub mod peers;
pub mod ping;
pub mod probe;
pub mod rank_failure;
pub mod render;
pub mod stats;
pub mod tasks;
