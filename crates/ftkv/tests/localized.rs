//! Localized recovery on the in-process fabric: after kills during puts the survivors keep
//! writing without a collective recovery, only the owners whose keys lost a copy move data, and
//! every key is back at its full copy count. Every scenario runs under a hard timeout; the
//! randomized ones print their seed, and `FTKV_SEED=<n>` replays one.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{acknowledge, within, History};
use ftkv::engine::layout::{Layout, Shape};
use ftkv::fabric::local::{LocalCluster, LocalFabric};
use ftkv::fabric::Fabric;
use ftkv::slot::SlotGeometry;
use ftkv::{Config, Key, RepairReport, Store};
use ftkv_sim::history::{allowed, observe, planned_write, value, Observed, Op};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn config(copies: usize) -> Config {
    let mut config = Config::new(["checkpoint", "loot"], copies).localized();
    config.initial_capacity = 1024;
    config.max_value = 16 << 10;
    config
}

type Finals = HashMap<(i32, u16), Observed>;

/// What a survivor saw: reads while the store still ran on its first windows, the repairs it
/// made, whether it had to recover globally while writing, what its own keys' copies held, and
/// reads after the final global recovery.
struct Seen {
    before_global: Finals,
    repairs: Vec<RepairReport>,
    /// Why it had to recover globally while writing or reading, if it had to.
    went_global: Option<String>,
    own_copies: Vec<(usize, bool)>,
    after_global: Finals,
}

fn read_all(store: &mut Store<LocalFabric>) -> ftkv::Result<Finals> {
    let mut finals = Finals::new();
    for owner in 0..store.workers() as i32 {
        for kind in 0..2u16 {
            let read = store.get(Key::new(owner, kind))?;
            finals.insert((owner, kind), observe(owner, read.as_deref()));
        }
    }
    Ok(finals)
}

/// The survivors' meeting points outside the store: nobody reads before every survivor has
/// written, and nobody can send the store to global recovery (in its reads) while another
/// survivor could still join a global recovery started during the writes.
struct Meeting {
    victims: Vec<i32>,
    survivors: usize,
    written: AtomicUsize,
    settled: AtomicUsize,
    read: AtomicUsize,
}

impl Meeting {
    /// Waits for every survivor to finish writing, joining any global recovery meanwhile.
    ///
    /// A survivor counts itself written only once its routes follow every victim's failure
    /// without an escalation: the repairers escalate in the background, so only then can no
    /// survivor raise the alarm after the others passed this point.
    fn after_writes(&self, store: &mut Store<LocalFabric>, went_global: &mut Option<String>) {
        loop {
            if store.needs_recovery() {
                *went_global = Some("alarm after the writes".into());
                store.recover().expect("global recovery");
                continue;
            }
            let known = self.victims.iter().all(|v| store.failed().contains(v));
            match store.follow() {
                Ok(()) if known => break,
                Ok(()) => {}
                Err(e) if e.needs_recovery() => {}
                Err(e) => panic!("worker {}: {e}", store.worker()),
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        self.written.fetch_add(1, Ordering::AcqRel);
        while self.written.load(Ordering::Acquire) < self.survivors {
            if store.needs_recovery() {
                *went_global = Some("alarm after the writes".into());
                store.recover().expect("global recovery");
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        self.wait_for_all(&self.settled);
    }

    /// Waits until every survivor has passed `point` (no store call meanwhile).
    fn wait_for_all(&self, point: &AtomicUsize) {
        point.fetch_add(1, Ordering::AcqRel);
        while point.load(Ordering::Acquire) < self.survivors {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Writes `ops` planned writes; a failure that needs global recovery is recovered at once.
/// Then waits for every survivor, reads every key, checks its own keys' copies and finally
/// recovers globally (the collective way to drop the dead from the communicator).
fn localized_worker(
    fabric: LocalFabric,
    copies: usize,
    ops: u32,
    seed: u64,
    history: &History,
    meeting: &Meeting,
) -> Seen {
    let mut store = Store::create(&fabric, config(copies)).expect("create");
    let me = store.worker();
    let mut rng = SmallRng::seed_from_u64(seed ^ ((me as u64) << 32));
    let mut went_global = None;
    let mut last: HashMap<u16, Option<Vec<u8>>> = HashMap::new();
    for seq in 1..=ops {
        let (kind, delete) = planned_write(seq);
        history.lock().unwrap().entry((me, kind)).or_default().push(Op {
            seq,
            delete,
            acked: false,
        });
        let key = Key::new(me, kind);
        let bytes = (!delete).then(|| value(me, seq, rng.gen_range(16..12_000)));
        let result = match &bytes {
            Some(bytes) => store.put(key, bytes),
            None => store.delete(key),
        };
        match result {
            Ok(()) => {
                acknowledge(history, (me, kind), seq);
                last.insert(kind, bytes);
            }
            Err(e) if e.needs_recovery() => {
                went_global = Some(format!("write {seq}: {e}"));
                last.remove(&kind);
                store.recover().expect("global recovery");
            }
            Err(e) => panic!("worker {me}: {e}"),
        }
        if seq == 1 {
            // Every own checkpoint exists before the first victim dies (they die later).
            store.sync().expect("the sync after the first writes");
        }
    }
    meeting.after_writes(&mut store, &mut went_global);
    while !meeting.victims.iter().all(|v| store.failed().contains(v)) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let localized = store.follow().and_then(|()| {
        let own_copies = own_copies(&mut store, &last)?;
        Ok((own_copies, read_all(&mut store)?))
    });
    let (own_copies, before_global) = match localized {
        Ok(seen) => seen,
        Err(e) if e.needs_recovery() => {
            went_global = Some(format!("reads: {e}"));
            (Vec::new(), Finals::new())
        }
        Err(e) => panic!("worker {me}: {e}"),
    };
    let repairs = store.take_repairs();
    // A global recovery revokes the store: nobody starts it while others still read.
    meeting.wait_for_all(&meeting.read);
    store.recover().expect("the final global recovery");
    let after_global = read_all(&mut store).expect("reads after the global recovery");
    store.sync().expect("final sync");
    Seen { before_global, repairs, went_global, own_copies, after_global }
}

/// For each own key with a known last acknowledged write: how many live copies it has and
/// whether every one holds that write.
fn own_copies(
    store: &mut Store<LocalFabric>,
    last: &HashMap<u16, Option<Vec<u8>>>,
) -> ftkv::Result<Vec<(usize, bool)>> {
    let me = store.worker();
    let mut found = Vec::new();
    for (&kind, expected) in last {
        let copies = store.read_copies(Key::new(me, kind))?;
        let all_hold = copies.iter().all(|(_, v)| v == expected);
        found.push((copies.len(), all_hold));
    }
    Ok(found)
}

/// `ranks` ranks, `copies` copies, `victims` killed at their `nth` pass through a put's
/// failpoint.
struct Scenario {
    what: String,
    ranks: usize,
    copies: usize,
    victims: Vec<(i32, &'static str, usize)>,
}

impl Scenario {
    fn random(seed: u64) -> Scenario {
        let mut rng = SmallRng::seed_from_u64(seed);
        let ranks = rng.gen_range(4..=8usize);
        let copies = rng.gen_range(2..=3usize);
        let kills = rng.gen_range(1..copies);
        let drawn = ftkv_sim::scenario::victims(&mut rng, kills, ranks, |rng, _| {
            let point = ["put_before_header", "put_between_copies"][rng.gen_range(0..2)];
            (point, rng.gen_range(copies + 1..60))
        });
        let victims: Vec<(i32, &'static str, usize)> =
            drawn.into_iter().map(|(v, (point, nth))| (v, point, nth)).collect();
        let what = format!("seed {seed}: {ranks} ranks, {copies} copies, kills {victims:?}");
        Scenario { what, ranks, copies, victims }
    }

    fn run(&self, seed: u64) -> Vec<Option<Seen>> {
        println!("{}", self.what);
        let _ = tracing_subscriber::fmt().without_time().with_target(false).try_init();
        let cluster = LocalCluster::new(self.ranks);
        for &(victim, point, nth) in &self.victims {
            cluster.arm(victim, point, nth);
        }
        let history = Arc::new(History::default());
        let meeting = Arc::new(Meeting {
            victims: self.victims.iter().map(|v| v.0).collect(),
            survivors: self.ranks - self.victims.len(),
            written: AtomicUsize::new(0),
            settled: AtomicUsize::new(0),
            read: AtomicUsize::new(0),
        });
        let copies = self.copies;
        let shared = history.clone();
        let seen = within(60, self.what.clone(), move || {
            cluster.run(|fabric| localized_worker(fabric, copies, 80, seed, &shared, &meeting))
        });
        self.check_histories(&seen, &history.lock().unwrap());
        seen
    }

    fn check_histories(&self, seen: &[Option<Seen>], history: &HashMap<(i32, u16), Vec<Op>>) {
        let what = &self.what;
        for &(victim, _, _) in &self.victims {
            assert!(seen[victim as usize].is_none(), "{what}: victim {victim} was not killed");
        }
        for (reader, seen) in seen.iter().enumerate() {
            let Some(seen) = seen else { continue };
            for finals in [&seen.before_global, &seen.after_global] {
                for (&(owner, kind), &read) in finals {
                    let ops = history.get(&(owner, kind)).map_or(&[][..], Vec::as_slice);
                    assert!(
                        allowed(ops, read),
                        "{what}: rank {reader} reads {read:?} for ({owner}, {kind}), {ops:?}"
                    );
                }
            }
            // Copies never live on the owner: as many as the other survivors allow.
            let full = self.copies.min(self.ranks - self.victims.len() - 1);
            for &(count, all_hold) in &seen.own_copies {
                assert!(all_hold, "{what}: a copy of rank {reader}'s key is stale");
                assert_eq!(count, full, "{what}: rank {reader}'s key lacks a copy");
            }
        }
    }
}

#[test]
fn random_kills_are_repaired_locally_and_lose_no_acknowledged_write() {
    let seeds: Vec<u64> = match std::env::var("FTKV_SEED") {
        Ok(seed) => vec![seed.parse().expect("FTKV_SEED is a number")],
        Err(_) => (1..=60).collect(),
    };
    for seed in seeds {
        let scenario = Scenario::random(seed);
        let seen = scenario.run(seed);
        // One kill is repaired locally whenever a key has a reserve holder to move to.
        if scenario.victims.len() == 1 && scenario.ranks - 1 > scenario.copies {
            let global: Vec<_> =
                seen.iter().flatten().filter_map(|s| s.went_global.clone()).collect();
            assert!(global.is_empty(), "{}: one kill went global: {global:?}", scenario.what);
        }
    }
}

/// One kill: exactly the owners whose keys had a copy on the victim move data (one copy per
/// such key), nobody else does, and the survivors never recover globally while writing.
#[test]
fn only_owners_of_lost_copies_move_data() {
    let (ranks, copies, victim) = (6, 2, 4);
    let scenario = Scenario {
        what: format!("{ranks} ranks, {copies} copies, worker {victim} killed mid-put"),
        ranks,
        copies,
        victims: vec![(victim, "put_between_copies", 21)],
    };
    let seen = scenario.run(7);
    let all: Vec<i32> = (0..ranks as i32).collect();
    let geometry = SlotGeometry::new(16 << 10);
    let shape = Shape { kinds: 2, copies, spares: 1 };
    let layout = Layout::with_spares(&all, &vec![0; ranks], shape, geometry, 0);
    for (worker, seen) in seen.iter().enumerate() {
        let Some(seen) = seen else { continue };
        assert_eq!(seen.went_global, None, "worker {worker} recovered globally");
        let lost_copy = |kind: u16| {
            let route = layout.route(Key::new(worker as i32, kind)).unwrap();
            route.iter().any(|c| c.worker == victim)
        };
        let lost = (0..2u16).filter(|&kind| lost_copy(kind)).count();
        // A key not yet written when the victim died has nothing to move (the loot is first
        // written at the tenth write); the checkpoint is written before the victim can die.
        let moved: usize = seen.repairs.iter().map(|r| r.keys_moved).sum();
        let lower = lost_copy(0) as usize;
        assert!(
            (lower..=lost).contains(&moved),
            "worker {worker}: {moved} keys moved, {lost} had a copy on {victim}"
        );
        let bytes: u64 = seen.repairs.iter().map(|r| r.bytes_moved).sum();
        assert!(bytes > 0 || !lost_copy(0), "worker {worker}: its checkpoint's copy moved");
        assert!(seen.repairs.iter().all(|r| r.failed == vec![victim]), "{:?}", seen.repairs);
    }
}

/// Every survivor calls [`Store::follow`] until it knows `victim` failed, then waits for the
/// others to have done the same (`arrived` counts them; no store call meanwhile).
fn follow_until_failed(
    store: &mut Store<LocalFabric>,
    victim: i32,
    arrived: &AtomicUsize,
    survivors: usize,
) {
    while !store.failed().contains(&victim) {
        store.follow().expect("a localized follow");
        std::thread::sleep(Duration::from_micros(200));
    }
    store.follow().expect("a localized follow");
    arrived.fetch_add(1, Ordering::AcqRel);
    while arrived.load(Ordering::Acquire) < survivors {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Two kills in turn, the second a holder of the first victim's key: that key lost a copy and
/// its owner, so its first live holder copies it to the new holder. Nobody recovers globally
/// and every holder of the dead owner's key has its last acknowledged value.
#[test]
fn a_dead_owners_key_that_loses_a_copy_is_repaired_by_its_first_live_holder() {
    let (ranks, copies, first) = (6, 2, 1);
    let key = Key::new(first, 0);
    let layout = Layout::with_spares(
        &(0..ranks as i32).collect::<Vec<_>>(),
        &vec![0; ranks],
        Shape { kinds: 2, copies, spares: 1 },
        SlotGeometry::new(16 << 10),
        0,
    );
    let second = layout.route(key).unwrap()[0].worker;
    let outcomes = within(60, "two kills in turn".into(), move || {
        let cluster = LocalCluster::new(ranks);
        cluster.arm(first, "first_kill", 1);
        cluster.arm(second, "second_kill", 1);
        let (after_first, after_second) = (AtomicUsize::new(0), AtomicUsize::new(0));
        cluster.run(|fabric| {
            let mut store = Store::create(&fabric, config(copies)).expect("a store");
            let me = store.worker();
            store.put(Key::new(me, 0), format!("last of {me}").as_bytes()).expect("a put");
            store.sync().expect("every put acknowledged");
            fabric.failpoint("first_kill");
            follow_until_failed(&mut store, first, &after_first, ranks - 1);
            fabric.failpoint("second_kill");
            follow_until_failed(&mut store, second, &after_second, ranks - 2);
            let repairs: usize = store.take_repairs().iter().map(|r| r.keys_moved).sum();
            (store.needs_recovery(), store.read_copies(key).expect("copies"), repairs)
        })
    });
    let mut moved = 0;
    for (worker, outcome) in outcomes.into_iter().enumerate() {
        let Some((alarmed, copies_held, repairs)) = outcome else {
            assert!([first, second].contains(&(worker as i32)), "worker {worker} died");
            continue;
        };
        assert!(!alarmed, "worker {worker} needs a global recovery");
        assert_eq!(copies_held.len(), copies, "worker {worker}: {copies_held:?}");
        let want = format!("last of {first}").into_bytes();
        assert!(copies_held.iter().all(|(_, v)| v.as_ref() == Some(&want)), "{copies_held:?}");
        moved += repairs;
    }
    assert!(moved >= 1, "somebody moved the dead owner's key");
}

/// An owner that makes no store call after a failure still gets its key's lost copy back: its
/// repairer thread moves it while the owner sleeps, and another worker reads every copy of it
/// there. (Before the repairer existed the owner moved it at its next call, so this waited in
/// vain.) The owner then finds the move in its repair reports.
#[test]
fn an_idle_owners_lost_copy_is_repaired_in_the_background() {
    let (ranks, copies, victim, observer) = (6, 2, 4, 0);
    let layout = Layout::with_spares(
        &(0..ranks as i32).collect::<Vec<_>>(),
        &vec![0; ranks],
        Shape { kinds: 2, copies, spares: 1 },
        SlotGeometry::new(16 << 10),
        0,
    );
    let lost_a_copy =
        |w: i32| layout.route(Key::new(w, 0)).unwrap().iter().any(|c| c.worker == victim);
    let idle = (0..ranks as i32)
        .find(|&w| w != victim && w != observer && lost_a_copy(w))
        .expect("an owner with a copy on the victim");
    let outcomes = within(60, "an idle owner".into(), move || {
        let cluster = LocalCluster::new(ranks);
        cluster.arm(victim, "written", 1);
        let confirmed = AtomicUsize::new(0);
        cluster.run(|fabric| {
            let mut store = Store::create(&fabric, config(copies)).expect("a store");
            let me = store.worker();
            store.put(Key::new(me, 0), format!("last of {me}").as_bytes()).expect("a put");
            store.sync().expect("every put acknowledged");
            fabric.failpoint("written");
            if me == observer {
                let held = wait_for_full_copies(&mut store, victim, Key::new(idle, 0), copies);
                confirmed.store(1, Ordering::Release);
                return (held, Vec::new());
            }
            while confirmed.load(Ordering::Acquire) == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            (Vec::new(), store.take_repairs())
        })
    });
    let (held, _) = outcomes[observer as usize].as_ref().expect("the observer survived");
    let want = format!("last of {idle}").into_bytes();
    assert!(held.iter().all(|(_, v)| v.as_ref() == Some(&want)), "{held:?}");
    let (_, repairs) = outcomes[idle as usize].as_ref().expect("the idle owner survived");
    let moved: usize = repairs.iter().map(|r| r.keys_moved).sum();
    assert!(moved >= 1, "the idle owner reports no move: {repairs:?}");
    assert!(repairs.iter().all(|r| r.failed == vec![victim] && r.bytes_moved > 0), "{repairs:?}");
}

/// Once `victim`'s failure is known here, reads `key`'s copies until `copies` live holders
/// all have a value (at most 10 s).
fn wait_for_full_copies(
    store: &mut Store<LocalFabric>,
    victim: i32,
    key: Key,
    copies: usize,
) -> Vec<(i32, Option<Vec<u8>>)> {
    let started = std::time::Instant::now();
    while !store.failed().contains(&victim) {
        assert!(started.elapsed() < Duration::from_secs(10), "{victim}'s failure never noticed");
        std::thread::sleep(Duration::from_millis(1));
    }
    loop {
        let held = store.read_copies(key).expect("reads of a key with live copies");
        let full = held.len() == copies && held.iter().all(|(_, v)| v.is_some());
        if full {
            return held;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never repaired: {held:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}
