//! What the store reports besides return values: typed events, raised through `tracing` (the
//! library prints nothing; a program shows them by installing a subscriber, as ftkv's own
//! programs and the C API do). Each event's message is the line ftkv's command prints for it
//! (its `Display`), and its `kind` field names the variant ([`Event::kind`]). An event runs the
//! subscriber on the thread that raised it (the application's, the detector's or the deadline
//! thread); for [`Event::EndingProcess`] right before the process SIGKILLs itself. Spans name
//! what the store is doing: `recovery` (a global recovery), `repair` (a localized one, on the
//! repairer thread), `transaction`.

use std::fmt;

/// One store event. `Display` gives the line ftkv's command prints for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A watchdog ends this process as a fail-stop failure, for the reason given.
    EndingProcess(String),
    /// This member sent the end to the process of `worker`, which the survivors declared
    /// failed (it may have been stopped, not dead): SIGKILL to `pid` on this host, or a
    /// request to the runtime for a process on another host.
    /// `cause` says how this member learned of the failure.
    EndedDeclared { worker: i32, pid: u32, reach: crate::fabric::Reach, cause: Cause },
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
            Event::EndedDeclared { worker, pid, reach, cause } => match reach {
                crate::fabric::Reach::ThisHost => write!(
                    f,
                    "ftkv: worker {worker} was declared failed ({cause}); its process (pid \
                     {pid}) on this host was killed"
                ),
                crate::fabric::Reach::Runtime => write!(
                    f,
                    "ftkv: worker {worker} was declared failed ({cause}); the runtime was asked \
                     to kill its process on its host"
                ),
            },
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

/// How a member learned that a worker failed, as [`Event::EndedDeclared`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Open MPI's failed set (ULFM: its heartbeat detector, the runtime's report of a dead
    /// process, or a connection its transport gave up on).
    OpenMpi,
    /// A failure notice from worker `from`, a member on this host.
    Told { from: i32 },
    /// Silent in the store's own heartbeat for longer than the suspicion bound.
    Silent,
    /// The error of one of the store's calls that named the worker (a ping or a transfer).
    Call,
    /// A recovery's agreement on the failed set.
    Recovery,
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::OpenMpi => write!(f, "in Open MPI's failed set"),
            Cause::Told { from } => write!(f, "told by worker {from} on this host"),
            Cause::Silent => write!(f, "silent in the store's heartbeat past the bound"),
            Cause::Call => write!(f, "named by a store call's error"),
            Cause::Recovery => write!(f, "agreed by a recovery"),
        }
    }
}

impl Event {
    /// The event's `kind` field: `ending_process`, `ended_declared`, `warning`,
    /// `recovery_step` or `recovery_waiting`.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::EndingProcess(_) => "ending_process",
            Event::EndedDeclared { .. } => "ended_declared",
            Event::Warning(_) => "warning",
            Event::RecoveryStep { .. } => "recovery_step",
            Event::RecoveryWaiting { .. } => "recovery_waiting",
        }
    }
}

/// Raises `event`: an error for a process that ends itself, a warning for what the store works
/// around or waits for, information for a traced recovery step.
pub(crate) fn emit(event: Event) {
    let kind = event.kind();
    match &event {
        Event::EndingProcess(_) => tracing::error!(kind, "{event}"),
        Event::Warning(_) | Event::RecoveryWaiting { .. } | Event::EndedDeclared { .. } => {
            tracing::warn!(kind, "{event}")
        }
        Event::RecoveryStep { .. } => tracing::info!(kind, "{event}"),
    }
}

pub(crate) fn warn(what: impl Into<String>) {
    emit(Event::Warning(what.into()));
}

/// Whether a subscriber that shows ftkv's reports as lines (ftkv's programs, the C API) takes
/// the callsite of `metadata`: events at information level or above. Spans are left out: such
/// a subscriber prints no context, and a span it does not take costs nothing (a transaction
/// opens one per call).
pub fn shown_as_line(metadata: &tracing::Metadata<'_>) -> bool {
    metadata.is_event() && *metadata.level() <= tracing::Level::INFO
}

/// The field `name` of a `tracing` event, as text: for a subscriber that shows ftkv's events
/// (`message` is the line, `kind` the [`Event::kind`]); `None` when the event has no such field.
pub fn field_text(event: &tracing::Event<'_>, name: &'static str) -> Option<String> {
    let mut visitor = FieldText { name, text: None };
    event.record(&mut visitor);
    visitor.text
}

/// Keeps one field's value as text.
struct FieldText {
    name: &'static str,
    text: Option<String>,
}

impl tracing::field::Visit for FieldText {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == self.name {
            self.text = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        if field.name() == self.name {
            self.text = Some(format!("{value:?}"));
        }
    }
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
