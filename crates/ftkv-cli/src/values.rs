//! Self-describing test values: a value names its owner, sequence number and length, and every
//! other byte follows from them, so a torn or foreign value is recognised.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_check_and_torn_ones_fail() {
        let v = value(3, 17, 100);
        assert_eq!(check_value(&v), Some((3, 17)));
        let mut torn = v.clone();
        torn[50] ^= 1;
        assert_eq!(check_value(&torn), None);
        assert_eq!(check_value(&v[..99]), None);
        let mut mixed = value(3, 18, 100);
        mixed[..50].copy_from_slice(&v[..50]);
        assert_eq!(check_value(&mixed), None, "half of two versions");
        assert_eq!(check_value(&[0u8; 4]), None);
    }
}
