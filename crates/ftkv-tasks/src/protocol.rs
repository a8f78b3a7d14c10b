//! The pool's protocols as one sans-I/O state machine per worker: steal, loot, termination
//! and the recovery plan. A [`Worker`] never touches a network, a store or a clock: it takes
//! events (a tick at a time, a message, a recovery's new live set, what the store holds) and
//! returns [`Command`]s for its driver to execute in order. [`crate::pool`] executes them on a
//! [`ftkv::fabric::Fabric`] and a [`ftkv::Store`], the in-process fabric or MPI, on threads or
//! on the deterministic world of `ftkv_sim::world` (`crate::sim_world`).
//!
//! **Execution contract.** A driver executes a command list front to back and stops at the
//! first command that fails because a process failed; it then recovers (every survivor
//! recovers the store, then calls [`Worker::rejoin`]) and drops the rest of the list. The
//! machine's state is already the state after the whole list: every command list is written so
//! that any prefix of it, followed by a recovery, keeps the computation exact:
//! - a victim's list is: put the loot key, put a checkpoint without the loot, send the loot;
//! - a thief's list is: put a checkpoint with the loot, acknowledge;
//! - the acknowledgement's list deletes the loot key;
//! - [`Worker::rejoin`] writes the loot still in flight again, then a fresh checkpoint, then
//!   synchronises (a barrier: every survivor's fresh checkpoint is in the store before anyone
//!   reads) and reads everyone's state ([`Command::ReadAll`]); [`Worker::on_stored`] applies
//!   this worker's part of [`crate::state::plan`] and checkpoints it before deleting loot keys.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::forkjoin::{decode_handed, start_ready, JoinRef, Owed, Work};
use crate::problem::Problem;
use crate::state::{buddy, plan, Checkpoint, Loot, Seen};
use crate::uts::Counts;

/// The shortest time between two termination waves.
const WAVE_GAP: Duration = Duration::from_millis(1);

/// How long a worker waits for the acknowledgement of a fork-join result it sent before it
/// sends every unacknowledged result again.
const RESEND_GAP: Duration = Duration::from_millis(50);

/// The results a futures entry holds at most: a holder that applied this many since it last
/// emptied the entry checkpoints and empties it at once (an idle holder runs no periodic
/// checkpoint, and every hand-over rewrites the whole entry).
const ENTRY_LIMIT: usize = 64;

/// When a worker writes its periodic checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interval {
    Time(Duration),
    Tasks(u64),
}

/// What the protocol needs to know of the pool's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// `None`: no checkpoints (a failure is then fatal).
    pub interval: Option<Interval>,
    /// Tasks run per tick.
    pub batch: usize,
    pub seed: u64,
    /// Localized recovery: the end is gathered by messages to the leader ([`PoolMessage::
    /// Collect`]) instead of a collective [`Command::Finish`], which a communicator with
    /// failed members cannot complete.
    pub localized: bool,
}

/// A message between two workers of the pool (one tag; [`ftkv::codec`] on the wire).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum PoolMessage<T> {
    /// An idle worker asks for work.
    Steal,
    /// A victim's answer: the steal id and the tasks, or `None` (a refusal).
    Loot(Option<(u64, Vec<T>)>),
    /// The thief checkpointed the loot of this steal id.
    Ack(u64),
    /// The leader's termination probe of this wave id.
    Probe(u64),
    /// An answer to a probe: wave id, busy, loot sent to and received from live workers, and
    /// the answering worker's view (a digest of the workers it knows failed).
    Status([u64; 5]),
    /// The computation is over.
    Done,
    /// Localized recovery's end: the leader, after two quiet waves, asks for every live
    /// worker's [`Worker::contribution`] (round id).
    Collect(u64),
    /// An answer to [`PoolMessage::Collect`]: round id, view, the six contribution words.
    Contribution(u64, u64, [u64; 6]),
    /// The summed contributions and the failed workers every contribution's view named; each
    /// worker that receives it passes it on to the others before it ends.
    Total([u64; 6], Vec<i32>),
    /// A fork-join result for a frame the receiver holds ([`crate::forkjoin::Owed`]).
    Join(JoinRef, Counts),
    /// The receiver of a [`PoolMessage::Join`] checkpointed these results applied (or found
    /// them applied already), or, after a [`PoolMessage::Return`], applied them with its
    /// futures entry holding them: their sender may forget them.
    Joined(Vec<JoinRef>),
    /// Futures: a worker that owes results to frames the receiver holds asks for the
    /// receiver's futures entry.
    Lock,
    /// Futures: the receiver's futures entry is lent to the asking worker, and to nobody else
    /// until it returns it (the outer lock of the hand-over).
    Lent,
    /// Futures: the borrower gives the futures entry back, with the results it wrote into it.
    Return(Vec<Owed>),
}

/// One of a worker's store keys (the futures entry only for programs with futures).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Slot {
    Checkpoint = 0,
    Loot = 1,
    /// Results written into this worker's futures entry by the workers that owed them
    /// (future-based cooperation only; [`crate::forkjoin::Futures`]).
    Futures = 2,
}

impl Slot {
    /// This slot's store key of worker `owner`.
    pub fn key(self, owner: i32) -> ftkv::Key {
        ftkv::Key::new(owner, self as u16)
    }
}

/// What a worker asks its driver to do, in order (see the module's execution contract).
#[derive(Debug, Clone, PartialEq)]
pub enum Command<T> {
    /// Send to a live worker (by worker id; the driver maps it to its communicator's rank).
    Send { to: i32, message: PoolMessage<T> },
    /// Blocking put of this worker's own key.
    Put { slot: Slot, bytes: Vec<u8> },
    /// Blocking delete of `owner`'s loot key (this worker's own, or one it resolves for a dead
    /// victim).
    DeleteLoot { owner: i32 },
    /// A barrier over the live workers through the store.
    Sync,
    /// Read every worker's checkpoint, loot key and (with futures) futures entry and hand them
    /// to [`Worker::on_stored`].
    ReadAll,
    /// A named failure-injection point.
    Failpoint(&'static str),
    /// Futures: append `results` to `owner`'s futures entry, which `owner` lent this worker:
    /// read it, then write it with [`ftkv::Store::put_handed`] (the thief writing its victim's
    /// data).
    HandOver { owner: i32, results: Vec<Owed> },
    /// Futures: write this worker's own futures entry empty (with
    /// [`ftkv::Store::put_handed`], since others wrote it), once a checkpoint holds every
    /// result it held.
    EmptyFutures,
    /// The leader announced the end: gather the results ([`Worker::contribution`]).
    Finish,
    /// Localized recovery: move a failed worker's stored state into this one's, in one store
    /// transaction (see [`Settle`]).
    Settle(Settle),
    /// Localized recovery's end: the summed contributions (as [`Worker::contribution`]'s
    /// words) and the failed workers, the same on every survivor.
    End([u64; 6], Vec<i32>),
}

/// This worker's part in a localized recovery after a failure, each run by its driver as one
/// store transaction (all of it lands or none; a backup finishes it if this worker dies
/// midway), so that a second failure at any point neither loses nor doubles a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// As the failed worker's buddy: add its checkpoint (pool, counts) to this worker's and
    /// write its checkpoint back emptied and marked adopted ([`Checkpoint::adopted_by`]), so
    /// that it is adopted exactly once. [`Worker::with_adopted`] computes both.
    Adopt { dead: i32 },
    /// The failed `victim`'s loot key, resolved by its thief when that one lives, else by the
    /// victim's buddy: its tasks go to the resolver when the victim's checkpoint left them
    /// out and the thief's state does not hold them ([`Worker::with_loot`]); the key is
    /// deleted in the same transaction.
    Loot { victim: i32 },
    /// This worker's own loot in flight to a `thief` that failed: taken back unless the
    /// thief's stored checkpoint holds it ([`Worker::with_taken_back`]); the loot key is
    /// deleted in the same transaction.
    TakeBack { thief: i32 },
}

/// Counters of one worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub tasks: u64,
    pub steals: u64,
    pub checkpoints: u64,
    pub store_bytes: u64,
}

/// What the store holds for every worker, by worker id, decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored<T> {
    pub checkpoints: Vec<Option<Checkpoint<T>>>,
    pub loots: Vec<Option<Loot<T>>>,
    /// Every worker's futures entry (empty without futures).
    pub handed: Vec<Vec<Owed>>,
}

impl<T: Copy + serde::Serialize + serde::de::DeserializeOwned> Stored<T> {
    /// Decodes every worker's stored checkpoint, loot key and futures entry (`futures` empty:
    /// none are kept); `Err` names what is corrupt.
    pub fn decode(
        checkpoints: &[Option<Vec<u8>>],
        loots: &[Option<Vec<u8>>],
        futures: &[Option<Vec<u8>>],
    ) -> Result<Stored<T>, &'static str> {
        let checkpoints: Vec<Option<Checkpoint<T>>> = checkpoints
            .iter()
            .map(|b| b.as_deref().map(|b| Checkpoint::decode(b).ok_or("checkpoint")).transpose())
            .collect::<Result<_, _>>()?;
        let loots = loots
            .iter()
            .map(|b| b.as_deref().map(|b| Loot::decode(b).ok_or("loot")).transpose())
            .collect::<Result<_, _>>()?;
        let mut handed: Vec<Vec<Owed>> = futures
            .iter()
            .map(|b| b.as_deref().map_or(Some(Vec::new()), decode_handed).ok_or("futures entry"))
            .collect::<Result<_, _>>()?;
        handed.resize(checkpoints.len(), Vec::new());
        Ok(Stored { checkpoints, loots, handed })
    }
}

/// The leader's termination wave in flight: sums of the answers so far.
struct Wave {
    id: u64,
    answers: usize,
    busy: u64,
    sent: u64,
    received: u64,
    /// Whether every answer so far came from a worker with the leader's view of failures.
    same_view: bool,
}

/// The leader's collection of contributions at the end of a localized run.
struct Collection {
    round: u64,
    answers: usize,
    words: Vec<u64>,
}

/// A loot this worker gave away and that its thief has not acknowledged yet.
struct Pending<T> {
    steal_id: u64,
    /// The thief's worker id.
    thief: i32,
    tasks: Vec<T>,
}

/// One worker of the pool, as a state machine.
pub struct Worker<'p, P: Problem> {
    problem: &'p P,
    settings: Settings,
    me: i32,
    live: Vec<i32>,
    state: Checkpoint<P::Task>,
    steal_counter: u64,
    pending: Option<Pending<P::Task>>,
    asking: Option<i32>,
    /// Loot sent to and received from each worker (by worker id) on the current
    /// communicator; the termination waves count live workers' only.
    sent_to: Vec<u64>,
    received_from: Vec<u64>,
    wave: Option<Wave>,
    waves: u64,
    last_wave: Duration,
    quiet_wave: Option<(u64, u64)>,
    collection: Option<Collection>,
    /// Failed workers a global recovery's plan dealt with (adopted and their loot resolved,
    /// without emptying their checkpoints): a later localized recovery leaves them alone.
    settled_globally: Vec<i32>,
    done: bool,
    rng: SmallRng,
    last_checkpoint: (Duration, u64),
    /// When this worker last sent every unacknowledged fork-join result (`None`: at its
    /// next tick, after a failure changed who holds which frames).
    last_resend: Option<Duration>,
    /// Futures: the worker this one's futures entry is lent to, and those waiting for it.
    lent_to: Option<i32>,
    waiting_for_entry: Vec<i32>,
    /// Futures: the holder whose futures entry this worker asked for or writes.
    handing: Option<i32>,
    /// Futures: results were written into this worker's futures entry since it last emptied
    /// it, and how many.
    entry_written: bool,
    entry_results: usize,
    counters: Counters,
}

type Commands<T> = Vec<Command<T>>;

/// An adoption's two new checkpoints: the buddy's with the failed worker's state added, and
/// the failed worker's emptied.
pub type Adoption<T> = (Checkpoint<T>, Checkpoint<T>);

impl<'p, P: Problem> Worker<'p, P> {
    /// Worker `me` of `workers`, all alive, in its initial state.
    pub fn new(problem: &'p P, settings: Settings, me: i32, workers: usize) -> Self {
        Worker {
            problem,
            settings,
            me,
            live: (0..workers as i32).collect(),
            state: Checkpoint::initial(problem, me, workers),
            steal_counter: 0,
            pending: None,
            asking: None,
            sent_to: vec![0; workers],
            received_from: vec![0; workers],
            wave: None,
            waves: 0,
            last_wave: Duration::ZERO,
            quiet_wave: None,
            collection: None,
            settled_globally: Vec::new(),
            done: false,
            rng: SmallRng::seed_from_u64(settings.seed ^ ((me as u64) << 40)),
            last_checkpoint: (Duration::ZERO, 0),
            last_resend: Some(Duration::ZERO),
            lent_to: None,
            waiting_for_entry: Vec::new(),
            handing: None,
            entry_written: false,
            entry_results: 0,
            counters: Counters::default(),
        }
    }

    pub fn me(&self) -> i32 {
        self.me
    }

    /// The live workers by rank (worker ids).
    pub fn live(&self) -> &[i32] {
        &self.live
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// The tasks each tick runs.
    pub fn batch(&self) -> usize {
        self.settings.batch
    }

    /// Sets the tasks each later tick runs (at least 1).
    pub fn set_batch(&mut self, batch: usize) {
        self.settings.batch = batch.max(1);
    }

    /// Tree nodes (or boards) counted so far by this worker's state.
    pub fn counts(&self) -> Counts {
        self.state.counts
    }

    /// Whether this worker has no task to run (its driver may pause before the next tick).
    pub fn is_idle(&self) -> bool {
        !self.has_tasks()
    }

    /// Whether this worker has tasks in its pool or continuations ready to become tasks.
    fn has_tasks(&self) -> bool {
        !self.state.pool.is_empty() || !self.state.joins.ready.is_empty()
    }

    fn checkpointing(&self) -> bool {
        self.settings.interval.is_some()
    }

    /// Whether this worker leads the termination waves (the first live worker).
    fn leads(&self) -> bool {
        self.live.first() == Some(&self.me)
    }

    /// A digest of the workers this worker knows failed: equal views, equal failed sets.
    fn view(&self) -> u64 {
        self.failed()
            .into_iter()
            .fold(0xcbf2_9ce4_8422_2325, |h, w| (h ^ (w as u64 + 1)).wrapping_mul(0x100_0000_01b3))
    }

    /// The first checkpoint, before any work, and a barrier.
    pub fn start(&mut self) -> Commands<P::Task> {
        let mut commands = self.checkpoint(Duration::ZERO);
        commands.push(Command::Sync);
        commands
    }

    /// One round at time `now`: a batch of tasks (and the periodic checkpoint) or a steal
    /// request, then the leader's termination wave; [`Command::Finish`] once it is over.
    pub fn tick(&mut self, now: Duration) -> Commands<P::Task> {
        let mut commands = Vec::new();
        if !self.has_tasks() {
            commands.extend(self.ask_for_work());
        } else {
            commands.extend(self.run_batch());
            commands.extend(self.maybe_checkpoint(now));
        }
        commands.extend(self.resend_owed(now));
        commands.extend(self.termination_wave(now));
        if self.done && !self.settings.localized {
            commands.push(Command::Finish);
        }
        commands
    }

    /// Runs a batch of tasks and sends the fork-join results they owe to other workers.
    fn run_batch(&mut self) -> Commands<P::Task> {
        let owed = self.state.joins.owed.len();
        let problem = self.problem;
        let state = &mut self.state;
        let mut work = Work {
            me: self.me,
            workers: state.received.len(),
            pool: &mut state.pool,
            counts: &mut state.counts,
            joins: &mut state.joins,
        };
        start_ready(problem, &mut work);
        for _ in 0..self.settings.batch {
            let Some(task) = work.pool.pop() else { break };
            problem.run_on(&task, &mut work);
            self.counters.tasks += 1;
        }
        self.route_owed(owed)
    }

    /// The worker that holds the frames `creator` opened: the creator while it lives, else the
    /// buddy that adopted them (buddies follow the ring, so a buddy's own buddy is the dead
    /// creator's buddy once the first buddy died too).
    fn holder(&self, creator: i32) -> i32 {
        if self.live.contains(&creator) {
            creator
        } else {
            buddy(creator, &self.live, self.state.received.len())
        }
    }

    /// Sends the owed fork-join results from index `from` on to their frames' holders; one
    /// this worker holds itself (it adopted the frame's creator) is applied here instead, or
    /// dropped when its frame closed already.
    fn route_owed(&mut self, from: usize) -> Commands<P::Task> {
        let mut commands = Vec::new();
        let mut at = from;
        while let Some(&owed) = self.state.joins.owed.get(at) {
            let to = self.holder(owed.to.frame.creator);
            if to != self.me {
                if !P::HANDS_OVER_RESULTS {
                    commands.push(Command::Failpoint("join_before_send"));
                    let message = PoolMessage::Join(owed.to, owed.counts);
                    commands.push(Command::Send { to, message });
                } else if self.handing.is_none() {
                    self.handing = Some(to);
                    commands.push(Command::Send { to, message: PoolMessage::Lock });
                }
                at += 1;
                continue;
            }
            self.state.joins.owed.remove(at);
            self.state.joins.accept(owed.to, owed.counts, &mut self.state.counts);
        }
        commands
    }

    /// Every unacknowledged fork-join result again, [`RESEND_GAP`] after the last time (its
    /// holder may have ignored it, not holding the frame yet, or died) or right after a
    /// failure.
    fn resend_owed(&mut self, now: Duration) -> Commands<P::Task> {
        let due = self.last_resend.is_none_or(|t| now.saturating_sub(t) >= RESEND_GAP);
        if !due || self.state.joins.owed.is_empty() {
            return Vec::new();
        }
        self.last_resend = Some(now);
        self.handing = None;
        self.route_owed(0)
    }

    /// A fork-join result from `source` for a frame this worker should hold: applied if its
    /// child is still pending, checkpointed, then acknowledged. One for a frame held elsewhere
    /// (a failure this worker does not know yet) is ignored; its sender sends it again.
    fn on_join(
        &mut self,
        source: i32,
        to: JoinRef,
        counts: Counts,
        now: Duration,
    ) -> Commands<P::Task> {
        if self.holder(to.frame.creator) != self.me {
            return Vec::new();
        }
        let owed = self.state.joins.owed.len();
        self.state.joins.accept(to, counts, &mut self.state.counts);
        let sends = self.route_owed(owed);
        let mut commands = self.checkpoint(now);
        commands.push(Command::Failpoint("join_before_ack"));
        commands.push(Command::Send { to: source, message: PoolMessage::Joined(vec![to]) });
        commands.extend(sends);
        commands
    }

    /// The holder's acknowledgement of `joined` results: they are forgotten; with futures the
    /// next hand-over starts.
    fn on_joined(&mut self, joined: Vec<JoinRef>) -> Commands<P::Task> {
        for to in joined {
            self.state.joins.acknowledged(to);
        }
        if !P::HANDS_OVER_RESULTS {
            return Vec::new();
        }
        self.handing = None;
        self.route_owed(0)
    }

    /// Futures: `thief` asks for this worker's futures entry; lent at once unless it is lent
    /// already (then when it returns).
    fn on_lock(&mut self, thief: i32) -> Commands<P::Task> {
        if self.lent_to.is_some() {
            if !self.waiting_for_entry.contains(&thief) {
                self.waiting_for_entry.push(thief);
            }
            return Vec::new();
        }
        self.lent_to = Some(thief);
        vec![Command::Send { to: thief, message: PoolMessage::Lent }]
    }

    /// Lends the futures entry to the next waiting worker, if any.
    fn lend_to_next(&mut self) -> Commands<P::Task> {
        if self.lent_to.is_some() || self.waiting_for_entry.is_empty() {
            return Vec::new();
        }
        let thief = self.waiting_for_entry.remove(0);
        self.on_lock(thief)
    }

    /// Futures: `holder` lent this worker its futures entry: the results owed to frames it
    /// holds are written into it, then the entry goes back with them. An entry this worker
    /// no longer waits for goes back at once.
    fn on_lent(&mut self, holder: i32) -> Commands<P::Task> {
        let results: Vec<Owed> = if self.handing == Some(holder) {
            let owed = self.state.joins.owed.iter();
            owed.filter(|o| self.holder(o.to.frame.creator) == holder).copied().collect()
        } else {
            Vec::new()
        };
        let mut commands = Vec::new();
        if !results.is_empty() && self.checkpointing() {
            commands.push(Command::Failpoint("handover_lent"));
            commands.push(Command::HandOver { owner: holder, results: results.clone() });
            commands.push(Command::Failpoint("handover_written"));
        }
        let nothing_to_hand = results.is_empty() && self.handing == Some(holder);
        commands.push(Command::Send { to: holder, message: PoolMessage::Return(results) });
        if nothing_to_hand {
            self.handing = None;
            commands.extend(self.route_owed(0));
        }
        commands
    }

    /// Futures: `thief` gave this worker's futures entry back with the `results` it wrote
    /// into it: those for frames this worker holds are applied and acknowledged (the entry
    /// holds them until a checkpoint does; one that holds [`ENTRY_LIMIT`] results is
    /// checkpointed and emptied first), then the entry goes to the next waiting worker.
    /// Without checkpointing nothing is written into the entry (a failure is fatal then).
    fn on_return(&mut self, thief: i32, results: Vec<Owed>, now: Duration) -> Commands<P::Task> {
        if self.lent_to == Some(thief) {
            self.lent_to = None;
        }
        if self.checkpointing() {
            self.entry_written |= !results.is_empty();
            self.entry_results += results.len();
        }
        let owed = self.state.joins.owed.len();
        let mine: Vec<Owed> =
            results.into_iter().filter(|r| self.holder(r.to.frame.creator) == self.me).collect();
        self.state.joins.apply_handed(&mine, &mut self.state.counts);
        let joined: Vec<JoinRef> = mine.iter().map(|r| r.to).collect();
        let mut commands = Vec::new();
        if self.entry_results >= ENTRY_LIMIT && self.lent_to.is_none() {
            commands.extend(self.checkpoint(now));
        }
        if !joined.is_empty() {
            commands.push(Command::Failpoint("handover_before_ack"));
            commands.push(Command::Send { to: thief, message: PoolMessage::Joined(joined) });
        }
        commands.extend(self.route_owed(owed));
        commands.extend(self.lend_to_next());
        commands
    }

    fn maybe_checkpoint(&mut self, now: Duration) -> Commands<P::Task> {
        let due = match self.settings.interval {
            None => false,
            Some(Interval::Time(t)) => now.saturating_sub(self.last_checkpoint.0) >= t,
            Some(Interval::Tasks(n)) => self.counters.tasks - self.last_checkpoint.1 >= n,
        };
        if due {
            self.checkpoint(now)
        } else {
            Vec::new()
        }
    }

    fn checkpoint(&mut self, now: Duration) -> Commands<P::Task> {
        self.last_checkpoint = (now, self.counters.tasks);
        if !self.checkpointing() {
            return Vec::new();
        }
        let bytes = self.state.encode();
        self.counters.checkpoints += 1;
        self.counters.store_bytes += bytes.len() as u64;
        let mut commands = vec![Command::Put { slot: Slot::Checkpoint, bytes }];
        if self.entry_written && self.lent_to.is_none() {
            (self.entry_written, self.entry_results) = (false, 0);
            commands.push(Command::EmptyFutures);
        }
        commands
    }

    fn ask_for_work(&mut self) -> Commands<P::Task> {
        let others: Vec<i32> = self.live.iter().copied().filter(|&w| w != self.me).collect();
        if self.asking.is_some() || others.is_empty() {
            return Vec::new();
        }
        let victim = others[self.rng.gen_range(0..others.len())];
        self.asking = Some(victim);
        vec![Command::Send { to: victim, message: PoolMessage::Steal }]
    }

    /// A message from worker `source` at time `now`. Messages from a worker this one knows
    /// failed change nothing (a late loot of it is resolved through its loot key).
    pub fn on_message(
        &mut self,
        source: i32,
        message: PoolMessage<P::Task>,
        now: Duration,
    ) -> Commands<P::Task> {
        if !self.live.contains(&source) {
            return Vec::new();
        }
        match message {
            PoolMessage::Steal => self.on_steal_request(source, now),
            PoolMessage::Loot(loot) => self.on_loot(source, loot, now),
            PoolMessage::Ack(steal_id) => self.on_ack(steal_id),
            PoolMessage::Probe(id) => {
                let [busy, sent, received] = self.status();
                let message = PoolMessage::Status([id, busy, sent, received, self.view()]);
                vec![Command::Send { to: source, message }]
            }
            PoolMessage::Status(words) => {
                self.on_status(words);
                Vec::new()
            }
            PoolMessage::Done => {
                self.done = true;
                Vec::new()
            }
            PoolMessage::Collect(round) => {
                let contribution = self.contribution();
                let message = PoolMessage::Contribution(round, self.view(), contribution);
                vec![Command::Send { to: source, message }]
            }
            PoolMessage::Contribution(round, view, words) => {
                self.on_contribution(round, view, words)
            }
            PoolMessage::Join(to, counts) => self.on_join(source, to, counts, now),
            PoolMessage::Joined(joined) => self.on_joined(joined),
            PoolMessage::Lock => self.on_lock(source),
            PoolMessage::Lent => self.on_lent(source),
            PoolMessage::Return(results) => self.on_return(source, results, now),
            PoolMessage::Total(words, failed) => {
                let mut commands = self.to_others(PoolMessage::Total(words, failed.clone()));
                commands.retain(|c| !matches!(c, Command::Send { to, .. } if *to == source));
                commands.push(Command::End(words, failed));
                commands
            }
        }
    }

    /// Gives the older half of the pool, unless a loot is still unacknowledged or there is too
    /// little work.
    fn on_steal_request(&mut self, thief: i32, now: Duration) -> Commands<P::Task> {
        if self.pending.is_some() || self.state.pool.len() < 2 {
            return vec![Command::Send { to: thief, message: PoolMessage::Loot(None) }];
        }
        let half = self.state.pool.len() / 2;
        let tasks: Vec<P::Task> = self.state.pool.drain(..half).collect();
        self.steal_counter += 1;
        let steal_id = self.steal_counter;
        self.pending = Some(Pending { steal_id, thief, tasks: tasks.clone() });
        let mut commands = self.store_pending_loot();
        commands.push(Command::Failpoint("steal_victim_after_loot"));
        commands.extend(self.checkpoint(now));
        commands.push(Command::Failpoint("steal_victim_before_send"));
        let message = PoolMessage::Loot(Some((steal_id, tasks)));
        commands.push(Command::Send { to: thief, message });
        self.sent_to[thief as usize] += 1;
        self.counters.steals += 1;
        commands
    }

    /// Writes the loot in flight to this worker's loot key, then counts it as given
    /// (`last_given`): a checkpoint that no longer holds the loot's tasks must say so, and is
    /// only ever written after the loot key holds them.
    fn store_pending_loot(&mut self) -> Commands<P::Task> {
        let Some(pending) = self.pending.as_ref() else { return Vec::new() };
        self.state.last_given = pending.steal_id;
        if !self.checkpointing() {
            return Vec::new();
        }
        let loot =
            Loot { steal_id: pending.steal_id, thief: pending.thief, tasks: pending.tasks.clone() };
        let bytes = loot.encode();
        self.counters.store_bytes += bytes.len() as u64;
        vec![Command::Put { slot: Slot::Loot, bytes }]
    }

    /// Writes this worker's loot key again from what it knows, since a global recovery may have
    /// lost every copy of it while this worker lives: the loot in flight, or a deletion when
    /// none is (a loot key is deleted as soon as its thief acknowledged it, so without a loot
    /// in flight the key holds nothing).
    fn rewrite_loot(&mut self) -> Commands<P::Task> {
        if self.pending.is_some() {
            self.store_pending_loot()
        } else {
            vec![Command::DeleteLoot { owner: self.me }]
        }
    }

    fn on_loot(
        &mut self,
        victim: i32,
        loot: Option<(u64, Vec<P::Task>)>,
        now: Duration,
    ) -> Commands<P::Task> {
        self.asking = None;
        let Some((steal_id, tasks)) = loot else { return Vec::new() };
        self.state.pool.extend(tasks);
        self.state.received[victim as usize] = steal_id;
        self.received_from[victim as usize] += 1;
        let mut commands = vec![Command::Failpoint("steal_thief_before_checkpoint")];
        commands.extend(self.checkpoint(now));
        commands.push(Command::Failpoint("steal_thief_before_ack"));
        commands.push(Command::Send { to: victim, message: PoolMessage::Ack(steal_id) });
        commands
    }

    fn on_ack(&mut self, steal_id: u64) -> Commands<P::Task> {
        if self.pending.as_ref().is_none_or(|p| p.steal_id != steal_id) {
            return Vec::new();
        }
        self.pending = None;
        if self.checkpointing() {
            vec![Command::DeleteLoot { owner: self.me }]
        } else {
            Vec::new()
        }
    }

    /// (busy, loot sent to live workers, loot received from live workers); waiting for an
    /// acknowledgement counts as busy.
    fn status(&self) -> [u64; 3] {
        let busy =
            !self.state.pool.is_empty() || self.pending.is_some() || !self.state.joins.is_empty();
        let live_sum = |counts: &[u64]| self.live.iter().map(|&w| counts[w as usize]).sum();
        [busy as u64, live_sum(&self.sent_to), live_sum(&self.received_from)]
    }

    fn on_status(&mut self, words: [u64; 5]) {
        let view = self.view();
        if let Some(wave) = self.wave.as_mut().filter(|w| w.id == words[0]) {
            wave.answers += 1;
            wave.busy += words[1];
            wave.sent += words[2];
            wave.received += words[3];
            wave.same_view &= words[4] == view;
        }
    }

    /// Termination detection by the leader (the first live worker): a wave probes every live
    /// worker for its status; two consecutive waves with no busy worker, every loot sent
    /// received, equal counts and every answer from the leader's view of failures end the
    /// computation, and the leader tells everyone.
    fn termination_wave(&mut self, now: Duration) -> Commands<P::Task> {
        if self.done || !self.leads() {
            return Vec::new();
        }
        let others = self.live.len() - 1;
        match &self.wave {
            None if now.saturating_sub(self.last_wave) >= WAVE_GAP => self.start_wave(now),
            Some(wave) if wave.answers == others => self.end_wave(now),
            _ => Vec::new(),
        }
    }

    fn start_wave(&mut self, now: Duration) -> Commands<P::Task> {
        self.waves += 1;
        let [busy, sent, received] = self.status();
        self.wave =
            Some(Wave { id: self.waves, answers: 0, busy, sent, received, same_view: true });
        let probe = PoolMessage::Probe(self.waves);
        let mut commands = self.to_others(probe);
        if self.live.len() == 1 {
            commands.extend(self.end_wave(now));
        }
        commands
    }

    fn end_wave(&mut self, now: Duration) -> Commands<P::Task> {
        let wave = self.wave.take().expect("a wave in flight");
        self.last_wave = now;
        let quiet = wave.busy == 0 && wave.sent == wave.received && wave.same_view;
        let previous = self.quiet_wave.replace((wave.sent, wave.received));
        if !quiet {
            self.quiet_wave = None;
        }
        if !(quiet && previous == Some((wave.sent, wave.received))) {
            return Vec::new();
        }
        if self.settings.localized {
            return self.start_collection();
        }
        self.done = true;
        self.to_others(PoolMessage::Done)
    }

    fn start_collection(&mut self) -> Commands<P::Task> {
        self.done = true;
        let round = self.waves;
        let words = self.contribution().to_vec();
        self.collection = Some(Collection { round, answers: 0, words });
        let commands = self.to_others(PoolMessage::Collect(round));
        if commands.is_empty() {
            return self.end_collection();
        }
        commands
    }

    /// A contribution of the current round from a worker with the leader's view counts;
    /// one with another view means a failure in between: the waves start again.
    fn on_contribution(&mut self, round: u64, view: u64, words: [u64; 6]) -> Commands<P::Task> {
        let same_view = view == self.view();
        let Some(collection) = self.collection.as_mut().filter(|c| c.round == round) else {
            return Vec::new();
        };
        if !same_view {
            self.restart_waves();
            return Vec::new();
        }
        collection.answers += 1;
        collection.words.extend(words);
        if collection.answers + 1 < self.live.len() {
            return Vec::new();
        }
        self.end_collection()
    }

    fn end_collection(&mut self) -> Commands<P::Task> {
        let collection = self.collection.take().expect("a collection in flight");
        let (total, sums) = sum_contributions(&collection.words);
        let words = [total.nodes, total.leaves, total.max_depth as u64, sums[0], sums[1], sums[2]];
        let failed = self.failed();
        let mut commands = self.to_others(PoolMessage::Total(words, failed.clone()));
        commands.push(Command::End(words, failed));
        commands
    }

    /// Forgets the termination state: a failure (or a changed view) makes the leader start
    /// the waves again.
    fn restart_waves(&mut self) {
        (self.wave, self.quiet_wave, self.collection, self.done) = (None, None, None, false);
    }

    /// The workers this worker knows failed.
    pub fn failed(&self) -> Vec<i32> {
        let workers = self.state.received.len() as i32;
        (0..workers).filter(|w| !self.live.contains(w)).collect()
    }

    /// `message` to every other live worker.
    fn to_others(&self, message: PoolMessage<P::Task>) -> Commands<P::Task> {
        let others = self.live.iter().filter(|&&w| w != self.me);
        others.map(|&to| Command::Send { to, message: message.clone() }).collect()
    }

    /// This worker's part of the final sums: nodes, leaves, depth, tasks, checkpoints, bytes.
    pub fn contribution(&self) -> [u64; 6] {
        let c = &self.state.counts;
        let k = &self.counters;
        [c.nodes, c.leaves, c.max_depth as u64, k.tasks, k.checkpoints, k.store_bytes]
    }

    /// After the store recovered on `live`: forgets the steal and termination state of the old
    /// communicator, writes its loot key again (the loot in flight, or a deletion) and a fresh
    /// checkpoint, so that keys the recovery lost while this worker lives hold its state again
    /// (`RecoveryReport::keys_to_rewrite`), synchronises and reads everyone's state. `None` when checkpointing is off (a failure is then fatal).
    pub fn rejoin(&mut self, live: &[i32], now: Duration) -> Option<Commands<P::Task>> {
        if !self.checkpointing() {
            return None;
        }
        self.live = live.to_vec();
        self.settled_globally = self.failed();
        self.asking = None;
        self.last_resend = None;
        (self.lent_to, self.handing) = (None, None);
        self.waiting_for_entry.clear();
        // The fresh checkpoint holds every result this worker applied: its futures entry is
        // written again empty (the recovery may have lost it).
        self.entry_written = P::HANDS_OVER_RESULTS;
        self.sent_to.fill(0);
        self.received_from.fill(0);
        (self.wave, self.quiet_wave, self.done) = (None, None, false);
        self.last_wave = now;
        let mut commands = self.rewrite_loot();
        commands.extend(self.checkpoint(now));
        commands.push(Command::Failpoint("rejoin_before_sync"));
        commands.push(Command::Sync);
        commands.push(Command::ReadAll);
        Some(commands)
    }

    /// Applies this worker's part of the recovery plan computed from `stored` (read after
    /// [`Worker::rejoin`]'s barrier): adopts dead workers' checkpoints, takes in-flight loot,
    /// takes its own loot back if its thief died before checkpointing it, checkpoints, deletes
    /// the resolved loot keys and synchronises. Returns the commands and the adopted workers.
    pub fn on_stored(
        &mut self,
        stored: Stored<P::Task>,
        now: Duration,
    ) -> (Commands<P::Task>, Vec<i32>) {
        let seen = self.seen(&stored);
        let pending = self.pending.as_ref().map(|p| p.steal_id);
        let plan = plan(self.me, &self.live, &seen, pending);
        for &dead in &plan.adopt {
            self.adopt(
                dead,
                stored.checkpoints[dead as usize].clone(),
                &stored.handed[dead as usize],
            );
        }
        let mut commands = vec![Command::Failpoint("buddy_after_adopting")];
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
        commands.extend(self.checkpoint(now));
        commands.extend(plan.delete_loot.iter().map(|&owner| Command::DeleteLoot { owner }));
        commands.push(Command::Sync);
        (commands, plan.adopt)
    }

    /// Localized recovery: `failed` is every worker the store knows failed. Forgets the newly
    /// failed ones (a steal request to one, the termination wave in flight) and returns this
    /// worker's part of the recovery as [`Command::Settle`]s: the adoption and loot of every
    /// failed worker whose buddy it is now, the loot of a failed victim it was asking, its own
    /// loot in flight to a failed thief. Every other worker only forgets and keeps working.
    /// The settles are idempotent: one that finds its work done writes nothing.
    pub fn on_failures(&mut self, failed: &[i32], now: Duration) -> Commands<P::Task> {
        let newly: Vec<i32> = failed.iter().copied().filter(|w| self.live.contains(w)).collect();
        if newly.is_empty() || newly.contains(&self.me) {
            return Vec::new();
        }
        self.live.retain(|w| !newly.contains(w));
        self.last_resend = None;
        let lend = self.forget_borrowers(&newly);
        self.restart_waves();
        self.last_wave = now;
        let mut settles = Vec::new();
        if let Some(victim) = self.asking.filter(|v| newly.contains(v)) {
            self.asking = None;
            settles.push(Settle::Loot { victim });
        }
        let workers = self.state.received.len();
        let unsettled = |w: &i32| !self.live.contains(w) && !self.settled_globally.contains(w);
        for dead in (0..workers as i32).filter(unsettled) {
            if buddy(dead, &self.live, workers) == self.me {
                settles.push(Settle::Adopt { dead });
                settles.push(Settle::Loot { victim: dead });
            }
        }
        if let Some(pending) = self.pending.as_ref().filter(|p| !self.live.contains(&p.thief)) {
            settles.push(Settle::TakeBack { thief: pending.thief });
        }
        settles.dedup();
        let mut commands = Vec::new();
        for settle in settles {
            commands.push(Command::Settle(settle));
            if matches!(settle, Settle::Adopt { .. }) {
                commands.push(Command::Failpoint("buddy_after_adopting"));
            }
        }
        commands.extend(lend);
        commands
    }

    /// Futures: a failed borrower's loan of this worker's entry ends (what it wrote there is
    /// still owed by its state, or by its buddy's), and a failed holder's entry is asked of
    /// its buddy at the next resend.
    fn forget_borrowers(&mut self, failed: &[i32]) -> Commands<P::Task> {
        self.waiting_for_entry.retain(|w| !failed.contains(w));
        if self.handing.is_some_and(|h| failed.contains(&h)) {
            self.handing = None;
        }
        if self.lent_to.is_some_and(|t| failed.contains(&t)) {
            self.lent_to = None;
        }
        self.lend_to_next()
    }

    /// For [`Settle::Adopt`]: this worker's state with `dead`'s stored checkpoint (`None`:
    /// its initial state) added and the results of its futures entry (`handed`) applied, and
    /// that checkpoint emptied; `None` when it was adopted already.
    pub fn with_adopted(
        &self,
        dead: i32,
        theirs: Option<Checkpoint<P::Task>>,
        handed: &[Owed],
    ) -> Option<Adoption<P::Task>> {
        let workers = self.state.received.len();
        let theirs = theirs.unwrap_or_else(|| Checkpoint::initial(self.problem, dead, workers));
        if theirs.adopted_by.is_some() {
            return None;
        }
        let emptied = theirs.emptied(self.me);
        let mut mine = self.state.clone();
        mine.take_in(dead, theirs, handed);
        Some((mine, emptied))
    }

    /// For [`Settle::Loot`]: whether this worker resolves `victim`'s stored `loot` (it is the
    /// thief, or the thief failed too and this worker is the victim's buddy).
    pub fn resolves_loot(&self, victim: i32, loot: &Loot<P::Task>) -> bool {
        let workers = self.state.received.len();
        loot.thief == self.me
            || (!self.live.contains(&loot.thief) && buddy(victim, &self.live, workers) == self.me)
    }

    /// For [`Settle::Loot`]: this worker's state with the tasks of `victim`'s stored `loot`,
    /// when they are nowhere else: the victim's stored checkpoint (`victims`) left them out
    /// and the thief's state (this worker's own, or its stored checkpoint `thiefs`) does not
    /// hold them. `None`: the key only needs deleting.
    pub fn with_loot(
        &self,
        victim: i32,
        loot: &Loot<P::Task>,
        victims: Option<&Checkpoint<P::Task>>,
        thiefs: Option<&Checkpoint<P::Task>>,
    ) -> Option<Checkpoint<P::Task>> {
        let left_out = victims.is_some_and(|c| c.last_given >= loot.steal_id);
        let thief_state = if loot.thief == self.me { Some(&self.state) } else { thiefs };
        let held = thief_state.is_some_and(|c| c.holds_loot(victim, loot.steal_id));
        if !left_out || held {
            return None;
        }
        let mut mine = self.state.clone();
        mine.pool.extend(loot.tasks.iter().copied());
        mine.received[victim as usize] = loot.steal_id;
        Some(mine)
    }

    /// For [`Settle::TakeBack`]: this worker's state with its loot in flight back in its pool
    /// unless the failed thief's stored checkpoint (`thiefs`) holds it; `None` when no loot is
    /// in flight.
    pub fn with_taken_back(
        &self,
        thiefs: Option<&Checkpoint<P::Task>>,
    ) -> Option<Checkpoint<P::Task>> {
        let pending = self.pending.as_ref()?;
        let mut mine = self.state.clone();
        if !thiefs.is_some_and(|c| c.holds_loot(self.me, pending.steal_id)) {
            mine.pool.extend(pending.tasks.iter().copied());
            mine.received[self.me as usize] = pending.steal_id;
        }
        Some(mine)
    }

    /// Takes `state` as this worker's state once a settle transaction committed it to the
    /// store; after [`Settle::TakeBack`] no loot is in flight any more.
    pub fn settled(&mut self, settle: Settle, state: Checkpoint<P::Task>) {
        self.state = state;
        self.counters.checkpoints += 1;
        if matches!(settle, Settle::TakeBack { .. }) {
            self.pending = None;
        }
    }

    /// Forgets the loot in flight after a [`Settle::TakeBack`] that found it resolved already.
    pub fn clear_pending(&mut self) {
        self.pending = None;
    }

    /// What each worker's state includes, as the store holds it; this worker's own from its
    /// state, which it has just written: the store holds the same, or nothing when it had no
    /// holder to put it on (this worker is the only survivor), and reading nothing there as
    /// the initial state counted loot twice (the world found it: 2 workers, 1 copy).
    fn seen(&self, stored: &Stored<P::Task>) -> Vec<Seen> {
        let workers = self.state.received.len();
        (0..workers)
            .map(|w| {
                if w as i32 == self.me {
                    return Seen {
                        last_given: self.state.last_given,
                        received: self.state.received.clone(),
                        adopted: self.state.adopted.clone(),
                        loot: self.pending.as_ref().map(|p| (p.steal_id, p.thief)),
                    };
                }
                let initial;
                let c = match &stored.checkpoints[w] {
                    Some(c) => c,
                    None => {
                        initial = Checkpoint::initial(self.problem, w as i32, workers);
                        &initial
                    }
                };
                Seen {
                    last_given: c.last_given,
                    received: c.received.clone(),
                    adopted: c.adopted.clone(),
                    loot: stored.loots[w].as_ref().map(|l| (l.steal_id, l.thief)),
                }
            })
            .collect()
    }

    fn adopt(&mut self, dead: i32, checkpoint: Option<Checkpoint<P::Task>>, handed: &[Owed]) {
        let workers = self.state.received.len();
        let theirs = checkpoint.unwrap_or_else(|| Checkpoint::initial(self.problem, dead, workers));
        self.state.take_in(dead, theirs, handed);
    }
}

/// The final sums: the whole result, and the survivors' tasks, checkpoints and store bytes.
pub type Sums = (Counts, [u64; 3]);

/// Adds up the survivors' contributions ([`Worker::contribution`], six words each).
pub fn sum_contributions(words: &[u64]) -> Sums {
    let mut total = Counts::default();
    let mut sums = [0u64; 3];
    for w in words.chunks(6) {
        total.add(&Counts { nodes: w[0], leaves: w[1], max_depth: w[2] as u32 });
        sums.iter_mut().zip(&w[3..]).for_each(|(s, v)| *s += v);
    }
    (total, sums)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fib::{Call, Fib};
    use crate::forkjoin::{ForkJoin, FrameId, Futures, Spawned};
    use crate::nqueens::{Board, NQueens};

    const QUEENS: NQueens = NQueens { n: 6 };
    const SETTINGS: Settings =
        Settings { interval: Some(Interval::Tasks(1000)), batch: 4, seed: 1, localized: false };

    /// Worker `me` of 3 with `tasks` boards in its pool.
    fn worker(me: i32, tasks: usize) -> Worker<'static, NQueens> {
        let mut w = Worker::new(&QUEENS, SETTINGS, me, 3);
        w.state.pool = vec![Board { row: 1, columns: 1, left: 2, right: 0 }; tasks];
        w
    }

    /// The command kinds of a list, in order: send(message), put(slot), delete, sync, read,
    /// failpoint(name), finish.
    fn kinds<T: std::fmt::Debug>(commands: &[Command<T>]) -> Vec<String> {
        commands
            .iter()
            .map(|c| match c {
                Command::Send { to, message } => {
                    let what = format!("{message:?}");
                    let name = what.split(['(', ' ']).next().unwrap_or_default().to_owned();
                    format!("send {name} to {to}")
                }
                Command::Put { slot, .. } => format!("put {slot:?}"),
                Command::DeleteLoot { owner } => format!("delete loot of {owner}"),
                Command::Sync => "sync".into(),
                Command::ReadAll => "read".into(),
                Command::Failpoint(name) => format!("failpoint {name}"),
                Command::Finish => "finish".into(),
                Command::Settle(settle) => format!("settle {settle:?}"),
                Command::End(..) => "end".into(),
                Command::HandOver { owner, .. } => format!("hand over to {owner}"),
                Command::EmptyFutures => "empty futures".into(),
            })
            .collect()
    }

    const FORK_JOIN: ForkJoin<Fib> = ForkJoin { inner: Fib { n: 6 } };
    const FUTURES: Futures<Fib> = Futures { inner: Fib { n: 6 } };

    /// A result for child 1 of frame 0 opened by worker `creator`.
    fn result_for(creator: i32) -> (JoinRef, Counts) {
        let to = JoinRef { frame: FrameId { creator, serial: 0 }, child: 1 };
        (to, Counts { nodes: 3, leaves: 2, max_depth: 2 })
    }

    /// Worker 0 of 3 with its root frame open (both children spawned).
    fn holder<P: Problem<Task = Spawned<Call>>>(program: &P) -> Worker<'_, P> {
        let mut w = Worker::new(program, SETTINGS, 0, 3);
        w.set_batch(1);
        w.run_batch();
        assert_eq!(w.state.joins.frames.len(), 1, "the root frame is open");
        w
    }

    #[test]
    fn a_frame_holder_checkpoints_a_returned_result_before_it_acknowledges_it() {
        let mut w = holder(&FORK_JOIN);
        let (to, counts) = result_for(0);
        let commands = w.on_message(1, PoolMessage::Join(to, counts), Duration::ZERO);
        let want = ["put Checkpoint", "failpoint join_before_ack", "send Joined to 1"];
        assert_eq!(kinds(&commands), want);
        assert_eq!(w.state.joins.frames[0].pending.children(), vec![0], "child 1 returned");
        let again = w.on_message(1, PoolMessage::Join(to, counts), Duration::ZERO);
        assert_eq!(kinds(&again), want, "a result sent again is acknowledged again");
        assert_eq!(w.state.joins.frames[0].sum.nodes, 1 + 3, "and counts once");
        let elsewhere = w.on_message(1, PoolMessage::Join(result_for(2).0, counts), Duration::ZERO);
        assert!(elsewhere.is_empty(), "a frame worker 2 holds is not this worker's");
    }

    #[test]
    fn a_futures_entry_is_lent_to_one_thief_at_a_time() {
        let mut w = holder(&FUTURES);
        let lent = w.on_message(1, PoolMessage::Lock, Duration::ZERO);
        assert_eq!(kinds(&lent), ["send Lent to 1"]);
        assert!(w.on_message(2, PoolMessage::Lock, Duration::ZERO).is_empty(), "2 waits");
        let (to, counts) = result_for(0);
        let returned = PoolMessage::Return(vec![Owed { to, counts }]);
        let commands = w.on_message(1, returned, Duration::ZERO);
        let want = ["failpoint handover_before_ack", "send Joined to 1", "send Lent to 2"];
        assert_eq!(kinds(&commands), want, "no checkpoint: the entry holds the result");
        assert_eq!(w.state.joins.frames[0].pending.children(), vec![0]);
        let checkpoint = w.checkpoint(Duration::ZERO);
        assert_eq!(kinds(&checkpoint), ["put Checkpoint"], "not emptied while lent to 2");
        w.on_message(2, PoolMessage::Return(Vec::new()), Duration::ZERO);
        let checkpoint = w.checkpoint(Duration::ZERO);
        assert_eq!(kinds(&checkpoint), ["put Checkpoint", "empty futures"]);
    }

    #[test]
    fn a_thief_writes_its_results_into_the_lent_entry_and_forgets_them_when_acknowledged() {
        let mut w: Worker<'_, Futures<Fib>> = Worker::new(&FUTURES, SETTINGS, 1, 3);
        let (to, counts) = result_for(0);
        w.state.joins.owed.push(Owed { to, counts });
        let asked = w.tick(Duration::from_secs(1));
        assert!(kinds(&asked).contains(&"send Lock to 0".to_string()), "{asked:?}");
        let lent = w.on_message(0, PoolMessage::Lent, Duration::ZERO);
        let want = [
            "failpoint handover_lent",
            "hand over to 0",
            "failpoint handover_written",
            "send Return to 0",
        ];
        assert_eq!(kinds(&lent), want);
        assert_eq!(w.state.joins.owed.len(), 1, "owed until acknowledged");
        w.on_message(0, PoolMessage::Joined(vec![to]), Duration::ZERO);
        assert!(w.state.joins.owed.is_empty());
    }

    /// (case, worker, message from rank 1, expected commands)
    type Case = (&'static str, Worker<'static, NQueens>, PoolMessage<Board>, Vec<&'static str>);

    #[test]
    fn steal_protocol_table() {
        let t = Duration::ZERO;
        let loot =
            || PoolMessage::Loot(Some((1, vec![Board { row: 2, columns: 3, left: 0, right: 0 }])));
        // (case, worker, message from rank 1 (its id in the live set 0..3), expected commands)
        let table: Vec<Case> = vec![
            ("too little work: refuse", worker(0, 1), PoolMessage::Steal, vec!["send Loot to 1"]),
            (
                "victim: loot key, checkpoint without it, then the loot",
                worker(0, 4),
                PoolMessage::Steal,
                vec![
                    "put Loot",
                    "failpoint steal_victim_after_loot",
                    "put Checkpoint",
                    "failpoint steal_victim_before_send",
                    "send Loot to 1",
                ],
            ),
            (
                "thief: checkpoint with the loot before the acknowledgement",
                worker(0, 0),
                loot(),
                vec![
                    "failpoint steal_thief_before_checkpoint",
                    "put Checkpoint",
                    "failpoint steal_thief_before_ack",
                    "send Ack to 1",
                ],
            ),
            ("a refusal changes nothing", worker(0, 0), PoolMessage::Loot(None), vec![]),
            ("an acknowledgement nobody waits for", worker(0, 3), PoolMessage::Ack(7), vec![]),
            ("a probe is answered", worker(2, 3), PoolMessage::Probe(4), vec!["send Status to 1"]),
        ];
        for (case, mut w, message, want) in table {
            assert_eq!(kinds(&w.on_message(1, message, t)), want, "{case}");
        }
    }

    #[test]
    fn a_victim_with_a_loot_in_flight_refuses_and_deletes_the_key_on_its_ack() {
        let t = Duration::ZERO;
        let mut victim = worker(0, 6);
        victim.on_message(1, PoolMessage::Steal, t);
        assert_eq!(victim.state.pool.len(), 3, "the older half went");
        assert_eq!(victim.state.last_given, 1, "the checkpoint says the loot left");
        assert_eq!(kinds(&victim.on_message(2, PoolMessage::Steal, t)), ["send Loot to 2"]);
        assert_eq!(kinds(&victim.on_message(1, PoolMessage::Ack(1), t)), ["delete loot of 0"]);
        assert_eq!(victim.on_message(1, PoolMessage::Ack(1), t), vec![], "once");
    }

    /// The leader's commands of one tick at `ms`, without its own steal requests.
    fn leader_tick(leader: &mut Worker<NQueens>, ms: u64) -> Vec<String> {
        leader.asking = None;
        let commands = kinds(&leader.tick(Duration::from_millis(ms)));
        commands.into_iter().filter(|c| !c.starts_with("send Steal")).collect()
    }

    #[test]
    fn the_leader_ends_after_two_equal_quiet_waves() {
        let mut leader = worker(0, 0);
        let answer = |leader: &mut Worker<NQueens>, id, busy| {
            for rank in 1..=2 {
                let view = leader.view();
                let status = PoolMessage::Status([id, busy, 0, 0, view]);
                leader.on_message(rank, status, Duration::ZERO);
            }
        };
        assert_eq!(leader_tick(&mut leader, 2), ["send Probe to 1", "send Probe to 2"]);
        answer(&mut leader, 1, 0);
        assert_eq!(leader_tick(&mut leader, 3), Vec::<String>::new(), "one quiet wave");
        assert_eq!(leader_tick(&mut leader, 5), ["send Probe to 1", "send Probe to 2"]);
        answer(&mut leader, 2, 0);
        let end = ["send Done to 1", "send Done to 2", "finish"];
        assert_eq!(leader_tick(&mut leader, 6), end, "two equal quiet waves");
    }

    #[test]
    fn a_busy_answer_or_a_stale_wave_keeps_the_computation_going() {
        let mut leader = worker(0, 0);
        let mut ms = 2;
        for wave in 1..=4u64 {
            leader_tick(&mut leader, ms);
            let busy = u64::from(wave % 2 == 1);
            let view = leader.view();
            leader.on_message(1, PoolMessage::Status([wave, busy, 0, 0, view]), Duration::ZERO);
            leader.on_message(2, PoolMessage::Status([wave + 9, 0, 0, 0, view]), Duration::ZERO);
            leader.on_message(2, PoolMessage::Status([wave, 0, 0, 0, view]), Duration::ZERO);
            assert!(!leader_tick(&mut leader, ms + 1).contains(&"finish".to_owned()), "{wave}");
            ms += 3;
        }
    }

    #[test]
    fn rejoin_rewrites_the_loot_in_flight_before_the_fresh_checkpoint() {
        let t = Duration::ZERO;
        let mut victim = worker(1, 4);
        victim.on_message(2, PoolMessage::Steal, t);
        let commands = victim.rejoin(&[1, 2], t).expect("checkpointing");
        let want = ["put Loot", "put Checkpoint", "failpoint rejoin_before_sync", "sync", "read"];
        assert_eq!(kinds(&commands), want);
        let unprotected = Settings { interval: None, ..SETTINGS };
        assert!(Worker::new(&QUEENS, unprotected, 0, 2).rejoin(&[0], t).is_none());
    }
}
