//! The coordinator of one transaction as an engine without I/O: it takes what its last command
//! found ([`Event`]) and returns the next [`Command`]; [`crate::txn::run`] is the runtime that
//! executes the commands on a [`Backend`](crate::txn::Backend). The protocol is the one of
//! [`crate::txn`]: announce, lock every key in key order, read, check the conditions, compute
//! the update's writes, commit, apply, mark done, unlock; a failed condition, a write to a key
//! the transaction does not name, or a lock held too long ends it through an aborted record
//! and the release of the locks it took. A failing command (the runtime's error) ends the run
//! where it is: the record decides, and the backups finish it.

use crate::engine::txn::types::{Expect, Outcome, RecordState, TxId, TxRecord, Txn};
use crate::key::Key;

/// One I/O operation of a coordinator or of a resolution ([`crate::engine::txn::resolution`]). Each
/// names the transaction it acts for, so one executor runs both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// The newest transaction record of the coordinator.
    ReadRecord(i32),
    /// Writes the record to every live holder of its coordinator's record (a new version).
    WriteRecord(TxRecord),
    /// Compare-and-swap of the key's lock word from free to the transaction's id.
    SwapLock(Key, TxId),
    /// The newest version of the key and its value.
    Read(Key),
    /// Writes the value (`None`: deletes) at the version to every live holder of the key.
    Write(Key, u64, Option<Vec<u8>>),
    /// Frees the key's lock word where it holds the transaction's id.
    ReleaseLock(Key, TxId),
}

/// What the coordinator asks its runtime for next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Runs the failure-injection point `step` (when there is one), then `op`.
    Io { step: Option<&'static str>, op: Op },
    /// Resolves the failed coordinators this worker is the backup of (a lock it waits for may
    /// be held by one of them), then lets others run before the lock is tried again.
    ResolveDutiesAndWait,
    /// Computes the update's writes from every locked key's (key, version, value).
    Update(Vec<(Key, u64, Option<Vec<u8>>)>),
    /// The transaction is over.
    Finish(Result<Outcome, Refusal>),
}

/// Why a transaction ended without running to its decision, nothing written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A key stayed locked for the whole bound (by this many attempts).
    Contended { key: Key, attempts: usize },
    /// The update wrote a key the transaction did not name (and so did not lock).
    UnlockedWrite { key: Key },
}

/// What the runtime found doing the last command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The first event of a run.
    Start,
    /// A write, release, resolution or wait is done.
    Done,
    /// A lock swap: `None` when every holder now holds this transaction's id, else what the
    /// first other holder held.
    Swapped(Option<u64>),
    /// A read: the key's newest version and value.
    Read(u64, Option<Vec<u8>>),
    /// A record read: the coordinator's newest transaction record (`None`: it has none).
    Record(Option<TxRecord>),
    /// The update's writes.
    Updated(Vec<(Key, Option<Vec<u8>>)>),
}

/// Where the coordinator is.
#[derive(Debug)]
enum Phase {
    Announcing,
    /// Taking the lock of `keys[index]`, at its `attempts`-th swap.
    Locking {
        index: usize,
        attempts: usize,
    },
    /// Waiting after a swap that found the lock held.
    Waiting {
        index: usize,
        attempts: usize,
    },
    Reading {
        index: usize,
    },
    Updating,
    /// Writing `record.writes[index..]`, then the done record.
    Applying {
        index: usize,
    },
    /// Releasing `keys[..remaining]` from the last, then ending with `end` (after the done or
    /// the aborted record).
    Unlocking {
        remaining: usize,
        end: Result<Outcome, Refusal>,
    },
    /// Over, with this end (returned again if asked again).
    Finished(Result<Outcome, Refusal>),
    /// Only while [`Coordinator::next`] decides: every step sets the next phase.
    Deciding,
}

/// The coordinator of transaction `id` running `txn`.
#[derive(Debug)]
pub struct Coordinator<'t> {
    txn: &'t Txn,
    keys: Vec<Key>,
    record: TxRecord,
    lock_attempts: usize,
    reads: Vec<(u64, Option<Vec<u8>>)>,
    phase: Phase,
}

impl<'t> Coordinator<'t> {
    /// A coordinator that tries each lock up to `lock_attempts` times.
    pub fn new(id: TxId, txn: &'t Txn, lock_attempts: usize) -> Coordinator<'t> {
        let keys = txn.keys();
        let record =
            TxRecord { id, state: RecordState::Locking, keys: keys.clone(), writes: Vec::new() };
        Coordinator {
            txn,
            keys,
            record,
            lock_attempts,
            reads: Vec::new(),
            phase: Phase::Announcing,
        }
    }

    /// The command that follows `event`, what the previous command found.
    pub fn next(&mut self, event: Event) -> Command {
        match std::mem::replace(&mut self.phase, Phase::Deciding) {
            Phase::Announcing => {
                self.phase = Phase::Locking { index: 0, attempts: 0 };
                io(Some("tx_announce"), Op::WriteRecord(self.record.clone()))
            }
            Phase::Locking { index, attempts } => self.locking(index, attempts, event),
            Phase::Waiting { index, attempts } if attempts >= self.lock_attempts => {
                let end = Err(Refusal::Contended { key: self.keys[index], attempts });
                self.abandon(index, end)
            }
            Phase::Waiting { index, attempts } => self.swap(index, attempts),
            Phase::Reading { index } => self.reading(index, event),
            Phase::Updating => self.updating(event),
            Phase::Applying { index } => self.apply(index),
            Phase::Unlocking { remaining, end } => self.unlock(remaining, end),
            Phase::Finished(end) => {
                self.phase = Phase::Finished(end.clone());
                Command::Finish(end)
            }
            Phase::Deciding => unreachable!("next runs one step at a time (&mut self)"),
        }
    }

    /// After the announcement (`attempts` 0) or a swap of `keys[index]`'s lock.
    fn locking(&mut self, index: usize, attempts: usize, event: Event) -> Command {
        if attempts == 0 {
            return self.next_lock(index);
        }
        match event {
            Event::Swapped(None) => self.next_lock(index + 1),
            Event::Swapped(Some(held)) if held == self.record.id.0 => self.next_lock(index + 1),
            _ => {
                self.phase = Phase::Waiting { index, attempts };
                Command::ResolveDutiesAndWait
            }
        }
    }

    /// The first swap of `keys[index]`'s lock, or the reads once every key is locked.
    fn next_lock(&mut self, index: usize) -> Command {
        if index == self.keys.len() {
            return self.read(0, Some("tx_read"));
        }
        self.swap(index, 0)
    }

    fn swap(&mut self, index: usize, attempts: usize) -> Command {
        self.phase = Phase::Locking { index, attempts: attempts + 1 };
        io(Some("tx_lock"), Op::SwapLock(self.keys[index], self.record.id))
    }

    fn read(&mut self, index: usize, step: Option<&'static str>) -> Command {
        self.phase = Phase::Reading { index };
        io(step, Op::Read(self.keys[index]))
    }

    /// After the read of `keys[index]`.
    fn reading(&mut self, index: usize, event: Event) -> Command {
        if let Event::Read(version, value) = event {
            self.reads.push((version, value));
        }
        if index + 1 < self.keys.len() {
            return self.read(index + 1, None);
        }
        let failed = self.txn.conditions.iter().find(|(key, expect)| !self.holds(*key, expect));
        if let Some(&(condition, _)) = failed {
            let locked = self.keys.len();
            return self.abandon(locked, Ok(Outcome::Aborted { condition }));
        }
        self.phase = Phase::Updating;
        let locked = self.keys.iter().zip(&self.reads);
        Command::Update(locked.map(|(key, (v, value))| (*key, *v, value.clone())).collect())
    }

    /// After the update computed its writes: the commit, or the refusal of a write to a key
    /// that is not locked.
    fn updating(&mut self, event: Event) -> Command {
        let update = match event {
            Event::Updated(update) => update,
            _ => Vec::new(),
        };
        let mut wanted = self.txn.writes.clone();
        wanted.extend(update);
        if let Some(&(key, _)) = wanted.iter().find(|(key, _)| !self.keys.contains(key)) {
            let locked = self.keys.len();
            return self.abandon(locked, Err(Refusal::UnlockedWrite { key }));
        }
        let writes = wanted.into_iter().map(|(key, value)| (key, self.current(key).0 + 1, value));
        self.record.writes = writes.collect();
        self.record.state = RecordState::Committed;
        self.phase = Phase::Applying { index: 0 };
        io(Some("tx_commit"), Op::WriteRecord(self.record.clone()))
    }

    /// The write of `record.writes[index]`, or the done record once all are written.
    fn apply(&mut self, index: usize) -> Command {
        let Some((key, version, value)) = self.record.writes.get(index).cloned() else {
            self.phase = Phase::Unlocking { remaining: self.keys.len(), end: self.committed() };
            let done = TxRecord { state: RecordState::Done, ..self.record.clone() };
            return io(Some("tx_done"), Op::WriteRecord(done));
        };
        self.phase = Phase::Applying { index: index + 1 };
        io(Some("tx_apply"), Op::Write(key, version, value))
    }

    /// Ends a transaction that wrote nothing: the aborted record, then the release of the
    /// `locked` first keys, then `end`.
    fn abandon(&mut self, locked: usize, end: Result<Outcome, Refusal>) -> Command {
        self.phase = Phase::Unlocking { remaining: locked, end };
        let aborted = TxRecord { state: RecordState::Aborted, ..self.record.clone() };
        io(Some("tx_abort"), Op::WriteRecord(aborted))
    }

    /// Releases `keys[remaining - 1]` (the locks go from the last taken to the first), or ends
    /// with `end` once none is left.
    fn unlock(&mut self, remaining: usize, end: Result<Outcome, Refusal>) -> Command {
        if remaining == 0 {
            self.phase = Phase::Finished(end.clone());
            return Command::Finish(end);
        }
        let key = self.keys[remaining - 1];
        self.phase = Phase::Unlocking { remaining: remaining - 1, end };
        io(Some("tx_unlock"), Op::ReleaseLock(key, self.record.id))
    }

    /// The committed outcome: the values read, in [`Txn::reads`] order.
    fn committed(&self) -> Result<Outcome, Refusal> {
        let reads = self.txn.reads.iter().map(|&key| {
            let (version, value) = self.current(key);
            (key, *version, value.clone())
        });
        Ok(Outcome::Committed { reads: reads.collect() })
    }

    /// The version and value read of a locked key.
    fn current(&self, key: Key) -> &(u64, Option<Vec<u8>>) {
        let index = self.keys.iter().position(|&k| k == key).expect("a locked key");
        &self.reads[index]
    }

    fn holds(&self, key: Key, expect: &Expect) -> bool {
        let (version, value) = self.current(key);
        match expect {
            Expect::Version(expected) => version == expected,
            Expect::Value(expected) => value == expected,
        }
    }
}

fn io(step: Option<&'static str>, op: Op) -> Command {
    Command::Io { step, op }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: TxId = TxId(5 << 32 | 1);
    const OTHER: u64 = 7 << 32 | 3;

    fn key(owner: i32) -> Key {
        Key::new(owner, 0)
    }

    /// Runs `coordinator` on `events` (the first is [`Event::Start`]) and returns every command.
    fn drive(coordinator: &mut Coordinator<'_>, events: Vec<Event>) -> Vec<Command> {
        events.into_iter().map(|event| coordinator.next(event)).collect()
    }

    fn record(state: RecordState, keys: &[Key], writes: Vec<(Key, u64, Option<Vec<u8>>)>) -> Op {
        Op::WriteRecord(TxRecord { id: ID, state, keys: keys.to_vec(), writes })
    }

    #[test]
    fn a_transaction_without_contention_locks_reads_commits_applies_and_unlocks() {
        let txn = Txn {
            reads: vec![key(2)],
            conditions: vec![(key(1), Expect::Version(4))],
            writes: vec![(key(1), Some(b"new".to_vec()))],
        };
        let mut coordinator = Coordinator::new(ID, &txn, 10);
        let keys = [key(1), key(2)];
        let events = vec![
            Event::Start,
            Event::Done,
            Event::Swapped(None),
            Event::Swapped(Some(ID.0)),
            Event::Read(4, Some(b"old".to_vec())),
            Event::Read(9, None),
            Event::Updated(vec![(key(2), Some(b"too".to_vec()))]),
            Event::Done,
            Event::Done,
            Event::Done,
            Event::Done,
            Event::Done,
            Event::Done,
        ];
        let writes = vec![(key(1), 5, Some(b"new".to_vec())), (key(2), 10, Some(b"too".to_vec()))];
        let expected = vec![
            io(Some("tx_announce"), record(RecordState::Locking, &keys, vec![])),
            io(Some("tx_lock"), Op::SwapLock(key(1), ID)),
            io(Some("tx_lock"), Op::SwapLock(key(2), ID)),
            io(Some("tx_read"), Op::Read(key(1))),
            io(None, Op::Read(key(2))),
            Command::Update(vec![(key(1), 4, Some(b"old".to_vec())), (key(2), 9, None)]),
            io(Some("tx_commit"), record(RecordState::Committed, &keys, writes.clone())),
            io(Some("tx_apply"), Op::Write(key(1), 5, Some(b"new".to_vec()))),
            io(Some("tx_apply"), Op::Write(key(2), 10, Some(b"too".to_vec()))),
            io(Some("tx_done"), record(RecordState::Done, &keys, writes)),
            io(Some("tx_unlock"), Op::ReleaseLock(key(2), ID)),
            io(Some("tx_unlock"), Op::ReleaseLock(key(1), ID)),
            Command::Finish(Ok(Outcome::Committed { reads: vec![(key(2), 9, None)] })),
        ];
        assert_eq!(drive(&mut coordinator, events), expected);
    }

    #[test]
    fn a_held_lock_is_waited_for_and_tried_again_until_the_bound() {
        let txn = Txn { writes: vec![(key(1), None), (key(3), None)], ..Txn::default() };
        let mut coordinator = Coordinator::new(ID, &txn, 2);
        let keys = [key(1), key(3)];
        let events = vec![
            Event::Start,
            Event::Done,
            Event::Swapped(None),
            Event::Swapped(Some(OTHER)),
            Event::Done,
            Event::Swapped(Some(OTHER)),
            Event::Done,
            Event::Done,
            Event::Done,
        ];
        let expected = vec![
            io(Some("tx_announce"), record(RecordState::Locking, &keys, vec![])),
            io(Some("tx_lock"), Op::SwapLock(key(1), ID)),
            io(Some("tx_lock"), Op::SwapLock(key(3), ID)),
            Command::ResolveDutiesAndWait,
            io(Some("tx_lock"), Op::SwapLock(key(3), ID)),
            Command::ResolveDutiesAndWait,
            io(Some("tx_abort"), record(RecordState::Aborted, &keys, vec![])),
            io(Some("tx_unlock"), Op::ReleaseLock(key(1), ID)),
            Command::Finish(Err(Refusal::Contended { key: key(3), attempts: 2 })),
        ];
        assert_eq!(drive(&mut coordinator, events), expected);
    }

    #[test]
    fn a_condition_that_does_not_hold_aborts_and_releases_every_lock() {
        let txn = Txn {
            conditions: vec![(key(2), Expect::Value(Some(b"x".to_vec())))],
            writes: vec![(key(1), None)],
            ..Txn::default()
        };
        let mut coordinator = Coordinator::new(ID, &txn, 10);
        let keys = [key(1), key(2)];
        let events = vec![
            Event::Start,
            Event::Done,
            Event::Swapped(None),
            Event::Swapped(None),
            Event::Read(1, None),
            Event::Read(1, Some(b"y".to_vec())),
            Event::Done,
            Event::Done,
            Event::Done,
        ];
        let commands = drive(&mut coordinator, events);
        assert_eq!(commands[5], io(Some("tx_abort"), record(RecordState::Aborted, &keys, vec![])));
        assert_eq!(commands[6], io(Some("tx_unlock"), Op::ReleaseLock(key(2), ID)));
        assert_eq!(commands[7], io(Some("tx_unlock"), Op::ReleaseLock(key(1), ID)));
        assert_eq!(commands[8], Command::Finish(Ok(Outcome::Aborted { condition: key(2) })));
    }

    #[test]
    fn an_update_that_writes_an_unnamed_key_is_refused_before_anything_is_written() {
        let txn = Txn { reads: vec![key(1)], ..Txn::default() };
        let mut coordinator = Coordinator::new(ID, &txn, 10);
        let events = vec![
            Event::Start,
            Event::Done,
            Event::Swapped(None),
            Event::Read(3, None),
            Event::Updated(vec![(key(9), None)]),
            Event::Done,
            Event::Done,
        ];
        let commands = drive(&mut coordinator, events);
        let aborted = record(RecordState::Aborted, &[key(1)], vec![]);
        assert_eq!(commands[4], io(Some("tx_abort"), aborted));
        assert_eq!(commands[5], io(Some("tx_unlock"), Op::ReleaseLock(key(1), ID)));
        assert_eq!(commands[6], Command::Finish(Err(Refusal::UnlockedWrite { key: key(9) })));
        assert!(!commands.iter().any(|c| matches!(c, Command::Io { op: Op::Write(..), .. })));
    }
}
