//! ftkv over hosts simulated on this machine (`--nodes`: a network namespace, host name and
//! PRRTE daemon per host, TCP between them), under real `mpirun --with-ft ulfm`: a job with
//! kills, all ranks of one host killed at once, and no leftovers (processes, namespaces,
//! shared-memory files). No process may end itself when only killed ranks failed. Every run
//! has a hard bound.

use std::time::Duration;

use ftkv_cli::cluster::namespaces_with_prefix;
use ftkv_cli::launch::{job_slot, shm_segments};

mod common;

use common::Driver;

/// The network namespace of process `pid` (`net:[inode]`).
fn netns_of(pid: u32) -> String {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/net")).expect("a live rank");
    link.display().to_string()
}

/// After a driver ended: none of its namespaces, processes or new shared-memory files remain.
fn assert_no_leftovers(driver_pid: u32, ranks: &[u32], shm_before: &[String]) {
    let prefix = format!("ftkv{driver_pid}x");
    assert_eq!(namespaces_with_prefix(&prefix), Vec::<String>::new(), "namespaces left");
    let alive: Vec<&u32> =
        ranks.iter().filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists()).collect();
    assert!(alive.is_empty(), "ranks left running: {alive:?}");
    let new: Vec<String> = shm_segments().into_iter().filter(|s| !shm_before.contains(s)).collect();
    assert!(new.is_empty(), "shared-memory files left: {new:?}");
}

/// The ids of the list in `text` right after `label`, e.g. `[1, 3]`.
fn list_after(text: &str, label: &str) -> Vec<usize> {
    let at = text.find(label).unwrap_or_else(|| panic!("no {label:?} in:\n{text}")) + label.len();
    let list = text[at..].split(']').next().unwrap_or_default();
    list.trim().trim_matches(['[', ']']).split(',').filter_map(|w| w.trim().parse().ok()).collect()
}

#[test]
fn a_demo_over_three_hosts_with_two_kills_matches_and_no_process_ends_itself() {
    let _slot = job_slot();
    let shm_before = shm_segments();
    let args = ["demo", "--nodes", "3", "-n", "6", "--kills", "2", "--copies", "2"];
    let driver = Driver::start(&[&args[..], &["--tree", "T1", "--timeout", "120"]].concat());
    let pid = driver.id();
    let ranks: Vec<u32> =
        common::wait_for_world_ranks(pid, "tasks-rank", 6).into_values().collect();
    let (status, stdout, stderr) = driver.finish(Duration::from_secs(180));
    assert!(status.success(), "the demo failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("-> MATCH"), "{stdout}");
    assert_eq!(list_after(&stdout, "killed ranks").len(), 2, "{stdout}\n{stderr}");
    let ended = list_after(&stdout, "ranks that ended themselves");
    assert_eq!(ended, Vec::<usize>::new(), "{stdout}\n{stderr}");
    assert_no_leftovers(pid, &ranks, &shm_before);
}

/// The pool's localized recovery across hosts: two workers SIGKILLed by PID, the survivors
/// settle their work while the others keep stealing over TCP, and nobody stops for a global
/// recovery.
#[test]
fn a_localized_demo_over_three_hosts_with_two_kills_matches_without_a_global_recovery() {
    let _slot = job_slot();
    let shm_before = shm_segments();
    let args = ["demo", "--nodes", "3", "-n", "6", "--kills", "2", "--copies", "2"];
    let localized = ["--recovery", "localized", "--seed", "3"];
    let driver =
        Driver::start(&[&args[..], &localized, &["--tree", "T1", "--timeout", "120"]].concat());
    let pid = driver.id();
    let ranks: Vec<u32> =
        common::wait_for_world_ranks(pid, "tasks-rank", 6).into_values().collect();
    let (status, stdout, stderr) = driver.finish(Duration::from_secs(180));
    assert!(status.success(), "the demo failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("-> MATCH"), "{stdout}");
    assert_eq!(list_after(&stdout, "killed ranks").len(), 2, "{stdout}\n{stderr}");
    assert!(stdout.contains("global recoveries: 0"), "{stdout}\n{stderr}");
    let ended = list_after(&stdout, "ranks that ended themselves");
    assert_eq!(ended, Vec::<usize>::new(), "{stdout}\n{stderr}");
    assert_no_leftovers(pid, &ranks, &shm_before);
}

/// What a driver run ended with: its status, output and the PIDs of its ranks.
struct Ended {
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
    pid: u32,
    ranks: Vec<u32>,
}

/// Open MPI's runtime ended the job because it lost a host's daemon: the one failure ftkv
/// cannot survive (`docs/hosts.md`, "A host's daemon dying ends the whole job").
const DAEMON_LOST: &str = "PRTE has lost communication with a remote daemon";

/// 6 ranks over `hosts` simulated hosts (by slot: 0–1, 2–3, 4–5 on 3 hosts; 0–2, 3–5 on 2),
/// and every rank of the host of rank 5 SIGKILLed at the same moment, 0.5 s after the pool showed
/// work in the deep tree (T3L, unless `extra` names a `--tree`) (a death during `MPI_Init` or
/// the store's creation ends any job), while the pool checkpoints and steals across hosts;
/// `extra` arguments to the demo. Over 2 hosts the survivors hold exactly half of the workers,
/// worker 0 among them, which the quorum rule lets go on.
fn kill_one_hosts_ranks_during_a_demo(hosts: usize, extra: &[&str]) -> Ended {
    let hosts_arg = hosts.to_string();
    let args = ["demo", "--nodes", &hosts_arg, "-n", "6", "--kills", "0", "--copies", "2"];
    let tree: &[&str] = if extra.contains(&"--tree") { &[] } else { &["--tree", "T3L"] };
    let driver = Driver::start(&[&args[..], tree, &["--timeout", "150"], extra].concat());
    let pid = driver.id();
    let by_rank = common::wait_for_world_ranks(pid, "tasks-rank", 6);
    driver.wait_for_work(Duration::from_secs(90));
    std::thread::sleep(Duration::from_millis(500));
    let host = netns_of(by_rank[&5]);
    let victims: Vec<u32> = by_rank.values().copied().filter(|&p| netns_of(p) == host).collect();
    let mut spread: Vec<(usize, String)> =
        by_rank.iter().map(|(&r, &p)| (r, netns_of(p))).collect();
    spread.sort();
    assert_eq!(victims.len(), 6 / hosts, "6 ranks over {hosts} hosts: {spread:?}");
    common::kill_and_confirm(&victims);
    let ranks: Vec<u32> = by_rank.into_values().collect();
    let (status, stdout, stderr) = driver.finish(Duration::from_secs(200));
    Ended { status, stdout, stderr, pid, ranks }
}

/// Once in CI (none of 10 runs on this machine) Open MPI's runtime lost a host's daemon right
/// after the kill and ended the whole job, which no store can survive; such a run is repeated
/// once, and a second one fails the test.
#[test]
fn all_ranks_of_one_host_killed_at_once_lose_nothing() {
    let (stdout, _) = kill_one_hosts_ranks_and_check(3, &[]);
    assert!(!stdout.contains("global recoveries: 0"), "the store recovered globally: {stdout}");
}

/// The same with localized recovery: both workers' buddies settle their work in transactions
/// while the other host's workers keep working; nobody stops for a global recovery.
#[test]
fn all_ranks_of_one_host_killed_at_once_are_settled_locally() {
    let (stdout, stderr) = kill_one_hosts_ranks_and_check(3, &["--recovery", "localized"]);
    assert!(stdout.contains("global recoveries: 0"), "{stdout}\n{stderr}");
}

/// The wavefront of futures (9,000,000 cells, each awaited by two) with a host's ranks killed
/// at once: the frames they held, their futures entries and the values they owed go to their
/// buddies on the other hosts, settled locally; the last cell exact.
#[test]
fn a_hosts_ranks_killed_at_once_during_the_wavefront_lose_nothing() {
    let extra = ["--model", "fbc", "--tree", "wave:3000", "--recovery", "localized"];
    let (stdout, stderr) = kill_one_hosts_ranks_and_check(3, &extra);
    assert!(stdout.contains("9000000 nodes, 15137373 leaves -> MATCH"), "{stdout}\n{stderr}");
    assert!(stdout.contains("global recoveries: 0"), "{stdout}\n{stderr}");
}

/// Open MPI's default mapping over 2 hosts (by slot: ranks 0–2 on one, 3–5 on the other) and
/// 2 copies: the second host's 3 ranks killed together. Placement keeps a copy of every key off
/// each host, so nothing is lost and the count is exact.
#[test]
fn a_host_lost_over_two_hosts_by_slot_loses_nothing() {
    kill_one_hosts_ranks_and_check(2, &[]);
}

/// Kills one host's ranks during a demo run over `hosts` hosts with `extra` arguments; checks
/// the exact result, the agreed failures and that no process was left behind. The demo's
/// stdout and stderr.
fn kill_one_hosts_ranks_and_check(hosts: usize, extra: &[&str]) -> (String, String) {
    let _slot = job_slot();
    let shm_before = shm_segments();
    let mut run = kill_one_hosts_ranks_during_a_demo(hosts, extra);
    assert_no_leftovers(run.pid, &run.ranks, &shm_before);
    if !run.status.success() && run.stderr.contains(DAEMON_LOST) {
        eprintln!("the runtime lost a daemon and ended the job; once more:\n{}", run.stderr);
        run = kill_one_hosts_ranks_during_a_demo(hosts, extra);
        assert_no_leftovers(run.pid, &run.ranks, &shm_before);
    }
    let Ended { status, stdout, stderr, .. } = run;
    assert!(status.success(), "the demo failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("-> MATCH"), "{stdout}");
    assert_eq!(
        list_after(&stdout, "failed ranks as the survivors agreed").len(),
        6 / hosts,
        "{stdout}\n{stderr}"
    );
    let ended = list_after(&stdout, "ranks that ended themselves");
    assert_eq!(ended, Vec::<usize>::new(), "{stdout}\n{stderr}");
    assert!(stderr.contains("failed without a kill of this driver's"), "{stderr}");
    (stdout, stderr)
}

/// A worker on one of 3 hosts SIGSTOPped for 12 s with a 5 s suspicion bound: the puts of the
/// other hosts' writers to it wait (TCP) until the heartbeat detector declares it, the
/// survivors recover and print the exact result while it is stopped, and once resumed it ends
/// itself. 3 copies: once in CI the detector also declared a live rank dead (3 s bound), which
/// with 2 copies lost a key of which both holders were declared.
///
/// With every simulated host's ranks in one scheduling group (see `ftkv_launch::cluster`), 6 of
/// 6 runs passed on this 2-core machine; with a group per host, 3 of 7 failed when a whole
/// host went without a time slice for longer than the bound (a live rank declared dead during
/// store creation, or a rank that declared all others dead).
///
/// The survivors end the stopped process (its host mate, by pid), so the job ends within the
/// bound, a recovery and a second of the stop.
#[test]
fn a_worker_stopped_past_the_suspicion_bound_across_hosts_is_ended() {
    let _slot = job_slot();
    let args = ["--nodes", "3", "-n", "6", "--kills", "0", "--copies", "3", "--tree", "T1"];
    let stop = ["--stop", "60", "--suspicion", "5", "--timeout", "90"];
    let (report, stdout, stderr) =
        common::demo_report(&[&args[..], &stop[..]].concat(), Duration::from_secs(150));
    common::assert_ended_while_stopped(&report, &stdout, &stderr, false, Duration::from_secs(5));
}

/// With every default: every rank of one of 3 simulated hosts (mapped by slot: consecutive
/// ranks, which Open MPI's ring detector would find one bound after the other) SIGSTOPped at
/// once for 60 s with a 5 s bound: the store's own heartbeat finds them within the bound, their
/// heartbeat peers on the other hosts find that the host still answers and ask the runtime to
/// end them (no worker is left on their host), the survivors' result is exact, and the job
/// ends within the bound, a recovery and a second of the stop.
#[test]
fn a_hosts_every_rank_stopped_at_once_is_ended_through_the_runtime() {
    let _slot = job_slot();
    let args = ["--nodes", "3", "-n", "6", "--kills", "0", "--copies", "3", "--tree", "T1"];
    let stop = ["--stop", "60", "--stop-host", "--suspicion", "5", "--timeout", "90"];
    let args = [&args[..], &stop[..]].concat();
    let (report, stdout, stderr) = common::demo_report(&args, Duration::from_secs(150));
    let stopped = report["stopped_ranks"].as_array().expect("stopped").len();
    assert_eq!(stopped, 2, "a host's 2 ranks: {stdout}\n{stderr}");
    common::assert_ended_while_stopped(&report, &stdout, &stderr, true, Duration::from_secs(5));
}

#[test]
fn progress_lines_are_read_for_their_task_count() {
    let line = "[demo]   2.28 s: 13.00 M tasks on live workers (5.71 M/s), kills 0/0";
    assert_eq!(common::tasks_in_progress_line(line), Some(13.0));
    assert_eq!(common::tasks_in_progress_line("[demo] UTS T3L on 6 ranks"), None);
}
