//! The production pool driver ([`crate::pool::run`]) over the production store on the
//! deterministic world of [`ftkv_sim::world`]: every worker's driver, its store's detector,
//! repairer and recovery, and (with localized recovery) the settles' transactions run
//! unchanged as tasks of one seeded scheduler with a virtual clock. One seed fixes the problem
//! (UTS, N-Queens, Fibonacci or the wavefront), the workers, copies, recovery mode, checkpoint interval and batch, the
//! interleaving of every task and the faults: up to `copies − 1` victims, each killed at a
//! named point of the steal, adoption and rejoin protocols (`steal_victim_after_loot`, …) or at
//! any step of the run, or stopped there and declared failed later, and a slow worker. A failing seed replays exactly (`ftkv sim --model pool-world --seed S --trace`).
//!
//! Every survivor must end with the sequential count (`problem::check_exact`), all survivors
//! must name the same failed workers, those that died; a worker that panics or returns an
//! error, or a run that does not end within its virtual time limit, is a violation.

use std::sync::Arc;
use std::time::Duration;

use ftkv::fabric::local::{LocalCluster, LocalFabric};
use ftkv::Recovery;
use ftkv_sim::recovery::RunReport;
use ftkv_sim::world::{Fault, World, WorldConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::fib::Fib;
use crate::forkjoin::Joined;
use crate::model::Model;
use crate::nqueens::NQueens;
use crate::pool::{self, Interval, Look, Outcome, PoolConfig};
use crate::problem::{check_exact, solve_sequential, Problem, Reference};
use crate::uts;
use crate::wavefront::Wavefront;

/// Virtual time a run may take before it counts as a hang.
const LIMIT: Duration = Duration::from_secs(120);

/// Steps after the start by which every worker's store exists: creating the store is
/// collective and not fault tolerant (a kill inside it ends the pool with the store's error on
/// every survivor). With kills from step 1, the latest that did so in 3,000 seeds was at step 70.
const CREATED_BY: u64 = 150;

/// The named points of the pool's protocols where a victim may die.
pub const POINTS: [&str; 6] = [
    "steal_victim_after_loot",
    "steal_victim_before_send",
    "steal_thief_before_checkpoint",
    "steal_thief_before_ack",
    "buddy_after_adopting",
    "rejoin_before_sync",
];

/// The named points of the fork-join results' protocol: a worker about to send a result it
/// owes, a frame's holder that applied and checkpointed a result before it acknowledges it.
pub const JOIN_POINTS: [&str; 2] = ["join_before_send", "join_before_ack"];

/// The named points of the futures' hand-over: a thief lent its victim's futures entry, a
/// thief that wrote the results into it, a holder that applied them before it acknowledges.
pub const HANDOVER_POINTS: [&str; 3] = ["handover_lent", "handover_written", "handover_before_ack"];

/// How the victim of a run dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kill {
    /// At its `nth` pass through a named point.
    Point(&'static str, usize),
    /// This many steps after it starts the pool.
    Step(u64),
    /// Stops (SIGSTOP) this many steps after it starts the pool, and is declared failed by the
    /// others' failure detector this long after (ULFM's detector timeout).
    Stop(u64, Duration),
}

/// One run's scenario, drawn from its seed.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub seed: u64,
    pub ranks: usize,
    pub copies: usize,
    pub localized: bool,
    pub checkpoint_every: u64,
    pub look_every: usize,
    /// Each victim and how it dies: up to `copies − 1` of them.
    pub kills: Vec<(i32, Kill)>,
    pub slow: Vec<i32>,
}

impl Scenario {
    /// The scenario of `seed` (its problem is drawn by [`run`] from the same seed).
    fn of(rng: &mut SmallRng, seed: u64, points: &[&'static str]) -> Scenario {
        let ranks = rng.gen_range(2..=5usize);
        let copies = rng.gen_range(1..=3usize.min(ranks - 1));
        // Up to `copies − 1` victims; with one copy, one victim (whose death loses every copy
        // of the keys it held while their owner lives: the owner writes them again).
        let count = if rng.gen_bool(0.8) { rng.gen_range(1..copies.max(2)) } else { 0 };
        let kills = ftkv_sim::scenario::victims(rng, count, ranks, |rng, _| {
            if rng.gen_bool(0.5) {
                Kill::Point(points[rng.gen_range(0..points.len())], rng.gen_range(1..=3))
            } else if rng.gen_bool(0.7) {
                Kill::Step(rng.gen_range(CREATED_BY..4_000))
            } else {
                let declared = Duration::from_micros(rng.gen_range(500..20_000));
                Kill::Stop(rng.gen_range(CREATED_BY..4_000), declared)
            }
        });
        let slow = if rng.gen_bool(0.2) { vec![rng.gen_range(0..ranks as i32)] } else { vec![] };
        Scenario {
            seed,
            ranks,
            copies,
            localized: rng.gen_bool(0.5),
            checkpoint_every: rng.gen_range(3..=40),
            look_every: rng.gen_range(1..=16),
            kills,
            slow,
        }
    }

    fn config(&self) -> PoolConfig {
        PoolConfig {
            copies: self.copies,
            interval: Some(Interval::Tasks(self.checkpoint_every)),
            look: Look::Tasks(self.look_every),
            progress: None,
            seed: self.seed,
            recovery: if self.localized { Recovery::Localized } else { Recovery::Global },
            ..PoolConfig::default()
        }
    }

    fn describe(&self, problem: &str) -> String {
        let mode = if self.localized { "localized" } else { "global" };
        format!(
            "{problem} on {} workers, {} copies, {mode}, checkpoint every {} tasks, look every \
             {}, kills {:?}, slow {:?}",
            self.ranks, self.copies, self.checkpoint_every, self.look_every, self.kills, self.slow
        )
    }
}

/// The runs of a campaign from `first_seed`: reports of the failing ones and a digest of all
/// ([`ftkv_sim::world::campaign`]).
pub fn campaign(first_seed: u64, runs: u64) -> (Vec<RunReport>, u64) {
    ftkv_sim::world::campaign(first_seed, runs, |seed| run(seed, false).0)
}

/// Runs the scenario of `seed`; with `trace`, also returns one line per step and per fault.
pub fn run(seed: u64, trace: bool) -> (RunReport, Vec<String>) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let scenario = Scenario::of(&mut rng, seed, &POINTS);
    run_independent(&mut rng, scenario, trace)
}

/// [`campaign`] of the fork-join programs ([`run_nfj`]).
pub fn campaign_nfj(first_seed: u64, runs: u64) -> (Vec<RunReport>, u64) {
    ftkv_sim::world::campaign(first_seed, runs, |seed| run_nfj(seed, false).0)
}

/// [`run`] with the problem as a nested fork-join program ([`Model::Nfj`]): UTS, N-Queens or
/// Fibonacci; victims also die at the points of the results' protocol ([`JOIN_POINTS`]), and
/// the reference is the sequential fork-join program's result.
pub fn run_nfj(seed: u64, trace: bool) -> (RunReport, Vec<String>) {
    run_joined(Model::Nfj, &JOIN_POINTS, seed, trace)
}

/// [`campaign`] of the programs with futures ([`run_fbc`]).
pub fn campaign_fbc(first_seed: u64, runs: u64) -> (Vec<RunReport>, u64) {
    ftkv_sim::world::campaign(first_seed, runs, |seed| run_fbc(seed, false).0)
}

/// [`run`] with the problem written with futures ([`Model::Fbc`]): UTS, N-Queens or
/// Fibonacci, or the wavefront, whose futures are awaited by two cells each
/// ([`crate::wavefront`]); victims also die at every step of the hand-over
/// ([`HANDOVER_POINTS`]).
pub fn run_fbc(seed: u64, trace: bool) -> (RunReport, Vec<String>) {
    run_joined(Model::Fbc, &HANDOVER_POINTS, seed, trace)
}

/// A run of `model` (fork-join or futures), victims dying at the steal and recovery points
/// and at `points`.
fn run_joined(
    model: Model,
    points: &[&'static str],
    seed: u64,
    trace: bool,
) -> (RunReport, Vec<String>) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let points: Vec<&'static str> = POINTS.iter().chain(points).copied().collect();
    let scenario = Scenario::of(&mut rng, seed, &points);
    let problems = if model == Model::Fbc { 4 } else { 3 };
    let (problem, name) = match rng.gen_range(0..problems) {
        0 => {
            let params = small_uts(&mut rng);
            (Tree::Uts(params), uts_name(&params))
        }
        1 => {
            let n = rng.gen_range(6..=8);
            (Tree::Queens(NQueens { n }), format!("{n}-Queens"))
        }
        2 => {
            let n = rng.gen_range(8..=14);
            (Tree::Fib(Fib { n }), format!("fib({n})"))
        }
        _ => {
            let wave = Wavefront { n: rng.gen_range(3..=10) };
            let name = format!("fbc wavefront {0}x{0}", wave.n);
            return simulate(wave, &name, scenario, trace);
        }
    };
    let name = format!("{} {name}", model.name());
    match model {
        Model::Fbc => simulate_joined::<true>(problem, &name, scenario, trace),
        _ => simulate_joined::<false>(problem, &name, scenario, trace),
    }
}

/// [`simulate`] of `tree` as a program that joins in frames ([`Joined`]).
fn simulate_joined<const HANDED: bool>(
    tree: Tree,
    name: &str,
    scenario: Scenario,
    trace: bool,
) -> (RunReport, Vec<String>) {
    match tree {
        Tree::Uts(inner) => simulate(Joined::<_, HANDED> { inner }, name, scenario, trace),
        Tree::Queens(inner) => simulate(Joined::<_, HANDED> { inner }, name, scenario, trace),
        Tree::Fib(inner) => simulate(Joined::<_, HANDED> { inner }, name, scenario, trace),
    }
}

/// A tree problem of the fork-join and futures runs.
enum Tree {
    Uts(uts::Params),
    Queens(NQueens),
    Fib(Fib),
}

/// A UTS tree of a few hundred nodes.
fn small_uts(rng: &mut SmallRng) -> uts::Params {
    uts::Params {
        depth: rng.gen_range(4..=6),
        root_id: rng.gen_range(0..1000),
        ..uts::Params::default()
    }
}

fn uts_name(params: &uts::Params) -> String {
    format!("UTS geometric depth {} root {}", params.depth, params.root_id)
}

fn run_independent(
    rng: &mut SmallRng,
    scenario: Scenario,
    trace: bool,
) -> (RunReport, Vec<String>) {
    if rng.gen_bool(0.5) {
        let params = small_uts(rng);
        simulate(params, &uts_name(&params), scenario, trace)
    } else {
        let problem = NQueens { n: rng.gen_range(6..=8) };
        simulate(problem, &format!("{}-Queens", problem.n), scenario, trace)
    }
}

fn simulate<P: Problem + Send + 'static>(
    problem: P,
    name: &str,
    scenario: Scenario,
    trace: bool,
) -> (RunReport, Vec<String>) {
    let reference = Reference::from(solve_sequential(&problem));
    let world = World::new(WorldConfig {
        seed: scenario.seed,
        limit: LIMIT,
        trace,
        slow: scenario.slow.clone(),
    });
    let cluster = LocalCluster::new(scenario.ranks);
    let mut step_faults = Vec::new();
    for &(victim, how) in &scenario.kills {
        match how {
            Kill::Point(point, nth) => cluster.arm(victim, point, nth),
            Kill::Step(after) => step_faults.push((victim, after, None)),
            Kill::Stop(after, declared) => step_faults.push((victim, after, Some(declared))),
        }
    }
    let config = scenario.config();
    let problem = Arc::new(problem);
    let body = move |fabric: LocalFabric| {
        let me = fabric_rank(&fabric);
        if let Some(&(rank, after, declared)) = step_faults.iter().find(|f| f.0 == me) {
            ftkv_sim::world::plan_here(|now| match declared {
                Some(declared) => {
                    Fault::Stall { rank, at: now + after, declared_after: Some(declared) }
                }
                None => Fault::Kill { rank, at: now + after },
            });
        }
        pool::run(&fabric, &*problem, &config).map_err(|e| e.to_string())
    };
    let (results, outcome) = ftkv_sim::world::run_cluster(&cluster, &world, body);
    let mut violations: Vec<String> = outcome.aborted.iter().cloned().collect();
    let dead: Vec<i32> = (0..scenario.ranks as i32).filter(|&r| cluster.is_dead(r)).collect();
    let mut survivors = 0;
    let mut named: Vec<&Vec<i32>> = Vec::new();
    for (rank, result) in results.iter().enumerate() {
        match result {
            Err(panic) => violations.push(format!("worker {rank} panicked: {panic}")),
            Ok(Some(Err(e))) => violations.push(format!("worker {rank}: {e}")),
            Ok(Some(Ok(ended))) => {
                survivors += 1;
                named.push(&ended.failed);
                violations.extend(judge(rank, ended, reference, &dead));
            }
            Ok(None) => {}
        }
    }
    if named.windows(2).any(|w| w[0] != w[1]) {
        violations.push(format!("the survivors name different failed workers: {named:?}"));
    }
    if outcome.aborted.is_none() && survivors == 0 {
        violations.push("no worker survived".into());
    }
    let report = RunReport {
        seed: scenario.seed,
        scenario: scenario.describe(name),
        violations,
        digest: outcome.digest,
        steps: outcome.steps as usize,
    };
    let mut lines = outcome.struck;
    lines.extend(outcome.trace);
    (report, lines)
}

fn fabric_rank(fabric: &LocalFabric) -> i32 {
    use ftkv::fabric::Fabric;
    fabric.rank()
}

/// What is wrong with survivor `rank`'s outcome: a count other than the sequential one, or a
/// worker named failed that did not die (a kill may land after the end: then nobody names it).
fn judge(rank: usize, ended: &Outcome, reference: Reference, dead: &[i32]) -> Vec<String> {
    let mut wrong = Vec::new();
    if let Err(e) = check_exact(&ended.total, reference) {
        wrong.push(format!("worker {rank}: {e}"));
    }
    if !ended.failed.iter().all(|w| dead.contains(w)) {
        wrong.push(format!("worker {rank} names {:?} failed, {dead:?} died", ended.failed));
    }
    wrong
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_run_and_every_run_is_exact() {
        for seed in 1..=6 {
            let (a, _) = run(seed, false);
            let (b, _) = run(seed, false);
            assert_eq!(a, b, "seed {seed}");
            assert!(a.violations.is_empty(), "{a}");
            let (a, _) = run_nfj(seed, false);
            assert_eq!(a, run_nfj(seed, false).0, "fork-join seed {seed}");
            assert!(a.violations.is_empty(), "{a}");
            let (a, _) = run_fbc(seed, false);
            assert_eq!(a, run_fbc(seed, false).0, "futures seed {seed}");
            assert!(a.violations.is_empty(), "{a}");
        }
    }
}
