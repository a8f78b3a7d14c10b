//! `ftkv bench scale`: what a store costs as the job grows, with the library's defaults
//! (localized recovery, 2 kinds, 3 copies, values that grow past the slots' inline capacity).
//!
//! Per job size: store creation, 1 KiB put p50 and p99, per-rank memory with every key holding
//! `stored` bytes, threads and sockets per rank, and (unless left out) one SIGKILL → detection →
//! every copy restored, with global and with localized recovery. Results go to
//! `bench_scale.json` and `bench_scale.svg` (each cost against ranks, as a ratio to the
//! smallest job).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use ftkv::{Config, Key, Store};
use ftkv_launch::cluster::Hosts;
use ftkv_launch::launch::Launch;
use ftkv_mpi::Mpi;
use plotters::prelude::*;
use serde::Serialize;

use crate::bench_recovery::{
    measure_recovery_on, reports_by_rank, write_json, RecoveryMode, RecoveryRow, FLAT_OUT_PACE_US,
};
use crate::machine::{field_of, meminfo_kib};
use crate::plot;
use crate::reports::{Report, ScaleReport};
use crate::stats::Histogram;

/// Kinds and copies of the measured store (the defaults a node should take, issue of record:
/// 128 ranks per host, 2 kinds, 3 copies, 1 MiB per key).
const KINDS: [&str; 2] = ["checkpoint", "loot"];
const COPIES: usize = 3;

/// One job layout: ranks, and simulated hosts (1: this machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Layout {
    pub ranks: usize,
    pub hosts: usize,
}

impl std::str::FromStr for Layout {
    type Err = String;

    /// `64` (one host) or `64x8` (64 ranks over 8 simulated hosts).
    fn from_str(s: &str) -> std::result::Result<Layout, String> {
        let (ranks, hosts) = s.split_once('x').unwrap_or((s, "1"));
        let number = |v: &str| v.trim().parse::<usize>().map_err(|e| format!("{s:?}: {e}"));
        let layout = Layout { ranks: number(ranks)?, hosts: number(hosts)? };
        if layout.ranks < 4 || layout.hosts == 0 || layout.hosts > layout.ranks {
            return Err(format!("{s:?}: needs at least 4 ranks and 1..=ranks hosts"));
        }
        Ok(layout)
    }
}

/// One job size of `ftkv bench scale`.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleRow {
    pub ranks: usize,
    pub hosts: usize,
    /// The slowest rank's `Store::create`.
    pub create_ms: f64,
    /// Medians over the ranks of their 1 KiB put p50 and p99.
    pub put_p50_us: f64,
    pub put_p99_us: f64,
    pub stored_per_key: usize,
    /// Medians over the ranks, in KiB: private resident memory, resident shared memory (its view
    /// of the windows), address space.
    pub rss_anon_kib: f64,
    pub rss_shmem_kib: f64,
    pub vm_size_kib: f64,
    /// The machine's shared memory the store added, per rank, in KiB (windows and extents of
    /// every host: they all live on this machine).
    pub shm_per_rank_kib: f64,
    /// The most threads and sockets any rank held.
    pub threads_max: u64,
    pub sockets_max: u64,
    /// One SIGKILL, global then localized recovery (absent with `--no-recovery`, or when the
    /// measurement failed: then its error is in `recovery_errors`).
    pub global: Option<RecoveryRow>,
    pub localized: Option<RecoveryRow>,
    pub recovery_errors: Vec<String>,
}

/// The rank side: creates a store with the library's defaults (localized), puts 1 KiB for
/// `millis`, then stores `stored` bytes under each of its keys and reports ([`ScaleReport`]).
pub fn scale_rank_main(stored: usize, millis: u64) -> Result<()> {
    let mpi = Mpi::init()?;
    let world = mpi.world()?.dup()?;
    let copies = COPIES.min(world.size() as usize - 1);
    world.barrier()?;
    let shm_empty = meminfo_kib("Shmem:")?;
    world.barrier()?;
    let started = Instant::now();
    let mut store = Store::create(&world, Config::new(KINDS, copies).localized())?;
    let create_ms = started.elapsed().as_secs_f64() * 1e3;
    let me = store.worker();
    store.sync()?;
    let latency = put_for(&mut store, Key::new(me, 1), Duration::from_millis(millis))?;
    let value = vec![5u8; stored];
    for kind in 0..KINDS.len() as u16 {
        store.put(Key::new(me, kind), &value)?;
    }
    store.sync()?;
    let host_ranks = host_ranks(&world)?;
    let report = ScaleReport {
        ranks: world.size() as usize,
        host_ranks,
        create_ms,
        p50_us: latency.quantile_us(0.5),
        p99_us: latency.quantile_us(0.99),
        rss_anon_kib: status_kib("RssAnon:")?,
        rss_shmem_kib: status_kib("RssShmem:")?,
        vm_size_kib: status_kib("VmSize:")?,
        threads: status_kib("Threads:")?,
        sockets: sockets()?,
        shm_empty_kib: shm_empty,
        shm_stored_kib: meminfo_kib("Shmem:")?,
    };
    println!("{}", report.line());
    store.sync()?;
    drop(store);
    drop(world);
    mpi.finalize_bounded(Duration::from_secs(3))?;
    Ok(())
}

fn put_for(store: &mut Store, key: Key, span: Duration) -> Result<Histogram> {
    let mut latency = Histogram::default();
    let small = vec![3u8; 1024];
    let until = Instant::now() + span;
    while Instant::now() < until {
        let t = Instant::now();
        store.put(key, &small)?;
        latency.record(t.elapsed());
    }
    Ok(latency)
}

/// How many of the job's ranks share this rank's host.
fn host_ranks(world: &ftkv_mpi::Comm) -> Result<usize> {
    let mine = world.host_id()?;
    let all = world.allgather(&mine.to_le_bytes())?;
    Ok(all.chunks_exact(4).filter(|c| **c == mine.to_le_bytes()).count())
}

/// A `Name: value` line of /proc/self/status (KiB for memory, a count for `Threads:`).
fn status_kib(field: &str) -> Result<u64> {
    field_of(&std::fs::read_to_string("/proc/self/status")?, field)
}

/// Open sockets of this process.
fn sockets() -> Result<u64> {
    let fds = std::fs::read_dir("/proc/self/fd")?;
    let links = fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok());
    Ok(links.filter(|l| l.to_string_lossy().starts_with("socket:")).count() as u64)
}

/// Measures one layout.
pub fn measure_scale(
    exe: &Path,
    layout: Layout,
    stored: usize,
    millis: u64,
    recovery: bool,
) -> Result<ScaleRow> {
    let hosts = hosts_of(layout);
    let args = ["bench-scale-rank".to_string(), stored.to_string(), millis.to_string()];
    let launch = Launch::new(exe, layout.ranks).args(args).on_hosts(hosts.clone());
    let out = launch.timeout(Duration::from_secs(600)).run()?;
    ensure!(!out.timed_out, "the scale benchmark hung:\n{}", out.transcript());
    let reports: Vec<ScaleReport> =
        reports_by_rank(&out, layout.ranks)?.into_iter().flatten().collect();
    ensure!(reports.len() == layout.ranks, "not every rank reported:\n{}", out.transcript());
    let mut row = scale_row_of(layout, &reports, stored);
    if recovery {
        let per_rank = stored * KINDS.len();
        let mut measure = |mode: RecoveryMode| match measure_recovery_on(
            exe,
            layout.ranks,
            hosts.clone(),
            per_rank,
            mode,
        ) {
            Ok(measured) => Some(measured),
            Err(e) => {
                let mode = if mode == RecoveryMode::Global { "global" } else { "localized" };
                let first = format!("{e:#}").lines().next().unwrap_or_default().to_owned();
                row.recovery_errors.push(format!("{mode}: {first}"));
                None
            }
        };
        let global = measure(RecoveryMode::Global);
        let localized = measure(RecoveryMode::Localized { pace_us: FLAT_OUT_PACE_US });
        (row.global, row.localized) = (global, localized);
    }
    Ok(row)
}

fn hosts_of(layout: Layout) -> Hosts {
    if layout.hosts > 1 {
        Hosts::Simulated(layout.hosts)
    } else {
        Hosts::ThisMachine
    }
}

fn scale_row_of(layout: Layout, reports: &[ScaleReport], stored: usize) -> ScaleRow {
    let median_of = |f: fn(&ScaleReport) -> f64| median(reports.iter().map(f).collect());
    let first = &reports[0];
    let shm_added = first.shm_stored_kib.saturating_sub(first.shm_empty_kib);
    ScaleRow {
        ranks: layout.ranks,
        hosts: layout.hosts,
        create_ms: reports.iter().map(|r| r.create_ms).fold(0.0, f64::max),
        put_p50_us: median_of(|r| r.p50_us),
        put_p99_us: median_of(|r| r.p99_us),
        stored_per_key: stored,
        rss_anon_kib: median_of(|r| r.rss_anon_kib as f64),
        rss_shmem_kib: median_of(|r| r.rss_shmem_kib as f64),
        vm_size_kib: median_of(|r| r.vm_size_kib as f64),
        shm_per_rank_kib: shm_added as f64 / layout.ranks as f64,
        threads_max: reports.iter().map(|r| r.threads).max().unwrap_or(0),
        sockets_max: reports.iter().map(|r| r.sockets).max().unwrap_or(0),
        global: None,
        localized: None,
        recovery_errors: Vec::new(),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// A layout whose failure-free job failed, with the first line of its error.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleFailure {
    pub layout: Layout,
    pub error: String,
}

/// What `bench_scale.json` holds.
#[derive(Serialize)]
struct ScaleResults<'a> {
    rows: &'a [ScaleRow],
    failed: &'a [ScaleFailure],
}

/// Runs every layout (a failed one is reported and the others still run), prints a table and the creation time's linear fit, writes
/// `bench_scale.json` and `bench_scale.svg`.
pub fn run_scale(
    exe: &Path,
    layouts: &[Layout],
    stored: usize,
    millis: u64,
    recovery: bool,
    out_dir: &Path,
) -> Result<Vec<ScaleRow>> {
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for &layout in layouts {
        match measure_scale(exe, layout, stored, millis, recovery) {
            Ok(row) => rows.push(row),
            Err(e) => {
                let first = format!("{e:#}").lines().next().unwrap_or_default().to_owned();
                failed.push(ScaleFailure { layout, error: first });
            }
        }
        eprintln!("[bench scale] {} ranks on {} hosts: done", layout.ranks, layout.hosts);
    }
    print_table(&rows);
    print_fit(&rows);
    for row in rows.iter().filter(|r| !r.recovery_errors.is_empty()) {
        println!("{} ranks on {} hosts: {}", row.ranks, row.hosts, row.recovery_errors.join("; "));
        let layout = Layout { ranks: row.ranks, hosts: row.hosts };
        let errors = row.recovery_errors.iter().cloned();
        failed.extend(errors.map(|error| ScaleFailure { layout, error }));
    }
    for f in &failed {
        println!("{} ranks on {} hosts failed: {}", f.layout.ranks, f.layout.hosts, f.error);
    }
    write_json(out_dir, "bench_scale.json", &ScaleResults { rows: &rows, failed: &failed })?;
    let svg = svg_plot(&rows)?;
    std::fs::write(out_dir.join("bench_scale.svg"), svg).context("writing bench_scale.svg")?;
    anyhow::ensure!(
        failed.is_empty(),
        "{} measurements failed (a layout's job, or a recovery that did not finish): {}",
        failed.len(),
        failed
            .iter()
            .map(|f| format!("{} ranks on {} hosts: {}", f.layout.ranks, f.layout.hosts, f.error))
            .collect::<Vec<_>>()
            .join("; ")
    );
    Ok(rows)
}

fn print_table(rows: &[ScaleRow]) {
    println!(
        "| ranks | hosts | create ms | 1 KiB put p50 / p99 µs | RssAnon MiB/rank | shm MiB/rank \
         | RssShmem MiB/rank | VmSize MiB/rank | threads | sockets | global detect / restore ms \
         | localized detect / restore ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mib = |kib: f64| kib / 1024.0;
    let recovery = |r: &Option<RecoveryRow>| {
        r.as_ref().map_or("-".into(), |r| format!("{:.1} / {:.1}", r.detect_ms, r.restore_ms))
    };
    for r in rows {
        println!(
            "| {} | {} | {:.0} | {:.2} / {:.2} | {:.1} | {:.1} | {:.1} | {:.0} | {} | {} | {} | {} |",
            r.ranks,
            r.hosts,
            r.create_ms,
            r.put_p50_us,
            r.put_p99_us,
            mib(r.rss_anon_kib),
            mib(r.shm_per_rank_kib),
            mib(r.rss_shmem_kib),
            mib(r.vm_size_kib),
            r.threads_max,
            r.sockets_max,
            recovery(&r.global),
            recovery(&r.localized),
        );
    }
}

/// The least-squares line of creation time against ranks over the one-host rows.
fn print_fit(rows: &[ScaleRow]) {
    let points: Vec<(f64, f64)> =
        rows.iter().filter(|r| r.hosts == 1).map(|r| (r.ranks as f64, r.create_ms)).collect();
    if let Some((slope, intercept, r2)) = linear_fit(&points) {
        println!(
            "creation time on one host: {intercept:.1} ms + {slope:.3} ms × ranks (R² {r2:.3})"
        );
    }
}

/// Slope, intercept and R² of the least-squares line through `points` (at least 2).
fn linear_fit(points: &[(f64, f64)]) -> Option<(f64, f64, f64)> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let (sx, sy) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let syy: f64 = points.iter().map(|(_, y)| (y - my).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    let r2 = if syy == 0.0 { 1.0 } else { sxy * sxy / (sxx * syy) };
    Some((slope, my - slope * mx, r2))
}

/// Each cost of the one-host rows as a ratio to the smallest job's, against ranks (SVG).
fn svg_plot(rows: &[ScaleRow]) -> Result<String> {
    type Metric = (&'static str, fn(&ScaleRow) -> f64, RGBColor);
    let metrics: [Metric; 6] = [
        ("create ms", |r| r.create_ms, RED),
        ("put p50", |r| r.put_p50_us, BLUE),
        ("RssAnon/rank", |r| r.rss_anon_kib, GREEN),
        ("shm/rank", |r| r.shm_per_rank_kib, MAGENTA),
        ("threads", |r| r.threads_max as f64, BLACK),
        ("sockets", |r| r.sockets_max as f64, CYAN),
    ];
    let one_host: Vec<&ScaleRow> = rows.iter().filter(|r| r.hosts == 1).collect();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (640, 400)).into_drawing_area();
        root.fill(&WHITE).map_err(plot::plot_error)?;
        let Some(base) = one_host.first() else {
            root.present().map_err(plot::plot_error)?;
            drop(root);
            return Ok(svg);
        };
        let max_ranks = one_host.iter().map(|r| r.ranks).max().unwrap_or(8) as f64;
        let ratio = |f: fn(&ScaleRow) -> f64, r: &ScaleRow| f(r) / f(base).max(1e-9);
        let top = metrics
            .iter()
            .flat_map(|(_, f, _)| one_host.iter().map(move |r| ratio(*f, r)))
            .fold(2.0f64, f64::max);
        let mut chart = ChartBuilder::on(&root)
            .caption("cost per rank against ranks (ratio to the smallest job)", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..max_ranks * 1.05, 0f64..top * 1.1)
            .map_err(plot::plot_error)?;
        chart.configure_mesh().x_desc("ranks").y_desc("ratio").draw().map_err(plot::plot_error)?;
        for (name, f, color) in metrics {
            let series = one_host.iter().map(|r| (r.ranks as f64, ratio(f, r)));
            chart
                .draw_series(LineSeries::new(series, color.stroke_width(2)))
                .map_err(plot::plot_error)?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(plot::plot_error)?;
        root.present().map_err(plot::plot_error)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_parse_and_bad_ones_are_refused() {
        assert_eq!("64".parse::<Layout>(), Ok(Layout { ranks: 64, hosts: 1 }));
        assert_eq!("64x8".parse::<Layout>(), Ok(Layout { ranks: 64, hosts: 8 }));
        for bad in ["2", "8x0", "8x9", "x", "8y2"] {
            assert!(bad.parse::<Layout>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_fit_of_a_line_is_exact() {
        let points: Vec<(f64, f64)> =
            [8.0, 16.0, 32.0].iter().map(|&x| (x, 3.0 * x + 5.0)).collect();
        let (slope, intercept, r2) = linear_fit(&points).unwrap();
        assert!((slope - 3.0).abs() < 1e-9 && (intercept - 5.0).abs() < 1e-9 && r2 > 0.999);
        assert!(linear_fit(&points[..1]).is_none());
    }
}
