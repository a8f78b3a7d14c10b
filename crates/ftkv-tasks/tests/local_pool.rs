//! The work-stealing pool on the in-process fabric (ranks as threads, no MPI): exact N-Queens
//! counts with no failure and with a worker killed at each named point of the steal and
//! recovery protocols. Every run is bounded, so a protocol that waits forever fails the test.

use std::sync::mpsc;
use std::time::Duration;

use ftkv::fabric::local::LocalCluster;
use ftkv::Recovery;
use ftkv_tasks::nqueens::NQueens;
use ftkv_tasks::pool::{self, Interval, Look, Outcome, PoolConfig};
use ftkv_tasks::problem::{check_exact, solve_sequential, Reference};

/// The longest a pool run may take before the test fails.
const RUN_BOUND: Duration = Duration::from_secs(60);

fn config(ranks: usize, seed: u64) -> PoolConfig {
    configured(ranks, seed, Recovery::Global)
}

fn configured(ranks: usize, seed: u64, recovery: Recovery) -> PoolConfig {
    PoolConfig {
        recovery,
        copies: 2.min(ranks - 1),
        interval: Some(Interval::Tasks(200)),
        look: Look::Tasks(16),
        progress: None,
        seed,
        ..PoolConfig::default()
    }
}

/// Runs N-Queens of size `n` on `ranks` thread workers, `victim` killed at its `nth` pass
/// through `failpoint` when given; each rank's outcome (`None` for the killed one).
fn run_pool(
    ranks: usize,
    n: u32,
    kill: Option<(i32, &str, usize)>,
    seed: u64,
) -> Vec<Option<Outcome>> {
    run_pool_with(ranks, n, kill.as_slice(), configured(ranks, seed, Recovery::Global))
}

/// Like [`run_pool`] with every kill of `kills` armed and the pool configured by `config`.
fn run_pool_with(
    ranks: usize,
    n: u32,
    kills: &[(i32, &str, usize)],
    config: PoolConfig,
) -> Vec<Option<Outcome>> {
    let cluster = LocalCluster::new(ranks);
    for &(victim, point, nth) in kills {
        cluster.arm(victim, point, nth);
    }
    let (done, result) = mpsc::channel();
    std::thread::spawn(move || {
        let problem = NQueens::new(n).expect("a valid size");
        let outcomes = cluster.run(|fabric| {
            pool::run(&fabric, &problem, &config).expect("the pool ends without an error")
        });
        let _ = done.send(outcomes);
    });
    result.recv_timeout(RUN_BOUND).expect("the pool finishes within its bound")
}

/// Every survivor reports the published count; exactly `killed` died and the survivors agree.
fn assert_exact(outcomes: &[Option<Outcome>], n: u32, killed: &[i32]) {
    let problem = NQueens::new(n).unwrap();
    let published = problem.published().expect("a published count");
    let reference = Reference::from(solve_sequential(&problem));
    assert_eq!(reference.leaves, published, "the sequential count is the published one");
    for (rank, outcome) in outcomes.iter().enumerate() {
        let rank = rank as i32;
        match outcome {
            None => assert!(killed.contains(&rank), "rank {rank} died unexpectedly"),
            Some(outcome) => {
                assert!(!killed.contains(&rank), "killed rank {rank} finished");
                let exact = check_exact(&outcome.total, reference);
                assert!(exact.is_ok(), "rank {rank}: {exact:?} ({outcome:?})");
                assert_eq!(outcome.failed, killed, "rank {rank}'s failed set");
            }
        }
    }
}

#[test]
fn n_queens_is_exact_without_failures_on_2_to_5_workers() {
    for ranks in 2..=5 {
        assert_exact(&run_pool(ranks, 8, None, ranks as u64), 8, &[]);
    }
}

#[test]
fn n_queens_is_exact_with_a_worker_killed_at_every_protocol_point() {
    let points = [
        ("steal_victim_after_loot", 1),
        ("steal_victim_before_send", 1),
        ("steal_thief_before_checkpoint", 1),
        ("steal_thief_before_ack", 1),
        ("steal_victim_after_loot", 3),
        ("steal_thief_before_ack", 4),
    ];
    let mut deaths = Vec::new();
    for (i, (point, nth)) in points.into_iter().enumerate() {
        for victim in [1, 3] {
            let outcomes = run_pool(4, 12, Some((victim, point, nth)), 10 + i as u64);
            let died = outcomes[victim as usize].is_none();
            let killed: Vec<i32> = if died { vec![victim] } else { Vec::new() };
            assert_exact(&outcomes, 12, &killed);
            deaths.push((point, nth, victim, died));
        }
    }
    // A victim that never reached its point in the run proves nothing; half must have.
    let reached = deaths.iter().filter(|d| d.3).count();
    assert!(reached * 2 >= deaths.len(), "too few kills happened: {deaths:?}");
}

#[test]
fn the_buddy_killed_after_adopting_hands_the_work_to_the_next() {
    // Worker 2 dies in its first steal (every worker but 0 starts as a thief); its buddy, 3,
    // then dies right after adopting its checkpoint. Threads race, so worker 2 may find no
    // work to steal before the end: every run must be exact, and the planned double failure
    // must happen in at least one of them.
    let mut happened = 0;
    for seed in 1..=6 {
        let cluster = LocalCluster::new(5);
        cluster.arm(2, "steal_thief_before_checkpoint", 1);
        cluster.arm(3, "buddy_after_adopting", 1);
        let (done, result) = mpsc::channel();
        std::thread::spawn(move || {
            let problem = NQueens::new(12).unwrap();
            let outcomes =
                cluster.run(|fabric| pool::run(&fabric, &problem, &config(5, seed)).unwrap());
            let _ = done.send(outcomes);
        });
        let outcomes = result.recv_timeout(RUN_BOUND).expect("the pool finishes within its bound");
        let killed: Vec<i32> = (0..5).filter(|&r| outcomes[r as usize].is_none()).collect();
        assert_exact(&outcomes, 12, &killed);
        assert!(killed.is_empty() || killed.contains(&2), "only planned deaths: {killed:?}");
        happened += usize::from(killed == [2, 3]);
    }
    assert!(happened >= 1, "worker 2 and then its buddy died in none of 6 runs");
}

/// The protocol points of the steal and settle protocols, with the pass at which they kill.
const POINTS: [(&str, usize); 6] = [
    ("steal_victim_after_loot", 1),
    ("steal_victim_before_send", 1),
    ("steal_thief_before_checkpoint", 1),
    ("steal_thief_before_ack", 1),
    ("steal_victim_after_loot", 3),
    ("steal_thief_before_ack", 4),
];

/// The workers that did not finish.
fn dead(outcomes: &[Option<Outcome>]) -> Vec<i32> {
    (0..outcomes.len() as i32).filter(|&r| outcomes[r as usize].is_none()).collect()
}

#[test]
fn localized_recovery_is_exact_with_a_worker_killed_at_every_steal_point() {
    let mut deaths = Vec::new();
    for (i, (point, nth)) in POINTS.into_iter().enumerate() {
        for victim in [1, 3] {
            let config = configured(4, 30 + i as u64, Recovery::Localized);
            let outcomes = run_pool_with(4, 12, &[(victim, point, nth)], config);
            let killed = dead(&outcomes);
            assert_exact(&outcomes, 12, &killed);
            assert!(killed.is_empty() || killed == [victim], "only planned deaths: {killed:?}");
            let modes: Vec<Vec<bool>> = outcomes
                .iter()
                .flatten()
                .map(|o| o.stats.recoveries.iter().map(|r| r.localized).collect())
                .collect();
            eprintln!("{point}#{nth} kills {victim}: died {killed:?}, localized? {modes:?}");
            let only_localized = modes.iter().all(|m| m.iter().all(|&localized| localized));
            assert!(only_localized, "no survivor stopped for a global recovery: {modes:?}");
            let noticed = modes.iter().all(|m| m.len() == killed.len());
            assert!(noticed, "every survivor dealt with each failure once: {modes:?}");
            deaths.push((point, nth, victim, !killed.is_empty()));
        }
    }
    let reached = deaths.iter().filter(|d| d.3).count();
    assert!(reached * 2 >= deaths.len(), "too few kills happened: {deaths:?}");
}

#[test]
fn localized_runs_end_exact_without_failures_on_3_to_5_workers() {
    for ranks in 3..=5 {
        let config = configured(ranks, 70 + ranks as u64, Recovery::Localized);
        // Every copy needs a reserve holder besides the owner.
        let config = PoolConfig { copies: 2.min(ranks - 2), ..config };
        assert_exact(&run_pool_with(ranks, 8, &[], config), 8, &[]);
    }
}

#[test]
fn localized_recovery_survives_kills_inside_the_settling_transactions() {
    // Worker 2 dies in its first steal; its buddy, 3, dies inside its adoption's transaction
    // (or right after it), so the transaction's backup and then worker 4 finish the job.
    let steps =
        ["tx_announce", "tx_lock", "tx_commit", "tx_apply", "tx_done", "buddy_after_adopting"];
    let mut doubles = 0;
    for (i, step) in steps.into_iter().enumerate() {
        for seed in 0..2u64 {
            // Two failures inside one detection window: three copies keep every key.
            let config = PoolConfig {
                copies: 3,
                ..configured(5, 50 + 2 * i as u64 + seed, Recovery::Localized)
            };
            let kills = [(2, "steal_thief_before_checkpoint", 1), (3, step, 1)];
            let outcomes = run_pool_with(5, 12, &kills, config);
            let killed = dead(&outcomes);
            assert_exact(&outcomes, 12, &killed);
            doubles += usize::from(killed == [2, 3]);
        }
    }
    assert!(doubles >= 3, "the double failure happened in only {doubles} of 12 runs");
}

/// A buddy's adoption whose transaction the store's fall back to global recovery interrupts
/// after the commit decision: worker 2 is killed from outside, its buddy 3 is stopped in the
/// adoption between its two writes (the dead worker's emptied checkpoint is written, its own
/// is not), and workers 4 and 5, the two holders of 3's checkpoint, are killed meanwhile. That
/// key lost every copy, so everyone recovers globally; the adoption is finished after it and
/// the count stays exact.
#[test]
fn an_adoption_interrupted_by_a_fall_back_to_global_recovery_is_kept() {
    let cluster = LocalCluster::new(6);
    cluster.stop_at(3, "tx_apply", 2);
    let config = PoolConfig { copies: 2, ..configured(6, 91, Recovery::Localized) };
    let (done, result) = mpsc::channel();
    std::thread::spawn(move || {
        let problem = NQueens::new(13).expect("a valid size");
        let outcomes = std::thread::scope(|s| {
            let run = s.spawn(|| {
                cluster.run(|fabric| pool::run(&fabric, &problem, &config).expect("no error"))
            });
            std::thread::sleep(Duration::from_millis(30));
            cluster.kill(2);
            let stopped = (0..20_000).any(|_| {
                std::thread::sleep(Duration::from_millis(1));
                cluster.is_stopped(3)
            });
            if stopped {
                cluster.kill_all(&[4, 5]);
                // Time for 3's store to notice (in-process detection takes microseconds), so
                // that its next write fails.
                std::thread::sleep(Duration::from_millis(300));
                cluster.resume(3);
            }
            (stopped, run.join().expect("the pool's threads end"))
        });
        let _ = done.send(outcomes);
    });
    let (stopped, outcomes) = result.recv_timeout(RUN_BOUND).expect("the pool ends in time");
    assert!(stopped, "the buddy stopped inside its adoption: {outcomes:?}");
    assert_exact(&outcomes, 13, &[2, 4, 5]);
    for outcome in outcomes.iter().flatten() {
        let global = outcome.stats.recoveries.iter().filter(|r| !r.localized).count();
        assert!(global >= 1, "the survivors fell back to global recovery: {outcome:?}");
    }
    let buddy = outcomes[3].as_ref().expect("the buddy survives");
    let localized = buddy.stats.recoveries.iter().filter(|r| r.localized).count();
    assert_eq!(localized, 0, "the fall back interrupted the buddy's adoption: {buddy:?}");
}
