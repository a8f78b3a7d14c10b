//! The resolution of a transaction record left open, as an engine without I/O: it takes what
//! its last command found ([`Event`]) and returns the next [`Command`]; [`crate::txn::resolve`]
//! (a backup's duty to a failed coordinator) and [`crate::txn::finish_own`] (a coordinator's
//! own transaction after a global recovery) are the runtimes that execute the commands on a
//! [`Backend`](crate::txn::Backend), with the executor of [`crate::txn::run`].
//!
//! A resolution reads the coordinator's newest record, then closes it: a `Committed` record is
//! written again to every live holder (so a later backup reads the same decision), its writes
//! are applied and it is marked `Done`; a `Locking` one is marked `Aborted`; a `Done` or
//! `Aborted` one stays as it is. Then every lock of the record is released, from the last key
//! to the first. A failing command (the runtime's error) ends the resolution where it is: the
//! record decides, and the next resolution of it (the next backup's, or the one after the next
//! recovery) starts again from its newest version.

use std::fmt::Debug;

use crate::engine::txn::coordinator::{Event, Op};
use crate::engine::txn::types::{Decision, RecordState, Resolution, TxId, TxRecord};

/// What the resolution asks its runtime for next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<R> {
    /// Runs the failure-injection point `step` (when there is one), then `op`.
    Io { step: Option<&'static str>, op: Op },
    /// The resolution is over, with what it decided.
    Finish(R),
}

/// Whose open transaction a [`Resolver`] resolves, and what it reports.
pub trait Duty {
    /// What the resolution decided.
    type Report: Debug;
    /// The failure-injection point before the record is read.
    const STEP: &'static str;
    /// The coordinator whose record is read.
    fn coordinator(&self) -> i32;
    /// The record to close, of `newest`, the coordinator's newest record (`None`: it has none).
    fn record_to_close(&self, newest: Option<TxRecord>) -> Option<TxRecord>;
    /// What closing `record` decides (`None`: nothing to close).
    fn report(&self, record: Option<&TxRecord>) -> Self::Report;
}

/// A backup's duty to the failed `coordinator` ([`crate::txn::resolve`]): closes its newest
/// record whatever its state (the locks of one already closed are released again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolveFailed {
    pub coordinator: i32,
}

impl Duty for ResolveFailed {
    type Report = Resolution;
    const STEP: &'static str = "tx_resolve";

    fn coordinator(&self) -> i32 {
        self.coordinator
    }

    fn record_to_close(&self, newest: Option<TxRecord>) -> Option<TxRecord> {
        newest
    }

    /// A `Committed` record is rolled forward, a `Locking` one aborted; a closed one (or none)
    /// left nothing open.
    fn report(&self, record: Option<&TxRecord>) -> Resolution {
        match record.map(|r| (r.id, r.state)) {
            Some((id, RecordState::Committed)) => Resolution::RolledForward(id),
            Some((id, RecordState::Locking)) => Resolution::Aborted(id),
            Some((_, RecordState::Done | RecordState::Aborted)) | None => Resolution::Nothing,
        }
    }
}

/// A coordinator's finish of its own transaction `id` ([`crate::txn::finish_own`]): closes the
/// newest record when it is `id`'s. None of `id` (an older transaction's record is the newest)
/// means the announcement never became durable, so nothing of `id` was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FinishOwn {
    pub id: TxId,
}

impl Duty for FinishOwn {
    type Report = Decision;
    const STEP: &'static str = "tx_finish";

    fn coordinator(&self) -> i32 {
        self.id.coordinator()
    }

    fn record_to_close(&self, newest: Option<TxRecord>) -> Option<TxRecord> {
        newest.filter(|record| record.id == self.id)
    }

    /// Committed once the record was: a `Committed` record is rolled forward, a `Done` one
    /// was applied; anything else wrote nothing.
    fn report(&self, record: Option<&TxRecord>) -> Decision {
        match record.map(|r| r.state) {
            Some(RecordState::Committed | RecordState::Done) => Decision::Committed,
            Some(RecordState::Locking | RecordState::Aborted) | None => Decision::Aborted,
        }
    }
}

/// One planned I/O: the failure-injection point (when there is one) and the operation.
type PlannedIo = (Option<&'static str>, Op);

/// Where the resolution is.
#[derive(Debug)]
enum Phase<R> {
    /// Before [`Event::Start`].
    Starting,
    /// Reading the coordinator's newest record.
    ReadingRecord,
    /// Running `remaining`, one at a time (each finds [`Event::Done`]), then reporting `report`.
    Closing { remaining: std::vec::IntoIter<PlannedIo>, report: R },
    /// Over: no event is expected any more.
    Finished,
}

/// The resolution of one coordinator's open transaction, for `duty`.
#[derive(Debug)]
pub struct Resolver<D: Duty> {
    duty: D,
    phase: Phase<D::Report>,
}

impl<D: Duty> Resolver<D> {
    /// A resolution for `duty` that waits for [`Event::Start`].
    pub fn new(duty: D) -> Resolver<D> {
        Resolver { duty, phase: Phase::Starting }
    }

    /// The command that follows `event`, what the previous command found: [`Event::Start`]
    /// first, the record read after [`Op::ReadRecord`], [`Event::Done`] after any other.
    ///
    /// # Panics
    /// On an event the previous command cannot find, or any event after [`Command::Finish`]
    /// (a driver bug).
    pub fn next(&mut self, event: Event) -> Command<D::Report> {
        match (std::mem::replace(&mut self.phase, Phase::Finished), event) {
            (Phase::Starting, Event::Start) => {
                self.phase = Phase::ReadingRecord;
                let op = Op::ReadRecord(self.duty.coordinator());
                Command::Io { step: Some(D::STEP), op }
            }
            (Phase::ReadingRecord, Event::Record(newest)) => self.close(newest),
            (Phase::Closing { remaining, report }, Event::Done) => {
                self.continue_closing(remaining, report)
            }
            (phase, event) => panic!("transaction resolution: {event:?} in {phase:?}"),
        }
    }

    /// Plans the closing of the record the duty closes of `newest`, and starts it.
    fn close(&mut self, newest: Option<TxRecord>) -> Command<D::Report> {
        let record = self.duty.record_to_close(newest);
        let report = self.duty.report(record.as_ref());
        let planned = record.as_ref().map_or_else(Vec::new, closing);
        self.continue_closing(planned.into_iter(), report)
    }

    /// The next of the `remaining` I/O, or `report` once none is left.
    fn continue_closing(
        &mut self,
        mut remaining: std::vec::IntoIter<PlannedIo>,
        report: D::Report,
    ) -> Command<D::Report> {
        let Some((step, op)) = remaining.next() else { return Command::Finish(report) };
        self.phase = Phase::Closing { remaining, report };
        Command::Io { step, op }
    }
}

/// The I/O that brings `record` to its end state (`Done` or `Aborted`) and releases its locks.
fn closing(record: &TxRecord) -> Vec<PlannedIo> {
    let mut planned = match record.state {
        RecordState::Done | RecordState::Aborted => Vec::new(),
        RecordState::Committed => rolling_forward(record),
        RecordState::Locking => {
            let aborted = TxRecord { state: RecordState::Aborted, ..record.clone() };
            vec![(Some("tx_abort"), Op::WriteRecord(aborted))]
        }
    };
    planned.extend(unlocking(record));
    planned
}

/// A committed record written again to every live holder, its writes, and its `Done` record.
fn rolling_forward(record: &TxRecord) -> Vec<PlannedIo> {
    let again = (None, Op::WriteRecord(record.clone()));
    let writes = record
        .writes
        .iter()
        .map(|(key, version, value)| (Some("tx_apply"), Op::Write(*key, *version, value.clone())));
    let done = TxRecord { state: RecordState::Done, ..record.clone() };
    let done = (Some("tx_done"), Op::WriteRecord(done));
    std::iter::once(again).chain(writes).chain(std::iter::once(done)).collect()
}

/// The release of every lock of `record`, from the last key to the first.
fn unlocking(record: &TxRecord) -> impl Iterator<Item = PlannedIo> + '_ {
    let release = move |&key| (Some("tx_unlock"), Op::ReleaseLock(key, record.id));
    record.keys.iter().rev().map(release)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Key;

    /// Coordinator 4's transaction, and an older one of it.
    const ID: TxId = TxId(5 << 32 | 2);
    const OLDER: TxId = TxId(5 << 32 | 1);
    const COORDINATOR: i32 = 4;

    const STATES: [RecordState; 4] =
        [RecordState::Locking, RecordState::Committed, RecordState::Done, RecordState::Aborted];

    fn key(owner: i32) -> Key {
        Key::new(owner, 0)
    }

    /// A record of transaction `id` over keys 1 and 2 that writes both.
    fn record(id: TxId, state: RecordState) -> TxRecord {
        let writes = vec![(key(1), 5, Some(b"new".to_vec())), (key(2), 10, None)];
        TxRecord { id, state, keys: vec![key(1), key(2)], writes }
    }

    fn io<R>(step: Option<&'static str>, op: Op) -> Command<R> {
        Command::Io { step, op }
    }

    /// Runs a resolver for `duty`: [`Event::Start`], `newest` as the record read, then
    /// [`Event::Done`] after every further I/O; every command, up to the report.
    fn drive<D: Duty>(duty: D, newest: Option<TxRecord>) -> Vec<Command<D::Report>> {
        let mut resolver = Resolver::new(duty);
        let mut commands = vec![resolver.next(Event::Start), resolver.next(Event::Record(newest))];
        while let Some(Command::Io { .. }) = commands.last() {
            assert!(commands.len() < 20, "the resolution never reports");
            commands.push(resolver.next(Event::Done));
        }
        commands
    }

    /// The release of record's locks: key 2, then key 1.
    fn unlocks<R>() -> Vec<Command<R>> {
        vec![
            io(Some("tx_unlock"), Op::ReleaseLock(key(2), ID)),
            io(Some("tx_unlock"), Op::ReleaseLock(key(1), ID)),
        ]
    }

    fn aborts_and_unlocks<R>() -> Vec<Command<R>> {
        let mut commands =
            vec![io(Some("tx_abort"), Op::WriteRecord(record(ID, RecordState::Aborted)))];
        commands.extend(unlocks());
        commands
    }

    fn rolls_forward_and_unlocks<R>() -> Vec<Command<R>> {
        let mut commands = vec![
            io(None, Op::WriteRecord(record(ID, RecordState::Committed))),
            io(Some("tx_apply"), Op::Write(key(1), 5, Some(b"new".to_vec()))),
            io(Some("tx_apply"), Op::Write(key(2), 10, None)),
            io(Some("tx_done"), Op::WriteRecord(record(ID, RecordState::Done))),
        ];
        commands.extend(unlocks());
        commands
    }

    /// The read of the record at `step`, then `closing`, then the report.
    fn expected<R>(step: &'static str, closing: Vec<Command<R>>, report: R) -> Vec<Command<R>> {
        let mut commands = vec![io(Some(step), Op::ReadRecord(COORDINATOR))];
        commands.extend(closing);
        commands.push(Command::Finish(report));
        commands
    }

    #[test]
    fn a_backup_closes_the_newest_record_by_its_state() {
        let backup = ResolveFailed { coordinator: COORDINATOR };
        let cases = [
            (None, vec![], Resolution::Nothing),
            (Some(RecordState::Locking), aborts_and_unlocks(), Resolution::Aborted(ID)),
            (
                Some(RecordState::Committed),
                rolls_forward_and_unlocks(),
                Resolution::RolledForward(ID),
            ),
            (Some(RecordState::Done), unlocks(), Resolution::Nothing),
            (Some(RecordState::Aborted), unlocks(), Resolution::Nothing),
        ];
        for (state, closing, report) in cases {
            let newest = state.map(|state| record(ID, state));
            let commands = drive(backup, newest);
            assert_eq!(commands, expected("tx_resolve", closing, report), "{state:?}");
        }
    }

    #[test]
    fn a_coordinator_closes_its_own_record_by_its_state() {
        let own = FinishOwn { id: ID };
        let cases = [
            (RecordState::Locking, aborts_and_unlocks(), Decision::Aborted),
            (RecordState::Committed, rolls_forward_and_unlocks(), Decision::Committed),
            (RecordState::Done, unlocks(), Decision::Committed),
            (RecordState::Aborted, unlocks(), Decision::Aborted),
        ];
        for (state, closing, decision) in cases {
            let commands = drive(own, Some(record(ID, state)));
            assert_eq!(commands, expected("tx_finish", closing, decision), "{state:?}");
        }
    }

    #[test]
    fn a_coordinator_without_a_record_of_its_own_transaction_finds_it_aborted() {
        let own = FinishOwn { id: ID };
        let nothing_written = expected("tx_finish", vec![], Decision::Aborted);
        assert_eq!(drive(own, None), nothing_written, "no record");
        for state in STATES {
            let older = Some(record(OLDER, state));
            assert_eq!(drive(own, older), nothing_written, "an older {state:?} record");
        }
    }

    #[test]
    #[should_panic(expected = "transaction resolution")]
    fn an_event_out_of_turn_is_a_driver_bug() {
        let mut resolver = Resolver::new(ResolveFailed { coordinator: COORDINATOR });
        resolver.next(Event::Start);
        resolver.next(Event::Done);
    }

    #[test]
    #[should_panic(expected = "transaction resolution")]
    fn an_event_after_the_report_is_a_driver_bug() {
        let mut resolver = Resolver::new(FinishOwn { id: ID });
        resolver.next(Event::Start);
        assert_eq!(resolver.next(Event::Record(None)), Command::Finish(Decision::Aborted));
        resolver.next(Event::Done);
    }
}
