//! The threads beside a store's calls: the detector, and with localized recovery the repairer,
//! started on every new set of windows and stopped before a global recovery; and the calls
//! that reach every member: [`Store::sync`] and [`Store::interrupt`].

use std::sync::Arc;

use super::{follow, Store};
use crate::config::{Detection, Recovery};
use crate::detector::{Detector, Watch};
use crate::error::{Error, Result};
use crate::fabric::{Fabric, FabricWindow};
use crate::key::Key;

impl<F: Fabric> Store<F> {
    /// Starts the detector thread on the current windows and routes, and with localized
    /// recovery the repairer thread first. Fails with [`Error::Closed`] when the store has no
    /// windows, with [`Error::RecoveryNeeded`] when a member failed while the detector's
    /// communicator was made (a duplication that a death interrupts fails on every member:
    /// seen at the end of a global recovery at 32 ranks over 2 hosts, a second victim killed
    /// inside it), or with the fabric's other errors.
    pub(super) fn start_detector(&mut self) -> Result<()> {
        let comm = Arc::new(self.comm.dup().map_err(|e| self.failure(e))?);
        self.watch_comm = Some(comm.clone());
        let live_hosts: Vec<u32> =
            self.routes.live.iter().map(|&w| self.hosts[w as usize]).collect();
        let my_host = self.hosts[self.me as usize];
        let localized = self.config.recovery == Recovery::Localized;
        let neighbours = (0..live_hosts.len() as i32)
            .filter(|&r| {
                live_hosts[r as usize] == my_host && self.routes.live[r as usize] != self.me
            })
            .filter(|_| localized)
            .collect();
        let heartbeat_peers = match self.config.end_declared && comm.can_end_processes() {
            true => self.heartbeat_peers(),
            false => Vec::new(),
        };
        let windows = self.windows.clone().ok_or(Error::Closed)?;
        let listeners = self.routes.live.iter().enumerate().filter_map(|(rank, &worker)| {
            windows.window().listener_of(rank as i32).map(|address| (worker, address))
        });
        crate::detector::ending::lock(&self.ending).know_listeners(listeners);
        if self.config.recovery == Recovery::Localized {
            self.start_repairer()?;
        }
        self.detector = Some(Detector::start(Watch {
            comm,
            store_comm: self.comm.clone(),
            live: self.routes.live.clone(),
            me: self.me,
            hosts: self.hosts.clone(),
            processes: self.processes.clone(),
            end_declared: self.config.end_declared,
            ending: self.ending.clone(),
            end_through_runtime: self.config.end_through_runtime,
            heartbeat_peers,
            neighbours,
            health: self.health.clone(),
            poll_interval: self.config.poll_interval,
            watchdog: self.config.effective_watchdog(&live_hosts),
            suspicion: self.config.suspicion,
            answer_pings: self.config.detection == Detection::Ping,
            fence: Box::new(move |failed: &[i32]| windows.fence(failed)),
        }));
        Ok(())
    }

    /// The members this one shares keys with (the holders of its keys, the owners of the keys
    /// it holds), as ranks of the current communicator: its heartbeat peers.
    fn heartbeat_peers(&self) -> Vec<i32> {
        let holders = |key| self.routes.route(key).unwrap_or(&[]).iter().map(|c| c.worker);
        let kinds = 0..self.config.kinds.len() as u16;
        let mine: Vec<i32> = kinds.flat_map(|k| holders(Key::new(self.me, k))).collect();
        let held = self.routes.keys().filter(|&key| holders(key).any(|w| w == self.me));
        let owners: Vec<i32> = held.map(|key| key.owner).collect();
        let peers = crate::detector::key_sharers(self.me, &mine, &owners);
        let rank_of = |w: i32| self.routes.live.iter().position(|&l| l == w).map(|r| r as i32);
        peers.into_iter().filter_map(rank_of).collect()
    }

    /// Starts the repairer thread of localized recovery on the current windows and routes.
    fn start_repairer(&mut self) -> Result<()> {
        let parts = follow::FollowerParts {
            me: self.me,
            workers: self.workers,
            hosts: self.hosts.clone(),
            kinds: self.config.kinds.len(),
            poll_interval: self.config.poll_interval,
            health: self.health.clone(),
            comm: self.comm.clone(),
            windows: self.windows.clone().ok_or(Error::Closed)?,
            acked: self.acked.clone(),
        };
        let follower = follow::Follower::new(parts, self.routes.clone());
        self.repairer = Some(follow::Repairer::start(follower)?);
        Ok(())
    }

    /// Stops the repairer thread, adopting the routes it left: the copies are where they say.
    pub(super) fn stop_repairer(&mut self) {
        let Some(repairer) = self.repairer.take() else {
            return;
        };
        let follower = repairer.follower();
        let (layout, followed) = follower.current_routes();
        self.repairs.extend(follower.take_repairs());
        drop(repairer);
        if let Some(generation) = followed {
            self.routes = layout;
            self.followed = generation;
        }
    }

    /// A barrier over the live workers. [`Error::RecoveryNeeded`] if a failure interrupts it or
    /// was noticed before; then every survivor must [`Store::recover`]. The copies of an
    /// asynchronous put whose handle was leaked are written before it.
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
        self.complete_handoff(None)?;
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
}
