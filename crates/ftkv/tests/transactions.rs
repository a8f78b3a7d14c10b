//! `Store::transaction` on the in-process fabric: workers append their transaction ids to
//! their own key and their neighbour's in read-modify-write transactions, a quarter of them
//! conditioned on the value read just before and a quarter on a value that never holds, while one worker is killed at a named step of
//! the protocol. Every scenario ends judged: a transaction is in both keys' logs or in
//! neither, a committed one is in both, an aborted one in none, no log repeats an id, and the
//! logs admit a serial order. Every scenario runs under a hard timeout.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{wait_until, within};
use ftkv::fabric::local::{LocalCluster, LocalFabric};
use ftkv::fabric::Fabric;
use ftkv::txn::{Decision, Expect, Outcome, TxId, Txn};
use ftkv::{Config, Key, Store};
use ftkv_sim::txn_log::{append, judge as judge_logs, log_of};

const RANKS: usize = 5;
const TRANSACTIONS: u32 = 12;
const VICTIM: i32 = 2;

fn config() -> Config {
    let mut config = Config::new(["log"], 2).localized().with_transactions();
    config.initial_capacity = 1024;
    config.max_value = 4096;
    config
}

fn keys_of(coordinator: i32) -> [Key; 2] {
    [Key::new(coordinator, 0), Key::new((coordinator + 1) % RANKS as i32, 0)]
}

/// How one worker's transactions ended: (id, committed).
type Ended = Vec<(u64, bool)>;

fn worker(
    store: &mut Store<LocalFabric>,
    [finished, settled]: [&AtomicUsize; 2],
    cluster: &LocalCluster,
) -> Ended {
    let me = store.worker();
    let mut ended = Vec::new();
    for seq in 1..=TRANSACTIONS {
        let keys = keys_of(me);
        let mut txn = Txn { reads: keys.to_vec(), ..Txn::default() };
        if seq.is_multiple_of(4) {
            txn.conditions.push((keys[1], Expect::Value(Some(b"never".to_vec()))));
        } else if seq.is_multiple_of(2) {
            let seen = store.get(keys[1]).expect("a read before the transaction");
            txn.conditions.push((keys[1], Expect::Value(seen)));
        }
        let id = TxId::new(me, seq).0;
        let outcome = store.transaction(&txn, append(id)).expect("a transaction");
        ended.push((id, matches!(outcome, Outcome::Committed { .. })));
    }
    finished.fetch_add(1, Ordering::SeqCst);
    // Resolves as a backup until every worker finished or died, and once more after this
    // worker's store knows of the victim's death.
    loop {
        let dead = cluster.is_dead(VICTIM);
        let known = !dead || store.failed().contains(&VICTIM);
        let all_ended = finished.load(Ordering::SeqCst) + usize::from(dead) == RANKS;
        store.resolve_transactions().expect("resolving as a backup");
        if known && all_ended {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // Nobody reads before every survivor (the backup among them) has resolved.
    settled.fetch_add(1, Ordering::SeqCst);
    while settled.load(Ordering::SeqCst) + usize::from(cluster.is_dead(VICTIM)) < RANKS {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    ended
}

/// One scenario: the victim dies at the `nth` hit of `step` (never, for `None`).
fn scenario(kill: Option<(&'static str, usize)>) -> (BTreeMap<i32, Vec<u64>>, Vec<Ended>) {
    let name = format!("transactions with a kill at {kill:?}");
    within(60, name, move || {
        let cluster = LocalCluster::new(RANKS);
        if let Some((step, nth)) = kill {
            cluster.arm(VICTIM, step, nth);
        }
        let (finished, settled) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let results = cluster.run(|fabric| {
            let mut store = Store::create(&fabric, config()).expect("a store");
            let ended = worker(&mut store, [&finished, &settled], &cluster);
            let logs: BTreeMap<i32, Vec<u64>> = (0..RANKS as i32)
                .map(|owner| (owner, log_of(&store.get(Key::new(owner, 0)).expect("a read"))))
                .collect();
            (logs, ended)
        });
        let victim_died = results[VICTIM as usize].is_none();
        assert_eq!(
            victim_died,
            kill.is_some(),
            "the victim died iff a kill was armed: {kill:?} {:?}",
            results.iter().map(|r| r.as_ref().map(|(_, e)| e.len())).collect::<Vec<_>>()
        );
        let survivors: Vec<_> = results.into_iter().flatten().collect();
        assert!(survivors.len() >= RANKS - 1, "a survivor did not finish");
        for (logs, _) in &survivors {
            assert_eq!(logs, &survivors[0].0, "survivors read different logs");
        }
        let logs = survivors[0].0.clone();
        (logs, survivors.into_iter().map(|(_, ended)| ended).collect())
    })
}

fn judge(logs: &BTreeMap<i32, Vec<u64>>, ended: &[Ended], kill: Option<(&str, usize)>) {
    let by_key: BTreeMap<Key, Vec<u64>> =
        logs.iter().map(|(owner, log)| (Key::new(*owner, 0), log.clone())).collect();
    let planned: Vec<(u64, Vec<Key>)> = (0..RANKS as i32)
        .flat_map(|c| (1..=TRANSACTIONS).map(move |seq| (TxId::new(c, seq).0, keys_of(c).to_vec())))
        .collect();
    let ended: Vec<(u64, bool)> = ended.iter().flatten().copied().collect();
    let violations = judge_logs(&by_key, &planned, &ended);
    assert!(violations.is_empty(), "{kill:?}: {violations:?}");
}

#[test]
fn transactions_without_failures_are_atomic_and_serializable() {
    let (logs, ended) = scenario(None);
    judge(&logs, &ended, None);
    let committed = ended.iter().flatten().filter(|(_, c)| *c).count();
    assert!(committed >= RANKS * TRANSACTIONS as usize / 2, "{committed} committed");
}

#[test]
fn a_coordinator_killed_at_any_step_is_finished_by_its_backup() {
    for kill in [
        ("tx_announce", 3),
        ("tx_lock", 4),
        ("tx_read", 3),
        ("tx_abort", 1),
        ("tx_commit", 3),
        ("put_before_header", 9),
        ("tx_apply", 4),
        ("tx_done", 3),
        ("tx_unlock", 5),
    ] {
        let (logs, ended) = scenario(Some(kill));
        judge(&logs, &ended, Some(kill));
    }
}

/// A transaction that moves a value from one owner's key to another's: it reads the source,
/// writes the target and deletes the source, conditioned on the source's version. Run again
/// with the version it expected before, the condition fails and nothing changes.
#[test]
fn a_conditional_move_deletes_the_source_and_a_stale_one_aborts() {
    within(30, "a conditional move".into(), || {
        LocalCluster::new(RANKS).run(|fabric| {
            let mut store = Store::create(&fabric, config()).expect("a store");
            let (source, target) = (Key::new(0, 0), Key::new(1, 0));
            if store.worker() == 0 {
                store.put(source, b"payload").expect("a put");
                let moved = Txn {
                    reads: vec![source],
                    conditions: vec![(source, Expect::Version(1))],
                    writes: vec![(source, None), (target, Some(b"payload".to_vec()))],
                };
                let outcome = store.transaction(&moved, |_| Vec::new()).expect("the move");
                let Outcome::Committed { reads } = outcome else { panic!("{outcome:?}") };
                assert_eq!(reads, vec![(source, 1, Some(b"payload".to_vec()))]);
                assert_eq!(store.get(source).expect("a read"), None);
                assert_eq!(store.get(target).expect("a read"), Some(b"payload".to_vec()));
                let stale = store.transaction(&moved, |_| Vec::new()).expect("the stale move");
                assert_eq!(stale, Outcome::Aborted { condition: source });
                store.put(source, b"after").expect("a put after the transactions");
                assert_eq!(store.get(source).expect("a read"), Some(b"after".to_vec()));
            }
            store.sync().expect("a barrier");
        })
    });
}

/// A transaction that a global recovery interrupts after its commit decision (its first write
/// applied, its second not) is finished after the recovery, by its coordinator
/// ([`Store::finish_transactions`] reports it committed) or, when the coordinator died there,
/// by its backup: every survivor then reads both writes. The second write's key loses both
/// copies (workers 3 and 4) of its owner's earlier put while the coordinator is stopped before
/// writing it, which the localized store cannot repair: it falls back to global recovery.
#[test]
fn a_transaction_a_global_recovery_interrupts_after_its_commit_is_finished_after_it() {
    for coordinator_dies in [false, true] {
        let name = format!("an interrupted transaction, coordinator dies: {coordinator_dies}");
        within(60, name, move || interrupted_by_global_recovery(coordinator_dies));
    }
}

fn interrupted_by_global_recovery(coordinator_dies: bool) {
    let cluster = LocalCluster::new(RANKS);
    cluster.stop_at(0, "tx_apply", 2);
    // Holders (one host, 2 copies): (0, 0) on 1 and 2, (2, 0) on 3 and 4, worker 0's
    // transaction record on 2 and 3.
    let (mine, theirs) = (Key::new(0, 0), Key::new(2, 0));
    let outcomes = cluster.run(|fabric| {
        let mut store = Store::create(&fabric, config()).expect("a store");
        let me = store.worker();
        if me == 2 {
            store.put(theirs, b"before").expect("a put");
        }
        store.sync().expect("a barrier");
        if me >= 3 {
            wait_until("the kill", || cluster.is_dead(me));
            fabric.failpoint("ends a killed worker");
        }
        match store.worker() {
            0 => {
                let written =
                    vec![(mine, Some(b"mine".to_vec())), (theirs, Some(b"theirs".to_vec()))];
                let txn = Txn { writes: written, ..Txn::default() };
                let interrupted = store.transaction(&txn, |_| Vec::new());
                assert!(
                    matches!(&interrupted, Err(e) if e.needs_recovery()),
                    "the recovery interrupts the transaction: {interrupted:?}"
                );
            }
            1 => {
                wait_until("the coordinator stops", || cluster.is_stopped(0));
                let killed: &[i32] = if coordinator_dies { &[0, 3, 4] } else { &[3, 4] };
                cluster.kill_all(killed);
                wait_until("the fall back to global recovery", || store.needs_recovery());
                // The coordinator's detector (1 ms rounds) learns of it too before it goes on:
                // otherwise its write reaches the dead holders' memory and returns.
                std::thread::sleep(std::time::Duration::from_millis(300));
                cluster.resume(0);
            }
            _ => {}
        }
        wait_until("the alarm", || store.needs_recovery());
        store.recover().expect("the global recovery");
        let decision = store.finish_transactions().expect("finishing the transactions");
        store.sync().expect("a barrier");
        let mut read = |key| store.get(key).expect("a read");
        (me, decision, read(mine), read(theirs))
    });
    assert_eq!(outcomes[0].is_none(), coordinator_dies, "the coordinator lives iff not killed");
    for (worker, decision, mine, theirs) in outcomes.into_iter().flatten() {
        let expected = if worker == 0 { Some(Decision::Committed) } else { None };
        assert_eq!(decision, expected, "worker {worker}'s own last transaction");
        assert_eq!(mine.as_deref(), Some(&b"mine"[..]), "worker {worker} reads the first write");
        assert_eq!(theirs.as_deref(), Some(&b"theirs"[..]), "worker {worker} reads the second");
    }
}
