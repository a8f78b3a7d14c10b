//! Operations on the window memory of members on other hosts, over TCP connections of ftkv's
//! own.
//!
//! Between hosts, Open MPI's messages and one-sided calls complete only as fast as the target's
//! progress engine reads its sockets, which it does from inside MPI calls and, when no thread of
//! the process is inside a blocking MPI call, at a reduced rate: under load, requests sat unread
//! in the target's kernel socket buffer for up to seconds (seen with `ss` while every writer
//! waited for its acknowledgement). Here a member reaches a member on another host over a
//! connection of its own, made the first time it sends that member a request ([`Links::send`]);
//! one serving thread per member and window sleeps in `poll(2)` on the member's listener and all
//! of its incoming connections at once and, whenever one is readable, reads that origin's whole
//! request, applies it to this member's window memory and answers, whatever the application
//! thread does. A connection that ends (a SIGKILLed peer's kernel closes it at once) fails the
//! operations on it with `ProcFailed`.
//!
//! Connections are lazy: creating the links ([`Links::start`], collective) only shares the
//! members' listening addresses and a [`Secret`]; a member connects to a target when it first
//! sends it a request. Per member and window whose members span hosts:
//! - sockets = 1 listener (open for the window's lifetime), plus one per member this member
//!   reached, plus one per member that reached it (a member exchanges window data with the
//!   holders of its keys and the owners it holds for, not with every member);
//! - threads = exactly one serving thread ([`Server`]), whatever the number of members or hosts.
//!   (One thread per incoming connection starved MPI's progress threads: 64 ranks over 8
//!   simulated hosts on 2 cores ran ~3600 serving threads.)
//!
//! An origin's connection to a target is in one of three states ([`Link`]): not connected yet,
//! connected, or failed. The first request connects (within [`CONNECT_TIMEOUT`]) and sends the
//! introduction before the request; a connect that is refused, reset or times out, and any
//! later failed transfer, fails the request with `ProcFailed` naming the target, and the target
//! counts as failed for good: it is never connected again.
//!
//! The serving loop:
//! - accepts new connections without blocking and reads each one's introduction as it arrives,
//!   among the served connections' requests (see below); a connection is served only once its
//!   introduction proved it genuine;
//! - serves one whole request of an origin before it looks at another connection, so each
//!   origin's requests are applied in order and origins interleave only at request boundaries;
//! - reads the rest of a request after `poll` said readable with a read timeout of
//!   [`REQUEST_TIMEOUT`]: an origin whose request stops arriving midway holds up the others at
//!   most that long, then its connection is dropped;
//! - sends answers without blocking: what the socket does not take at once waits for the
//!   connection to be writable, and that origin's next request is read only once its answer is
//!   sent, so an origin slow to read a large answer holds up no other origin;
//! - drops a connection whose read or send hits EOF or an error (its origin died or closed) and
//!   goes on with the others; it ends when `poll` fails other than with `EINTR`, or when its
//!   [`Links`] is dropped: the stop flag is checked every [`STOP_CHECK`] and the served streams
//!   are shut down so a read in progress returns, then the thread is joined, so no thread
//!   touches the window memory after the drop; the listener closes with the thread.
//!
//! Request, on an origin's connection: `u32` operation count, then per operation a kind byte and
//! `u64` displacement and length (little-endian), then every put's data and every
//! compare-and-swap's operands (compare, swap: two `u64`) in operation order. Answer: every
//! get's data and every compare-and-swap's previous value in operation order, then one status
//! byte. Extent operations carry the extent's id where the others carry a displacement.
//!
//! Every listener is reachable by any process on the network for the window's lifetime, so a
//! connection counts as a member's only once it proved it belongs to this job: its first
//! [`INTRO_LEN`] bytes, the introduction, are [`INTRO_MAGIC`], the origin's and the target's
//! member ranks (`u32`, little-endian) and the creation's [`Secret`], and the origin has not
//! connected to this member before. Any other connection, and one whose introduction is not
//! whole within [`INTRODUCTION_TIMEOUT`], is dropped and counted ([`Links::rejected`]); it is
//! never served and never fails anything.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::comm::Comm;
use crate::error::{other, MpiError, Result};
use crate::extent::Extents;
use crate::window::{compare_and_swap_word, copy_from_shared, copy_into_shared};

const OP_PUT: u8 = 1;
const OP_GET: u8 = 2;
const OP_COMPARE_AND_SWAP: u8 = 3;
const OP_EXTENT_PUT: u8 = 4;
const OP_EXTENT_GET: u8 = 5;
const OP_EXTENT_FREE: u8 = 6;
const ENTRY_LEN: usize = 17;
const STATUS_OK: u8 = 0;
const STATUS_OUT_OF_RANGE: u8 = 1;
const STATUS_ATOMIC_FAILED: u8 = 2;
const STATUS_EXTENT_FAILED: u8 = 3;

/// Requests up to this size are sent with one write (header and data copied together).
const COALESCE_LIMIT: usize = 64 * 1024;
/// How long an origin's socket call waits before it asks ULFM whether the target failed.
const WAIT_SLICE: Duration = Duration::from_millis(50);
/// How long connecting to a target (and sending the introduction) may take before the target
/// counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes of an address in the exchange: IPv4 address and port.
const ADDRESS_LEN: usize = 6;
/// What every introduction starts with.
const INTRO_MAGIC: &[u8; 8] = b"FTKVLNK1";
/// Bytes of a [`Secret`].
const SECRET_LEN: usize = 16;
/// Where an introduction holds the origin's rank, the target's rank and the secret.
const INTRO_ORIGIN: usize = INTRO_MAGIC.len();
const INTRO_TARGET: usize = INTRO_ORIGIN + 4;
const INTRO_SECRET: usize = INTRO_TARGET + 4;
/// Bytes of an introduction: magic, origin rank, target rank, secret.
const INTRO_LEN: usize = INTRO_SECRET + SECRET_LEN;
/// How long an accepted connection has to send its whole introduction.
const INTRODUCTION_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the serving loop waits for more of a request it started reading before it drops the
/// connection (the wait of each read; a request that keeps arriving may take longer).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the serving loop wakes from `poll` to check whether it is to stop (and whether an
/// introduction's time is up); also how long it leaves the listener alone after accepting
/// failed (out of descriptors, say).
const STOP_CHECK: Duration = Duration::from_millis(50);
/// How many accepted connections may be waiting for their introduction at once; more wait in
/// the listener's backlog meanwhile.
const MAX_ARRIVALS: usize = 64;
/// The listener's backlog: connections the kernel completes before the serving loop accepts
/// them (many origins may reach one member at once; the kernel caps it at `somaxconn`).
const BACKLOG: libc::c_int = 1024;

/// This member's window memory, as the serving thread reaches it.
#[derive(Clone, Copy)]
pub(crate) struct Memory {
    pub base: *mut u8,
    pub len: usize,
    /// The window's extents, and this member's rank among the window's members.
    pub extents: Extents,
    pub member: i32,
}

// SAFETY: the memory belongs to a window that outlives the serving thread (the window joins it
// before it is freed); it is only written by raw copies and atomic instructions, never through
// plain Rust references.
unsafe impl Send for Memory {}

impl Memory {
    /// The compare-and-swap of a request (`operands`: the compare and the swap value) on the
    /// word at `disp` of this member's memory, with the processor's lock-free instruction
    /// ([`compare_and_swap_word`]), as members on this host run it.
    fn compare_and_swap(self, disp: u64, operands: &[u8]) -> Option<u64> {
        let word = |at: usize| u64::from_le_bytes(operands[at..at + 8].try_into().expect("8"));
        let disp = i64::try_from(disp).ok()?;
        compare_and_swap_word(self.base, self.len, disp, word(0), word(8)).ok()
    }

    fn range(self, disp: u64, len: u64) -> Option<*mut u8> {
        let end = disp.checked_add(len)?;
        // SAFETY: `disp` is at most `self.len`, so the offset stays inside the allocation.
        (end <= self.len as u64).then(|| unsafe { self.base.add(disp as usize) })
    }
}

/// One operation of a request, with the buffer it borrows.
pub(crate) enum Remote<'buf> {
    Put {
        disp: i64,
        data: &'buf [u8],
    },
    Get {
        disp: i64,
        out: &'buf mut [u8],
    },
    /// `operands`: compare, then swap (little-endian u64s); `held` gets the previous value.
    CompareAndSwap {
        disp: i64,
        operands: &'buf [u8; 16],
        held: &'buf mut [u8; 8],
    },
    ExtentPut {
        id: u64,
        data: &'buf [u8],
    },
    ExtentGet {
        id: u64,
        out: &'buf mut [u8],
    },
    ExtentFree {
        id: u64,
    },
}

/// One member's links to the members on other hosts: its connections to them, each made by the
/// first request to its target ([`Outgoing`]), and the thread that serves the connections other
/// members made to it ([`Server`]).
pub(crate) struct Links {
    outgoing: Outgoing,
    /// The one thread accepting and serving every incoming connection.
    server: Server,
    /// A private duplicate of the members' communicator: ULFM's failure knowledge while an
    /// answer is awaited, and the barrier before the connections end.
    members: Comm,
}

impl Links {
    /// Starts this member's links (`remote[r]`: member `r` is on another host) and the thread
    /// serving incoming connections into `memory`. Collective over `comm`: rank 0 draws a fresh
    /// [`Secret`] that every member learns, and every member learns every member's listening
    /// address. Connects nothing and accepts nothing yet: a member connects to a target when it
    /// first sends it a request ([`Links::send`]), and the listener stays open, served by the
    /// serving thread, until the links are dropped. Fails when this member cannot listen or
    /// start its thread, or when a collective call fails.
    pub fn start(comm: &Comm, remote: &[bool], memory: Memory) -> Result<Links> {
        let secret = Secret::share(comm)?;
        let listener = TcpListener::bind(SocketAddrV4::new(local_address()?, 0))
            .map_err(|e| io_error("binding the window listener", e, None))?;
        let addresses = exchange_addresses(comm, &listener)?;
        let members = comm.dup()?;
        let me = comm.rank();
        let gate = Gate { secret: secret.clone(), me, remote: remote.to_vec() };
        let server = Server::start(listener, gate, REQUEST_TIMEOUT, move || {
            let mut buffers = ServeBuffers::default();
            move |stream: &mut TcpStream, answer: &mut Vec<u8>| {
                serve_request(stream, memory, &mut buffers, answer)
            }
        })
        .map_err(|e| io_error("starting the server", e, None))?;
        let outgoing = Outgoing::new(me, secret, &addresses, remote);
        Ok(Links { outgoing, server, members })
    }

    /// The listening address of member `target` on another host (`None` for a member on this
    /// host or no member).
    pub fn address_of(&self, target: i32) -> Option<SocketAddrV4> {
        let target = self.outgoing.targets.get(usize::try_from(target).ok()?)?;
        target.as_ref().map(|t| t.address)
    }

    /// How many connections to this member were dropped, since the links started, because
    /// they did not prove to come from a member of this job: a wrong, incomplete or late
    /// introduction, or a member's second connection (see [`Gate`]).
    pub fn rejected(&self) -> usize {
        self.server.rejected()
    }

    /// Waits until every member is done with the others' memory (`MPI_Barrier` on the
    /// members; ULFM ends it with an error instead of a hang when one died, which is ignored:
    /// that member needs nothing more).
    pub fn wait_for_members(&self) {
        let _ = self.members.barrier();
    }

    /// Sends every target's request, connecting first to a target not reached before
    /// ([`Outgoing::link`]); [`Sent::answers`] then reads the answers. A target that could not
    /// be connected to, or whose request could not be sent, is in the result's error
    /// (`ProcFailed` naming it), and counts as failed: its connection is never used or made
    /// again.
    pub fn send<'buf>(&self, mut batches: Vec<(i32, Vec<Remote<'buf>>)>) -> Sent<'_, 'buf> {
        // Links are locked in target order: two threads of one member (the owner and the
        // repairer) sending to the same targets cannot each hold the link the other waits for.
        batches.sort_by_key(|(target, _)| *target);
        let mut sent = Sent {
            awaiting: Vec::with_capacity(batches.len()),
            first_error: None,
            members: &self.members,
        };
        for (target, ops) in batches {
            let mut link = match self.outgoing.link(target) {
                Ok(link) => link,
                Err(e) => {
                    sent.fail(e);
                    continue;
                }
            };
            match send_request(link.stream(), &ops, target, &self.members) {
                Ok(()) => sent.awaiting.push((target, ops, link)),
                Err(e) => {
                    *link = Link::Failed;
                    sent.fail(e);
                }
            }
        }
        sent
    }
}

/// Requests sent, their answers not yet read; each connection stays locked until then.
pub(crate) struct Sent<'links, 'buf> {
    awaiting: Vec<(i32, Vec<Remote<'buf>>, MutexGuard<'links, Link>)>,
    first_error: Option<MpiError>,
    members: &'links Comm,
}

impl Sent<'_, '_> {
    fn fail(&mut self, e: MpiError) {
        self.first_error.get_or_insert(e);
    }

    /// Reads every answer. `Ok` means every put is in its target's memory and every get filled
    /// its buffer; a target whose connection ended fails it with `ProcFailed` (after the other
    /// targets' answers were read), and a connection whose answer was not read whole is not
    /// used again.
    pub fn answers(mut self) -> Result<()> {
        for (target, ops, mut link) in std::mem::take(&mut self.awaiting) {
            match read_answer(link.stream(), ops, target, self.members) {
                Ok(STATUS_OK) => {}
                Ok(STATUS_ATOMIC_FAILED) => {
                    self.fail(other("HostWindow", "a remote compare-and-swap failed at its target"))
                }
                Ok(STATUS_EXTENT_FAILED) => {
                    self.fail(other("HostWindow", "a remote extent operation failed at its target"))
                }
                Ok(_) => {
                    self.fail(other("HostWindow", "a remote operation was outside the window"))
                }
                Err(e) => {
                    *link = Link::Failed;
                    self.fail(e);
                }
            }
        }
        self.first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Links {
    /// Ends every outgoing connection, then stops the serving thread ([`Server::stop`]: it
    /// shuts the incoming connections down, closes the listener and is joined), so that no
    /// thread touches the window memory afterwards.
    fn drop(&mut self) {
        self.outgoing.shutdown();
        let _ = self.server.stop();
    }
}

/// An origin's connection to one target.
enum Link {
    /// Not connected yet: the first request to the target connects.
    Unopened,
    /// Connected, introduced, and every transfer on it so far succeeded.
    Open(TcpStream),
    /// Connecting or a transfer failed: the target counts as failed, and is never connected
    /// again.
    Failed,
}

impl Link {
    /// The connection, while it is open.
    fn stream(&mut self) -> Option<&mut TcpStream> {
        match self {
            Link::Open(stream) => Some(stream),
            Link::Unopened | Link::Failed => None,
        }
    }
}

/// A member on another host as an origin reaches it: its listening address and this origin's
/// link to it.
struct Target {
    address: SocketAddrV4,
    link: Mutex<Link>,
}

/// An origin's side of the links: one [`Link`] per member on another host, connected on first
/// use.
struct Outgoing {
    /// The origin's rank among the members.
    me: i32,
    secret: Secret,
    /// Per member, in rank order: `None` for a member on this host.
    targets: Vec<Option<Target>>,
}

impl Outgoing {
    /// Every link not connected yet; `addresses[r]`: member `r`'s listener, reached only if
    /// `remote[r]` (it is on another host).
    fn new(me: i32, secret: Secret, addresses: &[SocketAddrV4], remote: &[bool]) -> Outgoing {
        let targets = addresses
            .iter()
            .zip(remote)
            .map(|(&address, &remote)| {
                remote.then(|| Target { address, link: Mutex::new(Link::Unopened) })
            })
            .collect();
        Outgoing { me, secret, targets }
    }

    /// `target`'s link, locked (so the caller has its connection to itself until it drops the
    /// guard), connected first if it was not: [`Link::Open`], or [`Link::Failed`] if it failed
    /// before. Connecting happens under the lock, so a target is connected at most once; when
    /// it fails ([`dial`]: refused, reset, unreachable or not done within [`CONNECT_TIMEOUT`])
    /// the link becomes [`Link::Failed`] and this fails with `ProcFailed` naming `target` (or
    /// with the socket's error if it is not a peer's failure). Fails with `Other` when `target`
    /// is no member on another host.
    fn link(&self, target: i32) -> Result<MutexGuard<'_, Link>> {
        let slot = usize::try_from(target).ok().and_then(|t| self.targets.get(t));
        let Some(Some(slot)) = slot else {
            return Err(other("Links", "target is not on another host"));
        };
        let mut link = slot.link.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(*link, Link::Unopened) {
            let intro = introduction(&self.secret, self.me, target);
            match dial(slot.address, &intro, CONNECT_TIMEOUT) {
                Ok(stream) => *link = Link::Open(stream),
                Err(e) => {
                    *link = Link::Failed;
                    return Err(io_error("connecting to a member", e, Some(target)));
                }
            }
        }
        Ok(link)
    }

    /// Shuts every open connection down, so that its target's serving loop drops it.
    fn shutdown(&self) {
        for slot in self.targets.iter().flatten() {
            let link = slot.link.lock().unwrap_or_else(PoisonError::into_inner);
            if let Link::Open(stream) = &*link {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Connects to the listener at `address` within `timeout` and sends `intro` (the outgoing half
/// of a link's creation). The connection then waits in slices of [`WAIT_SLICE`], as [`Peer`]
/// expects.
fn dial(
    address: SocketAddrV4,
    intro: &[u8; INTRO_LEN],
    timeout: Duration,
) -> std::io::Result<TcpStream> {
    let mut stream = TcpStream::connect_timeout(&SocketAddr::V4(address), timeout)?;
    configure(&stream)?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(intro)?;
    stream.set_read_timeout(Some(WAIT_SLICE))?;
    stream.set_write_timeout(Some(WAIT_SLICE))?;
    Ok(stream)
}

fn send_request(
    stream: Option<&mut TcpStream>,
    ops: &[Remote<'_>],
    target: i32,
    members: &Comm,
) -> Result<()> {
    let stream = stream.ok_or(MpiError::ProcFailed { op: "ftkv tcp", peer: Some(target) })?;
    let mut peer = Peer { stream, target, members };
    let puts = || {
        ops.iter().filter_map(|op| match op {
            Remote::Put { data, .. } | Remote::ExtentPut { data, .. } => Some(*data),
            Remote::CompareAndSwap { operands, .. } => Some(&operands[..]),
            Remote::Get { .. } | Remote::ExtentGet { .. } | Remote::ExtentFree { .. } => None,
        })
    };
    let header_len = 4 + ops.len() * ENTRY_LEN;
    let total = header_len + puts().map(<[u8]>::len).sum::<usize>();
    let coalesce = total <= COALESCE_LIMIT;
    let mut request = Vec::with_capacity(if coalesce { total } else { header_len });
    encode_header(ops, &mut request);
    if coalesce {
        puts().for_each(|data| request.extend_from_slice(data));
        peer.write_all(&request)
    } else {
        peer.write_all(&request)?;
        puts().try_for_each(|data| peer.write_all(data))
    }
}

fn encode_header(ops: &[Remote<'_>], header: &mut Vec<u8>) {
    header.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for op in ops {
        let (code, disp, len) = match op {
            Remote::Put { disp, data } => (OP_PUT, *disp, data.len()),
            Remote::Get { disp, out } => (OP_GET, *disp, out.len()),
            Remote::CompareAndSwap { disp, held, .. } => (OP_COMPARE_AND_SWAP, *disp, held.len()),
            Remote::ExtentPut { id, data } => (OP_EXTENT_PUT, *id as i64, data.len()),
            Remote::ExtentGet { id, out } => (OP_EXTENT_GET, *id as i64, out.len()),
            Remote::ExtentFree { id } => (OP_EXTENT_FREE, *id as i64, 0),
        };
        header.push(code);
        header.extend_from_slice(&(disp as u64).to_le_bytes());
        header.extend_from_slice(&(len as u64).to_le_bytes());
    }
}

/// Reads one target's answer: the gets' data, then the status byte it returns.
fn read_answer(
    stream: Option<&mut TcpStream>,
    ops: Vec<Remote<'_>>,
    target: i32,
    members: &Comm,
) -> Result<u8> {
    let stream = stream.ok_or(MpiError::ProcFailed { op: "ftkv tcp", peer: Some(target) })?;
    let mut peer = Peer { stream, target, members };
    for op in ops {
        match op {
            Remote::Get { out, .. } | Remote::ExtentGet { out, .. } => peer.read_exact(out)?,
            Remote::CompareAndSwap { held, .. } => peer.read_exact(held)?,
            Remote::Put { .. } | Remote::ExtentPut { .. } | Remote::ExtentFree { .. } => {}
        }
    }
    let mut status = [0u8; 1];
    peer.read_exact(&mut status)?;
    Ok(status[0])
}

/// An origin's connection to one target, for transfers that wait as long as the target is
/// alive: the socket's timeout ([`WAIT_SLICE`]) wakes the wait to ask ULFM whether the target
/// failed (a host cut off from the network closes no connection; the failure detector
/// declares its processes failed), and the transfer then fails with `ProcFailed`.
struct Peer<'s> {
    stream: &'s mut TcpStream,
    target: i32,
    members: &'s Comm,
}

impl Peer<'_> {
    fn read_exact(&mut self, buf: &mut [u8]) -> Result<()> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.stream.read(&mut buf[filled..]) {
                Ok(0) => return Err(self.failed("reading an answer")),
                Ok(n) => filled += n,
                Err(e) => self.on_error("reading an answer", e)?,
            }
        }
        Ok(())
    }

    fn write_all(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            match self.stream.write(data) {
                Ok(0) => return Err(self.failed("sending a request")),
                Ok(n) => data = &data[n..],
                Err(e) => self.on_error("sending a request", e)?,
            }
        }
        Ok(())
    }

    /// `Ok` to go on waiting: interrupted, or timed out while the target is not known failed.
    fn on_error(&self, what: &'static str, e: std::io::Error) -> Result<()> {
        use std::io::ErrorKind::{Interrupted, TimedOut, WouldBlock};
        match e.kind() {
            Interrupted => Ok(()),
            TimedOut | WouldBlock if !self.members.failed_ranks()?.contains(&self.target) => Ok(()),
            TimedOut | WouldBlock => Err(self.failed(what)),
            _ => Err(io_error(what, e, Some(self.target))),
        }
    }

    fn failed(&self, what: &'static str) -> MpiError {
        MpiError::ProcFailed { op: what, peer: Some(self.target) }
    }
}

/// The thread that accepts and serves every incoming connection of a member ([`serve_loop`]),
/// and what stops it.
struct Server {
    stop: Arc<AtomicBool>,
    /// The served connections, to shut them down at the stop.
    open: Arc<OpenStreams>,
    /// How many connections were dropped for want of a genuine introduction.
    rejected: Arc<AtomicUsize>,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl Server {
    /// Starts the serving thread over `listener`, whose connections are served once `gate`
    /// admitted their introduction; the thread builds its request handler with `handler` first
    /// (so the handler itself need not be `Send`). `timeout`: [`REQUEST_TIMEOUT`].
    fn start<F, H>(
        listener: TcpListener,
        gate: Gate,
        timeout: Duration,
        handler: F,
    ) -> std::io::Result<Server>
    where
        F: FnOnce() -> H + Send + 'static,
        H: FnMut(&mut TcpStream, &mut Vec<u8>) -> std::io::Result<()>,
    {
        listener.set_nonblocking(true)?;
        deepen_backlog(&listener, BACKLOG)?;
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(OpenStreams::default());
        let rejected = Arc::new(AtomicUsize::new(0));
        let admission = Admission::new(listener, gate, Arc::clone(&rejected));
        let (flag, streams) = (Arc::clone(&stop), Arc::clone(&open));
        let thread =
            std::thread::Builder::new().name("ftkv-window-serve".into()).spawn(move || {
                serve_loop(admission, Serving::new(streams, timeout, handler()), &flag)
            })?;
        Ok(Server { stop, open, rejected, thread: Some(thread) })
    }

    /// How many connections were dropped for want of a genuine introduction ([`Admission`]).
    fn rejected(&self) -> usize {
        self.rejected.load(Ordering::Relaxed)
    }

    /// How many connections are being served.
    #[cfg(test)]
    fn served(&self) -> usize {
        self.open.lock().fds.len()
    }

    /// Stops the serving thread and waits for it: raises the stop flag (checked every
    /// [`STOP_CHECK`]), shuts every served connection down so that a read in progress returns,
    /// joins; the listener closes as the thread ends. What the thread ended with (`Ok` at once
    /// if it was stopped before).
    fn stop(&mut self) -> std::io::Result<()> {
        self.stop.store(true, Ordering::Release);
        self.open.shut_all();
        match self.thread.take() {
            Some(thread) => {
                thread.join().unwrap_or_else(|_| Err(std::io::Error::other("panicked")))
            }
            None => Ok(()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Lets `listener` hold up to `backlog` connections not accepted yet (the standard library
/// listens with 128).
fn deepen_backlog(listener: &TcpListener, backlog: libc::c_int) -> std::io::Result<()> {
    // SAFETY: the descriptor is `listener`'s open, listening socket; on Linux `listen` on a
    // listening socket only changes its backlog. It touches no memory.
    let rc = unsafe { libc::listen(listener.as_raw_fd(), backlog) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The descriptors of the connections the serving loop serves, so that another thread can shut
/// them down. A descriptor is here exactly while its stream is open: [`Incoming`] registers it
/// once open and deregisters it, under the same lock, before it closes; once stopped,
/// registering shuts the connection down at once.
#[derive(Default)]
struct OpenStreams(Mutex<Registry>);

#[derive(Default)]
struct Registry {
    stopped: bool,
    fds: Vec<RawFd>,
}

impl OpenStreams {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn register(&self, fd: RawFd) {
        let mut registry = self.lock();
        if registry.stopped {
            let _ = shutdown_fd(fd);
        } else {
            registry.fds.push(fd);
        }
    }

    fn deregister(&self, fd: RawFd) {
        self.lock().fds.retain(|&open| open != fd);
    }

    /// Shuts every registered connection down, and every one registered later.
    fn shut_all(&self) {
        let mut registry = self.lock();
        registry.stopped = true;
        for &fd in &registry.fds {
            let _ = shutdown_fd(fd);
        }
    }
}

/// Shuts both directions of socket `fd` down; must be called with [`OpenStreams`]' lock held,
/// for a descriptor registered there or being registered by its open stream.
fn shutdown_fd(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: `fd` is an open socket: its stream is being registered, or it is registered and
    // is deregistered (under the lock the caller holds) before its stream closes. `shutdown`
    // touches no memory.
    let rc = unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// One served connection, with the part of its last answer not sent yet.
struct Incoming {
    stream: TcpStream,
    unsent: Vec<u8>,
    /// How much of `unsent` went already.
    sent: usize,
    open: Arc<OpenStreams>,
}

impl Incoming {
    fn new(stream: TcpStream, open: &Arc<OpenStreams>) -> Incoming {
        open.register(stream.as_raw_fd());
        Incoming { stream, unsent: Vec::new(), sent: 0, open: Arc::clone(open) }
    }

    /// What `poll` is to wait for: the rest of the answer to go, else the next request.
    fn events(&self) -> libc::c_short {
        if self.sent < self.unsent.len() {
            libc::POLLOUT
        } else {
            libc::POLLIN
        }
    }

    /// Acts on `revents`: sends more of the unsent answer, or serves one whole request with
    /// `handle` (which appends its answer to `answer`, a buffer kept across requests) and sends
    /// what the socket takes of the answer at once. Whether the connection stays.
    fn step<H>(&mut self, revents: libc::c_short, answer: &mut Vec<u8>, handle: &mut H) -> bool
    where
        H: FnMut(&mut TcpStream, &mut Vec<u8>) -> std::io::Result<()>,
    {
        if revents & libc::POLLNVAL != 0 {
            return false;
        }
        if revents & (libc::POLLIN | libc::POLLOUT | libc::POLLHUP | libc::POLLERR) == 0 {
            return true;
        }
        if self.sent < self.unsent.len() {
            // Writable, hung up or failed: the send tells which.
            return match send_now(&self.stream, &self.unsent[self.sent..]) {
                Ok(n) => {
                    self.sent += n;
                    if self.sent == self.unsent.len() {
                        (self.unsent, self.sent) = (Vec::new(), 0);
                    }
                    true
                }
                Err(_) => false,
            };
        }
        // Readable, hung up or failed: a request, or the read ends with EOF or the error.
        answer.clear();
        if handle(&mut self.stream, answer).is_err() {
            return false;
        }
        match send_now(&self.stream, answer) {
            Ok(n) if n == answer.len() => true,
            Ok(n) => {
                (self.unsent, self.sent) = (std::mem::take(answer), n);
                true
            }
            Err(_) => false,
        }
    }
}

impl Drop for Incoming {
    /// Shuts the connection down (its origin sees it end) and deregisters it before the stream
    /// closes.
    fn drop(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
        self.open.deregister(self.stream.as_raw_fd());
    }
}

/// Sends what the socket takes of `data` without waiting; how many bytes went.
fn send_now(stream: &TcpStream, data: &[u8]) -> std::io::Result<usize> {
    let mut sent = 0;
    while sent < data.len() {
        let rest = &data[sent..];
        // SAFETY: the pointer and length describe `rest`, alive and only read during the call;
        // the descriptor is `stream`'s open socket. MSG_NOSIGNAL: a closed peer is EPIPE, not
        // SIGPIPE; MSG_DONTWAIT: never blocks.
        let n = unsafe {
            libc::send(
                stream.as_raw_fd(),
                rest.as_ptr().cast(),
                rest.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::Interrupted => continue,
                std::io::ErrorKind::WouldBlock => break,
                _ => return Err(e),
            }
        }
        if n == 0 {
            break;
        }
        sent += n as usize;
    }
    Ok(sent)
}

/// Accepts connections and serves their requests from this one thread until `stop` is raised
/// (checked every [`STOP_CHECK`]; `Ok`) or `poll` fails other than with `EINTR` (its error).
/// Each round waits with `poll` on the listener, the connections whose introduction is awaited
/// and the served connections, then settles introductions and accepts ([`Admission::step`]),
/// serves one whole request of each readable served connection ([`Serving::step`]), and serves
/// the connections just admitted from the next round on. At its end every connection is shut
/// down and closed, the listener too, and introductions still awaited count as rejected.
fn serve_loop<H>(
    mut admission: Admission,
    mut serving: Serving<H>,
    stop: &AtomicBool,
) -> std::io::Result<()>
where
    H: FnMut(&mut TcpStream, &mut Vec<u8>) -> std::io::Result<()>,
{
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let ended = loop {
        if stop.load(Ordering::Acquire) {
            break Ok(());
        }
        fds.clear();
        admission.poll_fds(Instant::now(), &mut fds);
        let admitting = fds.len();
        serving.poll_fds(&mut fds);
        if let Err(e) = poll(&mut fds, STOP_CHECK) {
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break Err(e);
        }
        let admitted = admission.step(&fds[..admitting], Instant::now());
        serving.step(&fds[admitting..], stop);
        admitted.into_iter().for_each(|stream| serving.add(stream));
    };
    admission.end();
    ended
}

/// Waits with `poll(2)` until one of `fds` is ready or `wait` passed; how many are ready.
fn poll(fds: &mut [libc::pollfd], wait: Duration) -> std::io::Result<usize> {
    let wait = wait.as_millis().min(libc::c_int::MAX as u128) as libc::c_int;
    // SAFETY: `fds` holds `fds.len()` initialized `pollfd`s that outlive the call, which writes
    // only their `revents`; every descriptor is an open socket of the loop, or negative
    // (ignored by `poll`).
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait) };
    if ready < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(ready as usize)
}

/// The serving loop's served connections and request handler.
struct Serving<H> {
    incoming: Vec<Incoming>,
    open: Arc<OpenStreams>,
    /// [`REQUEST_TIMEOUT`].
    timeout: Duration,
    handle: H,
    /// The buffer answers are built in, kept across requests.
    answer: Vec<u8>,
}

impl<H> Serving<H>
where
    H: FnMut(&mut TcpStream, &mut Vec<u8>) -> std::io::Result<()>,
{
    fn new(open: Arc<OpenStreams>, timeout: Duration, handle: H) -> Serving<H> {
        Serving { incoming: Vec::new(), open, timeout, handle, answer: Vec::new() }
    }

    /// Serves `stream` from now on, its reads waiting at most the request timeout (dropped if
    /// that cannot be set).
    fn add(&mut self, stream: TcpStream) {
        if stream.set_read_timeout(Some(self.timeout)).is_ok() {
            self.incoming.push(Incoming::new(stream, &self.open));
        } else {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Appends what `poll` is to wait for on every served connection, in order.
    fn poll_fds(&self, fds: &mut Vec<libc::pollfd>) {
        fds.extend(self.incoming.iter().map(|c| libc::pollfd {
            fd: c.stream.as_raw_fd(),
            events: c.events(),
            revents: 0,
        }));
    }

    /// Acts on each served connection's `revents` (in the order of [`Serving::poll_fds`]),
    /// dropping those that end; stops early once `stop` is raised.
    fn step(&mut self, ready: &[libc::pollfd], stop: &AtomicBool) {
        let mut at = 0;
        for fd in ready {
            if stop.load(Ordering::Acquire) {
                break;
            }
            if self.incoming[at].step(fd.revents, &mut self.answer, &mut self.handle) {
                at += 1;
            } else {
                drop(self.incoming.remove(at));
            }
        }
    }
}

/// The serving loop's listener and the connections whose introduction it awaits: it accepts
/// without blocking and reads each introduction as it arrives, so a silent or slow connection
/// holds up nothing.
///
/// A connection is rejected, that is dropped and counted, when its introduction is wrong
/// ([`Gate::check`], which also rejects a member's second connection), ends early, is not
/// whole within [`INTRODUCTION_TIMEOUT`] of its accept, or is still incomplete when the loop
/// ends. Connections still waiting in the listener's backlog then are never accepted, so not
/// counted: the kernel resets them when the listener closes.
struct Admission {
    listener: TcpListener,
    gate: Gate,
    /// `connected[r]`: member `r`'s connection was admitted (at most once in the links'
    /// lifetime: an origin never connects again).
    connected: Vec<bool>,
    arrivals: Vec<Arrival>,
    rejected: Arc<AtomicUsize>,
    /// Until when the listener is left alone because accepting failed.
    resting_until: Instant,
}

impl Admission {
    fn new(listener: TcpListener, gate: Gate, rejected: Arc<AtomicUsize>) -> Admission {
        let connected = vec![false; gate.remote.len()];
        let resting_until = Instant::now();
        Admission { listener, gate, connected, arrivals: Vec::new(), rejected, resting_until }
    }

    /// Appends what `poll` is to wait for: the listener first (a negative descriptor, which
    /// `poll` ignores, while it rests or [`MAX_ARRIVALS`] introductions are awaited), then every
    /// awaited introduction.
    fn poll_fds(&self, now: Instant, fds: &mut Vec<libc::pollfd>) {
        let listening = now >= self.resting_until && self.arrivals.len() < MAX_ARRIVALS;
        let listener = if listening { self.listener.as_raw_fd() } else { -1 };
        fds.push(libc::pollfd { fd: listener, events: libc::POLLIN, revents: 0 });
        fds.extend(self.arrivals.iter().map(|arrival| libc::pollfd {
            fd: arrival.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
    }

    /// Acts on `ready` (in the order of [`Admission::poll_fds`]): reads the introductions that
    /// arrived or whose time is up, then accepts what waits on the listener. The connections
    /// admitted, to be served.
    fn step(&mut self, ready: &[libc::pollfd], now: Instant) -> Vec<TcpStream> {
        let mut admitted = Vec::new();
        for at in (0..self.arrivals.len()).rev() {
            let revents = ready.get(at + 1).map_or(0, |fd| fd.revents);
            if revents != 0 || now >= self.arrivals[at].until {
                self.settle(at, now, &mut admitted);
            }
        }
        if ready.first().is_some_and(|fd| fd.revents != 0) {
            self.accept(now, &mut admitted);
        }
        admitted
    }

    /// Reads what arrived of the introduction of arrival `at`; once there is a verdict, admits
    /// its connection into `admitted` or rejects it.
    fn settle(&mut self, at: usize, now: Instant, admitted: &mut Vec<TcpStream>) {
        if let Some(verdict) = self.arrivals[at].poll(now, &self.gate, &self.connected) {
            let arrival = self.arrivals.swap_remove(at);
            admitted.extend(self.decide(arrival, verdict));
        }
    }

    /// Accepts the connections waiting on the listener (up to [`MAX_ARRIVALS`] awaited) and
    /// reads what arrived of their introductions; after an error other than a connection that
    /// went away, rests the listener for [`STOP_CHECK`].
    fn accept(&mut self, now: Instant, admitted: &mut Vec<TcpStream>) {
        use std::io::ErrorKind::{ConnectionAborted, Interrupted, WouldBlock};
        while self.arrivals.len() < MAX_ARRIVALS {
            match self.listener.accept() {
                Ok((stream, _)) => match Arrival::new(stream, now + INTRODUCTION_TIMEOUT) {
                    Ok(arrival) => {
                        self.arrivals.push(arrival);
                        self.settle(self.arrivals.len() - 1, now, admitted);
                    }
                    Err(_) => self.reject(),
                },
                Err(e) if matches!(e.kind(), Interrupted | ConnectionAborted) => {}
                Err(e) if e.kind() == WouldBlock => return,
                Err(_) => {
                    self.resting_until = now + STOP_CHECK;
                    return;
                }
            }
        }
    }

    /// The connection of `arrival` if `verdict` admits it and it can be made blocking again
    /// (its origin then counts as connected); otherwise `None`, and it counts as rejected
    /// before its connection is closed (a peer that sees it closed sees it counted).
    fn decide(&mut self, arrival: Arrival, verdict: Verdict) -> Option<TcpStream> {
        let Ok(origin) = verdict else {
            self.reject();
            drop(arrival);
            return None;
        };
        match arrival.into_stream() {
            Ok(stream) => {
                self.connected[origin as usize] = true;
                Some(stream)
            }
            Err(_) => {
                self.reject();
                None
            }
        }
    }

    fn reject(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts every introduction still awaited as rejected (the loop ends).
    fn end(&mut self) {
        self.rejected.fetch_add(self.arrivals.len(), Ordering::Relaxed);
        self.arrivals.clear();
    }
}

/// One part of an answer, in operation order: window bytes to copy (`None`: out of range,
/// zeros), a compare-and-swap's previous value, or an extent's bytes.
enum Answer {
    Copy(Option<*mut u8>, usize),
    Held(u64),
    Extent(u64, usize),
}

/// What serving a request needs besides the window memory, kept from one request to the next.
#[derive(Default)]
struct ServeBuffers {
    entries: Vec<u8>,
    put_data: Vec<u8>,
    gets: Vec<Answer>,
}

/// One entry of a request: operation code, displacement (or extent id), length.
struct Entry {
    code: u8,
    disp: u64,
    len: u64,
}

impl Entry {
    fn decode(bytes: &[u8]) -> Entry {
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        Entry { code: bytes[0], disp: word(1), len: word(9) }
    }
}

/// Reads one whole request from `stream`, applies it to `memory` and appends its answer to
/// `answer`. Fails when the stream fails or ends before the request is whole.
fn serve_request(
    stream: &mut TcpStream,
    memory: Memory,
    buffers: &mut ServeBuffers,
    answer: &mut Vec<u8>,
) -> std::io::Result<()> {
    let mut count = [0u8; 4];
    stream.read_exact(&mut count)?;
    buffers.entries.resize(u32::from_le_bytes(count) as usize * ENTRY_LEN, 0);
    stream.read_exact(&mut buffers.entries)?;
    let mut status = STATUS_OK;
    buffers.gets.clear();
    let entries = std::mem::take(&mut buffers.entries);
    for entry in entries.chunks_exact(ENTRY_LEN).map(Entry::decode) {
        let served = serve_entry(stream, memory, &entry, buffers)?;
        if served != STATUS_OK {
            status = served;
        }
    }
    buffers.entries = entries;
    build_answer(memory, buffers, status, answer);
    if buffers.put_data.capacity() > KEPT_BUFFER {
        buffers.put_data = Vec::new();
    }
    Ok(())
}

/// The largest request buffer the serving thread keeps between requests: a large value's
/// buffer is given back once it is applied.
const KEPT_BUFFER: usize = 4 << 20;

/// Applies one entry (reading its data from `stream`); returns its status.
fn serve_entry(
    stream: &mut TcpStream,
    memory: Memory,
    entry: &Entry,
    buffers: &mut ServeBuffers,
) -> std::io::Result<u8> {
    let ServeBuffers { put_data, gets, .. } = buffers;
    let target = memory.range(entry.disp, entry.len);
    let in_range = if target.is_some() { STATUS_OK } else { STATUS_OUT_OF_RANGE };
    match entry.code {
        OP_PUT => {
            put_data.resize(entry.len as usize, 0);
            stream.read_exact(put_data)?;
            if let Some(ptr) = target {
                // SAFETY: `ptr` is `len` bytes inside the window memory (range-checked),
                // which outlives the serving thread; `put_data` is a separate allocation.
                unsafe { copy_into_shared(put_data.as_ptr(), ptr, put_data.len()) };
            }
            Ok(in_range)
        }
        OP_GET => {
            gets.push(Answer::Copy(target, entry.len as usize));
            Ok(in_range)
        }
        OP_COMPARE_AND_SWAP => {
            put_data.resize(16, 0);
            stream.read_exact(put_data)?;
            let aligned = entry.disp.is_multiple_of(8) && entry.len == 8;
            let held = match target.filter(|_| aligned) {
                Some(_) => memory.compare_and_swap(entry.disp, put_data),
                None => None,
            };
            gets.push(Answer::Held(held.unwrap_or(0)));
            Ok(match (target, held) {
                (None, _) => STATUS_OUT_OF_RANGE,
                (Some(_), None) => STATUS_ATOMIC_FAILED,
                _ => STATUS_OK,
            })
        }
        OP_EXTENT_PUT => {
            put_data.resize(entry.len as usize, 0);
            stream.read_exact(put_data)?;
            Ok(extent_status(memory.extents.write(memory.member, entry.disp, put_data)))
        }
        OP_EXTENT_GET => {
            gets.push(Answer::Extent(entry.disp, entry.len as usize));
            Ok(STATUS_OK)
        }
        OP_EXTENT_FREE => Ok(extent_status(memory.extents.free(memory.member, entry.disp))),
        _ => Ok(STATUS_OUT_OF_RANGE),
    }
}

fn extent_status(done: Result<()>) -> u8 {
    if done.is_ok() {
        STATUS_OK
    } else {
        STATUS_EXTENT_FAILED
    }
}

/// Appends a request's answer to `answer`: every get's bytes and compare-and-swap's value in
/// order, then `status`.
fn build_answer(memory: Memory, buffers: &ServeBuffers, mut status: u8, answer: &mut Vec<u8>) {
    let ServeBuffers { gets, .. } = buffers;
    for part in gets.iter() {
        let (target, len) = match *part {
            Answer::Held(value) => {
                answer.extend_from_slice(&value.to_le_bytes());
                continue;
            }
            Answer::Copy(target, len) => (target, len),
            Answer::Extent(id, len) => {
                let start = answer.len();
                answer.resize(start + len, 0);
                if memory.extents.read(memory.member, id, &mut answer[start..]).is_err() {
                    status = STATUS_EXTENT_FAILED;
                }
                continue;
            }
        };
        let start = answer.len();
        answer.resize(start + len, 0);
        if let Some(ptr) = target {
            // SAFETY: `ptr` is `len` readable bytes inside the window memory (range-checked);
            // `answer` is a separate allocation.
            unsafe { copy_from_shared(ptr.cast_const(), answer[start..].as_mut_ptr(), len) };
        }
    }
    answer.push(status);
}

/// Every member's listening address, in rank order.
fn exchange_addresses(comm: &Comm, listener: &TcpListener) -> Result<Vec<SocketAddrV4>> {
    let mine = match listener.local_addr() {
        Ok(SocketAddr::V4(address)) => address,
        Ok(SocketAddr::V6(_)) => return Err(other("Links", "the listener is not IPv4")),
        Err(e) => return Err(io_error("reading the listener's address", e, None)),
    };
    let mut encoded = mine.ip().octets().to_vec();
    encoded.extend_from_slice(&mine.port().to_le_bytes());
    let all = comm.allgather(&encoded)?;
    Ok(all
        .chunks_exact(ADDRESS_LEN)
        .map(|c| {
            let ip = Ipv4Addr::new(c[0], c[1], c[2], c[3]);
            SocketAddrV4::new(ip, u16::from_le_bytes([c[4], c[5]]))
        })
        .collect())
}

/// The secret of one creation of the links: rank 0 draws it from the kernel's random source and
/// every member learns it over MPI. Never printed (no `Debug`).
///
/// An introduction carries the secret itself, not a hash keyed by it. What it guards against is
/// a process that can connect to a listener but is no member and cannot read the job's
/// traffic: it does not know the secret. The secret travels only over MPI and over the job's
/// own connections, whose requests go in clear; whoever can read those could also replay the
/// secret to a listener while its window lives (as a member that has not connected to that
/// listener's member yet: a member's second connection is rejected, so the genuine one would
/// then fail as if its target had), or tamper with the requests themselves, which no
/// introduction prevents, and a non-cryptographic keyed hash (xxh3) would not make it
/// unforgeable either. Each creation draws a new secret and closes its listeners when its
/// window's links are dropped, so a secret read then opens nothing later.
#[derive(Clone)]
struct Secret([u8; SECRET_LEN]);

impl Secret {
    /// Reads a fresh secret from `/dev/urandom`.
    fn draw() -> std::io::Result<Secret> {
        let mut bytes = [0u8; SECRET_LEN];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
        Ok(Secret(bytes))
    }

    /// Rank 0's fresh secret, learnt by every member of `comm` (collective: every member
    /// contributes a flag and a secret's bytes, only rank 0's are used). Fails on every member
    /// alike when rank 0 could not draw one, so no member is left in a collective call.
    fn share(comm: &Comm) -> Result<Secret> {
        let mut mine = [0u8; 1 + SECRET_LEN];
        let drawn = (comm.rank() == 0).then(Secret::draw);
        if let Some(Ok(secret)) = &drawn {
            mine[0] = 1;
            mine[1..].copy_from_slice(&secret.0);
        }
        let all = comm.allgather(&mine)?;
        match (drawn, all[0]) {
            (Some(Err(e)), _) => Err(io_error("drawing the links' secret", e, None)),
            (_, 1) => Ok(Secret(all[1..1 + SECRET_LEN].try_into().expect("16 bytes"))),
            _ => Err(other("Links", "rank 0 could not draw the links' secret")),
        }
    }

    /// Whether `candidate` is this secret, compared in a time that does not depend on where
    /// they differ.
    fn matches(&self, candidate: &[u8]) -> bool {
        let differ = self.0.iter().zip(candidate).fold(0u8, |acc, (a, b)| acc | (a ^ b));
        candidate.len() == SECRET_LEN && differ == 0
    }
}

/// The introduction `origin` sends first on its connection to `target`.
fn introduction(secret: &Secret, origin: i32, target: i32) -> [u8; INTRO_LEN] {
    let mut intro = [0u8; INTRO_LEN];
    intro[..INTRO_ORIGIN].copy_from_slice(INTRO_MAGIC);
    intro[INTRO_ORIGIN..INTRO_TARGET].copy_from_slice(&(origin as u32).to_le_bytes());
    intro[INTRO_TARGET..INTRO_SECRET].copy_from_slice(&(target as u32).to_le_bytes());
    intro[INTRO_SECRET..].copy_from_slice(&secret.0);
    intro
}

/// Why an accepted connection was dropped instead of served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rejected {
    /// It did not start with [`INTRO_MAGIC`].
    Magic,
    /// Its secret was not this creation's.
    Secret,
    /// It was meant for another member.
    Target,
    /// Its origin is not a member on another host.
    Origin,
    /// Its origin's connection was admitted before (in the links' lifetime).
    Duplicate,
    /// It ended before its introduction was whole.
    Truncated,
    /// Its introduction was not whole in time.
    TimedOut,
    /// Reading or configuring it failed otherwise.
    Io,
}

/// A connection's verdict: its origin's rank, or why it is dropped.
type Verdict = std::result::Result<i32, Rejected>;

/// What an accepting member checks introductions against.
struct Gate {
    secret: Secret,
    /// The accepting member's rank.
    me: i32,
    /// `remote[r]`: member `r` is on another host.
    remote: Vec<bool>,
}

impl Gate {
    /// The origin of a whole introduction if it is genuine: the magic, this creation's secret,
    /// this member as target, and as origin a member on another host not in `connected` yet.
    fn check(&self, intro: &[u8; INTRO_LEN], connected: &[bool]) -> Verdict {
        let rank = |at: usize| u32::from_le_bytes(intro[at..at + 4].try_into().expect("4 bytes"));
        if intro[..INTRO_ORIGIN] != INTRO_MAGIC[..] {
            return Err(Rejected::Magic);
        }
        if !self.secret.matches(&intro[INTRO_SECRET..]) {
            return Err(Rejected::Secret);
        }
        if i64::from(rank(INTRO_TARGET)) != i64::from(self.me) {
            return Err(Rejected::Target);
        }
        let origin = rank(INTRO_ORIGIN) as usize;
        if !self.remote.get(origin).copied().unwrap_or(false) {
            return Err(Rejected::Origin);
        }
        if connected.get(origin).copied().unwrap_or(false) {
            return Err(Rejected::Duplicate);
        }
        Ok(origin as i32)
    }
}

/// An accepted connection whose introduction is read as it arrives, without waiting for it.
struct Arrival {
    stream: TcpStream,
    intro: [u8; INTRO_LEN],
    filled: usize,
    /// When its time to send the whole introduction is up.
    until: Instant,
}

impl Arrival {
    /// Starts reading `stream`'s introduction, which must be whole before `until`.
    fn new(stream: TcpStream, until: Instant) -> std::io::Result<Arrival> {
        stream.set_nonblocking(true)?;
        Ok(Arrival { stream, intro: [0; INTRO_LEN], filled: 0, until })
    }

    /// Reads what has arrived of the introduction (never a byte beyond it) and returns the
    /// verdict once there is one: `None` while it is incomplete, starts with the magic and
    /// `now` is before its time is up; else the origin's rank ([`Gate::check`]) or why the
    /// connection is to be dropped.
    fn poll(&mut self, now: Instant, gate: &Gate, connected: &[bool]) -> Option<Verdict> {
        use std::io::ErrorKind::{Interrupted, WouldBlock};
        while self.filled < INTRO_LEN {
            match self.stream.read(&mut self.intro[self.filled..]) {
                Ok(0) => return Some(Err(Rejected::Truncated)),
                Ok(n) => self.filled += n,
                Err(e) if e.kind() == Interrupted => {}
                Err(e) if e.kind() == WouldBlock => {
                    return (now >= self.until).then_some(Err(Rejected::TimedOut));
                }
                Err(_) => return Some(Err(Rejected::Io)),
            }
            if !INTRO_MAGIC.starts_with(&self.intro[..self.filled.min(INTRO_ORIGIN)]) {
                return Some(Err(Rejected::Magic));
            }
        }
        Some(gate.check(&self.intro, connected))
    }

    /// The connection of an admitted member, blocking again for its serving thread.
    fn into_stream(self) -> std::io::Result<TcpStream> {
        self.stream.set_nonblocking(false)?;
        configure(&self.stream)?;
        Ok(self.stream)
    }
}

fn configure(stream: &TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)
}

/// A failed socket operation: the peer's end is gone (`ProcFailed`), or anything else.
fn io_error(what: &'static str, e: std::io::Error, peer: Option<i32>) -> MpiError {
    use std::io::ErrorKind::*;
    match e.kind() {
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe | ConnectionRefused
        | TimedOut | WouldBlock | HostUnreachable | NetworkUnreachable => {
            MpiError::ProcFailed { op: what, peer }
        }
        _ => MpiError::Other { op: what, class: -1, msg: e.to_string() },
    }
}

/// The IPv4 address this member listens on: the first address of this host inside the
/// networks named by `FTKV_TCP_IF_INCLUDE`, else by Open MPI's `btl_tcp_if_include` (CIDR
/// subnets or interface names, comma-separated); without either, the first non-loopback
/// address, or loopback on a host without one.
fn local_address() -> Result<Ipv4Addr> {
    let include = ["FTKV_TCP_IF_INCLUDE", "OMPI_MCA_btl_tcp_if_include"]
        .iter()
        .find_map(|var| std::env::var(var).ok().filter(|v| !v.trim().is_empty()));
    let interfaces = crate::runtime::ipv4_interfaces()?;
    let chosen = match include {
        Some(spec) => {
            let filters: Vec<&str> = spec.split(',').map(str::trim).collect();
            interfaces.iter().find(|(name, ip)| filters.iter().any(|f| matches(f, name, *ip)))
        }
        None => interfaces.iter().find(|(_, ip)| !ip.is_loopback()),
    };
    Ok(chosen.map_or(Ipv4Addr::LOCALHOST, |(_, ip)| *ip))
}

/// Whether `filter` (an interface name or an `a.b.c.d/len` subnet) names interface `name` with
/// address `ip`.
fn matches(filter: &str, name: &str, ip: Ipv4Addr) -> bool {
    let Some((net, len)) = filter.split_once('/') else { return filter == name };
    let (Ok(net), Ok(len)) = (net.parse::<Ipv4Addr>(), len.parse::<u32>()) else { return false };
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len.min(32)) };
    u32::from(ip) & mask == u32::from(net) & mask
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnet_and_name_filters() {
        let ip = Ipv4Addr::new(10, 250, 0, 3);
        assert!(matches("10.250.0.0/24", "veth0", ip));
        assert!(!matches("10.251.0.0/24", "veth0", ip));
        assert!(matches("veth0", "veth0", ip));
        assert!(!matches("lo", "veth0", ip));
        assert!(matches("0.0.0.0/0", "x", ip));
    }

    #[test]
    fn a_closed_connection_is_a_failed_peer() {
        let e = io_error("x", std::io::Error::from(std::io::ErrorKind::UnexpectedEof), Some(3));
        assert_eq!(e, MpiError::ProcFailed { op: "x", peer: Some(3) });
    }

    const SECRET: Secret = Secret([7; SECRET_LEN]);

    /// Member 0's gate: members 1 and 2 on other hosts, 3 on its own.
    fn gate() -> Gate {
        Gate { secret: SECRET, me: 0, remote: vec![false, true, true, false] }
    }

    /// The verdict on a connection that sends `sent`, then closes (`close`) or stays silent;
    /// `connected`: the members already admitted.
    fn verdict(sent: &[u8], close: bool, connected: &[bool]) -> Verdict {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        client.write_all(sent).unwrap();
        let client = (!close).then_some(client);
        let (stream, _) = listener.accept().unwrap();
        let until = Instant::now() + Duration::from_millis(200);
        let mut arrival = Arrival::new(stream, until).unwrap();
        let verdict = loop {
            match arrival.poll(Instant::now(), &gate(), connected) {
                Some(verdict) => break verdict,
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        };
        drop(client);
        verdict
    }

    const NONE: [bool; 4] = [false; 4];

    #[test]
    fn a_genuine_introduction_is_admitted() {
        assert_eq!(verdict(&introduction(&SECRET, 1, 0), false, &NONE), Ok(1));
        assert_eq!(verdict(&introduction(&SECRET, 2, 0), true, &NONE), Ok(2));
    }

    #[test]
    fn garbage_is_rejected_at_once() {
        let request = b"GET / HTTP/1.1\r\nHost: ftkv\r\n\r\n";
        assert_eq!(verdict(request, false, &NONE), Err(Rejected::Magic));
        assert_eq!(verdict(&[0xAB; 64], true, &NONE), Err(Rejected::Magic));
    }

    #[test]
    fn a_forged_secret_is_rejected() {
        let mut forged = introduction(&SECRET, 1, 0);
        forged[INTRO_LEN - 1] ^= 1;
        assert_eq!(verdict(&forged, false, &NONE), Err(Rejected::Secret));
        let other = Secret([8; SECRET_LEN]);
        assert_eq!(verdict(&introduction(&other, 1, 0), false, &NONE), Err(Rejected::Secret));
    }

    #[test]
    fn a_second_connection_of_a_member_is_rejected() {
        let connected = [false, true, false, false];
        let intro = introduction(&SECRET, 1, 0);
        assert_eq!(verdict(&intro, false, &connected), Err(Rejected::Duplicate));
    }

    #[test]
    fn only_members_on_other_hosts_introducing_to_this_one_are_admitted() {
        let to_other = introduction(&SECRET, 1, 2);
        assert_eq!(verdict(&to_other, false, &NONE), Err(Rejected::Target));
        for origin in [0, 3, 4, -1] {
            let intro = introduction(&SECRET, origin, 0);
            assert_eq!(verdict(&intro, false, &NONE), Err(Rejected::Origin), "{origin}");
        }
    }

    #[test]
    fn a_short_introduction_then_close_is_rejected() {
        let intro = introduction(&SECRET, 1, 0);
        assert_eq!(verdict(&intro[..20], true, &NONE), Err(Rejected::Truncated));
        assert_eq!(verdict(&[], true, &NONE), Err(Rejected::Truncated));
    }

    #[test]
    fn a_silent_or_stalled_connection_times_out() {
        assert_eq!(verdict(&[], false, &NONE), Err(Rejected::TimedOut));
        let intro = introduction(&SECRET, 1, 0);
        assert_eq!(verdict(&intro[..INTRO_LEN - 1], false, &NONE), Err(Rejected::TimedOut));
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(SECRET.matches(&[7; SECRET_LEN]));
        assert!(!SECRET.matches(&[7; SECRET_LEN - 1]));
        let mut last = [7; SECRET_LEN];
        last[SECRET_LEN - 1] = 0;
        assert!(!SECRET.matches(&last));
    }

    /// Member 0's gate with `n` members on other hosts (ranks 1 to `n`).
    fn members_gate(n: i32) -> Gate {
        Gate { secret: SECRET, me: 0, remote: (0..=n).map(|rank| rank != 0).collect() }
    }

    fn v4(address: SocketAddr) -> SocketAddrV4 {
        match address {
            SocketAddr::V4(address) => address,
            SocketAddr::V6(_) => panic!("IPv6"),
        }
    }

    /// Member `rank`'s side of the links, with member 0 (listening at `address`) on another
    /// host.
    fn origin(rank: i32, address: SocketAddrV4) -> Outgoing {
        Outgoing::new(rank, SECRET, &[address], &[true])
    }

    /// A connection from no member: it sends `sent` and stays open; reads wait 5 s.
    fn stray(address: SocketAddrV4, sent: &[u8]) -> TcpStream {
        let mut stream = TcpStream::connect(address).unwrap();
        stream.write_all(sent).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream
    }

    /// Waits up to 10 s for `done`.
    fn eventually(what: &str, done: impl Fn() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < Duration::from_secs(10), "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends a request over `origin`'s link to member 0 (connecting it on first use, as
    /// [`Links::send`] does) and reads its whole answer.
    fn ask_over(origin: &Outgoing, tag: u8, repeat: u32, payload: &[u8]) -> Vec<u8> {
        let mut link = origin.link(0).unwrap();
        let stream = link.stream().expect("open");
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        ask(stream, tag, repeat, payload)
    }

    #[test]
    fn members_connect_on_first_use_among_strays_which_are_rejected() {
        let (mut server, address, log) = start_echo(2, Duration::from_secs(2));
        let origins = [origin(1, address), origin(2, address)];
        let mut strays = vec![
            stray(address, b"GET / HTTP/1.1\r\nHost: ftkv\r\n\r\n"),
            stray(address, &introduction(&Secret([8; SECRET_LEN]), 1, 0)),
            stray(address, &[]),
        ];
        std::thread::scope(|scope| {
            for (origin, tag) in origins.iter().zip([b'1', b'2']) {
                scope.spawn(move || {
                    for round in 0..5u8 {
                        assert_eq!(ask_over(origin, tag, 2, &[round]), [round; 2]);
                    }
                });
            }
            scope.spawn(|| strays.push(stray(address, &[0xAB; 64])));
        });
        // A second connection as member 1, with the right secret: a duplicate.
        strays.push(stray(address, &introduction(&SECRET, 1, 0)));
        eventually("every stray rejected, the silent one in time", || server.rejected() == 5);
        assert_eq!(server.served(), 2);
        for stray in &mut strays {
            assert!(closed(stray), "a stray's connection is dropped");
        }
        assert_eq!(ask_over(&origins[0], b'1', 1, b"after"), b"after");
        assert_eq!(ask_over(&origins[1], b'2', 3, b"x"), b"xxx");
        let log = log.lock().unwrap().clone();
        let tags = |tag| log.iter().filter(|(_, t)| *t == tag).count();
        assert_eq!((tags(b'1'), tags(b'2'), log.len()), (6, 6, 12), "strays never served");
        server.stop().unwrap();
        assert!(TcpStream::connect(address).is_err(), "the listener closed with the server");
    }

    #[test]
    fn nothing_is_connected_before_the_first_send() {
        let (mut server, address, _log) = start_echo(2, Duration::from_secs(2));
        let origins = [origin(1, address), origin(2, address)];
        let unopened = |origin: &Outgoing| {
            let target = origin.targets[0].as_ref().unwrap();
            matches!(*target.link.lock().unwrap(), Link::Unopened)
        };
        std::thread::sleep(Duration::from_millis(200));
        assert!(origins.iter().all(unopened));
        assert_eq!((server.served(), server.rejected()), (0, 0));
        assert_eq!(ask_over(&origins[0], b'1', 1, b"first"), b"first");
        assert!(!unopened(&origins[0]) && unopened(&origins[1]));
        eventually("member 1's connection served", || server.served() == 1);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!((server.served(), server.rejected()), (1, 0), "one connection, no other");
        server.stop().unwrap();
    }

    #[test]
    fn a_target_whose_listener_is_gone_fails_the_first_send_for_good() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let address = v4(listener.local_addr().unwrap());
        drop(listener);
        let origin = origin(1, address);
        let failed = MpiError::ProcFailed { op: "connecting to a member", peer: Some(0) };
        assert_eq!(origin.link(0).err(), Some(failed));
        assert!(matches!(*origin.link(0).unwrap(), Link::Failed));
        // A listener back at that address is never connected to.
        if let Ok(listener) = TcpListener::bind(address) {
            assert!(matches!(*origin.link(0).unwrap(), Link::Failed));
            listener.set_nonblocking(true).unwrap();
            let accepted = listener.accept().map(|_| ()).map_err(|e| e.kind());
            assert_eq!(accepted, Err(std::io::ErrorKind::WouldBlock));
        }
        for target in [1, -1] {
            assert!(matches!(origin.link(target).err(), Some(MpiError::Other { .. })));
        }
    }

    /// A test request: tag byte, repeat count and payload length (`u32`, little-endian), then
    /// the payload; its answer is the payload `repeat` times.
    fn request(tag: u8, repeat: u32, payload: &[u8]) -> Vec<u8> {
        let mut bytes = vec![tag];
        bytes.extend_from_slice(&repeat.to_le_bytes());
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(payload);
        bytes
    }

    /// Who served which request: the serving thread and the request's tag.
    type Log = Arc<Mutex<Vec<(std::thread::ThreadId, u8)>>>;

    /// A [`Server`] of member 0 with `members` members on other hosts, on a listener of this
    /// process, whose handler answers [`request`]s and records them in the returned log; the
    /// listener's address.
    fn start_echo(members: i32, timeout: Duration) -> (Server, SocketAddrV4, Log) {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let address = v4(listener.local_addr().unwrap());
        let log = Log::default();
        let record = Arc::clone(&log);
        let server = Server::start(listener, members_gate(members), timeout, move || {
            move |stream: &mut TcpStream, answer: &mut Vec<u8>| {
                let mut head = [0u8; 9];
                stream.read_exact(&mut head)?;
                let repeat = u32::from_le_bytes(head[1..5].try_into().unwrap());
                let mut payload = vec![0u8; u32::from_le_bytes(head[5..].try_into().unwrap()) as _];
                stream.read_exact(&mut payload)?;
                for _ in 0..repeat {
                    answer.extend_from_slice(&payload);
                }
                record.lock().unwrap().push((std::thread::current().id(), head[0]));
                Ok(())
            }
        })
        .unwrap();
        (server, address, log)
    }

    /// Member `rank`'s connection to member 0 at `address`, as [`Outgoing::link`] makes it,
    /// with a 5 s read timeout.
    fn dial_as(rank: i32, address: SocketAddrV4) -> TcpStream {
        let stream = dial(address, &introduction(&SECRET, rank, 0), CONNECT_TIMEOUT).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream
    }

    /// [`start_echo`] with `n` members, each connected (ranks 1 to `n`, in order) and served.
    fn echo_server(n: usize, timeout: Duration) -> (Server, Vec<TcpStream>, Log) {
        let (server, address, log) = start_echo(n as i32, timeout);
        let origins: Vec<TcpStream> = (1..=n as i32).map(|rank| dial_as(rank, address)).collect();
        eventually("every member's connection served", || server.served() == n);
        (server, origins, log)
    }

    /// Sends a request on `origin` and reads its whole answer.
    fn ask(origin: &mut TcpStream, tag: u8, repeat: u32, payload: &[u8]) -> Vec<u8> {
        origin.write_all(&request(tag, repeat, payload)).unwrap();
        let mut answer = vec![0u8; payload.len() * repeat as usize];
        origin.read_exact(&mut answer).unwrap();
        answer
    }

    /// Whether the server's end of `origin` was closed: a read ends (EOF or reset) instead of
    /// timing out.
    fn closed(origin: &mut TcpStream) -> bool {
        use std::io::ErrorKind::{TimedOut, WouldBlock};
        match origin.read(&mut [0u8; 1]) {
            Ok(n) => n == 0,
            Err(e) => !matches!(e.kind(), TimedOut | WouldBlock),
        }
    }

    #[test]
    fn one_thread_serves_every_connection_and_drops_the_closed_and_the_stalled() {
        let timeout = Duration::from_millis(300);
        let (mut server, origins, log) = echo_server(3, timeout);
        let [mut a, mut b, c]: [TcpStream; 3] = origins.try_into().unwrap();
        for round in 0..3u8 {
            assert_eq!(ask(&mut a, b'a', 2, &[round]), [round; 2]);
            assert_eq!(ask(&mut b, b'b', 1, b"bee"), b"bee");
            let mut c = &c;
            c.write_all(&request(b'c', 3, b"xy")).unwrap();
            let mut answer = [0u8; 6];
            c.read_exact(&mut answer).unwrap();
            assert_eq!(&answer, b"xyxyxy");
        }
        // An origin that closes is dropped; the others go on.
        drop(c);
        assert_eq!(ask(&mut a, b'a', 1, b"after close"), b"after close");
        assert_eq!(ask(&mut b, b'b', 1, b"after close"), b"after close");
        // Half a request, then silence: dropped after the timeout, the others served meanwhile.
        let whole = request(b'b', 1, b"12345678");
        b.write_all(&whole[..whole.len() - 5]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let asked = Instant::now();
        assert_eq!(ask(&mut a, b'a', 1, b"while b stalls"), b"while b stalls");
        // At most the stall's timeout (the loop may have started on `b` first), with room for a
        // loaded machine; a loop blocked by `b` for good would fail the read (5 s timeout).
        assert!(asked.elapsed() < timeout + Duration::from_secs(3), "{:?}", asked.elapsed());
        assert!(closed(&mut b), "the stalled connection is dropped");
        for _ in 0..3 {
            assert_eq!(ask(&mut a, b'a', 4, b"z"), b"zzzz");
        }
        let log = log.lock().unwrap().clone();
        let tags = |tag| log.iter().filter(|(_, t)| *t == tag).count();
        assert_eq!((tags(b'a'), tags(b'b'), tags(b'c')), (3 + 2 + 3, 3 + 1, 3));
        let thread = log[0].0;
        assert_ne!(thread, std::thread::current().id());
        assert!(log.iter().all(|(id, _)| *id == thread), "one thread served every request");
        // Stop and join promptly; the remaining origin sees its connection end.
        let stopping = Instant::now();
        server.stop().unwrap();
        assert!(stopping.elapsed() < Duration::from_secs(2), "{:?}", stopping.elapsed());
        assert!(closed(&mut a));
    }

    #[test]
    fn an_unread_answer_holds_up_no_other_connection() {
        let (mut server, origins, _log) = echo_server(2, Duration::from_secs(2));
        let [mut a, mut b]: [TcpStream; 2] = origins.try_into().unwrap();
        // 16 MiB that `a` does not read yet: far more than the socket buffers hold.
        let pattern: Vec<u8> = (0..=255).collect();
        let repeat = (16 << 20) / pattern.len() as u32;
        a.write_all(&request(b'a', repeat, &pattern)).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let asked = Instant::now();
        for _ in 0..5 {
            assert_eq!(ask(&mut b, b'b', 1, b"quick"), b"quick");
        }
        assert!(asked.elapsed() < Duration::from_secs(3), "{:?}", asked.elapsed());
        let mut answer = vec![0u8; pattern.len() * repeat as usize];
        a.read_exact(&mut answer).unwrap();
        assert!(answer.chunks_exact(pattern.len()).all(|chunk| chunk == &pattern[..]));
        assert_eq!(ask(&mut a, b'a', 1, b"next"), b"next", "a is served again once it read");
        server.stop().unwrap();
    }

    #[test]
    fn stopping_ends_a_read_in_progress() {
        let (mut server, origins, _log) = echo_server(2, Duration::from_secs(30));
        let [mut a, _b]: [TcpStream; 2] = origins.try_into().unwrap();
        let whole = request(b'a', 1, b"never whole");
        a.write_all(&whole[..4]).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let stopping = Instant::now();
        server.stop().unwrap();
        assert!(stopping.elapsed() < Duration::from_secs(2), "{:?}", stopping.elapsed());
        assert!(closed(&mut a));
    }

    #[test]
    fn the_server_keeps_listening_once_every_connection_is_gone() {
        let (mut server, address, _log) = start_echo(3, Duration::from_secs(2));
        drop([dial_as(1, address), dial_as(2, address)]);
        std::thread::sleep(Duration::from_millis(200));
        eventually("the closed connections dropped", || server.served() == 0);
        assert!(!server.thread.as_ref().unwrap().is_finished());
        assert_eq!(ask(&mut dial_as(3, address), b'c', 2, b"late"), b"latelate");
        assert!(closed(&mut dial_as(1, address)), "member 1 connected before: a duplicate");
        assert_eq!(server.rejected(), 1);
        server.stop().unwrap();
    }
}
