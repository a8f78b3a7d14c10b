//! Real multi-rank tests of the safe MPI layer under `mpirun --with-ft ulfm`. Each job has a hard
//! timeout; every surviving rank's own output is checked.

use std::time::Duration;

use ftkv_cli::launch::{JobOutput, Launch};

mod common;

use common::run;

fn job(case: &str, ranks: usize) -> Launch {
    common::job(case, ranks, Duration::from_secs(30))
}

fn assert_rank(out: &JobOutput, rank: usize, key: &str, want: &str) {
    assert_eq!(out.rank_value(rank, key), Some(want), "rank {rank} {key}:\n{}", out.transcript());
}

#[test]
fn every_rank_sees_the_world() {
    let out = run(job("hello", 4));
    for rank in 0..4 {
        assert_rank(&out, rank, "rank", &rank.to_string());
        assert_rank(&out, rank, "size", "4");
        assert_rank(&out, rank, "done", "yes");
    }
}

#[test]
fn send_recv_and_ping_round_trip() {
    let out = run(job("sendrecv", 4));
    for rank in 0..4 {
        assert_rank(&out, rank, "ring_from", &((rank + 3) % 4).to_string());
        let rtt: u64 = out.rank_value(rank, "ping_us").expect("ping_us").parse().unwrap();
        assert!(rtt < 1_000_000, "ping took {rtt} µs");
        assert_rank(&out, rank, "done", "yes");
    }
}

#[test]
fn rma_put_get_and_atomics_round_trip() {
    let out = run(job("rma", 4));
    assert_rank(&out, 0, "atomics", "ok");
    for rank in 0..4 {
        assert_rank(&out, rank, "rma", "ok");
        assert_rank(&out, rank, "done", "yes");
    }
}

#[test]
fn killed_rank_is_reported_to_a_ping_within_one_second() {
    let out = run(job("detect", 4).env("FTKV_FAILPOINT", "detect_kill@2").env("FTKV_VICTIM", "2"));
    let ms: u64 = out.rank_value(0, "detected_ms").expect("detected_ms").parse().unwrap();
    assert!(ms < 1000, "detection took {ms} ms");
    for rank in [0, 1, 3] {
        assert_rank(&out, rank, "survivors", "3");
        assert_rank(&out, rank, "done", "yes");
    }
    assert!(out.rank_lines(2).is_empty(), "the killed rank printed:\n{}", out.transcript());
}

#[test]
fn revoke_shrink_and_a_new_window_on_the_survivors() {
    let out = run(job("shrink", 4).env("FTKV_FAILPOINT", "shrink_kill@1"));
    for rank in [0, 2, 3] {
        assert_rank(&out, rank, "shrunk_size", "3");
        assert_rank(&out, rank, "failed", "[1]");
        assert_rank(&out, rank, "rma", "ok");
        assert_rank(&out, rank, "done", "yes");
    }
    assert_rank(&out, 0, "atomics", "ok");
}
