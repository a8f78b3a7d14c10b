//! A deterministic simulator of the work-stealing pool: every worker's
//! [`protocol::Worker`] runs on one seeded scheduler with virtual time, against a simulated
//! fabric and store, with the driver loop of [`crate::pool`] (global recovery: revoke, the one
//! agreement per communicator, the store's recovery, rejoin; localized recovery
//! ([`Mode::Localized`]): each worker's settles on noticing a death, run as atomic
//! transactions, and the end gathered by messages). One seed fixes the problem (a UTS
//! tree or an N-Queens board), the workers, the interleaving, message delays and every fault,
//! so a failing seed replays exactly.
//!
//! Faults a seed injects: kills at a named protocol point of a victim, a thief or a buddy
//! (`steal_victim_after_loot`, …, `buddy_after_adopting`, `rejoin_before_sync`), at any action
//! (also inside a collective or a recovery), during a put (the value reaches some holders);
//! a put that never returns, ended by the watchdog as a fail-stop; a slow worker (scheduled an
//! eighth as often); messages delayed and reordered between senders (from one sender they
//! arrive in order, as MPI's are); with localized recovery, the store falling back to global
//! recovery inside a settle's transaction (decided by its record, finished after the recovery
//! as `Store::finish_transactions` does).
//!
//! The simulated fabric keeps ULFM's guarantees and no more (as [`ftkv::sim`]'s): agreements
//! and the store's recovery complete among the live members with one result; a barrier or
//! gather fails on every caller when a member died before joining and may succeed on some
//! callers only when one died after joining; revocation fails later collectives. The store
//! is abstract: it never loses an acknowledged write (its recovery is simulated by
//! [`ftkv::sim`]), and a put interrupted by a failure may or may not be visible after the next
//! recovery, the same for every reader.
//!
//! Judged after the run: every survivor ends with the sequential result (every task counted
//! exactly once), all survivors agree on it and on the failed workers, nobody waits forever.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use ftkv::sim::{mix, RunReport};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::nqueens::NQueens;
use crate::problem::{check_exact, solve_sequential, Problem, Reference};
use crate::protocol::{self, Command, Interval, PoolMessage, Settings, Settle, Slot, Stored};
use crate::protocol::{sum_contributions, Sums};
use crate::state::{Checkpoint, Loot};
use crate::uts::{self, Counts};

/// Virtual microseconds after which the watchdog ends a worker whose put never returns.
const WATCHDOG_US: u64 = 2_000;
/// The longest a survivor takes to learn of a death (virtual microseconds).
const NOTICE_US: u64 = 300;
/// How long an idle worker with nothing to do waits before its next tick, unless a message
/// arrives first (virtual microseconds; the leader's wave gap is 1 ms).
const PARK_US: u64 = 1_000;
/// More steps than any run needs: reaching it means a livelock.
const STEP_LIMIT: usize = 400_000;
const POINTS: [&str; 6] = [
    "steal_victim_after_loot",
    "steal_victim_before_send",
    "steal_thief_before_checkpoint",
    "steal_thief_before_ack",
    "buddy_after_adopting",
    "rejoin_before_sync",
];

/// One simulated pool run.
#[derive(Debug, Clone)]
pub struct PoolRun {
    pub report: RunReport,
    /// Where each death happened: a protocol point's name, `working`, `recovering`, …
    pub kills: Vec<&'static str>,
    /// Loot sent (successful steals) and recoveries completed, over all workers.
    pub steals: u64,
    pub rejoins: u64,
    /// Settles during which the store fell back to global recovery.
    pub fall_backs: u64,
    /// One line per step when traced.
    pub log: Vec<String>,
}

/// A campaign's summary.
#[derive(Debug, Clone, Default)]
pub struct Campaign {
    pub runs: u64,
    pub failing: Vec<RunReport>,
    /// A hash of every run's trace.
    pub digest: u64,
    /// Deaths by where they happened.
    pub kills: BTreeMap<&'static str, u64>,
    pub steals: u64,
    pub rejoins: u64,
    pub fall_backs: u64,
}

/// Runs the scenario of `seed`.
pub fn run(seed: u64) -> RunReport {
    simulate_seed(seed, false, Mode::Global).report
}

/// Runs the scenario of `seed`, with one line per step in [`PoolRun::log`].
pub fn run_traced(seed: u64, mode: Mode) -> PoolRun {
    simulate_seed(seed, true, mode)
}

/// How the simulated pool recovers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Revoke, the one agreement, the store's recovery, rejoin ([`crate::pool`]'s global path).
    Global,
    /// [`protocol::Worker::on_failures`] on each worker once it notices a death, its settles
    /// run atomically on the simulated store (the transactions' own protocol runs on the
    /// world in `ftkv::sim_transactions`), and the end gathered by messages ([`Command::End`]).
    Localized,
}

/// Runs `runs` scenarios from `first_seed` on; the summary digest combines every run's.
pub fn campaign(first_seed: u64, runs: u64) -> Campaign {
    campaign_in(first_seed, runs, Mode::Global)
}

/// [`campaign`] with the pool recovering as `mode` says.
pub fn campaign_in(first_seed: u64, runs: u64, mode: Mode) -> Campaign {
    let mut summary = Campaign { runs, digest: 0x9e37_79b9_7f4a_7c15, ..Campaign::default() };
    for seed in first_seed..first_seed + runs {
        let run = simulate_seed(seed, false, mode);
        summary.digest = mix(summary.digest, run.report.digest);
        for kill in run.kills {
            *summary.kills.entry(kill).or_insert(0) += 1;
        }
        summary.steals += run.steals;
        summary.rejoins += run.rejoins;
        summary.fall_backs += run.fall_backs;
        if !run.report.violations.is_empty() {
            summary.failing.push(run.report);
        }
    }
    summary
}

fn simulate_seed(seed: u64, log: bool, mode: Mode) -> PoolRun {
    let mut rng = SmallRng::seed_from_u64(seed);
    if rng.gen_bool(0.5) {
        let params = uts::Params {
            depth: rng.gen_range(4..=6),
            root_id: rng.gen_range(0..1000),
            ..uts::Params::default()
        };
        let name = format!("UTS geometric depth {} root {}", params.depth, params.root_id);
        simulate(&params, name, (seed, mode), rng, log)
    } else {
        let problem = NQueens { n: rng.gen_range(6..=8) };
        simulate(&problem, format!("{}-Queens", problem.n), (seed, mode), rng, log)
    }
}

fn simulate<P: Problem>(
    problem: &P,
    name: String,
    (seed, mode): (u64, Mode),
    rng: SmallRng,
    log: bool,
) -> PoolRun {
    let expected = solve_sequential(problem);
    let mut sim = Sim::new(problem, name, (seed, mode), rng, expected.nodes);
    if log {
        sim.log = Some(Vec::new());
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.run()));
    if let Err(panic) = outcome {
        let what = panic.downcast_ref::<&str>().map(|s| s.to_string());
        let what = what.or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_default();
        sim.violations.push(format!("a worker panicked: {what}"));
    } else {
        sim.judge(expected);
    }
    let log = sim.log.take().unwrap_or_default();
    let report = RunReport {
        seed,
        scenario: sim.scenario,
        violations: sim.violations,
        digest: sim.digest,
        steps: sim.steps,
    };
    PoolRun {
        report,
        kills: sim.kills,
        steals: sim.steals,
        rejoins: sim.rejoins,
        fall_backs: sim.fall_backs,
        log,
    }
}

/// When an armed worker dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kill {
    /// At its `nth` pass through a named protocol point.
    Point(&'static str, usize),
    /// At its `nth` action, wherever it is (also waiting in a collective).
    Action(usize),
    /// At its `nth` action after its first recovery started.
    InRecovery(usize),
    /// During its `nth` put (the value may reach some holders).
    DuringPut(usize),
    /// As a holder of the `nth` put any other worker makes (counting loot puts only when
    /// `loot`): that put fails (its value may reach some holders), its writer knows at once,
    /// and now and then the writer dies too, later in the recovery this starts.
    HolderOfPut { nth: usize, loot: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Sync,
    Gather,
    Agree,
    Recover,
}

/// Why a worker waits in a collective, i.e. what it does once the call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Context {
    /// A store barrier of the work or of a rejoin.
    Sync,
    /// The final gather of the results.
    Gather,
    /// The final agreement (with the gathered sums when the gather succeeded).
    FinishAgree(Option<Sums>),
    /// The agreement a recovery joins.
    RecoveryAgree,
    /// The store's recovery.
    Recover,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Working,
    Waiting {
        context: Context,
        kind: Kind,
        epoch: usize,
        call: u64,
    },
    /// Inside a put that never returns, until the watchdog's deadline.
    Stalled(u64),
    Done(Sums),
    /// A localized run's end: the total and the failed workers it named (a bit per worker).
    Ended(Sums, u64),
    Failed,
    Dead,
}

struct SimWorker<'p, P: Problem> {
    id: i32,
    machine: protocol::Worker<'p, P>,
    queue: VecDeque<Command<P::Task>>,
    phase: Phase,
    epoch: usize,
    /// Took part in the one agreement of its epoch.
    agreed: bool,
    /// Virtual time from which it knows of a death it has not recovered from.
    notice: Option<u64>,
    parked_until: u64,
    actions: usize,
    recovery_actions: Option<usize>,
    passes: BTreeMap<&'static str, usize>,
    puts: usize,
    kill: Option<Kill>,
    stalls_at_put: Option<usize>,
    slow: bool,
    /// Its queue holds (the rest of) a rejoin; a failure starts the recovery again.
    rejoining: bool,
    /// Its settle that the store's fall back to global recovery interrupted.
    in_doubt: Option<InDoubt<P::Task>>,
}

/// A settle's transaction that the store's fall back to global recovery interrupted, as
/// `ftkv::Store::transaction` leaves it: decided by its record (`committed`), its writes (in
/// order) applied up to some point when committed, none when not. The store's
/// `finish_transactions` applies the rest after the recovery, on the coordinator or, once it
/// died, on its backup; the coordinator's machine then takes `state` if it committed.
struct InDoubt<T> {
    settle: Settle,
    writes: Vec<Write>,
    state: Option<Checkpoint<T>>,
    committed: bool,
}

/// A write of the simulated store: key (owner, slot) and value (`None`: a delete).
type Write = (i32, Slot, Option<Vec<u8>>);

/// A communicator generation.
struct Epoch {
    members: Vec<i32>,
    revoked: bool,
}

#[derive(Default)]
struct Call {
    joined: BTreeMap<i32, [u64; 6]>,
    decided: Option<Vec<u64>>,
}

/// One store key: its acknowledged value and a write a failure interrupted.
#[derive(Default)]
struct Cell {
    value: Option<Vec<u8>>,
    in_flight: Option<Option<Vec<u8>>>,
}

struct Flight<T> {
    from: i32,
    to: i32,
    epoch: usize,
    at: u64,
    message: PoolMessage<T>,
}

struct Sim<'p, P: Problem> {
    mode: Mode,
    rng: SmallRng,
    scenario: String,
    now: u64,
    max_delay: u64,
    workers: Vec<SimWorker<'p, P>>,
    epochs: Vec<Epoch>,
    calls: BTreeMap<(usize, Kind, u64), Call>,
    counters: BTreeMap<(i32, usize, Kind), u64>,
    store: BTreeMap<(i32, Slot), Cell>,
    flights: Vec<Flight<P::Task>>,
    digest: u64,
    steps: usize,
    violations: Vec<String>,
    log: Option<Vec<String>>,
    /// Where each death happened.
    kills: Vec<&'static str>,
    /// Puts made so far, by all workers.
    puts: usize,
    loot_puts: usize,
    /// Loot sent and recoveries completed, over all workers.
    steals: u64,
    rejoins: u64,
    /// Localized: the settle (counted over all workers, those that write) during which the
    /// store falls back to global recovery.
    fall_back_at: Option<usize>,
    settles: usize,
    fall_backs: u64,
}

impl<'p, P: Problem> Sim<'p, P> {
    /// The scenario of `seed` on a problem of `nodes` tasks.
    fn new(
        problem: &'p P,
        name: String,
        (seed, mode): (u64, Mode),
        mut rng: SmallRng,
        nodes: u64,
    ) -> Self {
        let n = rng.gen_range(2..=6usize);
        let interval = if rng.gen_bool(0.5) {
            Interval::Tasks(rng.gen_range(3..40))
        } else {
            Interval::Time(Duration::from_micros(rng.gen_range(20..400)))
        };
        let settings = Settings {
            interval: Some(interval),
            batch: rng.gen_range(1..=6),
            seed,
            localized: mode == Mode::Localized,
        };
        let max_delay = [0, 2, 10, 60, 300][rng.gen_range(0..5)];
        let kills = rng.gen_range(0..=3usize.min(n - 1));
        // About the actions a worker takes in a failure-free run.
        let actions = (nodes as usize / settings.batch / n).max(4) * 2;
        let mut armed: BTreeMap<i32, Kill> = BTreeMap::new();
        while armed.len() < kills {
            let kill = match rng.gen_range(0..4) {
                0 | 1 => Kill::Point(POINTS[rng.gen_range(0..POINTS.len())], rng.gen_range(1..4)),
                2 => Kill::Action(rng.gen_range(1..actions)),
                _ if rng.gen_bool(0.5) => Kill::InRecovery(rng.gen_range(1..40)),
                _ if rng.gen_bool(0.5) => Kill::DuringPut(rng.gen_range(1..12)),
                _ if rng.gen_bool(0.5) => {
                    Kill::HolderOfPut { nth: rng.gen_range(1..4), loot: true }
                }
                _ => Kill::HolderOfPut { nth: rng.gen_range(1..(n * 12)), loot: false },
            };
            armed.insert(rng.gen_range(0..n as i32), kill);
        }
        let stall = (rng.gen_bool(0.1) && armed.len() < n - 1)
            .then(|| (rng.gen_range(0..n as i32), rng.gen_range(1..12)))
            .filter(|(w, _)| !armed.contains_key(w));
        let slow = rng.gen_bool(0.3).then(|| rng.gen_range(0..n as i32));
        let fall_back_at =
            (mode == Mode::Localized && rng.gen_bool(0.3)).then(|| rng.gen_range(1..4usize));
        let scenario = format!(
            "{name}, {n} workers, {mode:?} recovery, batch {}, {interval:?}, delay ≤ \
             {max_delay} µs, kills {armed:?}, stalled put {stall:?}, slow {slow:?}, fall back \
             at settle {fall_back_at:?}",
            settings.batch
        );
        let workers = (0..n as i32)
            .map(|id| {
                let mut machine = protocol::Worker::new(problem, settings, id, n);
                let queue = machine.start().into();
                SimWorker {
                    id,
                    machine,
                    queue,
                    phase: Phase::Working,
                    epoch: 0,
                    agreed: false,
                    notice: None,
                    parked_until: 0,
                    actions: 0,
                    recovery_actions: None,
                    passes: BTreeMap::new(),
                    puts: 0,
                    kill: armed.get(&id).copied(),
                    stalls_at_put: stall.filter(|(w, _)| *w == id).map(|(_, at)| at),
                    slow: slow == Some(id),
                    rejoining: false,
                    in_doubt: None,
                }
            })
            .collect();
        Sim {
            mode,
            rng,
            scenario,
            now: 0,
            max_delay,
            workers,
            epochs: vec![Epoch { members: (0..n as i32).collect(), revoked: false }],
            calls: BTreeMap::new(),
            counters: BTreeMap::new(),
            store: BTreeMap::new(),
            flights: Vec::new(),
            digest: seed,
            steps: 0,
            violations: Vec::new(),
            log: None,
            kills: Vec::new(),
            puts: 0,
            loot_puts: 0,
            steals: 0,
            rejoins: 0,
            fall_back_at,
            settles: 0,
            fall_backs: 0,
        }
    }

    fn alive(&self, id: i32) -> bool {
        !matches!(self.workers[id as usize].phase, Phase::Dead)
    }

    fn run(&mut self) {
        while self.steps < STEP_LIMIT {
            let runnable: Vec<usize> =
                (0..self.workers.len()).filter(|&i| self.can_act(i)).collect();
            if runnable.is_empty() {
                if !self.advance_time() {
                    break;
                }
                continue;
            }
            self.maybe_kill_a_waiting_worker();
            self.fire_watchdogs();
            let weights: Vec<u32> =
                runnable.iter().map(|&i| if self.workers[i].slow { 1 } else { 8 }).collect();
            let total: u32 = weights.iter().sum();
            let mut pick = self.rng.gen_range(0..total);
            let i = runnable
                .iter()
                .zip(&weights)
                .find(|(_, &w)| {
                    let hit = pick < w;
                    pick = pick.saturating_sub(w);
                    hit
                })
                .map(|(&i, _)| i)
                .expect("a pick");
            if self.can_act(i) {
                self.act(i);
            }
            self.now += self.rng.gen_range(1..=3);
            self.steps += 1;
        }
        if self.steps >= STEP_LIMIT {
            self.violations.push(format!("no end after {STEP_LIMIT} steps"));
        }
    }

    /// When nobody can act: jumps to the next moment something happens (a message arrives,
    /// a parked worker wakes, a death is noticed, a watchdog fires). `false` when nothing will.
    fn advance_time(&mut self) -> bool {
        let (mut next, now): (Option<u64>, u64) = (None, self.now);
        let mut consider = |t: u64| {
            if t > now {
                next = Some(next.map_or(t, |n: u64| n.min(t)));
            }
        };
        for f in &self.flights {
            if self.alive(f.to) {
                consider(f.at);
            }
        }
        for w in &self.workers {
            match w.phase {
                Phase::Stalled(until) => consider(until),
                Phase::Working => {
                    consider(w.parked_until);
                    if let Some(t) = w.notice {
                        consider(t);
                    }
                }
                _ => {}
            }
        }
        let Some(t) = next else { return false };
        self.now = t;
        self.fire_watchdogs();
        true
    }

    /// Ends every worker whose put has not returned by its watchdog's deadline.
    fn fire_watchdogs(&mut self) {
        for i in 0..self.workers.len() {
            if matches!(self.workers[i].phase, Phase::Stalled(until) if until <= self.now) {
                self.trace(i, 0xdead_0003);
                self.die(i, "watchdog after a put that never returned");
            }
        }
    }

    fn must_recover(&self, i: usize) -> bool {
        let w = &self.workers[i];
        let noticed = w.notice.is_some_and(|t| t <= self.now);
        self.epochs[w.epoch].revoked || (noticed && self.mode == Mode::Global)
    }

    /// Localized: a death this worker noticed and has not handed to its machine yet (it does
    /// between two command lists, as the driver does before each step).
    fn must_settle(&self, i: usize) -> bool {
        let w = &self.workers[i];
        self.mode == Mode::Localized
            && w.queue.is_empty()
            && w.notice.is_some_and(|t| t <= self.now)
    }

    /// The messages worker `i` may receive now: from each sender of its epoch, the oldest.
    fn deliverable(&self, i: usize) -> Vec<usize> {
        let id = self.workers[i].id;
        let epoch = self.workers[i].epoch;
        let mut firsts: Vec<usize> = Vec::new();
        let mut senders: Vec<i32> = Vec::new();
        for (k, f) in self.flights.iter().enumerate() {
            if f.to != id || f.epoch != epoch || senders.contains(&f.from) {
                continue;
            }
            senders.push(f.from);
            if f.at <= self.now {
                firsts.push(k);
            }
        }
        firsts
    }

    fn can_act(&self, i: usize) -> bool {
        let w = &self.workers[i];
        match w.phase {
            Phase::Dead | Phase::Done(_) | Phase::Ended(..) | Phase::Failed | Phase::Stalled(_) => {
                false
            }
            Phase::Waiting { kind, epoch, call, .. } => self.completes(kind, epoch, call),
            Phase::Working => {
                !w.queue.is_empty()
                    || w.rejoining
                    || self.must_recover(i)
                    || self.must_settle(i)
                    || w.parked_until <= self.now
                    || !self.deliverable(i).is_empty()
            }
        }
    }

    /// Whether a collective can return: every live member joined, or (barrier, gather) a
    /// member died without joining or the communicator was revoked.
    fn completes(&self, kind: Kind, epoch: usize, call: u64) -> bool {
        let Some(c) = self.calls.get(&(epoch, kind, call)) else { return false };
        if c.decided.is_some() {
            return true;
        }
        let members = &self.epochs[epoch].members;
        let absent_alive = members.iter().any(|m| self.alive(*m) && !c.joined.contains_key(m));
        let absent_dead = members.iter().any(|m| !self.alive(*m) && !c.joined.contains_key(m));
        // A store barrier fails on a death in either mode: the pool then recovers globally.
        let regular = matches!(kind, Kind::Sync | Kind::Gather);
        !absent_alive || (regular && (absent_dead || self.epochs[epoch].revoked))
    }

    fn maybe_kill_a_waiting_worker(&mut self) {
        if !self.rng.gen_bool(0.02) {
            return;
        }
        let waiting = self.workers.iter().position(|w| {
            matches!(w.kill, Some(Kill::Action(_) | Kill::InRecovery(_)))
                && matches!(w.phase, Phase::Waiting { .. })
        });
        if let Some(i) = waiting {
            self.trace(i, 0xdead_0002);
            let why =
                if self.recovering(i) { "recovering, in a collective" } else { "in a collective" };
            self.die(i, why);
        }
    }

    /// Whether worker `i` is inside a recovery (its agreement, the store's, or a rejoin).
    fn recovering(&self, i: usize) -> bool {
        let w = &self.workers[i];
        w.rejoining
            || matches!(
                w.phase,
                Phase::Waiting { context: Context::RecoveryAgree | Context::Recover, .. }
            )
    }

    fn die(&mut self, i: usize, why: &'static str) {
        self.kills.push(why);
        self.workers[i].phase = Phase::Dead;
        self.workers[i].kill = None;
        // Its backup rolls a committed record forward before anyone reads what it wrote.
        if let Some(in_doubt) = self.workers[i].in_doubt.take().filter(|d| d.committed) {
            self.apply(&in_doubt.writes);
        }
        if self.mode == Mode::Localized {
            self.land_or_drop_in_flight(self.workers[i].id);
        }
        for j in 0..self.workers.len() {
            if !self.alive(self.workers[j].id) {
                continue;
            }
            let at = self.now + self.rng.gen_range(0..NOTICE_US);
            let w = &mut self.workers[j];
            w.notice = Some(w.notice.map_or(at, |t| t.min(at)));
        }
    }

    fn kill_due(&self, i: usize) -> bool {
        let w = &self.workers[i];
        match w.kill {
            Some(Kill::Action(at)) => w.actions >= at,
            Some(Kill::InRecovery(at)) => w.recovery_actions.is_some_and(|a| a >= at),
            _ => false,
        }
    }

    fn act(&mut self, i: usize) {
        self.workers[i].actions += 1;
        if let Some(a) = self.workers[i].recovery_actions.as_mut() {
            *a += 1;
        }
        if self.kill_due(i) {
            self.trace(i, 0xdead_0000);
            let why = if self.recovering(i) { "recovering" } else { "working" };
            return self.die(i, why);
        }
        match self.workers[i].phase {
            Phase::Waiting { context, kind, epoch, call } => {
                self.complete(i, context, kind, epoch, call)
            }
            Phase::Working => self.work(i),
            _ => {}
        }
    }

    fn work(&mut self, i: usize) {
        if self.must_settle(i) {
            return self.notice_failures(i);
        }
        if self.must_recover(i) {
            self.interrupt_write(i);
            self.trace(i, 0x100);
            return self.start_recovery(i);
        }
        if let Some(command) = self.workers[i].queue.pop_front() {
            return self.execute(i, command);
        }
        if self.workers[i].rejoining {
            self.trace(i, 0x200);
            self.workers[i].rejoining = false;
            self.rejoins += 1;
            return;
        }
        let now = Duration::from_micros(self.now);
        let deliverable = self.deliverable(i);
        if !deliverable.is_empty() {
            let k = deliverable[self.rng.gen_range(0..deliverable.len())];
            let flight = self.flights.remove(k);
            self.trace(i, 0x300 | message_code(&flight.message) | (flight.from as u64) << 4);
            let commands = self.workers[i].machine.on_message(flight.from, flight.message, now);
            self.workers[i].queue.extend(commands);
            return;
        }
        let commands = self.workers[i].machine.tick(now);
        self.trace(i, 0x400 | commands.len() as u64);
        let w = &mut self.workers[i];
        if commands.is_empty() && w.machine.is_idle() {
            w.parked_until = self.now + PARK_US;
        }
        w.queue.extend(commands);
    }

    /// A write of worker `i` (`None`: a delete) that a failure interrupted: it may have reached
    /// some holders, and then the next recovery may make it current.
    fn maybe_in_flight(&mut self, i: usize, slot: Slot, value: Option<Vec<u8>>) {
        if self.rng.gen_bool(0.5) {
            let id = self.workers[i].id;
            self.store.entry((id, slot)).or_default().in_flight = Some(value);
        }
    }

    /// A failure noticed at a put or delete: the write may have reached some holders.
    fn interrupt_write(&mut self, i: usize) {
        let id = self.workers[i].id;
        let (slot, value) = match self.workers[i].queue.front() {
            Some(Command::Put { slot, bytes }) => (*slot, Some(bytes.clone())),
            Some(Command::DeleteLoot { owner }) if *owner == id => (Slot::Loot, None),
            _ => return,
        };
        self.maybe_in_flight(i, slot, value);
    }

    fn start_recovery(&mut self, i: usize) {
        let w = &mut self.workers[i];
        w.queue.clear();
        w.recovery_actions.get_or_insert(0);
        self.epochs[w.epoch].revoked = true;
        if std::mem::replace(&mut self.workers[i].agreed, true) {
            self.join(i, Context::Recover, Kind::Recover, [0; 6]);
        } else {
            self.join(i, Context::RecoveryAgree, Kind::Agree, [0; 6]);
        }
    }

    fn execute(&mut self, i: usize, command: Command<P::Task>) {
        self.trace(i, command_code(&command));
        let id = self.workers[i].id;
        match command {
            Command::Send { to, message } => {
                self.steals += u64::from(matches!(message, PoolMessage::Loot(Some(_))));
                let at = self.now + self.rng.gen_range(0..=self.max_delay);
                let epoch = self.workers[i].epoch;
                self.flights.push(Flight { from: id, to, epoch, at, message });
            }
            Command::Put { slot, bytes } => self.put(i, slot, bytes),
            Command::DeleteLoot { owner } => {
                self.store.entry((owner, Slot::Loot)).or_default().value = None;
            }
            Command::Sync => self.join(i, Context::Sync, Kind::Sync, [0; 6]),
            Command::ReadAll => self.read_all(i),
            Command::Failpoint(name) => {
                let passes = self.workers[i].passes.entry(name).or_insert(0);
                *passes += 1;
                let passes = *passes;
                if self.workers[i].kill == Some(Kill::Point(name, passes)) {
                    self.trace(i, 0xdead_0001);
                    self.die(i, name);
                }
            }
            Command::Finish => {
                let mine = self.workers[i].machine.contribution();
                self.join(i, Context::Gather, Kind::Gather, mine);
            }
            Command::Settle(settle) => self.settle(i, settle),
            Command::End(words, failed) => {
                let mask = failed.iter().fold(0u64, |m, &w| m | 1 << w);
                self.workers[i].phase = Phase::Ended(sum_contributions(&words), mask);
            }
        }
    }

    fn put(&mut self, i: usize, slot: Slot, bytes: Vec<u8>) {
        self.puts += 1;
        self.loot_puts += usize::from(slot == Slot::Loot);
        let (puts, loot_puts) = (self.puts, self.loot_puts);
        let holder = self.workers.iter().position(|w| {
            let armed = match w.kill {
                Some(Kill::HolderOfPut { nth, loot: false }) => nth == puts,
                Some(Kill::HolderOfPut { nth, loot: true }) => {
                    slot == Slot::Loot && nth == loot_puts
                }
                _ => false,
            };
            armed && w.id != self.workers[i].id && !matches!(w.phase, Phase::Dead)
        });
        if let Some(h) = holder.filter(|_| self.mode == Mode::Localized) {
            // The localized store moves the copy to a reserve holder; the put completes.
            self.trace(h, 0xdead_0005);
            self.die(h, "holder of another's put");
        } else if let Some(h) = holder {
            self.trace(h, 0xdead_0005);
            self.die(h, "holder of another's put");
            self.maybe_in_flight(i, slot, Some(bytes));
            self.workers[i].notice = Some(self.now);
            if self.workers[i].kill.is_none() && self.rng.gen_bool(0.4) {
                self.workers[i].kill = Some(Kill::InRecovery(self.rng.gen_range(1..10)));
            }
            return self.start_recovery(i);
        }
        let w = &mut self.workers[i];
        w.puts += 1;
        let (id, puts, kill, stalls_at) = (w.id, w.puts, w.kill, w.stalls_at_put);
        // The key's cell exists from its first put on, landed or not.
        self.store.entry((id, slot)).or_default();
        if kill == Some(Kill::DuringPut(puts)) {
            self.maybe_in_flight(i, slot, Some(bytes));
            self.trace(i, 0xdead_0004);
            return self.die(i, "during a put");
        }
        if stalls_at == Some(puts) {
            self.maybe_in_flight(i, slot, Some(bytes));
            self.workers[i].phase = Phase::Stalled(self.now + WATCHDOG_US);
            return;
        }
        let cell = self.store.entry((id, slot)).or_default();
        cell.value = Some(bytes);
        cell.in_flight = None;
    }

    /// Localized: worker `i` hands every death it knows of to its machine and queues its part
    /// of the recovery (counted as recovering, for kills armed in a recovery).
    fn notice_failures(&mut self, i: usize) {
        let dead: Vec<i32> =
            self.workers.iter().filter(|w| !self.alive(w.id)).map(|w| w.id).collect();
        let now = Duration::from_micros(self.now);
        let w = &mut self.workers[i];
        w.notice = None;
        w.recovery_actions.get_or_insert(0);
        let commands = w.machine.on_failures(&dead, now);
        self.rejoins += u64::from(!commands.is_empty());
        self.trace(i, 0x600 | commands.len() as u64);
        self.workers[i].queue.extend(commands);
    }

    /// Localized: a dead worker's write that its death interrupted lands or not, once, the
    /// same for every later reader (the store reads the newest version on any live holder).
    fn land_or_drop_in_flight(&mut self, id: i32) {
        for slot in [Slot::Checkpoint, Slot::Loot] {
            let lands = self.rng.gen_bool(0.5);
            if let Some(cell) = self.store.get_mut(&(id, slot)) {
                if let Some(value) = cell.in_flight.take() {
                    if lands {
                        cell.value = value;
                    }
                }
            }
        }
    }

    fn stored<T: serde::de::DeserializeOwned>(&self, owner: i32, slot: Slot) -> Option<T> {
        let bytes = self.store.get(&(owner, slot))?.value.as_ref()?;
        ftkv::codec::decode(bytes)
    }

    fn set(&mut self, owner: i32, slot: Slot, value: Option<Vec<u8>>) {
        self.store.entry((owner, slot)).or_default().value = value;
    }

    /// One [`Settle`] as one atomic transaction on the simulated store (as [`crate::pool`]
    /// runs it through `Store::transaction`), or, at the scenario's chosen settle, one the
    /// store's fall back to global recovery interrupts ([`Sim::fall_back`]).
    fn settle(&mut self, i: usize, settle: Settle) {
        let me = self.workers[i].id;
        let mut writes: Vec<Write> = Vec::new();
        let new = match settle {
            Settle::Adopt { dead } => {
                let theirs = self.stored(dead, Slot::Checkpoint);
                let adoption = self.workers[i].machine.with_adopted(dead, theirs);
                adoption.map(|(mine, emptied)| {
                    writes.push((dead, Slot::Checkpoint, Some(emptied.encode())));
                    mine
                })
            }
            Settle::Loot { victim } => {
                let Some(loot) = self.stored::<Loot<P::Task>>(victim, Slot::Loot) else { return };
                let machine = &self.workers[i].machine;
                if !machine.resolves_loot(victim, &loot) {
                    return;
                }
                let victims = self.stored(victim, Slot::Checkpoint);
                let thiefs = (loot.thief != me).then(|| self.stored(loot.thief, Slot::Checkpoint));
                writes.push((victim, Slot::Loot, None));
                machine.with_loot(victim, &loot, victims.as_ref(), thiefs.flatten().as_ref())
            }
            Settle::TakeBack { thief } => {
                let thiefs = self.stored(thief, Slot::Checkpoint);
                writes.push((me, Slot::Loot, None));
                self.workers[i].machine.with_taken_back(thiefs.as_ref())
            }
        };
        if let Some(state) = &new {
            writes.push((me, Slot::Checkpoint, Some(state.encode())));
        }
        if writes.is_empty() {
            return;
        }
        self.settles += 1;
        if self.fall_back_at == Some(self.settles) && self.nobody_finished() {
            return self.fall_back(i, settle, writes, new);
        }
        self.apply(&writes);
        match new {
            Some(state) => self.workers[i].machine.settled(settle, state),
            None if matches!(settle, Settle::TakeBack { .. }) => {
                self.workers[i].machine.clear_pending()
            }
            None => {}
        }
    }

    fn apply(&mut self, writes: &[Write]) {
        for (owner, slot, value) in writes {
            self.set(*owner, *slot, value.clone());
        }
    }

    /// Whether no worker has ended: a fall back to global recovery needs every survivor.
    fn nobody_finished(&self) -> bool {
        !self.workers.iter().any(|w| matches!(w.phase, Phase::Done(_) | Phase::Ended(..)))
    }

    /// The store falls back to global recovery inside worker `i`'s settle transaction: the
    /// record decides it (committed or not, at random); committed, a prefix of its writes
    /// has landed. The worker's call fails, and it starts the global recovery.
    fn fall_back(
        &mut self,
        i: usize,
        settle: Settle,
        writes: Vec<Write>,
        state: Option<Checkpoint<P::Task>>,
    ) {
        let committed = self.rng.gen_bool(0.5);
        if committed {
            let landed = self.rng.gen_range(0..=writes.len());
            self.apply(&writes[..landed]);
        }
        self.trace(i, 0x700 | u64::from(committed));
        self.fall_backs += 1;
        self.workers[i].in_doubt = Some(InDoubt { settle, writes, state, committed });
        self.start_recovery(i);
    }

    /// After the store's recovery, before worker `i` rejoins: `Store::finish_transactions`
    /// finishes its interrupted settle, and a committed one takes effect on its machine.
    fn finish_in_doubt(&mut self, i: usize) {
        let Some(in_doubt) = self.workers[i].in_doubt.take() else { return };
        if !in_doubt.committed {
            return;
        }
        self.apply(&in_doubt.writes);
        if let Some(state) = in_doubt.state {
            self.workers[i].machine.settled(in_doubt.settle, state);
        }
    }

    fn read_all(&mut self, i: usize) {
        let n = self.workers.len() as i32;
        let store = &self.store;
        let read = |slot| -> Vec<Option<Vec<u8>>> {
            (0..n).map(|w| store.get(&(w, slot)).and_then(|c| c.value.clone())).collect()
        };
        let (checkpoints, loots) = (read(Slot::Checkpoint), read(Slot::Loot));
        match Stored::decode(&checkpoints, &loots) {
            Ok(stored) => {
                let now = Duration::from_micros(self.now);
                let (commands, _) = self.workers[i].machine.on_stored(stored, now);
                for command in commands.into_iter().rev() {
                    self.workers[i].queue.push_front(command);
                }
            }
            Err(what) => {
                self.violations.push(format!("worker {i} read a corrupt {what}"));
                self.workers[i].phase = Phase::Failed;
            }
        }
    }

    fn join(&mut self, i: usize, context: Context, kind: Kind, mine: [u64; 6]) {
        let (id, epoch) = (self.workers[i].id, self.workers[i].epoch);
        let counter = self.counters.entry((id, epoch, kind)).or_insert(0);
        let call = *counter;
        *counter += 1;
        self.calls.entry((epoch, kind, call)).or_default().joined.insert(id, mine);
        self.workers[i].phase = Phase::Waiting { context, kind, epoch, call };
    }

    /// The call's outcome, computed by its first completer and the same for everyone after.
    fn decide(
        &mut self,
        key: (usize, Kind, u64),
        compute: impl FnOnce(&mut Self) -> Vec<u64>,
    ) -> Vec<u64> {
        if let Some(decided) = &self.calls[&key].decided {
            return decided.clone();
        }
        let value = compute(self);
        self.calls.get_mut(&key).expect("the call").decided = Some(value.clone());
        value
    }

    /// Whether a barrier or gather succeeds for this caller.
    fn regular_succeeds(&mut self, key: (usize, Kind, u64)) -> bool {
        let members = &self.epochs[key.0].members;
        let all_joined = members.iter().all(|m| self.calls[&key].joined.contains_key(m));
        let anyone_dead = members.iter().any(|m| !self.alive(*m));
        let revoked = self.epochs[key.0].revoked;
        !(revoked || !all_joined || (anyone_dead && self.rng.gen_bool(0.5)))
    }

    fn complete(&mut self, i: usize, context: Context, kind: Kind, epoch: usize, call: u64) {
        let key = (epoch, kind, call);
        self.trace(i, 0x500 | (kind as u64) << 4);
        match context {
            Context::Sync => {
                if self.regular_succeeds(key) {
                    self.workers[i].phase = Phase::Working;
                } else {
                    self.start_recovery(i);
                }
            }
            Context::Gather => {
                let ok = self.regular_succeeds(key);
                let sums = ok.then(|| {
                    let members = self.epochs[epoch].members.clone();
                    let words: Vec<u64> =
                        members.iter().flat_map(|m| self.calls[&key].joined[m]).collect();
                    sum_contributions(&words)
                });
                self.workers[i].agreed = true;
                self.join(i, Context::FinishAgree(sums), Kind::Agree, [ok as u64, 0, 0, 0, 0, 0]);
            }
            Context::FinishAgree(sums) => {
                let value = self.agreement(key)[0];
                match sums.filter(|_| value == 1) {
                    Some(sums) => self.workers[i].phase = Phase::Done(sums),
                    None => self.start_recovery(i),
                }
            }
            Context::RecoveryAgree => {
                self.agreement(key);
                self.join(i, Context::Recover, Kind::Recover, [0; 6]);
            }
            Context::Recover => self.rejoin(i, key),
        }
    }

    fn agreement(&mut self, key: (usize, Kind, u64)) -> Vec<u64> {
        self.decide(key, |sim| {
            let c = &sim.calls[&key];
            let flags = c.joined.iter().filter(|(m, _)| sim.alive(**m));
            vec![flags.fold(1, |a, (_, f)| a & f[0])]
        })
    }

    /// The store's recovery returned the new live set: resolves interrupted writes (once per
    /// recovery), then the worker rejoins on the new communicator.
    fn rejoin(&mut self, i: usize, key: (usize, Kind, u64)) {
        let new = self.decide(key, |sim| {
            let live: Vec<i32> =
                sim.epochs[key.0].members.iter().copied().filter(|m| sim.alive(*m)).collect();
            sim.epochs.push(Epoch { members: live, revoked: false });
            let cells: Vec<(i32, Slot)> = sim.store.keys().copied().collect();
            for cell in cells {
                let lands = sim.rng.gen_bool(0.5);
                let c = sim.store.get_mut(&cell).expect("a cell");
                if let Some(value) = c.in_flight.take() {
                    if lands {
                        c.value = value;
                    }
                }
            }
            let new = sim.epochs.len() - 1;
            sim.flights.retain(|f| f.epoch == new);
            vec![new as u64]
        })[0] as usize;
        let live = self.epochs[new].members.clone();
        let now = Duration::from_micros(self.now);
        self.finish_in_doubt(i);
        let w = &mut self.workers[i];
        w.epoch = new;
        w.agreed = false;
        w.notice = None;
        w.parked_until = 0;
        let commands = w.machine.rejoin(&live, now).expect("the simulation checkpoints");
        w.queue = commands.into();
        w.rejoining = true;
        w.phase = Phase::Working;
    }

    fn trace(&mut self, i: usize, code: u64) {
        let id = self.workers[i].id as u64;
        self.digest = mix(mix(self.digest, (self.steps as u64) << 8 | id), code);
        let (step, now, epoch) = (self.steps, self.now, self.workers[i].epoch);
        if let Some(log) = &mut self.log {
            log.push(format!("step {step} t={now}µs worker {id} epoch {epoch}: {code:#x}"));
        }
    }

    fn judge(&mut self, expected: Counts) {
        let mut results: Vec<(i32, Sums, Vec<i32>)> = Vec::new();
        for w in &self.workers {
            match w.phase {
                Phase::Dead => {}
                Phase::Done(sums) => {
                    let live = w.machine.live();
                    let failed = (0..self.workers.len() as i32).filter(|x| !live.contains(x));
                    results.push((w.id, sums, failed.collect()));
                }
                Phase::Ended(sums, mask) => {
                    let failed = (0..self.workers.len() as i32).filter(|x| mask & 1 << x != 0);
                    results.push((w.id, sums, failed.collect()));
                }
                other => self.violations.push(format!("worker {} ends in {other:?}", w.id)),
            }
        }
        for (id, (total, _), failed) in &results {
            if let Err(what) = check_exact(total, Reference::from(expected)) {
                self.violations.push(format!("worker {id} {what}"));
            }
            if let Some(alive) = failed.iter().find(|&&f| self.alive(f)) {
                self.violations.push(format!("worker {id} counts live worker {alive} as failed"));
            }
            if *failed != results[0].2 {
                self.violations.push(format!(
                    "workers {id} and {} disagree on the failed set: {failed:?} vs {:?}",
                    results[0].0, results[0].2
                ));
            }
        }
    }
}

fn message_code<T>(message: &PoolMessage<T>) -> u64 {
    match message {
        PoolMessage::Steal => 1,
        PoolMessage::Loot(None) => 2,
        PoolMessage::Loot(Some(_)) => 3,
        PoolMessage::Ack(_) => 4,
        PoolMessage::Probe(_) => 5,
        PoolMessage::Status(_) => 6,
        PoolMessage::Done => 7,
        PoolMessage::Collect(_) => 8,
        PoolMessage::Contribution(..) => 9,
        PoolMessage::Total(..) => 10,
    }
}

fn command_code<T>(command: &Command<T>) -> u64 {
    match command {
        Command::Send { to, message } => 0x1000 | message_code(message) << 4 | *to as u64,
        Command::Put { slot, bytes } => 0x2000 | (*slot as u64) << 8 | (bytes.len() as u64 & 0xff),
        Command::DeleteLoot { owner } => 0x3000 | *owner as u64,
        Command::Sync => 0x4000,
        Command::ReadAll => 0x5000,
        Command::Failpoint(name) => {
            0x6000 | POINTS.iter().position(|p| p == name).unwrap_or(0xff) as u64
        }
        Command::Finish => 0x7000,
        Command::Settle(_) => 0x8000,
        Command::End(..) => 0x9000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_pool_runs_stay_exact() {
        let failing = campaign(1, 300).failing;
        let shown = ftkv::sim::first_failing(&failing);
        assert!(failing.is_empty(), "{} failing seeds, e.g.\n{shown}", failing.len());
    }

    #[test]
    fn seeded_localized_pool_runs_stay_exact_and_recover_locally() {
        let run = campaign_in(1, 300, Mode::Localized);
        let shown = ftkv::sim::first_failing(&run.failing);
        assert!(run.failing.is_empty(), "{} failing seeds, e.g.\n{shown}", run.failing.len());
        assert!(run.rejoins > 100, "workers settled failures in only {} runs' steps", run.rejoins);
        assert!(run.kills.keys().any(|k| *k == "buddy_after_adopting"), "{:?}", run.kills);
        assert!(run.fall_backs > 10, "the store fell back in only {} settles", run.fall_backs);
    }

    #[test]
    fn a_pool_seed_replays_exactly() {
        let a = campaign(40, 30).digest;
        assert_eq!(a, campaign(40, 30).digest);
        assert_ne!(a, campaign(41, 30).digest, "a different seed gives a different trace");
    }
}
