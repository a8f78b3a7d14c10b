//! Running a program as an MPI job under `mpirun --with-ft ulfm`, with a hard timeout and
//! per-rank output.
//!
//! Under `--with-ft ulfm`, `mpirun` exits 0 even when ranks were killed, so callers judge a job
//! by each rank's own output ([`JobOutput::rank_lines`]). Lines reach us through
//! `--output tag` (`[job,rank]<stdout>: text`).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::cluster::{Hosts, SimulatedCluster};
use crate::env;
use crate::rank_errors::{find_rank_error, rank_errors_in, said_once};
use crate::records::{RankRecords, RECORDS_VAR};

/// Variables of ftkv's that every job's ranks see when they are set here.
const FORWARDED: [&str; 4] =
    ["FTKV_FAILPOINT", "FTKV_TRACE", "FTKV_END_DECLARED", "FTKV_END_THROUGH_RUNTIME"];

/// A job to start: program, arguments, rank count, environment, MCA parameters and timeout.
#[derive(Debug, Clone)]
pub struct Launch {
    program: PathBuf,
    args: Vec<String>,
    ranks: usize,
    env: Vec<(String, String)>,
    mca: Vec<(String, String)>,
    flags: Vec<String>,
    timeout: Duration,
    attached: bool,
    hosts: Option<Hosts>,
}

impl Launch {
    /// A job of `ranks` copies of `program`, killed after 60 s unless [`Launch::timeout`] says
    /// otherwise.
    pub fn new(program: impl AsRef<Path>, ranks: usize) -> Launch {
        Launch {
            program: program.as_ref().to_owned(),
            args: Vec::new(),
            ranks,
            env: Vec::new(),
            mca: Vec::new(),
            flags: Vec::new(),
            timeout: Duration::from_secs(60),
            attached: false,
            hosts: None,
        }
    }

    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Launch {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// An environment variable for every rank (exported with `-x`).
    pub fn env(mut self, key: &str, value: &str) -> Launch {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Runs the job on `hosts` instead of the hosts `FTKV_NODES` / `FTKV_HOSTFILE` name.
    pub fn on_hosts(mut self, hosts: Hosts) -> Launch {
        self.hosts = Some(hosts);
        self
    }

    /// Open MPI's heartbeat failure detector: each rank sends a heartbeat every `period` from
    /// its MPI progress (a store's detector thread makes progress every millisecond; Open
    /// MPI's own detector thread stays off, see `ftkv_mpi::default_heartbeat_detector`) and a
    /// rank silent for `timeout` is declared failed; the verdict spreads
    /// by Open MPI's reliable broadcast among the ranks (the default, through the runtime, does
    /// not reach them while a host's daemon is cut off). The only thing in Open MPI that
    /// declares a rank failed that is alive but silent (stopped, cut off).
    pub fn heartbeat_detector(
        self,
        period: std::time::Duration,
        timeout: std::time::Duration,
    ) -> Launch {
        self.mca("mpi_ft_detector", "true")
            .mca("mpi_ft_detector_thread", "false")
            .mca("mpi_ft_detector_period", &period.as_secs_f64().to_string())
            .mca("mpi_ft_detector_timeout", &timeout.as_secs_f64().to_string())
            .mca("mpi_ft_propagator_with_rbcast", "true")
    }

    /// Open MPI's heartbeat detector set for a store's suspicion bound (`Config::suspicion`): a
    /// rank silent for `suspicion` is declared failed, heartbeats every tenth of it (at least
    /// 0.1 s, at most 1 s), so that the store's own check, which ends a rank that did not run
    /// for half the bound, keeps its margin. What `ftkv demo --stop` and `ftkv chaos --stop`
    /// run with.
    pub fn suspicion_detector(self, suspicion: std::time::Duration) -> Launch {
        let tenth = suspicion / 10;
        let period =
            tenth.clamp(std::time::Duration::from_millis(100), std::time::Duration::from_secs(1));
        self.heartbeat_detector(period, suspicion)
    }

    /// An MCA parameter (`--mca key value`).
    pub fn mca(mut self, key: &str, value: &str) -> Launch {
        self.mca.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Extra `mpirun` flags, passed as given after ftkv's own flags and MCA parameters and
    /// before the program (e.g. `--prtemca KEY VALUE`, `--runtime-options LIST`). `mpirun`
    /// judges them: one it rejects ends the job before any rank starts, with its message on
    /// the job's stderr ([`Launch::run`] does not start such a job again).
    pub fn mpirun_args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, flags: I) -> Launch {
        self.flags.extend(flags.into_iter().map(Into::into));
        self
    }

    /// `FTKV_TEST_BTL=tcp` moves the job to `--mca btl self,tcp` (the transport between nodes),
    /// pinned to the loopback interface: Open MPI's default excludes `127.0.0.1/8` and would
    /// talk over the machine's external address. The real-MPI tests run once without and once
    /// with it.
    pub fn transport_from_env(self) -> Launch {
        match std::env::var("FTKV_TEST_BTL").as_deref() {
            Ok("tcp") => self.mca("btl", "self,tcp").mca("btl_tcp_if_include", "lo"),
            _ => self,
        }
    }

    /// The job's output goes straight to this process's stdout and stderr, untagged (the
    /// returned [`JobOutput`] then holds no stdout lines; its stderr is kept as well), except
    /// the ranks' error lines: once the job has ended, each of their messages is printed once,
    /// with the ranks that reported it ([`JobOutput::errors_said_once`]).
    pub fn attached(mut self) -> Launch {
        self.attached = true;
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Launch {
        self.timeout = timeout;
        self
    }

    /// The `mpirun` command line on `hosts` (ftkv's variables set in this process are passed
    /// on to the ranks: `FTKV_FAILPOINT`, `FTKV_TRACE`, `FTKV_END_DECLARED`, `FTKV_END_THROUGH_RUNTIME`).
    fn command(
        &self,
        hosts: &Hosts,
        cluster: Option<&SimulatedCluster>,
        records: &Path,
    ) -> Result<Command> {
        let mut cmd = match cluster {
            Some(cluster) => cluster.launcher(&env::mpirun()),
            None => Command::new(env::mpirun()),
        };
        let hostfile = cluster.map(SimulatedCluster::hostfile);
        cmd.args(mpirun_flags(self.ranks, hosts, hostfile.as_deref())?);
        if !self.attached {
            cmd.args(["--output", "tag"]);
        }
        for (key, value) in &self.mca {
            cmd.args(["--mca", key, value]);
        }
        cmd.args(&self.flags);
        for (key, value) in &self.env {
            cmd.env(key, value).args(["-x", key]);
        }
        cmd.env(RECORDS_VAR, records).args(["-x", RECORDS_VAR]);
        for key in FORWARDED {
            if std::env::var_os(key).is_some() && !self.env.iter().any(|(k, _)| k == key) {
                cmd.args(["-x", key]);
            }
        }
        for (key, value) in env::MCA_DEFAULTS {
            if std::env::var_os(key).is_none() {
                cmd.env(key, value);
            }
        }
        cmd.arg(&self.program).args(&self.args);
        Ok(cmd)
    }

    /// The simulated hosts for a job on `hosts`, made now (`None` for a real or no hostfile).
    fn cluster_for(&self, hosts: &Hosts) -> Result<Option<SimulatedCluster>> {
        let Hosts::Simulated(nodes) = *hosts else { return Ok(None) };
        crate::cluster::remove_orphaned_clusters();
        SimulatedCluster::create(nodes, self.ranks.div_ceil(nodes)).map(Some)
    }

    /// Runs the job to completion or until the timeout (then `mpirun` and every process under
    /// it are SIGKILLed and `timed_out` is set). Removes shared-memory segments the job left
    /// behind, however it ended.
    ///
    /// A job whose `mpirun` could not start at all (see [`JobOutput::never_started`]) is
    /// started again, at most [`START_ATTEMPTS`] times in all, with a note on stderr.
    pub fn run(&self) -> Result<JobOutput> {
        with_start_retries("ftkv", || {
            let out = self.spawn()?.finish()?;
            let again = out.never_started();
            Ok((out, again.then(|| format!("mpirun could not start the job ({START_FAILURE})"))))
        })
    }

    /// Starts the job; its output can be read line by line while it runs.
    pub fn spawn(&self) -> Result<RunningJob> {
        let slot = job_slot();
        install_interrupt_handler()?;
        ensure!(!crate::interrupt::interrupted(), "interrupted; no new job is started");
        remove_unused_segments(&[]);
        remove_leftovers_of_gone_processes();
        let hosts = match &self.hosts {
            Some(hosts) => hosts.clone(),
            None => Hosts::from_env()?,
        };
        let cluster = self.cluster_for(&hosts)?;
        let records = RankRecords::create()?;
        let command = self.command(&hosts, cluster.as_ref(), &records.dir)?;
        let shm_before = shm_segments();
        let start = Instant::now();
        let mut child = spawn(command, self.attached)?;
        let processes = JobProcesses::register(child.id(), shm_before);
        let (sender, lines) = std::sync::mpsc::channel();
        let out_reader = child
            .stdout
            .take()
            .map(|stdout| std::thread::spawn(move || forward_lines(stdout, &sender)));
        let attached = self.attached;
        let err_reader = child.stderr.take().map(|mut stderr| {
            std::thread::spawn(
                move || if attached { tee(&mut stderr) } else { read_all(&mut stderr) },
            )
        });
        Ok(RunningJob {
            _slot: slot,
            child,
            attached,
            records,
            cluster,
            processes,
            lines,
            seen: Vec::new(),
            out_reader,
            err_reader,
            start,
            deadline: start + self.timeout,
            outlived_mpirun: Vec::new(),
        })
    }
}

/// A job that is running: its stdout lines as they come, and its end.
pub struct RunningJob {
    _slot: std::sync::MutexGuard<'static, ()>,
    child: Child,
    /// The job's output goes to this process's own (see [`Launch::attached`]).
    attached: bool,
    records: RankRecords,
    /// Dropped (removed) after the job's processes have ended.
    cluster: Option<SimulatedCluster>,
    processes: JobProcesses,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
    out_reader: Option<std::thread::JoinHandle<()>>,
    err_reader: Option<std::thread::JoinHandle<String>>,
    start: Instant,
    deadline: Instant,
    /// The ranks still running when `mpirun` ended on its own (the launcher then ended them).
    outlived_mpirun: Vec<u32>,
}

impl RunningJob {
    /// The next `(rank, text)` stdout line, waiting at most `wait`; `None` on timeout or when
    /// the output ended.
    pub fn next_line(&mut self, wait: Duration) -> Option<(Option<usize>, String)> {
        let line = self.lines.recv_timeout(wait).ok()?;
        self.seen.push(line.clone());
        Some(match parse_tagged(&line) {
            Some((rank, text)) => (Some(rank), text.to_owned()),
            None => (None, line),
        })
    }

    /// Whether `mpirun` is still running.
    pub fn is_running(&mut self) -> bool {
        self.processes.refresh_if_due();
        Instant::now() < self.deadline && matches!(self.child.try_wait(), Ok(None))
    }

    /// The simulated hosts the job runs on (`--nodes`), if any.
    pub fn cluster(&self) -> Option<&SimulatedCluster> {
        self.cluster.as_ref()
    }

    /// Time since the job started.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Waits for the end (or the job's timeout) and returns everything it printed.
    pub fn finish(mut self) -> Result<JobOutput> {
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        let (status, timed_out) = self.wait_or_kill(remaining)?;
        if let Some(reader) = self.out_reader.take() {
            reader.join().expect("stdout reader panicked");
        }
        self.seen.extend(self.lines.try_iter());
        let mut stderr =
            self.err_reader.take().map(|r| r.join().unwrap_or_default()).unwrap_or_default();
        self.records.append_missing_errors(&mut stderr);
        if !self.outlived_mpirun.is_empty() {
            let pids = &self.outlived_mpirun;
            stderr.push_str(&format!(
                "ftkv: mpirun ended while ranks were still running (pids {pids:?}); ended them\n"
            ));
        }
        let stdout = self.seen.join("\n");
        let mut out = JobOutput::parse(&stdout, stderr, status, timed_out, self.start.elapsed());
        self.records.complete_stdout(&mut out.by_rank);
        if self.attached {
            out.errors_said_once().iter().for_each(|line| eprintln!("{line}"));
        }
        Ok(out)
    }
}

impl RunningJob {
    /// Waits for `mpirun` at most `timeout` (learning the job's processes meanwhile), then
    /// SIGKILLs it if needed, and ends what is left of the job. `true`: timed out.
    fn wait_or_kill(&mut self, timeout: Duration) -> Result<(Option<ExitStatus>, bool)> {
        let deadline = Instant::now() + timeout;
        let outcome = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    self.outlived_mpirun = self.processes.ranks_alive();
                    break Ok((Some(status), false));
                }
                Ok(None) if Instant::now() < deadline => {}
                Ok(None) => {
                    self.processes.refresh();
                    print_stacks_of_hung_ranks(&self.processes);
                    break self.kill_now().map(|()| (None, true));
                }
                Err(e) => break Err(e.into()),
            }
            self.processes.refresh_if_due();
            std::thread::sleep(Duration::from_millis(10));
        };
        self.processes.end();
        outcome
    }

    fn kill_now(&mut self) -> Result<()> {
        self.processes.refresh();
        kill_process_group(self.child.id())?;
        self.child.wait()?;
        Ok(())
    }
}

/// The variable that asks for the stacks of a timed-out job's ranks.
pub const STACKS_ON_HANG_VAR: &str = "FTKV_STACKS_ON_HANG";

/// With [`STACKS_ON_HANG_VAR`] set: prints (to stderr) every thread's stack of each live
/// rank of a job that timed out, from `gdb` (skipped when there is none), before the job is
/// killed: where a hang sits is gone once it is. At most 30 s per rank.
fn print_stacks_of_hung_ranks(processes: &JobProcesses) {
    if std::env::var_os(STACKS_ON_HANG_VAR).is_none() {
        return;
    }
    let ranks = processes.seen.iter().filter(|&&(pid, start)| {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        start_time(pid) == Some(start) && !matches!(comm.trim(), "mpirun" | "prterun" | "prted")
    });
    for &(pid, _) in ranks {
        let gdb = Command::new("timeout")
            .args(["30", "gdb", "-batch", "-p", &pid.to_string()])
            .args(["-ex", "thread apply all bt 10"])
            .stdin(Stdio::null())
            .output();
        match gdb {
            Ok(out) => {
                let stacks = String::from_utf8_lossy(&out.stdout);
                let threads =
                    stacks.lines().filter(|l| l.starts_with("Thread ") || l.starts_with('#'));
                eprintln!("[hung job] stacks of process {pid}:");
                let short = |line: &str| line.chars().take(160).collect::<String>();
                threads.for_each(|line| eprintln!("[hung job] {pid} {}", short(line)));
            }
            Err(e) => eprintln!("[hung job] no stacks of process {pid}: {e}"),
        }
    }
}

/// A job dropped before [`RunningJob::finish`] (its driver met an error) is ended like a timed
/// out one: nothing of it outlives the driver's interest.
impl Drop for RunningJob {
    fn drop(&mut self) {
        if self.processes.ended {
            return;
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            if let Err(e) = self.kill_now() {
                eprintln!("ftkv: ending an abandoned job: {e}");
            }
        }
        self.processes.end();
    }
}

fn forward_lines(stdout: impl Read, sender: &std::sync::mpsc::Sender<String>) {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::new(stdout);
    let mut buf = Vec::new();
    while matches!(reader.read_until(b'\n', &mut buf), Ok(n) if n > 0) {
        let line = String::from_utf8_lossy(&buf).replace('\0', "");
        if sender.send(line.trim_end_matches(['\n', '\r']).to_owned()).is_err() {
            return;
        }
        buf.clear();
    }
}

/// The flags every ftkv job runs with: ULFM, the rank count and the ranks' placement on
/// `hosts` (`hostfile`: a simulated cluster's).
pub fn mpirun_flags(ranks: usize, hosts: &Hosts, hostfile: Option<&Path>) -> Result<Vec<String>> {
    let mut flags: Vec<String> = ["--with-ft", "ulfm"].map(String::from).into();
    if crate::cluster::is_root() {
        flags.push("--allow-run-as-root".into());
    }
    flags.extend(["-n".to_owned(), ranks.to_string()]);
    flags.extend(crate::cluster::mapping_flags(hosts, ranks, hostfile)?);
    Ok(flags)
}

/// Jobs of one process run one at a time (concurrent jobs on 2 cores distort each other's
/// timing); a test that runs an ftkv command which launches its own job holds this slot for the
/// command's duration, so the command's job does not share the machine with the test's others.
pub fn job_slot() -> std::sync::MutexGuard<'static, ()> {
    static SLOT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SLOT.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Starts `mpirun` in a process group of its own, its output piped unless `attached`.
fn spawn(mut cmd: Command, attached: bool) -> Result<Child> {
    use std::os::unix::process::CommandExt;
    cmd.stdin(Stdio::null()).process_group(0);
    cmd.stderr(Stdio::piped());
    if !attached {
        cmd.stdout(Stdio::piped());
    }
    cmd.spawn().with_context(|| format!("cannot start {:?} (run scripts/setup.sh)", env::mpirun()))
}

/// Copies `pipe` to this process's stderr line by line as it comes, but for the ranks' error
/// lines (said once each when the job has ended, see [`Launch::attached`]), and returns all of
/// it: an attached job's stderr reaches the terminal live and is still there to judge
/// afterwards (a runtime that could not start, see [`JobOutput::never_started`]).
fn tee(pipe: &mut impl Read) -> String {
    copy_but_rank_errors(pipe, &mut std::io::stderr())
}

/// Copies `pipe` to `sink` line by line but for the ranks' error lines, and returns all of it.
fn copy_but_rank_errors(pipe: &mut impl Read, sink: &mut impl std::io::Write) -> String {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::new(pipe);
    let (mut kept, mut line) = (Vec::new(), Vec::new());
    while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
        if find_rank_error(&String::from_utf8_lossy(&line)).is_none() {
            let _ = sink.write_all(&line);
        }
        kept.append(&mut line);
    }
    String::from_utf8_lossy(&kept).replace('\0', "")
}

fn read_all(pipe: &mut impl Read) -> String {
    let mut bytes = Vec::new();
    if let Err(e) = pipe.read_to_end(&mut bytes) {
        return format!("<output unreadable: {e}>");
    }
    String::from_utf8_lossy(&bytes).replace('\0', "")
}

/// Waits for `child` at most `timeout`, then ends it with `kill` and reaps it. `true`: timed out.
fn wait_with_timeout_by(
    child: &mut Child,
    timeout: Duration,
    kill: impl FnOnce(&mut Child) -> Result<()>,
) -> Result<(Option<ExitStatus>, bool)> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok((Some(status), false));
        }
        if Instant::now() >= deadline {
            kill(child)?;
            child.wait()?;
            return Ok((None, true));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `cmd` (an ftkv command that launches its own jobs) to completion with its output
/// captured; SIGKILLs it and fails if it runs longer than `bound`.
/// The pipes are drained while it runs, so a talkative command cannot block on a full pipe.
pub fn output_within(mut cmd: Command, bound: Duration) -> Result<std::process::Output> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let mut out_pipe = child.stdout.take().context("stdout pipe")?;
    let mut err_pipe = child.stderr.take().context("stderr pipe")?;
    let stdout = std::thread::spawn(move || read_all(&mut out_pipe));
    let stderr = std::thread::spawn(move || read_all(&mut err_pipe));
    let (status, timed_out) = wait_with_timeout_by(&mut child, bound, |c| Ok(c.kill()?))?;
    let (stdout, stderr) = (stdout.join(), stderr.join());
    match status {
        Some(status) if !timed_out => Ok(std::process::Output {
            status,
            stdout: stdout.unwrap_or_default().into_bytes(),
            stderr: stderr.unwrap_or_default().into_bytes(),
        }),
        _ => bail!("{cmd:?} did not end within {bound:?}"),
    }
}

/// SIGKILLs every process of the job's process group (mpirun, its daemon and the ranks).
pub fn kill_process_group(pgid: u32) -> Result<()> {
    let status = Command::new("kill").args(["-KILL", "--", &format!("-{pgid}")]).status()?;
    if !status.success() {
        bail!("kill -KILL -{pgid} failed: {status}");
    }
    Ok(())
}

/// SIGKILLs a rank chosen by `rng` among those of `pids` not in `killed` (in rank order, so a
/// seed picks the same victims every run) and returns it; `Ok(None)` when no rank is left or
/// the chosen one had already exited.
pub fn kill_random_rank(
    pids: &std::collections::HashMap<usize, u32>,
    killed: &[usize],
    rng: &mut impl rand::Rng,
) -> Result<Option<usize>> {
    let mut alive: Vec<usize> = pids.keys().copied().filter(|r| !killed.contains(r)).collect();
    if alive.is_empty() {
        return Ok(None);
    }
    alive.sort_unstable();
    let victim = alive[rng.gen_range(0..alive.len())];
    Ok(kill_pid(pids[&victim])?.then_some(victim))
}

/// SIGKILLs one process. `Ok(false)`: it had already exited.
pub fn kill_pid(pid: u32) -> Result<bool> {
    signal_pid(pid, "-KILL")
}

/// Sends `signal` (`-KILL`, `-STOP`, `-CONT`, as `kill` spells it) to one process.
/// `Ok(false)`: it had already exited.
pub fn signal_pid(pid: u32, signal: &str) -> Result<bool> {
    let alive = || std::path::Path::new(&format!("/proc/{pid}")).exists();
    if !alive() {
        return Ok(false);
    }
    let status =
        Command::new("kill").args([signal, &pid.to_string()]).stderr(Stdio::null()).status()?;
    if !status.success() {
        if !alive() {
            return Ok(false);
        }
        bail!("kill {signal} {pid} failed: {status}");
    }
    Ok(true)
}

const SHM_DIR: &str = "/dev/shm";

/// Open MPI's files in [`SHM_DIR`] (the shared-memory transport's segments and the backing
/// files of shared-memory windows) and ftkv's extents (`ftkv_mpi::extent`).
const SHM_PREFIXES: [&str; 3] = ["sm_segment.", "osc_sm.", EXTENT_PREFIX];
/// The prefix of ftkv's extent files, followed by the window's 16 hex digits and `-`.
const EXTENT_PREFIX: &str = "ftkv-x";

fn is_mpi_segment(name: &str) -> bool {
    SHM_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The names of Open MPI's files in `/dev/shm` now.
pub fn shm_segments() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(SHM_DIR) else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| is_mpi_segment(name))
        .collect()
}

/// Removes the segments that appeared since `before` (all, when `before` is empty: a job whose
/// driver was SIGKILLed leaves segments that nobody else will remove) and that no live process
/// uses any more.
///
/// Another job may be running beside this one (a test that starts `ftkv demo`, which launches
/// its own job from another process): its segments are new too, and removing one while its
/// ranks still attach to it breaks that job's shared-memory set-up. A segment is in use while
/// some process holds it open (between creation and `mmap`) or mapped; the descriptors are read
/// before the mappings, so a segment moving from one to the other is seen in at least one.
fn remove_unused_segments(before: &[String]) {
    let new: Vec<String> = shm_segments().into_iter().filter(|n| !before.contains(n)).collect();
    if new.is_empty() {
        return;
    }
    let in_use = shm_segments_in_use();
    let windows_in_use: std::collections::HashSet<&str> =
        in_use.iter().filter_map(|n| extent_window(n)).collect();
    let used = |name: &str| {
        in_use.contains(name) || extent_window(name).is_some_and(|w| windows_in_use.contains(w))
    };
    for name in new.iter().filter(|n| !used(n)) {
        // A segment that vanished meanwhile needs no removal; anything else is worth a warning.
        if let Err(e) = std::fs::remove_file(Path::new(SHM_DIR).join(name)) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("ftkv: cannot remove {SHM_DIR}/{name}: {e}");
            }
        }
    }
}

/// The directories in the temporary directory that a process leaves behind when it is killed,
/// each named by a prefix and the process's pid: drivers' job records
/// ([`crate::records`]), and the session directories of Open MPI's runtime (`ompi.<pid>` of an
/// `mpirun`, `prted.<pid>` of a daemon). A session directory holds the runtime's rendezvous
/// files, created exclusively: once the pid is reused by a later `mpirun` or daemon, that one
/// cannot start ("The PMIx server's listener thread failed to start", openpmix issue 4022,
/// mended in PMIx releases newer than Open MPI 5.0's).
const LEFT_BY_PID: [&str; 3] = [crate::records::RECORDS_PREFIX, "ompi.", "prted."];

/// Removes the directories of [`LEFT_BY_PID`] whose process is gone; those of live processes
/// stay.
fn remove_leftovers_of_gone_processes() {
    let temp = std::env::temp_dir();
    let Ok(entries) = std::fs::read_dir(&temp) else { return };
    for name in entries.filter_map(|e| e.ok()?.file_name().into_string().ok()) {
        if pid_left_behind(&name).is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = std::fs::remove_dir_all(temp.join(&name));
        }
    }
}

/// The pid in a name of [`LEFT_BY_PID`] (the digits after its prefix).
fn pid_left_behind(name: &str) -> Option<u32> {
    let rest = LEFT_BY_PID.iter().find_map(|prefix| name.strip_prefix(prefix))?;
    let digits = rest.split(|c: char| !c.is_ascii_digit()).next()?;
    digits.parse().ok()
}

/// The window an extent file belongs to (`ftkv-x<16 hex digits>-`), `None` for other files:
/// a window's extents are in use while some process holds one of its files open (each member
/// keeps its marker open).
fn extent_window(name: &str) -> Option<&str> {
    let window_len = EXTENT_PREFIX.len() + 17;
    name.strip_prefix(EXTENT_PREFIX)?;
    name.get(..window_len).filter(|_| name.len() > window_len)
}

/// The names of Open MPI's `/dev/shm` files that some live process has open or mapped.
fn shm_segments_in_use() -> std::collections::HashSet<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Default::default() };
    let pids: Vec<PathBuf> =
        entries.filter_map(|e| Some(e.ok()?.path())).filter(|p| is_pid_dir(p)).collect();
    let mut in_use: std::collections::HashSet<String> =
        pids.iter().flat_map(|pid| open_segments(pid)).collect();
    in_use.extend(pids.iter().flat_map(|pid| mapped_segments(pid)));
    in_use
}

fn is_pid_dir(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
}

/// Segment names among the open file descriptors of process directory `pid`.
fn open_segments(pid: &Path) -> Vec<String> {
    let Ok(fds) = std::fs::read_dir(pid.join("fd")) else { return Vec::new() };
    fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| segment_name(&target.to_string_lossy()))
        .collect()
}

/// Segment names among the memory mappings of process directory `pid`.
fn mapped_segments(pid: &Path) -> Vec<String> {
    let Ok(maps) = std::fs::read_to_string(pid.join("maps")) else { return Vec::new() };
    maps.lines().filter_map(|line| segment_name(line.split_whitespace().nth(5)?)).collect()
}

/// `/dev/shm/sm_segment.x (deleted)` → `sm_segment.x`; `None` for other paths.
fn segment_name(path: &str) -> Option<String> {
    let name = path.strip_prefix(SHM_DIR)?.strip_prefix('/')?;
    let name = name.split_whitespace().next()?;
    is_mpi_segment(name).then(|| name.to_owned())
}

/// A process identity that survives pid reuse: pid and start time (clock ticks since boot).
type ProcessId = (u32, u64);

/// The processes of one job: `mpirun` and everything started under it, as last seen. The ranks
/// run in process groups of their own (PRRTE's daemon gives each one), so killing `mpirun`'s
/// group does not reach them, and once `mpirun` is gone they are no longer its descendants:
/// they are remembered while it runs.
struct JobProcesses {
    root: u32,
    seen: std::collections::HashSet<ProcessId>,
    refreshed: Instant,
    shm_before: Vec<String>,
    registered: usize,
    /// [`JobProcesses::end`] ran.
    ended: bool,
}

/// A running job as the interrupt handler sees it: registration id, processes, and the
/// shared-memory files that existed before it started.
type JobEntry = (usize, Vec<ProcessId>, Vec<String>);

/// The jobs of this process that are running, for the interrupt handler.
static RUNNING_JOBS: std::sync::Mutex<Vec<JobEntry>> = std::sync::Mutex::new(Vec::new());

impl JobProcesses {
    fn register(root: u32, shm_before: Vec<String>) -> JobProcesses {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let registered = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut job = JobProcesses {
            root,
            seen: Default::default(),
            refreshed: Instant::now(),
            shm_before,
            registered,
            ended: false,
        };
        job.refresh();
        if crate::interrupt::interrupted() {
            end_running_jobs();
        }
        job
    }

    /// [`JobProcesses::refresh`] at most every 100 ms.
    fn refresh_if_due(&mut self) {
        if self.refreshed.elapsed() >= Duration::from_millis(100) {
            self.refresh();
        }
    }

    /// Adds the live descendants of `mpirun` and publishes them to the interrupt handler.
    fn refresh(&mut self) {
        self.refreshed = Instant::now();
        if let Some(start) = start_time(self.root) {
            self.seen.insert((self.root, start));
        }
        self.seen.extend(descendants(self.root));
        let entry = (self.registered, self.seen.iter().copied().collect(), self.shm_before.clone());
        let mut running = RUNNING_JOBS.lock().unwrap_or_else(|p| p.into_inner());
        running.retain(|(id, _, _)| *id != self.registered);
        running.push(entry);
    }

    /// The job's ranks (processes the runtime started with a `PMIX_RANK`) that are still
    /// running, not zombies.
    fn ranks_alive(&self) -> Vec<u32> {
        let rank = |&&(pid, start): &&ProcessId| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z'));
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let is_rank = environ.split(|&b| b == 0).any(|var| var.starts_with(b"PMIX_RANK="));
            start_time(pid) == Some(start) && !zombie && is_rank
        };
        let mut pids: Vec<u32> = self.seen.iter().filter(rank).map(|&(pid, _)| pid).collect();
        pids.sort_unstable();
        pids
    }

    /// After `mpirun` ended: SIGKILLs what is left of the job, waits (at most 5 s) until it is
    /// gone, and removes the job's shared-memory files.
    fn end(&mut self) {
        self.ended = true;
        let seen: Vec<ProcessId> = self.seen.iter().copied().collect();
        end_processes(&seen, &self.shm_before);
        let mut running = RUNNING_JOBS.lock().unwrap_or_else(|p| p.into_inner());
        running.retain(|(id, _, _)| *id != self.registered);
    }
}

/// Installs the interrupt handler ([`crate::interrupt`]) with the launcher's cleanups: end
/// every job this process launched, then remove its simulated hosts.
fn install_interrupt_handler() -> Result<()> {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        crate::interrupt::on_interrupt(end_running_jobs);
        crate::interrupt::on_interrupt(crate::cluster::remove_live_clusters);
    });
    crate::interrupt::install()
}

/// Ends every running job of this process (for SIGINT/SIGTERM of a driver): SIGKILL, wait,
/// remove their shared-memory files.
pub fn end_running_jobs() {
    let jobs = std::mem::take(&mut *RUNNING_JOBS.lock().unwrap_or_else(|p| p.into_inner()));
    for (_, processes, shm_before) in jobs {
        end_processes(&processes, &shm_before);
    }
}

fn end_processes(processes: &[ProcessId], shm_before: &[String]) {
    let alive = |&&(pid, start): &&ProcessId| start_time(pid) == Some(start);
    for &(pid, _) in processes.iter().filter(alive) {
        if let Err(e) = kill_pid(pid) {
            eprintln!("ftkv: ending a leftover process of the job: {e}");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while processes.iter().any(|p| alive(&p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    remove_unused_segments(shm_before);
}

/// The pids of every live process under `root` whose command line contains `word` (a test
/// finds the ranks of a job that an ftkv command launched this way).
pub fn processes_under(root: u32, word: &str) -> Vec<u32> {
    let matches = |pid: u32| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&cmdline).replace('\0', " ").contains(word)
    };
    descendants(root).into_iter().map(|(pid, _)| pid).filter(|&pid| matches(pid)).collect()
}

/// Every live process under `root` (children, their children, ...), with start times.
fn descendants(root: u32) -> Vec<ProcessId> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let table: Vec<(u32, u32, u64)> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let (ppid, start) = parent_and_start(pid)?;
            Some((pid, ppid, start))
        })
        .collect();
    let mut found = vec![root];
    let mut out = Vec::new();
    while let Some(parent) = found.pop() {
        for &(pid, ppid, start) in &table {
            if ppid == parent && !out.iter().any(|&(p, _)| p == pid) {
                out.push((pid, start));
                found.push(pid);
            }
        }
    }
    out
}

/// Parent pid and start time of `pid`, from `/proc/<pid>/stat` (the fields after the command
/// name, which may itself hold spaces and parentheses).
fn parent_and_start(pid: u32) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some((fields.get(1)?.parse().ok()?, fields.get(19)?.parse().ok()?))
}

fn start_time(pid: u32) -> Option<u64> {
    parent_and_start(pid).map(|(_, start)| start)
}

/// What a job printed, split by rank, and how it ended.
#[derive(Debug, Clone)]
pub struct JobOutput {
    by_rank: BTreeMap<usize, Vec<String>>,
    pub untagged: Vec<String>,
    pub stderr: String,
    pub status: Option<ExitStatus>,
    pub timed_out: bool,
    pub elapsed: Duration,
}

impl JobOutput {
    /// The output of a job that printed `stdout` (`[1,<rank>]<stdout>: ...` lines) and nothing
    /// else, and ended with no status: for checking that reports read back as they were
    /// written.
    pub fn from_stdout(stdout: &str) -> JobOutput {
        JobOutput::parse(stdout, String::new(), None, false, Duration::ZERO)
    }

    fn parse(
        stdout: &str,
        stderr: String,
        status: Option<ExitStatus>,
        timed_out: bool,
        elapsed: Duration,
    ) -> JobOutput {
        let mut by_rank: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        let mut untagged = Vec::new();
        for line in stdout.lines() {
            match parse_tagged(line) {
                Some((rank, text)) => by_rank.entry(rank).or_default().push(text.to_owned()),
                None => untagged.push(line.to_owned()),
            }
        }
        JobOutput { by_rank, untagged, stderr, status, timed_out, elapsed }
    }

    /// The stdout lines rank `rank` printed (empty if it printed nothing).
    pub fn rank_lines(&self, rank: usize) -> &[String] {
        self.by_rank.get(&rank).map_or(&[], Vec::as_slice)
    }

    /// Rank `rank`'s reports of `kind`, in order: its stdout lines `kind {json}` (as
    /// [`report_line`] writes them), each parsed into `T`; `Err` names a line that does not.
    pub fn rank_reports<T: serde::de::DeserializeOwned>(
        &self,
        rank: usize,
        kind: &str,
    ) -> Result<Vec<T>> {
        let prefix = format!("{kind} {{");
        let lines = self.rank_lines(rank).iter().filter(|l| l.starts_with(&prefix));
        lines
            .map(|l| {
                serde_json::from_str(&l[kind.len() + 1..])
                    .with_context(|| format!("rank {rank}'s {kind} report {l:?}"))
            })
            .collect()
    }

    /// Rank `rank`'s first report of `kind` ([`JobOutput::rank_reports`]), if it made one.
    pub fn rank_report<T: serde::de::DeserializeOwned>(
        &self,
        rank: usize,
        kind: &str,
    ) -> Result<Option<T>> {
        Ok(self.rank_reports(rank, kind)?.into_iter().next())
    }

    /// The stderr lines of rank `rank`, without Open MPI's `[1,rank]<stderr>:` tag.
    pub fn own_stderr(&self, rank: usize) -> impl Iterator<Item = &str> {
        let tag = format!("[1,{rank}]<stderr>:");
        self.stderr.lines().filter_map(move |l| l.strip_prefix(tag.as_str()))
    }

    /// The ranks' error lines in the job's stderr (`ftkv: rank R: error: ...`), each message
    /// once with the ranks that reported it (`ftkv: ranks 0-3, 5: ...`).
    pub fn errors_said_once(&self) -> Vec<String> {
        said_once(rank_errors_in(&self.stderr))
    }

    /// Whether `rank` left evidence that it ended itself as a fail-stop failure: ftkv's
    /// watchdog message or Open MPI's fatal-signal report.
    pub fn ended_itself(&self, rank: usize) -> bool {
        self.own_stderr(rank).map(str::trim).any(|l| {
            (l.starts_with("ftkv:") && l.contains("ending this process"))
                || l.contains("*** Process received signal")
        })
    }

    /// The ranks of a job of `ranks` that ended themselves ([`JobOutput::ended_itself`]).
    pub fn self_ended(&self, ranks: usize) -> Vec<usize> {
        (0..ranks).filter(|&r| self.ended_itself(r)).collect()
    }

    /// All output, for failure messages: the ranks' errors first, each message once
    /// ([`JobOutput::errors_said_once`]), then [`JobOutput::transcript_but_errors`].
    pub fn transcript(&self) -> String {
        let errors: String =
            self.errors_said_once().iter().map(|l| format!("[errors] {l}\n")).collect();
        errors + &self.transcript_but_errors()
    }

    /// All output but the ranks' error lines, for failure messages that show those themselves:
    /// stdout by rank, `mpirun`'s own lines, the exit status, then stderr.
    pub fn transcript_but_errors(&self) -> String {
        let mut text = String::new();
        for (rank, lines) in &self.by_rank {
            for line in lines {
                text.push_str(&format!("[rank {rank}] {line}\n"));
            }
        }
        for line in &self.untagged {
            text.push_str(&format!("[mpirun] {line}\n"));
        }
        let status =
            self.status.map_or("none (killed at the timeout)".to_owned(), |s| s.to_string());
        let elapsed = self.elapsed.as_secs_f64();
        text.push_str(&format!("[mpirun] exit status {status} after {elapsed:.2} s\n"));
        text.push_str("[stderr]\n");
        for line in self.stderr.lines().filter(|l| find_rank_error(l).is_none()) {
            text.push_str(&format!("{line}\n"));
        }
        text
    }
}

/// How often [`Launch::run`] starts a job whose `mpirun` failed before any rank ran.
pub const START_ATTEMPTS: usize = 3;

/// Runs `attempt` until it gives no reason to start again, at most [`START_ATTEMPTS`] times;
/// each reason is printed after `who`. For drivers that run a job their own way (streaming
/// its output) and must start it again when it never started.
pub fn with_start_retries<T>(
    who: &str,
    mut attempt: impl FnMut() -> Result<(T, Option<String>)>,
) -> Result<T> {
    for _ in 1..START_ATTEMPTS {
        match attempt()? {
            (value, None) => return Ok(value),
            (_, Some(why)) => eprintln!("{who}: {why}; starting it again"),
        }
    }
    attempt().map(|(value, _)| value)
}

/// Runs `launch`, whose ranks each print `ready pid=<pid>` once ready, SIGKILLs the ranks
/// `victims` from outside by PID `delay` after the last of the `ranks` ranks said so, then
/// reads the job to its end. A job whose `mpirun` could not start at all is started again, as
/// [`Launch::run`] does.
///
/// Fails when the ranks did not all get ready (the job's transcript in the error) or a victim
/// had ended before its kill; a job that timed out is returned (`timed_out`).
pub fn run_with_outside_kills(
    launch: &Launch,
    ranks: usize,
    victims: &[usize],
    delay: Duration,
) -> Result<JobOutput> {
    let started = with_start_retries("outside kills", || {
        let mut running = launch.spawn()?;
        match ready_pids(&mut running, ranks) {
            Some(pids) => Ok((Ok((running, pids)), None)),
            None => {
                let out = running.finish()?;
                let again = out.never_started().then(|| "mpirun could not start".to_owned());
                Ok((Err(out), again))
            }
        }
    })?;
    let (mut running, pids) = match started {
        Ok(ready) => ready,
        Err(out) => bail!("the ranks did not get ready:\n{}", out.transcript()),
    };
    std::thread::sleep(delay);
    for victim in victims {
        ensure!(kill_pid(pids[victim])?, "rank {victim} ended before its kill");
    }
    while running.next_line(Duration::from_millis(50)).is_some() || running.is_running() {}
    running.finish()
}

/// Each rank's pid from its `ready pid=<pid>` line (at most 60 s of waiting for a line);
/// `None` when the job's output ended first.
fn ready_pids(
    running: &mut RunningJob,
    ranks: usize,
) -> Option<std::collections::HashMap<usize, u32>> {
    let mut pids = std::collections::HashMap::new();
    while pids.len() < ranks {
        let (Some(rank), line) = running.next_line(Duration::from_secs(60))? else { continue };
        if let Some(pid) = line.strip_prefix("ready pid=").and_then(|p| p.trim().parse().ok()) {
            pids.insert(rank, pid);
        }
    }
    Some(pids)
}

/// What `mpirun` prints when its PMIx server cannot start: a sporadic start-up failure of
/// Open MPI's runtime, before any rank exists.
const START_FAILURE: &str = "The PMIx server's listener thread failed to start";

impl JobOutput {
    /// Whether `mpirun` failed to start its runtime, so that no rank ever ran: its start-up
    /// failure message, or a job that ended without a word from any rank or from `mpirun`.
    pub fn never_started(&self) -> bool {
        let joined = self.stderr.split_whitespace().collect::<Vec<_>>().join(" ");
        let silent = self.stderr.trim().is_empty() && self.untagged.iter().all(|l| l.is_empty());
        self.by_rank.is_empty() && !self.timed_out && (joined.contains(START_FAILURE) || silent)
    }
}

/// A report line of `kind` for a driver to read back with [`JobOutput::rank_reports`]:
/// `kind {json}` (serde's JSON of `value`, on one line).
pub fn report_line<T: serde::Serialize>(kind: &str, value: &T) -> String {
    let json = serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
    format!("{kind} {json}")
}

/// The union of the failed sets the ranks reported (worker ids; a negative id is no worker),
/// sorted, without repeats: the failed set the survivors agreed on.
pub fn union_of_failed<W: TryInto<usize>>(reported: impl IntoIterator<Item = W>) -> Vec<usize> {
    let mut failed: Vec<usize> = reported.into_iter().filter_map(|w| w.try_into().ok()).collect();
    failed.sort_unstable();
    failed.dedup();
    failed
}

/// `[1,3]<stdout>: text` → `(3, "text")`.
fn parse_tagged(line: &str) -> Option<(usize, &str)> {
    let rest = line.strip_prefix('[')?;
    let (ids, rest) = rest.split_once(']')?;
    let rank = ids.split_once(',')?.1.parse().ok()?;
    let text = rest.strip_prefix("<stdout>:")?;
    Some((rank, text.strip_prefix(' ').unwrap_or(text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_lines_are_split_by_rank() {
        let table = [
            ("[1,3]<stdout>: hello 3", Some((3, "hello 3"))),
            ("[12,0]<stdout>: a=b c", Some((0, "a=b c"))),
            ("[1,0]<stdout>:", Some((0, ""))),
            ("plain", None),
            ("[1,x]<stdout>: bad", None),
        ];
        for (line, want) in table {
            assert_eq!(parse_tagged(line), want, "{line:?}");
        }
    }

    #[test]
    fn output_within_returns_the_output_or_fails_on_overrun() {
        let mut echo = Command::new("sh");
        echo.args(["-c", "echo out; echo err >&2"]);
        let out = output_within(echo, Duration::from_secs(10)).expect("echo ends");
        assert_eq!((&out.stdout[..], &out.stderr[..]), (&b"out\n"[..], &b"err\n"[..]));
        let mut sleep = Command::new("sleep");
        sleep.arg("10");
        let started = Instant::now();
        assert!(output_within(sleep, Duration::from_millis(200)).is_err());
        assert!(started.elapsed() < Duration::from_secs(5), "the overrun was cut short");
    }

    #[test]
    fn directories_left_by_gone_processes_are_named_by_their_pid() {
        assert_eq!(pid_left_behind("ftkv-rank-records-4194304999-0"), Some(4194304999));
        assert_eq!(pid_left_behind("ompi.17"), Some(17));
        assert_eq!(pid_left_behind("prted.23"), Some(23));
        assert_eq!(pid_left_behind("ftkv-rank-records-test-left-behind"), None);
        assert_eq!(pid_left_behind("ompi.sessions"), None);
        let gone = std::env::temp_dir().join("ftkv-rank-records-4194304999-0");
        std::fs::create_dir_all(&gone).unwrap();
        remove_leftovers_of_gone_processes();
        assert!(!gone.exists(), "a gone driver's records are removed");
    }

    #[test]
    fn segment_names_come_from_shm_paths_only() {
        let table = [
            ("/dev/shm/sm_segment.vm.0.d7040001.3", Some("sm_segment.vm.0.d7040001.3")),
            ("/dev/shm/sm_segment.vm.0.1.0 (deleted)", Some("sm_segment.vm.0.1.0")),
            ("/dev/shm/other", None),
            ("/tmp/sm_segment.vm.0.1.0", None),
            ("/dev/shmsm_segment.x", None),
        ];
        for (path, want) in table {
            assert_eq!(segment_name(path).as_deref(), want, "{path:?}");
        }
    }

    #[test]
    fn a_mapped_segment_is_in_use_and_kept() {
        let name = format!("sm_segment.ftkv-test.{}", std::process::id());
        let path = Path::new(SHM_DIR).join(&name);
        let file = std::fs::File::create(&path).expect("creates a segment file");
        assert!(shm_segments_in_use().contains(&name), "an open segment counts as in use");
        remove_unused_segments(&[]);
        assert!(path.exists(), "a segment in use must not be removed");
        drop(file);
        remove_unused_segments(&[]);
        assert!(!path.exists(), "an unused new segment is removed");
    }

    #[test]
    fn the_agreed_failed_set_is_the_sorted_union_of_the_reports() {
        assert_eq!(union_of_failed([3, 1, -1, 1, 3]), vec![1, 3]);
        assert_eq!(union_of_failed(Vec::<usize>::new()), Vec::<usize>::new());
    }

    #[test]
    fn own_stderr_is_one_rank_s_lines_without_the_tag() {
        let out = JobOutput::parse(
            "",
            "[1,2]<stderr>: ftkv: x\n[1,0]<stderr>: y\n".into(),
            None,
            false,
            Duration::ZERO,
        );
        assert_eq!(out.own_stderr(2).collect::<Vec<_>>(), vec![" ftkv: x"]);
    }

    #[test]
    fn an_attached_job_s_stderr_is_copied_live_but_for_the_ranks_error_lines() {
        let stderr =
            "warning: slow\nftkv: rank 1: error: store: X\nftkv: rank 0: error: store: X\nend";
        let mut shown = Vec::new();
        let kept = copy_but_rank_errors(&mut stderr.as_bytes(), &mut shown);
        assert_eq!(String::from_utf8(shown).unwrap(), "warning: slow\nend");
        assert_eq!(kept, stderr, "all of it is kept");
        let out = JobOutput::parse("", kept, None, false, Duration::ZERO);
        assert_eq!(out.errors_said_once(), vec!["ftkv: ranks 0-1: store: X"]);
    }

    #[test]
    fn a_transcript_says_the_ranks_errors_once_first() {
        let stderr = "[1,0]<stderr>: ftkv: rank 0: error: store: X\n\
                      [1,1]<stderr>: note\n\
                      [recorded by rank-1] ftkv: rank 1: error: store: X\n";
        let out = JobOutput::parse("[1,1]<stdout>: hi", stderr.into(), None, false, Duration::ZERO);
        let transcript = out.transcript();
        assert!(transcript.starts_with("[errors] ftkv: ranks 0-1: store: X\n[rank 1] hi\n"));
        assert!(transcript.ends_with("[stderr]\n[1,1]<stderr>: note\n"), "{transcript}");
        assert_eq!(transcript.matches("store: X").count(), 1, "{transcript}");
    }

    #[test]
    fn reports_are_read_back_as_json_by_kind_and_rank() {
        #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        struct Done {
            failed: Vec<usize>,
            ms: f64,
        }
        let line = report_line("result", &Done { failed: vec![3], ms: 1.5 });
        assert_eq!(line, r#"result {"failed":[3],"ms":1.5}"#);
        let stdout = format!(
            "[1,1]<stdout>: {line}\n[1,1]<stdout>: result nodes=4\n[1,2]<stdout>: result {{bad\n"
        );
        let out = JobOutput::parse(&stdout, String::new(), None, false, Duration::ZERO);
        let done: Option<Done> = out.rank_report(1, "result").unwrap();
        assert_eq!(
            done,
            Some(Done { failed: vec![3], ms: 1.5 }),
            "key=value lines are not reports"
        );
        assert_eq!(out.rank_report::<Done>(0, "result").unwrap(), None);
        assert!(out.rank_report::<Done>(2, "result").is_err(), "a broken report is an error");
    }

    #[test]
    fn a_job_without_a_word_from_any_rank_or_mpirun_never_started() {
        let parse = |stdout: &str, stderr: &str, timed_out| {
            JobOutput::parse(stdout, stderr.into(), None, timed_out, Duration::ZERO)
        };
        let table = [
            ("silent", parse("", "", false), true),
            ("start-up failure", parse("", START_FAILURE, false), true),
            ("a rank spoke", parse("[1,0]<stdout>: pid=1\n", "", false), false),
            ("mpirun complained", parse("", "mpirun: bad option", false), false),
            ("hung silently", parse("", "", true), false),
        ];
        for (case, out, want) in table {
            assert_eq!(out.never_started(), want, "{case}");
        }
    }
}
