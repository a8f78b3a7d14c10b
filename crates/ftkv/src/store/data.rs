//! The data path: puts, deletes and gets of own and handed keys on the current routes, the
//! checks before them, and how a fabric error of one of them is classified.

use super::Store;
use crate::config::{Detection, Recovery};
use crate::detector::read_allowance;
use crate::engine::layout::Copy;
use crate::error::{Error, Result};
use crate::fabric::{Fabric, FabricError, FabricWindow};
use crate::key::Key;
use crate::slot::{Committed, Header, State};
use crate::store::fence::read_copy;
use crate::store::halves;

impl<F: Fabric> Store<F> {
    /// Writes `value` under this worker's own `key` and returns when every holder has it.
    ///
    /// Completion: `Ok` means the new version is complete in every copy's holder's memory (all
    /// of them live, as far as this rank knows when the last copy completed). Failure: input errors change
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
        let header = Header::for_ordered_value(value.len(), version, self.epoch()?, self.me);
        self.write(key, header, value)?;
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
        self.write(key, Header::for_delete(version, self.epoch()?, self.me), &[])?;
        self.acked.set(key.kind as usize, version);
        Ok(())
    }

    /// Writes a key owned by another worker that the application handed to this one (a thief
    /// writing its victim's data). The application guarantees a single writer per key at a time
    /// (an outer lock); writers may take turns, the owner among them: every handed write first
    /// reads the key's current version from its holders (one read more than [`Store::put`]), so
    /// it lands above whatever the previous writer wrote. An owner whose key another worker
    /// wrote writes it again with `put_handed` too (its own version counter is behind). Like
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
        self.write(key, Header::for_value(value, version, self.epoch()?, self.me), value)?;
        self.note_own_version(key, version);
        Ok(())
    }

    /// Deletes a handed key (see [`Store::put_handed`]).
    pub fn delete_handed(&mut self, key: Key) -> Result<()> {
        self.check_key(key)?;
        let version = self.next_handed_version(key)?;
        self.write(key, Header::for_delete(version, self.epoch()?, self.me), &[])?;
        self.note_own_version(key, version);
        Ok(())
    }

    /// After a handed write of this worker's own key at `version`: its own counter and
    /// acknowledged version move up to it (a later [`Store::put`] lands above).
    fn note_own_version(&mut self, key: Key, version: u64) {
        if key.owner == self.me {
            let kind = key.kind as usize;
            self.versions[kind] = self.versions[kind].max(version);
            self.acked.set(kind, self.acked.get(kind).max(version));
        }
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
    pub(super) fn read_versioned(&mut self, key: Key) -> Result<(u64, Option<Vec<u8>>)> {
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

    pub(super) fn check_key(&self, key: Key) -> Result<()> {
        if key.kind as usize >= self.config.kinds.len() {
            return Err(Error::UnknownKindIndex(key.kind));
        }
        if key.owner < 0 || key.owner as usize >= self.workers {
            return Err(Error::UnknownOwner(key.owner));
        }
        Ok(())
    }

    pub(super) fn check_own(&self, key: Key) -> Result<()> {
        self.check_key(key)?;
        if key.owner != self.me {
            return Err(Error::ForeignOwner { key, me: self.me });
        }
        Ok(())
    }

    pub(super) fn check_value(&self, value: &[u8]) -> Result<()> {
        if value.len() > self.config.max_value {
            return Err(Error::ValueTooLarge { len: value.len(), max: self.config.max_value });
        }
        Ok(())
    }

    /// Versions always advance, also past an attempt that failed, so two different values
    /// never carry the same version.
    pub(super) fn next_own_version(&mut self, key: Key) -> u64 {
        let v = &mut self.versions[key.kind as usize];
        *v += 1;
        *v
    }

    /// The version of a handed write of `key`: above the newest on its holders (another
    /// writer may have written it since this worker last did) and above every version this
    /// worker wrote or tried.
    fn next_handed_version(&mut self, key: Key) -> Result<u64> {
        let stored = match self.read_newest(key) {
            Ok(newest) => newest.map_or(0, |c| c.header.version),
            Err(Error::KeyLost(_)) => 0,
            Err(e) => return Err(e),
        };
        let mine = if key.owner == self.me { self.versions[key.kind as usize] } else { 0 };
        let tried = self.handed.get(&key).copied().unwrap_or(0);
        let version = stored.max(mine).max(tried) + 1;
        self.handed.insert(key, version);
        Ok(version)
    }

    pub(super) fn ensure_healthy(&self) -> Result<()> {
        if self.windows.is_none() {
            return Err(Error::Closed);
        }
        if self.health.alarmed() {
            return Err(Error::RecoveryNeeded { failed: self.newly_failed() });
        }
        Ok(())
    }

    pub(super) fn newly_failed(&self) -> Vec<i32> {
        let live = &self.routes.live;
        live.iter().copied().filter(|&w| self.health.is_failed(w)).collect()
    }

    /// [`Error::RecoveryNeeded`] when a holder of `route` is known failed; with global
    /// recovery it also raises the alarm (with localized recovery the caller follows the
    /// failure and tries again).
    pub(super) fn ensure_alive(&self, route: &[Copy]) -> Result<()> {
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
    pub(super) fn route(&self, key: Key) -> Result<&[Copy]> {
        self.routes.route(key).ok_or(Error::UnknownOwner(key.owner))
    }

    /// Writes `key` and, once the write is acknowledged, no longer reports it lost.
    pub(super) fn write(&mut self, key: Key, header: Header, data: &[u8]) -> Result<()> {
        self.complete_handoff(None)?;
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
        self.localized(Some(key), |store| store.write_once(key, header, data))
    }

    /// The fast path: the version's half invalidated, its data and its header on every holder,
    /// completed by one scope, failure knowledge checked before and after.
    fn write_once(&mut self, key: Key, header: Header, data: &[u8]) -> Result<()> {
        self.ensure_healthy()?;
        let route = self.route(key)?;
        self.ensure_alive(route)?;
        self.ready_to_write(route)?;
        let geometry = self.routes.geometry();
        let free_stale = self.spills.stale(key, header.version, data.len(), geometry);
        self.put_to(route, header, data, free_stale)?;
        self.ensure_alive(route)?;
        self.spills.written(key, header.version, data.len(), geometry);
        Ok(())
    }

    /// Header and data of one version to the version's half on each of `targets`, complete at
    /// every target when it returns. `free_stale`: the half's extent held an earlier, larger
    /// value that an inline one now replaces.
    pub(super) fn put_to(
        &self,
        route: &[Copy],
        header: Header,
        data: &[u8],
        free_stale: bool,
    ) -> Result<()> {
        let encoded = header.encode();
        let windows = self.windows()?;
        let (window, geometry, version) = (windows.window(), windows.geometry(), header.version);
        let comm = &self.comm;
        let extents = halves::write_extents(window, route, geometry, &header, data);
        extents.map_err(|e| self.failure(e))?;
        self.health.enter_call(halves::inline_bytes(geometry, data) * route.len());
        comm.stall_point("put_stall");
        let issued = window.scope(|s| {
            for copy in route {
                halves::issue_value(s, copy, geometry, &header, data, free_stale)?;
                comm.failpoint("put_before_header");
                halves::issue_header(s, copy, geometry, version, &encoded)?;
                comm.failpoint("put_between_copies");
            }
            Ok(())
        });
        self.health.leave_call();
        issued.map_err(|e| self.failure(e))
    }

    /// Each copy of `route` not known failed: its holder and newest complete version, read
    /// with watchdog-bounded gets.
    fn read_live(&self, route: &[Copy]) -> Result<Vec<(i32, Option<Committed>)>> {
        let windows = self.windows()?;
        let (window, geometry) = (windows.window(), windows.geometry());
        let mut copies = Vec::with_capacity(route.len());
        for copy in route.iter().filter(|c| !self.health.is_failed(c.worker)) {
            self.health.enter_call(read_allowance(geometry.max_value));
            let found = read_copy(window, copy, geometry);
            self.health.leave_call();
            copies.push((copy.worker, found.map_err(|e| self.failure(e))?));
        }
        Ok(copies)
    }

    /// Ends this process when its clock thread has not ticked for more than half the
    /// suspicion bound ([`crate::detector`]): it may have been declared failed, and its writes
    /// must stop here. The write in flight when it stopped is the only one that can land late
    /// (and the holders' fences void it).
    pub(super) fn ensure_not_suspended(&self) {
        let gap = self.health.since_last_tick();
        crate::detector::end_if_stopped(self.comm.as_ref(), gap, self.config.suspicion);
    }

    /// The checks just before a write's copies go to `targets`: this process was not stopped
    /// past the suspicion bound, and with ping detection every target answers.
    pub(super) fn ready_to_write(&self, targets: &[Copy]) -> Result<()> {
        self.ensure_not_suspended();
        if self.config.detection == Detection::Ping {
            self.ping_all(targets)?;
        }
        Ok(())
    }

    fn ping_all(&self, route: &[Copy]) -> Result<()> {
        let comm = self.watch_comm.as_ref().ok_or(Error::Closed)?;
        for copy in route {
            let ping = comm.ping(copy.rank, self.config.watchdog);
            if let Err(e) = ping {
                self.health.mark_failed(copy.worker, crate::events::Cause::Call);
                return Err(self.failure(e));
            }
        }
        Ok(())
    }

    /// Classifies an MPI error of a store call. Besides ULFM's own failure classes, Open MPI's
    /// collectives can return `MPI_ERR_OTHER` on members that meet a failure indirectly; with
    /// global recovery any error while the communicator is revoked or has failed members counts
    /// as a failure.
    pub(super) fn failure(&self, e: FabricError) -> Error {
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
                if let Some(&worker) = self.routes.live.get(rank as usize) {
                    self.health.mark_failed(worker, crate::events::Cause::Call);
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
        self.localized(Some(key), |store| store.read_holders_once(key))
    }

    fn read_holders_once(&self, key: Key) -> Result<Vec<(i32, Option<Committed>)>> {
        self.ensure_healthy()?;
        let route = self.route(key)?;
        let copies = self.read_live(route)?;
        self.ensure_alive(route)?;
        Ok(copies)
    }
}
