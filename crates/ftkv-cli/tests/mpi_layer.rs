//! Real multi-rank tests of the safe MPI layer under `mpirun --with-ft ulfm`. Each job has a hard
//! timeout; every surviving rank's own output is checked.

use std::time::Duration;

use ftkv_cli::launch::{JobOutput, Launch};
use ftkv_cli::reports::{
    DetectedReport, HelloReport, Passed, RingReport, ShrunkReport, SwapsAfterKillReport,
};

mod common;

use common::run;

fn job(case: &str, ranks: usize) -> Launch {
    common::job(case, ranks, Duration::from_secs(30))
}

/// Rank `rank`'s report of `kind`; fails the test with the transcript when it has none.
fn report<T: serde::de::DeserializeOwned>(out: &JobOutput, rank: usize, kind: &str) -> T {
    let report = out.rank_report(rank, kind).expect("a JSON report");
    report.unwrap_or_else(|| panic!("rank {rank}: no {kind} report:\n{}", out.transcript()))
}

/// Rank `rank` reported that step `kind` passed (`kind {}`).
fn assert_passed(out: &JobOutput, rank: usize, kind: &str) {
    let _: Passed = report(out, rank, kind);
}

#[test]
fn every_rank_sees_the_world() {
    let out = run(job("hello", 4));
    for rank in 0..4 {
        let hello: HelloReport = report(&out, rank, "hello");
        assert_eq!(hello, HelloReport { rank: rank as i32, size: 4 });
        assert_passed(&out, rank, "done");
    }
}

#[test]
fn send_recv_and_ping_round_trip() {
    let out = run(job("sendrecv", 4));
    for rank in 0..4 {
        let ring: RingReport = report(&out, rank, "ring");
        assert_eq!(ring.from, (rank as i32 + 3) % 4);
        assert!(ring.ping_us < 1_000_000, "ping took {} µs", ring.ping_us);
        assert_passed(&out, rank, "done");
    }
}

#[test]
fn rma_put_get_and_atomics_round_trip() {
    let out = run(job("rma", 4));
    assert_passed(&out, 0, "atomics");
    for rank in 0..4 {
        assert_passed(&out, rank, "rma");
        assert_passed(&out, rank, "done");
    }
}

/// A host-mate SIGKILLed from outside while it and another rank race compare-and-swap loops on
/// its word (`cas-victim`, 3 ranks on one host) blocks no survivor's later swap, on its word or
/// on a survivor's: swaps leave nothing held at any instant (a spin lock in Open MPI's osc sm,
/// held by a rank killed inside `MPI_Compare_and_swap`, would hold them forever).
#[test]
fn a_rank_killed_inside_its_compare_and_swap_blocks_no_survivor() {
    let out = common::job_with_outside_kills(job("cas-victim", 3), 3, &[1]);
    for survivor in [0, 2] {
        let swaps: SwapsAfterKillReport = report(&out, survivor, "swaps");
        assert!(swaps.on_the_dead > 0 && swaps.on_a_survivor > 0, "rank {survivor}: {swaps:?}");
    }
}

#[test]
fn killed_rank_is_reported_to_a_ping_within_one_second() {
    let out = run(job("detect", 4).env("FTKV_FAILPOINT", "detect_kill@2").env("FTKV_VICTIM", "2"));
    let detected: DetectedReport = report(&out, 0, "detected");
    assert!(detected.ms < 1000, "detection took {} ms", detected.ms);
    for rank in [0, 1, 3] {
        let shrunk: ShrunkReport = report(&out, rank, "shrunk");
        assert_eq!((shrunk.size, shrunk.failed), (3, vec![2]), "rank {rank}");
        assert_passed(&out, rank, "done");
    }
    assert!(out.rank_lines(2).is_empty(), "the killed rank printed:\n{}", out.transcript());
}

#[test]
fn revoke_shrink_and_a_new_window_on_the_survivors() {
    let out = run(job("shrink", 4).env("FTKV_FAILPOINT", "shrink_kill@1"));
    for rank in [0, 2, 3] {
        let shrunk: ShrunkReport = report(&out, rank, "shrunk");
        assert_eq!((shrunk.size, &shrunk.failed), (3, &vec![1]), "rank {rank}");
        assert!(shrunk.barrier_failed.is_some(), "rank {rank}: {shrunk:?}");
        assert_passed(&out, rank, "rma");
        assert_passed(&out, rank, "done");
    }
    assert_passed(&out, 0, "atomics");
}
