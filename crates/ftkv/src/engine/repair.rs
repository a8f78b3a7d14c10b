//! The localized repairer's decisions as an engine without I/O: it takes what the repairer
//! thread saw ([`Event`]) and returns what to do next ([`Command`]); the thread's loop in
//! `store/follow.rs` is the runtime that looks at the store, fences, relocates and copies, and
//! waits. [`Interruptions`] is the one rule for giving up on localized recovery, shared by the
//! repairer and by the store calls that wait for it: an interrupted repair or call is tried
//! again after a pause (time for the detector to publish the failure behind the interruption),
//! and after a number of interruptions in a row the store goes to global recovery.

/// Poll intervals to wait after an interruption before trying again.
pub const PAUSE_POLLS: u32 = 4;

/// What the repairer thread saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A look at the store: the failure generation the detector published, the one the routes
    /// follow (`None`: none yet), and whether the alarm is up (the store goes to global
    /// recovery, which takes over from the repairer).
    Looked { published: u64, followed: Option<u64>, alarmed: bool },
    /// The repair that the last [`Command::Follow`] asked for is done.
    Followed,
    /// It was interrupted: a further failure, or an error the runtime reported.
    Interrupted,
}

/// What the repairer thread does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Follow the failures up to this generation: fence the failed workers out of this
    /// worker's slots, relocate the routes, copy what this worker repairs, publish the routes.
    Follow(u64),
    /// Nothing to do: wait until the store changes (at most a poll interval), then look again.
    Wait,
    /// Wait this many poll intervals, then look again.
    Pause(u32),
    /// Send the store to global recovery, then pause as after an interruption.
    Escalate,
}

/// Interruptions in a row and the rule that ends localized recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interruptions {
    in_a_row: usize,
    limit: usize,
}

impl Interruptions {
    /// Gives up at the `limit`-th interruption in a row (at least 1).
    pub fn new(limit: usize) -> Interruptions {
        Interruptions { in_a_row: 0, limit: limit.max(1) }
    }

    /// After an interruption: [`Command::Pause`] and try again, or [`Command::Escalate`] at the
    /// limit (and at every later one, until a success).
    pub fn interrupted(&mut self) -> Command {
        self.in_a_row += 1;
        match self.in_a_row >= self.limit {
            true => Command::Escalate,
            false => Command::Pause(PAUSE_POLLS),
        }
    }

    /// After a success: the count starts again.
    pub fn succeeded(&mut self) {
        self.in_a_row = 0;
    }
}

/// The repairer's engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repairer {
    interruptions: Interruptions,
}

impl Repairer {
    /// A repairer that gives up at the `attempts`-th interrupted repair in a row.
    pub fn new(attempts: usize) -> Repairer {
        Repairer { interruptions: Interruptions::new(attempts) }
    }

    /// The next command after `event`.
    pub fn next(&mut self, event: Event) -> Command {
        match event {
            Event::Looked { alarmed: true, .. } => Command::Wait,
            Event::Looked { published, followed, .. } if followed == Some(published) => {
                Command::Wait
            }
            Event::Looked { published, .. } => Command::Follow(published),
            Event::Followed => {
                self.interruptions.succeeded();
                Command::Wait
            }
            Event::Interrupted => self.interruptions.interrupted(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn looked(published: u64, followed: Option<u64>, alarmed: bool) -> Event {
        Event::Looked { published, followed, alarmed }
    }

    /// Each case: the events in order and the command after each.
    #[test]
    fn the_repairer_follows_new_failures_pauses_after_an_interruption_and_escalates_at_the_limit() {
        use Command::*;
        let cases: [(&str, Vec<(Event, Command)>); 6] = [
            ("nothing failed", vec![(looked(0, None, false), Follow(0))]),
            ("the routes follow what was published", vec![(looked(2, Some(2), false), Wait)]),
            (
                "a new failure is followed, then nothing is left",
                vec![
                    (looked(3, Some(2), false), Follow(3)),
                    (Event::Followed, Wait),
                    (looked(3, Some(3), false), Wait),
                ],
            ),
            (
                "the alarm leaves the failures to global recovery",
                vec![(looked(3, Some(2), true), Wait)],
            ),
            (
                "interruptions pause until the third in a row escalates",
                vec![
                    (looked(1, None, false), Follow(1)),
                    (Event::Interrupted, Pause(PAUSE_POLLS)),
                    (looked(2, None, false), Follow(2)),
                    (Event::Interrupted, Pause(PAUSE_POLLS)),
                    (looked(2, None, false), Follow(2)),
                    (Event::Interrupted, Escalate),
                    (looked(2, None, true), Wait),
                ],
            ),
            (
                "a success starts the count again",
                vec![
                    (Event::Interrupted, Pause(PAUSE_POLLS)),
                    (Event::Interrupted, Pause(PAUSE_POLLS)),
                    (Event::Followed, Wait),
                    (Event::Interrupted, Pause(PAUSE_POLLS)),
                    (Event::Interrupted, Pause(PAUSE_POLLS)),
                    (Event::Interrupted, Escalate),
                ],
            ),
        ];
        for (name, steps) in cases {
            let mut repairer = Repairer::new(3);
            for (i, (event, command)) in steps.into_iter().enumerate() {
                assert_eq!(repairer.next(event), command, "{name}: step {i}, {event:?}");
            }
        }
    }

    #[test]
    fn interruptions_escalate_at_the_limit_and_after_it_until_a_success() {
        let mut interruptions = Interruptions::new(2);
        assert_eq!(interruptions.interrupted(), Command::Pause(PAUSE_POLLS));
        assert_eq!(interruptions.interrupted(), Command::Escalate);
        assert_eq!(interruptions.interrupted(), Command::Escalate);
        interruptions.succeeded();
        assert_eq!(interruptions.interrupted(), Command::Pause(PAUSE_POLLS));
        assert_eq!(Interruptions::new(0).interrupted(), Command::Escalate);
    }
}
