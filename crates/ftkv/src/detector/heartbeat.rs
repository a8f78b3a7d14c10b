//! The store's own heartbeat among the members that share keys (each key's owner and its
//! holders). Open MPI's heartbeat detector watches the ranks in a ring, each its predecessor:
//! when several consecutive ranks stop at once (a frozen host's ranks, which mapping by slot
//! makes consecutive) it declares them one after the other, a bound each, and the writers to
//! them wait meanwhile. Here every member is watched by all members it shares keys with, which
//! placement puts on other hosts too, so each stopped member is found within the bound,
//! however many stop together.
//!
//! A member sends each of its peers an empty notice every period (a tenth of the bound, within
//! 0.1–1 s) and counts, per peer, the time it itself ran without hearing from that peer: a round
//! gap longer than a period (this member was not scheduled) counts as a period only, so a
//! member that was itself starved does not blame its peers. A peer silent past the bound is
//! ended as a declared one would be ([`super::ending`]: by pid on this host, through the
//! runtime on another host that still answers): Open MPI then learns of its death and reports
//! it like any failure; nothing is marked failed here. While a global recovery's alarm is
//! raised, a peer heard within half a bound before it, and not since, is not judged: it may be
//! in that recovery, which sends no heartbeats.

use std::time::{Duration, Instant};

use super::Watch;
use crate::fabric::Fabric;
use crate::rt;

/// The heartbeat period for a suspicion bound.
pub(super) fn period_for(bound: Duration) -> Duration {
    (bound / 10).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// One member's heartbeats: whom it tells and watches, and how long each was silent.
pub(super) struct Heartbeats {
    /// The peers' ranks in the detector's communicator.
    peers: Vec<i32>,
    /// Per peer: how long this member ran without a heartbeat from it.
    silence: Vec<Duration>,
    /// Peers found silent past the bound (each is ended once).
    judged: Vec<i32>,
    /// Once the alarm of a global recovery is raised, per peer: it was heard within half a
    /// bound then and not since, so it may be in that recovery, which sends no heartbeats until
    /// it replaces the detectors: its silence is not counted (a peer stopped meanwhile is left
    /// to Open MPI's detector, whose declaration ends it). Empty before the alarm.
    may_recover: Vec<bool>,
    period: Duration,
    bound: Duration,
    last_round: Instant,
    last_sent: Option<Instant>,
}

impl Heartbeats {
    /// Heartbeats with `peers` (ranks of the detector's communicator) under `bound`.
    pub fn new(peers: Vec<i32>, bound: Duration) -> Heartbeats {
        let silence = vec![Duration::ZERO; peers.len()];
        let period = period_for(bound);
        let (last_round, last_sent) = (rt::now(), None);
        let (judged, may_recover) = (Vec::new(), Vec::new());
        Heartbeats { peers, silence, judged, may_recover, period, bound, last_round, last_sent }
    }

    /// Whether this member exchanges heartbeats at all.
    pub fn any(&self) -> bool {
        !self.peers.is_empty()
    }

    /// Notes a heartbeat from `rank`: it runs its detector, so it is not in a recovery either.
    pub fn heard(&mut self, rank: i32) {
        if let Some(i) = self.peers.iter().position(|&p| p == rank) {
            self.silence[i] = Duration::ZERO;
            if let Some(may_recover) = self.may_recover.get_mut(i) {
                *may_recover = false;
            }
        }
    }

    /// One detector round: sends the heartbeats when a period passed, adds the time since the
    /// last round to every peer's silence (a period at most; not to peers that may be in a
    /// global recovery, see `may_recover`) and returns the live peers newly silent past the
    /// bound (worker ids), to end.
    pub fn round<F: Fabric>(&mut self, watch: &Watch<F>) -> Vec<i32> {
        let now = rt::now();
        let ran = now.saturating_duration_since(self.last_round).min(self.period);
        self.last_round = now;
        if self.last_sent.is_none_or(|at| now.saturating_duration_since(at) >= self.period) {
            self.send(watch);
            self.last_sent = Some(now);
        }
        let mut newly = Vec::new();
        if watch.health.alarmed() && self.may_recover.is_empty() {
            let heard_lately = |silence: &Duration| *silence < self.bound / 2;
            self.may_recover = self.silence.iter().map(heard_lately).collect();
        }
        for (i, &peer) in self.peers.iter().enumerate() {
            if self.may_recover.get(i).copied().unwrap_or(false) {
                continue;
            }
            self.silence[i] += ran;
            let worker = watch.live[peer as usize];
            if self.judged.contains(&peer) || watch.health.is_failed(worker) {
                continue;
            }
            if self.silence[i] > self.bound {
                self.judged.push(peer);
                newly.push(worker);
            }
        }
        newly
    }

    /// An empty notice to every peer not known failed; one that cannot be sent now (an
    /// agreement runs in this process) is sent next period.
    fn send<F: Fabric>(&self, watch: &Watch<F>) {
        let alive = |&&rank: &&i32| !watch.health.is_failed(watch.live[rank as usize]);
        for &peer in self.peers.iter().filter(alive) {
            match watch.comm.send_notice(&[], peer) {
                Ok(_) => {}
                Err(e) if e.is_failure() => {}
                Err(e) => crate::events::warn(format!("detector: a heartbeat: {e}")),
            }
        }
    }
}

/// The members that share keys with `me` (worker ids): the holders of its keys and the owners
/// of the keys it holds, itself left out, each once.
pub(crate) fn key_sharers(me: i32, holders_of_mine: &[i32], owners_held: &[i32]) -> Vec<i32> {
    let mut peers: Vec<i32> =
        holders_of_mine.iter().chain(owners_held).copied().filter(|&w| w != me).collect();
    peers.sort_unstable();
    peers.dedup();
    peers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_period_is_a_tenth_of_the_bound_within_a_tenth_of_a_second_and_a_second() {
        assert_eq!(period_for(Duration::from_secs(10)), Duration::from_secs(1));
        assert_eq!(period_for(Duration::from_secs(3)), Duration::from_millis(300));
        assert_eq!(period_for(Duration::from_millis(500)), Duration::from_millis(100));
        assert_eq!(period_for(Duration::from_secs(60)), Duration::from_secs(1));
    }

    #[test]
    fn key_sharers_are_holders_and_owners_once_without_this_member() {
        assert_eq!(key_sharers(2, &[3, 4, 3], &[0, 4, 2]), vec![0, 3, 4]);
        assert_eq!(key_sharers(0, &[], &[]), Vec::<i32>::new());
    }
}
