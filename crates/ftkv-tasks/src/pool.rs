//! The work-stealing task pool with task-level checkpointing into ftkv, on MPI with ULFM.
//!
//! One worker per rank runs tasks from its local pool (newest first) and, when idle, asks a
//! random live worker for work. Steals are two-sided messages on the pool's own communicator
//! (a [`Store::communicator`]); a victim gives the older half of its pool.
//!
//! **Checkpointing** (store writes only, no reads outside failures): every worker writes its
//! checkpoint (pool, partial result, bookkeeping; [`crate::state`]) at the configured interval
//! and at both sides of every steal. The victim writes the loot key, then a checkpoint
//! without the loot, then sends; the thief checkpoints the loot before it acknowledges; the
//! victim deletes the loot key on the acknowledgement.
//!
//! **Recovery**: any failure makes every survivor revoke the pool's communicator and call
//! [`Store::recover`]; each then writes a fresh checkpoint, reads every worker's checkpoint and
//! loot key, and applies its part of [`crate::state::plan`]: a dead worker's buddy adopts its
//! checkpoint, in-flight loot goes to exactly one side. A failure during any of this starts it
//! again; adoption and loot resolution are recorded in the checkpoints, so they happen once.
//!
//! **Termination**: the leader (rank 0) probes every worker for (busy, loot sent, loot
//! received) in waves of point-to-point messages; two consecutive waves with no busy worker and
//! equal counts end the computation. The survivors then gather the results and agree that
//! every one of them has them. Each pool communicator sees exactly one agreement per worker: at
//! the end, or, for a worker that starts a recovery first, right after it revoked the pool and
//! store communicators (so that nobody waits in the agreement for a worker that waits
//! elsewhere).

use crate::events::{self, PoolEvent};
use std::time::{Duration, Instant};

use ftkv::fabric::{Fabric, FabricError};
use ftkv::{Key, Store};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::problem::Problem;
use ftkv::codec;

use crate::state::{plan, Checkpoint, Loot, Seen};
use crate::uts::Counts;

const STEAL_TAG: i32 = 11;
const LOOT_TAG: i32 = 12;
const ACK_TAG: i32 = 13;
const PROBE_TAG: i32 = 14;
const STATUS_TAG: i32 = 15;
const DONE_TAG: i32 = 16;
/// The shortest time between two termination waves.
const WAVE_GAP: Duration = Duration::from_millis(1);
const CHECKPOINT: u16 = 0;
/// A victim's answer to a steal request: the steal id and the tasks, or a refusal.
type LootMessage<T> = Option<(u64, Vec<T>)>;
/// A worker's answer to a termination probe: wave id, busy, loot sent, loot received.
type StatusMessage = [u64; 4];
const LOOT: u16 = 1;

/// When a worker writes its periodic checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interval {
    Time(Duration),
    Tasks(u64),
}

/// How the pool runs.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Copies of every checkpoint in the store.
    pub copies: usize,
    /// `None`: no checkpoints at all (the failure-free baseline; a failure is then fatal).
    pub interval: Option<Interval>,
    /// Tasks run between two looks at the network.
    pub batch: usize,
    /// How often each worker prints a `progress` line (`None`: never).
    pub progress: Option<Duration>,
    pub seed: u64,
}

impl Default for PoolConfig {
    fn default() -> PoolConfig {
        PoolConfig {
            copies: 2,
            interval: Some(Interval::Time(Duration::from_millis(100))),
            batch: 64,
            progress: None,
            seed: 1,
        }
    }
}

/// Everything that can end a worker.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("store: {0}")]
    Store(#[from] ftkv::Error),
    #[error("fabric: {0}")]
    Fabric(#[from] FabricError),
    #[error("corrupt {0} in the store")]
    Corrupt(&'static str),
    #[error("a worker failed and checkpointing is off")]
    Unprotected,
}

impl PoolError {
    fn needs_recovery(&self) -> bool {
        match self {
            PoolError::Store(e) => e.needs_recovery(),
            PoolError::Fabric(_) => true,
            _ => false,
        }
    }
}

type Result<T> = std::result::Result<T, PoolError>;

/// A recovery as one worker saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecoveryInfo {
    pub failed: Vec<i32>,
    pub adopted: Vec<i32>,
    pub store_ms: f64,
    pub total_ms: f64,
}

/// Per-worker counters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub tasks: u64,
    pub steals: u64,
    pub checkpoints: u64,
    pub store_bytes: u64,
    pub recoveries: Vec<RecoveryInfo>,
}

/// What [`run`] returns on every surviving worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The whole computation's result (the same on every survivor).
    pub total: Counts,
    /// Sums over the survivors of their tasks, checkpoints and bytes written to the store.
    pub tasks: u64,
    pub checkpoints: u64,
    pub store_bytes: u64,
    pub stats: Stats,
    pub elapsed: Duration,
    /// The workers that failed during the run, as the survivors agreed (the store's live set
    /// at the end is the same on every survivor).
    pub failed: Vec<i32>,
}

/// What the store holds for every worker, by worker id.
struct Stored<T> {
    seen: Vec<Seen>,
    checkpoints: Vec<Option<Checkpoint<T>>>,
    loots: Vec<Option<Loot<T>>>,
}

/// Sums of one termination wave: every worker's (busy, loot sent, loot received) as it
/// answered the leader's probe.
struct Wave {
    id: u64,
    answers: usize,
    busy: u64,
    sent: u64,
    received: u64,
}

/// A loot this worker gave away and that its thief has not acknowledged yet.
struct Pending<T> {
    steal_id: u64,
    /// The thief's worker id.
    thief: i32,
    tasks: Vec<T>,
}

struct Worker<'p, P: Problem, F: Fabric> {
    problem: &'p P,
    config: &'p PoolConfig,
    store: Store<F>,
    comm: F,
    me: i32,
    live: Vec<i32>,
    state: Checkpoint<P::Task>,
    steal_counter: u64,
    pending: Option<Pending<P::Task>>,
    asking: Option<i32>,
    sent: u64,
    received: u64,
    /// The leader's (rank 0's) termination wave in flight.
    wave: Option<Wave>,
    waves: u64,
    last_wave: Instant,
    quiet_wave: Option<(u64, u64)>,
    /// The leader announced the end.
    done: bool,
    /// Whether this worker took part in the one agreement of the current communicator (at the
    /// end of the computation, or when a recovery starts).
    agreed: bool,
    rng: SmallRng,
    last_checkpoint: (Instant, u64),
    last_progress: Instant,
    stats: Stats,
}

/// Runs `problem` on every rank of `world` (collective) and returns the result on every
/// survivor. Workers may be killed at any moment; the survivors finish with the exact result
/// as long as no more than `copies − 1` workers fail between two recoveries.
///
/// The fabric `F` is MPI in production; on [`ftkv::fabric::local`] the same protocol runs on
/// threads, without MPI.
pub fn run<P: Problem, F: Fabric>(world: &F, problem: &P, config: &PoolConfig) -> Result<Outcome> {
    let started = Instant::now();
    let mut store_config = ftkv::Config::new(["checkpoint", "loot"], config.copies);
    store_config.initial_capacity = 16 << 10;
    store_config.max_value = 8 << 20;
    let store = Store::create(world, store_config)?;
    let comm = store.communicator()?;
    let me = store.worker();
    let workers = store.workers();
    let mut worker = Worker {
        problem,
        config,
        comm,
        me,
        live: store.live().to_vec(),
        state: Checkpoint::initial(problem, me, workers),
        store,
        steal_counter: 0,
        pending: None,
        asking: None,
        sent: 0,
        received: 0,
        wave: None,
        waves: 0,
        last_wave: Instant::now(),
        quiet_wave: None,
        done: false,
        agreed: false,
        rng: SmallRng::seed_from_u64(config.seed ^ ((me as u64) << 40)),
        last_checkpoint: (Instant::now(), 0),
        last_progress: Instant::now(),
        stats: Stats::default(),
    };
    worker.start()?;
    let (total, sums) = worker.work()?;
    let workers = worker.store.workers() as i32;
    let failed = (0..workers).filter(|w| !worker.live.contains(w)).collect();
    Ok(Outcome {
        failed,
        total,
        tasks: sums[0],
        checkpoints: sums[1],
        store_bytes: sums[2],
        stats: worker.stats,
        elapsed: started.elapsed(),
    })
}

impl<P: Problem, F: Fabric> Worker<'_, P, F> {
    fn checkpointing(&self) -> bool {
        self.config.interval.is_some()
    }

    /// The first checkpoint, on every worker, before any work.
    fn start(&mut self) -> Result<()> {
        loop {
            let started = self.checkpoint().and_then(|()| Ok(self.store.sync()?));
            match started {
                Ok(()) => return Ok(()),
                Err(e) if e.needs_recovery() => self.recover()?,
                Err(e) => return Err(e),
            }
        }
    }

    /// Steps until termination, recovering from every failure on the way.
    fn work(&mut self) -> Result<(Counts, [u64; 3])> {
        loop {
            let step =
                self.step().and_then(|done| if done { self.finish().map(Some) } else { Ok(None) });
            match step {
                Ok(Some(result)) => return Ok(result),
                Ok(None) => {}
                Err(e) if e.needs_recovery() => self.recover()?,
                Err(e) => return Err(e),
            }
        }
    }

    /// One round: messages, a batch of tasks or a steal attempt, the termination wave.
    /// `Ok(true)` once the computation is over.
    fn step(&mut self) -> Result<bool> {
        if self.store.needs_recovery() {
            return Err(ftkv::Error::RecoveryNeeded { failed: Vec::new() }.into());
        }
        self.handle_messages()?;
        if self.state.pool.is_empty() {
            self.ask_for_work()?;
            std::thread::sleep(Duration::from_micros(50));
        } else {
            self.run_batch();
            self.maybe_checkpoint()?;
        }
        self.report_progress();
        self.termination_wave()
    }

    fn run_batch(&mut self) {
        for _ in 0..self.config.batch {
            let Some(task) = self.state.pool.pop() else { break };
            self.problem.run(&task, &mut self.state.pool, &mut self.state.counts);
            self.stats.tasks += 1;
        }
    }

    fn maybe_checkpoint(&mut self) -> Result<()> {
        let due = match self.config.interval {
            None => false,
            Some(Interval::Time(t)) => self.last_checkpoint.0.elapsed() >= t,
            Some(Interval::Tasks(n)) => self.stats.tasks - self.last_checkpoint.1 >= n,
        };
        if due {
            self.checkpoint()?;
        }
        Ok(())
    }

    fn checkpoint(&mut self) -> Result<()> {
        self.last_checkpoint = (Instant::now(), self.stats.tasks);
        if !self.checkpointing() {
            return Ok(());
        }
        let bytes = self.state.encode();
        self.store.put(Key::new(self.me, CHECKPOINT), &bytes)?;
        self.stats.checkpoints += 1;
        self.stats.store_bytes += bytes.len() as u64;
        Ok(())
    }

    fn report_progress(&mut self) {
        let Some(every) = self.config.progress else { return };
        if self.last_progress.elapsed() >= every {
            self.last_progress = Instant::now();
            let (tasks, nodes) = (self.stats.tasks, self.state.counts.nodes);
            events::emit(PoolEvent::Progress { tasks, nodes });
        }
    }

    fn handle_messages(&mut self) -> Result<()> {
        while let Some(message) = self.comm.try_receive()? {
            let (source, buf) = (message.source, message.data);
            match message.tag {
                STEAL_TAG => self.on_steal_request(source)?,
                LOOT_TAG => self.on_loot(source, &buf)?,
                ACK_TAG => self.on_ack(&buf)?,
                PROBE_TAG => self.on_probe(source, &buf)?,
                STATUS_TAG => self.on_status(&buf)?,
                DONE_TAG => self.done = true,
                _ => {}
            }
        }
        Ok(())
    }

    fn ask_for_work(&mut self) -> Result<()> {
        if self.asking.is_some() || self.comm.size() < 2 {
            return Ok(());
        }
        let mut victim = self.rng.gen_range(0..self.comm.size() - 1);
        if victim >= self.comm.rank() {
            victim += 1;
        }
        self.comm.send(&codec::encode(&()), victim, STEAL_TAG)?;
        self.asking = Some(victim);
        Ok(())
    }

    /// Gives the older half of the pool, unless a loot is still unacknowledged or there is too
    /// little work; an empty answer is a refusal.
    fn on_steal_request(&mut self, thief: i32) -> Result<()> {
        if self.pending.is_some() || self.state.pool.len() < 2 {
            let refusal: LootMessage<P::Task> = None;
            return Ok(self.comm.send(&codec::encode(&refusal), thief, LOOT_TAG)?);
        }
        let half = self.state.pool.len() / 2;
        let tasks: Vec<P::Task> = self.state.pool.drain(..half).collect();
        self.steal_counter += 1;
        let steal_id = self.steal_counter;
        let thief_worker = self.live[thief as usize];
        self.pending = Some(Pending { steal_id, thief: thief_worker, tasks });
        self.store_pending_loot()?;
        self.comm.failpoint("steal_victim_after_loot");
        self.checkpoint()?;
        self.comm.failpoint("steal_victim_before_send");
        let pending = self.pending.as_ref().expect("set above");
        let message: LootMessage<P::Task> = Some((steal_id, pending.tasks.clone()));
        self.comm.send(&codec::encode(&message), thief, LOOT_TAG)?;
        self.sent += 1;
        self.stats.steals += 1;
        Ok(())
    }

    /// Writes the loot in flight to this worker's loot key, then counts it as given
    /// (`last_given`): a checkpoint that no longer holds the loot's tasks must say so, and must
    /// only ever be written once the loot key holds them. Called again by a recovery, since the
    /// put may have failed before reaching every holder (or any).
    fn store_pending_loot(&mut self) -> Result<()> {
        let Some(pending) = self.pending.as_ref() else { return Ok(()) };
        if self.checkpointing() {
            let steal_id = pending.steal_id;
            let loot = Loot { steal_id, thief: pending.thief, tasks: pending.tasks.clone() };
            let bytes = loot.encode();
            self.store.put(Key::new(self.me, LOOT), &bytes)?;
            self.stats.store_bytes += bytes.len() as u64;
        }
        self.state.last_given = pending.steal_id;
        Ok(())
    }

    fn on_loot(&mut self, victim: i32, message: &[u8]) -> Result<()> {
        self.asking = None;
        let loot: LootMessage<P::Task> =
            codec::decode(message).ok_or(PoolError::Corrupt("loot message"))?;
        let Some((steal_id, tasks)) = loot else { return Ok(()) };
        let victim_worker = self.live[victim as usize];
        self.state.pool.extend(tasks);
        self.state.received[victim_worker as usize] = steal_id;
        self.received += 1;
        self.comm.failpoint("steal_thief_before_checkpoint");
        self.checkpoint()?;
        self.comm.failpoint("steal_thief_before_ack");
        self.comm.send(&codec::encode(&steal_id), victim, ACK_TAG)?;
        Ok(())
    }

    fn on_ack(&mut self, message: &[u8]) -> Result<()> {
        let steal_id: u64 = codec::decode(message).ok_or(PoolError::Corrupt("ack"))?;
        if self.pending.as_ref().is_some_and(|p| p.steal_id == steal_id) {
            self.pending = None;
            if self.checkpointing() {
                self.store.delete(Key::new(self.me, LOOT))?;
            }
        }
        Ok(())
    }

    /// (busy, loot sent, loot received) of this worker; waiting for an acknowledgement counts
    /// as busy.
    fn status(&self) -> [u64; 3] {
        let busy = !self.state.pool.is_empty() || self.pending.is_some();
        [busy as u64, self.sent, self.received]
    }

    fn on_probe(&mut self, leader: i32, message: &[u8]) -> Result<()> {
        let id: u64 = codec::decode(message).ok_or(PoolError::Corrupt("probe"))?;
        let [busy, sent, received] = self.status();
        let reply: StatusMessage = [id, busy, sent, received];
        Ok(self.comm.send(&codec::encode(&reply), leader, STATUS_TAG)?)
    }

    fn on_status(&mut self, message: &[u8]) -> Result<()> {
        let words: StatusMessage = codec::decode(message).ok_or(PoolError::Corrupt("status"))?;
        if let Some(wave) = self.wave.as_mut().filter(|w| w.id == words[0]) {
            wave.answers += 1;
            wave.busy += words[1];
            wave.sent += words[2];
            wave.received += words[3];
        }
        Ok(())
    }

    /// Termination detection by the leader (rank 0): a wave probes every worker for its
    /// status; two consecutive waves with no busy worker, every loot sent received, and equal
    /// counts end the computation, and the leader tells everyone. `Ok(true)` at the end.
    fn termination_wave(&mut self) -> Result<bool> {
        if self.done {
            return Ok(true);
        }
        if self.comm.rank() != 0 {
            return Ok(false);
        }
        let others = self.comm.size() as usize - 1;
        match &self.wave {
            None if self.last_wave.elapsed() >= WAVE_GAP => self.start_wave(),
            Some(wave) if wave.answers == others => self.end_wave(),
            _ => Ok(false),
        }
    }

    fn start_wave(&mut self) -> Result<bool> {
        self.waves += 1;
        let [busy, sent, received] = self.status();
        self.wave = Some(Wave { id: self.waves, answers: 0, busy, sent, received });
        for rank in 1..self.comm.size() {
            self.comm.send(&codec::encode(&self.waves), rank, PROBE_TAG)?;
        }
        if self.comm.size() == 1 {
            return self.end_wave();
        }
        Ok(false)
    }

    fn end_wave(&mut self) -> Result<bool> {
        let wave = self.wave.take().expect("a wave in flight");
        self.last_wave = Instant::now();
        let quiet = wave.busy == 0 && wave.sent == wave.received;
        let previous = self.quiet_wave.replace((wave.sent, wave.received));
        if !quiet {
            self.quiet_wave = None;
        }
        if !(quiet && previous == Some((wave.sent, wave.received))) {
            return Ok(false);
        }
        for rank in 1..self.comm.size() {
            self.comm.send(&codec::encode(&()), rank, DONE_TAG)?;
        }
        self.done = true;
        Ok(true)
    }

    /// Sums the survivors' results, tasks, checkpoints and store bytes. Every survivor then
    /// agrees on whether all of them got the sums; anything else, also another survivor's
    /// recovery starting, makes all of them recover and end again.
    fn finish(&mut self) -> Result<(Counts, [u64; 3])> {
        let c = &self.state.counts;
        let mine = [
            c.nodes,
            c.leaves,
            c.max_depth as u64,
            self.stats.tasks,
            self.stats.checkpoints,
            self.stats.store_bytes,
        ];
        let bytes: Vec<u8> = mine.iter().flat_map(|w| w.to_le_bytes()).collect();
        let gathered = self.comm.allgather(&bytes);
        self.agreed = true;
        let agreed = self.comm.agree(gathered.is_ok() as u32)?;
        let all = gathered?;
        if agreed.value != 1 {
            return Err(ftkv::Error::RecoveryNeeded { failed: Vec::new() }.into());
        }
        let words: Vec<u64> =
            all.chunks(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        let mut total = Counts::default();
        let mut sums = [0u64; 3];
        for w in words.chunks(6) {
            total.add(&Counts { nodes: w[0], leaves: w[1], max_depth: w[2] as u32 });
            sums.iter_mut().zip(&w[3..]).for_each(|(s, v)| *s += v);
        }
        Ok((total, sums))
    }

    /// Recovers until a recovery completes without another failure.
    fn recover(&mut self) -> Result<()> {
        if !self.checkpointing() {
            return Err(PoolError::Unprotected);
        }
        let started = Instant::now();
        loop {
            if let Err(e) = self.comm.revoke() {
                events::emit(PoolEvent::Warning(format!("revoking the pool communicator: {e}")));
            }
            if let Err(e) = self.store.interrupt() {
                events::emit(PoolEvent::Warning(format!("revoking the store communicator: {e}")));
            }
            self.join_agreement();
            events::emit(PoolEvent::Recovering);
            let report = self.store.recover()?;
            match self.rejoin() {
                Ok(adopted) => {
                    let info = RecoveryInfo {
                        failed: report.failed,
                        adopted,
                        store_ms: report.duration.as_secs_f64() * 1e3,
                        total_ms: started.elapsed().as_secs_f64() * 1e3,
                    };
                    events::emit(PoolEvent::Recovered(info.clone()));
                    self.stats.recoveries.push(info);
                    return Ok(());
                }
                Err(e) if e.needs_recovery() => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Contributes "not done" to the communicator's one agreement unless this worker already
    /// took part: survivors that reached the end wait in it and learn that they must recover.
    fn join_agreement(&mut self) {
        if std::mem::replace(&mut self.agreed, true) {
            return;
        }
        if let Err(e) = self.comm.agree(0) {
            events::emit(PoolEvent::Warning(format!("agreement on the pool communicator: {e}")));
        }
    }

    /// After the store recovered: a new communicator, a fresh checkpoint, then this worker's
    /// part of the plan computed from everyone's stored state.
    fn rejoin(&mut self) -> Result<Vec<i32>> {
        self.comm = self.store.communicator()?;
        self.agreed = false;
        self.live = self.store.live().to_vec();
        (self.asking, self.sent, self.received) = (None, 0, 0);
        (self.wave, self.quiet_wave, self.done) = (None, None, false);
        self.store_pending_loot()?;
        self.checkpoint()?;
        self.store.sync()?;
        let stored = self.read_everyone()?;
        let pending = self.pending.as_ref().map(|p| p.steal_id);
        let plan = plan(self.me, &self.live, &stored.seen, pending);
        for &dead in &plan.adopt {
            self.adopt(dead, stored.checkpoints[dead as usize].clone());
        }
        self.comm.failpoint("buddy_after_adopting");
        for &victim in &plan.take_loot {
            let loot = stored.loots[victim as usize].as_ref().expect("planned loot exists");
            self.state.pool.extend(loot.tasks.iter().copied());
            self.state.received[victim as usize] = loot.steal_id;
        }
        if let Some(pending) = self.pending.take() {
            if plan.take_back_pending {
                self.state.pool.extend(pending.tasks);
                self.state.received[self.me as usize] = pending.steal_id;
            }
        }
        self.checkpoint()?;
        self.delete_loot(&plan.delete_loot)?;
        self.store.sync()?;
        Ok(plan.adopt)
    }

    fn adopt(&mut self, dead: i32, checkpoint: Option<Checkpoint<P::Task>>) {
        let workers = self.state.received.len();
        let theirs = checkpoint.unwrap_or_else(|| Checkpoint::initial(self.problem, dead, workers));
        self.state.pool.extend(theirs.pool);
        self.state.counts.add(&theirs.counts);
        self.state.adopted.push(dead);
    }

    fn delete_loot(&mut self, victims: &[i32]) -> Result<()> {
        for &victim in victims {
            let key = Key::new(victim, LOOT);
            if victim == self.me {
                self.store.delete(key)?;
            } else {
                self.store.delete_handed(key)?;
            }
        }
        Ok(())
    }

    /// Every worker's checkpoint and loot key, as the store has them after a recovery.
    fn read_everyone(&mut self) -> Result<Stored<P::Task>> {
        let workers = self.state.received.len();
        let (mut seen, mut checkpoints, mut loots) = (Vec::new(), Vec::new(), Vec::new());
        for w in 0..workers as i32 {
            let checkpoint = match self.store.get(Key::new(w, CHECKPOINT))? {
                Some(bytes) => {
                    Some(Checkpoint::decode(&bytes).ok_or(PoolError::Corrupt("checkpoint"))?)
                }
                None => None,
            };
            let loot = match self.store.get(Key::new(w, LOOT))? {
                Some(bytes) => Some(Loot::decode(&bytes).ok_or(PoolError::Corrupt("loot"))?),
                None => None,
            };
            let initial = Checkpoint::initial(self.problem, w, workers);
            let c = checkpoint.as_ref().unwrap_or(&initial);
            seen.push(Seen {
                last_given: c.last_given,
                received: c.received.clone(),
                adopted: c.adopted.clone(),
                loot: loot.as_ref().map(|l| (l.steal_id, l.thief)),
            });
            checkpoints.push(checkpoint);
            loots.push(loot);
        }
        Ok(Stored { seen, checkpoints, loots })
    }
}
