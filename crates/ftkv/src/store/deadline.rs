//! The recovery deadline: ends this process when a step of a recovery attempt is stuck with
//! every live member inside it, and never because a member is late.
//!
//! Open MPI 5.0's `MPIX_Comm_shrink` (and agree) can stay stuck on every survivor after a kill
//! during recovery; a bound turns that hang into fail-stop failures. But a survivor that calls
//! [`Store::recover`](crate::Store::recover) late (its application is busy) holds the others in
//! the same calls, and a bound that ran from each member's own entry ended the punctual ones,
//! losing the keys they held. So the bound runs only once every live member is inside the step:
//!
//! - Every member marks the step it entered (the store-wide attempt number and the step,
//!   [`mark`]) in a word at the start of its window of the windows the recovery replaces
//!   ([`crate::engine::layout::RECOVERY_MARK_AT`]), and the others read it one-sidedly by
//!   compare-and-swap: the processor's atomics within a host, the member's serving thread
//!   across hosts. No collective (the collectives are what may be stuck), no message that must
//!   be received, nothing that waits on the member's application thread; a dead member on
//!   another host fails the read (its connection ends) instead of hanging it. The recovery
//!   reads from those windows anyway, and every member holds them until the recovery commits.
//! - Each member's deadline thread reads the marks of the members it has not seen in its own
//!   step yet, learns failures from ULFM (the detector's communicator) and the failed set known
//!   before the recovery, and applies [`judge`]: expired iff every member entered the step (or a
//!   later one) or is known failed, and the last of those events lies more than the bound back.
//!   A known failure does not hold anyone, but it restarts the bound: the step's call returns an
//!   error once it learns of it.
//! - While a member is not there, the thread names the members it waits for
//!   ([`Event::RecoveryWaiting`](crate::events::Event::RecoveryWaiting)), after a second and
//!   then every five seconds.
//!
//! A member stuck in a step alone (Open MPI's shrink returned on the others, which wait for it
//! in the next step) sees everyone at its step or beyond and ends itself; the others, in a
//! later step it never entered, wait and recover without it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Windows;
use crate::detector::{Health, SLOWEST_HEALTHY_RATE};
use crate::events::{self, Event};
use crate::fabric::{Fabric, FabricWindow};
use crate::rt::{self, Thread};

/// How often the deadline thread reads marks and failures.
const POLL: Duration = Duration::from_millis(20);
/// How long a step waits for absent members before the first [`Event::RecoveryWaiting`].
const FIRST_REPORT: Duration = Duration::from_secs(1);
/// How often it is repeated while they stay absent.
const REPORT_EVERY: Duration = Duration::from_secs(5);

/// A member's position in the store's recoveries: the store-wide number of the attempt (every
/// survivor numbers attempts alike, since each attempt ends in an agreement) and its step. A
/// later attempt, or a later step of the same attempt, is greater; 0 is no attempt yet.
pub(crate) fn mark(attempt: u64, step: Step) -> u64 {
    (attempt << 4) | (step as u64 + 1)
}

/// What a member's deadline knows of one member for the step it is in, as time since the step
/// began there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// Not seen in the step (or a later one) and not known failed: it holds the bound.
    Absent,
    /// Seen in the step, or a later one, this long after the step began.
    Entered(Duration),
    /// Known failed this long after the step began.
    Failed(Duration),
}

impl Arrival {
    fn settled_at(self) -> Option<Duration> {
        match self {
            Arrival::Absent => None,
            Arrival::Entered(at) | Arrival::Failed(at) => Some(at),
        }
    }
}

/// What [`judge`] decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// These members (by rank) have not entered the step: the bound does not run.
    Waiting { absent: Vec<usize> },
    /// Every member is in (or failed); the bound runs out after `left`.
    Running { left: Duration },
    /// Every member has been in (or failed) for `inside`, longer than the bound.
    Expired { inside: Duration },
}

/// The deadline's rule, at `now` since the step began: expired iff no member is
/// [`Arrival::Absent`] and the last arrival or failure is more than `bound` before `now`.
pub(crate) fn judge(arrivals: &[Arrival], now: Duration, bound: Duration) -> Verdict {
    let absent: Vec<usize> =
        (0..arrivals.len()).filter(|&m| arrivals[m] == Arrival::Absent).collect();
    if !absent.is_empty() {
        return Verdict::Waiting { absent };
    }
    let last = arrivals.iter().filter_map(|a| a.settled_at()).max().unwrap_or_default();
    let inside = now.saturating_sub(last);
    match bound.checked_sub(inside) {
        Some(left) => Verdict::Running { left },
        None => Verdict::Expired { inside },
    }
}

/// The arrivals of every member (by rank in the replaced windows) in this member's current
/// step, kept up to date from the marks read and the failures learned.
#[derive(Debug)]
pub(crate) struct Arrivals {
    /// This member's current mark: the step judged.
    mark: u64,
    began: Instant,
    /// Each member's highest mark read.
    seen: Vec<u64>,
    failed: Vec<bool>,
    arrivals: Vec<Arrival>,
}

impl Arrivals {
    pub fn new(members: usize, began: Instant) -> Arrivals {
        Arrivals {
            mark: 0,
            began,
            seen: vec![0; members],
            failed: vec![false; members],
            arrivals: vec![Arrival::Entered(Duration::ZERO); members],
        }
    }

    /// This member entered the step of `mark` at `now`: a member already seen there or beyond,
    /// or known failed, counts from now; every other one is absent until seen.
    pub fn enter(&mut self, mark: u64, now: Instant) {
        self.mark = mark;
        self.began = now;
        for m in 0..self.seen.len() {
            self.arrivals[m] = match (self.failed[m], self.seen[m] >= mark) {
                (true, _) => Arrival::Failed(Duration::ZERO),
                (false, true) => Arrival::Entered(Duration::ZERO),
                (false, false) => Arrival::Absent,
            };
        }
    }

    /// Member `m`'s mark read at `now`.
    pub fn saw(&mut self, m: usize, mark: u64, now: Instant) {
        self.seen[m] = self.seen[m].max(mark);
        if self.arrivals[m] == Arrival::Absent && self.seen[m] >= self.mark {
            self.arrivals[m] = Arrival::Entered(now.saturating_duration_since(self.began));
        }
    }

    /// Member `m` is known failed at `now` (counted once).
    pub fn fail(&mut self, m: usize, now: Instant) {
        if !std::mem::replace(&mut self.failed[m], true) {
            self.arrivals[m] = Arrival::Failed(now.saturating_duration_since(self.began));
        }
    }

    /// The members not seen in the step and not known failed.
    pub fn absent(&self) -> Vec<usize> {
        (0..self.arrivals.len()).filter(|&m| self.arrivals[m] == Arrival::Absent).collect()
    }

    /// How long the step has lasted here at `now`.
    pub fn lasted(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.began)
    }

    /// [`judge`] at `now`.
    pub fn verdict(&self, now: Instant, bound: Duration) -> Verdict {
        judge(&self.arrivals, self.lasted(now), bound)
    }
}

/// The windows whose mark words the members of a recovery write and read; `None` once the
/// recovery released them to free them.
type Board<W> = Arc<Mutex<Option<Arc<Windows<W>>>>>;

/// What a [`Deadline`] watches and how it ends the process.
pub(crate) struct DeadlineParts<F: Fabric> {
    /// The store's communicator, through which the process ends itself.
    pub comm: Arc<F>,
    /// The detector's communicator (same members, in the same order, as the replaced windows),
    /// on which the thread learns ULFM's failures; `None` when the store has none.
    pub failures: Option<Arc<F>>,
    /// The failed set known before the recovery.
    pub health: Arc<Health>,
    /// The windows the recovery replaces, where the members mark their steps.
    pub windows: Arc<Windows<F::Window>>,
    /// This member's worker id.
    pub worker: i32,
    pub bound: Duration,
    pub step: Arc<StepMarker>,
    /// The store-wide number of this attempt.
    pub attempt: u64,
}

/// Ends the process (fail-stop, through the fabric) when a step of the watched recovery attempt
/// stays stuck with every live member inside it for longer than its bound (the recovery
/// watchdog plus the time the attempt's bytes take, [`StepMarker`]); the message names the
/// step. While members are not inside, it waits for them, however long, naming them. Dropping
/// it wakes and joins its thread, so the communicators and windows it holds are released
/// before the drop returns.
pub(crate) struct Deadline<W: FabricWindow> {
    done: Arc<AtomicBool>,
    board: Board<W>,
    thread: Option<Thread<()>>,
    /// The fabric's test for a killed rank's unwinding ([`Fabric::is_kill`]).
    is_kill: fn(&(dyn std::any::Any + Send)) -> bool,
}

impl<W: FabricWindow> Deadline<W> {
    /// Starts watching the attempt of `parts`.
    pub fn start<F: Fabric<Window = W>>(parts: DeadlineParts<F>) -> Deadline<W> {
        let done = Arc::new(AtomicBool::new(false));
        let board: Board<W> = Arc::new(Mutex::new(Some(parts.windows.clone())));
        let watcher = Watcher::new(parts, board.clone());
        let flag = done.clone();
        let spawned = rt::spawn("ftkv-deadline", move || watcher.run(&flag));
        let thread = spawned
            .map_err(|e| events::warn(format!("cannot start the recovery deadline thread: {e}")))
            .ok();
        Deadline { done, board, thread, is_kill: F::is_kill }
    }

    /// Stops reading and writing marks, so that the replaced windows can be freed: every
    /// member still absent counts as entered from now. For the last step, after the agreement
    /// that every live member reached.
    pub fn release_windows(&self) {
        rt::lock(&self.board).take();
    }
}

impl<W: FabricWindow> Drop for Deadline<W> {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.unpark();
            match thread.join() {
                Err(payload) if !(self.is_kill)(payload.as_ref()) => {
                    events::warn("the deadline thread panicked")
                }
                _ => {}
            }
        }
    }
}

/// The deadline thread's state.
struct Watcher<F: Fabric> {
    parts: DeadlineParts<F>,
    board: Board<F::Window>,
    /// Workers by rank in the replaced windows.
    live: Vec<i32>,
    /// This member's rank there (`None`: not a member, marks are neither written nor read).
    me: Option<usize>,
    /// This member's highest mark in the attempt.
    mark: u64,
    /// When the next [`Event::RecoveryWaiting`] is due, as time in the step.
    next_report: Duration,
    /// Whether a mark could not be read or written (warned once).
    warned: bool,
}

impl<F: Fabric> Watcher<F> {
    fn new(parts: DeadlineParts<F>, board: Board<F::Window>) -> Watcher<F> {
        let live = parts.windows.layout().live.clone();
        let me = live.iter().position(|&w| w == parts.worker);
        Watcher { parts, board, live, me, mark: 0, next_report: FIRST_REPORT, warned: false }
    }

    fn run(mut self, done: &AtomicBool) {
        let mut arrivals = Arrivals::new(self.live.len(), rt::now());
        while !done.load(Ordering::Acquire) {
            let now = rt::now();
            self.follow_own_step(&mut arrivals, now);
            self.learn_failures(&mut arrivals, now);
            self.read_marks(&mut arrivals, now);
            if self.judge(&arrivals, now) {
                return;
            }
            rt::park_timeout(POLL);
        }
    }

    /// Marks this member's step when it advanced, and judges the new step from now.
    fn follow_own_step(&mut self, arrivals: &mut Arrivals, now: Instant) {
        let mark = mark(self.parts.attempt, self.parts.step.get());
        if mark <= self.mark {
            return;
        }
        self.mark = mark;
        self.next_report = FIRST_REPORT;
        if let Some(me) = self.me {
            let board = rt::lock(&self.board);
            let raised = board.as_ref().map(|w| w.raise_recovery_mark(me as i32, mark));
            drop(board);
            if let Some(Err(e)) = raised {
                self.warn_once(&format!("marking this member's recovery step: {e}"));
            }
            arrivals.saw(me, mark, now);
        }
        arrivals.enter(mark, now);
    }

    /// Marks the members known failed: before the recovery, or by ULFM since.
    fn learn_failures(&self, arrivals: &mut Arrivals, now: Instant) {
        for (m, &worker) in self.live.iter().enumerate() {
            if self.parts.health.is_failed(worker) {
                arrivals.fail(m, now);
            }
        }
        let Some(comm) = &self.parts.failures else { return };
        // Lets failure notifications arrive unless the store's thread is inside a fault-tolerant
        // call (revoke, shrink, agree), which lets them arrive itself; an error here is a
        // failure to learn of later.
        let _ = comm.progress();
        if let Ok(ranks) = comm.failed_ranks() {
            let members = ranks.into_iter().filter_map(|r| usize::try_from(r).ok());
            members.filter(|&m| m < self.live.len()).for_each(|m| arrivals.fail(m, now));
        }
    }

    /// Reads the marks of the members not seen in this step yet. Once the windows are released
    /// (after the final agreement), every member counts as entered.
    fn read_marks(&mut self, arrivals: &mut Arrivals, now: Instant) {
        let absent = arrivals.absent();
        if absent.is_empty() || self.me.is_none() {
            return;
        }
        let board = rt::lock(&self.board);
        let Some(windows) = board.as_ref() else {
            absent.into_iter().for_each(|m| arrivals.saw(m, u64::MAX, now));
            return;
        };
        let mut unread = None;
        for m in absent {
            match windows.recovery_mark(m as i32) {
                Ok(mark) => arrivals.saw(m, mark, now),
                Err(e) if e.is_failure() => arrivals.fail(m, now),
                Err(e) => unread = Some(e),
            }
        }
        drop(board);
        if let Some(e) = unread {
            self.warn_once(&format!("reading a member's recovery step: {e}"));
        }
    }

    /// Applies the verdict: ends the process when expired (returns `true` then), names the
    /// absent members when a report is due.
    fn judge(&mut self, arrivals: &Arrivals, now: Instant) -> bool {
        let bound = self.parts.bound + self.parts.step.allowance();
        match arrivals.verdict(now, bound) {
            Verdict::Expired { inside } => {
                self.parts.comm.fail_stop(&format!(
                    "a recovery attempt has not ended after {bound:?} with every live member \
                     inside its step ({:.1} s since the last entered it): stuck in step {}",
                    inside.as_secs_f64(),
                    self.parts.step.get().describe()
                ));
                true
            }
            Verdict::Waiting { absent } => {
                self.report_waiting(&absent, arrivals.lasted(now));
                false
            }
            Verdict::Running { .. } => false,
        }
    }

    fn report_waiting(&mut self, absent: &[usize], waited: Duration) {
        if waited < self.next_report {
            return;
        }
        self.next_report = waited + REPORT_EVERY;
        events::emit(Event::RecoveryWaiting {
            worker: self.parts.worker,
            step: self.parts.step.get().describe().to_owned(),
            absent: absent.iter().map(|&m| self.live[m]).collect(),
            waited,
        });
    }

    fn warn_once(&mut self, what: &str) {
        if !std::mem::replace(&mut self.warned, true) {
            events::warn(format!("recovery deadline: {what}"));
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

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(10);

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    use Arrival::{Absent, Entered, Failed};

    /// One row per case: the arrivals, the time in the step, the verdict.
    #[test]
    fn expired_iff_every_live_member_entered_and_the_last_entry_is_older_than_the_bound() {
        let rows: Vec<(&str, Vec<Arrival>, Duration, Verdict)> = vec![
            (
                "all in at once, within",
                vec![Entered(s(0)); 3],
                s(9),
                Verdict::Running { left: s(1) },
            ),
            (
                "all in at once, at the bound",
                vec![Entered(s(0)); 3],
                s(10),
                Verdict::Running { left: s(0) },
            ),
            (
                "all in at once, past",
                vec![Entered(s(0)); 3],
                s(11),
                Verdict::Expired { inside: s(11) },
            ),
            ("one late member holds all", vec![Entered(s(0)), Absent, Entered(s(0))], s(3600), {
                Verdict::Waiting { absent: vec![1] }
            }),
            (
                "two late",
                vec![Absent, Entered(s(0)), Absent],
                s(60),
                Verdict::Waiting { absent: vec![0, 2] },
            ),
            ("the bound counts from the last entry", vec![Entered(s(0)), Entered(s(30))], s(39), {
                Verdict::Running { left: s(1) }
            }),
            ("and expires after it", vec![Entered(s(0)), Entered(s(30))], s(41), {
                Verdict::Expired { inside: s(11) }
            }),
            ("a failed member holds nobody", vec![Entered(s(0)), Failed(s(0))], s(11), {
                Verdict::Expired { inside: s(11) }
            }),
            ("a failure restarts the bound", vec![Entered(s(0)), Failed(s(20))], s(25), {
                Verdict::Running { left: s(5) }
            }),
            ("a failure does not wait for the absent", vec![Failed(s(1)), Absent], s(99), {
                Verdict::Waiting { absent: vec![1] }
            }),
            ("alone", vec![Entered(s(0))], s(11), Verdict::Expired { inside: s(11) }),
        ];
        for (case, arrivals, now, want) in rows {
            assert_eq!(judge(&arrivals, now, BOUND), want, "{case}");
        }
    }

    #[test]
    fn arrivals_follow_marks_steps_and_failures() {
        let t0 = Instant::now();
        let at = |secs| t0 + s(secs);
        let shrink = mark(7, Step::Shrink);
        let mut arrivals = Arrivals::new(3, t0);
        arrivals.saw(0, shrink, t0);
        arrivals.enter(shrink, t0);
        assert_eq!(arrivals.absent(), vec![1, 2], "nobody else seen yet");
        arrivals.saw(1, mark(7, Step::Revoke), at(1));
        assert_eq!(arrivals.absent(), vec![1, 2], "an earlier step is not the step");
        arrivals.saw(2, mark(6, Step::FreeWindow), at(1));
        assert_eq!(arrivals.absent(), vec![1, 2], "an earlier attempt is not the attempt");
        arrivals.saw(1, mark(7, Step::Agree), at(2));
        arrivals.fail(2, at(3));
        assert_eq!(arrivals.verdict(at(13), BOUND), Verdict::Running { left: Duration::ZERO });
        assert_eq!(arrivals.verdict(at(14), BOUND), Verdict::Expired { inside: s(11) });
        // The next step: member 1 was seen there already, member 2 stays failed.
        arrivals.saw(0, mark(7, Step::OpenWindow), at(20));
        arrivals.enter(mark(7, Step::OpenWindow), at(20));
        assert_eq!(arrivals.absent(), Vec::<usize>::new());
        assert_eq!(arrivals.arrivals[2], Failed(Duration::ZERO), "still failed");
        assert_eq!(arrivals.verdict(at(31), BOUND), Verdict::Expired { inside: s(11) });
        arrivals.saw(0, mark(8, Step::Revoke), at(40));
        arrivals.enter(mark(8, Step::Revoke), at(40));
        assert_eq!(arrivals.absent(), vec![1], "a new attempt waits for everyone again");
    }

    #[test]
    fn marks_order_attempts_then_steps() {
        assert!(mark(1, Step::Revoke) > 0);
        assert!(mark(1, Step::FreeWindow) < mark(2, Step::Revoke));
        assert!(mark(2, Step::Revoke) < mark(2, Step::Shrink));
        assert!(mark(2, Step::Agree) < mark(2, Step::FreeWindow));
    }
}
