//! The production [`Store`] on a deterministic world ([`crate::world`]): its data path, its
//! detector, global recovery, the localized repairer, fencing and value growth run unchanged
//! on the in-process fabric, with every thread a task of one seeded scheduler and a virtual
//! clock. One seed fixes the scenario (ranks, hosts and their mapping, copies, recovery mode,
//! value sizes), the interleaving of every task and the faults: kills at any step of the
//! writes, stops, a put that never returns, a recovery's shrink that never returns (on one
//! survivor or on every rank), a slow rank. A failing seed replays exactly (`ftkv sim --model world --seed S
//! --trace`).
//!
//! Each rank writes its two keys (the shared workload of [`crate::history`]), recovering when
//! told to; the survivors then meet, read every key and judge each read by the history oracle:
//! no acknowledged write lost, no torn value. A rank that panics, or a run that does not end
//! within its virtual time limit (a hang), is a violation too.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::history::{allowed, observe, planned_write, value, Observed, Op};
use crate::recovery::RunReport;
use crate::scenario::{kill_count, ranks_on_hosts, victims};
use crate::world::{Fault, World, WorldConfig};
use ftkv::fabric::local::{LocalCluster, LocalFabric};
use ftkv::{rt, Config, Key, Store};

/// Virtual time a run may take before it counts as a hang.
const LIMIT: Duration = Duration::from_secs(60);
/// Virtual time between a survivor's first two looks while it waits for the others; each
/// further pause doubles, up to [`MEETING_POLL_MAX`] (a victim stuck in a call for the
/// watchdog's seconds costs few steps).
const MEETING_POLL: Duration = Duration::from_micros(200);
const MEETING_POLL_MAX: Duration = Duration::from_millis(20);

/// One run's scenario, drawn from its seed.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub seed: u64,
    pub ranks: usize,
    pub hosts: Vec<u32>,
    pub copies: usize,
    pub localized: bool,
    /// Each victim and how many steps after the last store's creation it dies.
    pub kills: Vec<(i32, u64)>,
    /// A victim that dies instead at its first pass through a recovery's failpoint.
    pub in_recovery: Option<(i32, &'static str)>,
    /// A second victim that dies instead inside its first barrier after the first victim's
    /// death (a recovery's, which then ends differently for the survivors).
    pub inside_barrier: Option<i32>,
    /// Victims that stop instead of dying (SIGSTOP), and when after their stop the others'
    /// failure detector declares them failed (ULFM's detector timeout).
    pub stalls: Vec<(i32, Duration)>,
    pub slow: Vec<i32>,
    pub writes: u32,
    /// A victim whose `nth` put never returns instead (a call stuck in MPI): the store's
    /// watchdog ends it.
    pub stuck_put: Option<(i32, usize)>,
    /// A recovery's shrink that never returns, as Open MPI's can stay stuck.
    pub stuck_shrink: Option<StuckShrink>,
}

/// Where a recovery's shrink never returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StuckShrink {
    /// On this survivor, after the shrink returned on the others (which wait for it in the
    /// next step): its recovery deadline ends it, and the others recover without it.
    Alone(i32),
    /// On every rank: each one's recovery deadline ends it, so the job ends instead of
    /// hanging (no survivor is left).
    Everywhere,
}

impl Scenario {
    /// The scenario of `seed`: 3–6 ranks on 1–3 hosts (by slot or by node), 1–3 copies,
    /// global or localized recovery, up to `copies − 1` kills within the writes.
    pub fn of(seed: u64) -> Scenario {
        let mut rng = SmallRng::seed_from_u64(seed);
        let (ranks, hosts) = ranks_on_hosts(&mut rng);
        let copies = rng.gen_range(1..=3usize.min(ranks - 1));
        let count = kill_count(&mut rng, copies, ranks);
        let kills = victims(&mut rng, count, ranks, |rng, before: &[(i32, u64)]| {
            // Half of the later victims die soon after the first: inside the recovery or the
            // repair it started.
            match before.first() {
                Some(&(_, first)) if rng.gen_bool(0.5) => first + rng.gen_range(1..600),
                _ => rng.gen_range(1..6_000),
            }
        });
        let points = ["recovery_after_shrink", "recovery_mid_copy"];
        let in_recovery = (kills.len() == 2 && rng.gen_bool(0.5))
            .then(|| (kills[1].0, points[rng.gen_range(0..points.len())]));
        let inside_barrier =
            (kills.len() == 2 && in_recovery.is_none() && rng.gen_bool(0.5)).then(|| kills[1].0);
        let slow = if rng.gen_bool(0.25) { vec![rng.gen_range(0..ranks as i32)] } else { vec![] };
        let localized = rng.gen_bool(0.5);
        let writes = rng.gen_range(10..=40);
        let mut stalls = Vec::new();
        for &(victim, _) in &kills {
            let stops = in_recovery.is_none_or(|(v, _)| v != victim) && rng.gen_bool(0.3);
            if stops {
                stalls.push((victim, Duration::from_micros(rng.gen_range(500..20_000))));
            }
        }
        let plain_victim = kills.first().map(|&(v, _)| v).filter(|&v| {
            stalls.iter().all(|&(s, _)| s != v)
                && in_recovery.is_none_or(|(r, _)| r != v)
                && inside_barrier != Some(v)
        });
        let stuck_put = plain_victim
            .filter(|_| rng.gen_bool(0.1))
            .map(|v| (v, rng.gen_range(1..=writes as usize / 2)));
        let stuck_shrink = stuck_shrink(&mut rng, ranks, copies, &kills);
        Scenario {
            seed,
            ranks,
            hosts,
            copies,
            localized,
            kills,
            in_recovery,
            inside_barrier,
            stalls,
            slow,
            writes,
            stuck_put,
            stuck_shrink,
        }
    }

    fn describe(&self) -> String {
        let mode = if self.localized { "localized" } else { "global" };
        format!(
            "{} ranks on hosts {:?}, {} copies, {mode}, {} writes, kills {:?}, in recovery {:?}, \
             inside a barrier {:?}, stalls {:?}, stuck put {:?}, stuck shrink {:?}, slow {:?}",
            self.ranks,
            self.hosts,
            self.copies,
            self.writes,
            self.kills,
            self.in_recovery,
            self.inside_barrier,
            self.stalls,
            self.stuck_put,
            self.stuck_shrink,
            self.slow
        )
    }

    /// Victim `rank`'s fault at step `at`: a kill, or a stop that is declared failed later.
    fn fault(&self, rank: i32, at: u64) -> Fault {
        match self.stalls.iter().find(|&&(v, _)| v == rank) {
            Some(&(_, declared)) => Fault::Stall { rank, at, declared_after: Some(declared) },
            None => Fault::Kill { rank, at },
        }
    }

    /// Whether `rank` may end in this scenario: a victim, or a rank a stuck shrink ends.
    fn may_end(&self, rank: i32) -> bool {
        self.kills.iter().any(|&(v, _)| v == rank)
            || match self.stuck_shrink {
                Some(StuckShrink::Alone(stuck)) => stuck == rank,
                Some(StuckShrink::Everywhere) => true,
                None => false,
            }
    }

    /// Arms the stuck calls on `cluster`.
    fn arm_stuck_calls(&self, cluster: &LocalCluster) {
        if let Some((victim, nth)) = self.stuck_put {
            cluster.stop_at(victim, "put_stall", nth);
        }
        match self.stuck_shrink {
            Some(StuckShrink::Alone(stuck)) => cluster.stop_at(stuck, "recovery_after_shrink", 1),
            Some(StuckShrink::Everywhere) => {
                (0..self.ranks as i32).for_each(|r| cluster.stop_at(r, "recovery_stall_shrink", 1))
            }
            None => {}
        }
    }

    fn config(&self) -> Config {
        let mut config = Config::new(["checkpoint", "loot"], self.copies);
        config.initial_capacity = 256;
        config.max_value = 8 << 10;
        // Fixed here, not read from the environment: the same seed runs alike everywhere.
        config.suspicion = SUSPICION;
        config.recovery_watchdog = RECOVERY_WATCHDOG;
        config.watchdog = WATCHDOG;
        let spans_hosts = self.hosts.iter().any(|&h| h != self.hosts[0]);
        if self.stuck_put.is_some() && spans_hosts {
            // The victim sits in its put for the cross-host watchdog's seconds: a slower
            // detector poll spares the steps.
            config.poll_interval = STUCK_POLL;
        }
        if self.localized {
            config = config.localized();
        }
        config
    }
}

/// The scenarios' suspicion bound: across hosts the watchdog is then the store's floor there
/// ([`ftkv::CROSS_HOST_WATCHDOG`]).
const SUSPICION: Duration = Duration::from_secs(2);
/// The scenarios' watchdog on one host: far above a put's virtual time, also to a stopped
/// holder until it is declared (at most 20 ms).
const WATCHDOG: Duration = Duration::from_millis(100);
/// The detector's poll when a stuck put waits for the cross-host watchdog.
const STUCK_POLL: Duration = Duration::from_millis(10);
/// The scenarios' recovery watchdog: far above a recovery step's virtual time with every
/// member inside, short enough that a stuck shrink costs few steps.
const RECOVERY_WATCHDOG: Duration = Duration::from_millis(500);

/// A recovery's shrink that never returns: on one survivor in half the scenarios where
/// one more failure leaves every key a copy and a majority alive, on every rank in one of
/// twenty of the others with kills.
fn stuck_shrink(
    rng: &mut SmallRng,
    ranks: usize,
    copies: usize,
    kills: &[(i32, u64)],
) -> Option<StuckShrink> {
    if kills.is_empty() {
        return None;
    }
    let may_fail = (copies - 1).min((ranks - 1) / 2);
    if kills.len() < may_fail {
        let survivors: Vec<i32> =
            (0..ranks as i32).filter(|r| kills.iter().all(|&(v, _)| v != *r)).collect();
        let stuck = survivors[rng.gen_range(0..survivors.len())];
        rng.gen_bool(0.5).then_some(StuckShrink::Alone(stuck))
    } else {
        rng.gen_bool(0.05).then_some(StuckShrink::Everywhere)
    }
}

/// Every key's writes, as its owner tried them.
type History = Mutex<HashMap<(i32, u16), Vec<Op>>>;
/// What a survivor read: every key's observation, and each copy of its own keys (by kind).
struct Finals {
    reads: Vec<((i32, u16), Observed)>,
    own_copies: Vec<(u16, Vec<Observed>)>,
    live: usize,
    /// The store's workers after each recovery that changed them, in order: every survivor
    /// commits the same recoveries (each commit is agreed), so every survivor's list is the same.
    recovered_to: Vec<Vec<i32>>,
}

/// The survivors' meeting points outside the store (the harness's, not the protocol's): for
/// each point, the highest point each rank reached.
pub(crate) struct Meeting {
    cluster: LocalCluster,
    reached: Vec<AtomicUsize>,
}

/// The meeting points, in order.
const CREATED: usize = 1;
const WRITTEN: usize = 2;
const READ: usize = 3;

impl Meeting {
    /// A meeting of the ranks of `cluster`, none of them at a point yet.
    pub(crate) fn new(cluster: &LocalCluster, ranks: usize) -> Meeting {
        let reached = (0..ranks).map(|_| AtomicUsize::new(0)).collect();
        Meeting { cluster: cluster.clone(), reached }
    }

    /// Marks `point` reached by `me` and waits until every other live rank has too (the
    /// stores' creation: no recovery is possible yet).
    pub(crate) fn wait_for_all(&self, point: usize, me: i32) {
        self.reached[me as usize].store(point, Ordering::Release);
        let mut pause = MEETING_POLL;
        while !self.all_at(point) {
            pause = pause_longer(pause);
        }
    }

    /// Whether every rank is dead or has reached `point`.
    fn all_at(&self, point: usize) -> bool {
        (0..self.reached.len()).all(|r| {
            self.cluster.is_dead(r as i32) || self.reached[r].load(Ordering::Acquire) >= point
        })
    }

    /// Whether `store` knows of every rank's death.
    fn knows_every_death(&self, store: &Store<LocalFabric>) -> bool {
        let failed = store.failed();
        (0..self.reached.len() as i32).all(|r| !self.cluster.is_dead(r) || failed.contains(&r))
    }

    /// Marks `point` reached by `me` and waits for every other live rank, recovering whenever
    /// the store asks, until this rank's store knows of every death and needs no recovery: so
    /// no survivor starts a recovery once another passed the last point.
    fn wait_at(&self, point: usize, store: &mut Store<LocalFabric>, recovered_to: &mut Recovered) {
        self.wait_tending(point, store, |store| {
            if store.needs_recovery() {
                recover(store, recovered_to);
            }
        });
    }

    /// [`Meeting::wait_at`] that calls `tend` at every look instead of recovering: it must
    /// recover when the store needs it, and may do other chores (resolve failed workers'
    /// transactions).
    pub(crate) fn wait_tending(
        &self,
        point: usize,
        store: &mut Store<LocalFabric>,
        mut tend: impl FnMut(&mut Store<LocalFabric>),
    ) {
        self.reached[store.worker() as usize].store(point, Ordering::Release);
        let mut pause = MEETING_POLL;
        while !self.all_at(point) || store.needs_recovery() || !self.knows_every_death(store) {
            tend(store);
            pause = pause_longer(pause);
        }
    }
}

/// Sleeps `pause` of virtual time; the next pause of a meeting's wait.
fn pause_longer(pause: Duration) -> Duration {
    rt::sleep(pause);
    (pause * 2).min(MEETING_POLL_MAX)
}

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
    if let Some((victim, point)) = scenario.in_recovery {
        cluster.arm(victim, point, 1);
    }
    scenario.arm_stuck_calls(&cluster);
    let history: Arc<History> = Arc::default();
    let meeting = Arc::new(Meeting::new(&cluster, scenario.ranks));
    let body = {
        let (scenario, history, meeting) = (scenario.clone(), history.clone(), meeting.clone());
        move |fabric: LocalFabric| worker(fabric, &scenario, &history, &meeting)
    };
    let (results, outcome) = crate::world::run_cluster(&cluster, &world, body);
    let mut violations = Vec::new();
    if let Some(why) = &outcome.aborted {
        violations.push(why.clone());
    }
    let history = history.lock().unwrap_or_else(|p| p.into_inner());
    for (rank, result) in results.iter().enumerate() {
        match result {
            Err(panic) => violations.push(format!("rank {rank} panicked: {panic}")),
            Ok(Some(finals)) => violations.extend(judge(rank, finals, &history, scenario.copies)),
            Ok(None) => {}
        }
    }
    let recoveries: Vec<(usize, &Recovered)> = results
        .iter()
        .enumerate()
        .filter_map(|(rank, r)| match r {
            Ok(Some(finals)) => Some((rank, &finals.recovered_to)),
            _ => None,
        })
        .collect();
    if recoveries.windows(2).any(|w| w[0].1 != w[1].1) {
        violations.push(format!("the survivors committed different recoveries: {recoveries:?}"));
    }
    let ended: Vec<i32> =
        (0..results.len() as i32).filter(|&r| matches!(results[r as usize], Ok(None))).collect();
    let unplanned: Vec<i32> = ended.iter().copied().filter(|&r| !scenario.may_end(r)).collect();
    if !unplanned.is_empty() {
        violations.push(format!("ranks {unplanned:?} ended, no fault was planned for them"));
    }
    let everyone_may_end = scenario.stuck_shrink == Some(StuckShrink::Everywhere);
    if outcome.aborted.is_none() && ended.len() == results.len() && !everyone_may_end {
        violations.push("no rank survived".into());
    }
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

/// The reads of `rank` that its keys' histories do not allow, and its own keys with fewer
/// copies than the live workers allow or copies that differ.
fn judge(
    rank: usize,
    finals: &Finals,
    history: &HashMap<(i32, u16), Vec<Op>>,
    copies: usize,
) -> Vec<String> {
    let ops_of = |owner: i32, kind: u16| history.get(&(owner, kind)).map_or(&[][..], Vec::as_slice);
    let mut wrong: Vec<String> = finals
        .reads
        .iter()
        .filter_map(|&((owner, kind), read)| {
            let ops = ops_of(owner, kind);
            (!allowed(ops, read)).then(|| {
                format!("rank {rank} reads {read:?} for ({owner}, {kind}); history {ops:?}")
            })
        })
        .collect();
    let expected = copies.min(finals.live - 1);
    for (kind, held) in &finals.own_copies {
        let ops = ops_of(rank as i32, *kind);
        let whole = held.iter().all(|&c| allowed(ops, c)) && held.windows(2).all(|w| w[0] == w[1]);
        if held.len() != expected || !whole {
            wrong.push(format!(
                "rank {rank}'s key ({rank}, {kind}) has copies {held:?}, {expected} expected; \
                 history {ops:?}"
            ));
        }
    }
    wrong
}

/// One rank: creates the store, writes, meets the survivors, reads every key.
fn worker(
    fabric: LocalFabric,
    scenario: &Scenario,
    history: &History,
    meeting: &Meeting,
) -> Finals {
    let mut store = Store::create(&fabric, scenario.config()).expect("creating the store");
    let me = store.worker();
    meeting.wait_for_all(CREATED, me);
    let step_kill = scenario.kills.iter().find(|&&(v, _)| v == me).filter(|_| {
        scenario.inside_barrier != Some(me) && scenario.stuck_put.is_none_or(|(v, _)| v != me)
    });
    if let Some(&(_, after)) = step_kill {
        crate::world::plan_here(|now| scenario.fault(me, now + after));
    }
    if scenario.inside_barrier == Some(me) {
        let after = scenario.kills[0].0;
        crate::world::plan_here(|_| Fault::KillWaiting { rank: me, label: "in a barrier", after });
    }
    let mut recovered_to = Vec::new();
    write(&mut store, scenario, history, &mut recovered_to);
    if scenario.kills.iter().any(|&(v, _)| v == me) {
        // A victim dies within its writes: one that got here first dies now.
        crate::world::plan_here(|now| scenario.fault(me, now));
        rt::step("victim's end");
    }
    meeting.wait_at(WRITTEN, &mut store, &mut recovered_to);
    let mut finals = loop {
        match read_all(&mut store, scenario.localized) {
            Ok(finals) => break finals,
            Err(e) if e.needs_recovery() => {
                recover(&mut store, &mut recovered_to);
            }
            Err(e) => panic!("rank {me}: reading: {e}"),
        }
    };
    meeting.wait_at(READ, &mut store, &mut recovered_to);
    finals.recovered_to = recovered_to;
    finals
}

/// The rank's planned writes, each recorded before and acknowledged after.
fn write(
    store: &mut Store<LocalFabric>,
    scenario: &Scenario,
    history: &History,
    recovered_to: &mut Recovered,
) {
    let me = store.worker();
    let mut rng = SmallRng::seed_from_u64(scenario.seed ^ ((me as u64 + 1) << 32));
    for seq in 1..=scenario.writes {
        let (kind, delete) = planned_write(seq);
        let op = Op { seq, delete, acked: false };
        lock(history).entry((me, kind)).or_default().push(op);
        let key = Key::new(me, kind);
        let result = if delete {
            store.delete(key)
        } else {
            let len = if rng.gen_bool(0.2) { rng.gen_range(300..8_000) } else { 64 };
            store.put(key, &value(me, seq, len))
        };
        match result {
            Ok(()) => acknowledge(history, (me, kind), seq),
            Err(e) if e.needs_recovery() => {
                recover(store, recovered_to);
            }
            Err(e) => panic!("rank {me}: write {seq}: {e}"),
        }
    }
}

/// The store's workers after each recovery that changed them (see [`Finals`]).
type Recovered = Vec<Vec<i32>>;

/// Recovers until a recovery succeeds: one that a failure interrupted at its end (freeing the
/// replaced windows) returns that failure, and the survivors recover again. Notes the store's
/// workers after each call in `recovered_to` when they changed.
fn recover(store: &mut Store<LocalFabric>, recovered_to: &mut Recovered) {
    loop {
        let result = store.recover();
        if recovered_to.last().map(Vec::as_slice) != Some(store.live()) {
            recovered_to.push(store.live().to_vec());
        }
        match result {
            Ok(_) => return,
            Err(e) if e.needs_recovery() => continue,
            Err(e) => panic!("a recovery among the survivors: {e:?}"),
        }
    }
}

fn lock(history: &History) -> std::sync::MutexGuard<'_, HashMap<(i32, u16), Vec<Op>>> {
    history.lock().unwrap_or_else(|p| p.into_inner())
}

fn acknowledge(history: &History, key: (i32, u16), seq: u32) {
    let mut history = lock(history);
    let ops = history.get_mut(&key).expect("recorded before");
    if let Some(op) = ops.iter_mut().rev().find(|o| o.seq == seq) {
        op.acked = true;
    }
}

/// Every key as this rank reads it, and the copies of its own keys (after the repairs of every
/// failure known here, with localized recovery).
fn read_all(store: &mut Store<LocalFabric>, localized: bool) -> ftkv::Result<Finals> {
    if localized {
        store.follow()?;
    }
    let me = store.worker();
    let mut reads = Vec::new();
    for owner in 0..store.workers() as i32 {
        for kind in 0..2u16 {
            let read = store.get(Key::new(owner, kind))?;
            reads.push(((owner, kind), observe(owner, read.as_deref())));
        }
    }
    let mut own_copies = Vec::new();
    for kind in 0..2u16 {
        let held = store.read_copies(Key::new(me, kind))?;
        own_copies.push((kind, held.iter().map(|(_, v)| observe(me, v.as_deref())).collect()));
    }
    let live = (0..store.workers() as i32).filter(|w| !store.failed().contains(w)).count();
    Ok(Finals { reads, own_copies, live, recovered_to: Vec::new() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scenarios_include_every_stuck_call() {
        let scenarios: Vec<Scenario> = (1..=10_000).map(Scenario::of).collect();
        let count = |f: &dyn Fn(&Scenario) -> bool| scenarios.iter().filter(|s| f(s)).count();
        let across_hosts = |s: &Scenario| s.hosts.iter().any(|&h| h != s.hosts[0]);
        let puts = count(&|s| s.stuck_put.is_some());
        let puts_across = count(&|s| s.stuck_put.is_some() && across_hosts(s));
        let alone = count(&|s| matches!(s.stuck_shrink, Some(StuckShrink::Alone(_))));
        let everywhere = count(&|s| s.stuck_shrink == Some(StuckShrink::Everywhere));
        let global_alone =
            count(&|s| !s.localized && matches!(s.stuck_shrink, Some(StuckShrink::Alone(_))));
        let drawn = format!(
            "stuck puts {puts} ({puts_across} across hosts), shrinks alone {alone} \
             ({global_alone} global), everywhere {everywhere}"
        );
        assert!(puts_across >= 100 && puts - puts_across >= 50, "{drawn}");
        assert!(global_alone >= 80 && everywhere >= 100, "{drawn}");
    }

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
