//! Ending the processes the survivors declared failed. A rank that is stopped (SIGSTOP, a hung
//! driver call, a node in trouble) is declared failed after the suspicion bound and the
//! survivors go on without it, but it is not dead: the launcher waits for every process it
//! started, so the job would end only when that rank runs again and ends itself. Each time
//! the failed set grows (in the detector's round, and at the end of a global recovery, which
//! replaces the detector and may have begun before its round saw the failure), and when the
//! store's heartbeat finds a peer silent past the bound, this member makes those processes
//! dead:
//!
//! - a worker on this member's host: SIGKILL by its pid, which every survivor on that host
//!   sends (a pid that names another process since is left alone, see
//!   [`Fabric::end_process`]);
//! - a worker on another host: with `Config::end_through_runtime` (on by default), this member
//!   first tries a TCP connection to the worker's listener (the address its windows gave).
//!   The kernel of a host that runs and is reachable completes it while the process is
//!   stopped; the kernel refuses it once the process is dead (its sockets closed with it); a
//!   host cut off or down does not answer. Only a worker whose host completed the connection
//!   is asked of the runtime, whose daemon on that host kills it: PRRTE 3.0.14 treats a
//!   request for a process it cannot find as one for every process, and a request for a rank
//!   behind a cut link left it stuck. Pids mean nothing between machines, so nothing else is
//!   tried across hosts.
//!
//! A process already dead is left as it is. Where nothing reaches the process (its host's
//! daemon frozen with it, its host cut off, or a runtime that offers no job control) it stays
//! until it runs again, and then ends itself (its clock, see [`super::watchdog`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::events::{self, Cause, Event};
use crate::fabric::{Ended, Fabric, ProcessTag, Reach};
use crate::rt;

/// What the members of one store did to end failed processes, for the store's lifetime: a
/// global recovery replaces the detector (and its communicator) while the processes it
/// declared may still be unended, so the store ends what its recovery reports failed through
/// the same record.
pub(crate) type SharedEnding = Arc<Mutex<Ending>>;

/// Who ends processes and how: this member, every worker's host and process, whether this
/// member's side keeps the quorum (a member that finds most of the job failed is more likely
/// the one cut off or starved, and ends nothing), whether the runtime may be asked
/// ([`crate::Config::end_through_runtime`]) and how long a probe of a host may take
/// ([`probe_timeout`]).
pub(crate) struct Reacher<'a, F> {
    pub comm: &'a F,
    pub me: i32,
    pub hosts: &'a [u32],
    pub processes: &'a [ProcessTag],
    pub keeps_quorum: bool,
    pub through_runtime: bool,
    pub probe_timeout: Duration,
}

impl<'a, F> Reacher<'a, F> {
    /// Member `me`'s reacher over `comm`, with the workers' `hosts` and `processes`: it ends
    /// processes only while its side `keeps_quorum`, asks the runtime only with
    /// `through_runtime`, and a host's probe takes at most [`probe_timeout`] of `suspicion`.
    pub fn new(
        comm: &'a F,
        me: i32,
        hosts: &'a [u32],
        processes: &'a [ProcessTag],
        (keeps_quorum, through_runtime): (bool, bool),
        suspicion: Duration,
    ) -> Reacher<'a, F> {
        let probe_timeout = probe_timeout(suspicion);
        Reacher { comm, me, hosts, processes, keeps_quorum, through_runtime, probe_timeout }
    }
}

/// The failed workers this member ended or is probing (each once; one left alone is judged
/// again when the failed set next grows, since what kept it from being ended may have
/// passed: the quorum, an unknown listener), the last
/// listener address each worker on another host had, and the failed workers whose hosts are
/// being probed.
#[derive(Default)]
pub(crate) struct Ending {
    done: Vec<i32>,
    listeners: HashMap<i32, SocketAddr>,
    probing: Vec<(i32, Cause, Receiver<bool>)>,
}

/// A new, empty record shared by a store and its detectors.
pub(crate) fn shared() -> SharedEnding {
    Arc::new(Mutex::new(Ending::default()))
}

/// Locks `ending` (a panic while it was held leaves it usable: it is a list of workers judged).
pub(crate) fn lock(ending: &SharedEnding) -> std::sync::MutexGuard<'_, Ending> {
    ending.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How long a probe of a failed worker's host may take: a quarter of the suspicion `bound`,
/// within 0.25–2 s.
pub(crate) fn probe_timeout(bound: Duration) -> Duration {
    (bound / 4).clamp(Duration::from_millis(250), Duration::from_secs(2))
}

/// What becomes of a failed worker's process ([`decide`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    /// SIGKILL by pid.
    EndHere,
    /// Probe its host, then ask the runtime if the host completed the connection.
    Probe(SocketAddr),
    /// Not this member's to end, or nothing reaches it.
    Leave,
}

impl Ending {
    /// Notes the listeners of the workers on other hosts (`(worker, address)`), as a new set of
    /// windows gives them: where their hosts are probed, also after those windows are gone.
    pub fn know_listeners(&mut self, listeners: impl IntoIterator<Item = (i32, SocketAddr)>) {
        self.listeners.extend(listeners);
    }

    /// Ends the `failed` workers' processes this member is to end ([`decide`]), each once
    /// (one it leaves alone is judged again at the next call):
    /// those on its host by pid at once; for those on another host it starts a probe of the
    /// host, and [`Ending::end_probed`] asks the runtime once the host completed the
    /// connection. An error is reported, not retried.
    pub fn end_failed<F: Fabric>(&mut self, reacher: &Reacher<'_, F>, failed: &[(i32, Cause)]) {
        for &(worker, cause) in failed {
            if worker == reacher.me || self.done.contains(&worker) {
                continue;
            }
            match decide(reacher, worker, self.listeners.get(&worker).copied()) {
                Decision::EndHere => {
                    self.done.push(worker);
                    end(reacher, worker, Reach::ThisHost, cause);
                }
                Decision::Probe(address) => {
                    self.done.push(worker);
                    let told = rt::probe_tcp(address, reacher.probe_timeout);
                    self.probing.push((worker, cause, told));
                }
                Decision::Leave => {}
            }
        }
    }

    /// Whether a probe is still to be answered.
    pub fn is_probing(&self) -> bool {
        !self.probing.is_empty()
    }

    /// Asks the runtime to end each probed worker found frozen; a probe that answered no
    /// (refused: the process is dead; no answer: the host is cut off or down; the owner ran)
    /// leaves its worker alone for good. A frozen worker that the runtime may not be asked
    /// about now (this side lost the quorum meanwhile) is judged again at the next
    /// [`Ending::end_failed`]. Probes still running are looked at next time.
    pub fn end_probed<F: Fabric>(&mut self, reacher: &Reacher<'_, F>) {
        let mut answered = Vec::new();
        self.probing.retain(|(worker, cause, told)| match told.try_recv() {
            Ok(made) => {
                answered.push((*worker, *cause, made));
                false
            }
            Err(TryRecvError::Disconnected) => false,
            Err(TryRecvError::Empty) => true,
        });
        for (worker, cause, _) in answered.into_iter().filter(|&(_, _, frozen)| frozen) {
            if reacher.keeps_quorum && reacher.through_runtime {
                end(reacher, worker, Reach::Runtime, cause);
            } else {
                self.done.retain(|&w| w != worker);
            }
        }
    }
}

/// What member `reacher.me` does with failed `worker`'s process, given the worker's last
/// known `listener`: nothing while its side does not keep the quorum; ends it by pid when it
/// shares the host (a dead one is told apart by its pid's start time); probes its host, when
/// the runtime may be asked and a listener is known, when it is on another host.
fn decide<F>(reacher: &Reacher<'_, F>, worker: i32, listener: Option<SocketAddr>) -> Decision {
    if !reacher.keeps_quorum {
        return Decision::Leave;
    }
    let host = |w: i32| reacher.hosts.get(w as usize).copied();
    if host(worker) == host(reacher.me) {
        return Decision::EndHere;
    }
    match (reacher.through_runtime, listener) {
        (true, Some(address)) => Decision::Probe(address),
        _ => Decision::Leave,
    }
}

fn end<F: Fabric>(reacher: &Reacher<'_, F>, worker: i32, reach: Reach, cause: Cause) {
    let Some(tag) = reacher.processes.get(worker as usize) else { return };
    match reacher.comm.end_process(tag, reach) {
        Ok(Ended::Sent) => {
            events::emit(Event::EndedDeclared { worker, pid: tag.pid, reach, cause })
        }
        Ok(Ended::Gone | Ended::Unsupported) => {}
        Err(e) => events::warn(format!(
            "worker {worker} was declared failed, but its process could not be ended: {e}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_host_by_pid_and_another_hosts_worker_probed_when_the_runtime_may_be_asked_and_nothing_without_quorum(
    ) {
        // Workers 0..6 on hosts 0, 0, 1, 1, 2, 2.
        let hosts = [0, 0, 1, 1, 2, 2];
        let address: SocketAddr = "10.0.0.2:4000".parse().expect("an address");
        let reacher = |keeps_quorum, through_runtime| Reacher {
            comm: &(),
            me: 0,
            hosts: &hosts,
            processes: &[],
            keeps_quorum,
            through_runtime,
            probe_timeout: Duration::from_secs(1),
        };
        let table = [
            (1, None, (true, true), Decision::EndHere),
            (1, Some(address), (true, true), Decision::EndHere),
            (1, None, (false, true), Decision::Leave),
            (3, None, (true, true), Decision::Leave),
            (3, Some(address), (true, true), Decision::Probe(address)),
            (3, Some(address), (true, false), Decision::Leave),
            (3, Some(address), (false, true), Decision::Leave),
        ];
        for (worker, listener, (quorum, runtime), expected) in table {
            let decided = decide(&reacher(quorum, runtime), worker, listener);
            assert_eq!(decided, expected, "worker {worker}, listener {listener:?}");
        }
    }

    #[test]
    fn a_probe_tells_a_frozen_listener_from_a_running_one_and_a_closed_port() {
        let frozen = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
        let running = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
        let running_at = running.local_addr().expect("its address");
        let rejecting = std::thread::spawn(move || drop(running.accept()));
        let closed = {
            let gone = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
            gone.local_addr().expect("its address")
        };
        let timeout = Duration::from_millis(500);
        let frozen_at = frozen.local_addr().expect("its address");
        assert_eq!(rt::probe_tcp(frozen_at, timeout).recv(), Ok(true));
        assert_eq!(rt::probe_tcp(running_at, timeout).recv(), Ok(false));
        assert_eq!(rt::probe_tcp(closed, timeout).recv(), Ok(false));
        rejecting.join().expect("the rejecting listener");
    }

    #[test]
    fn the_probe_timeout_is_a_quarter_of_the_bound_within_a_quarter_second_and_two() {
        assert_eq!(probe_timeout(Duration::from_secs(10)), Duration::from_millis(2000));
        assert_eq!(probe_timeout(Duration::from_secs(3)), Duration::from_millis(750));
        assert_eq!(probe_timeout(Duration::from_millis(500)), Duration::from_millis(250));
    }
}
