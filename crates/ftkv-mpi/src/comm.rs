//! Communicators: point-to-point messages, collectives, and the ULFM failure calls.

use std::ffi::c_int;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use crate::error::{check, MpiError, Result};
use crate::ffi;
pub use crate::request::Status;
use crate::request::{byte_count, status_from, RecvRequest, SendRequest};
use crate::runtime::{Mpi, Runtime};

/// Matches a message from any source (`MPI_ANY_SOURCE`).
pub const ANY_SOURCE: i32 = -1;
/// Matches a message with any tag (`MPI_ANY_TAG`).
pub const ANY_TAG: i32 = -1;
/// Tag of [`Comm::connect_pairs`]'s messages (on a private duplicate, so no user tag clashes).
const CONNECT_TAG: i32 = 15;

/// The outcome of [`Comm::agree`]: the bitwise AND of all survivors' flags, and whether some
/// process failed that this rank had not acknowledged (ULFM reports that, yet the value is
/// agreed upon by every surviving process either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreed {
    pub value: u32,
    pub unacknowledged_failures: bool,
}

/// An agreement begun by [`Comm::start_agree`]. Dropped before it completed, its request and
/// flag are leaked: MPI still writes the outcome, and an agreement cannot be cancelled.
pub struct PendingAgreement {
    raw: ffi::MPI_Request,
    /// The flag MPI writes the outcome into; `None` once the agreement completed.
    value: Option<Box<c_int>>,
    outcome: Option<Agreed>,
    _inside: RwLockReadGuard<'static, ()>,
}

impl PendingAgreement {
    /// Whether the agreement completed, making MPI progress: `Some` with the outcome as
    /// [`Comm::agree`] gives it once it did, `None` while it runs. Fails with an error of no
    /// failure class; after completion it keeps returning the same outcome.
    pub fn test(&mut self) -> Result<Option<Agreed>> {
        let Some(value) = &self.value else { return Ok(self.outcome) };
        let mut flag: c_int = 0;
        let mut status = ffi::MPI_Status::default();
        // SAFETY: `self.raw` is the agreement's active request; out-pointers are valid.
        let rc = unsafe { ffi::MPI_Test(&mut self.raw, &mut flag, &mut status) };
        let agreed =
            |unacknowledged_failures| Agreed { value: **value as u32, unacknowledged_failures };
        let outcome = match check(rc, "MPIX_Comm_iagree") {
            Ok(()) if flag == 0 => return Ok(None),
            Ok(()) => agreed(false),
            Err(MpiError::ProcFailed { .. }) => agreed(true),
            Err(e) => return Err(e),
        };
        self.value = None;
        self.outcome = Some(outcome);
        Ok(Some(outcome))
    }
}

impl Drop for PendingAgreement {
    fn drop(&mut self) {
        if let Some(value) = self.value.take() {
            Box::leak(value);
        }
    }
}

/// Held shared by every thread of this process inside a fault-tolerant call (revoke, shrink,
/// agree), and tried exclusively by [`Comm::progress_beside_fault_tolerant_calls`].
static FAULT_TOLERANT_CALLS: RwLock<()> = RwLock::new(());

/// Runs `call` unless a thread of this process is inside a fault-tolerant call, which `call`
/// must not run beside when it makes MPI progress (see
/// [`Comm::progress_beside_fault_tolerant_calls`]); `None` when one is.
pub fn beside_fault_tolerant_calls<R>(call: impl FnOnce() -> R) -> Option<R> {
    let _alone = FAULT_TOLERANT_CALLS.try_write().ok()?;
    Some(call())
}

/// Marks the calling thread inside a fault-tolerant call until the guard drops.
fn inside_fault_tolerant_call() -> RwLockReadGuard<'static, ()> {
    FAULT_TOLERANT_CALLS.read().unwrap_or_else(PoisonError::into_inner)
}

/// An MPI communicator with `MPI_ERRORS_RETURN`. Freed on drop unless predefined.
///
/// All methods may be called from several threads at once (MPI runs `MPI_THREAD_MULTIPLE`).
#[derive(Debug)]
pub struct Comm {
    raw: ffi::MPI_Comm,
    owned: bool,
    rank: i32,
    size: i32,
    runtime: Arc<Runtime>,
}

// SAFETY: MPI is initialised with MPI_THREAD_MULTIPLE, so a communicator handle may be used from
// any thread concurrently; the handle is an immutable pointer owned by this value.
unsafe impl Send for Comm {}
// SAFETY: as above; no method mutates Rust-side state.
unsafe impl Sync for Comm {}

impl Comm {
    pub(crate) fn predefined(raw: ffi::MPI_Comm, runtime: Arc<Runtime>) -> Result<Comm> {
        let (rank, size) = query_rank_size(raw)?;
        Ok(Comm { raw, owned: false, rank, size, runtime })
    }

    pub(crate) fn owned(raw: ffi::MPI_Comm, runtime: Arc<Runtime>) -> Result<Comm> {
        let (rank, size) = query_rank_size(raw)?;
        Ok(Comm { raw, owned: true, rank, size, runtime })
    }

    pub(crate) fn raw(&self) -> ffi::MPI_Comm {
        self.raw
    }

    pub(crate) fn runtime(&self) -> Arc<Runtime> {
        self.runtime.clone()
    }

    /// This process's rank in the communicator.
    pub fn rank(&self) -> i32 {
        self.rank
    }

    /// An id of the host this process runs on: equal for processes on one host (the same
    /// processor name), different otherwise (up to 32-bit hash collisions). Local.
    pub fn host_id(&self) -> Result<u32> {
        let name = crate::runtime::processor_name()?;
        Ok(name.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ b as u32).wrapping_mul(0x0100_0193)))
    }

    /// Number of processes in the communicator (dead ones included until a shrink).
    pub fn size(&self) -> i32 {
        self.size
    }

    /// `MPI_Comm_dup`: a new communicator with the same group and its own message space.
    /// Collective; fails with `ProcFailed` if a member is dead. Returns once every live member
    /// has left the call: the members then agree on whether all of them got the new
    /// communicator, and each frees its own and fails with `ProcFailed` if not. (Open MPI
    /// 5.0.11 crashes a process that learns of a failure while still inside the call.)
    pub fn dup(&self) -> Result<Comm> {
        let mut raw = null_comm();
        let dup = || {
            // SAFETY: `self.raw` is a valid communicator; `raw` is a valid out-pointer.
            unsafe { ffi::MPI_Comm_dup(self.raw, &mut raw) }
        };
        let created = self.collective("MPI_Comm_dup", dup);
        self.creation_agreed(created, raw, "MPI_Comm_dup")
    }

    /// `MPI_Comm_split`: the members that pass the same `color`, ordered by `key` (ties by rank).
    /// Collective; fails with `ProcFailed` if a member is dead. Returns once every live member
    /// has left the call: the members then agree on whether all of them got the new
    /// communicator, and each frees its own and fails with `ProcFailed` if not. (Open MPI
    /// 5.0.11 crashes a process that learns of a failure while still inside the call.)
    pub fn split(&self, color: i32, key: i32) -> Result<Comm> {
        let mut raw = null_comm();
        let split = || {
            // SAFETY: `self.raw` is a valid communicator; `raw` is a valid out-pointer.
            unsafe { ffi::MPI_Comm_split(self.raw, color, key, &mut raw) }
        };
        let created = self.collective("MPI_Comm_split", split);
        self.creation_agreed(created, raw, "MPI_Comm_split")
    }

    /// Ends a communicator creation on this communicator (`created` and `raw` from the
    /// creating call `op`): every member agrees on whether all of them got the new communicator, and
    /// keeps it only then; otherwise each frees its own and fails with `ProcFailed`.
    ///
    /// Open MPI 5.0.11 crashes a process that learns of a failure while it is still inside a
    /// communicator's creation (SIGSEGV in `ompi_comm_revoke_local`, called for the half-built
    /// communicator, which has no collective module yet). A member that returned early and
    /// went on could fail, or revoke, while another was still inside (seen: a rank slow to
    /// finish `MPI_Comm_dup` for its store's detector on a loaded machine crashed when another
    /// rank, already writing, was killed). After the agreement nobody is inside. It runs on
    /// this communicator, which every member has, not on the new one: a creation can fail on
    /// some members and succeed on others, and the new communicator's members would wait for
    /// those that never got it. A failure the agreement meets once all got the new
    /// communicator is left to the next call on it.
    fn creation_agreed(
        &self,
        created: Result<()>,
        raw: ffi::MPI_Comm,
        op: &'static str,
    ) -> Result<Comm> {
        let created = created.and_then(|()| Comm::owned(raw, self.runtime.clone()));
        let agreed = self.agree(u32::from(created.is_ok()))?;
        match created {
            Ok(comm) if agreed.value == 1 => Ok(comm),
            Ok(_) => Err(MpiError::ProcFailed { op, peer: None }),
            Err(e) => Err(e),
        }
    }

    /// Opens the transport connection of every pair of members from one side, the lower rank,
    /// one distance at a time (collective). Open MPI's TCP transport can lose a connection that
    /// both sides open at the same moment from several threads ("Epoll ADD ... Bad file
    /// descriptor", after which that pair's messages stall); the connections belong to the
    /// process pairs, so once opened here they serve every communicator between them. Call it
    /// before other threads message across hosts.
    pub fn connect_pairs(&self) -> Result<()> {
        let (me, n) = (self.rank, self.size);
        let mut byte = [0u8; 1];
        for distance in 1..n {
            let up = (me + distance) % n;
            let down = (me - distance).rem_euclid(n);
            if me < up {
                self.send(&[1], up, CONNECT_TAG)?;
            }
            if down < me {
                self.recv(&mut byte, down, CONNECT_TAG)?;
            }
        }
        self.barrier()
    }

    /// `MPI_Barrier`. Returns `ProcFailed` (or `Revoked`) instead of hanging when a member died.
    pub fn barrier(&self) -> Result<()> {
        // SAFETY: `self.raw` is a valid communicator.
        let barrier = || unsafe { ffi::MPI_Barrier(self.raw) };
        self.collective("MPI_Barrier", barrier)
    }

    /// Runs `call`, a blocking collective `op` on this communicator, and checks its return
    /// code: an error of no failure class while ULFM learned of a failed member during the
    /// call (or the communicator was revoked) is the failure it is, `ProcFailed`; any other
    /// error is returned as MPI gave it.
    ///
    /// Open MPI 5.0 returns `MPI_ERR_OTHER` from a blocking collective that a member's death
    /// interrupts, under `MPI_THREAD_MULTIPLE`, to the process whose internal wait the failure
    /// woke: the root of the linear barrier it picks for small communicators
    /// (`docs/limits.md`, `tests/c/barrier_after_failure.c` in `ftkv-capi`).
    pub(crate) fn collective(&self, op: &'static str, call: impl FnOnce() -> c_int) -> Result<()> {
        // A count that cannot be read counts as none: an error then reads as a failure if
        // ULFM knows any failed member afterwards (the communicator is unusable either way).
        let known_before = self.failed_count().unwrap_or(0);
        let rc = call();
        match check(rc, op) {
            Err(MpiError::Other { .. }) if self.failure_since(known_before) => {
                Err(MpiError::ProcFailed { op, peer: None })
            }
            outcome => outcome,
        }
    }

    /// True when the communicator is revoked or ULFM knows more than `known_before` failed
    /// members (and when asking fails: the communicator is then unusable as a failed one is).
    fn failure_since(&self, known_before: i32) -> bool {
        self.is_revoked().unwrap_or(true) || self.failed_count().map_or(true, |n| n > known_before)
    }

    /// The number of members ULFM knows failed (`MPIX_Comm_get_failed`), acknowledging none.
    fn failed_count(&self) -> Result<i32> {
        self.failed_group()?.size()
    }

    /// The group of members ULFM knows failed (`MPIX_Comm_get_failed`). Local.
    fn failed_group(&self) -> Result<Group> {
        let mut failed = null_group();
        // SAFETY: `self.raw` is a valid communicator; `failed` a valid out-pointer.
        let rc = unsafe { ffi::MPIX_Comm_get_failed(self.raw, &mut failed) };
        check(rc, "MPIX_Comm_get_failed")?;
        Ok(Group(failed))
    }

    /// `MPI_Allgather` of `send.len()` bytes per rank; the result holds rank 0's bytes first.
    /// Every rank must pass the same length.
    pub fn allgather(&self, send: &[u8]) -> Result<Vec<u8>> {
        let count = byte_count(send.len(), "MPI_Allgather")?;
        let mut out = vec![0u8; send.len() * self.size as usize];
        let gather = || {
            // SAFETY: `send` holds `count` bytes, `out` holds `count * size` bytes; both
            // outlive the blocking call.
            unsafe {
                ffi::MPI_Allgather(
                    send.as_ptr().cast(),
                    count,
                    ffi::ftkv_type_byte,
                    out.as_mut_ptr().cast(),
                    count,
                    ffi::ftkv_type_byte,
                    self.raw,
                )
            }
        };
        self.collective("MPI_Allgather", gather)?;
        Ok(out)
    }

    /// Blocking `MPI_Send`. Small messages are buffered (eager): success does **not** prove the
    /// destination alive. Large messages return `ProcFailed` when the destination died.
    pub fn send(&self, data: &[u8], dest: i32, tag: i32) -> Result<()> {
        let count = byte_count(data.len(), "MPI_Send")?;
        // SAFETY: `data` holds `count` bytes and outlives the blocking call.
        let rc = unsafe {
            ffi::MPI_Send(data.as_ptr().cast(), count, ffi::ftkv_type_byte, dest, tag, self.raw)
        };
        check(rc, "MPI_Send").map_err(|e| e.with_peer(dest))
    }

    /// Blocking synchronous send (`MPI_Ssend`): returns once the receive has started, so success
    /// proves the destination was alive.
    pub fn ssend(&self, data: &[u8], dest: i32, tag: i32) -> Result<()> {
        let count = byte_count(data.len(), "MPI_Ssend")?;
        // SAFETY: `data` holds `count` bytes and outlives the blocking call.
        let rc = unsafe {
            ffi::MPI_Ssend(data.as_ptr().cast(), count, ffi::ftkv_type_byte, dest, tag, self.raw)
        };
        check(rc, "MPI_Ssend").map_err(|e| e.with_peer(dest))
    }

    /// Blocking `MPI_Recv` into `buf`; fails with `ProcFailed` when `source` died (it does not hang
    /// on a dead source, but it does wait forever for a live one that never sends).
    pub fn recv(&self, buf: &mut [u8], source: i32, tag: i32) -> Result<Status> {
        let count = byte_count(buf.len(), "MPI_Recv")?;
        let mut status = ffi::MPI_Status::default();
        // SAFETY: `buf` holds `count` writable bytes; `status` is a valid out-pointer.
        let rc = unsafe {
            ffi::MPI_Recv(
                buf.as_mut_ptr().cast(),
                count,
                ffi::ftkv_type_byte,
                source,
                tag,
                self.raw,
                &mut status,
            )
        };
        check(rc, "MPI_Recv").map_err(|e| e.with_peer(source))?;
        status_from(&status)
    }

    /// Nonblocking send of an owned buffer (`MPI_Isend`).
    pub fn isend(&self, data: Vec<u8>, dest: i32, tag: i32) -> Result<SendRequest> {
        SendRequest::start(self.raw, data, dest, tag, false)
    }

    /// Nonblocking synchronous send (`MPI_Issend`): completes once the receive has started.
    pub fn issend(&self, data: Vec<u8>, dest: i32, tag: i32) -> Result<SendRequest> {
        SendRequest::start(self.raw, data, dest, tag, true)
    }

    /// Nonblocking receive of at most `capacity` bytes (`MPI_Irecv`).
    pub fn irecv(&self, capacity: usize, source: i32, tag: i32) -> Result<RecvRequest> {
        RecvRequest::start(self.raw, capacity, source, tag)
    }

    /// `MPI_Iprobe`: the status of a matching pending message, if any. Makes MPI progress.
    pub fn iprobe(&self, source: i32, tag: i32) -> Result<Option<Status>> {
        let mut flag: c_int = 0;
        let mut status = ffi::MPI_Status::default();
        // SAFETY: `flag` and `status` are valid out-pointers.
        let rc = unsafe { ffi::MPI_Iprobe(source, tag, self.raw, &mut flag, &mut status) };
        check(rc, "MPI_Iprobe")?;
        if flag == 0 {
            return Ok(None);
        }
        status_from(&status).map(Some)
    }

    /// Makes MPI progress (an `MPI_Iprobe` with `tag`) unless a thread of this process is inside
    /// a fault-tolerant call ([`Comm::revoke`], [`Comm::shrink`], [`Comm::agree`]), which makes
    /// progress itself. Beside one, Open MPI 5.0.11 fails: its agreement crashes (SIGSEGV in
    /// `ompi_errhandler_proc_failed_internal`) when another thread runs its callbacks from
    /// `opal_progress`; its revoke, whose reliable broadcast also sends to dead members, can
    /// wait forever over TCP (closing a dead peer's endpoint under that endpoint's lock, it waits
    /// in libevent's `event_del` for a receive callback that the other thread's progress runs
    /// and that waits for the same lock). `true` when it made progress.
    pub fn progress_beside_fault_tolerant_calls(&self, tag: i32) -> Result<bool> {
        beside_fault_tolerant_calls(|| self.iprobe(ANY_SOURCE, tag).map(|_| true))
            .unwrap_or(Ok(false))
    }

    /// A round trip to `dest`: sends an 8-byte ping with `ping_tag` and waits for the answer
    /// with `pong_tag`, which `dest` gives from [`Comm::answer_pings`]. Returns the round-trip
    /// time, `ProcFailed` once MPI knows `dest` is dead, or `Timeout` after `timeout`.
    pub fn ping(
        &self,
        dest: i32,
        ping_tag: i32,
        pong_tag: i32,
        timeout: Duration,
    ) -> Result<Duration> {
        let start = Instant::now();
        let deadline = start + timeout;
        let pong = self.irecv(8, dest, pong_tag)?;
        let ping = self.isend(0u64.to_le_bytes().to_vec(), dest, ping_tag)?;
        ping.wait_until(deadline, timeout).map_err(|e| e.with_peer(dest))?;
        pong.wait_until(deadline, timeout).map_err(|e| e.with_peer(dest))?;
        Ok(start.elapsed())
    }

    /// Answers every pending ping (from any source) with `ping_tag` by a pong with `pong_tag`;
    /// returns how many were answered. Call it from a helper thread's polling loop.
    pub fn answer_pings(&self, ping_tag: i32, pong_tag: i32) -> Result<usize> {
        let mut answered = 0;
        while let Some(status) = self.iprobe(ANY_SOURCE, ping_tag)? {
            let mut buf = [0u8; 8];
            self.recv(&mut buf, status.source, ping_tag)?;
            self.send(&buf, status.source, pong_tag)?;
            answered += 1;
        }
        Ok(answered)
    }

    /// `MPIX_Comm_revoke`: every member's pending and future operations on this communicator
    /// (except shrink, agree, ack and get_failed) fail with `Revoked`. Local, does not block
    /// (no other thread of this process progresses MPI meanwhile: see
    /// [`Comm::progress_beside_fault_tolerant_calls`]).
    pub fn revoke(&self) -> Result<()> {
        let inside = inside_fault_tolerant_call();
        // SAFETY: `self.raw` is a valid communicator.
        let rc = unsafe { ffi::MPIX_Comm_revoke(self.raw) };
        drop(inside);
        check(rc, "MPIX_Comm_revoke")
    }

    /// `MPIX_Comm_is_revoked`.
    pub fn is_revoked(&self) -> Result<bool> {
        let mut flag: c_int = 0;
        // SAFETY: `self.raw` is a valid communicator; `flag` a valid out-pointer.
        check(unsafe { ffi::MPIX_Comm_is_revoked(self.raw, &mut flag) }, "MPIX_Comm_is_revoked")?;
        Ok(flag != 0)
    }

    /// `MPIX_Comm_shrink`: a new communicator of the surviving members (collective over them),
    /// ranks renumbered in the old order. Works on a revoked communicator.
    ///
    /// Returns once every live member has the new communicator: an agreement on it follows the
    /// shrink (every process that returns from a shrink is a member, so all of them join), for
    /// the reason `dup` ends with one.
    pub fn shrink(&self) -> Result<Comm> {
        let mut raw = null_comm();
        let inside = inside_fault_tolerant_call();
        // SAFETY: `self.raw` is a valid communicator; `raw` a valid out-pointer.
        let rc = unsafe { ffi::MPIX_Comm_shrink(self.raw, &mut raw) };
        drop(inside);
        check(rc, "MPIX_Comm_shrink")?;
        let shrunk = Comm::owned(raw, self.runtime.clone())?;
        shrunk.agree(1)?;
        Ok(shrunk)
    }

    /// `MPIX_Comm_agree`: fault-tolerant consensus on the bitwise AND of `flag` over the
    /// surviving members. Works on a revoked communicator.
    pub fn agree(&self, flag: u32) -> Result<Agreed> {
        let mut value = flag as c_int;
        let inside = inside_fault_tolerant_call();
        // SAFETY: `self.raw` is a valid communicator; `value` a valid in/out pointer.
        let rc = unsafe { ffi::MPIX_Comm_agree(self.raw, &mut value) };
        drop(inside);
        match check(rc, "MPIX_Comm_agree") {
            Ok(()) => Ok(Agreed { value: value as u32, unacknowledged_failures: false }),
            Err(MpiError::ProcFailed { .. }) => {
                Ok(Agreed { value: value as u32, unacknowledged_failures: true })
            }
            Err(e) => Err(e),
        }
    }

    /// Starts [`Comm::agree`] without waiting for it (`MPIX_Comm_iagree`): the caller polls
    /// [`PendingAgreement::test`] and may do other MPI work meanwhile (a recovery of another
    /// communicator). Until it completes, this thread counts as inside a fault-tolerant call
    /// ([`Comm::progress_beside_fault_tolerant_calls`] does not progress beside it), since
    /// Open MPI's agreement must not be progressed by two threads at once.
    pub fn start_agree(&self, flag: u32) -> Result<PendingAgreement> {
        let inside = inside_fault_tolerant_call();
        let mut value = Box::new(flag as c_int);
        // SAFETY: reading an immutable handle exported by the C shim.
        let mut raw = unsafe { ffi::ftkv_request_null };
        // SAFETY: `self.raw` is a valid communicator; `value` is heap memory that outlives the
        // request (the pending agreement owns it and leaks it if dropped unfinished); `raw` a
        // valid out-pointer.
        let rc = unsafe { ffi::MPIX_Comm_iagree(self.raw, &mut *value, &mut raw) };
        check(rc, "MPIX_Comm_iagree")?;
        Ok(PendingAgreement { raw, value: Some(value), outcome: None, _inside: inside })
    }

    /// The ranks (in this communicator) that this process knows to have failed
    /// (`MPIX_Comm_get_failed`), sorted; acknowledges them (`MPIX_Comm_ack_failed`) so that
    /// `ANY_SOURCE` receives and [`Comm::agree`] proceed. Local; the set only grows while MPI makes
    /// progress on this process.
    pub fn failed_ranks(&self) -> Result<Vec<i32>> {
        let failed = self.failed_group()?;
        let members = failed.size()?;
        let ranks = failed.translate_into(&self.group()?, members)?;
        let mut acked: c_int = 0;
        // SAFETY: `self.raw` is a valid communicator; `acked` a valid out-pointer.
        let rc = unsafe { ffi::MPIX_Comm_ack_failed(self.raw, members, &mut acked) };
        check(rc, "MPIX_Comm_ack_failed")?;
        Ok(ranks)
    }

    /// Translates `ranks` of this communicator into ranks of `other`; a process that is not in
    /// `other` maps to `None`.
    pub fn translate_ranks(&self, ranks: &[i32], other: &Comm) -> Result<Vec<Option<i32>>> {
        let own = self.group()?;
        let theirs = other.group()?;
        let mut out = vec![0 as c_int; ranks.len()];
        let n = byte_count(ranks.len(), "MPI_Group_translate_ranks")?;
        // SAFETY: both groups are valid; `ranks` and `out` hold `n` ints each.
        let rc = unsafe {
            ffi::MPI_Group_translate_ranks(own.0, n, ranks.as_ptr(), theirs.0, out.as_mut_ptr())
        };
        check(rc, "MPI_Group_translate_ranks")?;
        // SAFETY: reading an immutable constant exported by the C shim.
        let undefined = unsafe { ffi::ftkv_undefined };
        Ok(out.into_iter().map(|r| (r != undefined).then_some(r)).collect())
    }

    fn group(&self) -> Result<Group> {
        let mut group = null_group();
        // SAFETY: `self.raw` is a valid communicator; `group` a valid out-pointer.
        check(unsafe { ffi::MPI_Comm_group(self.raw, &mut group) }, "MPI_Comm_group")?;
        Ok(Group(group))
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: the communicator was created by this value and is freed exactly once.
        if let Err(e) = check(unsafe { ffi::MPI_Comm_free(&mut self.raw) }, "MPI_Comm_free") {
            tracing::warn!("ftkv-mpi: {e}");
        }
    }
}

/// An owned MPI group, freed on drop.
struct Group(ffi::MPI_Group);

impl Group {
    fn size(&self) -> Result<c_int> {
        let mut size: c_int = 0;
        // SAFETY: `self.0` is a valid group; `size` a valid out-pointer.
        check(unsafe { ffi::MPI_Group_size(self.0, &mut size) }, "MPI_Group_size")?;
        Ok(size)
    }

    fn translate_into(&self, other: &Group, members: c_int) -> Result<Vec<i32>> {
        let from: Vec<c_int> = (0..members).collect();
        let mut to = vec![0 as c_int; members as usize];
        // SAFETY: both groups are valid; `from` and `to` hold `members` ints each.
        let rc = unsafe {
            ffi::MPI_Group_translate_ranks(self.0, members, from.as_ptr(), other.0, to.as_mut_ptr())
        };
        check(rc, "MPI_Group_translate_ranks")?;
        to.sort_unstable();
        Ok(to)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: reading an immutable handle exported by the C shim.
        if self.0 == unsafe { ffi::ftkv_group_null } {
            return;
        }
        // SAFETY: the group was returned by MPI to this value and is freed exactly once.
        if let Err(e) = check(unsafe { ffi::MPI_Group_free(&mut self.0) }, "MPI_Group_free") {
            tracing::warn!("ftkv-mpi: {e}");
        }
    }
}

fn query_rank_size(raw: ffi::MPI_Comm) -> Result<(i32, i32)> {
    let (mut rank, mut size): (c_int, c_int) = (0, 0);
    // SAFETY: `raw` is a valid communicator; both out-pointers are valid.
    check(unsafe { ffi::MPI_Comm_rank(raw, &mut rank) }, "MPI_Comm_rank")?;
    // SAFETY: as above.
    check(unsafe { ffi::MPI_Comm_size(raw, &mut size) }, "MPI_Comm_size")?;
    Ok((rank, size))
}

fn null_comm() -> ffi::MPI_Comm {
    // SAFETY: reading an immutable handle exported by the C shim.
    unsafe { ffi::ftkv_comm_null }
}

fn null_group() -> ffi::MPI_Group {
    // SAFETY: reading an immutable handle exported by the C shim.
    unsafe { ffi::ftkv_group_null }
}

impl Mpi {
    /// `MPI_COMM_WORLD` (not freed when dropped).
    pub fn world(&self) -> Result<Comm> {
        // SAFETY: reading an immutable handle exported by the C shim.
        Comm::predefined(unsafe { ffi::ftkv_comm_world }, self.runtime())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn wildcards_match_mpi_h() {
        // SAFETY: reading immutable constants exported by the C shim.
        let (source, tag) = unsafe { (super::ffi::ftkv_any_source, super::ffi::ftkv_any_tag) };
        assert_eq!((super::ANY_SOURCE, super::ANY_TAG), (source, tag));
    }
}
