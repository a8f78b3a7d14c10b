//! What every part of a rank's store reads and the detector publishes: the failed workers (an
//! atomic bitmap), the alarm that sends a store to global recovery, the watchdog's counters of
//! data-path calls per lane, and the clock's and the detector's last beats.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::events::Cause;

/// A [`Cause`] as a nonzero number: the plain causes 1–4, a notice from worker `w` 5 + `w`.
fn encode_cause(cause: Cause) -> u32 {
    match cause {
        Cause::OpenMpi => 1,
        Cause::Silent => 2,
        Cause::Call => 3,
        Cause::Recovery => 4,
        Cause::Told { from } => 5 + from.max(0) as u32,
    }
}

fn decode_cause(code: u32) -> Option<Cause> {
    match code {
        0 => None,
        1 => Some(Cause::OpenMpi),
        2 => Some(Cause::Silent),
        3 => Some(Cause::Call),
        4 => Some(Cause::Recovery),
        told => Some(Cause::Told { from: (told - 5) as i32 }),
    }
}

/// What the detector publishes and the watchdog watches.
#[derive(Debug)]
pub(crate) struct Health {
    workers: usize,
    failed: Vec<AtomicU64>,
    /// How each worker was first learned failed ([`encode_cause`]; 0: not marked).
    causes: Box<[AtomicU32]>,
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
    pub(super) in_call: [AtomicU64; Lane::ALL.len()],
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
            causes: (0..workers).map(|_| AtomicU32::new(0)).collect(),
            generation: AtomicU64::new(0),
            alarm_on_failure,
            alarm: AtomicBool::new(false),
            in_call: Lane::ALL.map(|_| AtomicU64::new(0)),
            call_bytes: Lane::ALL.map(|_| AtomicU64::new(0)),
            tick_at: AtomicU64::new(0),
            detector_at: AtomicU64::new(0),
            detector_step: AtomicU64::new(0),
            first_failure_at: AtomicU64::new(0),
            born: crate::rt::now(),
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

    pub(super) fn stamp_tick(&self) {
        self.tick_at.store(coarse_now().as_ticks().max(1), Ordering::Release);
    }

    pub(super) fn now(&self) -> u64 {
        crate::rt::since(self.born).as_nanos().max(1) as u64
    }

    pub(super) fn enter_detector_step(&self, step: DetectorStep) {
        if step == DetectorStep::Progress {
            self.detector_at.store(self.now(), Ordering::Release);
        }
        self.detector_step.store(step as u64, Ordering::Release);
    }

    /// How long the detector's current round has lasted, and the part it is in (`None` before
    /// its first round).
    pub(super) fn detector_round(&self) -> Option<(Duration, DetectorStep)> {
        let at = self.detector_at.load(Ordering::Acquire);
        if at == 0 {
            return None;
        }
        let lasted = Duration::from_nanos(self.now().saturating_sub(at));
        let step = DetectorStep::ALL[self.detector_step.load(Ordering::Acquire) as usize];
        Some((lasted, step))
    }

    pub(super) fn stop_ticks(&self) {
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

    /// How worker `id` was first learned failed (`None`: it is not marked).
    pub fn cause(&self, id: i32) -> Option<Cause> {
        decode_cause(self.causes.get(id as usize)?.load(Ordering::Acquire))
    }

    /// Marks worker `id` failed, learned of by `cause` (the first cause is kept).
    pub fn mark_failed(&self, id: i32, cause: Cause) {
        if let Some(slot) = self.causes.get(id as usize) {
            let code = encode_cause(cause);
            let _ = slot.compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire);
        }
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
    pub(super) fn call_bound(&self, lane: Lane, watchdog: Duration) -> Duration {
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
pub(super) fn coarse_now() -> coarsetime::Instant {
    crate::rt::coarse_now()
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
    pub(super) const ALL: [Lane; 3] = [Lane::Owner, Lane::Repairer, Lane::Replicator];

    /// The thread that makes this lane's calls, for messages.
    pub(super) fn thread_name(self) -> &'static str {
        match self {
            Lane::Owner => "store's owning",
            Lane::Repairer => "repairer",
            Lane::Replicator => "replicator",
        }
    }
}

/// The parts of a detector round, named when one of them does not return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub(super) enum DetectorStep {
    Progress,
    FailedRanks,
    Fence,
    Revoked,
    /// Taking or sending failure notices.
    Notices,
    Pause,
}

impl DetectorStep {
    /// Whether the detector can be stuck here on another process: not while it pauses, nor
    /// while it fences, which reads and writes only this process's own slots (slow with a
    /// large value, never waiting on a peer).
    pub(super) fn can_be_stuck(self) -> bool {
        !matches!(self, DetectorStep::Pause | DetectorStep::Fence)
    }

    const ALL: [DetectorStep; 6] = [
        DetectorStep::Progress,
        DetectorStep::FailedRanks,
        DetectorStep::Fence,
        DetectorStep::Revoked,
        DetectorStep::Notices,
        DetectorStep::Pause,
    ];
}
