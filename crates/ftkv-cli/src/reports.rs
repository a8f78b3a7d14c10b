//! What the multi-rank test cases (`ftkv-mpitest store-<case>`) report, one `kind {json}` line
//! each ([`crate::launch::report_line`]), read back by the tests with
//! [`crate::launch::JobOutput::rank_reports`].

use serde::{Deserialize, Serialize};

/// A survivor of `store-localized` after the failures: whether it had to recover globally
/// while writing, its own checkpoint's live copies and whether each holds its last
/// acknowledged write, and what it moved to reserve holders.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocalizedReport {
    /// Why it recovered globally while writing (`None`: it never did).
    pub global: Option<String>,
    pub copies: usize,
    pub copies_wanted: usize,
    pub current: bool,
    pub moved_keys: usize,
    pub moved_bytes: u64,
    pub repair_ms: f64,
}

/// The observer (rank 0) of `store-localized` with `STORE_IDLE_SECONDS`: when (Unix µs) it
/// read every live worker's checkpoint back at its full copy count, while their owners made
/// no store call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdleObserverReport {
    pub full_at_us: u64,
    /// From noticing the failure to reading every copy back.
    pub waited_ms: f64,
}

/// An owner of `store-localized` with `STORE_IDLE_SECONDS`: when (Unix µs) it made its first
/// store call after the failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdleOwnerReport {
    pub woke_at_us: u64,
}

/// Microseconds since the Unix epoch (comparable across the ranks of one machine).
pub fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
