//! What the store reports besides return values: typed events handed to a sink that the
//! application installs once per process ([`set_sink`]); the library never prints. Without a
//! sink, events are dropped. The sink runs on the thread that raised the event (the
//! application's, the detector's or the deadline thread), so it must be cheap and thread-safe;
//! for [`Event::EndingProcess`] it runs right before the process SIGKILLs itself.

use std::fmt;
use std::sync::OnceLock;

/// One store event. `Display` gives the line ftkv's command prints for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A watchdog ends this process as a fail-stop failure, for the reason given.
    EndingProcess(String),
    /// Something failed that the store works around (a revoke, a free, a helper thread).
    Warning(String),
    /// A recovery step reached (only when `FTKV_TRACE` is set).
    RecoveryStep { worker: i32, epoch: u64, step: String },
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::EndingProcess(why) => {
                write!(f, "ftkv: {why}; ending this process so the others recover")
            }
            Event::Warning(what) => write!(f, "ftkv: {what}"),
            Event::RecoveryStep { worker, epoch, step } => {
                write!(f, "ftkv: worker {worker} epoch {epoch}: recovery: {step}")
            }
        }
    }
}

static SINK: OnceLock<fn(&Event)> = OnceLock::new();

/// Installs this process's sink; `false` if one was installed already (the first one stays).
pub fn set_sink(sink: fn(&Event)) -> bool {
    SINK.set(sink).is_ok()
}

pub(crate) fn emit(event: Event) {
    if let Some(sink) = SINK.get() {
        sink(&event);
    }
}

pub(crate) fn warn(what: impl Into<String>) {
    emit(Event::Warning(what.into()));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The drivers recognise a rank that ended itself by this line (`JobOutput::ended_itself`).
    #[test]
    fn ending_process_renders_the_line_the_drivers_look_for() {
        let line = Event::EndingProcess("a call has not returned for 2s".into()).to_string();
        assert!(line.starts_with("ftkv:") && line.contains("ending this process"), "{line}");
    }
}
