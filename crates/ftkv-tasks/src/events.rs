//! What the pool reports while it runs: typed events raised through `tracing` (the library
//! prints nothing). Reports (progress and recoveries, [`PoolEvent::is_report`]) have the target
//! [`REPORT_TARGET`]: ftkv's programs print them on stdout, where their drivers read them; the
//! pool's warnings are ordinary warnings. Each event's message is its `Display`. An event runs
//! the subscriber on the worker's own thread.

use std::fmt;

/// A recovery as one worker saw it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RecoveryInfo {
    /// Whether only this worker's part was done while the others worked on (localized) or
    /// every survivor stopped for the store's global recovery.
    pub localized: bool,
    pub failed: Vec<i32>,
    pub adopted: Vec<i32>,
    pub store_ms: f64,
    pub total_ms: f64,
}

/// One pool event. `Display` gives the line ftkv's command prints for it.
#[derive(Debug, Clone, PartialEq)]
pub enum PoolEvent {
    /// Periodic progress (`PoolConfig::progress`): tasks run and tree nodes counted so far.
    Progress { tasks: u64, nodes: u64 },
    /// This worker starts recovering from a failure.
    Recovering,
    /// This worker's recovery completed.
    Recovered(RecoveryInfo),
    /// Something failed that the pool works around.
    Warning(String),
}

impl PoolEvent {
    /// Whether the event is part of the worker's report (progress and recoveries, which ftkv's
    /// command prints on stdout) rather than a warning.
    pub fn is_report(&self) -> bool {
        !matches!(self, PoolEvent::Warning(_))
    }
}

/// The JSON of a progress line (`progress {json}`): what [`PoolEvent::Progress`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Progress {
    pub tasks: u64,
    pub nodes: u64,
}

impl fmt::Display for PoolEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            &PoolEvent::Progress { tasks, nodes } => {
                let json =
                    serde_json::to_string(&Progress { tasks, nodes }).map_err(|_| fmt::Error)?;
                write!(f, "progress {json}")
            }
            PoolEvent::Recovering => write!(f, "recovering"),
            PoolEvent::Recovered(info) => {
                let json = serde_json::to_string(info).map_err(|_| fmt::Error)?;
                write!(f, "recovered {json}")
            }
            PoolEvent::Warning(what) => write!(f, "ftkv-tasks: {what}"),
        }
    }
}

/// The target of the pool's reports (progress and recoveries).
pub const REPORT_TARGET: &str = "ftkv_tasks::report";

/// Raises `event`: a report at information level with [`REPORT_TARGET`], a warning otherwise.
pub(crate) fn emit(event: PoolEvent) {
    if event.is_report() {
        tracing::info!(target: REPORT_TARGET, "{event}");
    } else {
        tracing::warn!("{event}");
    }
}
