//! Protocol scenarios on the in-process fabric: ranks are threads, kills are exact. Every
//! scenario runs under a hard timeout; the randomized ones print their seed, and
//! `FTKV_SEED=<n>` replays one.

mod common;

use std::collections::HashMap;
use std::sync::Mutex;

use common::{acknowledge, within};
use ftkv::fabric::local::{LocalCluster, LocalFabric};
use ftkv::{Config, Error, Key, Store};
use ftkv_sim::history::{allowed, observe, planned_write, value, Observed, Op};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn config(copies: usize) -> Config {
    let mut config = Config::new(["checkpoint", "loot"], copies);
    config.initial_capacity = 1024;
    config.max_value = 16 << 10;
    config
}

fn recover(store: &mut Store<LocalFabric>) {
    store.recover().expect("recovery among the survivors");
}

fn sync_until_done(store: &mut Store<LocalFabric>) {
    loop {
        match store.sync() {
            Ok(()) => return,
            Err(e) if e.needs_recovery() => recover(store),
            Err(e) => panic!("sync: {e}"),
        }
    }
}

#[test]
fn put_get_delete_round_trip_on_2_to_8_ranks() {
    for ranks in 2..=8usize {
        let copies = (ranks - 1).min(3);
        let reads = within(30, format!("{ranks} ranks"), move || {
            LocalCluster::new(ranks).run(|fabric| {
                let mut store = Store::create(&fabric, config(copies)).expect("create");
                let me = store.worker();
                store.put(Key::new(me, 0), &value(me, 1, 100 + me as usize)).expect("put");
                store.put(Key::new(me, 1), &value(me, 2, 10)).expect("put loot");
                store.delete(Key::new(me, 1)).expect("delete loot");
                store.sync().expect("sync");
                let all: Vec<_> = (0..ranks as i32)
                    .map(|o| {
                        (store.get(Key::new(o, 0)).unwrap(), store.get(Key::new(o, 1)).unwrap())
                    })
                    .collect();
                store.sync().expect("sync");
                all
            })
        });
        for (reader, read) in reads.into_iter().enumerate() {
            for (owner, (checkpoint, loot)) in read.expect("nobody killed").into_iter().enumerate()
            {
                let owner = owner as i32;
                assert_eq!(
                    checkpoint,
                    Some(value(owner, 1, 100 + owner as usize)),
                    "rank {reader}"
                );
                assert_eq!(loot, None, "rank {reader} reads the deleted loot of {owner}");
            }
        }
    }
}

#[test]
fn bad_input_is_rejected_without_harm() {
    let results = within(30, "bad input".into(), || {
        LocalCluster::new(3).run(|fabric| {
            let mut store = Store::create(&fabric, config(2)).expect("create");
            let me = store.worker();
            let foreign = store.put(Key::new((me + 1) % 3, 0), b"x");
            let too_large = store.put(Key::new(me, 0), &vec![0u8; (16 << 10) + 1]);
            let unknown_kind = store.put(Key::new(me, 7), b"x");
            let unknown_owner = store.get(Key::new(9, 0));
            store.put(Key::new(me, 0), b"fine").expect("a good put after bad ones");
            store.sync().expect("sync");
            let read = store.get(Key::new((me + 1) % 3, 0)).expect("get");
            (foreign, too_large, unknown_kind, unknown_owner.map(drop), read)
        })
    });
    for result in results {
        let (foreign, too_large, unknown_kind, unknown_owner, read) = result.expect("alive");
        assert!(matches!(foreign, Err(Error::ForeignOwner { .. })), "{foreign:?}");
        assert!(matches!(too_large, Err(Error::ValueTooLarge { .. })), "{too_large:?}");
        assert!(matches!(unknown_kind, Err(Error::UnknownKindIndex(7))), "{unknown_kind:?}");
        assert!(matches!(unknown_owner, Err(Error::UnknownOwner(9))), "{unknown_owner:?}");
        assert_eq!(read.as_deref(), Some(&b"fine"[..]));
    }
}

/// Rank 0 writes its key again and again (its own puts, written in order without a hash)
/// while ranks 1 and 2 read it: every read is one whole value written, never a mix, never the
/// key's absence, and the values read never go back. Sizes alternate between inline values and
/// values in extents, so a half changes from one kind to the other under the readers.
#[test]
fn gets_during_the_owners_puts_read_whole_values() {
    for (reader, seen) in gets_during_writes(false) {
        let mut last = 0;
        for observed in seen {
            match observed {
                Observed::Seq(seq) => {
                    assert!(seq >= last, "reader {reader} read {seq} after {last}");
                    last = seq;
                }
                Observed::Absent => assert_eq!(last, 0, "reader {reader}: absent after {last}"),
                other => panic!("reader {reader} read {other:?}"),
            }
        }
    }
}

/// The same with every fifth write a delete (whose header is hashed and which gives a half's
/// extent back): every read is one whole value written or the key's absence, never a mix.
#[test]
fn gets_during_the_owners_puts_and_deletes_read_whole_values_or_none() {
    for (reader, seen) in gets_during_writes(true) {
        for observed in seen {
            let whole = matches!(observed, Observed::Seq(_) | Observed::Absent);
            assert!(whole, "reader {reader} read {observed:?}");
        }
    }
}

/// Rank 0 writes its key 20,000 times (every fifth a delete with `deletes`) while ranks 1
/// and 2 read it twice as often; what each reader saw, in order.
fn gets_during_writes(deletes: bool) -> Vec<(usize, Vec<Observed>)> {
    let reads = within(60, "concurrent gets".into(), move || {
        LocalCluster::new(3).run(move |fabric| {
            let mut config = config(2);
            config.initial_capacity = 256;
            let mut store = Store::create(&fabric, config).expect("create");
            let key = Key::new(0, 0);
            let writes = 20_000u32;
            let mut seen = Vec::new();
            if store.worker() == 0 {
                for seq in 1..=writes {
                    if deletes && seq % 5 == 0 {
                        store.delete(key).expect("delete");
                        continue;
                    }
                    let len = [20, 200, 3000, 9000][seq as usize % 4];
                    store.put(key, &value(0, seq, len)).expect("put");
                }
            } else {
                for _ in 0..writes * 2 {
                    seen.push(observe(0, store.get(key).expect("get").as_deref()));
                }
            }
            store.sync().expect("sync");
            seen
        })
    });
    let readers = reads.into_iter().enumerate().skip(1);
    readers.map(|(reader, seen)| (reader, seen.expect("nobody killed"))).collect()
}

/// Kills worker 1 at the `nth` pass through `failpoint` (each put passes it once per copy, two
/// copies) while it overwrites its checkpoint; every survivor must then read its previous or
/// its new value, never anything else.
fn writer_killed_at(failpoint: &'static str, nth: usize) {
    let cluster = LocalCluster::new(4);
    cluster.arm(1, failpoint, nth);
    let reads = within(30, failpoint.into(), move || {
        cluster.run(|fabric| {
            let mut store = Store::create(&fabric, config(2)).expect("create");
            let me = store.worker();
            store.put(Key::new(me, 0), &value(me, 1, 3000)).expect("first put");
            store.sync().expect("sync");
            if me == 1 {
                let _ = store.put(Key::new(me, 0), &value(me, 2, 5000));
                unreachable!("worker 1 dies inside its second put");
            }
            sync_until_done(&mut store);
            store.get(Key::new(1, 0)).expect("read the dead writer's key")
        })
    });
    assert!(reads[1].is_none(), "worker 1 was killed");
    for read in reads.into_iter().flatten() {
        let read = read.expect("a surviving copy");
        assert!(read == value(1, 1, 3000) || read == value(1, 2, 5000), "torn or stale value");
    }
}

/// A value that moves between its slot (1 KiB inline) and its half's extent, or whose extent
/// grows or shrinks, with its writer (worker 1) killed at every step of the third put: after
/// the first copy's data, between copies, after the second copy's data. Every survivor reads
/// the second or the third value, never a torn one. The sizes exercise each move: inline to
/// extent, extent to inline (the half's old extent given back), an extent grown 10×, one
/// shrunk 10×.
#[test]
fn a_writer_killed_at_every_step_of_a_growth_leaves_old_or_new() {
    let moves: [[usize; 3]; 4] =
        [[500, 600, 5000], [5000, 600, 700], [1500, 1600, 16_000], [16_000, 16_000, 1600]];
    for sizes in moves {
        // Puts 1 and 2 pass each failpoint twice (two copies); the third put passes 5 and 6.
        for (failpoint, nth) in
            [("put_before_header", 5), ("put_between_copies", 5), ("put_before_header", 6)]
        {
            writer_killed_growing(failpoint, nth, sizes);
        }
    }
}

fn writer_killed_growing(failpoint: &'static str, nth: usize, sizes: [usize; 3]) {
    let cluster = LocalCluster::new(4);
    cluster.arm(1, failpoint, nth);
    let reads = within(30, format!("{failpoint}#{nth} {sizes:?}"), move || {
        cluster.run(|fabric| {
            let mut store = Store::create(&fabric, config(2)).expect("create");
            let me = store.worker();
            for (seq, &len) in sizes[..2].iter().enumerate() {
                store.put(Key::new(me, 0), &value(me, seq as u32 + 1, len)).expect("put");
            }
            store.sync().expect("sync");
            if me == 1 {
                let _ = store.put(Key::new(me, 0), &value(me, 3, sizes[2]));
                unreachable!("worker 1 dies inside its third put ({failpoint}#{nth} {sizes:?})");
            }
            sync_until_done(&mut store);
            store.get(Key::new(1, 0)).expect("read the dead writer's key")
        })
    });
    assert!(reads[1].is_none(), "worker 1 was killed");
    let allowed = [value(1, 2, sizes[1]), value(1, 3, sizes[2])];
    for read in reads.into_iter().flatten() {
        let read = read.expect("a surviving copy");
        assert!(allowed.contains(&read), "torn or stale value at {failpoint}#{nth} {sizes:?}");
    }
}

#[test]
fn writer_killed_between_data_and_header_leaves_old_or_new() {
    writer_killed_at("put_before_header", 3);
    writer_killed_at("put_before_header", 4);
}

#[test]
fn writer_killed_between_copies_leaves_old_or_new() {
    writer_killed_at("put_between_copies", 3);
}

/// A randomized run: ranks, copies, up to `copies − 1` kills at random failpoints (one of them
/// possibly during recovery), every survivor checks every key against the writers' histories.
fn random_scenario(seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let ranks = rng.gen_range(3..=8usize);
    let copies = rng.gen_range(1..=3usize.min(ranks - 1));
    let kills = (copies - 1).min(ranks - 2);
    let cluster = LocalCluster::new(ranks);
    let drawn = ftkv_sim::scenario::victims(&mut rng, kills, ranks, |rng, before| {
        if before.len() == 1 {
            (["recovery_after_shrink", "recovery_mid_copy"][rng.gen_range(0..2)], 1)
        } else {
            (["put_before_header", "put_between_copies"][rng.gen_range(0..2)], rng.gen_range(1..60))
        }
    });
    for &(victim, (point, nth)) in &drawn {
        cluster.arm(victim, point, nth);
    }
    let victims: Vec<i32> = drawn.iter().map(|&(victim, _)| victim).collect();
    let ops_per_rank = 80u32;
    let history: Mutex<HashMap<(i32, u16), Vec<Op>>> = Mutex::new(HashMap::new());
    let what = format!("seed {seed}: {ranks} ranks, {copies} copies, kills {victims:?}");
    println!("{what}");
    let history = std::sync::Arc::new(history);
    let shared = history.clone();
    let finals = within(60, what.clone(), move || {
        cluster.run(|fabric| run_worker(fabric, copies, ops_per_rank, seed, &shared))
    });
    for &victim in &victims {
        assert!(finals[victim as usize].is_none(), "{what}: victim {victim} was not killed");
    }
    assert!(finals.iter().flatten().count() >= 2, "{what}: survivors finished");
    let history = history.lock().unwrap();
    for (reader, finals) in finals.iter().enumerate() {
        let Some(finals) = finals else { continue };
        for (&(owner, kind), &read) in finals {
            let ops = history.get(&(owner, kind)).map_or(&[][..], Vec::as_slice);
            assert!(
                allowed(ops, read),
                "{what}: rank {reader} reads {read:?} for ({owner}, {kind}), history {ops:?}"
            );
        }
    }
}

type Finals = HashMap<(i32, u16), Observed>;

fn run_worker(
    fabric: LocalFabric,
    copies: usize,
    ops: u32,
    seed: u64,
    history: &Mutex<HashMap<(i32, u16), Vec<Op>>>,
) -> Finals {
    let mut store = Store::create(&fabric, config(copies)).expect("create");
    let me = store.worker();
    let mut rng = SmallRng::seed_from_u64(seed ^ ((me as u64) << 32));
    for seq in 1..=ops {
        let (kind, delete) = planned_write(seq);
        let op = Op { seq, delete, acked: false };
        history.lock().unwrap().entry((me, kind)).or_default().push(op);
        let key = Key::new(me, kind);
        let result = if delete {
            store.delete(key)
        } else {
            store.put(key, &value(me, seq, rng.gen_range(16..12_000)))
        };
        match result {
            Ok(()) => acknowledge(history, (me, kind), seq),
            Err(e) if e.needs_recovery() => recover(&mut store),
            Err(e) => panic!("worker {me}: {e}"),
        }
    }
    sync_until_done(&mut store);
    let workers = store.workers() as i32;
    let mut finals = Finals::new();
    for owner in 0..workers {
        for kind in 0..2u16 {
            let read = store.get(Key::new(owner, kind)).expect("get");
            finals.insert((owner, kind), observe(owner, read.as_deref()));
        }
    }
    store.sync().expect("final sync");
    finals
}

#[test]
fn random_kills_lose_no_acknowledged_write() {
    let seeds: Vec<u64> = match std::env::var("FTKV_SEED") {
        Ok(seed) => vec![seed.parse().expect("FTKV_SEED is a number")],
        Err(_) => (1..=200).collect(),
    };
    for seed in seeds {
        random_scenario(seed);
    }
}

/// Every holder of a live owner's key dies (1 copy, its holder killed): recovery reports the key
/// lost, reads of it say so, and the owner's next put restores it for every reader.
#[test]
fn a_live_owner_restores_its_lost_key_by_writing_it() {
    let cluster = LocalCluster::new(4);
    cluster.arm(1, "holder_dies", 1);
    let results = within(30, "lost key restored".into(), move || {
        cluster.run(|fabric| {
            let mut store = Store::create(&fabric, config(1)).expect("create");
            let me = store.worker();
            store.put(Key::new(me, 0), &value(me, 1, 100)).expect("first put");
            store.sync().expect("sync");
            fabric_point(&fabric, "holder_dies");
            let report = loop {
                match store.sync() {
                    Ok(()) => store.sync().expect("a failure was expected"),
                    Err(e) if e.needs_recovery() => break store.recover().expect("recover"),
                    Err(e) => panic!("sync: {e}"),
                }
            };
            sync_until_done(&mut store);
            let before = store.get(Key::new(0, 0));
            sync_until_done(&mut store);
            if me == 0 {
                store.put(Key::new(0, 0), &value(0, 2, 200)).expect("the owner rewrites its key");
            }
            sync_until_done(&mut store);
            let after = store.get(Key::new(0, 0)).expect("the restored key reads");
            let lost = (report.keys_lost, report.keys_to_rewrite);
            (lost, before.map_err(|e| e.to_string()), after)
        })
    });
    assert!(results[1].is_none(), "holder 1 was killed");
    for (rank, result) in results.into_iter().enumerate().filter(|(r, _)| *r != 1) {
        let ((lost, to_rewrite), before, after) = result.expect("a survivor");
        assert!(lost.is_empty(), "rank {rank}: a live owner's key reported lost: {lost:?}");
        let reported = to_rewrite.contains(&Key::new(0, 0));
        assert!(reported, "rank {rank}: reported for its owner to write again: {to_rewrite:?}");
        assert!(before.is_err_and(|e| e.contains("lost")), "rank {rank}: lost before rewrite");
        assert_eq!(after, Some(value(0, 2, 200)), "rank {rank} reads the restored value");
    }
}

fn fabric_point(fabric: &LocalFabric, name: &str) {
    use ftkv::fabric::Fabric;
    fabric.failpoint(name);
}

/// 6 workers over 3 hosts, by slot (0 1 | 2 3 | 4 5) and by node (0 3 | 1 4 | 2 5).
const BY_SLOT: [u32; 6] = [0, 0, 1, 1, 2, 2];
const BY_NODE: [u32; 6] = [0, 1, 2, 0, 1, 2];

/// The last values [`write_rounds`] acknowledged for `owner`'s two kinds.
fn last_values(owner: i32) -> [Vec<u8>; 2] {
    [value(owner, 5, 500), value(owner, 15, 50)]
}

/// Five rounds of puts to both own keys, then a sync: every write acknowledged.
fn write_rounds(store: &mut Store<LocalFabric>) {
    let me = store.worker();
    for seq in 1..=5 {
        store.put(Key::new(me, 0), &value(me, seq, 100 * seq as usize)).expect("put");
        store.put(Key::new(me, 1), &value(me, 10 + seq, 50)).expect("put loot");
    }
    store.sync().expect("sync after the writes");
}

/// Syncs until a failure shows, then recovers (a sync may still succeed just after a kill).
fn recover_from_failure(store: &mut Store<LocalFabric>) -> ftkv::RecoveryReport {
    for _ in 0..3 {
        match store.sync() {
            Ok(()) => continue,
            Err(e) if e.needs_recovery() => return store.recover().expect("recover"),
            Err(e) => panic!("sync: {e}"),
        }
    }
    panic!("worker {}: no failure noticed", store.worker());
}

/// Every key of every owner reads its last acknowledged value.
fn assert_last_values(store: &mut Store<LocalFabric>) {
    for owner in 0..store.workers() as i32 {
        for (kind, want) in last_values(owner).into_iter().enumerate() {
            let read = store.get(Key::new(owner, kind as u16)).expect("get");
            assert_eq!(read, Some(want), "worker {} reads ({owner}, {kind})", store.worker());
        }
    }
}

/// How many hosts other than `owner`'s the workers `ranks` run on.
fn other_hosts(ranks: &[i32], hosts: &[u32], owner: i32) -> usize {
    let mut others: Vec<u32> =
        ranks.iter().map(|&r| hosts[r as usize]).filter(|&h| h != hosts[owner as usize]).collect();
    others.sort_unstable();
    others.dedup();
    others.len()
}

/// Every key has `copies` distinct live holders (as far as enough workers live), none its
/// owner, on as many hosts other than its owner's as the live workers offer.
fn assert_spread(store: &mut Store<LocalFabric>, copies: usize) {
    let hosts = store.hosts().to_vec();
    let live = store.live().to_vec();
    for owner in 0..store.workers() as i32 {
        let candidates: Vec<i32> = live.iter().copied().filter(|&w| w != owner).collect();
        for kind in 0..2u16 {
            let copies_read = store.read_copies(Key::new(owner, kind)).expect("read copies");
            let mut holders: Vec<i32> = copies_read.into_iter().map(|(w, _)| w).collect();
            let what = format!("({owner}, {kind}) on {holders:?}, live {live:?}");
            assert!(!holders.contains(&owner), "{what}");
            let spread = other_hosts(&holders, &hosts, owner);
            assert_eq!(spread, copies.min(other_hosts(&candidates, &hosts, owner)), "{what}");
            holders.sort_unstable();
            holders.dedup();
            assert_eq!(holders.len(), copies.min(candidates.len()), "{what}");
        }
    }
}

/// Both workers of host 1 die at one instant: with 2 copies on distinct hosts other than the
/// owner's, every key keeps a copy, and recovery restores every acknowledged value.
#[test]
fn a_whole_host_lost_at_once_loses_no_acknowledged_write() {
    let cluster = LocalCluster::new(6).with_hosts(BY_SLOT.to_vec());
    let killer = cluster.clone();
    let results = within(30, "a host lost".into(), move || {
        cluster.run(|fabric| {
            let mut store = Store::create(&fabric, config(2)).expect("create");
            assert_eq!(store.hosts(), BY_SLOT);
            assert_spread(&mut store, 2);
            write_rounds(&mut store);
            if store.worker() == 0 {
                killer.kill_all(&[2, 3]);
            }
            let report = recover_from_failure(&mut store);
            sync_until_done(&mut store);
            assert_last_values(&mut store);
            assert_spread(&mut store, 2);
            store.sync().expect("final sync");
            report
        })
    });
    assert!(results[2].is_none() && results[3].is_none(), "host 1's workers were killed");
    for (worker, report) in results.into_iter().enumerate().filter(|(w, _)| ![2, 3].contains(w)) {
        let report = report.expect("a survivor");
        assert_eq!(report.failed, vec![2, 3], "worker {worker}");
        assert!(report.keys_lost.is_empty(), "worker {worker}: lost {:?}", report.keys_lost);
    }
}

/// One worker dies, then a whole host: after each recovery every key's copies are again on
/// distinct hosts other than its owner's where the survivors allow, and no value is lost.
#[test]
fn recovery_places_copies_on_other_hosts_again() {
    let cluster = LocalCluster::new(6).with_hosts(BY_NODE.to_vec());
    let killer = cluster.clone();
    let results = within(30, "copies spread after recovery".into(), move || {
        cluster.run(|fabric| {
            let mut store = Store::create(&fabric, config(2)).expect("create");
            write_rounds(&mut store);
            let mut failed = Vec::new();
            for victims in [&[4][..], &[2, 5]] {
                if store.worker() == 0 {
                    killer.kill_all(victims);
                }
                let report = recover_from_failure(&mut store);
                assert!(report.keys_lost.is_empty(), "lost {:?}", report.keys_lost);
                failed.extend(report.failed);
                sync_until_done(&mut store);
                assert_last_values(&mut store);
                assert_spread(&mut store, 2);
                store.sync().expect("sync after the checks");
            }
            (failed, store.live().to_vec())
        })
    });
    for (worker, result) in results.into_iter().enumerate() {
        if [2, 4, 5].contains(&worker) {
            assert!(result.is_none(), "worker {worker} was killed");
            continue;
        }
        let (failed, live) = result.expect("a survivor");
        assert_eq!((failed, live), (vec![4, 2, 5], vec![0, 1, 3]), "worker {worker}");
    }
}

/// A survivor that calls recover long after the recovery deadline (7 times
/// the 200 ms bound here) holds the others inside their recovery; none of them ends itself,
/// and every survivor reads every key, the dead worker's too.
#[test]
fn a_late_survivor_holds_the_others_past_the_recovery_deadline() {
    let cluster = LocalCluster::new(4);
    cluster.arm(1, "holder_dies", 1);
    let results = within(60, "late survivor".into(), move || {
        cluster.run(|fabric| {
            let mut config = config(2);
            config.recovery_watchdog = std::time::Duration::from_millis(200);
            let mut store = Store::create(&fabric, config).expect("create");
            let me = store.worker();
            store.put(Key::new(me, 0), &value(me, 1, 100)).expect("put");
            store.sync().expect("sync");
            fabric_point(&fabric, "holder_dies");
            common::wait_until("the failure is noticed", || store.needs_recovery());
            if me == 3 {
                std::thread::sleep(std::time::Duration::from_millis(1400));
            }
            let report = store.recover().expect("recover");
            let reads: Vec<_> = (0..4).map(|o| store.get(Key::new(o, 0)).expect("get")).collect();
            (report.failed, reads)
        })
    });
    assert!(results[1].is_none(), "worker 1 was killed");
    for (rank, result) in results.into_iter().enumerate().filter(|(r, _)| *r != 1) {
        let (failed, reads) = result.unwrap_or_else(|| panic!("survivor {rank} ended itself"));
        assert_eq!(failed, vec![1], "rank {rank}");
        for (owner, read) in reads.into_iter().enumerate() {
            assert_eq!(read, Some(value(owner as i32, 1, 100)), "rank {rank} reads {owner}");
        }
    }
}

/// Writers take turns on one key, its owner among them, one at a time (the barrier is the
/// outer lock): each handed write lands above the previous writer's, so every worker reads the
/// last value, and the owner's own `put` after its handed write lands above it too.
#[test]
fn writers_taking_turns_on_a_key_each_land_above_the_last() {
    within(30, "writers taking turns".into(), || {
        LocalCluster::new(3).run(|fabric| {
            let mut store = Store::create(&fabric, config(2)).expect("store");
            let key = Key::new(0, 1);
            let me = store.worker();
            for (turn, writer) in [1, 2, 0, 1, 0, 2].into_iter().enumerate() {
                if me == writer {
                    store.put_handed(key, format!("turn {turn}").as_bytes()).expect("handed");
                }
                store.sync().expect("no failure");
                let read = store.get(key).expect("read");
                assert_eq!(read, Some(format!("turn {turn}").into_bytes()), "turn {turn}");
                store.sync().expect("everyone read before the next turn");
            }
            if me == 0 {
                store.put(key, b"owner").expect("own put");
            }
            store.sync().expect("no failure");
            assert_eq!(store.get(key).expect("read").as_deref(), Some(&b"owner"[..]));
        });
    });
}
