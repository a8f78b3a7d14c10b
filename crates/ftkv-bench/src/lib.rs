//! ftkv's benchmarks, each comparing side by side in one run and writing its results to a
//! file: the put path against raw MPI RMA and two-sided messages (`bench`), the store against
//! raw RMA, Redis and etcd (`bench_store`, with the peer servers it starts on 127.0.0.1 in
//! `peers`; the checkpoint workload every system runs is `workload`), recovery times
//! (`bench_recovery`), the latency statistics, plots and machine readings they share, and what
//! their rank programs report to their drivers (`reports`).

#![forbid(unsafe_code)]

pub mod bench;
pub mod bench_recovery;
pub mod bench_scale;
pub mod bench_store;
pub mod machine;
pub mod peers;
pub mod plot;
pub mod reports;
pub mod stats;
pub mod workload;
