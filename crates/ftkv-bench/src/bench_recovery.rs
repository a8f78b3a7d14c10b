//! `ftkv bench recovery` (SIGKILL one rank: detection and re-replication times, put latency
//! around it) and `ftkv bench growth` (put latency and memory as the job grows).

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use serde::Serialize;

use crate::bench::unix_us;
use crate::bench_store::size_name;
use ftkv_launch::launch::{field, kill_pid, JobOutput, Launch};

/// One recovery measurement.
#[derive(Debug, Clone, Serialize)]
pub struct RecoveryRow {
    /// `global` (every survivor stops in `Store::recover`) or `localized` (only the owners of
    /// copies that lived on the victim move data; nobody stops putting).
    pub mode: &'static str,
    pub ranks: usize,
    pub bytes_per_rank: usize,
    /// SIGKILL to the first survivor's put seeing the failure.
    pub detect_ms: f64,
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
    /// Localized rows, over the survivors that moved nothing: the largest ratio of put p99 in
    /// the 50 ms after their detection to their p99 before it, and the smallest ratio of their
    /// put rates in those two spans.
    pub uninvolved_p99_ratio: Option<f64>,
    pub uninvolved_rate_ratio: Option<f64>,
}

/// Kills the last rank of a job of `ranks` ranks once all stored `bytes` each.
pub fn measure_recovery(
    exe: &Path,
    ranks: usize,
    bytes: usize,
    localized: bool,
) -> Result<RecoveryRow> {
    let mut args = vec!["bench-recovery-rank".to_string(), bytes.to_string()];
    if localized {
        args.push("--localized".into());
    }
    let launch = Launch::new(exe, ranks).args(args).timeout(Duration::from_secs(120));
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
    if localized {
        localized_row(&out, ranks, bytes, victim, killed_us)
    } else {
        recovery_row(&out, ranks, bytes, victim, killed_us)
    }
}

/// The report line (starting with `prefix`) of every survivor: every rank but `victim` and the
/// ranks the survivors agreed failed.
fn survivor_lines(
    out: &JobOutput,
    ranks: usize,
    victim: usize,
    prefix: &str,
) -> Result<Vec<String>> {
    let failed = out.agreed_failed(ranks, prefix);
    let line = |r: usize| out.rank_lines(r).iter().find(|l| l.starts_with(prefix)).cloned();
    let survivors = (0..ranks).filter(|r| *r != victim && !failed.contains(r));
    let lines: Vec<Option<String>> = survivors.map(line).collect();
    ensure!(
        !lines.is_empty() && lines.iter().all(Option::is_some),
        "not every survivor (all but rank {victim} and the failed {failed:?}) reported:\n{}",
        out.transcript()
    );
    Ok(lines.into_iter().flatten().collect())
}

/// The number `key=<n>` on `line` (NaN when absent).
fn number(line: &str, key: &str) -> f64 {
    field(line, key).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

/// `key`'s number on each of `lines`.
fn numbers(lines: &[String], key: &str) -> Vec<f64> {
    lines.iter().map(|l| number(l, key)).collect()
}

fn min(v: Vec<f64>) -> f64 {
    v.into_iter().fold(f64::MAX, f64::min)
}

fn max(v: Vec<f64>) -> f64 {
    v.into_iter().fold(0.0, f64::max)
}

fn all_restored(lines: &[String]) -> bool {
    lines.iter().all(|l| field(l, "restored") == Some("true"))
}

fn localized_row(
    out: &JobOutput,
    ranks: usize,
    bytes: usize,
    victim: usize,
    killed_us: u64,
) -> Result<RecoveryRow> {
    let lines = survivor_lines(out, ranks, victim, "recovery mode=localized")?;
    let detect = min(numbers(&lines, "detect_us"));
    let (involved, uninvolved): (Vec<String>, Vec<String>) =
        lines.iter().cloned().partition(|l| number(l, "moved_keys") > 0.0);
    let repaired = numbers(&involved, "repaired_us").into_iter().fold(detect, f64::max);
    let ratios = |a: &str, b: &str| -> Vec<f64> {
        uninvolved.iter().map(|l| number(l, a) / number(l, b)).collect()
    };
    Ok(RecoveryRow {
        mode: "localized",
        ranks,
        bytes_per_rank: bytes,
        detect_ms: (detect - killed_us as f64) / 1e3,
        restore_ms: (repaired - detect) / 1e3,
        blocked_ms: 0.0,
        put_p50_before_us: median(numbers(&lines, "before_p50_us")),
        put_p50_after_us: median(numbers(&lines, "during_p50_us")),
        keys_recovered: numbers(&lines, "moved_keys").iter().sum::<f64>() as u64,
        restored: all_restored(&lines),
        bytes_moved: Some(numbers(&lines, "moved_bytes").iter().sum::<f64>() as u64),
        uninvolved_p99_ratio: Some(max(ratios("during_p99_us", "before_p99_us"))),
        uninvolved_rate_ratio: Some(min(ratios("during_rate", "before_rate"))),
    })
}

fn recovery_row(
    out: &JobOutput,
    ranks: usize,
    bytes: usize,
    victim: usize,
    killed_us: u64,
) -> Result<RecoveryRow> {
    let lines = survivor_lines(out, ranks, victim, "recovery ")?;
    let detect = min(numbers(&lines, "detect_us"));
    Ok(RecoveryRow {
        mode: "global",
        ranks,
        bytes_per_rank: bytes,
        detect_ms: (detect - killed_us as f64) / 1e3,
        restore_ms: (max(numbers(&lines, "recovered_us")) - detect) / 1e3,
        blocked_ms: max(numbers(&lines, "blocked_ms")),
        put_p50_before_us: median(numbers(&lines, "before_p50_us")),
        put_p50_after_us: median(numbers(&lines, "after_p50_us")),
        keys_recovered: max(numbers(&lines, "keys")) as u64,
        restored: all_restored(&lines),
        bytes_moved: None,
        uninvolved_p99_ratio: None,
        uninvolved_rate_ratio: None,
    })
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
    let lines: Vec<&String> = (0..ranks)
        .filter_map(|r| out.rank_lines(r).iter().find(|l| l.starts_with("growth ")))
        .collect();
    ensure!(lines.len() == ranks, "not every rank reported:\n{}", out.transcript());
    let values = |key: &str| -> Vec<f64> {
        lines.iter().filter_map(|l| field(l, key)?.parse().ok()).collect()
    };
    let first = |key: &str| {
        field(lines[0], key).and_then(|v| v.parse::<f64>().ok()).context("a growth field")
    };
    let per_rank = |a: f64, b: f64| (b - a).max(0.0) / ranks as f64;
    let empty = first("shm_empty_kib")?;
    let created = per_rank(empty, first("shm_created_kib")?);
    let stored_kib = per_rank(empty, first("shm_stored_kib")?);
    Ok(GrowthRow {
        ranks,
        copies,
        put_p50_us: median(values("p50_us")),
        put_p99_us: median(values("p99_us")),
        stored_per_rank: stored,
        shm_created_per_rank_kib: created,
        shm_stored_per_rank_kib: stored_kib,
        overhead: stored_kib * 1024.0 / (copies * stored) as f64,
    })
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
            for localized in [false, true] {
                let row = measure_recovery(exe, n, bytes, localized)?;
                eprintln!(
                    "[bench recovery] {n} ranks, {}, {}: detect {:.1} ms, restore {:.1} ms",
                    size_name(bytes),
                    row.mode,
                    row.detect_ms,
                    row.restore_ms
                );
                rows.push(row);
            }
        }
    }
    println!("| mode | ranks | data per rank | kill → detection ms | detection → copies restored ms | interrupted put blocked ms | put p50 before µs | put p50 after µs | MiB moved | uninvolved p99 during / before | uninvolved rate during / before | restored |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let or_dash =
        |v: Option<f64>, scale: f64| v.map_or("-".into(), |v| format!("{:.2}", v * scale));
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {} | {} | {} | {} |",
            r.mode,
            r.ranks,
            size_name(r.bytes_per_rank),
            r.detect_ms,
            r.restore_ms,
            r.blocked_ms,
            r.put_p50_before_us,
            r.put_p50_after_us,
            or_dash(r.bytes_moved.map(|b| b as f64), 1.0 / (1u64 << 20) as f64),
            or_dash(r.uninvolved_p99_ratio, 1.0),
            or_dash(r.uninvolved_rate_ratio, 1.0),
            if r.restored { "yes" } else { "NO" }
        );
    }
    write_json(out_dir, "bench_recovery.json", &rows)?;
    ensure!(rows.iter().all(|r| r.restored), "a recovery did not restore the data");
    Ok(rows)
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

fn write_json<T: Serialize>(dir: &Path, name: &str, rows: &T) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(rows)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("[bench] wrote {}", path.display());
    Ok(())
}
