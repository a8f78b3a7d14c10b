//! The checkpoint workload of `ftkv bench store`, the same for every system measured.

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::reports::{StoreRunReport, System};

/// The checkpoint workload of `ftkv bench store` on one writer: overwrite the checkpoint with
/// `size` bytes until `until`; every 10th write also puts the loot, and 5 writes later deletes
/// it. `write(kind, value)` (`None`: delete) is the system's blocking write. The first
/// [`warm_up`] of the time is not recorded (connections, page faults, replication start-up).
pub fn checkpoint_workload(
    size: usize,
    until: Instant,
    mut write: impl FnMut(u16, Option<&[u8]>) -> Result<()>,
) -> Result<WorkloadResult> {
    let record_from = Instant::now() + warm_up(until.saturating_duration_since(Instant::now()));
    let mut value = vec![0u8; size];
    let mut result = WorkloadResult::default();
    let mut started = Instant::now();
    let mut seq = 0u64;
    let mut warming = true;
    while Instant::now() < until {
        if warming && Instant::now() >= record_from {
            warming = false;
            result.histogram = crate::stats::Histogram::default();
            (result.writes, result.bytes, started) = (0, 0, Instant::now());
        }
        seq += 1;
        stamp(&mut value, seq);
        result.timed(|| write(0, Some(&value)), size)?;
        if seq.is_multiple_of(10) {
            result.timed(|| write(1, Some(&value)), size)?;
            result.loot_present = true;
        } else if seq % 10 == 5 && result.loot_present {
            result.timed(|| write(1, None), 0)?;
            result.loot_present = false;
        }
    }
    result.secs = started.elapsed().as_secs_f64();
    result.last_checkpoint = value;
    Ok(result)
}

/// The unrecorded start of a run of `length`: a fifth of it, at most 300 ms.
pub fn warm_up(length: Duration) -> Duration {
    (length / 5).min(Duration::from_millis(300))
}

/// Puts `seq` into the first bytes of `value` so that every write differs.
fn stamp(value: &mut [u8], seq: u64) {
    let bytes = seq.to_le_bytes();
    let n = value.len().min(8);
    value[..n].copy_from_slice(&bytes[..n]);
}

/// What one writer measured.
#[derive(Debug, Default)]
pub struct WorkloadResult {
    pub histogram: crate::stats::Histogram,
    pub writes: u64,
    pub bytes: u64,
    pub secs: f64,
    pub last_checkpoint: Vec<u8>,
    /// Whether the loot key holds a value at the end (its last write was a put).
    pub loot_present: bool,
}

impl WorkloadResult {
    fn timed(&mut self, write: impl FnOnce() -> Result<()>, bytes: usize) -> Result<()> {
        let start = Instant::now();
        write()?;
        self.histogram.record(start.elapsed());
        self.writes += 1;
        self.bytes += bytes as u64;
        Ok(())
    }

    /// The report of `system`'s run at `size` by the writer of rank `writer` for the driver.
    pub fn into_report(
        self,
        system: System,
        size: usize,
        writer: usize,
        verified: bool,
    ) -> StoreRunReport {
        let WorkloadResult { histogram, writes, bytes, secs, .. } = self;
        StoreRunReport { system, size, writer, writes, bytes, secs, verified, histogram }
    }
}
