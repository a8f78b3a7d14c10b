//! [`Store::put_async`]: a put that returns once its first copy is complete at its holder,
//! while a replicator thread writes the other copies; [`PendingPut::wait`] (or dropping the
//! handle) completes them.
//!
//! The replicator does not copy the caller's value: it copies the first copy, holder to
//! holder, to the holders on this host, and reads it once for the holders on other hosts.
//! Only when no holder shares this host does the value travel in a buffer of its own. A wait
//! that finds its copies not yet started writes them itself from the caller's value: on a
//! busy node a thread's wake-up costs more than the copies.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Weak};

use super::{Store, Windows};
use crate::config::Recovery;
use crate::detector::{Health, Lane};
use crate::engine::layout::Copy;
use crate::error::{Error, Result};
use crate::fabric::{Fabric, FabricError, FabricResult, FabricWindow};
use crate::key::Key;
use crate::rt::{self, Thread};
use crate::slot::{Header, HEADER_LEN};
use crate::store::halves;

/// The largest value [`Store::put_async`] writes to every holder itself when they all share
/// this host: below it, handing the copies to the replicator thread (a channel message and a
/// thread's wake-up) costs more than the copies it would save.
pub const WRITE_THROUGH_BYTES: usize = 64 << 10;

/// Where the replicator takes a version's bytes from.
enum Source {
    /// The first copy, on a holder on this host: copied holder to holder.
    Holder(Copy),
    /// A copy of the value (no holder shares this host).
    Bytes(Arc<Vec<u8>>),
}

/// What the store keeps for [`Store::put_async`] between calls.
pub(super) struct AsyncState<W> {
    /// The thread that writes the other copies (started by the first asynchronous put that
    /// hands copies off).
    replicator: Option<Replicator<W>>,
    /// The value buffer of the last asynchronous put that needed one, once waited for: the next
    /// one copies its value into it.
    buffer: Option<Vec<u8>>,
    /// The copies of the last asynchronous put, while they are not known complete.
    handoff: Option<Handoff>,
    /// The (key, version) of the asynchronous put last detached and not completed since.
    detached: Option<(Key, u64)>,
}

impl<W> Default for AsyncState<W> {
    fn default() -> Self {
        AsyncState { replicator: None, buffer: None, handoff: None, detached: None }
    }
}

/// One version's other copies, for the replicator thread.
struct Job<W> {
    /// The windows the copies go to, not kept alive by a job in the queue: a job the owner
    /// claimed must not hold windows that the store frees or abandons.
    windows: Weak<Windows<W>>,
    /// Where the watchdog sees the job's one-sided calls ([`Lane::Replicator`]).
    health: Arc<Health>,
    source: Source,
    /// The holders on this host, then those on other hosts.
    local: Vec<Copy>,
    remote: Vec<Copy>,
    header: Header,
    /// Whether an inline value replaces a value in the half's extent (see [`halves::Spills`]).
    free_stale: bool,
    /// Taken by whichever of the replicator and the waiting owner comes first.
    claim: Arc<AtomicBool>,
    done: mpsc::SyncSender<FabricResult<Replicated>>,
}

/// What became of a job's copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replicated {
    /// Every copy holds the version.
    Written,
    /// The first copy no longer held the version when it was copied (a write of another
    /// worker's or a recovery replaced it): the owner writes every copy again from its value.
    SourceChanged,
}

/// The owner's side of a job handed to the replicator.
pub(crate) struct Handoff {
    key: Key,
    header: Header,
    targets: Vec<Copy>,
    free_stale: bool,
    claim: Arc<AtomicBool>,
    done: mpsc::Receiver<FabricResult<Replicated>>,
    /// The job's own copy of the value ([`Source::Bytes`]), kept to be reused.
    staged: Option<Arc<Vec<u8>>>,
}

/// The thread that writes the copies after the first of each asynchronous put, one job at a
/// time, and reports the outcome of each job it runs (a job the owner claimed first is
/// skipped).
pub(crate) struct Replicator<W> {
    jobs: Option<mpsc::Sender<Job<W>>>,
    thread: Option<Thread<()>>,
}

impl<W: FabricWindow> Replicator<W> {
    fn start() -> Result<Replicator<W>> {
        let (jobs, queue) = mpsc::channel::<Job<W>>();
        let thread = rt::spawn("ftkv-replicator", move || {
            disfavour_on_wakeup();
            let mut buffer = Vec::new();
            while let Ok(job) = rt::recv(&queue) {
                if job.claim.swap(true, Ordering::AcqRel) {
                    continue;
                }
                let replicated = match job.windows.upgrade() {
                    Some(windows) => replicate(&job, &windows, &mut buffer),
                    None => Err(FabricError::Other {
                        op: "put_async",
                        msg: "the store's windows were closed".into(),
                    }),
                };
                // The value goes back to its store before the owner learns the outcome.
                let Job { done, source, .. } = job;
                drop(source);
                let _ = done.send(replicated);
            }
        })
        .map_err(|e| Error::RecoveryFailed(format!("starting the replicator thread: {e}")))?;
        Ok(Replicator { jobs: Some(jobs), thread: Some(thread) })
    }
}

/// Keeps the replicator from taking the core of the owner that just handed it a job: on a node
/// with a rank per core the owner would otherwise wait for its own copies to be written.
fn disfavour_on_wakeup() {
    #[cfg(feature = "mpi")]
    if let Err(e) = ftkv_mpi::sched::yield_on_wakeup() {
        crate::events::warn(format!("the replicator thread keeps its scheduling policy: {e}"));
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

/// Writes one job's copies into `windows`, its memory copies and one-sided calls bounded by the
/// watchdog like the owner's (extent writes are not: see [`halves::write_extents`]); `buffer`
/// holds the first copy's bytes for holders on other hosts.
fn replicate<W: FabricWindow>(
    job: &Job<W>,
    windows: &Windows<W>,
    buffer: &mut Vec<u8>,
) -> FabricResult<Replicated> {
    match &job.source {
        Source::Holder(first) => copy_from_holder(job, windows, first, buffer),
        Source::Bytes(data) => {
            write_version(job, windows, &job.local, data)?;
            write_version(job, windows, &job.remote, data).map(|()| Replicated::Written)
        }
    }
}

/// Runs `call`, which moves about `bytes`, as one call of the replicator's watchdog lane.
fn watched<W, T>(job: &Job<W>, bytes: usize, call: impl FnOnce() -> T) -> T {
    job.health.enter_call_on(Lane::Replicator, bytes);
    let out = call();
    job.health.leave_call_on(Lane::Replicator);
    out
}

/// The first copy to the holders on this host holder to holder, and, read once into
/// `buffer`, to those on other hosts.
fn copy_from_holder<W: FabricWindow>(
    job: &Job<W>,
    windows: &Windows<W>,
    first: &Copy,
    buffer: &mut Vec<u8>,
) -> FabricResult<Replicated> {
    let (window, geometry, header) = (windows.window(), windows.geometry(), &job.header);
    if !job.local.is_empty() {
        let bytes = (header.len as usize + HEADER_LEN) * job.local.len();
        let copied = watched(job, bytes, || {
            let free_stale = job.free_stale;
            halves::copy_between_holders(window, first, &job.local, geometry, header, free_stale)
        })?;
        if !copied {
            return Ok(Replicated::SourceChanged);
        }
    }
    if job.remote.is_empty() {
        return Ok(Replicated::Written);
    }
    let half = (header.version % 2) as usize;
    let read = watched(job, header.len as usize + HEADER_LEN, || {
        halves::read_data_into(window, first, geometry, half, header, buffer)
    })?;
    if !read {
        return Ok(Replicated::SourceChanged);
    }
    write_version(job, windows, &job.remote, buffer).map(|()| Replicated::Written)
}

/// `data`, the job's version, to every copy of `targets`.
fn write_version<W: FabricWindow>(
    job: &Job<W>,
    windows: &Windows<W>,
    targets: &[Copy],
    data: &[u8],
) -> FabricResult<()> {
    if targets.is_empty() {
        return Ok(());
    }
    let (window, geometry) = (windows.window(), windows.geometry());
    halves::write_extents(window, targets, geometry, &job.header, data)?;
    let encoded = job.header.encode();
    let out = halves::Outgoing {
        header: job.header,
        encoded: &encoded,
        data,
        free_stale: job.free_stale,
    };
    let bytes = halves::inline_bytes(geometry, data) * targets.len();
    watched(job, bytes, || window.scope(|s| halves::issue_version(s, targets, geometry, &out)))
}

/// A put of [`Store::put_async`] whose first copy is complete and whose other copies are being
/// written. It borrows the store and the value: the program computes meanwhile, then waits.
///
/// [`PendingPut::wait`] returns what [`Store::put`] would have: `Ok` once every copy holds the
/// value. Dropping the handle waits too; an error then surfaces at the store's next call (the
/// failure stays known), so call `wait` to see it here. A handle that is leaked
/// (`std::mem::forget`) is completed by the replicator, which copies from the first copy; the
/// store's next write, asynchronous put, barrier or recovery waits for it.
#[must_use = "the other copies are complete only once the handle is waited for or dropped"]
pub struct PendingPut<'s, F: Fabric> {
    store: &'s mut Store<F>,
    key: Key,
    value: &'s [u8],
    /// The version written, until waited for; `None` once waited for.
    header: Option<Header>,
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

    /// This put without its borrows, for a caller that cannot hold them (the C API keeps the
    /// caller's pointer instead): nothing is waited for. [`Store::wait_detached`] waits for it
    /// with the same value, as [`PendingPut::wait`] would; [`Store::release_detached`] and the
    /// store's next write, asynchronous put, barrier or recovery complete its copies from the
    /// first copy instead, as for a leaked handle, and a later `wait_detached` is refused.
    pub fn detach(mut self) -> DetachedPut {
        let header = self.header.take();
        if let Some(header) = header {
            self.store.asynchronous.detached = Some((self.key, header.version));
        }
        DetachedPut { key: self.key, header, len: self.value.len() }
    }

    fn finish(&mut self) -> Result<()> {
        let Some(header) = self.header.take() else { return Ok(()) };
        let (store, key, value) = (&mut *self.store, self.key, self.value);
        let written = store
            .complete_handoff(Some(value))
            .and_then(|()| store.route(key).and_then(|route| store.ensure_alive(route)));
        match written {
            Err(e) if e.needs_recovery() && store.config.recovery == Recovery::Localized => {
                store.write(key, header, value)?;
            }
            written => written?,
        }
        store.acked.set(key.kind as usize, header.version);
        let geometry = store.routes.geometry();
        store.spills.written(key, header.version, value.len(), geometry);
        if !store.lost.is_empty() {
            store.lost.retain(|&k| k != key);
        }
        Ok(())
    }
}

/// A [`PendingPut`] detached from the store and the value ([`PendingPut::detach`]).
#[must_use = "wait for it with Store::wait_detached"]
#[derive(Debug)]
pub struct DetachedPut {
    key: Key,
    /// The version written, `None` when every copy was written before `put_async` returned.
    header: Option<Header>,
    len: usize,
}

impl DetachedPut {
    /// The length of the value the put writes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the put writes an empty value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
    /// copies are handed to a replicator thread, which copies them from the first. The
    /// returned handle borrows `value` until it is waited for ([`PendingPut::wait`], or when
    /// dropped); a wait that finds the copies not started yet writes them itself. A value of at
    /// most [`WRITE_THROUGH_BYTES`] whose holders all share this host, and any value of a key
    /// with one copy, is written to every copy before this returns, as [`Store::put`] does:
    /// handing it off would cost more than the copies.
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
    pub fn put_async<'s>(&'s mut self, key: Key, value: &'s [u8]) -> Result<PendingPut<'s, F>> {
        if self.writes_through(key, value.len()) {
            self.put(key, value)?;
            return Ok(PendingPut { store: self, key, value, header: None });
        }
        self.check_own(key)?;
        self.check_value(value)?;
        self.complete_handoff(None)?;
        let version = self.next_own_version(key);
        let header = Header::for_ordered_value(value.len(), version, self.epoch()?, self.me);
        match self.start_async(key, header, value) {
            Err(e) if e.needs_recovery() && self.config.recovery == Recovery::Localized => {
                // A failure met on the way: the blocking write follows it and writes every copy.
                self.write(key, header, value)?;
            }
            started => started?,
        }
        Ok(PendingPut { store: self, key, value, header: Some(header) })
    }

    /// Waits for a detached asynchronous put ([`PendingPut::detach`]) as [`PendingPut::wait`]
    /// does. `value` must hold the bytes the put was given, unchanged: a copy the replicator
    /// has not started is written from it.
    ///
    /// Completion and failure as [`PendingPut::wait`]. Refused before anything is written:
    /// a value of another length than the put's ([`Error::ValueMismatch`]; the put stays
    /// pending), and a put that is not this store's pending one ([`Error::NotPending`]: a
    /// later write or [`Store::release_detached`] completed it, or another store made it).
    pub fn wait_detached(&mut self, put: DetachedPut, value: &[u8]) -> Result<()> {
        let Some(header) = put.header else { return Ok(()) };
        if self.asynchronous.detached != Some((put.key, header.version)) {
            return Err(Error::NotPending { key: put.key });
        }
        if value.len() != put.len {
            return Err(Error::ValueMismatch { expected: put.len, given: value.len() });
        }
        self.asynchronous.detached = None;
        PendingPut { store: self, key: put.key, value, header: put.header }.wait()
    }

    /// Completes a detached asynchronous put without its value: the replicator writes its
    /// copies from the first copy, as for a leaked handle, and this waits for it. The put is
    /// not acknowledged: a failure it met is left to the detector and the store's next call.
    /// A put that is not this store's pending one is left alone.
    pub fn release_detached(&mut self, put: DetachedPut) {
        if put.header.is_some_and(|h| self.asynchronous.detached == Some((put.key, h.version))) {
            let _ = self.complete_handoff(None);
        }
    }

    /// Whether [`Store::put_async`] writes every copy of `key` itself: when it has one copy
    /// (the first is all there is), or when all its holders share this host and the value is at
    /// most [`WRITE_THROUGH_BYTES`], copying it to them costs less than handing it to the
    /// replicator thread.
    fn writes_through(&self, key: Key, len: usize) -> bool {
        let cheap = |route: &[Copy]| {
            route.len() <= 1
                || (len <= WRITE_THROUGH_BYTES && route.iter().all(|c| self.shares_host(c)))
        };
        self.routes.route(key).is_some_and(cheap)
    }

    fn shares_host(&self, copy: &Copy) -> bool {
        self.hosts[copy.worker as usize] == self.hosts[self.me as usize]
    }

    /// Writes the first copy of `header`'s version (on this host when a holder is here) and
    /// hands the others to the replicator.
    fn start_async(&mut self, key: Key, header: Header, value: &[u8]) -> Result<()> {
        if self.config.recovery == Recovery::Localized {
            self.follow_failures(Some(key))?;
        }
        self.ensure_healthy()?;
        self.ensure_not_suspended();
        let route = self.route(key)?;
        self.ensure_alive(route)?;
        let mut copies = route.to_vec();
        // The first copy on this host when there is one: shared memory returns soonest, and
        // the replicator copies from it.
        let local = copies.iter().position(|c| self.shares_host(c));
        if let Some(local) = local {
            copies.swap(0, local);
        }
        let first = copies.remove(0);
        let geometry = self.routes.geometry();
        let free_stale = self.spills.stale(key, header.version, value.len(), geometry);
        self.put_to(std::slice::from_ref(&first), header, value, free_stale)?;
        let source = match local {
            Some(_) => Source::Holder(first),
            None => Source::Bytes(Arc::new(self.staged(value))),
        };
        self.replicate(key, header, copies, source, free_stale)
    }

    /// A copy of `value` for the replicator, in the buffer the last such copy gave back when
    /// there is one: a fresh allocation of a large value costs its pages' faults on every put.
    fn staged(&mut self, value: &[u8]) -> Vec<u8> {
        let mut buffer = self.asynchronous.buffer.take().unwrap_or_default();
        buffer.clear();
        buffer.extend_from_slice(value);
        buffer
    }

    /// Hands the copies of `header`'s version to `targets` to the replicator thread (started
    /// on first use); [`Store::complete_handoff`] completes them.
    fn replicate(
        &mut self,
        key: Key,
        header: Header,
        targets: Vec<Copy>,
        source: Source,
        free_stale: bool,
    ) -> Result<()> {
        let windows = Arc::downgrade(self.windows.as_ref().ok_or(Error::Closed)?);
        if self.asynchronous.replicator.is_none() {
            self.asynchronous.replicator = Some(Replicator::start()?);
        }
        let jobs = self
            .asynchronous
            .replicator
            .as_ref()
            .and_then(|r| r.jobs.as_ref())
            .ok_or(Error::Closed)?;
        let (local, remote) = targets.iter().partition(|c| self.shares_host(c));
        let (done, finished) = mpsc::sync_channel(1);
        let claim = Arc::new(AtomicBool::new(false));
        let staged = match &source {
            Source::Bytes(data) => Some(data.clone()),
            Source::Holder(_) => None,
        };
        let health = self.health.clone();
        let job = Job {
            windows,
            health,
            source,
            local,
            remote,
            header,
            free_stale,
            claim: claim.clone(),
            done,
        };
        jobs.send(job).map_err(|_| Error::RecoveryFailed("the replicator thread ended".into()))?;
        self.asynchronous.handoff =
            Some(Handoff { key, header, targets, free_stale, claim, done: finished, staged });
        Ok(())
    }

    /// Completes the copies handed to the replicator, if any: when it has not started them,
    /// writes them from `value`; otherwise waits for its report. `None` stands for a handle
    /// that was leaked: the replicator, which copies from the first copy, then writes them, and
    /// this waits for it; its outcome concerns a version nobody waits for, so a failure it met
    /// is left to the detector and the next call rather than returned here. A first copy that
    /// changed before the replicator copied it makes the owner write every copy again from
    /// `value`.
    pub(super) fn complete_handoff(&mut self, value: Option<&[u8]>) -> Result<()> {
        if value.is_none() {
            self.asynchronous.detached = None;
        }
        let Some(handoff) = self.asynchronous.handoff.take() else { return Ok(()) };
        let Some(value) = value else {
            if let Ok(Err(e)) = rt::recv(&handoff.done) {
                let _ = self.failure(e);
            }
            return Ok(());
        };
        let replicated = if !handoff.claim.swap(true, Ordering::AcqRel) {
            self.write_handed_off(&handoff, value).map(|()| Replicated::Written)
        } else {
            match rt::recv(&handoff.done) {
                Ok(replicated) => replicated.map_err(|e| self.failure(e)),
                Err(_) => Err(self.failure(FabricError::Other {
                    op: "put_async",
                    msg: "the replicator ended".into(),
                })),
            }
        };
        if let Some(staged) = handoff.staged {
            self.asynchronous.buffer = Arc::try_unwrap(staged).ok();
        }
        if replicated? == Replicated::SourceChanged {
            self.write(handoff.key, handoff.header, value)?;
        }
        Ok(())
    }

    /// The copies of a hand-off that the replicator had not started, written by the owner with
    /// the checks of a blocking put's write.
    fn write_handed_off(&self, handoff: &Handoff, value: &[u8]) -> Result<()> {
        self.ready_to_write(&handoff.targets)?;
        self.put_to(&handoff.targets, handoff.header, value, handoff.free_stale)
    }
}
