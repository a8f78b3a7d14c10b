//! Where a key's copies live: a pure function of (owner, kind, live set, copies).
//!
//! The live ranks form a ring in world-rank order. A key's candidates are the live ranks after
//! its owner on the ring, the owner itself excluded (whether the owner lives or not); copy `i`
//! of kind `k` goes to candidate `(k + i) mod m`, where `m` is the number of candidates. So
//! copies are distinct, never on the owner, spread over the kinds, and after a failure only the
//! keys that had a copy on the dead rank (or whose owner's neighbourhood shifted) move.
//! If fewer than `copies` candidates remain, every candidate holds a copy.

/// The world ranks holding the copies of `(owner, kind)`, in copy order.
pub fn holders(owner: i32, kind: u16, live: &[i32], copies: usize) -> Vec<i32> {
    let after = live.iter().filter(|&&r| r > owner);
    let before = live.iter().filter(|&&r| r < owner);
    let candidates: Vec<i32> = after.chain(before).copied().collect();
    let m = candidates.len();
    (0..copies.min(m)).map(|i| candidates[(kind as usize + i) % m]).collect()
}

#[cfg(test)]
mod tests {
    use super::holders;

    /// (owner, kind, live, copies, expected holders)
    type Row = (i32, u16, Vec<i32>, usize, Vec<i32>);

    #[test]
    fn placement_table() {
        let all8: Vec<i32> = (0..8).collect();
        let table: Vec<Row> = vec![
            (0, 0, vec![0, 1, 2, 3], 1, vec![1]),
            (0, 0, vec![0, 1, 2, 3], 2, vec![1, 2]),
            (0, 1, vec![0, 1, 2, 3], 2, vec![2, 3]),
            (3, 0, vec![0, 1, 2, 3], 2, vec![0, 1]),
            (3, 2, vec![0, 1, 2, 3], 3, vec![2, 0, 1]),
            (2, 0, all8.clone(), 3, vec![3, 4, 5]),
            (7, 1, all8.clone(), 3, vec![1, 2, 3]),
            // owner 2 died: its keys stay placed on the ring after it
            (2, 0, vec![0, 1, 3], 2, vec![3, 0]),
            // holder 1 died: owner 0's copies move on
            (0, 0, vec![0, 2, 3], 2, vec![2, 3]),
            // fewer candidates than copies: all of them
            (0, 0, vec![0, 1], 3, vec![1]),
            (5, 0, vec![5], 2, vec![]),
        ];
        for (owner, kind, live, copies, want) in table {
            assert_eq!(
                holders(owner, kind, &live, copies),
                want,
                "{owner} {kind} {live:?} {copies}"
            );
        }
    }

    #[test]
    fn copies_are_distinct_and_never_on_the_owner() {
        for n in 2..=16 {
            let live: Vec<i32> = (0..n).collect();
            for copies in 1..n as usize {
                for owner in 0..n {
                    for kind in 0..4 {
                        let h = holders(owner, kind, &live, copies);
                        assert_eq!(h.len(), copies);
                        assert!(!h.contains(&owner));
                        let mut sorted = h.clone();
                        sorted.sort_unstable();
                        sorted.dedup();
                        assert_eq!(sorted.len(), copies, "{owner} {kind} {h:?}");
                    }
                }
            }
        }
    }
}
