//! What the store and the task pool need from the machine underneath: a fault-tolerant
//! communicator with ULFM's recovery calls, point-to-point messages and passive-target windows.
//!
//! `ftkv_mpi::Comm` is the production fabric (MPI with ULFM, the default `mpi` feature);
//! `local::LocalCluster` (the `local` feature, for tests and the simulator) runs ranks as threads of one process
//! with killable ranks, for fast protocol tests that need no MPI at all. Errors are [`FabricError`]s in both, with the same
//! meaning: `ProcFailed` and `Revoked` are peer failures, never panics.

use std::any::Any;
use std::time::Duration;

#[cfg(any(test, feature = "local"))]
pub mod killed;
#[cfg(any(test, feature = "local"))]
pub mod local;
#[cfg(feature = "mpi")]
mod mpi;

/// Why a fabric call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FabricError {
    /// A process involved in the call failed.
    #[error("{op}: a peer process failed{}", peer.map(|p| format!(" (rank {p})")).unwrap_or_default())]
    ProcFailed { op: &'static str, peer: Option<i32> },
    /// A member revoked the communicator.
    #[error("{op}: the communicator was revoked")]
    Revoked { op: &'static str },
    /// The call did not complete before its deadline.
    #[error("{op}: no completion within {after:?}")]
    Timeout { op: &'static str, after: Duration },
    /// Anything else (bad arguments, an error of the layer underneath), with its message.
    #[error("{op}: {msg}")]
    Other { op: &'static str, msg: String },
}

impl FabricError {
    /// True for the errors that mean "a process failed" (directly or through a revocation):
    /// the caller should recover rather than retry.
    pub fn is_failure(&self) -> bool {
        matches!(self, FabricError::ProcFailed { .. } | FabricError::Revoked { .. })
    }
}

/// A fabric call's result.
pub type FabricResult<T> = std::result::Result<T, FabricError>;

/// The outcome of [`Fabric::agree`]: the AND of the survivors' flags (the same on every
/// survivor), and whether a process failed that this member had not acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreed {
    pub value: u32,
    pub unacknowledged_failures: bool,
}

/// A point-to-point message received by [`Fabric::try_receive`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The sender's rank in the communicator.
    pub source: i32,
    pub tag: i32,
    pub data: Vec<u8>,
}

/// Who a member's process is, told by every member at the store's creation: what a survivor
/// needs to end that process once the survivors declared it failed ([`Fabric::end_process`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcessTag {
    /// Its pid on its host (0: unknown).
    pub pid: u32,
    /// When it started, in the host's clock ticks after boot (0: unknown): a pid that names
    /// another process since is told apart by it.
    pub started: u64,
    /// Its rank in the runtime's job (`u32::MAX`: none).
    pub runtime_rank: u32,
}

impl ProcessTag {
    /// The length of [`ProcessTag::to_bytes`].
    pub const LEN: usize = 16;

    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut bytes = [0; Self::LEN];
        bytes[..4].copy_from_slice(&self.pid.to_le_bytes());
        bytes[4..12].copy_from_slice(&self.started.to_le_bytes());
        bytes[12..].copy_from_slice(&self.runtime_rank.to_le_bytes());
        bytes
    }

    /// The tag of `bytes` (at least [`ProcessTag::LEN`] long).
    pub fn from_bytes(bytes: &[u8]) -> ProcessTag {
        let word = |range: std::ops::Range<usize>| {
            bytes[range].iter().rev().fold(0u64, |w, &b| w << 8 | b as u64)
        };
        ProcessTag {
            pid: word(0..4) as u32,
            started: word(4..12),
            runtime_rank: word(12..16) as u32,
        }
    }
}

/// How a survivor reaches a process it ends ([`Fabric::end_process`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// The process runs on this member's host: by its pid.
    ThisHost,
    /// The process runs on another host: through the runtime that started the job.
    Runtime,
}

/// What [`Fabric::end_process`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The process was sent its end (SIGKILL, or the runtime took the request).
    Sent,
    /// The process had ended already.
    Gone,
    /// This fabric cannot end processes that way.
    Unsupported,
}

/// A communicator: one member per worker still alive, ranks `0..size()`.
///
/// Collective calls are made by all members in the same order. `barrier`, `allgather`, `dup`
/// and [`Fabric::open_window`] fail with `ProcFailed` when a member died, `Revoked` after
/// [`Fabric::revoke`]; `shrink` and `agree` work on revoked communicators and complete among the
/// survivors with a uniform result.
pub trait Fabric: Send + Sync + Sized + 'static {
    type Window: FabricWindow;

    fn rank(&self) -> i32;
    fn size(&self) -> i32;
    /// An id of the host this member runs on: equal for members that share a host (share
    /// memory), different otherwise. Local.
    fn host_id(&self) -> FabricResult<u32>;
    /// A new communicator with the same members (collective).
    fn dup(&self) -> FabricResult<Self>;
    fn barrier(&self) -> FabricResult<()>;
    /// Every member's equally long `mine`, concatenated in rank order.
    fn allgather(&self, mine: &[u8]) -> FabricResult<Vec<u8>>;
    /// Makes every member's pending and future collectives fail with `Revoked`. Local.
    fn revoke(&self) -> FabricResult<()>;
    fn is_revoked(&self) -> FabricResult<bool>;
    /// The survivors, in the old rank order (collective over them).
    fn shrink(&self) -> FabricResult<Self>;
    /// The AND of the survivors' flags, the same on every survivor.
    fn agree(&self, flag: u32) -> FabricResult<Agreed>;
    /// Ranks known dead here, acknowledged (so `agree` stops flagging them). Local.
    fn failed_ranks(&self) -> FabricResult<Vec<i32>>;
    /// Each member's rank in `origin` (of which this communicator is a subset), in rank order.
    fn ranks_in(&self, origin: &Self) -> FabricResult<Vec<i32>>;
    /// Lets failure notifications arrive (MPI learns of failures only while it progresses);
    /// skipped while another thread of this process is inside a fault-tolerant call (revoke,
    /// shrink, agree), which progresses itself.
    fn progress(&self) -> FabricResult<()>;
    /// A round trip to `target`'s [`Fabric::answer_pings`]; `ProcFailed` or `Timeout` when
    /// `target` is dead.
    fn ping(&self, target: i32, timeout: Duration) -> FabricResult<()>;
    /// Answers the pings that arrived.
    fn answer_pings(&self) -> FabricResult<()>;
    /// Allocates `len` bytes per member (collective), zeroes the `(offset, len)` ranges of this
    /// member's memory and opens a passive-target epoch to all members.
    fn open_window(&self, len: usize, zeroed: &[(usize, usize)]) -> FabricResult<Self::Window>;
    /// Sends `data` to `dest` with `tag`. Returns once the data may be reused: delivery is
    /// not confirmed (a send to a rank that just died may still succeed). `ProcFailed` when
    /// `dest` is known dead, `Revoked` on a revoked communicator. MPI may block a large send
    /// until the receiver matches it; the in-process fabric never blocks.
    fn send(&self, data: &[u8], dest: i32, tag: i32) -> FabricResult<()>;
    /// The oldest message that arrived from any member, if one did; never waits. Messages
    /// from one sender arrive in the order sent. `Revoked` on a revoked communicator; on MPI
    /// also `ProcFailed` while a member's failure is not acknowledged (an any-source probe),
    /// which the in-process fabric never reports.
    fn try_receive(&self) -> FabricResult<Option<Message>>;
    /// Sends `notice` to member `dest` and returns at once, whatever `dest` does: the fabric
    /// finishes the send in the background and gives it up when `dest` is dead. Notices travel
    /// apart from [`Fabric::send`]'s messages; `dest` takes them with
    /// [`Fabric::try_receive_notice`]. `false` when nothing was sent because MPI must not be
    /// entered now (another thread of this process is inside an agreement): send it later.
    /// `ProcFailed` when `dest` is known dead.
    fn send_notice(&self, notice: &[u8], dest: i32) -> FabricResult<bool>;
    /// The oldest notice that arrived from any member, if one did; never waits (`None` also
    /// while another thread of this process is inside an agreement). `Revoked` on a revoked
    /// communicator.
    fn try_receive_notice(&self) -> FabricResult<Option<Message>>;
    /// Whether [`Fabric::end_process`] can end processes (the store's heartbeat runs only
    /// then: what it finds silent it ends).
    fn can_end_processes(&self) -> bool {
        false
    }
    /// This member's [`ProcessTag`]; the default knows none.
    fn process_tag(&self) -> ProcessTag {
        ProcessTag::default()
    }
    /// Ends the process `tag` names, which the survivors declared failed (it may be stopped or
    /// frozen rather than dead, and the job's launcher waits for every process it started).
    /// Returns once the end was sent: SIGKILL on this host, a request to the runtime for
    /// another host (which ends it asynchronously). `Other` when the system refused; the
    /// default fabric has no processes to end ([`Ended::Unsupported`]).
    fn end_process(&self, tag: &ProcessTag, reach: Reach) -> FabricResult<Ended> {
        let _ = (tag, reach);
        Ok(Ended::Unsupported)
    }
    /// Bytes of shared memory this host offers for windows, when the fabric knows it.
    fn shared_memory_capacity(&self) -> Option<u64> {
        None
    }
    /// Whether a thread's panic `payload` is this fabric's way of ending a killed rank (not a
    /// bug to report).
    fn is_kill(payload: &(dyn Any + Send)) -> bool {
        let _ = payload;
        false
    }
    /// A named failure-injection point (`FTKV_FAILPOINT` for MPI, armed kills locally; on MPI
    /// `<name>:stop` stops the process there with SIGSTOP instead).
    fn failpoint(&self, name: &str);
    /// A named point where an armed member blocks forever instead of dying (on MPI also where
    /// `<name>:stop` stops the process with SIGSTOP until it is continued).
    fn stall_point(&self, name: &str);
    /// Ends this member as a fail-stop failure; the others see it as dead.
    fn fail_stop(&self, why: &str);
}

/// A window inside its passive-target epoch.
pub trait FabricWindow: Send + Sync + 'static {
    type Scope<'buf>: RmaOps<'buf>;

    /// Runs `issue`, then completes every operation it issued at its target (also when `issue`
    /// failed). `Ok` means every put is visible at its target and every get filled its buffer.
    /// The operations to one target take effect in the order they were issued, puts, extent
    /// writes and frees alike (a slot's invalidated header before its value, the value before
    /// its header: see [`crate::slot`]), and a get sees every put issued before it.
    fn scope<'buf, R>(
        &self,
        issue: impl FnOnce(&mut Self::Scope<'buf>) -> FabricResult<R>,
    ) -> FabricResult<R>;
    /// Makes peers' completed puts visible to [`FabricWindow::read_local`].
    fn sync(&self) -> FabricResult<()>;
    fn read_local(&self, offset: usize, out: &mut [u8]) -> FabricResult<()>;
    /// Copies the first `out.len()` bytes of this member's own extent `id` (see
    /// [`RmaOps::put_extent`]); bytes past the extent's end, or of an extent that does not
    /// exist, read as zero.
    fn read_local_extent(&self, id: u64, out: &mut [u8]) -> FabricResult<()>;
    /// Copies `data` into this member's own window memory (visible to peers' later gets).
    fn write_local(&self, offset: usize, data: &[u8]) -> FabricResult<()>;
    /// Atomically replaces the little-endian u64 at `disp` (8-byte aligned) in `target`'s
    /// memory by `swap` if it equals `compare`; returns the value it held (the swap happened
    /// iff that equals `compare`). Complete at the target when it returns, and atomic with
    /// respect to every other compare-and-swap of the same word, from any member on any host;
    /// not with respect to puts of the same bytes. A dead target on another host fails it
    /// with a failure error; on this host (shared memory) it may succeed on the dead member's
    /// memory, as a put does, so callers check the failed set afterwards.
    fn compare_and_swap(
        &self,
        target: i32,
        disp: i64,
        compare: u64,
        swap: u64,
    ) -> FabricResult<u64>;
    /// Ends the epoch and frees the window (collective over the window's members).
    fn close(self) -> FabricResult<()>;
    /// Leaves the window allocated without touching it again: a collective free cannot be
    /// matched when the members of a failed recovery attempt do not all hold it.
    fn abandon(self);
    /// The address of `target`'s listener when `target` is a member on another host reached
    /// over connections of the window's own: its host's kernel completes a TCP connection to
    /// it while the host runs and is reachable, even when `target`'s process is stopped.
    /// `None` for a member on this host, or when the window has no listeners.
    fn listener_of(&self, target: i32) -> Option<std::net::SocketAddr> {
        let _ = target;
        None
    }
}

/// One-sided operations inside a [`FabricWindow::scope`]; buffers stay borrowed until it ends.
///
/// Besides its window memory, every member holds *extents*: memory segments of its own, named
/// by a `u64` id within the window, each as long as the bytes last written to it. A value too
/// large for its slot lives in one, so a window reserves no memory for the largest value a put
/// may bring: an extent grows when a larger value is written and gives memory back when a
/// smaller one is. Extents go with the window: closing it frees them.
pub trait RmaOps<'buf> {
    fn put(&mut self, target: i32, disp: i64, data: &'buf [u8]) -> FabricResult<()>;
    fn get(&mut self, target: i32, disp: i64, out: &'buf mut [u8]) -> FabricResult<()>;
    /// Makes `target`'s extent `id` hold `data` at its start: created when absent, grown when
    /// shorter, shortened (its memory given back) when much longer. Complete at the target
    /// when the scope returns. A target without the memory for it fails the call with
    /// [`FabricError::Other`]; the extent may then hold part of `data`.
    fn put_extent(&mut self, target: i32, id: u64, data: &'buf [u8]) -> FabricResult<()>;
    /// Reads the first `out.len()` bytes of `target`'s extent `id` when the scope completes;
    /// bytes past its end, or of an extent that does not exist, read as zero.
    fn get_extent(&mut self, target: i32, id: u64, out: &'buf mut [u8]) -> FabricResult<()>;
    /// Gives `target`'s extent `id` back (nothing happens when there is none).
    fn free_extent(&mut self, target: i32, id: u64) -> FabricResult<()>;
    /// Whether `target` shares this member's host: [`RmaOps::copy`] and
    /// [`RmaOps::copy_extent`] reach members that do.
    fn on_this_host(&self, target: i32) -> FabricResult<bool>;
    /// Copies `len` bytes of `source`'s memory at `from` into `target`'s at `to` without a
    /// buffer of this member's: both on this member's host ([`RmaOps::on_this_host`]; an error
    /// otherwise). Ordered like a get from `source` and a put to `target`.
    fn copy(
        &mut self,
        source: i32,
        from: i64,
        target: i32,
        to: i64,
        len: usize,
    ) -> FabricResult<()>;
    /// Makes `target`'s extent `to` hold the first `len` bytes of `source`'s extent `from`,
    /// both on this member's host (an error otherwise, and when the source holds fewer bytes).
    /// Ordered like [`RmaOps::copy`].
    fn copy_extent(
        &mut self,
        source: i32,
        from: u64,
        target: i32,
        to: u64,
        len: u64,
    ) -> FabricResult<()>;
}
