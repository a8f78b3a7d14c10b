//! `ftkv sim --model scale`: the store's placement and recovery decisions at job sizes this
//! machine cannot run (1,024 and 16,384 workers over 16–256 hosts), computed from the same
//! pure functions the store uses ([`Layout::with_spares`], [`Layout::relocate`]).
//!
//! For a seeded set of failed workers (a share of the job), each case reports:
//! - the localized repair: which copies move (the keys whose route changed), the messages and
//!   bytes that takes (a read of the newest surviving copy and a write to the new holder per
//!   moved copy, each the key's value), how many ranks take part, and the most any survivor
//!   sends; or that a chain ran out of reserves and the store falls back to global recovery;
//! - the global recovery: every survivor takes part in its collectives (revoke, shrink, window
//!   allocation, the allgather of the version records, a barrier and an agreement), and every
//!   copy of every key is written into the new windows;
//! - placement balance: the most copies any live worker holds over the mean, after the
//!   localized repair and after a global recovery's fresh layout.
//!
//! This is the protocol's decisions and message counts, not a run of its drivers: the bytes
//! are `copies × value` per key moved, and the collectives are counted, not timed.

use rand::{rngs::StdRng, seq::SliceRandom, SeedableRng};
use serde::Serialize;

use ftkv::engine::layout::{Layout, Shape};

/// Bytes of one version record in the global recovery's allgather (key, version, source).
const RECORD_BYTES: u64 = 16;
/// Collective steps of one global recovery attempt: revoke, shrink, window allocation, record
/// allgather, barrier, agreement.
const GLOBAL_COLLECTIVES: u64 = 6;

/// How ranks are placed on hosts, as Open MPI maps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Mapping {
    BySlot,
    ByNode,
}

/// One simulated job and failure.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Case {
    pub workers: usize,
    pub hosts: usize,
    pub mapping: Mapping,
    /// Failed workers, per mille of the job.
    pub failed_per_mille: usize,
    pub kinds: usize,
    pub copies: usize,
    pub spares: usize,
    pub value_bytes: u64,
    pub seed: u64,
}

/// What the store decides for one [`Case`].
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub case: Case,
    pub failed: usize,
    /// `false`: some chain has fewer live candidates than copies; the store falls back to a
    /// global recovery.
    pub localized: bool,
    pub copies_moved: u64,
    pub localized_messages: u64,
    pub localized_bytes: u64,
    /// Ranks that read or write a moved copy.
    pub localized_ranks: usize,
    /// The most copies any one survivor writes in the repair.
    pub localized_max_per_survivor: u64,
    /// Per survivor in a global recovery: collectives, and the record bytes it receives.
    pub global_collectives: u64,
    pub global_record_bytes_per_survivor: u64,
    pub global_copies_written: u64,
    /// Max over mean copies held per live worker: after the localized repair (when it is
    /// one) and in a global recovery's fresh layout.
    pub balance_localized: Option<f64>,
    pub balance_global: f64,
    /// Copies that lived on failed workers: a localized repair moves each exactly once and
    /// nothing else.
    pub copies_lost: u64,
}

/// Each worker's host for `mapping`.
fn hosts_of(workers: usize, hosts: usize, mapping: Mapping) -> Vec<u32> {
    let per_host = workers.div_ceil(hosts);
    (0..workers)
        .map(|w| match mapping {
            Mapping::BySlot => (w / per_host) as u32,
            Mapping::ByNode => (w % hosts) as u32,
        })
        .collect()
}

/// Simulates one case.
pub fn simulate(case: Case) -> Outcome {
    let hosts = hosts_of(case.workers, case.hosts, case.mapping);
    let all: Vec<i32> = (0..case.workers as i32).collect();
    let shape = Shape { kinds: case.kinds, copies: case.copies, spares: case.spares };
    let geometry = ftkv::slot::SlotGeometry::new(64);
    let layout = Layout::with_spares(&all, &hosts, shape, geometry, 0);
    let mut rng = StdRng::seed_from_u64(case.seed);
    let count = (case.workers * case.failed_per_mille).div_ceil(1000).max(1);
    let mut failed: Vec<i32> = all.choose_multiple(&mut rng, count).copied().collect();
    failed.sort_unstable();
    let live: Vec<i32> = all.iter().copied().filter(|w| failed.binary_search(w).is_err()).collect();
    let fresh = Layout::with_spares(&live, &hosts, shape, geometry, live[0]);
    let keys = (case.workers * case.kinds) as u64;
    let mut outcome = Outcome {
        case,
        failed: failed.len(),
        localized: false,
        copies_moved: 0,
        localized_messages: 0,
        localized_bytes: 0,
        localized_ranks: 0,
        localized_max_per_survivor: 0,
        global_collectives: GLOBAL_COLLECTIVES,
        global_record_bytes_per_survivor: keys * case.copies as u64 * RECORD_BYTES,
        global_copies_written: keys * case.copies as u64,
        balance_localized: None,
        balance_global: balance(&fresh, &live),
        copies_lost: copies_on(&layout, &failed),
    };
    if let Some(repaired) = layout.relocate(&failed) {
        localized_repair(&layout, &repaired, &failed, &live, &mut outcome);
    }
    outcome
}

/// Fills in the localized repair from the routes before and after.
fn localized_repair(
    before: &Layout,
    after: &Layout,
    failed: &[i32],
    live: &[i32],
    outcome: &mut Outcome,
) {
    let mut sends = std::collections::HashMap::<i32, u64>::new();
    let mut involved = std::collections::HashSet::<i32>::new();
    for key in before.keys() {
        let old = before.route(key).expect("routed");
        let new = after.route(key).expect("routed");
        let moved: Vec<i32> =
            new.iter().map(|c| c.worker).filter(|w| !old.iter().any(|c| c.worker == *w)).collect();
        if moved.is_empty() {
            continue;
        }
        // The owner moves its own key; a failed owner's first live holder moves it.
        let source = if failed.binary_search(&key.owner).is_err() {
            key.owner
        } else {
            old.iter().map(|c| c.worker).find(|w| failed.binary_search(w).is_err()).unwrap_or(-1)
        };
        *sends.entry(source).or_default() += moved.len() as u64;
        involved.insert(source);
        involved.extend(moved.iter().copied());
        outcome.copies_moved += moved.len() as u64;
    }
    outcome.localized = true;
    outcome.localized_messages = 2 * outcome.copies_moved;
    outcome.localized_bytes = 2 * outcome.copies_moved * outcome.case.value_bytes;
    outcome.localized_ranks = involved.len();
    outcome.localized_max_per_survivor = sends.values().copied().max().unwrap_or(0);
    outcome.balance_localized = Some(balance(after, live));
}

/// The copies `layout` routes to `workers` (sorted).
fn copies_on(layout: &Layout, workers: &[i32]) -> u64 {
    let routes = layout.keys().flat_map(|key| layout.route(key).unwrap_or(&[]).iter());
    routes.filter(|c| workers.binary_search(&c.worker).is_ok()).count() as u64
}

/// Max over mean copies held per live worker in `layout`'s routes.
fn balance(layout: &Layout, live: &[i32]) -> f64 {
    let mut held = std::collections::HashMap::<i32, u64>::new();
    for key in layout.keys() {
        for copy in layout.route(key).unwrap_or(&[]) {
            *held.entry(copy.worker).or_default() += 1;
        }
    }
    let total: u64 = held.values().sum();
    let mean = total as f64 / live.len() as f64;
    let max = held.values().copied().max().unwrap_or(0) as f64;
    if mean == 0.0 {
        1.0
    } else {
        max / mean
    }
}

/// The cases of `ftkv sim --model scale`: `sizes` as (workers, hosts), both mappings, 1 % and
/// 10 % failed, 2 kinds, 3 copies, 1 reserve per copy, 1 MiB values.
pub fn cases(sizes: &[(usize, usize)], seed: u64) -> Vec<Case> {
    let mut cases = Vec::new();
    for &(workers, hosts) in sizes {
        for mapping in [Mapping::BySlot, Mapping::ByNode] {
            for failed_per_mille in [10, 100] {
                cases.push(Case {
                    workers,
                    hosts,
                    mapping,
                    failed_per_mille,
                    kinds: 2,
                    copies: 3,
                    spares: 1,
                    value_bytes: 1 << 20,
                    seed,
                });
            }
        }
    }
    cases
}

/// Prints one table row per outcome.
pub fn print(outcomes: &[Outcome]) {
    println!(
        "| workers | hosts | mapping | failed | localized | copies moved | msgs | MiB moved \
         | ranks involved | max copies / survivor | balance after repair | global: collectives \
         / record KiB per survivor / copies written | balance after global |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for o in outcomes {
        let balance = o.balance_localized.map_or("-".into(), |b| format!("{b:.2}"));
        println!(
            "| {} | {} | {:?} | {} | {} | {} | {} | {:.0} | {} | {} | {} | {} / {:.0} / {} | {:.2} |",
            o.case.workers,
            o.case.hosts,
            o.case.mapping,
            o.failed,
            if o.localized { "yes" } else { "falls back" },
            o.copies_moved,
            o.localized_messages,
            o.localized_bytes as f64 / (1u64 << 20) as f64,
            o.localized_ranks,
            o.localized_max_per_survivor,
            balance,
            o.global_collectives,
            o.global_record_bytes_per_survivor as f64 / 1024.0,
            o.global_copies_written,
            o.balance_global,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_failure_moves_exactly_the_copies_it_held() {
        let case = Case {
            workers: 64,
            hosts: 4,
            mapping: Mapping::BySlot,
            failed_per_mille: 1,
            kinds: 2,
            copies: 3,
            spares: 1,
            value_bytes: 1024,
            seed: 7,
        };
        let o = simulate(case);
        assert_eq!(o.failed, 1);
        assert!(o.localized);
        // 64 workers × 2 kinds × 3 copies over 64 holders: the failed worker held 6.
        assert_eq!((o.copies_lost, o.copies_moved), (6, 6), "{o:?}");
        assert!(o.localized_max_per_survivor <= 2, "{o:?}");
        assert!(o.balance_global >= 1.0 && o.balance_localized.is_some_and(|b| b >= 1.0));
    }

    #[test]
    fn mappings_place_ranks_as_open_mpi_does() {
        assert_eq!(hosts_of(6, 3, Mapping::BySlot), vec![0, 0, 1, 1, 2, 2]);
        assert_eq!(hosts_of(6, 3, Mapping::ByNode), vec![0, 1, 2, 0, 1, 2]);
    }
}
