//! The production store's transactions ([`Store::transaction`]) on a deterministic world
//! ([`crate::world`]): the coordinator's engine, the store as its backend (replicated lock
//! words, records and writes), the backups' resolution and the in-doubt finish run unchanged
//! on the in-process fabric, every thread a task of one seeded scheduler, with a virtual clock.
//! One seed fixes the scenario (ranks, hosts and their mapping, copies, the transactions), the
//! interleaving and the faults: kills at any step or at a named step of the protocol
//! (`tx_announce` … `tx_finish`), a slow rank. A failing seed replays exactly (`ftkv sim
//! --model txn-world --seed S --trace`).
//!
//! Each rank runs a few read-modify-write transactions over 2–3 of the workers' keys, each
//! appending its id to every key's log (its value, [`crate::txn_log`]), half of them with a
//! condition on the first key's value (read just before, so a concurrent transaction makes it
//! fail). Up to `copies − 1` ranks are killed, a majority living. The survivors then resolve
//! the failed coordinators, meet, read every key and the lowest live rank locks every key
//! once more. The run is judged:
//!
//! - atomicity: a transaction is in the log of every key it wrote or of none; one that
//!   returned committed, or whose in-doubt finish said committed, is in all; one that
//!   returned aborted, or finished aborted, in none;
//! - isolation: the logs order the transactions without a cycle, no id appears twice, and a
//!   conditioned transaction that committed sits right after the log it read;
//! - agreement: every survivor reads the same logs;
//! - liveness: no transaction gave up on a lock, the last one's included (no lock left held),
//!   and no run hangs or panics.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::recovery::RunReport;
use crate::scenario::{kill_count, ranks_on_hosts, victims};
use crate::store::Meeting;
use crate::txn_log::{self, log_of};
use crate::world::{Fault, World, WorldConfig};
use ftkv::fabric::local::{LocalCluster, LocalFabric};
use ftkv::txn::{Decision, Expect, Outcome, TxId, Txn};
use ftkv::{Config, Error, Key, Store};

/// Virtual time a run may take before it counts as a hang.
const LIMIT: Duration = Duration::from_secs(60);
/// The kind of every worker's shared key.
const DATA: u16 = 0;

/// The transaction protocol's named steps a victim may die at (its `nth` pass).
pub const TX_POINTS: [&str; 10] = [
    "tx_announce",
    "tx_lock",
    "tx_read",
    "tx_commit",
    "tx_apply",
    "tx_done",
    "tx_unlock",
    "tx_abort",
    "tx_resolve",
    "tx_finish",
];

/// How a victim dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Death {
    /// This many steps after the stores' creation.
    AfterSteps(u64),
    /// At its `nth` pass through a named step of the protocol.
    AtPoint(&'static str, usize),
}

/// One run's scenario, drawn from its seed.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub seed: u64,
    pub ranks: usize,
    pub hosts: Vec<u32>,
    pub copies: usize,
    /// Each victim and how it dies; one that has not died by the end of its transactions dies
    /// there.
    pub kills: Vec<(i32, Death)>,
    pub slow: Vec<i32>,
    /// Each rank's transactions: the keys' owners and whether it is conditioned.
    pub plans: Vec<Vec<(Vec<i32>, bool)>>,
}

impl Scenario {
    /// The scenario of `seed`: 3–6 ranks on 1–3 hosts (by slot or by node), 2–3 copies,
    /// localized recovery, 1–4 transactions per rank, up to `copies − 1` kills.
    pub fn of(seed: u64) -> Scenario {
        let mut rng = SmallRng::seed_from_u64(seed);
        let (ranks, hosts) = ranks_on_hosts(&mut rng);
        let copies = rng.gen_range(2..=3usize.min(ranks - 1));
        let count = kill_count(&mut rng, copies, ranks);
        let kills = victims(&mut rng, count, ranks, |rng, _| {
            if rng.gen_bool(0.5) {
                Death::AfterSteps(rng.gen_range(1..4_000))
            } else {
                Death::AtPoint(TX_POINTS[rng.gen_range(0..TX_POINTS.len())], rng.gen_range(1..=3))
            }
        });
        let slow = if rng.gen_bool(0.25) { vec![rng.gen_range(0..ranks as i32)] } else { vec![] };
        let transactions = rng.gen_range(1..=4usize);
        let plans = (0..ranks)
            .map(|_| (0..transactions).map(|_| plan_one(&mut rng, ranks)).collect())
            .collect();
        Scenario { seed, ranks, hosts, copies, kills, slow, plans }
    }

    fn describe(&self) -> String {
        let transactions = self.plans.first().map_or(0, Vec::len);
        format!(
            "{} ranks on hosts {:?}, {} copies, {transactions} transactions each, kills {:?}, \
             slow {:?}",
            self.ranks, self.hosts, self.copies, self.kills, self.slow
        )
    }

    fn config(&self) -> Config {
        let mut config = Config::new(["data"], self.copies).localized().with_transactions();
        config.initial_capacity = 256;
        config.max_value = 4 << 10;
        config
    }
}

/// The owners of 2–3 distinct keys, and whether the transaction is conditioned.
fn plan_one(rng: &mut SmallRng, ranks: usize) -> (Vec<i32>, bool) {
    let count = rng.gen_range(2..=3usize.min(ranks));
    let mut owners: Vec<i32> = Vec::new();
    while owners.len() < count {
        let owner = rng.gen_range(0..ranks as i32);
        if !owners.contains(&owner) {
            owners.push(owner);
        }
    }
    (owners, rng.gen_bool(0.5))
}

/// How a transaction ended, as its coordinator saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ended {
    /// Not yet, or never: the coordinator died.
    Open,
    Committed,
    Aborted,
    GaveUp(String),
}

/// A transaction as its coordinator started it.
#[derive(Debug, Clone)]
struct Started {
    id: u64,
    keys: Vec<Key>,
    /// The conditioned key and the length of the log it held when read.
    condition: Option<(Key, usize)>,
    ended: Ended,
}

/// Every transaction started, in the order started.
type Ledger = Mutex<Vec<Started>>;

/// What a survivor saw at the end: every key's log, and whether its last transaction, over
/// every key, gave up (only the lowest live rank runs one).
struct Finals {
    logs: BTreeMap<Key, Vec<u64>>,
    last_gave_up: Option<String>,
}

/// The meeting points, in order.
const CREATED: usize = 1;
const DONE: usize = 2;
const RESOLVED: usize = 3;
const READ: usize = 4;

/// The runs of a campaign: reports of the failing ones and a digest of all
/// ([`crate::world::campaign`]).
pub fn campaign(first_seed: u64, runs: u64) -> (Vec<RunReport>, u64) {
    crate::world::campaign(first_seed, runs, |seed| run(seed, false).0)
}

/// Runs the scenario of `seed`; with `trace`, also returns one line per step and per fault.
pub fn run(seed: u64, trace: bool) -> (RunReport, Vec<String>) {
    let scenario = Arc::new(Scenario::of(seed));
    let world = World::new(WorldConfig { seed, limit: LIMIT, trace, slow: scenario.slow.clone() });
    let cluster = LocalCluster::new(scenario.ranks).with_hosts(scenario.hosts.clone());
    for &(victim, death) in &scenario.kills {
        if let Death::AtPoint(point, nth) = death {
            cluster.arm(victim, point, nth);
        }
    }
    let ledger: Arc<Ledger> = Arc::default();
    let meeting = Arc::new(Meeting::new(&cluster, scenario.ranks));
    let body = {
        let (scenario, ledger, meeting) = (scenario.clone(), ledger.clone(), meeting.clone());
        move |fabric: LocalFabric| worker(fabric, &scenario, &ledger, &meeting)
    };
    let (results, outcome) = crate::world::run_cluster(&cluster, &world, body);
    let mut violations = Vec::new();
    if let Some(why) = &outcome.aborted {
        violations.push(why.clone());
    }
    let mut finals = Vec::new();
    for (rank, result) in results.into_iter().enumerate() {
        match result {
            Err(panic) => violations.push(format!("rank {rank} panicked: {panic}")),
            Ok(Some(seen)) => finals.push((rank, seen)),
            Ok(None) => {}
        }
    }
    if outcome.aborted.is_none() && finals.is_empty() {
        violations.push("no rank survived".into());
    }
    let ledger = ledger.lock().unwrap_or_else(|p| p.into_inner());
    violations.extend(judge(&finals, &ledger));
    let report = RunReport {
        seed,
        scenario: scenario.describe(),
        violations,
        digest: outcome.digest,
        steps: outcome.steps as usize,
    };
    let mut lines = outcome.struck.clone();
    lines.extend(outcome.trace);
    (report, lines)
}

/// Every violation of the survivors' final logs against the transactions started.
fn judge(finals: &[(usize, Finals)], ledger: &[Started]) -> Vec<String> {
    let mut violations = Vec::new();
    let Some((first, reference)) = finals.first() else { return violations };
    for (rank, seen) in finals {
        if seen.logs != reference.logs {
            violations.push(format!(
                "rank {rank} reads {:?}, rank {first} {:?}",
                seen.logs, reference.logs
            ));
        }
        if let Some(why) = &seen.last_gave_up {
            violations.push(format!("rank {rank}'s last transaction gave up: {why}"));
        }
    }
    let logs = &reference.logs;
    let planned: Vec<(u64, Vec<Key>)> = ledger.iter().map(|t| (t.id, t.keys.clone())).collect();
    let ended: Vec<(u64, bool)> = ledger
        .iter()
        .filter_map(|t| match t.ended {
            Ended::Committed => Some((t.id, true)),
            Ended::Aborted => Some((t.id, false)),
            _ => None,
        })
        .collect();
    violations.extend(txn_log::judge(logs, &planned, &ended));
    for started in ledger {
        if let Ended::GaveUp(why) = &started.ended {
            violations.push(format!("{:?} gave up: {why}", TxId(started.id)));
        }
        let everywhere =
            started.keys.iter().all(|k| logs.get(k).is_some_and(|l| l.contains(&started.id)));
        if let (Some((key, read)), true) = (started.condition, everywhere) {
            let position = logs[&key].iter().position(|&id| id == started.id);
            if position != Some(read) {
                violations.push(format!(
                    "{:?} read {read} entries of {key} but sits at {position:?}",
                    TxId(started.id)
                ));
            }
        }
    }
    for (key, log) in logs {
        if let Some(stray) = log.iter().find(|id| ledger.iter().all(|t| t.id != **id)) {
            violations.push(format!("key {key} holds {:?}, which nobody started", TxId(*stray)));
        }
    }
    violations
}

/// One rank: creates the store, runs its transactions, resolves failed coordinators with the
/// other survivors, reads every key.
fn worker(fabric: LocalFabric, scenario: &Scenario, ledger: &Ledger, meeting: &Meeting) -> Finals {
    let mut store = Store::create(&fabric, scenario.config()).expect("creating the store");
    let me = store.worker();
    meeting.wait_for_all(CREATED, me);
    let death = scenario.kills.iter().find(|&&(v, _)| v == me).map(|&(_, d)| d);
    if let Some(Death::AfterSteps(after)) = death {
        crate::world::plan_here(|now| Fault::Kill { rank: me, at: now + after });
    }
    let mut started = 0;
    for (owners, conditioned) in &scenario.plans[me as usize] {
        started += 1;
        let keys: Vec<Key> = owners.iter().map(|&o| Key::new(o, DATA)).collect();
        run_one(&mut store, TxId::new(me, started), keys, *conditioned, ledger);
        tend(&mut store);
    }
    if death.is_some() {
        // A victim dies within its transactions: one that got here first dies now.
        crate::world::plan_here(|now| Fault::Kill { rank: me, at: now });
        ftkv::rt::step("victim's end");
    }
    meeting.wait_tending(DONE, &mut store, tend);
    tend(&mut store);
    meeting.wait_tending(RESOLVED, &mut store, tend);
    let logs = loop {
        match read_logs(&mut store) {
            Ok(logs) => break logs,
            Err(e) if e.needs_recovery() => {
                recover(&mut store);
            }
            Err(e) => panic!("rank {me}: reading: {e}"),
        }
    };
    meeting.wait_tending(READ, &mut store, tend);
    let lowest_live = (0..me).all(|r| store.failed().contains(&r));
    let last_gave_up = lowest_live.then(|| lock_every_key(&mut store)).flatten();
    Finals { logs, last_gave_up }
}

/// Runs transaction `id` over `keys`, appending its id to each, recorded in `ledger` before it
/// starts and when it ends (an in-doubt one after its finish).
fn run_one(
    store: &mut Store<LocalFabric>,
    id: TxId,
    keys: Vec<Key>,
    conditioned: bool,
    ledger: &Ledger,
) {
    let mut txn = Txn { reads: keys.clone(), ..Txn::default() };
    let mut condition = None;
    if conditioned {
        let value = loop {
            match store.get(keys[0]) {
                Ok(value) => break value,
                Err(e) if e.needs_recovery() => {
                    recover(store);
                }
                Err(e) => panic!("{id:?}: reading its condition: {e}"),
            }
        };
        condition = Some((keys[0], log_of(&value).len()));
        txn.conditions.push((keys[0], Expect::Value(value)));
    }
    let entry = {
        let mut ledger = lock(ledger);
        ledger.push(Started { id: id.0, keys, condition, ended: Ended::Open });
        ledger.len() - 1
    };
    let ended = match store.transaction(&txn, txn_log::append(id.0)) {
        Ok(Outcome::Committed { .. }) => Ended::Committed,
        Ok(Outcome::Aborted { .. }) => Ended::Aborted,
        Err(Error::TransactionContended { key, attempts }) => {
            Ended::GaveUp(format!("lock of {key} held after {attempts} attempts"))
        }
        Err(e) if e.needs_recovery() => match recover(store) {
            Some(Decision::Committed) => Ended::Committed,
            Some(Decision::Aborted) => Ended::Aborted,
            None => Ended::GaveUp(format!("in doubt after {e}, and no decision")),
        },
        Err(e) => Ended::GaveUp(format!("failed: {e}")),
    };
    lock(ledger)[entry].ended = ended;
}

/// A survivor's chore while it waits: resolve the failed coordinators it is the backup of,
/// recovering when the store asks.
fn tend(store: &mut Store<LocalFabric>) {
    loop {
        match store.resolve_transactions() {
            Ok(_) => return,
            Err(e) if e.needs_recovery() => {
                recover(store);
            }
            Err(e) => panic!("rank {}: resolving transactions: {e}", store.worker()),
        }
    }
}

/// Recovers until a recovery succeeds, then finishes the transactions the failures left half
/// done ([`Store::finish_transactions`]) and waits for every survivor to have finished them
/// (the store's contract: a global recovery frees every lock, so a transaction that started
/// before a backup rolled a failed coordinator's forward would read its keys half written);
/// how this rank's own interrupted one ended, if any.
fn recover(store: &mut Store<LocalFabric>) -> Option<Decision> {
    let mut decided = None;
    loop {
        match store.recover() {
            Ok(_) => {}
            Err(e) if e.needs_recovery() => continue,
            Err(e) => panic!("a recovery among the survivors: {e:?}"),
        }
        match store.finish_transactions() {
            Ok(decision) => decided = decided.or(decision),
            Err(e) if e.needs_recovery() => continue,
            Err(e) => panic!("finishing transactions after a recovery: {e:?}"),
        };
        match store.sync() {
            Ok(()) => return decided,
            Err(e) if e.needs_recovery() => continue,
            Err(e) => panic!("the barrier after finishing transactions: {e:?}"),
        }
    }
}

/// Every worker's log as this rank reads it.
fn read_logs(store: &mut Store<LocalFabric>) -> ftkv::Result<BTreeMap<Key, Vec<u64>>> {
    let mut logs = BTreeMap::new();
    for owner in 0..store.workers() as i32 {
        let key = Key::new(owner, DATA);
        logs.insert(key, log_of(&store.get(key)?));
    }
    Ok(logs)
}

/// A transaction that locks every key and writes nothing; why it gave up, if it did.
fn lock_every_key(store: &mut Store<LocalFabric>) -> Option<String> {
    let reads = (0..store.workers() as i32).map(|o| Key::new(o, DATA)).collect();
    let txn = Txn { reads, ..Txn::default() };
    match store.transaction(&txn, |_| Vec::new()) {
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

fn lock(ledger: &Ledger) -> std::sync::MutexGuard<'_, Vec<Started>> {
    ledger.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_run() {
        for seed in [1, 2, 3] {
            let (a, _) = run(seed, false);
            let (b, _) = run(seed, false);
            assert_eq!(a, b, "seed {seed}");
            assert!(a.violations.is_empty(), "{a}");
        }
    }
}
