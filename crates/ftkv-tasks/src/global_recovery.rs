//! The pool's global recovery loop as an engine without I/O: the driver ([`crate::pool`])
//! hands it what its last command found and carries out the command it returns, until the
//! engine says the worker recovered or must stop (openraft's Engine and Runtime).
//!
//! One round: revoke the pool's communicator and interrupt the store's (so that nobody waits
//! for this worker in a collective), take part in the pool communicator's one agreement (the
//! survivors that reached the end wait in it and learn there that they must recover), run the
//! store's global recovery, then rejoin (a new communicator, the transactions the failures
//! left half done finished, a fresh checkpoint, a barrier, everyone's state read). Another
//! failure met by the store's recovery or by the rejoin starts the next round; any other error
//! ends the pool on this worker.

/// What the driver found when it carried out the last command.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A failure interrupted the pool: recovery starts.
    Failed,
    /// The pool's communicator is revoked and the store's interrupted (a failure to do either
    /// is the driver's warning: the communicator may already be revoked).
    Revoked,
    /// This worker took part in the pool communicator's agreement (now or before).
    Agreed,
    /// The store's global recovery ended.
    StoreRecovered(Result<StoreRecovered, Interrupted>),
    /// The rejoin ended.
    Rejoined(Result<(), Interrupted>),
}

/// A completed store recovery, as the pool reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreRecovered {
    /// The workers the recovery found failed.
    pub failed: Vec<i32>,
    /// How long the store's recovery took, in milliseconds.
    pub store_ms: f64,
}

/// Why a step did not complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupted {
    /// Another failure: the store needs another recovery.
    AnotherFailure,
    /// Anything else: the driver holds the error.
    Fatal,
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Revoke the pool's communicator and interrupt the store's.
    Revoke,
    /// Contribute "not done" to the pool communicator's one agreement unless this worker
    /// already took part in it.
    JoinAgreement,
    /// Run the store's global recovery ([`ftkv::Store::recover`]).
    RecoverStore,
    /// Rejoin the pool after the store recovered.
    Rejoin,
    /// The worker recovered: report the recovery that completed.
    Recovered(StoreRecovered),
    /// Stop: the last step's error ends the pool on this worker.
    Fail,
}

/// Where the engine is in its round.
#[derive(Debug, Clone, PartialEq)]
enum Phase {
    Idle,
    Revoking,
    Agreeing,
    RecoveringStore,
    Rejoining(StoreRecovered),
    Ended,
}

/// The recovery loop of one worker, from one failure until it recovered or must stop.
#[derive(Debug, Clone, PartialEq)]
pub struct GlobalRecovery {
    phase: Phase,
    rounds: usize,
}

impl Default for GlobalRecovery {
    fn default() -> GlobalRecovery {
        GlobalRecovery { phase: Phase::Idle, rounds: 0 }
    }
}

impl GlobalRecovery {
    /// How many rounds started (one, plus one per failure met on the way).
    pub fn rounds(&self) -> usize {
        self.rounds
    }

    /// The command that follows `event`.
    ///
    /// # Panics
    /// On an event the current command cannot produce (a driver bug).
    pub fn next(&mut self, event: Event) -> Command {
        let phase = std::mem::replace(&mut self.phase, Phase::Ended);
        match (phase, event) {
            (Phase::Idle, Event::Failed) => self.start_round(),
            (Phase::Revoking, Event::Revoked) => {
                self.phase = Phase::Agreeing;
                Command::JoinAgreement
            }
            (Phase::Agreeing, Event::Agreed) => {
                self.phase = Phase::RecoveringStore;
                Command::RecoverStore
            }
            (Phase::RecoveringStore, Event::StoreRecovered(Ok(report))) => {
                self.phase = Phase::Rejoining(report);
                Command::Rejoin
            }
            (Phase::Rejoining(report), Event::Rejoined(Ok(()))) => Command::Recovered(report),
            (
                Phase::RecoveringStore | Phase::Rejoining(_),
                Event::StoreRecovered(Err(why)) | Event::Rejoined(Err(why)),
            ) => match why {
                Interrupted::AnotherFailure => self.start_round(),
                Interrupted::Fatal => Command::Fail,
            },
            (phase, event) => panic!("global recovery: {event:?} in {phase:?}"),
        }
    }

    fn start_round(&mut self) -> Command {
        self.rounds += 1;
        self.phase = Phase::Revoking;
        Command::Revoke
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recovered(failed: &[i32]) -> StoreRecovered {
        StoreRecovered { failed: failed.to_vec(), store_ms: 1.5 }
    }

    /// Feeds `events` in order; the commands that came out.
    fn drive(events: Vec<Event>) -> (Vec<Command>, GlobalRecovery) {
        let mut engine = GlobalRecovery::default();
        let commands = events.into_iter().map(|e| engine.next(e)).collect();
        (commands, engine)
    }

    #[test]
    fn a_round_without_another_failure_recovers() {
        let (commands, engine) = drive(vec![
            Event::Failed,
            Event::Revoked,
            Event::Agreed,
            Event::StoreRecovered(Ok(recovered(&[2]))),
            Event::Rejoined(Ok(())),
        ]);
        use Command::*;
        let expected =
            vec![Revoke, JoinAgreement, RecoverStore, Rejoin, Recovered(recovered(&[2]))];
        assert_eq!(commands, expected);
        assert_eq!(engine.rounds(), 1);
    }

    #[test]
    fn another_failure_starts_a_new_round_and_the_last_recovery_is_reported() {
        use Command::*;
        use Interrupted::AnotherFailure;
        let cases: [(&str, Vec<Event>); 2] = [
            ("in the store's recovery", vec![Event::StoreRecovered(Err(AnotherFailure))]),
            (
                "in the rejoin",
                vec![
                    Event::StoreRecovered(Ok(recovered(&[1]))),
                    Event::Rejoined(Err(AnotherFailure)),
                ],
            ),
        ];
        for (case, interrupted) in cases {
            let mut events = vec![Event::Failed, Event::Revoked, Event::Agreed];
            events.extend(interrupted);
            events.extend([
                Event::Revoked,
                Event::Agreed,
                Event::StoreRecovered(Ok(recovered(&[1, 3]))),
                Event::Rejoined(Ok(())),
            ]);
            let (commands, engine) = drive(events);
            let last = &commands[commands.len() - 5..];
            let expected =
                [Revoke, JoinAgreement, RecoverStore, Rejoin, Recovered(recovered(&[1, 3]))];
            assert_eq!(last, expected, "{case}: a new round, then the recovery");
            assert_eq!(engine.rounds(), 2, "{case}");
        }
    }

    #[test]
    fn any_other_error_stops() {
        use Interrupted::Fatal;
        let cases = [
            vec![Event::StoreRecovered(Err(Fatal))],
            vec![Event::StoreRecovered(Ok(recovered(&[0]))), Event::Rejoined(Err(Fatal))],
        ];
        for interrupted in cases {
            let mut events = vec![Event::Failed, Event::Revoked, Event::Agreed];
            events.extend(interrupted);
            let (commands, _) = drive(events);
            assert_eq!(commands.last(), Some(&Command::Fail));
        }
    }

    #[test]
    #[should_panic(expected = "global recovery")]
    fn an_event_out_of_turn_is_a_driver_bug() {
        drive(vec![Event::Failed, Event::Agreed]);
    }
}
