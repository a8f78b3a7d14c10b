//! [`Store::recover`]: the driver of global recovery. It executes the commands of the
//! recovery machine ([`crate::engine::attempt`]) on the fabric, adopts the windows of the attempt that
//! every survivor agreed on, and frees the ones it replaced.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::rt;

use super::deadline::{Deadline, DeadlineParts};
use super::deadline::{Step, StepMarker};
use super::exchange;
use super::{RecoveryReport, Store, Windows};
use crate::detector::read_allowance;
use crate::engine::attempt::{self, Command, Event, Fault};
use crate::error::{Error, Result};
use crate::fabric::{Fabric, FabricWindow};
use crate::key::Key;
use crate::slot::Committed;

/// What the global recoveries so far leave for the next.
#[derive(Debug, Default)]
pub(super) struct RecoveryState {
    /// Attempts begun since creation: the same count on every survivor, since each attempt ends
    /// in an agreement (the recovery deadline's marks number attempts by it).
    attempts: u64,
    /// The workers the recoveries so far removed.
    failed: Vec<i32>,
    /// A failure noticed while the last recovery committed: the alarm stays raised after it.
    pending_alarm: bool,
}

impl<F: Fabric> Store<F> {
    /// Whether a failure (or another rank's recovery) was noticed since the last recovery.
    pub fn needs_recovery(&self) -> bool {
        self.health.alarmed()
    }

    /// Collective over the survivors: revokes the communicator, shrinks it, builds new windows
    /// on the survivors, recomputes placement and copies the newest surviving version of every
    /// key to its new holders, restoring the copy count (as far as enough ranks live).
    ///
    /// A failure during recovery restarts it. With `copies = c`, up to `c − 1` failures between
    /// two recoveries lose no acknowledged write. Every survivor must call it once it saw
    /// [`Error::RecoveryNeeded`] (or [`Store::needs_recovery`]); a rank that does not, holds
    /// the others' recovery until it does: they wait however long it takes, and name the workers
    /// they wait for in [`Event::RecoveryWaiting`](crate::events::Event::RecoveryWaiting) events
    /// (after a second, then every five seconds).
    ///
    /// The recovery deadline ([`Config::recovery_watchdog`](crate::Config::recovery_watchdog),
    /// plus the time the attempt's bytes take) runs only while every live member is inside the
    /// same step of the attempt, counted from the moment the last of them entered it (or a member
    /// was known failed): a step stuck with all of them inside, which Open MPI's shrink or
    /// agreement can be, ends each of them as a fail-stop failure whose message names the step;
    /// a member stuck alone in a step the others have left ends itself and the others recover
    /// without it. Members mark their steps in the windows being replaced, which the others read
    /// one-sidedly; lateness never ends a process.
    ///
    /// # Example
    ///
    /// Worker 2 dies after its put was acknowledged; the survivors notice, recover, and read
    /// its last value back:
    ///
    /// ```
    /// use ftkv::fabric::{local::LocalCluster, Fabric};
    /// use ftkv::{Config, Key, Store};
    ///
    /// let cluster = LocalCluster::new(4);
    /// cluster.arm(2, "after_put", 1); // worker 2 dies at this named point
    /// let outcomes = cluster.run(|fabric| {
    ///     let mut store = Store::create(&fabric, Config::new(["checkpoint"], 2)).unwrap();
    ///     let me = store.worker();
    ///     store.put(Key::new(me, 0), format!("last of {me}").as_bytes()).unwrap();
    ///     store.sync().unwrap(); // every put is complete before worker 2 dies
    ///     fabric.failpoint("after_put");
    ///     // The detector notices within milliseconds; 10 s bound the wait.
    ///     for _ in 0..10_000 {
    ///         if store.needs_recovery() {
    ///             break;
    ///         }
    ///         std::thread::sleep(std::time::Duration::from_millis(1));
    ///     }
    ///     assert!(store.needs_recovery(), "the failure was noticed");
    ///     let report = store.recover().unwrap();
    ///     assert_eq!(report.failed, vec![2]);
    ///     assert_eq!(store.failed(), vec![2]);
    ///     store.get(Key::new(2, 0)).unwrap()
    /// });
    /// assert!(outcomes[2].is_none(), "worker 2 died");
    /// assert_eq!(outcomes[0], Some(Some(b"last of 2".to_vec())));
    /// ```
    pub fn recover(&mut self) -> Result<RecoveryReport> {
        let _span = tracing::info_span!("recovery", worker = self.me).entered();
        let started = rt::now();
        let _ = self.complete_handoff(None);
        self.stop_repairer();
        self.detector = None;
        let Some(retained) = self.windows.take() else { return Err(Error::Closed) };
        let mut machine = attempt::Machine::new(attempt::Inputs {
            me: self.me,
            hosts: self.hosts.clone(),
            kinds: self.config.kinds.len(),
            copies: self.config.copies,
            spares: self.config.spares,
            previous: retained.layout().clone(),
            acked: self.acked.snapshot(),
        });
        let step = Arc::new(StepMarker::default());
        let mut run = AttemptRun {
            step,
            deadline: None,
            epoch: retained.epoch(),
            windows: None,
            held: HashMap::new(),
            agreement_error: None,
        };
        let mut command = machine.start();
        loop {
            let event = match command {
                Command::Commit(committed) => {
                    return self.commit(committed, retained, run, started)
                }
                Command::Fail(failed) => return Err(self.give_up(failed, retained, run)),
                command => match self.execute(command, &retained, &mut run) {
                    Ok(event) => event,
                    Err(e) => {
                        // Freeing a window is collective: nobody may wait in it now.
                        if let Some(windows) = run.windows.take() {
                            windows.into_window().abandon();
                        }
                        drop(run);
                        Windows::abandon_replaced(retained);
                        return Err(e);
                    }
                },
            };
            command = machine.on(event);
        }
    }

    /// Executes one recovery command on the fabric and reports what happened. Errors returned
    /// here end the recovery at once (a revoke or shrink that failed for another reason than a
    /// process failure).
    fn execute(
        &mut self,
        command: Command,
        retained: &Arc<Windows<F::Window>>,
        run: &mut AttemptRun<F>,
    ) -> Result<Event> {
        let step = run.step.clone();
        Ok(match command {
            Command::Revoke { attempt } => {
                if attempt > 1 {
                    let me = self.me;
                    crate::events::warn(format!(
                        "worker {me}: recovery attempt {} met a failure, retrying",
                        attempt - 1
                    ));
                }
                run.step = Arc::new(StepMarker::default());
                // Another survivor may be copying a value as large as the largest a put takes.
                run.step.moves(read_allowance(self.config.max_value));
                run.deadline = None;
                run.deadline = Some(self.start_deadline(retained, &run.step));
                run.step.set(Step::Revoke);
                self.comm.revoke().map_err(Error::Fabric)?;
                self.trace(run.epoch, "revoked");
                Event::Revoked
            }
            Command::Shrink => {
                step.set(Step::Shrink);
                self.comm.stall_point("recovery_stall_shrink");
                match self.comm.shrink() {
                    Ok(shrunk) => {
                        let shrunk = Arc::new(shrunk);
                        self.comm = shrunk.clone();
                        let live = self.live_ids(&shrunk)?;
                        self.trace(run.epoch, &format!("shrunk to {live:?}"));
                        Event::Shrunk(Ok(live))
                    }
                    Err(e) if e.is_failure() => Event::Shrunk(Err(Fault::Failure)),
                    Err(e) => return Err(Error::Fabric(e)),
                }
            }
            Command::OpenWindow { layout } => {
                run.epoch += 1;
                self.comm.failpoint("recovery_after_shrink");
                step.set(Step::OpenWindow);
                match Windows::open(&*self.comm, layout, run.epoch) {
                    Ok(windows) => {
                        let windows = run.windows.insert(windows);
                        self.trace(run.epoch, "window open");
                        let scanned = retained.scan(&windows.layout().live);
                        let scanned = scanned.map(|held| {
                            // Read once, copied out once, perhaps to several holders.
                            let bytes: usize = held.values().map(|c| c.data.len()).sum();
                            step.moves(bytes * (1 + self.config.copies));
                            let versions = held.iter().map(|(k, c)| (*k, c.header.version));
                            let versions = versions.collect();
                            run.held = held;
                            versions
                        });
                        Event::WindowOpened(Ok(scanned.map_err(fault)))
                    }
                    Err(e) => Event::WindowOpened(Err(fault(e))),
                }
            }
            Command::Exchange { records } => {
                step.set(Step::ExchangeRecords);
                let all = exchange::exchange(&*self.comm, &records);
                if all.is_ok() {
                    self.trace(run.epoch, "records exchanged");
                }
                Event::Exchanged(all.map_err(fault))
            }
            Command::Copy { sends } => {
                self.comm.failpoint("recovery_mid_copy");
                step.set(Step::CopyOut);
                let windows = run.windows.as_ref().expect("copies go to an opened window");
                let copied = windows
                    .copy_out(&sends, &run.held)
                    .and_then(|()| {
                        step.set(Step::Barrier);
                        Ok(self.comm.barrier()?)
                    })
                    .map(|()| self.comm.failed_ranks().is_ok_and(|f| f.is_empty()));
                Event::Copied(copied.map_err(fault))
            }
            Command::Agree { flags, revoke } => {
                if revoke {
                    step.set(Step::Revoke);
                    if let Err(e) = self.comm.revoke() {
                        crate::events::warn(format!("revoke during recovery: {e}"));
                    }
                }
                let ok = flags & attempt::ATTEMPT_SUCCEEDED != 0;
                self.trace(run.epoch, &format!("rebuilt ok={ok}"));
                step.set(Step::Agree);
                let agreed = self.comm.agree(flags);
                if let Ok(agreed) = &agreed {
                    self.trace(run.epoch, &format!("agreed {}", agreed.value));
                }
                let agreed = agreed.map(|a| (a.value, a.unacknowledged_failures));
                Event::Agreed(agreed.map_err(|e| {
                    run.agreement_error = Some(Error::Fabric(e.clone()));
                    fault(e)
                }))
            }
            Command::Dispose { free } => {
                step.set(Step::FreeWindow);
                self.dispose(run, free);
                Event::Disposed
            }
            Command::Commit(_) | Command::Fail(_) => unreachable!("handled by recover"),
        })
    }

    /// Adopts the committed attempt's windows as a whole, its layout as the routes, and frees
    /// the windows they replace. Fails when that free does (the new windows stay adopted).
    fn commit(
        &mut self,
        committed: attempt::Committed,
        retained: Arc<Windows<F::Window>>,
        mut run: AttemptRun<F>,
        started: Instant,
    ) -> Result<RecoveryReport> {
        let windows = run.windows.take().expect("agreement implies a window");
        self.routes = windows.layout().clone();
        self.windows = Some(Arc::new(windows));
        if committed.alarm {
            self.recoveries.pending_alarm = true;
        }
        // Every live member agreed: none is late for the free, and its marks go with it.
        if let Some(deadline) = &run.deadline {
            deadline.release_windows();
        }
        run.step.set(Step::FreeWindow);
        let freed = Windows::close_replaced(retained);
        let epoch = run.epoch;
        drop(run);
        freed?;
        self.trace(epoch, "old window freed");
        let recovered = Recovered { keys: committed.keys, lost: committed.lost };
        self.finish_recovery(recovered, committed.attempts, started)
    }

    /// The error a recovery that did not succeed returns. After a partition this side leaves
    /// the store without touching its windows again; when every attempt failed, the previous
    /// window stays, so that another recovery can start from it.
    fn give_up(
        &mut self,
        failed: attempt::Failed,
        retained: Arc<Windows<F::Window>>,
        mut run: AttemptRun<F>,
    ) -> Error {
        let agreement_error = run.agreement_error.take();
        drop(run);
        match failed {
            attempt::Failed::Partitioned { live, previous } => {
                Windows::abandon_replaced(retained);
                Error::Partitioned { live, previous }
            }
            attempt::Failed::Error(message) => {
                Windows::abandon_replaced(retained);
                agreement_error.unwrap_or(Error::RecoveryFailed(message))
            }
            attempt::Failed::Exhausted { last_error } => {
                if let Some(e) = last_error {
                    crate::events::warn(format!("recovery gave up; last error: {e}"));
                }
                // The next recovery starts again from the last committed windows and the routes
                // on them.
                self.windows = Some(retained);
                Error::RecoveryNeeded { failed: self.newly_failed() }
            }
        }
    }

    /// Ends the processes of the workers this recovery found failed, as the detector does when
    /// it sees a failure first ([`crate::detector::ending`]): the recovery replaced the
    /// detector, which may not have seen them. The probes of other hosts this starts are
    /// answered in the next detector's rounds. A finished recovery kept the quorum (its
    /// attempt refuses to go on otherwise, `Error::Partitioned`), so the runtime may be asked
    /// as the configuration says.
    fn end_failed(&self, failed: &[i32]) {
        if !self.config.end_declared || failed.is_empty() {
            return;
        }
        let reacher = crate::detector::Reacher::new(
            &*self.comm,
            self.me,
            &self.hosts,
            &self.processes,
            (true, self.config.end_through_runtime),
            self.config.suspicion,
        );
        let cause = |w: i32| self.health.cause(w).unwrap_or(crate::events::Cause::Recovery);
        let caused: Vec<_> = failed.iter().map(|&w| (w, cause(w))).collect();
        crate::detector::ending::lock(&self.ending).end_failed(&reacher, &caused);
    }

    fn finish_recovery(
        &mut self,
        recovered: Recovered,
        attempts: usize,
        started: Instant,
    ) -> Result<RecoveryReport> {
        let failed: Vec<i32> = (0..self.workers as i32)
            .filter(|w| !self.routes.live.contains(w) && !self.recoveries.failed.contains(w))
            .collect();
        self.recoveries.failed.extend(&failed);
        self.end_failed(&failed);
        self.lost = recovered.lost.clone();
        self.handed.clear();
        // The new routes are fresh: the next call follows every failure known by then.
        self.followed = u64::MAX;
        self.health.clear_alarm();
        if std::mem::take(&mut self.recoveries.pending_alarm) {
            self.health.raise_alarm();
        }
        self.start_detector()?;
        let (keys_to_rewrite, keys_lost) =
            recovered.lost.into_iter().partition(|key| self.routes.live.contains(&key.owner));
        Ok(RecoveryReport {
            failed,
            keys_recovered: recovered.keys,
            keys_lost,
            keys_to_rewrite,
            attempts,
            duration: rt::since(started),
        })
    }

    /// Frees a failed attempt's window when every survivor opened it (only an agreement can say
    /// so, and freeing is collective); otherwise leaves it allocated, since a collective free
    /// that some survivors never join would not return.
    fn dispose(&self, run: &mut AttemptRun<F>, everyone_opened: bool) {
        let Some(windows) = run.windows.take() else { return };
        let window = windows.into_window();
        if !everyone_opened {
            self.trace(run.epoch, "failed attempt's window left allocated");
            window.abandon();
            return;
        }
        match window.close() {
            Ok(()) => self.trace(run.epoch, "failed attempt's window freed"),
            Err(e) => {
                crate::events::warn(format!("freeing a failed recovery attempt's window: {e}"))
            }
        }
    }

    /// A recovery step event of `epoch` when `FTKV_TRACE` is set (chaos runs set it, so a
    /// stuck survivor shows where it stopped).
    fn trace(&self, epoch: u64, what: &str) {
        if std::env::var_os("FTKV_TRACE").is_some() {
            let (worker, step) = (self.me, what.to_owned());
            crate::events::emit(crate::events::Event::RecoveryStep { worker, epoch, step });
        }
    }

    /// Starts the deadline of the next attempt (numbered store-wide), whose members mark their
    /// steps in `retained`.
    fn start_deadline(
        &mut self,
        retained: &Arc<Windows<F::Window>>,
        step: &Arc<StepMarker>,
    ) -> Deadline<F::Window> {
        self.recoveries.attempts += 1;
        Deadline::start(DeadlineParts {
            comm: self.comm.clone(),
            failures: self.watch_comm.clone(),
            health: self.health.clone(),
            windows: retained.clone(),
            worker: self.me,
            bound: self.config.recovery_watchdog,
            step: step.clone(),
            attempt: self.recoveries.attempts,
        })
    }

    fn live_ids(&self, shrunk: &F) -> Result<Vec<i32>> {
        Ok(shrunk.ranks_in(&self.origin)?)
    }
}

/// The state a recovery keeps across its commands: the current attempt's step marker and
/// deadline, and its windows once opened.
struct AttemptRun<F: Fabric> {
    step: Arc<StepMarker>,
    deadline: Option<Deadline<F::Window>>,
    /// The epoch of the last windows opened: the replaced windows' until the first attempt
    /// opens its own.
    epoch: u64,
    windows: Option<Windows<F::Window>>,
    /// The previous window's slots this rank holds, read once the attempt's window is open.
    held: HashMap<Key, Committed>,
    /// The agreement's own error, returned if it ends the recovery.
    agreement_error: Option<Error>,
}

/// The outcome of a successful rebuild.
struct Recovered {
    keys: usize,
    lost: Vec<Key>,
}

/// A fabric error as the recovery machine sees it.
fn fault(e: impl Into<Error>) -> Fault {
    match e.into() {
        e if e.needs_recovery() => Fault::Failure,
        e => Fault::Other(e.to_string()),
    }
}
