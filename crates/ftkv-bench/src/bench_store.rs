//! `ftkv bench store`: the checkpoint workload (reference paper §2) on ftkv, raw MPI RMA,
//! Redis and etcd in one invocation, every value on 3 copies, with the ratios that matter.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde::Serialize;

use crate::workload::{checkpoint_workload, WorkloadResult};
use plotters::style::RGBColor;

use crate::plot::{self, size_name, Chart, Series};

use crate::peers::{self, EtcdClient, RedisClient, ETCD_PORTS, REDIS_PORTS};
use crate::reports::{Report, StoreRunReport, System};
use crate::stats::Histogram;
use ftkv_launch::launch::{JobOutput, Launch};

/// What to run.
#[derive(Debug, Clone)]
pub struct StoreBench {
    pub systems: Vec<System>,
    pub writers: Vec<usize>,
    pub sizes: Vec<usize>,
    pub millis: u64,
    pub copies: usize,
    pub out_dir: PathBuf,
    /// The JSON report (default: `out_dir/bench_store.json`).
    pub json: Option<PathBuf>,
}

/// One measured (system, writers, size).
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub system: System,
    pub writers: usize,
    pub size: usize,
    pub writes: u64,
    pub writes_per_s: f64,
    pub mib_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    /// The last written value of every key was found on every copy.
    pub verified: bool,
}

/// Ratios at one (writers, size).
#[derive(Debug, Clone, Serialize)]
pub struct Ratios {
    pub writers: usize,
    pub size: usize,
    pub ftkv_over_raw_p50: Option<f64>,
    pub ftkv_over_redis_throughput: Option<f64>,
    pub ftkv_over_etcd_throughput: Option<f64>,
}

/// Runs everything, prints the table and writes JSON and SVG plots into `out_dir`.
pub fn run(exe: &Path, bench: &StoreBench) -> Result<Vec<Row>> {
    ensure!(!bench.sizes.is_empty() && !bench.writers.is_empty(), "nothing to measure");
    ensure!(bench.writers.iter().all(|&w| w >= 1), "--writers must be at least 1");
    peers::install_interrupt_handler()?;
    let mut progress = Progress::new(steps(bench));
    let mut rows = Vec::new();
    if bench.systems.iter().any(|s| matches!(s, System::Ftkv | System::RawRma)) {
        for &writers in &bench.writers {
            rows.extend(mpi_rows(exe, bench, writers, &mut progress)?);
        }
    }
    if bench.systems.iter().any(|s| matches!(s, System::Redis | System::Etcd)) {
        peers::ensure_installed()?;
    }
    if bench.systems.contains(&System::Redis) {
        let servers = peers::start_redis()?;
        rows.extend(peer_rows(bench, System::Redis, &mut progress)?);
        drop(servers);
    }
    if bench.systems.contains(&System::Etcd) {
        let servers = peers::start_etcd()?;
        rows.extend(peer_rows(bench, System::Etcd, &mut progress)?);
        drop(servers);
    }
    let ratios = ratios(&rows, bench);
    print!("{}", markdown(&rows, &ratios));
    write_outputs(bench, &rows, &ratios)?;
    ensure!(rows.iter().all(|r| r.verified), "a system did not hold the last value on every copy");
    Ok(rows)
}

fn steps(bench: &StoreBench) -> usize {
    let per_size = bench.systems.len() * bench.sizes.len() * bench.writers.len();
    per_size.max(1)
}

/// A one-line progress bar on stderr.
struct Progress {
    total: usize,
    done: usize,
    started: Instant,
}

impl Progress {
    fn new(total: usize) -> Progress {
        Progress { total, done: 0, started: Instant::now() }
    }

    fn step(&mut self, row: &Row) {
        self.done += 1;
        let filled = self.done * 20 / self.total.max(1);
        eprintln!(
            "[bench store] [{}{}] {}/{} {:>6.1} s  {:<8} W={} {:>8}: {:>9.0} writes/s, p50 {:.1} µs{}",
            "#".repeat(filled),
            "-".repeat(20 - filled.min(20)),
            self.done,
            self.total,
            self.started.elapsed().as_secs_f64(),
            row.system.name(),
            row.writers,
            size_name(row.size),
            row.writes_per_s,
            row.p50_us,
            if row.verified { "" } else { "  NOT VERIFIED" }
        );
    }
}

/// Per writer: a histogram and totals from one rank's [`StoreRunReport`] or one thread.
struct Measured {
    result: WorkloadResult,
    verified: bool,
}

impl From<StoreRunReport> for Measured {
    fn from(report: StoreRunReport) -> Measured {
        let StoreRunReport { writes, bytes, secs, verified, histogram, .. } = report;
        let result = WorkloadResult { histogram, writes, bytes, secs, ..WorkloadResult::default() };
        Measured { result, verified }
    }
}

fn row(system: System, writers: usize, size: usize, measured: &[Measured]) -> Row {
    let mut histogram = Histogram::default();
    measured.iter().for_each(|m| histogram.merge(&m.result.histogram));
    let per_s = |f: fn(&WorkloadResult) -> f64| {
        measured.iter().map(|m| f(&m.result) / m.result.secs.max(1e-9)).sum()
    };
    Row {
        system,
        writers,
        size,
        writes: measured.iter().map(|m| m.result.writes).sum(),
        writes_per_s: per_s(|r| r.writes as f64),
        mib_per_s: per_s(|r| r.bytes as f64) / (1 << 20) as f64,
        p50_us: histogram.quantile_us(0.5),
        p99_us: histogram.quantile_us(0.99),
        p999_us: histogram.quantile_us(0.999),
        verified: measured.len() == writers && measured.iter().all(|m| m.verified),
    }
}

/// ftkv and raw RMA: one mpirun job per writer count (at least copies + 1 ranks, so no copy
/// lives on its owner).
fn mpi_rows(
    exe: &Path,
    bench: &StoreBench,
    writers: usize,
    progress: &mut Progress,
) -> Result<Vec<Row>> {
    let ranks = writers.max(bench.copies + 1);
    let sizes: Vec<String> = bench.sizes.iter().map(|s| s.to_string()).collect();
    let mpi_systems: Vec<&str> = bench
        .systems
        .iter()
        .filter(|s| matches!(s, System::Ftkv | System::RawRma))
        .map(|s| s.name())
        .collect();
    let args = [
        "bench-store-rank".to_string(),
        mpi_systems.join(","),
        writers.to_string(),
        sizes.join(","),
        bench.millis.to_string(),
        bench.copies.to_string(),
    ];
    let budget = Duration::from_millis(bench.millis * bench.sizes.len() as u64 * 2)
        + Duration::from_secs(60);
    let out = Launch::new(exe, ranks).args(args).timeout(budget).run()?;
    ensure!(!out.timed_out, "the MPI benchmark hung:\n{}", out.transcript());
    let mut rows = Vec::new();
    for &size in &bench.sizes {
        for system in
            [System::RawRma, System::Ftkv].into_iter().filter(|s| bench.systems.contains(s))
        {
            let measured = measured_by_ranks(&out, ranks, system, size)?;
            let r = row(system, writers, size, &measured);
            progress.step(&r);
            rows.push(r);
        }
    }
    Ok(rows)
}

/// What the writer ranks reported of `system`'s runs at `size` (an error when none did).
fn measured_by_ranks(
    out: &JobOutput,
    ranks: usize,
    system: System,
    size: usize,
) -> Result<Vec<Measured>> {
    let mut measured = Vec::new();
    for rank in 0..ranks {
        measured.extend(runs_of(StoreRunReport::all_of(out, rank)?, system, size));
    }
    if measured.is_empty() {
        bail!("no {} results for {size} bytes:\n{}", system.name(), out.transcript());
    }
    Ok(measured)
}

/// The runs of `system` at `size` among `reports`.
fn runs_of(reports: Vec<StoreRunReport>, system: System, size: usize) -> Vec<Measured> {
    let wanted = reports.into_iter().filter(|r| r.system == system && r.size == size);
    wanted.map(Measured::from).collect()
}

/// Redis or etcd: `writers` client threads in this process.
fn peer_rows(bench: &StoreBench, system: System, progress: &mut Progress) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &writers in &bench.writers {
        for &size in &bench.sizes {
            let until = Instant::now() + Duration::from_millis(bench.millis);
            let measured: Vec<Measured> = std::thread::scope(|s| {
                let threads: Vec<_> = (0..writers)
                    .map(|w| s.spawn(move || peer_writer(system, (writers, w), size, until)))
                    .collect();
                threads.into_iter().map(|t| t.join().expect("writer thread")).collect::<Result<_>>()
            })?;
            let r = row(system, writers, size, &measured);
            progress.step(&r);
            rows.push(r);
        }
    }
    Ok(rows)
}

/// Keys of one writer of one run (each run its own, so that no run sees another's loot).
fn keys((writers, writer): (usize, usize), size: usize) -> [Vec<u8>; 2] {
    let run = format!("{writers}w:{size}:{writer}");
    [format!("checkpoint:{run}").into_bytes(), format!("loot:{run}").into_bytes()]
}

fn peer_writer(
    system: System,
    writer: (usize, usize),
    size: usize,
    until: Instant,
) -> Result<Measured> {
    let keys = keys(writer, size);
    match system {
        System::Redis => {
            let mut client = RedisClient::connect(REDIS_PORTS[0])?;
            let result = checkpoint_workload(size, until, |kind, value| match value {
                Some(v) => client.set_and_wait(&keys[kind as usize], v),
                None => client.del_and_wait(&keys[kind as usize]),
            })?;
            let verified = verify_redis(&keys, &result)?;
            Ok(Measured { result, verified })
        }
        System::Etcd => {
            let mut client = EtcdClient::connect(etcd_leader()?)?;
            let result = checkpoint_workload(size, until, |kind, value| match value {
                Some(v) => client.put(&keys[kind as usize], v),
                None => client.delete(&keys[kind as usize]),
            })?;
            let verified = verify_etcd(&keys, &result)?;
            Ok(Measured { result, verified })
        }
        _ => bail!("{} is measured under mpirun", system.name()),
    }
}

/// Every Redis server (primary and replicas) has the last checkpoint and the loot's state.
fn verify_redis(keys: &[Vec<u8>; 2], result: &WorkloadResult) -> Result<bool> {
    let mut ok = true;
    for port in REDIS_PORTS {
        let mut c = RedisClient::connect(port)?;
        ok &= c.get(&keys[0])?.as_deref() == Some(&result.last_checkpoint[..]);
        ok &= c.get(&keys[1])?.is_some() == result.loot_present;
    }
    Ok(ok)
}

/// Every etcd member's own copy (a serializable read) has the last values; etcd acknowledges
/// a write once a quorum has it, so the third member gets up to 5 s to apply it.
fn verify_etcd(keys: &[Vec<u8>; 2], result: &WorkloadResult) -> Result<bool> {
    let deadline = Instant::now() + Duration::from_secs(5);
    for (port, _) in ETCD_PORTS {
        let mut c = EtcdClient::connect(port)?;
        loop {
            let checkpoint = c.get(&keys[0], true)?;
            let loot = c.get(&keys[1], true)?;
            if checkpoint.as_deref() == Some(&result.last_checkpoint[..])
                && loot.is_some() == result.loot_present
            {
                break;
            }
            if Instant::now() > deadline {
                let found = checkpoint.map(|c| c.len());
                eprintln!(
                    "[bench store] etcd member {port}: checkpoint {found:?} bytes, last written {} (equal: {}); loot present {} (expected {})",
                    result.last_checkpoint.len(),
                    c.get(&keys[0], true)?.as_deref() == Some(&result.last_checkpoint[..]),
                    loot.is_some(),
                    result.loot_present
                );
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(true)
}

/// The client port of the current etcd leader (writes sent elsewhere take an extra hop).
fn etcd_leader() -> Result<u16> {
    for (port, _) in ETCD_PORTS {
        let mut c = EtcdClient::connect(port)?;
        let status = c.status()?;
        if status.0 == status.1 {
            return Ok(port);
        }
    }
    Ok(ETCD_PORTS[0].0)
}

fn ratios(rows: &[Row], bench: &StoreBench) -> Vec<Ratios> {
    let find = |s: System, w: usize, size: usize| {
        rows.iter().find(|r| r.system == s && r.writers == w && r.size == size)
    };
    let mut out = Vec::new();
    for &w in &bench.writers {
        for &size in &bench.sizes {
            let ftkv = find(System::Ftkv, w, size);
            let over = |other: System, f: fn(&Row) -> f64, inverse: bool| {
                let (a, b) = (ftkv?, find(other, w, size)?);
                Some(if inverse { f(b) / f(a) } else { f(a) / f(b) })
            };
            out.push(Ratios {
                writers: w,
                size,
                ftkv_over_raw_p50: over(System::RawRma, |r| r.p50_us, false),
                ftkv_over_redis_throughput: over(System::Redis, |r| r.writes_per_s, false),
                ftkv_over_etcd_throughput: over(System::Etcd, |r| r.writes_per_s, false),
            });
        }
    }
    out
}

pub fn markdown(rows: &[Row], ratios: &[Ratios]) -> String {
    let mut text = String::from(
        "| system | writers | size | writes/s | MiB/s | p50 µs | p99 µs | p99.9 µs | verified |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        text += &format!(
            "| {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {} |\n",
            r.system.name(),
            r.writers,
            size_name(r.size),
            r.writes_per_s,
            r.mib_per_s,
            r.p50_us,
            r.p99_us,
            r.p999_us,
            if r.verified { "yes" } else { "NO" }
        );
    }
    text += "\n| writers | size | ftkv/raw RMA p50 latency | ftkv/Redis throughput | ftkv/etcd throughput |\n|---|---|---|---|---|\n";
    let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}x"));
    for q in ratios {
        text += &format!(
            "| {} | {} | {} | {} | {} |\n",
            q.writers,
            size_name(q.size),
            show(q.ftkv_over_raw_p50),
            show(q.ftkv_over_redis_throughput),
            show(q.ftkv_over_etcd_throughput)
        );
    }
    text
}

fn write_outputs(bench: &StoreBench, rows: &[Row], ratios: &[Ratios]) -> Result<()> {
    std::fs::create_dir_all(&bench.out_dir)
        .with_context(|| format!("creating {}", bench.out_dir.display()))?;
    let json = serde_json::json!({
        "copies": bench.copies, "millis_per_run": bench.millis, "rows": rows, "ratios": ratios,
        "clients": {
            "ftkv": "ftkv Store::put/delete (passive-target RMA, bitmap detection)",
            "raw_rma": "MPI_Put of the same bytes to the same 3 holders + MPI_Win_flush per holder",
            "redis": "minimal RESP client in ftkv: SET + WAIT 2 pipelined in one round trip, WAIT count checked",
            "etcd": "etcd-client (gRPC, etcd's native v3 API), one connection per writer, sent to the leader",
        },
    });
    let path = bench.json.clone().unwrap_or_else(|| bench.out_dir.join("bench_store.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&json)? + "\n")?;
    let writers = bench.writers[0];
    let throughput = svg_plot(rows, writers, "writes/s", |r| r.writes_per_s)?;
    let latency = svg_plot(rows, writers, "p50 latency (µs)", |r| r.p50_us)?;
    std::fs::write(bench.out_dir.join("bench_store_throughput.svg"), throughput)?;
    std::fs::write(bench.out_dir.join("bench_store_latency.svg"), latency)?;
    eprintln!(
        "[bench store] wrote {}, bench_store_throughput.svg, bench_store_latency.svg",
        path.display()
    );
    Ok(())
}

/// A log-log line plot of `metric` against value size, one line per system, for `writers`
/// (SVG).
pub fn svg_plot(
    rows: &[Row],
    writers: usize,
    label: &str,
    metric: fn(&Row) -> f64,
) -> Result<String> {
    let series: Vec<Series> = System::ALL
        .into_iter()
        .map(|system| Series {
            name: system.name().to_owned(),
            color: color(system),
            points: rows
                .iter()
                .filter(|r| r.system == system && r.writers == writers)
                .map(|r| (r.size, metric(r)))
                .collect(),
        })
        .collect();
    let caption = format!("{label} vs value size ({writers} writers, 3 copies)");
    plot::by_size(&Chart::against_size(&caption, label), &series)
}

/// The line colour of `system` in the plots.
fn color(system: System) -> RGBColor {
    match system {
        System::Ftkv => RGBColor(0xd6, 0x27, 0x28),
        System::RawRma => RGBColor(0x7f, 0x7f, 0x7f),
        System::Redis => RGBColor(0x1f, 0x77, 0xb4),
        System::Etcd => RGBColor(0x2c, 0xa0, 0x2c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reports::read_back;

    fn row(system: System, size: usize, writes_per_s: f64) -> Row {
        Row {
            system,
            writers: 2,
            size,
            writes: 10,
            writes_per_s,
            mib_per_s: 0.0,
            p50_us: 1.0,
            p99_us: 2.0,
            p999_us: 3.0,
            verified: true,
        }
    }

    #[test]
    fn the_plot_has_one_labelled_line_per_system_measured() {
        let rows = [
            row(System::Ftkv, 1 << 10, 90_000.0),
            row(System::Ftkv, 1 << 20, 9_000.0),
            row(System::Redis, 1 << 10, 500.0),
            row(System::Redis, 1 << 20, 40.0),
        ];
        let svg = svg_plot(&rows, 2, "writes/s", |r| r.writes_per_s).expect("a plot");
        assert!(svg.starts_with("<svg"), "{svg}");
        let line_of = |system: System| {
            let RGBColor(r, g, b) = color(system);
            format!("stroke=\"#{r:02X}{g:02X}{b:02X}\" stroke-width=\"2\" points=")
        };
        assert!(svg.contains(&line_of(System::Ftkv)), "ftkv's line: {svg}");
        assert!(svg.contains(&line_of(System::Redis)), "redis's line: {svg}");
        assert!(!svg.contains(&line_of(System::Etcd)), "etcd was not measured: {svg}");
        for text in ["ftkv", "redis", "KiB", "MiB", "writes/s vs value size"] {
            assert!(svg.contains(text), "no {text:?} in {svg}");
        }
        let empty = svg_plot(&rows, 8, "writes/s", |r| r.writes_per_s).expect("a plot");
        assert!(empty.starts_with("<svg") && !empty.contains(&line_of(System::Ftkv)), "{empty}");
    }

    /// A writer's report of one write of `size` bytes per entry of `micros` (its latency, µs)
    /// in 0.5 s.
    fn report(system: System, size: usize, writer: usize, micros: &[u64]) -> StoreRunReport {
        let mut histogram = Histogram::default();
        micros.iter().for_each(|&us| histogram.record(Duration::from_micros(us)));
        let writes = micros.len() as u64;
        let bytes = writes * size as u64;
        StoreRunReport { system, size, writer, writes, bytes, secs: 0.5, verified: true, histogram }
    }

    #[test]
    fn a_row_comes_from_the_writers_reports_of_its_system_and_size() {
        let lines = [
            report(System::RawRma, 1024, 0, &[1, 1, 1]).line(),
            report(System::Ftkv, 1024, 0, &[10, 10]).line(),
            report(System::Ftkv, 2048, 0, &[99]).line(),
            report(System::Ftkv, 1024, 1, &[20, 30]).line(),
        ];
        let reports: Vec<StoreRunReport> = lines.iter().map(|l| read_back(l)).collect();
        let measured = runs_of(reports, System::Ftkv, 1024);
        assert_eq!(measured.len(), 2);
        let r = super::row(System::Ftkv, 2, 1024, &measured);
        assert_eq!((r.writes, r.writes_per_s, r.verified), (4, 8.0, true));
        assert_eq!(r.mib_per_s, 8.0 * 1024.0 / (1 << 20) as f64);
        let merged = report(System::Ftkv, 1024, 0, &[10, 10, 20, 30]).histogram;
        assert_eq!((r.p50_us, r.p99_us), (merged.quantile_us(0.5), merged.quantile_us(0.99)));
    }
}
