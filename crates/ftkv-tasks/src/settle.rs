//! One localized-recovery settle ([`Settle`]) as an engine without I/O: the driver
//! ([`crate::pool`]) hands it what its last command found and carries out the command it
//! returns, until the engine says what the settle changes on the worker or that it fails
//! (openraft's Engine and Runtime).
//!
//! Every settle is one store transaction that reads this worker's checkpoint and one more key:
//! - [`Settle::Adopt`] reads the dead worker's checkpoint (and, for a program whose results
//!   are handed over, its futures entry, whose results it applies) and writes the checkpoint
//!   back emptied ([`Worker::with_adopted`]);
//! - [`Settle::Loot`] first reads the failed victim's loot key: nothing stored, or a loot
//!   this worker does not resolve ([`Worker::resolves_loot`]), ends it; a loot whose thief is
//!   another worker also needs that thief's stored checkpoint. The transaction reads the
//!   victim's checkpoint, holds only while the loot key still holds the bytes read, and
//!   deletes the key ([`Worker::with_loot`]);
//! - [`Settle::TakeBack`] first reads the failed thief's stored checkpoint; the transaction
//!   reads this worker's loot key and deletes it ([`Worker::with_taken_back`]).
//!
//! Once the transaction holds its locks, the writes follow from the values it read; this
//! worker's checkpoint is written when the settle yields a new state. A committed
//! transaction with a new state makes the worker take it ([`Worker::settled`]); any other
//! end of a take-back forgets the loot in flight ([`Worker::clear_pending`]). A failed
//! worker's stored checkpoint that does not decode fails the settle once its transaction
//! ended. A transaction call that fails with an error (the store fell back to global
//! recovery) leaves the settle in doubt when it would have changed the worker: the recovery's
//! [`ftkv::Store::finish_transactions`] decides it, and it takes effect iff the transaction
//! committed.

use ftkv::txn::{Decision, Expect, Outcome, Reads, Txn};
use ftkv::Key;

use crate::forkjoin::{decode_handed, Owed};
use crate::problem::Problem;
use crate::protocol::{Settle, Slot, Worker};
use crate::state::{Checkpoint, Loot};

/// A write of a transaction: a key and its new value (`None` deletes it).
pub type Write = (Key, Option<Vec<u8>>);

/// What the driver found when it carried out the last command.
#[derive(Debug, Clone, PartialEq)]
pub enum Event<'r> {
    /// The settle starts.
    Start,
    /// The loot key [`Command::ReadLoot`] read (`None`: nothing stored).
    LootRead(Option<Vec<u8>>),
    /// The checkpoint [`Command::ReadCheckpoint`] read (`None`: nothing stored).
    CheckpointRead(Option<Vec<u8>>),
    /// Inside [`Command::Transact`]'s transaction, once it holds its locks and its conditions
    /// hold: the values it read (the store's update callback).
    Locked(&'r Reads),
    /// [`Command::Transact`]'s transaction ended.
    Transacted(Outcome),
    /// [`Command::Transact`]'s transaction call failed with an error the driver keeps.
    TransactionFailed,
    /// After the global recovery: how the store finished this worker's transaction that the
    /// failed call left open ([`ftkv::Store::finish_transactions`]; `None`: no such
    /// transaction).
    Decided(Option<Decision>),
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Command<T> {
    /// Read the loot key of `owner`; answer [`Event::LootRead`].
    ReadLoot { owner: i32 },
    /// Read the checkpoint of `owner`; answer [`Event::CheckpointRead`].
    ReadCheckpoint { owner: i32 },
    /// Run this store transaction. Its update callback answers [`Event::Locked`] with the
    /// writes of [`Command::Write`]; its end answers [`Event::Transacted`], or
    /// [`Event::TransactionFailed`] when the call failed.
    Transact(Txn),
    /// Inside the transaction: write these, in order.
    Write(Vec<Write>),
    /// The settle is over: apply its effect to the worker.
    TakeEffect(Effect<T>),
    /// The settle is over and fails: the store holds a corrupt value of this kind.
    Corrupt(&'static str),
    /// The settle fails with the transaction call's error and stays in doubt: keep this
    /// engine and hand it the recovery's decision ([`Event::Decided`]).
    RememberInDoubt,
    /// The settle fails with the transaction call's error; nothing of it is in doubt.
    Fail,
}

/// What a settle changes on its worker.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect<T> {
    /// The worker takes `state`, which the store committed ([`Worker::settled`]).
    Settled { settle: Settle, state: Box<Checkpoint<T>> },
    /// The worker forgets its loot in flight ([`Worker::clear_pending`]).
    ClearPending,
    /// Nothing.
    Unchanged,
}

/// A settle that waits for the failed thief's stored checkpoint before its transaction.
enum AwaitingThiefs<T> {
    Loot { victim: i32, stored: Vec<u8>, loot: Loot<T> },
    TakeBack,
}

impl<T> AwaitingThiefs<T> {
    fn with(self, thiefs: Option<Checkpoint<T>>) -> Plan<T> {
        match self {
            AwaitingThiefs::Loot { victim, stored, loot } => {
                Plan::Loot { victim, stored, loot, thiefs }
            }
            AwaitingThiefs::TakeBack => Plan::TakeBack { thiefs },
        }
    }
}

/// What a settle's transaction needs besides the values it reads.
enum Plan<T> {
    Adopt {
        dead: i32,
    },
    /// `stored`: the loot key's bytes, which must still be there; `thiefs`: the failed
    /// thief's stored checkpoint (`None` when this worker is the thief).
    Loot {
        victim: i32,
        stored: Vec<u8>,
        loot: Loot<T>,
        thiefs: Option<Checkpoint<T>>,
    },
    TakeBack {
        thiefs: Option<Checkpoint<T>>,
    },
}

impl<T> Plan<T> {
    /// The transaction of worker `me`, without the writes that follow from its reads; an
    /// adoption also reads the failed worker's futures entry when results are handed over
    /// (`futures`).
    fn txn(&self, me: i32, futures: bool) -> Txn {
        let mine = Slot::Checkpoint.key(me);
        match self {
            Plan::Adopt { dead } => {
                let mut reads = vec![mine, Slot::Checkpoint.key(*dead)];
                if futures {
                    reads.push(Slot::Futures.key(*dead));
                }
                Txn { reads, ..Txn::default() }
            }
            Plan::Loot { victim, stored, .. } => Txn {
                reads: vec![mine, Slot::Checkpoint.key(*victim)],
                conditions: vec![(Slot::Loot.key(*victim), Expect::Value(Some(stored.clone())))],
                ..Txn::default()
            },
            Plan::TakeBack { .. } => {
                Txn { reads: vec![mine, Slot::Loot.key(me)], ..Txn::default() }
            }
        }
    }

    /// The failed worker whose checkpoint the transaction reads, if any.
    fn failed_worker(&self) -> Option<i32> {
        match self {
            Plan::Adopt { dead } => Some(*dead),
            Plan::Loot { victim, .. } => Some(*victim),
            Plan::TakeBack { .. } => None,
        }
    }
}

/// What the transaction's writes would commit.
struct Written<T> {
    /// This worker's new state (`None`: the settle leaves it unchanged).
    state: Option<Checkpoint<T>>,
    /// What of the failed worker's did not decode (its checkpoint or futures entry), if any.
    corrupt: Option<&'static str>,
}

/// Where the engine is in its settle.
enum Phase<T> {
    Idle,
    ReadingLoot { victim: i32 },
    ReadingThiefs(AwaitingThiefs<T>),
    Transacting(Plan<T>),
    Written(Written<T>),
    InDoubt(Checkpoint<T>),
    Ended,
}

impl<T> Phase<T> {
    fn name(&self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::ReadingLoot { .. } => "reading the loot",
            Phase::ReadingThiefs(_) => "reading the thief's checkpoint",
            Phase::Transacting(_) => "transacting",
            Phase::Written(_) => "awaiting the transaction's end",
            Phase::InDoubt(_) => "in doubt",
            Phase::Ended => "ended",
        }
    }
}

/// One settle of a worker of problem `P`, from its first read until it took effect, failed,
/// or (in doubt) the recovery decided it.
pub struct Settling<P: Problem> {
    settle: Settle,
    phase: Phase<P::Task>,
}

impl<P: Problem> Settling<P> {
    /// `settle` before it starts: [`Event::Start`] returns its first command.
    pub fn new(settle: Settle) -> Settling<P> {
        Settling { settle, phase: Phase::Idle }
    }

    /// The command that follows `event`; `machine` is the settling worker, whose pure
    /// computations decide what the settle reads and writes.
    ///
    /// # Panics
    /// On an event the current command cannot produce (a driver bug).
    pub fn next(&mut self, event: Event<'_>, machine: &Worker<'_, P>) -> Command<P::Task> {
        let phase = std::mem::replace(&mut self.phase, Phase::Ended);
        match (phase, event) {
            (Phase::Idle, Event::Start) => self.start(machine.me()),
            (Phase::ReadingLoot { victim }, Event::LootRead(stored)) => {
                self.on_loot(victim, stored, machine)
            }
            (Phase::ReadingThiefs(awaiting), Event::CheckpointRead(stored)) => {
                match decode_checkpoint(stored.as_deref()) {
                    Ok(thiefs) => self.transact(awaiting.with(thiefs), machine.me()),
                    Err(Corrupt) => Command::Corrupt("checkpoint"),
                }
            }
            (Phase::Transacting(plan), Event::Locked(reads)) => self.write(&plan, reads, machine),
            (Phase::Transacting(_), Event::Transacted(outcome)) => {
                self.end(Written { state: None, corrupt: None }, &outcome)
            }
            (Phase::Written(written), Event::Transacted(outcome)) => self.end(written, &outcome),
            (Phase::Transacting(_), Event::TransactionFailed) => Command::Fail,
            (Phase::Written(written), Event::TransactionFailed) => self.interrupted(written),
            (Phase::InDoubt(state), Event::Decided(decision)) => self.decided(state, decision),
            (phase, event) => panic!("settle {:?}: {event:?} while {}", self.settle, phase.name()),
        }
    }

    /// The writes of the transaction once it holds its locks and read `reads`: the
    /// [`Command::Write`] that [`Event::Locked`] returns (for the store's update callback).
    ///
    /// # Panics
    /// When no transaction is running (a driver bug).
    pub fn writes(&mut self, reads: &Reads, machine: &Worker<'_, P>) -> Vec<Write> {
        match self.next(Event::Locked(reads), machine) {
            Command::Write(writes) => writes,
            _ => unreachable!("a locked transaction is answered with its writes"),
        }
    }

    /// What the in-doubt settle changes once the recovery decided its transaction: the
    /// [`Command::TakeEffect`] that [`Event::Decided`] returns.
    ///
    /// # Panics
    /// When the settle is not in doubt (a driver bug).
    pub fn effect_of(
        &mut self,
        decision: Option<Decision>,
        machine: &Worker<'_, P>,
    ) -> Effect<P::Task> {
        match self.next(Event::Decided(decision), machine) {
            Command::TakeEffect(effect) => effect,
            _ => unreachable!("a decision is answered with the settle's effect"),
        }
    }

    fn start(&mut self, me: i32) -> Command<P::Task> {
        match self.settle {
            Settle::Adopt { dead } => self.transact(Plan::Adopt { dead }, me),
            Settle::Loot { victim } => {
                self.phase = Phase::ReadingLoot { victim };
                Command::ReadLoot { owner: victim }
            }
            Settle::TakeBack { thief } => {
                self.phase = Phase::ReadingThiefs(AwaitingThiefs::TakeBack);
                Command::ReadCheckpoint { owner: thief }
            }
        }
    }

    /// The failed `victim`'s `stored` loot key: nothing, or a loot this worker does not
    /// resolve, ends the settle; a loot of another thief needs that thief's checkpoint.
    fn on_loot(
        &mut self,
        victim: i32,
        stored: Option<Vec<u8>>,
        machine: &Worker<'_, P>,
    ) -> Command<P::Task> {
        let Some(stored) = stored else { return Command::TakeEffect(Effect::Unchanged) };
        let Some(loot) = Loot::decode(&stored) else { return Command::Corrupt("loot") };
        if !machine.resolves_loot(victim, &loot) {
            return Command::TakeEffect(Effect::Unchanged);
        }
        if loot.thief == machine.me() {
            return self.transact(Plan::Loot { victim, stored, loot, thiefs: None }, machine.me());
        }
        let thief = loot.thief;
        self.phase = Phase::ReadingThiefs(AwaitingThiefs::Loot { victim, stored, loot });
        Command::ReadCheckpoint { owner: thief }
    }

    fn transact(&mut self, plan: Plan<P::Task>, me: i32) -> Command<P::Task> {
        let txn = plan.txn(me, P::HANDS_OVER_RESULTS);
        self.phase = Phase::Transacting(plan);
        Command::Transact(txn)
    }

    /// The writes that follow from `reads`: the failed worker's emptied checkpoint (adopt) or
    /// the deleted loot key (loot, take back), then this worker's new state, if any. An
    /// adoption of a corrupt checkpoint writes nothing.
    fn write(
        &mut self,
        plan: &Plan<P::Task>,
        reads: &Reads,
        machine: &Worker<'_, P>,
    ) -> Command<P::Task> {
        let me = machine.me();
        let failed = plan.failed_worker().map_or(Ok(None), |w| checkpoint_in(reads, w));
        let corrupt = failed.is_err().then_some("checkpoint");
        let failed = failed.unwrap_or(None);
        let mut writes = Vec::new();
        let state = match plan {
            Plan::Adopt { .. } if corrupt.is_some() => None,
            Plan::Adopt { dead } => match handed_in(reads, *dead) {
                Err(Corrupt) => {
                    self.phase =
                        Phase::Written(Written { state: None, corrupt: Some("futures entry") });
                    return Command::Write(Vec::new());
                }
                Ok(handed) => machine.with_adopted(*dead, failed, &handed).map(|(new, emptied)| {
                    writes.push((Slot::Checkpoint.key(*dead), Some(emptied.encode())));
                    new
                }),
            },
            Plan::Loot { victim, loot, thiefs, .. } => {
                writes.push((Slot::Loot.key(*victim), None));
                machine.with_loot(*victim, loot, failed.as_ref(), thiefs.as_ref())
            }
            Plan::TakeBack { thiefs } => {
                writes.push((Slot::Loot.key(me), None));
                machine.with_taken_back(thiefs.as_ref())
            }
        };
        if let Some(new) = &state {
            writes.push((Slot::Checkpoint.key(me), Some(new.encode())));
        }
        self.phase = Phase::Written(Written { state, corrupt });
        Command::Write(writes)
    }

    /// The transaction ended with `outcome` after its writes would commit `written`.
    fn end(&self, written: Written<P::Task>, outcome: &Outcome) -> Command<P::Task> {
        if let Some(what) = written.corrupt {
            return Command::Corrupt(what);
        }
        let effect = match (outcome, written.state) {
            (Outcome::Committed { .. }, Some(state)) => {
                Effect::Settled { settle: self.settle, state: Box::new(state) }
            }
            _ if matches!(self.settle, Settle::TakeBack { .. }) => Effect::ClearPending,
            _ => Effect::Unchanged,
        };
        Command::TakeEffect(effect)
    }

    /// The transaction call failed after its writes would commit `written`: in doubt when
    /// they change the worker.
    fn interrupted(&mut self, written: Written<P::Task>) -> Command<P::Task> {
        match written.state {
            Some(state) => {
                self.phase = Phase::InDoubt(state);
                Command::RememberInDoubt
            }
            None => Command::Fail,
        }
    }

    /// The in-doubt settle takes effect iff its transaction committed.
    fn decided(&self, state: Checkpoint<P::Task>, decision: Option<Decision>) -> Command<P::Task> {
        let effect = match decision {
            Some(Decision::Committed) => {
                Effect::Settled { settle: self.settle, state: Box::new(state) }
            }
            Some(Decision::Aborted) | None => Effect::Unchanged,
        };
        Command::TakeEffect(effect)
    }
}

/// A stored value that does not decode.
struct Corrupt;

fn decode_checkpoint<T: Copy + serde::de::DeserializeOwned>(
    stored: Option<&[u8]>,
) -> Result<Option<Checkpoint<T>>, Corrupt> {
    stored.map(|bytes| Checkpoint::decode(bytes).ok_or(Corrupt)).transpose()
}

/// `owner`'s futures entry among a transaction's `reads` (empty: not read, or nothing
/// stored).
fn handed_in(reads: &Reads, owner: i32) -> Result<Vec<Owed>, Corrupt> {
    let key = Slot::Futures.key(owner);
    match reads.iter().find(|(read, ..)| *read == key).and_then(|(.., value)| value.as_deref()) {
        Some(bytes) => decode_handed(bytes).ok_or(Corrupt),
        None => Ok(Vec::new()),
    }
}

/// `owner`'s checkpoint among a transaction's `reads` (`None`: not read, or nothing stored).
fn checkpoint_in<T: Copy + serde::de::DeserializeOwned>(
    reads: &Reads,
    owner: i32,
) -> Result<Option<Checkpoint<T>>, Corrupt> {
    let key = Slot::Checkpoint.key(owner);
    let stored = reads.iter().find(|(read, ..)| *read == key);
    decode_checkpoint(stored.and_then(|(.., value)| value.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nqueens::{Board, NQueens};
    use crate::protocol::{Interval, PoolMessage, Settings};
    use std::time::Duration;

    const QUEENS: NQueens = NQueens { n: 6 };
    const SETTINGS: Settings =
        Settings { interval: Some(Interval::Tasks(1000)), batch: 4, seed: 1, localized: true };
    const BOARD: Board = Board { row: 1, columns: 1, left: 2, right: 0 };

    /// Worker 0 of 3, all alive, in its initial state.
    fn worker() -> Worker<'static, NQueens> {
        Worker::new(&QUEENS, SETTINGS, 0, 3)
    }

    /// Worker 0 of 3 that settled into a state with four boards, then gave two of them to
    /// thief 1 (steal 1), which has not acknowledged them.
    fn victim_of_thief_1() -> Worker<'static, NQueens> {
        let mut w = worker();
        w.settled(Settle::Adopt { dead: 2 }, Checkpoint { pool: vec![BOARD; 4], ..initial(0) });
        w.on_message(1, PoolMessage::Steal, Duration::ZERO);
        w
    }

    fn initial(worker: i32) -> Checkpoint<Board> {
        Checkpoint::initial(&QUEENS, worker, 3)
    }

    /// A stored checkpoint with `pool` boards that gave loot up to steal `last_given` and
    /// holds the loot of each victim up to steal `received`.
    fn stored(pool: usize, last_given: u64, received: [u64; 3]) -> Checkpoint<Board> {
        Checkpoint {
            pool: vec![BOARD; pool],
            last_given,
            received: received.to_vec(),
            ..initial(1)
        }
    }

    /// Loot `steal_id` of three boards to `thief`, as stored.
    fn loot(steal_id: u64, thief: i32) -> Loot<Board> {
        Loot { steal_id, thief, tasks: vec![BOARD; 3] }
    }

    /// The values a transaction read: `(key, value)` pairs at version 1.
    fn reads(values: &[(Key, Option<Vec<u8>>)]) -> Vec<(Key, u64, Option<Vec<u8>>)> {
        values.iter().map(|(key, value)| (*key, 1, value.clone())).collect()
    }

    fn committed() -> Event<'static> {
        Event::Transacted(Outcome::Committed { reads: Vec::new() })
    }

    fn settled(settle: Settle, state: Checkpoint<Board>) -> Command<Board> {
        Command::TakeEffect(Effect::Settled { settle, state: Box::new(state) })
    }

    const UNCHANGED: Command<Board> = Command::TakeEffect(Effect::Unchanged);

    /// Feeds `events` in order to a new engine for `settle` on `machine`; the commands that
    /// came out, and the engine.
    fn drive(
        settle: Settle,
        machine: &Worker<'static, NQueens>,
        events: Vec<Event>,
    ) -> (Vec<Command<Board>>, Settling<NQueens>) {
        let mut engine = Settling::new(settle);
        let commands = events.into_iter().map(|e| engine.next(e, machine)).collect();
        (commands, engine)
    }

    fn adopt_txn() -> Txn {
        Txn { reads: vec![Slot::Checkpoint.key(0), Slot::Checkpoint.key(2)], ..Txn::default() }
    }

    #[test]
    fn adopt_table() {
        let machine = worker();
        let theirs = stored(2, 0, [0, 0, 0]);
        let (with_theirs, emptied) = machine.with_adopted(2, Some(theirs.clone()), &[]).unwrap();
        let (with_initial, initial_emptied) = machine.with_adopted(2, None, &[]).unwrap();
        let adopted_already = theirs.emptied(1);
        // (case, dead worker's stored checkpoint, writes, end)
        let table = [
            (
                "its checkpoint joins this worker's and is written back emptied",
                Some(theirs.encode()),
                vec![
                    (Slot::Checkpoint.key(2), Some(emptied.encode())),
                    (Slot::Checkpoint.key(0), Some(with_theirs.encode())),
                ],
                settled(Settle::Adopt { dead: 2 }, with_theirs),
            ),
            (
                "a worker that never wrote one is adopted at its initial state",
                None,
                vec![
                    (Slot::Checkpoint.key(2), Some(initial_emptied.encode())),
                    (Slot::Checkpoint.key(0), Some(with_initial.encode())),
                ],
                settled(Settle::Adopt { dead: 2 }, with_initial),
            ),
            ("adopted already: nothing", Some(adopted_already.encode()), vec![], UNCHANGED),
            (
                "a corrupt checkpoint: nothing written, the settle fails",
                Some(b"not a checkpoint".to_vec()),
                vec![],
                Command::Corrupt("checkpoint"),
            ),
        ];
        for (case, theirs, writes, end) in table {
            let read = reads(&[
                (Slot::Checkpoint.key(0), Some(initial(0).encode())),
                (Slot::Checkpoint.key(2), theirs),
            ]);
            let events = vec![Event::Start, Event::Locked(&read), committed()];
            let (commands, _) = drive(Settle::Adopt { dead: 2 }, &machine, events);
            let expected = vec![Command::Transact(adopt_txn()), Command::Write(writes), end];
            assert_eq!(commands, expected, "{case}");
        }
    }

    #[test]
    fn loot_that_is_not_this_worker_s_to_resolve_ends_after_the_read() {
        let machine = worker();
        let read_loot = Command::ReadLoot { owner: 1 };
        // (case, stored loot key of victim 1, commands after the read)
        let table = [
            ("no stored loot", None, UNCHANGED),
            ("the thief lives and is another worker", Some(loot(1, 2).encode()), UNCHANGED),
            ("a corrupt loot", Some(b"x".to_vec()), Command::Corrupt("loot")),
        ];
        for (case, stored, end) in table {
            let events = vec![Event::Start, Event::LootRead(stored)];
            let (commands, _) = drive(Settle::Loot { victim: 1 }, &machine, events);
            assert_eq!(commands, vec![read_loot.clone(), end], "{case}");
        }
    }

    fn loot_txn(stored: &Loot<Board>) -> Txn {
        Txn {
            reads: vec![Slot::Checkpoint.key(0), Slot::Checkpoint.key(1)],
            conditions: vec![(Slot::Loot.key(1), Expect::Value(Some(stored.encode())))],
            ..Txn::default()
        }
    }

    #[test]
    fn loot_of_this_worker_as_thief_is_taken_when_the_victim_s_checkpoint_left_it_out() {
        let machine = worker();
        let stolen = loot(1, 0);
        let taken = machine.with_loot(1, &stolen, Some(&stored(1, 1, [0; 3])), None).unwrap();
        // (case, victim 1's stored checkpoint, writes, end)
        let table = [
            (
                "left out: the loot joins this worker's pool",
                stored(1, 1, [0; 3]),
                vec![(Slot::Loot.key(1), None), (Slot::Checkpoint.key(0), Some(taken.encode()))],
                settled(Settle::Loot { victim: 1 }, taken),
            ),
            (
                "still in the victim's pool: the key is only deleted",
                stored(4, 0, [0; 3]),
                vec![(Slot::Loot.key(1), None)],
                UNCHANGED,
            ),
        ];
        for (case, victims, writes, end) in table {
            let read = reads(&[
                (Slot::Checkpoint.key(0), None),
                (Slot::Checkpoint.key(1), Some(victims.encode())),
            ]);
            let events = vec![
                Event::Start,
                Event::LootRead(Some(stolen.encode())),
                Event::Locked(&read),
                committed(),
            ];
            let (commands, _) = drive(Settle::Loot { victim: 1 }, &machine, events);
            let expected = vec![
                Command::ReadLoot { owner: 1 },
                Command::Transact(loot_txn(&stolen)),
                Command::Write(writes),
                end,
            ];
            assert_eq!(commands, expected, "{case}");
        }
    }

    #[test]
    fn loot_of_a_failed_thief_is_resolved_by_the_victim_s_buddy_after_reading_the_thief() {
        let mut machine = worker();
        machine.on_failures(&[1, 2], Duration::ZERO);
        let stolen = loot(1, 2);
        let victims = stored(1, 1, [0; 3]);
        let taken = machine.with_loot(1, &stolen, Some(&victims), None).unwrap();
        let reads_of_the_victim =
            [(Slot::Checkpoint.key(0), None), (Slot::Checkpoint.key(1), Some(victims.encode()))];
        // (case, thief 2's stored checkpoint, writes, end)
        let table = [
            (
                "the thief never checkpointed it: the buddy takes it",
                stored(0, 0, [0; 3]),
                vec![(Slot::Loot.key(1), None), (Slot::Checkpoint.key(0), Some(taken.encode()))],
                settled(Settle::Loot { victim: 1 }, taken),
            ),
            (
                "the thief checkpointed it: the key is only deleted",
                stored(3, 0, [0, 1, 0]),
                vec![(Slot::Loot.key(1), None)],
                UNCHANGED,
            ),
        ];
        for (case, thiefs, writes, end) in table {
            let read = reads(&reads_of_the_victim);
            let events = vec![
                Event::Start,
                Event::LootRead(Some(stolen.encode())),
                Event::CheckpointRead(Some(thiefs.encode())),
                Event::Locked(&read),
                committed(),
            ];
            let (commands, _) = drive(Settle::Loot { victim: 1 }, &machine, events);
            let expected = vec![
                Command::ReadLoot { owner: 1 },
                Command::ReadCheckpoint { owner: 2 },
                Command::Transact(loot_txn(&stolen)),
                Command::Write(writes),
                end,
            ];
            assert_eq!(commands, expected, "{case}");
        }
        let corrupt_thiefs = vec![
            Event::Start,
            Event::LootRead(Some(stolen.encode())),
            Event::CheckpointRead(Some(b"x".to_vec())),
        ];
        let (commands, _) = drive(Settle::Loot { victim: 1 }, &machine, corrupt_thiefs);
        assert_eq!(commands.last(), Some(&Command::Corrupt("checkpoint")), "a corrupt thief's");
    }

    #[test]
    fn take_back_table() {
        let machine = victim_of_thief_1();
        let back = machine.with_taken_back(None).unwrap();
        let kept = machine.with_taken_back(Some(&stored(2, 0, [1, 0, 0]))).unwrap();
        let txn = Txn { reads: vec![Slot::Checkpoint.key(0), Slot::Loot.key(0)], ..Txn::default() };
        let take_back = Settle::TakeBack { thief: 1 };
        // (case, thief 1's stored checkpoint, writes, end)
        let table = [
            (
                "the thief never checkpointed it: back in the pool",
                None,
                vec![(Slot::Loot.key(0), None), (Slot::Checkpoint.key(0), Some(back.encode()))],
                settled(take_back, back),
            ),
            (
                "the thief checkpointed it: the pool stays, the loot in flight is forgotten",
                Some(stored(2, 0, [1, 0, 0]).encode()),
                vec![(Slot::Loot.key(0), None), (Slot::Checkpoint.key(0), Some(kept.encode()))],
                settled(take_back, kept),
            ),
        ];
        for (case, thiefs, writes, end) in table {
            let read = reads(&[(Slot::Checkpoint.key(0), None), (Slot::Loot.key(0), None)]);
            let events = vec![
                Event::Start,
                Event::CheckpointRead(thiefs),
                Event::Locked(&read),
                committed(),
            ];
            let (commands, _) = drive(take_back, &machine, events);
            let expected = vec![
                Command::ReadCheckpoint { owner: 1 },
                Command::Transact(txn.clone()),
                Command::Write(writes),
                end,
            ];
            assert_eq!(commands, expected, "{case}");
        }
        let nothing_in_flight = worker();
        let read = reads(&[(Slot::Checkpoint.key(0), None), (Slot::Loot.key(0), None)]);
        let events =
            vec![Event::Start, Event::CheckpointRead(None), Event::Locked(&read), committed()];
        let (commands, _) = drive(take_back, &nothing_in_flight, events);
        let expected = vec![
            Command::ReadCheckpoint { owner: 1 },
            Command::Transact(txn),
            Command::Write(vec![(Slot::Loot.key(0), None)]),
            Command::TakeEffect(Effect::ClearPending),
        ];
        assert_eq!(commands, expected, "nothing in flight any more: the key is deleted");
    }

    #[test]
    fn only_a_committed_transaction_with_a_new_state_changes_the_worker() {
        let aborted = |key| Event::Transacted(Outcome::Aborted { condition: key });
        let stolen = loot(1, 0);
        let victims = stored(1, 1, [0; 3]);
        let read = reads(&[
            (Slot::Checkpoint.key(0), None),
            (Slot::Checkpoint.key(1), Some(victims.encode())),
        ]);
        let thief = worker();
        let taken = thief.with_loot(1, &stolen, Some(&victims), None).unwrap();
        let loot_settle = Settle::Loot { victim: 1 };
        let loot_events = |end: Event<'static>| {
            vec![Event::Start, Event::LootRead(Some(stolen.encode())), Event::Locked(&read), end]
        };
        let (commands, _) = drive(loot_settle, &thief, loot_events(committed()));
        assert_eq!(commands.last(), Some(&settled(loot_settle, taken)), "committed");
        let (commands, _) = drive(loot_settle, &thief, loot_events(aborted(Slot::Loot.key(1))));
        assert_eq!(commands.last(), Some(&UNCHANGED), "aborted");
        let before_the_lock =
            vec![Event::Start, Event::LootRead(Some(stolen.encode())), aborted(Slot::Loot.key(1))];
        let (commands, _) = drive(loot_settle, &thief, before_the_lock);
        assert_eq!(commands.last(), Some(&UNCHANGED), "the loot key changed: nothing was written");
        let victim = victim_of_thief_1();
        let take_back = Settle::TakeBack { thief: 1 };
        let events = vec![Event::Start, Event::CheckpointRead(None), aborted(Slot::Loot.key(0))];
        let (commands, _) = drive(take_back, &victim, events);
        assert_eq!(commands.last(), Some(&Command::TakeEffect(Effect::ClearPending)), "take back");
    }

    #[test]
    fn a_failed_call_leaves_a_change_in_doubt_until_the_recovery_decides_it() {
        let machine = worker();
        let (adopted, _) = machine.with_adopted(2, None, &[]).unwrap();
        let read = reads(&[(Slot::Checkpoint.key(0), None), (Slot::Checkpoint.key(2), None)]);
        let adopt = Settle::Adopt { dead: 2 };
        // (decision, effect)
        let table = [
            (
                Some(Decision::Committed),
                Effect::Settled { settle: adopt, state: Box::new(adopted) },
            ),
            (Some(Decision::Aborted), Effect::Unchanged),
            (None, Effect::Unchanged),
        ];
        for (decision, effect) in table {
            let events = vec![Event::Start, Event::Locked(&read), Event::TransactionFailed];
            let (commands, mut engine) = drive(adopt, &machine, events);
            assert_eq!(commands.last(), Some(&Command::RememberInDoubt), "{decision:?}");
            assert_eq!(engine.effect_of(decision, &machine), effect, "{decision:?}");
        }
    }

    #[test]
    fn a_failed_call_without_a_change_is_not_in_doubt() {
        let machine = worker();
        let adopted_already = stored(0, 0, [0; 3]).emptied(1);
        let read = reads(&[
            (Slot::Checkpoint.key(0), None),
            (Slot::Checkpoint.key(2), Some(adopted_already.encode())),
        ]);
        let cases = [
            ("before the lock", vec![Event::Start, Event::TransactionFailed]),
            (
                "after writing nothing",
                vec![Event::Start, Event::Locked(&read), Event::TransactionFailed],
            ),
        ];
        for (case, events) in cases {
            let (commands, _) = drive(Settle::Adopt { dead: 2 }, &machine, events);
            assert_eq!(commands.last(), Some(&Command::Fail), "{case}");
        }
    }

    #[test]
    #[should_panic(expected = "settle Adopt")]
    fn an_event_out_of_turn_is_a_driver_bug() {
        drive(Settle::Adopt { dead: 2 }, &worker(), vec![Event::Start, Event::LootRead(None)]);
    }

    #[test]
    #[should_panic(expected = "settle TakeBack")]
    fn a_decision_for_a_settle_that_is_not_in_doubt_is_a_driver_bug() {
        let events = vec![Event::Start, Event::Decided(Some(Decision::Committed))];
        drive(Settle::TakeBack { thief: 1 }, &worker(), events);
    }
}
