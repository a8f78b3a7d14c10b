//! The store's errors.

use crate::fabric::FabricError;
use crate::key::Key;

pub type Result<T> = std::result::Result<T, Error>;

/// Everything a store call can fail with. Input errors ([`UnknownKind`](Error::UnknownKind),
/// [`ValueTooLarge`](Error::ValueTooLarge), [`ForeignOwner`](Error::ForeignOwner),
/// [`UnknownOwner`](Error::UnknownOwner)) change nothing anywhere. Failure errors
/// ([`RecoveryNeeded`](Error::RecoveryNeeded)) mean: the operation may or may not have reached
/// its holders; call [`Store::recover`](crate::Store::recover) on every survivor, then retry.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown key kind {0:?}")]
    UnknownKind(String),
    #[error("kind index {0} is not configured")]
    UnknownKindIndex(u16),
    #[error("owner {0} is not a worker of this store")]
    UnknownOwner(i32),
    #[error("value of {len} bytes exceeds the maximum of {max} bytes")]
    ValueTooLarge { len: usize, max: usize },
    #[error("the value given is {given} bytes long, the asynchronous put's was {expected}")]
    ValueMismatch { expected: usize, given: usize },
    #[error("the asynchronous put of key {key} is not this store's pending one: a later write completed it")]
    NotPending { key: Key },
    #[error("key {key} belongs to worker {}, not to this worker {me}; use put_handed for a key handed to it", key.owner)]
    ForeignOwner { key: Key, me: i32 },
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    #[error(
        "configuration rejected: it differs from rank 0's or is invalid on ranks {ranks:?} \
         (their own error says which)"
    )]
    ConfigMismatch { ranks: Vec<i32> },
    #[error(
        "windows of {per_rank} bytes on each of this host's {ranks} ranks exceed its {capacity} \
         bytes of shared memory (lower initial_capacity, kinds, copies or spares)"
    )]
    WindowTooLarge { per_rank: usize, ranks: usize, capacity: u64 },
    #[error("the store is closed")]
    Closed,
    #[error("workers {failed:?} failed: call recover() on every survivor")]
    RecoveryNeeded { failed: Vec<i32> },
    #[error(
        "this worker's side {live:?} holds no majority of the workers {previous:?} that were \
         live across hosts: the others may be cut off rather than dead, so this side leaves the \
         store to them"
    )]
    /// A recovery found this side without a majority of the last live set across hosts; the
    /// store is closed on this side.
    Partitioned { live: Vec<i32>, previous: Vec<i32> },
    /// A recovery ended on an error that is not a process failure; the store is closed.
    #[error("recovery failed: {0}")]
    RecoveryFailed(String),
    #[error("every copy of key {0} was lost")]
    KeyLost(Key),
    #[error("key {key} stayed locked by other transactions for {attempts} attempts")]
    TransactionContended { key: Key, attempts: usize },
    #[error("invalid transaction: {0}")]
    InvalidTransaction(String),
    /// A fabric call failed. The fabric's error is part of this one's text and not its
    /// [`source`](std::error::Error::source), so a chain printed with `{:#}` says it once.
    #[error("fabric: {0}")]
    Fabric(FabricError),
}

impl From<FabricError> for Error {
    fn from(e: FabricError) -> Error {
        Error::Fabric(e)
    }
}

impl Error {
    /// Whether the error reports a process failure (recover, then retry) rather than bad input.
    pub fn needs_recovery(&self) -> bool {
        matches!(self, Error::RecoveryNeeded { .. })
            || matches!(self, Error::Fabric(e) if e.is_failure())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `: `-separated parts of `text` that occur more than once.
    fn repeated_segments(text: &str) -> Vec<&str> {
        let segments: Vec<&str> = text.split(": ").collect();
        let repeated = |s: &&str| segments.iter().filter(|t| *t == s).count() > 1;
        segments.iter().copied().filter(repeated).collect()
    }

    #[test]
    fn a_fabric_error_is_said_once_alone_and_in_a_chain() {
        let revoked = || Error::from(FabricError::Revoked { op: "put" });
        let alone = revoked().to_string();
        let chain = format!("{:#}", anyhow::Error::from(revoked()).context("writing a checkpoint"));
        assert_eq!(alone, "fabric: put: the communicator was revoked");
        assert_eq!(chain, "writing a checkpoint: fabric: put: the communicator was revoked");
        assert_eq!(repeated_segments(&chain), Vec::<&str>::new(), "{chain}");
    }
}
