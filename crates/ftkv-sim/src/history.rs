//! The history oracle every failure test of the store judges by: the in-process scenarios, the
//! recovery simulator ([`crate::recovery`]) and the real-MPI chaos campaign (`ftkv chaos`).
//!
//! A key's history is the writes its owner tried, in order, each marked acknowledged or not.
//! After failures a read of the key may return the last acknowledged write or any write tried
//! after it (in flight when something died), never an older one, never a torn value; a key
//! whose last acknowledged write was a delete, or that was never acknowledged, may also be
//! absent. Test values describe themselves ([`value`], [`check_value`]), so a torn or foreign
//! value is recognised whatever its size.

/// One write a worker tried: its sequence number, whether it deletes, whether it was acked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    pub seq: u32,
    pub delete: bool,
    pub acked: bool,
}

/// The shared write workload's write number `seq` of a worker: the kind it writes and whether
/// it deletes (kind 0 written nine times in ten; kind 1 put at 0 mod 10, deleted at 5 mod 10).
pub fn planned_write(seq: u32) -> (u16, bool) {
    match seq % 10 {
        0 => (1, false),
        5 => (1, true),
        _ => (0, false),
    }
}

/// What a read of a key returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// The value of write `seq`.
    Seq(u32),
    Absent,
    /// A value that is not any write's (half of one, half of another).
    Torn,
    /// The store reported the key lost.
    Lost,
}

/// Whether `observed` is allowed by the key's history `ops`: the last acknowledged write or any
/// write tried after it; with nothing acknowledged, or after an acknowledged delete, also the
/// key's absence.
pub fn allowed(ops: &[Op], observed: Observed) -> bool {
    let last_acked = ops.iter().rposition(|o| o.acked);
    let candidates = &ops[last_acked.unwrap_or(0)..];
    match observed {
        Observed::Torn | Observed::Lost => false,
        Observed::Seq(seq) => candidates.iter().any(|o| o.seq == seq && !o.delete),
        Observed::Absent => last_acked.is_none() || candidates.iter().any(|o| o.delete),
    }
}

/// The value of `owner`'s write number `seq`, `len` bytes long (at least 12).
pub fn value(owner: i32, seq: u32, len: usize) -> Vec<u8> {
    let len = len.max(12);
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&(owner as u32).to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend_from_slice(&(len as u32).to_le_bytes());
    v.extend((12..len).map(|i| pattern(owner, seq, i)));
    v
}

fn pattern(owner: i32, seq: u32, i: usize) -> u8 {
    (owner as usize * 31 + seq as usize * 7 + i * 13) as u8
}

/// `(owner, seq)` of a complete value, `None` if it is torn or not a test value.
pub fn check_value(v: &[u8]) -> Option<(i32, u32)> {
    let word = |at: usize| Some(u32::from_le_bytes(v.get(at..at + 4)?.try_into().ok()?));
    let (owner, seq, len) = (word(0)? as i32, word(4)?, word(8)? as usize);
    let intact = v.len() == len
        && v[12..].iter().enumerate().all(|(i, &b)| b == pattern(owner, seq, i + 12));
    intact.then_some((owner, seq))
}

/// What a read of `owner`'s key returned, judged as a test value.
pub fn observe(owner: i32, read: Option<&[u8]>) -> Observed {
    match read {
        None => Observed::Absent,
        Some(v) => match check_value(v) {
            Some((o, seq)) if o == owner => Observed::Seq(seq),
            _ => Observed::Torn,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(seq: u32, delete: bool, acked: bool) -> Op {
        Op { seq, delete, acked }
    }

    #[test]
    fn history_judgement_table() {
        let acked_then_inflight = [op(1, false, true), op(2, false, true), op(3, false, false)];
        let deleted = [op(1, false, true), op(2, true, true)];
        let never_acked = [op(1, false, false)];
        let table: Vec<(&[Op], Observed, bool)> = vec![
            (&acked_then_inflight, Observed::Seq(2), true),
            (&acked_then_inflight, Observed::Seq(3), true),
            (&acked_then_inflight, Observed::Seq(1), false),
            (&acked_then_inflight, Observed::Absent, false),
            (&acked_then_inflight, Observed::Torn, false),
            (&deleted, Observed::Absent, true),
            (&deleted, Observed::Seq(1), false),
            (&never_acked, Observed::Absent, true),
            (&never_acked, Observed::Seq(1), true),
            (&[], Observed::Absent, true),
            (&[], Observed::Seq(4), false),
        ];
        for (ops, observed, want) in table {
            assert_eq!(allowed(ops, observed), want, "{ops:?} {observed:?}");
        }
    }

    #[test]
    fn values_check_and_torn_ones_fail() {
        let v = value(3, 17, 100);
        assert_eq!(check_value(&v), Some((3, 17)));
        assert_eq!(observe(3, Some(&v)), Observed::Seq(17));
        assert_eq!(observe(4, Some(&v)), Observed::Torn, "another owner's value");
        let mut torn = v.clone();
        torn[50] ^= 1;
        assert_eq!(check_value(&torn), None);
        assert_eq!(check_value(&v[..99]), None);
        let mut mixed = value(3, 18, 100);
        mixed[..50].copy_from_slice(&v[..50]);
        assert_eq!(check_value(&mixed), None, "half of two versions");
        assert_eq!(check_value(&[0u8; 4]), None);
        assert_eq!(observe(3, None), Observed::Absent);
    }
}
