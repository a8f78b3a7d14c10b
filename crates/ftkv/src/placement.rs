//! Where a key's copies live: a pure function of (owner, kind, live set with each worker's host,
//! copies).
//!
//! The live ranks form a ring in world-rank order. A key's candidates are the live ranks after
//! its owner on the ring, the owner itself excluded (whether the owner lives or not). They split
//! into the owner's host mates and, grouped by host in order of first appearance on the ring,
//! the ranks of each other host. Copies go first to as many distinct other hosts as there are,
//! round by round (one rank per other host per round), and only then to the owner's host mates:
//! while at least `copies` other hosts live, losing a whole host costs each key at most one copy.
//!
//! Load spreads over owners and kinds: an owner deals the copies of its keys kind after kind,
//! round-robin over the other hosts (each kind starting at the host after the one where the
//! previous kind stopped) and, within a host, round-robin over its live ranks in world-rank
//! order, starting at the owner's index among all workers ordered by (host id, worker id) (dead
//! ones included, so it stays put across failures). The owner's host mates, in ring order, are
//! taken from position `kind mod size`. Kind `k`'s holders cost `O(k × copies)` to deal.
//!
//! With every rank on one host this is exactly the ring placement: copy `i` of kind `k` goes to
//! candidate `(k + i) mod m` of the `m` candidates. On hosts of equal size mapped by slot or by
//! node every rank holds as many slots as any other; after one rank's failure there, the ranks
//! of each host stay within two slots of each other, and after a whole host's, all within one.
//! On uneven hosts a smaller host's ranks hold more: each key puts a copy on every other host it
//! can. If fewer than `copies` candidates remain, every candidate holds a copy.

/// The world ranks holding the copies of `(owner, kind)`, in copy order: distinct, never
/// `owner`, on as many distinct hosts other than `owner`'s as `live` offers.
///
/// `hosts[w]` is the host id of worker `w`, for every worker ever (dead ones included).
///
/// # Panics
/// If `hosts` lacks the owner or a live rank.
pub fn holders(owner: i32, kind: u16, live: &[i32], hosts: &[u32], copies: usize) -> Vec<i32> {
    let home = hosts[owner as usize];
    let (mates, elsewhere): (Vec<i32>, Vec<i32>) =
        ring_after(owner, live).partition(|&r| hosts[r as usize] == home);
    let mut dealer = Dealer::new(host_groups(&elsewhere, hosts), host_major_index(owner, hosts));
    for _ in 0..kind {
        dealer.deal(copies);
    }
    let mut order = dealer.deal(copies);
    order.extend(rotated(&mates, kind as usize));
    order.truncate(copies);
    order
}

/// The live ranks after `owner` on the ring, `owner` excluded.
fn ring_after(owner: i32, live: &[i32]) -> impl Iterator<Item = i32> + '_ {
    let after = live.iter().filter(move |&&r| r > owner);
    let before = live.iter().filter(move |&&r| r < owner);
    after.chain(before).copied()
}

/// `ranks` grouped by host, groups in order of first appearance, each group in world-rank order.
fn host_groups(ranks: &[i32], hosts: &[u32]) -> Vec<Vec<i32>> {
    let mut index: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
    let mut groups: Vec<Vec<i32>> = Vec::new();
    for &rank in ranks {
        let next = groups.len();
        let at = *index.entry(hosts[rank as usize]).or_insert(next);
        if at == next {
            groups.push(Vec::new());
        }
        groups[at].push(rank);
    }
    groups.into_iter().map(sorted).collect()
}

fn sorted(mut ranks: Vec<i32>) -> Vec<i32> {
    ranks.sort_unstable();
    ranks
}

/// `owner`'s index among all workers ordered by (host id, worker id).
fn host_major_index(owner: i32, hosts: &[u32]) -> usize {
    let me = (hosts[owner as usize], owner as usize);
    hosts.iter().enumerate().filter(|&(w, &h)| (h, w) < me).count()
}

/// One owner's copies on other hosts, dealt key after key: round-robin over the host groups,
/// each key continuing after the group where the previous one stopped, and within each group
/// round-robin over its ranks.
struct Dealer {
    groups: Vec<Vec<i32>>,
    /// The position of each group's next rank (taken modulo the group's length).
    cursors: Vec<usize>,
    /// The group the next key starts at.
    next: usize,
}

impl Dealer {
    /// Every group's cursor starts at `offset`: owners with different offsets deal to
    /// different ranks first.
    fn new(groups: Vec<Vec<i32>>, offset: usize) -> Dealer {
        Dealer { cursors: vec![offset; groups.len()], groups, next: 0 }
    }

    /// One key's copies: up to `copies` distinct ranks, one per group per round.
    fn deal(&mut self, copies: usize) -> Vec<i32> {
        let available: usize = self.groups.iter().map(Vec::len).sum();
        let mut taken = vec![0; self.groups.len()];
        let mut dealt = Vec::new();
        let mut group = self.next;
        while dealt.len() < copies.min(available) {
            if taken[group] < self.groups[group].len() {
                dealt.push(self.take(group));
                taken[group] += 1;
                self.next = (group + 1) % self.groups.len();
            }
            group = (group + 1) % self.groups.len();
        }
        dealt
    }

    fn take(&mut self, group: usize) -> i32 {
        let ranks = &self.groups[group];
        let rank = ranks[self.cursors[group] % ranks.len()];
        self.cursors[group] += 1;
        rank
    }
}

/// `ranks` starting at position `start mod len`, wrapping around.
fn rotated(ranks: &[i32], start: usize) -> impl Iterator<Item = i32> + '_ {
    let first = start % ranks.len().max(1);
    ranks[first..].iter().chain(&ranks[..first]).copied()
}

#[cfg(test)]
mod tests {
    use super::holders;

    /// (owner, kind, live, copies, expected holders)
    type Row = (i32, u16, Vec<i32>, usize, Vec<i32>);

    /// 6 ranks over hosts 0, 1, 2: by slot (0 1 | 2 3 | 4 5) and by node (0 3 | 1 4 | 2 5).
    const BY_SLOT: [u32; 6] = [0, 0, 1, 1, 2, 2];
    const BY_NODE: [u32; 6] = [0, 1, 2, 0, 1, 2];

    fn check(table: Vec<Row>, hosts: &[u32]) {
        for (owner, kind, live, copies, want) in table {
            assert_eq!(
                holders(owner, kind, &live, hosts, copies),
                want,
                "{owner} {kind} {live:?} {copies} on hosts {hosts:?}"
            );
        }
    }

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
        check(table, &[0; 8]);
    }

    /// On one host, copy `i` of kind `k` is candidate `(k + i) mod m` of the ring after the owner
    /// (the placement before hosts counted), also with dead ranks.
    #[test]
    fn one_host_is_the_ring_placement() {
        for n in 1..=12i32 {
            let hosts = vec![7; n as usize];
            for live in [(0..n).collect::<Vec<_>>(), (0..n).filter(|r| r % 3 != 1).collect()] {
                for owner in 0..n {
                    let after = live.iter().filter(|&&r| r > owner);
                    let ring: Vec<i32> =
                        after.chain(live.iter().filter(|&&r| r < owner)).copied().collect();
                    for (kind, copies) in (0..5).flat_map(|k| (1..=4).map(move |c| (k, c))) {
                        let m = ring.len();
                        let want: Vec<i32> =
                            (0..copies.min(m)).map(|i| ring[(kind as usize + i) % m]).collect();
                        let got = holders(owner, kind, &live, &hosts, copies);
                        assert_eq!(got, want, "{owner} {kind} {copies} {live:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn copies_go_to_other_hosts_first_by_slot() {
        let all6: Vec<i32> = (0..6).collect();
        let table: Vec<Row> = vec![
            // owners of host 0 hand kind 0 to different ranks of hosts 1 and 2
            (0, 0, all6.clone(), 2, vec![2, 4]),
            (1, 0, all6.clone(), 2, vec![3, 5]),
            (0, 1, all6.clone(), 2, vec![3, 5]),
            (2, 0, all6.clone(), 2, vec![4, 0]),
            (3, 0, all6.clone(), 2, vec![5, 1]),
            (5, 1, all6.clone(), 2, vec![0, 2]),
            // a third copy: a second round over the other hosts, not the owner's mate
            (0, 0, all6.clone(), 3, vec![2, 4, 3]),
            (4, 2, all6.clone(), 3, vec![1, 3, 0]),
            // more copies than other-host ranks: the owner's mate comes last
            (0, 0, all6.clone(), 5, vec![2, 4, 3, 5, 1]),
            // rank 3 died: host 1 keeps its copies on rank 2
            (1, 0, vec![0, 1, 2, 4, 5], 2, vec![2, 5]),
            (0, 1, vec![0, 1, 2, 4, 5], 3, vec![2, 4, 5]),
            // host 1 died: host 2 first, then the owner's mate; its dead owners keep two hosts
            (0, 0, vec![0, 1, 4, 5], 2, vec![4, 5]),
            (0, 0, vec![0, 1, 4, 5], 3, vec![4, 5, 1]),
            (1, 0, vec![0, 1, 4, 5], 2, vec![5, 4]),
            (2, 0, vec![0, 1, 4, 5], 2, vec![4, 0]),
            (3, 0, vec![0, 1, 4, 5], 2, vec![5, 1]),
        ];
        check(table, &BY_SLOT);
    }

    #[test]
    fn copies_go_to_other_hosts_first_by_node() {
        let all6: Vec<i32> = (0..6).collect();
        let table: Vec<Row> = vec![
            (0, 0, all6.clone(), 2, vec![1, 2]),
            (3, 0, all6.clone(), 2, vec![4, 5]),
            (0, 1, all6.clone(), 2, vec![4, 5]),
            (1, 0, all6.clone(), 2, vec![2, 0]),
            (4, 3, all6.clone(), 2, vec![2, 0]),
            (0, 0, all6.clone(), 3, vec![1, 2, 4]),
            (0, 0, all6.clone(), 5, vec![1, 2, 4, 5, 3]),
            // rank 4 died: host 1 keeps its copies on rank 1
            (0, 0, vec![0, 1, 2, 3, 5], 3, vec![1, 2, 5]),
            // host 2 died: host 1 first, then the owner's mate; its dead owners keep two hosts
            (0, 0, vec![0, 1, 3, 4], 2, vec![1, 4]),
            (0, 0, vec![0, 1, 3, 4], 3, vec![1, 4, 3]),
            (2, 0, vec![0, 1, 3, 4], 2, vec![0, 1]),
            (5, 0, vec![0, 1, 3, 4], 2, vec![3, 4]),
        ];
        check(table, &BY_NODE);
    }

    /// How many slots each of `live` holds, over every owner of `hosts` and `kinds` kinds.
    fn loads(live: &[i32], hosts: &[u32], kinds: u16, copies: usize) -> Vec<usize> {
        let mut load = vec![0; hosts.len()];
        for owner in 0..hosts.len() as i32 {
            for kind in 0..kinds {
                for holder in holders(owner, kind, live, hosts, copies) {
                    load[holder as usize] += 1;
                }
            }
        }
        live.iter().map(|&r| load[r as usize]).collect()
    }

    /// `ranks` ranks over `hosts` hosts of equal size, by slot and by node.
    fn layouts(ranks: u32, hosts: u32) -> [Vec<u32>; 2] {
        let per_host = ranks / hosts;
        [(0..ranks).map(|r| r / per_host).collect(), (0..ranks).map(|r| r % hosts).collect()]
    }

    #[test]
    fn every_rank_holds_as_many_slots_on_even_hosts() {
        for (ranks, host_count) in [(6, 3), (4, 2), (8, 2), (8, 4), (9, 3), (12, 3), (12, 4)] {
            for hosts in layouts(ranks, host_count) {
                let live: Vec<i32> = (0..ranks as i32).collect();
                for copies in 1..ranks as usize {
                    for kinds in 1..=4 {
                        let load = loads(&live, &hosts, kinds, copies);
                        let spread = spread(load.iter().copied());
                        assert_eq!(spread, 0, "{hosts:?} {copies} copies {kinds} kinds: {load:?}");
                    }
                }
            }
        }
    }

    /// On hosts of different sizes a smaller host's ranks hold more (each key puts one copy on
    /// every other host it can), but in these layouts the ranks of one host stay within one slot
    /// of each other.
    #[test]
    fn load_stays_even_within_each_host_on_uneven_hosts() {
        let layouts: [&[u32]; 4] = [
            &[0, 0, 0, 1, 1, 1, 2, 2],
            &[0, 1, 2, 0, 1, 2, 0, 1],
            &[0, 0, 1, 1, 1, 2, 2, 2],
            &[0, 1, 0, 1, 0],
        ];
        for hosts in layouts {
            let live: Vec<i32> = (0..hosts.len() as i32).collect();
            assert_within_hosts(&live, hosts, 1);
        }
    }

    /// After one rank's death the ranks of each host stay within two slots of each other; after
    /// a whole host's, every live rank within one slot of every other.
    #[test]
    fn load_stays_even_after_failures() {
        for (ranks, host_count) in [(6, 3), (8, 2), (8, 4), (9, 3), (12, 3), (12, 4)] {
            for hosts in layouts(ranks, host_count) {
                let all: Vec<i32> = (0..ranks as i32).collect();
                for dead in 0..ranks as i32 {
                    let live: Vec<i32> = all.iter().copied().filter(|&r| r != dead).collect();
                    assert_within_hosts(&live, &hosts, 2);
                }
                for host in 0..host_count {
                    let live: Vec<i32> =
                        all.iter().copied().filter(|&r| hosts[r as usize] != host).collect();
                    assert_within_all(&live, &hosts, 1);
                }
            }
        }
    }

    /// For 1–3 copies and 1–4 kinds, the live ranks of each host hold within `bound` slots of
    /// each other.
    fn assert_within_hosts(live: &[i32], hosts: &[u32], bound: usize) {
        for (copies, kinds) in (1..=3).flat_map(|c| (1..=4).map(move |k| (c, k))) {
            let load = loads(live, hosts, kinds, copies);
            for host in hosts {
                let here = live.iter().zip(&load).filter(|(&r, _)| hosts[r as usize] == *host);
                let spread = spread(here.map(|(_, &l)| l));
                assert!(spread <= bound, "{hosts:?} live {live:?} {copies} {kinds}: {load:?}");
            }
        }
    }

    /// For 1–3 copies and 1–4 kinds, all live ranks hold within `bound` slots of each other.
    fn assert_within_all(live: &[i32], hosts: &[u32], bound: usize) {
        for (copies, kinds) in (1..=3).flat_map(|c| (1..=4).map(move |k| (c, k))) {
            let load = loads(live, hosts, kinds, copies);
            let spread = spread(load.iter().copied());
            assert!(spread <= bound, "{hosts:?} live {live:?} {copies} {kinds}: {load:?}");
        }
    }

    fn spread(loads: impl Iterator<Item = usize> + Clone) -> usize {
        loads.clone().max().unwrap_or(0) - loads.min().unwrap_or(0)
    }

    /// A deterministic stream of layouts: `n` ranks, host ids below `host_count`, a live subset.
    fn scrambled(seed: u64, n: usize, host_count: u32) -> (Vec<u32>, Vec<i32>) {
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let hosts = (0..n).map(|_| (next() % host_count as u64) as u32).collect();
        let live = (0..n as i32).filter(|_| next() % 4 != 0).collect();
        (hosts, live)
    }

    #[test]
    fn copies_are_distinct_never_on_the_owner_and_on_most_hosts() {
        for seed in 0..400 {
            let n = 2 + (seed % 15) as usize;
            let (hosts, live) = scrambled(seed, n, 1 + (seed % 5) as u32);
            for owner in 0..n as i32 {
                let other_hosts = distinct_hosts(&live, &hosts, owner);
                for copies in 1..n {
                    for kind in 0..4 {
                        let h = holders(owner, kind, &live, &hosts, copies);
                        let what = format!("{owner} {kind} {copies} {live:?} on {hosts:?}: {h:?}");
                        let candidates = live.iter().filter(|&&r| r != owner).count();
                        assert_eq!(h.len(), copies.min(candidates), "{what}");
                        assert!(!h.contains(&owner), "{what}");
                        assert!(h.iter().all(|r| live.contains(r)), "{what}");
                        let mut sorted = h.clone();
                        sorted.sort_unstable();
                        sorted.dedup();
                        assert_eq!(sorted.len(), h.len(), "{what}");
                        let spread = distinct_hosts(&h, &hosts, owner);
                        assert_eq!(spread, copies.min(other_hosts), "{what}");
                    }
                }
            }
        }
    }

    /// How many hosts other than `owner`'s the ranks of `ranks` are on.
    fn distinct_hosts(ranks: &[i32], hosts: &[u32], owner: i32) -> usize {
        let mut others: Vec<u32> = ranks
            .iter()
            .map(|&r| hosts[r as usize])
            .filter(|&h| h != hosts[owner as usize])
            .collect();
        others.sort_unstable();
        others.dedup();
        others.len()
    }
}
