//! The transaction protocol's data (see [`crate::txn`]): ids, transactions, records and what
//! the coordinator and the backups decide. Its engines ([`crate::engine::txn::coordinator`],
//! [`crate::engine::txn::resolution`]) and its runtime ([`crate::txn`]) use them.

use serde::{Deserialize, Serialize};

use crate::key::Key;

/// A transaction's id, also the value of the lock words it holds: the coordinator's worker id
/// + 1 in the high half (0 means "free"), its sequence number in the low half.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TxId(pub u64);

impl TxId {
    pub fn new(coordinator: i32, seq: u32) -> TxId {
        TxId(((coordinator as u64 + 1) << 32) | seq as u64)
    }

    pub fn coordinator(self) -> i32 {
        ((self.0 >> 32) as i32) - 1
    }
}

/// The lock word of a free key.
pub const FREE: u64 = 0;

/// What a condition expects of a key when the transaction runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Expect {
    /// The key's newest version (0: never written).
    Version(u64),
    /// The key's value (`None`: deleted or never written).
    Value(Option<Vec<u8>>),
}

/// A transaction: keys to read, conditions that must all hold, and writes (`None` deletes).
/// [`crate::txn::run`] adds the writes its `update` computes from the values read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Txn {
    pub reads: Vec<Key>,
    pub conditions: Vec<(Key, Expect)>,
    pub writes: Vec<(Key, Option<Vec<u8>>)>,
}

impl Txn {
    /// Every key the transaction touches, sorted, once each (the locking order).
    pub fn keys(&self) -> Vec<Key> {
        let conditions = self.conditions.iter().map(|(k, _)| *k);
        let writes = self.writes.iter().map(|(k, _)| *k);
        let mut keys: Vec<Key> =
            self.reads.iter().copied().chain(conditions).chain(writes).collect();
        keys.sort_by_key(|k| (k.owner, k.kind));
        keys.dedup();
        keys
    }
}

/// The state of a transaction record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecordState {
    Locking,
    Committed,
    Done,
    Aborted,
}

/// A coordinator's transaction record: the decision its backups act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxRecord {
    pub id: TxId,
    pub state: RecordState,
    /// Every key the transaction locked.
    pub keys: Vec<Key>,
    /// Every write with its target version (empty while `Locking`).
    pub writes: Vec<(Key, u64, Option<Vec<u8>>)>,
}

/// How a transaction ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Applied on every key; the values read (in [`Txn::reads`] order) with their versions.
    Committed { reads: Vec<(Key, u64, Option<Vec<u8>>)> },
    /// Nothing written: this condition did not hold.
    Aborted { condition: Key },
}

/// The values a transaction read: key, version, value.
pub type Reads = [(Key, u64, Option<Vec<u8>>)];

/// What a backup's resolution of a failed coordinator decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// No transaction of the coordinator was open.
    Nothing,
    RolledForward(TxId),
    Aborted(TxId),
}

/// How a coordinator's own transaction ended, as its record decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Every write is applied.
    Committed,
    /// Nothing was written.
    Aborted,
}
