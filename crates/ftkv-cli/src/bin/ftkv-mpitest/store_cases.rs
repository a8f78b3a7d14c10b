//! Store scenarios for the multi-rank tests (`ftkv-mpitest store-<case>`).
//!
//! Rounds run in lockstep: every worker puts its checkpoint for round `r` (and writes and
//! deletes its loot), then all sync. A failure anywhere sends every survivor into recovery,
//! after which the round is retried if its put was not acknowledged. At the end every survivor
//! reads every worker's checkpoint and reports each as a `read` ([`CheckpointRead`]).

use anyhow::{bail, ensure, Result};
use ftkv::txn::{Expect, Outcome, TxId, Txn};
use ftkv::{Config, Error, Key, Store};
use ftkv_cli::chaos;
use ftkv_cli::launch::report_line;
use ftkv_cli::machine::unix_us;
use ftkv_cli::reports::{
    AckedRound, CheckpointRead, DeclaredReport, FencedReport, IdleObserverReport, IdleOwnerReport,
    LocalizedReport, RejectedReport, RoundRead, TxnReport,
};
use ftkv_mpi::{failpoint, Comm};
use ftkv_sim::history::{check_value, value};
use ftkv_sim::txn_log;

use super::report_passed;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The length of `owner`'s checkpoint in `round`: 1 KiB, or with `STORE_GROWTH` doubling each
/// round up to `1 KiB << STORE_GROWTH_SHIFT` (12: 4 MiB), for every owner or only for
/// `STORE_GROWTH_OWNER`.
fn round_len(owner: i32, round: u32) -> usize {
    let grows = std::env::var_os("STORE_GROWTH").is_some()
        && std::env::var("STORE_GROWTH_OWNER").map_or(true, |o| o == owner.to_string());
    if grows {
        1024usize << (round - 1).min(env_usize("STORE_GROWTH_SHIFT", 12) as u32)
    } else {
        1024
    }
}

fn config(ranks: usize) -> Config {
    let mut config =
        Config::new(["checkpoint", "loot"], env_usize("STORE_COPIES", 2).min(ranks - 1));
    config.initial_capacity = 1024;
    config.max_value = env_usize("STORE_MAX_MIB", 4) << 20;
    if let Some(ms) = std::env::var("STORE_RECOVERY_WATCHDOG_MS").ok().and_then(|v| v.parse().ok())
    {
        config.recovery_watchdog = std::time::Duration::from_millis(ms);
    }
    config
}

pub fn run(case: &str, world: &Comm) -> Result<()> {
    match case {
        "store-rounds" => rounds(world),
        "store-bad-input" => bad_input(world),
        "store-mismatch" => mismatch(world),
        "store-localized" => localized(world),
        "store-fenced" => fenced(world),
        "store-txn" => transactions(world),
        other => bail!("unknown store case {other:?}"),
    }
}

fn rounds(world: &Comm) -> Result<()> {
    let mut store = Store::create(world, config(world.size() as usize))?;
    let total = env_usize("STORE_ROUNDS", 5) as u32;
    let mut round = 1;
    while round <= total {
        match one_round(&mut store, round) {
            Ok(()) => round += 1,
            Err(RoundError::Unacked(e)) => round = recover_at(&mut store, e, round)?,
            Err(RoundError::Acked(e)) => round = recover_at(&mut store, e, round + 1)?,
        }
    }
    chaos::finish(&mut store)?;
    report_all(&mut store, world.size())
}

enum RoundError {
    Unacked(Error),
    Acked(Error),
}

fn one_round(store: &mut Store, round: u32) -> std::result::Result<(), RoundError> {
    let me = store.worker();
    let checkpoint = Key::new(me, 0);
    let loot = Key::new(me, 1);
    store.put(checkpoint, &value(me, round, round_len(me, round))).map_err(RoundError::Unacked)?;
    ftkv_cli::rank_println!("{}", report_line("acked", &AckedRound { round }));
    failpoint::hit("store_round");
    store.put(loot, &value(me, round, 64)).map_err(RoundError::Acked)?;
    store.delete(loot).map_err(RoundError::Acked)?;
    store.sync().map_err(RoundError::Acked)
}

/// Recovers and returns the round every survivor resumes at: the lowest next round among them.
/// A failure can end a round's sync on some survivors and not on others, so the survivors may
/// come out of recovery one round apart; without this they would pair their syncs wrongly.
fn recover_at(store: &mut Store, cause: Error, next: u32) -> Result<u32> {
    ensure!(cause.needs_recovery(), "store call failed: {cause}");
    join_late(store);
    loop {
        chaos::recover(store)?;
        match lowest_next_round(store, next) {
            Ok(round) => return Ok(round),
            Err(e) if e.needs_recovery() => continue,
            Err(e) => bail!("agreeing on the round failed: {e}"),
        }
    }
}

/// With `STORE_LATE_RANK=<w>`, worker `w` sleeps `STORE_LATE_SECONDS` (default 30) before its
/// first recovery, as an application busy elsewhere would: the others wait for it inside theirs.
fn join_late(store: &Store) {
    static LATE_ONCE: std::sync::Once = std::sync::Once::new();
    let late = std::env::var("STORE_LATE_RANK").ok().and_then(|v| v.parse::<i32>().ok());
    if late == Some(store.worker()) {
        LATE_ONCE.call_once(|| {
            let seconds = env_usize("STORE_LATE_SECONDS", 30) as u64;
            std::thread::sleep(std::time::Duration::from_secs(seconds));
        });
    }
}

fn lowest_next_round(store: &Store, next: u32) -> ftkv::Result<u32> {
    let comm = store.communicator()?;
    let all = comm.allgather(&next.to_le_bytes()).map_err(|e| ftkv::Error::Fabric(e.into()))?;
    let rounds = all.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    Ok(rounds.min().unwrap_or(next))
}

fn report_all(store: &mut Store, workers: i32) -> Result<()> {
    for owner in 0..workers {
        let round = match store.get(Key::new(owner, 0))? {
            None => RoundRead::None,
            Some(v) => match check_value(&v) {
                Some((o, r)) if o == owner => RoundRead::Round(r),
                _ => RoundRead::Torn,
            },
        };
        let loot_present = store.get(Key::new(owner, 1))?.is_some();
        ftkv_cli::rank_println!(
            "{}",
            report_line("read", &CheckpointRead { owner, round, loot_present })
        );
    }
    Ok(())
}

fn expect_err(
    result: ftkv::Result<()>,
    what: &str,
    matches: impl Fn(&Error) -> bool,
) -> Result<()> {
    match result {
        Err(e) if matches(&e) => Ok(()),
        other => bail!("{what}: expected a rejection, got {other:?}"),
    }
}

fn bad_input(world: &Comm) -> Result<()> {
    let mut store = Store::create(world, config(world.size() as usize))?;
    let me = store.worker();
    let next = (me + 1) % world.size();
    expect_err(store.own_key("nonsense").map(drop), "unknown kind", |e| {
        matches!(e, Error::UnknownKind(_))
    })?;
    expect_err(store.put(Key::new(me, 9), b"x"), "kind index", |e| {
        matches!(e, Error::UnknownKindIndex(9))
    })?;
    expect_err(store.put(Key::new(next, 0), b"x"), "foreign", |e| {
        matches!(e, Error::ForeignOwner { .. })
    })?;
    expect_err(store.put(Key::new(99, 0), b"x"), "owner", |e| {
        matches!(e, Error::UnknownOwner(99))
    })?;
    let huge = vec![0u8; (4 << 20) + 1];
    expect_err(store.put(Key::new(me, 0), &huge), "too large", |e| {
        matches!(e, Error::ValueTooLarge { .. })
    })?;
    store.put(Key::new(me, 0), &value(me, 1, 100))?;
    store.sync()?;
    let theirs = store.get(Key::new(next, 0))?.map(|v| check_value(&v));
    ensure!(theirs == Some(Some((next, 1))), "neighbour's value after bad input: {theirs:?}");
    report_passed("bad_input");
    Ok(())
}

fn mismatch(world: &Comm) -> Result<()> {
    let mut config = config(world.size() as usize);
    let odd = env_usize("STORE_ODD_RANK", 1) as i32;
    if world.rank() == odd {
        config.copies = env_usize("STORE_ODD_COPIES", 1);
    }
    match Store::create(world, config) {
        Ok(_) => bail!("a store was created from mismatched configs"),
        Err(e @ (Error::ConfigMismatch { .. } | Error::InvalidConfig(_))) => {
            let report = RejectedReport { invalid: matches!(e, Error::InvalidConfig(_)) };
            ftkv_cli::rank_println!("{}", report_line("rejected", &report));
            Ok(())
        }
        Err(e) => bail!("unexpected error {e}"),
    }
}

/// Localized recovery under outside kills: every worker overwrites its checkpoint for
/// `STORE_SECONDS` (default 3) after printing `ready pid=<pid>`; the test SIGKILLs some of them.
/// With `STORE_IDLE_SECONDS` nobody writes after the first checkpoint: the owners sleep that
/// long without a store call (then report `idle_owner`), while rank 0 waits for the failure and
/// reads every live worker's checkpoint until each has its full copy count (`idle_observer`):
/// only the owners' repairer threads can have moved their copies meanwhile.
/// The survivors then meet in an agreement (which survives dead members, unlike a barrier),
/// bring their routes up to date and check their own checkpoint's copies (a `localized`
/// report, [`LocalizedReport`]). Finally they recover globally and print every key as
/// `store-rounds` does.
fn localized(world: &Comm) -> Result<()> {
    let coordination = world.dup()?;
    let config = config(world.size() as usize).localized();
    let copies = config.copies;
    let mut store = Store::create(world, config)?;
    let me = store.worker();
    let checkpoint = Key::new(me, 0);
    store.put(checkpoint, &value(me, 1, 1024))?;
    store.sync()?;
    ftkv_cli::rank_println!("ready pid={}", std::process::id());
    let (last, global) = match std::env::var("STORE_IDLE_SECONDS").ok() {
        Some(secs) => stay_idle(&mut store, secs.parse()?, copies)?,
        None => write_for(&mut store, env_usize("STORE_SECONDS", 3))?,
    };
    chaos::meet(&coordination, &mut store)?;
    while store.failed().len() < coordination.failed_ranks()?.len() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    store.follow()?;
    let held = store.read_copies(checkpoint)?;
    let current = held.iter().all(|(_, v)| v.as_deref() == Some(&value(me, last, 1024)[..]));
    let repairs = store.take_repairs();
    let report = LocalizedReport {
        global,
        copies: held.len(),
        copies_wanted: copies,
        current,
        moved_keys: repairs.iter().map(|r| r.keys_moved).sum(),
        moved_bytes: repairs.iter().map(|r| r.bytes_moved).sum(),
        repair_ms: repairs.iter().map(|r| r.duration.as_secs_f64() * 1e3).sum(),
    };
    ftkv_cli::rank_println!("{}", report_line("localized", &report));
    chaos::meet(&coordination, &mut store)?;
    chaos::recover(&mut store)?;
    chaos::finish(&mut store)?;
    report_all(&mut store, world.size())
}

/// Localized store, one rank SIGSTOPped from outside (`STORE_VICTIM`) and declared failed by
/// Open MPI's heartbeat detector: every survivor reads the victim's checkpoint once it knows of
/// the failure ([`DeclaredReport`]), keeps writing its own, and once the victim was resumed and
/// has ended (the driver creates `STORE_RESUMED_FILE`), reads it again ([`FencedReport`]): a
/// write the victim issued late must not show.
fn fenced(world: &Comm) -> Result<()> {
    let coordination = world.dup()?;
    let mut config = config(world.size() as usize).localized();
    config.suspicion =
        std::time::Duration::from_millis(env_usize("STORE_SUSPICION_MS", 3000) as u64);
    let mut store = Store::create(world, config)?;
    let me = store.worker();
    let victim = env_usize("STORE_VICTIM", 2) as i32;
    store.put(Key::new(me, 0), &value(me, 1, 1024))?;
    store.sync()?;
    ftkv_cli::rank_println!("ready pid={}", std::process::id());
    let declared = |store: &mut Store| Ok(store.failed().contains(&victim));
    let mut seq = write_until(&mut store, 1, declared)?;
    if me == victim {
        bail!("the victim went on writing after it was declared failed");
    }
    let before = checkpoint_seq(&mut store, victim)?;
    ftkv_cli::rank_println!("{}", report_line("declared", &DeclaredReport { victim, seq: before }));
    let resumed_file = std::env::var("STORE_RESUMED_FILE")?;
    let resumed = |_: &mut Store| Ok(std::path::Path::new(&resumed_file).exists());
    seq = write_until(&mut store, seq, resumed)?;
    let after = checkpoint_seq(&mut store, victim)?;
    let report = FencedReport { before, after, own_seq: seq };
    ftkv_cli::rank_println!("{}", report_line("fenced", &report));
    chaos::meet(&coordination, &mut store)?;
    chaos::recover(&mut store)?;
    chaos::finish(&mut store)
}

/// `store-localized` without writes: rank 0 observes (see [`localized`]), the others sleep
/// `secs` seconds without a store call. Returns what [`write_for`] does: the first checkpoint
/// is the last acknowledged write, and nobody recovered globally.
fn stay_idle(store: &mut Store, secs: u64, copies: usize) -> Result<(u32, Option<String>)> {
    if store.worker() != 0 {
        std::thread::sleep(std::time::Duration::from_secs(secs));
        ftkv_cli::rank_println!(
            "{}",
            report_line("idle_owner", &IdleOwnerReport { woke_at_us: unix_us() })
        );
        return Ok((1, None));
    }
    let bound = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while store.failed().is_empty() {
        ensure!(std::time::Instant::now() < bound, "no failure noticed within 30 s");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let noticed = std::time::Instant::now();
    let failed = store.failed();
    let owners: Vec<i32> =
        store.live().iter().copied().filter(|w| *w != 0 && !failed.contains(w)).collect();
    for owner in owners {
        while !has_full_copies(store, Key::new(owner, 0), copies)? {
            ensure!(std::time::Instant::now() < bound, "worker {owner}'s copies never came back");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    let report = IdleObserverReport {
        full_at_us: unix_us(),
        waited_ms: noticed.elapsed().as_secs_f64() * 1e3,
    };
    ftkv_cli::rank_println!("{}", report_line("idle_observer", &report));
    Ok((1, None))
}

/// Whether `key` has `copies` live holders, each with a value (of a live owner: every
/// acknowledged write is on all of them).
fn has_full_copies(store: &mut Store, key: Key, copies: usize) -> Result<bool> {
    let held = store.read_copies(key)?;
    Ok(held.len() == copies && held.iter().all(|(_, v)| v.is_some()))
}

/// Overwrites the own checkpoint from `seq` on until `done` (checked between puts, at most
/// 60 s); returns the last acknowledged sequence number.
fn write_until(
    store: &mut Store,
    mut seq: u32,
    mut done: impl FnMut(&mut Store) -> Result<bool>,
) -> Result<u32> {
    let me = store.worker();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !done(store)? {
        ensure!(std::time::Instant::now() < until, "waited 60 s");
        store.put(Key::new(me, 0), &value(me, seq + 1, 1024))?;
        seq += 1;
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    Ok(seq)
}

/// The sequence number in `owner`'s checkpoint as this rank reads it.
fn checkpoint_seq(store: &mut Store, owner: i32) -> Result<u32> {
    let read = store.get(Key::new(owner, 0))?;
    let Some(read) = read else {
        let copies = store.read_copies(Key::new(owner, 0))?;
        let seqs: Vec<(i32, Option<(i32, u32)>)> =
            copies.iter().map(|(h, v)| (*h, v.as_deref().and_then(check_value))).collect();
        bail!("no checkpoint of worker {owner}; its copies: {seqs:?}");
    };
    let (found, seq) = check_value(&read).ok_or_else(|| anyhow::anyhow!("a torn checkpoint"))?;
    ensure!(found == owner, "worker {owner}'s checkpoint holds worker {found}'s value");
    Ok(seq)
}

/// Overwrites the own checkpoint for `secs` seconds (with `STORE_ASYNC`, each through
/// `put_async` and its `wait`); returns the last acknowledged write and why the store had to
/// recover globally, if it had to.
fn write_for(store: &mut Store, secs: usize) -> Result<(u32, Option<String>)> {
    let me = store.worker();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(secs as u64);
    let asynchronous = std::env::var_os("STORE_ASYNC").is_some();
    let (mut last, mut global) = (1, None);
    let mut seq = 1;
    while std::time::Instant::now() < until {
        seq += 1;
        let checkpoint = value(me, seq, 1024);
        let written = if asynchronous {
            store.put_async(Key::new(me, 0), &checkpoint).and_then(|pending| pending.wait())
        } else {
            store.put(Key::new(me, 0), &checkpoint)
        };
        match written {
            Ok(()) => last = seq,
            Err(e) if e.needs_recovery() => {
                global = Some(e.to_string().replace(' ', "_"));
                chaos::recover(store)?;
            }
            Err(e) => return Err(e.into()),
        }
        failpoint::hit("localized_write");
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    Ok((last, global))
}

/// A meeting point of the live members that a dead member does not break: an agreement.
/// Transactions on a localized store (`STORE_TXNS` per worker, default 16): each appends its id
/// to the log (kind 0) of its own key and its right neighbour's, a quarter conditioned on the
/// value read just before and a quarter on a value that never holds. A rank that
/// `FTKV_FAILPOINT` kills at a protocol step leaves its transaction to its backup. When done,
/// a worker marks its kind-1 key `done` and resolves others' transactions as a backup until
/// every worker is done or failed. Then every survivor judges what it reads and reports a
/// [`TxnReport`] when the judgement passed: no log repeats an id, each transaction is
/// in both of its keys' logs or neither, its own committed ones in both and aborted ones in
/// neither, and the logs admit a serial order. The survivors then leave the store without
/// rebuilding it ([`Store::abandon`]) and end without `MPI_Finalize`, which refuses windows
/// still allocated.
fn transactions(world: &Comm) -> Result<()> {
    let coordination = world.dup()?;
    let mut store =
        Store::create(world, config(world.size() as usize).localized().with_transactions())?;
    let (me, workers) = (store.worker(), world.size());
    let count = env_usize("STORE_TXNS", 16) as u32;
    let mut ended = Vec::new();
    let timer = std::time::Instant::now();
    for seq in 1..=count {
        ended.push((TxId::new(me, seq).0, one_transaction(&mut store, seq)?));
    }
    let mean_us = timer.elapsed().as_secs_f64() * 1e6 / count as f64;
    store.put(Key::new(me, 1), b"done")?;
    let started = std::time::Instant::now();
    while !all_done(&mut store, workers)? {
        ensure!(started.elapsed().as_secs() < 60, "the other workers did not finish");
        store.resolve_transactions()?;
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    store.resolve_transactions()?;
    meet(&coordination)?;
    let logs: Vec<Vec<u64>> = (0..workers)
        .map(|w| Ok(txn_log::log_of(&store.get(Key::new(w, 0))?)))
        .collect::<Result<_>>()?;
    judge_logs(&store, &logs, &ended, count)?;
    let committed = ended.iter().filter(|(_, c)| *c).count();
    let digest = logs.iter().flatten().fold(0u64, |h, id| ftkv_sim::recovery::mix(h, *id));
    let report = TxnReport {
        committed,
        aborted: ended.len() - committed,
        logs: format!("{digest:016x}"),
        resolved: store.resolved_coordinators().to_vec(),
        tx_us: mean_us,
    };
    ftkv_cli::rank_println!("{}", report_line("txn", &report));
    meet(&coordination)?;
    store.abandon();
    report_passed("done");
    meet(&coordination)?;
    // The runtime forwards output asynchronously; a job whose first rank ends at once can lose
    // or untag the others' last lines.
    std::thread::sleep(std::time::Duration::from_millis(300));
    failpoint::exit_now(0)
}

fn right_neighbour_keys(store: &Store, coordinator: i32) -> [Key; 2] {
    let workers = store.workers() as i32;
    [Key::new(coordinator, 0), Key::new((coordinator + 1) % workers, 0)]
}

/// Runs this worker's transaction `seq`; whether it committed.
fn one_transaction(store: &mut Store, seq: u32) -> Result<bool> {
    let keys = right_neighbour_keys(store, store.worker());
    let mut txn = Txn { reads: keys.to_vec(), ..Txn::default() };
    if seq.is_multiple_of(4) {
        txn.conditions.push((keys[1], Expect::Value(Some(b"never".to_vec()))));
    } else if seq.is_multiple_of(2) {
        let seen = store.get(keys[1])?;
        txn.conditions.push((keys[1], Expect::Value(seen)));
    }
    let id = TxId::new(store.worker(), seq).0;
    Ok(matches!(store.transaction(&txn, txn_log::append(id))?, Outcome::Committed { .. }))
}

/// Whether every worker is failed or marked its kind-1 key done.
fn all_done(store: &mut Store, workers: i32) -> Result<bool> {
    for worker in 0..workers {
        if !store.failed().contains(&worker) && store.get(Key::new(worker, 1))?.is_none() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The checks of [`transactions`] on the logs every worker's key holds ([`txn_log::judge`]).
fn judge_logs(store: &Store, logs: &[Vec<u64>], ended: &[(u64, bool)], count: u32) -> Result<()> {
    let by_key = logs.iter().enumerate().map(|(w, log)| (Key::new(w as i32, 0), log.clone()));
    let planned: Vec<(u64, Vec<Key>)> = (0..logs.len() as i32)
        .flat_map(|c| {
            let keys = right_neighbour_keys(store, c).to_vec();
            (1..=count).map(move |seq| (TxId::new(c, seq).0, keys.clone()))
        })
        .collect();
    let violations = txn_log::judge(&by_key.collect(), &planned, ended);
    ensure!(violations.is_empty(), "{}", violations.join("; "));
    Ok(())
}

fn meet(coordination: &Comm) -> Result<()> {
    coordination.failed_ranks()?;
    coordination.agree(1)?;
    Ok(())
}
