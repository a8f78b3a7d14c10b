//! What a C program learns besides return values: the store's events through a handler, the
//! failed workers one at a time (`ftkv_next_failure`), and counters.

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::RwLock;

use ftkv::events::field_text;
use ftkv_mpi::c_abi::LineCallback;
use tracing::{Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

use crate::{ftkv_status, ftkv_store, guarded, put_out, store_mut};
use ftkv_status::*;

/// What an event handler is told about.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ftkv_event_kind {
    /// A watchdog ends this process as a fail-stop failure (the handler runs right before the
    /// process SIGKILLs itself).
    FTKV_EVENT_ENDING_PROCESS = 0,
    /// Something failed that the store works around.
    FTKV_EVENT_WARNING = 1,
    /// A recovery step was reached (only when `FTKV_TRACE` is set in the environment).
    FTKV_EVENT_RECOVERY_STEP = 2,
    /// A recovery waits for survivors that have not called `ftkv_recover` (after a second,
    /// then every five seconds).
    FTKV_EVENT_RECOVERY_WAITING = 3,
}

/// A handler of the store's events: the kind, the event as one line of text (valid during
/// the call), and the `user` pointer given to `ftkv_set_event_handler`. It must return
/// normally (from C++: `noexcept`; an exception must not leave it).
pub type ftkv_event_handler =
    Option<unsafe extern "C" fn(kind: ftkv_event_kind, message: *const c_char, user: *mut c_void)>;

/// The installed handler with its `user` pointer.
static HANDLER: RwLock<Option<LineCallback<ftkv_event_kind>>> = RwLock::new(None);

/// Installs `handler` for every store of this process (`NULL`: the default, a line on
/// stderr), replacing the one before; `user` is passed back to it. It runs on whichever thread
/// raised the event (the program's or one of ftkv's): it must be thread-safe and return
/// quickly, must not call ftkv, and must return normally (from C++: `noexcept`).
/// Completion: `FTKV_OK`; never fails.
///
/// # Safety
/// `handler` is NULL or a function of this signature that keeps the rules above.
#[no_mangle]
pub unsafe extern "C" fn ftkv_set_event_handler(
    handler: ftkv_event_handler,
    user: *mut c_void,
) -> ftkv_status {
    guarded(|| {
        let mut installed = HANDLER.write().unwrap_or_else(|e| e.into_inner());
        // SAFETY: this function's contract: `handler` keeps the rules of a `LineCallback`.
        *installed = handler.map(|h| unsafe { LineCallback::new(h, user) });
        Ok(FTKV_OK)
    })
}

/// Installs the C API's subscriber for this process, unless the program installed one of its
/// own: every store event, and every warning of ftkv's libraries, goes to the program's handler
/// ([`ftkv_set_event_handler`]) or, by default, to stderr as one line.
pub(crate) fn install_forwarding() {
    let _ = tracing_subscriber::registry().with(Forward).try_init();
}

/// The layer that hands events to the program's handler.
struct Forward;

impl<S: Subscriber> Layer<S> for Forward {
    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        ftkv::events::shown_as_line(metadata)
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let Some(kind) = kind_of(event) else { return };
        let message = field_text(event, "message").unwrap_or_default();
        let installed = *HANDLER.read().unwrap_or_else(|e| e.into_inner());
        let Some(handler) = installed else {
            eprintln!("{message}");
            return;
        };
        handler.call(kind, &CString::new(message.replace('\0', " ")).unwrap_or_default());
    }
}

/// What the program is told an event is: the store's `kind` field, or a warning for the
/// warnings and errors of ftkv's other layers; `None` for what is neither (information of
/// the libraries that has no `kind`).
fn kind_of(event: &tracing::Event<'_>) -> Option<ftkv_event_kind> {
    let kind = match field_text(event, "kind").as_deref() {
        Some("ending_process") => ftkv_event_kind::FTKV_EVENT_ENDING_PROCESS,
        Some("recovery_step") => ftkv_event_kind::FTKV_EVENT_RECOVERY_STEP,
        Some("recovery_waiting") => ftkv_event_kind::FTKV_EVENT_RECOVERY_WAITING,
        Some(_) => ftkv_event_kind::FTKV_EVENT_WARNING,
        None if *event.metadata().level() <= Level::WARN => ftkv_event_kind::FTKV_EVENT_WARNING,
        None => return None,
    };
    Some(kind)
}

/// Sets `*worker` to a failed worker that this call has not returned before on this store
/// (the smallest such), so a program learns of each failure once, whichever recovery mode it
/// runs. With localized recovery this is how the survivors learn whose data to adopt: the
/// store repairs the copies by itself.
///
/// Completion: `FTKV_OK` with `*worker` set; `FTKV_NOT_FOUND` when no failure is new. Never
/// waits, and may be called while an asynchronous put is pending.
///
/// # Safety
/// `store` is NULL or a live handle used by one thread at a time; `worker` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn ftkv_next_failure(
    store: *mut ftkv_store,
    worker: *mut c_int,
) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let handle = unsafe { store_mut(store) }?;
        let reported = &mut handle.reported;
        let Some(new) = handle.store.failed().into_iter().find(|w| !reported.contains(w)) else {
            return Ok(FTKV_NOT_FOUND);
        };
        // SAFETY: the caller's contract (above).
        unsafe { put_out(worker, new) }?;
        reported.push(new);
        Ok(FTKV_OK)
    })
}

/// Counts of one store handle's work and of the failures it met.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ftkv_counters {
    /// Puts acknowledged: blocking, asynchronous (once waited for) and handed.
    pub puts: u64,
    /// Deletes acknowledged (own and handed).
    pub deletes: u64,
    /// Gets that returned a value or `FTKV_NOT_FOUND`.
    pub gets: u64,
    /// Value bytes of the acknowledged puts (once per put, not per copy).
    pub bytes_written: u64,
    /// Changes of the failed set this worker's detector published.
    pub failures_noticed: u64,
    /// Global recoveries this worker completed (`ftkv_recover`).
    pub global_recoveries: u64,
    /// Keys those recoveries reported lost (no copy survived).
    pub keys_lost: u64,
    /// Localized repairs this worker followed.
    pub repairs: u64,
    /// Copies this worker moved in them, and their bytes.
    pub keys_moved: u64,
    pub bytes_moved: u64,
    /// This worker's transactions that committed, and that aborted on a condition.
    pub transactions_committed: u64,
    pub transactions_aborted: u64,
    /// Failed coordinators whose open transaction this worker finished as their backup.
    pub transactions_resolved: u64,
}

/// Copies the store handle's counters into `*out`.
///
/// Completion: `FTKV_OK`. Failure: `FTKV_INVALID_ARGUMENT` for a NULL pointer. Never waits,
/// and may be called while an asynchronous put is pending.
///
/// # Safety
/// `store` is NULL or a live handle used by one thread at a time; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ftkv_counters_get(
    store: *mut ftkv_store,
    out: *mut ftkv_counters,
) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let handle = unsafe { store_mut(store) }?;
        handle.collect_repairs();
        let counters = ftkv_counters {
            failures_noticed: handle.store.failures_noticed(),
            transactions_resolved: handle.store.resolved_coordinators().len() as u64,
            ..handle.counters
        };
        // SAFETY: the caller's contract (above).
        unsafe { put_out(out, counters) }?;
        Ok(FTKV_OK)
    })
}
