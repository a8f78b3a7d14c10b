//! Failure knowledge for the put path, kept fresh by a detector thread per rank.
//!
//! Failures are noticed only while MPI makes progress, so the thread polls `MPI_Iprobe` on its
//! own communicator every poll interval, reads ULFM's failed set and publishes it in an atomic
//! bitmap of worker ids. It also notices a revoked communicator (another rank started
//! recovery). The put path reads the bitmap: a few relaxed atomic loads, no system call.
//!
//! The same thread is the watchdog: the put path marks the start and end of every data-path MPI
//! call in a counter (odd while inside). A call that stays inside longer than the watchdog
//! bound, which is what one-sided calls do against some dead targets, ends the process with
//! SIGKILL after a message: a fail-stop failure that the survivors recover from.
//!
//! In [`Detection::Ping`](crate::Detection::Ping) mode it also answers the two-sided pings that
//! writers send before every put, polling without sleeping (the reference paper's helper).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::fabric::{Fabric, FabricResult};

/// What the detector publishes and the watchdog watches.
#[derive(Debug)]
pub(crate) struct Health {
    workers: usize,
    failed: Vec<AtomicU64>,
    /// Bumped whenever a worker is newly marked failed: the put path compares it with the
    /// generation its routes were computed for (one relaxed load per call).
    generation: AtomicU64,
    /// Whether a newly failed worker raises the alarm (global recovery) or only bumps the
    /// generation (localized recovery decides in the store's own call path).
    alarm_on_failure: bool,
    alarm: AtomicBool,
    /// Entries and exits of data-path calls, odd while one is inside: the owner's calls
    /// ([`Lane::Owner`]), the repairer thread's ([`Lane::Repairer`]) and the replicator
    /// thread's ([`Lane::Replicator`]), watched apart; each written by its lane's thread only.
    in_call: [AtomicU64; Lane::ALL.len()],
    /// Bytes the current call of each lane moves: its bound grows with them
    /// ([`SLOWEST_HEALTHY_RATE`]).
    call_bytes: [AtomicU64; Lane::ALL.len()],
    /// When the clock thread last ticked, in ticks of the coarse clock ([`coarse_now`]; 0: no
    /// clock runs).
    tick_at: AtomicU64,
    /// When the detector thread last began a round, in nanoseconds since `born` (0: none yet),
    /// and the part of the round it is in ([`DetectorStep`]).
    detector_at: AtomicU64,
    detector_step: AtomicU64,
    /// When a worker was first marked failed, in nanoseconds since `born` (0: never).
    first_failure_at: AtomicU64,
    born: Instant,
}

impl Health {
    pub fn new(workers: usize, alarm_on_failure: bool) -> Health {
        Health {
            workers,
            failed: (0..workers.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            generation: AtomicU64::new(0),
            alarm_on_failure,
            alarm: AtomicBool::new(false),
            in_call: Lane::ALL.map(|_| AtomicU64::new(0)),
            call_bytes: Lane::ALL.map(|_| AtomicU64::new(0)),
            tick_at: AtomicU64::new(0),
            detector_at: AtomicU64::new(0),
            detector_step: AtomicU64::new(0),
            first_failure_at: AtomicU64::new(0),
            born: Instant::now(),
        }
    }

    /// How long ago the clock thread last ticked (zero while none runs). The clock does nothing
    /// but sleep briefly and tick, so a long gap means this process was stopped (or its host
    /// froze) that long, never that an MPI call was slow. Read on the coarse clock
    /// ([`coarse_now`]), since every put asks, and less its resolution: a gap at least this
    /// long, so that a short suspicion bound never ends a process that was not stopped.
    #[inline]
    pub fn since_last_tick(&self) -> Duration {
        let at = self.tick_at.load(Ordering::Acquire);
        if at == 0 {
            return Duration::ZERO;
        }
        let since = coarse_now().duration_since(coarsetime::Instant::from_ticks(at));
        Duration::from(since).saturating_sub(COARSE_RESOLUTION)
    }

    fn stamp_tick(&self) {
        self.tick_at.store(coarse_now().as_ticks().max(1), Ordering::Release);
    }

    fn now(&self) -> u64 {
        self.born.elapsed().as_nanos().max(1) as u64
    }

    fn enter_detector_step(&self, step: DetectorStep) {
        if step == DetectorStep::Progress {
            self.detector_at.store(self.now(), Ordering::Release);
        }
        self.detector_step.store(step as u64, Ordering::Release);
    }

    /// How long the detector's current round has lasted, and the part it is in (`None` before
    /// its first round).
    fn detector_round(&self) -> Option<(Duration, DetectorStep)> {
        let at = self.detector_at.load(Ordering::Acquire);
        if at == 0 {
            return None;
        }
        let lasted = Duration::from_nanos(self.now().saturating_sub(at));
        let step = DetectorStep::ALL[self.detector_step.load(Ordering::Acquire) as usize];
        Some((lasted, step))
    }

    fn stop_ticks(&self) {
        self.tick_at.store(0, Ordering::Release);
    }

    /// How many times a worker was newly marked failed.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// How many workers the store was created with.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Every worker of `0..workers` marked failed.
    pub fn failed_workers(&self, workers: usize) -> Vec<i32> {
        (0..workers as i32).filter(|&w| self.is_failed(w)).collect()
    }

    /// Whether worker `id` is known to have failed.
    #[inline]
    pub fn is_failed(&self, id: i32) -> bool {
        let word = self.failed[id as usize / 64].load(Ordering::Acquire);
        word & (1 << (id % 64)) != 0
    }

    pub fn mark_failed(&self, id: i32) {
        let bit = 1 << (id % 64);
        let before = self.failed[id as usize / 64].fetch_or(bit, Ordering::AcqRel);
        if before & bit == 0 {
            let _ = self.first_failure_at.compare_exchange(
                0,
                self.now(),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        if self.alarm_on_failure {
            self.alarm.store(true, Ordering::Release);
        }
    }

    /// When a worker was first marked failed (`None`: none was).
    pub fn first_failure_at(&self) -> Option<Instant> {
        let at = self.first_failure_at.load(Ordering::Acquire);
        (at != 0).then(|| self.born + Duration::from_nanos(at))
    }

    /// Whether a failure or a revocation happened since the last recovery.
    #[inline]
    pub fn alarmed(&self) -> bool {
        self.alarm.load(Ordering::Acquire)
    }

    pub fn raise_alarm(&self) {
        self.alarm.store(true, Ordering::Release);
    }

    pub fn clear_alarm(&self) {
        self.alarm.store(false, Ordering::Release);
    }

    /// Marks the start of a bounded data-path call of the store's owner thread that moves
    /// about `bytes`.
    #[inline]
    pub fn enter_call(&self, bytes: usize) {
        self.enter_call_on(Lane::Owner, bytes);
    }

    /// Marks its end.
    #[inline]
    pub fn leave_call(&self) {
        self.leave_call_on(Lane::Owner);
    }

    /// Marks the start of a bounded data-path call made on `lane` that moves about `bytes`.
    #[inline]
    pub fn enter_call_on(&self, lane: Lane, bytes: usize) {
        self.call_bytes[lane as usize].store(bytes as u64, Ordering::Relaxed);
        count_crossing(&self.in_call[lane as usize]);
    }

    /// The watchdog's bound for the current call of `lane`: `watchdog`, plus the time its
    /// bytes take at [`SLOWEST_HEALTHY_RATE`].
    fn call_bound(&self, lane: Lane, watchdog: Duration) -> Duration {
        let bytes = self.call_bytes[lane as usize].load(Ordering::Relaxed);
        watchdog + Duration::from_secs_f64(bytes as f64 / SLOWEST_HEALTHY_RATE)
    }

    /// Marks its end.
    #[inline]
    pub fn leave_call_on(&self, lane: Lane) {
        count_crossing(&self.in_call[lane as usize]);
    }
}

/// The time on the coarse monotonic clock (Linux's `CLOCK_MONOTONIC_COARSE`: a few ns to read
/// against about 50 ns for the precise clock measured here, and as precise as the kernel's
/// tick, at most [`COARSE_RESOLUTION`]): for the clock thread's gaps.
#[inline]
fn coarse_now() -> coarsetime::Instant {
    coarsetime::Instant::now_without_cache_update()
}

/// The coarsest the coarse clock ticks: once per kernel tick, 10 ms at the lowest tick rate
/// Linux offers (100 Hz).
const COARSE_RESOLUTION: Duration = Duration::from_millis(10);

/// Counts an entry into or an exit from a data-path call on a lane's counter. Each lane has
/// one thread that makes its calls, the counter's only writer, so a plain store publishes the
/// count (no locked instruction on the put path); the watchdog only reads it.
#[inline]
fn count_crossing(counter: &AtomicU64) {
    counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Release);
}

/// The slowest rate, in bytes per second, at which a healthy data-path call moves a large value
/// (a loaded node writing into fresh shared memory, or over a slow link): a call that moves `n`
/// bytes is ended as stuck only after the watchdog plus `n` at this rate.
pub(crate) const SLOWEST_HEALTHY_RATE: f64 = (32u64 << 20) as f64;

/// The bytes a read of one copy may move, for its watchdog bound: the largest value, capped
/// (a read's length is known only once its header is read).
pub(crate) fn read_allowance(max_value: usize) -> usize {
    max_value.min(1 << 30)
}

/// The threads whose one-sided calls the watchdog bounds, each on its own counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// The thread that owns the store and makes its calls.
    Owner = 0,
    /// The repairer thread of localized recovery ([`crate::store`]'s `follow` module).
    Repairer = 1,
    /// The replicator thread that writes the other copies of asynchronous puts.
    Replicator = 2,
}

impl Lane {
    const ALL: [Lane; 3] = [Lane::Owner, Lane::Repairer, Lane::Replicator];

    /// The thread that makes this lane's calls, for messages.
    fn thread_name(self) -> &'static str {
        match self {
            Lane::Owner => "store's owning",
            Lane::Repairer => "repairer",
            Lane::Replicator => "replicator",
        }
    }
}

/// The running detector and clock threads; stopped and joined on drop.
pub(crate) struct Detector {
    stop: Arc<AtomicBool>,
    stop_clock: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    clock: Option<JoinHandle<()>>,
    /// The fabric's test for a killed rank's unwinding ([`Fabric::is_kill`]).
    is_kill: fn(&(dyn std::any::Any + Send)) -> bool,
}

/// What the detector thread needs.
pub(crate) struct Watch<F> {
    pub comm: Arc<F>,
    /// The store's own communicator: a member that sends the store to global recovery revokes
    /// it, and the others learn of it here.
    pub store_comm: Arc<F>,
    pub live: Vec<i32>,
    pub health: Arc<Health>,
    pub poll_interval: Duration,
    pub watchdog: Duration,
    /// [`crate::Config::suspicion`].
    pub suspicion: Duration,
    pub answer_pings: bool,
    /// Fences newly failed workers out of this rank's slots (see [`crate::fence`]).
    pub fence: FenceFailed,
}

/// What the detector calls with every failed worker once the failed set grew.
pub(crate) type FenceFailed = Box<dyn Fn(&[i32]) -> FabricResult<usize> + Send>;

impl Detector {
    pub fn start<F: Fabric>(watch: Watch<F>) -> Detector {
        let stop = Arc::new(AtomicBool::new(false));
        let (comm, health) = (watch.comm.clone(), watch.health.clone());
        let bounds = [watch.suspicion, watch.watchdog];
        let stop_clock = Arc::new(AtomicBool::new(false));
        let flag = stop_clock.clone();
        health.stamp_tick();
        let clock = std::thread::Builder::new()
            .name("ftkv-clock".into())
            .spawn(move || tick(&*comm, &health, bounds, &flag))
            .expect("spawning the clock thread");
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("ftkv-detector".into())
            .spawn(move || run(watch, &flag))
            .expect("spawning the detector thread");
        Detector { stop, stop_clock, handle: Some(handle), clock: Some(clock), is_kill: F::is_kill }
    }
}

impl Drop for Detector {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(handle) = self.handle.take() {
            match handle.join() {
                Err(payload) if !(self.is_kill)(payload.as_ref()) => {
                    crate::events::warn("the detector thread panicked")
                }
                _ => {}
            }
        }
        // The clock goes on watching the detector until it has ended.
        self.stop_clock.store(true, Ordering::Release);
        if let Some(clock) = self.clock.take() {
            clock.thread().unpark();
            if clock.join().is_err() {
                crate::events::warn("the clock thread panicked");
            }
        }
    }
}

/// The parts of a detector round, named when one of them does not return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
enum DetectorStep {
    Progress,
    FailedRanks,
    Fence,
    Revoked,
    Pause,
}

impl DetectorStep {
    /// Whether the detector can be stuck here on another process: not while it pauses, nor
    /// while it fences, which reads and writes only this process's own slots (slow with a
    /// large value, never waiting on a peer).
    fn can_be_stuck(self) -> bool {
        !matches!(self, DetectorStep::Pause | DetectorStep::Fence)
    }

    const ALL: [DetectorStep; 5] = [
        DetectorStep::Progress,
        DetectorStep::FailedRanks,
        DetectorStep::Fence,
        DetectorStep::Revoked,
        DetectorStep::Pause,
    ];
}

/// The clock thread: sleeps a tick at a time and stamps [`Health::since_last_tick`]; ends the
/// process when one of its sleeps lasted more than half the suspicion bound. It takes no lock
/// and makes no MPI call, so only a stopped process (or a frozen host) delays it that long.
///
/// It also watches the detector thread: a detector round that has not ended after `stuck`
/// (the watchdog bound) in a part that waits on MPI ends the process, naming the part of the
/// round it is stuck in. Without
/// its detector a process would learn of no failure and wait forever; ended, it is a failure
/// the others recover from.
fn tick<F: Fabric>(
    comm: &F,
    health: &Health,
    [suspicion, stuck]: [Duration; 2],
    stop: &AtomicBool,
) {
    let period = (suspicion / 20).min(Duration::from_millis(100));
    while !stop.load(Ordering::Acquire) {
        std::thread::park_timeout(period);
        end_if_stopped(comm, health.since_last_tick(), suspicion);
        health.stamp_tick();
        match health.detector_round() {
            Some((lasted, step)) if lasted > stuck && step.can_be_stuck() => {
                comm.fail_stop(&format!(
                    "the failure detector's round has not ended for {:.1} s (stuck in {step:?}): \
                     without it this process would wait for failures it never learns of",
                    lasted.as_secs_f64()
                ));
            }
            _ => {}
        }
    }
    health.stop_ticks();
}

fn run<F: Fabric>(watch: Watch<F>, stop: &AtomicBool) {
    let mut stuck = Lane::ALL.map(StuckCall::new);
    let mut fenced_generation = 0;
    while !stop.load(Ordering::Acquire) {
        watch.health.enter_detector_step(DetectorStep::Progress);
        watch.comm.stall_point("detector_round");
        end_if_suspended(&watch);
        poll_once(&watch);
        watch.health.enter_detector_step(DetectorStep::Fence);
        fenced_generation = fence_new_failures(&watch, fenced_generation);
        stuck.iter_mut().for_each(|lane| lane.check(&watch));
        watch.health.enter_detector_step(DetectorStep::Pause);
        if watch.answer_pings {
            std::thread::yield_now();
        } else {
            std::thread::sleep(watch.poll_interval);
        }
    }
}

/// Fences newly failed `workers` out of this rank's slots, then publishes them: whoever sees
/// a failure here (the store's calls, the alarm) sees it fenced on this rank.
fn publish_failures<F: Fabric>(watch: &Watch<F>, workers: impl Iterator<Item = i32>) {
    let newly: Vec<i32> = workers.filter(|&w| !watch.health.is_failed(w)).collect();
    if newly.is_empty() {
        return;
    }
    let mut failed = watch.health.failed_workers(watch.health.workers());
    failed.extend(&newly);
    watch.health.enter_detector_step(DetectorStep::Fence);
    if let Err(e) = (watch.fence)(&failed) {
        crate::events::warn(format!("detector: fencing failed workers: {e}"));
    }
    tracing::debug!(failed = ?newly, "failure published");
    newly.into_iter().for_each(|w| watch.health.mark_failed(w));
}

/// Fences the failed workers when the failed set grew since `fenced` (a generation); returns
/// the generation now fenced. A fencing error is reported and tried again next round.
fn fence_new_failures<F: Fabric>(watch: &Watch<F>, fenced: u64) -> u64 {
    let generation = watch.health.generation();
    if generation == fenced {
        return fenced;
    }
    match (watch.fence)(&watch.health.failed_workers(watch.health.workers())) {
        Ok(_) => generation,
        Err(e) => {
            crate::events::warn(format!("detector: fencing failed workers: {e}"));
            fenced
        }
    }
}

/// Ends this process when the clock did not tick for more than half the suspicion bound: the
/// process was stopped (SIGSTOP), or its host froze, long enough that the others may have
/// declared it failed and gone on without it. Checked before the watchdog after such a gap, so
/// a call the watchdog sees stuck is not blamed on its target.
fn end_if_suspended<F: Fabric>(watch: &Watch<F>) {
    end_if_stopped(watch.comm.as_ref(), watch.health.since_last_tick(), watch.suspicion);
}

/// Ends this process (fail-stop through `comm`) when it did not run for `gap`, more than half
/// the `suspicion` bound. Half, not the whole bound: Open MPI's heartbeat detector declares a
/// rank once it heard nothing for its timeout (the bound), counted from the last heartbeat
/// that arrived, up to one heartbeat period before the rank stopped; measured, a rank SIGCONTed
/// right after its declaration had been stopped for less than the bound and went on writing.
/// A heartbeat period longer than half the bound would void this margin.
pub(crate) fn end_if_stopped<F: Fabric>(comm: &F, gap: Duration, suspicion: Duration) {
    if gap > suspicion / 2 {
        comm.fail_stop(&format!(
            "this process did not run for {:.1} s, more than half the suspicion bound {:?}: the \
             other ranks may have declared it failed and gone on without it, so it must not \
             rejoin",
            gap.as_secs_f64(),
            suspicion
        ));
    }
}

/// One round of progress and failure queries. MPI errors here are failures to report, never a
/// reason to stop watching.
fn poll_once<F: Fabric>(watch: &Watch<F>) {
    let progressed =
        if watch.answer_pings { watch.comm.answer_pings() } else { watch.comm.progress() };
    if progressed.as_ref().is_err_and(|e| !e.is_failure()) {
        crate::events::warn(format!("detector: {}", progressed.unwrap_err()));
    }
    watch.health.enter_detector_step(DetectorStep::FailedRanks);
    match watch.comm.failed_ranks() {
        Ok(ranks) => publish_failures(watch, ranks.iter().map(|&r| watch.live[r as usize])),
        Err(e) => crate::events::warn(format!("detector: {e}")),
    }
    watch.health.enter_detector_step(DetectorStep::Revoked);
    let revoked = |comm: &F| comm.is_revoked().unwrap_or(true);
    if revoked(&watch.comm) || revoked(&watch.store_comm) {
        watch.health.raise_alarm();
    }
}

/// The watchdog's memory of the call it saw last on one lane.
struct StuckCall {
    lane: Lane,
    seen: u64,
    since: Option<Instant>,
}

impl StuckCall {
    fn new(lane: Lane) -> StuckCall {
        StuckCall { lane, seen: 0, since: None }
    }

    fn check<F: Fabric>(&mut self, watch: &Watch<F>) {
        let bound = watch.health.call_bound(self.lane, watch.watchdog);
        let now = watch.health.in_call[self.lane as usize].load(Ordering::Acquire);
        let inside = !now.is_multiple_of(2);
        if !inside || now != self.seen {
            self.seen = now;
            self.since = inside.then(Instant::now);
            return;
        }
        if self.since.is_some_and(|t| t.elapsed() > bound) {
            watch.comm.fail_stop(&format!(
                "a one-sided MPI call of the {} thread has not returned for {bound:?} (its \
                 target is presumably dead and Open MPI does not report it)",
                self.lane.thread_name()
            ));
            self.since = None;
        }
    }
}

/// The steps of a recovery attempt, in the order an attempt takes them (the recovery deadline
/// compares members' steps by it), named for the message of a deadline that expires inside
/// one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub(crate) enum Step {
    Revoke,
    Shrink,
    OpenWindow,
    ExchangeRecords,
    CopyOut,
    Barrier,
    Agree,
    FreeWindow,
}

impl Step {
    const ALL: [Step; 8] = [
        Step::Revoke,
        Step::Shrink,
        Step::OpenWindow,
        Step::ExchangeRecords,
        Step::CopyOut,
        Step::Barrier,
        Step::Agree,
        Step::FreeWindow,
    ];

    /// The step and the MPI call it waits in.
    pub fn describe(self) -> &'static str {
        match self {
            Step::Revoke => "revoke (MPIX_Comm_revoke)",
            Step::Shrink => "shrink (MPIX_Comm_shrink)",
            Step::OpenWindow => "open window (MPI_Win_allocate on the shrunk communicator)",
            Step::ExchangeRecords => "exchange records (MPI_Allgather)",
            Step::CopyOut => "copy to new holders (shared-memory copies, requests to other hosts)",
            Step::Barrier => "barrier after the copies (MPI_Barrier)",
            Step::Agree => "agree on the attempt (MPIX_Comm_agree)",
            Step::FreeWindow => "free a window (MPI_Win_free)",
        }
    }
}

/// The step a recovery attempt is in, shared between the store and its deadline, and the
/// bytes the attempt moves, which extend the deadline ([`SLOWEST_HEALTHY_RATE`]).
#[derive(Debug, Default)]
pub(crate) struct StepMarker {
    step: std::sync::atomic::AtomicUsize,
    bytes: AtomicU64,
}

impl StepMarker {
    pub fn set(&self, step: Step) {
        self.step.store(step as usize, Ordering::Release);
    }

    pub fn get(&self) -> Step {
        Step::ALL[self.step.load(Ordering::Acquire).min(Step::ALL.len() - 1)]
    }

    /// Counts `bytes` more that the attempt reads or copies.
    pub fn moves(&self, bytes: usize) {
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// How long the attempt's bytes take at [`SLOWEST_HEALTHY_RATE`].
    pub fn allowance(&self) -> Duration {
        Duration::from_secs_f64(self.bytes.load(Ordering::Relaxed) as f64 / SLOWEST_HEALTHY_RATE)
    }
}
