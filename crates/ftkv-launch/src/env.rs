//! Every environment variable ftkv reads, with its default. `docs/environment.md` mirrors this
//! table.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `FTKV_MPIRUN` | `<venv>/bin/mpirun` | the `mpirun` that launches ranks |
//! | `FTKV_VENV` | `<workspace>/.venv` | the venv `scripts/setup.sh` creates (Open MPI from PyPI) |
//! | `FTKV_FAILPOINT` | unset | `name[@ranks][#n]` entries: SIGKILL a rank at a named point |
//! | `FTKV_TRACE` | unset | set: each rank traces its recovery steps on stderr (`ftkv chaos` sets it; ftkv passes it, and `FTKV_FAILPOINT`, on to the ranks of every job it launches) |
//! | `FTKV_MAX_RANKS` | 8 × the cores | the most ranks a job ftkv launches may have (`-n`, `--ranks`, `--writers`) |
//! | `FTKV_NODES` | unset | N: jobs run over N hosts simulated on this machine (`--nodes N` sets it) |
//! | `FTKV_HOSTFILE` | unset | a hostfile passed to mpirun; ranks follow its slots (`--hostfile FILE` sets it) |
//! | `FTKV_MAP_BY` | by slot | mpirun's `--map-by` (`--map-by SPEC` sets it) |
//! | `FTKV_TEST_BTL` | unset | `tcp`: the real-MPI tests run over `--mca btl self,tcp`, pinned to `lo` |
//! | `FTKV_STACKS_ON_HANG` | unset | set: a job that times out prints its ranks' stacks (`gdb`) before it is killed ([`crate::launch::STACKS_ON_HANG_VAR`]) |
//! | `FTKV_TCP_IF_INCLUDE` | unset | subnets (`a.b.c.d/len`) or interface names, comma-separated: the interface a rank listens on for other hosts' puts (else Open MPI's `btl_tcp_if_include`, else the first non-loopback address) |
//! | `OMPI_MCA_btl` | `^ofi` | set by ftkv when unset: skips probing for absent fabrics |
//! | `OMPI_MCA_osc` | `^ucx` | set by ftkv when unset: skips probing for absent fabrics |
//! | `OMPI_COMM_WORLD_SIZE` | set by `mpirun` | present: ftkv runs as a rank, absent: it launches itself |

use std::path::PathBuf;

/// The workspace this binary was built from (where `scripts/setup.sh` puts the venv).
pub fn workspace_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The project venv: `FTKV_VENV` or `<workspace>/.venv`.
pub fn venv_dir() -> PathBuf {
    std::env::var_os("FTKV_VENV").map_or_else(|| workspace_dir().join(".venv"), PathBuf::from)
}

/// The `mpirun` to use: `FTKV_MPIRUN` or the venv's.
pub fn mpirun() -> PathBuf {
    std::env::var_os("FTKV_MPIRUN").map_or_else(|| venv_dir().join("bin/mpirun"), PathBuf::from)
}

/// `FTKV_MAX_RANKS`, if set: overrides the limit on a job's ranks that ftkv derives from the
/// machine's cores (`args::rank_limit` parses it and refuses a value that is not a number ≥ 1).
pub fn max_ranks() -> Option<std::ffi::OsString> {
    std::env::var_os("FTKV_MAX_RANKS")
}

/// MCA defaults ftkv applies unless the user set them: the PyPI build probes for OFI and UCX
/// hardware that this kind of machine lacks, which costs ~1 s per start-up; Open MPI's
/// collective components that are not fault tolerant (`coll/han`, `coll/cuda`) are left out
/// (see `ftkv_mpi::NOT_FAULT_TOLERANT_COLLECTIVES`).
pub const MCA_DEFAULTS: [(&str, &str); 3] =
    [("OMPI_MCA_btl", "^ofi"), ("OMPI_MCA_osc", "^ucx"), ("OMPI_MCA_coll", "^han,cuda")];

/// Whether this process was started by `mpirun` as one rank of a job.
pub fn running_under_mpirun() -> bool {
    std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some()
}

/// The world rank given by `mpirun`, if any.
pub fn world_rank() -> Option<i32> {
    std::env::var("OMPI_COMM_WORLD_RANK").ok()?.parse().ok()
}
