//! The C API of ftkv: a store on a communicator the C program owns, with every setting
//! ([`ftkv_config`]: global or localized recovery, reserve holders, watchdogs); blocking and
//! asynchronous puts of the program's own keys, handed writes of others' keys, gets of any key
//! (also a failed worker's), transactions ([`transactions`]), recovery, failure notification
//! and counters ([`events`]). Built as a shared and a static library; `include/ftkv.h` is
//! generated from this crate by cbindgen, and `include/ftkv.hpp` wraps it for C++17.
//!
//! Every function returns an [`ftkv_status`] (or says otherwise); [`ftkv_status_message`]
//! names a status and [`ftkv_last_error`] gives the calling thread's last error in words. No
//! Rust panic crosses the boundary: one is caught and returned as [`ftkv_status::FTKV_PANIC`].
//!
//! Pointer contract of every function: a store handle is NULL or one that
//! [`ftkv_store_open`] or [`ftkv_store_create`] returned and no free or abandon ended, used by
//! one thread at a time; data and buffer pointers have the bytes their length says. The
//! functions that take pointers are `unsafe fn`s; every dereference happens in
//! `ftkv_mpi::c_abi`, whose `unsafe fn`s pass the contract on.

#![allow(non_camel_case_types)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod config;
pub mod events;
pub mod transactions;

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use ftkv::{Config, DetachedPut, Error, Key, Store};
use ftkv_mpi::{c_abi, Mpi};

pub use config::*;
pub use events::*;
pub use transactions::*;

/// Switches Open MPI's heartbeat detector on ([`ftkv_mpi::default_heartbeat_detector`]: a
/// rank silent for 10 s is declared failed) when the shared library is loaded, before the
/// program's `main` and so before its `MPI_Init`, unless the environment configures the
/// detector (`mpirun --mca mpi_ft_detector ...`), and applies the other settings fault tolerance
/// needs ([`ftkv_mpi::fault_tolerant_defaults`]: no collective component that is not fault
/// tolerant, `MPI_Finalize` without its closing fence), each unless the environment sets it. A program linked with the static library passes the
/// parameters to `mpirun` itself.
#[used]
#[link_section = ".init_array"]
static HEARTBEAT_DETECTOR_ON_LOAD: extern "C" fn() = heartbeat_detector_on_load;

extern "C" fn heartbeat_detector_on_load() {
    ftkv_mpi::default_heartbeat_detector();
    ftkv_mpi::fault_tolerant_defaults();
}

/// An MPI communicator handle as Open MPI's `mpi.h` defines it (a pointer).
pub type MPI_Comm = *mut c_void;

/// What a call of the C API ended with.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ftkv_status {
    /// The call did what it documents.
    FTKV_OK = 0,
    /// `ftkv_get`: the key holds no value (never written, or deleted).
    FTKV_NOT_FOUND = 1,
    /// `ftkv_get`: the value is longer than the buffer; `*len` holds its length.
    FTKV_BUFFER_TOO_SMALL = 2,
    /// A process failed: every survivor must call `ftkv_recover` before the store is used again.
    FTKV_RECOVERY_NEEDED = 3,
    /// No copy of the key survived a recovery and its owner has not written it since.
    FTKV_KEY_LOST = 4,
    /// An argument was invalid (a null pointer, an unknown kind or owner, a value larger than
    /// the store's maximum, another worker's key for `ftkv_put`); nothing changed.
    FTKV_INVALID_ARGUMENT = 5,
    /// Store creation: the configurations of the ranks differ, or one is invalid.
    FTKV_INVALID_CONFIG = 6,
    /// MPI is not initialised with `MPI_THREAD_MULTIPLE`, or an MPI call failed otherwise.
    FTKV_MPI_ERROR = 7,
    /// A recovery could not complete (too few survivors, or the survivors are partitioned).
    FTKV_RECOVERY_FAILED = 8,
    /// A bug inside ftkv (a Rust panic), caught at the boundary.
    FTKV_PANIC = 9,
    /// `ftkv_transaction`: a key stayed locked by other transactions for the whole bound;
    /// nothing was written.
    FTKV_CONTENDED = 10,
}

use ftkv_status::*;

/// A store handle (opaque).
pub struct ftkv_store {
    store: Store,
    /// How many kinds the program named: the kinds after them are the store's own (the
    /// transaction records), which the program's writes must not touch.
    kinds: usize,
    /// The asynchronous put not yet waited for, and where the program keeps its value.
    pending: Option<Pending>,
    /// The failed workers `ftkv_next_failure` returned.
    reported: Vec<i32>,
    counters: ftkv_counters,
    /// The MPI library the store runs on, as the C program initialised it.
    _mpi: Mpi,
}

/// An asynchronous put whose other copies are not waited for yet.
struct Pending {
    put: DetachedPut,
    /// The program's value (`put.len()` bytes): it keeps them unchanged until `ftkv_wait`
    /// returns.
    data: *const u8,
}

impl ftkv_store {
    /// Waits for the pending asynchronous put, if any ([`Store::wait_detached`] from the
    /// program's bytes): `Ok` once every copy holds it.
    fn wait_pending(&mut self) -> Result<(), Failure> {
        let Some(pending) = self.pending.take() else { return Ok(()) };
        let len = pending.put.len();
        // SAFETY: `ftkv_put_async`'s contract: its `len` bytes at `data` stay valid and
        // unchanged until `ftkv_wait` returns, and this is `ftkv_wait`.
        let value = unsafe { c_abi::slice(pending.data, len) }
            .ok_or_else(|| invalid("the pending put's data pointer is NULL"))?;
        self.store.wait_detached(pending.put, value)?;
        self.count_put(len);
        Ok(())
    }

    /// Completes the pending asynchronous put, if any, without its value (the store copies
    /// the first copy; the put is not acknowledged): for the collective and final calls.
    fn release_pending(&mut self) {
        if let Some(pending) = self.pending.take() {
            self.store.release_detached(pending.put);
        }
    }

    /// Refuses a call while an asynchronous put is pending: its value must be waited for
    /// first (the program may not have kept it for longer).
    fn ensure_nothing_pending(&self) -> Result<(), Failure> {
        match self.pending {
            Some(_) => Err(invalid("an asynchronous put is pending: call ftkv_wait first")),
            None => Ok(()),
        }
    }

    /// Refuses a write of one of the store's own kinds (the transaction records).
    fn check_writable(&self, kind: u16) -> Result<(), Failure> {
        match usize::from(kind) < self.kinds {
            true => Ok(()),
            false => Err(invalid(&format!("kind {kind} is not one of the program's kinds"))),
        }
    }

    /// The key (`owner`, `kind`) a plain write may go to (`None`: this rank's own), once
    /// nothing is pending and the kind is the program's.
    fn writable_key(&self, owner: Option<c_int>, kind: u16) -> Result<Key, Failure> {
        self.ensure_nothing_pending()?;
        self.check_writable(kind)?;
        Ok(key(owner.unwrap_or_else(|| self.store.worker()), kind))
    }

    fn count_put(&mut self, len: usize) {
        self.counters.puts += 1;
        self.counters.bytes_written += len as u64;
    }

    /// Adds the localized repairs the store reported since the last look to the counters.
    fn collect_repairs(&mut self) {
        for repair in self.store.take_repairs() {
            self.counters.repairs += 1;
            self.counters.keys_moved += repair.keys_moved as u64;
            self.counters.bytes_moved += repair.bytes_moved;
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// An error on its way to C: its status and its message.
#[derive(Debug)]
struct Failure(ftkv_status, String);

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        let status = match &e {
            _ if e.needs_recovery() => FTKV_RECOVERY_NEEDED,
            Error::KeyLost(_) => FTKV_KEY_LOST,
            Error::InvalidConfig(_)
            | Error::ConfigMismatch { .. }
            | Error::WindowTooLarge { .. } => FTKV_INVALID_CONFIG,
            Error::UnknownKind(_)
            | Error::UnknownKindIndex(_)
            | Error::UnknownOwner(_)
            | Error::ValueTooLarge { .. }
            | Error::ValueMismatch { .. }
            | Error::InvalidTransaction(_)
            | Error::ForeignOwner { .. } => FTKV_INVALID_ARGUMENT,
            Error::TransactionContended { .. } => FTKV_CONTENDED,
            Error::RecoveryFailed(_) | Error::Partitioned { .. } => FTKV_RECOVERY_FAILED,
            _ => FTKV_MPI_ERROR,
        };
        Failure(status, e.to_string())
    }
}

impl From<ftkv_mpi::MpiError> for Failure {
    fn from(e: ftkv_mpi::MpiError) -> Failure {
        Failure(FTKV_MPI_ERROR, e.to_string())
    }
}

fn invalid(what: &str) -> Failure {
    Failure(FTKV_INVALID_ARGUMENT, what.to_owned())
}

/// Runs `body`, records its error for [`ftkv_last_error`] and turns a panic into
/// [`FTKV_PANIC`].
fn guarded(body: impl FnOnce() -> Result<ftkv_status, Failure>) -> ftkv_status {
    let (status, message) = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(status)) => (status, String::new()),
        Ok(Err(Failure(status, message))) => (status, message),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            (FTKV_PANIC, format!("ftkv panicked: {what}"))
        }
    };
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = message);
    status
}

/// The store behind `store`, or an argument error for a null handle.
///
/// # Safety
/// `store` is NULL or a live handle used by one thread at a time.
unsafe fn store_mut<'a>(store: *mut ftkv_store) -> Result<&'a mut ftkv_store, Failure> {
    // SAFETY: the caller's contract (above).
    unsafe { c_abi::handle_mut(store) }.ok_or_else(|| invalid("the store handle is NULL"))
}

/// `len` bytes at `data` (empty when `len` is 0, whatever `data` is).
///
/// # Safety
/// `data` has `len` readable bytes, unchanged while the slice lives.
unsafe fn bytes<'a>(data: *const c_void, len: usize) -> Result<&'a [u8], Failure> {
    // SAFETY: the caller's contract (above).
    unsafe { c_abi::slice(data.cast::<u8>(), len) }
        .ok_or_else(|| invalid("the data pointer is NULL"))
}

/// Room for `cap` bytes at `buf`.
///
/// # Safety
/// `buf` has room for `cap` bytes that nothing else uses while the slice lives.
unsafe fn room<'a>(buf: *mut c_void, cap: usize) -> Result<&'a mut [u8], Failure> {
    // SAFETY: the caller's contract (above).
    unsafe { c_abi::slice_mut(buf.cast::<u8>(), cap) }
        .ok_or_else(|| invalid("the buffer pointer is NULL"))
}

/// Writes `value` through `out`.
///
/// # Safety
/// `out` is NULL or writable for one `T`.
unsafe fn put_out<T>(out: *mut T, value: T) -> Result<(), Failure> {
    // SAFETY: the caller's contract (above).
    let written = unsafe { c_abi::write_out(out, value) };
    written.then_some(()).ok_or_else(|| invalid("an output pointer is NULL"))
}

/// Hands a value read to C: `*len` its length, the bytes into `buf` when they fit
/// (`FTKV_BUFFER_TOO_SMALL` otherwise, nothing copied), `FTKV_NOT_FOUND` (`*len` = 0) for none.
///
/// # Safety
/// `buf` has room for `cap` bytes; `len` is NULL or writable.
unsafe fn copy_out(
    value: Option<&[u8]>,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> Result<ftkv_status, Failure> {
    let Some(value) = value else {
        // SAFETY: the caller's contract (above).
        unsafe { put_out(len, 0) }?;
        return Ok(FTKV_NOT_FOUND);
    };
    // SAFETY: the caller's contract (above).
    unsafe { put_out(len, value.len()) }?;
    if value.len() > cap {
        return Ok(FTKV_BUFFER_TOO_SMALL);
    }
    // SAFETY: the caller's contract (above): `buf` has room for `cap` ≥ `value.len()` bytes.
    unsafe { room(buf, value.len()) }?.copy_from_slice(value);
    Ok(FTKV_OK)
}

/// The kind names `kinds[0..n]`.
///
/// # Safety
/// `kinds` has `n` pointers, each NULL or a NUL-terminated string.
unsafe fn kind_names(kinds: *const *const c_char, n: usize) -> Result<Vec<String>, Failure> {
    // SAFETY: the caller's contract (above).
    let pointers = unsafe { c_abi::slice(kinds, n) }.filter(|p| !p.is_empty());
    let pointers = pointers.ok_or_else(|| invalid("at least one kind is needed"))?;
    pointers
        .iter()
        .map(|&p| {
            // SAFETY: the caller's contract (above).
            let name = unsafe { c_abi::c_str(p) }.ok_or_else(|| invalid("a kind name is NULL"))?;
            name.to_str().map(str::to_owned).map_err(|_| invalid("a kind name is not UTF-8"))
        })
        .collect()
}

/// The kind index `kind` as a key of `store`'s worker `owner`.
fn key(owner: c_int, kind: u16) -> Key {
    Key::new(owner, kind)
}

/// A short description of `status` (a static string; never NULL; "unknown status" for a
/// value that is no `ftkv_status`).
#[no_mangle]
pub extern "C" fn ftkv_status_message(status: c_int) -> *const c_char {
    let text: &'static CStr = match status {
        s if s == FTKV_OK as c_int => c"ok",
        s if s == FTKV_NOT_FOUND as c_int => c"the key holds no value",
        s if s == FTKV_BUFFER_TOO_SMALL as c_int => c"the value is longer than the buffer",
        s if s == FTKV_RECOVERY_NEEDED as c_int => {
            c"a process failed: call ftkv_recover on every survivor"
        }
        s if s == FTKV_KEY_LOST as c_int => c"no copy of the key survived",
        s if s == FTKV_INVALID_ARGUMENT as c_int => c"invalid argument",
        s if s == FTKV_INVALID_CONFIG as c_int => c"invalid or mismatched store configuration",
        s if s == FTKV_MPI_ERROR as c_int => c"MPI error",
        s if s == FTKV_RECOVERY_FAILED as c_int => c"the recovery could not complete",
        s if s == FTKV_PANIC as c_int => c"internal error in ftkv",
        s if s == FTKV_CONTENDED as c_int => c"a key stayed locked by other transactions",
        _ => c"unknown status",
    };
    text.as_ptr()
}

/// The calling thread's last error in words ("" after a call that succeeded). Valid until
/// the thread's next ftkv call.
#[no_mangle]
pub extern "C" fn ftkv_last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// Creates a store collectively on every rank of `comm` with every setting of `config` (the
/// program keeps owning `comm` and `config`; ftkv works on a duplicate of `comm`). Keys are
/// (owner rank in `comm`, kind index into `config->kinds`). MPI must be initialised with
/// `MPI_THREAD_MULTIPLE` (ftkv runs a failure detector thread). Unless the program installed
/// a `SIGPIPE` handler, ftkv sets `SIGPIPE` to ignored: a write to a dead peer's connection
/// must come back as an error, not end the process. The store's events go to the handler of
/// `ftkv_set_event_handler`, by default to stderr.
///
/// Completion: `FTKV_OK` on every rank with `*out` set, once every rank created its part.
/// Failure: `FTKV_INVALID_CONFIG` when the settings differ between ranks or are invalid (no
/// rank hangs), `FTKV_INVALID_ARGUMENT` for a NULL pointer or an unknown mode, `FTKV_MPI_ERROR`
/// when MPI is not ready or a rank failed meanwhile; `*out` is then unchanged.
///
/// # Safety
/// `comm` is a valid communicator of this process's MPI library; `config` is NULL or points to
/// a configuration whose `kinds` holds `n_kinds` NUL-terminated strings; `out` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn ftkv_store_open(
    comm: MPI_Comm,
    config: *const ftkv_config,
    out: *mut *mut ftkv_store,
) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let settings = unsafe { c_abi::handle_ref(config) };
        let settings = settings.ok_or_else(|| invalid("the configuration pointer is NULL"));
        let config = settings.and_then(|c| {
            // SAFETY: the caller's contract (above).
            let names = unsafe { kind_names(c.kinds, c.n_kinds) }?;
            c.to_config(names)
        });
        // SAFETY: the caller's contract (above).
        unsafe { open(comm, config, out) }
    })
}

/// Creates a store collectively on every rank of `comm` with global recovery and the defaults
/// of `ftkv_config_default` otherwise: keys are (owner rank in `comm`, kind index into
/// `kinds`); every key has `copies` copies on other ranks; values are at most `max_value`
/// bytes (0: the default, 64 MiB). Completion and failure as `ftkv_store_open`.
///
/// # Safety
/// `comm` is a valid communicator of this process's MPI library; `kinds` holds `n_kinds`
/// NUL-terminated strings; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ftkv_store_create(
    comm: MPI_Comm,
    kinds: *const *const c_char,
    n_kinds: usize,
    copies: usize,
    max_value: usize,
    out: *mut *mut ftkv_store,
) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let config = unsafe { kind_names(kinds, n_kinds) }.map(|names| {
            let mut config = Config::new(names, copies);
            if max_value > 0 {
                config.max_value = max_value;
                config.initial_capacity = config.initial_capacity.min(max_value);
            }
            config
        });
        // SAFETY: the caller's contract (above).
        unsafe { open(comm, config, out) }
    })
}

/// Creates the store on a duplicate of `comm` and hands it to C through `out`. A rank whose
/// own arguments were refused (`config` is its error) still takes part in the collective
/// creation, with a configuration every rank refuses, so that no rank waits for it.
///
/// # Safety
/// `comm` is a valid communicator of this process's MPI library; `out` is NULL or writable.
unsafe fn open(
    comm: MPI_Comm,
    config: Result<Config, Failure>,
    out: *mut *mut ftkv_store,
) -> Result<ftkv_status, Failure> {
    let config = config.and_then(|config| match out.is_null() {
        true => Err(invalid("the output pointer is NULL")),
        false => Ok(config),
    });
    events::install_forwarding();
    let mpi = Mpi::attach()?;
    // SAFETY: the caller's contract (above).
    let comm = unsafe { c_abi::duplicate_comm(&mpi, comm) }?;
    let (config, refused) = match config {
        Ok(config) => (config, None),
        Err(refused) => (Config::new(Vec::<String>::new(), 0), Some(refused)),
    };
    let kinds = config.kinds.iter().filter(|k| k.as_str() != ftkv::TX_RECORD_KIND).count();
    let created = Store::create(&comm, config);
    if let Some(refused) = refused {
        return Err(refused);
    }
    let handle = ftkv_store {
        store: created?,
        kinds,
        pending: None,
        reported: Vec::new(),
        counters: ftkv_counters::default(),
        _mpi: mpi,
    };
    // SAFETY: the caller's contract (above).
    unsafe { put_out(out, c_abi::into_handle(handle)) }?;
    Ok(FTKV_OK)
}

/// Frees `store` collectively over its live workers (its windows are freed with them). A
/// pending asynchronous put is completed from its first copy first (unacknowledged; its
/// bytes are not read). After a failure that was not recovered the store is abandoned instead
/// (as `ftkv_store_abandon`: a collective free would wait for the dead). NULL is a no-op.
///
/// Completion: `FTKV_OK`; the handle is gone. Never fails.
///
/// # Safety
/// `store` is NULL or a live handle, not used by another thread and not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ftkv_store_free(store: *mut ftkv_store) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let Some(mut handle) = (unsafe { c_abi::take_handle(store) }) else { return Ok(FTKV_OK) };
        handle.release_pending();
        if handle.store.needs_recovery() {
            handle.store.abandon();
        }
        Ok(FTKV_OK)
    })
}

/// Leaves `store` without any collective call (its memory stays allocated until the process
/// ends): for the end of a job after a failure that was not recovered. A pending asynchronous
/// put is not completed. NULL is a no-op.
///
/// # Safety
/// As `ftkv_store_free`.
#[no_mangle]
pub unsafe extern "C" fn ftkv_store_abandon(store: *mut ftkv_store) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        if let Some(handle) = unsafe { c_abi::take_handle(store) } {
            handle.store.abandon();
        }
        Ok(FTKV_OK)
    })
}

/// This rank's worker id (its rank in the communicator the store was created on), or -1 for
/// a NULL handle. Never waits, never fails otherwise.
///
/// # Safety
/// `store` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ftkv_store_worker(store: *const ftkv_store) -> c_int {
    // SAFETY: the caller's contract (above).
    unsafe { c_abi::handle_ref(store) }.map_or(-1, |s| s.store.worker())
}

/// Writes `len` bytes at `data` under this rank's own key of kind `kind` and returns once
/// every copy holds them.
///
/// Completion: `FTKV_OK` once the new value is on every holder. Failure:
/// `FTKV_INVALID_ARGUMENT` (a NULL pointer, an unknown kind, a value above the maximum, an
/// asynchronous put pending: `ftkv_wait` first) changes nothing; `FTKV_RECOVERY_NEEDED` means a process failed: the
/// new value may be on some holders, all or none, the previous one is intact, and after
/// `ftkv_recover` a get returns one of the two. With localized recovery a holder that failed
/// is replaced in the background and the put goes to the new holders: `FTKV_RECOVERY_NEEDED`
/// then means the store fell back to global recovery.
///
/// # Safety
/// `store` is NULL or a live handle used by one thread at a time; `data` has `len` readable
/// bytes.
#[no_mangle]
pub unsafe extern "C" fn ftkv_put(
    store: *mut ftkv_store,
    kind: u16,
    data: *const c_void,
    len: usize,
) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let (handle, value) = unsafe { (store_mut(store)?, bytes(data, len)?) };
        handle.store.put(handle.writable_key(None, kind)?, value)?;
        handle.count_put(len);
        Ok(FTKV_OK)
    })
}

/// Writes `len` bytes at `data` under this rank's own key of kind `kind` like `ftkv_put`, but
/// returns once the first copy (on this host when a holder is here) holds them; a replicator
/// thread writes the others. The program computes meanwhile, then completes the put with
/// `ftkv_wait`. **The `len` bytes at `data` must stay allocated and unchanged until
/// `ftkv_wait` returns**: a wait that finds the other copies not started writes them from
/// them. Until then the store takes only `ftkv_wait`, the queries (`ftkv_store_worker`,
/// `ftkv_needs_recovery`, `ftkv_failed`, `ftkv_next_failure`, `ftkv_counters_get`) and the
/// collective and final calls (`ftkv_sync`, `ftkv_recover`, `ftkv_store_free`,
/// `ftkv_store_abandon`); those complete the put from its first copy without reading the
/// bytes, and the put is then not acknowledged. Any other call returns
/// `FTKV_INVALID_ARGUMENT`. Small values whose holders all share this host, and keys with one
/// copy, are written to every copy before this returns.
///
/// Completion: `FTKV_OK` means the first holder has the new version. Failure: as `ftkv_put`;
/// until `ftkv_wait` returned, the new version may be on the first holder only: if this rank
/// dies then, a recovery reads it back when that holder survives, the previous version
/// otherwise (never a mix).
///
/// # Safety
/// As `ftkv_put`, and the bytes stay as said above.
#[no_mangle]
pub unsafe extern "C" fn ftkv_put_async(
    store: *mut ftkv_store,
    kind: u16,
    data: *const c_void,
    len: usize,
) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let (handle, value) = unsafe { (store_mut(store)?, bytes(data, len)?) };
        let put = handle.store.put_async(handle.writable_key(None, kind)?, value)?.detach();
        handle.pending = Some(Pending { put, data: value.as_ptr() });
        Ok(FTKV_OK)
    })
}

/// Completes the pending asynchronous put: returns once every copy holds its value (at once
/// when no put is pending). The put's bytes may change once it returned.
///
/// Completion and failure as `ftkv_put` for that put's value. With localized recovery a holder
/// that failed meanwhile is replaced and the whole write goes again to the new holders before
/// this returns.
///
/// # Safety
/// `store` is NULL or a live handle used by one thread at a time.
#[no_mangle]
pub unsafe extern "C" fn ftkv_wait(store: *mut ftkv_store) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        unsafe { store_mut(store) }?.wait_pending()?;
        Ok(FTKV_OK)
    })
}

/// A barrier over the store's live workers (collective): every put acknowledged before it on
/// any worker is visible to every get after it. A pending asynchronous put is completed from
/// its first copy first (unacknowledged; call `ftkv_wait` before to have it acknowledged).
///
/// Completion: `FTKV_OK` on every live worker. Failure: `FTKV_RECOVERY_NEEDED` when a worker
/// failed (with localized recovery too: recover globally, then call it again).
///
/// # Safety
/// `store` is NULL or a live handle used by one thread at a time.
#[no_mangle]
pub unsafe extern "C" fn ftkv_sync(store: *mut ftkv_store) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let handle = unsafe { store_mut(store) }?;
        handle.release_pending();
        handle.store.sync()?;
        Ok(FTKV_OK)
    })
}

/// Deletes this rank's own key of kind `kind`; completion and failure as `ftkv_put`.
///
/// # Safety
/// `store` is NULL or a live handle used by one thread at a time.
#[no_mangle]
pub unsafe extern "C" fn ftkv_delete(store: *mut ftkv_store, kind: u16) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let handle = unsafe { store_mut(store) }?;
        handle.store.delete(handle.writable_key(None, kind)?)?;
        handle.counters.deletes += 1;
        Ok(FTKV_OK)
    })
}

/// Writes `len` bytes at `data` under another worker's key (`owner`, `kind`) that was handed
/// to this rank: the reference paper's future-based cooperation, where a thief writes its
/// victim's entry. The program guarantees one writer per key at a time by a lock of its own
/// (the owner does not write the key meanwhile). Each copy is checksummed, so a reader never
/// takes a mix of two writers' bytes.
///
/// Completion and failure as `ftkv_put`; `FTKV_INVALID_ARGUMENT` for an unknown owner or kind.
///
/// # Safety
/// As `ftkv_put`.
#[no_mangle]
pub unsafe extern "C" fn ftkv_put_handed(
    store: *mut ftkv_store,
    owner: c_int,
    kind: u16,
    data: *const c_void,
    len: usize,
) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let (handle, value) = unsafe { (store_mut(store)?, bytes(data, len)?) };
        handle.store.put_handed(handle.writable_key(Some(owner), kind)?, value)?;
        handle.count_put(len);
        Ok(FTKV_OK)
    })
}

/// Deletes another worker's key handed to this rank (see `ftkv_put_handed`); completion and
/// failure as `ftkv_put_handed`.
///
/// # Safety
/// `store` is NULL or a live handle used by one thread at a time.
#[no_mangle]
pub unsafe extern "C" fn ftkv_delete_handed(
    store: *mut ftkv_store,
    owner: c_int,
    kind: u16,
) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let handle = unsafe { store_mut(store) }?;
        handle.store.delete_handed(handle.writable_key(Some(owner), kind)?)?;
        handle.counters.deletes += 1;
        Ok(FTKV_OK)
    })
}

/// Reads the newest value of key (`owner`, `kind`) from its live holders into `buf` (room for
/// `cap` bytes) and sets `*len` to its length. Works for any owner, also a failed one (after
/// `ftkv_recover`, or at once with localized recovery): the value is its last acknowledged put
/// (or a later one that was in flight). Refused while an asynchronous put is pending.
///
/// Completion: `FTKV_OK` with the value in `buf`; `FTKV_NOT_FOUND` (`*len` = 0) when the key
/// holds no value; `FTKV_BUFFER_TOO_SMALL` with `*len` the length needed (nothing copied).
/// Failure: `FTKV_RECOVERY_NEEDED` after a failure that needs global recovery,
/// `FTKV_KEY_LOST` when no copy survived.
///
/// # Safety
/// `store` is NULL or a live handle used by one thread at a time; `buf` has room for `cap`
/// bytes; `len` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ftkv_get(
    store: *mut ftkv_store,
    owner: c_int,
    kind: u16,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let handle = unsafe { store_mut(store) }?;
        if len.is_null() {
            return Err(invalid("the length pointer is NULL"));
        }
        handle.ensure_nothing_pending()?;
        let value = handle.store.get(key(owner, kind))?;
        // SAFETY: the caller's contract (above).
        let status = unsafe { copy_out(value.as_deref(), buf, cap, len) }?;
        if status != FTKV_BUFFER_TOO_SMALL {
            handle.counters.gets += 1;
        }
        Ok(status)
    })
}

/// Whether a failure was noticed that needs `ftkv_recover` (1) or not (0); -1 for a NULL
/// handle. With localized recovery it is 1 only once the store fell back to global recovery.
/// Never waits.
///
/// # Safety
/// `store` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn ftkv_needs_recovery(store: *const ftkv_store) -> c_int {
    // SAFETY: the caller's contract (above).
    unsafe { c_abi::handle_ref(store) }.map_or(-1, |s| c_int::from(s.store.needs_recovery()))
}

/// Recovers the store collectively over the survivors: shrinks it to them and copies the
/// newest surviving version of every key to its new holders. Every survivor must call it
/// once it saw `FTKV_RECOVERY_NEEDED` (or `ftkv_needs_recovery`); a survivor that does not
/// holds the others in it: they wait however long it takes, and report the workers they wait
/// for (an `FTKV_EVENT_RECOVERY_WAITING` event, by default a line on stderr: `ftkv: worker 0:
/// recovery waiting for workers [3] to enter step shrink (MPIX_Comm_shrink) (6.0 s so
/// far)...`), after a second and then every five seconds. With `copies` = c, up to c − 1
/// failures between two recoveries lose no acknowledged write.
///
/// The recovery deadline (the configuration's recovery watchdog, plus the time the data to
/// copy takes) runs only while every live survivor is inside the same step of the recovery,
/// from the moment the last one entered it: a step stuck inside Open MPI with all of them in
/// it (`MPIX_Comm_shrink` can stay blocked after a kill during recovery) ends each of them
/// with a message naming the step (`... stuck in step shrink (MPIX_Comm_shrink)`), and a
/// survivor stuck alone in a step the others left ends itself while they recover without it.
/// A late survivor never makes the others end themselves.
///
/// Completion: `FTKV_OK` on every survivor (a pending asynchronous put is completed from its
/// first copy first, unacknowledged). Failure: another failure during the recovery
/// restarts it inside the call; `FTKV_RECOVERY_FAILED` when too few ranks are left.
///
/// # Safety
/// `store` is NULL or a live handle used by one thread at a time.
#[no_mangle]
pub unsafe extern "C" fn ftkv_recover(store: *mut ftkv_store) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let handle = unsafe { store_mut(store) }?;
        handle.release_pending();
        let report = handle.store.recover()?;
        handle.counters.global_recoveries += 1;
        handle.counters.keys_lost += report.keys_lost.len() as u64;
        Ok(FTKV_OK)
    })
}

/// With localized recovery: brings this worker's routes up to every failure noticed so far,
/// waiting until the repairer thread (which moves the copies that lived on failed workers in
/// the background) has followed them. Every put, delete and get that notices a new failure
/// does the same first; call it before reading a failed worker's keys. Refused while an
/// asynchronous put is pending. With global recovery it only reports a failure not yet
/// recovered.
///
/// Completion: `FTKV_OK`. Failure: `FTKV_RECOVERY_NEEDED` when the repair fell back to global
/// recovery (or a further failure interrupted it: call again).
///
/// # Safety
/// `store` is NULL or a live handle used by one thread at a time.
#[no_mangle]
pub unsafe extern "C" fn ftkv_follow(store: *mut ftkv_store) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let handle = unsafe { store_mut(store) }?;
        handle.ensure_nothing_pending()?;
        handle.store.follow()?;
        handle.collect_repairs();
        Ok(FTKV_OK)
    })
}

/// Copies the failed workers this rank knows of (ascending) into `out` (room for `cap`) and
/// sets `*count` to how many there are (it may exceed `cap`: then only `cap` are copied).
///
/// Completion: `FTKV_OK`. Failure: `FTKV_INVALID_ARGUMENT` for a NULL handle or `count`, or a
/// NULL `out` with room for failures. Never waits.
///
/// # Safety
/// `store` is NULL or a live handle used by one thread at a time; `out` has room for `cap`
/// values; `count` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ftkv_failed(
    store: *mut ftkv_store,
    out: *mut c_int,
    cap: usize,
    count: *mut usize,
) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let failed = unsafe { store_mut(store) }?.store.failed();
        // SAFETY: the caller's contract (above).
        unsafe { put_out(count, failed.len()) }?;
        let n = failed.len().min(cap);
        // SAFETY: the caller's contract (above).
        let room = unsafe { c_abi::slice_mut(out, n) };
        let room = room.ok_or_else(|| invalid("the output array is NULL"))?;
        room.copy_from_slice(&failed[..n]);
        Ok(FTKV_OK)
    })
}
