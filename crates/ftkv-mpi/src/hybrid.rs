//! A window that fits the transport: shared memory within a host, TCP between hosts.
//!
//! Between hosts Open MPI gives windows osc rdma over btl tcp, where a put completes only when
//! the target process makes MPI progress (20 ms when the target calls MPI every 20 ms) and a
//! flush to a dead target never returns; two-sided messages between hosts, too, wait for the
//! target's progress engine to read its sockets. A [`HostWindow`] therefore keeps one
//! `MPI_Win_allocate_shared` window per host (over the members that share the host), whose
//! members' memory it reaches with the processor's own loads and stores, not through Open MPI's
//! calls (a put of 1 KiB to 3 holders then costs the copies and a fence), and reaches members on
//! other hosts over connections of its own
//! ([`crate::remote`]), served by one thread per member that sleeps in `poll` on all of its
//! incoming connections until a request comes: a put completes in bounded time whatever the
//! target's application thread does, and a dead target's connection ends, which fails the
//! operation with `ProcFailed` instead of a hang.
//! Operations to one target are applied in issue order (a slot's data before its header).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::comm::Comm;
use crate::error::{other, MpiError, Result};
use crate::extent::Extents;
use crate::remote::{Links, Memory, Remote};
use crate::window::{LockedWindow, SharedSegments, Window};

/// A window over every member of a communicator whose operations use shared memory to members
/// on this host and TCP connections of its own to members on other hosts. Inside a passive-target epoch from
/// creation to [`HostWindow::close`].
pub struct HostWindow {
    local: Option<LockedWindow>,
    /// Where the members on this host are and their memory.
    host: Arc<HostMembers>,
    /// The connections to other hosts; dropped (serving thread joined) before the window is
    /// freed.
    links: Option<Arc<Links>>,
    /// Every member's extents; members on this host reach them directly.
    extents: Extents,
    /// This member's rank among the window's members.
    member: i32,
    /// Held open while this member holds the window ([`Extents::open_marker`]).
    _marker: std::fs::File,
    _host: Comm,
}

impl HostWindow {
    /// Allocates `len` bytes on every member of `comm` (collective): one shared-memory window
    /// per host, and, when the members span more than one host, a listener and one serving
    /// thread per member; a member connects to a member on another host when it first reaches
    /// it (`ftkv_mpi`'s `remote` module). Fails with `ProcFailed` if a member is dead.
    pub fn allocate(comm: &Comm, len: usize) -> Result<HostWindow> {
        let hosts = host_ids(comm)?;
        let me = comm.rank() as usize;
        let extents = Extents::new(window_name(comm)?);
        let marker = extents.open_marker(comm.rank())?;
        let color = first_on_host(&hosts, hosts[me]) as i32;
        let host = comm.split(color, comm.rank())?;
        let local = Window::allocate_shared(&host, len)?.lock_all()?;
        let segments = local.window().shared_segments(host.size())?;
        let host_rank: Box<[Option<i32>]> = host_ranks(&hosts, hosts[me]).into();
        let remote: Vec<bool> = host_rank.iter().map(Option::is_none).collect();
        let links = if remote.iter().any(|&r| r) {
            // The window's own traffic between hosts is TCP of its own, but its users' (the
            // store's collectives, the pool's steals) are Open MPI messages between the same
            // process pairs.
            comm.dup()?.connect_pairs()?;
            let (base, len) = local.window().local_memory();
            let memory = Memory { base, len, extents, member: me as i32 };
            Some(Arc::new(Links::start(comm, &remote, memory)?))
        } else {
            None
        };
        Ok(HostWindow {
            local: Some(local),
            host: Arc::new(HostMembers { host_rank, segments }),
            links,
            extents,
            member: me as i32,
            _marker: marker,
            _host: host,
        })
    }

    /// Waits until every member stopped reaching this member's memory over its connection
    /// (a barrier over all members, which ULFM ends with an error instead of a hang when one
    /// died), then ends the connections. Without it a member that frees its window first would
    /// close connections others are still reading through, and they would take it for dead.
    fn end_links(&mut self, wait_for_members: bool) {
        if let Some(links) = self.links.take() {
            if wait_for_members {
                links.wait_for_members();
            }
        }
    }

    fn local(&self) -> &LockedWindow {
        self.local.as_ref().expect("present until close")
    }

    /// Whether some member lives on another host (operations to it go over a connection).
    pub fn spans_hosts(&self) -> bool {
        self.links.is_some()
    }

    /// The listening address of `target`, a member on another host (`None` for a member on
    /// this host, or once the window is closed).
    pub fn listener_of(&self, target: i32) -> Option<std::net::SocketAddrV4> {
        self.links.as_ref().and_then(|links| links.address_of(target))
    }

    /// How many connections to this member were dropped, since the window was created,
    /// because they did not prove to come from a member of this job (a wrong, incomplete or
    /// late introduction, or a member's second connection). 0 when every member shares this
    /// host (nothing listens then) or once the window is closed.
    pub fn rejected_connections(&self) -> usize {
        self.links.as_ref().map_or(0, |links| links.rejected())
    }

    /// Runs `issue`, then completes every operation it issued: the ones to members on this
    /// host are copies this thread made with the processor's loads and stores (in issue order,
    /// ordered before what follows by a fence), and each other host's requests are sent, then
    /// their answers read (also when `issue` failed). `Ok` means every put is in its target's memory and every get filled its buffer.
    /// A target on another host whose connection ended makes it fail with `ProcFailed` once
    /// every other operation has completed; buffers are never released while still in use.
    pub fn scope<'buf, R>(
        &self,
        issue: impl FnOnce(&mut HostScope<'buf>) -> Result<R>,
    ) -> Result<R> {
        let mut scope = HostScope {
            host: self.host.clone(),
            links: self.links.clone(),
            copied: false,
            batches: Vec::new(),
            extents: self.extents,
        };
        let issued = issue(&mut scope);
        let completed = scope.complete();
        let value = issued?;
        completed.map(|()| value)
    }

    /// Atomically replaces the u64 at `disp` in `target`'s memory by `swap` if it equals
    /// `compare`, and returns the value it held: the processor's lock-free compare-and-swap
    /// on the target's shared memory, run by this thread for a target on this host and by the
    /// target's serving thread for one on another host, so both paths exclude each other and a
    /// member killed in the middle of a swap blocks nobody's next one.
    /// Complete at the target when it returns; a target on another host whose connection ended
    /// fails it with `ProcFailed`.
    pub fn compare_and_swap(&self, target: i32, disp: i64, compare: u64, swap: u64) -> Result<u64> {
        let rank = usize::try_from(target).ok().and_then(|t| self.host.host_rank.get(t)).copied();
        match rank {
            None => Err(other("HostWindow", "target rank outside the communicator")),
            Some(Some(rank)) => {
                self.host.segments.compare_and_swap(rank, disp, compare, swap).map_err(unattributed)
            }
            Some(None) => {
                let links = self.links.as_ref().ok_or_else(|| other("HostWindow", "no links"))?;
                let mut operands = [0u8; 16];
                operands[..8].copy_from_slice(&compare.to_le_bytes());
                operands[8..].copy_from_slice(&swap.to_le_bytes());
                let mut held = [0u8; 8];
                let op = Remote::CompareAndSwap { disp, operands: &operands, held: &mut held };
                links.send(vec![(target, vec![op])]).answers()?;
                Ok(u64::from_le_bytes(held))
            }
        }
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

    /// Copies the first `out.len()` bytes of this member's own extent `id`; bytes past its
    /// end, or of an extent that does not exist, read as zero.
    pub fn read_local_extent(&self, id: u64, out: &mut [u8]) -> Result<()> {
        self.extents.read(self.member, id, out)
    }

    /// Copies into this member's own window memory.
    pub fn write_local(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.local().window().write_local(offset, data)
    }

    /// Waits for every member (collective; a dead member ends the wait with no error here),
    /// ends the connections, ends the epoch and frees the window (collective over the members
    /// of this host), then removes the window's extents on this host, failed members' too:
    /// once the members left the barrier and the collective free, none uses them.
    pub fn close(mut self) -> Result<()> {
        self.end_links(true);
        let local = self.local.take().expect("present until close");
        let freed = local.unlock_all()?.free();
        self.extents.remove_all(None);
        freed
    }

    /// Ends the connections, removes this member's extents and leaves the window's memory
    /// allocated without a collective call (for a window whose members may not all take part
    /// in freeing it).
    pub fn abandon(mut self) {
        self.end_links(false);
        self.extents.remove_all(Some(self.member));
        std::mem::forget(self.local.take());
    }
}

impl Drop for HostWindow {
    /// Like [`HostWindow::close`], reporting nothing.
    fn drop(&mut self) {
        self.end_links(true);
    }
}

/// A failure of an operation on the host's shared-memory window, without a peer: the window
/// numbers its ranks among the host's members, not among the window's members, and a one-sided
/// call can fail for another member's death than its target's. (A connection to another host
/// that ends names its peer exactly, a member rank.)
fn unattributed(e: MpiError) -> MpiError {
    match e {
        MpiError::ProcFailed { op, .. } => MpiError::ProcFailed { op, peer: None },
        other => other,
    }
}

/// Every member's host id, in rank order.
fn host_ids(comm: &Comm) -> Result<Vec<u32>> {
    let mine = comm.host_id()?;
    let all = comm.allgather(&mine.to_le_bytes())?;
    Ok(all.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
}

/// The window's name for its extents: member 0's fresh name, learned by every member.
fn window_name(comm: &Comm) -> Result<u64> {
    let all = comm.allgather(&Extents::fresh_window_name().to_le_bytes())?;
    Ok(u64::from_le_bytes(all[..8].try_into().expect("8 bytes")))
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

/// The members of a [`HostWindow`] on this member's host: each member's rank among them
/// (`None` for members on other hosts) and their memory, mapped into this process.
struct HostMembers {
    host_rank: Box<[Option<i32>]>,
    segments: SharedSegments,
}

/// Operations issued inside [`HostWindow::scope`]; buffers stay borrowed until it completed
/// them.
pub struct HostScope<'buf> {
    host: Arc<HostMembers>,
    links: Option<Arc<Links>>,
    /// Whether an operation copied into or out of this host's shared memory.
    copied: bool,
    batches: Vec<(i32, Vec<Remote<'buf>>)>,
    extents: Extents,
}

impl<'buf> HostScope<'buf> {
    /// A put of `data` to `target` at `disp`; complete when the scope returns.
    pub fn put(&mut self, target: i32, disp: i64, data: &'buf [u8]) -> Result<()> {
        match self.host_rank(target)? {
            Some(rank) => {
                self.copied = true;
                self.host.segments.write(rank, disp, data)
            }
            None => {
                self.batch(target).push(Remote::Put { disp, data });
                Ok(())
            }
        }
    }

    /// A get of `out.len()` bytes from `target` at `disp`; filled when the scope returns.
    pub fn get(&mut self, target: i32, disp: i64, out: &'buf mut [u8]) -> Result<()> {
        match self.host_rank(target)? {
            Some(rank) => {
                self.copied = true;
                self.host.segments.read(rank, disp, out)
            }
            None => {
                self.batch(target).push(Remote::Get { disp, out });
                Ok(())
            }
        }
    }

    /// Makes `target`'s extent `id` hold `data` (see [`crate::extent`]): at once on this host,
    /// when the scope completes on another; after every operation issued before it, on either.
    pub fn put_extent(&mut self, target: i32, id: u64, data: &'buf [u8]) -> Result<()> {
        match self.host_rank(target)? {
            Some(_) => {
                SharedSegments::complete();
                self.extents.write(target, id, data)
            }
            None => {
                self.batch(target).push(Remote::ExtentPut { id, data });
                Ok(())
            }
        }
    }

    /// Reads the first `out.len()` bytes of `target`'s extent `id` (zeros past its end).
    pub fn get_extent(&mut self, target: i32, id: u64, out: &'buf mut [u8]) -> Result<()> {
        match self.host_rank(target)? {
            Some(_) => self.extents.read(target, id, out),
            None => {
                self.batch(target).push(Remote::ExtentGet { id, out });
                Ok(())
            }
        }
    }

    /// Whether `target`'s memory and extents are on this host, where [`HostScope::copy`] and
    /// [`HostScope::copy_extent`] reach them.
    pub fn on_this_host(&self, target: i32) -> Result<bool> {
        Ok(self.host_rank(target)?.is_some())
    }

    /// Copies `len` bytes of `source`'s memory at `from` into `target`'s at `to`, both on this
    /// host (see [`HostScope::on_this_host`]; an error otherwise), at once and after every
    /// operation issued before it.
    pub fn copy(&mut self, source: i32, from: i64, target: i32, to: i64, len: usize) -> Result<()> {
        let (source, target) = self.host_ranks_of(source, target, "shared-memory copy")?;
        self.copied = true;
        self.host.segments.copy(source, from, target, to, len)
    }

    /// Makes `target`'s extent `to` hold the first `len` bytes of `source`'s extent `from`,
    /// both on this host (an error otherwise), at once and after every operation issued
    /// before it.
    pub fn copy_extent(
        &mut self,
        source: i32,
        from: u64,
        target: i32,
        to: u64,
        len: u64,
    ) -> Result<()> {
        self.host_ranks_of(source, target, "extent copy")?;
        SharedSegments::complete();
        self.extents.copy(source, from, target, to, len)
    }

    /// Removes `target`'s extent `id` (nothing when there is none), after every operation
    /// issued before it.
    pub fn free_extent(&mut self, target: i32, id: u64) -> Result<()> {
        match self.host_rank(target)? {
            Some(_) => {
                SharedSegments::complete();
                self.extents.free(target, id)
            }
            None => {
                self.batch(target).push(Remote::ExtentFree { id });
                Ok(())
            }
        }
    }

    /// The ranks among this host's members of `source` and `target`; an error of `op` when
    /// either is on another host.
    fn host_ranks_of(&self, source: i32, target: i32, op: &'static str) -> Result<(i32, i32)> {
        match (self.host_rank(source)?, self.host_rank(target)?) {
            (Some(source), Some(target)) => Ok((source, target)),
            _ => Err(other(op, "a member is on another host")),
        }
    }

    fn host_rank(&self, target: i32) -> Result<Option<i32>> {
        let rank = usize::try_from(target).ok().and_then(|t| self.host.host_rank.get(t));
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

    /// Sends every other host's requests, orders the shared-memory copies before what this
    /// thread does next (a fence), then reads the answers; the first error is returned after
    /// that.
    fn complete(&mut self) -> Result<()> {
        let batches = std::mem::take(&mut self.batches);
        let sent = (!batches.is_empty()).then(|| self.links.as_ref().map(|l| l.send(batches)));
        if self.copied {
            SharedSegments::complete();
        }
        match sent {
            None => Ok(()),
            Some(Some(sent)) => sent.answers(),
            Some(None) => Err(other("HostScope", "no connections to other hosts")),
        }
    }
}
