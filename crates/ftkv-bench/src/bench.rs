//! `ftkv bench put` and `ftkv bench detect`: the put path against raw MPI RMA and two-sided
//! messages to the same holders, in each detection mode, and how long the detector takes to
//! notice a SIGKILL.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ftkv::engine::placement;
use ftkv::{Config, Detection, Key, Store};
use ftkv_mpi::{failpoint, Comm, LockedWindow, Mpi, Window};
use plotters::style::RGBColor;

use crate::machine::unix_us;
use crate::plot::{self, Chart, Series};
use crate::reports::{GlobalRecoveryReport, GrowthReport, LocalizedRecoveryReport, Report, System};
use crate::stats::Histogram;
use crate::workload::{checkpoint_workload, WorkloadResult};

/// One mode's latencies at one size (a row of `ftkv bench put`'s results file).
#[derive(Debug, Clone, serde::Serialize)]
pub struct PutRow {
    pub mode: String,
    pub size: usize,
    pub puts: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

/// The latencies of `samples`, printed by rank 0 as one line of `key=value` words.
fn report(mode: &str, size: usize, samples: &mut [Duration]) -> PutRow {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    let mean_us = samples.iter().sum::<Duration>().as_secs_f64() * 1e6 / samples.len() as f64;
    let row = PutRow {
        mode: mode.to_owned(),
        size,
        puts: samples.len(),
        p50_us: at(0.5),
        p99_us: at(0.99),
        max_us: at(1.0),
        mean_us,
    };
    println!(
        "mode={mode} size={size} puts={} p50_us={:.2} p99_us={:.2} max_us={:.2} mean_us={:.2}",
        row.puts, row.p50_us, row.p99_us, row.max_us, row.mean_us
    );
    row
}

/// What `ftkv bench put` writes to its results file: the job's shape, every row, and for each
/// size the p50 of ftkv over raw RMA and over two-sided messages.
#[derive(Debug, serde::Serialize)]
struct PutResults {
    ranks: i32,
    copies: usize,
    hosts: usize,
    rows: Vec<PutRow>,
    ratios: Vec<PutRatio>,
}

#[derive(Debug, serde::Serialize)]
struct PutRatio {
    size: usize,
    ftkv_over_raw_p50: f64,
    ftkv_over_two_sided_p50: f64,
    /// `put_async`'s return over the blocking put, and its waited-for total over the blocking.
    async_returned_over_put_p50: Option<f64>,
    async_waited_over_put_p50: Option<f64>,
}

fn ratios(rows: &[PutRow]) -> Vec<PutRatio> {
    let p50 = |mode: &str, size: usize| {
        rows.iter().find(|r| r.mode == mode && r.size == size).map(|r| r.p50_us)
    };
    let mut sizes: Vec<usize> = rows.iter().map(|r| r.size).collect();
    sizes.dedup();
    sizes
        .into_iter()
        .filter_map(|size| {
            let ftkv = p50("ftkv_bitmap", size)?;
            Some(PutRatio {
                size,
                ftkv_over_raw_p50: ftkv / p50("raw_rma", size)?,
                ftkv_over_two_sided_p50: ftkv / p50("two_sided", size)?,
                async_returned_over_put_p50: p50("ftkv_async_returned", size).map(|a| a / ftkv),
                async_waited_over_put_p50: p50("ftkv_async_waited", size).map(|a| a / ftkv),
            })
        })
        .collect()
}

/// The rank side of `ftkv bench put`: every rank writes its checkpoint `iterations` times per
/// size and mode; rank 0 reports its latencies. Raw RMA is put + flush of the same bytes to the
/// same holders with no header, checksum or failure check.
pub fn put_rank_main(
    copies: usize,
    sizes: &[usize],
    iterations: usize,
    out: &std::path::Path,
) -> Result<()> {
    let mpi = Mpi::init()?;
    let world = mpi.world()?.dup()?;
    // Ping mode's extra thread in MPI stalls Open MPI's TCP transport for seconds between
    // hosts (measured up to 16 s per put), longer than the watchdog: measured on one host only.
    let hosts = host_ids(&world)?;
    let spans_hosts = hosts.iter().any(|&h| h != hosts[0]);
    let mut rows = Vec::new();
    for &size in sizes {
        let Interleaved { mut raw, mut bitmap, mut returned, mut waited } =
            interleaved_puts(&world, copies, size, iterations)?;
        let mut two_sided = two_sided_put(&world, copies, size, iterations)?;
        let mut ping = match spans_hosts {
            false => Some(store_put(&world, copies, size, iterations, Detection::Ping)?),
            true => None,
        };
        if world.rank() == 0 {
            rows.push(report("raw_rma", size, &mut raw));
            rows.push(report("two_sided", size, &mut two_sided));
            rows.push(report("ftkv_bitmap", size, &mut bitmap));
            rows.push(report("ftkv_async_returned", size, &mut returned));
            rows.push(report("ftkv_async_waited", size, &mut waited));
            match ping.as_mut() {
                Some(ping) => rows.push(report("ftkv_ping", size, ping)),
                None => println!("mode=ftkv_ping size={size} skipped=spans_hosts"),
            }
        }
    }
    if world.rank() == 0 {
        let mut distinct = hosts.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let ratios = ratios(&rows);
        let results =
            PutResults { ranks: world.size(), copies, hosts: distinct.len(), rows, ratios };
        write_results(out, &serde_json::to_string_pretty(&results)?)?;
        let plot = out.with_extension("svg");
        std::fs::write(&plot, put_svg(&results)?)
            .with_context(|| format!("writing {}", plot.display()))?;
        println!("results={} plot={}", out.display(), plot.display());
    }
    drop(world);
    mpi.finalize_bounded(Duration::from_secs(3))?;
    Ok(())
}

/// The modes of `ftkv bench put` in its plot, each with its line's colour.
const PUT_MODES: [(&str, RGBColor); 6] = [
    ("raw_rma", RGBColor(0x7f, 0x7f, 0x7f)),
    ("two_sided", RGBColor(0x1f, 0x77, 0xb4)),
    ("ftkv_bitmap", RGBColor(0xd6, 0x27, 0x28)),
    ("ftkv_async_returned", RGBColor(0xff, 0x7f, 0x0e)),
    ("ftkv_async_waited", RGBColor(0x94, 0x67, 0xbd)),
    ("ftkv_ping", RGBColor(0x2c, 0xa0, 0x2c)),
];

/// The p50 of every mode against value size (SVG).
fn put_svg(results: &PutResults) -> Result<String> {
    let series: Vec<Series> = PUT_MODES
        .iter()
        .map(|&(mode, color)| Series {
            name: mode.to_owned(),
            color,
            points: results
                .rows
                .iter()
                .filter(|r| r.mode == mode)
                .map(|r| (r.size, r.p50_us))
                .collect(),
        })
        .collect();
    let caption = format!(
        "put p50 vs value size ({} ranks on {} hosts, {} copies)",
        results.ranks, results.hosts, results.copies
    );
    plot::by_size(&Chart::against_size(&caption, "p50 (µs)"), &series)
}

/// The holders the store places this rank's checkpoint on (host-aware, as the store does).
fn holders(world: &Comm, copies: usize) -> Result<Vec<i32>> {
    let live: Vec<i32> = (0..world.size()).collect();
    let hosts = host_ids(world)?;
    Ok(placement::holders(world.rank(), 0, &live, &hosts, copies))
}

/// Every rank's host id, in rank order.
pub fn host_ids(world: &Comm) -> Result<Vec<u32>> {
    let all = world.allgather(&world.host_id()?.to_le_bytes())?;
    Ok(all.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// Fails on every rank alike, before anything is allocated, when windows of `per_rank` bytes on
/// every rank would not fit the shared memory of some rank's host.
fn ensure_windows_fit(world: &Comm, per_rank: usize) -> Result<()> {
    let ranks = world.size() as u128;
    let fits = ftkv_mpi::shared_memory_capacity()
        .is_none_or(|capacity| per_rank as u128 * ranks <= capacity as u128);
    let all = world.allgather(&[fits as u8])?;
    anyhow::ensure!(
        all.iter().all(|&f| f == 1),
        "raw RMA windows of {per_rank} bytes on each of {ranks} ranks exceed the shared memory \
         of the hosts of ranks {:?}",
        all.iter().enumerate().filter(|(_, &f)| f == 0).map(|(r, _)| r).collect::<Vec<_>>()
    );
    Ok(())
}

/// The latencies of the modes measured side by side, one put of each per round.
struct Interleaved {
    raw: Vec<Duration>,
    bitmap: Vec<Duration>,
    /// `Store::put_async`: until it returned (the first copy complete, the others handed off),
    /// and until its handle's `wait` returned (every copy complete), nothing computed between.
    returned: Vec<Duration>,
    waited: Vec<Duration>,
}

/// Raw RMA, ftkv's blocking put (bitmap detection) and `put_async` to the same holders, one
/// of each per round: every mode meets the same state of a machine that other jobs, the page
/// cache and the scheduler change by the second, so their ratios hold within one run.
fn interleaved_puts(
    world: &Comm,
    copies: usize,
    size: usize,
    iterations: usize,
) -> Result<Interleaved> {
    let per_rank = size.checked_mul(world.size() as usize).context("window size overflows")?;
    ensure_windows_fit(world, per_rank)?;
    let window: LockedWindow = Window::allocate(world, per_rank)?.lock_all()?;
    let targets = holders(world, copies)?;
    let disp = (world.rank() as usize * size) as i64;
    let (mut store, key, data) = bench_store(world, copies, size, Detection::Bitmap)?;
    let mut out = Interleaved {
        raw: Vec::with_capacity(iterations),
        bitmap: Vec::with_capacity(iterations),
        returned: Vec::with_capacity(iterations),
        waited: Vec::with_capacity(iterations),
    };
    world.barrier()?;
    for _ in 0..iterations {
        let start = Instant::now();
        window.scope(|s| targets.iter().try_for_each(|&t| s.put(t, disp, &data)))?;
        out.raw.push(start.elapsed());
        let start = Instant::now();
        store.put(key, &data)?;
        out.bitmap.push(start.elapsed());
        let start = Instant::now();
        let pending = store.put_async(key, &data)?;
        let returned = Instant::now();
        pending.wait()?;
        let waited = Instant::now();
        out.returned.push(returned - start);
        out.waited.push(waited - start);
    }
    store.sync()?;
    world.barrier()?;
    Ok(out)
}

const DATA_TAG: i32 = 901;
const ACK_TAG: i32 = 902;

/// The two-sided reference: the same bytes sent to the same holders with `MPI_Isend`, each
/// holder answering with an 8-byte acknowledgement once it received them (what a put's
/// completion means); every rank serves the others' messages while it waits for its own.
fn two_sided_put(
    world: &Comm,
    copies: usize,
    size: usize,
    iterations: usize,
) -> Result<Vec<Duration>> {
    let me = world.rank();
    let live: Vec<i32> = (0..world.size()).collect();
    let hosts = host_ids(world)?;
    let senders_to_me = live
        .iter()
        .filter(|&&r| r != me && placement::holders(r, 0, &live, &hosts, copies).contains(&me))
        .count();
    let mut server = Server { expected: senders_to_me * iterations, served: 0, buf: vec![0; size] };
    let targets = placement::holders(me, 0, &live, &hosts, copies);
    let data = vec![7u8; size];
    world.barrier()?;
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        // `isend` owns its buffer: the copies are made before the clock starts.
        let payloads: Vec<Vec<u8>> = targets.iter().map(|_| data.clone()).collect();
        let mut payloads = payloads.into_iter();
        let start = Instant::now();
        let mut acks = targets
            .iter()
            .map(|&t| world.irecv(8, t, ACK_TAG).map(Some))
            .collect::<ftkv_mpi::Result<Vec<_>>>()?;
        let mut sends = targets
            .iter()
            .map(|&t| world.isend(payloads.next().expect("one per target"), t, DATA_TAG).map(Some))
            .collect::<ftkv_mpi::Result<Vec<_>>>()?;
        while acks.iter().any(Option::is_some) || sends.iter().any(Option::is_some) {
            server.serve(world)?;
            for ack in &mut acks {
                if ack.as_mut().map(|a| a.test()).transpose()?.flatten().is_some() {
                    *ack = None;
                }
            }
            for send in &mut sends {
                if send.as_mut().map(|s| s.test()).transpose()?.unwrap_or(false) {
                    *send = None;
                }
            }
        }
        samples.push(start.elapsed());
    }
    while server.served < server.expected {
        server.serve(world)?;
    }
    world.barrier()?;
    Ok(samples)
}

/// A holder's side of [`two_sided_put`]: receives data messages and acknowledges each.
struct Server {
    expected: usize,
    served: usize,
    buf: Vec<u8>,
}

impl Server {
    fn serve(&mut self, world: &Comm) -> Result<()> {
        while let Some(status) = world.iprobe(ftkv_mpi::ANY_SOURCE, DATA_TAG)? {
            world.recv(&mut self.buf[..status.len], status.source, DATA_TAG)?;
            world.send(&0u64.to_le_bytes(), status.source, ACK_TAG)?;
            self.served += 1;
        }
        Ok(())
    }
}

fn store_put(
    world: &Comm,
    copies: usize,
    size: usize,
    iterations: usize,
    detection: Detection,
) -> Result<Vec<Duration>> {
    let (mut store, key, data) = bench_store(world, copies, size, detection)?;
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let start = Instant::now();
        store.put(key, &data)?;
        samples.push(start.elapsed());
    }
    store.sync()?;
    Ok(samples)
}

/// A store of one kind sized for `size`-byte values, this rank's key and a value to write,
/// after a barrier.
fn bench_store(
    world: &Comm,
    copies: usize,
    size: usize,
    detection: Detection,
) -> Result<(Store, Key, Vec<u8>)> {
    let mut config = Config::new(["checkpoint"], copies);
    config.max_value = size;
    config.initial_capacity = size;
    config.detection = detection;
    let mut store = Store::create(world, config)?;
    let key = Key::new(store.worker(), 0);
    store.sync()?;
    Ok((store, key, vec![7u8; size]))
}

/// The rank side of `ftkv bench detect`: after a barrier the last rank SIGKILLs itself; rank 0
/// computes without MPI calls and polls `needs_recovery()` (an atomic flag the detector thread
/// sets), then prints the time since the barrier.
pub fn detect_rank_main() -> Result<()> {
    let mpi = Mpi::init()?;
    let world = mpi.world()?.dup()?;
    let store = Store::create(&world, Config::new(["checkpoint"], 1))?;
    world.barrier()?;
    let killed_at = Instant::now();
    if world.rank() == world.size() - 1 {
        failpoint::kill_self();
    }
    while !store.needs_recovery() && killed_at.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_micros(50));
    }
    if world.rank() == 0 {
        let noticed = store.needs_recovery();
        println!("detected={noticed} detect_ms={:.2}", killed_at.elapsed().as_secs_f64() * 1e3);
    }
    failpoint::exit_now(0)
}

/// The rank side of `ftkv bench store` for ftkv and raw MPI RMA: for each size, the raw run then
/// the ftkv run (those of them in `systems`), `writers` ranks writing for `millis` each, then
/// every copy verified.
pub fn store_rank_main(
    systems: &[&str],
    writers: usize,
    sizes: &[usize],
    millis: u64,
    copies: usize,
) -> Result<()> {
    let mpi = Mpi::init()?;
    let world = mpi.world()?.dup()?;
    anyhow::ensure!(copies < world.size() as usize, "copies must be fewer than the ranks");
    let writer = world.rank() as usize;
    let writing = writer < writers;
    for &size in sizes {
        if systems.contains(&"raw_rma") {
            let raw = raw_checkpoints(&world, Run { copies, size, millis, writing })?;
            if let Some((result, verified)) = raw {
                let report = result.into_report(System::RawRma, size, writer, verified);
                println!("{}", report.line());
            }
        }
        if systems.contains(&"ftkv") {
            let ftkv = ftkv_checkpoints(&world, Run { copies, size, millis, writing })?;
            if let Some((result, verified)) = ftkv {
                let report = result.into_report(System::Ftkv, size, writer, verified);
                println!("{}", report.line());
            }
        }
    }
    drop(world);
    mpi.finalize_bounded(Duration::from_secs(3))?;
    Ok(())
}

/// One measured run of the checkpoint workload on this rank: whether it writes, for how long.
#[derive(Debug, Clone, Copy)]
struct Run {
    copies: usize,
    size: usize,
    millis: u64,
    writing: bool,
}

/// Raw RMA: each (owner, kind) has a `size`-byte slot at the same offset on each of its
/// holders; a write is one put per holder and one flush per holder, a delete puts 8 zero bytes.
fn raw_checkpoints(world: &Comm, run: Run) -> Result<Option<(WorkloadResult, bool)>> {
    let Run { copies, size, millis, writing } = run;
    let slot = size.max(8);
    let ranks = world.size() as usize;
    let per_rank = slot.checked_mul(ranks * 2).context("window size overflows")?;
    ensure_windows_fit(world, per_rank)?;
    let window = Window::allocate(world, per_rank)?.lock_all()?;
    let targets = holders(world, copies)?;
    let disp = |kind: u16| ((world.rank() as usize * 2 + kind as usize) * slot) as i64;
    let zeros = [0u8; 8];
    world.barrier()?;
    let until = Instant::now() + Duration::from_millis(millis);
    let result = if writing {
        Some(checkpoint_workload(size, until, |kind, value| {
            let data = value.unwrap_or(&zeros);
            Ok(window.scope(|s| targets.iter().try_for_each(|&t| s.put(t, disp(kind), data)))?)
        })?)
    } else {
        None
    };
    world.barrier()?;
    let verified = match &result {
        Some(r) => verify_raw(&window, &targets, disp(0), &r.last_checkpoint)?,
        None => true,
    };
    world.barrier()?;
    window.unlock_all()?.free()?;
    Ok(result.map(|r| (r, verified)))
}

fn verify_raw(window: &LockedWindow, targets: &[i32], disp: i64, last: &[u8]) -> Result<bool> {
    let mut ok = true;
    for &t in targets {
        let mut copy = vec![0u8; last.len()];
        window.scope(|s| s.get(t, disp, &mut copy))?;
        ok &= copy == last;
    }
    Ok(ok)
}

fn ftkv_checkpoints(world: &Comm, run: Run) -> Result<Option<(WorkloadResult, bool)>> {
    let Run { copies, size, millis, writing } = run;
    let mut config = Config::new(["checkpoint", "loot"], copies);
    config.max_value = size;
    config.initial_capacity = size;
    let mut store = Store::create(world, config)?;
    let me = store.worker();
    store.sync()?;
    let until = Instant::now() + Duration::from_millis(millis);
    let result = if writing {
        Some(checkpoint_workload(size, until, |kind, value| {
            let key = Key::new(me, kind);
            match value {
                Some(v) => store.put(key, v)?,
                None => store.delete(key)?,
            }
            Ok(())
        })?)
    } else {
        None
    };
    store.sync()?;
    let verified = match &result {
        Some(r) => verify_store(&mut store, me, r)?,
        None => true,
    };
    store.sync()?;
    Ok(result.map(|r| (r, verified)))
}

/// Every holder has the last checkpoint, and the loot as its last write left it.
fn verify_store(store: &mut Store, me: i32, result: &WorkloadResult) -> Result<bool> {
    let checkpoint = store.read_copies(Key::new(me, 0))?;
    let loot = store.read_copies(Key::new(me, 1))?;
    let checkpoints_ok =
        checkpoint.iter().all(|(_, v)| v.as_deref() == Some(&result.last_checkpoint[..]));
    let loot_ok = loot.iter().all(|(_, v)| v.is_some() == result.loot_present);
    Ok(checkpoints_ok && loot_ok && !checkpoint.is_empty())
}

/// The rank side of `ftkv bench recovery`: every rank stores `bytes` in its checkpoint (2
/// copies), then puts 1 KiB to a second key in a loop. The driver SIGKILLs one rank; each
/// survivor reports ([`GlobalRecoveryReport`]) when it noticed, when its recovery returned,
/// how long the interrupted put was blocked, and its put latency before and after.
pub fn recovery_rank_main(bytes: usize) -> Result<()> {
    let mpi = Mpi::init()?;
    let world = mpi.world()?.dup()?;
    let mut store = checkpointed_store(&world, bytes, Config::new(["checkpoint", "small"], 2))?;
    let me = store.worker();
    let small = vec![1u8; 1024];
    let mut before = crate::stats::Histogram::default();
    let started = Instant::now();
    let blocked_from = loop {
        let t = Instant::now();
        let unix = unix_us();
        match store.put(Key::new(me, 1), &small) {
            Ok(()) => before.record(t.elapsed()),
            Err(e) if e.needs_recovery() => break (t, unix),
            Err(e) => return Err(e.into()),
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(30), "no failure within 30 s");
        std::thread::sleep(Duration::from_micros(20));
    };
    let detect_us = blocked_from.1;
    let noticed_us = noticed_unix_us(&store).unwrap_or(detect_us);
    let recovery = store.recover()?;
    let recovered_us = unix_us();
    let blocked = blocked_from.0.elapsed();
    let mut after = crate::stats::Histogram::default();
    for _ in 0..2000 {
        let t = Instant::now();
        store.put(Key::new(me, 1), &small)?;
        after.record(t.elapsed());
    }
    let restored = store.get(Key::new(me, 0))?.is_some_and(|v| v.len() == bytes);
    store.sync()?;
    let report = GlobalRecoveryReport {
        failed: recovery.failed,
        detect_us,
        noticed_us,
        recovered_us,
        store_ms: recovery.duration.as_secs_f64() * 1e3,
        blocked_ms: blocked.as_secs_f64() * 1e3,
        before_p50_us: before.quantile_us(0.5),
        after_p50_us: after.quantile_us(0.5),
        keys: recovery.keys_recovered,
        restored,
    };
    println!("{}", report.line());
    drop(store);
    drop(world);
    mpi.finalize_bounded(Duration::from_secs(3))?;
    Ok(())
}

/// When `store` learned of its first failure, in Unix µs.
fn noticed_unix_us(store: &Store) -> Option<u64> {
    let ago = store.first_failure_noticed()?.elapsed();
    Some(unix_us().saturating_sub(ago.as_micros() as u64))
}

/// The store of `ftkv bench recovery`'s ranks: `config` sized for `bytes`, every worker's
/// checkpoint holding `bytes`, synced; prints `ready pid=<pid>` for the driver's kill.
fn checkpointed_store(world: &Comm, bytes: usize, mut config: Config) -> Result<Store> {
    config.max_value = bytes.max(1024);
    config.initial_capacity = bytes.max(1024);
    let mut store = Store::create(world, config)?;
    let me = store.worker();
    store.put(Key::new(me, 0), &vec![me as u8; bytes])?;
    store.sync()?;
    println!("ready pid={}", std::process::id());
    Ok(store)
}

/// How long after its detection a rank's puts count as "during the recovery" in `ftkv bench
/// recovery`'s localized rows (a localized repair of 1 MiB per rank ends well inside it).
pub const RECOVERY_WINDOW_US: u64 = 50_000;

/// How often a rank of `ftkv bench recovery` looks at its store's failed set while it waits for
/// its next put, in µs: the resolution of its detection time.
const DETECTION_LOOK_US: u64 = 20;

/// The rank side of `ftkv bench recovery --localized` rows: like [`recovery_rank_main`], but
/// with [`ftkv::Recovery::Localized`]: the survivors never stop putting, one put every
/// `pace_us` µs. Each reports ([`LocalizedRecoveryReport`]) when it noticed the failure, when
/// its own keys' copies were back, what it moved, and its 1 KiB put latency and rate before its
/// detection and in the [`RECOVERY_WINDOW_US`] after it. Then they meet in an agreement and
/// recover globally, so the job ends like any other.
pub fn localized_recovery_rank_main(bytes: usize, pace_us: u64) -> Result<()> {
    let mpi = Mpi::init()?;
    let world = mpi.world()?.dup()?;
    let coordination = world.dup()?;
    let config = Config::new(["checkpoint", "small"], 2).localized();
    let mut store = checkpointed_store(&world, bytes, config)?;
    let me = store.worker();
    let run = put_through_a_failure(&mut store, Duration::from_micros(pace_us))?;
    let copies = store.read_copies(Key::new(me, 0))?;
    let restored =
        copies.len() == 2 && copies.iter().all(|(_, v)| v.as_ref().map(Vec::len) == Some(bytes));
    println!("{}", run.report(restored).line());
    coordination.failed_ranks()?;
    coordination.agree(1)?;
    store.recover()?;
    store.sync()?;
    drop(store);
    drop(world);
    drop(coordination);
    mpi.finalize_bounded(Duration::from_secs(3))?;
    Ok(())
}

/// One rank's puts around a failure it repairs locally.
#[derive(Default)]
struct LocalizedRun {
    started_us: u64,
    detect_us: Option<u64>,
    noticed_us: Option<u64>,
    repaired_us: Option<u64>,
    keys_moved: usize,
    bytes_moved: u64,
    /// Each put's start (Unix µs) and latency.
    samples: Vec<(u64, Duration)>,
}

impl LocalizedRun {
    /// Notes the store's first failure and its repairs since the last look.
    fn look(&mut self, store: &mut Store) {
        if self.detect_us.is_none() && !store.failed().is_empty() {
            self.detect_us = Some(unix_us());
            self.noticed_us = noticed_unix_us(store);
        }
        for repair in store.take_repairs() {
            self.repaired_us = Some(unix_us());
            self.keys_moved += repair.keys_moved;
            self.bytes_moved += repair.bytes_moved;
        }
    }

    /// Whether the [`RECOVERY_WINDOW_US`] after the detection is over.
    fn window_over(&self) -> bool {
        self.detect_us.is_some_and(|d| unix_us() > d + RECOVERY_WINDOW_US)
    }

    /// Waits until `next`, looking at the store every [`DETECTION_LOOK_US`].
    fn pause_until(&mut self, store: &mut Store, next: Instant) {
        loop {
            self.look(store);
            let now = Instant::now();
            if now >= next {
                return;
            }
            let look = Duration::from_micros(DETECTION_LOOK_US);
            std::thread::sleep((next - now).min(look));
        }
    }

    /// The driver's report of this run; `restored`: whether the checkpoint is back on its
    /// copies.
    fn report(&self, restored: bool) -> LocalizedRecoveryReport {
        let detect_us = self.detect_us.unwrap_or(self.started_us);
        let (mut before, mut during) = <(Histogram, Histogram)>::default();
        for &(at, latency) in &self.samples {
            if at < detect_us {
                before.record(latency);
            } else {
                during.record(latency);
            }
        }
        let before_secs = detect_us.saturating_sub(self.started_us) as f64 / 1e6;
        let rate = |h: &Histogram, secs: f64| h.count() as f64 / secs.max(1e-9);
        LocalizedRecoveryReport {
            detect_us,
            noticed_us: self.noticed_us.unwrap_or(detect_us),
            repaired_us: self.repaired_us.unwrap_or(detect_us),
            moved_keys: self.keys_moved,
            moved_bytes: self.bytes_moved,
            before_p50_us: before.quantile_us(0.5),
            before_p99_us: before.quantile_us(0.99),
            during_p50_us: during.quantile_us(0.5),
            during_p99_us: during.quantile_us(0.99),
            before_rate: rate(&before, before_secs),
            during_rate: rate(&during, RECOVERY_WINDOW_US as f64 / 1e6),
            restored,
        }
    }
}

/// Puts 1 KiB to the second key every `pace` until [`RECOVERY_WINDOW_US`] after this rank
/// noticed a failure; every put must succeed (a localized repair never stops a writer).
fn put_through_a_failure(store: &mut Store, pace: Duration) -> Result<LocalizedRun> {
    let me = store.worker();
    let small = vec![1u8; 1024];
    let started = Instant::now();
    let mut run = LocalizedRun {
        started_us: unix_us(),
        samples: Vec::with_capacity(1 << 18),
        ..LocalizedRun::default()
    };
    while !run.window_over() {
        let (unix, t) = (unix_us(), Instant::now());
        store.put(Key::new(me, 1), &small)?;
        run.samples.push((unix, t.elapsed()));
        anyhow::ensure!(started.elapsed() < Duration::from_secs(30), "no failure within 30 s");
        run.pause_until(store, t + pace);
    }
    Ok(run)
}

/// The rank side of `ftkv bench growth`: 1 KiB put latency on this job's ranks, then the
/// machine's shared memory (where windows live) before the store, after creating it and after
/// every rank stored `stored` bytes; every rank reports all of them ([`GrowthReport`]), the
/// driver takes the memory from rank 0's.
pub fn growth_rank_main(copies: usize, stored: usize, millis: u64) -> Result<()> {
    let mpi = Mpi::init()?;
    let world = mpi.world()?.dup()?;
    let mut config = Config::new(["checkpoint", "small"], copies);
    config.max_value = stored.max(1024);
    config.initial_capacity = stored.max(1024);
    world.barrier()?;
    let shm_empty = shmem_kib()?;
    let mut store = Store::create(&world, config)?;
    let me = store.worker();
    store.sync()?;
    let shm_created = shmem_kib()?;
    let mut latency = crate::stats::Histogram::default();
    let small = vec![3u8; 1024];
    let until = Instant::now() + Duration::from_millis(millis);
    while Instant::now() < until {
        let t = Instant::now();
        store.put(Key::new(me, 1), &small)?;
        latency.record(t.elapsed());
    }
    store.sync()?;
    store.put(Key::new(me, 0), &vec![5u8; stored])?;
    store.sync()?;
    let shm_stored = shmem_kib()?;
    let report = GrowthReport {
        ranks: world.size() as usize,
        copies,
        stored,
        p50_us: latency.quantile_us(0.5),
        p99_us: latency.quantile_us(0.99),
        shm_empty_kib: shm_empty,
        shm_created_kib: shm_created,
        shm_stored_kib: shm_stored,
    };
    println!("{}", report.line());
    store.sync()?;
    drop(store);
    drop(world);
    mpi.finalize_bounded(Duration::from_secs(3))?;
    Ok(())
}

/// The machine's shared memory in KiB (`Shmem:` of /proc/meminfo): MPI windows live there.
fn shmem_kib() -> Result<u64> {
    crate::machine::meminfo_kib("Shmem:")
}

/// Writes `text` to `path`, creating its directory.
fn write_results(path: &std::path::Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, format!("{text}\n")).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(mode: &str, size: usize, p50_us: f64) -> PutRow {
        let mode = mode.to_owned();
        PutRow { mode, size, puts: 10, p50_us, p99_us: p50_us, max_us: p50_us, mean_us: p50_us }
    }

    #[test]
    fn the_put_plot_has_a_line_per_measured_mode() {
        let rows = vec![
            row("raw_rma", 1024, 0.4),
            row("raw_rma", 1 << 20, 700.0),
            row("ftkv_bitmap", 1024, 0.5),
            row("ftkv_bitmap", 1 << 20, 750.0),
        ];
        let ratios = ratios(&rows);
        let results = PutResults { ranks: 4, copies: 3, hosts: 1, rows, ratios };
        let svg = put_svg(&results).expect("a plot");
        let line_of = |mode: &str| {
            let (_, RGBColor(r, g, b)) = PUT_MODES.iter().find(|(m, _)| *m == mode).unwrap();
            format!("stroke=\"#{r:02X}{g:02X}{b:02X}\" stroke-width=\"2\" points=")
        };
        assert!(svg.contains(&line_of("raw_rma")), "{svg}");
        assert!(svg.contains(&line_of("ftkv_bitmap")), "{svg}");
        assert!(!svg.contains(&line_of("two_sided")), "not measured: {svg}");
        assert!(svg.contains("4 ranks on 1 hosts, 3 copies"), "{svg}");
    }
}
