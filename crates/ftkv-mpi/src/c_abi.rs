//! The C boundary of `ftkv-capi`: pointers a C program passed in, turned into references.
//!
//! Each function that dereferences a pointer is an `unsafe fn`: the pointers come from C,
//! which cannot be checked, so the caller (a C API function, itself `unsafe` to call) passes
//! on the contract that C API function states in its documentation and in the generated
//! header (a handle is NULL or live and used by one thread at a time; a buffer has the bytes
//! its length says; a string is NUL-terminated). NULL is never dereferenced: each returns
//! `None` (or `false`) for it, except for empty slices.

use std::ffi::{c_char, c_void, CStr};

use crate::comm::Comm;
use crate::error::{check, Result};
use crate::ffi;
use crate::runtime::Mpi;

/// The value behind a C handle, mutably; `None` for NULL.
///
/// # Safety
/// `handle` is NULL or a live handle made by [`into_handle`], not used elsewhere while the
/// reference lives.
pub unsafe fn handle_mut<'a, T>(handle: *mut T) -> Option<&'a mut T> {
    // SAFETY: the C API's contract: NULL (handled by `as_mut`) or a live handle it returned,
    // used by one thread at a time.
    unsafe { handle.as_mut() }
}

/// The value behind a C handle; `None` for NULL.
///
/// # Safety
/// `handle` is NULL or a live handle made by [`into_handle`], not changed while the reference
/// lives.
pub unsafe fn handle_ref<'a, T>(handle: *const T) -> Option<&'a T> {
    // SAFETY: as `handle_mut`.
    unsafe { handle.as_ref() }
}

/// A C handle made from `value` (owned by the C program until [`take_handle`]).
pub fn into_handle<T>(value: T) -> *mut T {
    Box::into_raw(Box::new(value))
}

/// Takes back the value of a handle made by [`into_handle`]; `None` for NULL. The handle must
/// not be used afterwards (the C API's contract: freed once).
///
/// # Safety
/// `handle` is NULL or a live handle made by [`into_handle`] for a `T`, taken back once.
pub unsafe fn take_handle<T>(handle: *mut T) -> Option<Box<T>> {
    // SAFETY: the pointer came from `into_handle` (Box::into_raw) and is taken back once.
    (!handle.is_null()).then(|| unsafe { Box::from_raw(handle) })
}

/// `len` values at `data`; empty when `len` is 0 whatever `data` is, `None` for NULL.
///
/// # Safety
/// Unless NULL or `len` is 0, `data` points to `len` initialised values that stay unchanged
/// while the slice lives.
pub unsafe fn slice<'a, T>(data: *const T, len: usize) -> Option<&'a [T]> {
    if len == 0 {
        return Some(&[]);
    }
    // SAFETY: the caller's contract: `len` readable values at non-NULL `data`, unchanged
    // during the call.
    (!data.is_null()).then(|| unsafe { std::slice::from_raw_parts(data, len) })
}

/// Room for `len` values at `data`; empty when `len` is 0, `None` for NULL.
///
/// # Safety
/// Unless NULL or `len` is 0, `data` points to room for `len` values that nothing else uses
/// while the slice lives.
pub unsafe fn slice_mut<'a, T>(data: *mut T, len: usize) -> Option<&'a mut [T]> {
    if len == 0 {
        return Some(&mut []);
    }
    // SAFETY: the caller's contract: room for `len` values at non-NULL `data`, not used
    // elsewhere during the call.
    (!data.is_null()).then(|| unsafe { std::slice::from_raw_parts_mut(data, len) })
}

/// Writes `value` through `out`; `false` for NULL.
///
/// # Safety
/// `out` is NULL or points to writable memory for one `T`.
pub unsafe fn write_out<T>(out: *mut T, value: T) -> bool {
    if out.is_null() {
        return false;
    }
    // SAFETY: the caller's contract: `out` points to writable memory for one `T`.
    unsafe { out.write(value) };
    true
}

/// The NUL-terminated string at `text`; `None` for NULL.
///
/// # Safety
/// `text` is NULL or points to a NUL-terminated string that stays unchanged while the
/// reference lives.
pub unsafe fn c_str<'a>(text: *const c_char) -> Option<&'a CStr> {
    // SAFETY: the caller's contract: a NUL-terminated string at non-NULL `text`.
    (!text.is_null()).then(|| unsafe { CStr::from_ptr(text) })
}

/// A C program's callback that takes a kind `K` (a C enum), a line of text and the program's
/// `user` pointer, with that pointer: calling it is safe once [`LineCallback::new`] took the
/// program's word for it. The pointer is kept as an address (the program owns what it points
/// to), so the callback can be called from any thread.
#[derive(Debug, Clone, Copy)]
pub struct LineCallback<K> {
    function: unsafe extern "C" fn(K, *const c_char, *mut c_void),
    user: usize,
}

impl<K> LineCallback<K> {
    /// The callback `function` with `user`.
    ///
    /// # Safety
    /// `function` can be called with any `K`, a NUL-terminated line valid during the call and
    /// `user`, from any thread and at any time, and returns normally (no unwinding, no
    /// `longjmp`).
    pub unsafe fn new(
        function: unsafe extern "C" fn(K, *const c_char, *mut c_void),
        user: *mut c_void,
    ) -> Self {
        LineCallback { function, user: user as usize }
    }

    /// Calls the program's function with `kind`, `line` and its `user` pointer.
    pub fn call(&self, kind: K, line: &CStr) {
        // SAFETY: `new`'s contract: callable with any kind, a line valid during the call (it
        // is borrowed across it) and the program's `user`, from any thread.
        unsafe { (self.function)(kind, line.as_ptr(), self.user as *mut c_void) }
    }
}

/// A duplicate of the C program's communicator `raw` (collective, like `MPI_Comm_dup`) that
/// returns errors instead of aborting; freed when dropped, while `raw` stays the program's.
///
/// # Safety
/// `raw` is a valid communicator of this process's MPI library.
pub unsafe fn duplicate_comm(mpi: &Mpi, raw: *mut std::ffi::c_void) -> Result<Comm> {
    let mut dup: ffi::MPI_Comm = std::ptr::null_mut();
    // SAFETY: `raw` is valid (the contract); `dup` is a valid out-pointer.
    check(unsafe { ffi::MPI_Comm_dup(raw, &mut dup) }, "MPI_Comm_dup")?;
    // SAFETY: `dup` is the valid communicator just created; the handler is predefined.
    let rc = unsafe { ffi::MPI_Comm_set_errhandler(dup, ffi::ftkv_errors_return) };
    let comm = Comm::owned(dup, mpi.runtime())?;
    check(rc, "MPI_Comm_set_errhandler")?;
    Ok(comm)
}
