//! The `ftkv` command's own parts: the demo's task runs, the probe, ping, how a rank reports a
//! failure, and how events are rendered. The launcher, the benchmarks and the chaos campaign
//! live in their own crates and are re-exported under their old names.

#![forbid(unsafe_code)]

pub use ftkv_bench::{bench, bench_recovery, bench_scale, bench_store, machine, peers, stats};
pub use ftkv_chaos as chaos;
pub use ftkv_launch::rank_println;
pub use ftkv_launch::{args, cluster, env, interrupt, launch, progress, rank_errors, records};

pub mod ping;
pub mod probe;
pub mod rank_failure;
pub mod reports;
pub mod sim_scale;
pub mod sockets;
pub mod tasks;
pub mod trace;
