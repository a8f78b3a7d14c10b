//! Transactions from C: a `ftkv_txn` names reads, conditions on a key's version or value, and
//! writes and deletes of any keys; `ftkv_transaction` runs it atomically and isolated from
//! other transactions; after a failure the coordinator's backups finish it.

use std::ffi::{c_int, c_void};

use ftkv::txn::{Decision, Expect, Outcome, Txn};
use ftkv::Key;

use crate::{
    bytes, copy_out, ftkv_status, ftkv_store, guarded, invalid, put_out, store_mut, Failure,
};
use ftkv_status::*;

/// A transaction being built, and once run, how it ended (opaque).
pub struct ftkv_txn {
    txn: Txn,
    outcome: Option<Outcome>,
}

/// How `ftkv_transaction` ended.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ftkv_txn_outcome {
    /// Every write is on every live holder of its key.
    FTKV_TXN_COMMITTED = 0,
    /// A condition did not hold: nothing was written (`ftkv_txn_aborted_on` names the key).
    FTKV_TXN_ABORTED = 1,
}

/// What `ftkv_finish_transactions` found of this worker's interrupted transaction.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ftkv_txn_decision {
    /// No transaction of this worker was interrupted.
    FTKV_TXN_NONE = 0,
    /// The interrupted transaction committed: every write is applied.
    FTKV_TXN_DECIDED_COMMIT = 1,
    /// The interrupted transaction aborted: nothing of it was written.
    FTKV_TXN_DECIDED_ABORT = 2,
}

/// A new, empty transaction. Completion: never NULL; free it with `ftkv_txn_free`.
#[no_mangle]
pub extern "C" fn ftkv_txn_new() -> *mut ftkv_txn {
    ftkv_mpi::c_abi::into_handle(ftkv_txn { txn: Txn::default(), outcome: None })
}

/// Frees `txn`. NULL is a no-op.
///
/// # Safety
/// `txn` is NULL or a live transaction from `ftkv_txn_new`, freed once.
#[no_mangle]
pub unsafe extern "C" fn ftkv_txn_free(txn: *mut ftkv_txn) {
    // SAFETY: the caller's contract (above).
    drop(unsafe { ftkv_mpi::c_abi::take_handle(txn) });
}

/// The transaction behind `txn`, or an argument error for NULL.
///
/// # Safety
/// `txn` is NULL or a live transaction used by one thread at a time.
unsafe fn txn_mut<'a>(txn: *mut ftkv_txn) -> Result<&'a mut ftkv_txn, Failure> {
    // SAFETY: the caller's contract (above).
    unsafe { ftkv_mpi::c_abi::handle_mut(txn) }.ok_or_else(|| invalid("the transaction is NULL"))
}

/// The transaction behind `txn`, or an argument error for NULL.
///
/// # Safety
/// As [`txn_mut`].
unsafe fn txn_ref<'a>(txn: *const ftkv_txn) -> Result<&'a ftkv_txn, Failure> {
    // SAFETY: the caller's contract (above).
    unsafe { ftkv_mpi::c_abi::handle_ref(txn) }.ok_or_else(|| invalid("the transaction is NULL"))
}

/// Adds `change` to `txn`, which must not have run yet.
///
/// # Safety
/// As [`txn_mut`].
unsafe fn extend(
    txn: *mut ftkv_txn,
    change: impl FnOnce(&mut Txn),
) -> Result<ftkv_status, Failure> {
    // SAFETY: the caller's contract (above).
    let txn = unsafe { txn_mut(txn) }?;
    if txn.outcome.is_some() {
        return Err(invalid("the transaction has run; build a new one"));
    }
    change(&mut txn.txn);
    Ok(FTKV_OK)
}

/// Adds `change`, given a copy of the `len` bytes at `data`, to `txn`.
///
/// # Safety
/// As [`txn_mut`]; `data` has `len` readable bytes.
unsafe fn extend_copied(
    txn: *mut ftkv_txn,
    data: *const c_void,
    len: usize,
    change: impl FnOnce(&mut Txn, Vec<u8>),
) -> Result<ftkv_status, Failure> {
    // SAFETY: the caller's contract (above).
    let value = unsafe { bytes(data, len) }?.to_vec();
    // SAFETY: the caller's contract (above).
    unsafe { extend(txn, |t| change(t, value)) }
}

/// Adds a read of key (`owner`, `kind`): once the transaction committed, `ftkv_txn_result`
/// gives its value and version as they were under the transaction's locks. Completion:
/// `FTKV_OK`; the key is checked when the transaction runs.
///
/// # Safety
/// `txn` is NULL or a live transaction used by one thread at a time.
#[no_mangle]
pub unsafe extern "C" fn ftkv_txn_read(txn: *mut ftkv_txn, owner: c_int, kind: u16) -> ftkv_status {
    // SAFETY: the caller's contract (above).
    guarded(|| unsafe { extend(txn, |t| t.reads.push(Key::new(owner, kind))) })
}

/// Adds a condition: key (`owner`, `kind`) is at `version` (0: never written) when the
/// transaction runs, else it aborts. Completion as `ftkv_txn_read`.
///
/// # Safety
/// As `ftkv_txn_read`.
#[no_mangle]
pub unsafe extern "C" fn ftkv_txn_expect_version(
    txn: *mut ftkv_txn,
    owner: c_int,
    kind: u16,
    version: u64,
) -> ftkv_status {
    let condition = (Key::new(owner, kind), Expect::Version(version));
    // SAFETY: the caller's contract (above).
    guarded(|| unsafe { extend(txn, |t| t.conditions.push(condition)) })
}

/// Adds a condition: key (`owner`, `kind`) holds the `len` bytes at `data` when the
/// transaction runs, else it aborts. The bytes are copied. Completion as `ftkv_txn_read`;
/// `FTKV_INVALID_ARGUMENT` for NULL `data` with `len` > 0.
///
/// # Safety
/// As `ftkv_txn_read`; `data` has `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn ftkv_txn_expect_value(
    txn: *mut ftkv_txn,
    owner: c_int,
    kind: u16,
    data: *const c_void,
    len: usize,
) -> ftkv_status {
    let key = Key::new(owner, kind);
    // SAFETY: the caller's contract (above).
    guarded(|| unsafe {
        extend_copied(txn, data, len, |t, value| {
            t.conditions.push((key, Expect::Value(Some(value))))
        })
    })
}

/// Adds a condition: key (`owner`, `kind`) holds no value (never written, or deleted) when the
/// transaction runs, else it aborts. Completion as `ftkv_txn_read`.
///
/// # Safety
/// As `ftkv_txn_read`.
#[no_mangle]
pub unsafe extern "C" fn ftkv_txn_expect_absent(
    txn: *mut ftkv_txn,
    owner: c_int,
    kind: u16,
) -> ftkv_status {
    let condition = (Key::new(owner, kind), Expect::Value(None));
    // SAFETY: the caller's contract (above).
    guarded(|| unsafe { extend(txn, |t| t.conditions.push(condition)) })
}

/// Adds a write of the `len` bytes at `data` (copied) to key (`owner`, `kind`), any worker's.
/// A key that transactions write must not also be written by plain puts. Completion as
/// `ftkv_txn_expect_value`.
///
/// # Safety
/// As `ftkv_txn_expect_value`.
#[no_mangle]
pub unsafe extern "C" fn ftkv_txn_write(
    txn: *mut ftkv_txn,
    owner: c_int,
    kind: u16,
    data: *const c_void,
    len: usize,
) -> ftkv_status {
    let key = Key::new(owner, kind);
    // SAFETY: the caller's contract (above).
    guarded(|| unsafe {
        extend_copied(txn, data, len, |t, value| t.writes.push((key, Some(value))))
    })
}

/// Adds a delete of key (`owner`, `kind`). Completion as `ftkv_txn_read`.
///
/// # Safety
/// As `ftkv_txn_read`.
#[no_mangle]
pub unsafe extern "C" fn ftkv_txn_delete(
    txn: *mut ftkv_txn,
    owner: c_int,
    kind: u16,
) -> ftkv_status {
    // SAFETY: the caller's contract (above).
    guarded(|| unsafe { extend(txn, |t| t.writes.push((Key::new(owner, kind), None))) })
}

/// Runs `txn` as this worker's next transaction: every key it names is locked on every live
/// holder, read, its conditions checked, its writes recorded in this worker's transaction
/// record on the record's holders, then written, then unlocked. Needs a store opened with
/// `transactions` and localized recovery. A transaction runs once. Refused while an
/// asynchronous put is pending, and for writes of kinds that are not the program's.
///
/// Completion: `FTKV_OK` with `*outcome` `FTKV_TXN_COMMITTED` (every write on every live holder
/// of its key, the locks released; `ftkv_txn_result` gives the reads) or `FTKV_TXN_ABORTED`
/// (a condition did not hold, nothing written). Failure: `FTKV_CONTENDED` when a key stayed
/// locked for the whole bound (nothing written); `FTKV_INVALID_ARGUMENT` for an unknown key
/// or a store without transactions; `FTKV_RECOVERY_NEEDED` when the store fell back to global
/// recovery meanwhile: after `ftkv_recover`, `ftkv_finish_transactions` says whether it
/// committed. If this worker dies instead, the first live holder of its record finishes the
/// transaction: its writes land everywhere if the record said committed, nowhere otherwise.
///
/// # Safety
/// `store` and `txn` are NULL or live handles used by one thread at a time; `outcome` is NULL
/// or writable.
#[no_mangle]
pub unsafe extern "C" fn ftkv_transaction(
    store: *mut ftkv_store,
    txn: *mut ftkv_txn,
    outcome: *mut ftkv_txn_outcome,
) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let (handle, txn) = unsafe { (store_mut(store)?, txn_mut(txn)?) };
        if outcome.is_null() {
            return Err(invalid("the outcome pointer is NULL"));
        }
        if txn.outcome.is_some() {
            return Err(invalid("the transaction has run; build a new one"));
        }
        handle.ensure_nothing_pending()?;
        for (key, _) in &txn.txn.writes {
            handle.check_writable(key.kind)?;
        }
        let ended = handle.store.transaction(&txn.txn, |_| Vec::new())?;
        let result = match ended {
            Outcome::Committed { .. } => {
                handle.counters.transactions_committed += 1;
                ftkv_txn_outcome::FTKV_TXN_COMMITTED
            }
            Outcome::Aborted { .. } => {
                handle.counters.transactions_aborted += 1;
                ftkv_txn_outcome::FTKV_TXN_ABORTED
            }
        };
        txn.outcome = Some(ended);
        // SAFETY: the caller's contract (above).
        unsafe { put_out(outcome, result) }?;
        Ok(FTKV_OK)
    })
}

/// The `index`-th read (in the order `ftkv_txn_read` added them) of a committed transaction:
/// its value into `buf` (room for `cap` bytes), its length into `*len`, and its version into
/// `*version` unless `version` is NULL.
///
/// Completion: `FTKV_OK`; `FTKV_NOT_FOUND` (`*len` = 0) when the key held no value;
/// `FTKV_BUFFER_TOO_SMALL` with `*len` the length needed (nothing copied). Failure:
/// `FTKV_INVALID_ARGUMENT` when the transaction did not commit or has no such read.
///
/// # Safety
/// `txn` is NULL or a live transaction; `buf` has room for `cap` bytes; `len` and `version`
/// are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ftkv_txn_result(
    txn: *const ftkv_txn,
    index: usize,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
    version: *mut u64,
) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let txn = unsafe { txn_ref(txn) }?;
        let Some(Outcome::Committed { reads }) = &txn.outcome else {
            return Err(invalid("the transaction did not commit"));
        };
        let (_, read_version, value) =
            reads.get(index).ok_or_else(|| invalid("the transaction has no read of that index"))?;
        if !version.is_null() {
            // SAFETY: the caller's contract (above); not NULL.
            unsafe { put_out(version, *read_version) }?;
        }
        // SAFETY: the caller's contract (above).
        unsafe { copy_out(value.as_deref(), buf, cap, len) }
    })
}

/// The key whose condition did not hold in an aborted transaction.
///
/// Completion: `FTKV_OK` with `*owner` and `*kind` set. Failure: `FTKV_INVALID_ARGUMENT` when
/// the transaction did not abort.
///
/// # Safety
/// `txn` is NULL or a live transaction; `owner` and `kind` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ftkv_txn_aborted_on(
    txn: *const ftkv_txn,
    owner: *mut c_int,
    kind: *mut u16,
) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let txn = unsafe { txn_ref(txn) }?;
        let Some(Outcome::Aborted { condition }) = &txn.outcome else {
            return Err(invalid("the transaction did not abort"));
        };
        // SAFETY: the caller's contract (above).
        unsafe { put_out(owner, condition.owner).and_then(|()| put_out(kind, condition.kind)) }?;
        Ok(FTKV_OK)
    })
}

/// Resolves the open transactions of failed coordinators whose backup this worker is now:
/// rolls a committed one forward, aborts one that was still locking, releases its locks, and
/// sets `*resolved` (unless NULL) to how many. Transactions do it before every lock attempt;
/// a worker that runs none calls it after a failure so that others' transactions do not wait
/// for it. Refused while an asynchronous put is pending.
///
/// Completion: `FTKV_OK`. Failure: `FTKV_RECOVERY_NEEDED` when the store fell back to global
/// recovery.
///
/// # Safety
/// `store` is NULL or a live handle used by one thread at a time; `resolved` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn ftkv_resolve_transactions(
    store: *mut ftkv_store,
    resolved: *mut usize,
) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let handle = unsafe { store_mut(store) }?;
        handle.ensure_nothing_pending()?;
        let count = handle.store.resolve_transactions()?;
        if !resolved.is_null() {
            // SAFETY: the caller's contract (above); not NULL.
            unsafe { put_out(resolved, count) }?;
        }
        Ok(FTKV_OK)
    })
}

/// After every `ftkv_recover` of a store with transactions: finishes the transactions that
/// failures left half done whose decision this worker holds, and sets `*decision` to how this
/// worker's own transaction ended whose `ftkv_transaction` returned `FTKV_RECOVERY_NEEDED`.
/// Every survivor calls it before anyone reads keys that transactions write.
///
/// Completion: `FTKV_OK`. Failure: `FTKV_RECOVERY_NEEDED` after a new failure (recover, then
/// call again: it is idempotent and reports the same decision); `FTKV_KEY_LOST` when this
/// worker's own record lost every copy (the decision is gone).
///
/// # Safety
/// `store` is NULL or a live handle used by one thread at a time; `decision` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn ftkv_finish_transactions(
    store: *mut ftkv_store,
    decision: *mut ftkv_txn_decision,
) -> ftkv_status {
    guarded(|| {
        // SAFETY: the caller's contract (above).
        let handle = unsafe { store_mut(store) }?;
        if decision.is_null() {
            return Err(invalid("the decision pointer is NULL"));
        }
        handle.ensure_nothing_pending()?;
        let decided = match handle.store.finish_transactions()? {
            None => ftkv_txn_decision::FTKV_TXN_NONE,
            Some(Decision::Committed) => ftkv_txn_decision::FTKV_TXN_DECIDED_COMMIT,
            Some(Decision::Aborted) => ftkv_txn_decision::FTKV_TXN_DECIDED_ABORT,
        };
        // SAFETY: the caller's contract (above).
        unsafe { put_out(decision, decided) }?;
        Ok(FTKV_OK)
    })
}
