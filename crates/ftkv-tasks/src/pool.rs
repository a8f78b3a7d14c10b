//! The work-stealing task pool with task-level checkpointing into ftkv, on MPI with ULFM: the
//! driver that executes [`crate::protocol`]'s commands on a [`Fabric`] and a [`Store`].
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
//! **Global recovery** ([`Recovery::Global`]): any failure makes every survivor revoke the
//! pool's communicator and call [`Store::recover`]; each then writes a fresh checkpoint, reads
//! every worker's checkpoint and loot key, and applies its part of [`crate::state::plan`]: a
//! dead worker's buddy adopts its checkpoint, in-flight loot goes to exactly one side. A
//! failure during any of this starts it again; adoption and loot resolution are recorded in
//! the checkpoints, so they happen once.
//!
//! **Localized recovery** ([`Recovery::Localized`]): nobody stops and the communicator keeps
//! its dead members. Before each step a worker compares the store's failed set with the one it
//! dealt with; a change runs its part ([`protocol::Worker::on_failures`]): as a buddy it moves
//! a dead worker's stored checkpoint into its own, as a thief or buddy it resolves a dead
//! victim's loot key, as a victim it takes back loot its dead thief never checkpointed, each
//! in one [`Store::transaction`] ([`Settle`]; its engine, [`crate::settle`], decides what it
//! reads, writes and changes). Every other worker only forgets the dead one.
//! A store that cannot repair a failure locally sends everyone down the global path; a settle
//! whose transaction that interrupted is finished after the global recovery
//! ([`Store::finish_transactions`]) and takes effect on its worker if it committed.
//!
//! **Task models** ([`crate::model`]): a fork-join or futures program keeps its open frames
//! and the results it owes in the same checkpoint ([`crate::forkjoin`]); a result for a frame
//! another worker holds goes back by message (fork-join) or by a write of the holder's futures
//! entry under the holder's lock (futures), and is owed until the holder acknowledges it.
//!
//! **Termination**: the leader (the first live worker) probes every live worker for (busy,
//! loot sent to and received from live workers, view of the failed set) in waves of
//! point-to-point messages (a worker with tasks, loot unacknowledged, open frames or owed
//! results is busy); two consecutive waves with no busy worker, equal counts and one view end
//! the computation. With global recovery the survivors then gather the results and
//! agree that every one of them has them. Each pool communicator sees exactly one agreement per
//! worker: at the end, or, for a worker that starts a recovery first, right after it revoked
//! the pool and store communicators (so that nobody waits in the agreement for a worker that
//! waits elsewhere). With localized recovery the leader collects the contributions by messages
//! and sends the total, which every receiver passes on before it ends.

use std::time::{Duration, Instant};

pub use crate::events::RecoveryInfo;
use crate::events::{self, PoolEvent};
use crate::global_recovery::{self as recovery, GlobalRecovery};
use ftkv::codec;
use ftkv::fabric::{Fabric, FabricError};
use ftkv::{rt, Recovery, Store};

use crate::forkjoin::{self, Owed};
use crate::problem::Problem;
pub use crate::protocol::Interval;
pub use crate::protocol::Sums;
use crate::protocol::{self, sum_contributions, Command, Settings, Settle, Slot, Stored};
use crate::settle::{self, Effect, Settling};
use crate::uts::Counts;

/// The one tag of the pool's messages on its communicator.
const POOL_TAG: i32 = 11;

/// How the pool runs.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Copies of every checkpoint in the store.
    pub copies: usize,
    /// `None`: no checkpoints at all (the failure-free baseline; a failure is then fatal).
    pub interval: Option<Interval>,
    /// How long a worker runs tasks between two looks at the network.
    pub look: Look,
    /// How often each worker prints a `progress` line (`None`: never).
    pub progress: Option<Duration>,
    pub seed: u64,
    /// The store's suspicion bound ([`ftkv::Config::suspicion`]).
    pub suspicion: Duration,
    /// The store's data-path watchdog ([`ftkv::Config::watchdog`]). With a heartbeat detector
    /// that declares silent ranks failed it must outlast the suspicion bound: a put to a
    /// stopped or cut-off holder on another host waits until the detector declares it, and a
    /// shorter watchdog would end the healthy writer instead.
    pub watchdog: Duration,
    /// How a failure is recovered: [`Recovery::Global`] stops every worker for the store's
    /// global recovery; [`Recovery::Localized`] leaves every worker but the failed worker's
    /// buddy and its victims and thieves working (see the module's recovery paragraph).
    pub recovery: Recovery,
}

impl Default for PoolConfig {
    fn default() -> PoolConfig {
        PoolConfig {
            copies: 2,
            interval: Some(Interval::Time(Duration::from_millis(100))),
            look: Look::default(),
            progress: None,
            seed: 1,
            suspicion: ftkv::suspicion_from_environment(),
            watchdog: Duration::from_secs(2),
            recovery: Recovery::Global,
        }
    }
}

/// How often a worker stops running tasks to look at the network (steal requests, loot,
/// termination probes). Each look is an MPI call with its progress engine; across hosts that
/// means a `poll` of every socket, so looking after every few cheap tasks costs more than the
/// tasks. A victim answers a steal request at its next look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// After this many tasks (at least 1).
    Tasks(usize),
    /// After about this much work: the number of tasks per look follows the tasks' measured
    /// cost (halved or doubled at most per look, between 1 and [`MAX_BATCH`]).
    Every(Duration),
}

impl Default for Look {
    /// About every 500 µs of work.
    fn default() -> Look {
        Look::Every(Duration::from_micros(500))
    }
}

/// The most tasks a worker runs between two looks at the network under [`Look::Every`].
pub const MAX_BATCH: usize = 1 << 16;

impl Look {
    /// The tasks of the first batch.
    fn first_batch(self) -> usize {
        match self {
            Look::Tasks(n) => n.max(1),
            Look::Every(_) => 64,
        }
    }

    /// The tasks of the next batch, after a full batch of `ran` tasks took `took`.
    fn next_batch(self, ran: usize, took: Duration) -> usize {
        match self {
            Look::Tasks(n) => n.max(1),
            Look::Every(span) => {
                let per_task = took.as_secs_f64() / ran.max(1) as f64;
                let ideal =
                    if per_task > 0.0 { (span.as_secs_f64() / per_task) as usize } else { ran * 2 };
                ideal.clamp((ran / 2).max(1), ran * 2).min(MAX_BATCH)
            }
        }
    }
}

/// Everything that can end a worker. A store's or a fabric's error is part of the pool error's
/// text and not its [`source`](std::error::Error::source), so a chain printed with `{:#}` says
/// it once.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("store: {0}")]
    Store(ftkv::Error),
    #[error("fabric: {0}")]
    Fabric(FabricError),
    #[error("corrupt {0} in the store")]
    Corrupt(&'static str),
    #[error("a worker failed and checkpointing is off")]
    Unprotected,
    #[error("localized recovery needs checkpointing")]
    LocalizedWithoutCheckpoints,
}

impl From<ftkv::Error> for PoolError {
    fn from(e: ftkv::Error) -> PoolError {
        PoolError::Store(e)
    }
}

impl From<FabricError> for PoolError {
    fn from(e: FabricError) -> PoolError {
        PoolError::Fabric(e)
    }
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

struct Driver<'p, P: Problem, F: Fabric> {
    machine: protocol::Worker<'p, P>,
    config: &'p PoolConfig,
    store: Store<F>,
    comm: F,
    /// The worker id of each rank of `comm` (all workers until a global recovery shrinks it).
    ranks: Vec<i32>,
    /// The failed workers this worker's localized recovery has dealt with, and the store's
    /// failure counter when it last looked ([`Store::failures_noticed`]).
    known_failed: Vec<i32>,
    noticed: u64,
    /// The failed workers a localized run's end named ([`Command::End`]).
    ended_failed: Option<Vec<i32>>,
    started: Instant,
    /// Whether this worker took part in the one agreement of the current communicator (at the
    /// end of the computation, or when a recovery starts).
    agreed: bool,
    /// The workers the last [`Command::ReadAll`] made this worker adopt.
    adopted: Vec<i32>,
    last_progress: Instant,
    recoveries: Vec<RecoveryInfo>,
    /// A settle whose transaction call failed after computing a change (the store fell back
    /// to global recovery): the recovery's [`Store::finish_transactions`] decides it.
    in_doubt: Option<Settling<P>>,
}

/// Runs `problem` on every rank of `world` (collective) and returns the result on every
/// survivor. Workers may be killed at any moment; the survivors finish with the exact result
/// as long as no more than `copies − 1` workers fail between two recoveries.
///
/// The fabric `F` is MPI in production; on `ftkv::fabric::local` (ftkv's `local` feature) the
/// same protocol runs on threads, without MPI.
pub fn run<P: Problem, F: Fabric>(world: &F, problem: &P, config: &PoolConfig) -> Result<Outcome> {
    let started = rt::now();
    let kinds: &[&str] = if P::HANDS_OVER_RESULTS {
        &["checkpoint", "loot", "futures"]
    } else {
        &["checkpoint", "loot"]
    };
    let mut store_config = ftkv::Config::new(kinds.iter().copied(), config.copies);
    store_config.initial_capacity = 16 << 10;
    store_config.max_value = 8 << 20;
    store_config.suspicion = config.suspicion;
    store_config.watchdog = config.watchdog;
    if config.recovery == Recovery::Localized {
        if config.interval.is_none() {
            return Err(PoolError::LocalizedWithoutCheckpoints);
        }
        store_config = store_config.localized().with_transactions();
        store_config.max_value = 24 << 20;
        // Enough reserve holders per copy for every key's chain to reach every other worker
        // (at most 4 per copy): failures then fall back to global recovery only when a key
        // loses every copy.
        let others = (world.size() as usize).saturating_sub(1);
        store_config.spares = others.div_ceil(config.copies.max(1)).saturating_sub(1).clamp(1, 4);
    }
    let mut store = Store::create(world, store_config)?;
    let (comm, recovered_first) = communicator_after_recoveries(&mut store)?;
    let ranks = store.live().to_vec();
    let settings = Settings {
        interval: config.interval,
        batch: config.look.first_batch(),
        seed: config.seed,
        localized: config.recovery == Recovery::Localized,
    };
    let machine = protocol::Worker::new(problem, settings, store.worker(), store.workers());
    let mut driver = Driver {
        machine,
        config,
        store,
        comm,
        ranks,
        known_failed: Vec::new(),
        noticed: 0,
        ended_failed: None,
        started,
        agreed: false,
        adopted: Vec::new(),
        last_progress: rt::now(),
        recoveries: Vec::new(),
        in_doubt: None,
    };
    driver.start(recovered_first)?;
    let (total, sums) = driver.work()?;
    let workers = driver.store.workers() as i32;
    let failed = match driver.ended_failed.take() {
        Some(failed) => failed,
        None => (0..workers).filter(|w| !driver.machine.live().contains(w)).collect(),
    };
    let k = driver.machine.counters();
    let stats = Stats {
        tasks: k.tasks,
        steals: k.steals,
        checkpoints: k.checkpoints,
        store_bytes: k.store_bytes,
        recoveries: driver.recoveries,
    };
    Ok(Outcome {
        failed,
        total,
        tasks: sums[0],
        checkpoints: sums[1],
        store_bytes: sums[2],
        stats,
        elapsed: rt::since(started),
    })
}

/// The store's communicator for the pool's messages, after the recoveries that failures since
/// the store's creation need (a worker may die before the pool starts), and whether one ran.
fn communicator_after_recoveries<F: Fabric>(store: &mut Store<F>) -> Result<(F, bool)> {
    let mut recovered = false;
    loop {
        match store.communicator() {
            Ok(comm) => return Ok((comm, recovered)),
            Err(e) if e.needs_recovery() => match store.recover() {
                Ok(_) => recovered = true,
                Err(e) if e.needs_recovery() => {}
                Err(e) => return Err(e.into()),
            },
            Err(e) => return Err(e.into()),
        }
    }
}

impl<P: Problem, F: Fabric> Driver<'_, P, F> {
    fn now(&self) -> Duration {
        rt::since(self.started)
    }

    /// The first checkpoint, on every worker, before any work. When workers died before the
    /// pool started and the store `recovered_first`, the survivors start the way they rejoin
    /// after a recovery (the others, whose next collective that recovery fails, rejoin after
    /// joining it): the dead workers are adopted at their initial state (they did no work
    /// anybody saw).
    fn start(&mut self, recovered_first: bool) -> Result<()> {
        if recovered_first {
            return match self.rejoin() {
                Err(e) if e.needs_recovery() => self.recover(),
                rejoined => rejoined,
            };
        }
        let commands = self.machine.start();
        match self.execute(commands) {
            Ok(_) => Ok(()),
            // The recovery's rejoin writes a fresh checkpoint and synchronises in place of the
            // start: starting again would add a barrier that the others, who started before
            // the failure and rejoined from their work, never join.
            Err(e) if e.needs_recovery() => self.recover(),
            Err(e) => Err(e),
        }
    }

    /// Steps until termination, recovering from every failure on the way.
    fn work(&mut self) -> Result<Sums> {
        loop {
            match self.step() {
                Ok(Some(sums)) => return Ok(sums),
                Ok(None) => {}
                Err(e) if e.needs_recovery() => {
                    if self.localized() {
                        if let Some(sums) = self.total_arrived()? {
                            return Ok(sums);
                        }
                        events::emit(PoolEvent::Warning(format!("global recovery after: {e}")));
                    }
                    self.recover()?
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Localized recovery, about to fall back to global recovery: the end's total if it
    /// arrived already (then the computation is over, and the workers that sent or passed it
    /// on may have ended: a global recovery would wait for them). The other messages that
    /// arrived are dropped, as the global recovery's revoke would drop them; a receive that
    /// fails (the pool's communicator revoked by a worker that started the recovery) ends the
    /// look.
    fn total_arrived(&mut self) -> Result<Option<Sums>> {
        while let Ok(Some(message)) = self.receive() {
            let total = codec::decode(&message.data)
                .filter(|_| message.tag == POOL_TAG)
                .filter(|m| matches!(m, protocol::PoolMessage::Total(..)));
            if let Some(total) = total {
                let source = self.ranks[message.source as usize];
                let commands = self.machine.on_message(source, total, self.now());
                return self.execute(commands);
            }
        }
        Ok(None)
    }

    /// The messages that arrived, then one tick. `Some` once the computation is over.
    fn step(&mut self) -> Result<Option<Sums>> {
        if self.store.needs_recovery() {
            return Err(ftkv::Error::RecoveryNeeded { failed: Vec::new() }.into());
        }
        if let Some(sums) = self.notice_failures()? {
            return Ok(Some(sums));
        }
        while let Some(message) = self.receive()? {
            if message.tag != POOL_TAG {
                continue;
            }
            let decoded = codec::decode(&message.data).ok_or(PoolError::Corrupt("message"))?;
            let source = self.ranks[message.source as usize];
            let commands = self.machine.on_message(source, decoded, self.now());
            if let Some(sums) = self.execute(commands)? {
                return Ok(Some(sums));
            }
        }
        let commands = self.tick();
        if self.machine.is_idle() {
            rt::sleep(Duration::from_micros(50));
        }
        let sums = self.execute(commands)?;
        self.report_progress();
        Ok(sums)
    }

    /// One tick of the machine; a tick that ran a full batch of tasks sets the next batch
    /// from its duration ([`Look::next_batch`]).
    fn tick(&mut self) -> Vec<Command<P::Task>> {
        let (batch, tasks_before, started) =
            (self.machine.batch(), self.machine.counters().tasks, rt::now());
        let commands = self.machine.tick(self.now());
        let ran = (self.machine.counters().tasks - tasks_before) as usize;
        if ran == batch {
            self.machine.set_batch(self.config.look.next_batch(ran, rt::since(started)));
        }
        commands
    }

    /// Executes `commands` in order, stopping at the first error. `Some` when one of them
    /// finished the computation.
    fn execute(&mut self, commands: Vec<Command<P::Task>>) -> Result<Option<Sums>> {
        for command in commands {
            match command {
                Command::Send { to, message } => self.send(to, &message)?,
                Command::Put { slot, bytes } => {
                    self.store.put(slot.key(self.machine.me()), &bytes)?
                }
                Command::DeleteLoot { owner } => self.delete_loot(owner)?,
                Command::Sync => self.store.sync()?,
                Command::ReadAll => {
                    let stored = self.read_everyone()?;
                    let (more, adopted) = self.machine.on_stored(stored, self.now());
                    self.adopted = adopted;
                    if let Some(sums) = self.execute(more)? {
                        return Ok(Some(sums));
                    }
                }
                Command::Failpoint(name) => self.comm.failpoint(name),
                Command::HandOver { owner, results } => self.hand_over(owner, &results)?,
                Command::EmptyFutures => {
                    let key = Slot::Futures.key(self.machine.me());
                    self.store.put_handed(key, &forkjoin::encode_handed(&[]))?
                }
                Command::Finish => return self.finish().map(Some),
                Command::Settle(settle) => self.settle(settle)?,
                Command::End(words, failed) => {
                    self.ended_failed = Some(failed);
                    return Ok(Some(sum_contributions(&words)));
                }
            }
        }
        Ok(None)
    }

    fn localized(&self) -> bool {
        self.config.recovery == Recovery::Localized
    }

    /// Sends `message` to worker `to`. With localized recovery a send that fails because `to`
    /// failed is dropped: the failure itself is dealt with once the store reports it.
    /// The end's total is passed on best effort: every receiver passes it on too.
    fn send(&mut self, to: i32, message: &protocol::PoolMessage<P::Task>) -> Result<()> {
        let rank = self.ranks.iter().position(|&w| w == to).expect("a worker of the communicator");
        match self.comm.send(&codec::encode(message), rank as i32, POOL_TAG) {
            Err(FabricError::ProcFailed { .. }) if self.localized() => Ok(()),
            Err(_) if matches!(message, protocol::PoolMessage::Total(..)) => Ok(()),
            sent => Ok(sent?),
        }
    }

    /// The next message, if one arrived. With localized recovery a receive that fails for a
    /// failure (an any-source probe while a failure is not acknowledged, or a message whose
    /// sender died before it fully arrived) acknowledges the failures and tries again, a few
    /// times; a message of a failed sender is dropped (the machine ignores those anyway).
    fn receive(&mut self) -> Result<Option<ftkv::fabric::Message>> {
        const ATTEMPTS: usize = 4;
        for _ in 0..ATTEMPTS {
            match self.comm.try_receive() {
                Err(FabricError::ProcFailed { .. }) if self.localized() => {
                    self.comm.failed_ranks()?;
                }
                received => return Ok(received?),
            }
        }
        Ok(None)
    }

    /// Localized recovery: hands the failures the store learned of since the last look to the
    /// machine and runs this worker's part ([`protocol::Worker::on_failures`]); first resolves
    /// the open transactions of failed coordinators whose backup this worker is.
    fn notice_failures(&mut self) -> Result<Option<Sums>> {
        if !self.localized() || self.store.failures_noticed() == self.noticed {
            return Ok(None);
        }
        self.noticed = self.store.failures_noticed();
        let failed = self.store.failed();
        if failed == self.known_failed {
            return Ok(None);
        }
        let started = rt::now();
        let newly: Vec<i32> =
            failed.iter().copied().filter(|w| !self.known_failed.contains(w)).collect();
        self.known_failed = failed.clone();
        events::emit(PoolEvent::Recovering);
        self.store.resolve_transactions()?;
        let commands = self.machine.on_failures(&failed, self.now());
        let adopted = commands
            .iter()
            .filter_map(|c| match c {
                Command::Settle(Settle::Adopt { dead }) => Some(*dead),
                _ => None,
            })
            .collect();
        let sums = self.execute(commands)?;
        let info = RecoveryInfo {
            localized: true,
            failed: newly,
            adopted,
            store_ms: 0.0,
            total_ms: rt::since(started).as_secs_f64() * 1e3,
        };
        events::emit(PoolEvent::Recovered(info.clone()));
        self.recoveries.push(info);
        Ok(sums)
    }

    /// Runs one [`Settle`]: carries out the commands of its engine ([`Settling`]). Fails with
    /// the first store error, which leaves the settle in doubt when its transaction call failed
    /// after computing a change (the recovery's [`Driver::rejoin`] finishes it), or when the
    /// store holds a corrupt loot or checkpoint.
    fn settle(&mut self, settle: Settle) -> Result<()> {
        let mut settling = Settling::new(settle);
        let mut event = settle::Event::Start;
        let mut error = None;
        loop {
            event = match settling.next(event, &self.machine) {
                settle::Command::ReadLoot { owner } => {
                    settle::Event::LootRead(self.store.get(Slot::Loot.key(owner))?)
                }
                settle::Command::ReadCheckpoint { owner } => {
                    settle::Event::CheckpointRead(self.store.get(Slot::Checkpoint.key(owner))?)
                }
                settle::Command::Transact(txn) => {
                    let machine = &self.machine;
                    let engine = &mut settling;
                    match self.store.transaction(&txn, |reads| engine.writes(reads, machine)) {
                        Ok(outcome) => settle::Event::Transacted(outcome),
                        Err(e) => {
                            error = Some(e);
                            settle::Event::TransactionFailed
                        }
                    }
                }
                settle::Command::Write(_) => {
                    unreachable!("a settle's writes are computed inside its transaction")
                }
                settle::Command::TakeEffect(effect) => {
                    self.take_effect(effect);
                    return Ok(());
                }
                settle::Command::Corrupt(what) => return Err(PoolError::Corrupt(what)),
                settle::Command::RememberInDoubt => {
                    self.in_doubt = Some(settling);
                    return Err(error.expect("a failed transaction call's error").into());
                }
                settle::Command::Fail => {
                    return Err(error.expect("a failed transaction call's error").into())
                }
            }
        }
    }

    /// Applies what a settle changes on this worker.
    fn take_effect(&mut self, effect: Effect<P::Task>) {
        match effect {
            Effect::Settled { settle, state } => self.machine.settled(settle, *state),
            Effect::ClearPending => self.machine.clear_pending(),
            Effect::Unchanged => {}
        }
    }

    /// Appends `results` to `owner`'s futures entry, which `owner` lent this worker: reads it
    /// and writes it back with them (the thief writing its victim's data). Returns once every
    /// copy holds the new entry; on an error the entry holds the old value or the new one
    /// (the results stay owed by this worker either way, and are handed over again).
    fn hand_over(&mut self, owner: i32, results: &[Owed]) -> Result<()> {
        let key = Slot::Futures.key(owner);
        let stored = self.store.get(key)?;
        let mut entry = match stored.as_deref() {
            Some(bytes) => {
                forkjoin::decode_handed(bytes).ok_or(PoolError::Corrupt("futures entry"))?
            }
            None => Vec::new(),
        };
        entry.extend_from_slice(results);
        self.store.put_handed(key, &forkjoin::encode_handed(&entry))?;
        Ok(())
    }

    fn delete_loot(&mut self, owner: i32) -> Result<()> {
        let key = Slot::Loot.key(owner);
        if owner == self.machine.me() {
            self.store.delete(key)?;
        } else {
            self.store.delete_handed(key)?;
        }
        Ok(())
    }

    fn report_progress(&mut self) {
        let Some(every) = self.config.progress else { return };
        if rt::since(self.last_progress) >= every {
            self.last_progress = rt::now();
            let (tasks, nodes) = (self.machine.counters().tasks, self.machine.counts().nodes);
            events::emit(PoolEvent::Progress { tasks, nodes });
        }
    }

    /// Sums the survivors' results, tasks, checkpoints and store bytes. Every survivor then
    /// agrees on whether all of them got the sums; anything else, also another survivor's
    /// recovery starting, makes all of them recover and end again.
    fn finish(&mut self) -> Result<Sums> {
        let bytes: Vec<u8> =
            self.machine.contribution().iter().flat_map(|w| w.to_le_bytes()).collect();
        let gathered = self.comm.allgather(&bytes);
        self.agreed = true;
        let agreed = self.comm.agree(gathered.is_ok() as u32)?;
        let all = gathered?;
        if agreed.value != 1 {
            return Err(ftkv::Error::RecoveryNeeded { failed: Vec::new() }.into());
        }
        let words: Vec<u64> =
            all.chunks(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        Ok(sum_contributions(&words))
    }

    /// Recovers until a recovery completes without another failure: carries out the commands
    /// of the recovery loop's engine ([`GlobalRecovery`]). Fails with the first error that is
    /// not another failure.
    fn recover(&mut self) -> Result<()> {
        let started = rt::now();
        let mut engine = GlobalRecovery::default();
        let mut event = recovery::Event::Failed;
        let mut error = None;
        loop {
            event = match engine.next(event) {
                recovery::Command::Revoke => {
                    self.revoke_communicators();
                    recovery::Event::Revoked
                }
                recovery::Command::JoinAgreement => {
                    self.join_agreement();
                    recovery::Event::Agreed
                }
                recovery::Command::RecoverStore => {
                    events::emit(PoolEvent::Recovering);
                    // A failure met at the recovery's end (the replaced windows' collective
                    // free) is another failure: the store needs the next one.
                    let recovered = self.store.recover().map(|report| recovery::StoreRecovered {
                        failed: report.failed,
                        store_ms: report.duration.as_secs_f64() * 1e3,
                    });
                    recovery::Event::StoreRecovered(interrupted(recovered, &mut error))
                }
                recovery::Command::Rejoin => {
                    recovery::Event::Rejoined(interrupted(self.rejoin(), &mut error))
                }
                recovery::Command::Recovered(report) => {
                    let info = RecoveryInfo {
                        localized: false,
                        failed: report.failed,
                        adopted: std::mem::take(&mut self.adopted),
                        store_ms: report.store_ms,
                        total_ms: rt::since(started).as_secs_f64() * 1e3,
                    };
                    events::emit(PoolEvent::Recovered(info.clone()));
                    self.recoveries.push(info);
                    return Ok(());
                }
                recovery::Command::Fail => {
                    return Err(error.expect("the engine fails on an error the driver kept"))
                }
            }
        }
    }

    /// Revokes the pool's communicator and interrupts the store's; a failure to do either is
    /// a warning (the communicator may already be revoked).
    fn revoke_communicators(&mut self) {
        if let Err(e) = self.comm.revoke() {
            events::emit(PoolEvent::Warning(format!("revoking the pool communicator: {e}")));
        }
        if let Err(e) = self.store.interrupt() {
            events::emit(PoolEvent::Warning(format!("revoking the store communicator: {e}")));
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

    /// After the store recovered: a new communicator, the transactions the failures left half
    /// done finished (a settle of this worker's among them takes effect if it committed),
    /// then the machine's rejoin commands (fresh checkpoint, barrier, everyone's state, this
    /// worker's part of the plan).
    fn rejoin(&mut self) -> Result<()> {
        self.comm = self.store.communicator()?;
        // The new communicator's one agreement is still to come, also when a failure ends
        // this rejoin before its end: the next round of the recovery loop joins it.
        self.agreed = false;
        let decision = self.store.finish_transactions()?;
        if let Some(mut settling) = self.in_doubt.take() {
            let effect = settling.effect_of(decision, &self.machine);
            self.take_effect(effect);
        }
        let live = self.store.live().to_vec();
        self.ranks = live.clone();
        self.known_failed = self.store.failed();
        self.noticed = self.store.failures_noticed();
        let now = self.now();
        let commands = self.machine.rejoin(&live, now).ok_or(PoolError::Unprotected)?;
        self.execute(commands)?;
        Ok(())
    }

    /// Every worker's checkpoint, loot key and (with futures) futures entry, as the store has
    /// them after a recovery.
    fn read_everyone(&mut self) -> Result<Stored<P::Task>> {
        let workers = self.store.workers() as i32;
        let (mut checkpoints, mut loots, mut futures) = (Vec::new(), Vec::new(), Vec::new());
        for w in 0..workers {
            checkpoints.push(self.store.get(Slot::Checkpoint.key(w))?);
            loots.push(self.store.get(Slot::Loot.key(w))?);
            if P::HANDS_OVER_RESULTS {
                futures.push(self.store.get(Slot::Futures.key(w))?);
            }
        }
        Stored::decode(&checkpoints, &loots, &futures).map_err(PoolError::Corrupt)
    }
}

/// A step of the recovery loop as its engine takes it: another failure, or an error the
/// driver keeps in `error` (the engine then says to fail with it).
fn interrupted<T, E: Into<PoolError>>(
    step: std::result::Result<T, E>,
    error: &mut Option<PoolError>,
) -> std::result::Result<T, recovery::Interrupted> {
    step.map_err(|e| {
        let e = e.into();
        if e.needs_recovery() {
            recovery::Interrupted::AnotherFailure
        } else {
            *error = Some(e);
            recovery::Interrupted::Fatal
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `: `-separated parts of `text` that occur more than once.
    fn repeated_segments(text: &str) -> Vec<&str> {
        let segments: Vec<&str> = text.split(": ").collect();
        let repeated = |s: &&str| segments.iter().filter(|t| *t == s).count() > 1;
        segments.iter().copied().filter(repeated).collect()
    }

    #[test]
    fn the_batch_follows_the_tasks_cost_towards_the_span_at_most_halved_or_doubled() {
        let us = Duration::from_micros;
        let every = Look::Every(us(500));
        let table = [
            // (look, tasks that ran, how long they took, next batch)
            (Look::Tasks(16), 16, us(9_000), 16),
            (Look::Tasks(0), 1, us(1), 1),
            (every, 400, us(400), 500),
            (every, 64, us(64), 128),
            (every, 1000, us(4_000), 500),
            (every, 1, us(10_000), 1),
            (every, 100, Duration::ZERO, 200),
            (every, MAX_BATCH, us(1), MAX_BATCH),
        ];
        for (look, ran, took, next) in table {
            assert_eq!(look.next_batch(ran, took), next, "{look:?}, {ran} tasks in {took:?}");
        }
        assert_eq!(every.first_batch(), 64);
        assert_eq!(Look::Tasks(0).first_batch(), 1);
    }

    #[test]
    fn every_part_of_a_worker_s_error_is_said_once() {
        let revoked = FabricError::Revoked { op: "put" };
        let table = [
            (
                PoolError::from(ftkv::Error::from(revoked.clone())),
                "store: fabric: put: the communicator was revoked",
            ),
            (PoolError::from(ftkv::Error::Closed), "store: the store is closed"),
            (PoolError::from(revoked), "fabric: put: the communicator was revoked"),
        ];
        for (error, want) in table {
            let chain = format!("{:#}", anyhow::Error::from(error).context("worker 3"));
            assert_eq!(chain, format!("worker 3: {want}"));
            assert_eq!(repeated_segments(&chain), Vec::<&str>::new(), "{chain}");
        }
    }
}
