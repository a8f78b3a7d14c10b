//! RMA windows and passive-target epochs.
//!
//! Completion: an operation issued in an epoch (put, get, accumulate) is complete at the target
//! only after a flush of that target (or the end of the epoch). [`RmaScope`] ties the origin
//! buffers' lifetimes to a scope that flushes before it returns, so a buffer can never be freed
//! while MPI may still read or write it.
//!
//! Failure: Open MPI does not report a dead target for most one-sided calls. Depending on the
//! window kind they return success (data goes into a dead process's memory) or never return
//! (`ftkv probe` measures which). Only [`Window::fence`] and window creation report
//! `ProcFailed`. Callers must bound these calls themselves.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;

use crate::comm::Comm;
use crate::error::{check, other, MpiError, Result};
use crate::ffi;
use crate::request::byte_count;
use crate::runtime::Runtime;

/// How a window's memory was created; it decides what a target displacement means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    /// `MPI_Win_allocate` or `MPI_Win_allocate_shared`: displacements are byte offsets into
    /// each rank's window.
    Allocate,
    /// `MPI_Win_create_dynamic` + `MPI_Win_attach`: displacements are the target's absolute
    /// addresses, as returned by [`Window::attach`].
    Dynamic,
}

/// The memory of a window's members on this host, as mapped into this process: for copies
/// into and out of it with the processor's own loads and stores, and for the atomic
/// operations ftkv runs with the processor's own instructions ([`compare_and_swap_word`]).
#[derive(Debug)]
pub(crate) struct SharedSegments(Vec<(*mut u8, usize)>);

// SAFETY: the segments are addresses of window memory that stays mapped until the window is
// freed; they are only used through raw-pointer copies and atomic instructions on words
// inside them, never through Rust references to plain bytes.
unsafe impl Send for SharedSegments {}
// SAFETY: as above.
unsafe impl Sync for SharedSegments {}

impl SharedSegments {
    /// Member `rank`'s memory from `disp` for `len` bytes, when it lies inside.
    fn range(&self, rank: i32, disp: i64, len: usize, op: &'static str) -> Result<*mut u8> {
        let (base, size) = usize::try_from(rank)
            .ok()
            .and_then(|r| self.0.get(r))
            .copied()
            .ok_or_else(|| other(op, "target rank outside the window"))?;
        let start = usize::try_from(disp)
            .ok()
            .filter(|&d| d.checked_add(len).is_some_and(|end| end <= size))
            .ok_or_else(|| other(op, "the range lies outside the target's memory"))?;
        // SAFETY: `start + len <= size`, so the offset stays inside the mapped segment.
        Ok(unsafe { base.add(start) })
    }

    /// Copies `data` into member `rank`'s memory at `disp`; in the target's memory when it
    /// returns (cache-coherent shared memory; [`SharedSegments::complete`] orders it before
    /// what this thread does next).
    pub(crate) fn write(&self, rank: i32, disp: i64, data: &[u8]) -> Result<()> {
        let to = self.range(rank, disp, data.len(), "shared-memory put")?;
        // SAFETY: the range is inside mapped window memory (checked by `range`) and cannot
        // overlap `data`, a buffer of this process's own.
        unsafe { copy_into_shared(data.as_ptr(), to, data.len()) };
        Ok(())
    }

    /// Copies `out.len()` bytes of member `rank`'s memory at `disp` into `out`.
    pub(crate) fn read(&self, rank: i32, disp: i64, out: &mut [u8]) -> Result<()> {
        let from = self.range(rank, disp, out.len(), "shared-memory get")?;
        // SAFETY: as in `write`, with the roles of the two buffers exchanged.
        unsafe { copy_from_shared(from, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies `len` bytes of member `source`'s memory at `from` into member `target`'s at `to`
    /// without a buffer of this process: both are mapped here. Ordered as [`copy_into_shared`]
    /// on the target's side and as [`copy_from_shared`] on the source's. Fails when either
    /// range lies outside its member's memory, or when they overlap.
    pub(crate) fn copy(
        &self,
        source: i32,
        from: i64,
        target: i32,
        to: i64,
        len: usize,
    ) -> Result<()> {
        let from = self.range(source, from, len, "shared-memory copy")?;
        let to = self.range(target, to, len, "shared-memory copy")?;
        let (a, b) = (from as usize, to as usize);
        if a < b + len && b < a + len && len > 0 {
            return Err(other("shared-memory copy", "the two ranges overlap"));
        }
        std::sync::atomic::fence(AtomicOrdering::Release);
        // SAFETY: both ranges lie inside mapped window memory (checked by `range`) and do not
        // overlap (checked above).
        unsafe { ptr::copy_nonoverlapping(from, to, len) };
        std::sync::atomic::fence(AtomicOrdering::Acquire);
        Ok(())
    }

    /// Orders every copy this thread made into or out of the segments before its later
    /// loads, stores and file writes (what a flush does for the shared-memory window's own
    /// calls).
    pub(crate) fn complete() {
        std::sync::atomic::fence(AtomicOrdering::SeqCst);
    }

    /// [`compare_and_swap_word`] on the word at `disp` of member `rank`'s memory.
    pub(crate) fn compare_and_swap(
        &self,
        rank: i32,
        disp: i64,
        compare: u64,
        swap: u64,
    ) -> Result<u64> {
        let (base, len) = usize::try_from(rank)
            .ok()
            .and_then(|r| self.0.get(r))
            .copied()
            .ok_or_else(|| other("compare-and-swap", "target rank outside the window"))?;
        compare_and_swap_word(base, len, disp, compare, swap)
    }
}

/// Copies `len` bytes from `from` into memory that peers read (window memory), after every
/// earlier load and store of this thread: a peer that sees these bytes sees what this thread
/// wrote before them (a slot's value before its header).
///
/// # Safety
///
/// `from` must be valid for reading and `to` for writing `len` bytes, and the two ranges must
/// not overlap. The copy goes through raw pointers, so no Rust reference aliases memory that
/// peers write.
pub(crate) unsafe fn copy_into_shared(from: *const u8, to: *mut u8, len: usize) {
    std::sync::atomic::fence(AtomicOrdering::Release);
    // SAFETY: the caller's contract.
    unsafe { ptr::copy_nonoverlapping(from, to, len) };
}

/// Copies `len` bytes out of memory that peers write (window memory) before every later load
/// and store of this thread: a header read after a value is read after it.
///
/// # Safety
///
/// As [`copy_into_shared`].
pub(crate) unsafe fn copy_from_shared(from: *const u8, to: *mut u8, len: usize) {
    // SAFETY: the caller's contract.
    unsafe { ptr::copy_nonoverlapping(from, to, len) };
    std::sync::atomic::fence(AtomicOrdering::Acquire);
}

/// Atomically replaces the u64 at `disp` of the `len` bytes at `base` by `swap` if it equals
/// `compare` (one lock-free instruction, sequentially consistent), and returns the value it
/// held. Nothing is held between the compare and the swap, so a process killed at any moment
/// leaves nothing that could block another's swap on the same word (Open MPI's osc sm runs
/// `MPI_Compare_and_swap` under a spin lock in the target's shared state, which a process
/// killed inside it holds forever). Fails when the word is not inside the memory or not 8-byte
/// aligned.
pub(crate) fn compare_and_swap_word(
    base: *mut u8,
    len: usize,
    disp: i64,
    compare: u64,
    swap: u64,
) -> Result<u64> {
    let start = usize::try_from(disp).ok().filter(|&d| d.checked_add(8).is_some_and(|e| e <= len));
    let Some(start) = start else {
        return Err(other("compare-and-swap", "the word lies outside the target's memory"));
    };
    let address = base as usize + start;
    if !address.is_multiple_of(std::mem::align_of::<AtomicU64>()) {
        return Err(other("compare-and-swap", "the word is not 8-byte aligned"));
    }
    // SAFETY: the word lies inside mapped window memory (checked above) and is aligned for an
    // AtomicU64; every change of it goes through atomic instructions, so a shared reference to
    // it as an atomic never aliases a plain Rust reference.
    let word = unsafe { &*(address as *const AtomicU64) };
    Ok(match word.compare_exchange(compare, swap, AtomicOrdering::SeqCst, AtomicOrdering::SeqCst) {
        Ok(held) | Err(held) => held,
    })
}

/// Which call allocates a window's memory.
#[derive(Clone, Copy)]
enum Allocation {
    Plain,
    Shared,
}

/// The signature `MPI_Win_allocate` and `MPI_Win_allocate_shared` share.
type AllocateFn = unsafe extern "C" fn(
    ffi::MPI_Aint,
    std::ffi::c_int,
    ffi::MPI_Info,
    ffi::MPI_Comm,
    *mut c_void,
    *mut ffi::MPI_Win,
) -> std::ffi::c_int;

/// `MPI_Win_lock`'s lock type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    Exclusive,
    Shared,
}

/// An RMA window with `MPI_ERRORS_RETURN`, freed on drop (dynamic regions detached first).
#[derive(Debug)]
pub struct Window {
    raw: ffi::MPI_Win,
    kind: WindowKind,
    base: *mut u8,
    len: usize,
    regions: Vec<Box<[u8]>>,
    _runtime: Arc<Runtime>,
}

// SAFETY: MPI runs MPI_THREAD_MULTIPLE, so the window handle may be used from any thread; the
// local memory is only accessed through raw-pointer copies (RMA memory is shared with remote
// writers by design and never exposed as a Rust reference).
unsafe impl Send for Window {}
// SAFETY: as above.
unsafe impl Sync for Window {}

impl Window {
    /// `MPI_Win_allocate` of `len` bytes on this rank, displacement unit 1. The contents are
    /// unspecified (fresh shared memory reads as zero, and pages become resident only when first
    /// written, so a large window costs address space until used). Collective; fails with
    /// `ProcFailed` if a member of `comm` is dead.
    pub fn allocate(comm: &Comm, len: usize) -> Result<Window> {
        Window::allocate_with(comm, len, Allocation::Plain)
    }

    /// `MPI_Win_allocate_shared`: like [`Window::allocate`], for members that all share this
    /// host, whose memory each member can also reach with its own instructions
    /// (`MPI_Win_shared_query`). Fails if a member lives on another host.
    pub fn allocate_shared(comm: &Comm, len: usize) -> Result<Window> {
        Window::allocate_with(comm, len, Allocation::Shared)
    }

    fn allocate_with(comm: &Comm, len: usize, allocation: Allocation) -> Result<Window> {
        let mut base: *mut u8 = ptr::null_mut();
        let mut raw = null_win();
        let (call, name) = match allocation {
            Allocation::Plain => (ffi::MPI_Win_allocate as AllocateFn, "MPI_Win_allocate"),
            Allocation::Shared => {
                (ffi::MPI_Win_allocate_shared as AllocateFn, "MPI_Win_allocate_shared")
            }
        };
        let size = aint(len, name)?;
        let allocate = || {
            // SAFETY: `base` receives the address of `len` bytes owned by the window; `raw` is
            // a valid out-pointer; `comm` is a valid communicator. Both calls take these
            // arguments.
            unsafe {
                call(
                    size,
                    1,
                    ffi::ftkv_info_null,
                    comm.raw(),
                    (&mut base as *mut *mut u8).cast::<c_void>(),
                    &mut raw,
                )
            }
        };
        comm.collective(name, allocate)?;
        Window::wrap(raw, WindowKind::Allocate, base, len, comm)
    }

    /// `MPI_Win_create_dynamic`: a window without memory; add regions with [`Window::attach`].
    pub fn create_dynamic(comm: &Comm) -> Result<Window> {
        let mut raw = null_win();
        let create = || {
            // SAFETY: `comm` is valid; `raw` is a valid out-pointer.
            unsafe { ffi::MPI_Win_create_dynamic(ffi::ftkv_info_null, comm.raw(), &mut raw) }
        };
        comm.collective("MPI_Win_create_dynamic", create)?;
        Window::wrap(raw, WindowKind::Dynamic, ptr::null_mut(), 0, comm)
    }

    fn wrap(
        raw: ffi::MPI_Win,
        kind: WindowKind,
        base: *mut u8,
        len: usize,
        comm: &Comm,
    ) -> Result<Window> {
        let win = Window { raw, kind, base, len, regions: Vec::new(), _runtime: comm.runtime() };
        // SAFETY: `raw` is the valid window just created.
        let rc = unsafe { ffi::MPI_Win_set_errhandler(raw, ffi::ftkv_errors_return) };
        check(rc, "MPI_Win_set_errhandler")?;
        Ok(win)
    }

    /// This rank's window memory as a raw pointer and length, for the crate's own message
    /// servers (an `Allocate` window).
    pub(crate) fn local_memory(&self) -> (*mut u8, usize) {
        (self.base, self.len)
    }

    /// The window's kind.
    pub fn kind(&self) -> WindowKind {
        self.kind
    }

    /// Length in bytes of this rank's memory of an `Allocate` window.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether this rank's part of an `Allocate` window is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Attaches a new zeroed region of `len` bytes to a `Dynamic` window and returns its
    /// absolute address, the displacement peers use to reach it. Local.
    pub fn attach(&mut self, len: usize) -> Result<i64> {
        if self.kind != WindowKind::Dynamic {
            return Err(other("MPI_Win_attach", "only dynamic windows take attached regions"));
        }
        let mut region = vec![0u8; len].into_boxed_slice();
        let ptr = region.as_mut_ptr();
        // SAFETY: the region is owned by the window and freed only after MPI_Win_detach.
        let rc = unsafe { ffi::MPI_Win_attach(self.raw, ptr.cast(), aint(len, "MPI_Win_attach")?) };
        check(rc, "MPI_Win_attach")?;
        self.regions.push(region);
        let mut address: ffi::MPI_Aint = 0;
        // SAFETY: `ptr` is a valid address; `address` a valid out-pointer.
        check(unsafe { ffi::MPI_Get_address(ptr.cast(), &mut address) }, "MPI_Get_address")?;
        Ok(address as i64)
    }

    /// Copies `out.len()` bytes from this rank's window memory at `offset` (an `Allocate`
    /// window). Peers' writes are visible after [`LockedWindow::sync`] (`MPI_Win_sync`).
    /// Bytes that a peer writes concurrently may be seen partially.
    pub fn read_local(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_local_range(offset, out.len())?;
        // SAFETY: the range lies inside the window's memory (checked above) and `out` is a
        // buffer of this process's own.
        unsafe { copy_from_shared(self.base.add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies `data` into this rank's window memory at `offset` (an `Allocate` window).
    pub fn write_local(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_local_range(offset, data.len())?;
        // SAFETY: the range lies inside the window's memory (checked above) and `data` is a
        // buffer of this process's own.
        unsafe { copy_into_shared(data.as_ptr(), self.base.add(offset), data.len()) };
        Ok(())
    }

    /// Every member's memory of a window from [`Window::allocate_shared`], mapped into this
    /// process (`MPI_Win_shared_query`), indexed by rank in the window. Valid while the window
    /// is not freed.
    pub(crate) fn shared_segments(&self, members: i32) -> Result<SharedSegments> {
        let mut segments = Vec::with_capacity(members.max(0) as usize);
        for rank in 0..members {
            let (mut size, mut unit): (ffi::MPI_Aint, std::ffi::c_int) = (0, 0);
            let mut base: *mut u8 = ptr::null_mut();
            // SAFETY: `self.raw` is a valid window; the out-pointers are valid locals, `base`
            // receives the address of `rank`'s memory as mapped into this process.
            let rc = unsafe {
                ffi::MPI_Win_shared_query(
                    self.raw,
                    rank,
                    &mut size,
                    &mut unit,
                    (&mut base as *mut *mut u8).cast::<c_void>(),
                )
            };
            check(rc, "MPI_Win_shared_query")?;
            if base.is_null() && size > 0 {
                return Err(other("MPI_Win_shared_query", "a member's memory is not shared"));
            }
            segments.push((base, size as usize));
        }
        Ok(SharedSegments(segments))
    }

    fn check_local_range(&self, offset: usize, len: usize) -> Result<()> {
        let inside = self.kind == WindowKind::Allocate
            && offset.checked_add(len).is_some_and(|end| end <= self.len);
        if !inside {
            return Err(other("local window access", "range outside this rank's window memory"));
        }
        Ok(())
    }

    /// Opens a passive-target epoch to every rank (`MPI_Win_lock_all`, shared, no lock
    /// contention). Consumes the window; the returned guard closes the epoch on drop or with
    /// [`LockedWindow::unlock_all`].
    pub fn lock_all(self) -> Result<LockedWindow> {
        // SAFETY: `self.raw` is a valid window with no open epoch (ownership guarantees it).
        check(unsafe { ffi::MPI_Win_lock_all(0, self.raw) }, "MPI_Win_lock_all")?;
        Ok(LockedWindow { win: Some(self) })
    }

    /// `MPI_Win_lock` of one target. Never use it for mutual exclusion between ranks: a lock
    /// whose holder died is never released and the next lock call hangs.
    pub fn lock(&self, target: i32, kind: LockKind) -> Result<TargetLock<'_>> {
        // SAFETY: reading immutable constants exported by the C shim.
        let lock_type = unsafe {
            match kind {
                LockKind::Exclusive => ffi::ftkv_lock_exclusive,
                LockKind::Shared => ffi::ftkv_lock_shared,
            }
        };
        // SAFETY: `self.raw` is a valid window.
        check(unsafe { ffi::MPI_Win_lock(lock_type, target, 0, self.raw) }, "MPI_Win_lock")?;
        Ok(TargetLock { win: self, target, open: true })
    }

    /// `MPI_Win_fence` (active target synchronisation, collective). The one RMA call that
    /// reports a dead member as `ProcFailed`.
    pub fn fence(&self) -> Result<()> {
        // SAFETY: `self.raw` is a valid window.
        check(unsafe { ffi::MPI_Win_fence(0, self.raw) }, "MPI_Win_fence")
    }

    /// Frees the window now (`MPI_Win_free`, collective) and reports the result.
    pub fn free(mut self) -> Result<()> {
        self.free_inner()
    }

    fn free_inner(&mut self) -> Result<()> {
        if self.raw == null_win() {
            return Ok(());
        }
        let detached = self.detach_regions();
        // SAFETY: the window is valid, has no open epoch, and is freed exactly once (raw is set
        // to MPI_WIN_NULL by MPI_Win_free).
        let freed = check(unsafe { ffi::MPI_Win_free(&mut self.raw) }, "MPI_Win_free");
        self.raw = null_win();
        detached.and(freed)
    }

    fn detach_regions(&mut self) -> Result<()> {
        let mut result = Ok(());
        for region in &self.regions {
            // SAFETY: the region was attached to this window by `attach`.
            let rc = unsafe { ffi::MPI_Win_detach(self.raw, region.as_ptr().cast()) };
            result = result.and(check(rc, "MPI_Win_detach"));
        }
        result
    }

    pub(crate) fn ops(&self) -> Ops {
        Ops(self.raw)
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        if let Err(e) = self.free_inner() {
            tracing::warn!("ftkv-mpi: {e}");
        }
    }
}

/// A window in a `lock_all` epoch: every RMA operation to any rank is allowed.
#[derive(Debug)]
pub struct LockedWindow {
    win: Option<Window>,
}

impl LockedWindow {
    /// The window inside the epoch.
    pub fn window(&self) -> &Window {
        self.win.as_ref().expect("present until unlock")
    }

    /// Runs `issue` with a scope for put/get/accumulate, then flushes every target the scope
    /// touched (`MPI_Win_flush`; `MPI_Win_flush_all` past 8 targets). When this returns `Ok`,
    /// all operations are complete at their targets. The flush runs even when `issue` fails.
    pub fn scope<'buf, R>(
        &self,
        issue: impl FnOnce(&mut RmaScope<'buf>) -> Result<R>,
    ) -> Result<R> {
        RmaScope::run(self.window().ops(), issue)
    }

    /// `MPI_Compare_and_swap` of a u64 at `disp` followed by a flush of `target`: returns the
    /// previous value (the swap happened iff it equals `compare`).
    pub fn compare_and_swap(&self, target: i32, disp: i64, compare: u64, swap: u64) -> Result<u64> {
        self.window().ops().compare_and_swap(target, disp, compare, swap)
    }

    /// `MPI_Fetch_and_op` with `MPI_SUM` (or `MPI_NO_OP` when `add` is `None`) of a u64,
    /// followed by a flush of `target`: returns the previous value.
    pub fn fetch_and_add(&self, target: i32, disp: i64, add: Option<u64>) -> Result<u64> {
        self.window().ops().fetch_and_op(target, disp, add)
    }

    /// Atomically replaces a u64 at `disp` (`MPI_Fetch_and_op` with `MPI_REPLACE`) and flushes
    /// `target`: returns the previous value.
    pub fn swap(&self, target: i32, disp: i64, value: u64) -> Result<u64> {
        self.window().ops().swap(target, disp, value)
    }

    /// `MPI_Win_flush(target)`: completes this rank's operations to `target`.
    pub fn flush(&self, target: i32) -> Result<()> {
        self.window().ops().flush(target)
    }

    /// `MPI_Win_flush_all`.
    pub fn flush_all(&self) -> Result<()> {
        self.window().ops().flush_all()
    }

    /// `MPI_Win_sync`: synchronises this rank's public and private window copies (needed before
    /// reading local memory that peers wrote).
    pub fn sync(&self) -> Result<()> {
        // SAFETY: the window is valid and inside an epoch.
        check(unsafe { ffi::MPI_Win_sync(self.window().raw) }, "MPI_Win_sync")
    }

    /// Closes the epoch (`MPI_Win_unlock_all`) and gives the window back.
    pub fn unlock_all(mut self) -> Result<Window> {
        let win = self.win.take().expect("present until unlock");
        // SAFETY: the window is valid and in a lock_all epoch opened by `lock_all`.
        check(unsafe { ffi::MPI_Win_unlock_all(win.raw) }, "MPI_Win_unlock_all")?;
        Ok(win)
    }
}

impl Drop for LockedWindow {
    fn drop(&mut self) {
        let Some(win) = self.win.take() else { return };
        // SAFETY: the window is valid and in a lock_all epoch opened by `lock_all`.
        if let Err(e) = check(unsafe { ffi::MPI_Win_unlock_all(win.raw) }, "MPI_Win_unlock_all") {
            tracing::warn!("ftkv-mpi: {e}");
        }
    }
}

/// A window locked at one target by `MPI_Win_lock`; unlocks on drop.
#[derive(Debug)]
pub struct TargetLock<'w> {
    win: &'w Window,
    target: i32,
    open: bool,
}

impl TargetLock<'_> {
    /// Like [`LockedWindow::scope`], restricted to the locked target by MPI.
    pub fn scope<'buf, R>(
        &self,
        issue: impl FnOnce(&mut RmaScope<'buf>) -> Result<R>,
    ) -> Result<R> {
        RmaScope::run(self.win.ops(), issue)
    }

    /// `MPI_Win_unlock(target)`: completes all operations and releases the lock.
    pub fn unlock(mut self) -> Result<()> {
        self.open = false;
        // SAFETY: the window is valid and locked at `target` by this value.
        check(unsafe { ffi::MPI_Win_unlock(self.target, self.win.raw) }, "MPI_Win_unlock")
    }
}

impl Drop for TargetLock<'_> {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        // SAFETY: the window is valid and locked at `target` by this value.
        let rc = unsafe { ffi::MPI_Win_unlock(self.target, self.win.raw) };
        if let Err(e) = check(rc, "MPI_Win_unlock") {
            tracing::warn!("ftkv-mpi: {e}");
        }
    }
}

/// Operations issued inside [`LockedWindow::scope`]; buffers stay borrowed until the scope's
/// flush completed them.
#[derive(Debug)]
pub struct RmaScope<'buf> {
    ops: Ops,
    targets: [i32; 8],
    touched: usize,
    _buffers: std::marker::PhantomData<&'buf mut [u8]>,
}

impl<'buf> RmaScope<'buf> {
    pub(crate) fn new(ops: Ops) -> Self {
        RmaScope { ops, targets: [0; 8], touched: 0, _buffers: std::marker::PhantomData }
    }

    /// Issues through a new scope, then flushes what it touched, also when `issue` failed.
    fn run<R>(ops: Ops, issue: impl FnOnce(&mut RmaScope<'buf>) -> Result<R>) -> Result<R> {
        let mut scope = RmaScope::new(ops);
        let issued = issue(&mut scope);
        let flushed = scope.flush();
        let value = issued?;
        flushed.map(|()| value)
    }

    fn touch(&mut self, target: i32) {
        let known = &self.targets[..self.touched.min(8)];
        if known.contains(&target) {
            return;
        }
        if self.touched < 8 {
            self.targets[self.touched] = target;
        }
        self.touched += 1;
    }

    /// `MPI_Put` of `data` to `target` at `disp`; complete when the scope returns.
    pub fn put(&mut self, target: i32, disp: i64, data: &'buf [u8]) -> Result<()> {
        self.touch(target);
        self.ops.put(target, disp, data)
    }

    /// `MPI_Get` of `out.len()` bytes from `target` at `disp`; `out` is filled when the scope
    /// returns.
    pub fn get(&mut self, target: i32, disp: i64, out: &'buf mut [u8]) -> Result<()> {
        self.touch(target);
        self.ops.get(target, disp, out)
    }

    /// `MPI_Accumulate` with `MPI_SUM` of u64 values (element-wise atomic with respect to other
    /// accumulates).
    pub fn accumulate_sum(&mut self, target: i32, disp: i64, values: &'buf [u64]) -> Result<()> {
        self.touch(target);
        self.ops.accumulate_sum(target, disp, values)
    }

    pub(crate) fn flush(&self) -> Result<()> {
        if self.touched > self.targets.len() {
            return self.ops.flush_all();
        }
        self.targets[..self.touched].iter().try_for_each(|&t| self.ops.flush(t))
    }
}

/// The raw window handle, for the operations shared by all epoch kinds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ops(ffi::MPI_Win);

impl Ops {
    fn put(self, target: i32, disp: i64, data: &[u8]) -> Result<()> {
        let n = byte_count(data.len(), "MPI_Put")?;
        // SAFETY: `data` outlives the operation's completion: the caller borrows it for the
        // enclosing scope, which flushes before it returns.
        let rc = unsafe {
            ffi::MPI_Put(
                data.as_ptr().cast(),
                n,
                ffi::ftkv_type_byte,
                target,
                disp as ffi::MPI_Aint,
                n,
                ffi::ftkv_type_byte,
                self.0,
            )
        };
        check(rc, "MPI_Put").map_err(|e| e.with_peer(target))
    }

    fn get(self, target: i32, disp: i64, out: &mut [u8]) -> Result<()> {
        let n = byte_count(out.len(), "MPI_Get")?;
        // SAFETY: `out` is exclusively borrowed until the enclosing scope's flush completed the
        // operation.
        let rc = unsafe {
            ffi::MPI_Get(
                out.as_mut_ptr().cast(),
                n,
                ffi::ftkv_type_byte,
                target,
                disp as ffi::MPI_Aint,
                n,
                ffi::ftkv_type_byte,
                self.0,
            )
        };
        check(rc, "MPI_Get").map_err(|e| e.with_peer(target))
    }

    fn accumulate_sum(self, target: i32, disp: i64, values: &[u64]) -> Result<()> {
        let n = byte_count(values.len(), "MPI_Accumulate")?;
        // SAFETY: `values` outlives the operation's completion (borrowed for the scope).
        let rc = unsafe {
            ffi::MPI_Accumulate(
                values.as_ptr().cast(),
                n,
                ffi::ftkv_type_uint64,
                target,
                disp as ffi::MPI_Aint,
                n,
                ffi::ftkv_type_uint64,
                ffi::ftkv_op_sum,
                self.0,
            )
        };
        check(rc, "MPI_Accumulate").map_err(|e| e.with_peer(target))
    }

    pub(crate) fn compare_and_swap(
        self,
        target: i32,
        disp: i64,
        compare: u64,
        swap: u64,
    ) -> Result<u64> {
        let mut result: u64 = 0;
        // SAFETY: the origin, compare and result values live on this stack frame until the flush
        // below completed the operation.
        let rc = unsafe {
            ffi::MPI_Compare_and_swap(
                (&swap as *const u64).cast(),
                (&compare as *const u64).cast(),
                (&mut result as *mut u64).cast(),
                ffi::ftkv_type_uint64,
                target,
                disp as ffi::MPI_Aint,
                self.0,
            )
        };
        check(rc, "MPI_Compare_and_swap").map_err(|e| e.with_peer(target))?;
        self.flush(target)?;
        Ok(result)
    }

    fn fetch_and_op(self, target: i32, disp: i64, add: Option<u64>) -> Result<u64> {
        // SAFETY: reading immutable handles exported by the C shim.
        let op = unsafe {
            if add.is_some() {
                ffi::ftkv_op_sum
            } else {
                ffi::ftkv_op_no_op
            }
        };
        self.fetch_with(target, disp, add.unwrap_or(0), op, "MPI_Fetch_and_op")
    }

    fn swap(self, target: i32, disp: i64, value: u64) -> Result<u64> {
        // SAFETY: reading an immutable handle exported by the C shim.
        let op = unsafe { ffi::ftkv_op_replace };
        self.fetch_with(target, disp, value, op, "MPI_Fetch_and_op(REPLACE)")
    }

    fn fetch_with(
        self,
        target: i32,
        disp: i64,
        origin: u64,
        op: ffi::MPI_Op,
        name: &'static str,
    ) -> Result<u64> {
        let mut result: u64 = 0;
        // SAFETY: origin and result live on this stack frame until the flush below completed
        // the operation.
        let rc = unsafe {
            ffi::MPI_Fetch_and_op(
                (&origin as *const u64).cast(),
                (&mut result as *mut u64).cast(),
                ffi::ftkv_type_uint64,
                target,
                disp as ffi::MPI_Aint,
                op,
                self.0,
            )
        };
        check(rc, name).map_err(|e| e.with_peer(target))?;
        self.flush(target)?;
        Ok(result)
    }

    fn flush(self, target: i32) -> Result<()> {
        // SAFETY: the window is valid and inside an epoch that includes `target`.
        check(unsafe { ffi::MPI_Win_flush(target, self.0) }, "MPI_Win_flush")
            .map_err(|e: MpiError| e.with_peer(target))
    }

    fn flush_all(self) -> Result<()> {
        // SAFETY: the window is valid and inside an epoch.
        check(unsafe { ffi::MPI_Win_flush_all(self.0) }, "MPI_Win_flush_all")
    }
}

fn null_win() -> ffi::MPI_Win {
    // SAFETY: reading an immutable handle exported by the C shim.
    unsafe { ffi::ftkv_win_null }
}

fn aint(len: usize, op: &'static str) -> Result<ffi::MPI_Aint> {
    ffi::MPI_Aint::try_from(len).map_err(|_| other(op, "length does not fit MPI_Aint"))
}
