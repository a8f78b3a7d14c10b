//! What the benchmarks read of the machine: the clock the driver and every rank share, and
//! `/proc/meminfo`.

use anyhow::{Context, Result};

/// Microseconds since the Unix epoch: a clock the driver and every rank on this machine share.
pub fn unix_us() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.map_or(0, |d| d.as_micros() as u64)
}

/// A `Name: value` line of /proc/meminfo, in KiB.
pub(crate) fn meminfo_kib(field: &str) -> Result<u64> {
    field_of(&std::fs::read_to_string("/proc/meminfo")?, field)
}

pub(crate) fn field_of(text: &str, field: &str) -> Result<u64> {
    let line = text.lines().find(|l| l.starts_with(field));
    let value = line.and_then(|l| l.split_whitespace().nth(1)?.parse().ok());
    value.with_context(|| format!("no {field} line"))
}
