//! Ending the processes the survivors declared failed. A rank that is stopped (SIGSTOP, a hung
//! driver call, a node in trouble) is declared failed after the suspicion bound and the
//! survivors go on without it, but it is not dead: the launcher waits for every process it
//! started, so the job would end only when that rank runs again and ends itself. Each time
//! the failed set grows, the detector makes the failed processes dead:
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

use super::Watch;
use crate::events::{self, Event};
use crate::fabric::{Ended, Fabric, Reach};

/// What this member did to end failed processes.
pub(super) struct Ending {
    /// The failure generation last acted on.
    generation: u64,
    /// The failed workers this member sent an end or a request for (each once).
    done: Vec<i32>,
}

impl Ending {
    pub fn new() -> Ending {
        Ending { generation: 0, done: Vec::new() }
    }

    /// Once the failed set grew since the last call: ends the failed processes this member is
    /// to end ([`plan`]), each once; an error is reported, not retried.
    pub fn end_declared<F: Fabric>(&mut self, watch: &Watch<F>) {
        let generation = watch.health.generation();
        if generation == self.generation || !watch.end_declared {
            return;
        }
        self.generation = generation;
        let failed = watch.health.failed_workers(watch.health.workers());
        for (worker, reach) in plan(watch.me, &failed, &watch.hosts, &self.done) {
            self.done.push(worker);
            end(watch, worker, reach);
        }
    }
}

impl Ending {
    /// Ends the processes of the `silent` members (ranks of the detector's communicator), which
    /// sent no heartbeat past the bound or were declared failed after a stall: by pid on this
    /// host, through the runtime otherwise. Open MPI learns of their deaths from the runtime.
    pub fn end_silent<F: Fabric>(&mut self, watch: &Watch<F>, silent: &[i32]) {
        let host = |w: i32| watch.hosts.get(w as usize).copied();
        for worker in silent.iter().map(|&rank| watch.live[rank as usize]) {
            if worker == watch.me || self.done.contains(&worker) {
                continue;
            }
            let reach =
                if host(worker) == host(watch.me) { Reach::ThisHost } else { Reach::Runtime };
            if reach == Reach::Runtime && !watch.end_through_runtime {
                continue;
            }
            self.done.push(worker);
            end(watch, worker, reach);
        }
    }
}

/// Which of the `failed` workers (none of `done`) member `me` ends, and how: those on its
/// host by pid (a dead one is told apart by its pid's start time). A failed worker on another
/// host is left to the heartbeat ([`Ending::end_silent`]), which asks the runtime only for a
/// process that was silent before it was declared: one that died is gone already, and the
/// runtime cannot tell. `hosts` is every worker's host by worker id.
fn plan(me: i32, failed: &[i32], hosts: &[u32], done: &[i32]) -> Vec<(i32, Reach)> {
    let host = |w: i32| hosts.get(w as usize).copied();
    let to_end = failed.iter().copied().filter(|w| *w != me && !done.contains(w));
    to_end.filter(|&w| host(w) == host(me)).map(|w| (w, Reach::ThisHost)).collect()
}

fn end<F: Fabric>(watch: &Watch<F>, worker: i32, reach: Reach) {
    let Some(tag) = watch.processes.get(worker as usize) else { return };
    match watch.comm.end_process(tag, reach) {
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

    /// This member, the failed workers, those done, what it ends.
    type Case<'a> = (i32, &'a [i32], &'a [i32], Vec<(i32, Reach)>);

    #[test]
    fn failed_workers_on_this_host_are_ended_by_pid_and_others_left_to_the_heartbeat() {
        // Workers 0..6 on hosts 0, 0, 1, 1, 2, 2.
        let hosts = [0, 0, 1, 1, 2, 2];
        let table: [Case; 5] = [
            (0, &[1], &[], vec![(1, Reach::ThisHost)]),
            (2, &[1], &[], vec![]),
            (0, &[2, 3], &[], vec![]),
            (0, &[1, 3], &[1], vec![]),
            (1, &[1], &[], vec![]),
        ];
        for (me, failed, done, expected) in table {
            assert_eq!(plan(me, failed, &hosts, done), expected, "me {me}, failed {failed:?}");
        }
    }
}
