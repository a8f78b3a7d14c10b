//! The rank side of one chaos run (`ftkv chaos-rank`): writes its own keys, recovers, and
//! reports what it wrote and what it reads at the end.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use ftkv::{Config, Key, Recovery, Store};
use ftkv_launch::launch::report_line;
use ftkv_mpi::{Comm, Mpi};
use ftkv_sim::history::{observe, planned_write, value, Observed};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::{DoneReport, FinalRead, NoticedReport, Read, RecoveryReport, WriteReport};

/// What a chaos rank runs with: the arguments `ftkv chaos` passes to `ftkv chaos-rank`.
#[derive(Debug, Clone)]
pub struct RankArgs {
    pub copies: usize,
    /// How long the rank writes before the survivors check.
    pub duration: Duration,
    pub seed: u64,
    /// The store's watchdog bound for one data-path call.
    pub watchdog: Duration,
    pub recovery: Recovery,
    /// The store's suspicion bound, when Open MPI's heartbeat detector runs with it as its
    /// timeout (`--stop`); the store's default otherwise.
    pub suspicion: Option<Duration>,
}

/// The rank side of one chaos run: creates the store (localized recovery when asked), writes
/// for the run's duration, and prints every write, every recovery and, once the survivors
/// finished writing, its read of every key (`final`; on a localized store also `final_local`,
/// read before the final global recovery) and `done`. Fails when a store call fails with an
/// error that no recovery repairs; a rank that ends itself (watchdog, stopped too long) prints
/// no `done`.
pub fn rank_main(args: &RankArgs) -> Result<()> {
    let mpi = Mpi::init()?;
    let world = mpi.world()?;
    let localized = args.recovery == Recovery::Localized;
    let coordination = localized.then(|| world.dup()).transpose()?;
    let store = Store::create(&world, store_config(args))?;
    ftkv_launch::rank_println!("pid={}", std::process::id());
    let mut writer = Writer::new(store, args.seed, localized);
    writer.write_for(args.duration)?;
    if let Some(coordination) = &coordination {
        writer.read_localized(coordination, world.size())?;
    }
    writer.finish()?;
    report_finals(&mut writer.store, world.size(), "final")?;
    ftkv_launch::rank_println!(
        "{}",
        report_line("done", &DoneReport { failed: failed_workers(&writer.store) })
    );
    drop(writer);
    drop(coordination);
    drop(world);
    mpi.finalize_bounded(Duration::from_secs(3))?;
    Ok(())
}

/// The store's configuration for `args`: two kinds, small values, the given bounds.
fn store_config(args: &RankArgs) -> Config {
    let mut config = Config::new(["checkpoint", "loot"], args.copies);
    config.initial_capacity = 4096;
    config.max_value = 64 << 10;
    config.watchdog = args.watchdog;
    if let Some(suspicion) = args.suspicion {
        config.suspicion = suspicion;
    }
    match args.recovery {
        Recovery::Localized => config.localized(),
        Recovery::Global => config,
    }
}

/// A rank's own last acknowledged write of a kind: its value, or `None` for a delete. Before
/// any write it is a delete numbered 0, what an owner writes when a key it never had
/// acknowledged is reported lost.
#[derive(Debug, Clone, Default)]
struct Acked {
    seq: u32,
    value: Option<Vec<u8>>,
}

/// One rank's writes to its own keys and the recoveries they lead to.
struct Writer {
    store: Store,
    rng: SmallRng,
    /// Per kind: the last acknowledged write, written again when a recovery reports the key
    /// lost.
    last_acked: [Acked; 2],
    /// With localized recovery: the failures already announced by a `noticed` line.
    noticed: Option<usize>,
}

impl Writer {
    fn new(store: Store, seed: u64, localized: bool) -> Writer {
        let rng = SmallRng::seed_from_u64(seed ^ (store.worker() as u64) << 32);
        let noticed = localized.then_some(0);
        Writer { store, rng, last_acked: Default::default(), noticed }
    }

    /// Writes the planned workload for `duration`, recovering whenever a write needs it.
    fn write_for(&mut self, duration: Duration) -> Result<()> {
        let me = self.store.worker();
        let start = Instant::now();
        let mut seq = 0u32;
        while start.elapsed() < duration {
            seq += 1;
            let (kind, delete) = planned_write(seq);
            let bytes = (!delete).then(|| value(me, seq, self.rng.gen_range(16..8192)));
            self.write(kind, seq, bytes)?;
            self.announce_failures();
            std::thread::sleep(Duration::from_micros(300));
        }
        Ok(())
    }

    /// Puts `bytes` (deletes when `None`) as write `seq` of own key `kind`, printing a
    /// [`WriteReport`] before and once acknowledged. A write that needs a recovery is not
    /// retried: the rank recovers ([`Writer::recover`]) and the write stays unacknowledged.
    /// Fails on any other store error.
    fn write(&mut self, kind: u16, seq: u32, bytes: Option<Vec<u8>>) -> Result<()> {
        let report = WriteReport { kind, seq, delete: bytes.is_none(), acked: false };
        ftkv_launch::rank_println!("{}", report_line("write", &report));
        let key = Key::new(self.store.worker(), kind);
        let result = match &bytes {
            Some(v) => self.store.put(key, v),
            None => self.store.delete(key),
        };
        match result {
            Ok(()) => {
                ftkv_launch::rank_println!(
                    "{}",
                    report_line("write", &WriteReport { acked: true, ..report })
                );
                self.last_acked[kind as usize] = Acked { seq, value: bytes };
                Ok(())
            }
            Err(e) if e.needs_recovery() => self.recover(),
            Err(e) => bail!("store call failed: {e}"),
        }
    }

    /// Recovers globally, then writes again each own key the recovery reported lost (its last
    /// acknowledged write), recovering again whenever a failure interrupts that. Fails when a
    /// recovery fails.
    fn recover(&mut self) -> Result<()> {
        let report = recover(&mut self.store)?;
        let me = self.store.worker();
        for (owner, kind) in report.lost_keys {
            if owner == me {
                let Acked { seq, value } = self.last_acked[kind as usize].clone();
                self.write(kind, seq, value)?;
            }
        }
        Ok(())
    }

    /// With localized recovery: prints a [`NoticedReport`] when the store knows of more failed
    /// workers than before (the driver's cue for a kill during a localized repair).
    fn announce_failures(&mut self) {
        let Some(noticed) = self.noticed else { return };
        let failed = self.store.failed();
        let count = failed.len();
        if count > noticed {
            ftkv_launch::rank_println!("{}", report_line("noticed", &NoticedReport { failed }));
            self.noticed = Some(count);
        }
    }

    /// On a localized store, before any final global recovery: once every survivor stopped
    /// writing (an agreement on `coordination`, which dead members do not break) and this
    /// rank's routes follow every failure its MPI knows of, prints its read of every key
    /// (`final_local`), then meets the others again so that nobody recovers while another
    /// reads. A store that fell back to global recovery meanwhile reads what it can and leaves
    /// the rest to the final reads. Fails when the agreement fails or the store does not
    /// learn of the failures within 30 s.
    fn read_localized(&mut self, coordination: &Comm, workers: i32) -> Result<()> {
        self.meet(coordination)?;
        let known = coordination.failed_ranks()?.len();
        let bound = Instant::now() + Duration::from_secs(30);
        while self.store.failed().len() < known {
            ensure!(Instant::now() < bound, "the store did not learn of {known} failures in 30 s");
            std::thread::sleep(Duration::from_millis(1));
        }
        let read = self
            .store
            .follow()
            .and_then(|()| report_finals(&mut self.store, workers, "final_local"));
        if let Err(e) = read {
            ensure!(e.needs_recovery(), "reading on the localized store failed: {e}");
        }
        self.meet(coordination)
    }

    /// [`meet`], recovering as [`Writer::recover`] does (writing lost own keys again).
    fn meet(&mut self, coordination: &Comm) -> Result<()> {
        meet_joining_recoveries(coordination, || match self.store.needs_recovery() {
            true => self.recover(),
            false => Ok(()),
        })
    }

    /// Syncs the survivors at the end, recovering (and writing lost own keys again) as often as
    /// failures interrupt it. Fails when a sync fails without needing a recovery.
    fn finish(&mut self) -> Result<()> {
        loop {
            match self.store.sync() {
                Ok(()) => return Ok(()),
                Err(e) if e.needs_recovery() => self.recover()?,
                Err(e) => bail!("sync failed: {e}"),
            }
        }
    }
}

/// A meeting point of the live members that a dead member does not break (an agreement on
/// `coordination`), during which this rank calls `join_recovery` every 200 µs: it must join
/// every global recovery its store needs meanwhile (when `Store::needs_recovery` says so). A
/// member whose call needed a recovery is inside it, and the recovery ends only once every
/// survivor joined, so a rank that waited for the meeting without joining would hold both.
/// Fails when the agreement or `join_recovery` fails.
pub fn meet_joining_recoveries(
    coordination: &Comm,
    mut join_recovery: impl FnMut() -> Result<()>,
) -> Result<()> {
    coordination.failed_ranks()?;
    let mut agreement = coordination.start_agree(1)?;
    while agreement.test()?.is_none() {
        join_recovery()?;
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}

/// [`meet_joining_recoveries`] for a `store` whose recoveries need nothing else of this rank.
pub fn meet(coordination: &Comm, store: &mut Store) -> Result<()> {
    meet_joining_recoveries(coordination, || match store.needs_recovery() {
        true => recover(store).map(drop),
        false => Ok(()),
    })
}

/// Runs a global recovery, printing `recovering` before (the driver's cue for a kill during
/// recovery) and a [`RecoveryReport`] after it, which it returns. Fails when the recovery
/// fails (the store is then unusable).
pub fn recover(store: &mut Store) -> Result<RecoveryReport> {
    ftkv_launch::rank_println!("recovering");
    let report = store.recover()?;
    let report = RecoveryReport {
        failed: report.failed,
        attempts: report.attempts,
        keys_recovered: report.keys_recovered,
        lost_keys: report
            .keys_lost
            .iter()
            .chain(&report.keys_to_rewrite)
            .map(|k| (k.owner, k.kind))
            .collect(),
        ms: report.duration.as_secs_f64() * 1e3,
    };
    ftkv_launch::rank_println!("{}", report_line("recovery", &report));
    Ok(report)
}

/// Syncs the survivors at the end of a run, recovering as often as failures interrupt it.
/// Fails when a sync fails without needing a recovery, or a recovery fails.
pub fn finish(store: &mut Store) -> Result<()> {
    loop {
        match store.sync() {
            Ok(()) => return Ok(()),
            Err(e) if e.needs_recovery() => {
                recover(store)?;
            }
            Err(e) => bail!("sync failed: {e}"),
        }
    }
}

/// The workers that are not in the store's live set: the same on every survivor, since the
/// live set is the shrunk communicator's membership.
pub fn failed_workers(store: &Store) -> Vec<usize> {
    let live = store.live();
    (0..store.workers()).filter(|&w| !live.contains(&(w as i32))).collect()
}

/// Prints a [`FinalRead`] line tagged `tag` for every key of every worker. Stops at the first
/// read that fails other than with [`ftkv::Error::KeyLost`] and returns that error.
fn report_finals(store: &mut Store, workers: i32, tag: &str) -> ftkv::Result<()> {
    for owner in 0..workers {
        for kind in 0..2u16 {
            let read = match store.get(Key::new(owner, kind)) {
                Ok(read) => match observe(owner, read.as_deref()) {
                    Observed::Seq(seq) => Read::Seq(seq),
                    Observed::Absent => Read::Absent,
                    Observed::Torn | Observed::Lost => Read::Torn,
                },
                Err(ftkv::Error::KeyLost(_)) => Read::Lost,
                Err(e) => return Err(e),
            };
            ftkv_launch::rank_println!("{}", report_line(tag, &FinalRead { owner, kind, read }));
        }
    }
    Ok(())
}
