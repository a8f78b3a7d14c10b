//! Library half of the `ftkv` command: launching jobs under Open MPI's `mpirun` (also used by the
//! multi-rank tests) and the subcommands' implementations.

pub mod bench;
pub mod chaos;
pub mod env;
pub mod launch;
pub mod ping;
pub mod probe;
pub mod tasks;
pub mod values;
