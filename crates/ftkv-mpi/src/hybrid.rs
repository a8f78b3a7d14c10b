//! A window that fits the transport: shared memory within a host, messages between hosts.
//!
//! Between hosts Open MPI gives windows osc rdma over btl tcp, where a put completes only when
//! the target process makes MPI progress (20 ms when the target calls MPI every 20 ms) and a
//! flush to a dead target never returns. A [`HostWindow`] therefore keeps one
//! `MPI_Win_allocate` window per host (over the members that share the host: osc sm, loads and
//! stores) and reaches members on other hosts with two-sided messages, which a server thread on
//! every member applies to its own window memory. Two-sided calls are covered by ULFM: a
//! message to or from a dead member completes with `ProcFailed` instead of hanging, and a put
//! completes in bounded time whatever the target's application thread does.
//!
//! Protocol, on a communicator of its own: the origin sends one control message per target and
//! scope (`CTRL_TAG`: a list of `(op, disp, len)`), then the data of each put (`PUT_TAG`,
//! received by the server straight into its window memory); the server sends the data of each
//! get (`GET_TAG`) and then one acknowledgement (`ACK_TAG`), after every operation of the list
//! was applied. MPI's non-overtaking order keeps the puts of one scope in issue order at the
//! target (a slot's data before its header).

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::comm::{byte_count, status_from, Comm, ANY_SOURCE};
use crate::error::{check, MpiError, Result};
use crate::ffi;
use crate::runtime::other;
use crate::window::{LockedWindow, RmaScope, Window};

const CTRL_TAG: i32 = 11;
const PUT_TAG: i32 = 12;
const GET_TAG: i32 = 13;
const ACK_TAG: i32 = 14;
const CONNECT_TAG: i32 = 15;

const OP_PUT: u8 = 1;
const OP_GET: u8 = 2;
const ENTRY_LEN: usize = 17;

const ACK_OK: u8 = 0;
const ACK_OUT_OF_RANGE: u8 = 1;

/// After a request, the server polls without sleeping for this long (a burst's next request
/// comes within microseconds), then sleeps [`IDLE_SLEEP`] between polls.
const BUSY_WINDOW: Duration = Duration::from_millis(2);
const IDLE_SLEEP: Duration = Duration::from_micros(100);

/// This member's window memory, as the server thread reaches it.
#[derive(Clone, Copy)]
struct Memory {
    base: *mut u8,
    len: usize,
}

// SAFETY: the memory belongs to a window that outlives the server thread (the window joins the
// thread before it is freed); it is only accessed by MPI calls and raw copies, never through
// Rust references.
unsafe impl Send for Memory {}

impl Memory {
    /// The address of `[disp, disp + len)`, if it lies inside the memory.
    fn range(self, disp: u64, len: u64) -> Option<*mut u8> {
        let end = disp.checked_add(len)?;
        // SAFETY: `disp` is at most `self.len`, so the offset stays inside the allocation.
        (end <= self.len as u64).then(|| unsafe { self.base.add(disp as usize) })
    }
}

/// The thread that applies other hosts' operations to this member's memory.
struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(messages: Arc<Comm>, memory: Memory, origins: Vec<i32>) -> Server {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ftkv-window-server".into())
            .spawn(move || serve(&messages, memory, Origins::new(origins), &flag))
            .expect("spawning the window server thread");
        Server { stop, thread: Some(thread) }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The members whose requests a server takes: those on other hosts. While none has failed, one
/// wildcard probe finds the next request. Once one has, the server probes each live origin in
/// turn: a request a dead member left behind cannot be received (ULFM fails the receive) and
/// would otherwise be the wildcard probe's answer forever, starving every live origin.
struct Origins {
    live: Vec<i32>,
    any_failed: bool,
    next: usize,
}

impl Origins {
    fn new(live: Vec<i32>) -> Origins {
        Origins { live, any_failed: false, next: 0 }
    }

    fn mark_failed(&mut self, failed: &[i32]) {
        let before = self.live.len();
        self.live.retain(|r| !failed.contains(r));
        self.any_failed |= self.live.len() < before;
        self.next = 0;
    }

    /// The next request's origin and length, probing as described on [`Origins`].
    fn probe(&mut self, messages: &Comm) -> Result<Option<crate::comm::Status>> {
        if !self.any_failed {
            return messages.iprobe(ANY_SOURCE, CTRL_TAG);
        }
        for _ in 0..self.live.len() {
            let origin = self.live[self.next % self.live.len()];
            self.next = (self.next + 1) % self.live.len();
            if let Some(status) = messages.iprobe(origin, CTRL_TAG)? {
                return Ok(Some(status));
            }
        }
        Ok(None)
    }
}

/// Serves requests until `stop`. A request whose origin died is dropped where it failed (a put
/// may have written part of its data, which the slot protocol never commits), and that origin
/// is probed no more.
fn serve(messages: &Comm, memory: Memory, mut origins: Origins, stop: &AtomicBool) {
    let mut busy_until = Instant::now();
    while !stop.load(Ordering::Acquire) {
        match origins.probe(messages) {
            Ok(Some(status)) => {
                if serve_request(messages, memory, status.source, status.len).is_err() {
                    origins.mark_failed(&failed_peers(messages));
                }
                busy_until = Instant::now() + BUSY_WINDOW;
            }
            Ok(None) if Instant::now() < busy_until => std::thread::yield_now(),
            Ok(None) => std::thread::sleep(IDLE_SLEEP),
            Err(_) => {
                // A wildcard probe fails while a member's failure is unacknowledged, a probe of
                // one origin when that origin died.
                origins.mark_failed(&failed_peers(messages));
                std::thread::sleep(IDLE_SLEEP);
            }
        }
    }
}

/// The members known to have failed (acknowledging them, so that wildcard probes work again).
/// An error's own peer is not enough: while a failure is unacknowledged, Open MPI fails
/// probes of live origins too.
fn failed_peers(messages: &Comm) -> Vec<i32> {
    messages.failed_ranks().unwrap_or_default()
}

fn serve_request(messages: &Comm, memory: Memory, origin: i32, len: usize) -> Result<()> {
    let mut ctrl = vec![0u8; len];
    messages.recv(&mut ctrl, origin, CTRL_TAG)?;
    let mut ack = ACK_OK;
    for entry in ctrl.chunks_exact(ENTRY_LEN) {
        let disp = u64::from_le_bytes(entry[1..9].try_into().expect("8 bytes"));
        let len = u64::from_le_bytes(entry[9..17].try_into().expect("8 bytes"));
        let target = memory.range(disp, len);
        if target.is_none() {
            ack = ACK_OUT_OF_RANGE;
        }
        match entry[0] {
            OP_PUT => receive_put(messages, origin, target, len as usize)?,
            OP_GET => send_get(messages, origin, target, len as usize)?,
            _ => ack = ACK_OUT_OF_RANGE,
        }
    }
    messages.send(&[ack], origin, ACK_TAG)
}

/// Receives a put's data into the window memory at `target` (into a scratch buffer when the
/// range was out of bounds, so the message is consumed either way).
fn receive_put(messages: &Comm, origin: i32, target: Option<*mut u8>, len: usize) -> Result<()> {
    let mut scratch = Vec::new();
    let buf = target.unwrap_or_else(|| {
        scratch.resize(len, 0);
        scratch.as_mut_ptr()
    });
    let count = byte_count(len, "MPI_Recv(put)")?;
    let mut status = ffi::MPI_Status::default();
    // SAFETY: `buf` points to `len` writable bytes: inside the window memory (range-checked)
    // or the scratch buffer, both alive during the blocking call.
    let rc = unsafe {
        ffi::MPI_Recv(
            buf.cast(),
            count,
            ffi::ftkv_type_byte,
            origin,
            PUT_TAG,
            messages.raw(),
            &mut status,
        )
    };
    check(rc, "MPI_Recv(put)").map_err(|e| e.with_peer(origin))
}

/// Sends `len` bytes of the window memory at `target` (zeros when out of bounds).
fn send_get(messages: &Comm, origin: i32, target: Option<*mut u8>, len: usize) -> Result<()> {
    let zeros;
    let buf = match target {
        Some(ptr) => ptr.cast_const(),
        None => {
            zeros = vec![0u8; len];
            zeros.as_ptr()
        }
    };
    let count = byte_count(len, "MPI_Send(get)")?;
    // SAFETY: `buf` points to `len` readable bytes (window memory, range-checked, or `zeros`)
    // that stay alive during the blocking call.
    let rc = unsafe {
        ffi::MPI_Send(buf.cast(), count, ffi::ftkv_type_byte, origin, GET_TAG, messages.raw())
    };
    check(rc, "MPI_Send(get)").map_err(|e| e.with_peer(origin))
}

/// A window over every member of a communicator whose operations use shared memory to members
/// on this host and messages to members on other hosts. Inside a passive-target epoch from
/// creation to [`HostWindow::close`].
pub struct HostWindow {
    local: Option<LockedWindow>,
    /// Each member's rank in the host's communicator, `None` for members on other hosts.
    host_rank: Arc<[Option<i32>]>,
    /// The server; dropped (stopped and joined) before the window is freed.
    server: Option<Server>,
    messages: Arc<Comm>,
    _host: Comm,
}

impl HostWindow {
    /// Allocates `len` bytes on every member of `comm` (collective): one shared-memory window
    /// per host, and, when the members span more than one host, a server thread per member
    /// for the other hosts' operations. Fails with `ProcFailed` if a member is dead.
    pub fn allocate(comm: &Comm, len: usize) -> Result<HostWindow> {
        let hosts = host_ids(comm)?;
        let me = comm.rank() as usize;
        let color = first_on_host(&hosts, hosts[me]) as i32;
        let host = comm.split(color, comm.rank())?;
        let messages = Arc::new(comm.dup()?);
        let local = Window::allocate(&host, len)?.lock_all()?;
        let host_rank: Arc<[Option<i32>]> = host_ranks(&hosts, hosts[me]).into();
        let spans_hosts = host_rank.iter().any(Option::is_none);
        if spans_hosts {
            connect_every_pair(&messages)?;
        }
        let server = spans_hosts.then(|| {
            let (base, len) = local.window().local_memory();
            let origins = (0..comm.size()).filter(|&r| host_rank[r as usize].is_none()).collect();
            Server::start(messages.clone(), Memory { base, len }, origins)
        });
        Ok(HostWindow { local: Some(local), host_rank, server, messages, _host: host })
    }

    fn local(&self) -> &LockedWindow {
        self.local.as_ref().expect("present until close")
    }

    /// Whether some member lives on another host (operations to it are messages).
    pub fn spans_hosts(&self) -> bool {
        self.server.is_some()
    }

    /// Runs `issue`, then completes every operation it issued: flushes the shared-memory ones
    /// and waits for each other host's acknowledgement (also when `issue` failed). `Ok` means
    /// every put is in its target's memory and every get filled its buffer. A dead target
    /// makes it fail with `ProcFailed` (from ULFM, for message targets) once every operation
    /// has completed; buffers are never released while MPI may still use them.
    pub fn scope<'buf, R>(
        &self,
        issue: impl FnOnce(&mut HostScope<'buf>) -> Result<R>,
    ) -> Result<R> {
        let mut scope = HostScope {
            host_rank: self.host_rank.clone(),
            messages: self.messages.clone(),
            rma: RmaScope::new(self.local().window().ops()),
            batches: Vec::new(),
        };
        let issued = issue(&mut scope);
        let completed = scope.complete();
        let value = issued?;
        completed.map(|()| value)
    }

    /// Makes peers' completed writes visible to [`HostWindow::read_local`].
    pub fn sync(&self) -> Result<()> {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.local().sync()
    }

    /// Copies from this member's own window memory.
    pub fn read_local(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.local().window().read_local(offset, out)
    }

    /// Copies into this member's own window memory.
    pub fn write_local(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.local().window().write_local(offset, data)
    }

    /// Stops the server, ends the epoch and frees the window (collective over the members of
    /// this host).
    pub fn close(mut self) -> Result<()> {
        self.server = None;
        let local = self.local.take().expect("present until close");
        local.unlock_all()?.free()
    }

    /// Stops the server and leaves the window's memory allocated without a collective call (for
    /// a window whose members may not all take part in freeing it).
    pub fn abandon(mut self) {
        self.server = None;
        std::mem::forget(self.local.take());
    }
}

impl Drop for HostWindow {
    fn drop(&mut self) {
        self.server = None;
    }
}

/// Opens the connection of every pair of members from one side, the lower rank, one distance
/// at a time, before any other thread uses the communicator: Open MPI's TCP transport can lose
/// a connection that both sides open at the same moment from several threads ("Epoll ADD ...
/// Bad file descriptor", after which that pair's messages stall).
fn connect_every_pair(messages: &Comm) -> Result<()> {
    let (me, n) = (messages.rank(), messages.size());
    let mut byte = [0u8; 1];
    for distance in 1..n {
        let up = (me + distance) % n;
        let down = (me - distance).rem_euclid(n);
        if me < up {
            messages.send(&[1], up, CONNECT_TAG)?;
        }
        if down < me {
            messages.recv(&mut byte, down, CONNECT_TAG)?;
        }
    }
    messages.barrier()
}

/// Every member's host id, in rank order.
fn host_ids(comm: &Comm) -> Result<Vec<u32>> {
    let mine = comm.host_id()?;
    let all = comm.allgather(&mine.to_le_bytes())?;
    Ok(all.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
}

fn first_on_host(hosts: &[u32], host: u32) -> usize {
    hosts.iter().position(|&h| h == host).expect("a member's own host is among the hosts")
}

/// Each member's rank among the members on `host` (`None` for other hosts), as
/// `MPI_Comm_split` with the member's rank as key numbers them.
fn host_ranks(hosts: &[u32], host: u32) -> Vec<Option<i32>> {
    let mut next = 0;
    hosts
        .iter()
        .map(|&h| {
            (h == host).then(|| {
                next += 1;
                next - 1
            })
        })
        .collect()
}

/// One remote operation of a scope, with the buffer it borrows.
enum Remote<'buf> {
    Put { disp: i64, data: &'buf [u8] },
    Get { disp: i64, out: &'buf mut [u8] },
}

/// Operations issued inside [`HostWindow::scope`]; buffers stay borrowed until it completed
/// them.
pub struct HostScope<'buf> {
    host_rank: Arc<[Option<i32>]>,
    messages: Arc<Comm>,
    rma: RmaScope<'buf>,
    batches: Vec<(i32, Vec<Remote<'buf>>)>,
}

impl<'buf> HostScope<'buf> {
    /// A put of `data` to `target` at `disp`; complete when the scope returns.
    pub fn put(&mut self, target: i32, disp: i64, data: &'buf [u8]) -> Result<()> {
        match self.host_rank(target)? {
            Some(rank) => self.rma.put(rank, disp, data),
            None => {
                self.batch(target).push(Remote::Put { disp, data });
                Ok(())
            }
        }
    }

    /// A get of `out.len()` bytes from `target` at `disp`; filled when the scope returns.
    pub fn get(&mut self, target: i32, disp: i64, out: &'buf mut [u8]) -> Result<()> {
        match self.host_rank(target)? {
            Some(rank) => self.rma.get(rank, disp, out),
            None => {
                self.batch(target).push(Remote::Get { disp, out });
                Ok(())
            }
        }
    }

    fn host_rank(&self, target: i32) -> Result<Option<i32>> {
        let rank = usize::try_from(target).ok().and_then(|t| self.host_rank.get(t));
        rank.copied().ok_or_else(|| other("HostScope", "target rank outside the communicator"))
    }

    fn batch(&mut self, target: i32) -> &mut Vec<Remote<'buf>> {
        let at = match self.batches.iter().position(|(t, _)| *t == target) {
            Some(at) => at,
            None => {
                self.batches.push((target, Vec::new()));
                self.batches.len() - 1
            }
        };
        &mut self.batches[at].1
    }

    /// Sends every batch, flushes the shared-memory operations, then waits until every
    /// request completed; the first error is returned after that.
    fn complete(&mut self) -> Result<()> {
        let mut pending = Vec::new();
        let mut first_error = None;
        for (target, ops) in std::mem::take(&mut self.batches) {
            if let Err(e) = start_batch(&self.messages, target, ops, &mut pending) {
                first_error.get_or_insert(e);
            }
        }
        if let Err(e) = self.rma.flush() {
            first_error.get_or_insert(e);
        }
        if let Err(e) = wait_all(&mut pending) {
            first_error.get_or_insert(e);
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// A started request and what it means: the peer, and for the ack where its byte lands.
struct Pending {
    raw: ffi::MPI_Request,
    peer: i32,
    ack: Option<Box<[u8; 1]>>,
    /// The control message, owned until its send completes.
    _owned: Vec<u8>,
}

// SAFETY: used only by the thread that runs the scope.
unsafe impl Send for Pending {}

/// Starts one target's batch: the ack and get receives first, then the control message and the
/// puts' data. Requests that started are in `pending` even when a later one failed to start.
fn start_batch<'buf>(
    messages: &Comm,
    target: i32,
    ops: Vec<Remote<'buf>>,
    pending: &mut Vec<Pending>,
) -> Result<()> {
    let mut ctrl = Vec::with_capacity(ops.len() * ENTRY_LEN);
    for op in &ops {
        let (code, disp, len) = match op {
            Remote::Put { disp, data } => (OP_PUT, *disp, data.len()),
            Remote::Get { disp, out } => (OP_GET, *disp, out.len()),
        };
        ctrl.push(code);
        ctrl.extend_from_slice(&(disp as u64).to_le_bytes());
        ctrl.extend_from_slice(&(len as u64).to_le_bytes());
    }
    let mut ack = Box::new([u8::MAX; 1]);
    let ack_ptr = ack.as_mut_ptr();
    pending.push(start_recv(messages, ack_ptr, 1, target, ACK_TAG, Some(ack))?);
    let mut puts = Vec::new();
    for op in ops {
        match op {
            Remote::Get { out, .. } => {
                let (ptr, len) = (out.as_mut_ptr(), out.len());
                pending.push(start_recv(messages, ptr, len, target, GET_TAG, None)?);
            }
            Remote::Put { data, .. } => puts.push(data),
        }
    }
    let (ctrl_ptr, ctrl_len) = (ctrl.as_ptr(), ctrl.len());
    pending.push(start_send(messages, ctrl_ptr, ctrl_len, target, CTRL_TAG, ctrl)?);
    for data in puts {
        pending.push(start_send(messages, data.as_ptr(), data.len(), target, PUT_TAG, Vec::new())?);
    }
    Ok(())
}

fn start_recv(
    messages: &Comm,
    buf: *mut u8,
    len: usize,
    source: i32,
    tag: i32,
    ack: Option<Box<[u8; 1]>>,
) -> Result<Pending> {
    let count = byte_count(len, "MPI_Irecv")?;
    let mut raw = request_null();
    // SAFETY: `buf` points to `len` writable bytes that stay borrowed (the scope's buffers) or
    // owned (the ack box, moved into the returned value) until the request completed.
    let rc = unsafe {
        ffi::MPI_Irecv(
            buf.cast(),
            count,
            ffi::ftkv_type_byte,
            source,
            tag,
            messages.raw(),
            &mut raw,
        )
    };
    check(rc, "MPI_Irecv").map_err(|e| e.with_peer(source))?;
    Ok(Pending { raw, peer: source, ack, _owned: Vec::new() })
}

fn start_send(
    messages: &Comm,
    buf: *const u8,
    len: usize,
    dest: i32,
    tag: i32,
    owned: Vec<u8>,
) -> Result<Pending> {
    let count = byte_count(len, "MPI_Isend")?;
    let mut raw = request_null();
    // SAFETY: `buf` points to `len` readable bytes that stay borrowed (a put's data) or owned
    // (`owned`, moved into the returned value) until the request completed.
    let rc = unsafe {
        ffi::MPI_Isend(buf.cast(), count, ffi::ftkv_type_byte, dest, tag, messages.raw(), &mut raw)
    };
    check(rc, "MPI_Isend").map_err(|e| e.with_peer(dest))?;
    Ok(Pending { raw, peer: dest, ack: None, _owned: owned })
}

fn request_null() -> ffi::MPI_Request {
    // SAFETY: reading an immutable handle exported by the C shim.
    unsafe { ffi::ftkv_request_null }
}

/// Tests every request until all completed (successfully or with an error: ULFM completes a
/// request with a dead peer in error). Never returns earlier, since the requests use the
/// scope's buffers; a peer that is alive but never answers is for the caller's watchdog.
fn wait_all(pending: &mut Vec<Pending>) -> Result<()> {
    let mut first_error = None;
    let mut idle_polls: u32 = 0;
    while !pending.is_empty() {
        let before = pending.len();
        let mut i = 0;
        while i < pending.len() {
            match test(&mut pending[i]) {
                Ok(false) => i += 1,
                Ok(true) => {
                    let done = pending.swap_remove(i);
                    if let Some(e) = ack_error(&done) {
                        first_error.get_or_insert(e);
                    }
                }
                Err(e) => {
                    pending.swap_remove(i);
                    first_error.get_or_insert(e);
                }
            }
        }
        if pending.len() == before {
            idle_polls += 1;
            if idle_polls > 64 {
                std::thread::yield_now();
            }
        } else {
            idle_polls = 0;
        }
    }
    first_error.map_or(Ok(()), Err)
}

fn test(request: &mut Pending) -> Result<bool> {
    let mut flag: c_int = 0;
    let mut status = ffi::MPI_Status::default();
    // SAFETY: `raw` is an active request started by this module; out-pointers are valid.
    let rc = unsafe { ffi::MPI_Test(&mut request.raw, &mut flag, &mut status) };
    check(rc, "MPI_Test").map_err(|e| e.with_peer(request.peer))?;
    if flag != 0 && request.ack.is_some() {
        status_from(&status)?;
    }
    Ok(flag != 0)
}

fn ack_error(done: &Pending) -> Option<MpiError> {
    let ack = done.ack.as_ref()?;
    (ack[0] != ACK_OK)
        .then(|| other("HostWindow", "a remote operation was outside the target's window"))
}
