//! The store's global recovery as a state machine without I/O: events in (a shrink's live set,
//! the exchanged records, an agreement's value), commands out (revoke, shrink, open a window,
//! exchange, copy, agree, commit, dispose, fail). [`Store::recover`](crate::Store::recover) executes
//! the commands on a real fabric; `ftkv_sim::recovery` executes them on a simulated one with seeded
//! interleavings and kills. Every decision of a recovery is taken here: whether this side may
//! go on (`plan::keeps_quorum`), the new layout, which copies this rank sends, which keys
//! are lost, this rank's agreement flags, and what an agreement means (commit, free or abandon
//! the attempt's window, retry, give up).
//!
//! One attempt: revoke the old communicator, shrink it, open a window on the survivors,
//! exchange every survivor's records (the versions it holds, and the keys it owns and wrote),
//! copy the newest version of each key to its new holders, barrier, then agree on whether
//! every survivor succeeded. Only the agreement is uniform across survivors (ULFM reports
//! other failures per process), so it alone decides.

use crate::engine::layout::{Layout, Shape};
use crate::engine::plan::{self, Record, OWNER_MARK};
use crate::key::Key;

/// How many attempts a recovery makes before it gives up.
pub const MAX_ATTEMPTS: usize = 16;

/// Agreement flag: this survivor's attempt succeeded and it saw no new failure.
pub const ATTEMPT_SUCCEEDED: u32 = 1;
/// Agreement flag: this survivor opened the attempt's window.
pub const WINDOW_OPENED: u32 = 2;

/// What a recovery starts from, the same on every survivor except `me` and `acked`.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// This worker's stable id.
    pub me: i32,
    /// Every worker's host, by worker id.
    pub hosts: Vec<u32>,
    pub kinds: usize,
    pub copies: usize,
    /// Reserve holders per copy in the layouts a recovery builds ([`crate::Config::spares`]).
    pub spares: usize,
    /// The layout of the last completed recovery (or of the creation); the layouts a recovery
    /// builds keep its slot geometry.
    pub previous: Layout,
    /// The last acknowledged version of each of this worker's own keys, by kind (0: none).
    pub acked: Vec<u64>,
}

/// What the driver reports back after executing a [`Command`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The revoke was issued (its own error, if any, changes nothing).
    Revoked,
    /// The shrink returned the live workers (stable ids, in rank order), or met a failure.
    Shrunk(Result<Vec<i32>, Fault>),
    /// The attempt's window was opened (outer `Ok`), and then this worker's scan of the
    /// previous window: the newest complete version of every slot it holds, read after the
    /// shrink, so that every survivor's put acknowledged before it joined the shrink is in it
    /// (a scan before the shrink could miss a put a survivor still completes meanwhile). A
    /// failed scan still counts the window as opened: everyone may free it.
    WindowOpened(Result<Result<Vec<(Key, u64)>, Fault>, Fault>),
    /// Every survivor's records, or a failure during the exchange.
    Exchanged(Result<Vec<Record>, Fault>),
    /// The copies were written and the barrier passed; `quiet`: no new failure is known here.
    Copied(Result<bool, Fault>),
    /// The agreement's value, and whether it saw failures this rank had not acknowledged.
    Agreed(Result<(u32, bool), Fault>),
    /// The attempt's window was freed or abandoned as commanded.
    Disposed,
}

/// A fabric call's failure as the machine needs it: a process failure, or anything else with
/// its message (kept, and reported if every attempt fails; the attempt is retried either way,
/// since the other survivors retry in lock-step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    Failure,
    Other(String),
}

/// What the driver must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Revoke the communicator of the previous attempt (the store's at the first), then report
    /// [`Event::Revoked`]. `attempt` counts from 1.
    Revoke { attempt: usize },
    /// Shrink the revoked communicator to its live members.
    Shrink,
    /// Open the window of `layout` (its `window_len` bytes per member) on the shrunk
    /// communicator, then scan the previous window's slots this worker holds.
    OpenWindow { layout: Layout },
    /// Allgather these records.
    Exchange { records: Vec<Record> },
    /// Write the newest version of each of `sends` (this rank holds it) to every new holder,
    /// then pass a barrier and report whether a failure is known.
    Copy { sends: Vec<Key> },
    /// Revoke the shrunk communicator first when `revoke` (the attempt failed here), then
    /// contribute `flags` to the agreement.
    Agree { flags: u32, revoke: bool },
    /// The recovery succeeded: adopt the attempt's window and layout.
    Commit(Committed),
    /// Free the attempt's window (collective: every survivor opened it) or abandon it, then
    /// report [`Event::Disposed`].
    Dispose { free: bool },
    /// The recovery ends without success.
    Fail(Failed),
}

/// A successful recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub layout: Layout,
    /// Keys with a surviving version.
    pub keys: usize,
    /// Keys lost: no copy survived, and the key was written (its live owner says so, or every
    /// holder it had died with its owner).
    pub lost: Vec<Key>,
    /// The agreement saw failures this rank had not acknowledged: another recovery is due.
    pub alarm: bool,
    pub attempts: usize,
}

/// Why a recovery ended without success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failed {
    /// This side holds no majority of the previous live set across hosts.
    Partitioned { live: Vec<i32>, previous: Vec<i32> },
    /// An error that is not a process failure.
    Error(String),
    /// Every attempt met a failure; the last error that was not a process failure, if any.
    Exhausted { last_error: Option<String> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Revoking,
    Shrinking,
    Opening,
    Exchanging,
    Copying,
    Agreeing,
    Disposing,
    Ended,
}

/// One survivor's recovery, driven by [`Machine::start`] and [`Machine::on`].
#[derive(Debug)]
pub struct Machine {
    inputs: Inputs,
    phase: Phase,
    attempt: usize,
    layout: Option<Layout>,
    opened: bool,
    /// The outcome of this attempt's rebuild, once known: keys recovered and keys lost.
    rebuilt: Option<(usize, Vec<Key>)>,
    /// The last error that was not a process failure (reported if every attempt fails: the
    /// others retry in lock-step, so one rank cannot leave on its own).
    error: Option<String>,
    /// Set when the agreement itself failed: the recovery ends once the window is disposed.
    ending: Option<Failed>,
}

impl Machine {
    pub fn new(inputs: Inputs) -> Machine {
        let (layout, rebuilt, error, ending) = (None, None, None, None);
        let phase = Phase::Revoking;
        Machine { inputs, phase, attempt: 1, layout, opened: false, rebuilt, error, ending }
    }

    /// The first command.
    pub fn start(&mut self) -> Command {
        self.phase = Phase::Revoking;
        Command::Revoke { attempt: self.attempt }
    }

    /// The current attempt (from 1).
    pub fn attempt(&self) -> usize {
        self.attempt
    }

    /// The next command after `event`.
    ///
    /// # Panics
    /// On an event that does not answer the last command (a driver bug).
    pub fn on(&mut self, event: Event) -> Command {
        match (self.phase, event) {
            (Phase::Revoking, Event::Revoked) => {
                self.phase = Phase::Shrinking;
                Command::Shrink
            }
            (Phase::Shrinking, Event::Shrunk(shrunk)) => self.on_shrunk(shrunk),
            (Phase::Opening, Event::WindowOpened(opened)) => self.on_opened(opened),
            (Phase::Exchanging, Event::Exchanged(records)) => self.on_exchanged(records),
            (Phase::Copying, Event::Copied(copied)) => self.on_copied(copied),
            (Phase::Agreeing, Event::Agreed(agreed)) => self.on_agreed(agreed),
            (Phase::Disposing, Event::Disposed) => self.next_attempt(),
            (phase, event) => panic!("recovery event {event:?} does not answer phase {phase:?}"),
        }
    }

    fn on_shrunk(&mut self, shrunk: Result<Vec<i32>, Fault>) -> Command {
        let live = match shrunk {
            Ok(live) => live,
            Err(Fault::Failure) => return self.next_attempt(),
            Err(Fault::Other(e)) => return self.fail(Failed::Error(e)),
        };
        let previous = &self.inputs.previous.live;
        if !plan::keeps_quorum(previous, &live, &self.inputs.hosts) {
            return self.fail(Failed::Partitioned { live, previous: previous.clone() });
        }
        let i = &self.inputs;
        let shape = Shape { kinds: i.kinds, copies: i.copies, spares: i.spares };
        let layout = Layout::with_spares(&live, &i.hosts, shape, i.previous.geometry(), i.me);
        self.layout = Some(layout.clone());
        (self.opened, self.rebuilt) = (false, None);
        self.phase = Phase::Opening;
        Command::OpenWindow { layout }
    }

    fn on_opened(&mut self, opened: Result<Result<Vec<(Key, u64)>, Fault>, Fault>) -> Command {
        match opened {
            Ok(Ok(held)) => {
                self.opened = true;
                self.phase = Phase::Exchanging;
                Command::Exchange { records: self.records(&held) }
            }
            Ok(Err(scan)) => {
                self.opened = true;
                self.attempt_failed_here(scan)
            }
            Err(fault) => self.attempt_failed_here(fault),
        }
    }

    /// The versions this worker holds (sourced at its rank in the shrunk communicator) and its
    /// statements about the own keys it wrote with an acknowledgement.
    fn records(&self, held: &[(Key, u64)]) -> Vec<Record> {
        let rank = self.rank();
        let held = held.iter().map(|&(key, version)| Record { key, version, source: rank });
        let me = self.inputs.me;
        let written = self.inputs.acked.iter().enumerate().filter(|(_, &v)| v > 0);
        let marks = written.map(|(kind, &version)| Record {
            key: Key::new(me, kind as u16),
            version,
            source: OWNER_MARK,
        });
        held.chain(marks).collect()
    }

    fn rank(&self) -> i32 {
        let live = &self.layout.as_ref().expect("a layout after the shrink").live;
        live.iter().position(|&w| w == self.inputs.me).expect("a survivor is live") as i32
    }

    fn on_exchanged(&mut self, records: Result<Vec<Record>, Fault>) -> Command {
        let records = match records {
            Ok(records) => records,
            Err(fault) => return self.attempt_failed_here(fault),
        };
        let layout = self.layout.as_ref().expect("a layout after the shrink");
        let plan = plan::plan(&records, layout, self.rank());
        let lost = plan
            .lost_candidates
            .into_iter()
            .filter(|k| plan.marked.contains(k) || self.all_holders_died(*k))
            .collect();
        self.rebuilt = Some((plan.recovered, lost));
        self.phase = Phase::Copying;
        Command::Copy { sends: plan.sends }
    }

    /// A dead owner's key without a surviving copy may never have been written; it counts as
    /// lost when every worker that reserved a slot for it died (every slot, not only the
    /// current holders: survivors may have moved copies down their chains at different times,
    /// and the verdict must be the same on all of them).
    fn all_holders_died(&self, key: Key) -> bool {
        let live = &self.layout.as_ref().expect("a layout after the shrink").live;
        let mut slots = self.inputs.previous.slots(key);
        !live.contains(&key.owner) && slots.all(|c| !live.contains(&c.worker))
    }

    fn on_copied(&mut self, copied: Result<bool, Fault>) -> Command {
        match copied {
            Ok(quiet) => {
                self.phase = Phase::Agreeing;
                Command::Agree { flags: self.flags(quiet), revoke: !quiet }
            }
            Err(fault) => self.attempt_failed_here(fault),
        }
    }

    /// A step of this attempt failed on this rank: it revokes the shrunk communicator (so the
    /// others leave their collectives) and votes against the attempt; an error that is not a
    /// process failure still goes through the agreement, which the others wait in.
    fn attempt_failed_here(&mut self, fault: Fault) -> Command {
        if let Fault::Other(e) = fault {
            self.error = Some(e);
        }
        self.rebuilt = None;
        self.phase = Phase::Agreeing;
        Command::Agree { flags: self.flags(false), revoke: true }
    }

    fn flags(&self, ok: bool) -> u32 {
        let opened = if self.opened { WINDOW_OPENED } else { 0 };
        let succeeded = if ok && self.rebuilt.is_some() { ATTEMPT_SUCCEEDED } else { 0 };
        opened | succeeded
    }

    fn on_agreed(&mut self, agreed: Result<(u32, bool), Fault>) -> Command {
        let (value, alarm) = match agreed {
            Ok(agreed) => agreed,
            Err(fault) => {
                let message = match fault {
                    Fault::Failure => "the recovery's agreement met a failure".to_owned(),
                    Fault::Other(e) => e,
                };
                self.ending = Some(Failed::Error(message));
                self.phase = Phase::Disposing;
                return Command::Dispose { free: false };
            }
        };
        if value & ATTEMPT_SUCCEEDED != 0 {
            let (keys, lost) = self.rebuilt.take().expect("agreement implies local success");
            let layout = self.layout.take().expect("a layout after the shrink");
            self.phase = Phase::Ended;
            let attempts = self.attempt;
            return Command::Commit(Committed { layout, keys, lost, alarm, attempts });
        }
        self.phase = Phase::Disposing;
        Command::Dispose { free: self.opened && value & WINDOW_OPENED != 0 }
    }

    fn next_attempt(&mut self) -> Command {
        if let Some(failed) = self.ending.take() {
            return self.fail(failed);
        }
        if self.attempt == MAX_ATTEMPTS {
            let last_error = self.error.take();
            return self.fail(Failed::Exhausted { last_error });
        }
        self.attempt += 1;
        self.start()
    }

    fn fail(&mut self, failed: Failed) -> Command {
        self.phase = Phase::Ended;
        Command::Fail(failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slot::SlotGeometry;

    /// Worker 2 of 4 on two hosts, 1 kind, 2 copies; worker 3 died.
    fn machine(hosts: Vec<u32>) -> Machine {
        let all = [0, 1, 2, 3];
        let previous = Layout::compute(&all, &hosts, 1, 2, SlotGeometry::new(64), 2);
        let inputs =
            Inputs { me: 2, hosts, kinds: 1, copies: 2, spares: 0, previous, acked: vec![4] };
        Machine::new(inputs)
    }

    fn open(m: &mut Machine, live: Vec<i32>) -> Command {
        assert_eq!(m.start(), Command::Revoke { attempt: 1 });
        assert_eq!(m.on(Event::Revoked), Command::Shrink);
        let opened = m.on(Event::Shrunk(Ok(live.clone())));
        assert!(matches!(&opened, Command::OpenWindow { layout } if layout.live == live));
        opened
    }

    #[test]
    fn a_clean_attempt_commits_what_the_agreement_confirms() {
        let mut m = machine(vec![0; 4]);
        open(&mut m, vec![0, 1, 2]);
        let Command::Exchange { records } = m.on(Event::WindowOpened(Ok(Ok(vec![])))) else {
            panic!("exchange expected")
        };
        let mark = Record { key: Key::new(2, 0), version: 4, source: OWNER_MARK };
        assert_eq!(records, vec![mark], "only the owner's mark: it holds no slot");
        let held = Record { key: Key::new(2, 0), version: 4, source: 0 };
        // Worker 0 says it wrote its key, of which no copy survived: lost. Worker 3's key has
        // no copy either, but a holder of it lives: it was never written.
        let written = Record { key: Key::new(0, 0), version: 3, source: OWNER_MARK };
        let all = vec![mark, held, written];
        assert_eq!(m.on(Event::Exchanged(Ok(all))), Command::Copy { sends: vec![] });
        let flags = ATTEMPT_SUCCEEDED | WINDOW_OPENED;
        assert_eq!(m.on(Event::Copied(Ok(true))), Command::Agree { flags, revoke: false });
        let Command::Commit(committed) = m.on(Event::Agreed(Ok((flags, false)))) else {
            panic!("commit expected")
        };
        assert_eq!(
            (committed.keys, committed.lost, committed.attempts),
            (1, vec![Key::new(0, 0)], 1)
        );
    }

    #[test]
    fn an_agreement_without_success_disposes_and_retries() {
        let table = [(WINDOW_OPENED, true), (0, false)];
        for (value, free) in table {
            let mut m = machine(vec![0; 4]);
            open(&mut m, vec![0, 1, 2]);
            let exchange = m.on(Event::WindowOpened(Ok(Ok(vec![]))));
            assert!(matches!(exchange, Command::Exchange { .. }));
            let agree = m.on(Event::Exchanged(Err(Fault::Failure)));
            assert_eq!(agree, Command::Agree { flags: WINDOW_OPENED, revoke: true });
            assert_eq!(m.on(Event::Agreed(Ok((value, true)))), Command::Dispose { free });
            assert_eq!(m.on(Event::Disposed), Command::Revoke { attempt: 2 });
        }
    }

    #[test]
    fn a_failed_scan_still_counts_the_window_as_opened() {
        let mut m = machine(vec![0; 4]);
        open(&mut m, vec![0, 1, 2]);
        let agree = m.on(Event::WindowOpened(Ok(Err(Fault::Other("scan".into())))));
        assert_eq!(agree, Command::Agree { flags: WINDOW_OPENED, revoke: true });
        let dispose = m.on(Event::Agreed(Ok((WINDOW_OPENED, false))));
        assert_eq!(dispose, Command::Dispose { free: true });
    }

    #[test]
    fn a_failed_shrink_retries_until_the_attempts_run_out() {
        let mut m = machine(vec![0; 4]);
        m.start();
        for attempt in 2..=MAX_ATTEMPTS {
            assert_eq!(m.on(Event::Revoked), Command::Shrink);
            assert_eq!(m.on(Event::Shrunk(Err(Fault::Failure))), Command::Revoke { attempt });
        }
        m.on(Event::Revoked);
        let last = m.on(Event::Shrunk(Err(Fault::Failure)));
        assert_eq!(last, Command::Fail(Failed::Exhausted { last_error: None }));
    }

    #[test]
    fn a_minority_across_hosts_leaves_the_store() {
        let mut m = machine(vec![0, 0, 1, 1]);
        m.start();
        m.on(Event::Revoked);
        let failed = m.on(Event::Shrunk(Ok(vec![2])));
        let partitioned = Failed::Partitioned { live: vec![2], previous: vec![0, 1, 2, 3] };
        assert_eq!(failed, Command::Fail(partitioned));
    }
}
