//! What the benchmarks' rank programs report to their drivers: one `kind {json}` stdout line
//! per report ([`ftkv_launch::launch::report_line`]), read back by the driver with
//! [`JobOutput::rank_reports`]. Each kind has one struct, written by the rank side and read by
//! the driver.

use anyhow::Result;
use ftkv_launch::launch::{report_line, JobOutput};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::stats::Histogram;

/// A report a rank prints on one line and a driver reads back by its kind.
pub trait Report: Serialize + DeserializeOwned {
    /// The first word of this report's lines, which the driver selects them by.
    const KIND: &'static str;

    /// The line the rank prints: `KIND {json}`.
    fn line(&self) -> String {
        report_line(Self::KIND, self)
    }

    /// Rank `rank`'s first report of this kind, if it made one; `Err` when a line of this kind
    /// is not one.
    fn first_of(out: &JobOutput, rank: usize) -> Result<Option<Self>> {
        out.rank_report(rank, Self::KIND)
    }

    /// Rank `rank`'s reports of this kind, in the order it printed them.
    fn all_of(out: &JobOutput, rank: usize) -> Result<Vec<Self>> {
        out.rank_reports(rank, Self::KIND)
    }
}

/// A survivor of a global row of `ftkv bench recovery` (every survivor stops in
/// `Store::recover`), after the driver's SIGKILL.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GlobalRecoveryReport {
    /// The workers (stable ids) that `Store::recover` found failed; the survivors agree on them.
    pub failed: Vec<i32>,
    /// When its put saw the failure: Unix time in µs, taken just before that put started.
    pub detect_us: u64,
    /// When its store learned of the failure ([`ftkv::Store::first_failure_noticed`]): Unix
    /// time in µs.
    pub noticed_us: u64,
    /// When its `Store::recover` returned: Unix time in µs.
    pub recovered_us: u64,
    /// How long `Store::recover` took by its own report, in ms.
    pub store_ms: f64,
    /// From the start of the put that saw the failure to the recovery's return, in ms.
    pub blocked_ms: f64,
    /// The p50 of its 1 KiB puts before the failure, in µs.
    pub before_p50_us: f64,
    /// The p50 of 2000 1 KiB puts after the recovery, in µs.
    pub after_p50_us: f64,
    /// The keys whose newest surviving version the recovery copied to new holders.
    pub keys: usize,
    /// Whether its checkpoint read back at its full size after the recovery.
    pub restored: bool,
}

impl Report for GlobalRecoveryReport {
    const KIND: &'static str = "global_recovery";
}

/// A survivor of a localized row of `ftkv bench recovery` (the owners of copies that lived on
/// the victim move them while everybody keeps putting), after the driver's SIGKILL.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocalizedRecoveryReport {
    /// When it first saw the failure (its store's failed set non-empty between its puts): Unix
    /// time in µs.
    pub detect_us: u64,
    /// When its store learned of the failure ([`ftkv::Store::first_failure_noticed`]): Unix
    /// time in µs.
    pub noticed_us: u64,
    /// When it took its last repair (its own keys' copies back on their full count): Unix time
    /// in µs; `detect_us` when it repaired nothing.
    pub repaired_us: u64,
    /// Keys its repairs copied to reserve holders.
    pub moved_keys: usize,
    /// Bytes its repairs copied to reserve holders.
    pub moved_bytes: u64,
    /// The p50 and p99 of its 1 KiB puts before `detect_us`, in µs.
    pub before_p50_us: f64,
    pub before_p99_us: f64,
    /// The p50 and p99 of its 1 KiB puts in the `RECOVERY_WINDOW_US` after `detect_us`, in µs.
    pub during_p50_us: f64,
    pub during_p99_us: f64,
    /// Its puts per second from its first put to `detect_us`.
    pub before_rate: f64,
    /// Its puts per second in the `RECOVERY_WINDOW_US` after `detect_us`.
    pub during_rate: f64,
    /// Whether its checkpoint was on 2 copies, each at its full size, after the window.
    pub restored: bool,
}

impl Report for LocalizedRecoveryReport {
    const KIND: &'static str = "localized_recovery";
}

/// A rank of `ftkv bench growth`: its put latency, and the machine's shared memory (where MPI
/// windows live) at three points of the job, as this rank read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GrowthReport {
    /// The job's ranks.
    pub ranks: usize,
    /// Copies of every value.
    pub copies: usize,
    /// Bytes every rank stored in its checkpoint before `shm_stored_kib` was read.
    pub stored: usize,
    /// The p50 and p99 of its 1 KiB puts, in µs.
    pub p50_us: f64,
    pub p99_us: f64,
    /// The machine's `Shmem:` (/proc/meminfo) in KiB before the store existed, after it was
    /// created, and after every rank stored `stored` bytes.
    pub shm_empty_kib: u64,
    pub shm_created_kib: u64,
    pub shm_stored_kib: u64,
}

impl Report for GrowthReport {
    const KIND: &'static str = "growth";
}

/// One writer's run of the checkpoint workload in `ftkv bench store` under MPI (ftkv or raw
/// RMA), at one value size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreRunReport {
    pub system: System,
    /// The value size, in bytes.
    pub size: usize,
    /// The writer's rank.
    pub writer: usize,
    /// Writes (puts and deletes) after the warm-up.
    pub writes: u64,
    /// Value bytes those writes carried.
    pub bytes: u64,
    /// How long those writes took, in seconds.
    pub secs: f64,
    /// Whether every copy held the last checkpoint, and the loot as its last write left it.
    pub verified: bool,
    /// The latency of each of those writes.
    pub histogram: Histogram,
}

impl Report for StoreRunReport {
    const KIND: &'static str = "store_run";
}

/// `line` as rank 0 of a job printed it, read back by the drivers' own path
/// ([`Report::first_of`]).
/// The systems `ftkv bench store` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum System {
    Ftkv,
    RawRma,
    Redis,
    Etcd,
}

impl System {
    pub const ALL: [System; 4] = [System::Ftkv, System::RawRma, System::Redis, System::Etcd];

    pub fn name(self) -> &'static str {
        match self {
            System::Ftkv => "ftkv",
            System::RawRma => "raw_rma",
            System::Redis => "redis",
            System::Etcd => "etcd",
        }
    }
}

#[cfg(test)]
pub(crate) fn read_back<T: Report>(line: &str) -> T {
    let out = JobOutput::from_stdout(&format!("[1,0]<stdout>: {line}\n"));
    let report = T::first_of(&out, 0).unwrap_or_else(|e| panic!("{line:?}: {e}"));
    report.unwrap_or_else(|| panic!("{line:?} is not a {} report", T::KIND))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn histogram(micros: &[u64]) -> Histogram {
        let mut h = Histogram::default();
        micros.iter().for_each(|&us| h.record(Duration::from_micros(us)));
        h
    }

    #[test]
    fn a_global_recovery_report_is_read_back_equal() {
        let report = GlobalRecoveryReport {
            failed: vec![3, 1],
            detect_us: 1_700_000_000_123_456,
            noticed_us: 1_700_000_000_121_001,
            recovered_us: 1_700_000_000_155_000,
            store_ms: 31.5,
            blocked_ms: 31.640_001,
            before_p50_us: 1.61,
            after_p50_us: histogram(&[3, 5]).quantile_us(0.5),
            keys: 16,
            restored: true,
        };
        assert_eq!(read_back::<GlobalRecoveryReport>(&report.line()), report);
    }

    #[test]
    fn a_localized_recovery_report_is_read_back_equal() {
        let report = LocalizedRecoveryReport {
            detect_us: 1_700_000_000_123_456,
            noticed_us: 1_700_000_000_121_001,
            repaired_us: 1_700_000_000_141_741,
            moved_keys: 2,
            moved_bytes: 2 << 20,
            before_p50_us: 1.59,
            before_p99_us: histogram(&[1, 2, 700]).quantile_us(0.99),
            during_p50_us: 1.61,
            during_p99_us: 9.75,
            before_rate: 120_345.6,
            during_rate: 98_000.0,
            restored: false,
        };
        assert_eq!(read_back::<LocalizedRecoveryReport>(&report.line()), report);
    }

    #[test]
    fn a_growth_report_is_read_back_equal() {
        let report = GrowthReport {
            ranks: 8,
            copies: 3,
            stored: 1 << 20,
            p50_us: 0.52,
            p99_us: 2.625,
            shm_empty_kib: 1024,
            shm_created_kib: 9_000,
            shm_stored_kib: 33_576,
        };
        assert_eq!(read_back::<GrowthReport>(&report.line()), report);
    }

    #[test]
    fn a_store_run_report_is_read_back_equal_with_its_histogram() {
        let report = StoreRunReport {
            system: System::RawRma,
            size: 1 << 20,
            writer: 1,
            writes: 5,
            bytes: 4 << 20,
            secs: 0.812_345_678,
            verified: true,
            histogram: histogram(&[1, 2, 2, 700, 10_000]),
        };
        let line = report.line();
        assert!(line.contains(r#""system":"raw_rma""#), "{line}");
        let back = read_back::<StoreRunReport>(&line);
        assert_eq!(back, report);
        assert_eq!(back.histogram.count(), 5);
    }
}

/// A rank of `ftkv bench scale`: what creating a store with the library's defaults cost it,
/// its put latency, and the resources it holds once every key holds `stored` bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleReport {
    pub ranks: usize,
    /// Its host's ranks.
    pub host_ranks: usize,
    /// `Store::create`, from the barrier before it to its return on this rank.
    pub create_ms: f64,
    /// The p50 and p99 of its 1 KiB puts, in µs.
    pub p50_us: f64,
    pub p99_us: f64,
    /// This process's private resident memory (`RssAnon`), its resident shared memory
    /// (`RssShmem`: its view of the windows it maps), and its mapped address space (`VmSize`),
    /// in KiB, with every key holding `stored` bytes.
    pub rss_anon_kib: u64,
    pub rss_shmem_kib: u64,
    pub vm_size_kib: u64,
    /// Threads and sockets of this process then.
    pub threads: u64,
    pub sockets: u64,
    /// The machine's `Shmem:` (/proc/meminfo) in KiB before the store and once every key holds
    /// `stored` bytes.
    pub shm_empty_kib: u64,
    pub shm_stored_kib: u64,
}

impl Report for ScaleReport {
    const KIND: &'static str = "scale";
}
