//! The transaction protocol core: multi-key transactions (reads, writes, deletes and
//! conditionals on version or value) with a coordinator whose decision is replicated, written
//! against an abstract [`Backend`]; [`crate::Store::transaction`] runs it on the store (and
//! `ftkv_sim::transactions` runs that on a deterministic world with kills at every step).
//!
//! Protocol of a coordinator `c` running transaction `t` (its id names `c`):
//!
//! 1. **Announce**: the coordinator's transaction record (a key of its own, replicated like any
//!    other, whose holders are its *backups*) gets `Locking` with every key of `t`.
//! 2. **Lock** every key in key order: a compare-and-swap of the key's lock word from free to
//!    `t`, on every holder of the key in route order, so the lock survives as long as one
//!    holder does. A key locked by a live transaction is waited for; one locked by a
//!    transaction whose coordinator failed is waited for until that coordinator's backup
//!    resolved it (below), or resolved here when this coordinator is that backup.
//! 3. **Read** every key and check the conditions; a failed condition releases the locks and
//!    aborts (nothing was written).
//! 4. **Commit**: the record gets `Committed` with every write and its target version (the
//!    version read + 1); once every holder acknowledged it, the outcome is decided.
//! 5. **Apply** every write at its target version, mark the record `Done`, release the locks.
//!
//! When the coordinator fails, its backup (the first live holder of its record, one at a time)
//! resolves the record: a `Committed` record is first written again to every live holder (so
//! a later backup reads the same decision) and then rolled forward (every write again, at the
//! same version with the same bytes: idempotent while the locks stay held in the dead
//! transaction's name); a `Locking` one is marked `Aborted`; then the dead transaction's locks
//! are released. Writes happen only after the commit was acknowledged everywhere,
//! so a transaction is applied on every key or on none. Locks held until after the writes make
//! committed transactions serializable (two-phase locking); reads outside transactions are not
//! isolated from them.
//!
//! A coordinator that survives a failure its transaction could not get past (the store fell
//! back to global recovery, which frees every lock) finishes the transaction itself after the
//! recovery by the same rules ([`finish_own`]) and so learns the decision; the backups finish
//! the failed coordinators' transactions then too ([`resolve_duties`]).

use crate::engine::txn::coordinator::{Command, Coordinator, Event, Op, Refusal};
use crate::engine::txn::resolution::{self, Duty, FinishOwn, ResolveFailed, Resolver};
pub use crate::engine::txn::types::{
    Decision, Expect, Outcome, Reads, RecordState, Resolution, TxId, TxRecord, Txn, FREE,
};
use crate::key::Key;

/// What a transaction failed with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxError<E> {
    /// The backend failed (this process was killed, or the store needs global recovery). If
    /// the record was committed, the backups finish the transaction.
    Backend(E),
    /// A key stayed locked for the whole bound (by this many attempts).
    Contended { key: Key, attempts: usize },
    /// The update wrote a key the transaction did not name (and so did not lock).
    UnlockedWrite { key: Key },
}

impl<E> From<E> for TxError<E> {
    fn from(e: E) -> Self {
        TxError::Backend(e)
    }
}

/// The store operations the protocol runs on. Every call may fail with the backend's error
/// (a kill in the simulator). Replicated writes are atomic per holder, not across holders: a
/// writer that fails midway leaves the new version on some holders, and reads return the
/// newest version on any live holder.
pub trait Backend {
    type Error;
    /// A failure-injection point named after the protocol step about to run.
    fn step(&mut self, name: &'static str) -> Result<(), Self::Error>;
    /// Compare-and-swap of `key`'s lock word on every live holder, in route order: `Ok(None)`
    /// when every holder held `from` (now `to`) or already `to` (an attempt that a holder's
    /// failure interrupted is tried again whole), `Ok(Some(found))` at the first that held
    /// `found` instead (the holders this call swapped were swapped back).
    fn swap_lock(&mut self, key: Key, from: u64, to: u64) -> Result<Option<u64>, Self::Error>;
    /// Frees `key`'s lock word on every live holder where it holds `id` (a compare-and-swap
    /// from `id` to free on each; holders that hold anything else are left alone, so a lock
    /// taken on some holders only is released too).
    fn release_lock(&mut self, key: Key, id: u64) -> Result<(), Self::Error>;
    /// The newest version of `key` and its value.
    fn read(&mut self, key: Key) -> Result<(u64, Option<Vec<u8>>), Self::Error>;
    /// Writes `value` at `version` to every live holder of `key`.
    fn write(&mut self, key: Key, version: u64, value: Option<&[u8]>) -> Result<(), Self::Error>;
    /// The newest transaction record of `coordinator`.
    fn read_record(&mut self, coordinator: i32) -> Result<Option<TxRecord>, Self::Error>;
    /// Writes `coordinator`'s record to every live holder of it (a new version).
    fn write_record(&mut self, coordinator: i32, record: &TxRecord) -> Result<(), Self::Error>;
    /// The failed coordinators whose open transaction this worker must resolve now: it is
    /// their one backup (the first live holder of their record) and has not resolved them yet.
    fn backup_duties(&self) -> Vec<i32>;
    /// Notes that this worker resolved `coordinator` (it drops out of the duties).
    fn resolved(&mut self, coordinator: i32);
    /// Lets others run before a lock is tried again.
    fn wait(&mut self) -> Result<(), Self::Error>;
}

/// Attempts to take one lock before the transaction gives up with [`TxError::Contended`].
pub const LOCK_ATTEMPTS: usize = 10_000;

/// Runs `txn` as transaction `id` on `backend` (see the module's protocol): the runtime of the
/// coordinator's engine ([`crate::engine::txn::coordinator::Coordinator`]), which decides every step while
/// this executes them. Once the locks are held and the conditions hold, `update` computes
/// further writes from every locked key's value (read-modify-write); they must go to keys of
/// `txn` (others are refused with [`TxError::UnlockedWrite`] before anything is written).
pub fn run<B: Backend>(
    backend: &mut B,
    id: TxId,
    txn: &Txn,
    update: impl FnOnce(&Reads) -> Vec<(Key, Option<Vec<u8>>)>,
) -> Result<Outcome, TxError<B::Error>> {
    let mut coordinator = Coordinator::new(id, txn, LOCK_ATTEMPTS);
    let mut update = Some(update);
    let mut event = Event::Start;
    loop {
        event = match coordinator.next(event) {
            Command::Io { step, op } => execute(backend, step, op)?,
            Command::ResolveDutiesAndWait => {
                resolve_duties(backend)?;
                backend.wait()?;
                Event::Done
            }
            Command::Update(locked) => {
                Event::Updated(update.take().map_or_else(Vec::new, |u| u(&locked)))
            }
            Command::Finish(end) => {
                return end.map_err(|refusal| match refusal {
                    Refusal::Contended { key, attempts } => TxError::Contended { key, attempts },
                    Refusal::UnlockedWrite { key } => TxError::UnlockedWrite { key },
                })
            }
        };
    }
}

/// Runs the failure-injection point `step` (when there is one), then `op`, on `backend`; what
/// `op` found. Fails with the first backend error, before `op` when `step` failed.
fn execute<B: Backend>(
    backend: &mut B,
    step: Option<&'static str>,
    op: Op,
) -> Result<Event, B::Error> {
    if let Some(step) = step {
        backend.step(step)?;
    }
    Ok(match op {
        Op::ReadRecord(coordinator) => Event::Record(backend.read_record(coordinator)?),
        Op::WriteRecord(record) => {
            backend.write_record(record.id.coordinator(), &record)?;
            Event::Done
        }
        Op::SwapLock(key, id) => Event::Swapped(backend.swap_lock(key, FREE, id.0)?),
        Op::Read(key) => {
            let (version, value) = backend.read(key)?;
            Event::Read(version, value)
        }
        Op::Write(key, version, value) => {
            backend.write(key, version, value.as_deref())?;
            Event::Done
        }
        Op::ReleaseLock(key, id) => {
            backend.release_lock(key, id.0)?;
            Event::Done
        }
    })
}

/// Resolves every failed coordinator this worker is the backup of. A waiting coordinator does
/// it before every new attempt at a lock: the lock it waits for may be held, directly or
/// through a chain of waiting transactions, by a failed coordinator only it can resolve.
pub fn resolve_duties<B: Backend>(backend: &mut B) -> Result<(), B::Error> {
    for coordinator in backend.backup_duties() {
        resolve(backend, coordinator)?;
        backend.resolved(coordinator);
    }
    Ok(())
}

/// Resolves the open transaction of the failed `coordinator`: the backup's duty, run by one
/// backup at a time (the first live holder of the coordinator's record) once it learns of the
/// failure ([`resolve_duties`]). A committed record is first written again to every live
/// holder, so that a backup that takes over after this one fails reads the same decision. The
/// runtime of [`ResolveFailed`]'s [`Resolver`].
pub fn resolve<B: Backend>(backend: &mut B, coordinator: i32) -> Result<Resolution, B::Error> {
    resolve_for(backend, ResolveFailed { coordinator })
}

/// Finishes the coordinator's own transaction `id` when its [`run`] failed with a backend
/// error that the coordinator survived (a global recovery interrupted it): rolls a `Committed`
/// record forward, aborts a `Locking` one, releases its locks, and returns the decision. No
/// record of `id` (an older transaction's record is the newest) means its announcement never
/// became durable, so nothing of it was written. The runtime of [`FinishOwn`]'s [`Resolver`].
pub fn finish_own<B: Backend>(backend: &mut B, id: TxId) -> Result<Decision, B::Error> {
    resolve_for(backend, FinishOwn { id })
}

/// Runs the resolution of `duty` on `backend`: executes the [`Resolver`]'s commands until it
/// reports. Fails with the first backend error, where the resolution is (the record decides,
/// and the next resolution of it starts again from the record).
fn resolve_for<B: Backend, D: Duty>(backend: &mut B, duty: D) -> Result<D::Report, B::Error> {
    let mut resolver = Resolver::new(duty);
    let mut event = Event::Start;
    loop {
        event = match resolver.next(event) {
            resolution::Command::Io { step, op } => execute(backend, step, op)?,
            resolution::Command::Finish(report) => return Ok(report),
        };
    }
}
