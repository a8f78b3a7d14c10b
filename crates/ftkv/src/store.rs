//! The store: collective creation, the put/get/delete data path, global recovery.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::attempt::{self, Command, Event, Fault};
use crate::detector::{read_allowance, Deadline, Detector, Health, Step, StepMarker, Watch};
use crate::error::{Error, Result};
use crate::fabric::{Fabric, FabricError, FabricWindow};
use crate::fence::{read_copy, read_local_slot, Fencer};
use crate::halves;
use crate::key::{Config, Detection, Key, Recovery};
use crate::layout::{Copy, Layout};
use crate::recovery;
use crate::slot::{Committed, Header, SlotGeometry, State, FENCE_LEN, HEADER_LEN};

/// The fabric a plain `Store` runs on: MPI when built with it.
#[cfg(feature = "mpi")]
pub type DefaultFabric = ftkv_mpi::Comm;
/// The fabric a plain `Store` runs on: the in-process one when built without MPI.
#[cfg(not(feature = "mpi"))]
pub type DefaultFabric = crate::fabric::local::LocalFabric;

/// What [`Store::recover`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Workers that failed since the previous recovery (stable ids).
    pub failed: Vec<i32>,
    /// Keys whose newest surviving version was copied to their new holders.
    pub keys_recovered: usize,
    /// Keys of which no copy survived (never written, or lost to too many failures).
    pub keys_lost: Vec<Key>,
    /// Recovery attempts (more than 1 when a failure interrupted recovery).
    pub attempts: usize,
    pub duration: Duration,
}

/// What one localized repair did on this worker (see [`Recovery::Localized`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairReport {
    /// Every worker known failed when the routes were brought up to date (stable ids).
    pub failed: Vec<i32>,
    /// Keys whose copies this worker moved to reserve holders (its own keys, and keys of failed
    /// owners whose first live holder it is), and the bytes it copied there (the newest
    /// surviving version of each).
    pub keys_moved: usize,
    pub bytes_moved: u64,
    /// From the repairer thread taking up the failure to every moved copy written.
    pub duration: Duration,
}

/// Attempts of one localized write or read before a failure that keeps interrupting it sends
/// the store to global recovery.
const LOCALIZED_ATTEMPTS: usize = 8;

mod asynchronous;
mod follow;
mod transactions;

pub use asynchronous::PendingPut;

/// A window of an earlier epoch, kept until a recovery commits.
struct Retained<W> {
    fencer: Arc<Fencer<W>>,
    layout: Layout,
}

impl<W: FabricWindow> Retained<W> {
    /// The window itself, once nothing else holds it (the detector thread is stopped).
    fn into_window(self) -> Option<W> {
        let window = self.fencer.into_window();
        if window.is_none() {
            crate::events::warn("a retained window is still shared; it stays allocated");
        }
        window
    }

    fn close(self) -> Result<()> {
        match self.into_window() {
            Some(window) => Ok(window.close()?),
            None => Ok(()),
        }
    }

    fn abandon(self) {
        if let Some(window) = self.into_window() {
            window.abandon();
        }
    }
}

/// A resilient, replicated key-value store over the members of a communicator.
///
/// Keys are `(owner, kind)`; the owner is a worker's rank in the communicator the store was
/// created on (stable across shrinking). Each key has `copies` holders, none the owner. Calls are
/// made by one thread at a time (`&mut self`); the detector thread runs beside it.
///
/// The fabric `F` is MPI (`ftkv_mpi::Comm`, the default with the `mpi` feature) in production
/// and [`LocalFabric`](crate::fabric::local::LocalFabric) in protocol tests (the default
/// without MPI).
pub struct Store<F: Fabric = DefaultFabric> {
    config: Config,
    geometry: SlotGeometry,
    me: i32,
    workers: usize,
    /// The host id of every worker, by worker id (learned at creation).
    hosts: Vec<u32>,
    origin: F,
    comm: Arc<F>,
    /// The current window, with the fencing of failed writers out of this rank's slots.
    window: Option<Arc<Fencer<F::Window>>>,
    layout: Layout,
    epoch: u64,
    versions: Vec<u64>,
    /// The last acknowledged version of each own key (0: none yet), shared with the repairer.
    acked: Arc<follow::Acked>,
    handed: HashMap<Key, u64>,
    health: Arc<Health>,
    detector: Option<Detector>,
    /// The detector's communicator, on which its thread answers pings.
    watch_comm: Option<Arc<F>>,
    lost: Vec<Key>,
    recovered_failed: Vec<i32>,
    /// A failure noticed while the last recovery committed: the alarm stays raised after it.
    pending_alarm: bool,
    /// The detector's failure generation the current routes follow ([`Recovery::Localized`]).
    followed: u64,
    /// Localized repairs not yet taken by [`Store::take_repairs`].
    repairs: Vec<RepairReport>,
    /// Transactions this worker started (the next one's sequence number − 1).
    transactions: u32,
    /// This worker's transaction whose call failed before it knew the outcome (its record
    /// decides it; [`Store::finish_transactions`] finishes it).
    open_transaction: Option<crate::txn::TxId>,
    /// Failed coordinators whose open transaction this worker resolved as their backup.
    resolved_coordinators: Vec<i32>,
    /// Halves of keys this worker last wrote through an extent.
    spills: halves::Spills,
    /// The thread that writes the other copies of [`Store::put_async`]s (started by the first).
    replicator: Option<asynchronous::Replicator<F::Window>>,
    /// The thread that repairs copies after failures ([`Recovery::Localized`] only).
    repairer: Option<follow::Repairer<F>>,
}

impl<F: Fabric> Store<F> {
    /// Creates the store collectively on every member of `comm`.
    ///
    /// Every rank must pass an equal `config`; a rank whose config is invalid gets
    /// [`Error::InvalidConfig`] (or [`Error::WindowTooLarge`] when its window would not fit
    /// this host's shared memory, checked before anything is allocated), and every other rank
    /// gets [`Error::ConfigMismatch`], also when configs differ (no rank hangs). A rank that
    /// cannot tell its host ([`Fabric::host_id`] fails) gets that error, the others
    /// [`Error::ConfigMismatch`]. A dead member makes creation fail with an MPI failure error.
    ///
    /// Every member learns every member's host id here, once: placement spreads each key's
    /// copies over hosts other than its owner's, now and after every recovery.
    ///
    /// # Example
    ///
    /// Three ranks (threads of the in-process fabric here; `ftkv_mpi::Comm` under `mpirun`)
    /// create a store whose keys each have 2 copies:
    ///
    /// ```
    /// use ftkv::fabric::local::LocalCluster;
    /// use ftkv::{Config, Store};
    ///
    /// let workers = LocalCluster::new(3).run(|fabric| {
    ///     let store = Store::create(&fabric, Config::new(["checkpoint"], 2)).unwrap();
    ///     store.workers()
    /// });
    /// assert_eq!(workers, vec![Some(3); 3]);
    /// ```
    pub fn create(comm: &F, config: Config) -> Result<Store<F>> {
        let workers = comm.size() as usize;
        let geometry = SlotGeometry::new(config.initial_capacity).limited(config.max_value);
        let live: Vec<i32> = (0..comm.size()).collect();
        let me = comm.rank();
        let host = comm.host_id();
        // A rank that cannot tell its host still joins the allgather, and then says no.
        let hosts = gather_hosts(comm, host.as_ref().copied().unwrap_or(0))?;
        let valid = host
            .map_err(Error::from)
            .and_then(|_| config.validate(workers))
            .map(|()| Layout::with_spares(&live, &hosts, config.shape(), geometry, me));
        let valid = valid.and_then(|layout| {
            let on_my_host = hosts.iter().filter(|&&h| h == hosts[me as usize]).count();
            check_window_memory(comm, layout.window_len, on_my_host).map(|()| layout)
        });
        agree_on_config(comm, &config, valid.is_ok())?;
        let layout = valid?;
        let origin = comm.dup()?;
        let store_comm = Arc::new(comm.dup()?);
        let window = open_window(store_comm.as_ref(), &layout, geometry)?;
        let window = Arc::new(Fencer::new(Arc::new(window), &layout.local, geometry));
        let health = Arc::new(Health::new(workers, config.recovery == Recovery::Global));
        let mut store = Store::<F> {
            versions: vec![0; config.kinds.len()],
            acked: Arc::new(follow::Acked::new(config.kinds.len())),
            config,
            geometry,
            me,
            workers,
            hosts,
            origin,
            comm: store_comm,
            window: Some(window),
            layout,
            epoch: 0,
            handed: HashMap::new(),
            health,
            detector: None,
            watch_comm: None,
            lost: Vec::new(),
            recovered_failed: Vec::new(),
            pending_alarm: false,
            followed: 0,
            repairs: Vec::new(),
            transactions: 0,
            open_transaction: None,
            resolved_coordinators: Vec::new(),
            spills: halves::Spills::default(),
            replicator: None,
            repairer: None,
        };
        store.start_detector()?;
        Ok(store)
    }

    /// This worker's stable id.
    pub fn worker(&self) -> i32 {
        self.me
    }

    /// A new communicator of the live workers, in the store's rank order (rank `r` is worker
    /// `live()[r]`), for the application's own messages. Collective over the live workers; a
    /// failure makes it fail, and after [`Store::recover`] the application takes a new one.
    pub fn communicator(&self) -> Result<F> {
        self.ensure_healthy()?;
        self.comm.dup().map_err(|e| self.failure(e))
    }

    /// How many workers the store was created with (owners are `0..workers()`).
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// A counter that changes whenever the detector adds to [`Store::failed`] (one atomic
    /// load): for a caller that polls for failures in its hot loop. A recovery may restart it.
    pub fn failures_noticed(&self) -> u64 {
        self.health.generation()
    }

    /// Every worker this rank knows failed (stable ids): those the last recovery left out and
    /// those its detector noticed since.
    pub fn failed(&self) -> Vec<i32> {
        let gone = (0..self.workers as i32).filter(|w| !self.layout.live.contains(w));
        let mut failed: Vec<i32> = gone.chain(self.health.failed_workers(self.workers)).collect();
        failed.sort_unstable();
        failed.dedup();
        failed
    }

    /// The workers of the store's current windows (stable ids): the live ones of the last
    /// recovery; with [`Recovery::Localized`], workers that failed since stay in it until a
    /// global recovery (see [`Store::failed`]).
    pub fn live(&self) -> &[i32] {
        &self.layout.live
    }

    /// The host id of every worker (index: worker id, dead ones included), as
    /// [`Fabric::host_id`] told at creation.
    pub fn hosts(&self) -> &[u32] {
        &self.hosts
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The key of this worker's kind `name`.
    pub fn own_key(&self, name: &str) -> Result<Key> {
        Ok(Key::new(self.me, self.config.kind(name)?))
    }

    /// Writes `value` under this worker's own `key` and returns when every holder has it.
    ///
    /// Completion: `Ok` means the new version is flushed to every copy's holder (all of them
    /// live, as far as this rank knows when the flush returned). Failure: input errors change
    /// nothing; [`Error::RecoveryNeeded`] means a process failed: the new version may be on some
    /// holders, all, or none, and the previous version is intact on every live holder; after
    /// [`Store::recover`] a get returns one of the two.
    ///
    /// A key that a recovery reported lost (every holder died) is restored by its owner's next
    /// acknowledged put or delete: the write goes to the key's new holders, and from then on
    /// gets return it again.
    ///
    /// # Example
    ///
    /// ```
    /// use ftkv::fabric::local::LocalCluster;
    /// use ftkv::{Config, Key, Store};
    ///
    /// LocalCluster::new(3).run(|fabric| {
    ///     let mut store = Store::create(&fabric, Config::new(["checkpoint"], 2)).unwrap();
    ///     let mine = store.own_key("checkpoint").unwrap();
    ///     store.put(mine, b"state 1").unwrap(); // both copies hold it now
    ///     assert!(store.put(Key::new((mine.owner + 1) % 3, 0), b"x").is_err(), "not ours");
    /// });
    /// ```
    pub fn put(&mut self, key: Key, value: &[u8]) -> Result<()> {
        self.check_own(key)?;
        self.check_value(value)?;
        let version = self.next_own_version(key);
        self.write(key, Header::for_value(value, version, self.epoch, self.me), value)?;
        self.acked.set(key.kind as usize, version);
        Ok(())
    }

    /// Deletes this worker's own `key`; same completion and failure semantics as [`Store::put`].
    ///
    /// # Example
    ///
    /// ```
    /// use ftkv::fabric::local::LocalCluster;
    /// use ftkv::{Config, Store};
    ///
    /// LocalCluster::new(3).run(|fabric| {
    ///     let mut store = Store::create(&fabric, Config::new(["loot"], 2)).unwrap();
    ///     let mine = store.own_key("loot").unwrap();
    ///     store.put(mine, b"tasks").unwrap();
    ///     store.delete(mine).unwrap();
    ///     assert_eq!(store.get(mine).unwrap(), None);
    /// });
    /// ```
    pub fn delete(&mut self, key: Key) -> Result<()> {
        self.check_own(key)?;
        let version = self.next_own_version(key);
        self.write(key, Header::for_delete(version, self.epoch, self.me), &[])?;
        self.acked.set(key.kind as usize, version);
        Ok(())
    }

    /// Writes a key owned by another worker that the application handed to this one (a thief
    /// writing its victim's data). The application guarantees a single writer per key at a time;
    /// the first handed write reads the key's current version from its holders. Like
    /// [`Store::put`], it restores a key reported lost.
    ///
    /// # Example
    ///
    /// Worker 1 writes worker 0's key after worker 0 handed it over (one writer at a time):
    ///
    /// ```
    /// use ftkv::fabric::local::LocalCluster;
    /// use ftkv::{Config, Key, Store};
    ///
    /// LocalCluster::new(3).run(|fabric| {
    ///     let mut store = Store::create(&fabric, Config::new(["loot"], 2)).unwrap();
    ///     let key = Key::new(0, 0);
    ///     if store.worker() == 1 {
    ///         store.put_handed(key, b"taken over").unwrap();
    ///         assert_eq!(store.get(key).unwrap().as_deref(), Some(&b"taken over"[..]));
    ///         store.delete_handed(key).unwrap();
    ///         assert_eq!(store.get(key).unwrap(), None);
    ///     }
    /// });
    /// ```
    pub fn put_handed(&mut self, key: Key, value: &[u8]) -> Result<()> {
        self.check_key(key)?;
        self.check_value(value)?;
        let version = self.next_handed_version(key)?;
        self.write(key, Header::for_value(value, version, self.epoch, self.me), value)
    }

    /// Deletes a handed key (see [`Store::put_handed`]).
    pub fn delete_handed(&mut self, key: Key) -> Result<()> {
        self.check_key(key)?;
        let version = self.next_handed_version(key)?;
        self.write(key, Header::for_delete(version, self.epoch, self.me), &[])
    }

    /// The newest committed value of `key` on any live holder, `None` if it was deleted or never
    /// written. Reads with one-sided gets (the holders are not interrupted); used in recovery.
    /// [`Error::KeyLost`] if no copy survived the last recovery and nobody wrote it since.
    ///
    /// # Example
    ///
    /// Every worker reads every other worker's key once all wrote (a barrier in between):
    ///
    /// ```
    /// use ftkv::fabric::local::LocalCluster;
    /// use ftkv::{Config, Key, Store};
    ///
    /// LocalCluster::new(3).run(|fabric| {
    ///     let mut store = Store::create(&fabric, Config::new(["checkpoint"], 2)).unwrap();
    ///     let me = store.worker();
    ///     store.put(Key::new(me, 0), format!("from {me}").as_bytes()).unwrap();
    ///     store.sync().unwrap();
    ///     for owner in 0..3 {
    ///         let value = store.get(Key::new(owner, 0)).unwrap();
    ///         assert_eq!(value, Some(format!("from {owner}").into_bytes()));
    ///     }
    /// });
    /// ```
    pub fn get(&mut self, key: Key) -> Result<Option<Vec<u8>>> {
        Ok(self.read_versioned(key)?.1)
    }

    /// The newest version of `key` (0: never written) and its value (`None`: deleted or never
    /// written).
    fn read_versioned(&mut self, key: Key) -> Result<(u64, Option<Vec<u8>>)> {
        Ok(match self.read_newest(key)? {
            None => (0, None),
            Some(c) => (c.header.version, (c.header.state == State::Value).then_some(c.data)),
        })
    }

    /// What each live holder of `key` has: its newest complete version (`None` for a deletion
    /// or nothing). For verification: every entry equals the last acknowledged write.
    pub fn read_copies(&mut self, key: Key) -> Result<Vec<(i32, Option<Vec<u8>>)>> {
        let copies = self.read_live_copies(key)?;
        let value = |c: Committed| (c.header.state == State::Value).then_some(c.data);
        Ok(copies.into_iter().map(|(worker, found)| (worker, found.and_then(value))).collect())
    }

    fn check_key(&self, key: Key) -> Result<()> {
        if key.kind as usize >= self.config.kinds.len() {
            return Err(Error::UnknownKindIndex(key.kind));
        }
        if key.owner < 0 || key.owner as usize >= self.workers {
            return Err(Error::UnknownOwner(key.owner));
        }
        Ok(())
    }

    fn check_own(&self, key: Key) -> Result<()> {
        self.check_key(key)?;
        if key.owner != self.me {
            return Err(Error::ForeignOwner { key, me: self.me });
        }
        Ok(())
    }

    fn check_value(&self, value: &[u8]) -> Result<()> {
        if value.len() > self.config.max_value {
            return Err(Error::ValueTooLarge { len: value.len(), max: self.config.max_value });
        }
        Ok(())
    }

    /// Versions always advance, also past an attempt that failed, so two different values
    /// never carry the same version.
    fn next_own_version(&mut self, key: Key) -> u64 {
        let v = &mut self.versions[key.kind as usize];
        *v += 1;
        *v
    }

    fn next_handed_version(&mut self, key: Key) -> Result<u64> {
        let current = match self.handed.get(&key) {
            Some(&v) => v,
            None => match self.read_newest(key) {
                Ok(newest) => newest.map_or(0, |c| c.header.version),
                Err(Error::KeyLost(_)) => 0,
                Err(e) => return Err(e),
            },
        };
        self.handed.insert(key, current + 1);
        Ok(current + 1)
    }

    fn ensure_healthy(&self) -> Result<()> {
        if self.window.is_none() {
            return Err(Error::Closed);
        }
        if self.health.alarmed() {
            return Err(Error::RecoveryNeeded { failed: self.newly_failed() });
        }
        Ok(())
    }

    fn newly_failed(&self) -> Vec<i32> {
        let live = &self.layout.live;
        live.iter().copied().filter(|&w| self.health.is_failed(w)).collect()
    }

    /// [`Error::RecoveryNeeded`] when a holder of `route` is known failed; with global
    /// recovery it also raises the alarm (with localized recovery the caller follows the
    /// failure and tries again).
    fn ensure_alive(&self, route: &[Copy]) -> Result<()> {
        if route.iter().any(|c| self.health.is_failed(c.worker)) {
            if self.config.recovery == Recovery::Global {
                self.health.raise_alarm();
            }
            return Err(Error::RecoveryNeeded { failed: self.newly_failed() });
        }
        Ok(())
    }

    /// Where the copies of `key` live in this epoch (also of a key reported lost: a write
    /// restores it there).
    fn route(&self, key: Key) -> Result<&[Copy]> {
        self.layout.route(key).ok_or(Error::UnknownOwner(key.owner))
    }

    /// Writes `key` and, once the write is acknowledged, no longer reports it lost.
    fn write(&mut self, key: Key, header: Header, data: &[u8]) -> Result<()> {
        self.write_copies(key, header, data)?;
        if !self.lost.is_empty() {
            self.lost.retain(|&k| k != key);
        }
        Ok(())
    }

    /// Writes one version to every current holder. With localized recovery, a holder failing
    /// during the write moves its copy down its chain and the write goes again to the new
    /// routes (the same version, so a copy that already has it is only rewritten); returns once
    /// the routes follow every failure known here.
    fn write_copies(&mut self, key: Key, header: Header, data: &[u8]) -> Result<()> {
        if self.config.recovery == Recovery::Global {
            return self.write_once(key, header, data);
        }
        self.localized(|store| store.write_once(key, header, data))
    }

    /// Runs `op` on routes that follow every failure the detector published, again after a
    /// failure that interrupted it, and follows the failures noticed meanwhile before returning.
    fn localized<T>(&mut self, mut op: impl FnMut(&mut Self) -> Result<T>) -> Result<T> {
        let mut last = None;
        for _ in 0..LOCALIZED_ATTEMPTS {
            let done = self.follow_failures().and_then(|()| op(self));
            let done = done.and_then(|value| self.follow_failures().map(|()| value));
            match done {
                Err(e) if e.needs_recovery() && !self.health.alarmed() => {
                    last = Some(e);
                    // Gives the detector a few polls to publish the failure behind the error.
                    std::thread::sleep(self.config.poll_interval * 4);
                }
                done => return done,
            }
        }
        let last = last.map(|e| e.to_string()).unwrap_or_default();
        Err(self.escalate(&format!("failures kept interrupting a store call (last: {last})")))
    }

    /// The fast path: header and data to the version's half on every holder, one flush per
    /// holder, failure knowledge checked before and after.
    fn write_once(&mut self, key: Key, header: Header, data: &[u8]) -> Result<()> {
        self.ensure_healthy()?;
        self.ensure_not_suspended();
        let route = self.route(key)?;
        self.ensure_alive(route)?;
        if self.config.detection == Detection::Ping {
            self.ping_all(route)?;
        }
        let free_stale = self.spills.stale(key, header.version, data.len(), self.geometry);
        self.put_to(route, header, data, free_stale)?;
        self.ensure_alive(route)?;
        self.spills.written(key, header.version, data.len(), self.geometry);
        Ok(())
    }

    /// Header and data of one version to the version's half on each of `targets`, complete at
    /// every target when it returns. `free_stale`: the half's extent held an earlier, larger
    /// value that an inline one now replaces.
    fn put_to(&self, route: &[Copy], header: Header, data: &[u8], free_stale: bool) -> Result<()> {
        let encoded = header.encode();
        let (version, geometry) = (header.version, self.geometry);
        let window = self.window.as_ref().ok_or(Error::Closed)?.window();
        let comm = &self.comm;
        let extents = halves::write_extents(window, route, geometry, version, data);
        extents.map_err(|e| self.failure(e))?;
        self.health.enter_call(halves::inline_bytes(geometry, data) * route.len());
        comm.stall_point("put_stall");
        let issued = window.scope(|s| {
            for copy in route {
                halves::issue_data(s, copy, geometry, version, data, free_stale)?;
                comm.failpoint("put_before_header");
                halves::issue_header(s, copy, geometry, version, &encoded)?;
                comm.failpoint("put_between_copies");
            }
            Ok(())
        });
        self.health.leave_call();
        issued.map_err(|e| self.failure(e))
    }

    /// Localized recovery: brings the routes up to the failures the detector published, once
    /// the repairer thread moved the copies that lived on failed workers ([`follow`]). A no-op
    /// (one atomic load) while nothing new failed.
    fn follow_failures(&mut self) -> Result<()> {
        let generation = self.health.generation();
        if generation == self.followed {
            return Ok(());
        }
        // No repairer between a recovery that gave up and the next one: recover again.
        let Some(repairer) = self.repairer.as_ref() else {
            return Err(Error::RecoveryNeeded { failed: self.newly_failed() });
        };
        let followed = repairer.follower().await_routes(generation)?;
        self.layout = followed.layout;
        self.followed = followed.generation;
        self.repairs.extend(followed.repairs);
        Ok(())
    }

    /// Each copy of `route` not known failed: its holder and newest complete version, read
    /// with watchdog-bounded gets.
    fn read_live(&self, route: &[Copy]) -> Result<Vec<(i32, Option<Committed>)>> {
        let window = self.window.as_ref().ok_or(Error::Closed)?.window();
        let mut copies = Vec::with_capacity(route.len());
        for copy in route.iter().filter(|c| !self.health.is_failed(c.worker)) {
            self.health.enter_call(read_allowance(self.geometry.max_value));
            let found = read_copy(window, copy, self.geometry);
            self.health.leave_call();
            copies.push((copy.worker, found.map_err(|e| self.failure(e))?));
        }
        Ok(copies)
    }

    /// Ends this process when its clock thread has not ticked for more than half the
    /// suspicion bound ([`crate::detector`]): it may have been declared failed, and its writes
    /// must stop here. The write in flight when it stopped is the only one that can land late
    /// (and the holders' fences void it).
    fn ensure_not_suspended(&self) {
        let gap = self.health.since_last_tick();
        crate::detector::end_if_stopped(self.comm.as_ref(), gap, self.config.suspicion);
    }

    /// Gives up on localized recovery: raises the alarm and revokes the store's communicator,
    /// so every survivor's next store call returns [`Error::RecoveryNeeded`] and
    /// [`Store::recover`] rebuilds the store globally.
    fn escalate(&self, why: &str) -> Error {
        follow::send_to_global_recovery(self.me, &self.health, self.workers, &*self.comm, why);
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
        self.localized(|_| Ok(()))
    }

    fn ping_all(&self, route: &[Copy]) -> Result<()> {
        let comm = self.watch_comm.as_ref().ok_or(Error::Closed)?;
        for copy in route {
            let ping = comm.ping(copy.rank, self.config.watchdog);
            if let Err(e) = ping {
                self.health.mark_failed(copy.worker);
                return Err(self.failure(e));
            }
        }
        Ok(())
    }

    /// Classifies an MPI error of a store call. Besides ULFM's own failure classes, Open MPI's
    /// collectives can return `MPI_ERR_OTHER` on members that meet a failure indirectly; with
    /// global recovery any error while the communicator is revoked or has failed members counts
    /// as a failure.
    fn failure(&self, e: FabricError) -> Error {
        let direct = e.is_failure() || matches!(e, FabricError::Timeout { .. });
        // With localized recovery the communicator keeps its failed members: their presence
        // says nothing about this error.
        let caused_by_failure = direct
            || (self.config.recovery == Recovery::Global
                && (self.comm.is_revoked().unwrap_or(true)
                    || self.comm.failed_ranks().map_or(true, |f| !f.is_empty())));
        if caused_by_failure {
            // The window's errors name a peer only when it is exact (`HostWindow`); other
            // failures are left to the detector, which publishes ULFM's failed set.
            if let FabricError::ProcFailed { peer: Some(rank), .. } = e {
                if let Some(&worker) = self.layout.live.get(rank as usize) {
                    self.health.mark_failed(worker);
                }
            }
            if self.config.recovery == Recovery::Global {
                self.health.raise_alarm();
            }
            return Error::RecoveryNeeded { failed: self.newly_failed() };
        }
        Error::Fabric(e)
    }

    fn read_newest(&mut self, key: Key) -> Result<Option<Committed>> {
        let copies = self.read_live_copies(key)?;
        let newest = copies.into_iter().filter_map(|(_, found)| found);
        Ok(newest.max_by_key(|c| c.header.version))
    }

    /// Each live holder's newest complete version of `key`, read with watchdog-bounded gets.
    /// [`Error::KeyLost`] for a key the last recovery reported lost that nobody wrote since.
    fn read_live_copies(&mut self, key: Key) -> Result<Vec<(i32, Option<Committed>)>> {
        let copies = self.read_holders(key)?;
        let rewritten = copies.iter().any(|(_, found)| found.is_some());
        if !rewritten && self.lost.contains(&key) {
            return Err(Error::KeyLost(key));
        }
        Ok(copies)
    }

    fn read_holders(&mut self, key: Key) -> Result<Vec<(i32, Option<Committed>)>> {
        if self.config.recovery == Recovery::Global {
            return self.read_holders_once(key);
        }
        self.localized(|store| store.read_holders_once(key))
    }

    fn read_holders_once(&self, key: Key) -> Result<Vec<(i32, Option<Committed>)>> {
        self.ensure_healthy()?;
        let route = self.route(key)?;
        let copies = self.read_live(route)?;
        self.ensure_alive(route)?;
        Ok(copies)
    }

    fn start_detector(&mut self) -> Result<()> {
        let comm = Arc::new(self.comm.dup()?);
        self.watch_comm = Some(comm.clone());
        let live_hosts: Vec<u32> =
            self.layout.live.iter().map(|&w| self.hosts[w as usize]).collect();
        let fencer = self.window.clone().ok_or(Error::Closed)?;
        if self.config.recovery == Recovery::Localized {
            self.start_repairer()?;
        }
        self.detector = Some(Detector::start(Watch {
            comm,
            store_comm: self.comm.clone(),
            live: self.layout.live.clone(),
            health: self.health.clone(),
            poll_interval: self.config.poll_interval,
            watchdog: self.config.effective_watchdog(&live_hosts),
            suspicion: self.config.suspicion,
            answer_pings: self.config.detection == Detection::Ping,
            fence: Box::new(move |failed: &[i32]| fencer.fence(failed)),
        }));
        Ok(())
    }

    /// Starts the repairer thread of localized recovery on the current windows and routes.
    fn start_repairer(&mut self) -> Result<()> {
        let parts = follow::FollowerParts {
            me: self.me,
            workers: self.workers,
            hosts: self.hosts.clone(),
            kinds: self.config.kinds.len(),
            geometry: self.geometry,
            poll_interval: self.config.poll_interval,
            health: self.health.clone(),
            comm: self.comm.clone(),
            window: self.window.clone().ok_or(Error::Closed)?,
            acked: self.acked.clone(),
        };
        let follower = follow::Follower::new(parts, self.layout.clone());
        self.repairer = Some(follow::Repairer::start(follower)?);
        Ok(())
    }

    /// Stops the repairer thread, adopting the routes it left: the copies are where they say.
    fn stop_repairer(&mut self) {
        let Some(repairer) = self.repairer.take() else {
            return;
        };
        let follower = repairer.follower();
        let (layout, followed) = follower.current_routes();
        self.repairs.extend(follower.take_repairs());
        drop(repairer);
        if let Some(generation) = followed {
            self.layout = layout;
            self.followed = generation;
        }
    }

    /// A barrier over the live workers. [`Error::RecoveryNeeded`] if a failure interrupts it or
    /// was noticed before; then every survivor must [`Store::recover`].
    ///
    /// The outcome is not uniform: a failure during the barrier can end it with `Ok` on some
    /// survivors and an error on others (ULFM reports failures per process). Those that got `Ok`
    /// learn of the failure at a later store call; an application that counts rounds of
    /// barriers must agree on its round after a recovery (or use `MPIX_Comm_agree` itself).
    ///
    /// # Example
    ///
    /// ```
    /// use ftkv::fabric::local::LocalCluster;
    /// use ftkv::{Config, Store};
    ///
    /// LocalCluster::new(3).run(|fabric| {
    ///     let mut store = Store::create(&fabric, Config::new(["checkpoint"], 2)).unwrap();
    ///     store.sync().unwrap(); // every live worker got here
    /// });
    /// ```
    pub fn sync(&mut self) -> Result<()> {
        self.ensure_healthy()?;
        self.comm.barrier().map_err(|e| self.failure(e))
    }

    /// Revokes the store's communicator: every member's pending and future collective store
    /// calls ([`Store::sync`], [`Store::communicator`]) fail with [`Error::RecoveryNeeded`], and
    /// their detectors raise the alarm. For an application that must bring every member to
    /// [`Store::recover`] before it calls it itself.
    pub fn interrupt(&self) -> Result<()> {
        self.health.raise_alarm();
        Ok(self.comm.revoke()?)
    }

    /// Whether a failure (or another rank's recovery) was noticed since the last recovery.
    pub fn needs_recovery(&self) -> bool {
        self.health.alarmed()
    }

    /// Collective over the survivors: revokes the communicator, shrinks it, builds new windows
    /// on the survivors, recomputes placement and copies the newest surviving version of every
    /// key to its new holders, restoring the copy count (as far as enough ranks live).
    ///
    /// A failure during recovery restarts it. With `copies = c`, up to `c − 1` failures between
    /// two recoveries lose no acknowledged write. Every survivor must call it once it saw
    /// [`Error::RecoveryNeeded`] (or [`Store::needs_recovery`]); a rank that does not, hangs the
    /// others' recovery until it does.
    ///
    /// # Example
    ///
    /// Worker 2 dies after its put was acknowledged; the survivors notice, recover, and read
    /// its last value back:
    ///
    /// ```
    /// use ftkv::fabric::{local::LocalCluster, Fabric};
    /// use ftkv::{Config, Key, Store};
    ///
    /// let cluster = LocalCluster::new(4);
    /// cluster.arm(2, "after_put", 1); // worker 2 dies at this named point
    /// let outcomes = cluster.run(|fabric| {
    ///     let mut store = Store::create(&fabric, Config::new(["checkpoint"], 2)).unwrap();
    ///     let me = store.worker();
    ///     store.put(Key::new(me, 0), format!("last of {me}").as_bytes()).unwrap();
    ///     store.sync().unwrap(); // every put is complete before worker 2 dies
    ///     fabric.failpoint("after_put");
    ///     // The detector notices within milliseconds; 10 s bound the wait.
    ///     for _ in 0..10_000 {
    ///         if store.needs_recovery() {
    ///             break;
    ///         }
    ///         std::thread::sleep(std::time::Duration::from_millis(1));
    ///     }
    ///     assert!(store.needs_recovery(), "the failure was noticed");
    ///     let report = store.recover().unwrap();
    ///     assert_eq!(report.failed, vec![2]);
    ///     assert_eq!(store.failed(), vec![2]);
    ///     store.get(Key::new(2, 0)).unwrap()
    /// });
    /// assert!(outcomes[2].is_none(), "worker 2 died");
    /// assert_eq!(outcomes[0], Some(Some(b"last of 2".to_vec())));
    /// ```
    pub fn recover(&mut self) -> Result<RecoveryReport> {
        let started = Instant::now();
        self.stop_repairer();
        self.detector = None;
        let retained = match self.window.take() {
            Some(fencer) => Retained { fencer, layout: self.layout.clone() },
            None => return Err(Error::Closed),
        };
        let mut machine = attempt::Machine::new(attempt::Inputs {
            me: self.me,
            hosts: self.hosts.clone(),
            kinds: self.config.kinds.len(),
            copies: self.config.copies,
            spares: self.config.spares,
            geometry: self.geometry,
            previous: retained.layout.clone(),
            acked: self.acked.snapshot(),
        });
        let step = Arc::new(StepMarker::default());
        let mut run = AttemptRun {
            step,
            deadline: None,
            window: None,
            held: HashMap::new(),
            agreement_error: None,
        };
        let mut command = machine.start();
        loop {
            let event = match command {
                Command::Commit(committed) => {
                    return self.commit(committed, retained, run, started)
                }
                Command::Fail(failed) => return Err(self.give_up(failed, retained, run)),
                command => match self.execute(command, &retained, &mut run) {
                    Ok(event) => event,
                    Err(e) => {
                        // Freeing a window is collective: nobody may wait in it now.
                        if let Some(window) = run.window.take() {
                            window.abandon();
                        }
                        drop(run);
                        retained.abandon();
                        return Err(e);
                    }
                },
            };
            command = machine.on(event);
        }
    }

    /// Executes one recovery command on the fabric and reports what happened. Errors returned
    /// here end the recovery at once (a revoke or shrink that failed for another reason than a
    /// process failure).
    fn execute(
        &mut self,
        command: Command,
        retained: &Retained<F::Window>,
        run: &mut AttemptRun<F>,
    ) -> Result<Event> {
        let step = run.step.clone();
        Ok(match command {
            Command::Revoke { attempt } => {
                if attempt > 1 {
                    let me = self.me;
                    crate::events::warn(format!(
                        "worker {me}: recovery attempt {} met a failure, retrying",
                        attempt - 1
                    ));
                }
                run.step = Arc::new(StepMarker::default());
                // Another survivor may be copying a value as large as the largest a put takes.
                run.step.moves(read_allowance(self.config.max_value));
                run.deadline = None;
                let watchdog = self.config.recovery_watchdog;
                run.deadline = Some(Deadline::start(self.comm.clone(), watchdog, run.step.clone()));
                run.step.set(Step::Revoke);
                self.comm.revoke().map_err(Error::Fabric)?;
                self.trace("revoked");
                Event::Revoked
            }
            Command::Shrink => {
                step.set(Step::Shrink);
                self.comm.stall_point("recovery_stall_shrink");
                match self.comm.shrink() {
                    Ok(shrunk) => {
                        let shrunk = Arc::new(shrunk);
                        self.comm = shrunk.clone();
                        let live = self.live_ids(&shrunk)?;
                        self.trace(&format!("shrunk to {live:?}"));
                        Event::Shrunk(Ok(live))
                    }
                    Err(e) if e.is_failure() => Event::Shrunk(Err(Fault::Failure)),
                    Err(e) => return Err(Error::Fabric(e)),
                }
            }
            Command::OpenWindow { layout } => {
                self.layout = layout;
                self.epoch += 1;
                self.comm.failpoint("recovery_after_shrink");
                step.set(Step::OpenWindow);
                match open_window(&*self.comm, &self.layout, self.geometry) {
                    Ok(window) => {
                        run.window = Some(window);
                        self.trace("window open");
                        let scanned = scan_local(retained, &self.layout.live, self.geometry);
                        let scanned = scanned.map(|held| {
                            // Read once, copied out once, perhaps to several holders.
                            let bytes: usize = held.values().map(|c| c.data.len()).sum();
                            step.moves(bytes * (1 + self.config.copies));
                            let versions = held.iter().map(|(k, c)| (*k, c.header.version));
                            let versions = versions.collect();
                            run.held = held;
                            versions
                        });
                        Event::WindowOpened(Ok(scanned.map_err(fault)))
                    }
                    Err(e) => Event::WindowOpened(Err(fault(e))),
                }
            }
            Command::Exchange { records } => {
                step.set(Step::ExchangeRecords);
                let all = recovery::exchange(&*self.comm, &records);
                if all.is_ok() {
                    self.trace("records exchanged");
                }
                Event::Exchanged(all.map_err(fault))
            }
            Command::Copy { sends } => {
                self.comm.failpoint("recovery_mid_copy");
                step.set(Step::CopyOut);
                let window = run.window.as_ref().expect("copies go to an opened window");
                let copied = copy_out(window, &self.layout, &sends, &run.held, self.geometry)
                    .and_then(|()| {
                        step.set(Step::Barrier);
                        Ok(self.comm.barrier()?)
                    })
                    .map(|()| self.comm.failed_ranks().is_ok_and(|f| f.is_empty()));
                Event::Copied(copied.map_err(fault))
            }
            Command::Agree { flags, revoke } => {
                if revoke {
                    step.set(Step::Revoke);
                    if let Err(e) = self.comm.revoke() {
                        crate::events::warn(format!("revoke during recovery: {e}"));
                    }
                }
                self.trace(&format!("rebuilt ok={}", flags & attempt::ATTEMPT_SUCCEEDED != 0));
                step.set(Step::Agree);
                let agreed = self.comm.agree(flags);
                if let Ok(agreed) = &agreed {
                    self.trace(&format!("agreed {}", agreed.value));
                }
                let agreed = agreed.map(|a| (a.value, a.unacknowledged_failures));
                Event::Agreed(agreed.map_err(|e| {
                    run.agreement_error = Some(Error::Fabric(e.clone()));
                    fault(e)
                }))
            }
            Command::Dispose { free } => {
                step.set(Step::FreeWindow);
                self.dispose(run.window.take(), free);
                Event::Disposed
            }
            Command::Commit(_) | Command::Fail(_) => unreachable!("handled by recover"),
        })
    }

    /// Adopts the committed attempt: its window and layout; frees the previous window.
    fn commit(
        &mut self,
        committed: attempt::Committed,
        retained: Retained<F::Window>,
        mut run: AttemptRun<F>,
        started: Instant,
    ) -> Result<RecoveryReport> {
        let window = Arc::new(run.window.take().expect("agreement implies a window"));
        self.window = Some(Arc::new(Fencer::new(window, &self.layout.local, self.geometry)));
        if committed.alarm {
            self.pending_alarm = true;
        }
        run.step.set(Step::FreeWindow);
        let freed = retained.close();
        drop(run);
        freed?;
        self.trace("old window freed");
        let recovered = Recovered { keys: committed.keys, lost: committed.lost };
        self.finish_recovery(recovered, committed.attempts, started)
    }

    /// The error a recovery that did not succeed returns. After a partition this side leaves
    /// the store without touching its windows again; when every attempt failed, the previous
    /// window stays, so that another recovery can start from it.
    fn give_up(
        &mut self,
        failed: attempt::Failed,
        retained: Retained<F::Window>,
        mut run: AttemptRun<F>,
    ) -> Error {
        let agreement_error = run.agreement_error.take();
        drop(run);
        match failed {
            attempt::Failed::Partitioned { live, previous } => {
                retained.abandon();
                Error::Partitioned { live, previous }
            }
            attempt::Failed::Error(message) => {
                retained.abandon();
                agreement_error.unwrap_or(Error::RecoveryFailed(message))
            }
            attempt::Failed::Exhausted { last_error } => {
                if let Some(e) = last_error {
                    crate::events::warn(format!("recovery gave up; last error: {e}"));
                }
                // The next recovery starts again from the last committed window and layout.
                self.layout = retained.layout;
                self.window = Some(retained.fencer);
                Error::RecoveryNeeded { failed: self.newly_failed() }
            }
        }
    }

    fn finish_recovery(
        &mut self,
        recovered: Recovered,
        attempts: usize,
        started: Instant,
    ) -> Result<RecoveryReport> {
        let failed: Vec<i32> = (0..self.workers as i32)
            .filter(|w| !self.layout.live.contains(w) && !self.recovered_failed.contains(w))
            .collect();
        self.recovered_failed.extend(&failed);
        self.lost = recovered.lost.clone();
        self.handed.clear();
        // The new routes are fresh: the next call follows every failure known by then.
        self.followed = u64::MAX;
        self.health.clear_alarm();
        if std::mem::take(&mut self.pending_alarm) {
            self.health.raise_alarm();
        }
        self.start_detector()?;
        Ok(RecoveryReport {
            failed,
            keys_recovered: recovered.keys,
            keys_lost: recovered.lost,
            attempts,
            duration: started.elapsed(),
        })
    }

    /// Frees a failed attempt's window when every survivor opened it (only an agreement can say
    /// so, and freeing is collective); otherwise leaves it allocated, since a collective free
    /// that some survivors never join would not return.
    fn dispose(&self, window: Option<F::Window>, everyone_opened: bool) {
        let Some(window) = window else { return };
        if !everyone_opened {
            self.trace("failed attempt's window left allocated");
            window.abandon();
            return;
        }
        match window.close() {
            Ok(()) => self.trace("failed attempt's window freed"),
            Err(e) => {
                crate::events::warn(format!("freeing a failed recovery attempt's window: {e}"))
            }
        }
    }

    /// A recovery step event when `FTKV_TRACE` is set (chaos runs set it, so a
    /// stuck survivor shows where it stopped).
    fn trace(&self, what: &str) {
        if std::env::var_os("FTKV_TRACE").is_some() {
            let (worker, epoch, step) = (self.me, self.epoch, what.to_owned());
            crate::events::emit(crate::events::Event::RecoveryStep { worker, epoch, step });
        }
    }

    fn live_ids(&self, shrunk: &F) -> Result<Vec<i32>> {
        Ok(shrunk.ranks_in(&self.origin)?)
    }
}

/// The state a recovery keeps across its commands: the current attempt's step marker and
/// deadline, and its window once opened.
struct AttemptRun<F: Fabric> {
    step: Arc<StepMarker>,
    deadline: Option<Deadline>,
    window: Option<F::Window>,
    /// The previous window's slots this rank holds, read once the attempt's window is open.
    held: HashMap<Key, Committed>,
    /// The agreement's own error, returned if it ends the recovery.
    agreement_error: Option<Error>,
}

/// The outcome of a successful rebuild.
struct Recovered {
    keys: usize,
    lost: Vec<Key>,
}

/// A fabric error as the recovery machine sees it.
fn fault(e: impl Into<Error>) -> Fault {
    match e.into() {
        e if e.needs_recovery() => Fault::Failure,
        e => Fault::Other(e.to_string()),
    }
}

/// Every member's host id, by rank: one allgather of `mine` (4 bytes little-endian each).
fn gather_hosts<F: Fabric>(comm: &F, mine: u32) -> Result<Vec<u32>> {
    let all = comm.allgather(&mine.to_le_bytes())?;
    Ok(all.chunks(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
}

/// Every rank learns whether all configs are valid and equal before anyone acts on its own.
fn agree_on_config<F: Fabric>(comm: &F, config: &Config, valid: bool) -> Result<()> {
    let mut mine = config.fingerprint().to_le_bytes().to_vec();
    mine.push(valid as u8);
    let all = comm.allgather(&mine)?;
    let reference = &all[..9];
    let differing: Vec<i32> = all
        .chunks(9)
        .enumerate()
        .filter(|(_, c)| c[..8] != reference[..8] || c[8] == 0)
        .map(|(r, _)| r as i32)
        .collect();
    if differing.is_empty() || (!valid && differing.contains(&comm.rank())) {
        return Ok(());
    }
    Err(Error::ConfigMismatch { ranks: differing })
}

/// Refuses windows of `per_rank` bytes on each of this host's `ranks` ranks that its shared
/// memory could not hold. Memory is reserved, not resident, until values are written, but Open
/// MPI sizes the backing file for the whole reservation and fails when the file system is
/// smaller. Values beyond a slot's inline capacity live in extents, which take memory only as
/// they are written.
fn check_window_memory<F: Fabric>(comm: &F, per_rank: usize, ranks: usize) -> Result<()> {
    let Some(capacity) = comm.shared_memory_capacity() else { return Ok(()) };
    let total = (per_rank as u128) * ranks as u128;
    if total > capacity as u128 {
        return Err(Error::WindowTooLarge { per_rank, ranks, capacity });
    }
    Ok(())
}

/// Allocates the window of `layout`, empties this rank's slot headers, opens the lock_all epoch
/// and waits until every rank did, so no put can land before the headers are cleared.
fn open_window<F: Fabric>(comm: &F, layout: &Layout, geometry: SlotGeometry) -> Result<F::Window> {
    let headers = layout.local.iter().flat_map(|&(_, disp)| {
        let disp = disp as usize;
        let halves = [0, 1].map(|i| (disp + geometry.half_start(i), HEADER_LEN));
        [(disp, FENCE_LEN), halves[0], halves[1]]
    });
    let window = comm.open_window(layout.window_len, &headers.collect::<Vec<_>>())?;
    comm.barrier()?;
    Ok(window)
}

/// The newest complete version of every slot this rank hosts in the previous epoch's window,
/// after fencing every worker that is not in `live` (the shrunk communicator's workers).
fn scan_local<W: FabricWindow>(
    retained: &Retained<W>,
    live: &[i32],
    geometry: SlotGeometry,
) -> Result<HashMap<Key, Committed>> {
    let gone: Vec<i32> =
        retained.layout.live.iter().copied().filter(|w| !live.contains(w)).collect();
    retained.fencer.fence(&gone)?;
    let window = retained.fencer.window();
    window.sync()?;
    let mut found = HashMap::new();
    for &(key, disp) in &retained.layout.local {
        if let Some(committed) = read_local_slot(window, disp as usize, geometry)? {
            found.insert(key, committed);
        }
    }
    Ok(found)
}

/// Writes the versions this rank is the source of to their new holders.
fn copy_out<W: FabricWindow>(
    window: &W,
    layout: &Layout,
    sends: &[Key],
    local: &HashMap<Key, Committed>,
    geometry: SlotGeometry,
) -> Result<()> {
    for key in sends {
        let route = layout.route(*key).expect("planned keys are routed");
        put_committed(window, route, &local[key], geometry)?;
    }
    Ok(())
}

/// Writes a committed version (data and header into the version's half) to every copy of
/// `targets`, completed by one scope.
fn put_committed<W: FabricWindow>(
    window: &W,
    targets: &[Copy],
    committed: &Committed,
    geometry: SlotGeometry,
) -> std::result::Result<(), FabricError> {
    let version = committed.header.version;
    halves::write_extents(window, targets, geometry, version, &committed.data)?;
    put_committed_inline(window, targets, committed, geometry)
}

/// [`put_committed`] after its value's extents were written: the inline value (if it fits) and
/// the header, the one-sided calls the watchdog bounds.
fn put_committed_inline<W: FabricWindow>(
    window: &W,
    targets: &[Copy],
    committed: &Committed,
    geometry: SlotGeometry,
) -> std::result::Result<(), FabricError> {
    let encoded = committed.header.encode();
    let version = committed.header.version;
    let out =
        halves::Outgoing { version, encoded: &encoded, data: &committed.data, free_stale: true };
    window.scope(|s| halves::issue_version(s, targets, geometry, &out))
}

impl<F: Fabric> Store<F> {
    /// Leaves the store without a collective call: stops the detector and leaves the window
    /// allocated until the process ends. For the end of a job whose survivors do not rebuild
    /// the store after a failure (freeing a window is collective over its members, and a dead
    /// member can leave that call stuck). Dropping the store instead frees the window.
    pub fn abandon(mut self) {
        self.repairer = None;
        self.detector = None;
        if let Some(window) = self.window.take().and_then(Fencer::into_window) {
            window.abandon();
        }
    }
}

/// Stops the repairer and detector threads before the fields go: it polls MPI on a communicator derived from
/// the store's, and the window's collective free must not race with it.
impl<F: Fabric> Drop for Store<F> {
    fn drop(&mut self) {
        self.repairer = None;
        self.detector = None;
    }
}
