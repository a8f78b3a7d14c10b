//! A deterministic world for the production drivers: every thread of every rank is a *task*,
//! only one task runs at a time, a seeded scheduler picks which one at every step, and the
//! clock is virtual. One seed fixes the interleaving, the clock and the faults, so a failing
//! seed replays exactly (FoundationDB's discipline, on real threads passing a baton).
//!
//! A task takes a *step* at every call of the in-process fabric ([`ftkv::fabric::local`]) and
//! at every wait of [`ftkv::rt`]; there the scheduler may hand the baton to another task, and
//! a planned fault may strike: a kill (the rank's tasks unwind at their next step, as the
//! fabric's kills do) or a stall (the rank's tasks never run again, a stopped process). Each
//! step advances the virtual clock by [`TICK`]; when every task sleeps, the clock jumps to the
//! earliest wake-up. A run that passes its virtual time limit is a hang: its tasks are ended and
//! the run reports it.
//!
//! Everything a task does between two steps must not block on another task (std's blocking
//! calls would hold the baton forever): the store's threads, sleeps, locks, condition waits and
//! channels go through [`ftkv::rt`], which polls in virtual time here.

use std::cell::RefCell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::recovery::RunReport;
use ftkv::fabric::killed::Killed;
use ftkv::fabric::local::{panic_message, LocalCluster, LocalFabric};
use ftkv::rt;

/// Virtual time a step takes.
pub const TICK: Duration = Duration::from_micros(1);
/// Virtual time a task waits before it looks again at a lock, a channel or a thread's end.
const POLL: Duration = Duration::from_micros(20);
/// A running task keeps the baton at a step with probability 1 − 1/`STICKY_IN` (handing it
/// over costs two thread switches of the machine).
const STICKY_IN: u32 = 4;
/// Real time the end of a run may take once its tasks are told to end.
const TEARDOWN: Duration = Duration::from_secs(20);

/// A fault planned at a global step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `rank` dies at step `at`: its tasks unwind at their next step.
    Kill { rank: i32, at: u64 },
    /// `rank` stops at step `at` and never runs again (SIGSTOP); after `declared_after` of
    /// virtual time, if given, the fabric declares it failed (ULFM's detector timeout).
    Stall { rank: i32, at: u64, declared_after: Option<Duration> },
    /// `rank` dies at its first step that waits with `label` ("in a barrier") once rank
    /// `after` died: inside a collective it joined (a recovery's, say), which then ends
    /// differently for the others.
    KillWaiting { rank: i32, label: &'static str, after: i32 },
}

/// How a world runs.
#[derive(Debug, Clone)]
pub struct WorldConfig {
    pub seed: u64,
    /// Virtual time after which a run that has not ended is a hang.
    pub limit: Duration,
    /// Record one line per step ([`Outcome::trace`]).
    pub trace: bool,
    /// Ranks that get the baton a quarter as often as the others (slow processes).
    pub slow: Vec<i32>,
}

/// How a run ended.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Why the run was cut short (a hang), if it was.
    pub aborted: Option<String>,
    pub steps: u64,
    /// Virtual time at the end.
    pub elapsed: Duration,
    /// A hash of every step (task and label): the same seed gives the same digest.
    pub digest: u64,
    /// The faults that struck, in order, with the step and virtual time.
    pub struck: Vec<String>,
    pub trace: Vec<String>,
}

/// What the fabric does when a fault strikes (kill a rank, declare a stopped one failed).
pub trait Faults: Send + Sync {
    fn kill(&self, rank: i32);
    fn declare(&self, rank: i32);
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Wake {
    Ready,
    At(Duration),
    Never,
    Done,
}

struct Task {
    name: String,
    rank: i32,
    wake: Wake,
    thread: Option<std::thread::Thread>,
    /// Tasks waiting for this one's end.
    joiners: Vec<usize>,
}

struct Sched {
    rng: SmallRng,
    clock: Duration,
    base: Instant,
    tasks: Vec<Task>,
    running: Option<usize>,
    steps: u64,
    digest: u64,
    limit: Duration,
    slow: Vec<i32>,
    /// Planned faults not struck yet, latest first.
    planned: Vec<Fault>,
    /// Planned [`Fault::KillWaiting`]s not struck yet.
    waiting_kills: Vec<(i32, &'static str, i32)>,
    /// Stopped ranks to declare failed, with the virtual time when.
    declare_at: Vec<(Duration, i32)>,
    doomed: Vec<i32>,
    stalled: Vec<i32>,
    /// Set when the run ends: tasks then stop taking steps and unwind.
    ending: bool,
    aborted: Option<String>,
    struck: Vec<String>,
    trace: Option<Vec<String>>,
}

struct Shared {
    sched: Mutex<Sched>,
    ended: Condvar,
    faults: Mutex<Option<Arc<dyn Faults>>>,
}

/// A handle on one task of a world.
#[derive(Clone)]
pub struct TaskRef {
    shared: Arc<Shared>,
    id: usize,
}

thread_local! {
    static CURRENT: RefCell<Option<TaskRef>> = const { RefCell::new(None) };
}

/// How many worlds exist: outside them no thread looks at its task.
static WORLDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn current() -> Option<TaskRef> {
    if WORLDS.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        return None;
    }
    CURRENT.with(|c| c.borrow().clone())
}

/// A simulated world; see the module documentation.
pub struct World {
    shared: Arc<Shared>,
}

impl World {
    pub fn new(config: WorldConfig) -> World {
        let mut planned_rng = SmallRng::seed_from_u64(config.seed);
        let sched = Sched {
            rng: SmallRng::seed_from_u64(planned_rng.gen()),
            clock: Duration::ZERO,
            base: Instant::now(),
            tasks: Vec::new(),
            running: None,
            steps: 0,
            digest: 0,
            limit: config.limit,
            slow: config.slow,
            planned: Vec::new(),
            waiting_kills: Vec::new(),
            declare_at: Vec::new(),
            doomed: Vec::new(),
            stalled: Vec::new(),
            ending: false,
            aborted: None,
            struck: Vec::new(),
            trace: config.trace.then(Vec::new),
        };
        let shared =
            Shared { sched: Mutex::new(sched), ended: Condvar::new(), faults: Mutex::new(None) };
        WORLDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        World { shared: Arc::new(shared) }
    }

    /// Plans `fault`.
    pub fn plan(&self, fault: Fault) {
        self.shared.lock().plan(fault);
    }

    /// Who carries out the faults.
    pub fn set_faults(&self, faults: Arc<dyn Faults>) {
        *self.shared.faults.lock().unwrap_or_else(|p| p.into_inner()) = Some(faults);
    }

    /// Runs `body(rank)` for every rank in `0..ranks` as root tasks and everything they spawn
    /// through [`ftkv::rt::spawn`], until every task ended or the virtual time limit passed.
    /// Returns each rank's result (`Err` with the panic payload of a rank that unwound) and
    /// how the run went. A rank still running when the run was cut short is an `Err` too.
    pub fn run<T: Send + 'static>(
        &self,
        ranks: usize,
        body: Arc<dyn Fn(i32) -> T + Send + Sync>,
    ) -> (Vec<std::thread::Result<T>>, Outcome) {
        let mut roots = Vec::new();
        for rank in 0..ranks as i32 {
            let task = self.shared.add_task(format!("rank {rank}"), rank);
            let body = body.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            let spawned =
                std::thread::Builder::new().name(format!("sim rank {rank}")).spawn(move || {
                    let outcome = task.run_as_task(|| body(rank));
                    let _ = tx.send(outcome);
                });
            roots.push((spawned, rx));
        }
        self.shared.start();
        self.shared.await_end();
        let deadline = Instant::now() + TEARDOWN;
        let results = roots
            .into_iter()
            .map(|(spawned, rx)| {
                let left = deadline.saturating_duration_since(Instant::now());
                match (spawned, rx.recv_timeout(left)) {
                    (Ok(_), Ok(outcome)) => outcome,
                    (Err(e), _) => Err(Box::new(format!("starting the rank: {e}")) as _),
                    (Ok(_), Err(_)) => Err(Box::new("did not end".to_string()) as _),
                }
            })
            .collect();
        (results, self.shared.outcome())
    }
}

impl Drop for World {
    fn drop(&mut self) {
        WORLDS.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

fn fault_step(fault: &Fault) -> u64 {
    match *fault {
        Fault::Kill { at, .. } | Fault::Stall { at, .. } => at,
        Fault::KillWaiting { .. } => unreachable!("planned apart: it strikes at a wait"),
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Sched> {
        self.sched.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add_task(self: &Arc<Shared>, name: String, rank: i32) -> TaskRef {
        let mut sched = self.lock();
        sched.tasks.push(Task { name, rank, wake: Wake::Ready, thread: None, joiners: Vec::new() });
        TaskRef { shared: self.clone(), id: sched.tasks.len() - 1 }
    }

    /// Hands the baton to the first task.
    fn start(&self) {
        let mut sched = self.lock();
        let next = sched.pick();
        self.hand_over(sched, next);
    }

    /// Waits (really) until the run ended.
    fn await_end(&self) {
        let mut sched = self.lock();
        while !sched.ending {
            sched = self.ended.wait(sched).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn outcome(&self) -> Outcome {
        let mut sched = self.lock();
        Outcome {
            aborted: sched.aborted.clone(),
            steps: sched.steps,
            elapsed: sched.clock,
            digest: sched.digest,
            struck: sched.struck.clone(),
            trace: sched.trace.take().unwrap_or_default(),
        }
    }

    /// Gives the baton to `next`, or ends the run when no task can run any more.
    fn hand_over(&self, mut sched: MutexGuard<'_, Sched>, next: Option<usize>) {
        match next {
            Some(next) => {
                sched.running = Some(next);
                let thread = sched.tasks[next].thread.clone();
                drop(sched);
                if let Some(thread) = thread {
                    thread.unpark();
                }
            }
            None => self.end(sched, None),
        }
    }

    /// Ends the run: every task left unwinds at its next step (the stopped ones too).
    fn end(&self, mut sched: MutexGuard<'_, Sched>, why: Option<String>) {
        if sched.aborted.is_none() {
            sched.aborted = why;
        }
        sched.ending = true;
        sched.running = None;
        let threads: Vec<_> = sched.tasks.iter().filter_map(|t| t.thread.clone()).collect();
        drop(sched);
        self.ended.notify_all();
        for thread in threads {
            thread.unpark();
        }
    }

    fn faults(&self) -> Option<Arc<dyn Faults>> {
        self.faults.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Sched {
    /// Adds `fault` to the planned ones, kept latest first.
    fn plan(&mut self, fault: Fault) {
        if let Fault::KillWaiting { rank, label, after } = fault {
            self.waiting_kills.push((rank, label, after));
            return;
        }
        self.planned.push(fault);
        self.planned.sort_by_key(|f| std::cmp::Reverse(fault_step(f)));
    }

    /// Whether a planned [`Fault::KillWaiting`] strikes `rank` waiting with `label` now (it is
    /// then struck: the rank is doomed).
    fn strike_waiting(&mut self, rank: i32, label: &'static str) -> bool {
        let doomed = &self.doomed;
        let due = |&(r, l, after): &(i32, &'static str, i32)| {
            r == rank && l == label && doomed.contains(&after)
        };
        let Some(index) = self.waiting_kills.iter().position(due) else { return false };
        self.waiting_kills.remove(index);
        self.doomed.push(rank);
        let line = format!("step {} at {:?}: rank {rank} killed {label}", self.steps, self.clock);
        self.struck.push(line);
        true
    }

    /// The next task to run: a random one of those ready (a slow rank's task only one time in
    /// four), the clock moved to the earliest wake-up when every task sleeps. `None` when no
    /// task can ever run again.
    fn pick(&mut self) -> Option<usize> {
        loop {
            let clock = self.clock;
            let ready: Vec<usize> = (0..self.tasks.len())
                .filter(|&i| match self.tasks[i].wake {
                    Wake::Ready => true,
                    Wake::At(t) => t <= clock,
                    Wake::Never | Wake::Done => false,
                })
                .collect();
            if !ready.is_empty() {
                let next = self.choose(&ready);
                self.tasks[next].wake = Wake::Ready;
                return Some(next);
            }
            let earliest = self
                .tasks
                .iter()
                .filter_map(|t| match t.wake {
                    Wake::At(t) => Some(t),
                    _ => None,
                })
                .min()?;
            self.clock = earliest.max(clock);
        }
    }

    fn choose(&mut self, ready: &[usize]) -> usize {
        let running = self.running.filter(|r| ready.contains(r));
        if let Some(running) = running {
            if self.rng.gen_range(0..STICKY_IN) != 0 {
                return running;
            }
        }
        loop {
            let next = ready[self.rng.gen_range(0..ready.len())];
            let slow = self.slow.contains(&self.tasks[next].rank);
            if !slow || ready.len() == 1 || self.rng.gen_range(0..4) == 0 {
                return next;
            }
        }
    }

    /// Strikes the faults planned up to this step; returns the ranks to kill.
    fn strike_due(&mut self) -> Vec<i32> {
        let mut kills = Vec::new();
        while self.planned.last().is_some_and(|f| fault_step(f) <= self.steps) {
            let fault = self.planned.pop().expect("checked");
            let (what, rank) = match fault {
                Fault::Kill { rank, .. } => {
                    self.doomed.push(rank);
                    kills.push(rank);
                    ("killed", rank)
                }
                Fault::Stall { rank, declared_after, .. } => {
                    self.stalled.push(rank);
                    if let Some(after) = declared_after {
                        self.declare_at.push((self.clock + after, rank));
                    }
                    ("stopped", rank)
                }
                Fault::KillWaiting { .. } => unreachable!("planned apart"),
            };
            let line = format!("step {} at {:?}: rank {rank} {what}", self.steps, self.clock);
            self.struck.push(line);
        }
        kills
    }

    /// Whether `task` belongs to a stopped rank.
    fn stalled_task(&self, task: usize) -> bool {
        self.stalled.contains(&self.tasks[task].rank)
    }

    /// The stopped ranks whose detector timeout passed, for the fabric to declare failed.
    fn take_declared(&mut self) -> Vec<i32> {
        let clock = self.clock;
        let (due, later): (Vec<_>, Vec<_>) =
            self.declare_at.iter().partition(|&&(t, _)| t <= clock);
        self.declare_at = later;
        for &(_, rank) in &due {
            let line = format!("at {clock:?}: stopped rank {rank} declared failed");
            self.struck.push(line);
        }
        due.into_iter().map(|(_, r)| r).collect()
    }
}

/// Mixes `v` into the digest `h`.
fn mix(h: u64, v: u64) -> u64 {
    crate::recovery::mix(h, v)
}

fn label_code(what: &str) -> u64 {
    what.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

impl TaskRef {
    /// Runs `body` as this task: waits for the baton first, hands it on at the end.
    fn run_as_task<T>(&self, body: impl FnOnce() -> T) -> std::thread::Result<T> {
        CURRENT.with(|c| *c.borrow_mut() = Some(self.clone()));
        rt::enter_task(Arc::new(self.clone()));
        self.register();
        let outcome = match self.wait_turn() {
            Ok(()) => panic::catch_unwind(AssertUnwindSafe(body)),
            Err(payload) => Err(payload),
        };
        self.finish();
        rt::leave_task();
        CURRENT.with(|c| *c.borrow_mut() = None);
        outcome
    }

    fn register(&self) {
        self.shared.lock().tasks[self.id].thread = Some(std::thread::current());
    }

    fn rank(&self) -> i32 {
        self.shared.lock().tasks[self.id].rank
    }

    /// Parks until this task holds the baton; `Err` (a kill payload) when the run ends first
    /// or this task's rank was killed meanwhile.
    fn wait_turn(&self) -> Result<(), Box<dyn std::any::Any + Send>> {
        loop {
            let sched = self.shared.lock();
            let rank = sched.tasks[self.id].rank;
            if sched.ending {
                return Err(Box::new(Killed(rank)));
            }
            if sched.running == Some(self.id) {
                let doomed = sched.doomed.contains(&rank);
                drop(sched);
                if doomed && !std::thread::panicking() {
                    return Err(Box::new(Killed(rank)));
                }
                return Ok(());
            }
            drop(sched);
            std::thread::park();
        }
    }

    /// Marks this task ended and hands the baton on.
    fn finish(&self) {
        let mut sched = self.shared.lock();
        sched.tasks[self.id].wake = Wake::Done;
        for joiner in std::mem::take(&mut sched.tasks[self.id].joiners) {
            if sched.tasks[joiner].wake == Wake::Never && !sched.stalled_task(joiner) {
                sched.tasks[joiner].wake = Wake::Ready;
            }
        }
        if sched.ending || sched.running != Some(self.id) {
            return;
        }
        let next = sched.pick();
        self.shared.hand_over(sched, next);
    }

    /// One step of this task, after which it wants to run again at `wake`: faults strike, the
    /// clock advances, and the scheduler picks who runs next (this task waits for its turn).
    /// Unwinds with a kill payload when this task's rank was killed or the run ends (unless it
    /// already unwinds: then it runs on, so that its clean-up is scheduled too).
    fn step(&self, what: &'static str, wake: Wake) {
        let unwinding = std::thread::panicking();
        let mut sched = self.shared.lock();
        if sched.ending {
            let rank = sched.tasks[self.id].rank;
            drop(sched);
            if !unwinding {
                panic::resume_unwind(Box::new(Killed(rank)));
            }
            return;
        }
        sched.steps += 1;
        sched.clock += TICK;
        let code = mix(self.id as u64, label_code(what));
        sched.digest = mix(sched.digest, code);
        if sched.trace.is_some() {
            let line =
                format!("{} {:?} {}: {what}", sched.steps, sched.clock, sched.tasks[self.id].name);
            sched.trace.as_mut().expect("checked").push(line);
        }
        let mut kills = sched.strike_due();
        let rank = sched.tasks[self.id].rank;
        if !unwinding && sched.strike_waiting(rank, what) {
            kills.push(rank);
        }
        let declared = sched.take_declared();
        if sched.clock > sched.limit {
            let why = format!("no end within {:?} of virtual time (a hang)", sched.limit);
            self.shared.end(sched, Some(why));
            self.carry_out(&kills, &declared);
            if !unwinding {
                panic::resume_unwind(Box::new(Killed(self.rank())));
            }
            return;
        }
        if sched.doomed.contains(&rank) && !unwinding {
            drop(sched);
            self.carry_out(&kills, &declared);
            panic::resume_unwind(Box::new(Killed(rank)));
        }
        sched.tasks[self.id].wake = if sched.stalled.contains(&rank) { Wake::Never } else { wake };
        let next = sched.pick();
        if next == Some(self.id) {
            drop(sched);
            self.carry_out(&kills, &declared);
            return;
        }
        drop(sched);
        self.carry_out(&kills, &declared);
        let sched = self.shared.lock();
        self.shared.hand_over(sched, next);
        if let Err(payload) = self.wait_turn() {
            if !unwinding {
                panic::resume_unwind(payload);
            }
        }
    }

    /// Tells the fabric of the kills and declarations that struck (outside the scheduler's
    /// lock: the fabric takes its own).
    fn carry_out(&self, kills: &[i32], declared: &[i32]) {
        if kills.is_empty() && declared.is_empty() {
            return;
        }
        let Some(faults) = self.shared.faults() else { return };
        for &rank in kills {
            faults.kill(rank);
        }
        for &rank in declared {
            faults.declare(rank);
        }
    }

    /// Marks this task ended before it ran (its thread could not be started).
    fn abandon_task(&self) {
        self.shared.lock().tasks[self.id].wake = Wake::Done;
    }

    /// Waits until this task's thread ended (the calling task runs again once it did).
    fn await_task_end(&self) {
        let Some(me) = current() else { return };
        loop {
            let mut sched = self.shared.lock();
            if sched.tasks[self.id].wake == Wake::Done || sched.ending {
                return;
            }
            sched.tasks[self.id].joiners.push(me.id);
            drop(sched);
            me.step("join", Wake::Never);
        }
    }
}

/// Plans the fault `at(step now)` returns, from inside a task (outside a world, nothing).
pub fn plan_here(at: impl FnOnce(u64) -> Fault) {
    let Some(task) = current() else { return };
    let mut sched = task.shared.lock();
    let fault = at(sched.steps);
    sched.plan(fault);
}

/// Runs `run(seed)` for `runs` seeds from `first_seed` on as many threads as the machine has
/// cores (each run's world is its own) and returns the failing runs' reports and a digest of
/// all, folded in seed order, so that it does not depend on the threads.
///
/// Each lane is pinned to a core of its own, and its worlds' task threads (which inherit the
/// pinning) with it: a world hands its baton from thread to thread at every step, and a
/// hand-off between threads of one core costs far less than waking a thread on another
/// (`ftkv sim --model pool-world` and `fbc-world` beside each other, 3,000 runs each: 21.3 s
/// unpinned, 14.5 s with each process on one core).
pub fn campaign(
    first_seed: u64,
    runs: u64,
    run: impl Fn(u64) -> RunReport + Sync,
) -> (Vec<RunReport>, u64) {
    let lanes = std::thread::available_parallelism().map_or(1, |n| n.get() as u64).min(runs);
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let next = std::sync::atomic::AtomicU64::new(first_seed);
    let end = first_seed + runs;
    let mut reports: Vec<RunReport> = std::thread::scope(|s| {
        let lanes: Vec<_> = (0..lanes as usize)
            .map(|lane| {
                let core = (!cores.is_empty()).then(|| cores[lane % cores.len()]);
                let (next, run) = (&next, &run);
                s.spawn(move || {
                    if let Some(core) = core {
                        core_affinity::set_for_current(core);
                    }
                    let mut mine = Vec::new();
                    loop {
                        let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if seed >= end {
                            return mine;
                        }
                        mine.push(run(seed));
                    }
                })
            })
            .collect();
        lanes.into_iter().flat_map(|lane| lane.join().expect("a campaign lane")).collect()
    });
    reports.sort_by_key(|r| r.seed);
    let digest = reports.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, r| mix(h, r.digest));
    reports.retain(|r| !r.violations.is_empty());
    (reports, digest)
}

/// The world's side of the seam in [`rt`]: the store's calls on a task's thread.
impl rt::WorldTask for TaskRef {
    fn running(&self) -> bool {
        !self.shared.lock().ending
    }

    fn now(&self) -> Instant {
        let sched = self.shared.lock();
        sched.base + sched.clock
    }

    fn coarse_ticks(&self) -> u64 {
        let clock = self.shared.lock().clock + Duration::from_secs(1);
        coarsetime::Duration::from(clock).as_ticks()
    }

    fn step(&self, what: &'static str) {
        TaskRef::step(self, what, Wake::Ready);
    }

    fn sleep(&self, what: &'static str, span: Duration) -> bool {
        let wake_at = {
            let sched = self.shared.lock();
            if sched.ending {
                return false;
            }
            sched.clock + span
        };
        TaskRef::step(self, what, Wake::At(wake_at));
        true
    }

    fn wait_a_little(&self, what: &'static str) {
        rt::WorldTask::sleep(self, what, POLL);
    }

    fn spawn_child(&self, name: &str) -> Arc<dyn rt::WorldTask> {
        let rank = self.rank();
        Arc::new(self.shared.add_task(format!("rank {rank} {name}"), rank))
    }

    fn run(&self, body: Box<dyn FnOnce() + Send + '_>) -> std::thread::Result<()> {
        self.run_as_task(body)
    }

    fn await_end(&self) {
        self.await_task_end();
    }

    fn abandon(&self) {
        self.abandon_task();
    }

    fn seeded_delay(&self, longest: Duration) -> Duration {
        let micros = self.shared.lock().rng.gen_range(0..=longest.as_micros() as u64);
        Duration::from_micros(micros)
    }

    fn coin(&self, p: f64) -> bool {
        self.shared.lock().rng.gen_bool(p)
    }
}

/// Runs `body` on every rank of `cluster` as tasks of the deterministic `world`, which carries
/// out its planned faults on the cluster. Returns each rank's result as
/// [`LocalCluster::run`] does (`None` for a killed or stopped rank), a panic's message as
/// `Err`, and how the run went.
pub fn run_cluster<T: Send + 'static>(
    cluster: &LocalCluster,
    world: &World,
    body: impl Fn(LocalFabric) -> T + Send + Sync + 'static,
) -> (Vec<Result<Option<T>, String>>, Outcome) {
    world.set_faults(Arc::new(ClusterFaults(cluster.clone())));
    let members = cluster.clone();
    let run = move |rank: i32| {
        let fabric = members.world_member(rank);
        members.run_rank(rank, || body(fabric))
    };
    let (results, outcome) = world.run(cluster.ranks(), Arc::new(run));
    let results = results
        .into_iter()
        .map(|result| match result.and_then(|inner| inner) {
            Ok(value) => Ok(Some(value)),
            Err(payload) if payload.is::<Killed>() => Ok(None),
            Err(payload) => Err(panic_message(payload.as_ref())),
        })
        .collect();
    (results, outcome)
}

/// A world's faults carried out on an in-process cluster.
struct ClusterFaults(LocalCluster);

impl Faults for ClusterFaults {
    fn kill(&self, rank: i32) {
        self.0.kill(rank);
    }

    fn declare(&self, rank: i32) {
        self.0.declare(rank);
    }
}
