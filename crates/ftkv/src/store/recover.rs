//! [`Store::recover`]: the driver of global recovery. It executes the commands of the
//! recovery machine ([`crate::attempt`]) on the fabric, adopts the windows of the attempt that
//! every survivor agreed on, and frees the ones it replaced.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::create::open_window;
use super::{RecoveryReport, Store};
use crate::attempt::{self, Command, Event, Fault};
use crate::detector::{read_allowance, Deadline, Step, StepMarker};
use crate::error::{Error, Result};
use crate::fabric::{Fabric, FabricError, FabricWindow};
use crate::fence::{read_local_slot, Fencer};
use crate::halves;
use crate::key::Key;
use crate::layout::{Copy, Layout};
use crate::recovery;
use crate::slot::{Committed, SlotGeometry};

/// A window of an earlier epoch, kept until a recovery commits.
struct Retained<W> {
    fencer: Arc<Fencer<W>>,
    layout: Layout,
}

impl<W: FabricWindow> Retained<W> {
    /// The window itself, once nothing else holds it (the detector thread is stopped).
    fn into_window(self) -> Option<W> {
        let window = self.fencer.into_window();
        if window.is_none() {
            crate::events::warn("a retained window is still shared; it stays allocated");
        }
        window
    }

    fn close(self) -> Result<()> {
        match self.into_window() {
            Some(window) => Ok(window.close()?),
            None => Ok(()),
        }
    }

    fn abandon(self) {
        if let Some(window) = self.into_window() {
            window.abandon();
        }
    }
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
    /// [`Error::RecoveryNeeded`] (or [`Store::needs_recovery`]); a rank that does not, hangs the
    /// others' recovery until it does.
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
        let started = Instant::now();
        self.stop_repairer();
        self.detector = None;
        let retained = match self.window.take() {
            Some(fencer) => Retained { fencer, layout: self.layout.clone() },
            None => return Err(Error::Closed),
        };
        let mut machine = attempt::Machine::new(attempt::Inputs {
            me: self.me,
            hosts: self.hosts.clone(),
            kinds: self.config.kinds.len(),
            copies: self.config.copies,
            spares: self.config.spares,
            geometry: self.geometry,
            previous: retained.layout.clone(),
            acked: self.acked.snapshot(),
        });
        let step = Arc::new(StepMarker::default());
        let mut run = AttemptRun {
            step,
            deadline: None,
            window: None,
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
                        if let Some(window) = run.window.take() {
                            window.abandon();
                        }
                        drop(run);
                        retained.abandon();
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
        retained: &Retained<F::Window>,
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
                let watchdog = self.config.recovery_watchdog;
                run.deadline = Some(Deadline::start(self.comm.clone(), watchdog, run.step.clone()));
                run.step.set(Step::Revoke);
                self.comm.revoke().map_err(Error::Fabric)?;
                self.trace("revoked");
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
                        self.trace(&format!("shrunk to {live:?}"));
                        Event::Shrunk(Ok(live))
                    }
                    Err(e) if e.is_failure() => Event::Shrunk(Err(Fault::Failure)),
                    Err(e) => return Err(Error::Fabric(e)),
                }
            }
            Command::OpenWindow { layout } => {
                self.layout = layout;
                self.epoch += 1;
                self.comm.failpoint("recovery_after_shrink");
                step.set(Step::OpenWindow);
                match open_window(&*self.comm, &self.layout, self.geometry) {
                    Ok(window) => {
                        run.window = Some(window);
                        self.trace("window open");
                        let scanned = scan_local(retained, &self.layout.live, self.geometry);
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
                let all = recovery::exchange(&*self.comm, &records);
                if all.is_ok() {
                    self.trace("records exchanged");
                }
                Event::Exchanged(all.map_err(fault))
            }
            Command::Copy { sends } => {
                self.comm.failpoint("recovery_mid_copy");
                step.set(Step::CopyOut);
                let window = run.window.as_ref().expect("copies go to an opened window");
                let copied = copy_out(window, &self.layout, &sends, &run.held, self.geometry)
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
                self.trace(&format!("rebuilt ok={}", flags & attempt::ATTEMPT_SUCCEEDED != 0));
                step.set(Step::Agree);
                let agreed = self.comm.agree(flags);
                if let Ok(agreed) = &agreed {
                    self.trace(&format!("agreed {}", agreed.value));
                }
                let agreed = agreed.map(|a| (a.value, a.unacknowledged_failures));
                Event::Agreed(agreed.map_err(|e| {
                    run.agreement_error = Some(Error::Fabric(e.clone()));
                    fault(e)
                }))
            }
            Command::Dispose { free } => {
                step.set(Step::FreeWindow);
                self.dispose(run.window.take(), free);
                Event::Disposed
            }
            Command::Commit(_) | Command::Fail(_) => unreachable!("handled by recover"),
        })
    }

    /// Adopts the committed attempt: its window and layout; frees the previous window.
    fn commit(
        &mut self,
        committed: attempt::Committed,
        retained: Retained<F::Window>,
        mut run: AttemptRun<F>,
        started: Instant,
    ) -> Result<RecoveryReport> {
        let window = Arc::new(run.window.take().expect("agreement implies a window"));
        self.window = Some(Arc::new(Fencer::new(window, &self.layout.local, self.geometry)));
        if committed.alarm {
            self.pending_alarm = true;
        }
        run.step.set(Step::FreeWindow);
        let freed = retained.close();
        drop(run);
        freed?;
        self.trace("old window freed");
        let recovered = Recovered { keys: committed.keys, lost: committed.lost };
        self.finish_recovery(recovered, committed.attempts, started)
    }

    /// The error a recovery that did not succeed returns. After a partition this side leaves
    /// the store without touching its windows again; when every attempt failed, the previous
    /// window stays, so that another recovery can start from it.
    fn give_up(
        &mut self,
        failed: attempt::Failed,
        retained: Retained<F::Window>,
        mut run: AttemptRun<F>,
    ) -> Error {
        let agreement_error = run.agreement_error.take();
        drop(run);
        match failed {
            attempt::Failed::Partitioned { live, previous } => {
                retained.abandon();
                Error::Partitioned { live, previous }
            }
            attempt::Failed::Error(message) => {
                retained.abandon();
                agreement_error.unwrap_or(Error::RecoveryFailed(message))
            }
            attempt::Failed::Exhausted { last_error } => {
                if let Some(e) = last_error {
                    crate::events::warn(format!("recovery gave up; last error: {e}"));
                }
                // The next recovery starts again from the last committed window and layout.
                self.layout = retained.layout;
                self.window = Some(retained.fencer);
                Error::RecoveryNeeded { failed: self.newly_failed() }
            }
        }
    }

    fn finish_recovery(
        &mut self,
        recovered: Recovered,
        attempts: usize,
        started: Instant,
    ) -> Result<RecoveryReport> {
        let failed: Vec<i32> = (0..self.workers as i32)
            .filter(|w| !self.layout.live.contains(w) && !self.recovered_failed.contains(w))
            .collect();
        self.recovered_failed.extend(&failed);
        self.lost = recovered.lost.clone();
        self.handed.clear();
        // The new routes are fresh: the next call follows every failure known by then.
        self.followed = u64::MAX;
        self.health.clear_alarm();
        if std::mem::take(&mut self.pending_alarm) {
            self.health.raise_alarm();
        }
        self.start_detector()?;
        Ok(RecoveryReport {
            failed,
            keys_recovered: recovered.keys,
            keys_lost: recovered.lost,
            attempts,
            duration: started.elapsed(),
        })
    }

    /// Frees a failed attempt's window when every survivor opened it (only an agreement can say
    /// so, and freeing is collective); otherwise leaves it allocated, since a collective free
    /// that some survivors never join would not return.
    fn dispose(&self, window: Option<F::Window>, everyone_opened: bool) {
        let Some(window) = window else { return };
        if !everyone_opened {
            self.trace("failed attempt's window left allocated");
            window.abandon();
            return;
        }
        match window.close() {
            Ok(()) => self.trace("failed attempt's window freed"),
            Err(e) => {
                crate::events::warn(format!("freeing a failed recovery attempt's window: {e}"))
            }
        }
    }

    /// A recovery step event when `FTKV_TRACE` is set (chaos runs set it, so a
    /// stuck survivor shows where it stopped).
    fn trace(&self, what: &str) {
        if std::env::var_os("FTKV_TRACE").is_some() {
            let (worker, epoch, step) = (self.me, self.epoch, what.to_owned());
            crate::events::emit(crate::events::Event::RecoveryStep { worker, epoch, step });
        }
    }

    fn live_ids(&self, shrunk: &F) -> Result<Vec<i32>> {
        Ok(shrunk.ranks_in(&self.origin)?)
    }
}

/// The state a recovery keeps across its commands: the current attempt's step marker and
/// deadline, and its window once opened.
struct AttemptRun<F: Fabric> {
    step: Arc<StepMarker>,
    deadline: Option<Deadline>,
    window: Option<F::Window>,
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

/// The newest complete version of every slot this rank hosts in the previous epoch's window,
/// after fencing every worker that is not in `live` (the shrunk communicator's workers).
fn scan_local<W: FabricWindow>(
    retained: &Retained<W>,
    live: &[i32],
    geometry: SlotGeometry,
) -> Result<HashMap<Key, Committed>> {
    let gone: Vec<i32> =
        retained.layout.live.iter().copied().filter(|w| !live.contains(w)).collect();
    retained.fencer.fence(&gone)?;
    let window = retained.fencer.window();
    window.sync()?;
    let mut found = HashMap::new();
    for &(key, disp) in &retained.layout.local {
        if let Some(committed) = read_local_slot(window, disp as usize, geometry)? {
            found.insert(key, committed);
        }
    }
    Ok(found)
}

/// Writes the versions this rank is the source of to their new holders.
fn copy_out<W: FabricWindow>(
    window: &W,
    layout: &Layout,
    sends: &[Key],
    local: &HashMap<Key, Committed>,
    geometry: SlotGeometry,
) -> Result<()> {
    for key in sends {
        let route = layout.route(*key).expect("planned keys are routed");
        put_committed(window, route, &local[key], geometry)?;
    }
    Ok(())
}

/// Writes a committed version (data and header into the version's half) to every copy of
/// `targets`, completed by one scope.
fn put_committed<W: FabricWindow>(
    window: &W,
    targets: &[Copy],
    committed: &Committed,
    geometry: SlotGeometry,
) -> std::result::Result<(), FabricError> {
    let version = committed.header.version;
    halves::write_extents(window, targets, geometry, version, &committed.data)?;
    put_committed_inline(window, targets, committed, geometry)
}

/// [`put_committed`] after its value's extents were written: the inline value (if it fits) and
/// the header, the one-sided calls the watchdog bounds.
pub(super) fn put_committed_inline<W: FabricWindow>(
    window: &W,
    targets: &[Copy],
    committed: &Committed,
    geometry: SlotGeometry,
) -> std::result::Result<(), FabricError> {
    let encoded = committed.header.encode();
    let version = committed.header.version;
    let out =
        halves::Outgoing { version, encoded: &encoded, data: &committed.data, free_stale: true };
    window.scope(|s| halves::issue_version(s, targets, geometry, &out))
}
