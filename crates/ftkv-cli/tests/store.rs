//! The store on real `mpirun --with-ft ulfm` jobs: round trips, bad input, and SIGKILLed owners,
//! holders, writers mid-put and ranks in recovery. Every run has a hard timeout and every
//! survivor's own output is checked. `FTKV_TEST_BTL=tcp` runs the same jobs over `btl self,tcp`.

use std::collections::HashMap;
use std::time::Duration;

use ftkv_cli::chaos::RecoveryReport;
use ftkv_cli::launch::{JobOutput, Launch, RunningJob};
use ftkv_cli::reports::{
    AckedRound, CasReport, CheckpointRead, ErrorReport, IdleObserverReport, IdleOwnerReport,
    LocalizedReport, Passed, RejectedReport, RoundRead, TxnReport,
};

mod common;

use common::run;

fn job(case: &str, ranks: usize) -> Launch {
    common::job(case, ranks, Duration::from_secs(60))
}

/// One survivor's reads of every worker's checkpoint at the end ([`CheckpointRead`]s).
fn finals(out: &JobOutput, rank: usize) -> Vec<CheckpointRead> {
    out.rank_reports(rank, "read").expect("JSON reads")
}

/// Whether rank `rank` reported `kind {}` (a step that passed).
fn passed(out: &JobOutput, rank: usize, kind: &str) -> bool {
    out.rank_report::<Passed>(rank, kind).expect("JSON").is_some()
}

/// Rank `rank`'s global recoveries, in order.
fn recoveries(out: &JobOutput, rank: usize) -> Vec<RecoveryReport> {
    out.rank_reports(rank, "recovery").expect("JSON recovery reports")
}

/// Every survivor finished and read, for every owner, a round allowed by `allowed(owner)`.
fn assert_survivors_read(
    out: &JobOutput,
    ranks: usize,
    dead: &[usize],
    allowed: impl Fn(i32) -> Vec<u32>,
) {
    for rank in (0..ranks).filter(|r| !dead.contains(r)) {
        let got = finals(out, rank);
        assert_eq!(got.len(), ranks, "rank {rank} read every key:\n{}", out.transcript());
        for read in got {
            let ok = allowed(read.owner);
            assert!(
                matches!(read.round, RoundRead::Round(r) if ok.contains(&r)),
                "rank {rank}: {read:?}, want {ok:?}\n{}",
                out.transcript()
            );
        }
        assert!(passed(out, rank, "done"), "rank {rank}:\n{}", out.transcript());
        let error: Option<ErrorReport> = out.rank_report(rank, "error").expect("JSON");
        assert_eq!(error, None, "rank {rank}:\n{}", out.transcript());
    }
    for rank in dead {
        assert!(finals(out, *rank).is_empty(), "killed rank {rank} reported");
    }
}

/// Every survivor's first global recovery reported exactly `failed` and lost no key.
fn assert_recovered(out: &JobOutput, ranks: usize, dead: &[usize], failed: &[i32]) {
    for rank in (0..ranks).filter(|r| !dead.contains(r)) {
        let first = recoveries(out, rank).into_iter().next();
        let first = first.unwrap_or_else(|| panic!("rank {rank}:\n{}", out.transcript()));
        assert_eq!(first.failed, failed, "rank {rank}:\n{}", out.transcript());
        assert!(first.lost_keys.is_empty(), "rank {rank}:\n{}", out.transcript());
    }
}

#[test]
fn put_get_delete_round_trip_on_2_to_8_ranks() {
    for ranks in [2, 3, 5, 8] {
        let out = run(job("store-rounds", ranks));
        assert_survivors_read(&out, ranks, &[], |_| vec![5]);
        for rank in 0..ranks {
            let deleted = finals(&out, rank).iter().filter(|r| !r.loot_present).count();
            assert_eq!(deleted, ranks, "rank {rank} sees every loot deleted");
        }
    }
}

#[test]
fn bad_input_is_rejected_and_harms_nobody() {
    let out = run(job("store-bad-input", 4));
    for rank in 0..4 {
        assert!(passed(&out, rank, "bad_input"), "rank {rank}:\n{}", out.transcript());
    }
}

#[test]
fn mismatched_or_invalid_configs_fail_on_every_rank() {
    let rejected = |out: &JobOutput, rank: usize| {
        let report: Option<RejectedReport> = out.rank_report(rank, "rejected").expect("JSON");
        report.unwrap_or_else(|| panic!("rank {rank} was not rejected:\n{}", out.transcript()))
    };
    let out = run(job("store-mismatch", 4).env("STORE_ODD_RANK", "2").env("STORE_ODD_COPIES", "1"));
    for rank in 0..4 {
        assert!(!rejected(&out, rank).invalid, "rank {rank}: a mismatch, not an invalid config");
    }
    let out = run(job("store-mismatch", 4).env("STORE_ODD_RANK", "1").env("STORE_ODD_COPIES", "0"));
    assert!(rejected(&out, 1).invalid, "{}", out.transcript());
    for rank in [0, 2, 3] {
        assert!(!rejected(&out, rank).invalid, "rank {rank}: a mismatch, not an invalid config");
    }
}

#[test]
fn killed_owner_keeps_its_last_acknowledged_value() {
    let out = run(job("store-rounds", 4).env("FTKV_FAILPOINT", "store_round@2#3"));
    assert_recovered(&out, 4, &[2], &[2]);
    assert_survivors_read(&out, 4, &[2], |owner| if owner == 2 { vec![3] } else { vec![5] });
}

#[test]
fn killed_holder_loses_nothing() {
    // Owner 0's checkpoint lives on 1 and 2 (copies = 2 of 4): kill holder 1.
    let out = run(job("store-rounds", 4).env("FTKV_FAILPOINT", "store_round@1#2"));
    assert_recovered(&out, 4, &[1], &[1]);
    assert_survivors_read(&out, 4, &[1], |owner| if owner == 1 { vec![2] } else { vec![5] });
}

// Each write hits these failpoints once per copy (2 copies), 3 writes per round: hit 13 is the
// first copy of round 3's checkpoint.
#[test]
fn writer_killed_between_copies_leaves_old_or_new_never_torn() {
    let out = run(job("store-rounds", 4).env("FTKV_FAILPOINT", "put_between_copies@3#13"));
    assert_recovered(&out, 4, &[3], &[3]);
    assert_survivors_read(&out, 4, &[3], |owner| if owner == 3 { vec![2, 3] } else { vec![5] });
}

#[test]
fn writer_killed_between_data_and_header_leaves_old_or_new_never_torn() {
    let out = run(job("store-rounds", 4).env("FTKV_FAILPOINT", "put_before_header@1#13"));
    assert_recovered(&out, 4, &[1], &[1]);
    assert_survivors_read(&out, 4, &[1], |owner| if owner == 1 { vec![2, 3] } else { vec![5] });
}

#[test]
fn two_simultaneous_kills_with_three_copies_lose_nothing() {
    let out = run(job("store-rounds", 6)
        .env("STORE_COPIES", "3")
        .env("FTKV_FAILPOINT", "store_round@1,4#3"));
    // Killed in the same round, the two may still die a moment apart, and the survivors then
    // recover twice: the failures reported over all recoveries are the two kills.
    for rank in [0, 2, 3, 5] {
        let recovered = recoveries(&out, rank);
        let mut failed: Vec<i32> = recovered.iter().flat_map(|r| r.failed.clone()).collect();
        failed.sort_unstable();
        assert_eq!(failed, [1, 4], "rank {rank}:\n{}", out.transcript());
        let lost = recovered.iter().all(|r| r.lost_keys.is_empty());
        assert!(lost, "rank {rank} lost nothing:\n{}", out.transcript());
    }
    assert_survivors_read(&out, 6, &[1, 4], |owner| {
        if [1, 4].contains(&owner) {
            vec![3]
        } else {
            vec![5]
        }
    });
}

/// The last round whose checkpoint `rank` saw acknowledged (its `acked` reports).
fn last_acked_round(out: &JobOutput, rank: usize) -> u32 {
    let acked: Vec<AckedRound> = out.rank_reports(rank, "acked").expect("JSON");
    acked.iter().map(|a| a.round).max().unwrap_or(0)
}

/// Rank 1 dies in round 3, rank 3 at `recovery_point` of the recovery that follows: the
/// survivors restart recovery, lose nothing and finish cleanly. Rank 3 may have learnt of the
/// failure already in round 2's sync (ULFM reports it per process), so its value is its own
/// last acknowledged round, or the next one if that write was in flight.
fn assert_recovery_restarts_after_a_kill_at(recovery_point: &str) {
    let spec = format!("store_round@1#3;{recovery_point}@3");
    let out = run(job("store-rounds", 5).env("STORE_COPIES", "3").env("FTKV_FAILPOINT", &spec));
    for rank in [0, 2, 4] {
        let first = recoveries(&out, rank).into_iter().next();
        let first = first.unwrap_or_else(|| panic!("rank {rank}:\n{}", out.transcript()));
        assert!(first.attempts >= 2, "rank {rank} restarted recovery:\n{}", out.transcript());
        assert!(first.lost_keys.is_empty(), "rank {rank}:\n{}", out.transcript());
    }
    let acked_by_3 = last_acked_round(&out, 3);
    assert!(acked_by_3 >= 2, "rank 3 finished round 2's put:\n{}", out.transcript());
    assert_survivors_read(&out, 5, &[1, 3], |owner| match owner {
        1 => vec![3],
        3 => vec![acked_by_3, acked_by_3 + 1],
        _ => vec![5],
    });
}

#[test]
fn a_rank_killed_during_recovery_restarts_it() {
    assert_recovery_restarts_after_a_kill_at("recovery_after_shrink");
}

/// The failed attempt had opened its window on every survivor: they free it together, so
/// `MPI_Finalize` finds no window left (`assert_survivors_read` rejects an `error=` line).
#[test]
fn a_rank_killed_mid_copy_restarts_recovery_and_its_window_is_freed() {
    assert_recovery_restarts_after_a_kill_at("recovery_mid_copy");
}

#[test]
fn values_grow_from_1_kib_to_4_mib() {
    let out = run(job("store-rounds", 4).env("STORE_GROWTH", "1").env("STORE_ROUNDS", "13"));
    assert_survivors_read(&out, 4, &[], |_| vec![13]);
}

/// Every checkpoint doubles each round from 1 KiB to 256 MiB (1 KiB inline, the rest in
/// extents that grow and shrink with it) while two ranks are SIGKILLed: rank 2 in the middle
/// of a put around round 16 (its 32 MiB value in the first holder's extent, no header yet),
/// rank 3, a holder, right after a put around round 17 (rounds a recovery interrupted run
/// again, so the failpoints' hit counts land a round earlier in some runs). Nothing
/// acknowledged is lost and no reader sees a torn value: each dead rank's key reads its last
/// acknowledged round (rank 2's, or the round its put was in), the others' round 19.
#[test]
fn values_grow_to_256_mib_while_a_writer_and_a_holder_are_killed() {
    let launch = common::job("store-rounds", 5, Duration::from_secs(240))
        .env("STORE_GROWTH", "1")
        .env("STORE_GROWTH_SHIFT", "18")
        .env("STORE_MAX_MIB", "256")
        .env("STORE_ROUNDS", "19")
        .env("FTKV_FAILPOINT", "put_before_header@2#91;store_round@3#17");
    let out = run(launch);
    let (writer, holder) = (last_acked_round(&out, 2), last_acked_round(&out, 3));
    assert!(writer >= 14 && holder >= 15, "the kills came too early:\n{}", out.transcript());
    assert_survivors_read(&out, 5, &[2, 3], |owner| match owner {
        2 => vec![writer, writer + 1],
        3 => vec![holder],
        _ => vec![19],
    });
}

/// A 1 GiB value round-trips through a put and a read after its writer died: owner 1's
/// checkpoint doubles to 1 GiB in round 21, then owner 1 is SIGKILLed; after the global
/// recovery every survivor reads the whole value back, checked byte by byte.
#[test]
fn a_1_gib_value_is_read_back_after_its_writer_died() {
    let launch = common::job("store-rounds", 4, Duration::from_secs(300))
        .env("STORE_GROWTH", "1")
        .env("STORE_GROWTH_OWNER", "1")
        .env("STORE_GROWTH_SHIFT", "20")
        .env("STORE_MAX_MIB", "1024")
        .env("STORE_ROUNDS", "22")
        .env("FTKV_FAILPOINT", "store_round@1#21");
    let out = run(launch);
    assert_recovered(&out, 4, &[1], &[1]);
    assert_survivors_read(&out, 4, &[1], |owner| if owner == 1 { vec![21] } else { vec![22] });
}

#[test]
fn a_stuck_put_is_ended_by_the_watchdog_and_the_others_recover() {
    // Hit 7 of the write path is round 3's checkpoint put; it never returns.
    let out = run(job("store-rounds", 4).env("FTKV_FAILPOINT", "put_stall@2#7"));
    assert!(out.stderr.contains("has not returned for"), "watchdog message:\n{}", out.transcript());
    assert_recovered(&out, 4, &[2], &[2]);
    assert_survivors_read(&out, 4, &[2], |owner| if owner == 2 { vec![2] } else { vec![5] });
}

/// A survivor that calls recover 12 s late (worker 3; worker 1 killed at a failpoint, global
/// recovery, 6 ranks, 2 copies) holds the others inside their recovery, three times past its
/// 4 s recovery deadline, and they name it while they wait. Nobody ends itself and every
/// survivor reads every key.
#[test]
fn a_survivor_late_for_recovery_past_its_deadline_holds_the_others_and_nothing_is_lost() {
    let (ranks, victim, late) = (6, 1, 3);
    let launch = common::job("store-rounds", ranks, Duration::from_secs(150))
        .env("FTKV_FAILPOINT", &format!("store_round@{victim}#2"))
        .env("STORE_RECOVERY_WATCHDOG_MS", "4000")
        .env("STORE_LATE_RANK", &late.to_string())
        .env("STORE_LATE_SECONDS", "12");
    let out = run(launch);
    assert!(!out.stderr.contains("ending this process"), "a rank ended:\n{}", out.transcript());
    assert_recovered(&out, ranks, &[victim], &[victim as i32]);
    assert_survivors_read(&out, ranks, &[victim], |o| if o == 1 { vec![2] } else { vec![5] });
    for rank in (0..ranks).filter(|&r| r != victim && r != late) {
        let waited = recoveries(&out, rank)[0].ms;
        assert!(waited > 10_000.0, "rank {rank} recovered in {waited} ms:\n{}", out.transcript());
        let tag = format!("[1,{rank}]<stderr>:");
        let named = out
            .stderr
            .lines()
            .any(|l| l.starts_with(&tag) && l.contains(&format!("waiting for workers [{late}]")));
        assert!(named, "rank {rank} names the late worker:\n{}", out.transcript());
    }
}

/// Starts `store-localized` on `ranks` ranks, SIGKILLs `victims` from outside by PID once all
/// write, and returns the job's output.
fn localized_with_outside_kills(ranks: usize, victims: &[usize]) -> JobOutput {
    common::job_with_outside_kills(
        job("store-localized", ranks).env("STORE_SECONDS", "3"),
        ranks,
        victims,
    )
}

/// Localized recovery on real MPI: a rank SIGKILLed from outside while every rank overwrites
/// its checkpoint. No survivor recovers globally while writing, every survivor's checkpoint is
/// back at its full copy count holding its last acknowledged write, some survivor moved the
/// copies the victim held, and the final global recovery agrees on the victim.
#[test]
fn a_rank_killed_from_outside_is_repaired_locally_while_the_others_write() {
    let (ranks, victim) = (6, 4);
    let out = localized_with_outside_kills(ranks, &[victim]);
    let mut moved = 0;
    for rank in (0..ranks).filter(|&r| r != victim) {
        let report = localized_report(&out, rank);
        assert_eq!(report.global, None, "rank {rank}: {report:?}");
        assert_full_and_current(&report, rank);
        moved += report.moved_keys;
    }
    assert!(moved >= 1, "nobody moved the victim's copies:\n{}", out.transcript());
    assert_recovered(&out, ranks, &[victim], &[victim as i32]);
    assert_survivors_read(&out, ranks, &[victim], |_| (1..100_000).collect());
}

/// As above, every write an asynchronous put that is waited for (`put_async` + `wait`): the
/// first copy on this host, the others from the replicator thread, rewritten to the new
/// routes when a holder fails meanwhile. Nothing acknowledged is lost and no survivor falls
/// back to global recovery.
#[test]
fn asynchronous_puts_through_a_kill_from_outside_lose_nothing() {
    let (ranks, victim) = (6, 4);
    let launch = job("store-localized", ranks).env("STORE_SECONDS", "3").env("STORE_ASYNC", "1");
    let out = common::job_with_outside_kills(launch, ranks, &[victim]);
    for rank in (0..ranks).filter(|&r| r != victim) {
        let report = localized_report(&out, rank);
        assert_eq!(report.global, None, "rank {rank}: {report:?}");
        assert_full_and_current(&report, rank);
    }
    assert_recovered(&out, ranks, &[victim], &[victim as i32]);
    assert_survivors_read(&out, ranks, &[victim], |_| (1..100_000).collect());
}

/// Both ranks of the last host (ranks 4 and 5 of 6, mapped by slot over 3 simulated hosts
/// under `FTKV_NODES=3`) SIGKILLed from outside at once. Across hosts a key's 2 copies sit on 2
/// hosts, so every key keeps a copy and no survivor falls back to global recovery; on one
/// host a key can lose both copies, and the fallback (which reports such a key lost) is
/// allowed. Either way every survivor's
/// checkpoint ends with its full copy count holding its last acknowledged write, and the final
/// recovery agrees on both victims.
#[test]
fn a_hosts_ranks_killed_at_once_are_repaired_while_the_others_write() {
    let (ranks, victims) = (6, [4, 5]);
    let across_hosts = std::env::var("FTKV_NODES").is_ok_and(|n| n == "3");
    let out = localized_with_outside_kills(ranks, &victims);
    for rank in (0..ranks).filter(|r| !victims.contains(r)) {
        let report = localized_report(&out, rank);
        if across_hosts {
            assert_eq!(report.global, None, "rank {rank}: {report:?}");
        }
        assert_full_and_current(&report, rank);
    }
    if across_hosts {
        assert_recovered(&out, ranks, &victims, &[4, 5]);
    } else {
        // Two of 2 copies gone at once is beyond the store's tolerance: a key both of whose
        // holders died is reported lost until its owner writes it again.
        for rank in (0..ranks).filter(|r| !victims.contains(r)) {
            let first = recoveries(&out, rank).into_iter().next().map(|r| r.failed);
            assert_eq!(first, Some(vec![4, 5]), "{}", out.transcript());
        }
    }
    assert_survivors_read(&out, ranks, &victims, |_| (1..100_000).collect());
}

/// The lock words of transactions rest on compare-and-swap across every path of the store's
/// window: 6 ranks add 200 to a counter on every rank with compare-and-swap loops, racing
/// through shared memory on a host and through the serving threads between hosts (under
/// `FTKV_NODES=3`, where `spans_hosts=true` is required). Every counter ends exact.
#[test]
fn compare_and_swap_is_atomic_across_shared_memory_and_host_links() {
    let out = run(job("host-cas", 6));
    let across_hosts = std::env::var("FTKV_NODES").is_ok_and(|n| n == "3");
    for rank in 0..6 {
        let cas: Option<CasReport> = out.rank_report(rank, "cas").expect("JSON");
        let cas = cas.unwrap_or_else(|| panic!("rank {rank}:\n{}", out.transcript()));
        assert_eq!(cas.spans_hosts, across_hosts, "rank {rank}");
    }
}

/// Connections from outside the job: 4 ranks over 2 simulated hosts race compare-and-swap
/// loops through their windows' listeners while a process that is no member connects to every
/// window listener as soon as it appears (during the window's creation) and again 300 ms
/// later (during the swaps), from inside the listener's host: garbage, a forged introduction
/// followed by a put, half an introduction, a silent connection, one closed at once. Every
/// counter ends exact, no other byte of any window changed, and the listeners dropped and
/// counted what connected.
#[test]
fn connections_from_outside_the_job_are_dropped_and_change_nothing() {
    if !ftkv_cli::cluster::is_root() {
        eprintln!("skipped: simulated hosts need root");
        return;
    }
    // Its own hosts and their TCP transport, whatever FTKV_NODES and FTKV_TEST_BTL say.
    let launch = Launch::new(env!("CARGO_BIN_EXE_ftkv-mpitest"), 4)
        .args(["host-cas"])
        .on_hosts(ftkv_cli::cluster::Hosts::Simulated(2))
        .env("FTKV_TEST_LISTENERS", "1")
        .env("FTKV_TEST_CAS_ROUNDS", "5000")
        .timeout(Duration::from_secs(90));
    let mut running = launch.spawn().expect("mpirun starts");
    let intruders = intrude_while_running(&mut running);
    let out = running.finish().expect("the job ends");
    assert!(!out.timed_out, "job hung:\n{}", out.transcript());
    let connected: usize = intruders.iter().map(|i| i.connected).sum();
    let visits = format!("{intruders:?}\n{}", out.transcript());
    assert!(intruders.iter().any(|i| i.second_visit), "no visit during the swaps: {visits}");
    let mut rejected = 0;
    for rank in 0..4 {
        let cas: Option<CasReport> = out.rank_report(rank, "cas").expect("JSON");
        let cas = cas.unwrap_or_else(|| panic!("rank {rank}:\n{}", out.transcript()));
        assert!(cas.spans_hosts, "rank {rank}");
        rejected += cas.rejected;
    }
    eprintln!("{} intruder runs, {connected} connections, {rejected} dropped", intruders.len());
    assert!(connected > 0, "no intruder connected: {intruders:?}");
    assert!(rejected > 0, "{connected} intruding connections, none counted as dropped");
}

/// When the intruder visits a listener again after its first visit.
const SECOND_VISIT: Duration = Duration::from_millis(300);

/// One run of the intruder against a window listener.
#[derive(Debug)]
struct Intrusion {
    second_visit: bool,
    connected: usize,
}

/// While `running` runs: learns each rank's MPI listeners from its `listeners` line, and runs
/// the intruder (inside the rank's network namespace) against every other listener the rank
/// opens, at once and again [`SECOND_VISIT`] later.
fn intrude_while_running(running: &mut RunningJob) -> Vec<Intrusion> {
    let mut before: HashMap<u32, Vec<u64>> = HashMap::new();
    let mut first_seen: HashMap<(u32, u64), std::time::Instant> = HashMap::new();
    let mut children = Vec::new();
    while running.is_running() {
        while let Some((_, line)) = running.next_line(Duration::from_millis(5)) {
            if let Some((pid, inodes)) = parse_listeners_line(&line) {
                before.insert(pid, inodes);
            }
        }
        for (&pid, known) in &before {
            for (inode, address) in ftkv_cli::sockets::listening(pid) {
                if known.contains(&inode) {
                    continue;
                }
                let seen = *first_seen.entry((pid, inode)).or_insert_with(|| {
                    children.push((false, spawn_intruder(pid, address)));
                    std::time::Instant::now()
                });
                let since = seen.elapsed();
                if since > SECOND_VISIT && since < 2 * SECOND_VISIT {
                    first_seen.insert((pid, inode), seen - 2 * SECOND_VISIT);
                    children.push((true, spawn_intruder(pid, address)));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    children
        .into_iter()
        .map(|(second_visit, child)| {
            let out = child.wait_with_output().expect("the intruder ends");
            let text = String::from_utf8_lossy(&out.stdout);
            let connected = text
                .lines()
                .find_map(|l| l.strip_prefix("intruded ")?.trim().parse().ok())
                .unwrap_or_else(|| panic!("the intruder failed: {text}"));
            Intrusion { second_visit, connected }
        })
        .collect()
}

/// `listeners pid=<pid> inodes=<i,j,...>`.
fn parse_listeners_line(line: &str) -> Option<(u32, Vec<u64>)> {
    let rest = line.strip_prefix("listeners pid=")?;
    let (pid, inodes) = rest.split_once(" inodes=")?;
    let inodes = inodes.split(',').filter_map(|i| i.trim().parse().ok()).collect();
    Some((pid.parse().ok()?, inodes))
}

/// `ftkv-mpitest intrude <address>` inside process `pid`'s network namespace.
fn spawn_intruder(pid: u32, address: std::net::SocketAddrV4) -> std::process::Child {
    std::process::Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args([env!("CARGO_BIN_EXE_ftkv-mpitest"), "intrude", &address.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("nsenter starts")
}

/// Transactions on real MPI (`store-txn`, 4 ranks, localized, 2 copies): every rank appends
/// its ids to its own and its neighbour's log in 16 transactions while rank 1 is SIGKILLed at
/// a protocol step (`FTKV_FAILPOINT`), or nobody is. Every survivor judges atomicity, its own
/// outcomes and serializability on what it reads (`txn=ok`), all read the same logs, and after
/// a kill exactly one survivor resolved the victim's transaction as its backup. Rank 1 runs
/// ahead of a rank still creating its store only once every rank has created its
/// communicators (see `ftkv_mpi::Comm::dup`): before, a rank slow to finish one crashed when
/// the killed rank's failure reached it there.
#[test]
fn transactions_stay_atomic_when_their_coordinator_is_killed_at_any_step() {
    let ranks = 4;
    let kills =
        [None, Some("tx_announce#3"), Some("tx_lock#5"), Some("tx_read#2"), Some("tx_abort#1")];
    let more = [Some("tx_commit#3"), Some("put_before_header#6"), Some("tx_apply#4")];
    let last = [Some("tx_done#2"), Some("tx_unlock#3")];
    for kill in kills.into_iter().chain(more).chain(last) {
        let mut launch = job("store-txn", ranks);
        if let Some(point) = kill {
            let (name, nth) = point.split_once('#').expect("name#nth");
            launch = launch.env("FTKV_FAILPOINT", &format!("{name}@1#{nth}"));
        }
        let out = run(launch);
        let survivors: Vec<usize> = (0..ranks).filter(|&r| kill.is_none() || r != 1).collect();
        let mut backups = 0;
        for &rank in &survivors {
            let txn = |r: usize| -> Option<TxnReport> { out.rank_report(r, "txn").expect("JSON") };
            let report = txn(rank);
            let report =
                report.unwrap_or_else(|| panic!("{kill:?}: rank {rank}:\n{}", out.transcript()));
            let logs = txn(survivors[0]).map(|t| t.logs);
            assert_eq!(
                Some(&report.logs),
                logs.as_ref(),
                "{kill:?}: survivors read different logs"
            );
            backups += usize::from(report.resolved == [1]);
            assert!(passed(&out, rank, "done"), "{kill:?}:\n{}", out.transcript());
        }
        let wanted = usize::from(kill.is_some());
        assert_eq!(
            backups,
            wanted,
            "{kill:?}: backups that resolved rank 1:\n{}",
            out.transcript()
        );
        if kill.is_some() {
            assert!(out.stderr.contains("fired on rank 1"), "{kill:?}: the kill did not fire");
        }
    }
}

/// Rank `rank`'s `localized` report; fails the test with the transcript when it has none.
fn localized_report(out: &JobOutput, rank: usize) -> LocalizedReport {
    let report = out.rank_report(rank, "localized").expect("a JSON report");
    report.unwrap_or_else(|| panic!("rank {rank} reported nothing:\n{}", out.transcript()))
}

/// The own checkpoint has its full copy count (2) and every copy holds the last acknowledged
/// write.
fn assert_full_and_current(report: &LocalizedReport, rank: usize) {
    assert_eq!((report.copies, report.copies_wanted), (2, 2), "rank {rank}: {report:?}");
    assert!(report.current, "rank {rank}: a copy is stale: {report:?}");
}

/// Localized recovery with owners that make no store call: after a rank is SIGKILLed from
/// outside, every owner sleeps while rank 0 reads each live worker's checkpoint back at its
/// full copy count. Only the owners' repairer threads can have moved the copies the victim
/// held, and rank 0 sees them all before any owner wakes. Nobody recovers globally, and the
/// final global recovery agrees on the victim.
#[test]
fn an_idle_owners_lost_copies_are_repaired_while_it_makes_no_store_call() {
    let (ranks, victim) = (6, 4);
    let launch = job("store-localized", ranks).env("STORE_IDLE_SECONDS", "5");
    let out = common::job_with_outside_kills(launch, ranks, &[victim]);
    let observed: IdleObserverReport = out
        .rank_report(0, "idle_observer")
        .expect("a JSON report")
        .unwrap_or_else(|| panic!("rank 0 never saw every copy back:\n{}", out.transcript()));
    let mut moved = 0;
    for rank in (1..ranks).filter(|&r| r != victim) {
        let owner: IdleOwnerReport = out.rank_report(rank, "idle_owner").expect("JSON").unwrap();
        assert!(
            observed.full_at_us < owner.woke_at_us,
            "rank {rank} woke before its copies were back: {observed:?} {owner:?}"
        );
        moved += localized_report(&out, rank).moved_keys;
    }
    for rank in (0..ranks).filter(|&r| r != victim) {
        let report = localized_report(&out, rank);
        assert_eq!(report.global, None, "rank {rank}: {report:?}");
        assert_full_and_current(&report, rank);
    }
    assert!(moved >= 1, "no owner moved a copy:\n{}", out.transcript());
    eprintln!("every copy back {:.1} ms after rank 0 noticed the failure", observed.waited_ms);
    assert_recovered(&out, ranks, &[victim], &[victim as i32]);
}
