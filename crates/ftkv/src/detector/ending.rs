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
//!   milliseconds): with `Config::end_through_runtime`, each such peer asks the runtime, whose
//!   daemon on that host kills it (off by default: a request for a rank behind a cut link left
//!   PRRTE 3.0.14 stuck). Pids mean nothing between machines, so nothing else is tried across
//!   hosts.
//!
//! A process already dead is left as it is. Where nothing reaches the process (its host's
//! daemon frozen with it, or a runtime that offers no job control) it stays until it runs
//! again, and then ends itself (its clock, see [`super::watchdog`]).

use std::sync::{Arc, Mutex, PoisonError};

use crate::events::{self, Event};
use crate::fabric::{Ended, Fabric, ProcessTag, Reach};

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

/// The failed workers this member ended or left alone (each is judged once), and those its
/// heartbeat found silent for half a bound or more (declared later, they were stopped, not
/// dead).
#[derive(Default)]
pub(crate) struct Ending {
    done: Vec<i32>,
    suspects: Vec<i32>,
}

/// A new, empty record shared by a store and its detectors.
pub(crate) fn shared() -> SharedEnding {
    Arc::new(Mutex::new(Ending::default()))
}

/// Locks `ending` (a panic while it was held leaves it usable: it is a list of pids judged).
pub(crate) fn lock(ending: &SharedEnding) -> std::sync::MutexGuard<'_, Ending> {
    ending.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Ending {
    /// Notes whether `worker` was silent for half a bound or more (see [`Ending::end_failed`]).
    pub fn suspect(&mut self, worker: i32, silent: bool) {
        let known = self.suspects.contains(&worker);
        match (silent, known) {
            (true, false) => self.suspects.push(worker),
            (false, true) => self.suspects.retain(|&w| w != worker),
            _ => {}
        }
    }

    /// Ends the `failed` workers' processes this member is to end ([`plan`]), each once: those
    /// on its host by pid; those on another host through the runtime when they were silent
    /// before they were declared (a worker reported failed without a silence died: the runtime
    /// knows, and PRRTE 3.0.14 treats a request for a process it cannot find as one for every
    /// process). An error is reported, not retried.
    pub fn end_failed<F: Fabric>(&mut self, reacher: &Reacher<'_, F>, failed: &[i32]) {
        for (worker, reach) in plan(reacher, failed, &self.done, &self.suspects) {
            self.done.push(worker);
            end(reacher, worker, reach);
        }
        self.done.extend(failed.iter().filter(|w| !self.done.contains(w)).collect::<Vec<_>>());
    }

    /// Ends the processes of the `silent` workers, which sent no heartbeat past the bound and
    /// are not declared yet: by pid on this host, through the runtime otherwise. Open MPI
    /// learns of their deaths from the runtime.
    pub fn end_silent<F: Fabric>(&mut self, reacher: &Reacher<'_, F>, silent: &[i32]) {
        silent.iter().for_each(|&w| self.suspect(w, true));
        self.end_failed(reacher, silent);
    }
}

/// Which of the `failed` workers (none of `done`) the member of `reacher` ends, and how: those
/// on its host by pid (a dead one is told apart by its pid's start time), the `suspects` on
/// other hosts through the runtime when it may be asked.
fn plan<F>(
    reacher: &Reacher<'_, F>,
    failed: &[i32],
    done: &[i32],
    suspects: &[i32],
) -> Vec<(i32, Reach)> {
    let host = |w: i32| reacher.hosts.get(w as usize).copied();
    let mine = host(reacher.me);
    let to_end = failed.iter().copied().filter(|w| *w != reacher.me && !done.contains(w));
    let reach = |w: i32| match host(w) == mine {
        true => Some(Reach::ThisHost),
        false => (reacher.through_runtime && suspects.contains(&w)).then_some(Reach::Runtime),
    };
    to_end.filter_map(|w| reach(w).map(|r| (w, r))).collect()
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

    /// This member, the failed workers, those done, the suspects, what it ends.
    type Case<'a> = (i32, &'a [i32], &'a [i32], &'a [i32], Vec<(i32, Reach)>);

    #[test]
    fn failed_workers_on_this_host_are_ended_by_pid_and_silent_ones_elsewhere_by_the_runtime() {
        // Workers 0..6 on hosts 0, 0, 1, 1, 2, 2.
        let hosts = [0, 0, 1, 1, 2, 2];
        let table: [Case; 6] = [
            (0, &[1], &[], &[], vec![(1, Reach::ThisHost)]),
            (2, &[1], &[], &[], vec![]),
            (0, &[2, 3], &[], &[], vec![]),
            (0, &[2, 3], &[], &[3], vec![(3, Reach::Runtime)]),
            (0, &[1, 3], &[1], &[], vec![]),
            (1, &[1], &[], &[], vec![]),
        ];
        for (me, failed, done, suspects, expected) in table {
            let reacher =
                Reacher { comm: &(), me, hosts: &hosts, processes: &[], through_runtime: true };
            let planned = plan(&reacher, failed, done, suspects);
            assert_eq!(planned, expected, "me {me}, failed {failed:?}");
        }
    }
}
