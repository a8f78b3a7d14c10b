//! What the pool reports while it runs: typed events handed to a sink the application installs
//! once per process ([`set_sink`]); the library never prints. Without a sink, events are
//! dropped. The sink runs on the worker's own thread.

use std::fmt;
use std::sync::OnceLock;

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

static SINK: OnceLock<fn(&PoolEvent)> = OnceLock::new();

/// Installs this process's sink; `false` if one was installed already (the first one stays).
pub fn set_sink(sink: fn(&PoolEvent)) -> bool {
    SINK.set(sink).is_ok()
}

pub(crate) fn emit(event: PoolEvent) {
    if let Some(sink) = SINK.get() {
        sink(&event);
    }
}
