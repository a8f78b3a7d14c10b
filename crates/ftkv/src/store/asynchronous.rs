//! [`Store::put_async`]: a put that returns once its first copy is complete at its holder,
//! while a replicator thread writes the other copies; [`PendingPut::wait`] (or dropping the
//! handle) waits for them.

use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use super::{Store, Windows};
use crate::detector::{Health, Lane};
use crate::error::{Error, Result};
use crate::fabric::{Fabric, FabricError, FabricResult, FabricWindow};
use crate::halves;
use crate::key::{Key, Recovery};
use crate::layout::Copy;
use crate::slot::{Header, HEADER_LEN};

/// The largest value [`Store::put_async`] writes to every holder itself when they all share
/// this host: below it, handing the value to the replicator thread (a copy of the value, a
/// channel message and a thread's wake-up) costs more than the copies it would save.
pub const WRITE_THROUGH_BYTES: usize = 64 << 10;

/// One version's other copies, for the replicator thread.
struct Job<W> {
    /// The windows the copies go to.
    windows: Arc<Windows<W>>,
    /// Where the watchdog sees the job's one-sided calls ([`Lane::Replicator`]).
    health: Arc<Health>,
    targets: Vec<Copy>,
    header: Header,
    encoded: [u8; HEADER_LEN],
    data: Arc<Vec<u8>>,
    /// Whether an inline value replaces a value in the half's extent (see [`halves::Spills`]).
    free_stale: bool,
    done: mpsc::SyncSender<FabricResult<()>>,
}

/// The thread that writes the copies after the first of each asynchronous put, one job at a
/// time, and reports each job's completion.
pub(crate) struct Replicator<W> {
    jobs: Option<mpsc::Sender<Job<W>>>,
    thread: Option<JoinHandle<()>>,
}

impl<W: FabricWindow> Replicator<W> {
    fn start() -> Result<Replicator<W>> {
        let (jobs, queue) = mpsc::channel::<Job<W>>();
        let thread = std::thread::Builder::new()
            .name("ftkv-replicator".into())
            .spawn(move || {
                for job in queue {
                    let written = write_copies(&job);
                    // The value goes back to its store before the owner learns the outcome.
                    let Job { done, data, .. } = job;
                    drop(data);
                    let _ = done.send(written);
                }
            })
            .map_err(|e| Error::RecoveryFailed(format!("starting the replicator thread: {e}")))?;
        Ok(Replicator { jobs: Some(jobs), thread: Some(thread) })
    }
}

impl<W> Drop for Replicator<W> {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Writes one job's copies, its one-sided calls bounded by the watchdog like the owner's.
fn write_copies<W: FabricWindow>(job: &Job<W>) -> FabricResult<()> {
    let (window, geometry) = (job.windows.window(), job.windows.geometry());
    halves::write_extents(window, &job.targets, geometry, &job.header, &job.data)?;
    let bytes = halves::inline_bytes(geometry, &job.data) * job.targets.len();
    job.health.enter_call_on(Lane::Replicator, bytes);
    let out = halves::Outgoing {
        header: job.header,
        encoded: &job.encoded,
        data: &job.data,
        free_stale: job.free_stale,
    };
    let written = window.scope(|s| halves::issue_version(s, &job.targets, geometry, &out));
    job.health.leave_call_on(Lane::Replicator);
    written
}

/// A put of [`Store::put_async`] whose first copy is complete and whose other copies are being
/// written. It borrows the store: the program computes meanwhile, then waits.
///
/// [`PendingPut::wait`] returns what [`Store::put`] would have: `Ok` once every copy holds the
/// value. Dropping the handle waits too; an error then surfaces at the store's next call (the
/// failure stays known), so call `wait` to see it here.
#[must_use = "the other copies are complete only once the handle is waited for or dropped"]
pub struct PendingPut<'s, F: Fabric> {
    store: &'s mut Store<F>,
    key: Key,
    /// What is left to wait for; `None` once waited for, or when every copy was written
    /// before [`Store::put_async`] returned.
    pending: Option<Pending>,
}

/// A version whose first copy is written: its value, kept for a rewrite after a failure, and
/// the replicator's report on the other copies (`None`: there are none).
struct Pending {
    header: Header,
    data: Arc<Vec<u8>>,
    rest: Option<mpsc::Receiver<FabricResult<()>>>,
}

impl<F: Fabric> PendingPut<'_, F> {
    /// Waits until every copy holds the value.
    ///
    /// Completion and failure as [`Store::put`]: `Ok` means every holder has the new version.
    /// With localized recovery a holder that failed meanwhile is replaced and the whole write
    /// goes again to the new routes before this returns.
    pub fn wait(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        let Some(Pending { header, data, rest }) = self.pending.take() else { return Ok(()) };
        let rest = rest.map(|done| {
            done.recv().unwrap_or_else(|_| {
                Err(FabricError::Other { op: "put_async", msg: "the replicator ended".into() })
            })
        });
        let store = &mut *self.store;
        let written = match rest {
            Some(Err(e)) => Err(store.failure(e)),
            _ => store.route(self.key).and_then(|route| store.ensure_alive(route)),
        };
        match written {
            Err(e) if e.needs_recovery() && store.config.recovery == Recovery::Localized => {
                store.write(self.key, header, &data)?;
            }
            written => written?,
        }
        store.acked.set(self.key.kind as usize, header.version);
        let geometry = store.routes.geometry();
        store.spills.written(self.key, header.version, data.len(), geometry);
        if !store.lost.is_empty() {
            store.lost.retain(|&k| k != self.key);
        }
        store.async_buffer = Arc::try_unwrap(data).ok();
        Ok(())
    }
}

impl<F: Fabric> Drop for PendingPut<'_, F> {
    /// Waits, unless the thread is unwinding (a killed rank of the in-process fabric, a bug):
    /// then the store is not touched again.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = self.finish();
        }
    }
}

impl<F: Fabric> Store<F> {
    /// Writes `value` under this worker's own `key` like [`Store::put`], but returns once the
    /// first copy (on this host when a holder is here) is complete at its holder; the other
    /// copies are issued to a replicator thread. The returned handle waits for them
    /// ([`PendingPut::wait`], or when dropped). A value of at most [`WRITE_THROUGH_BYTES`]
    /// whose holders all share this host is written to every copy before this returns, as
    /// [`Store::put`] does: handing it off would cost more than the copies.
    ///
    /// Completion: `Ok(handle)` means the first holder has the new version. Failure: as
    /// [`Store::put`]; with localized recovery a failure met before the first copy is written
    /// makes this put a blocking one (every copy written when it returns). What a failure can
    /// lose: until the handle is waited for, the new version
    /// may be on the first holder only; if the owner dies then, a recovery reads it back when
    /// that holder survives, the previous version otherwise (never a mix). After `wait`
    /// returned `Ok`, the guarantee is the blocking put's.
    ///
    /// # Example
    ///
    /// ```
    /// use ftkv::fabric::local::LocalCluster;
    /// use ftkv::{Config, Store};
    ///
    /// LocalCluster::new(4).run(|fabric| {
    ///     let mut store = Store::create(&fabric, Config::new(["checkpoint"], 3)).unwrap();
    ///     let mine = store.own_key("checkpoint").unwrap();
    ///     let pending = store.put_async(mine, b"state 1").unwrap();
    ///     // ... compute the next state while the other two copies are written ...
    ///     pending.wait().unwrap();
    ///     assert!(store.read_copies(mine).unwrap().iter().all(|(_, v)| v.as_deref() == Some(&b"state 1"[..])));
    /// });
    /// ```
    pub fn put_async(&mut self, key: Key, value: &[u8]) -> Result<PendingPut<'_, F>> {
        self.check_own(key)?;
        self.check_value(value)?;
        if self.writes_through(key, value.len()) {
            self.put(key, value)?;
            return Ok(PendingPut { store: self, key, pending: None });
        }
        let version = self.next_own_version(key);
        let header = Header::for_ordered_value(value.len(), version, self.epoch()?, self.me);
        let data = Arc::new(self.staged(value));
        let rest = match self.start_async(key, header, &data) {
            Err(e) if e.needs_recovery() && self.config.recovery == Recovery::Localized => {
                // A failure met on the way: the blocking write follows it and writes every copy.
                self.write(key, header, value)?;
                None
            }
            started => started?,
        };
        Ok(PendingPut { store: self, key, pending: Some(Pending { header, data, rest }) })
    }

    /// Whether [`Store::put_async`] writes every copy of `key` itself: when it has one copy
    /// (the first is all there is), or when all its holders share this host and the value is at
    /// most [`WRITE_THROUGH_BYTES`], copying it to them costs less than handing it to the
    /// replicator thread.
    fn writes_through(&self, key: Key, len: usize) -> bool {
        let my_host = self.hosts[self.me as usize];
        let on_this_host =
            |route: &[Copy]| route.iter().all(|c| self.hosts[c.worker as usize] == my_host);
        let cheap = |route: &[Copy]| {
            route.len() <= 1 || (len <= WRITE_THROUGH_BYTES && on_this_host(route))
        };
        self.routes.route(key).is_some_and(cheap)
    }

    /// A copy of `value` for the replicator, in the buffer the last asynchronous put gave back
    /// when there is one: a fresh allocation of a large value costs its pages' faults on every
    /// put.
    fn staged(&mut self, value: &[u8]) -> Vec<u8> {
        let mut buffer = self.async_buffer.take().unwrap_or_default();
        buffer.clear();
        buffer.extend_from_slice(value);
        buffer
    }

    /// Writes the first copy of `header`'s version (on this host when a holder is here) and
    /// hands the others to the replicator; the receiver of their completion, if there are any.
    fn start_async(
        &mut self,
        key: Key,
        header: Header,
        data: &Arc<Vec<u8>>,
    ) -> Result<Option<mpsc::Receiver<FabricResult<()>>>> {
        if self.config.recovery == Recovery::Localized {
            self.follow_failures(Some(key))?;
        }
        self.ensure_healthy()?;
        self.ensure_not_suspended();
        let route = self.route(key)?;
        self.ensure_alive(route)?;
        let mut copies = route.to_vec();
        // The first copy on this host when there is one: shared memory returns soonest.
        let my_host = self.hosts[self.me as usize];
        if let Some(local) = copies.iter().position(|c| self.hosts[c.worker as usize] == my_host) {
            copies.swap(0, local);
        }
        let (first, others) = copies.split_at(1.min(copies.len()));
        let others = others.to_vec();
        let geometry = self.routes.geometry();
        let free_stale = self.spills.stale(key, header.version, data.len(), geometry);
        self.put_to(first, header, data, free_stale)?;
        if others.is_empty() {
            return Ok(None);
        }
        self.replicate(others, header, data, free_stale).map(Some)
    }

    /// Hands the copies to `targets` to the replicator thread (started on first use).
    fn replicate(
        &mut self,
        targets: Vec<Copy>,
        header: Header,
        data: &Arc<Vec<u8>>,
        free_stale: bool,
    ) -> Result<mpsc::Receiver<FabricResult<()>>> {
        let windows = self.windows.clone().ok_or(Error::Closed)?;
        if self.replicator.is_none() {
            self.replicator = Some(Replicator::start()?);
        }
        let jobs = self.replicator.as_ref().and_then(|r| r.jobs.as_ref()).ok_or(Error::Closed)?;
        let (done, finished) = mpsc::sync_channel(1);
        let (health, encoded, data) = (self.health.clone(), header.encode(), data.clone());
        let job = Job { windows, health, targets, header, encoded, data, free_stale, done };
        jobs.send(job).map_err(|_| Error::RecoveryFailed("the replicator thread ended".into()))?;
        Ok(finished)
    }
}
