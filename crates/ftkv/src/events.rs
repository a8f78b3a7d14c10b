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
    /// This worker's recovery has waited `waited` in `step` for the `absent` workers, which
    /// have not entered that step (most often: not called recover yet) and are not known
    /// failed. The recovery deadline does not run meanwhile: a late survivor holds the others.
    /// Raised after a second of waiting, then every five seconds.
    RecoveryWaiting { worker: i32, step: String, absent: Vec<i32>, waited: std::time::Duration },
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
            Event::RecoveryWaiting { worker, step, absent, waited } => write!(
                f,
                "ftkv: worker {worker}: recovery waiting for workers {absent:?} to enter step \
                 {step} ({:.1} s so far): every survivor must call recover",
                waited.as_secs_f64()
            ),
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

    #[test]
    fn recovery_waiting_names_the_absent_workers() {
        let event = Event::RecoveryWaiting {
            worker: 0,
            step: "shrink (MPIX_Comm_shrink)".into(),
            absent: vec![3, 4],
            waited: std::time::Duration::from_millis(6000),
        };
        let line = event.to_string();
        assert!(line.contains("waiting for workers [3, 4] to enter step shrink"), "{line}");
        assert!(line.contains("(6.0 s so far)"), "{line}");
    }
}
