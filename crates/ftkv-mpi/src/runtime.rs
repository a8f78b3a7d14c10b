//! MPI initialisation and finalisation.

use std::ffi::c_int;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::comm::Comm;
use crate::error::{check, MpiError, Result};
use crate::ffi;

static INITIALISED: AtomicBool = AtomicBool::new(false);

/// Keeps MPI initialised; shared by every handle so that `MPI_Finalize` runs after the last one.
#[derive(Debug)]
pub(crate) struct Runtime {
    finalized: AtomicBool,
}

impl Runtime {
    fn finalize(&self) -> Result<()> {
        if self.finalized.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        // SAFETY: MPI was initialised by `Mpi::init` and every handle that used it is gone (this
        // runs from the last `Arc<Runtime>` owner).
        check(unsafe { ffi::MPI_Finalize() }, "MPI_Finalize")
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Err(e) = self.finalize() {
            eprintln!("ftkv-mpi: {e}");
        }
    }
}

/// The MPI library, initialised once per process.
///
/// Dropping it (or calling [`Mpi::finalize`]) finalises MPI once no [`Comm`] or window derived
/// from it is alive.
#[derive(Debug)]
pub struct Mpi {
    runtime: Arc<Runtime>,
}

impl Mpi {
    /// Initialises MPI with `MPI_THREAD_MULTIPLE` and sets `MPI_ERRORS_RETURN` on
    /// `MPI_COMM_WORLD`. Fails if the library does not provide `MPI_THREAD_MULTIPLE`, if MPI was
    /// initialised before in this process, or if the `MPI_Status` layout of the linked Open MPI
    /// differs from the one this crate was written for.
    pub fn init() -> Result<Mpi> {
        if INITIALISED.swap(true, Ordering::SeqCst) {
            return Err(other("MPI_Init_thread", "MPI was already initialised in this process"));
        }
        check_abi()?;
        let mut provided: c_int = 0;
        // SAFETY: MPI permits NULL argc/argv; `provided` is a valid out-pointer.
        let rc = unsafe {
            ffi::MPI_Init_thread(
                ptr::null_mut(),
                ptr::null_mut(),
                ffi::ftkv_thread_multiple,
                &mut provided,
            )
        };
        check(rc, "MPI_Init_thread")?;
        let runtime = Arc::new(Runtime { finalized: AtomicBool::new(false) });
        // SAFETY: reading an immutable constant exported by the C shim.
        if provided != unsafe { ffi::ftkv_thread_multiple } {
            return Err(other("MPI_Init_thread", "MPI_THREAD_MULTIPLE is not provided"));
        }
        // SAFETY: MPI is initialised; both handles are valid predefined handles.
        let rc =
            unsafe { ffi::MPI_Comm_set_errhandler(ffi::ftkv_comm_world, ffi::ftkv_errors_return) };
        check(rc, "MPI_Comm_set_errhandler")?;
        Ok(Mpi { runtime })
    }

    /// `MPI_COMM_WORLD` (not freed when dropped).
    pub fn world(&self) -> Result<Comm> {
        // SAFETY: reading an immutable handle exported by the C shim.
        Comm::predefined(unsafe { ffi::ftkv_comm_world }, self.runtime.clone())
    }

    /// Like [`Mpi::finalize`], but leaves the process with exit code 0 if `MPI_Finalize` has not
    /// returned after `bound`: after process failures Open MPI's ULFM finalisation (an internal
    /// shrink and agreement) sometimes never returns, although every survivor called it. Call
    /// it when all results are out.
    pub fn finalize_bounded(self, bound: std::time::Duration) -> Result<()> {
        let _bounded = crate::failpoint::exit_unless_done(bound, move || {
            eprintln!("ftkv-mpi: MPI_Finalize has not returned after {bound:?}; exiting")
        });
        self.finalize()
    }

    /// Finalises MPI now and reports its return code. Fails without finalising if a [`Comm`] or
    /// window created from this runtime is still alive.
    pub fn finalize(self) -> Result<()> {
        if Arc::strong_count(&self.runtime) > 1 {
            return Err(other("MPI_Finalize", "communicators or windows are still alive"));
        }
        self.runtime.finalize()
    }
}

/// `MPI_Wtime`: seconds since an arbitrary point in the past.
pub fn wtime() -> f64 {
    // SAFETY: MPI_Wtime has no preconditions in Open MPI (it reads a clock).
    unsafe { ffi::MPI_Wtime() }
}

fn check_abi() -> Result<()> {
    // SAFETY: reading immutable constants exported by the C shim.
    let (size, source, tag, error, aint) = unsafe {
        (
            ffi::ftkv_status_size,
            ffi::ftkv_status_source_offset,
            ffi::ftkv_status_tag_offset,
            ffi::ftkv_status_error_offset,
            ffi::ftkv_aint_size,
        )
    };
    let ours = (
        std::mem::size_of::<ffi::MPI_Status>(),
        std::mem::offset_of!(ffi::MPI_Status, source),
        std::mem::offset_of!(ffi::MPI_Status, tag),
        std::mem::offset_of!(ffi::MPI_Status, error),
        std::mem::size_of::<ffi::MPI_Aint>(),
    );
    if ours != (size, source, tag, error, aint) {
        return Err(other("ABI check", "MPI_Status or MPI_Aint layout differs from mpi.h"));
    }
    Ok(())
}

pub(crate) fn other(op: &'static str, msg: &str) -> MpiError {
    MpiError::Other { op, class: -1, msg: msg.to_owned() }
}

#[cfg(test)]
mod tests {
    #[test]
    fn status_layout_matches_mpi_h() {
        super::check_abi().expect("MPI_Status layout");
    }
}
