//! `ftkv bench recovery` (SIGKILL one rank: detection and re-replication times, put latency
//! around it) and `ftkv bench growth` (put latency and memory as the job grows).

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use serde::Serialize;

use crate::machine::unix_us;
use crate::plot::{self, size_name, Chart, Series};
use crate::reports::{GlobalRecoveryReport, GrowthReport, LocalizedRecoveryReport, Report};
use ftkv_launch::cluster::Hosts;
use ftkv_launch::launch::{kill_pid, union_of_failed, JobOutput, Launch};
use plotters::chart::SeriesLabelPosition;
use plotters::style::RGBColor;

/// One recovery measurement.
#[derive(Debug, Clone, Serialize)]
pub struct RecoveryRow {
    /// `global` (every survivor stops in `Store::recover`) or `localized` (only the owners of
    /// copies that lived on the victim move data; nobody stops putting).
    pub mode: &'static str,
    pub ranks: usize,
    pub bytes_per_rank: usize,
    /// The survivors' pace: one 1 KiB put every this many µs (between them they look at the
    /// store's failed set every 20 µs).
    pub pace_us: u64,
    /// SIGKILL to the first survivor's store learning of the failure (its detector thread
    /// marking it, whatever the rank was doing).
    pub detect_ms: f64,
    /// SIGKILL to the last survivor's store learning of the failure: every survivor notified.
    pub detect_last_ms: f64,
    /// SIGKILL to the last survivor's put loop seeing the failure (a put that waits for a repair
    /// delays it).
    pub seen_last_ms: f64,
    /// From that detection to the last survivor's recovery returning (all copies restored).
    pub restore_ms: f64,
    /// The longest a survivor's interrupted put waited (detection included): with global
    /// recovery no put completes while the store recovers.
    pub blocked_ms: f64,
    pub put_p50_before_us: f64,
    /// After the recovery; in localized rows, in the 50 ms after each survivor's detection
    /// (nobody stops putting).
    pub put_p50_after_us: f64,
    pub keys_recovered: u64,
    pub restored: bool,
    /// Localized rows: bytes the owners copied to reserve holders (every survivor's sum).
    pub bytes_moved: Option<u64>,
    /// Localized rows, over the survivors that moved nothing (`None` when every survivor moved
    /// something): the largest ratio of put p99 in the 50 ms after their detection to their p99
    /// before it, and the smallest ratio of their put rates in those two spans.
    pub uninvolved_p99_ratio: Option<f64>,
    pub uninvolved_rate_ratio: Option<f64>,
    /// Localized rows: a plain memory copy of `bytes_moved` by the driver right after the job,
    /// into memory it wrote before (`memcpy_ms`) and into memory fresh from the kernel, as a new
    /// holder's is (`memcpy_fresh_ms`).
    pub memcpy_ms: Option<f64>,
    pub memcpy_fresh_ms: Option<f64>,
}

/// What a row of `ftkv bench recovery` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryMode {
    /// Every survivor stops in `Store::recover`; they put every [`FLAT_OUT_PACE_US`] before.
    Global,
    /// Nobody stops; every survivor puts once every `pace_us` µs throughout.
    Localized { pace_us: u64 },
}

/// The survivors' pace when they write flat out: a put every 20 µs (a rank that never sleeps
/// would leave the 2 cores of a small machine to 8 spinning ranks and measure the scheduler).
pub const FLAT_OUT_PACE_US: u64 = 20;
/// An application's pace: a checkpoint every millisecond.
pub const APPLICATION_PACE_US: u64 = 1000;

/// The rows of one job size and amount of data: global, then localized at each pace.
pub fn recovery_modes() -> [RecoveryMode; 3] {
    [
        RecoveryMode::Global,
        RecoveryMode::Localized { pace_us: FLAT_OUT_PACE_US },
        RecoveryMode::Localized { pace_us: APPLICATION_PACE_US },
    ]
}

/// Kills the last rank of a job of `ranks` ranks once all stored `bytes` each.
pub fn measure_recovery(
    exe: &Path,
    ranks: usize,
    bytes: usize,
    mode: RecoveryMode,
) -> Result<RecoveryRow> {
    measure_recovery_on(exe, ranks, Hosts::ThisMachine, bytes, mode)
}

/// [`measure_recovery`] with the ranks spread over `hosts`.
pub fn measure_recovery_on(
    exe: &Path,
    ranks: usize,
    hosts: Hosts,
    bytes: usize,
    mode: RecoveryMode,
) -> Result<RecoveryRow> {
    let mut args = vec!["bench-recovery-rank".to_string(), bytes.to_string()];
    if let RecoveryMode::Localized { pace_us } = mode {
        args.extend(["--localized".into(), "--pace-us".into(), pace_us.to_string()]);
    }
    let launch =
        Launch::new(exe, ranks).args(args).on_hosts(hosts).timeout(Duration::from_secs(300));
    let mut job = launch.spawn()?;
    let mut pids = std::collections::HashMap::new();
    while pids.len() < ranks {
        let Some((Some(rank), line)) = job.next_line(Duration::from_secs(60)) else {
            anyhow::bail!("the ranks did not get ready: {}", job.finish()?.transcript());
        };
        if let Some(pid) =
            line.strip_prefix("ready pid=").and_then(|p| p.trim().parse::<u32>().ok())
        {
            pids.insert(rank, pid);
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let victim = ranks - 1;
    let killed_us = unix_us();
    ensure!(kill_pid(pids[&victim])?, "rank {victim} exited before it could be killed");
    while job.next_line(Duration::from_millis(20)).is_some() || job.is_running() {}
    let out = job.finish()?;
    ensure!(!out.timed_out, "the recovery benchmark hung:\n{}", out.transcript());
    match mode {
        RecoveryMode::Localized { pace_us } => {
            let row = localized_row(&out, ranks, bytes, victim, killed_us)?;
            Ok(with_plain_copies(RecoveryRow { pace_us, ..row }))
        }
        RecoveryMode::Global => recovery_row(&out, ranks, bytes, victim, killed_us),
    }
}

/// `row` with the driver's plain copies of its moved bytes.
fn with_plain_copies(row: RecoveryRow) -> RecoveryRow {
    let Some(bytes) = row.bytes_moved.filter(|&b| b > 0) else { return row };
    let (warm, fresh) = plain_copy_ms(bytes as usize);
    RecoveryRow { memcpy_ms: Some(warm), memcpy_fresh_ms: Some(fresh), ..row }
}

/// Milliseconds one `copy_from_slice` of `bytes` takes into memory written before, and into
/// memory fresh from the kernel (each page faulted in on its first write).
pub fn plain_copy_ms(bytes: usize) -> (f64, f64) {
    let source = vec![7u8; bytes];
    let mut fresh = vec![0u8; bytes];
    let started = std::time::Instant::now();
    fresh.copy_from_slice(&source);
    let fresh_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = std::time::Instant::now();
    fresh.copy_from_slice(&source);
    let warm_ms = started.elapsed().as_secs_f64() * 1e3;
    std::hint::black_box(&fresh);
    (warm_ms, fresh_ms)
}

/// Each rank's first report of kind `T` (`None`: it made none), in rank order.
pub(crate) fn reports_by_rank<T: Report>(out: &JobOutput, ranks: usize) -> Result<Vec<Option<T>>> {
    (0..ranks).map(|rank| T::first_of(out, rank)).collect()
}

/// The ranks the survivors agreed failed: the union of their reports' failed workers, sorted.
fn agreed_failed(reports: &[Option<GlobalRecoveryReport>]) -> Vec<usize> {
    union_of_failed(reports.iter().flatten().flat_map(|r| r.failed.iter().copied()))
}

/// The survivors' reports of kind `T`: those of every rank but `victim` and the ranks
/// `failed` finds in the reports; an error when a survivor made none.
fn survivor_reports<T: Report>(
    out: &JobOutput,
    ranks: usize,
    victim: usize,
    failed: impl FnOnce(&[Option<T>]) -> Vec<usize>,
) -> Result<Vec<T>> {
    let reports = reports_by_rank(out, ranks)?;
    let failed = failed(&reports);
    let silent: Vec<usize> = (0..ranks)
        .filter(|r| *r != victim && !failed.contains(r) && reports[*r].is_none())
        .collect();
    survivors(reports, victim, &failed).with_context(|| {
        format!(
            "survivors {silent:?} (all ranks but {victim} and the failed {failed:?}) made no \
             report; {}\n{}",
            causes_of(out, &silent),
            out.transcript()
        )
    })
}

/// What the `ranks` said of why they failed, on one line: the ranks' error lines, else each
/// one's last stderr line, else that they said nothing.
fn causes_of(out: &JobOutput, ranks: &[usize]) -> String {
    let errors = out.errors_said_once();
    if !errors.is_empty() {
        return format!("their errors: {}", errors.join(" | "));
    }
    let last = |r: &usize| {
        let line = out.own_stderr(*r).map(str::trim).filter(|l| !l.is_empty()).last();
        format!("rank {r}: {}", line.unwrap_or("said nothing"))
    };
    let timed_out = if out.timed_out { "the job timed out; " } else { "" };
    format!("{timed_out}{}", ranks.iter().map(last).collect::<Vec<_>>().join(" | "))
}

/// The reports of every rank but `victim` and the ranks in `failed` (`reports` is in rank
/// order); `None` when one of them made none, or there are none.
fn survivors<T>(reports: Vec<Option<T>>, victim: usize, failed: &[usize]) -> Option<Vec<T>> {
    let ranks = reports.into_iter().enumerate();
    let survivors = ranks.filter(|(r, _)| *r != victim && !failed.contains(r));
    let reports: Option<Vec<T>> = survivors.map(|(_, report)| report).collect();
    reports.filter(|r| !r.is_empty())
}

fn min(v: impl IntoIterator<Item = f64>) -> f64 {
    v.into_iter().fold(f64::MAX, f64::min)
}

fn max(v: impl IntoIterator<Item = f64>) -> f64 {
    v.into_iter().fold(0.0, f64::max)
}

fn localized_row(
    out: &JobOutput,
    ranks: usize,
    bytes: usize,
    victim: usize,
    killed_us: u64,
) -> Result<RecoveryRow> {
    let reports = survivor_reports(out, ranks, victim, |_| Vec::new())?;
    Ok(localized_row_of(&reports, ranks, bytes, killed_us))
}

/// A localized row from the survivors' reports: detection is the first survivor's, the copies
/// are back when the last survivor that moved any took its repair.
fn localized_row_of(
    reports: &[LocalizedRecoveryReport],
    ranks: usize,
    bytes: usize,
    killed_us: u64,
) -> RecoveryRow {
    let detect = min(reports.iter().map(|r| r.noticed_us as f64));
    let detect_last = max(reports.iter().map(|r| r.noticed_us as f64));
    let seen_last = max(reports.iter().map(|r| r.detect_us as f64));
    let (involved, uninvolved): (Vec<&LocalizedRecoveryReport>, Vec<_>) =
        reports.iter().partition(|r| r.moved_keys > 0);
    let repaired = involved.iter().map(|r| r.repaired_us as f64).fold(detect, f64::max);
    let ratios = |f: fn(&LocalizedRecoveryReport) -> f64| uninvolved.iter().map(move |r| f(r));
    // With 2 copies of 4 ranks' keys, every survivor may move something.
    let some_uninvolved = !uninvolved.is_empty();
    RecoveryRow {
        mode: "localized",
        ranks,
        bytes_per_rank: bytes,
        pace_us: FLAT_OUT_PACE_US,
        detect_ms: (detect - killed_us as f64) / 1e3,
        detect_last_ms: (detect_last - killed_us as f64) / 1e3,
        seen_last_ms: (seen_last - killed_us as f64) / 1e3,
        restore_ms: (repaired - detect) / 1e3,
        blocked_ms: 0.0,
        put_p50_before_us: median(reports.iter().map(|r| r.before_p50_us).collect()),
        put_p50_after_us: median(reports.iter().map(|r| r.during_p50_us).collect()),
        keys_recovered: reports.iter().map(|r| r.moved_keys as u64).sum(),
        restored: reports.iter().all(|r| r.restored),
        bytes_moved: Some(reports.iter().map(|r| r.moved_bytes).sum()),
        uninvolved_p99_ratio: some_uninvolved
            .then(|| max(ratios(|r| r.during_p99_us / r.before_p99_us))),
        uninvolved_rate_ratio: some_uninvolved
            .then(|| min(ratios(|r| r.during_rate / r.before_rate))),
        memcpy_ms: None,
        memcpy_fresh_ms: None,
    }
}

fn recovery_row(
    out: &JobOutput,
    ranks: usize,
    bytes: usize,
    victim: usize,
    killed_us: u64,
) -> Result<RecoveryRow> {
    let reports = survivor_reports(out, ranks, victim, agreed_failed)?;
    Ok(recovery_row_of(&reports, ranks, bytes, killed_us))
}

/// A global row from the survivors' reports: detection is the first survivor's, the copies
/// are back when the last survivor's recovery returned.
fn recovery_row_of(
    reports: &[GlobalRecoveryReport],
    ranks: usize,
    bytes: usize,
    killed_us: u64,
) -> RecoveryRow {
    let detect = min(reports.iter().map(|r| r.noticed_us as f64));
    let detect_last = max(reports.iter().map(|r| r.noticed_us as f64));
    let seen_last = max(reports.iter().map(|r| r.detect_us as f64));
    RecoveryRow {
        mode: "global",
        ranks,
        bytes_per_rank: bytes,
        pace_us: FLAT_OUT_PACE_US,
        detect_ms: (detect - killed_us as f64) / 1e3,
        detect_last_ms: (detect_last - killed_us as f64) / 1e3,
        seen_last_ms: (seen_last - killed_us as f64) / 1e3,
        restore_ms: (max(reports.iter().map(|r| r.recovered_us as f64)) - detect) / 1e3,
        blocked_ms: max(reports.iter().map(|r| r.blocked_ms)),
        put_p50_before_us: median(reports.iter().map(|r| r.before_p50_us).collect()),
        put_p50_after_us: median(reports.iter().map(|r| r.after_p50_us).collect()),
        keys_recovered: reports.iter().map(|r| r.keys as u64).max().unwrap_or(0),
        restored: reports.iter().all(|r| r.restored),
        bytes_moved: None,
        uninvolved_p99_ratio: None,
        uninvolved_rate_ratio: None,
        memcpy_ms: None,
        memcpy_fresh_ms: None,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// One job size of `ftkv bench growth`.
#[derive(Debug, Clone, Serialize)]
pub struct GrowthRow {
    pub ranks: usize,
    pub copies: usize,
    pub put_p50_us: f64,
    pub put_p99_us: f64,
    pub stored_per_rank: usize,
    /// Shared memory the windows occupy per rank after creation (address space reserved for
    /// growth is not resident) and after every rank stored `stored_per_rank` bytes.
    pub shm_created_per_rank_kib: f64,
    pub shm_stored_per_rank_kib: f64,
    /// Resident window memory per rank divided by `copies × stored_per_rank`.
    pub overhead: f64,
}

pub fn measure_growth(exe: &Path, ranks: usize, stored: usize, millis: u64) -> Result<GrowthRow> {
    let copies = (ranks - 1).min(3);
    let args = [
        "bench-growth-rank".to_string(),
        copies.to_string(),
        stored.to_string(),
        millis.to_string(),
    ];
    let out = Launch::new(exe, ranks).args(args).timeout(Duration::from_secs(120)).run()?;
    ensure!(!out.timed_out, "the growth benchmark hung:\n{}", out.transcript());
    let reports: Vec<GrowthReport> = reports_by_rank(&out, ranks)?.into_iter().flatten().collect();
    ensure!(reports.len() == ranks, "not every rank reported:\n{}", out.transcript());
    Ok(growth_row_of(&reports, copies, stored))
}

/// A growth row from every rank's report: the put latencies are the ranks' medians, the shared
/// memory is rank 0's reading (the first report), spread over the ranks.
fn growth_row_of(reports: &[GrowthReport], copies: usize, stored: usize) -> GrowthRow {
    let ranks = reports.len();
    let first = &reports[0];
    let per_rank = |a: u64, b: u64| (b as f64 - a as f64).max(0.0) / ranks as f64;
    let stored_kib = per_rank(first.shm_empty_kib, first.shm_stored_kib);
    GrowthRow {
        ranks,
        copies,
        put_p50_us: median(reports.iter().map(|r| r.p50_us).collect()),
        put_p99_us: median(reports.iter().map(|r| r.p99_us).collect()),
        stored_per_rank: stored,
        shm_created_per_rank_kib: per_rank(first.shm_empty_kib, first.shm_created_kib),
        shm_stored_per_rank_kib: stored_kib,
        overhead: stored_kib * 1024.0 / (copies * stored) as f64,
    }
}

/// Runs the recovery matrix, prints a table, writes `bench_recovery.json`.
pub fn run_recovery(
    exe: &Path,
    ranks: &[usize],
    sizes: &[usize],
    out_dir: &Path,
) -> Result<Vec<RecoveryRow>> {
    let mut rows = Vec::new();
    for &n in ranks {
        for &bytes in sizes {
            for mode in recovery_modes() {
                let row = measure_recovery(exe, n, bytes, mode)?;
                eprintln!(
                    "[bench recovery] {n} ranks, {}, {} (a put every {} µs): notified {:.1}–{:.1} ms, seen by puts by {:.1} ms, restore {:.1} ms",
                    size_name(bytes),
                    row.mode,
                    row.pace_us,
                    row.detect_ms,
                    row.detect_last_ms,
                    row.seen_last_ms,
                    row.restore_ms
                );
                rows.push(row);
            }
        }
    }
    print_recovery_table(&rows);
    write_json(out_dir, "bench_recovery.json", &rows)?;
    if let Some(&largest) = ranks.iter().max() {
        let svg = recovery_svg(&rows, largest)?;
        let path = out_dir.join("bench_recovery.svg");
        std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("[bench] wrote {}", path.display());
    }
    ensure!(rows.iter().all(|r| r.restored), "a recovery did not restore the data");
    Ok(rows)
}

/// The recovery rows as a Markdown table.
fn print_recovery_table(rows: &[RecoveryRow]) {
    println!("| mode | ranks | data per rank | put every µs | kill → first / last survivor notified ms | kill → last put loop saw it ms | detection → copies restored ms | plain copy of the moved bytes ms (warm / fresh pages) | restore / fresh copy | interrupted put blocked ms | put p50 before µs | put p50 after µs | MiB moved | uninvolved p99 during / before | uninvolved rate during / before | restored |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let or_dash =
        |v: Option<f64>, scale: f64| v.map_or("-".into(), |v| format!("{:.2}", v * scale));
    for r in rows {
        let copies = match (r.memcpy_ms, r.memcpy_fresh_ms) {
            (Some(warm), Some(fresh)) => format!("{warm:.1} / {fresh:.1}"),
            _ => "-".into(),
        };
        println!(
            "| {} | {} | {} | {} | {:.1} / {:.1} | {:.1} | {:.1} | {} | {} | {:.1} | {:.2} | {:.2} | {} | {} | {} | {} |",
            r.mode,
            r.ranks,
            size_name(r.bytes_per_rank),
            r.pace_us,
            r.detect_ms,
            r.detect_last_ms,
            r.seen_last_ms,
            r.restore_ms,
            copies,
            or_dash(r.memcpy_fresh_ms.map(|c| r.restore_ms / c), 1.0),
            r.blocked_ms,
            r.put_p50_before_us,
            r.put_p50_after_us,
            or_dash(r.bytes_moved.map(|b| b as f64), 1.0 / (1u64 << 20) as f64),
            or_dash(r.uninvolved_p99_ratio, 1.0),
            or_dash(r.uninvolved_rate_ratio, 1.0),
            if r.restored { "yes" } else { "NO" }
        );
    }
}

/// The lines of `bench_recovery.svg`: a label, its colour, and the metric of the rows it
/// follows (`None`: the row is not on it).
type RecoveryLine = (&'static str, RGBColor, fn(&RecoveryRow) -> Option<f64>);

const RECOVERY_LINES: [RecoveryLine; 5] = [
    ("global: restored", RGBColor(200, 60, 60), |r| (r.mode == "global").then_some(r.restore_ms)),
    ("localized: restored (put every 20 µs)", RGBColor(40, 90, 200), |r| {
        (r.mode == "localized" && r.pace_us == FLAT_OUT_PACE_US).then_some(r.restore_ms)
    }),
    ("localized: restored (put every 1 ms)", RGBColor(40, 160, 200), |r| {
        (r.mode == "localized" && r.pace_us == APPLICATION_PACE_US).then_some(r.restore_ms)
    }),
    ("plain copy of the moved bytes, fresh pages", RGBColor(60, 160, 60), |r| {
        (r.pace_us == FLAT_OUT_PACE_US).then_some(r.memcpy_fresh_ms).flatten()
    }),
    ("last survivor notified (localized, 20 µs)", RGBColor(150, 90, 30), |r| {
        (r.mode == "localized" && r.pace_us == FLAT_OUT_PACE_US).then_some(r.detect_last_ms)
    }),
];

/// A log-log plot of the recovery times against the data per rank for jobs of `ranks` ranks,
/// with the plain copy of the moved bytes beside them (SVG).
fn recovery_svg(rows: &[RecoveryRow], ranks: usize) -> Result<String> {
    let rows: Vec<&RecoveryRow> = rows.iter().filter(|r| r.ranks == ranks).collect();
    let series: Vec<Series> = RECOVERY_LINES
        .iter()
        .map(|(label, color, metric)| Series {
            name: (*label).to_owned(),
            color: *color,
            points: rows.iter().filter_map(|r| metric(r).map(|v| (r.bytes_per_rank, v))).collect(),
        })
        .collect();
    let caption = format!("recovery vs data per rank ({ranks} ranks, 2 copies, 1 killed)");
    let chart = Chart {
        caption: &caption,
        x_desc: "data per rank",
        y_desc: "ms",
        size: (720, 440),
        legend: SeriesLabelPosition::UpperLeft,
    };
    plot::by_size(&chart, &series)
}

/// Runs the growth series, prints a table, writes `bench_growth.json`.
pub fn run_growth(
    exe: &Path,
    ranks: &[usize],
    stored: usize,
    millis: u64,
    out_dir: &Path,
) -> Result<Vec<GrowthRow>> {
    let mut rows = Vec::new();
    for &n in ranks {
        ensure!(n >= 2, "growth needs at least 2 ranks");
        let row = measure_growth(exe, n, stored, millis)?;
        eprintln!("[bench growth] {n} ranks: put p50 {:.2} µs", row.put_p50_us);
        rows.push(row);
    }
    println!("| ranks | copies | 1 KiB put p50 µs | p99 µs | window shm/rank after create KiB | after storing {} KiB | resident / (copies × stored) |", stored >> 10);
    println!("|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.0} | {:.0} | {:.2} |",
            r.ranks,
            r.copies,
            r.put_p50_us,
            r.put_p99_us,
            r.shm_created_per_rank_kib,
            r.shm_stored_per_rank_kib,
            r.overhead
        );
    }
    write_json(out_dir, "bench_growth.json", &rows)?;
    Ok(rows)
}

pub(crate) fn write_json<T: Serialize>(dir: &Path, name: &str, rows: &T) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(rows)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("[bench] wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reports::read_back;

    /// The line of a survivor's global report (workers 2 and 3 agreed failed).
    fn global(detect_us: u64, recovered_us: u64, blocked_ms: f64, p50: (f64, f64)) -> String {
        let report = GlobalRecoveryReport {
            failed: vec![3, 2],
            detect_us,
            noticed_us: detect_us,
            recovered_us,
            store_ms: 20.0,
            blocked_ms,
            before_p50_us: p50.0,
            after_p50_us: p50.1,
            keys: 16,
            restored: true,
        };
        report.line()
    }

    #[test]
    fn a_global_row_comes_from_the_survivors_reports_without_the_agreed_failed() {
        let lines = [
            Some(global(1_005_000, 1_036_000, 31.0, (1.5, 0.25))),
            Some(global(1_004_000, 1_030_000, 33.5, (1.75, 0.5))),
            None,
            None,
        ];
        let reports: Vec<Option<GlobalRecoveryReport>> =
            lines.iter().map(|l| l.as_deref().map(read_back)).collect();
        let failed = agreed_failed(&reports);
        assert_eq!(failed, vec![2, 3]);
        let survivors = survivors(reports, 3, &failed).expect("both survivors reported");
        let row = recovery_row_of(&survivors, 4, 1 << 20, 1_000_000);
        assert_eq!((row.mode, row.ranks, row.bytes_per_rank), ("global", 4, 1 << 20));
        assert_eq!((row.detect_ms, row.restore_ms, row.blocked_ms), (4.0, 32.0, 33.5));
        assert_eq!((row.put_p50_before_us, row.put_p50_after_us), (1.75, 0.5));
        assert_eq!((row.keys_recovered, row.restored, row.bytes_moved), (16, true, None));
    }

    #[test]
    fn a_survivor_without_a_report_is_missing() {
        let report = read_back::<GlobalRecoveryReport>(&global(1, 2, 3.0, (1.0, 1.0)));
        assert!(survivors(vec![Some(report.clone()), None, None], 2, &[]).is_none());
        assert_eq!(survivors(vec![Some(report.clone()), None, None], 2, &[1]), Some(vec![report]));
        assert!(survivors::<GlobalRecoveryReport>(vec![None, None], 1, &[0]).is_none());
    }

    /// A survivor's localized report line: it moved `moved_keys`, its p99 and rate went from
    /// `before` to `during`.
    fn localized(
        moved_keys: usize,
        repaired_us: u64,
        before: (f64, f64),
        during: (f64, f64),
    ) -> String {
        let report = LocalizedRecoveryReport {
            detect_us: 1_005_000,
            noticed_us: 1_005_000,
            repaired_us,
            moved_keys,
            moved_bytes: moved_keys as u64 * 1024,
            before_p50_us: 1.0,
            before_p99_us: before.0,
            during_p50_us: 2.0,
            during_p99_us: during.0,
            before_rate: before.1,
            during_rate: during.1,
            restored: true,
        };
        report.line()
    }

    #[test]
    fn a_localized_row_takes_the_repair_from_the_involved_and_the_ratios_from_the_others() {
        let lines = [
            localized(2, 1_023_000, (4.0, 1000.0), (40.0, 100.0)),
            localized(0, 1_005_000, (4.0, 1000.0), (8.0, 500.0)),
            localized(0, 1_005_000, (2.0, 1000.0), (8.0, 750.0)),
        ];
        let reports: Vec<LocalizedRecoveryReport> = lines.iter().map(|l| read_back(l)).collect();
        let row = localized_row_of(&reports, 4, 1 << 20, 1_000_000);
        assert_eq!(
            (row.mode, row.detect_ms, row.restore_ms, row.blocked_ms),
            ("localized", 5.0, 18.0, 0.0)
        );
        assert_eq!((row.put_p50_before_us, row.put_p50_after_us), (1.0, 2.0));
        assert_eq!((row.keys_recovered, row.bytes_moved, row.restored), (2, Some(2048), true));
        assert_eq!(row.uninvolved_p99_ratio, Some(4.0));
        assert_eq!(row.uninvolved_rate_ratio, Some(0.5));
        let all_moved: Vec<LocalizedRecoveryReport> = reports[..1].to_vec();
        let row = localized_row_of(&all_moved, 4, 1 << 20, 1_000_000);
        assert_eq!((row.uninvolved_p99_ratio, row.uninvolved_rate_ratio), (None, None));
    }

    #[test]
    fn the_recovery_plot_has_a_line_per_mode_and_the_plain_copy() {
        let row = |mode: &'static str, pace_us: u64, bytes: usize, restore_ms: f64| RecoveryRow {
            mode,
            ranks: 8,
            bytes_per_rank: bytes,
            pace_us,
            detect_ms: 10.0,
            detect_last_ms: 20.0,
            seen_last_ms: 20.0,
            restore_ms,
            blocked_ms: 0.0,
            put_p50_before_us: 1.0,
            put_p50_after_us: 1.0,
            keys_recovered: 2,
            restored: true,
            bytes_moved: Some(2 * bytes as u64),
            uninvolved_p99_ratio: None,
            uninvolved_rate_ratio: None,
            memcpy_ms: Some(restore_ms / 20.0),
            memcpy_fresh_ms: (mode == "localized").then_some(restore_ms / 5.0),
        };
        let mut rows = Vec::new();
        for bytes in [1 << 20, 16 << 20] {
            rows.push(row("global", FLAT_OUT_PACE_US, bytes, 60.0 * (bytes >> 20) as f64));
            rows.push(row("localized", FLAT_OUT_PACE_US, bytes, 15.0 * (bytes >> 20) as f64));
            rows.push(row("localized", APPLICATION_PACE_US, bytes, 14.0 * (bytes >> 20) as f64));
        }
        let svg = recovery_svg(&rows, 8).unwrap();
        for (label, _, _) in RECOVERY_LINES {
            assert!(svg.contains(&label.replace('µ', "&#181;")) || svg.contains(label), "{label}");
        }
        assert!(svg.contains("8 ranks"));
        assert!(!recovery_svg(&rows, 4).unwrap().contains("8 ranks"), "no rows of 4 ranks");
    }

    #[test]
    fn a_growth_row_spreads_rank_0_s_memory_over_the_ranks() {
        let report = |p50_us: f64, shm_stored_kib: u64| GrowthReport {
            ranks: 2,
            copies: 1,
            stored: 1 << 20,
            p50_us,
            p99_us: p50_us * 2.0,
            shm_empty_kib: 1000,
            shm_created_kib: 3000,
            shm_stored_kib,
        };
        let lines = [report(0.5, 5096).line(), report(0.75, 9999).line()];
        let reports: Vec<GrowthReport> = lines.iter().map(|l| read_back(l)).collect();
        let row = growth_row_of(&reports, 1, 1 << 20);
        assert_eq!((row.ranks, row.copies, row.stored_per_rank), (2, 1, 1 << 20));
        assert_eq!((row.put_p50_us, row.put_p99_us), (0.75, 1.5));
        assert_eq!((row.shm_created_per_rank_kib, row.shm_stored_per_rank_kib), (1000.0, 2048.0));
        assert_eq!(row.overhead, 2.0);
    }
}
