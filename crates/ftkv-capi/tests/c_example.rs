//! The C and C++ examples (`examples/c/checkpoint.c`, `examples/c/transaction.c`,
//! `examples/cpp/checkpoint.cpp`), built with the project venv's `mpicc`/`mpicxx` against
//! `include/` and the shared library, run under `mpirun --with-ft ulfm` with a rank SIGKILLed
//! from outside by PID while every rank works (on one host, or over the simulated hosts
//! `FTKV_NODES` asks for).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ftkv_launch::launch::{run_with_outside_kills, JobOutput, Launch};

/// The directory cargo builds this profile's libraries into (`target/<profile>`).
fn profile_dir() -> PathBuf {
    let test = std::env::current_exe().expect("the test binary's path");
    test.ancestors().nth(2).expect("target/<profile>/deps/<test>").to_path_buf()
}

fn workspace() -> &'static Path {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.ancestors().nth(2).expect("crates/ftkv-capi in the workspace")
}

/// The venv's MPI compiler wrapper `name` (`mpicc`, `mpicxx`), or `$var` when set.
fn compiler(var: &str, name: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".venv").join("bin").join(name))
}

/// Builds `libftkv_capi.so` into `libs` (a no-op when it is current): `cargo test` links the
/// integration tests against the rlib and leaves the cdylib out, so one built by an earlier
/// run from older sources would otherwise be what the examples load.
fn build_shared_library(libs: &Path) {
    let release = libs.file_name().is_some_and(|name| name == "release");
    let mut cargo = Command::new(env!("CARGO"));
    cargo.current_dir(workspace()).args(["build", "--quiet", "-p", "ftkv-capi", "--lib"]);
    if release {
        cargo.arg("--release");
    }
    let status = cargo.status().expect("cargo runs");
    assert!(status.success(), "cargo could not build ftkv-capi's shared library");
    assert!(libs.join("libftkv_capi.so").exists(), "no libftkv_capi.so in {}", libs.display());
}

/// Compiles `examples/<source>` against the headers and the shared library, warnings as
/// errors; the executable's path.
fn build_example(source: &str) -> PathBuf {
    build(&workspace().join("examples").join(source))
}

/// Compiles the C or C++ file `source` as [`build_example`] does.
fn build(source: &Path) -> PathBuf {
    let libs = profile_dir();
    build_shared_library(&libs);
    let cpp = source.extension().is_some_and(|e| e == "cpp");
    let (wrapper, standard) = if cpp {
        (compiler("MPICXX", "mpicxx"), "-std=c++17")
    } else {
        (compiler("MPICC", "mpicc"), "-std=c11")
    };
    let stem = source.file_stem().expect("a file name").to_string_lossy();
    let exe = libs.join(format!("ftkv-example-{stem}{}", if cpp { "-cpp" } else { "" }));
    let status = Command::new(wrapper)
        .arg(source)
        .args([standard, "-D_POSIX_C_SOURCE=200809L", "-D_DEFAULT_SOURCE", "-Wall", "-Wextra"])
        .arg("-Werror")
        .arg("-I")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("include"))
        .arg(format!("-L{}", libs.display()))
        .arg(format!("-Wl,-rpath,{}", libs.display()))
        .arg("-lftkv_capi")
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("the MPI compiler wrapper runs");
    assert!(status.success(), "{} does not compile", source.display());
    exe
}

/// Runs `exe` on `ranks` ranks for 3 s of work, SIGKILLs rank `victim` from outside 0.8 s
/// after every rank is ready, and checks that the job ended in time and every survivor
/// printed `done` without an error of the example's own.
fn run_with_a_kill(exe: &Path, ranks: usize, victim: usize) -> JobOutput {
    let launch = Launch::new(exe, ranks).args(["3"]).timeout(Duration::from_secs(120));
    let launch = launch.transport_from_env();
    let delay = Duration::from_millis(800);
    let out = run_with_outside_kills(&launch, ranks, &[victim], delay).expect("the job runs");
    eprintln!("TRANSCRIPT\n{}", out.transcript_but_errors());
    assert!(!out.timed_out, "the example hung:\n{}", out.transcript());
    for rank in (0..ranks).filter(|&r| r != victim) {
        let done = out.rank_lines(rank).iter().any(|l| l == "done");
        assert!(done, "rank {rank} did not finish:\n{}", out.transcript());
    }
    let name = exe.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let own_errors = out.stderr.lines().filter(|l| l.contains(": ftkv_")).collect::<Vec<_>>();
    assert!(own_errors.is_empty(), "{name}: a survivor failed: {own_errors:?}");
    out
}

/// The last iteration `rank` printed as acknowledged (`acked I`); 0 when none.
fn last_acked(out: &JobOutput, rank: usize) -> u64 {
    let acked = out.rank_lines(rank).iter().filter_map(|l| l.strip_prefix("acked "));
    acked.filter_map(|i| i.trim().parse().ok()).max().unwrap_or(0)
}

/// The checkpoint loop's verdict: every survivor noticed the victim, read its checkpoint
/// whole, at the last iteration the victim printed as acknowledged or later (the next put may
/// have been in flight), and the copies the victim held were moved by someone, without a fall
/// back to global recovery (the barrier at the end asks for one).
fn assert_checkpoint_loop(out: &JobOutput, ranks: usize, victim: usize) {
    let acked = last_acked(out, victim);
    assert!(acked >= 1, "the victim acknowledged nothing before its kill:\n{}", out.transcript());
    let mut moved = 0;
    for rank in (0..ranks).filter(|&r| r != victim) {
        let lines = out.rank_lines(rank);
        let noticed = format!("noticed failure of worker {victim}");
        assert!(lines.contains(&noticed), "rank {rank}: {noticed}?\n{}", out.transcript());
        let prefix = format!("read rank {victim} iteration ");
        let read = lines.iter().find_map(|l| l.strip_prefix(&prefix)).unwrap_or_else(|| {
            panic!("rank {rank} read no checkpoint of rank {victim}:\n{}", out.transcript())
        });
        let (iteration, verdict) = read.split_once(" -> ").expect("iteration -> verdict");
        assert_eq!(verdict, "MATCH", "rank {rank}:\n{}", out.transcript());
        let iteration: u64 = iteration.parse().expect("an iteration");
        assert!(iteration >= acked, "rank {rank} read {iteration}, {acked} was acknowledged");
        let wrote = lines.iter().any(|l| l.starts_with("wrote "));
        assert!(wrote, "rank {rank} did not end its writes:\n{}", out.transcript());
        let counters = lines.iter().find_map(|l| l.strip_prefix("counters ")).expect("counters");
        moved += counter(counters, "keys_moved");
        assert!(counter(counters, "puts") >= 1, "rank {rank}: {counters}");
    }
    assert!(moved >= 1, "nobody moved the victim's copies:\n{}", out.transcript());
    // The barrier at the end asks for a global recovery after the kill, which a survivor still
    // in its last writes meets there too; a fall back while writing says why on stderr.
    let fell_back = out.stderr.lines().find(|l| l.contains("need global recovery"));
    assert!(fell_back.is_none(), "localized recovery fell back: {fell_back:?}");
}

/// The value of `name=` in a `counters ...` line.
fn counter(line: &str, name: &str) -> u64 {
    let prefix = format!("{name}=");
    let field = line.split_whitespace().find_map(|f| f.strip_prefix(prefix.as_str()));
    field.and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {name} in {line:?}"))
}

#[test]
fn the_c_checkpoint_loop_reads_a_rank_killed_from_outside_back_whole() {
    let (ranks, victim) = (6, 4);
    let out = run_with_a_kill(&build_example("c/checkpoint.c"), ranks, victim);
    assert_checkpoint_loop(&out, ranks, victim);
}

#[test]
fn the_cpp_checkpoint_loop_reads_a_rank_killed_from_outside_back_whole() {
    let (ranks, victim) = (6, 1);
    let out = run_with_a_kill(&build_example("cpp/checkpoint.cpp"), ranks, victim);
    assert_checkpoint_loop(&out, ranks, victim);
}

/// Every rank coordinates transfers between accounts while one coordinator is SIGKILLed from
/// outside: the first survivor's total over every account, the dead one's too, is exactly
/// what the accounts opened with, transfers committed on every rank, and one survivor, its
/// backup, finished the dead coordinator's open transaction (if it had one) from its record.
#[test]
fn c_transactions_keep_the_total_when_a_coordinator_is_killed_from_outside() {
    let (ranks, victim) = (5, 2);
    let out = run_with_a_kill(&build_example("c/transaction.c"), ranks, victim);
    let verdict = out.rank_lines(0).iter().find(|l| l.starts_with("total ")).cloned();
    let verdict = verdict.unwrap_or_else(|| panic!("no total:\n{}", out.transcript()));
    assert_eq!(verdict, format!("total {} of {ranks} accounts -> MATCH", 100 * ranks));
    let mut resolved = 0;
    for rank in (0..ranks).filter(|&r| r != victim) {
        let lines = out.rank_lines(rank);
        let counters = lines.iter().find_map(|l| l.strip_prefix("counters ")).expect("counters");
        assert!(counter(counters, "committed") > 1, "rank {rank}: {counters}");
        resolved += counter(counters, "resolved");
        let noticed = format!("noticed failure of worker {victim}");
        assert!(lines.contains(&noticed), "rank {rank}: {noticed}?\n{}", out.transcript());
    }
    assert!(resolved >= 1, "no backup resolved the victim's transactions:\n{}", out.transcript());
}

/// A C program's own `MPI_Allreduce` on the communicator it shrank after ranks 4 and 5 were
/// SIGKILLed from outside at once (with `FTKV_NODES=3` the whole third host's ranks), launched
/// as the docs say (ftkv's launcher passes `coll ^han,cuda`; the C library sets it too): every
/// survivor's sum is the survivors' count. With `coll/han` selected it crashed in
/// `mca_coll_han_comm_create`.
#[test]
fn a_c_programs_own_allreduce_after_a_hosts_ranks_died_counts_the_survivors() {
    let exe =
        build(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/allreduce_after_failure.c"));
    let ranks = 6;
    let launch = Launch::new(&exe, ranks).args(["3"]).timeout(Duration::from_secs(120));
    let launch = launch.transport_from_env();
    let delay = Duration::from_millis(800);
    let out = run_with_outside_kills(&launch, ranks, &[4, 5], delay).expect("the job runs");
    assert!(!out.timed_out, "the program hung:\n{}", out.transcript());
    for rank in 0..4 {
        let lines = out.rank_lines(rank);
        assert!(
            lines.iter().any(|l| l == "allreduce 4 of 4"),
            "rank {rank}:\n{}",
            out.transcript()
        );
        assert!(lines.iter().any(|l| l == "done"), "rank {rank}:\n{}", out.transcript());
    }
}

/// `tests/c/barrier_after_failure.c`, Open MPI alone: a rank SIGKILLed while the others are
/// in `MPI_Barrier` (4 ranks). Each survivor's barrier fails with `MPI_ERR_PROC_FAILED` or,
/// at the root of Open MPI's linear barrier, `MPI_ERR_OTHER`, and ULFM knows the failed member
/// when the barrier returns: the premise of `Comm::barrier` reporting `MPI_ERR_OTHER` then as
/// the failure it is. Prints which survivors got `MPI_ERR_OTHER`.
#[test]
fn open_mpis_barrier_that_a_death_interrupts_fails_with_the_failure_known() {
    let exe = build(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/barrier_after_failure.c"));
    let (ranks, victim) = (4, 2);
    let launch = Launch::new(&exe, ranks).timeout(Duration::from_secs(60)).transport_from_env();
    let delay = Duration::from_millis(800);
    let out = run_with_outside_kills(&launch, ranks, &[victim], delay).expect("the job runs");
    assert!(!out.timed_out, "the program hung:\n{}", out.transcript());
    let mut got_other = Vec::new();
    for rank in (0..ranks).filter(|&r| r != victim) {
        let lines = out.rank_lines(rank);
        let line = lines.iter().find_map(|l| l.strip_prefix("barrier ")).unwrap_or_else(|| {
            panic!("rank {rank} printed no barrier outcome:\n{}", out.transcript())
        });
        let class = counter(line, "class");
        assert!(counter(line, "known_failed") >= 1, "rank {rank}: {line}");
        if class == counter(line, "other") {
            got_other.push(rank);
        } else {
            assert_eq!(class, counter(line, "proc_failed"), "rank {rank}: {line}");
        }
    }
    eprintln!("survivors whose barrier returned MPI_ERR_OTHER: {got_other:?}");
}

/// `tests/c/api_checks.c` on 4 ranks without failures: every C function's documented result
/// (argument errors, an asynchronous 1 MiB put, a handed write of another rank's key, exact
/// counters, transactions committed, aborted on a named key, their reads).
#[test]
fn every_c_function_returns_what_its_comment_says() {
    let exe = build(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/api_checks.c"));
    let launch = Launch::new(&exe, 4).timeout(Duration::from_secs(60)).transport_from_env();
    let out = launch.run().expect("mpirun starts");
    assert!(!out.timed_out, "the checks hung:\n{}", out.transcript());
    for rank in 0..4 {
        let lines = out.rank_lines(rank);
        assert!(lines.iter().any(|l| l == "checks passed"), "rank {rank}:\n{}", out.transcript());
    }
}

/// The C checkpoint loop under plain `mpirun --with-ft ulfm` (not ftkv's launcher: what the
/// C library sets before `MPI_Init` is all it gets) with every default (the 10 s bound: the
/// suite's longer `OMPI_MCA_mpi_ft_detector_timeout` is removed), one rank SIGSTOPped from
/// outside by pid for 90 s: the survivors declare it, end its process and finish, and
/// `mpirun` ends within the bound, a recovery and a second of the stop, not after the 90 s,
/// and every survivor reads the stopped rank's checkpoint whole after the barrier at the end
/// (where the stop is found: the writes end before the bound). Open MPI's linear barrier
/// returned `MPI_ERR_OTHER` to its root here, which `Comm::barrier` reports as the failure it
/// is (`docs/limits.md`).
#[test]
fn a_c_rank_stopped_for_90_s_under_plain_mpirun_costs_the_job_the_bound_and_a_second() {
    let exe = build_example("c/checkpoint.c");
    let (ranks, victim) = (4, 2);
    let mut mpirun = Command::new(ftkv_launch::env::mpirun());
    mpirun
        .args(["--with-ft", "ulfm", "--oversubscribe", "--allow-run-as-root", "--output", "tag"])
        .args(["-n", &ranks.to_string()])
        .arg(&exe)
        .arg("3")
        .env_remove("OMPI_MCA_mpi_ft_detector_timeout")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let job = plain::Job::spawn(mpirun, ranks);
    let pid = job.pids[&victim];
    let stopped_at = std::time::Instant::now();
    assert!(ftkv_launch::launch::signal_pid(pid, "-STOP").expect("kill runs"));
    let (ended, out) = job.wait(Duration::from_secs(100));
    let resumed = ftkv_launch::launch::signal_pid(pid, "-CONT").expect("kill runs");
    let took = ended.map(|at| at.duration_since(stopped_at));
    eprintln!("the job ended {took:?} after the stop");
    let allowed = Duration::from_secs(10) + Duration::from_secs(2);
    assert!(took.is_some_and(|t| t <= allowed), "the job took {took:?} after the stop:\n{out}");
    assert!(!resumed, "the stopped rank was still there when the job ended:\n{out}");
    for rank in (0..ranks).filter(|&r| r != victim) {
        let done = format!("[1,{rank}]<stdout>: done");
        assert!(out.lines().any(|l| l == done), "rank {rank} did not finish:\n{out}");
        let read = format!("[1,{rank}]<stdout>: read rank {victim} iteration ");
        let matched = out.lines().any(|l| l.starts_with(&read) && l.ends_with("-> MATCH"));
        assert!(matched, "rank {rank} read no whole checkpoint of rank {victim}:\n{out}");
    }
}

/// A job under plain `mpirun`, its tagged output read on threads.
mod plain {
    use std::collections::HashMap;
    use std::io::{BufRead, BufReader};
    use std::process::{Child, Command};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    pub struct Job {
        child: Child,
        lines: mpsc::Receiver<String>,
        seen: Vec<String>,
        /// Each rank's pid, from its `ready pid=<pid>` line.
        pub pids: HashMap<usize, u32>,
    }

    impl Job {
        /// Starts `mpirun` and waits (60 s at most) until each of the `ranks` printed its pid.
        pub fn spawn(mut mpirun: Command, ranks: usize) -> Job {
            let mut child = mpirun.spawn().expect("mpirun starts");
            let (tell, lines) = mpsc::channel();
            let stdout = child.stdout.take().expect("piped");
            let stderr = child.stderr.take().expect("piped");
            for stream in [Box::new(stdout) as Box<dyn std::io::Read + Send>, Box::new(stderr)] {
                let tell = tell.clone();
                std::thread::spawn(move || {
                    for line in BufReader::new(stream).lines().map_while(Result::ok) {
                        let _ = tell.send(line);
                    }
                });
            }
            let mut job = Job { child, lines, seen: Vec::new(), pids: HashMap::new() };
            let deadline = Instant::now() + Duration::from_secs(60);
            while job.pids.len() < ranks && Instant::now() < deadline {
                let Ok(line) = job.lines.recv_timeout(Duration::from_millis(100)) else { continue };
                if let Some((rank, pid)) = ready_pid(&line) {
                    job.pids.insert(rank, pid);
                }
                job.seen.push(line);
            }
            if job.pids.len() < ranks {
                let _ = job.child.kill();
                panic!("the ranks did not get ready:\n{}", job.seen.join("\n"));
            }
            job
        }

        /// Waits up to `limit` for `mpirun` to end (killing it past that); when it ended (if it
        /// did) and everything it printed.
        pub fn wait(mut self, limit: Duration) -> (Option<Instant>, String) {
            let deadline = Instant::now() + limit;
            let mut ended = None;
            while ended.is_none() && Instant::now() < deadline {
                if let Ok(line) = self.lines.recv_timeout(Duration::from_millis(20)) {
                    self.seen.push(line);
                }
                if self.child.try_wait().ok().flatten().is_some() {
                    ended = Some(Instant::now());
                }
            }
            if ended.is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
            // The readers end with the streams; what they still hold comes within moments.
            while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(500)) {
                self.seen.push(line);
            }
            (ended, self.seen.join("\n"))
        }
    }

    /// `(rank, pid)` from a tagged `[1,<rank>]<stdout>: ready pid=<pid>` line.
    fn ready_pid(line: &str) -> Option<(usize, u32)> {
        let rest = line.strip_prefix("[1,")?;
        let (rank, rest) = rest.split_once(']')?;
        let pid = rest.strip_prefix("<stdout>: ready pid=")?;
        Some((rank.parse().ok()?, pid.trim().parse().ok()?))
    }
}
