//! An in-process fabric: ranks are threads, windows are shared buffers, and any rank can be
//! killed, at a named failpoint or from outside, for fast and deterministic protocol tests.
//!
//! A killed rank's thread unwinds at its next fabric call (with a [`Killed`] payload that
//! [`LocalCluster::run`] reports as `None`); from then on the others see it as dead: its
//! collectives never arrive, `failed_ranks` lists it, and `shrink` leaves it out. Its window
//! memory stays readable and writable, as an `MPI_Win_allocate` window's does. Collectives match
//! by a per-kind call counter (regular collectives, shrink, agree), as ULFM matches agreements
//! independently of aborted collectives. Every rank runs on host 0 unless
//! [`LocalCluster::with_hosts`] places them on several (simulated) hosts.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::rt;

use super::{Agreed, Fabric, FabricError, FabricResult, FabricWindow, Message, RmaOps};

pub use super::killed::Killed;

/// A set of thread ranks sharing one simulated machine.
#[derive(Clone)]
pub struct LocalCluster {
    world: Arc<World>,
}

struct World {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    dead: Vec<bool>,
    comms: Vec<CommState>,
    windows: Vec<Arc<Memory>>,
    rendezvous: HashMap<(usize, Kind, u64), Rendezvous>,
    armed: HashMap<(i32, String), usize>,
    /// Stall points armed to stop a rank (see [`LocalCluster::stop_at`]), passes left.
    stops: HashMap<(i32, String), usize>,
    /// Ranks stopped at a stall point, and those told to resume.
    stopped: Vec<i32>,
    resumed: Vec<i32>,
    /// Ranks the others consider dead while their own one-sided calls still land (a stopped
    /// rank declared failed, then resumed).
    declared: Vec<bool>,
    /// Each rank's host id.
    hosts: Vec<u32>,
    /// Messages not yet received.
    mailboxes: Mailboxes,
    /// Notices not yet received.
    notices: Mailboxes,
    /// When each rank learns of each dead rank's failure (`failed_ranks`), by (learner, dead):
    /// at once, or a seeded while later on a simulated world (ULFM's failure notification
    /// reaches each process in its own time).
    learned_at: HashMap<(i32, i32), std::time::Instant>,
}

impl State {
    /// Marks `rank` dead, and when each other rank learns of it.
    fn mark_dead(&mut self, rank: i32) {
        self.dead[rank as usize] = true;
        let now = crate::rt::now();
        for learner in 0..self.dead.len() as i32 {
            self.learned_at.entry((learner, rank)).or_insert_with(|| now + notice_delay());
        }
    }
}

/// Messages not yet received, by communicator and receiving rank, oldest first, each with the
/// time it may be received from (on a simulated world, sent plus a seeded delay; one sender's
/// messages keep their order).
type Mailboxes = HashMap<(usize, i32), VecDeque<(Message, std::time::Instant)>>;

struct CommState {
    members: Vec<i32>,
    revoked: bool,
}

/// One window: each member's bytes, by rank, and each member's extents, by rank and id.
struct Memory {
    ranks: Vec<Mutex<Vec<u8>>>,
    extents: Mutex<HashMap<(i32, u64), Vec<u8>>>,
}

impl Memory {
    fn extents(&self) -> MutexGuard<'_, HashMap<(i32, u64), Vec<u8>>> {
        self.extents.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn put_extent(&self, target: i32, id: u64, data: &[u8]) -> FabricResult<()> {
        if target < 0 || target as usize >= self.ranks.len() {
            let msg = format!("no rank {target}");
            return Err(FabricError::Other { op: "local extent", msg });
        }
        self.extents().insert((target, id), data.to_vec());
        Ok(())
    }

    fn get_extent(&self, target: i32, id: u64, out: &mut [u8]) {
        let extents = self.extents();
        let held = extents.get(&(target, id)).map_or(&[][..], Vec::as_slice);
        let n = held.len().min(out.len());
        out[..n].copy_from_slice(&held[..n]);
        out[n..].fill(0);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Collective,
    Shrink,
    Agree,
}

/// One collective call in progress: who contributed what, and its outcome once decided.
struct Rendezvous {
    deposits: Vec<Option<Vec<u8>>>,
    outcome: Option<Vec<u8>>,
    /// A member that joined the collective and died before its outcome was decided: each
    /// caller may then fail ([`fails_after_a_death`]).
    died_inside: Option<usize>,
}

impl LocalCluster {
    /// A cluster of `ranks` live ranks with one world communicator.
    pub fn new(ranks: usize) -> LocalCluster {
        let state = State {
            dead: vec![false; ranks],
            declared: vec![false; ranks],
            comms: vec![CommState { members: (0..ranks as i32).collect(), revoked: false }],
            hosts: vec![0; ranks],
            ..State::default()
        };
        LocalCluster {
            world: Arc::new(World { state: Mutex::new(state), changed: Condvar::new() }),
        }
    }

    /// The same cluster with rank `r` on host `hosts[r]` (what [`Fabric::host_id`] answers).
    ///
    /// # Panics
    /// If `hosts` does not name one host per rank.
    pub fn with_hosts(self, hosts: Vec<u32>) -> LocalCluster {
        let mut state = self.world.lock();
        assert_eq!(hosts.len(), state.dead.len(), "one host per rank");
        state.hosts = hosts;
        drop(state);
        self
    }

    pub fn ranks(&self) -> usize {
        self.world.lock().dead.len()
    }

    /// Kills `rank` now: its threads unwind at their next fabric call.
    pub fn kill(&self, rank: i32) {
        self.kill_all(&[rank]);
    }

    /// Kills every rank of `ranks` at one instant (as a host's loss does): no rank sees one of
    /// them dead before the others.
    pub fn kill_all(&self, ranks: &[i32]) {
        self.world.mark_dead(ranks);
    }

    /// Kills `rank` at its `nth` (1-based) pass through failpoint `name`.
    pub fn arm(&self, rank: i32, name: &str, nth: usize) {
        self.world.lock().armed.insert((rank, name.to_string()), nth.max(1));
    }

    /// Stops `rank` at its `nth` (1-based) pass through stall point or failpoint `name` until
    /// [`LocalCluster::resume`]: a SIGSTOP at a chosen instant.
    pub fn stop_at(&self, rank: i32, name: &str, nth: usize) {
        self.world.lock().stops.insert((rank, name.to_string()), nth.max(1));
    }

    /// Whether `rank` waits at a stall point now.
    pub fn is_stopped(&self, rank: i32) -> bool {
        self.world.lock().stopped.contains(&rank)
    }

    /// Lets a rank stopped by [`LocalCluster::stop_at`] go on.
    pub fn resume(&self, rank: i32) {
        self.world.lock().resumed.push(rank);
        self.world.changed.notify_all();
    }

    /// Declares `rank` failed without ending it: the others see it dead (`failed_ranks`,
    /// shrink), while its own puts and gets still reach the windows, as a stopped rank's do
    /// once it resumes; its other fabric calls end it as a kill does. Its
    /// [`Fabric::fail_stop`] ends it for good.
    pub fn declare(&self, rank: i32) {
        let mut state = self.world.lock();
        state.mark_dead(rank);
        state.declared[rank as usize] = true;
        drop(state);
        self.world.changed.notify_all();
    }

    pub fn is_dead(&self, rank: i32) -> bool {
        self.world.lock().dead[rank as usize]
    }

    /// Runs `body` on every rank, one thread each, and returns each rank's result, `None` for a
    /// rank that was killed. A rank that panics is marked dead (so the others do not wait for
    /// it) and its panic is raised again here once every thread ended.
    pub fn run<T: Send>(&self, body: impl Fn(LocalFabric) -> T + Sync) -> Vec<Option<T>> {
        let ranks = self.ranks();
        let outcomes: Vec<std::thread::Result<T>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..ranks as i32)
                .map(|rank| {
                    let body = &body;
                    let fabric = self.world_member(rank);
                    s.spawn(move || self.run_rank(rank, || body(fabric)))
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap_or_else(Err)).collect()
        });
        outcomes
            .into_iter()
            .map(|outcome| match outcome {
                Ok(value) => Some(value),
                Err(payload) if payload.is::<Killed>() => None,
                Err(payload) => panic::resume_unwind(payload),
            })
            .collect()
    }

    /// Runs `body` as rank `rank` on the calling thread: a panic (a kill's [`Killed`] among
    /// them) marks the rank dead, so that the others do not wait for it, and comes back as
    /// `Err` with its payload.
    pub fn run_rank<T>(&self, rank: i32, body: impl FnOnce() -> T) -> std::thread::Result<T> {
        let outcome = panic::catch_unwind(AssertUnwindSafe(body));
        if outcome.is_err() {
            self.world.mark_dead(&[rank]);
        }
        outcome
    }

    /// Rank `rank`'s member of the cluster's world communicator.
    pub fn world_member(&self, rank: i32) -> LocalFabric {
        LocalFabric::new(self.world.clone(), 0, rank, rank)
    }
}

/// The message of a panic's payload.
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".into()
    }
}

/// How long after a death a rank learns of it: a seeded 0–2 ms on a simulated world, at once
/// otherwise.
fn notice_delay() -> Duration {
    rt::current_task().map_or(Duration::ZERO, |task| task.seeded_delay(Duration::from_millis(2)))
}

/// How long a message travels: a seeded 0–300 µs on a simulated world, none otherwise.
fn delay() -> Duration {
    rt::current_task().map_or(Duration::ZERO, |task| task.seeded_delay(Duration::from_micros(300)))
}

/// Whether a collective that a member joined before it died fails for this caller: ULFM lets
/// it succeed on some callers and fail on others. Decided by the seed on a simulated world;
/// it succeeds everywhere otherwise.
fn fails_after_a_death() -> bool {
    rt::current_task().is_some_and(|task| task.coin(0.5))
}

impl World {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn mark_dead(&self, ranks: &[i32]) {
        let mut state = self.lock();
        for &rank in ranks {
            state.mark_dead(rank);
        }
        drop(state);
        self.changed.notify_all();
    }

    fn wait<'a>(
        &'a self,
        what: &'static str,
        guard: MutexGuard<'a, State>,
    ) -> MutexGuard<'a, State> {
        crate::rt::wait_timeout(what, &self.changed, &self.state, guard, Duration::from_millis(20))
    }
}

/// One rank's handle on one communicator of a [`LocalCluster`].
pub struct LocalFabric {
    world: Arc<World>,
    comm: usize,
    rank: i32,
    /// The rank in the cluster (stable).
    me: i32,
    calls: [AtomicU64; 3],
    acked: Mutex<Vec<i32>>,
}

impl LocalFabric {
    /// Puts `message` into `dest`'s box of this communicator (`boxes` picks messages or
    /// notices). `Revoked` on a revoked communicator, `ProcFailed` when `dest` is dead.
    fn deliver(
        &self,
        message: Message,
        dest: i32,
        boxes: fn(&mut State) -> &mut Mailboxes,
    ) -> FabricResult<()> {
        let mut state = self.alive_state();
        let comm = &state.comms[self.comm];
        if comm.revoked {
            return Err(FabricError::Revoked { op: "local send" });
        }
        let peer = *comm.members.get(dest as usize).ok_or_else(|| FabricError::Other {
            op: "local send",
            msg: format!("no rank {dest} in a communicator of {}", comm.members.len()),
        })?;
        if state.dead[peer as usize] {
            return Err(FabricError::ProcFailed { op: "local send", peer: Some(dest) });
        }
        let mailbox = boxes(&mut state).entry((self.comm, dest)).or_default();
        let sent_before = mailbox.iter().filter(|(m, _)| m.source == message.source);
        let after = sent_before.map(|&(_, at)| at).max();
        let arrives = crate::rt::now() + delay();
        mailbox.push_back((message, after.map_or(arrives, |a| a.max(arrives))));
        drop(state);
        self.world.changed.notify_all();
        Ok(())
    }

    /// The oldest message of this rank's box of this communicator (`boxes` picks messages or
    /// notices). `Revoked` on a revoked communicator.
    fn take_oldest(
        &self,
        boxes: fn(&mut State) -> &mut Mailboxes,
    ) -> FabricResult<Option<Message>> {
        let mut state = self.alive_state();
        if state.comms[self.comm].revoked {
            return Err(FabricError::Revoked { op: "local receive" });
        }
        let Some(mailbox) = boxes(&mut state).get_mut(&(self.comm, self.rank)) else {
            return Ok(None);
        };
        let now = crate::rt::now();
        let arrived = mailbox.iter().position(|&(_, at)| at <= now);
        Ok(arrived.and_then(|i| mailbox.remove(i)).map(|(message, _)| message))
    }

    fn new(world: Arc<World>, comm: usize, rank: i32, me: i32) -> LocalFabric {
        let calls = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
        LocalFabric { world, comm, rank, me, calls, acked: Mutex::new(Vec::new()) }
    }

    /// The state, or unwinding when this rank is dead.
    fn alive_state(&self) -> MutexGuard<'_, State> {
        crate::rt::step("local call");
        let state = self.world.lock();
        if state.dead[self.me as usize] {
            drop(state);
            panic::resume_unwind(Box::new(Killed(self.me)));
        }
        state
    }

    fn handle_on(&self, comm: usize, state: &State) -> LocalFabric {
        let members = &state.comms[comm].members;
        let rank = members.iter().position(|&m| m == self.me).expect("a member") as i32;
        LocalFabric::new(self.world.clone(), comm, rank, self.me)
    }

    fn members(&self, state: &State) -> Vec<i32> {
        state.comms[self.comm].members.clone()
    }

    /// Deposits `mine` for this rank's next call of `kind` and waits for the outcome, which
    /// the first rank to see the call complete computes with `decide` from the contributions
    /// (`None` for members left out: dead ones in shrink and agree).
    fn rendezvous(
        &self,
        what: &'static str,
        kind: Kind,
        mine: Vec<u8>,
        decide: impl FnOnce(&mut State, &[Option<Vec<u8>>]) -> Vec<u8>,
    ) -> FabricResult<Vec<u8>> {
        let call = self.calls[kind as usize].fetch_add(1, Ordering::Relaxed);
        let key = (self.comm, kind, call);
        let mut state = self.alive_state();
        let size = state.comms[self.comm].members.len();
        let entry = state.rendezvous.entry(key).or_insert_with(|| Rendezvous {
            deposits: vec![None; size],
            outcome: None,
            died_inside: None,
        });
        entry.deposits[self.rank as usize] = Some(mine);
        let mut decide = Some(decide);
        loop {
            match self.progress_of(&state, key, kind)? {
                Progress::Decided(outcome, died_inside) => {
                    return outcome_for_this_caller(outcome, died_inside)
                }
                Progress::Complete(deposits, died_inside) => {
                    let outcome = (decide.take().expect("decided once"))(&mut state, &deposits);
                    let entry = state.rendezvous.get_mut(&key).expect("present");
                    entry.outcome = Some(outcome.clone());
                    entry.died_inside = died_inside;
                    self.world.changed.notify_all();
                    return outcome_for_this_caller(outcome, died_inside);
                }
                Progress::Waiting => state = self.world.wait(what, state),
            }
            if state.dead[self.me as usize] {
                drop(state);
                panic::resume_unwind(Box::new(Killed(self.me)));
            }
        }
    }

    fn progress_of(
        &self,
        state: &State,
        key: (usize, Kind, u64),
        kind: Kind,
    ) -> FabricResult<Progress> {
        let entry = &state.rendezvous[&key];
        if let Some(outcome) = &entry.outcome {
            return Ok(Progress::Decided(outcome.clone(), entry.died_inside));
        }
        let comm = &state.comms[self.comm];
        let dead = |rank: usize| state.dead[comm.members[rank] as usize];
        let missing: Vec<usize> =
            (0..comm.members.len()).filter(|&r| entry.deposits[r].is_none()).collect();
        if kind == Kind::Collective {
            if comm.revoked {
                return Err(FabricError::Revoked { op: "local collective" });
            }
            if let Some(&r) = missing.iter().find(|&&r| dead(r)) {
                return Err(FabricError::ProcFailed {
                    op: "local collective",
                    peer: Some(r as i32),
                });
            }
        }
        if missing.iter().any(|&r| !dead(r)) {
            return Ok(Progress::Waiting);
        }
        let died_inside = match kind {
            Kind::Collective => (0..comm.members.len()).find(|&r| dead(r)),
            _ => None,
        };
        let present = (0..comm.members.len())
            .map(|r| {
                if kind == Kind::Collective || !dead(r) {
                    entry.deposits[r].clone()
                } else {
                    None
                }
            })
            .collect();
        Ok(Progress::Complete(present, died_inside))
    }

    fn new_comm(state: &mut State, members: Vec<i32>) -> Vec<u8> {
        state.comms.push(CommState { members, revoked: false });
        ((state.comms.len() - 1) as u64).to_le_bytes().to_vec()
    }

    fn decode_id(bytes: &[u8]) -> usize {
        u64::from_le_bytes(bytes.try_into().expect("an 8-byte id")) as usize
    }
}

enum Progress {
    /// The outcome, and a member that died inside the collective.
    Decided(Vec<u8>, Option<usize>),
    /// Every live member's deposit (a dead one's too for a collective: it joined), and a
    /// member that died inside the collective.
    Complete(Vec<Option<Vec<u8>>>, Option<usize>),
    Waiting,
}

/// The collective's outcome for this caller: when a member joined it and died before it
/// completed, a failure on some callers and the outcome on others, each caller's by a seeded
/// coin ([`fails_after_a_death`]), as ULFM reports failures per process.
fn outcome_for_this_caller(outcome: Vec<u8>, died_inside: Option<usize>) -> FabricResult<Vec<u8>> {
    match died_inside {
        Some(r) if fails_after_a_death() => {
            Err(FabricError::ProcFailed { op: "local collective", peer: Some(r as i32) })
        }
        _ => Ok(outcome),
    }
}

impl Fabric for LocalFabric {
    type Window = LocalWindow;

    fn rank(&self) -> i32 {
        self.rank
    }

    fn size(&self) -> i32 {
        self.world.lock().comms[self.comm].members.len() as i32
    }

    fn host_id(&self) -> FabricResult<u32> {
        Ok(self.alive_state().hosts[self.me as usize])
    }

    fn dup(&self) -> FabricResult<LocalFabric> {
        let members = self.members(&self.alive_state());
        let id = self.rendezvous("in dup", Kind::Collective, Vec::new(), |state, _| {
            LocalFabric::new_comm(state, members)
        })?;
        Ok(self.handle_on(LocalFabric::decode_id(&id), &self.alive_state()))
    }

    fn barrier(&self) -> FabricResult<()> {
        self.rendezvous("in a barrier", Kind::Collective, Vec::new(), |_, _| Vec::new()).map(drop)
    }

    fn allgather(&self, mine: &[u8]) -> FabricResult<Vec<u8>> {
        self.rendezvous("in an allgather", Kind::Collective, mine.to_vec(), |_, deposits| {
            deposits.iter().flat_map(|d| d.clone().expect("every member contributed")).collect()
        })
    }

    fn revoke(&self) -> FabricResult<()> {
        self.alive_state().comms[self.comm].revoked = true;
        self.world.changed.notify_all();
        Ok(())
    }

    fn is_revoked(&self) -> FabricResult<bool> {
        Ok(self.alive_state().comms[self.comm].revoked)
    }

    fn shrink(&self) -> FabricResult<LocalFabric> {
        let members = self.members(&self.alive_state());
        let id = self.rendezvous("in a shrink", Kind::Shrink, Vec::new(), |state, deposits| {
            let survivors = members.iter().zip(deposits).filter(|(_, d)| d.is_some());
            LocalFabric::new_comm(state, survivors.map(|(&m, _)| m).collect())
        })?;
        Ok(self.handle_on(LocalFabric::decode_id(&id), &self.alive_state()))
    }

    fn agree(&self, flag: u32) -> FabricResult<Agreed> {
        let value = self.rendezvous(
            "in an agreement",
            Kind::Agree,
            flag.to_le_bytes().to_vec(),
            |_, deposits| {
                let flags =
                    deposits.iter().flatten().map(|d| u32::from_le_bytes([d[0], d[1], d[2], d[3]]));
                flags.fold(u32::MAX, |a, f| a & f).to_le_bytes().to_vec()
            },
        )?;
        let dead = self.dead_ranks();
        let acked = self.acked.lock().unwrap_or_else(|p| p.into_inner());
        let unacknowledged_failures = dead.iter().any(|r| !acked.contains(r));
        Ok(Agreed {
            value: u32::from_le_bytes([value[0], value[1], value[2], value[3]]),
            unacknowledged_failures,
        })
    }

    fn failed_ranks(&self) -> FabricResult<Vec<i32>> {
        let dead = self.dead_ranks();
        self.acked.lock().unwrap_or_else(|p| p.into_inner()).clone_from(&dead);
        Ok(dead)
    }

    fn ranks_in(&self, origin: &LocalFabric) -> FabricResult<Vec<i32>> {
        let state = self.alive_state();
        let theirs = &state.comms[origin.comm].members;
        let position = |m: &i32| theirs.iter().position(|t| t == m).expect("a subset") as i32;
        Ok(state.comms[self.comm].members.iter().map(position).collect())
    }

    fn progress(&self) -> FabricResult<()> {
        drop(self.alive_state());
        Ok(())
    }

    fn ping(&self, target: i32, _timeout: Duration) -> FabricResult<()> {
        let state = self.alive_state();
        let peer = state.comms[self.comm].members[target as usize];
        if state.dead[peer as usize] {
            return Err(FabricError::ProcFailed { op: "local ping", peer: Some(target) });
        }
        Ok(())
    }

    fn answer_pings(&self) -> FabricResult<()> {
        self.progress()
    }

    fn open_window(&self, len: usize, _zeroed: &[(usize, usize)]) -> FabricResult<LocalWindow> {
        let id = self.rendezvous(
            "in a window's creation",
            Kind::Collective,
            (len as u64).to_le_bytes().to_vec(),
            |state, deposits| {
                let sizes =
                    deposits.iter().map(|d| LocalFabric::decode_id(d.as_deref().expect("all")));
                let ranks = sizes.map(|n| Mutex::new(vec![0u8; n])).collect();
                let extents = Mutex::new(HashMap::new());
                state.windows.push(Arc::new(Memory { ranks, extents }));
                ((state.windows.len() - 1) as u64).to_le_bytes().to_vec()
            },
        )?;
        let state = self.alive_state();
        let memory = state.windows[LocalFabric::decode_id(&id)].clone();
        let members = Arc::new(self.members(&state));
        drop(state);
        Ok(LocalWindow { world: self.world.clone(), memory, members, rank: self.rank, me: self.me })
    }

    fn send(&self, data: &[u8], dest: i32, tag: i32) -> FabricResult<()> {
        self.deliver(Message { source: self.rank, tag, data: data.to_vec() }, dest, |s| {
            &mut s.mailboxes
        })
    }

    fn try_receive(&self) -> FabricResult<Option<Message>> {
        self.take_oldest(|s| &mut s.mailboxes)
    }

    fn send_notice(&self, notice: &[u8], dest: i32) -> FabricResult<bool> {
        let notice = Message { source: self.rank, tag: 0, data: notice.to_vec() };
        self.deliver(notice, dest, |s| &mut s.notices).map(|()| true)
    }

    fn try_receive_notice(&self) -> FabricResult<Option<Message>> {
        self.take_oldest(|s| &mut s.notices)
    }

    fn is_kill(payload: &(dyn Any + Send)) -> bool {
        payload.is::<Killed>()
    }

    /// Also a stall point: [`LocalCluster::stop_at`] stops a rank at a failpoint too.
    fn failpoint(&self, name: &str) {
        check_alive(&self.world, self.me);
        let stop_armed = self.world.lock().stops.contains_key(&(self.me, name.to_string()));
        if stop_armed {
            self.stall_point(name);
        }
        let mut state = self.world.lock();
        let Some(left) = state.armed.get_mut(&(self.me, name.to_string())) else { return };
        *left -= 1;
        if *left == 0 {
            state.mark_dead(self.me);
            drop(state);
            self.world.changed.notify_all();
            panic::resume_unwind(Box::new(Killed(self.me)));
        }
    }

    fn stall_point(&self, name: &str) {
        let mut state = self.alive_state();
        let Some(left) = state.stops.get_mut(&(self.me, name.to_string())) else { return };
        *left -= 1;
        if *left > 0 {
            return;
        }
        state.stops.remove(&(self.me, name.to_string()));
        state.stopped.push(self.me);
        self.world.changed.notify_all();
        while !state.resumed.contains(&self.me) {
            // A stopped thread ends with its process (killed, or ended by one of its own
            // threads); a process only declared failed by the others lives on, stopped.
            if state.dead[self.me as usize] && !state.declared[self.me as usize] {
                drop(state);
                panic::resume_unwind(Box::new(Killed(self.me)));
            }
            state = self.world.wait("stopped", state);
        }
        state.resumed.retain(|&r| r != self.me);
        state.stopped.retain(|&r| r != self.me);
    }

    fn fail_stop(&self, why: &str) {
        crate::events::warn(format!("rank {} ends itself (fail-stop): {why}", self.me));
        self.world.lock().declared[self.me as usize] = false;
        self.world.mark_dead(&[self.me]);
    }
}

impl LocalFabric {
    /// The members whose failure this rank learned of.
    fn dead_ranks(&self) -> Vec<i32> {
        let state = self.world.lock();
        let now = crate::rt::now();
        let learned = |peer: i32| state.learned_at.get(&(self.me, peer)).is_some_and(|&t| t <= now);
        let members = &state.comms[self.comm].members;
        (0..members.len() as i32).filter(|&r| learned(members[r as usize])).collect()
    }
}

/// A [`LocalFabric`] window: puts and gets copy bytes at once, under the target's lock.
pub struct LocalWindow {
    world: Arc<World>,
    memory: Arc<Memory>,
    /// The window's members, by window rank, as cluster ranks.
    members: Arc<Vec<i32>>,
    rank: i32,
    me: i32,
}

impl LocalWindow {
    fn check_alive(&self) {
        check_alive(&self.world, self.me);
    }
}

/// `ProcFailed` when window rank `target` is dead and on another host than `me` (a one-sided
/// call to a dead process across the network fails; within a host it lands in the shared
/// memory, as on MPI).
fn reach(world: &World, members: &[i32], me: i32, target: i32) -> FabricResult<()> {
    let Some(&peer) = members.get(target as usize) else { return Ok(()) };
    let state = world.lock();
    let (dead, hosts) = (state.dead[peer as usize], &state.hosts);
    if dead && hosts[peer as usize] != hosts[me as usize] {
        return Err(FabricError::ProcFailed { op: "local rma", peer: Some(target) });
    }
    Ok(())
}

/// Unwinds a dead rank's thread; a declared rank's one-sided calls go on.
fn check_alive(world: &World, me: i32) {
    crate::rt::step("local rma");
    let state = world.lock();
    let dead = state.dead[me as usize] && !state.declared[me as usize];
    drop(state);
    if dead {
        panic::resume_unwind(Box::new(Killed(me)));
    }
}

/// `target`'s bytes, after checking that `len` bytes at `disp` lie inside them.
fn target_bytes(
    memory: &Memory,
    target: i32,
    disp: i64,
    len: usize,
) -> FabricResult<MutexGuard<'_, Vec<u8>>> {
    let outside = |what: String| FabricError::Other { op: "local rma", msg: what };
    let bytes =
        memory.ranks.get(target as usize).ok_or_else(|| outside(format!("no rank {target}")))?;
    let guard = bytes.lock().unwrap_or_else(|p| p.into_inner());
    if disp < 0 || disp as usize + len > guard.len() {
        let size = guard.len();
        return Err(outside(format!("{len} bytes at {disp} outside rank {target}'s {size} bytes")));
    }
    Ok(guard)
}

/// The operations of one [`LocalWindow`] scope: each completes at once.
pub struct LocalScope<'buf> {
    world: Arc<World>,
    memory: Arc<Memory>,
    members: Arc<Vec<i32>>,
    me: i32,
    _buffers: std::marker::PhantomData<&'buf mut [u8]>,
}

impl LocalScope<'_> {
    /// Unwinds when this rank is dead; `ProcFailed` for a dead target on another host.
    fn check(&self, target: i32) -> FabricResult<()> {
        check_alive(&self.world, self.me);
        reach(&self.world, &self.members, self.me, target)
    }
}

impl<'buf> RmaOps<'buf> for LocalScope<'buf> {
    fn put(&mut self, target: i32, disp: i64, data: &'buf [u8]) -> FabricResult<()> {
        self.check(target)?;
        let mut bytes = target_bytes(&self.memory, target, disp, data.len())?;
        bytes[disp as usize..disp as usize + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn get(&mut self, target: i32, disp: i64, out: &'buf mut [u8]) -> FabricResult<()> {
        self.check(target)?;
        let bytes = target_bytes(&self.memory, target, disp, out.len())?;
        out.copy_from_slice(&bytes[disp as usize..disp as usize + out.len()]);
        Ok(())
    }

    fn put_extent(&mut self, target: i32, id: u64, data: &'buf [u8]) -> FabricResult<()> {
        self.check(target)?;
        self.memory.put_extent(target, id, data)
    }

    fn get_extent(&mut self, target: i32, id: u64, out: &'buf mut [u8]) -> FabricResult<()> {
        self.check(target)?;
        self.memory.get_extent(target, id, out);
        Ok(())
    }

    fn free_extent(&mut self, target: i32, id: u64) -> FabricResult<()> {
        self.check(target)?;
        self.memory.extents().remove(&(target, id));
        Ok(())
    }

    /// Every rank of the in-process fabric shares its memory.
    fn on_this_host(&self, _target: i32) -> FabricResult<bool> {
        Ok(true)
    }

    fn copy(
        &mut self,
        source: i32,
        from: i64,
        target: i32,
        to: i64,
        len: usize,
    ) -> FabricResult<()> {
        self.check(source)?;
        self.check(target)?;
        let bytes = target_bytes(&self.memory, source, from, len)?;
        let copied = bytes[from as usize..from as usize + len].to_vec();
        drop(bytes);
        let mut bytes = target_bytes(&self.memory, target, to, len)?;
        bytes[to as usize..to as usize + len].copy_from_slice(&copied);
        Ok(())
    }

    fn copy_extent(
        &mut self,
        source: i32,
        from: u64,
        target: i32,
        to: u64,
        len: u64,
    ) -> FabricResult<()> {
        self.check(source)?;
        self.check(target)?;
        let held = self.memory.extents().get(&(source, from)).cloned().unwrap_or_default();
        if (held.len() as u64) < len {
            let msg = format!("rank {source}'s extent {from} holds {} of {len} bytes", held.len());
            return Err(FabricError::Other { op: "local extent copy", msg });
        }
        self.memory.put_extent(target, to, &held[..len as usize])
    }
}

impl FabricWindow for LocalWindow {
    type Scope<'buf> = LocalScope<'buf>;

    fn scope<'buf, R>(
        &self,
        issue: impl FnOnce(&mut LocalScope<'buf>) -> FabricResult<R>,
    ) -> FabricResult<R> {
        issue(&mut LocalScope {
            world: self.world.clone(),
            memory: self.memory.clone(),
            members: self.members.clone(),
            me: self.me,
            _buffers: std::marker::PhantomData,
        })
    }

    fn sync(&self) -> FabricResult<()> {
        self.check_alive();
        Ok(())
    }

    fn read_local(&self, offset: usize, out: &mut [u8]) -> FabricResult<()> {
        self.check_alive();
        let bytes = target_bytes(&self.memory, self.rank, offset as i64, out.len())?;
        out.copy_from_slice(&bytes[offset..offset + out.len()]);
        Ok(())
    }

    fn read_local_extent(&self, id: u64, out: &mut [u8]) -> FabricResult<()> {
        self.check_alive();
        self.memory.get_extent(self.rank, id, out);
        Ok(())
    }

    fn write_local(&self, offset: usize, data: &[u8]) -> FabricResult<()> {
        self.check_alive();
        let mut bytes = target_bytes(&self.memory, self.rank, offset as i64, data.len())?;
        bytes[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn compare_and_swap(
        &self,
        target: i32,
        disp: i64,
        compare: u64,
        swap: u64,
    ) -> FabricResult<u64> {
        self.check_alive();
        reach(&self.world, &self.members, self.me, target)?;
        let mut bytes = target_bytes(&self.memory, target, disp, 8)?;
        let word = &mut bytes[disp as usize..disp as usize + 8];
        let held = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        if held == compare {
            word.copy_from_slice(&swap.to_le_bytes());
        }
        Ok(held)
    }

    fn close(self) -> FabricResult<()> {
        self.check_alive();
        Ok(())
    }

    fn abandon(self) {}
}
