//! The campaign's faults beside single SIGKILLs: one simulated host's ranks SIGKILLed at once
//! (`--kill-host`), and one rank SIGSTOPped past the suspicion bound, then SIGCONTed
//! (`--stop`).

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use ftkv_launch::launch::{kill_pid, signal_pid, JobOutput, RunningJob};
use rand::rngs::SmallRng;
use rand::Rng;

/// The hosts (indices into `host_of_rank`, one host per rank, `None` when unknown) that hold
/// ranks in `alive` and whose loss leaves the other ranks of `alive` the store: at least 2 of
/// them, holding the quorum the store's recovery demands ([`ftkv::keeps_quorum`]: more than
/// half, or exactly half with the lowest live rank). Sorted, without repeats.
pub fn killable_hosts(host_of_rank: &[Option<usize>], alive: &[usize]) -> Vec<usize> {
    let hosts: Vec<u32> = host_of_rank.iter().map(|h| h.map_or(u32::MAX, |h| h as u32)).collect();
    let previous: Vec<i32> = alive.iter().map(|&r| r as i32).collect();
    let mut candidates: Vec<usize> = alive.iter().filter_map(|&r| host_of_rank[r]).collect();
    candidates.sort_unstable();
    candidates.dedup();
    candidates.retain(|&host| {
        let live: Vec<i32> =
            previous.iter().copied().filter(|&r| host_of_rank[r as usize] != Some(host)).collect();
        live.len() >= 2 && ftkv::keeps_quorum(&previous, &live, &hosts)
    });
    candidates
}

/// Where a run stands when a fault may be due.
#[derive(Clone, Copy)]
pub struct Moment<'a> {
    pub job: &'a RunningJob,
    /// The time since every rank was ready (had created its store).
    pub since_ready: Duration,
    /// The ranks' pids.
    pub pids: &'a HashMap<usize, u32>,
    /// Ranks already killed or stopped.
    pub dead: &'a [usize],
    /// The job's ranks.
    pub ranks: usize,
}

/// One simulated host whose ranks are all SIGKILLed at a planned moment.
#[derive(Debug)]
pub struct HostKill {
    /// Counted from the moment every rank is ready (start-up over simulated hosts takes about
    /// as long as a short run).
    at: Duration,
    /// The host killed, once it was.
    pub host: Option<usize>,
    /// Its ranks that were SIGKILLed.
    pub ranks: Vec<usize>,
}

impl HostKill {
    /// A host kill at a random moment within 20–80 % of `duration`.
    pub fn planned(rng: &mut SmallRng, duration: Duration) -> HostKill {
        let d = duration.as_secs_f64();
        let at = Duration::from_secs_f64(rng.gen_range(0.2 * d..0.8 * d));
        HostKill { at, host: None, ranks: Vec::new() }
    }

    /// When due (`since_ready` after every rank was ready): SIGKILLs every live rank of a random host among
    /// [`killable_hosts`] and returns those ranks (empty otherwise). Fails when the job runs on
    /// no simulated hosts or no host can be lost while the rest keep the store.
    pub fn step(&mut self, now: &Moment, rng: &mut SmallRng) -> Result<Vec<usize>> {
        let Moment { job, since_ready, pids, dead, ranks } = *now;
        if self.host.is_some() || since_ready < self.at {
            return Ok(Vec::new());
        }
        let cluster = job.cluster().context("--kill-host needs simulated hosts (--nodes)")?;
        let host_of_rank: Vec<Option<usize>> =
            (0..ranks).map(|r| cluster.host_of(pids[&r])).collect();
        let alive: Vec<usize> = (0..ranks).filter(|r| !dead.contains(r)).collect();
        let candidates = killable_hosts(&host_of_rank, &alive);
        if candidates.is_empty() {
            bail!("no host can be lost with the others keeping the store: hosts {host_of_rank:?}");
        }
        let host = candidates[rng.gen_range(0..candidates.len())];
        self.ranks = alive.into_iter().filter(|&r| host_of_rank[r] == Some(host)).collect();
        for &rank in &self.ranks {
            kill_pid(pids[&rank])?;
        }
        self.host = Some(host);
        let at = job.elapsed().as_secs_f64();
        eprintln!("[chaos] {at:.1} s: SIGKILLed host {host}'s ranks {:?}", self.ranks);
        Ok(self.ranks.clone())
    }
}

/// One rank SIGSTOPped at a planned moment and SIGCONTed `length` later.
#[derive(Debug)]
pub struct Stall {
    at: Duration,
    length: Duration,
    /// The stopped rank and when (job time) it was stopped.
    pub stopped: Option<(usize, Duration)>,
    pub resumed: bool,
    /// How long after its stop the stopped process was first seen gone while still stopped
    /// (the survivors ended it).
    pub ended_after: Option<Duration>,
}

/// What became of a stalled rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StallOutcome {
    /// The survivors agreed it had failed.
    pub declared: bool,
    /// It reported `done`: it rejoined a store that had gone on without it.
    pub rejoined: bool,
    /// It ended itself once resumed, saying why (the store's own gap check, Open MPI's
    /// detector verdict, or a fail-stop).
    pub ended_itself: bool,
    /// The survivors ended it while it was still stopped.
    pub ended_by_survivors: bool,
    /// Milliseconds from the stop to the moment its process was seen gone, when the survivors
    /// ended it while stopped.
    pub ended_after_ms: Option<u64>,
    /// The survivors agreed that a rank failed that nobody killed or stopped: a healthy rank
    /// was declared.
    pub healthy_declared: bool,
    /// The survivors were to end it ([`ftkv::end_declared_from_environment`], and across hosts
    /// [`ftkv::end_through_runtime_from_environment`]); otherwise it may end itself once
    /// resumed.
    pub ending_expected: bool,
}

/// How late after its stop a stopped rank may be ended: the suspicion bound plus 2 s (the
/// detector's margin under load).
pub const ENDING_MARGIN: Duration = Duration::from_secs(2);

impl StallOutcome {
    /// Whether the stall went as the store promises: declared, never rejoined, ended (by the
    /// survivors while stopped, within `bound` + [`ENDING_MARGIN`] of the stop, or, when they
    /// were not to end it, by itself once resumed), and no healthy rank declared beside it.
    pub fn ok(&self, bound: Duration) -> bool {
        let late = (bound + ENDING_MARGIN).as_millis() as u64;
        let in_time = self.ended_after_ms.is_none_or(|ms| ms <= late);
        self.declared
            && !self.rejoined
            && !self.healthy_declared
            && in_time
            && (self.ended_by_survivors || (self.ended_itself && !self.ending_expected))
    }
}

impl Stall {
    /// A stall `at` after every rank is ready, `length` long.
    pub fn planned(at: Duration, length: Duration) -> Stall {
        Stall { at, length, stopped: None, resumed: false, ended_after: None }
    }

    /// SIGSTOPs a random rank not in `dead` once due (`since_ready` after every rank was
    /// ready), and SIGCONTs it after the stall's length. Fails when the signal cannot be sent to
    /// a process that still runs.
    pub fn step(&mut self, moment: &Moment, rng: &mut SmallRng) -> Result<()> {
        let Moment { job, since_ready, pids, dead, ranks } = *moment;
        let now = job.elapsed();
        match (self.stopped, self.resumed) {
            (None, _) if since_ready >= self.at => {
                let alive: Vec<usize> = (0..ranks).filter(|r| !dead.contains(r)).collect();
                ensure!(!alive.is_empty(), "no rank left to stop");
                let rank = alive[rng.gen_range(0..alive.len())];
                signal_pid(pids[&rank], "-STOP")?;
                self.stopped = Some((rank, now));
                eprintln!("[chaos] {:.1} s: SIGSTOP rank {rank}", now.as_secs_f64());
            }
            (Some((rank, at)), false) if now >= at + self.length => {
                if !signal_pid(pids[&rank], "-CONT")? {
                    self.ended_after.get_or_insert(now - at);
                }
                self.resumed = true;
                eprintln!("[chaos] {:.1} s: SIGCONT rank {rank}", now.as_secs_f64());
            }
            (Some((rank, at)), false)
                if self.ended_after.is_none() && ftkv_mpi::process::is_gone(pids[&rank]) =>
            {
                self.ended_after = Some(now - at);
                let after = (now - at).as_secs_f64();
                eprintln!(
                    "[chaos] {:.1} s: stopped rank {rank} ended {after:.2} s after its stop",
                    now.as_secs_f64()
                );
            }
            _ => {}
        }
        Ok(())
    }

    /// Notes that the job ended at `now` (job time): a rank still stopped then was ended by the
    /// survivors by then, at the latest.
    pub fn job_ended(&mut self, now: Duration) {
        if let (Some((_, at)), false, None) = (self.stopped, self.resumed, self.ended_after) {
            self.ended_after = Some(now.saturating_sub(at));
        }
    }

    /// The stopped rank, if any.
    pub fn rank(&self) -> Option<usize> {
        self.stopped.map(|(rank, _)| rank)
    }

    /// What became of the stopped rank, judged from the job's output and the failed set the
    /// survivors agreed on.
    /// `killed` are the ranks the driver SIGKILLed.
    pub fn outcome(
        &self,
        out: &JobOutput,
        agreed_failed: &[usize],
        killed: &[usize],
    ) -> Option<StallOutcome> {
        let rank = self.rank()?;
        let healthy = |r: &&usize| **r != rank && !killed.contains(r);
        Some(StallOutcome {
            declared: agreed_failed.contains(&rank),
            rejoined: crate::done_report(out, rank).is_some(),
            ended_itself: ended_after_stall(out, rank),
            // Seen gone while stopped, or the job ended before the stall's end (then the
            // process was seen gone too: the job ends only once every process did).
            ended_by_survivors: self.ended_after.is_some(),
            ended_after_ms: self.ended_after.map(|d| d.as_millis() as u64),
            healthy_declared: agreed_failed.iter().any(|r| healthy(&r)),
            ending_expected: ftkv::end_declared_from_environment()
                && ftkv::end_through_runtime_from_environment(),
        })
    }
}

/// Whether `rank` said why it ended: a fail-stop ([`JobOutput::ended_itself`]), the store's own
/// check that it did not run for half the suspicion bound, or Open MPI's verdict that others
/// declared it dead.
fn ended_after_stall(out: &JobOutput, rank: usize) -> bool {
    let says = |l: &str| l.contains("did not run for") || l.contains("reported dead");
    out.ended_itself(rank) || out.own_stderr(rank).any(says)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Case, host of each rank, live ranks, the hosts that may be killed.
    type HostCase<'a> = (&'a str, &'a [Option<usize>], Vec<usize>, Vec<usize>);

    #[test]
    fn a_host_may_be_killed_only_when_the_rest_keep_the_quorum() {
        let by_slot = [Some(0), Some(0), Some(0), Some(1), Some(1), Some(1)];
        let by_node = [Some(0), Some(1), Some(2), Some(0), Some(1), Some(2)];
        let all: Vec<usize> = (0..6).collect();
        let table: Vec<HostCase> = vec![
            ("2 hosts: the half without rank 0", &by_slot, all.clone(), vec![1]),
            ("3 hosts by node: any", &by_node, all.clone(), vec![0, 1, 2]),
            ("a host already dead: half with rank 0", &by_node, vec![0, 1, 3, 4], vec![1]),
            ("one host left", &[Some(0); 4], vec![0, 1, 2, 3], vec![]),
            ("rank 0 dead: lowest live rank decides", &by_slot, vec![1, 2, 3, 4], vec![1]),
            ("unknown hosts are no candidates", &[None; 4], vec![0, 1, 2, 3], vec![]),
            ("too few left", &[Some(0), Some(1), Some(1)], vec![0, 1, 2], vec![0]),
        ];
        for (case, hosts, alive, want) in table {
            assert_eq!(killable_hosts(hosts, &alive), want, "{case}");
        }
    }

    #[test]
    fn a_stall_is_fine_only_when_declared_ended_and_not_rejoined() {
        let ok = StallOutcome {
            declared: true,
            rejoined: false,
            ended_itself: true,
            ended_by_survivors: false,
            ended_after_ms: None,
            healthy_declared: false,
            ending_expected: false,
        };
        let bound = Duration::from_secs(3);
        assert!(ok.ok(bound));
        assert!(!StallOutcome { declared: false, ..ok }.ok(bound));
        assert!(!StallOutcome { rejoined: true, ..ok }.ok(bound));
        assert!(!StallOutcome { ended_itself: false, ..ok }.ok(bound));
        assert!(!StallOutcome { healthy_declared: true, ..ok }.ok(bound));
        let by_survivors = StallOutcome { ended_itself: false, ended_by_survivors: true, ..ok };
        assert!(StallOutcome { ended_after_ms: Some(5000), ..by_survivors }.ok(bound));
        assert!(!StallOutcome { ended_after_ms: Some(5001), ..by_survivors }.ok(bound));
        assert!(!StallOutcome { ending_expected: true, ..ok }.ok(bound));
        assert!(StallOutcome { ending_expected: true, ..by_survivors }.ok(bound));
    }
}
