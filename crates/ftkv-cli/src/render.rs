//! How a rank of ftkv's programs shows the library's events: the store's on stderr, the pool's
//! progress and recoveries on stdout (the drivers read them there, tagged by rank, and from
//! the rank's record, [`crate::records`]) and its
//! warnings on stderr.

use ftkv::events::Event;
use ftkv_tasks::events::PoolEvent;

/// Installs both sinks for this process (once; later calls keep the first).
pub fn install_event_sinks() {
    ftkv::events::set_sink(print_store_event);
    ftkv_tasks::events::set_sink(print_pool_event);
}

fn print_store_event(event: &Event) {
    eprintln!("{event}");
}

fn print_pool_event(event: &PoolEvent) {
    if event.is_report() {
        crate::rank_println!("{event}");
    } else {
        eprintln!("{event}");
    }
}
