//! How ftkv's programs show what the libraries report through `tracing`: each event at
//! information level or above as one line, its message; the pool's reports on stdout, tagged
//! as the rank's output ([`ftkv_launch::rank_println!`]), where the drivers read them; everything
//! else on stderr. Spans and fields stay out of the lines: the lines are what the drivers and
//! the tests read.

use ftkv::events::field_text;
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

use ftkv_tasks::events::REPORT_TARGET;

/// Installs the line printer as this process's subscriber; a later call, or one after the
/// program installed its own, changes nothing.
pub fn install() {
    let _ = tracing_subscriber::registry().with(Lines).try_init();
}

/// The layer that prints each event's message as one line.
struct Lines;

impl<S: Subscriber> Layer<S> for Lines {
    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        ftkv::events::shown_as_line(metadata)
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let line = message_of(event);
        if event.metadata().target() == REPORT_TARGET {
            ftkv_launch::rank_println!("{line}");
        } else {
            eprintln!("{line}");
        }
    }
}

/// The `message` field of `event` ("" when it has none).
fn message_of(event: &Event<'_>) -> String {
    field_text(event, "message").unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// An event's message and `kind` field.
    type Seen = (String, Option<String>);

    /// Collects what it sees of each event.
    struct Collect(Arc<Mutex<Vec<Seen>>>);

    impl<S: Subscriber> Layer<S> for Collect {
        fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
            let seen = (message_of(event), field_text(event, "kind"));
            self.0.lock().unwrap().push(seen);
        }
    }

    #[test]
    fn an_event_s_message_and_fields_are_read_as_text() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry().with(Collect(seen.clone()));
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(kind = "warning", "ftkv: {} failed", "a revoke");
            tracing::info!(target: REPORT_TARGET, "progress {{\"tasks\":1}}");
        });
        let seen = seen.lock().unwrap();
        assert_eq!(seen[0], ("ftkv: a revoke failed".into(), Some("warning".into())));
        assert_eq!(seen[1], ("progress {\"tasks\":1}".into(), None));
    }
}
