//! The watchdogs beside the detector: the clock thread, which ends a process that did not run
//! for half the suspicion bound (stopped, or its host frozen) and one whose detector round is
//! stuck in MPI, and the per-lane watch of data-path calls that never return.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::health::{Health, Lane};
use super::Watch;
use crate::fabric::Fabric;

/// The clock thread: sleeps a tick at a time and stamps [`Health::since_last_tick`]; ends the
/// process when one of its sleeps lasted more than half the suspicion bound. It takes no lock
/// and makes no MPI call, so only a stopped process (or a frozen host) delays it that long.
///
/// It also watches the detector thread: a detector round that has not ended after `stuck`
/// (the watchdog bound) in a part that waits on MPI ends the process, naming the part of the
/// round it is stuck in. Without
/// its detector a process would learn of no failure and wait forever; ended, it is a failure
/// the others recover from.
pub(super) fn tick<F: Fabric>(
    comm: &F,
    health: &Health,
    [suspicion, stuck]: [Duration; 2],
    stop: &AtomicBool,
) {
    let period = (suspicion / 20).min(Duration::from_millis(100));
    while !stop.load(Ordering::Acquire) {
        crate::rt::park_timeout(period);
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

/// Ends this process when the clock did not tick for more than half the suspicion bound: the
/// process was stopped (SIGSTOP), or its host froze, long enough that the others may have
/// declared it failed and gone on without it. Checked before the watchdog after such a gap, so
/// a call the watchdog sees stuck is not blamed on its target.
pub(super) fn end_if_suspended<F: Fabric>(watch: &Watch<F>) {
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

/// The watchdog's memory of the call it saw last on one lane.
pub(super) struct StuckCall {
    lane: Lane,
    seen: u64,
    since: Option<Instant>,
}

impl StuckCall {
    pub(super) fn new(lane: Lane) -> StuckCall {
        StuckCall { lane, seen: 0, since: None }
    }

    pub(super) fn check<F: Fabric>(&mut self, watch: &Watch<F>) {
        let bound = watch.health.call_bound(self.lane, watch.watchdog);
        let now = watch.health.in_call[self.lane as usize].load(Ordering::Acquire);
        let inside = !now.is_multiple_of(2);
        if !inside || now != self.seen {
            self.seen = now;
            self.since = inside.then(crate::rt::now);
            return;
        }
        if self.since.is_some_and(|t| crate::rt::since(t) > bound) {
            watch.comm.fail_stop(&format!(
                "a one-sided MPI call of the {} thread has not returned for {bound:?} (its \
                 target is presumably dead and Open MPI does not report it)",
                self.lane.thread_name()
            ));
            self.since = None;
        }
    }
}
