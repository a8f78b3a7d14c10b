//! `ftkv chaos`: randomized SIGKILL campaigns under real `mpirun --with-ft ulfm`, checked
//! against the history of acknowledged writes, with global or localized recovery
//! (`--recovery`), whole simulated hosts SIGKILLed (`--kill-host`) and a rank SIGSTOPped past
//! the suspicion bound (`--stop`).
//!
//! Who died is what the survivors agreed on (their [`DoneReport`]s), not what the driver
//! killed: a rank killed from outside counts like one the driver killed, and so does one that
//! ended itself as a fail-stop failure.
//!
//! Every rank loops put/delete on its own keys with self-describing values (`values`), printing
//! a [`WriteReport`] before and again after each acknowledged write (`write {json}` lines). The
//! driver SIGKILLs ranks from outside at random moments (every second kill as soon as a
//! survivor reports that it is recovering, or with localized recovery that it noticed the
//! failure), then reads every survivor's [`FinalRead`]s and judges each key ([`oracle`]): the
//! value must be the last acknowledged write or one tried after it (in flight at a death),
//! never older, never torn; a dead owner's key may be lost only when a recovery reported it.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ftkv::Recovery;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use ftkv_launch::args::{self, Opt};
use ftkv_launch::cluster::Hosts;
use ftkv_launch::launch::{kill_random_rank, union_of_failed, JobOutput, Launch, RunningJob};
use ftkv_launch::rank_errors::find_rank_error;
pub use ftkv_sim::history::{allowed, Observed, Op};

pub mod faults;
pub mod oracle;
mod rank;

use faults::{HostKill, Moment, Stall, StallOutcome};
use oracle::{judge_key, may_lose_keys, KeyVerdict, Owner};
pub use rank::{
    failed_workers, finish, meet, meet_joining_recoveries, rank_main, recover, RankArgs,
};

/// Campaign parameters.
#[derive(Debug, Clone)]
pub struct Campaign {
    pub runs: usize,
    pub ranks: usize,
    pub copies: usize,
    pub kills: usize,
    pub seed: u64,
    pub duration: Duration,
    /// Cut one simulated host's link this long after the start (needs `--nodes`); restored once
    /// the other hosts' ranks are done.
    pub cut_link: Option<Duration>,
    /// Limit every simulated host's link to this `tc` rate (e.g. `200mbit`), with up to 20 ms
    /// of queueing delay (the kernel's token bucket: this machine's kernel has no netem).
    pub slow_links: Option<String>,
    /// Directory that receives the whole transcript of every failed run (`seed-<seed>.txt`).
    pub transcripts: Option<std::path::PathBuf>,
    /// How the ranks' store repairs failures.
    pub recovery: Recovery,
    /// SIGSTOP one random rank this long after the start, for [`STALL_LENGTH`] (longer than
    /// the suspicion bound [`STOP_SUSPICION`]), then SIGCONT it.
    pub stop: Option<Duration>,
    /// SIGKILL every rank of one simulated host at once, at a random moment (needs
    /// `--nodes` 2 or more).
    pub kill_host: bool,
}

/// The suspicion bound of runs with `--stop`: Open MPI's heartbeat detector declares a rank
/// silent this long failed, and the store's own check ends a rank that did not run for half of
/// it (the bound `tests/failures.rs` tests the demo's stop with).
pub const STOP_SUSPICION: Duration = Duration::from_secs(3);

/// How long a `--stop` keeps its rank stopped: twice the suspicion bound, so the detector has
/// declared it well before it runs again.
pub const STALL_LENGTH: Duration = Duration::from_secs(6);

/// The campaign's summary (the JSON `ftkv chaos --json` writes).
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Summary {
    pub runs: usize,
    pub kills: usize,
    pub acked_writes: u64,
    pub lost_writes: u64,
    pub torn_reads: u64,
    pub hangs: usize,
    /// Keys a recovery reported lost (every holder died before the copies were restored). Not
    /// a silent loss: only allowed when the run killed at least `copies` ranks.
    pub keys_reported_lost: u64,
    /// Keys that recoveries reported lost, the largest count of any survivor per run summed;
    /// a live owner writes its lost key again, so these need not be lost at the end.
    pub keys_lost_in_recovery: u64,
    /// Ranks that ended themselves as fail-stop failures (a recovery call stuck or crashed
    /// inside Open MPI, a watchdog), with the evidence on their stderr.
    pub fail_stops: usize,
    /// Failures that neither the driver nor a fail-stop caused (a rank killed from outside),
    /// learnt from the survivors' agreed failed set.
    pub outside_failures: usize,
    /// Runs in which a recovery attempt stayed stuck inside Open MPI until the recovery
    /// deadline ended its ranks (each names the step); counted apart from lost data.
    pub stuck_runs: usize,
    /// Runs started again: `mpirun` could not start them, or (with `--cut-link`) they failed
    /// before the link was cut.
    pub restarted_runs: usize,
    /// Ranks of cut-off hosts (`--cut-link`).
    pub cut_off: usize,
    /// Of those, ranks that ended because their side held no majority (the others were ended
    /// by the runtime).
    pub fenced: usize,
    /// Ranks of a cut-off host that finished as if they were the store (a split brain).
    pub split_brain: usize,
    /// Hosts whose ranks were all SIGKILLed at once (`--kill-host`).
    pub host_kills: usize,
    /// Ranks SIGSTOPped past the suspicion bound (`--stop`).
    pub stalls: usize,
    /// Of those, ranks that were not declared failed, rejoined, ended without saying why or
    /// late, or were declared beside a healthy rank.
    pub stall_failures: usize,
    /// Per stalled rank the survivors ended while stopped: milliseconds from its stop to its
    /// end.
    pub stall_ended_after_ms: Vec<u64>,
    /// Stalls beside which a healthy rank was declared failed.
    pub healthy_declared: usize,
    /// Reads of a key as lost that no recovery reported, or of a live owner's key that its
    /// owner had not written again.
    pub unaccounted_losses: u64,
    /// Reads judged on localized stores before the final global recovery (`final_local`).
    pub local_reads: u64,
    pub failed_runs: usize,
}

impl Campaign {
    pub fn validate(&self) -> Result<()> {
        let ranks = Opt::new("--ranks", self.ranks);
        args::check_copies(Opt::new("--copies", self.copies), ranks)?;
        args::check_kills(Opt::new("--kills", self.kills), ranks)?;
        ensure!(self.runs >= 1, "--runs {} must be at least 1", self.runs);
        if let Some(at) = self.cut_link {
            ensure!(
                at < self.duration,
                "--cut-link {at:?} must fall inside the run's --duration {:?}",
                self.duration
            );
            let nodes = Hosts::from_env()?;
            ensure!(
                matches!(nodes, Hosts::Simulated(n) if n >= 3),
                "--cut-link needs --nodes 3 or more (a majority must stay connected)"
            );
        }
        if let Some(at) = self.stop {
            ensure!(self.cut_link.is_none(), "--stop and --cut-link cannot be combined");
            ensure!(
                at < self.duration,
                "--stop {at:?} must fall inside the run's --duration {:?}",
                self.duration
            );
            let failures = Opt::new("--kills (with --stop)", self.kills + 1);
            args::check_kills(failures, ranks)?;
        }
        if self.kill_host {
            self.validate_host_kill()?;
        }
        Ok(())
    }

    /// `--kill-host` needs simulated hosts, 2 or more, and must leave at least 2 ranks after
    /// the largest host and the single kills are gone.
    fn validate_host_kill(&self) -> Result<()> {
        let Hosts::Simulated(nodes) = Hosts::from_env()? else {
            bail!("--kill-host needs simulated hosts: --nodes 2 or more");
        };
        ensure!(nodes >= 2, "--kill-host needs --nodes 2 or more, got --nodes {nodes}");
        let largest = self.ranks.div_ceil(nodes);
        let gone = largest + self.kills + usize::from(self.stop.is_some());
        ensure!(
            gone + 2 <= self.ranks,
            "--kill-host on --nodes {nodes} ({largest} ranks per host) with --kills {} must leave \
             at least 2 of --ranks {} alive",
            self.kills,
            self.ranks
        );
        Ok(())
    }
}

/// Runs the campaign, one `mpirun` job per run, printing a line per run (above a progress
/// bar on a terminal).
pub fn run(exe: &std::path::Path, campaign: &Campaign) -> Result<Summary> {
    campaign.validate()?;
    let mut summary = Summary::default();
    let progress = ftkv_launch::progress::Progress::new("chaos", Some(campaign.runs as u64));
    for run in 0..campaign.runs {
        let seed = campaign.seed.wrapping_add(run as u64);
        let (result, restarts) = run_once(exe, campaign, seed)?;
        summary.restarted_runs += restarts;
        summary.runs += 1;
        summary.kills += result.kills;
        summary.acked_writes += result.verdict.acked;
        summary.lost_writes += result.verdict.lost;
        summary.torn_reads += result.verdict.torn;
        summary.hangs += result.hung as usize;
        summary.keys_reported_lost += result.verdict.reported_lost;
        summary.fail_stops += result.fail_stops;
        summary.outside_failures += result.outside;
        summary.stuck_runs += result.stuck as usize;
        summary.cut_off += result.cut;
        summary.fenced += result.fenced;
        summary.split_brain += result.split_brain;
        summary.keys_lost_in_recovery += result.lost_in_recovery;
        summary.host_kills += usize::from(result.host_killed);
        summary.stalls += usize::from(result.stall.is_some());
        summary.stall_failures += usize::from(result.stall_failed());
        summary.stall_ended_after_ms.extend(result.stall.and_then(|s| s.ended_after_ms));
        summary.healthy_declared += usize::from(result.stall.is_some_and(|s| s.healthy_declared));
        summary.unaccounted_losses += result.verdict.unaccounted;
        summary.local_reads += result.verdict.local_reads;
        let failed = result.failed(campaign.copies);
        summary.failed_runs += failed as usize;
        progress.line(&format!("{:>3}/{} seed={seed} {}", run + 1, campaign.runs, result.line()));
        progress.advance_to(run as u64 + 1);
        if failed || result.fail_stops > 0 || result.stuck {
            progress.line(&result.transcript_tail);
            if let Some(dir) = &campaign.transcripts {
                let path = dir.join(format!("seed-{seed}.txt"));
                std::fs::create_dir_all(dir)
                    .and_then(|()| std::fs::write(&path, &result.transcript))
                    .with_context(|| format!("writing {}", path.display()))?;
                progress.line(&format!("  transcript: {}", path.display()));
            }
        }
    }
    Ok(summary)
}

struct RunResult {
    kills: usize,
    verdict: Verdict,
    hung: bool,
    /// A survivor did not finish and left no evidence of a fail-stop.
    unexplained: bool,
    none_finished: bool,
    fail_stops: usize,
    outside: usize,
    stuck: bool,
    /// The most workers one recovery reported failed (failures between two recoveries).
    widest_recovery: usize,
    lost_in_recovery: u64,
    /// Ranks of the cut host.
    cut: usize,
    /// Ranks of the cut host that ended because their side held no majority.
    fenced: usize,
    /// Ranks of the cut host that finished as the store.
    split_brain: usize,
    /// A host's ranks were SIGKILLed at once.
    host_killed: bool,
    /// The only failures injected were one host's ranks: no key may be lost.
    host_kill_only: bool,
    /// What became of the rank stopped past the suspicion bound.
    stall: Option<StallOutcome>,
    transcript_tail: String,
    transcript: String,
}

impl RunResult {
    /// Whether the run's stall (if any) was not handled as it must be ([`StallOutcome::ok`]).
    fn stall_failed(&self) -> bool {
        self.stall.is_some_and(|s| !s.ok(STOP_SUSPICION))
    }

    /// Whether the run shows a defect: a hang, silently lost or torn data, a key reported lost
    /// although no recovery saw `copies` failures, or a survivor missing without evidence. A
    /// run whose survivors all ended stuck inside Open MPI's recovery counts apart.
    fn failed(&self, copies: usize) -> bool {
        let v = &self.verdict;
        let may_lose = may_lose_keys(copies, self.widest_recovery, self.host_kill_only);
        let unexplained_loss = v.reported_lost > 0 && !may_lose;
        self.hung
            || self.split_brain > 0
            || v.lost + v.torn + v.unaccounted > 0
            || self.stall_failed()
            || unexplained_loss
            || self.unexplained
            || (self.none_finished && !self.stuck)
    }

    /// The run's progress line after the seed.
    fn line(&self) -> String {
        let mut kills = self.kills.to_string();
        if self.fail_stops > 0 {
            kills += &format!("+{} fail-stop", self.fail_stops);
        }
        if self.outside > 0 {
            kills += &format!("+{} outside", self.outside);
        }
        if self.cut > 0 {
            kills += &format!(" cut={} fenced={}", self.cut, self.fenced);
        }
        if self.host_killed {
            kills += " (a host)";
        }
        if let Some(s) = self.stall {
            kills += &format!(
                " stall(declared={} ended_itself={} ended_by_survivors={} ended_after_ms={:?} healthy_declared={} rejoined={})",
                s.declared, s.ended_itself, s.ended_by_survivors, s.ended_after_ms, s.healthy_declared, s.rejoined
            );
        }
        let v = &self.verdict;
        let verdict = match (self.hung, self.stuck, self.unexplained || self.none_finished) {
            (true, _, _) => "HANG",
            (false, true, _) => "STUCK in recovery (Open MPI)",
            (false, false, true) => "INCOMPLETE",
            _ => "ok",
        };
        format!(
            "kills={kills} acked={} lost={} torn={} reported_lost={} unaccounted={} {verdict}",
            v.acked, v.lost, v.torn, v.reported_lost, v.unaccounted
        )
    }
}

/// One run; started again (same seed) when `mpirun` could not start it at all, and, with
/// `--cut-link`, when the job failed before the link was cut: Open MPI's heartbeat detector
/// can hang a loaded start-up or declare a live rank dead in it, which is not the cut under
/// test (each restart is printed and counted in `restarted_runs`).
fn run_once(exe: &std::path::Path, campaign: &Campaign, seed: u64) -> Result<(RunResult, usize)> {
    let mut restarts = 0;
    let who = format!("[chaos] seed={seed}");
    let result = ftkv_launch::launch::with_start_retries(&who, || {
        let (result, start) = run_attempt(exe, campaign, seed)?;
        let why = match start {
            Start::Ran => return Ok((result, None)),
            Start::NeverStarted => "mpirun could not start the job",
            Start::FailedBeforeCut => {
                "the job failed before the link was cut (start-up with the detector on)"
            }
        };
        restarts += 1;
        Ok((result, Some(why.to_owned())))
    })?;
    Ok((result, restarts.min(ftkv_launch::launch::START_ATTEMPTS - 1)))
}

/// How far a run got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// `mpirun` failed before any rank ran.
    NeverStarted,
    /// With `--cut-link`: the run failed before its link was cut.
    FailedBeforeCut,
    Ran,
}

fn run_attempt(
    exe: &std::path::Path,
    campaign: &Campaign,
    seed: u64,
) -> Result<(RunResult, Start)> {
    let mut job = rank_launch(exe, campaign, seed).spawn()?;
    if let Some(rate) = &campaign.slow_links {
        let Some(cluster) = job.cluster() else { bail!("--slow-links needs --nodes") };
        cluster.throttle_links(rate, "20ms")?;
    }
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut faults = Faults::plan(&mut rng, campaign);
    while let Some(line) = job.next_line(Duration::from_millis(2)).or_else(|| idle(&mut job)) {
        faults.step(&job, &line, campaign.ranks, &mut rng)?;
    }
    if let Some(stall) = &mut faults.stall {
        stall.job_ended(job.elapsed());
    }
    let restored = faults.cut.as_mut().map(|c| c.restore(&job)).transpose()?;
    let out = job.finish()?;
    let mut result = classify(&out, campaign.ranks, &faults.faulted());
    faults.judge(&out, campaign, &mut result, restored == Some(true));
    let cut_missed = faults.cut.as_ref().is_some_and(|c| c.host.is_none());
    let start = if out.never_started() {
        Start::NeverStarted
    } else if cut_missed && result.failed(campaign.copies) {
        Start::FailedBeforeCut
    } else {
        Start::Ran
    };
    Ok((result, start))
}

/// The `mpirun` job of one run: the rank program with the campaign's store settings, and
/// Open MPI's heartbeat detector when a link is cut or a rank stopped.
fn rank_launch(exe: &std::path::Path, campaign: &Campaign, seed: u64) -> Launch {
    let mut args = vec![
        "chaos-rank".to_owned(),
        campaign.copies.to_string(),
        campaign.duration.as_millis().to_string(),
        seed.to_string(),
        "--watchdog-ms".to_owned(),
        watchdog_for(campaign).as_millis().to_string(),
    ];
    if campaign.recovery == Recovery::Localized {
        args.push("--localized".to_owned());
    }
    if campaign.stop.is_some() {
        args.extend(["--suspicion-ms".to_owned(), STOP_SUSPICION.as_millis().to_string()]);
    }
    let stall =
        if campaign.stop.is_some() { STALL_LENGTH + STOP_SUSPICION } else { Duration::ZERO };
    let launch = Launch::new(exe, campaign.ranks)
        .args(args)
        .env("FTKV_TRACE", "1")
        .timeout(campaign.duration + Duration::from_secs(40) + stall);
    if campaign.cut_link.is_some() {
        with_failure_detector(launch)
    } else if campaign.stop.is_some() {
        launch.suspicion_detector(STOP_SUSPICION)
    } else {
        launch
    }
}

/// Every fault planned for one run and what became of it.
struct Faults {
    killer: Killer,
    host: Option<HostKill>,
    stall: Option<Stall>,
    cut: Option<LinkCut>,
    /// Single kills were planned besides a host kill or a stall.
    single_kills: bool,
}

impl Faults {
    /// Draws the run's faults from `rng` (single kills first, so a seed kills as it did before
    /// host kills existed).
    fn plan(rng: &mut SmallRng, campaign: &Campaign) -> Faults {
        let killer = Killer::plan(rng, campaign);
        let host = campaign.kill_host.then(|| HostKill::planned(rng, campaign.duration));
        let stall = campaign.stop.map(|at| Stall::planned(at, STALL_LENGTH));
        let cut = campaign.cut_link.map(LinkCut::planned);
        Faults { killer, host, stall, cut, single_kills: campaign.kills > 0 }
    }

    /// Takes in one output line and injects whatever fault is due.
    fn step(
        &mut self,
        job: &RunningJob,
        line: &(Option<usize>, String),
        ranks: usize,
        rng: &mut SmallRng,
    ) -> Result<()> {
        self.killer.observe(line, job.elapsed(), ranks);
        let Some(since_ready) = self.killer.since_ready(job.elapsed()) else { return Ok(()) };
        let stalled = self.stall.as_ref().and_then(Stall::rank);
        self.killer.maybe_kill(since_ready, rng, stalled)?;
        if let Some(host) = &mut self.host {
            let gone = self.killer.killed.iter().copied().chain(stalled).collect::<Vec<_>>();
            let pids = &self.killer.pids;
            let moment = Moment { job, since_ready, pids, dead: &gone, ranks };
            let killed = host.step(&moment, rng)?;
            self.killer.killed.extend(killed);
        }
        if let Some(stall) = &mut self.stall {
            let (pids, dead) = (&self.killer.pids, &self.killer.killed);
            stall.step(&Moment { job, since_ready, pids, dead, ranks }, rng)?;
        }
        if let Some(cut) = &mut self.cut {
            cut.observe(line);
            cut.step(job, since_ready, &self.killer, ranks, rng)?;
        }
        Ok(())
    }

    /// The ranks this driver took out: SIGKILLed (alone or with their host) or stopped.
    fn faulted(&self) -> Vec<usize> {
        let stalled = self.stall.as_ref().and_then(Stall::rank);
        self.killer.killed.iter().copied().chain(stalled).collect()
    }

    /// Completes `result` with what the host kill, the stall and the cut did. A planned host
    /// kill or stall that never happened leaves the run unexplained.
    fn judge(&self, out: &JobOutput, campaign: &Campaign, result: &mut RunResult, cut: bool) {
        result.kills = self.killer.killed.len();
        let host_killed = self.host.as_ref().is_some_and(|h| h.host.is_some());
        result.host_killed = host_killed;
        let others = self.single_kills || self.stall.is_some() || self.cut.is_some();
        result.host_kill_only = host_killed && !others;
        if let Some(stall) = &self.stall {
            let agreed = agreed_failed(out, campaign.ranks);
            result.stall = stall.outcome(out, &agreed, &self.killer.killed);
            result.unexplained |= result.stall.is_none();
        }
        result.unexplained |= self.host.is_some() && !host_killed;
        if let Some(link) = &self.cut {
            link.judge(out, campaign.ranks, result, cut);
        }
    }
}

/// The store's watchdog bound: the default; with a stopped rank, 2 s more than the suspicion
/// bound (a put to a silent holder waits until the detector declares it, as in `ftkv demo
/// --stop`); with a cut link long enough for the failure detector to declare every rank of
/// the cut host failed (it declares one after another, each after its own timeout), so that
/// the watchdog does not end the writers on the connected side.
fn watchdog_for(campaign: &Campaign) -> Duration {
    match (campaign.cut_link, campaign.stop) {
        (Some(_), _) => Duration::from_secs(8),
        (None, Some(_)) => STOP_SUSPICION + Duration::from_secs(2),
        (None, None) => ftkv::Config::new(["checkpoint"], 1).watchdog,
    }
}

/// Open MPI's heartbeat detector: a cut-off host sends no error, only silence, and nothing
/// else in Open MPI declares its ranks failed. A peer is declared failed after 2 s without a
/// heartbeat (one every 0.5 s; with 1 s the detector declared a live rank dead during a loaded
/// start-up once in about 10 campaigns).
fn with_failure_detector(launch: Launch) -> Launch {
    launch.heartbeat_detector(Duration::from_millis(500), Duration::from_secs(2))
}

/// How long a link stays cut at most when the other hosts' ranks do not finish.
const CUT_BOUND: Duration = Duration::from_secs(25);

/// One host's link, cut at a planned moment and restored once the ranks of the other hosts
/// finished (or after [`CUT_BOUND`]), so that the cut host's daemon reaches `mpirun` again.
struct LinkCut {
    at: Duration,
    host: Option<usize>,
    cut_ranks: Vec<usize>,
    cut_since: Option<Instant>,
    done: Vec<usize>,
    restored: bool,
}

impl LinkCut {
    fn planned(at: Duration) -> LinkCut {
        let (host, cut_ranks, cut_since, done) = (None, Vec::new(), None, Vec::new());
        LinkCut { at, host, cut_ranks, cut_since, done, restored: false }
    }

    fn observe(&mut self, (rank, text): &(Option<usize>, String)) {
        if let Some(rank) = rank {
            if text.starts_with("done {") || text.starts_with("error") {
                self.done.push(*rank);
            }
        }
    }

    /// Cuts when due (a random host other than rank 0's), restores when the others are done.
    fn step(
        &mut self,
        job: &RunningJob,
        since_ready: Duration,
        killer: &Killer,
        ranks: usize,
        rng: &mut SmallRng,
    ) -> Result<()> {
        let Some(cluster) = job.cluster() else { bail!("--cut-link needs simulated hosts") };
        if self.host.is_none() && since_ready >= self.at {
            let host_of = |r: &usize| killer.pids.get(r).and_then(|pid| cluster.host_of(*pid));
            let spared = host_of(&0);
            let holds_ranks = |h: &usize| (0..ranks).any(|r| host_of(&r) == Some(*h));
            let candidates: Vec<usize> = (0..cluster.hosts().len())
                .filter(|h| Some(*h) != spared && holds_ranks(h))
                .collect();
            if candidates.is_empty() {
                bail!("--cut-link needs a host without rank 0 that holds ranks");
            }
            let host = candidates[rng.gen_range(0..candidates.len())];
            self.cut_ranks = (0..ranks).filter(|r| host_of(r) == Some(host)).collect();
            cluster.set_link(host, false)?;
            let at = job.elapsed().as_secs_f64();
            eprintln!("[chaos] {at:.1} s: cut host {host}'s link (ranks {:?})", self.cut_ranks);
            self.host = Some(host);
            self.cut_since = Some(Instant::now());
        }
        let Some(since) = self.cut_since else { return Ok(()) };
        let others: Vec<usize> = (0..ranks)
            .filter(|r| !self.cut_ranks.contains(r) && !killer.killed.contains(r))
            .collect();
        let others_done = others.iter().all(|r| self.done.contains(r));
        if !self.restored && (others_done || since.elapsed() >= CUT_BOUND) {
            self.restore(job)?;
        }
        Ok(())
    }

    /// Brings the link back up (idempotent); `true` when it was cut.
    fn restore(&mut self, job: &RunningJob) -> Result<bool> {
        let (Some(host), Some(cluster)) = (self.host, job.cluster()) else { return Ok(false) };
        if !std::mem::replace(&mut self.restored, true) {
            cluster.set_link(host, true)?;
            eprintln!("[chaos] {:.1} s: restored host {host}'s link", job.elapsed().as_secs_f64());
        }
        Ok(true)
    }

    /// The cut host's ranks must never finish as the store: each ends, because its side held
    /// no majority (`fenced`), through its own watchdog or recovery deadline while cut off
    /// (not counted as a fail-stop), or because the runtime ended it once the link came back
    /// (Open MPI's runtime ends a job whose daemon it lost touch with). Their acknowledged writes
    /// are judged with everyone else's. A link never cut fails the run.
    fn judge(
        &self,
        out: &ftkv_launch::launch::JobOutput,
        ranks: usize,
        result: &mut RunResult,
        was_cut: bool,
    ) {
        let fenced = |r: &usize| out.own_stderr(*r).any(|l| l.contains("holds no majority"));
        let finished = |r: &usize| done_report(out, *r).is_some();
        result.fenced = self.cut_ranks.iter().filter(|r| fenced(r)).count();
        result.split_brain = self.cut_ranks.iter().filter(|r| finished(r)).count();
        result.cut = self.cut_ranks.len();
        let agreed = agreed_failed(out, ranks);
        let counted_outside = |r: &&usize| agreed.contains(r) && !out.ended_itself(**r);
        result.outside -= self.cut_ranks.iter().filter(counted_outside).count().min(result.outside);
        let ended_itself = self.cut_ranks.iter().filter(|r| out.ended_itself(**r)).count();
        result.fail_stops = result.fail_stops.saturating_sub(ended_itself);
        if !was_cut || self.cut_ranks.is_empty() {
            result.unexplained = true;
        }
    }
}

/// Judges one run's output: who died (the driver's kills and the survivors' agreed failed
/// set), who finished, and what the finished survivors read.
fn classify(out: &ftkv_launch::launch::JobOutput, ranks: usize, killed: &[usize]) -> RunResult {
    let histories = parse_histories(out, ranks);
    let agreed_failed = agreed_failed(out, ranks);
    let dead = |r: &usize| killed.contains(r) || agreed_failed.contains(r);
    let survivors: Vec<usize> = (0..ranks).filter(|r| !dead(r)).collect();
    let (finished, unfinished): (Vec<usize>, Vec<usize>) =
        survivors.iter().partition(|&&r| done_report(out, r).is_some());
    let not_killed = (0..ranks).filter(|r| !killed.contains(r));
    let ended: Vec<usize> = not_killed.filter(|r| !finished.contains(r)).collect();
    let fail_stop = |r: &&usize| ended_as_fail_stop(out, **r);
    let outside = ended.iter().filter(|r| agreed_failed.contains(r) && !fail_stop(r)).count();
    let recoveries = recoveries(out, ranks);
    RunResult {
        cut: 0,
        fenced: 0,
        split_brain: 0,
        host_killed: false,
        host_kill_only: false,
        stall: None,
        kills: killed.len(),
        verdict: judge_all(&histories, &finished, ranks, &recoveries.lost_keys),
        hung: out.timed_out,
        unexplained: !unfinished.iter().all(|&r| ended_as_fail_stop(out, r)),
        none_finished: finished.is_empty(),
        fail_stops: ended.iter().filter(fail_stop).count(),
        outside,
        stuck: ended.iter().any(|&r| ended_stuck_in_recovery(out, r)),
        widest_recovery: recoveries.widest,
        lost_in_recovery: recoveries.lost_in_recovery,
        transcript_tail: diagnose(out, killed, &unfinished),
        transcript: out.transcript(),
    }
}

/// What the recoveries of one run reported, over every rank's [`RecoveryReport`]s.
#[derive(Debug, Default)]
struct Recoveries {
    /// The most workers one recovery reported failed.
    widest: usize,
    /// The most keys any one survivor heard reported lost in all.
    lost_in_recovery: u64,
    /// Every key any recovery reported lost.
    lost_keys: BTreeSet<(i32, u16)>,
}

/// Reads every rank's [`RecoveryReport`]s; a report that does not parse counts as none (the
/// rank died while writing it).
fn recoveries(out: &JobOutput, ranks: usize) -> Recoveries {
    let mut all = Recoveries::default();
    for rank in 0..ranks {
        let reports: Vec<RecoveryReport> = out.rank_reports(rank, "recovery").unwrap_or_default();
        all.widest = reports.iter().map(|r| r.failed.len()).fold(all.widest, usize::max);
        let lost = reports.iter().map(|r| r.lost_keys.len() as u64).sum();
        all.lost_in_recovery = all.lost_in_recovery.max(lost);
        all.lost_keys.extend(reports.iter().flat_map(|r| r.lost_keys.iter().copied()));
    }
    all
}

/// Rank `rank`'s [`DoneReport`], if it finished (and wrote one that parses).
pub fn done_report(out: &JobOutput, rank: usize) -> Option<DoneReport> {
    out.rank_report(rank, "done").ok().flatten()
}

/// The failed workers the finished ranks agreed on (the union of their [`DoneReport`]s),
/// sorted, without repeats.
pub fn agreed_failed(out: &JobOutput, ranks: usize) -> Vec<usize> {
    union_of_failed((0..ranks).filter_map(|r| done_report(out, r)).flat_map(|d| d.failed))
}

/// Who was killed, the ranks' errors (each message once), and for each survivor that did not
/// finish its last lines and the rest of its stderr.
fn diagnose(
    out: &ftkv_launch::launch::JobOutput,
    killed: &[usize],
    unfinished: &[usize],
) -> String {
    let mut text = format!("  killed ranks {killed:?}, unfinished survivors {unfinished:?}\n");
    for line in out.errors_said_once() {
        text += &format!("  {line}\n");
    }
    let untagged = out.stderr.lines().filter(|l| !l.trim().is_empty() && !l.starts_with("[1,"));
    for line in untagged.filter(|l| !l.contains("help message")).take(10) {
        text += &format!("  [mpirun] {line}\n");
    }
    for &rank in unfinished {
        let lines = out.rank_lines(rank);
        for line in &lines[lines.len().saturating_sub(6)..] {
            text += &format!("  [rank {rank}] {line}\n");
        }
        let said = |l: &&str| find_rank_error(l).is_some();
        let own: Vec<&str> =
            out.own_stderr(rank).filter(|l| is_own_diagnostic(l) && !said(l)).collect();
        for line in &own[own.len().saturating_sub(20)..] {
            text += &format!("  [rank {rank} stderr] {line}\n");
        }
    }
    text
}

fn ended_as_fail_stop(out: &ftkv_launch::launch::JobOutput, rank: usize) -> bool {
    out.ended_itself(rank)
}

/// Whether `rank` was ended by the recovery deadline (a recovery attempt stuck inside Open MPI).
fn ended_stuck_in_recovery(out: &ftkv_launch::launch::JobOutput, rank: usize) -> bool {
    out.own_stderr(rank)
        .map(str::trim)
        .any(|l| l.starts_with("ftkv:") && l.contains("recovery attempt has not ended"))
}

/// Whether a rank's stderr line comes from ftkv or the Rust runtime rather than from Open MPI's
/// fault-tolerance banners.
fn is_own_diagnostic(line: &str) -> bool {
    let line = line.trim_start();
    let own = ["ftkv", "Error", "thread", "note:"].iter().any(|p| line.starts_with(p));
    own || line.contains("*** Process received signal") || line.contains("Signal: ")
}

/// A pseudo-line that keeps the loop going while the job is silent but still running.
fn idle(job: &mut RunningJob) -> Option<(Option<usize>, String)> {
    job.is_running().then(|| (None, String::new()))
}

/// When and whom to kill.
struct Killer {
    /// The ranks' pids, which each prints once its store exists.
    pids: HashMap<usize, u32>,
    /// When (job time) the last rank printed its pid: every fault counts from there, since a
    /// death inside `MPI_Init` or the store's creation ends any job.
    ready: Option<Duration>,
    killed: Vec<usize>,
    /// Per planned kill: a time after every rank is ready, or `None` for "as soon as a
    /// survivor recovers" (or, with localized recovery, noticed the failure).
    plan: Vec<Option<Duration>>,
    recovering_seen: bool,
}

impl Killer {
    fn plan(rng: &mut SmallRng, campaign: &Campaign) -> Killer {
        let d = campaign.duration.as_secs_f64();
        let plan = (0..campaign.kills)
            .map(|i| (i % 2 == 0).then(|| Duration::from_secs_f64(rng.gen_range(0.2 * d..0.8 * d))))
            .collect();
        let (pids, ready, killed) = (HashMap::new(), None, Vec::new());
        Killer { pids, ready, killed, plan, recovering_seen: false }
    }

    /// Takes in one output line of a job of `ranks` seen at job time `now`.
    fn observe(&mut self, (rank, text): &(Option<usize>, String), now: Duration, ranks: usize) {
        let Some(rank) = rank else { return };
        if let Some(pid) = text.strip_prefix("pid=").and_then(|p| p.trim().parse().ok()) {
            self.pids.insert(*rank, pid);
            if self.pids.len() == ranks {
                self.ready.get_or_insert(now);
            }
        }
        let repairing = text.starts_with("recovering") || text.starts_with("noticed ");
        if repairing && !self.killed.is_empty() {
            self.recovering_seen = true;
        }
    }

    /// The time since every rank was ready, at job time `now`; `None` before.
    fn since_ready(&self, now: Duration) -> Option<Duration> {
        self.ready.map(|ready| now.saturating_sub(ready))
    }

    /// SIGKILLs a random rank other than `spared` and those already killed when the next
    /// planned kill is due (`since_ready` after every rank was ready).
    fn maybe_kill(
        &mut self,
        since_ready: Duration,
        rng: &mut SmallRng,
        spared: Option<usize>,
    ) -> Result<()> {
        let Some(next) = self.plan.get(self.killed.len()).copied() else { return Ok(()) };
        let due = match next {
            Some(at) => since_ready >= at,
            None => self.recovering_seen,
        };
        if !due {
            return Ok(());
        }
        let excluded: Vec<usize> = self.killed.iter().copied().chain(spared).collect();
        let Some(victim) = kill_random_rank(&self.pids, &excluded, rng)? else {
            self.plan.truncate(self.killed.len());
            return Ok(());
        };
        self.killed.push(victim);
        self.recovering_seen = false;
        Ok(())
    }
}

/// Writers' histories per key and every survivor's final reads.
#[derive(Debug, Default)]
pub struct Histories {
    pub ops: BTreeMap<(i32, u16), Vec<Op>>,
    pub finals: HashMap<usize, HashMap<(i32, u16), Observed>>,
    /// Reads on a localized store before the final global recovery (`final_local`).
    pub finals_local: HashMap<usize, HashMap<(i32, u16), Observed>>,
}

fn parse_histories(out: &JobOutput, ranks: usize) -> Histories {
    let mut h = Histories::default();
    for rank in 0..ranks {
        for line in out.rank_lines(rank) {
            parse_line(&mut h, rank, line);
        }
    }
    h
}

/// Applies one output line of `rank` (a [`WriteReport`] or [`FinalRead`], `final` or
/// `final_local`; other lines, and a line cut short by the rank's death, change nothing) to
/// the histories.
pub fn parse_line(h: &mut Histories, rank: usize, line: &str) {
    let Some((kind, json)) = line.split_once(' ') else { return };
    match kind {
        "write" => {
            let Ok(write) = serde_json::from_str::<WriteReport>(json) else { return };
            let ops = h.ops.entry((rank as i32, write.kind)).or_default();
            if write.acked {
                if let Some(op) = ops.iter_mut().rev().find(|o| o.seq == write.seq) {
                    op.acked = true;
                }
            } else {
                ops.push(Op { seq: write.seq, delete: write.delete, acked: false });
            }
        }
        "final" | "final_local" => {
            let Ok(read) = serde_json::from_str::<FinalRead>(json) else { return };
            let observed = match read.read {
                Read::Seq(seq) => Observed::Seq(seq),
                Read::Absent => Observed::Absent,
                Read::Lost => Observed::Lost,
                Read::Torn => Observed::Torn,
            };
            let finals = if kind == "final" { &mut h.finals } else { &mut h.finals_local };
            finals.entry(rank).or_default().insert((read.owner, read.kind), observed);
        }
        _ => {}
    }
}

/// A write of a chaos rank (`write {json}`): once when it is tried, again with `acked` once
/// the store acknowledged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteReport {
    pub kind: u16,
    pub seq: u32,
    pub delete: bool,
    pub acked: bool,
}

/// What a survivor read of one key at the end (`final {json}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalRead {
    pub owner: i32,
    pub kind: u16,
    pub read: Read,
}

/// One read of a key: the sequence number its value carries, no value, a key the store
/// reported lost, or a value that is not one the writer wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Read {
    Seq(u32),
    Absent,
    Lost,
    Torn,
}

/// One global recovery on a rank (`recovery {json}`), from [`ftkv::RecoveryReport`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecoveryReport {
    pub failed: Vec<i32>,
    pub attempts: usize,
    pub keys_recovered: usize,
    /// `(owner, kind)` of each key no copy of which survived.
    pub lost_keys: Vec<(i32, u16)>,
    pub ms: f64,
}

/// A rank that finished (`done {json}`): the workers outside the store's live set, the same
/// on every survivor (the shrunk communicator's membership).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DoneReport {
    pub failed: Vec<usize>,
}

/// Counts over one run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Verdict {
    pub acked: u64,
    /// Reads older than the last acknowledged write: silently lost data.
    pub lost: u64,
    pub torn: u64,
    /// Reads of keys the store reported lost (a dead owner's, after a recovery said so).
    pub reported_lost: u64,
    /// Reads of a key as lost that no recovery reported, or of a live owner's key still lost.
    pub unaccounted: u64,
    /// Reads judged on localized stores before the final global recovery.
    pub local_reads: u64,
}

/// Judges every survivor's reads of every key ([`oracle::judge_key`]), the final ones and those
/// taken on a localized store before its final global recovery. Owners among `survivors` are
/// live; `reported_lost` holds the keys any recovery reported lost.
pub fn judge_all(
    h: &Histories,
    survivors: &[usize],
    ranks: usize,
    reported_lost: &BTreeSet<(i32, u16)>,
) -> Verdict {
    let acked = h.ops.values().flatten().filter(|o| o.acked).count() as u64;
    let mut verdict = Verdict { acked, ..Verdict::default() };
    let empty = HashMap::new();
    for rank in survivors {
        for (local, finals) in [(false, &h.finals), (true, &h.finals_local)] {
            let finals = finals.get(rank).unwrap_or(&empty);
            for (&key, &observed) in finals.iter().filter(|(k, _)| (k.0 as usize) < ranks) {
                let ops = h.ops.get(&key).map_or(&[][..], Vec::as_slice);
                let live = survivors.contains(&(key.0 as usize));
                let owner = if live { Owner::Live } else { Owner::Dead };
                let judged = judge_key(ops, owner, reported_lost.contains(&key), observed);
                count(&mut verdict, judged);
                verdict.local_reads += u64::from(local);
            }
        }
    }
    verdict
}

/// Adds one key's verdict to the run's counts.
fn count(verdict: &mut Verdict, judged: KeyVerdict) {
    match judged {
        KeyVerdict::Allowed => {}
        KeyVerdict::ReportedLost => verdict.reported_lost += 1,
        KeyVerdict::LostWrite => verdict.lost += 1,
        KeyVerdict::Torn => verdict.torn += 1,
        KeyVerdict::UnaccountedLoss => verdict.unaccounted += 1,
    }
}

/// With localized recovery: a rank noticed more failed workers (`noticed {json}`), the cue for
/// a kill during the repair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoticedReport {
    pub failed: Vec<i32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftkv_launch::launch::report_line;

    #[test]
    fn lines_build_histories_and_verdicts() {
        let mut h = Histories::default();
        let write = |kind, seq, acked| WriteReport { kind, seq, delete: false, acked };
        let writes = [write(0, 1, false), write(0, 1, true), write(0, 2, false)];
        let writes = writes.into_iter().chain([write(1, 3, false), write(1, 3, true)]);
        for w in writes {
            parse_line(&mut h, 1, &report_line("write", &w));
        }
        let finals = [
            FinalRead { owner: 1, kind: 0, read: Read::Seq(2) },
            FinalRead { owner: 1, kind: 1, read: Read::Absent },
        ];
        for read in finals {
            parse_line(&mut h, 0, &report_line("final", &read));
        }
        parse_line(&mut h, 0, "final {\"owner\":1,\"kin");
        let v = judge_all(&h, &[0], 2, &BTreeSet::new());
        assert_eq!(v, Verdict { acked: 2, lost: 1, ..Verdict::default() });
    }

    #[test]
    fn local_reads_and_losses_are_judged_by_owner_and_report() {
        let mut h = Histories::default();
        let write = |kind, seq, acked| WriteReport { kind, seq, delete: false, acked };
        let writes = [(1, write(0, 4, false)), (1, write(0, 4, true))];
        for (rank, w) in writes.into_iter().chain([(2, write(0, 7, false)), (2, write(0, 7, true))])
        {
            parse_line(&mut h, rank, &report_line("write", &w));
        }
        let read = |owner, read| FinalRead { owner, kind: 0, read };
        let lines = [
            ("final_local", read(1, Read::Seq(4))),
            ("final", read(1, Read::Lost)),
            ("final", read(2, Read::Lost)),
        ];
        for (tag, r) in lines {
            parse_line(&mut h, 0, &report_line(tag, &r));
        }
        let reported = BTreeSet::from([(1, 0), (2, 0)]);
        let v = judge_all(&h, &[0, 2], 3, &reported);
        let want = Verdict {
            acked: 2,
            reported_lost: 1,
            unaccounted: 1,
            local_reads: 1,
            ..Verdict::default()
        };
        assert_eq!(v, want, "1 is dead and reported lost; 2 lives and never wrote its key again");
        let unreported = judge_all(&h, &[0], 3, &BTreeSet::new());
        assert_eq!(unreported.unaccounted, 2);
    }
}
