//! One handler for SIGINT, SIGTERM and SIGHUP of a driver process: it runs the cleanups the
//! other parts registered, in registration order (the launcher's: end every job this process
//! launched and remove its simulated hosts; the benchmarks': stop their peer servers), then
//! exits with 130.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use anyhow::{Context, Result};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Cleanups the handler runs after ending the jobs, in registration order.
static CLEANUPS: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

/// Registers `cleanup` for the handler; each registration runs once per interrupt.
pub fn on_interrupt(cleanup: fn()) {
    CLEANUPS.lock().unwrap_or_else(|p| p.into_inner()).push(cleanup);
}

/// Whether the handler ran: the driver's own error (its job ended under it) is then a
/// consequence of the interrupt, and the process exits with 130 as well.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Acquire)
}

/// Installs the handler once per process; later calls do nothing.
pub fn install() -> Result<()> {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    let mut result = Ok(());
    INSTALLED.call_once(|| {
        result = ctrlc::set_handler(|| {
            INTERRUPTED.store(true, Ordering::Release);
            let cleanups = CLEANUPS.lock().unwrap_or_else(|p| p.into_inner()).clone();
            cleanups.iter().for_each(|cleanup| cleanup());
            eprintln!("ftkv: interrupted; jobs and peer servers stopped");
            std::process::exit(130);
        });
    });
    result.context("installing the interrupt handler")
}
