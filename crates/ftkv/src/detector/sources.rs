//! Where the detector learns of failures. Each round it polls its [`FailureSource`]s in
//! order: the notices of the other members on this host ([`Notices`]), ULFM's failed set
//! ([`UlfmFailedSet`], which Open MPI's heartbeat detector feeds too, while MPI makes progress
//! or, in ping mode, while the thread answers the writers' pings), then a revoked communicator
//! ([`Revocation`]: another member sent the store to global recovery).
//!
//! A member that learns of a failure other than by a notice tells the other members on its
//! host ([`Told::tell_neighbours`]). Open MPI's runtime tells each rank of a host in turn,
//! through a thread of each rank's own; on a host whose cores all run ranks (and their
//! repairers) the last rank heard of it 10–30 ms after the first. A notice is one small
//! message that the receiver's detector takes at its next round.
//! The put path is a source of its own, outside the rounds: a ping that fails (ping detection)
//! and a call whose error names its dead peer mark that worker in [`Health`](super::Health) directly. A newly
//! failed worker is fenced out of this rank's slots before it is published.

use super::health::DetectorStep;
use super::Watch;
use crate::events::Cause;
use crate::fabric::Fabric;

/// What one poll of a source found.
pub(super) enum Found {
    Nothing,
    /// These workers failed (some may be known already), each learned of by its cause.
    Failed(Vec<(i32, Cause)>),
    /// A communicator of the store was revoked: every member goes to global recovery.
    Revoked,
}

/// One place the detector learns of failures from, polled once per round. A poll never fails:
/// an error is reported and the source is polled again next round.
pub(super) trait FailureSource<F: Fabric> {
    fn poll(&mut self, watch: &Watch<F>) -> Found;
}

/// ULFM's failed set of the detector's communicator, after a round of MPI progress (which is
/// what makes Open MPI notice a failure), or of answering pings in ping mode.
pub(super) struct UlfmFailedSet;

impl<F: Fabric> FailureSource<F> for UlfmFailedSet {
    fn poll(&mut self, watch: &Watch<F>) -> Found {
        let progressed =
            if watch.answer_pings { watch.comm.answer_pings() } else { watch.comm.progress() };
        if progressed.as_ref().is_err_and(|e| !e.is_failure()) {
            crate::events::warn(format!("detector: {}", progressed.unwrap_err()));
        }
        watch.health.enter_detector_step(DetectorStep::FailedRanks);
        match watch.comm.failed_ranks() {
            Ok(ranks) => Found::Failed(
                ranks.iter().map(|&r| (watch.live[r as usize], Cause::OpenMpi)).collect(),
            ),
            Err(e) => {
                crate::events::warn(format!("detector: {e}"));
                Found::Nothing
            }
        }
    }
}

/// The failure notices other members on this host sent ([`Told::tell_neighbours`]): a notice
/// names failed workers, each a `u32` (little-endian). An empty notice is a heartbeat (see
/// [`super::heartbeat`]): its sender is kept in `heartbeats_from`. A notice that names no
/// worker of the store is reported and dropped; this member itself is never taken from a
/// notice.
#[derive(Default)]
pub(super) struct Notices {
    /// The senders (ranks of the detector's communicator) of the heartbeats the last poll took.
    pub heartbeats_from: Vec<i32>,
}

impl<F: Fabric> FailureSource<F> for Notices {
    /// No MPI call at all for a member without neighbours or heartbeat peers: only they send
    /// it notices.
    fn poll(&mut self, watch: &Watch<F>) -> Found {
        if watch.neighbours.is_empty() && watch.heartbeat_peers.is_empty() {
            return Found::Nothing;
        }
        watch.health.enter_detector_step(DetectorStep::Notices);
        let me = watch.live[watch.comm.rank() as usize];
        let mut named = Vec::new();
        loop {
            match watch.comm.try_receive_notice() {
                Ok(Some(notice)) if notice.data.is_empty() => {
                    self.heartbeats_from.push(notice.source)
                }
                Ok(Some(notice)) => match decode_notice(&notice.data, watch.health.workers()) {
                    Some(workers) => {
                        let from = Cause::Told { from: watch.live[notice.source as usize] };
                        named.extend(workers.into_iter().filter(|&w| w != me).map(|w| (w, from)))
                    }
                    None => crate::events::warn(format!(
                        "detector: a failure notice of {} bytes names no worker",
                        notice.data.len()
                    )),
                },
                Ok(None) => break,
                Err(e) if e.is_failure() => break,
                Err(e) => {
                    crate::events::warn(format!("detector: {e}"));
                    break;
                }
            }
        }
        match named.is_empty() {
            true => Found::Nothing,
            false => Found::Failed(named),
        }
    }
}

fn encode_notice(workers: &[i32]) -> Vec<u8> {
    workers.iter().flat_map(|&w| (w as u32).to_le_bytes()).collect()
}

/// The workers a notice names, when it is whole and names only workers below `workers`.
fn decode_notice(data: &[u8], workers: usize) -> Option<Vec<i32>> {
    if data.is_empty() || !data.len().is_multiple_of(4) {
        return None;
    }
    let named = data.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    named.map(|w| (w < workers as u32).then_some(w as i32)).collect()
}

/// The failed workers this member told its neighbours of, heard of from them, or knew of when
/// the detector started (a global recovery's survivors all know those).
pub(super) struct Told {
    known: Vec<i32>,
}

impl Told {
    /// Nothing told yet; the failures `watch` knows of are old news.
    pub fn starting<F: Fabric>(watch: &Watch<F>) -> Told {
        Told { known: watch.health.failed_workers(watch.health.workers()) }
    }

    /// Notes workers a notice named: they are not told again.
    pub fn heard(&mut self, found: &Found) {
        if let Found::Failed(workers) = found {
            self.known.extend(workers.iter().map(|&(worker, _)| worker));
        }
    }

    /// Tells every member on this host that has not failed of the failed workers nobody
    /// told this member of, in one notice each; a send that fails is reported, except to a
    /// member that died meanwhile.
    pub fn tell_neighbours<F: Fabric>(&mut self, watch: &Watch<F>) {
        let failed = watch.health.failed_workers(watch.health.workers());
        let news: Vec<i32> = failed.iter().copied().filter(|w| !self.known.contains(w)).collect();
        if news.is_empty() || watch.neighbours.is_empty() {
            return;
        }
        watch.health.enter_detector_step(DetectorStep::Notices);
        let notice = encode_notice(&news);
        let alive = |&&rank: &&i32| !watch.health.is_failed(watch.live[rank as usize]);
        for &rank in watch.neighbours.iter().filter(alive) {
            match watch.comm.send_notice(&notice, rank) {
                Ok(true) => {}
                // An agreement runs in this process: the news is told next round.
                Ok(false) => return,
                Err(e) if e.is_failure() => {}
                Err(e) => crate::events::warn(format!("detector: a failure notice: {e}")),
            }
        }
        self.known.extend(news);
    }
}

/// A revoked detector or store communicator.
pub(super) struct Revocation;

impl<F: Fabric> FailureSource<F> for Revocation {
    fn poll(&mut self, watch: &Watch<F>) -> Found {
        watch.health.enter_detector_step(DetectorStep::Revoked);
        let revoked = |comm: &F| comm.is_revoked().unwrap_or(true);
        match revoked(&watch.comm) || revoked(&watch.store_comm) {
            true => Found::Revoked,
            false => Found::Nothing,
        }
    }
}

/// Acts on what a source found: publishes newly failed workers, raises the alarm for a revoke.
pub(super) fn act_on<F: Fabric>(watch: &Watch<F>, found: Found) {
    match found {
        Found::Nothing => {}
        Found::Failed(workers) => publish_failures(watch, workers.into_iter()),
        Found::Revoked => watch.health.raise_alarm(),
    }
}

/// Fences newly failed `workers` out of this rank's slots, then publishes them: whoever sees
/// a failure here (the store's calls, the alarm) sees it fenced on this rank.
fn publish_failures<F: Fabric>(watch: &Watch<F>, workers: impl Iterator<Item = (i32, Cause)>) {
    let newly: Vec<(i32, Cause)> = workers.filter(|&(w, _)| !watch.health.is_failed(w)).collect();
    if newly.is_empty() {
        return;
    }
    let mut failed = watch.health.failed_workers(watch.health.workers());
    failed.extend(newly.iter().map(|&(worker, _)| worker));
    watch.health.enter_detector_step(DetectorStep::Fence);
    if let Err(e) = (watch.fence)(&failed) {
        crate::events::warn(format!("detector: fencing failed workers: {e}"));
    }
    tracing::debug!(failed = ?newly, "failure published");
    newly.into_iter().for_each(|(worker, cause)| watch.health.mark_failed(worker, cause));
}

/// Fences the failed workers when the failed set grew since `fenced` (a generation); returns
/// the generation now fenced. A fencing error is reported and tried again next round.
pub(super) fn fence_new_failures<F: Fabric>(watch: &Watch<F>, fenced: u64) -> u64 {
    let generation = watch.health.generation();
    if generation == fenced {
        return fenced;
    }
    match (watch.fence)(&watch.health.failed_workers(watch.health.workers())) {
        Ok(_) => generation,
        Err(e) => {
            crate::events::warn(format!("detector: fencing failed workers: {e}"));
            fenced
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::detector::Health;
    use crate::fabric::local::{LocalCluster, LocalFabric};

    #[test]
    fn a_notice_names_whole_workers_of_the_store_or_is_refused() {
        let table: [(&[u8], Option<Vec<i32>>); 5] = [
            (&encode_notice(&[2, 5]), Some(vec![2, 5])),
            (&[], None),
            (&[1, 0, 0], None),
            (&encode_notice(&[8]), None),
            (&encode_notice(&[7]), Some(vec![7])),
        ];
        for (data, named) in table {
            assert_eq!(decode_notice(data, 8), named, "{data:?}");
        }
    }

    /// A watch of `comm` for ranks 0..4 on hosts 0, 0, 0, 1: this member's neighbours are the
    /// other members on its host.
    fn watch(comm: LocalFabric, health: Arc<Health>) -> Watch<LocalFabric> {
        let hosts = [0, 0, 0, 1];
        let me = comm.rank();
        let neighbours =
            (0..4).filter(|&r| r != me && hosts[r as usize] == hosts[me as usize]).collect();
        let comm = Arc::new(comm);
        Watch {
            store_comm: comm.clone(),
            comm,
            live: vec![0, 1, 2, 3],
            me,
            hosts: hosts.to_vec(),
            processes: Arc::new(vec![Default::default(); 4]),
            end_declared: false,
            ending: crate::detector::ending::shared(),
            end_through_runtime: false,
            heartbeat_peers: Vec::new(),
            neighbours,
            health,
            poll_interval: Duration::from_millis(1),
            watchdog: Duration::from_secs(5),
            suspicion: Duration::from_secs(5),
            answer_pings: false,
            fence: Box::new(|_| Ok(0)),
        }
    }

    #[test]
    fn a_failure_is_told_once_to_the_live_members_of_this_host_and_a_heard_one_is_not_passed_on() {
        let heard = LocalCluster::new(4).run(|comm| {
            let me = comm.rank();
            let health = Arc::new(Health::new(4, false));
            let watch = watch(comm, health.clone());
            let mut told = Told::starting(&watch);
            if me == 0 {
                health.mark_failed(2, Cause::OpenMpi);
                told.tell_neighbours(&watch);
                told.tell_neighbours(&watch);
            }
            watch.comm.barrier().expect("barrier");
            let found = Notices::default().poll(&watch);
            told.heard(&found);
            let named: Vec<i32> = match &found {
                Found::Failed(workers) => workers.iter().map(|&(worker, _)| worker).collect(),
                _ => Vec::new(),
            };
            act_on(&watch, found);
            told.tell_neighbours(&watch);
            watch.comm.barrier().expect("barrier");
            let passed_on: Vec<i32> = match Notices::default().poll(&watch) {
                Found::Failed(workers) => workers.into_iter().map(|(worker, _)| worker).collect(),
                _ => Vec::new(),
            };
            (named, health.is_failed(2), passed_on)
        });
        let heard: Vec<_> = heard.into_iter().map(Option::unwrap).collect();
        assert_eq!(heard[1], (vec![2], true, vec![]), "rank 1 shares rank 0's host");
        assert_eq!(heard[2].0, Vec::<i32>::new(), "rank 2 failed: nobody tells it");
        assert_eq!(heard[3], (vec![], false, vec![]), "rank 3 is on another host");
    }
}
