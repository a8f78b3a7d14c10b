//! `ftkv probe`: what Open MPI's one-sided and two-sided calls do when their target is dead.
//!
//! Each case runs as its own `mpirun` job of 2 ranks (3 for the dead-lock-holder cases): rank 1
//! (or the lock holder, rank 2) SIGKILLs itself after a barrier; rank 0 waits until ULFM lists
//! it as failed, then makes the call under test. A watchdog thread reports `hang` when the call
//! has not returned after the bound and ends the rank; a job that ends without a report is an
//! `abort`.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ftkv_mpi::{failpoint, Comm, LockKind, LockedWindow, Mpi, MpiError, Window};
use serde::Serialize;

use crate::launch::Launch;

/// The window kinds and call groups a case belongs to.
pub const RMA_WINDOWS: [&str; 2] = ["allocate", "create_dynamic"];
/// Pseudo window name of the two-sided cases.
pub const TWO_SIDED: &str = "two_sided";

/// Pseudo window name of the runtime cases, run over simulated hosts.
pub const RUNTIME: &str = "runtime";
/// Runtime cases: `daemon_death`, one host's PRRTE daemon and its rank SIGKILLed together; the
/// outcome is whether the ranks on the other hosts can still shrink and synchronise. Each runs
/// once per entry of [`RUNTIME_OPTIONS`].
pub const RUNTIME_CALLS: [&str; 1] = ["daemon_death"];

/// A set of PRRTE options a runtime case runs under, on top of ftkv's own `mpirun` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// The name filters and reports use.
    pub name: &'static str,
    /// The extra `mpirun` flags ([`Launch::mpirun_args`]).
    pub flags: &'static [&'static str],
}

/// The recoverable-runtime options of the installed PRRTE (3.0.14) that a runtime case is run
/// under, one job each. `shipped` is ftkv's own flags only: `--with-ft ulfm`, which PRRTE's
/// Open MPI personality turns into the runtime options `recoverable` and `notifyerrors`.
pub const RUNTIME_OPTIONS: [RuntimeOptions; 7] = [
    RuntimeOptions { name: "shipped", flags: &[] },
    // Recoverable as the default of every job (an MCA parameter instead of a job option).
    RuntimeOptions {
        name: "recoverable_mca",
        flags: &["--prtemca", "state_base_recoverable", "1"],
    },
    // Run until explicitly terminated; failed processes restarted.
    RuntimeOptions { name: "continuous", flags: &["--runtime-options", "continuous"] },
    // Documented by `prterun --help runtime-options`.
    RuntimeOptions {
        name: "autorestart",
        flags: &["--runtime-options", "autorestart,max-restarts=2"],
    },
    // Automatic restarts as MCA defaults.
    RuntimeOptions {
        name: "autorestart_mca",
        flags: &[
            "--prtemca",
            "state_base_autorestart",
            "1",
            "--prtemca",
            "state_base_max_restarts",
            "2",
        ],
    },
    // Open MPI 4's recovery flags, still accepted by Open MPI 5's `mpirun`.
    RuntimeOptions {
        name: "enable_recovery",
        flags: &["--enable-recovery", "--max-restarts", "2", "--continuous"],
    },
    // The other error manager `prte_info` lists (the daemons' own), for `mpirun`.
    RuntimeOptions { name: "errmgr_prted", flags: &["--prtemca", "errmgr", "prted"] },
];

/// Extra `mpirun` flags of every runtime case: the error manager says what it decided
/// (`Comm failure: daemon ... - aborting`).
const RUNTIME_VERBOSE: [&str; 3] = ["--prtemca", "errmgr_base_verbose", "5"];

/// One-sided calls, each made against the dead target (`*_held`: against a live target whose
/// lock a dead rank held).
pub const RMA_CALLS: [&str; 14] = [
    "lock_exclusive",
    "lock_shared",
    "lock_all",
    "put",
    "get",
    "accumulate",
    "compare_and_swap",
    "fetch_and_op",
    "flush",
    "unlock",
    "fence",
    "free",
    "lock_exclusive_held",
    "lock_shared_held",
];

/// Two-sided calls to (or from) the dead rank.
pub const TWO_SIDED_CALLS: [&str; 5] = ["eager_send", "large_send", "ssend", "recv", "iprobe"];

const PROBER: i32 = 0;
const TARGET: i32 = 1;
const HOLDER: i32 = 2;
const DONE_TAG: i32 = 7;
const WINDOW_BYTES: usize = 4096;
const LARGE_SEND_BYTES: usize = 4 << 20;

/// Whether the caller's MPI already lists the dead target as failed when it makes the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Knowledge {
    /// The caller made MPI progress until `MPIX_Comm_get_failed` listed the target.
    Known,
    /// The caller made no MPI call for 300 ms after the target died, so nothing told it yet.
    Unknown,
}

impl Knowledge {
    pub fn name(self) -> &'static str {
        match self {
            Knowledge::Known => "known",
            Knowledge::Unknown => "unknown",
        }
    }

    pub fn parse(text: &str) -> Result<Knowledge> {
        match text {
            "known" => Ok(Knowledge::Known),
            "unknown" => Ok(Knowledge::Unknown),
            other => bail!("failure knowledge must be `known` or `unknown`, not {other:?}"),
        }
    }
}

/// One probe case: a call on a window kind (or two-sided), with the failure known or not; a
/// runtime case also names the PRRTE options it runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Case {
    pub window: &'static str,
    pub call: &'static str,
    pub failure: Knowledge,
    pub options: Option<RuntimeOptions>,
}

impl Case {
    /// The call, followed by `:<options>` for a runtime case.
    fn label(&self) -> String {
        match self.options {
            Some(options) => format!("{}:{}", self.call, options.name),
            None => self.call.to_owned(),
        }
    }
}

/// One measured case.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Outcome {
    pub window: String,
    pub call: String,
    pub outcome: String,
    /// Whether the caller knew of the failure when it called (see [`Knowledge`]).
    pub failure: Knowledge,
    /// For a runtime case: the name of its PRRTE options ([`RUNTIME_OPTIONS`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options: Option<String>,
    /// For an `abort`: the last lines the job wrote to stderr, which say who ended it; for a
    /// runtime case: the message that decided its outcome.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Every case of the probe.
pub fn all_cases() -> Vec<Case> {
    let rma = RMA_WINDOWS.iter().flat_map(|w| RMA_CALLS.iter().map(move |c| (*w, *c)));
    let pairs = rma.chain(TWO_SIDED_CALLS.iter().map(|c| (TWO_SIDED, *c)));
    let runtime = RUNTIME_CALLS.iter().flat_map(|call| {
        RUNTIME_OPTIONS.iter().map(move |options| Case {
            window: RUNTIME,
            call,
            failure: Knowledge::Known,
            options: Some(*options),
        })
    });
    pairs
        .flat_map(|(window, call)| {
            [Knowledge::Known, Knowledge::Unknown].map(|failure| Case {
                window,
                call,
                failure,
                options: None,
            })
        })
        .chain(runtime)
        .collect()
}

/// Selects the cases matching any filter; a filter is `:`-separated names of a window kind, a
/// call, `known`/`unknown` and/or a runtime case's options, all of which a case must have
/// (`allocate:put`, `fence:known`, `two_sided:ssend:unknown`, `flush`, `daemon_death:shipped`).
/// A filter that matches nothing is an error.
pub fn select_cases(filters: &[String]) -> Result<Vec<Case>> {
    if filters.is_empty() {
        return Ok(all_cases());
    }
    let mut chosen = Vec::new();
    for filter in filters {
        let matching: Vec<Case> = all_cases().into_iter().filter(|c| matches(filter, c)).collect();
        if matching.is_empty() {
            bail!("no probe case matches {filter:?} (see `ftkv probe --help` for the names)");
        }
        chosen.extend(matching);
    }
    Ok(chosen)
}

fn matches(filter: &str, case: &Case) -> bool {
    let options = case.options.map(|o| o.name);
    let names = [Some(case.window), Some(case.call), Some(case.failure.name()), options];
    filter.split(':').all(|part| names.contains(&Some(part)))
}

fn ranks_for(call: &str) -> usize {
    if call.ends_with("_held") || RUNTIME_CALLS.contains(&call) {
        3
    } else {
        2
    }
}

/// Runs each case in its own `mpirun` job of the program `exe` (which must understand
/// `probe-case WINDOW CALL KNOWLEDGE --hang-after SECS`), reporting progress on stderr.
pub fn run_cases(
    exe: &std::path::Path,
    cases: &[Case],
    hang_after: Duration,
) -> Result<Vec<Outcome>> {
    let mut outcomes = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let started = Instant::now();
        let (outcome, detail) = run_case(exe, case, hang_after)?;
        eprintln!(
            "[{:>2}/{}] {:<14} {:<20} {:<8} {outcome:<14} ({:.1} s)",
            i + 1,
            cases.len(),
            case.window,
            case.label(),
            case.failure.name(),
            started.elapsed().as_secs_f64()
        );
        if let Some(detail) = &detail {
            eprintln!("        {detail}");
        }
        outcomes.push(Outcome {
            window: case.window.to_owned(),
            call: case.call.to_owned(),
            outcome,
            failure: case.failure,
            options: case.options.map(|o| o.name.to_owned()),
            detail,
        });
    }
    Ok(outcomes)
}

/// Lines of an aborted job's stderr kept in its outcome.
const ABORT_DETAIL_LINES: usize = 12;

/// The case's outcome and, for an `abort`, the end of the job's stderr.
fn run_case(
    exe: &std::path::Path,
    case: &Case,
    hang_after: Duration,
) -> Result<(String, Option<String>)> {
    let bound = hang_after.as_secs_f64().to_string();
    let args = ["probe-case", case.window, case.call, case.failure.name(), "--hang-after", &bound];
    let file = std::env::temp_dir().join(format!("ftkv-probe-{}.outcome", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let mut job = Launch::new(exe, ranks_for(case.call))
        .args(args)
        .env(OUTCOME_FILE_VAR, &file.to_string_lossy())
        .timeout(hang_after + Duration::from_secs(20));
    if let Some(options) = case.options {
        // One rank per host, so that the dying daemon takes only the target with it.
        job = job
            .on_hosts(crate::cluster::Hosts::Simulated(ranks_for(case.call)))
            .mpirun_args(RUNTIME_VERBOSE)
            .mpirun_args(options.flags.iter().copied());
    }
    let out = job.run()?;
    let outcome = prober_outcome(&out, &file);
    let _ = std::fs::remove_file(&file);
    if case.options.is_some() {
        return Ok(runtime_outcome(&out, outcome));
    }
    let terminated = out.stderr.contains(DAEMON_LOST);
    if let Some(reported) = outcome {
        return Ok((reported.outcome, reported.detail));
    }
    if terminated {
        return Ok(("job_terminated".into(), None));
    }
    if out.timed_out {
        return Ok(("hang".into(), None));
    }
    let lines: Vec<&str> = out.stderr.lines().collect();
    let tail = lines[lines.len().saturating_sub(ABORT_DETAIL_LINES)..].join("\n");
    Ok(("abort".into(), Some(format!("exit {:?}; stderr ends: {tail}", out.status))))
}

/// What PRRTE prints when it ends a job because it lost a daemon (its `node-died` message).
const DAEMON_LOST: &str = "lost communication with a remote daemon";

/// The outcome of a runtime case and the message that decided it: `job_terminated` (PRRTE
/// ended the job after losing the daemon: this decides whatever the prober saw meanwhile,
/// since its barriers fail once the runtime kills the job's ranks), `rejected_option` (`mpirun`
/// ended before any rank spoke), `survivors_shrank` (the prober's shrink and barriers worked
/// for [`RUNTIME_WATCH`]), the prober's error or `hang`, else `abort`.
fn runtime_outcome(
    out: &crate::launch::JobOutput,
    reported: Option<ProberOutcome>,
) -> (String, Option<String>) {
    if out.stderr.contains(DAEMON_LOST) {
        let decided = help_gist(&out.stderr, DAEMON_LOST);
        let errmgr = out.stderr.lines().find(|l| l.contains("Comm failure: daemon"));
        let detail = errmgr.map_or(decided.clone(), |l| format!("{decided}; errmgr: {}", l.trim()));
        return ("job_terminated".into(), Some(detail));
    }
    let silent = (0..ranks_for(RUNTIME_CALLS[0])).all(|r| out.rank_lines(r).is_empty());
    let failed = out.status.is_some_and(|s| !s.success());
    if reported.is_none() && silent && failed && !out.timed_out {
        return ("rejected_option".into(), Some(help_gist(&out.stderr, "")));
    }
    match reported {
        Some(r) if r.outcome == "ok" => ("survivors_shrank".into(), None),
        Some(r) => (r.outcome, r.detail),
        None if out.timed_out => ("hang".into(), None),
        None => ("abort".into(), Some(format!("exit {:?}", out.status))),
    }
}

/// Longest detail [`help_gist`] returns.
const GIST_CHARS: usize = 400;

/// The gist of the PRRTE help message in `stderr` that starts at the first line containing
/// `start` (`""`: the first line of text): that line and the message's indented lines (PRRTE
/// indents a message's particulars) up to its closing `-----` line, joined with `; `, at most
/// [`GIST_CHARS`].
fn help_gist(stderr: &str, start: &str) -> String {
    let is_text = |l: &&str| !l.trim().is_empty() && !l.starts_with("-----");
    let mut lines =
        stderr.lines().skip_while(|l| !is_text(l) || !l.contains(start)).filter(|l| !l.is_empty());
    let Some(first) = lines.next() else { return String::new() };
    let message = lines.take_while(|l| !l.starts_with("-----"));
    let details = message.filter(|l| l.starts_with(' ') && !l.trim().is_empty()).map(str::trim);
    let gist: Vec<&str> = std::iter::once(first.trim()).chain(details).collect();
    gist.join("; ").chars().take(GIST_CHARS).collect()
}

/// The Markdown report: one matrix for the one-sided calls, one for the two-sided ones; each
/// column is a window kind with the failure known or unknown to the caller.
pub fn markdown(outcomes: &[Outcome]) -> String {
    let find = |w: &str, c: &str, k: Knowledge| {
        outcomes
            .iter()
            .find(|o| o.window == w && o.call == c && o.failure == k)
            .map_or("–", |o| o.outcome.as_str())
    };
    let columns: Vec<(&str, Knowledge)> = RMA_WINDOWS
        .iter()
        .flat_map(|w| [(*w, Knowledge::Known), (*w, Knowledge::Unknown)])
        .collect();
    let mut md = String::from("| one-sided call |");
    for (w, k) in &columns {
        md += &format!(" {w} ({}) |", k.name());
    }
    md += &format!("\n|---|{}\n", "---|".repeat(columns.len()));
    for call in RMA_CALLS {
        let cells: Vec<&str> = columns.iter().map(|(w, k)| find(w, call, *k)).collect();
        if cells.iter().any(|c| *c != "–") {
            md += &format!("| {call} | {} |\n", cells.join(" | "));
        }
    }
    md += "\n| two-sided call | known | unknown |\n|---|---|---|\n";
    for call in TWO_SIDED_CALLS {
        let (known, unknown) =
            (find(TWO_SIDED, call, Knowledge::Known), find(TWO_SIDED, call, Knowledge::Unknown));
        if known != "–" || unknown != "–" {
            md += &format!("| {call} | {known} | {unknown} |\n");
        }
    }
    md += "\n| runtime case (3 simulated hosts) | PRRTE options | outcome | deciding message |\n";
    md += "|---|---|---|---|\n";
    for o in outcomes.iter().filter(|o| o.window == RUNTIME) {
        let options = RUNTIME_OPTIONS.iter().find(|r| Some(r.name) == o.options.as_deref());
        let flags = options.map_or(String::new(), |r| r.flags.join(" "));
        let flags = if flags.is_empty() { "none".to_owned() } else { format!("`{flags}`") };
        let name = o.options.as_deref().unwrap_or_default();
        let detail = o.detail.as_deref().unwrap_or_default();
        md += &format!("| {}:{name} | {flags} | {} | {detail} |\n", o.call, o.outcome);
    }
    md
}

/// The rank side of one case (run under `mpirun`). Rank 0 prints `outcome=<x>`.
pub fn rank_main(window: &str, call: &str, failure: Knowledge, hang_after: Duration) -> Result<()> {
    let mpi = Mpi::init()?;
    let world = mpi.world()?;
    let probe = Probe { failure, hang_after };
    if window == TWO_SIDED {
        return two_sided_case(&world, call, probe);
    }
    if window == RUNTIME {
        return daemon_death_case(&world, probe);
    }
    rma_case(&world, window, call, probe)
}

/// How the prober makes its call: after learning of the failure or not, and with which bound.
#[derive(Debug, Clone, Copy)]
struct Probe {
    failure: Knowledge,
    hang_after: Duration,
}

fn victim(call: &str) -> i32 {
    if call.ends_with("_held") {
        HOLDER
    } else {
        TARGET
    }
}

/// The window under test and the displacement of the target's memory in it.
struct TestWindow {
    window: Window,
    target_disp: i64,
}

fn create_window(world: &Comm, kind: &str) -> Result<TestWindow> {
    match kind {
        "allocate" => {
            Ok(TestWindow { window: Window::allocate(world, WINDOW_BYTES)?, target_disp: 0 })
        }
        "create_dynamic" => {
            let mut window = Window::create_dynamic(world)?;
            let address = window.attach(WINDOW_BYTES)?;
            let all = world.allgather(&address.to_le_bytes())?;
            let at = TARGET as usize * 8;
            let target_disp = i64::from_le_bytes(all[at..at + 8].try_into().expect("8 bytes"));
            Ok(TestWindow { window, target_disp })
        }
        other => bail!("unknown window kind {other:?}"),
    }
}

fn rma_case(world: &Comm, kind: &str, call: &str, probe: Probe) -> Result<()> {
    let test = create_window(world, kind)?;
    let rank = world.rank();
    if rank == PROBER {
        return prober_rma(world, test, call, probe);
    }
    if rank == victim(call) {
        let _held = if rank == HOLDER {
            Some(hold_target_lock(&test.window, test.target_disp)?)
        } else {
            None
        };
        pass_barrier(world)?;
        failpoint::kill_self();
    }
    pass_barrier(world)?;
    wait_for_prober(world, probe.hang_after)
}

/// Rank 0 prepares what the call needs while everybody lives (an epoch, a lock), passes the
/// barrier after which the victim dies, waits until it knows, and makes the call.
fn prober_rma(world: &Comm, test: TestWindow, call: &str, probe: Probe) -> Result<()> {
    let disp = test.target_disp;
    let dead = victim(call);
    if needs_epoch(call) {
        let epoch = test.window.lock_all()?;
        pass_barrier(world)?;
        await_failure(world, dead, probe.failure)?;
        return report(probe.hang_after, || epoch_call(&epoch, call, disp));
    }
    if call == "unlock" {
        let lock = lock_and_put(&test.window, disp)?;
        pass_barrier(world)?;
        await_failure(world, dead, probe.failure)?;
        return report(probe.hang_after, || lock.unlock());
    }
    pass_barrier(world)?;
    await_failure(world, dead, probe.failure)?;
    report(probe.hang_after, || plain_call(test.window, call))
}

fn needs_epoch(call: &str) -> bool {
    matches!(call, "put" | "get" | "accumulate" | "compare_and_swap" | "fetch_and_op" | "flush")
}

/// Rank 2 of a `*_held` case takes an exclusive lock on the target and makes sure it is really
/// acquired (a put and a flush), then dies holding it.
fn hold_target_lock(window: &Window, disp: i64) -> Result<ftkv_mpi::TargetLock<'_>> {
    let lock = window.lock(TARGET, LockKind::Exclusive)?;
    let data = [1u8; 8];
    lock.scope(|s| s.put(TARGET, disp, &data))?;
    Ok(lock)
}

fn lock_and_put(window: &Window, disp: i64) -> Result<ftkv_mpi::TargetLock<'_>> {
    let lock = window.lock(TARGET, LockKind::Exclusive)?;
    let data = [2u8; 8];
    lock.scope(|s| s.put(TARGET, disp, &data))?;
    Ok(lock)
}

fn epoch_call(epoch: &LockedWindow, call: &str, disp: i64) -> std::result::Result<(), MpiError> {
    let data = [3u8; 64];
    let mut out = [0u8; 64];
    let values = [1u64; 8];
    match call {
        "put" => epoch.scope(|s| report_now(s.put(TARGET, disp, &data))),
        "get" => epoch.scope(|s| report_now(s.get(TARGET, disp, &mut out))),
        "accumulate" => epoch.scope(|s| report_now(s.accumulate_sum(TARGET, disp, &values))),
        "compare_and_swap" => epoch.compare_and_swap(TARGET, disp, 0, 1).map(drop),
        "fetch_and_op" => epoch.fetch_and_add(TARGET, disp, Some(1)).map(drop),
        "flush" => {
            epoch.scope(|s| s.put(TARGET, disp, &data)).map_err(|e| e.with_peer(TARGET))?;
            epoch.flush(TARGET)
        }
        other => unreachable!("{other} needs no epoch"),
    }
}

/// Reports the outcome of a call that only queues an operation, as soon as it returns (the
/// completing flush that follows is not what the case measures).
fn report_now(result: std::result::Result<(), MpiError>) -> std::result::Result<(), MpiError> {
    print_outcome(&result);
    failpoint::exit_now(0)
}

fn plain_call(window: Window, call: &str) -> std::result::Result<(), MpiError> {
    match call {
        "lock_all" => window.lock_all().map(std::mem::forget),
        "free" => window.free(),
        "lock_exclusive" | "lock_exclusive_held" => {
            window.lock(TARGET, LockKind::Exclusive).map(std::mem::forget)
        }
        "lock_shared" | "lock_shared_held" => {
            window.lock(TARGET, LockKind::Shared).map(std::mem::forget)
        }
        "fence" => window.fence(),
        other => unreachable!("{other} is handled elsewhere"),
    }
}

fn two_sided_case(world: &Comm, call: &str, probe: Probe) -> Result<()> {
    pass_barrier(world)?;
    if world.rank() == TARGET {
        failpoint::kill_self();
    }
    await_failure(world, TARGET, probe.failure)?;
    report(probe.hang_after, || match call {
        "eager_send" => world.send(&[0u8; 8], TARGET, 1),
        "large_send" => world.send(&vec![0u8; LARGE_SEND_BYTES], TARGET, 1),
        "ssend" => world.ssend(&[0u8; 8], TARGET, 1),
        "recv" => world.recv(&mut [0u8; 8], TARGET, 1).map(drop),
        "iprobe" => world.iprobe(TARGET, 1).map(drop),
        other => unreachable!("unknown two-sided call {other}"),
    })
}

/// The target SIGKILLs its host's PRRTE daemon (its parent) and itself; the others, once ULFM
/// reports the target failed, shrink and synchronise on the survivors for [`RUNTIME_WATCH`].
/// The prober reports `ok` when that worked; when the runtime ends the job instead, the driver
/// reports `job_terminated`.
fn daemon_death_case(world: &Comm, probe: Probe) -> Result<()> {
    pass_barrier(world)?;
    if world.rank() == TARGET {
        kill_own_daemon()?;
        failpoint::kill_self();
    }
    await_failure(world, TARGET, probe.failure)?;
    let go_on = || world.shrink().and_then(|survivors| keep_synchronising(&survivors));
    if world.rank() != PROBER {
        go_on()?;
        return wait_for_prober(world, probe.hang_after + RUNTIME_WATCH);
    }
    report(probe.hang_after + RUNTIME_WATCH, go_on)
}

/// How long the survivors of a daemon's death must keep working before the case reports `ok`:
/// the runtime ends such a job about 2 s after the death, which a single barrier can beat.
const RUNTIME_WATCH: Duration = Duration::from_secs(5);

/// Barriers on `survivors` every 100 ms for [`RUNTIME_WATCH`].
fn keep_synchronising(survivors: &Comm) -> std::result::Result<(), MpiError> {
    let start = Instant::now();
    while start.elapsed() < RUNTIME_WATCH {
        survivors.barrier()?;
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// SIGKILLs this rank's parent, which must be its host's PRRTE daemon.
fn kill_own_daemon() -> Result<()> {
    let daemon = std::os::unix::process::parent_id();
    let name = std::fs::read_to_string(format!("/proc/{daemon}/comm"))?;
    ensure!(name.trim() == "prted", "the rank's parent is {:?}, not a PRRTE daemon", name.trim());
    ensure!(crate::launch::kill_pid(daemon)?, "the daemon {daemon} was already gone");
    Ok(())
}

/// The barrier after which the victim dies. Ranks leave it at different moments, so a rank
/// still inside can already see the victim's death: that is the experiment, not an error (an
/// error would end the whole job, and with it the prober's report).
fn pass_barrier(world: &Comm) -> Result<()> {
    match world.barrier() {
        Err(e) if !e.is_failure() => Err(e.into()),
        _ => Ok(()),
    }
}

/// `Known`: waits (making MPI progress) until this rank's ULFM lists `rank` as failed, at most
/// 3 s, and prints `detected_ms=` (or `detected_ms=none`). `Unknown`: sleeps 300 ms without any
/// MPI call, so the target is dead but nothing has told this rank.
fn await_failure(world: &Comm, rank: i32, failure: Knowledge) -> Result<()> {
    if failure == Knowledge::Unknown {
        std::thread::sleep(Duration::from_millis(300));
        return Ok(());
    }
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        if world.failed_ranks()?.contains(&rank) {
            println!("detected_ms={}", start.elapsed().as_millis());
            return Ok(());
        }
        if let Err(e) = world.iprobe(ftkv_mpi::ANY_SOURCE, ftkv_mpi::ANY_TAG) {
            if !e.is_failure() {
                return Err(e.into());
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    println!("detected_ms=none");
    Ok(())
}

/// Runs `call` under a watchdog and prints its outcome, then leaves without finalising (MPI may
/// be wedged after a call against a dead process).
fn report(
    hang_after: Duration,
    call: impl FnOnce() -> std::result::Result<(), MpiError>,
) -> Result<()> {
    let bounded = failpoint::exit_unless_done(hang_after, || {
        publish_outcome(ProberOutcome { outcome: "hang".into(), detail: None })
    });
    let result = call();
    drop(bounded);
    print_outcome(&result);
    failpoint::exit_now(0)
}

fn print_outcome(result: &std::result::Result<(), MpiError>) {
    match result {
        Ok(()) => publish_outcome(ProberOutcome { outcome: "ok".into(), detail: None }),
        Err(e) => publish_outcome(ProberOutcome {
            outcome: e.kind_name().to_owned(),
            detail: Some(e.to_string()),
        }),
    }
}

/// Environment variable naming the file the prober also writes its outcome to: the rank leaves
/// without finalising right after printing, and the runtime, tearing the job down, may drop
/// output it has not forwarded yet.
const OUTCOME_FILE_VAR: &str = "FTKV_PROBE_OUTCOME";

/// What the prober saw of its call (`outcome {json}`, on stdout and in the outcome file).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct ProberOutcome {
    /// `ok`, `hang`, or the error's class.
    outcome: String,
    /// The error's message.
    detail: Option<String>,
}

/// Prints the prober's outcome report and writes it to the outcome file, when the driver
/// named one.
fn publish_outcome(outcome: ProberOutcome) {
    let line = crate::launch::report_line("outcome", &outcome);
    if let Some(path) = std::env::var_os(OUTCOME_FILE_VAR) {
        if let Err(e) = std::fs::write(&path, format!("{line}\n")) {
            eprintln!("ftkv: writing the probe outcome to {path:?}: {e}");
        }
    }
    println!("{line}");
}

/// The prober's outcome: its stdout report, else the one in the outcome file it wrote.
fn prober_outcome(out: &crate::launch::JobOutput, file: &std::path::Path) -> Option<ProberOutcome> {
    let reported: Option<ProberOutcome> = out.rank_report(PROBER as usize, "outcome").ok()?;
    if reported.is_some() {
        return reported;
    }
    let text = std::fs::read_to_string(file).ok()?;
    let json = text.trim().strip_prefix("outcome ")?;
    serde_json::from_str(json).ok()
}

/// Ranks other than the prober stay alive (and hold their window memory) until the prober is
/// gone or the bound passed.
fn wait_for_prober(world: &Comm, hang_after: Duration) -> Result<()> {
    let bound = hang_after + Duration::from_secs(10);
    let done = world.irecv(1, PROBER, DONE_TAG).context("waiting for the prober")?;
    match done.wait_until(Instant::now() + bound, bound) {
        Ok(_) | Err(MpiError::ProcFailed { .. }) | Err(MpiError::Timeout { .. }) => {
            failpoint::exit_now(0)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_select_cases_by_window_call_and_knowledge() {
        let runtime = RUNTIME_CALLS.len() * RUNTIME_OPTIONS.len();
        let table: [(&str, usize); 11] = [
            ("allocate:put", 2),
            ("put", 4),
            ("fence:known", 2),
            ("two_sided:ssend:unknown", 1),
            ("known", (all_cases().len() - runtime) / 2 + runtime),
            ("daemon_death", RUNTIME_OPTIONS.len()),
            ("daemon_death:shipped", 1),
            ("runtime:continuous:known", 1),
            ("runtime:daemon_death:unknown", 0),
            ("allocate:eager_send", 0),
            ("teleport", 0),
        ];
        for (filter, count) in table {
            let found = all_cases().iter().filter(|c| matches(filter, c)).count();
            assert_eq!(found, count, "filter {filter:?}");
        }
        assert!(select_cases(&["teleport".into()]).is_err());
        let pairs = 2 * RMA_CALLS.len() + TWO_SIDED_CALLS.len();
        assert_eq!(all_cases().len(), 2 * pairs + runtime);
    }

    #[test]
    fn a_help_message_s_gist_is_its_first_line_and_its_particulars() {
        let stderr = "noise\n-----\nPRTE has lost communication with a remote daemon.\n\n  \
                      HNP daemon   : [p@0,0] on node head\n  Remote daemon: [p@0,2] on node h1\n\n\
                      This is usually due to\n-----\n";
        let want = "PRTE has lost communication with a remote daemon.; \
                    HNP daemon   : [p@0,0] on node head; Remote daemon: [p@0,2] on node h1";
        assert_eq!(help_gist(stderr, DAEMON_LOST), want);
        let rejected = "-----\nIt looks like prte_init() failed\nfor some reason\n\n   \
                        prte_errmgr_base_select failed\n-----\n  later: not this one\n";
        let want = "It looks like prte_init() failed; prte_errmgr_base_select failed";
        assert_eq!(help_gist(rejected, ""), want);
        assert_eq!(help_gist("", DAEMON_LOST), "");
    }

    #[test]
    fn runtime_option_names_are_unique_and_unlike_other_case_names() {
        let names: std::collections::BTreeSet<&str> =
            RUNTIME_OPTIONS.iter().map(|o| o.name).collect();
        assert_eq!(names.len(), RUNTIME_OPTIONS.len());
        let others = RMA_WINDOWS.iter().chain(&RMA_CALLS).chain(&TWO_SIDED_CALLS);
        assert!(others
            .chain(&[TWO_SIDED, RUNTIME, "known", "unknown"])
            .all(|n| !names.contains(n)));
    }
}
