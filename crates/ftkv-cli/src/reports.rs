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

/// A check that passed, for report kinds that carry nothing else (`done {}`, `rma {}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Passed {}

/// Why a case failed on a rank (`error {json}`), before it leaves without `MPI_Finalize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReport {
    pub message: String,
}

/// `hello`: this rank's place in the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloReport {
    pub rank: i32,
    pub size: i32,
}

/// `sendrecv`: the rank the ring message came from, and the round trip of one ping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingReport {
    pub from: i32,
    pub ping_us: u64,
}

/// `host-cas`: every counter ended exact; swaps that lost a race and were tried again, and
/// whether the window spans hosts (its serving threads took part).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CasReport {
    pub retries: u64,
    pub spans_hosts: bool,
    /// Connections the rank's window listener dropped as not the job's.
    pub rejected: usize,
}

/// `cas-victim`: the compare-and-swaps a survivor made after its host-mate was killed in the
/// middle of its own swaps, on the dead member's word and on the other survivor's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwapsAfterKillReport {
    pub on_the_dead: u64,
    pub on_a_survivor: u64,
}

/// `detect`: how long rank 0's pings took to see the victim failed (rank 0 only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetectedReport {
    pub ms: u64,
}

/// `detect` and `shrink`: the communicator after revoke and shrink.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShrunkReport {
    pub size: i32,
    /// The world's failed ranks as ULFM reported them.
    pub failed: Vec<i32>,
    /// Whether the barrier that met the failure failed here (`shrink`; ULFM reports it per
    /// process, so it may not).
    pub barrier_failed: Option<bool>,
}

/// `store-rounds`: round `round`'s checkpoint put was acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckedRound {
    pub round: u32,
}

/// What a survivor read of one worker's checkpoint and loot at the end of `store-rounds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRead {
    pub owner: i32,
    pub round: RoundRead,
    pub loot_present: bool,
}

/// A checkpoint's round as read: the round its value carries, no value, or a value that is not
/// the owner's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoundRead {
    Round(u32),
    None,
    Torn,
}

/// `store-mismatch`: the store refused the configs, because this rank's own was invalid or
/// because they differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectedReport {
    pub invalid: bool,
}

/// `store-fenced`: the victim's checkpoint sequence number once this rank knew it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeclaredReport {
    pub victim: i32,
    pub seq: u32,
}

/// `store-fenced`: the victim's checkpoint before and after it was resumed (equal: none of
/// its late writes landed), and this rank's own last sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FencedReport {
    pub before: u32,
    pub after: u32,
    pub own_seq: u32,
}

/// `store-txn`: what a survivor judged on the logs it read (the judgement passed, or the case
/// failed with an error instead).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TxnReport {
    pub committed: usize,
    pub aborted: usize,
    /// A digest of every log as read (equal on every survivor).
    pub logs: String,
    /// Workers whose open transaction this rank resolved as their backup.
    pub resolved: Vec<i32>,
    /// Mean duration of this worker's transactions.
    pub tx_us: f64,
}
