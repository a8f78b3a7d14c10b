//! Localized recovery's repair ([`Recovery::Localized`]): after a failure the copies that
//! lived on failed workers move down their chains to reserve holders.
//!
//! A repairer thread beside the detector does it as soon as the detector publishes the
//! failure, whether or not the owner makes a store call: it fences the failed workers out of
//! this rank's slots, computes the routes without them, copies the newest surviving version of
//! every own key that lost a copy to its new holder, and of every key of a failed owner whose
//! first live holder this worker is. The store's calls go on meanwhile on their routes; a call
//! that notices a failure its routes do not follow waits for the repairer and adopts its
//! routes ([`Follower::await_routes`], from [`Store::follow`] and the retries of
//! [`Store::localized`]).
//!
//! The repairer writes only to holders that are new in a route, and the owner moves to the new
//! routes only once the repair is complete, so the owner's writes and the repairer's never
//! meet on one copy.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::{RepairReport, Store, Windows, LOCALIZED_ATTEMPTS};
use crate::config::Recovery;
use crate::detector::{read_allowance, Health, Lane};
use crate::engine::layout::{Copy, Layout};
use crate::engine::plan;
use crate::engine::repair::{self, Command as RepairCommand, Event, Interruptions, PAUSE_POLLS};
use crate::error::{Error, Result};
use crate::fabric::{Fabric, FabricError};
use crate::key::Key;
use crate::rt::{self, Thread};
use crate::slot::{Committed, Header, HEADER_LEN};
use crate::store::fence::{newest_header_version, newest_unfenced_header, read_copy};
use crate::store::halves;

/// The last acknowledged version of each own key (0: none yet), written by the owner's calls
/// and read by the repairer: an own key with an acknowledged write and no surviving copy
/// cannot be repaired locally.
#[derive(Debug)]
pub(crate) struct Acked(Vec<AtomicU64>);

impl Acked {
    pub fn new(kinds: usize) -> Acked {
        Acked((0..kinds).map(|_| AtomicU64::new(0)).collect())
    }

    pub fn get(&self, kind: usize) -> u64 {
        self.0[kind].load(Ordering::Acquire)
    }

    pub fn set(&self, kind: usize, version: u64) {
        self.0[kind].store(version, Ordering::Release);
    }

    pub fn snapshot(&self) -> Vec<u64> {
        (0..self.0.len()).map(|kind| self.get(kind)).collect()
    }
}

/// The routes the repairer keeps up to date, under the follower's lock.
struct Routes {
    layout: Layout,
    /// The failure generation `layout` follows (`None`: none yet, fresh windows).
    followed: Option<u64>,
    /// Repairs that a failure interrupted (each is tried again); a store call waiting for the
    /// routes takes a new one as its own interruption.
    interrupted: u64,
    /// Repairs done and not yet taken by the store.
    repairs: Vec<RepairReport>,
}

/// What a localized repair reads and writes, shared by the store and its repairer thread for
/// one set of windows (a global recovery makes a new one).
pub(crate) struct Follower<F: Fabric> {
    parts: FollowerParts<F>,
    routes: Mutex<Routes>,
    /// Signalled when the routes changed, a repair was interrupted, or a store call waits.
    changed: Condvar,
    /// Whether the repairer thread still runs (a store call does not wait for a dead one).
    running: AtomicBool,
}

/// What a [`Follower`] works with besides its routes.
pub(crate) struct FollowerParts<F: Fabric> {
    pub me: i32,
    pub workers: usize,
    pub hosts: Vec<u32>,
    pub kinds: usize,
    pub poll_interval: Duration,
    pub health: Arc<Health>,
    pub comm: Arc<F>,
    /// The windows the repairs read and write; a global recovery starts a new follower on
    /// its new ones.
    pub windows: Arc<Windows<F::Window>>,
    pub acked: Arc<Acked>,
}

/// The routes a store call adopts from the repairer.
pub(crate) struct Followed {
    pub layout: Layout,
    pub generation: u64,
    pub repairs: Vec<RepairReport>,
}

impl<F: Fabric> Follower<F> {
    /// A follower whose routes start at `layout`, following no failure generation yet.
    pub fn new(parts: FollowerParts<F>, layout: Layout) -> Follower<F> {
        let routes = Routes { layout, followed: None, interrupted: 0, repairs: Vec::new() };
        Follower {
            parts,
            routes: Mutex::new(routes),
            changed: Condvar::new(),
            running: AtomicBool::new(true),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Routes> {
        rt::lock(&self.routes)
    }

    /// Waits until the repairer's routes follow failure `generation` (or a later one) and
    /// returns them with the repairs done since the last call.
    ///
    /// [`Error::RecoveryNeeded`] when a failure interrupted the repair meanwhile (the caller
    /// tries again, as after any interrupted call), when the store was sent to global
    /// recovery, or when the repairer thread no longer runs. Bounded: every one-sided call of
    /// the repair is under the watchdog.
    pub fn await_routes(&self, generation: u64) -> Result<Followed> {
        let mut routes = self.lock();
        let interrupted = routes.interrupted;
        self.changed.notify_all();
        loop {
            if let Some(followed) = routes.followed.filter(|&g| g >= generation) {
                return Ok(Followed {
                    layout: routes.layout.clone(),
                    generation: followed,
                    repairs: std::mem::take(&mut routes.repairs),
                });
            }
            let stopped = !self.running.load(Ordering::Acquire);
            if self.parts.health.alarmed() || routes.interrupted != interrupted || stopped {
                return Err(Error::RecoveryNeeded { failed: self.newly_failed(&routes.layout) });
            }
            routes = self.wait(routes);
        }
    }

    /// The repairer's routes and the repairs done since the last call, when they already
    /// follow failure `generation` (or a later one); never waits.
    pub fn routes_if_followed(&self, generation: u64) -> Option<Followed> {
        let mut routes = self.lock();
        let followed = routes.followed.filter(|&g| g >= generation)?;
        Some(Followed {
            layout: routes.layout.clone(),
            generation: followed,
            repairs: std::mem::take(&mut routes.repairs),
        })
    }

    /// The repairs done and not yet taken.
    pub fn take_repairs(&self) -> Vec<RepairReport> {
        std::mem::take(&mut self.lock().repairs)
    }

    /// The routes as the repairer left them, and the generation they follow (for a global
    /// recovery, which starts from where the copies are).
    pub fn current_routes(&self) -> (Layout, Option<u64>) {
        let routes = self.lock();
        (routes.layout.clone(), routes.followed)
    }

    fn wait<'a>(&'a self, routes: MutexGuard<'a, Routes>) -> MutexGuard<'a, Routes> {
        rt::wait_timeout("routes", &self.changed, &self.routes, routes, self.parts.poll_interval)
    }

    /// The repairer thread's loop, the runtime of [`repair::Repairer`]: looks at the
    /// store and does what the engine answers until `stop`. Every new failure generation is
    /// followed; an interrupted repair is tried again after [`PAUSE_POLLS`] polls (time for the
    /// detector to publish the failure behind the error, as the call path waits); the
    /// [`LOCALIZED_ATTEMPTS`]-th interrupted repair in a row sends the store to global recovery.
    fn run(&self, stop: &AtomicBool) {
        let mut engine = repair::Repairer::new(LOCALIZED_ATTEMPTS);
        let mut routes = self.lock();
        let mut last_error = None;
        while !stop.load(Ordering::Acquire) {
            let health = &self.parts.health;
            let looked = Event::Looked {
                published: health.generation(),
                followed: routes.followed,
                alarmed: health.alarmed(),
            };
            let mut command = engine.next(looked);
            if let RepairCommand::Follow(generation) = command {
                let event = match self.follow(&mut routes, generation) {
                    Ok(()) => Event::Followed,
                    Err(e) => {
                        routes.interrupted += 1;
                        if !e.needs_recovery() {
                            crate::events::warn(format!("worker {}: repair: {e}", self.parts.me));
                        }
                        last_error = Some(e);
                        Event::Interrupted
                    }
                };
                self.changed.notify_all();
                command = engine.next(event);
            }
            routes = match command {
                RepairCommand::Follow(_) | RepairCommand::Wait => self.wait(routes),
                RepairCommand::Pause(polls) => self.pause(routes, polls),
                RepairCommand::Escalate => {
                    let last = last_error.as_ref().map(ToString::to_string).unwrap_or_default();
                    let why = format!("failures kept interrupting a repair (last: {last})");
                    self.escalate(&routes.layout, &why);
                    self.pause(routes, PAUSE_POLLS)
                }
            };
        }
    }

    /// Lets go of the routes for `polls` poll intervals.
    fn pause<'a>(&'a self, routes: MutexGuard<'a, Routes>, polls: u32) -> MutexGuard<'a, Routes> {
        drop(routes);
        rt::sleep(self.parts.poll_interval * polls);
        self.lock()
    }

    /// Brings `routes` up to the failures published by `generation`: fences them, moves the
    /// copies on failed workers down their chains, and copies there what this worker repairs.
    fn follow(&self, routes: &mut Routes, generation: u64) -> Result<()> {
        let started = rt::now();
        let failed = self.parts.health.failed_workers(self.parts.workers);
        let _span = tracing::info_span!("repair", worker = self.parts.me, ?failed).entered();
        let current = &routes.layout;
        self.parts.windows.fence(&failed).map_err(|e| self.failure(current, e))?;
        let (next, orphaned) = self.relocated_layout(current, &failed)?;
        let (own_keys, own_bytes) = self.repair_own_keys(current, &next)?;
        let (orphan_keys, orphan_bytes) = self.repair_orphans(current, &next, &orphaned)?;
        let moved = next.relocated != current.relocated;
        routes.layout = next;
        routes.followed = Some(generation);
        if moved {
            tracing::debug!(
                keys = own_keys + orphan_keys,
                bytes = own_bytes + orphan_bytes,
                "repaired"
            );
            routes.repairs.push(RepairReport {
                failed,
                keys_moved: own_keys + orphan_keys,
                bytes_moved: own_bytes + orphan_bytes,
                duration: rt::since(started),
            });
        }
        Ok(())
    }

    /// `current` with the copies of `failed` workers moved down their chains, if the failures
    /// can be repaired without rebuilding the windows, and the keys of failed owners whose
    /// route changes (see [`Follower::repair_orphans`]).
    fn relocated_layout(&self, current: &Layout, failed: &[i32]) -> Result<(Layout, Vec<Key>)> {
        let live: Vec<i32> = current.live.iter().copied().filter(|w| !failed.contains(w)).collect();
        if !plan::keeps_quorum(&current.live, &live, &self.parts.hosts) {
            return Err(self.escalate(current, "the survivors hold no quorum across hosts"));
        }
        let Some(next) = current.relocate(failed) else {
            return Err(self.escalate(current, "a copy has no live reserve holder left"));
        };
        let orphaned: Vec<Key> = current
            .keys()
            .filter(|&key| failed.contains(&key.owner) && next.route(key) != current.route(key))
            .collect();
        for &key in &orphaned {
            if self.first_live_holder(current, key).is_none() {
                let why = format!("key {key} lost its owner and every copy");
                return Err(self.escalate(current, &why));
            }
        }
        Ok((next, orphaned))
    }

    /// The first holder of `key` in the `current` route not known failed.
    fn first_live_holder(&self, current: &Layout, key: Key) -> Option<i32> {
        let route = current.route(key)?;
        route.iter().find(|c| !self.parts.health.is_failed(c.worker)).map(|c| c.worker)
    }

    /// Copies the newest surviving version of each `orphaned` key (its owner failed, so it
    /// cannot repair it) to its new holders in `next`, on the one rank that is the key's first
    /// live holder; returns the keys and bytes this rank moved. A key no live holder has data
    /// of was never acknowledged (an acknowledged write is on every holder): nothing to move.
    /// The copy names this rank as its writer: the new holder fenced the failed owner, and
    /// would void a version that names it.
    ///
    /// Others may write such a key meanwhile (a transaction, a handed put) on routes that
    /// already follow the failure; a new holder whose slot names a version as new as the
    /// surviving one or newer is left alone, so the older copy does not land over a newer write.
    /// (A write that lands between that check and the copy, two versions ahead, is not caught.)
    fn repair_orphans(
        &self,
        current: &Layout,
        next: &Layout,
        orphaned: &[Key],
    ) -> Result<(usize, u64)> {
        let (mut keys, mut bytes) = (0, 0);
        let mine = |key: &&Key| self.first_live_holder(current, **key) == Some(self.parts.me);
        for &key in orphaned.iter().filter(mine) {
            let (old, targets) = moved_copies(current, next, key)?;
            if let Some(mut newest) = self.newest_surviving(current, old)? {
                let targets = self.behind(current, &targets, newest.header.version)?;
                if targets.is_empty() {
                    continue;
                }
                newest.header.writer = self.parts.me;
                let newest = Committed { header: newest.header.hashed(&newest.data), ..newest };
                self.copy_to(current, &targets, &newest)?;
                keys += 1;
                bytes += newest.data.len() as u64 * targets.len() as u64;
            }
        }
        Ok((keys, bytes))
    }

    /// Copies the newest surviving version of each own key whose route changes in `next` to
    /// its new holders; returns the keys and bytes moved. A key with an acknowledged write and
    /// no surviving copy sends the store to global recovery, which reports it lost.
    fn repair_own_keys(&self, current: &Layout, next: &Layout) -> Result<(usize, u64)> {
        let (mut keys, mut bytes) = (0, 0);
        for kind in 0..self.parts.kinds {
            let key = Key::new(self.parts.me, kind as u16);
            let (old, targets) = moved_copies(current, next, key)?;
            if targets.is_empty() {
                continue;
            }
            if let Some(moved) = self.copy_between_holders(current, old, &targets)? {
                keys += 1;
                bytes += moved;
                continue;
            }
            let Some(newest) = self.newest_surviving(current, old)? else {
                if self.parts.acked.get(kind) > 0 {
                    let why = format!("no copy of the own key {key} survived");
                    return Err(self.escalate(current, &why));
                }
                continue;
            };
            self.copy_to(current, &targets, &newest)?;
            keys += 1;
            bytes += newest.data.len() as u64 * targets.len() as u64;
        }
        Ok((keys, bytes))
    }

    /// Copies an own key's newest version from the live copy of `route` that holds it straight
    /// into `targets` when all of them share this host and the version is ordered
    /// ([`halves::copy_between_holders`]): the value is neither read into this process nor
    /// hashed. The bytes moved, or `None` when the key goes the buffered way
    /// ([`Follower::newest_surviving`], [`Follower::copy_to`]).
    fn copy_between_holders(
        &self,
        current: &Layout,
        route: &[Copy],
        targets: &[Copy],
    ) -> Result<Option<u64>> {
        let (window, geometry) = (self.parts.windows.window(), self.parts.windows.geometry());
        // Targets on another host rule the copy out before any header is read.
        let on_this_host = halves::all_on_this_host(window, targets);
        if !on_this_host.map_err(|e| self.failure(current, e))? {
            return Ok(None);
        }
        let mut newest: Option<(Copy, Header)> = None;
        for copy in route.iter().filter(|c| !self.parts.health.is_failed(c.worker)) {
            self.parts.health.enter_call_on(Lane::Repairer, 3 * HEADER_LEN);
            let found = newest_unfenced_header(window, copy, geometry);
            self.parts.health.leave_call_on(Lane::Repairer);
            if let Some(header) = found.map_err(|e| self.failure(current, e))? {
                if newest.is_none_or(|(_, n)| header.version > n.version) {
                    newest = Some((*copy, header));
                }
            }
        }
        let Some((source, header)) = newest else { return Ok(None) };
        let bytes = header.len.saturating_mul(targets.len() as u64);
        self.parts.health.enter_call_on(Lane::Repairer, bytes as usize);
        let copied =
            halves::copy_between_holders(window, &source, targets, geometry, &header, true);
        self.parts.health.leave_call_on(Lane::Repairer);
        if !copied.map_err(|e| self.failure(current, e))? {
            return Ok(None);
        }
        if targets.iter().any(|c| self.parts.health.is_failed(c.worker)) {
            return Err(Error::RecoveryNeeded { failed: self.newly_failed(current) });
        }
        Ok(Some(bytes))
    }

    /// The newest complete version on the live copies of `route`, read with watchdog-bounded
    /// gets.
    fn newest_surviving(&self, current: &Layout, route: &[Copy]) -> Result<Option<Committed>> {
        let (window, geometry) = (self.parts.windows.window(), self.parts.windows.geometry());
        let mut newest: Option<Committed> = None;
        for copy in route.iter().filter(|c| !self.parts.health.is_failed(c.worker)) {
            let allowance = read_allowance(geometry.max_value);
            self.parts.health.enter_call_on(Lane::Repairer, allowance);
            let found = read_copy(window, copy, geometry);
            self.parts.health.leave_call_on(Lane::Repairer);
            let found = found.map_err(|e| self.failure(current, e))?;
            if let Some(found) = found {
                if newest.as_ref().is_none_or(|n| found.header.version > n.header.version) {
                    newest = Some(found);
                }
            }
        }
        Ok(newest)
    }

    /// The copies of `targets` whose slots name no version as new as `version`.
    fn behind(&self, current: &Layout, targets: &[Copy], version: u64) -> Result<Vec<Copy>> {
        let (window, geometry) = (self.parts.windows.window(), self.parts.windows.geometry());
        let mut behind = Vec::with_capacity(targets.len());
        for copy in targets {
            self.parts.health.enter_call_on(Lane::Repairer, 3 * HEADER_LEN);
            let found = newest_header_version(window, copy, geometry);
            self.parts.health.leave_call_on(Lane::Repairer);
            if found.map_err(|e| self.failure(current, e))? < version {
                behind.push(*copy);
            }
        }
        Ok(behind)
    }

    /// Writes a committed version (data, then header, into its half) to `targets`, with its
    /// header as it is: an own key's new holders have one writer, its owner, whose puts reach
    /// them only after the repair, so an ordered header stays ordered (an orphan's copy, which
    /// may meet a thief's write, comes here hashed).
    fn copy_to(&self, current: &Layout, targets: &[Copy], committed: &Committed) -> Result<()> {
        let windows = &self.parts.windows;
        let (window, geometry) = (windows.window(), windows.geometry());
        let (header, data) = (committed.header, &committed.data);
        let extents = halves::write_extents(window, targets, geometry, &header, data);
        extents.map_err(|e| self.failure(current, e))?;
        let bytes = halves::inline_bytes(geometry, data) * targets.len();
        self.parts.health.enter_call_on(Lane::Repairer, bytes);
        let written = windows.put_inline(targets, header, data);
        self.parts.health.leave_call_on(Lane::Repairer);
        written.map_err(|e| self.failure(current, e))?;
        if targets.iter().any(|c| self.parts.health.is_failed(c.worker)) {
            return Err(Error::RecoveryNeeded { failed: self.newly_failed(current) });
        }
        Ok(())
    }

    /// An MPI error of a repair: a process failure (its peer marked failed when the error
    /// names it) interrupts the repair, anything else is returned as it is.
    fn failure(&self, current: &Layout, e: FabricError) -> Error {
        if !(e.is_failure() || matches!(e, FabricError::Timeout { .. })) {
            return Error::Fabric(e);
        }
        if let FabricError::ProcFailed { peer: Some(rank), .. } = e {
            if let Some(&worker) = current.live.get(rank as usize) {
                self.parts.health.mark_failed(worker, crate::events::Cause::Call);
            }
        }
        Error::RecoveryNeeded { failed: self.newly_failed(current) }
    }

    fn newly_failed(&self, current: &Layout) -> Vec<i32> {
        current.live.iter().copied().filter(|&w| self.parts.health.is_failed(w)).collect()
    }

    /// Gives up on localized recovery: raises the alarm and revokes the store's communicator,
    /// so every survivor's next store call returns [`Error::RecoveryNeeded`] and
    /// [`Store::recover`](super::Store::recover) rebuilds the store globally.
    pub fn escalate(&self, current: &Layout, why: &str) -> Error {
        let FollowerParts { me, workers, ref health, ref comm, .. } = self.parts;
        send_to_global_recovery(me, health, workers, &**comm, why);
        Error::RecoveryNeeded { failed: self.newly_failed(current) }
    }
}

/// Raises the alarm and revokes the store's communicator `comm` (every survivor's detector
/// sees the revocation), after saying why worker `me` gives up on localized recovery.
pub(super) fn send_to_global_recovery<F: Fabric>(
    me: i32,
    health: &Health,
    workers: usize,
    comm: &F,
    why: &str,
) {
    crate::events::warn(format!(
        "worker {me}: failures of {:?} need global recovery: {why}",
        health.failed_workers(workers)
    ));
    health.raise_alarm();
    if let Err(e) = comm.revoke() {
        crate::events::warn(format!("revoking the store for global recovery: {e}"));
    }
}

/// The route of `key` in `current` and the copies of its route in `next` that are new.
fn moved_copies<'a>(
    current: &'a Layout,
    next: &Layout,
    key: Key,
) -> Result<(&'a [Copy], Vec<Copy>)> {
    let old = current.route(key).ok_or(Error::UnknownOwner(key.owner))?;
    let new = next.route(key).ok_or(Error::UnknownOwner(key.owner))?;
    Ok((old, new.iter().filter(|c| !old.contains(c)).copied().collect()))
}

/// The repairer thread of one [`Follower`]; stopped and joined on drop.
pub(crate) struct Repairer<F: Fabric> {
    follower: Arc<Follower<F>>,
    stop: Arc<AtomicBool>,
    thread: Option<Thread<()>>,
}

impl<F: Fabric> Repairer<F> {
    pub fn start(follower: Follower<F>) -> Result<Repairer<F>> {
        let follower = Arc::new(follower);
        let stop = Arc::new(AtomicBool::new(false));
        let (shared, flag) = (follower.clone(), stop.clone());
        let thread = rt::spawn("ftkv-repairer", move || {
            let _running = RunningFlag(&shared.running);
            shared.run(&flag);
        })
        .map_err(|e| Error::RecoveryFailed(format!("starting the repairer thread: {e}")))?;
        Ok(Repairer { follower, stop, thread: Some(thread) })
    }

    pub fn follower(&self) -> &Follower<F> {
        &self.follower
    }
}

impl<F: Fabric> Drop for Repairer<F> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.follower.changed.notify_all();
        if let Some(thread) = self.thread.take() {
            match thread.join() {
                Err(payload) if !F::is_kill(payload.as_ref()) => {
                    crate::events::warn("the repairer thread panicked")
                }
                _ => {}
            }
        }
    }
}

/// Clears the follower's running flag when the repairer thread ends, also by unwinding.
struct RunningFlag<'a>(&'a AtomicBool);

impl Drop for RunningFlag<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl<F: Fabric> Store<F> {
    /// Runs `op`, a call on `key` (`None`: on every key), on routes that follow every failure
    /// the detector published, again after a failure that interrupted it, and follows the
    /// failures noticed meanwhile before returning. A key none of whose holders failed keeps
    /// its route: the call goes ahead while the repairer moves other keys' copies
    /// ([`Store::follow_failures`]).
    pub(super) fn localized<T>(
        &mut self,
        key: Option<Key>,
        mut op: impl FnMut(&mut Self) -> Result<T>,
    ) -> Result<T> {
        let mut interruptions = Interruptions::new(LOCALIZED_ATTEMPTS);
        loop {
            let done = self.follow_failures(key).and_then(|()| op(self));
            let done = done.and_then(|value| self.follow_failures(key).map(|()| value));
            match done {
                Err(e) if e.needs_recovery() && !self.health.alarmed() => {
                    match interruptions.interrupted() {
                        // Gives the detector a few polls to publish the failure behind the error.
                        RepairCommand::Pause(polls) => rt::sleep(self.config.poll_interval * polls),
                        _ => {
                            let why =
                                format!("failures kept interrupting a store call (last: {e})");
                            return Err(self.escalate(&why));
                        }
                    }
                }
                done => return done,
            }
        }
    }

    /// Localized recovery: brings the routes up to the failures the detector published, once
    /// the repairer thread moved the copies that lived on failed workers
    /// ([`Follower::await_routes`]). A no-op (one atomic load) while nothing new failed.
    ///
    /// For a call on one `key` only (`None`: every key): while no holder on `key`'s route
    /// failed, the route stays as it is (the repairer gives a key new holders only when one of
    /// its holders failed), so the call does not wait for the repair of other keys; the routes
    /// are adopted once the repairer has them ready.
    pub(super) fn follow_failures(&mut self, key: Option<Key>) -> Result<()> {
        let generation = self.health.generation();
        if generation == self.followed {
            return Ok(());
        }
        // No repairer between a recovery that gave up and the next one: recover again.
        let Some(repairer) = self.repairer.as_ref() else {
            return Err(Error::RecoveryNeeded { failed: self.newly_failed() });
        };
        let untouched = key.is_some_and(|key| self.route_untouched(key));
        let followed = match repairer.follower().routes_if_followed(generation) {
            Some(followed) => followed,
            None if untouched => return Ok(()),
            None => repairer.follower().await_routes(generation)?,
        };
        self.routes = followed.layout;
        self.followed = followed.generation;
        self.repairs.extend(followed.repairs);
        Ok(())
    }

    /// Whether every holder on `key`'s current route is alive as far as this rank knows.
    fn route_untouched(&self, key: Key) -> bool {
        let route = self.routes.route(key);
        route.is_some_and(|route| route.iter().all(|c| !self.health.is_failed(c.worker)))
    }

    /// Gives up on localized recovery: raises the alarm and revokes the store's communicator,
    /// so every survivor's next store call returns [`Error::RecoveryNeeded`] and
    /// [`Store::recover`] rebuilds the store globally.
    fn escalate(&self, why: &str) -> Error {
        send_to_global_recovery(self.me, &self.health, self.workers, &*self.comm, why);
        Error::RecoveryNeeded { failed: self.newly_failed() }
    }

    /// The localized repairs done since the last call, oldest first ([`Recovery::Localized`]):
    /// one per change of the failed set that this worker followed.
    pub fn take_repairs(&mut self) -> Vec<RepairReport> {
        let mut repairs = std::mem::take(&mut self.repairs);
        if let Some(repairer) = &self.repairer {
            repairs.extend(repairer.follower().take_repairs());
        }
        repairs
    }

    /// Brings this worker's routes up to every failure noticed so far ([`Recovery::Localized`]):
    /// waits until the repairer thread, which moves the copies that lived on failed workers in
    /// the background, has followed them, and adopts its routes. Every put, delete and get
    /// that notices a new failure does the same first. A no-op with global recovery or when
    /// nothing new failed. [`Error::RecoveryNeeded`] when the repair escalated to global
    /// recovery or a further failure interrupted it (call again).
    ///
    /// # Example
    ///
    /// With localized recovery the survivors keep going; the copies that lived on the failed
    /// worker move to reserve holders, and `take_repairs` reports what this worker moved:
    ///
    /// ```
    /// use ftkv::fabric::{local::LocalCluster, Fabric};
    /// use ftkv::{Config, Key, Store};
    ///
    /// let cluster = LocalCluster::new(5);
    /// cluster.arm(3, "written", 1);
    /// let moved = cluster.run(|fabric| {
    ///     let config = Config::new(["checkpoint"], 2).localized();
    ///     let mut store = Store::create(&fabric, config).unwrap();
    ///     store.put(Key::new(store.worker(), 0), b"state").unwrap();
    ///     store.sync().unwrap();
    ///     fabric.failpoint("written");
    ///     for _ in 0..10_000 {
    ///         if store.failed().contains(&3) {
    ///             break;
    ///         }
    ///         std::thread::sleep(std::time::Duration::from_millis(1));
    ///     }
    ///     assert!(store.failed().contains(&3), "the failure was noticed");
    ///     store.follow().unwrap();
    ///     assert!(!store.needs_recovery(), "no global recovery");
    ///     store.take_repairs().iter().map(|r| r.keys_moved).sum::<usize>()
    /// });
    /// let moved: usize = moved.into_iter().flatten().sum();
    /// assert_eq!(moved, 2, "the two keys with a copy on worker 3 moved");
    /// ```
    pub fn follow(&mut self) -> Result<()> {
        if self.config.recovery == Recovery::Global {
            return self.ensure_healthy();
        }
        self.localized(None, |_| Ok(()))
    }
}
