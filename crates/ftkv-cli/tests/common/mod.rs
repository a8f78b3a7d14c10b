//! Helpers shared by the real-MPI tests: jobs of the `ftkv-mpitest` rank program with a hard
//! timeout, on the transport `FTKV_TEST_BTL` selects, and `ftkv demo` runs with their report.
//! Each test file uses some of them.
#![allow(dead_code)]

use std::time::Duration;

use std::collections::HashMap;

use ftkv_cli::launch::{run_with_outside_kills, JobOutput, Launch};

const TEST_PROGRAM: &str = env!("CARGO_BIN_EXE_ftkv-mpitest");

/// A job of `ranks` ranks running `ftkv-mpitest <case>`, killed after `timeout`.
pub fn job(case: &str, ranks: usize, timeout: Duration) -> Launch {
    Launch::new(TEST_PROGRAM, ranks).args([case]).timeout(timeout).transport_from_env()
}

/// Runs the job and fails the test if it hung.
pub fn run(launch: Launch) -> JobOutput {
    let out = launch.run().expect("mpirun starts");
    assert!(!out.timed_out, "job hung:\n{}", out.transcript());
    out
}

/// Runs `ftkv demo` with `args` and `--json` within `bound`; its JSON report, stdout and
/// stderr. Panics (the test fails) when the demo fails or does not end in time.
pub fn demo_report(args: &[&str], bound: Duration) -> (serde_json::Value, String, String) {
    demo_report_with(args, &[], bound)
}

/// [`demo_report`] with variables `env` set for the demo (and its ranks, for the variables the
/// launcher forwards).
pub fn demo_report_with(
    args: &[&str],
    env: &[(&str, &str)],
    bound: Duration,
) -> (serde_json::Value, String, String) {
    let json =
        std::env::temp_dir().join(format!("ftkv-demo-{}-{}.json", std::process::id(), args.len()));
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ftkv"));
    cmd.arg("demo").args(args).arg("--json").arg(&json);
    cmd.envs(env.iter().copied());
    let out = ftkv_cli::launch::output_within(cmd, bound).expect("the demo ends within its bound");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "the demo failed:\n{stdout}\n{stderr}");
    let text = std::fs::read_to_string(&json).expect("the demo's JSON report");
    let _ = std::fs::remove_file(&json);
    (serde_json::from_str(&text).expect("a JSON report"), stdout, stderr)
}

/// The checks of a demo whose worker(s) were SIGSTOPped past the suspicion `bound` with every
/// default: exact result, the stopped ranks failed as the survivors agreed (`only`: nobody
/// else), the survivors ended the stopped processes while they were still stopped (never
/// resumed), and the job ended at most the bound, the slowest recovery and a second after the
/// stop. A stopped rank that the runtime ended (it sends SIGCONT before SIGKILL) may have ended
/// itself first, saying why; no other rank did.
pub fn assert_ended_while_stopped(
    report: &serde_json::Value,
    stdout: &str,
    stderr: &str,
    only: bool,
    bound: Duration,
) {
    let all = format!("{stdout}\n{stderr}");
    assert_eq!(report["matches_published"], true, "{all}");
    let stopped: Vec<serde_json::Value> =
        report["stopped_ranks"].as_array().expect("stopped").clone();
    assert!(!stopped.is_empty(), "a rank was stopped: {all}");
    let failed = report["failed"].as_array().expect("the failed ranks").clone();
    assert!(stopped.iter().all(|r| failed.contains(r)), "every stopped rank declared: {all}");
    if only {
        assert_eq!(failed, stopped, "{all}");
    }
    let ended = report["self_ended"].as_array().expect("the ranks that ended themselves").clone();
    assert!(
        ended.iter().all(|r| stopped.contains(r)),
        "only stopped ranks ended themselves: {all}"
    );
    assert!(report["resume_ms"].is_null(), "the stopped ranks were never resumed: {all}");
    let stop = report["stop_ms"].as_f64().expect("a stop time");
    let gone = report["stopped_ended_ms"].as_f64().expect("the stopped processes ended");
    let job = report["job_ms"].as_f64().expect("the job's end");
    let recovery = report["recoveries"].as_array().expect("recoveries").iter();
    let slowest = recovery.filter_map(|r| r[1].as_f64()).fold(0.0, f64::max);
    let allowed = bound.as_secs_f64() * 1000.0 + slowest + 1000.0;
    assert!(
        gone - stop <= allowed,
        "ended {:.0} ms after the stop (allowed {allowed:.0}): {all}",
        gone - stop
    );
    assert!(
        job - stop <= allowed,
        "the job ended {:.0} ms after the stop (allowed {allowed:.0}): {all}",
        job - stop
    );
}

/// The checks of a demo whose one worker was SIGSTOPped past the suspicion bound while the
/// survivors do not end declared processes (`FTKV_END_DECLARED=0`): exact
/// result, the stopped rank failed as the survivors agreed, their result came before it was
/// resumed, and once resumed it ended itself saying why: the store's own gap check or Open
/// MPI's detector, whichever of the two threads runs first after SIGCONT. `only` also requires
/// that nobody else failed; without it, a live rank that Open MPI's detector declared dead by
/// mistake (seen across simulated hosts on 2 loaded cores) is accepted if it too ended itself
/// and the result stayed exact.
pub fn assert_left_behind_while_stopped(
    report: &serde_json::Value,
    stdout: &str,
    stderr: &str,
    only: bool,
) {
    let all = format!("{stdout}\n{stderr}");
    assert_eq!(report["matches_published"], true, "{all}");
    let stopped = report["stopped"].as_u64().expect("a stopped rank");
    let failed = report["failed"].as_array().expect("the failed ranks").clone();
    let ended = report["self_ended"].as_array().expect("the ranks that ended themselves").clone();
    assert!(failed.contains(&serde_json::json!(stopped)), "{all}");
    assert_eq!(failed, ended, "every failed rank ended itself, no other did: {all}");
    if only {
        assert_eq!(failed, vec![serde_json::json!(stopped)], "{all}");
    }
    let result = report["result_ms"].as_f64().expect("a result time");
    let resumed = report["resume_ms"].as_f64().expect("a resume time");
    assert!(result < resumed, "result at {result} ms, resumed at {resumed} ms\n{all}");
    let shown_early = stderr.contains("still stopped: result {\"nodes\":");
    assert!(shown_early, "the result shown early:\n{all}");
    let own = stderr.contains("did not run for");
    let open_mpis = stderr.contains("I have been reported dead by someone else");
    assert!(own || open_mpis, "the stopped rank says why it ends:\n{all}");
}

/// Runs `launch` (its ranks print `ready pid=<pid>`), SIGKILLs `victims` from outside 0.8 s
/// after every rank is ready, and returns the job's output; fails the test if it hung.
pub fn job_with_outside_kills(launch: Launch, ranks: usize, victims: &[usize]) -> JobOutput {
    let delay = Duration::from_millis(800);
    let out = run_with_outside_kills(&launch, ranks, victims, delay).expect("the job runs");
    assert!(!out.timed_out, "job hung:\n{}", out.transcript());
    out
}

/// The MPI world rank of process `pid` (`PMIX_RANK` in the environment the runtime started it
/// with); `None` for a process the runtime did not start as a rank, such as `mpirun`, whose
/// command line holds the ranks' arguments too.
pub fn world_rank(pid: u32) -> Option<usize> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let rank = environ.split(|&b| b == 0).find_map(|var| var.strip_prefix(b"PMIX_RANK="))?;
    String::from_utf8_lossy(rank).parse().ok()
}

/// Waits (at most 60 s) until the processes under `driver` whose command line holds `word`
/// include `count` MPI ranks; their pids by world rank.
pub fn wait_for_world_ranks(driver: u32, word: &str, count: usize) -> HashMap<usize, u32> {
    let started = std::time::Instant::now();
    loop {
        let ranks: HashMap<usize, u32> = ftkv_cli::launch::processes_under(driver, word)
            .into_iter()
            .filter_map(|pid| Some((world_rank(pid)?, pid)))
            .collect();
        if ranks.len() >= count {
            return ranks;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the ranks of {word} never started");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILLs `pids` and waits (at most 10 s) until each is gone or a zombie, so a test knows
/// its kill landed before it judges the job.
pub fn kill_and_confirm(pids: &[u32]) {
    let status = std::process::Command::new("kill")
        .arg("-KILL")
        .args(pids.iter().map(u32::to_string))
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -KILL {pids:?}");
    let started = std::time::Instant::now();
    while pids.iter().any(|&pid| is_running(pid)) {
        assert!(started.elapsed() < Duration::from_secs(10), "{pids:?} outlived SIGKILL by 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid` exists and is not a zombie.
fn is_running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
    state != Some('Z')
}

/// An `ftkv` driver (`demo`, `chaos`) started with piped output that is read as it comes, so a
/// test can act on the driver's progress and still judge its whole output.
pub struct Driver {
    child: std::process::Child,
    stdout: std::thread::JoinHandle<String>,
    stderr: std::thread::JoinHandle<String>,
    stderr_lines: std::sync::mpsc::Receiver<String>,
}

impl Driver {
    /// Starts `ftkv` with `args`.
    pub fn start(args: &[&str]) -> Driver {
        use std::process::Stdio;
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ftkv"));
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("ftkv starts");
        let mut stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let stdout = std::thread::spawn(move || {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut stdout, &mut text).expect("readable output");
            text.replace('\0', "")
        });
        let (send, stderr_lines) = std::sync::mpsc::channel();
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)) {
                let line = line.unwrap_or_default().replace('\0', "");
                let _ = send.send(line.clone());
                text.push_str(&line);
                text.push('\n');
            }
            text
        });
        Driver { child, stdout, stderr, stderr_lines }
    }

    /// The driver's pid.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits (at most `bound`) until a demo's progress line counts tasks run: the pool runs,
    /// so every rank is past `MPI_Init` and the store's creation, which no failure-tolerant
    /// job survives a death in.
    pub fn wait_for_work(&self, bound: Duration) {
        let started = std::time::Instant::now();
        while started.elapsed() < bound {
            let Ok(line) = self.stderr_lines.recv_timeout(Duration::from_millis(100)) else {
                continue;
            };
            if tasks_in_progress_line(&line).is_some_and(|m| m > 0.0) {
                return;
            }
        }
        panic!("the demo's pool showed no work within {bound:?}");
    }

    /// Waits for the driver to end within `bound` (SIGKILLed and failed otherwise); its
    /// status, stdout and stderr.
    pub fn finish(mut self, bound: Duration) -> (std::process::ExitStatus, String, String) {
        let started = std::time::Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            if started.elapsed() > bound {
                self.child.kill().expect("kill the driver");
                panic!("ftkv did not end within {bound:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        (status, self.stdout.join().unwrap(), self.stderr.join().unwrap())
    }
}

/// The millions of tasks a demo progress line (`[demo]   2.28 s: 13.00 M tasks on live
/// workers ...`) counts.
pub fn tasks_in_progress_line(line: &str) -> Option<f64> {
    let before = line.split(" M tasks on live workers").next().filter(|b| b.len() < line.len())?;
    before.rsplit(' ').next()?.parse().ok()
}

/// Waits (at most `bound`) until each of `ranks` ranks of the job `driver` started has recorded
/// a stdout line starting with `prefix` (`ftkv_cli::records`): e.g. a chaos rank's `pid=`, which
/// it prints once its store exists.
pub fn wait_for_recorded(driver: u32, ranks: usize, prefix: &str, bound: Duration) {
    let started = std::time::Instant::now();
    let job_dirs = format!("ftkv-rank-records-{driver}-");
    let recorded = |rank: usize| {
        let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return false };
        entries.filter_map(Result::ok).any(|entry| {
            let is_job = entry.file_name().to_string_lossy().starts_with(&job_dirs);
            let record = std::fs::read_to_string(entry.path().join(format!("rank-{rank}.out")));
            is_job && record.is_ok_and(|text| text.lines().any(|l| l.starts_with(prefix)))
        })
    };
    while !(0..ranks).all(recorded) {
        assert!(started.elapsed() < bound, "not every rank recorded {prefix:?} within {bound:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
