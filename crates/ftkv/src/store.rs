//! The store: its state and the small calls that read it. Its concerns live in the modules
//! below: creation ([`create`]), the data path ([`data`]), global recovery ([`recover`]), the
//! threads beside the calls ([`threads`]), localized recovery ([`follow`]), asynchronous puts
//! ([`asynchronous`]) and transactions ([`transactions`]); what the windows look like is one
//! value ([`windows`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::detector::{Detector, Health};
use crate::engine::layout::Layout;
use crate::error::{Error, Result};
use crate::fabric::{Fabric, FabricWindow};
use crate::key::Key;

/// The fabric a plain `Store` runs on: MPI when built with it.
#[cfg(feature = "mpi")]
pub type DefaultFabric = ftkv_mpi::Comm;
/// The fabric a plain `Store` runs on: the in-process one when built without MPI.
#[cfg(all(not(feature = "mpi"), any(test, feature = "local")))]
pub type DefaultFabric = crate::fabric::local::LocalFabric;

/// What [`Store::recover`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Workers that failed since the previous recovery (stable ids).
    pub failed: Vec<i32>,
    /// Keys whose newest surviving version was copied to their new holders.
    pub keys_recovered: usize,
    /// Keys of failed owners of which no copy survived (never written, or lost to too many
    /// failures): their data is gone.
    pub keys_lost: Vec<Key>,
    /// Keys of live owners of which no copy survived (never written, or every holder failed):
    /// nothing is lost as long as each owner writes its own again, since it knows what it
    /// wrote. Until then [`Store::get`] reports [`crate::Error::KeyLost`] for them.
    pub keys_to_rewrite: Vec<Key>,
    /// Recovery attempts (more than 1 when a failure interrupted recovery).
    pub attempts: usize,
    pub duration: Duration,
}

/// What one localized repair did on this worker (see
/// [`Recovery::Localized`](crate::Recovery::Localized)).
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
mod create;
mod data;
mod deadline;
mod exchange;
pub(crate) mod fence;
mod follow;
pub(crate) mod halves;
mod recover;
mod threads;
mod transactions;
pub mod txn;
mod windows;

pub use asynchronous::{DetachedPut, PendingPut, WRITE_THROUGH_BYTES};
use windows::Windows;

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
    me: i32,
    workers: usize,
    /// The host id of every worker, by worker id (learned at creation).
    hosts: Vec<u32>,
    /// Every worker's process (index: worker id), as each told at creation: what the detector
    /// needs to end a process the survivors declared failed.
    processes: Arc<Vec<crate::fabric::ProcessTag>>,
    /// The failed processes this member ended or left alone, and the silent ones, shared with
    /// every detector of this store (see [`crate::detector::ending`]).
    ending: crate::detector::SharedEnding,
    origin: F,
    comm: Arc<F>,
    /// The current windows (`None` while a recovery runs, and after one that ended the store).
    windows: Option<Arc<Windows<F::Window>>>,
    /// Where the calls find each key's copies: the layout of `windows`, with the copies of
    /// failed workers moved down their chains by localized repair.
    routes: Layout,
    versions: Vec<u64>,
    /// The last acknowledged version of each own key (0: none yet), shared with the repairer.
    acked: Arc<follow::Acked>,
    handed: HashMap<Key, u64>,
    health: Arc<Health>,
    detector: Option<Detector>,
    /// The detector's communicator, on which its thread answers pings (and a recovery's
    /// deadline learns failures).
    watch_comm: Option<Arc<F>>,
    /// What the global recoveries so far leave for the next ([`Store::recover`]).
    recoveries: recover::RecoveryState,
    /// Keys of which the last recovery found no copy, until their owner writes them again.
    lost: Vec<Key>,
    /// The detector's failure generation the current routes follow
    /// ([`Recovery::Localized`](crate::Recovery::Localized)).
    followed: u64,
    /// Localized repairs not yet taken by [`Store::take_repairs`].
    repairs: Vec<RepairReport>,
    /// What this worker's transactions left behind ([`Store::transaction`]).
    tx: transactions::TxState,
    /// Halves of keys this worker last wrote through an extent.
    spills: halves::Spills,
    /// The replicator thread and the copies in its hands ([`Store::put_async`]).
    asynchronous: asynchronous::AsyncState<F::Window>,
    /// The thread that repairs copies after failures
    /// ([`Recovery::Localized`](crate::Recovery::Localized) only).
    repairer: Option<follow::Repairer<F>>,
}

impl<F: Fabric> Store<F> {
    /// This worker's stable id.
    pub fn worker(&self) -> i32 {
        self.me
    }

    /// A new communicator of the live workers, in the store's rank order (rank `r` is worker
    /// `live()[r]`), for the application's own messages. Collective over the live workers; a
    /// failure makes it fail, and after [`Store::recover`] the application takes a new one.
    ///
    /// The outcome is uniform: ULFM lets a duplication that a member died in succeed on some
    /// members and fail on others, which would leave some with a communicator whose
    /// collectives wait forever for the others. So every member, also one that already knows
    /// of a failure (it revokes the store's communicator first, which ends the others'
    /// duplication), then joins an agreement on whether all got it, and each returns the new
    /// communicator only if all did.
    pub fn communicator(&self) -> Result<F> {
        let healthy = self.ensure_healthy();
        if healthy.is_err() {
            // The others may be inside the duplication, which waits for this member: the
            // revocation ends it for them (a recovery is due anyway).
            let _ = self.comm.revoke();
        }
        let duplicated = healthy.and_then(|()| self.comm.dup().map_err(|e| self.failure(e)));
        let agreed = self.comm.agree(duplicated.is_ok() as u32);
        let duplicated = duplicated?;
        match agreed {
            Ok(agreed) if agreed.value == 1 => Ok(duplicated),
            Ok(_) => Err(Error::RecoveryNeeded { failed: self.newly_failed() }),
            Err(e) => Err(self.failure(e)),
        }
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
        let gone = (0..self.workers as i32).filter(|w| !self.routes.live.contains(w));
        let mut failed: Vec<i32> = gone.chain(self.health.failed_workers(self.workers)).collect();
        failed.sort_unstable();
        failed.dedup();
        failed
    }

    /// When this rank first learned that a worker failed since the store was created (`None`:
    /// it learned of none). Its detector thread marks the failure
    /// whatever the caller is doing, so this is when the rank was notified, not when a store
    /// call first saw it.
    pub fn first_failure_noticed(&self) -> Option<std::time::Instant> {
        self.health.first_failure_at()
    }

    /// The workers of the store's current windows (stable ids): the live ones of the last
    /// recovery; with [`Recovery::Localized`](crate::Recovery::Localized), workers that failed
    /// since stay in it until a global recovery (see [`Store::failed`]).
    pub fn live(&self) -> &[i32] {
        &self.routes.live
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

    /// The current windows; [`Error::Closed`] while there are none.
    fn windows(&self) -> Result<&Windows<F::Window>> {
        self.windows.as_deref().ok_or(Error::Closed)
    }

    /// The epoch of the current windows, which every header this worker writes names;
    /// [`Error::Closed`] while there are none.
    fn epoch(&self) -> Result<u64> {
        Ok(self.windows()?.epoch())
    }
}

impl<F: Fabric> Store<F> {
    /// Leaves the store without a collective call: stops the detector and leaves the window
    /// allocated until the process ends. For the end of a job whose survivors do not rebuild
    /// the store after a failure (freeing a window is collective over its members, and a dead
    /// member can leave that call stuck). Dropping the store instead frees the window.
    pub fn abandon(mut self) {
        self.repairer = None;
        self.detector = None;
        if let Some(window) = self.windows.take().and_then(Windows::unshared) {
            window.abandon();
        }
    }
}

/// Stops the repairer and detector threads before the fields go: it polls MPI on a
/// communicator derived from the store's, and the window's collective free must not race with
/// it.
impl<F: Fabric> Drop for Store<F> {
    fn drop(&mut self) {
        self.repairer = None;
        self.detector = None;
    }
}
