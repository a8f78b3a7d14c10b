//! A deterministic simulator of the store's global recovery: every survivor's
//! [`attempt::Machine`] runs on one seeded scheduler, against a simulated ULFM fabric, with no
//! threads and no clock. One seed fixes the scenario (workers, hosts, copies, what each holder
//! stores, who died), the interleaving of every survivor's steps and the kills during the
//! recovery, so a failing seed replays exactly.
//!
//! The simulated fabric keeps ULFM's guarantees and no more: a shrink and an agreement complete
//! among the members still alive with one uniform result; any other collective fails on every
//! caller when a member died before joining, and may succeed on some callers and fail on others
//! when a member died after joining; a revoked communicator fails every later collective but
//! shrink and agreement; freeing a window is collective, so a free that some member never joins
//! never returns. Whether a survivor already knows of a death after its barrier is up to the
//! seed too.
//!
//! After the run every survivor must have committed the same live set and lost keys, the live
//! set must include every survivor, no acknowledged write whose copy survived may be lost or
//! older at any new holder, a written key without surviving copy must be reported lost, and
//! nobody may wait forever.

use std::collections::BTreeMap;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::history::{allowed, Observed, Op};
use ftkv::codec;
use ftkv::engine::attempt::{self, Command, Event, Fault, Machine};
use ftkv::engine::layout::Layout;
use ftkv::engine::plan::Record;
use ftkv::slot::SlotGeometry;
use ftkv::Key;

/// One simulated recovery: what went wrong (empty when nothing) and a hash of its trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReport {
    pub seed: u64,
    /// A one-line description of the scenario.
    pub scenario: String,
    pub violations: Vec<String>,
    /// A hash of every step of the run (who did what, and what came back).
    pub digest: u64,
    /// Steps executed.
    pub steps: usize,
}

impl std::fmt::Display for RunReport {
    /// `seed=S scenario: violation; violation` (the line `ftkv sim` prints for a failing seed).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seed={} {}: {}", self.seed, self.scenario, self.violations.join("; "))
    }
}

/// The first five failing runs, a line each, for an assertion message.
pub fn first_failing(failing: &[RunReport]) -> String {
    failing.iter().take(5).map(|r| format!("{r}\n")).collect()
}

/// Runs the scenario of `seed`.
pub fn run(seed: u64) -> RunReport {
    let mut sim = Sim::new(seed);
    sim.run();
    sim.report()
}

/// Runs the scenario of `seed` and returns, besides its report, one line per step: the step,
/// the worker, and the code of its command (`0x100`..`0x900`: revoke, shrink, open, exchange,
/// copy, agree, commit, dispose, fail) or of the event it received (`0x1000`..`0x7000` in
/// the same order as [`Event`]'s variants), `0xdead..` for a death.
pub fn run_traced(seed: u64) -> (RunReport, Vec<String>) {
    let mut sim = Sim::new(seed);
    sim.log = Some(Vec::new());
    sim.run();
    let log = sim.log.take().unwrap_or_default();
    (sim.report(), log)
}

/// Runs `runs` scenarios from `first_seed` on; the summary digest combines every run's.
pub fn campaign(first_seed: u64, runs: u64) -> (Vec<RunReport>, u64) {
    let mut digest = 0xcbf2_9ce4_8422_2325u64;
    let mut failing = Vec::new();
    for seed in first_seed..first_seed + runs {
        let report = run(seed);
        digest = mix(digest, report.digest);
        if !report.violations.is_empty() {
            failing.push(report);
        }
    }
    (failing, digest)
}

/// Folds `v` into the trace hash `h` (the digest of [`campaign`] and of the pool's simulator).
pub fn mix(h: u64, v: u64) -> u64 {
    (h ^ v).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(17)
}

/// A communicator of the simulated fabric.
#[derive(Debug, Clone)]
struct Comm {
    members: Vec<i32>,
    revoked: bool,
}

/// A collective call in progress on one communicator: who joined with what, and the outcome
/// once the first caller completed it.
#[derive(Debug, Default)]
struct Call {
    joined: BTreeMap<i32, Vec<u8>>,
    /// Workers alive when the call completed (for shrink and agreement).
    decided: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Shrink,
    Open,
    Exchange,
    Barrier,
    Agree,
    Free,
}

/// Where one survivor is.
#[derive(Debug)]
enum Status {
    /// About to execute this command.
    Ready(Command),
    /// Inside a collective (its command is kept to finish it).
    Waiting(Command, Kind, usize, u64),
    Done(Command),
}

struct Worker {
    id: i32,
    machine: Machine,
    status: Status,
    /// The communicator of its current attempt (index into `Sim::comms`).
    comm: usize,
    /// Collective calls made so far, by communicator and kind (ULFM matches calls in order).
    calls: BTreeMap<(usize, Kind), u64>,
    /// The step at which it dies, counted in its own actions.
    dies_at: Option<usize>,
    actions: usize,
    /// Its first shrink never returns (an Open MPI shrink stuck on one member while the
    /// others go on); its recovery deadline ends it once nobody else can move.
    stuck_in_shrink: bool,
}

struct Sim {
    seed: u64,
    rng: SmallRng,
    scenario: String,
    hosts: Vec<u32>,
    copies: usize,
    previous: Layout,
    /// The last acknowledged version of each key (0: never written).
    acked: BTreeMap<Key, u64>,
    /// Keys with a write of the next version in flight (on some holders).
    in_flight: std::collections::BTreeSet<Key>,
    /// What each holder stores in the previous window: key → version.
    stored: BTreeMap<i32, BTreeMap<Key, u64>>,
    dead: Vec<bool>,
    comms: Vec<Comm>,
    calls: BTreeMap<(usize, Kind, u64), Call>,
    /// The copies written in each attempt's window: (communicator, holder) → key → version.
    copied: BTreeMap<(usize, i32), BTreeMap<Key, u64>>,
    workers: Vec<Worker>,
    digest: u64,
    steps: usize,
    violations: Vec<String>,
    /// Every step, when traced ([`run_traced`]).
    log: Option<Vec<String>>,
    /// Who opened each attempt's window (by communicator).
    opened_by: BTreeMap<usize, std::collections::BTreeSet<i32>>,
}

const KINDS: usize = 2;

/// Acknowledged versions, what each holder stores, and the keys with a write in flight.
type Contents =
    (BTreeMap<Key, u64>, BTreeMap<i32, BTreeMap<Key, u64>>, std::collections::BTreeSet<Key>);
/// More steps than any run needs: reaching it means a livelock.
const STEP_LIMIT: usize = 20_000;

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = SmallRng::seed_from_u64(seed);
        let n = rng.gen_range(3..=8usize);
        let host_count = [1, 1, 2, 3][rng.gen_range(0..4)].min(n) as u32;
        let hosts: Vec<u32> = (0..n).map(|w| w as u32 % host_count).collect();
        let copies = rng.gen_range(1..=3usize.min(n - 1));
        let all: Vec<i32> = (0..n as i32).collect();
        let geometry = SlotGeometry::new(64);
        let previous = Layout::compute(&all, &hosts, KINDS, copies, geometry, 0);
        let (acked, stored, in_flight) = Self::contents(&mut rng, &previous);
        // Up to copies − 1 dead at the start (nothing may be lost), sometimes more.
        let max_dead = if rng.gen_bool(0.2) { copies } else { copies - 1 };
        let initially = rng.gen_range(1..=max_dead.clamp(1, n - 2));
        let mut dead = vec![false; n];
        while dead.iter().filter(|d| **d).count() < initially {
            dead[rng.gen_range(0..n)] = true;
        }
        let later = rng.gen_range(0..=2usize);
        let stuck = rng.gen_bool(0.15);
        let scenario = format!(
            "{n} workers on {host_count} hosts, {copies} copies, dead at start {:?}, {later} \
             kills during recovery{}",
            (0..n as i32).filter(|&w| dead[w as usize]).collect::<Vec<_>>(),
            if stuck { ", one shrink stuck" } else { "" }
        );
        let comms = vec![Comm { members: all.clone(), revoked: false }];
        let mut sim = Sim {
            seed,
            rng,
            scenario,
            hosts,
            copies,
            previous,
            acked,
            in_flight,
            stored,
            dead,
            comms,
            calls: BTreeMap::new(),
            copied: BTreeMap::new(),
            workers: Vec::new(),
            digest: seed,
            steps: 0,
            violations: Vec::new(),
            log: None,
            opened_by: BTreeMap::new(),
        };
        sim.start_workers(later, stuck);
        sim
    }

    /// Random acknowledged versions and what every holder stores: the acknowledged version,
    /// or, where a write was in flight, the next one on some holders.
    fn contents(rng: &mut SmallRng, layout: &Layout) -> Contents {
        let (mut acked, mut stored) = (BTreeMap::new(), BTreeMap::<i32, BTreeMap<Key, u64>>::new());
        let mut flying = std::collections::BTreeSet::new();
        for key in layout.keys() {
            let version = if rng.gen_bool(0.8) { rng.gen_range(1..50) } else { 0 };
            acked.insert(key, version);
            let in_flight = rng.gen_bool(0.3);
            if in_flight {
                flying.insert(key);
            }
            for copy in layout.route(key).unwrap_or(&[]) {
                let held = version + u64::from(in_flight && rng.gen_bool(0.5));
                if held > 0 {
                    stored.entry(copy.worker).or_default().insert(key, held);
                }
            }
        }
        (acked, stored, flying)
    }

    fn start_workers(&mut self, later_kills: usize, stuck: bool) {
        let survivors: Vec<i32> =
            (0..self.dead.len() as i32).filter(|&w| !self.dead[w as usize]).collect();
        let doomed: Vec<i32> = (0..later_kills.min(survivors.len() - 1))
            .map(|_| survivors[self.rng.gen_range(0..survivors.len())])
            .collect();
        let stuck = stuck.then(|| survivors[self.rng.gen_range(0..survivors.len())]);
        for &id in &survivors {
            let acked = (0..KINDS as u16).map(|k| self.acked[&Key::new(id, k)]).collect();
            let inputs = attempt::Inputs {
                me: id,
                hosts: self.hosts.clone(),
                kinds: KINDS,
                copies: self.copies,
                spares: 0,
                previous: self.previous.clone(),
                acked,
            };
            let mut machine = Machine::new(inputs);
            let first = machine.start();
            let dies_at = doomed.contains(&id).then(|| self.rng.gen_range(0..30));
            self.workers.push(Worker {
                id,
                machine,
                status: Status::Ready(first),
                comm: 0,
                calls: BTreeMap::new(),
                dies_at,
                actions: 0,
                stuck_in_shrink: stuck == Some(id),
            });
        }
    }

    fn run(&mut self) {
        while self.steps < STEP_LIMIT {
            let runnable: Vec<usize> =
                (0..self.workers.len()).filter(|&i| self.can_act(i)).collect();
            if runnable.is_empty() && !self.end_a_stuck_worker() {
                break;
            }
            if runnable.is_empty() {
                continue;
            }
            self.maybe_kill_a_blocked_worker();
            let i = runnable[self.rng.gen_range(0..runnable.len())];
            if self.can_act(i) {
                self.act(i);
            }
            self.steps += 1;
        }
        self.judge();
    }

    /// Now and then a worker due to die dies while it waits inside a collective (not only
    /// when it acts).
    fn maybe_kill_a_blocked_worker(&mut self) {
        if !self.rng.gen_bool(0.05) {
            return;
        }
        let blocked = self.workers.iter().position(|w| {
            w.dies_at.is_some()
                && !self.dead[w.id as usize]
                && matches!(w.status, Status::Waiting(..))
        });
        if let Some(i) = blocked {
            self.dead[self.workers[i].id as usize] = true;
            self.trace(i, 0xde_ad02);
        }
    }

    /// When nobody can move: the recovery deadline of a worker stuck in its shrink ends it (a
    /// fail-stop the others then see). `false` when no worker is stuck.
    fn end_a_stuck_worker(&mut self) -> bool {
        let stuck = self.workers.iter().position(|w| {
            w.stuck_in_shrink
                && !self.dead[w.id as usize]
                && matches!(w.status, Status::Waiting(_, Kind::Shrink, _, _))
        });
        let Some(i) = stuck else { return false };
        self.dead[self.workers[i].id as usize] = true;
        self.trace(i, 0xde_ad01);
        self.steps += 1;
        true
    }

    fn alive(&self, id: i32) -> bool {
        !self.dead[id as usize]
    }

    fn can_act(&self, i: usize) -> bool {
        let w = &self.workers[i];
        if !self.alive(w.id) {
            return false;
        }
        match &w.status {
            Status::Ready(_) => true,
            Status::Waiting(_, Kind::Shrink, _, _) if w.stuck_in_shrink => false,
            Status::Waiting(_, kind, comm, call) => self.completes(*kind, *comm, *call),
            Status::Done(_) => false,
        }
    }

    /// Whether a collective can return to its callers: every member joined or died (a dead
    /// member that never joined fails a regular collective at once).
    fn completes(&self, kind: Kind, comm: usize, call: u64) -> bool {
        let Some(c) = self.calls.get(&(comm, kind, call)) else { return false };
        if c.decided.is_some() {
            return true;
        }
        let members = &self.comms[comm].members;
        let absent_alive = members.iter().any(|m| self.alive(*m) && !c.joined.contains_key(m));
        let regular = !matches!(kind, Kind::Shrink | Kind::Agree);
        let absent_dead = members.iter().any(|m| !self.alive(*m) && !c.joined.contains_key(m));
        let revoked = self.comms[comm].revoked && regular && kind != Kind::Free;
        !absent_alive || (regular && kind != Kind::Free && (absent_dead || revoked))
    }

    fn act(&mut self, i: usize) {
        let w = &mut self.workers[i];
        w.actions += 1;
        if w.dies_at.is_some_and(|at| w.actions > at) {
            self.dead[w.id as usize] = true;
            self.trace(i, 0xde_ad00);
            return;
        }
        let status = std::mem::replace(&mut self.workers[i].status, Status::Done(Command::Shrink));
        let next = match status {
            Status::Ready(command) => self.begin(i, command),
            Status::Waiting(_, kind, comm, call) => {
                let event = self.finish(i, kind, comm, call);
                self.trace(i, event_code(&event));
                let next = self.workers[i].machine.on(event);
                Self::settle(next)
            }
            done @ Status::Done(_) => done,
        };
        self.workers[i].status = next;
    }

    /// Turns a command into a status: local ones run at once, collectives join their call.
    fn settle(command: Command) -> Status {
        match command {
            Command::Commit(_) | Command::Fail(_) => Status::Done(command),
            command => Status::Ready(command),
        }
    }

    fn begin(&mut self, i: usize, command: Command) -> Status {
        self.trace(i, command_code(&command));
        let comm = self.workers[i].comm;
        let id = self.workers[i].id;
        match &command {
            Command::Revoke { .. } => {
                self.comms[comm].revoked = true;
                let next = self.workers[i].machine.on(Event::Revoked);
                Self::settle(next)
            }
            Command::Shrink => self.join(i, command, Kind::Shrink, Vec::new()),
            Command::OpenWindow { .. } => self.join(i, command, Kind::Open, Vec::new()),
            Command::Exchange { records } => {
                let bytes = codec::encode(records);
                self.join(i, command, Kind::Exchange, bytes)
            }
            Command::Copy { sends } => {
                self.write_copies(id, comm, sends);
                self.join(i, command, Kind::Barrier, Vec::new())
            }
            Command::Agree { flags, revoke } => {
                if *revoke {
                    self.comms[comm].revoked = true;
                }
                self.join(i, command.clone(), Kind::Agree, flags.to_le_bytes().to_vec())
            }
            Command::Dispose { free: true } => self.join(i, command, Kind::Free, Vec::new()),
            Command::Dispose { free: false } => {
                let opened = self.opened_by.get(&comm).map_or(0, |o| o.len());
                if opened == self.comms[comm].members.len() {
                    self.violations.push(format!(
                        "worker {id} leaves the window of communicator {comm} allocated though \
                         every member opened it"
                    ));
                }
                let next = self.workers[i].machine.on(Event::Disposed);
                Self::settle(next)
            }
            Command::Commit(_) | Command::Fail(_) => Status::Done(command),
        }
    }

    fn join(&mut self, i: usize, command: Command, kind: Kind, mine: Vec<u8>) -> Status {
        let w = &mut self.workers[i];
        let counter = w.calls.entry((w.comm, kind)).or_insert(0);
        let call = *counter;
        *counter += 1;
        let (comm, id) = (w.comm, w.id);
        self.calls.entry((comm, kind, call)).or_default().joined.insert(id, mine);
        Status::Waiting(command, kind, comm, call)
    }

    /// The event a collective returns to worker `i`.
    fn finish(&mut self, i: usize, kind: Kind, comm: usize, call: u64) -> Event {
        let members = self.comms[comm].members.clone();
        let all_joined = {
            let c = &self.calls[&(comm, kind, call)];
            members.iter().all(|m| c.joined.contains_key(m))
        };
        let anyone_dead = members.iter().any(|m| !self.alive(*m));
        match kind {
            Kind::Shrink => {
                let new = self.decide(comm, kind, call, |sim| {
                    let survivors: Vec<i32> =
                        members.iter().copied().filter(|m| sim.alive(*m)).collect();
                    sim.comms.push(Comm { members: survivors, revoked: false });
                    ((sim.comms.len() - 1) as u64).to_le_bytes().to_vec()
                });
                let new = u64::from_le_bytes(new.try_into().expect("an id")) as usize;
                self.workers[i].comm = new;
                Event::Shrunk(Ok(self.comms[new].members.clone()))
            }
            Kind::Agree => {
                let value = self.decide(comm, kind, call, |sim| {
                    let c = &sim.calls[&(comm, kind, call)];
                    let flags = c.joined.iter().filter(|(m, _)| sim.alive(**m));
                    let and = flags.fold(u32::MAX, |a, (_, f)| {
                        a & u32::from_le_bytes(f[..4].try_into().expect("4 bytes"))
                    });
                    and.to_le_bytes().to_vec()
                });
                let value = u32::from_le_bytes(value[..4].try_into().expect("4 bytes"));
                Event::Agreed(Ok((value, anyone_dead && self.rng.gen_bool(0.5))))
            }
            Kind::Free => Event::Disposed,
            regular => {
                let revoked = self.comms[comm].revoked;
                let fails = revoked || !all_joined || (anyone_dead && self.rng.gen_bool(0.5));
                if fails {
                    return match regular {
                        Kind::Open => Event::WindowOpened(Err(Fault::Failure)),
                        Kind::Exchange => Event::Exchanged(Err(Fault::Failure)),
                        _ => Event::Copied(Err(Fault::Failure)),
                    };
                }
                match regular {
                    Kind::Open => {
                        let id = self.workers[i].id;
                        self.opened_by.entry(comm).or_default().insert(id);
                        let held = self.stored.get(&id).cloned().unwrap_or_default();
                        // The scan of the old window fails now and then (a read error).
                        if self.rng.gen_bool(0.02) {
                            return Event::WindowOpened(Ok(Err(Fault::Other("scan".into()))));
                        }
                        Event::WindowOpened(Ok(Ok(held.into_iter().collect())))
                    }
                    Kind::Exchange => {
                        let c = &self.calls[&(comm, kind, call)];
                        let decode = |m: &i32| codec::decode::<Vec<Record>>(&c.joined[m]);
                        let all =
                            members.iter().flat_map(|m| decode(m).unwrap_or_default()).collect();
                        Event::Exchanged(Ok(all))
                    }
                    _ => {
                        let knows = anyone_dead && self.rng.gen_bool(0.7);
                        Event::Copied(Ok(!knows))
                    }
                }
            }
        }
    }

    /// The call's outcome, computed by its first completer and the same for everyone after.
    fn decide(
        &mut self,
        comm: usize,
        kind: Kind,
        call: u64,
        compute: impl FnOnce(&mut Sim) -> Vec<u8>,
    ) -> Vec<u8> {
        if let Some(decided) = &self.calls[&(comm, kind, call)].decided {
            return decided.clone();
        }
        let value = compute(self);
        self.calls.get_mut(&(comm, kind, call)).expect("the call").decided = Some(value.clone());
        value
    }

    /// The copies worker `id` sends: its stored version of each key, to the key's new holders
    /// (in the layout of the communicator it shrank to).
    fn write_copies(&mut self, id: i32, comm: usize, sends: &[Key]) {
        let live = self.comms[comm].members.clone();
        let geometry = self.previous.geometry();
        let layout = Layout::compute(&live, &self.hosts, KINDS, self.copies, geometry, id);
        for key in sends {
            let Some(&version) = self.stored.get(&id).and_then(|s| s.get(key)) else {
                self.violations.push(format!("worker {id} sends {key} which it does not hold"));
                continue;
            };
            for copy in layout.route(*key).unwrap_or(&[]) {
                self.copied.entry((comm, copy.worker)).or_default().insert(*key, version);
            }
        }
    }

    fn trace(&mut self, i: usize, code: u64) {
        let id = self.workers[i].id as u64;
        self.digest = mix(mix(self.digest, (self.steps as u64) << 8 | id), code);
        let (step, comm) = (self.steps, self.workers[i].comm);
        if let Some(log) = &mut self.log {
            log.push(format!("step {step} worker {id} on communicator {comm}: {code:#x}"));
        }
    }

    fn judge(&mut self) {
        let alive: Vec<i32> =
            self.workers.iter().map(|w| w.id).filter(|&w| self.alive(w)).collect();
        let mut commits = Vec::new();
        let mut violations = Vec::new();
        for w in self.workers.iter().filter(|w| !self.dead[w.id as usize]) {
            match &w.status {
                Status::Done(Command::Commit(c)) => commits.push((w.id, w.comm, c.clone())),
                Status::Done(Command::Fail(f)) => {
                    let partitioned = matches!(f, attempt::Failed::Partitioned { .. });
                    if !partitioned {
                        violations.push(format!("worker {} gave up: {f:?}", w.id));
                    }
                }
                other => violations.push(format!("worker {} stuck at {}", w.id, short(other))),
            }
        }
        self.violations.extend(violations);
        if self.steps >= STEP_LIMIT {
            self.violations.push(format!("no end after {STEP_LIMIT} steps"));
        }
        let Some((_, comm, first)) = commits.first().cloned() else { return };
        for (id, _, c) in &commits {
            if c.layout.live != first.layout.live || c.lost != first.lost {
                self.violations.push(format!(
                    "worker {id} committed live {:?} lost {:?}, worker {} live {:?} lost {:?}",
                    c.layout.live, c.lost, commits[0].0, first.layout.live, first.lost
                ));
            }
        }
        for id in &alive {
            if !commits.iter().any(|(w, _, _)| w == id) {
                self.violations.push(format!("survivor {id} did not commit while others did"));
            }
        }
        self.judge_data(comm, &first);
    }

    /// The key's history as its owner wrote it: the acknowledged version, then the one in
    /// flight, if any.
    fn history_of(&self, key: Key) -> Vec<Op> {
        let acked = self.acked[&key];
        let mut ops = Vec::new();
        if acked > 0 {
            ops.push(Op { seq: acked as u32, delete: false, acked: true });
        }
        if self.in_flight.contains(&key) {
            ops.push(Op { seq: acked as u32 + 1, delete: false, acked: false });
        }
        ops
    }

    /// Judged by the history oracle ([`crate::history`]): while a copy survived, every live
    /// new holder has a version the key's history allows; a written key without a surviving
    /// copy is reported lost, and a key with one is not.
    fn judge_data(&mut self, comm: usize, committed: &attempt::Committed) {
        let live = &committed.layout.live;
        for (&key, &acked) in &self.acked.clone() {
            let old_holders = self.previous.route(key).unwrap_or(&[]).to_vec();
            let survived = old_holders.iter().any(|c| live.contains(&c.worker));
            let lost = committed.lost.contains(&key);
            if survived {
                if lost && acked > 0 {
                    self.violations.push(format!("{key} reported lost though a copy survived"));
                }
                let ops = self.history_of(key);
                for copy in committed.layout.route(key).unwrap_or(&[]) {
                    if !self.alive(copy.worker) {
                        continue;
                    }
                    let has = self.copied.get(&(comm, copy.worker)).and_then(|m| m.get(&key));
                    let observed = has.map_or(Observed::Absent, |&v| Observed::Seq(v as u32));
                    if !allowed(&ops, observed) {
                        self.violations.push(format!(
                            "{key}: new holder {} has {observed:?}, history {ops:?}",
                            copy.worker
                        ));
                    }
                }
            } else if acked > 0 && !lost {
                self.violations.push(format!("{key} written, no copy survived, not reported lost"));
            }
        }
    }

    fn report(self) -> RunReport {
        RunReport {
            seed: self.seed,
            scenario: self.scenario,
            violations: self.violations,
            digest: self.digest,
            steps: self.steps,
        }
    }
}

/// A status without the layouts it may carry.
fn short(status: &Status) -> String {
    match status {
        Status::Ready(c) => format!("ready to {:#x}", command_code(c)),
        Status::Waiting(c, kind, comm, call) => {
            format!("{:#x} waiting in {kind:?} #{call} on communicator {comm}", command_code(c))
        }
        Status::Done(c) => format!("done with {:#x}", command_code(c)),
    }
}

fn command_code(command: &Command) -> u64 {
    match command {
        Command::Revoke { attempt } => 0x100 | *attempt as u64,
        Command::Shrink => 0x200,
        Command::OpenWindow { .. } => 0x300,
        Command::Exchange { records } => 0x400 | records.len() as u64,
        Command::Copy { sends } => 0x500 | sends.len() as u64,
        Command::Agree { flags, revoke } => 0x600 | u64::from(*flags) << 1 | u64::from(*revoke),
        Command::Commit(c) => 0x700 | c.lost.len() as u64,
        Command::Dispose { free } => 0x800 | u64::from(*free),
        Command::Fail(_) => 0x900,
    }
}

fn event_code(event: &Event) -> u64 {
    match event {
        Event::Revoked => 0x1000,
        Event::Shrunk(r) => 0x2000 | r.as_ref().map_or(0xff, |l| l.len() as u64),
        Event::WindowOpened(r) => 0x3000 | r.as_ref().map_or(0, |scan| 1 + u64::from(scan.is_ok())),
        Event::Exchanged(r) => 0x4000 | r.as_ref().map_or(0xfff, |l| l.len() as u64),
        Event::Copied(r) => 0x5000 | r.as_ref().map_or(2, |q| u64::from(*q)),
        Event::Agreed(r) => 0x6000 | r.as_ref().map_or(0xff, |(v, _)| u64::from(*v)),
        Event::Disposed => 0x7000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_thousand_seeded_recoveries_keep_every_invariant() {
        let (failing, _) = campaign(1, 2000);
        let shown = first_failing(&failing);
        assert!(failing.is_empty(), "{} failing seeds, e.g.\n{shown}", failing.len());
    }

    #[test]
    fn a_seed_replays_exactly() {
        let (_, a) = campaign(500, 200);
        let (_, b) = campaign(500, 200);
        assert_eq!(a, b);
        assert_ne!(a, campaign(501, 200).1, "a different seed gives a different trace");
    }
}
