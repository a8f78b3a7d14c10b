//! Failure knowledge for the put path, kept fresh by a detector thread per rank, and the
//! watchdogs beside it.
//!
//! - [`health`]: what the put path reads: the failed workers in an atomic bitmap (a few relaxed
//!   loads per call, no system call), the alarm, the watchdog's call counters.
//! - [`sources`]: where failures come from. The detector thread polls them every poll interval
//!   (failures are noticed only while MPI makes progress), fences new failures out of this
//!   rank's slots and publishes them in [`Health`].
//! - [`ending`]: makes the processes the survivors declared failed dead (a stopped rank would
//!   hold the job's end): by pid on this host, through the runtime on another host that still
//!   answers a TCP connection to the worker's listener.
//! - [`heartbeat`]: the store's own heartbeat among the members that share keys: a peer
//!   silent past the bound is ended as a declared one (Open MPI's ring detector finds
//!   consecutive stopped ranks one bound after the other).
//! - [`watchdog`]: the put path marks the start and end of every data-path MPI call in a
//!   counter (odd while inside); a call that stays inside longer than the watchdog bound, which
//!   is what one-sided calls do against some dead targets, ends the process with SIGKILL after a
//!   message: a fail-stop failure that the survivors recover from. The clock thread ends a
//!   process that did not run for half the suspicion bound, and one whose detector is stuck.
//!
//! In [`Detection::Ping`](crate::Detection::Ping) mode the detector thread also answers the
//! two-sided pings that writers send before every put, polling without sleeping (the
//! reference paper's helper).

pub(crate) mod ending;
mod health;
mod heartbeat;
mod sources;
mod watchdog;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::events::Cause;
use crate::fabric::{Fabric, FabricResult, ProcessTag};
use crate::rt::{self, Thread};
use sources::{FailureSource, Notices, Revocation, Told, UlfmFailedSet};
use watchdog::StuckCall;

pub(crate) use ending::{Reacher, SharedEnding};
use health::DetectorStep;
pub(crate) use health::{read_allowance, Health, Lane, SLOWEST_HEALTHY_RATE};
pub(crate) use heartbeat::key_sharers;
pub(crate) use watchdog::end_if_stopped;

/// The running detector and clock threads; stopped and joined on drop.
pub(crate) struct Detector {
    stop: Arc<AtomicBool>,
    stop_clock: Arc<AtomicBool>,
    handle: Option<Thread<()>>,
    clock: Option<Thread<()>>,
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
    /// This member's worker id.
    pub me: i32,
    /// Every worker's host id, by worker id.
    pub hosts: Vec<u32>,
    /// Every worker's process, by worker id (see [`ending`]).
    pub processes: Arc<Vec<ProcessTag>>,
    /// [`crate::Config::end_declared`].
    pub end_declared: bool,
    /// What this store's members ended so far, shared with the store ([`ending`]).
    pub ending: SharedEnding,
    /// [`crate::Config::end_through_runtime`].
    pub end_through_runtime: bool,
    /// The members this one exchanges heartbeats with (ranks of `comm`; see [`heartbeat`]):
    /// those it shares keys with, when the fabric can end processes and `end_declared` is on.
    pub heartbeat_peers: Vec<i32>,
    /// The ranks of `comm` on this member's host, this member left out: the members it tells
    /// of the failures it learns of, and the only ones that tell it. Empty with global
    /// recovery, where the first survivor's revocation reaches every member as fast: no
    /// notices then.
    pub neighbours: Vec<i32>,
    pub health: Arc<Health>,
    pub poll_interval: Duration,
    pub watchdog: Duration,
    /// [`crate::Config::suspicion`].
    pub suspicion: Duration,
    pub answer_pings: bool,
    /// Fences newly failed workers out of this rank's slots (see [`crate::store::fence`]).
    pub fence: FenceFailed,
}

impl<F> Watch<F> {
    /// Who ends failed processes, from this member ([`ending`]). Nothing is ended unless
    /// this member's side keeps the quorum of the detector's live set
    /// ([`crate::keeps_quorum`]) without the failed workers and the `silent` ones: a side cut
    /// off from the others finds them all silent, and a member whose transport broke finds
    /// them failed (seen at 32 ranks over 2 simulated hosts under load: one member's view lost
    /// 19 of 32 after Open MPI's TCP transport failed a connection, and it killed its healthy
    /// host mates by pid).
    fn reacher(&self, silent: &[i32]) -> ending::Reacher<'_, F> {
        let failed = self.health.failed_workers(self.health.workers());
        let gone = |w: &i32| failed.contains(w) || silent.contains(w);
        let live: Vec<i32> = self.live.iter().copied().filter(|w| !gone(w)).collect();
        let quorum = crate::engine::plan::keeps_quorum(&self.live, &live, &self.hosts);
        ending::Reacher::new(
            &*self.comm,
            self.me,
            &self.hosts,
            &self.processes,
            (quorum, self.end_through_runtime),
            self.suspicion,
        )
    }
}

/// Once the failed set grew past `generation` (the one last acted on): ends the failed
/// processes this member is to end ([`ending::Ending::end_failed`]). Returns the generation
/// acted on.
fn end_new_failures<F: Fabric>(watch: &Watch<F>, generation: u64) -> u64 {
    let now = watch.health.generation();
    if now != generation && watch.end_declared {
        let failed = watch.health.failed_workers(watch.health.workers());
        let caused: Vec<(i32, Cause)> = failed
            .into_iter()
            .map(|w| (w, watch.health.cause(w).unwrap_or(Cause::OpenMpi)))
            .collect();
        ending::lock(&watch.ending).end_failed(&watch.reacher(&[]), &caused);
    }
    now
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
        let clock = rt::spawn("ftkv-clock", move || watchdog::tick(&*comm, &health, bounds, &flag))
            .expect("spawning the clock thread");
        let flag = stop.clone();
        let handle = rt::spawn("ftkv-detector", move || run(watch, &flag))
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
            clock.unpark();
            match clock.join() {
                Err(payload) if !(self.is_kill)(payload.as_ref()) => {
                    crate::events::warn("the clock thread panicked")
                }
                _ => {}
            }
        }
    }
}

/// The detector thread: each round, the neighbours' notices, MPI progress and the other
/// failure sources, a notice to the neighbours of what they did not tell, the fencing of new
/// failures and the ending of their processes, the watchdog's look at every lane, then a pause.
fn run<F: Fabric>(watch: Watch<F>, stop: &AtomicBool) {
    let mut stuck = Lane::ALL.map(StuckCall::new);
    let mut fenced_generation = 0;
    let (mut notices, mut ulfm, mut revocation) = (Notices::default(), UlfmFailedSet, Revocation);
    let mut told = Told::starting(&watch);
    let mut ended_generation = 0;
    let mut heartbeats = heartbeat::Heartbeats::new(watch.heartbeat_peers.clone(), watch.suspicion);
    while !stop.load(Ordering::Acquire) {
        watch.health.enter_detector_step(DetectorStep::Progress);
        watch.comm.stall_point("detector_round");
        watchdog::end_if_suspended(&watch);
        let heard = notices.poll(&watch);
        notices.heartbeats_from.drain(..).for_each(|rank| heartbeats.heard(rank));
        told.heard(&heard);
        sources::act_on(&watch, heard);
        let sources: [&mut dyn FailureSource<F>; 2] = [&mut ulfm, &mut revocation];
        for source in sources {
            let found = source.poll(&watch);
            sources::act_on(&watch, found);
        }
        told.tell_neighbours(&watch);
        watch.health.enter_detector_step(DetectorStep::Fence);
        fenced_generation = sources::fence_new_failures(&watch, fenced_generation);
        ended_generation = end_new_failures(&watch, ended_generation);
        let silent = if heartbeats.any() { heartbeats.round(&watch) } else { Vec::new() };
        let mut ending = ending::lock(&watch.ending);
        if !silent.is_empty() || ending.is_probing() {
            let reacher = watch.reacher(&silent);
            let silent: Vec<(i32, Cause)> = silent.iter().map(|&w| (w, Cause::Silent)).collect();
            ending.end_failed(&reacher, &silent);
            ending.end_probed(&reacher);
        }
        drop(ending);
        stuck.iter_mut().for_each(|lane| lane.check(&watch));
        watch.health.enter_detector_step(DetectorStep::Pause);
        if watch.answer_pings {
            std::thread::yield_now();
        } else {
            rt::sleep(watch.poll_interval);
        }
    }
}
