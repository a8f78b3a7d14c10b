//! Where the detector learns of failures. Each round it polls its [`FailureSource`]s in
//! order: ULFM's failed set ([`UlfmFailedSet`], which Open MPI's heartbeat detector feeds too,
//! while MPI makes progress or, in ping mode, while the thread answers the writers' pings), then
//! a revoked communicator ([`Revocation`]: another member sent the store to global recovery).
//! The put path is a source of its own, outside the rounds: a ping that fails (ping detection)
//! and a call whose error names its dead peer mark that worker in [`Health`](super::Health) directly. A newly
//! failed worker is fenced out of this rank's slots before it is published.

use super::health::DetectorStep;
use super::Watch;
use crate::fabric::Fabric;

/// What one poll of a source found.
pub(super) enum Found {
    Nothing,
    /// These workers failed (some may be known already).
    Failed(Vec<i32>),
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
            Ok(ranks) => Found::Failed(ranks.iter().map(|&r| watch.live[r as usize]).collect()),
            Err(e) => {
                crate::events::warn(format!("detector: {e}"));
                Found::Nothing
            }
        }
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
fn publish_failures<F: Fabric>(watch: &Watch<F>, workers: impl Iterator<Item = i32>) {
    let newly: Vec<i32> = workers.filter(|&w| !watch.health.is_failed(w)).collect();
    if newly.is_empty() {
        return;
    }
    let mut failed = watch.health.failed_workers(watch.health.workers());
    failed.extend(&newly);
    watch.health.enter_detector_step(DetectorStep::Fence);
    if let Err(e) = (watch.fence)(&failed) {
        crate::events::warn(format!("detector: fencing failed workers: {e}"));
    }
    tracing::debug!(failed = ?newly, "failure published");
    newly.into_iter().for_each(|w| watch.health.mark_failed(w));
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
