//! Nonblocking point-to-point requests that own their buffers.
//!
//! A request that is dropped before it completed is cancelled and freed; its buffer is then
//! leaked on purpose, because MPI may still write into (or read from) it.

use std::ffi::c_int;
use std::time::{Duration, Instant};

use crate::error::{check, other, MpiError, Result};
use crate::ffi;

/// Polls `MPI_Test` until `done` reports completion or `deadline` passes. Yields the core between
/// polls (sleeping after a while), so that ranks that outnumber cores still make progress.
fn poll_until(
    mut test: impl FnMut() -> Result<bool>,
    deadline: Instant,
    timeout: Duration,
    op: &'static str,
) -> Result<()> {
    let mut polls: u32 = 0;
    loop {
        if test()? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(MpiError::Timeout { op, after: timeout });
        }
        polls += 1;
        if polls < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

fn test_raw(raw: &mut ffi::MPI_Request, op: &'static str) -> Result<Option<ffi::MPI_Status>> {
    let mut flag: c_int = 0;
    let mut status = ffi::MPI_Status::default();
    // SAFETY: `raw` is an active request or MPI_REQUEST_NULL; out-pointers are valid.
    check(unsafe { ffi::MPI_Test(raw, &mut flag, &mut status) }, op)?;
    Ok((flag != 0).then_some(status))
}

fn is_null(raw: ffi::MPI_Request) -> bool {
    // SAFETY: reading an immutable handle exported by the C shim.
    raw == unsafe { ffi::ftkv_request_null }
}

/// Cancels and frees a request that has not completed; returns whether MPI still may touch
/// the request's buffer.
fn abandon(raw: &mut ffi::MPI_Request) -> bool {
    if is_null(*raw) {
        return false;
    }
    // SAFETY: `raw` is an active request owned by the caller.
    let cancel = check(unsafe { ffi::MPI_Cancel(raw) }, "MPI_Cancel");
    // SAFETY: as above; MPI_Request_free sets it to MPI_REQUEST_NULL.
    let free = check(unsafe { ffi::MPI_Request_free(raw) }, "MPI_Request_free");
    for e in [cancel.err(), free.err()].into_iter().flatten() {
        tracing::warn!("ftkv-mpi: abandoning a request: {e}");
    }
    true
}

/// A nonblocking send (`MPI_Isend`/`MPI_Issend`) that owns the data it sends.
#[derive(Debug)]
pub struct SendRequest {
    raw: ffi::MPI_Request,
    buf: Option<Vec<u8>>,
    dest: i32,
}

// SAFETY: the request handle and buffer are owned by this value; MPI_THREAD_MULTIPLE permits
// completing a request on another thread than the one that started it.
unsafe impl Send for SendRequest {}

impl SendRequest {
    pub(crate) fn start(
        comm: ffi::MPI_Comm,
        data: Vec<u8>,
        dest: i32,
        tag: i32,
        synchronous: bool,
    ) -> Result<SendRequest> {
        let count = byte_count(data.len(), "MPI_Isend")?;
        // SAFETY: reading an immutable handle exported by the C shim.
        let mut raw = unsafe { ffi::ftkv_request_null };
        let start = if synchronous { ffi::MPI_Issend } else { ffi::MPI_Isend };
        // SAFETY: `data` is moved into the returned request, so it stays valid and unmodified
        // until the request completes or is abandoned (then it is leaked).
        let rc = unsafe {
            start(data.as_ptr().cast(), count, ffi::ftkv_type_byte, dest, tag, comm, &mut raw)
        };
        check(rc, "MPI_Isend").map_err(|e| e.with_peer(dest))?;
        Ok(SendRequest { raw, buf: Some(data), dest })
    }

    /// `MPI_Test`: whether the send completed. Errors (e.g. `ProcFailed`) complete the request.
    pub fn test(&mut self) -> Result<bool> {
        let done = test_raw(&mut self.raw, "MPI_Test(send)").map_err(|e| e.with_peer(self.dest));
        Ok(done?.is_some())
    }

    /// Waits for completion until `deadline`; `Timeout { after: timeout }` if it passes.
    pub fn wait_until(mut self, deadline: Instant, timeout: Duration) -> Result<()> {
        poll_until(|| self.test(), deadline, timeout, "MPI_Isend")
    }
}

impl Drop for SendRequest {
    fn drop(&mut self) {
        if abandon(&mut self.raw) {
            std::mem::forget(self.buf.take());
        }
    }
}

/// A nonblocking receive (`MPI_Irecv`) into a buffer it owns.
#[derive(Debug)]
pub struct RecvRequest {
    raw: ffi::MPI_Request,
    buf: Option<Vec<u8>>,
    source: i32,
}

// SAFETY: as for SendRequest.
unsafe impl Send for RecvRequest {}

impl RecvRequest {
    pub(crate) fn start(
        comm: ffi::MPI_Comm,
        capacity: usize,
        source: i32,
        tag: i32,
    ) -> Result<RecvRequest> {
        let count = byte_count(capacity, "MPI_Irecv")?;
        let mut buf = vec![0u8; capacity];
        // SAFETY: reading an immutable handle exported by the C shim.
        let mut raw = unsafe { ffi::ftkv_request_null };
        // SAFETY: `buf` is moved into the returned request and neither read nor freed before
        // the request completes or is abandoned (then it is leaked).
        let rc = unsafe {
            ffi::MPI_Irecv(
                buf.as_mut_ptr().cast(),
                count,
                ffi::ftkv_type_byte,
                source,
                tag,
                comm,
                &mut raw,
            )
        };
        check(rc, "MPI_Irecv").map_err(|e| e.with_peer(source))?;
        Ok(RecvRequest { raw, buf: Some(buf), source })
    }

    /// `MPI_Test`: the status once the message arrived.
    pub fn test(&mut self) -> Result<Option<Status>> {
        let done = test_raw(&mut self.raw, "MPI_Test(recv)").map_err(|e| e.with_peer(self.source));
        done?.map(|status| status_from(&status)).transpose()
    }

    /// Waits until `deadline` and returns the received bytes (truncated to the message length)
    /// with the status. `ProcFailed` when the source died, `Timeout` when the deadline passed.
    pub fn wait_until(mut self, deadline: Instant, timeout: Duration) -> Result<(Vec<u8>, Status)> {
        let mut received = None;
        poll_until(
            || {
                received = self.test()?;
                Ok(received.is_some())
            },
            deadline,
            timeout,
            "MPI_Irecv",
        )?;
        let status = received.expect("poll_until returned Ok only after completion");
        let mut buf = self.buf.take().unwrap_or_default();
        buf.truncate(status.len);
        Ok((buf, status))
    }
}

impl Drop for RecvRequest {
    fn drop(&mut self) {
        if abandon(&mut self.raw) {
            std::mem::forget(self.buf.take());
        }
    }
}

/// What a completed receive or a probe reports: sender, tag and payload length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub source: i32,
    pub tag: i32,
    pub len: usize,
}

pub(crate) fn byte_count(len: usize, op: &'static str) -> Result<c_int> {
    c_int::try_from(len).map_err(|_| other(op, "buffer longer than 2^31 - 1 elements"))
}

pub(crate) fn status_from(status: &ffi::MPI_Status) -> Result<Status> {
    let mut count: c_int = 0;
    // SAFETY: `status` was filled by MPI; `count` a valid out-pointer.
    let rc = unsafe { ffi::MPI_Get_count(status, ffi::ftkv_type_byte, &mut count) };
    check(rc, "MPI_Get_count")?;
    Ok(Status { source: status.source, tag: status.tag, len: count.max(0) as usize })
}
