//! Ending the processes the survivors declared failed. A rank that is stopped (SIGSTOP, a hung
//! driver call, a node in trouble) is declared failed after the suspicion bound and the
//! survivors go on without it, but it is not dead: the launcher waits for every process it
//! started, so the job would end only when that rank runs again and ends itself. Each time
//! the failed set grows (in the detector's round, and at the end of a global recovery, which
//! replaces the detector and may have begun before its round saw the failure), this member
//! makes the failed processes dead:
//!
//! - a failed worker on this member's host: SIGKILL by its pid, which every survivor on that
//!   host sends (a pid that names another process since is left alone, see
//!   [`Fabric::end_process`]);
//! - a worker on another host that its heartbeat peers found silent past the bound, or that
//!   was declared failed after half a bound of silence (a death is reported within
//!   milliseconds), and whose host still completed a TCP connection to its listener when it
//!   fell silent (the host runs and is reachable: the worker is frozen): with
//!   `Config::end_through_runtime` (on by default), each such peer asks the runtime, whose
//!   daemon on that host kills it. A host that does not answer is cut off or down, and nothing
//!   is asked for it: a request for a rank behind a cut link left PRRTE 3.0.14 stuck. Pids mean
//!   nothing between machines, so nothing else is tried across hosts.
//!
//! A process already dead is left as it is. Where nothing reaches the process (its host's
//! daemon frozen with it, or a runtime that offers no job control) it stays until it runs
//! again, and then ends itself (its clock, see [`super::watchdog`]).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::events::{self, Event};
use crate::fabric::{Ended, Fabric, ProcessTag, Reach};
use crate::rt;

/// What the members of one store did to end failed processes, for the store's lifetime: a
/// global recovery replaces the detector (and its communicator) while the processes it
/// declared may still be unended, so the store ends what its recovery reports failed through
/// the same record.
pub(crate) type SharedEnding = Arc<Mutex<Ending>>;

/// Who ends processes and how: this member, every worker's host and process, and whether the
/// runtime may be asked ([`crate::Config::end_through_runtime`]).
pub(crate) struct Reacher<'a, F> {
    pub comm: &'a F,
    pub me: i32,
    pub hosts: &'a [u32],
    pub processes: &'a [ProcessTag],
    pub through_runtime: bool,
}

/// What this member knows of a worker its heartbeat found silent for half a bound or more:
/// whether its host still answers a TCP connection to the worker's listener.
enum Probe {
    /// No listener of the worker's is known: its host cannot be told frozen.
    Unknown,
    Pending(std::sync::mpsc::Receiver<bool>),
    Answered(bool),
}

impl Probe {
    /// The answer, once there is one (a probe whose thread ended without a word answered no).
    fn answer(&mut self) -> Option<bool> {
        if let Probe::Pending(told) = self {
            match told.try_recv() {
                Ok(made) => *self = Probe::Answered(made),
                Err(std::sync::mpsc::TryRecvError::Disconnected) => *self = Probe::Answered(false),
                Err(std::sync::mpsc::TryRecvError::Empty) => return None,
            }
        }
        match self {
            Probe::Answered(made) => Some(*made),
            _ => Some(false),
        }
    }
}

/// What becomes of a failed worker's process ([`decide`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    End(Reach),
    /// Not this member's to end, or nothing reaches it.
    Leave,
    /// Its host is being probed: decided in a later round.
    Later,
}

/// The failed workers this member ended or left alone (each is judged once), those its
/// heartbeat found silent for half a bound or more (declared later, they were stopped, not
/// dead) with what the probe of their hosts found, and the failed workers waiting for a probe.
#[derive(Default)]
pub(crate) struct Ending {
    done: Vec<i32>,
    suspects: Vec<(i32, Probe)>,
    waiting: Vec<i32>,
}

/// A new, empty record shared by a store and its detectors.
pub(crate) fn shared() -> SharedEnding {
    Arc::new(Mutex::new(Ending::default()))
}

/// Locks `ending` (a panic while it was held leaves it usable: it is a list of pids judged).
pub(crate) fn lock(ending: &SharedEnding) -> std::sync::MutexGuard<'_, Ending> {
    ending.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How long a probe of a silent worker's host may take: a quarter of the bound (the probe
/// starts at half the bound of silence, so it has answered when the bound is past), 2 s at
/// most.
pub(crate) fn probe_timeout(bound: Duration) -> Duration {
    (bound / 4).min(Duration::from_secs(2))
}

impl Ending {
    /// Notes whether `worker` is silent for half a bound or more; a newly silent one's host is
    /// probed at `listener` (its listener, if known) within `timeout`.
    pub fn suspect(
        &mut self,
        worker: i32,
        silent: bool,
        listener: Option<std::net::SocketAddr>,
        timeout: Duration,
    ) {
        let known = self.suspects.iter().any(|(w, _)| *w == worker);
        match (silent, known) {
            (true, false) => {
                let probe = listener.map_or(Probe::Unknown, |address| {
                    Probe::Pending(rt::probe_tcp(address, timeout))
                });
                self.suspects.push((worker, probe));
            }
            (false, true) => self.suspects.retain(|(w, _)| *w != worker),
            _ => {}
        }
    }

    /// Ends the `failed` workers' processes this member is to end ([`decide`]), each once:
    /// those on its host by pid; those on another host through the runtime when they were
    /// silent before they were declared and their host still answers (a worker reported
    /// failed without a silence died: the runtime knows, and PRRTE 3.0.14 treats a request for
    /// a process it cannot find as one for every process; a host that does not answer is cut
    /// off or down, and a request for it left PRRTE 3.0.14 stuck). A worker whose host is being
    /// probed waits for [`Ending::end_waiting`]. An error is reported, not retried.
    pub fn end_failed<F: Fabric>(&mut self, reacher: &Reacher<'_, F>, failed: &[i32]) {
        for &worker in failed {
            if worker == reacher.me || self.done.contains(&worker) {
                continue;
            }
            let probe = self.suspects.iter_mut().find(|(w, _)| *w == worker).map(|(_, p)| p);
            let answer = probe.map(Probe::answer);
            match decide(reacher, worker, answer) {
                Decision::Later => {
                    if !self.waiting.contains(&worker) {
                        self.waiting.push(worker);
                    }
                    continue;
                }
                Decision::End(reach) => end(reacher, worker, reach),
                Decision::Leave => {}
            }
            self.done.push(worker);
            self.waiting.retain(|&w| w != worker);
        }
    }

    /// Decides again on the failed workers whose hosts were being probed.
    pub fn end_waiting<F: Fabric>(&mut self, reacher: &Reacher<'_, F>) {
        if !self.waiting.is_empty() {
            let waiting = self.waiting.clone();
            self.end_failed(reacher, &waiting);
        }
    }
}

/// What member `reacher.me` does with failed `worker`'s process, given what the probe of a
/// suspect's host answered (`None`: not a suspect; `Some(None)`: no answer yet): ends it by
/// pid when it shares the host (a dead one is told apart by its pid's start time); through
/// the runtime, when it may be asked, a suspect on another host that still answers.
fn decide<F>(reacher: &Reacher<'_, F>, worker: i32, answer: Option<Option<bool>>) -> Decision {
    let host = |w: i32| reacher.hosts.get(w as usize).copied();
    if host(worker) == host(reacher.me) {
        return Decision::End(Reach::ThisHost);
    }
    match (reacher.through_runtime, answer) {
        (true, Some(Some(true))) => Decision::End(Reach::Runtime),
        (true, Some(None)) => Decision::Later,
        _ => Decision::Leave,
    }
}

fn end<F: Fabric>(reacher: &Reacher<'_, F>, worker: i32, reach: Reach) {
    let Some(tag) = reacher.processes.get(worker as usize) else { return };
    match reacher.comm.end_process(tag, reach) {
        Ok(Ended::Sent) => events::emit(Event::EndedDeclared { worker, pid: tag.pid, reach }),
        Ok(Ended::Gone | Ended::Unsupported) => {}
        Err(e) => events::warn(format!(
            "worker {worker} was declared failed, but its process could not be ended: {e}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This member, the failed worker, the probe's answer, the decision.
    type Case = (i32, i32, Option<Option<bool>>, Decision);

    #[test]
    fn same_host_by_pid_and_a_silent_worker_elsewhere_through_the_runtime_when_its_host_answers() {
        // Workers 0..6 on hosts 0, 0, 1, 1, 2, 2.
        let hosts = [0, 0, 1, 1, 2, 2];
        let table: [Case; 6] = [
            (0, 1, None, Decision::End(Reach::ThisHost)),
            (0, 1, Some(Some(false)), Decision::End(Reach::ThisHost)),
            (0, 3, None, Decision::Leave),
            (0, 3, Some(Some(true)), Decision::End(Reach::Runtime)),
            (0, 3, Some(Some(false)), Decision::Leave),
            (0, 3, Some(None), Decision::Later),
        ];
        for (me, worker, answer, expected) in table {
            let reacher =
                Reacher { comm: &(), me, hosts: &hosts, processes: &[], through_runtime: true };
            assert_eq!(decide(&reacher, worker, answer), expected, "me {me}, worker {worker}");
        }
        let reacher =
            Reacher { comm: &(), me: 0, hosts: &hosts, processes: &[], through_runtime: false };
        assert_eq!(decide(&reacher, 3, Some(Some(true))), Decision::Leave);
    }
}
