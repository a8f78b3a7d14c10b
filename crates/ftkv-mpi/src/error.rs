//! MPI return codes as typed errors.

use std::ffi::{c_char, c_int};
use std::time::Duration;

use crate::ffi;

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, MpiError>;

/// An MPI call that did not succeed. `op` names the MPI function (or the wrapper's operation).
///
/// [`ProcFailed`](MpiError::ProcFailed) and [`Revoked`](MpiError::Revoked) are the ULFM failure
/// notifications: the communicator (or window) is still usable for recovery (revoke, shrink,
/// agree). [`Timeout`](MpiError::Timeout) comes from this crate's deadlines, never from MPI.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MpiError {
    /// A process involved in the operation has failed (`MPIX_ERR_PROC_FAILED` or `..._PENDING`).
    #[error("{op}: a peer process failed{}", peer.map(|p| format!(" (rank {p})")).unwrap_or_default())]
    ProcFailed { op: &'static str, peer: Option<i32> },
    /// The communicator was revoked by some member (`MPIX_ERR_REVOKED`).
    #[error("{op}: the communicator was revoked")]
    Revoked { op: &'static str },
    /// The operation did not complete before its deadline.
    #[error("{op}: no completion within {after:?}")]
    Timeout { op: &'static str, after: Duration },
    /// Any other MPI error class, with MPI's own message.
    #[error("{op}: MPI error class {class}: {msg}")]
    Other { op: &'static str, class: i32, msg: String },
}

impl MpiError {
    /// True for the errors that mean "a process failed" (directly or via revocation): the caller
    /// should start recovery rather than retry.
    pub fn is_failure(&self) -> bool {
        matches!(self, MpiError::ProcFailed { .. } | MpiError::Revoked { .. })
    }

    /// The same error attributed to a known peer rank.
    pub fn with_peer(self, rank: i32) -> Self {
        match self {
            MpiError::ProcFailed { op, .. } => MpiError::ProcFailed { op, peer: Some(rank) },
            other => other,
        }
    }

    /// A short, stable name of the error kind: `proc_failed`, `revoked`, `timeout` or
    /// `error:<class>`.
    pub fn kind_name(&self) -> String {
        match self {
            MpiError::ProcFailed { .. } => "proc_failed".into(),
            MpiError::Revoked { .. } => "revoked".into(),
            MpiError::Timeout { .. } => "timeout".into(),
            MpiError::Other { class, .. } => format!("error:{class}"),
        }
    }
}

/// Turns an MPI return code into `Ok(())` or the matching [`MpiError`].
pub(crate) fn check(code: c_int, op: &'static str) -> Result<()> {
    // SAFETY: reading immutable constants exported by the C shim.
    if code == unsafe { ffi::ftkv_success } {
        return Ok(());
    }
    Err(error_from_code(code, op))
}

fn error_from_code(code: c_int, op: &'static str) -> MpiError {
    let class = error_class(code);
    // SAFETY: reading immutable constants exported by the C shim.
    let (failed, pending, revoked) = unsafe {
        (ffi::ftkv_err_proc_failed, ffi::ftkv_err_proc_failed_pending, ffi::ftkv_err_revoked)
    };
    if class == failed || class == pending {
        MpiError::ProcFailed { op, peer: None }
    } else if class == revoked {
        MpiError::Revoked { op }
    } else {
        MpiError::Other { op, class, msg: error_string(code) }
    }
}

fn error_class(code: c_int) -> c_int {
    let mut class: c_int = code;
    // SAFETY: `class` is a valid out-pointer for the duration of the call.
    let rc = unsafe { ffi::MPI_Error_class(code, &mut class) };
    // SAFETY: reading an immutable constant exported by the C shim.
    if rc != unsafe { ffi::ftkv_success } {
        return code;
    }
    class
}

fn error_string(code: c_int) -> String {
    // SAFETY: reading an immutable constant exported by the C shim.
    let capacity = unsafe { ffi::ftkv_max_error_string } as usize;
    let mut buf = vec![0 as c_char; capacity + 1];
    let mut len: c_int = 0;
    // SAFETY: `buf` holds MPI_MAX_ERROR_STRING + 1 characters, as MPI_Error_string requires.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr(), &mut len) };
    // SAFETY: reading an immutable constant exported by the C shim.
    if rc != unsafe { ffi::ftkv_success } {
        return format!("MPI error code {code} (no message available)");
    }
    let bytes: Vec<u8> = buf[..len.max(0) as usize].iter().map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// An error of `op` that is not an MPI return code (a size MPI cannot take, a state ftkv
/// refuses), with `msg` saying why.
pub(crate) fn other(op: &'static str, msg: &str) -> MpiError {
    MpiError::Other { op, class: -1, msg: msg.to_owned() }
}
