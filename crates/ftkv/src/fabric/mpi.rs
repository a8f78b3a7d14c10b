//! The production fabric: MPI with ULFM through `ftkv-mpi`.

use std::time::Duration;

use ftkv_mpi::{failpoint, Agreed, Comm, HostScope, HostWindow, ANY_SOURCE};

use super::{Fabric, FabricResult, FabricWindow, RmaOps};

const PING_TAG: i32 = 901;
const PONG_TAG: i32 = 902;

impl Fabric for Comm {
    type Window = HostWindow;

    fn rank(&self) -> i32 {
        Comm::rank(self)
    }

    fn size(&self) -> i32 {
        Comm::size(self)
    }

    fn host_id(&self) -> FabricResult<u32> {
        Comm::host_id(self)
    }

    fn dup(&self) -> FabricResult<Comm> {
        Comm::dup(self)
    }

    fn barrier(&self) -> FabricResult<()> {
        Comm::barrier(self)
    }

    fn allgather(&self, mine: &[u8]) -> FabricResult<Vec<u8>> {
        Comm::allgather(self, mine)
    }

    fn revoke(&self) -> FabricResult<()> {
        Comm::revoke(self)
    }

    fn is_revoked(&self) -> FabricResult<bool> {
        Comm::is_revoked(self)
    }

    fn shrink(&self) -> FabricResult<Comm> {
        Comm::shrink(self)
    }

    fn agree(&self, flag: u32) -> FabricResult<Agreed> {
        Comm::agree(self, flag)
    }

    fn failed_ranks(&self) -> FabricResult<Vec<i32>> {
        Comm::failed_ranks(self)
    }

    fn ranks_in(&self, origin: &Comm) -> FabricResult<Vec<i32>> {
        let ranks: Vec<i32> = (0..Comm::size(self)).collect();
        let translated = self.translate_ranks(&ranks, origin)?;
        Ok(translated.into_iter().map(|r| r.expect("a shrunk communicator's members")).collect())
    }

    fn progress(&self) -> FabricResult<()> {
        self.iprobe(ANY_SOURCE, PING_TAG).map(drop)
    }

    fn ping(&self, target: i32, timeout: Duration) -> FabricResult<()> {
        Comm::ping(self, target, PING_TAG, PONG_TAG, timeout).map(drop)
    }

    fn answer_pings(&self) -> FabricResult<()> {
        Comm::answer_pings(self, PING_TAG, PONG_TAG).map(drop)
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

    fn failpoint(&self, name: &str) {
        failpoint::hit(name);
    }

    fn stall_point(&self, name: &str) {
        failpoint::stall(name);
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
        HostWindow::scope(self, issue)
    }

    fn sync(&self) -> FabricResult<()> {
        HostWindow::sync(self)
    }

    fn read_local(&self, offset: usize, out: &mut [u8]) -> FabricResult<()> {
        HostWindow::read_local(self, offset, out)
    }

    fn close(self) -> FabricResult<()> {
        HostWindow::close(self)
    }

    fn abandon(self) {
        HostWindow::abandon(self);
    }
}

impl<'buf> RmaOps<'buf> for HostScope<'buf> {
    fn put(&mut self, target: i32, disp: i64, data: &'buf [u8]) -> FabricResult<()> {
        HostScope::put(self, target, disp, data)
    }

    fn get(&mut self, target: i32, disp: i64, out: &'buf mut [u8]) -> FabricResult<()> {
        HostScope::get(self, target, disp, out)
    }
}
