//! The C API of ftkv: a store on a communicator the C program owns, blocking put and delete of
//! the program's own keys, get of any key (also a failed worker's, after a recovery), global
//! recovery and the failed set. Built as a shared and a static library; `include/ftkv.h` is
//! generated from this file by cbindgen.
//!
//! Every function returns an [`ftkv_status`]; [`ftkv_status_message`] names a status and
//! [`ftkv_last_error`] gives the calling thread's last error in words. No Rust panic crosses
//! the boundary: one is caught and returned as [`ftkv_status::FTKV_PANIC`].
//!
//! Pointer contract of every function: a store handle is NULL or one that
//! [`ftkv_store_create`] returned and no free or abandon ended, used by one thread at a time;
//! data and buffer pointers have the bytes their length says.

#![allow(non_camel_case_types)]
// The functions are for C: each one's pointer contract is in its documentation (and the
// header's); every dereference of a C pointer is in `ftkv_mpi::c_abi`, the FFI crate.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use ftkv::{Config, Error, Key, Store};
use ftkv_mpi::{c_abi, Mpi};

/// Switches Open MPI's heartbeat detector on ([`ftkv_mpi::default_heartbeat_detector`]: a
/// rank silent for 10 s is declared failed) when the shared library is loaded, before the
/// program's `main` and so before its `MPI_Init`, unless the environment configures the
/// detector (`mpirun --mca mpi_ft_detector ...`). A program linked with the static library
/// passes the parameters to `mpirun` itself.
#[used]
#[link_section = ".init_array"]
static HEARTBEAT_DETECTOR_ON_LOAD: extern "C" fn() = heartbeat_detector_on_load;

extern "C" fn heartbeat_detector_on_load() {
    ftkv_mpi::default_heartbeat_detector();
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
}

use ftkv_status::*;

/// A store handle (opaque).
pub struct ftkv_store {
    store: Store,
    /// The MPI library the store runs on, as the C program initialised it.
    _mpi: Mpi,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// An error on its way to C: its status and its message.
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
            | Error::ForeignOwner { .. } => FTKV_INVALID_ARGUMENT,
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
fn store_mut<'a>(store: *mut ftkv_store) -> Result<&'a mut ftkv_store, Failure> {
    c_abi::handle_mut(store).ok_or_else(|| invalid("the store handle is NULL"))
}

/// `len` bytes at `data` (empty when `len` is 0, whatever `data` is).
fn bytes<'a>(data: *const c_void, len: usize) -> Result<&'a [u8], Failure> {
    c_abi::slice(data.cast::<u8>(), len).ok_or_else(|| invalid("the data pointer is NULL"))
}

/// Room for `cap` bytes at `buf`.
fn room<'a>(buf: *mut c_void, cap: usize) -> Result<&'a mut [u8], Failure> {
    c_abi::slice_mut(buf.cast::<u8>(), cap).ok_or_else(|| invalid("the buffer pointer is NULL"))
}

/// Writes `value` through `out`.
fn put_out<T>(out: *mut T, value: T) -> Result<(), Failure> {
    c_abi::write_out(out, value).then_some(()).ok_or_else(|| invalid("an output pointer is NULL"))
}

/// The kind names `kinds[0..n]`.
fn kind_names(kinds: *const *const c_char, n: usize) -> Result<Vec<String>, Failure> {
    let pointers = c_abi::slice(kinds, n).filter(|p| !p.is_empty());
    let pointers = pointers.ok_or_else(|| invalid("at least one kind is needed"))?;
    pointers
        .iter()
        .map(|&p| {
            let name = c_abi::c_str(p).ok_or_else(|| invalid("a kind name is NULL"))?;
            name.to_str().map(str::to_owned).map_err(|_| invalid("a kind name is not UTF-8"))
        })
        .collect()
}

/// The kind index `kind` as a key of `store`'s worker `owner`.
fn key(owner: c_int, kind: u16) -> Key {
    Key::new(owner, kind)
}

/// A short description of `status` (a static string; never NULL).
#[no_mangle]
pub extern "C" fn ftkv_status_message(status: ftkv_status) -> *const c_char {
    let text: &'static CStr = match status {
        FTKV_OK => c"ok",
        FTKV_NOT_FOUND => c"the key holds no value",
        FTKV_BUFFER_TOO_SMALL => c"the value is longer than the buffer",
        FTKV_RECOVERY_NEEDED => c"a process failed: call ftkv_recover on every survivor",
        FTKV_KEY_LOST => c"no copy of the key survived",
        FTKV_INVALID_ARGUMENT => c"invalid argument",
        FTKV_INVALID_CONFIG => c"invalid or mismatched store configuration",
        FTKV_MPI_ERROR => c"MPI error",
        FTKV_RECOVERY_FAILED => c"the recovery could not complete",
        FTKV_PANIC => c"internal error in ftkv",
    };
    text.as_ptr()
}

/// The calling thread's last error in words ("" after a call that succeeded). Valid until
/// the thread's next ftkv call.
#[no_mangle]
pub extern "C" fn ftkv_last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// Creates a store collectively on every rank of `comm` (the program keeps owning `comm`;
/// ftkv works on a duplicate). Keys are (owner rank in `comm`, kind index into `kinds`);
/// every key has `copies` copies on other ranks; values are at most `max_value` bytes (0: 1
/// MiB). MPI must be initialised with `MPI_THREAD_MULTIPLE` (ftkv runs a failure detector
/// thread). Unless the program installed a `SIGPIPE` handler, ftkv sets `SIGPIPE` to ignored:
/// a write to a dead peer's connection must come back as an error, not end the process.
///
/// Completion: `FTKV_OK` on every rank with `*out` set, once every rank created its part.
/// Failure: `FTKV_INVALID_CONFIG` when the arguments differ between ranks or are invalid (no
/// rank hangs), `FTKV_MPI_ERROR` when MPI is not ready or a rank failed meanwhile; `*out` is
/// then unchanged.
#[no_mangle]
pub extern "C" fn ftkv_store_create(
    comm: MPI_Comm,
    kinds: *const *const c_char,
    n_kinds: usize,
    copies: usize,
    max_value: usize,
    out: *mut *mut ftkv_store,
) -> ftkv_status {
    guarded(|| {
        if out.is_null() {
            return Err(invalid("the output pointer is NULL"));
        }
        let names = kind_names(kinds, n_kinds)?;
        // The store's warnings (a failure that needs global recovery, a process ending
        // itself) go to stderr, as ftkv's own programs print them.
        ftkv::events::set_sink(|event| eprintln!("{event}"));
        let mpi = Mpi::attach()?;
        let comm = c_abi::duplicate_comm(&mpi, comm)?;
        let mut config = Config::new(names, copies);
        if max_value > 0 {
            config.max_value = max_value;
        }
        let store = Store::create(&comm, config)?;
        put_out(out, c_abi::into_handle(ftkv_store { store, _mpi: mpi }))?;
        Ok(FTKV_OK)
    })
}

/// Frees `store` collectively over its live workers (its windows are freed with them). After
/// a failure that was not recovered, use `ftkv_store_abandon` instead. NULL is a no-op.
#[no_mangle]
pub extern "C" fn ftkv_store_free(store: *mut ftkv_store) -> ftkv_status {
    guarded(|| {
        drop(c_abi::take_handle(store));
        Ok(FTKV_OK)
    })
}

/// Leaves `store` without any collective call (its memory stays allocated until the process
/// ends): for the end of a job after a failure that was not recovered. NULL is a no-op.
#[no_mangle]
pub extern "C" fn ftkv_store_abandon(store: *mut ftkv_store) -> ftkv_status {
    guarded(|| {
        if let Some(handle) = c_abi::take_handle(store) {
            handle.store.abandon();
        }
        Ok(FTKV_OK)
    })
}

/// This rank's worker id (its rank in the communicator the store was created on), or -1 for
/// a NULL handle.
#[no_mangle]
pub extern "C" fn ftkv_store_worker(store: *const ftkv_store) -> c_int {
    c_abi::handle_ref(store).map_or(-1, |s| s.store.worker())
}

/// Writes `len` bytes at `data` under this rank's own key of kind `kind` and returns once
/// every copy holds them.
///
/// Completion: `FTKV_OK` once the new value is on every holder. Failure:
/// `FTKV_INVALID_ARGUMENT` changes nothing; `FTKV_RECOVERY_NEEDED` means a process failed: the
/// new value may be on some holders, all or none, the previous one is intact, and after
/// `ftkv_recover` a get returns one of the two.
#[no_mangle]
pub extern "C" fn ftkv_put(
    store: *mut ftkv_store,
    kind: u16,
    data: *const c_void,
    len: usize,
) -> ftkv_status {
    guarded(|| {
        let handle = store_mut(store)?;
        let me = handle.store.worker();
        handle.store.put(key(me, kind), bytes(data, len)?)?;
        Ok(FTKV_OK)
    })
}

/// Deletes this rank's own key of kind `kind`; completion and failure as `ftkv_put`.
#[no_mangle]
pub extern "C" fn ftkv_delete(store: *mut ftkv_store, kind: u16) -> ftkv_status {
    guarded(|| {
        let handle = store_mut(store)?;
        let me = handle.store.worker();
        handle.store.delete(key(me, kind))?;
        Ok(FTKV_OK)
    })
}

/// Reads the newest value of key (`owner`, `kind`) from its live holders into `buf` (room for
/// `cap` bytes) and sets `*len` to its length. Works for any owner, also a failed one after
/// `ftkv_recover`: the value is its last acknowledged put (or a later one that was in flight).
///
/// Completion: `FTKV_OK` with the value in `buf`; `FTKV_NOT_FOUND` (`*len` = 0) when the key
/// holds no value; `FTKV_BUFFER_TOO_SMALL` with `*len` the length needed (nothing copied).
/// Failure: `FTKV_RECOVERY_NEEDED` after a failure not yet recovered, `FTKV_KEY_LOST` when no
/// copy survived.
#[no_mangle]
pub extern "C" fn ftkv_get(
    store: *mut ftkv_store,
    owner: c_int,
    kind: u16,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> ftkv_status {
    guarded(|| {
        let handle = store_mut(store)?;
        let Some(value) = handle.store.get(key(owner, kind))? else {
            put_out(len, 0)?;
            return Ok(FTKV_NOT_FOUND);
        };
        put_out(len, value.len())?;
        if value.len() > cap {
            return Ok(FTKV_BUFFER_TOO_SMALL);
        }
        room(buf, cap)?[..value.len()].copy_from_slice(&value);
        Ok(FTKV_OK)
    })
}

/// Whether a failure was noticed that `ftkv_recover` has not dealt with yet (1) or not (0);
/// -1 for a NULL handle.
#[no_mangle]
pub extern "C" fn ftkv_needs_recovery(store: *const ftkv_store) -> c_int {
    c_abi::handle_ref(store).map_or(-1, |s| c_int::from(s.store.needs_recovery()))
}

/// Recovers the store collectively over the survivors: shrinks it to them and copies the
/// newest surviving version of every key to its new holders. Every survivor must call it
/// once it saw `FTKV_RECOVERY_NEEDED` (or `ftkv_needs_recovery`); a survivor that does not
/// holds the others in it: they wait however long it takes, and print on stderr, after a
/// second and then every five seconds, the workers they wait for (`ftkv: worker 0: recovery
/// waiting for workers [3] to enter step shrink (MPIX_Comm_shrink) (6.0 s so far)...`). With
/// `copies` = c, up to c − 1 failures between two recoveries lose no acknowledged write.
///
/// The recovery deadline (10 s, plus the time the data to copy takes) runs only while every
/// live survivor is inside the same step of the recovery, from the moment the last one entered
/// it: a step stuck inside Open MPI with all of them in it (`MPIX_Comm_shrink` can stay
/// blocked after a kill during recovery) ends each of them with a message naming the step
/// (`... stuck in step shrink (MPIX_Comm_shrink)`), and a survivor stuck alone in a step the
/// others left ends itself while they recover without it. A late survivor never makes the
/// others end themselves.
///
/// Completion: `FTKV_OK` on every survivor. Failure: another failure during the recovery
/// restarts it inside the call; `FTKV_RECOVERY_FAILED` when too few ranks are left.
#[no_mangle]
pub extern "C" fn ftkv_recover(store: *mut ftkv_store) -> ftkv_status {
    guarded(|| {
        store_mut(store)?.store.recover()?;
        Ok(FTKV_OK)
    })
}

/// Copies the failed workers this rank knows of (ascending) into `out` (room for `cap`) and
/// sets `*count` to how many there are (it may exceed `cap`: then only `cap` are copied).
#[no_mangle]
pub extern "C" fn ftkv_failed(
    store: *mut ftkv_store,
    out: *mut c_int,
    cap: usize,
    count: *mut usize,
) -> ftkv_status {
    guarded(|| {
        let failed = store_mut(store)?.store.failed();
        put_out(count, failed.len())?;
        let n = failed.len().min(cap);
        let room = c_abi::slice_mut(out, n).ok_or_else(|| invalid("the output array is NULL"))?;
        room.copy_from_slice(&failed[..n]);
        Ok(FTKV_OK)
    })
}
