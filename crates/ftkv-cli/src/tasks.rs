//! `ftkv demo` and `ftkv bench uts`: the work-stealing pool with task-level checkpointing
//! (`ftkv-tasks`) under real `mpirun`, with workers SIGKILLed from outside.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ftkv::Recovery;
use ftkv_mpi::Mpi;
use ftkv_tasks::events::Progress as PoolProgress;
use ftkv_tasks::fib::Fib;
use ftkv_tasks::model::Model;
use ftkv_tasks::nqueens::NQueens;
use ftkv_tasks::pool::{self, Interval, PoolConfig};
use ftkv_tasks::problem::{check_exact, solve_sequential, Reference};
use ftkv_tasks::uts::{self, Counts};
use ftkv_tasks::wavefront::{Wavefront, MODULUS};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::args::{self, Opt};
use crate::launch::{kill_random_rank, JobOutput, Launch};
use crate::progress::Progress;
use crate::rank_errors::find_rank_error;

/// What the pool computes: a UTS tree (the reference's flags or a sample name), N-Queens,
/// Fibonacci, or the wavefront of futures (a program, not a tree: futures only).
#[derive(Debug, Clone, PartialEq)]
pub enum Workload {
    Uts(String),
    Queens(u32),
    Fib(u32),
    Wave(u32),
}

impl Workload {
    /// `queens:N`, `fib:N`, `wave:N` or UTS parameters.
    pub fn parse(text: &str) -> Result<Workload> {
        if let Some(n) = text.trim().strip_prefix("wave:") {
            let n: u32 = n.parse().context("wave:N needs a number")?;
            Wavefront::new(n).map_err(anyhow::Error::msg)?;
            return Ok(Workload::Wave(n));
        }
        if let Some(n) = text.trim().strip_prefix("queens:") {
            let n: u32 = n.parse().context("queens:N needs a number")?;
            NQueens::new(n).map_err(anyhow::Error::msg)?;
            return Ok(Workload::Queens(n));
        }
        if let Some(n) = text.trim().strip_prefix("fib:") {
            let n: u32 = n.parse().context("fib:N needs a number")?;
            Fib::new(n).map_err(anyhow::Error::msg)?;
            return Ok(Workload::Fib(n));
        }
        uts::Params::parse(text)?;
        Ok(Workload::Uts(text.to_string()))
    }

    fn describe(&self) -> String {
        match self {
            Workload::Uts(text) => {
                match uts::Params::parse(text).ok().and_then(|p| p.published()) {
                    Some((name, _, _)) => format!("UTS {name} ({text:?})"),
                    None => format!("UTS {text:?}"),
                }
            }
            Workload::Queens(n) => format!("{n}-Queens"),
            Workload::Fib(n) => format!("Fibonacci fib({n})"),
            Workload::Wave(n) => {
                format!("wavefront {n}x{n} (last cell C({}, {}) mod {MODULUS})", 2 * n - 2, n - 1)
            }
        }
    }

    /// Refuses a model the workload cannot be written in: the wavefront's cells are futures
    /// awaited by two cells each, which only future-based cooperation expresses.
    pub fn check_model(&self, model: Model) -> Result<()> {
        if matches!(self, Workload::Wave(_)) && model != Model::Fbc {
            bail!(
                "wave:N is a program of futures each awaited by two cells, which the {} model \
                 cannot express: use --model fbc",
                model.name()
            );
        }
        Ok(())
    }

    /// Published (nodes, leaves) for UTS sample trees, (-, solutions) for N-Queens, the closed
    /// forms (2·F(N+1) − 1, F(N)) for Fibonacci and (N², C(2N − 2, N − 1) mod p) for the
    /// wavefront.
    fn published(&self) -> Option<(Option<u64>, u64)> {
        match self {
            Workload::Uts(text) => {
                uts::Params::parse(text).ok()?.published().map(|(_, n, l)| (Some(n), l))
            }
            Workload::Queens(n) => NQueens::new(*n).ok()?.published().map(|s| (None, s)),
            Workload::Fib(n) => Fib::new(*n).ok().map(|f| f.expected()).map(|(n, l)| (Some(n), l)),
            Workload::Wave(n) => {
                Wavefront::new(*n).ok().map(|w| w.expected()).map(|c| (Some(c.nodes), c.leaves))
            }
        }
    }

    /// What [`Workload::published`] gives: published counts, or Fibonacci's closed forms.
    fn reference_name(&self) -> &'static str {
        match self {
            Workload::Uts(_) | Workload::Queens(_) => "published",
            Workload::Fib(_) | Workload::Wave(_) => "closed form",
        }
    }

    fn as_arg(&self) -> String {
        match self {
            Workload::Uts(text) => format!("uts:{text}"),
            Workload::Queens(n) => format!("queens:{n}"),
            Workload::Fib(n) => format!("fib:{n}"),
            Workload::Wave(n) => format!("wave:{n}"),
        }
    }

    /// The result of this workload's sequential program in `model`, computed on this thread.
    pub fn sequential(&self, model: Model) -> Result<Counts> {
        Ok(match self {
            Workload::Uts(text) => model.sequential(uts::Params::parse(text)?),
            Workload::Queens(n) => model.sequential(NQueens::new(*n).map_err(anyhow::Error::msg)?),
            Workload::Fib(n) => model.sequential(Fib::new(*n).map_err(anyhow::Error::msg)?),
            Workload::Wave(n) => {
                self.check_model(model)?;
                solve_sequential(&Wavefront::new(*n).map_err(anyhow::Error::msg)?)
            }
        })
    }

    fn from_arg(arg: &str) -> Result<Workload> {
        match arg.strip_prefix("uts:") {
            Some(text) => Ok(Workload::Uts(text.to_string())),
            None => Workload::parse(arg),
        }
    }
}

/// How often each worker prints its progress: the driver plans its kills by it, and T1 runs
/// in about 0.3 s on 8 ranks here.
const PROGRESS_EVERY: Duration = Duration::from_millis(50);

/// The rank side: runs the pool and prints its `result {json}` report on every survivor.
pub fn rank_main(
    workload: &str,
    model: Model,
    interval: &str,
    (copies, recovery): (usize, Recovery),
    seed: u64,
    (suspicion, watchdog): (Duration, Duration),
) -> Result<()> {
    let workload = Workload::from_arg(workload)?;
    let mpi = Mpi::init()?;
    let world = mpi.world()?;
    crate::rank_println!("pid={}", std::process::id());
    let config = PoolConfig {
        copies,
        interval: parse_interval(interval)?,
        progress: Some(PROGRESS_EVERY),
        seed,
        suspicion,
        watchdog,
        recovery,
        ..PoolConfig::default()
    };
    let outcome = match &workload {
        Workload::Uts(text) => model.run(&world, uts::Params::parse(text)?, &config)?,
        Workload::Queens(n) => {
            model.run(&world, NQueens::new(*n).map_err(anyhow::Error::msg)?, &config)?
        }
        Workload::Fib(n) => {
            model.run(&world, Fib::new(*n).map_err(anyhow::Error::msg)?, &config)?
        }
        Workload::Wave(n) => {
            workload.check_model(model)?;
            pool::run(&world, &Wavefront::new(*n).map_err(anyhow::Error::msg)?, &config)?
        }
    };
    let t = outcome.total;
    let result = RankResult {
        computation: Computation {
            nodes: t.nodes,
            leaves: t.leaves,
            depth: t.max_depth as u64,
            tasks: outcome.tasks,
            checkpoints: outcome.checkpoints,
            store_bytes: outcome.store_bytes,
        },
        failed: outcome.failed.iter().map(|&w| w as usize).collect(),
        ms: outcome.elapsed.as_secs_f64() * 1e3,
    };
    crate::rank_println!("{}", crate::launch::report_line("result", &result));
    drop(world);
    mpi.finalize_bounded(Duration::from_secs(3))?;
    Ok(())
}

/// The whole computation's result and the survivors' sums, as every survivor reports them
/// and a run's report repeats them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Computation {
    pub nodes: u64,
    pub leaves: u64,
    pub depth: u64,
    pub tasks: u64,
    pub checkpoints: u64,
    pub store_bytes: u64,
}

/// What a surviving worker reports at the end (a `result {json}` line): the computation, the
/// failed workers as the survivors agreed, and its own run time. Every survivor's is the same
/// but for `ms`.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct RankResult {
    #[serde(flatten)]
    pub computation: Computation,
    pub failed: Vec<usize>,
    pub ms: f64,
}

impl RankResult {
    /// Whether two survivors report the same computation (everything but their time).
    fn agrees_with(&self, other: &RankResult) -> bool {
        RankResult { ms: 0.0, ..self.clone() } == RankResult { ms: 0.0, ..other.clone() }
    }
}

/// A checkpoint interval: `100ms` (or a bare number of milliseconds), `5000tasks`, or `off`
/// (also `0`): no checkpointing.
pub fn parse_interval(text: &str) -> Result<Option<Interval>> {
    let text = text.trim();
    if text == "off" || text == "0" {
        return Ok(None);
    }
    let (number, unit) =
        text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let n: u64 = number
        .parse()
        .with_context(|| format!("interval {text:?}: expected e.g. 100ms or 5000tasks"))?;
    ensure!(n > 0, "interval {text:?} must be positive (or off)");
    match unit {
        "" | "ms" => Ok(Some(Interval::Time(Duration::from_millis(n)))),
        "tasks" => Ok(Some(Interval::Tasks(n))),
        other => bail!("interval {text:?}: unknown unit {other:?} (ms or tasks)"),
    }
}

/// `ftkv demo` options.
#[derive(Debug, Clone)]
pub struct Demo {
    pub workload: Workload,
    pub model: Model,
    pub ranks: usize,
    pub kills: usize,
    /// As [`parse_interval`] takes it.
    pub interval: String,
    pub copies: usize,
    pub seed: u64,
    pub timeout: Duration,
    /// SIGSTOP one worker for this long (then SIGCONT).
    pub stop: Option<Duration>,
    /// With `stop`: stop every worker on the stopped one's simulated host at once.
    pub stop_host: bool,
    /// The suspicion bound, when given (Open MPI's heartbeat detector always runs with it).
    pub suspicion: Option<Duration>,
    /// Localized recovery instead of global.
    pub localized: bool,
    /// The hosts the job runs on when not those of the environment (`--nodes`, `--hostfile`).
    pub hosts: Option<crate::cluster::Hosts>,
}

impl Demo {
    /// The bound given, else the environment's (the store's default).
    fn suspicion(&self) -> Duration {
        self.suspicion.unwrap_or_else(ftkv::suspicion_from_environment)
    }
}

/// The demo's data-path watchdog; across hosts the store raises it past the suspicion bound
/// (a put to a silent holder there waits until the detector declares it).
const DEMO_WATCHDOG: Duration = Duration::from_secs(2);

/// What one run of the pool reported.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunReport {
    #[serde(flatten)]
    pub computation: Computation,
    pub wall_ms: f64,
    /// Ranks this driver SIGKILLed.
    pub killed: Vec<usize>,
    pub kill_ms: Vec<f64>,
    /// Ranks the survivors agreed had failed: the killed ones and any that died otherwise.
    pub failed: Vec<usize>,
    /// Per recovery seen by the survivors: the slowest survivor's store and total milliseconds.
    pub recoveries: Vec<(f64, f64)>,
    /// Global recoveries (every survivor stopped), as the survivor that saw most reported.
    pub global_recoveries: usize,
    /// The task rate of the survivors that adopted nothing, in the [`RATE_WINDOW`] after the
    /// first kill over the one before it (`None` without a kill or progress around it).
    pub uninvolved_rate_ratio: Option<f64>,
    /// Ranks that ended themselves as fail-stop failures (a watchdog): none when only killed
    /// ranks failed.
    pub self_ended: Vec<usize>,
    pub matches_published: Option<bool>,
    /// The rank this driver SIGSTOPped (`--stop`), when and when it was SIGCONTed (ms since
    /// the job started).
    pub stopped: Option<usize>,
    /// Every rank stopped (`--stop-host`: the stopped rank's host mates too).
    pub stopped_ranks: Vec<usize>,
    pub stop_ms: Option<f64>,
    pub resume_ms: Option<f64>,
    /// When the stopped rank's process was seen gone while still stopped (ms since the job
    /// started): the survivors ended it after declaring it failed.
    pub stopped_ended_ms: Option<f64>,
    /// When the first survivor reported the result (ms since the job started).
    pub result_ms: Option<f64>,
    /// When `mpirun` ended (ms since the job started).
    pub job_ms: Option<f64>,
}

/// Runs the demo: the pool under mpirun, kills at random moments, progress on stderr, a
/// verdict at the end (an error if the result is wrong).
pub fn run_demo(exe: &Path, demo: &Demo) -> Result<RunReport> {
    let ranks = Opt::new("--ranks", demo.ranks);
    let stopped = match demo.stop_host {
        true => demo.ranks.div_ceil(simulated_hosts(demo)?),
        false => 1,
    };
    ensure!(
        !demo.stop_host || demo.stop.is_some(),
        "--stop-host needs --stop SECS (how long the host's ranks stay stopped)"
    );
    let failures = demo.kills + if demo.stop.is_some() { stopped } else { 0 };
    args::check_kills(Opt::new("--kills (with --stop)", failures), ranks)?;
    ensure!(
        demo.suspicion().as_millis() > 10,
        "--suspicion must be longer than 10 ms (the detector polls every millisecond)"
    );
    args::check_copies(Opt::new("--copies", demo.copies), ranks)?;
    ensure!(
        failures == 0 || parse_interval(&demo.interval)?.is_some(),
        "kills and stops need checkpointing (--interval other than off)"
    );
    if let Some(stop) = demo.stop {
        eprintln!(
            "[demo] one worker SIGSTOPped for {:.1} s; suspicion bound {:.1} s (Open MPI's \
             heartbeat detector)",
            stop.as_secs_f64(),
            demo.suspicion().as_secs_f64()
        );
    }
    eprintln!(
        "[demo] {} as {} on {} ranks, {} kills, checkpoint every {}, {} copies, {} recovery, seed {}",
        demo.workload.describe(),
        demo.model.name(),
        demo.ranks,
        demo.kills,
        demo.interval,
        demo.copies,
        if demo.localized { "localized" } else { "global" },
        demo.seed
    );
    let report = run_pool_job(exe, demo, true)?;
    print_verdict(demo, &report);
    let sequential = demo.workload.sequential(demo.model)?;
    let matches_sequential = print_sequential(demo, &report, &sequential);
    if report.matches_published == Some(false) {
        bail!("the result differs from the published count");
    }
    ensure!(matches_sequential, "the result differs from the sequential program's");
    Ok(report)
}

/// One pool job with kills as planned by `demo`; `show` prints progress lines.
fn run_pool_job(exe: &Path, demo: &Demo, show: bool) -> Result<RunReport> {
    let mut args = vec![
        "tasks-rank".to_string(),
        demo.workload.as_arg(),
        demo.interval.clone(),
        demo.copies.to_string(),
        demo.seed.to_string(),
        demo.suspicion().as_millis().to_string(),
        DEMO_WATCHDOG.as_millis().to_string(),
        format!("--model={}", demo.model.name()),
    ];
    if demo.localized {
        args.push("--localized".to_string());
    }
    let mut launch = Launch::new(exe, demo.ranks)
        .args(args)
        .timeout(demo.timeout)
        .transport_from_env()
        .suspicion_detector(demo.suspicion());
    if let Some(hosts) = &demo.hosts {
        launch = launch.on_hosts(hosts.clone());
    }
    let (out, watch) = crate::launch::with_start_retries("[demo]", || {
        let (out, watch) = watch_pool_job(&launch, demo, show)?;
        let again = out.never_started().then(|| "mpirun could not start the job".to_owned());
        Ok(((out, watch), again))
    })?;
    ensure!(
        !out.timed_out,
        "the pool did not finish within {:?}; the ranks' errors:\n{}{}",
        demo.timeout,
        rank_errors(&out),
        tail(&out)
    );
    let mut report = result_of(&out, demo, &watch)?;
    let done = &report.computation;
    let total = Counts { nodes: done.nodes, leaves: done.leaves, max_depth: 0 };
    report.matches_published = demo
        .workload
        .published()
        .map(|(nodes, leaves)| check_exact(&total, Reference { nodes, leaves }).is_ok());
    Ok(report)
}

/// Runs the pool job to its end, killing ranks as planned and showing progress when `show`.
fn watch_pool_job(launch: &Launch, demo: &Demo, show: bool) -> Result<(JobOutput, Watch)> {
    let mut job = launch.spawn()?;
    let mut rng = SmallRng::seed_from_u64(demo.seed);
    let expected = demo.workload.published().and_then(|(nodes, leaves)| nodes.or(Some(leaves)));
    let progress = if show { Progress::new("demo", expected) } else { Progress::plain("demo") };
    let mut watch = Watch::new(plan_kills(&mut rng, demo.kills), expected, demo.copies, progress);
    watch.stop = demo.stop.map(|length| Stop::planned(&mut rng, length, demo.stop_host));
    while job.is_running() || watch.pending_output {
        let line = job.next_line(Duration::from_millis(5));
        watch.pending_output = line.is_some();
        if let Some((Some(rank), text)) = &line {
            watch.observe(*rank, text, job.elapsed());
        }
        watch.maybe_kill(&job, &mut rng)?;
        watch.maybe_stop_or_resume(&job, &mut rng)?;
        if show {
            watch.show_progress(job.elapsed());
        }
    }
    watch.job_ended = Some(job.elapsed());
    Ok((job.finish()?, watch))
}

/// Kill moments as fractions of the expected work (or of a second, when unknown), sorted: in
/// the first half, so that a kill held until the survivors recovered from earlier ones still
/// comes before the end.
fn plan_kills(rng: &mut SmallRng, kills: usize) -> Vec<f64> {
    let mut at: Vec<f64> = (0..kills).map(|_| rng.gen_range(0.1..0.5)).collect();
    at.sort_by(f64::total_cmp);
    at
}

/// A planned SIGSTOP of one worker: at a fraction of the work, for a while.
struct Stop {
    at: f64,
    length: Duration,
    /// The stopped rank and when (job time) it was stopped.
    done: Option<(usize, Duration)>,
    /// Every stopped rank: the one of `done`, and with `whole_host` its host mates.
    ranks: Vec<usize>,
    /// Stop the chosen rank's whole (simulated) host.
    whole_host: bool,
    resumed: Option<Duration>,
    /// When (job time) every stopped process was seen gone before it was resumed: the survivors
    /// ended it once they declared it failed.
    ended: Option<Duration>,
}

impl Stop {
    fn planned(rng: &mut SmallRng, length: Duration, whole_host: bool) -> Stop {
        let at = rng.gen_range(0.1..0.5);
        Stop { at, length, done: None, ranks: Vec::new(), whole_host, resumed: None, ended: None }
    }
}

/// How long before and after a kill the task rates of uninvolved workers are compared.
pub const RATE_WINDOW: Duration = Duration::from_millis(400);

/// Tasks run by job time `t` (ms), interpolated between progress lines; `None` outside them.
fn tasks_at(series: &[(f64, u64)], t: f64) -> Option<f64> {
    let after = series.iter().position(|&(at, _)| at >= t)?;
    let (t1, n1) = series[after];
    if after == 0 {
        return (t1 == t).then_some(n1 as f64);
    }
    let (t0, n0) = series[after - 1];
    Some(n0 as f64 + (n1 as f64 - n0 as f64) * (t - t0) / (t1 - t0))
}

/// The driver's view of the job: pids, progress, planned and done kills, recoveries.
struct Watch {
    stop: Option<Stop>,
    /// When `mpirun` ended (job time).
    job_ended: Option<Duration>,
    /// When the first survivor printed its result (job time).
    result_at: Option<Duration>,
    pids: HashMap<usize, u32>,
    tasks: HashMap<usize, u64>,
    /// Per rank: (job ms, tasks run) of each progress line.
    series: HashMap<usize, Vec<(f64, u64)>>,
    /// Ranks that adopted a failed worker's checkpoint in some recovery.
    adopters: Vec<usize>,
    plan: Vec<f64>,
    killed: Vec<usize>,
    kill_ms: Vec<f64>,
    expected: Option<u64>,
    recoveries: Vec<Vec<(f64, f64)>>,
    recovered_lines: HashMap<usize, usize>,
    /// Per rank: the failed workers its recoveries dealt with.
    recovered_failed: HashMap<usize, Vec<i32>>,
    /// Copies of every key: at most `copies − 1` kills may wait for their recovery at a time.
    copies: usize,
    /// The kill (its index in `plan`) for which the wait was shown.
    held_shown: Option<usize>,
    /// Per rank: its recoveries that stopped every survivor (`mode=global`).
    global_lines: HashMap<usize, usize>,
    last_shown: Instant,
    pending_output: bool,
    /// A bar on a terminal, plain `[demo]` lines otherwise.
    progress: Progress,
}

impl Watch {
    fn new(plan: Vec<f64>, expected: Option<u64>, copies: usize, progress: Progress) -> Watch {
        Watch {
            stop: None,
            job_ended: None,
            result_at: None,
            pids: HashMap::new(),
            tasks: HashMap::new(),
            series: HashMap::new(),
            adopters: Vec::new(),
            plan,
            killed: Vec::new(),
            kill_ms: Vec::new(),
            expected,
            recoveries: Vec::new(),
            recovered_lines: HashMap::new(),
            recovered_failed: HashMap::new(),
            copies,
            held_shown: None,
            global_lines: HashMap::new(),
            last_shown: Instant::now(),
            pending_output: true,
            progress,
        }
    }

    /// See [`RunReport::uninvolved_rate_ratio`].
    fn uninvolved_rate_ratio(&self, survivors: &[usize]) -> Option<f64> {
        let t0 = *self.kill_ms.first()?;
        let w = RATE_WINDOW.as_secs_f64() * 1e3;
        let (mut before, mut during) = (0.0, 0.0);
        for rank in survivors.iter().filter(|r| !self.adopters.contains(r)) {
            let series = self.series.get(rank)?;
            let at = |t| tasks_at(series, t);
            before += at(t0)? - at(t0 - w)?;
            during += at(t0 + w)? - at(t0)?;
        }
        (before > 0.0).then(|| during / before)
    }

    fn stopped_rank(&self) -> Option<usize> {
        self.stop.as_ref().and_then(|s| s.done).map(|(rank, _)| rank)
    }

    /// Every rank this driver stopped.
    fn stopped_ranks(&self) -> &[usize] {
        self.stop.as_ref().map_or(&[], |s| &s.ranks)
    }

    fn observe(&mut self, rank: usize, text: &str, elapsed: Duration) {
        if text.starts_with("result ") && self.result_at.is_none() {
            self.result_at = Some(elapsed);
            let still_stopped =
                self.stop.as_ref().is_some_and(|s| s.done.is_some() && s.resumed.is_none());
            if still_stopped {
                let stopped = self.stopped_rank().expect("a stopped rank");
                self.progress.line(&format!(
                    "{:>6.2} s: the survivors' result, rank {stopped} still stopped: {text}",
                    elapsed.as_secs_f64()
                ));
            }
        }
        if let Some(pid) = text.strip_prefix("pid=").and_then(|p| p.trim().parse().ok()) {
            self.pids.insert(rank, pid);
        } else if let Some(progress) = text.strip_prefix("progress ") {
            let Ok(progress) = serde_json::from_str::<PoolProgress>(progress) else { return };
            self.tasks.insert(rank, progress.tasks);
            let at = elapsed.as_secs_f64() * 1e3;
            self.series.entry(rank).or_default().push((at, progress.tasks));
        } else if let Some(info) = text.strip_prefix("recovered ") {
            let Ok(info) = serde_json::from_str::<pool::RecoveryInfo>(info) else { return };
            if !info.adopted.is_empty() && !self.adopters.contains(&rank) {
                self.adopters.push(rank);
            }
            if !info.localized {
                *self.global_lines.entry(rank).or_insert(0) += 1;
            }
            self.recovered_failed.entry(rank).or_default().extend(&info.failed);
            let seen = self.recovered_lines.entry(rank).or_insert(0);
            let nth = *seen;
            *seen += 1;
            if self.recoveries.len() <= nth {
                self.recoveries.push(Vec::new());
            }
            self.recoveries[nth].push((info.store_ms, info.total_ms));
        }
    }

    fn progress(&self, elapsed: Duration) -> f64 {
        let done: u64 = self.tasks.values().sum();
        match self.expected {
            Some(total) => done as f64 / total as f64,
            None => elapsed.as_secs_f64(),
        }
    }

    fn maybe_kill(&mut self, job: &crate::launch::RunningJob, rng: &mut SmallRng) -> Result<()> {
        let Some(&at) = self.plan.get(self.killed.len()) else { return Ok(()) };
        if self.progress(job.elapsed()) < at || self.pids.len() < 2 || self.hold_kill(job) {
            return Ok(());
        }
        let Some(victim) = kill_random_rank(&self.pids, &self.killed, rng)? else {
            self.progress.line("the chosen rank had already exited; its kill is dropped");
            self.plan.truncate(self.killed.len());
            return Ok(());
        };
        self.tasks.remove(&victim);
        self.killed.push(victim);
        self.kill_ms.push(job.elapsed().as_secs_f64() * 1e3);
        let at = job.elapsed().as_secs_f64();
        self.progress.line(&format!("{at:>6.2} s: SIGKILL rank {victim}"));
        Ok(())
    }

    /// Whether the next kill must wait: `copies − 1` killed ranks are not yet recovered from
    /// on every live rank, and one more failure could take every copy of a key (beyond what
    /// the store promises). Shown once per kill.
    fn hold_kill(&mut self, job: &crate::launch::RunningJob) -> bool {
        let unrecovered = self.unrecovered_kills();
        let hold = self.copies > 1 && unrecovered >= self.copies - 1;
        if hold && self.held_shown != Some(self.killed.len()) {
            self.held_shown = Some(self.killed.len());
            self.progress.line(&format!(
                "{:>6.2} s: next kill held until the survivors recovered ({unrecovered} killed \
                 ranks not yet recovered from, {} copies)",
                job.elapsed().as_secs_f64(),
                self.copies
            ));
        }
        hold
    }

    /// The killed ranks that some live rank has not yet reported recovered from.
    fn unrecovered_kills(&self) -> usize {
        let live = self.pids.keys().filter(|r| !self.killed.contains(r));
        let live: Vec<&usize> = live.collect();
        let recovered_by = |rank: &usize, killed: usize| {
            self.recovered_failed.get(rank).is_some_and(|f| f.contains(&(killed as i32)))
        };
        let recovered = |killed: &&usize| live.iter().all(|rank| recovered_by(rank, **killed));
        self.killed.iter().filter(|k| !recovered(k)).count()
    }

    /// SIGSTOPs the planned worker once the work reached its moment, and SIGCONTs it after its
    /// stop's length unless its process ended meanwhile (the survivors end a process they
    /// declared failed).
    fn maybe_stop_or_resume(
        &mut self,
        job: &crate::launch::RunningJob,
        rng: &mut SmallRng,
    ) -> Result<()> {
        let progress = self.progress(job.elapsed());
        let Some(stop) = self.stop.as_mut() else { return Ok(()) };
        match (stop.done, stop.resumed) {
            (None, _) if progress >= stop.at && self.pids.len() >= 2 => {
                let mut candidates: Vec<usize> =
                    self.pids.keys().copied().filter(|r| !self.killed.contains(r)).collect();
                candidates.sort_unstable();
                let rank = candidates[rng.gen_range(0..candidates.len())];
                stop.ranks = match stop.whole_host {
                    true => host_mates(job, &self.pids, &candidates, rank)?,
                    false => vec![rank],
                };
                for r in &stop.ranks {
                    signal(self.pids[r], "-STOP")?;
                    self.tasks.remove(r);
                }
                stop.done = Some((rank, job.elapsed()));
                let at = job.elapsed().as_secs_f64();
                self.progress.line(&format!("{at:>6.2} s: SIGSTOP ranks {:?}", stop.ranks));
            }
            (Some(_), None)
                if stop.ended.is_none()
                    && stop.ranks.iter().all(|r| ftkv_mpi::process::is_gone(self.pids[r])) =>
            {
                stop.ended = Some(job.elapsed());
                let at = job.elapsed().as_secs_f64();
                self.progress.line(&format!(
                    "{at:>6.2} s: the stopped processes of ranks {:?} ended",
                    stop.ranks
                ));
            }
            (Some((_, at)), None) if stop.ended.is_none() && job.elapsed() >= at + stop.length => {
                for r in &stop.ranks {
                    crate::launch::signal_pid(self.pids[r], "-CONT")?;
                }
                stop.resumed = Some(job.elapsed());
                let at = job.elapsed().as_secs_f64();
                self.progress.line(&format!("{at:>6.2} s: SIGCONT ranks {:?}", stop.ranks));
            }
            _ => {}
        }
        Ok(())
    }

    fn show_progress(&mut self, elapsed: Duration) {
        if self.last_shown.elapsed() < Duration::from_millis(250) {
            return;
        }
        self.last_shown = Instant::now();
        let done: u64 = self.tasks.values().sum();
        let rate = done as f64 / elapsed.as_secs_f64().max(1e-3) / 1e6;
        let message = format!(
            "{:>6.2} s: {:.2} M tasks on live workers ({rate:.2} M/s), kills {}/{}, recoveries {}",
            elapsed.as_secs_f64(),
            done as f64 / 1e6,
            self.killed.len(),
            self.plan.len(),
            self.recoveries.len()
        );
        self.progress.update(done, &message);
    }
}

/// The ranks' own errors, each message once with the ranks that reported it (`  ranks 0-3,
/// 5: ...`, indented under the failure message that names them, which the driver prefixes with
/// `ftkv:` once).
fn rank_errors(out: &JobOutput) -> String {
    let lines = out.errors_said_once();
    let unprefixed = lines.iter().take(5).map(|l| l.strip_prefix("ftkv: ").unwrap_or(l));
    unprefixed.map(|l| format!("  {l}\n")).collect()
}

/// The last 30 lines `rank` printed, on stdout and on stderr, but its error ([`rank_errors`]
/// shows it).
fn own_lines(out: &JobOutput, rank: usize) -> String {
    let stdout = out.rank_lines(rank).iter().map(String::as_str);
    let stderr = out.own_stderr(rank).filter(|l| find_rank_error(l).is_none());
    let lines: Vec<&str> = stdout.chain(stderr).collect();
    let last = &lines[lines.len().saturating_sub(30)..];
    last.iter().map(|l| format!("  [rank {rank}] {l}\n")).collect()
}

/// The last 40 lines of the job's output, without the ranks' errors ([`rank_errors`] shows
/// them).
fn tail(out: &JobOutput) -> String {
    let text = out.transcript_but_errors();
    let lines: Vec<&str> = text.lines().collect();
    let status = out.status.map_or("no exit status".to_owned(), |s| s.to_string());
    format!(
        "{}\n[mpirun: {status} after {:?}]",
        lines[lines.len().saturating_sub(40)..].join("\n"),
        out.elapsed
    )
}

/// What tells why `ranks` (failed without a kill of the driver's) ended: the ranks' errors,
/// each one's last lines and `mpirun`'s own lines.
fn show_why_they_failed(out: &JobOutput, ranks: &[usize]) {
    let errors = rank_errors(out);
    if !errors.is_empty() {
        eprint!("[demo] the ranks' errors:\n{errors}");
    }
    for &rank in ranks {
        eprint!("[demo] rank {rank}'s last lines:\n{}", own_lines(out, rank));
    }
    for line in &out.untagged {
        eprintln!("[demo] [mpirun] {line}");
    }
}

/// The result `rank` reported, if it reported one.
fn result_of_rank(out: &JobOutput, rank: usize) -> Result<Option<RankResult>> {
    out.rank_report(rank, "result")
}

/// Every survivor's result must agree; the report takes it. Survivors are the ranks that
/// neither this driver killed nor the survivors agreed had failed.
fn result_of(out: &JobOutput, demo: &Demo, watch: &Watch) -> Result<RunReport> {
    let mut failed = Vec::new();
    for rank in 0..demo.ranks {
        failed.extend(result_of_rank(out, rank)?.map(|r| r.failed).unwrap_or_default());
    }
    failed.sort_unstable();
    failed.dedup();
    let stopped = watch.stopped_rank();
    let dead = |r: &usize| {
        watch.killed.contains(r) || failed.contains(r) || watch.stopped_ranks().contains(r)
    };
    let survivors: Vec<usize> = (0..demo.ranks).filter(|r| !dead(r)).collect();
    let mut results = Vec::new();
    for &rank in &survivors {
        let Some(result) = result_of_rank(out, rank)? else {
            bail!(
                "survivor {rank} reported no result; the ranks' errors:\n{}its own last \
                 lines:\n{}\n{}",
                rank_errors(out),
                own_lines(out, rank),
                tail(out)
            );
        };
        results.push(result);
    }
    ensure!(
        !results.is_empty(),
        "no rank reported a result; the ranks' errors:\n{}{}",
        rank_errors(out),
        tail(out)
    );
    if let Some(rank) = stopped.filter(|r| failed.contains(r)) {
        ensure!(
            result_of_rank(out, rank)?.is_none(),
            "rank {rank}, declared failed while stopped, reported a result: it rejoined"
        );
    }
    let agreed = results.windows(2).all(|w| w[0].agrees_with(&w[1]));
    ensure!(agreed, "survivors disagree: {results:?}");
    let first = &results[0];
    let recoveries = watch
        .recoveries
        .iter()
        .map(|r| r.iter().fold((0.0f64, 0.0f64), |m, &(s, t)| (m.0.max(s), m.1.max(t))))
        .collect();
    let outside: Vec<usize> =
        failed.iter().copied().filter(|r| !watch.killed.contains(r)).collect();
    if !outside.is_empty() {
        eprintln!("[demo] ranks {outside:?} failed without a kill of this driver's; the survivors recovered");
        show_why_they_failed(out, &outside);
    }
    for rank in out.self_ended(demo.ranks) {
        for line in out.own_stderr(rank).map(str::trim).filter(|l| says_why_it_ended(l)).take(4) {
            eprintln!("[demo] rank {rank} ended itself: {line}");
        }
    }
    Ok(RunReport {
        failed,
        computation: first.computation.clone(),
        wall_ms: first.ms,
        killed: watch.killed.clone(),
        kill_ms: watch.kill_ms.clone(),
        recoveries,
        global_recoveries: watch.global_lines.values().copied().max().unwrap_or(0),
        uninvolved_rate_ratio: watch.uninvolved_rate_ratio(&survivors),
        self_ended: out.self_ended(demo.ranks),
        matches_published: None,
        stopped: watch.stopped_rank(),
        stopped_ranks: watch.stopped_ranks().to_vec(),
        stop_ms: watch.stop.as_ref().and_then(|s| s.done).map(|(_, at)| ms(at)),
        resume_ms: watch.stop.as_ref().and_then(|s| s.resumed).map(ms),
        stopped_ended_ms: watch.stop.as_ref().and_then(|s| s.ended).map(ms),
        result_ms: watch.result_at.map(ms),
        job_ms: watch.job_ended.map(ms),
    })
}

/// Prints the sequential program's result beside the pool's and whether they match.
fn print_sequential(demo: &Demo, r: &RunReport, sequential: &Counts) -> bool {
    let reference = Reference::from(*sequential);
    let total = Counts { nodes: r.computation.nodes, leaves: r.computation.leaves, max_depth: 0 };
    let ok = check_exact(&total, reference).is_ok();
    println!(
        "sequential ({} on one thread, this run): {} nodes, {} leaves -> {}",
        demo.model.name(),
        sequential.nodes,
        sequential.leaves,
        if ok { "MATCH" } else { "MISMATCH" }
    );
    ok
}

fn print_verdict(demo: &Demo, r: &RunReport) {
    println!(
        "{} ({}): {} nodes, {} leaves, depth {}",
        demo.workload.describe(),
        demo.model.name(),
        r.computation.nodes,
        r.computation.leaves,
        r.computation.depth
    );
    match (demo.workload.published(), r.matches_published) {
        (Some((nodes, leaves)), Some(ok)) => println!(
            "{}: {}{} leaves -> {}",
            demo.workload.reference_name(),
            nodes.map(|n| format!("{n} nodes, ")).unwrap_or_default(),
            leaves,
            if ok { "MATCH" } else { "MISMATCH" }
        ),
        _ => println!("published: none for these parameters"),
    }
    println!(
        "killed ranks {:?} at {:?} ms; failed ranks as the survivors agreed {:?}; ranks that ended themselves {:?}; recoveries (slowest survivor, store ms / total ms): {:?}; global recoveries: {}",
        r.killed,
        r.kill_ms.iter().map(|m| m.round()).collect::<Vec<_>>(),
        r.failed,
        r.self_ended,
        r.recoveries,
        r.global_recoveries
    );
    if let (Some(rank), Some(stop)) = (r.stopped, r.stop_ms) {
        let result =
            r.result_ms.map_or("no result".to_owned(), |t| format!("result at {:.0} ms", t));
        let after = match (r.stopped_ended_ms, r.resume_ms) {
            (Some(ended), _) => format!("its process ended by the survivors at {ended:.0} ms"),
            (None, Some(resume)) => format!("resumed at {resume:.0} ms"),
            (None, None) => "never resumed".to_owned(),
        };
        let job = r.job_ms.map_or(String::new(), |t| format!("; the job ended at {t:.0} ms"));
        println!(
            "stopped rank {rank} at {stop:.0} ms, {after}; the survivors' {result}{job}; failed as agreed: {}",
            r.failed.contains(&rank)
        );
    }
    println!(
        "checkpoint traffic: {} checkpoints, {:.2} MiB written by the survivors ({} copies each); {} tasks run (recomputed work included); pool time {:.0} ms",
        r.computation.checkpoints,
        r.computation.store_bytes as f64 / (1 << 20) as f64,
        demo.copies,
        r.computation.tasks,
        r.wall_ms
    );
}

/// What `ftkv bench uts` runs besides the failure-free comparison on one host.
pub struct BenchPlan {
    /// Runs of each variant (alternating).
    pub repeat: usize,
    /// Workers SIGKILLed in the recovery rows (0: none).
    pub kills: usize,
    /// Both variants also over this many simulated hosts.
    pub across: Option<usize>,
    /// The task models compared (each without and with checkpointing); empty: the demo's.
    pub models: Vec<Model>,
}

/// One failure-free variant of `ftkv bench uts`: checkpointing off or on, on the environment's
/// hosts or over simulated ones.
struct Variant {
    model: Model,
    checkpointing: bool,
    simulated_hosts: Option<usize>,
    runs: Vec<RunReport>,
}

impl Variant {
    fn name(&self) -> String {
        let hosts = match self.simulated_hosts {
            Some(n) => format!(", {n} hosts"),
            None => String::new(),
        };
        let checkpointing = if self.checkpointing { "on " } else { "off" };
        format!("{} checkpointing {checkpointing}{hosts}", self.model.name())
    }

    fn median_ms(&self) -> f64 {
        let mut ms: Vec<f64> = self.runs.iter().map(|r| r.wall_ms).collect();
        ms.sort_by(f64::total_cmp);
        ms[ms.len() / 2]
    }

    fn demo(&self, demo: &Demo) -> Demo {
        Demo {
            model: self.model,
            kills: 0,
            interval: if self.checkpointing { demo.interval.clone() } else { "off".into() },
            localized: self.checkpointing && demo.localized,
            hosts: self
                .simulated_hosts
                .map(crate::cluster::Hosts::Simulated)
                .or(demo.hosts.clone()),
            ..demo.clone()
        }
    }
}

/// `ftkv bench uts`: the same tree failure-free without and with checkpointing (and, with
/// [`BenchPlan::across`], both again over simulated hosts), `repeat` times each, alternating;
/// the ratio of the medians is the checkpointing overhead. With `kills`, also runs it with
/// kills under global and localized recovery (see `recovery_rows`). Prints the medians and
/// their ratios and writes them to `json`.
pub fn run_bench(exe: &Path, demo: &Demo, plan: &BenchPlan, json: &Path) -> Result<()> {
    let models = if plan.models.is_empty() { vec![demo.model] } else { plan.models.clone() };
    let hosts = [None].into_iter().chain(plan.across.map(Some));
    let mut variants: Vec<Variant> = hosts
        .flat_map(|h| [false, true].map(|c| (c, h)))
        .flat_map(|(c, h)| models.iter().map(move |&m| (m, c, h)))
        .map(|(model, checkpointing, simulated_hosts)| Variant {
            model,
            checkpointing,
            simulated_hosts,
            runs: Vec::new(),
        })
        .collect();
    variants.sort_by_key(|v| (v.simulated_hosts, models.iter().position(|&m| m == v.model)));
    let per_round = variants.len() as u64;
    let progress = Progress::new("bench uts", Some(per_round * plan.repeat as u64));
    for i in 0..plan.repeat {
        for (j, variant) in variants.iter_mut().enumerate() {
            let report = run_pool_job(exe, &variant.demo(demo), false)?;
            ensure!(report.matches_published != Some(false), "wrong result: {report:?}");
            progress.line(&format!(
                "{}/{} {}: {:.1} ms, {} checkpoints, {:.2} MiB",
                i + 1,
                plan.repeat,
                variant.name(),
                report.wall_ms,
                report.computation.checkpoints,
                report.computation.store_bytes as f64 / (1 << 20) as f64
            ));
            variant.runs.push(report);
            progress.advance_to(per_round * i as u64 + j as u64 + 1);
        }
    }
    let (off, on) = (variants[0].median_ms(), variants[1].median_ms());
    println!("| variant | median ms | runs |\n|---|---|---|");
    for variant in &variants {
        println!("| {} | {:.1} | {} |", variant.name(), variant.median_ms(), plan.repeat);
    }
    let per_model = model_overheads(&variants[..2 * models.len()]);
    let across = variants
        .get(2 * models.len()..)
        .filter(|remote| !remote.is_empty())
        .map(|remote| across_hosts(plan, [off, on], remote));
    let recovery = match plan.kills {
        0 => Vec::new(),
        kills => recovery_rows(exe, demo, plan.repeat, kills)?,
    };
    let result = serde_json::json!({
        "workload": demo.workload.describe(), "ranks": demo.ranks, "copies": demo.copies,
        "interval": demo.interval, "model": models[0].name(), "off_ms": off, "on_ms": on,
        "ratio": on / off, "models": per_model,
        "runs_off": variants[0].runs, "runs_on": variants[1].runs, "across": across,
        "recovery": recovery,
    });
    if let Some(dir) = json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(json, serde_json::to_string_pretty(&result)? + "\n")
        .with_context(|| format!("writing {}", json.display()))?;
    eprintln!("[bench uts] wrote {}", json.display());
    Ok(())
}

/// Prints and returns each model's checkpointing overhead (on over off) and its time without
/// checkpoints against the first model's, from one host's `variants` (off and on per model).
fn model_overheads(variants: &[Variant]) -> Vec<serde_json::Value> {
    let first_off = variants[0].median_ms();
    let mut out = Vec::new();
    for pair in variants.chunks(2) {
        let (off, on) = (pair[0].median_ms(), pair[1].median_ms());
        let (model, vs_first) = (pair[0].model.name(), off / first_off);
        println!(
            "{model}: checkpointing overhead {:.3}x ({:+.1} %); without checkpoints {vs_first:.2}x the time of {}",
            on / off,
            (on / off - 1.0) * 100.0,
            variants[0].model.name()
        );
        out.push(serde_json::json!({
            "model": model, "off_ms": off, "on_ms": on, "ratio": on / off,
            "off_vs_first_model": vs_first, "runs_off": pair[0].runs, "runs_on": pair[1].runs,
        }));
    }
    out
}

/// Prints and returns the rate across hosts against one host (one host's median over the
/// simulated hosts' median, per variant: 1 is as fast).
fn across_hosts(plan: &BenchPlan, one_host: [f64; 2], remote: &[Variant]) -> serde_json::Value {
    let hosts = plan.across.unwrap_or(1);
    let [off, on] = [0, 1].map(|i| remote.get(i).map_or(f64::NAN, Variant::median_ms));
    let rate = [one_host[0] / off, one_host[1] / on];
    println!(
        "rate over {hosts} hosts / one host: checkpointing off {:.2}x, on {:.2}x",
        rate[0], rate[1]
    );
    serde_json::json!({
        "hosts": hosts, "off_ms": off, "on_ms": on,
        "rate_off": rate[0], "rate_on": rate[1],
        "runs_off": remote.first().map(|v| &v.runs), "runs_on": remote.get(1).map(|v| &v.runs),
    })
}

fn ms(at: Duration) -> f64 {
    at.as_secs_f64() * 1e3
}

/// Sends `signal` (`-STOP`, `-CONT`) to a rank of this driver's job, which must still run.
/// How many simulated hosts the demo runs on; `--stop-host` needs 2 or more.
fn simulated_hosts(demo: &Demo) -> Result<usize> {
    let hosts = match &demo.hosts {
        Some(hosts) => hosts.clone(),
        None => crate::cluster::Hosts::from_env()?,
    };
    match hosts {
        crate::cluster::Hosts::Simulated(n) if n >= 2 => Ok(n),
        _ => bail!("--stop-host needs 2 or more simulated hosts (--nodes N)"),
    }
}

/// The ranks among `candidates` on `rank`'s simulated host, `rank` among them.
fn host_mates(
    job: &crate::launch::RunningJob,
    pids: &HashMap<usize, u32>,
    candidates: &[usize],
    rank: usize,
) -> Result<Vec<usize>> {
    let cluster = job.cluster().context("--stop-host needs simulated hosts (--nodes)")?;
    let host = cluster.host_of(pids[&rank]);
    ensure!(host.is_some(), "the host of rank {rank} is not known");
    Ok(candidates.iter().copied().filter(|r| cluster.host_of(pids[r]) == host).collect())
}

fn signal(pid: u32, signal: &str) -> Result<()> {
    ensure!(crate::launch::signal_pid(pid, signal)?, "process {pid} exited before kill {signal}");
    Ok(())
}

/// Whether a line of a rank that ended itself says why: ftkv's own messages, Open MPI's
/// verdict on a rank its detector declared dead, and Open MPI's report of a fatal signal.
fn says_why_it_ended(line: &str) -> bool {
    line.starts_with("ftkv:")
        || line.contains("I have been reported dead")
        || line.contains("*** Process received signal")
        || line.contains("] Signal: ")
}

/// One recovery mode of `ftkv bench uts --kills`: the medians over its runs.
#[derive(Debug, Clone, Serialize)]
pub struct RecoveryRow {
    pub mode: &'static str,
    pub runs: Vec<RunReport>,
    pub median_ms: f64,
    /// Median over the runs of [`RunReport::uninvolved_rate_ratio`].
    pub median_rate_ratio: Option<f64>,
    /// Median over the runs of the slowest survivor's first recovery (ms).
    pub median_recovery_ms: Option<f64>,
}

/// Runs the tree with `kills` workers SIGKILLed, `repeat` times with global and with
/// localized recovery (alternating), and prints the task rate of the workers that adopted
/// nothing in the [`RATE_WINDOW`] after the first kill over the one before it.
fn recovery_rows(exe: &Path, demo: &Demo, repeat: usize, kills: usize) -> Result<Vec<RecoveryRow>> {
    let mut rows: Vec<(bool, Vec<RunReport>)> = vec![(false, Vec::new()), (true, Vec::new())];
    let progress = Progress::new("bench uts", Some(2 * repeat as u64));
    for i in 0..repeat {
        for (localized, runs) in rows.iter_mut() {
            let run =
                Demo { kills, localized: *localized, seed: demo.seed + i as u64, ..demo.clone() };
            let report = run_pool_job(exe, &run, false)?;
            ensure!(report.matches_published != Some(false), "wrong result: {report:?}");
            progress.line(&format!(
                "{}/{repeat} {} recovery, {kills} kills: {:.1} ms, rate ratio {:?}, recoveries {:?}",
                i + 1,
                if *localized { "localized" } else { "global" },
                report.wall_ms,
                report.uninvolved_rate_ratio,
                report.recoveries
            ));
            runs.push(report);
            progress.advance_to(2 * i as u64 + 1 + u64::from(*localized));
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (!v.is_empty()).then(|| v[v.len() / 2])
    };
    println!(
        "\n| recovery | median ms | uninvolved rate during/before | first recovery ms | runs |"
    );
    println!("|---|---|---|---|---|");
    let mut out = Vec::new();
    for (localized, runs) in rows {
        let row = RecoveryRow {
            mode: if localized { "localized" } else { "global" },
            median_ms: median(runs.iter().map(|r| r.wall_ms).collect()).unwrap_or(0.0),
            median_rate_ratio: median(
                runs.iter().filter_map(|r| r.uninvolved_rate_ratio).collect(),
            ),
            median_recovery_ms: median(
                runs.iter().filter_map(|r| r.recoveries.first()).map(|r| r.1).collect(),
            ),
            runs,
        };
        let show =
            |v: Option<f64>, digits: usize| v.map_or("-".into(), |v| format!("{v:.digits$}"));
        println!(
            "| {} | {:.1} | {} | {} | {} |",
            row.mode,
            row.median_ms,
            show(row.median_rate_ratio, 2),
            show(row.median_recovery_ms, 1),
            row.runs.len()
        );
        out.push(row);
    }
    Ok(out)
}
