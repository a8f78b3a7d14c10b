//! [`Store::transaction`]: the protocol of [`crate::txn`] on the store's own slots. A key's
//! lock word is the last 8 bytes of each copy's fence block ([`LOCK_AT`]), changed by
//! compare-and-swap on every live holder; each worker's transaction record is its key of kind
//! [`TX_RECORD_KIND`], and the record's live holders are the worker's backup coordinators.

use std::time::Duration;

use super::Store;
use crate::config::{Recovery, TX_RECORD_KIND};
use crate::engine::layout::Copy;
use crate::error::{Error, Result};
use crate::fabric::{Fabric, FabricWindow};
use crate::key::Key;
use crate::slot::{Header, LOCK_AT};
use crate::txn::{self, Backend, Decision, Outcome, Reads, TxError, TxId, TxRecord, Txn};

/// How long a transaction waits before it tries a held lock again.
const LOCK_RETRY_PAUSE: Duration = Duration::from_micros(200);

/// What a worker's transactions leave in its store between calls.
#[derive(Debug, Default)]
pub(super) struct TxState {
    /// Transactions this worker started (the next one's sequence number − 1).
    started: u32,
    /// This worker's transaction whose call failed before it knew the outcome (its record
    /// decides it; [`Store::finish_transactions`] finishes it).
    open: Option<TxId>,
    /// Failed coordinators whose open transaction this worker resolved as their backup.
    resolved: Vec<i32>,
}

impl<F: Fabric> Store<F> {
    /// Runs `txn` atomically and isolated from other transactions: every key it names is
    /// locked on every live holder (in key order), read, its conditions checked, then every
    /// write of `txn` and of `update` (computed from the values read, for keys `txn` names) is
    /// recorded in this worker's transaction record on its holders before any key is written.
    ///
    /// Completion: `Ok(Outcome::Committed)` once every write is on every live holder of its
    /// key and the locks are released; `Ok(Outcome::Aborted)` when a condition did not hold
    /// (nothing written). Failure: if this worker dies, the first live holder of its record
    /// finishes the transaction (its writes land everywhere if the record said committed,
    /// nowhere otherwise) once it learns of the failure, at its next transaction,
    /// [`Store::follow`] or [`Store::resolve_transactions`]. [`Error::RecoveryNeeded`] from a
    /// localized store that had to fall back leaves the same decision to the record: after the
    /// global recovery, [`Store::finish_transactions`] finishes the transaction and reports it.
    ///
    /// Needs [`Config::with_transactions`](crate::Config::with_transactions) and localized
    /// recovery. Keys a transaction writes must not also be written by plain puts (their
    /// versions would not be ordered); reads outside transactions are not isolated from them.
    /// A global recovery frees every lock.
    ///
    /// # Example
    ///
    /// Worker 0 moves worker 1's value into its own key atomically, on the condition that
    /// worker 1's key still holds it:
    ///
    /// ```
    /// use ftkv::fabric::local::LocalCluster;
    /// use ftkv::txn::{Expect, Outcome, Txn};
    /// use ftkv::{Config, Key, Store};
    ///
    /// LocalCluster::new(4).run(|fabric| {
    ///     let config = Config::new(["work"], 2).localized().with_transactions();
    ///     let mut store = Store::create(&fabric, config).unwrap();
    ///     let (mine, theirs) = (Key::new(0, 0), Key::new(1, 0));
    ///     if store.worker() == 1 {
    ///         store.put(theirs, b"tasks").unwrap();
    ///     }
    ///     store.sync().unwrap();
    ///     if store.worker() == 0 {
    ///         let txn = Txn {
    ///             conditions: vec![(theirs, Expect::Value(Some(b"tasks".to_vec())))],
    ///             writes: vec![(mine, Some(b"tasks".to_vec())), (theirs, None)],
    ///             ..Txn::default()
    ///         };
    ///         let outcome = store.transaction(&txn, |_| Vec::new()).unwrap();
    ///         assert!(matches!(outcome, Outcome::Committed { .. }));
    ///         assert_eq!(store.get(theirs).unwrap(), None);
    ///         let again = store.transaction(&txn, |_| Vec::new()).unwrap();
    ///         assert!(matches!(again, Outcome::Aborted { .. }), "the condition no longer holds");
    ///     }
    /// });
    /// ```
    pub fn transaction(
        &mut self,
        txn: &Txn,
        update: impl FnOnce(&Reads) -> Vec<(Key, Option<Vec<u8>>)>,
    ) -> Result<Outcome> {
        let record_kind = self.transaction_record_kind()?;
        for key in txn.keys() {
            self.check_key(key)?;
        }
        self.tx.started += 1;
        let id = TxId::new(self.me, self.tx.started);
        let _span = tracing::info_span!("transaction", id = id.0).entered();
        let mut backend = StoreBackend { store: self, record_kind };
        match txn::run(&mut backend, id, txn, update) {
            Ok(outcome) => Ok(outcome),
            Err(TxError::Backend(e)) => {
                self.tx.open = Some(id);
                Err(e)
            }
            Err(TxError::Contended { key, attempts }) => {
                Err(Error::TransactionContended { key, attempts })
            }
            Err(TxError::UnlockedWrite { key }) => Err(Error::InvalidTransaction(format!(
                "the update wrote key {key}, which the transaction does not name"
            ))),
        }
    }

    /// Resolves the open transaction of every failed worker whose backup this worker is now
    /// (the first live holder of its record): rolls a committed one forward, aborts one that
    /// was still locking, releases its locks. Returns how many it resolved. Transactions do it
    /// before every lock attempt; a worker that runs none calls it (or [`Store::follow`]) after
    /// a failure so that others' transactions do not wait for it.
    pub fn resolve_transactions(&mut self) -> Result<usize> {
        let Ok(record_kind) = self.transaction_record_kind() else { return Ok(0) };
        self.follow()?;
        let before = self.tx.resolved.len();
        let mut backend = StoreBackend { store: self, record_kind };
        txn::resolve_duties(&mut backend)?;
        Ok(self.tx.resolved.len() - before)
    }

    /// After every [`Store::recover`] (global recovery frees every lock but applies no
    /// transaction): finishes the transactions the failures left half done whose decision
    /// this worker holds, and returns how this worker's transaction ended whose
    /// [`Store::transaction`] call failed with an error (`None`: no such transaction).
    ///
    /// It rolls forward or aborts, by their records, the open transactions of failed
    /// coordinators whose backup this worker is, and its own (a `Committed` record is applied
    /// everywhere, a `Locking` one aborted). Every survivor must call it before anyone reads
    /// keys that transactions write.
    ///
    /// Failure: a new failure returns [`Error::RecoveryNeeded`]; after the next recovery a new
    /// call finishes the same transactions (it is idempotent) and reports the same decision.
    /// [`Error::KeyLost`] when this worker's own record lost every copy (more failures than
    /// copies − 1): the decision is gone. A failed coordinator's lost record leaves nothing to
    /// finish.
    pub fn finish_transactions(&mut self) -> Result<Option<Decision>> {
        let Ok(record_kind) = self.transaction_record_kind() else { return Ok(None) };
        let open = self.tx.open;
        let mut backend = StoreBackend { store: self, record_kind };
        txn::resolve_duties(&mut backend)?;
        let decision = open.map(|id| txn::finish_own(&mut backend, id)).transpose()?;
        self.tx.open = None;
        Ok(decision)
    }

    /// The failed workers whose open transaction this worker resolved as their backup, in the
    /// order it did.
    pub fn resolved_coordinators(&self) -> &[i32] {
        &self.tx.resolved
    }

    /// The kind of the transaction records, when this store runs transactions.
    fn transaction_record_kind(&self) -> Result<u16> {
        if self.config.recovery != Recovery::Localized {
            return Err(Error::InvalidTransaction("transactions need localized recovery".into()));
        }
        let found = self.config.kinds.iter().position(|k| k == TX_RECORD_KIND);
        found.map(|k| k as u16).ok_or_else(|| {
            Error::InvalidTransaction(
                "the store was created without Config::with_transactions".into(),
            )
        })
    }

    /// One compare-and-swap pass over the live holders of `key` (see [`Backend::swap_lock`]).
    fn swap_lock_once(&self, key: Key, from: u64, to: u64) -> Result<Option<u64>> {
        self.ensure_healthy()?;
        let route = self.route(key)?;
        let mut swapped: Vec<&Copy> = Vec::new();
        for copy in route.iter().filter(|c| !self.health.is_failed(c.worker)) {
            let held = self.swap_lock_word(copy, from, to)?;
            if held == to {
                continue;
            }
            if held != from {
                for undo in swapped.iter().rev() {
                    self.swap_lock_word(undo, to, from)?;
                }
                return Ok(Some(held));
            }
            swapped.push(copy);
        }
        self.ensure_alive(route)?;
        Ok(None)
    }

    /// Frees `key`'s lock word on every live holder where it holds `id`.
    fn release_lock_once(&self, key: Key, id: u64) -> Result<()> {
        self.ensure_healthy()?;
        let route = self.route(key)?;
        for copy in route.iter().filter(|c| !self.health.is_failed(c.worker)) {
            self.swap_lock_word(copy, id, txn::FREE)?;
        }
        self.ensure_alive(route)
    }

    /// Compare-and-swap of the lock word of `copy`, bounded by the watchdog; the value it held.
    fn swap_lock_word(&self, copy: &Copy, from: u64, to: u64) -> Result<u64> {
        let window = self.windows()?.window();
        self.health.enter_call(8);
        let held = window.compare_and_swap(copy.rank, copy.disp + LOCK_AT as i64, from, to);
        self.health.leave_call();
        held.map_err(|e| self.failure(e))
    }

    /// Writes `value` (`None`: a deletion) at `version`, keeping this worker's own version
    /// counters above it.
    fn write_at(&mut self, key: Key, version: u64, value: Option<&[u8]>) -> Result<()> {
        let header = match value {
            Some(value) => {
                self.check_value(value)?;
                Header::for_value(value, version, self.epoch()?, self.me)
            }
            None => Header::for_delete(version, self.epoch()?, self.me),
        };
        self.write(key, header, value.unwrap_or(&[]))?;
        if key.owner == self.me {
            let kind = key.kind as usize;
            self.versions[kind] = self.versions[kind].max(version);
            self.acked.set(kind, self.acked.get(kind).max(version));
        } else if let Some(known) = self.handed.get_mut(&key) {
            *known = (*known).max(version);
        }
        Ok(())
    }

    /// The failed workers whose record's first live holder is this worker.
    fn backup_duties(&self, record_kind: u16) -> Vec<i32> {
        // Every failure known here: also those of a global recovery, which this rank may have
        // learned of only there (its detector, new since, has not seen them).
        let failed = self.failed();
        let first_live = |coordinator: i32| {
            let route = self.route(Key::new(coordinator, record_kind)).ok()?;
            route.iter().find(|c| !failed.contains(&c.worker)).map(|c| c.worker)
        };
        failed
            .iter()
            .copied()
            .filter(|c| *c != self.me && !self.tx.resolved.contains(c))
            .filter(|&c| first_live(c) == Some(self.me))
            .collect()
    }
}

/// The store as the transaction protocol's backend.
struct StoreBackend<'s, F: Fabric> {
    store: &'s mut Store<F>,
    record_kind: u16,
}

impl<F: Fabric> Backend for StoreBackend<'_, F> {
    type Error = Error;

    fn step(&mut self, name: &'static str) -> Result<()> {
        self.store.comm.failpoint(name);
        Ok(())
    }

    fn swap_lock(&mut self, key: Key, from: u64, to: u64) -> Result<Option<u64>> {
        self.store.localized(Some(key), |store| store.swap_lock_once(key, from, to))
    }

    fn release_lock(&mut self, key: Key, id: u64) -> Result<()> {
        self.store.localized(Some(key), |store| store.release_lock_once(key, id))
    }

    fn read(&mut self, key: Key) -> Result<(u64, Option<Vec<u8>>)> {
        self.store.read_versioned(key)
    }

    fn write(&mut self, key: Key, version: u64, value: Option<&[u8]>) -> Result<()> {
        self.store.write_at(key, version, value)
    }

    /// A failed coordinator's record that lost every copy reads as none: nothing is left to
    /// resolve (a global recovery, the only way past a lost key, freed its locks).
    fn read_record(&mut self, coordinator: i32) -> Result<Option<TxRecord>> {
        let key = Key::new(coordinator, self.record_kind);
        let value = match self.store.read_versioned(key) {
            Ok((_, value)) => value,
            Err(Error::KeyLost(_)) if coordinator != self.store.me => None,
            Err(e) => return Err(e),
        };
        Ok(value.as_deref().and_then(crate::codec::decode))
    }

    fn write_record(&mut self, coordinator: i32, record: &TxRecord) -> Result<()> {
        let key = Key::new(coordinator, self.record_kind);
        // Its own record only this worker writes while it lives: its counter is the newest
        // version. A backup writes a dead coordinator's record above the newest it reads.
        let version = if coordinator == self.store.me {
            self.store.next_own_version(key)
        } else {
            self.store.read_versioned(key)?.0 + 1
        };
        let bytes = crate::codec::encode(record);
        self.store.write_at(key, version, Some(&bytes))
    }

    fn backup_duties(&self) -> Vec<i32> {
        self.store.backup_duties(self.record_kind)
    }

    fn resolved(&mut self, coordinator: i32) {
        self.store.tx.resolved.push(coordinator);
    }

    fn wait(&mut self) -> Result<()> {
        crate::rt::sleep(LOCK_RETRY_PAUSE);
        self.store.follow()
    }
}
