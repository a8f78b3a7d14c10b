//! Helpers shared by the real-MPI tests: jobs of the `ftkv-mpitest` rank program with a hard
//! timeout, on the transport `FTKV_TEST_BTL` selects, and `ftkv demo` runs with their report.
//! Each test file uses some of them.
#![allow(dead_code)]

use std::time::Duration;

use std::collections::HashMap;

use ftkv_cli::launch::{kill_pid, with_start_retries, JobOutput, Launch, RunningJob};

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
    let json =
        std::env::temp_dir().join(format!("ftkv-demo-{}-{}.json", std::process::id(), args.len()));
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ftkv"));
    cmd.arg("demo").args(args).arg("--json").arg(&json);
    let out = ftkv_cli::launch::output_within(cmd, bound).expect("the demo ends within its bound");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "the demo failed:\n{stdout}\n{stderr}");
    let text = std::fs::read_to_string(&json).expect("the demo's JSON report");
    let _ = std::fs::remove_file(&json);
    (serde_json::from_str(&text).expect("a JSON report"), stdout, stderr)
}

/// The checks of a demo whose one worker was SIGSTOPped past the suspicion bound: exact
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

/// Runs `launch` (its ranks print `ready pid=<pid>`), SIGKILLs `victims` from outside 0.8 s after every
/// rank is ready, and returns the job's output.
/// A job whose `mpirun` could not start at all is started again, as [`Launch::run`] does.
pub fn job_with_outside_kills(launch: Launch, ranks: usize, victims: &[usize]) -> JobOutput {
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
    });
    let (mut running, pids) = started.expect("mpirun starts").unwrap_or_else(|out| {
        panic!("the ranks did not get ready:\n{}", out.transcript());
    });
    std::thread::sleep(Duration::from_millis(800));
    for victim in victims {
        assert!(kill_pid(pids[victim]).expect("kill"), "rank {victim} ended before its kill");
    }
    while running.next_line(Duration::from_millis(50)).is_some() || running.is_running() {}
    let out = running.finish().expect("the job's output");
    assert!(!out.timed_out, "job hung:\n{}", out.transcript());
    out
}

/// Each rank's pid from its `ready pid=<pid>` line (at most 60 s of waiting for a line);
/// `None` when the job's output ended first.
fn ready_pids(running: &mut RunningJob, ranks: usize) -> Option<HashMap<usize, u32>> {
    let mut pids = HashMap::new();
    while pids.len() < ranks {
        let (Some(rank), line) = running.next_line(Duration::from_secs(60))? else { continue };
        if let Some(pid) = line.strip_prefix("ready pid=").and_then(|p| p.trim().parse().ok()) {
            pids.insert(rank, pid);
        }
    }
    Some(pids)
}
