//! The production fabric: MPI with ULFM through `ftkv-mpi`.

use std::any::Any;
use std::sync::Mutex;
use std::time::Duration;

use ftkv_mpi::{
    failpoint, process, Comm, HostScope, HostWindow, MpiError, SendRequest, ANY_SOURCE, ANY_TAG,
};

use super::{
    Agreed, Ended, Fabric, FabricError, FabricResult, FabricWindow, Message, ProcessTag, Reach,
    RmaOps,
};

impl From<MpiError> for FabricError {
    fn from(e: MpiError) -> FabricError {
        match e {
            MpiError::ProcFailed { op, peer } => FabricError::ProcFailed { op, peer },
            MpiError::Revoked { op } => FabricError::Revoked { op },
            MpiError::Timeout { op, after } => FabricError::Timeout { op, after },
            MpiError::Other { op, class, msg } => {
                FabricError::Other { op, msg: format!("MPI error class {class}: {msg}") }
            }
        }
    }
}

const PING_TAG: i32 = 901;
const PONG_TAG: i32 = 902;
const NOTICE_TAG: i32 = 903;

/// This process's notices whose sends have not completed ([`Fabric::send_notice`]): each
/// notice send and receive tests them and lets go of the finished ones; a send that fails (its
/// receiver died) is finished too.
static NOTICES_IN_FLIGHT: Mutex<Vec<SendRequest>> = Mutex::new(Vec::new());

/// Keeps `sent` (when given) among the notices in flight and lets go of the finished ones.
fn finish_notices(sent: Option<SendRequest>) {
    let mut in_flight = NOTICES_IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner());
    in_flight.extend(sent);
    in_flight.retain_mut(|request| matches!(request.test(), Ok(false)));
}

impl Fabric for Comm {
    type Window = HostWindow;

    fn rank(&self) -> i32 {
        Comm::rank(self)
    }

    fn size(&self) -> i32 {
        Comm::size(self)
    }

    fn host_id(&self) -> FabricResult<u32> {
        Ok(Comm::host_id(self)?)
    }

    fn dup(&self) -> FabricResult<Comm> {
        Ok(Comm::dup(self)?)
    }

    fn barrier(&self) -> FabricResult<()> {
        Ok(Comm::barrier(self)?)
    }

    fn allgather(&self, mine: &[u8]) -> FabricResult<Vec<u8>> {
        Ok(Comm::allgather(self, mine)?)
    }

    fn revoke(&self) -> FabricResult<()> {
        Ok(Comm::revoke(self)?)
    }

    fn is_revoked(&self) -> FabricResult<bool> {
        Ok(Comm::is_revoked(self)?)
    }

    fn shrink(&self) -> FabricResult<Comm> {
        Ok(Comm::shrink(self)?)
    }

    fn agree(&self, flag: u32) -> FabricResult<Agreed> {
        let agreed = Comm::agree(self, flag)?;
        let unacknowledged_failures = agreed.unacknowledged_failures;
        Ok(Agreed { value: agreed.value, unacknowledged_failures })
    }

    fn failed_ranks(&self) -> FabricResult<Vec<i32>> {
        Ok(Comm::failed_ranks(self)?)
    }

    fn ranks_in(&self, origin: &Comm) -> FabricResult<Vec<i32>> {
        let ranks: Vec<i32> = (0..Comm::size(self)).collect();
        let translated = self.translate_ranks(&ranks, origin).map_err(FabricError::from)?;
        Ok(translated.into_iter().map(|r| r.expect("a shrunk communicator's members")).collect())
    }

    fn progress(&self) -> FabricResult<()> {
        Ok(self.progress_beside_fault_tolerant_calls(PING_TAG).map(drop)?)
    }

    fn ping(&self, target: i32, timeout: Duration) -> FabricResult<()> {
        Ok(Comm::ping(self, target, PING_TAG, PONG_TAG, timeout).map(drop)?)
    }

    fn answer_pings(&self) -> FabricResult<()> {
        Ok(Comm::answer_pings(self, PING_TAG, PONG_TAG).map(drop)?)
    }

    /// Shared memory to the members on this host, messages to the others (see
    /// [`HostWindow`]).
    fn open_window(&self, len: usize, zeroed: &[(usize, usize)]) -> FabricResult<HostWindow> {
        let window = HostWindow::allocate(self, len)?;
        for &(offset, len) in zeroed {
            window.write_local(offset, &vec![0u8; len])?;
        }
        Ok(window)
    }

    fn send(&self, data: &[u8], dest: i32, tag: i32) -> FabricResult<()> {
        Ok(Comm::send(self, data, dest, tag)?)
    }

    /// `MPI_Iprobe` for any source and tag, then `MPI_Recv` of what it found.
    fn try_receive(&self) -> FabricResult<Option<Message>> {
        let Some(status) = self.iprobe(ANY_SOURCE, ANY_TAG)? else { return Ok(None) };
        let mut data = vec![0u8; status.len];
        self.recv(&mut data, status.source, status.tag)?;
        Ok(Some(Message { source: status.source, tag: status.tag, data }))
    }

    /// `MPI_Isend` with the notices' own tag; the request waits among the notices in flight.
    /// Never beside a fault-tolerant call (see [`Comm::progress_beside_fault_tolerant_calls`]).
    fn send_notice(&self, notice: &[u8], dest: i32) -> FabricResult<bool> {
        let sent = ftkv_mpi::beside_fault_tolerant_calls(|| {
            let sent = self.isend(notice.to_vec(), dest, NOTICE_TAG)?;
            finish_notices(Some(sent));
            Ok::<_, MpiError>(())
        });
        Ok(sent.transpose()?.is_some())
    }

    /// `MPI_Iprobe` for any source with the notices' tag, then `MPI_Recv` of what it found;
    /// never beside a fault-tolerant call.
    fn try_receive_notice(&self) -> FabricResult<Option<Message>> {
        let received = ftkv_mpi::beside_fault_tolerant_calls(|| {
            finish_notices(None);
            let Some(status) = self.iprobe(ANY_SOURCE, NOTICE_TAG)? else { return Ok(None) };
            let mut data = vec![0u8; status.len];
            self.recv(&mut data, status.source, NOTICE_TAG)?;
            Ok::<_, MpiError>(Some(Message { source: status.source, tag: status.tag, data }))
        });
        Ok(received.transpose()?.flatten())
    }

    fn shared_memory_capacity(&self) -> Option<u64> {
        ftkv_mpi::shared_memory_capacity()
    }

    fn is_kill(_payload: &(dyn Any + Send)) -> bool {
        false
    }

    #[inline]
    fn failpoint(&self, name: &str) {
        failpoint::hit(name);
        failpoint::stop(name);
    }

    #[inline]
    fn stall_point(&self, name: &str) {
        failpoint::stall(name);
        failpoint::stop(name);
    }

    fn can_end_processes(&self) -> bool {
        true
    }

    fn process_tag(&self) -> ProcessTag {
        let tag = process::own_tag();
        ProcessTag { pid: tag.pid, started: tag.started, runtime_rank: tag.runtime_rank }
    }

    fn end_process(&self, tag: &ProcessTag, reach: Reach) -> FabricResult<Ended> {
        let killed = match reach {
            Reach::ThisHost => process::kill_on_this_host(&process::ProcessTag {
                pid: tag.pid,
                started: tag.started,
                runtime_rank: tag.runtime_rank,
            })?,
            Reach::Runtime if tag.runtime_rank == u32::MAX => return Ok(Ended::Unsupported),
            Reach::Runtime => process::kill_through_runtime(tag.runtime_rank)?,
        };
        Ok(match killed {
            process::Killed::Sent => Ended::Sent,
            process::Killed::Gone => Ended::Gone,
        })
    }

    fn fail_stop(&self, why: &str) {
        crate::events::emit(crate::events::Event::EndingProcess(why.to_owned()));
        failpoint::kill_self();
    }
}

impl FabricWindow for HostWindow {
    type Scope<'buf> = HostScope<'buf>;

    fn scope<'buf, R>(
        &self,
        issue: impl FnOnce(&mut HostScope<'buf>) -> FabricResult<R>,
    ) -> FabricResult<R> {
        let mut issued = None;
        let completed = HostWindow::scope(self, |scope| {
            issued = Some(issue(scope));
            Ok(())
        });
        let value = issued.expect("the scope ran its issue")?;
        completed?;
        Ok(value)
    }

    fn sync(&self) -> FabricResult<()> {
        Ok(HostWindow::sync(self)?)
    }

    fn read_local(&self, offset: usize, out: &mut [u8]) -> FabricResult<()> {
        Ok(HostWindow::read_local(self, offset, out)?)
    }

    fn read_local_extent(&self, id: u64, out: &mut [u8]) -> FabricResult<()> {
        Ok(HostWindow::read_local_extent(self, id, out)?)
    }

    fn write_local(&self, offset: usize, data: &[u8]) -> FabricResult<()> {
        HostWindow::write_local(self, offset, data)?;
        HostWindow::sync(self)?;
        Ok(())
    }

    fn compare_and_swap(
        &self,
        target: i32,
        disp: i64,
        compare: u64,
        swap: u64,
    ) -> FabricResult<u64> {
        Ok(HostWindow::compare_and_swap(self, target, disp, compare, swap)?)
    }

    fn close(self) -> FabricResult<()> {
        Ok(HostWindow::close(self)?)
    }

    fn abandon(self) {
        HostWindow::abandon(self);
    }
    fn listener_of(&self, target: i32) -> Option<std::net::SocketAddr> {
        HostWindow::listener_of(self, target).map(std::net::SocketAddr::V4)
    }
}

impl<'buf> RmaOps<'buf> for HostScope<'buf> {
    fn put(&mut self, target: i32, disp: i64, data: &'buf [u8]) -> FabricResult<()> {
        Ok(HostScope::put(self, target, disp, data)?)
    }

    fn get(&mut self, target: i32, disp: i64, out: &'buf mut [u8]) -> FabricResult<()> {
        Ok(HostScope::get(self, target, disp, out)?)
    }

    fn put_extent(&mut self, target: i32, id: u64, data: &'buf [u8]) -> FabricResult<()> {
        Ok(HostScope::put_extent(self, target, id, data)?)
    }

    fn get_extent(&mut self, target: i32, id: u64, out: &'buf mut [u8]) -> FabricResult<()> {
        Ok(HostScope::get_extent(self, target, id, out)?)
    }

    fn free_extent(&mut self, target: i32, id: u64) -> FabricResult<()> {
        Ok(HostScope::free_extent(self, target, id)?)
    }

    fn on_this_host(&self, target: i32) -> FabricResult<bool> {
        Ok(HostScope::on_this_host(self, target)?)
    }

    fn copy(
        &mut self,
        source: i32,
        from: i64,
        target: i32,
        to: i64,
        len: usize,
    ) -> FabricResult<()> {
        Ok(HostScope::copy(self, source, from, target, to, len)?)
    }

    fn copy_extent(
        &mut self,
        source: i32,
        from: u64,
        target: i32,
        to: u64,
        len: u64,
    ) -> FabricResult<()> {
        Ok(HostScope::copy_extent(self, source, from, target, to, len)?)
    }
}
