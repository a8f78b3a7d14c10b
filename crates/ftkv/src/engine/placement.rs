//! Where a key's copies live: a pure function of (owner, kind, live set with each worker's host,
//! copies).
//!
//! A key's candidates are the live ranks other than its owner (whether the owner lives or not).
//! The owner's host mates among them are taken in ring order: the live ranks after the owner in
//! world-rank order, wrapping around. The other candidates are grouped by host, each group in
//! world-rank order, the groups in host id order from the host after the owner's, wrapping
//! around.
//!
//! Copies are dealt in rounds. A round puts one copy on each other host that has a candidate
//! left, in group order, then one on an owner's host mate if one is left; the next round starts
//! when this one is done. The owner's host thus counts as one more host, used after the other
//! hosts and before any of them takes a second copy, and a key's copies are as even over the
//! hosts of its candidates as their numbers of candidates allow: losing one host costs each key
//! as few copies as the hosts allow. With two copies or more and candidates on two hosts or
//! more, every key keeps a live copy when any one host is lost. If fewer than `copies`
//! candidates remain, every candidate holds a copy.
//!
//! Load spreads over owners and kinds: an owner deals the copies of its keys that go to other
//! hosts kind after kind, round-robin over the groups (each kind starting at the group after the
//! one where the previous kind stopped, kind 0 at the first) and, within a group, round-robin
//! over its ranks. In a host's group it starts at its index among the workers of every other
//! host, ordered by host id from the host after that one (wrapping around), then by worker id,
//! dead workers included: the starts stay put across failures, and the owners that deal to one
//! host start at consecutive positions. The owner's host mates are taken in ring order from
//! position `kind mod size`, one per round. Kind `k`'s holders cost `O(k × copies)` to deal.
//!
//! With every rank on one host this is exactly the ring placement: copy `i` of kind `k` goes to
//! candidate `(k + i) mod m` of the `m` candidates in ring order. On hosts of equal size mapped
//! by slot or by node every rank holds as many slots as any other; after one rank's failure
//! there, the ranks of each host stay within two slots of each other, and after a whole host's,
//! all live ranks within one. On uneven hosts a smaller host's ranks hold more (each key puts a
//! copy on every other host it can), and the ranks of one host stay within two slots of each
//! other.

/// The world ranks holding the copies of `(owner, kind)`, in copy order: distinct, never
/// `owner`, one on each host other than `owner`'s that `live` offers before one on `owner`'s,
/// and one on each of those before a second on any (see the module doc).
///
/// `hosts[w]` is the host id of worker `w`, for every worker ever (dead ones included).
///
/// # Panics
/// If `hosts` lacks the owner or a live rank.
pub fn holders(owner: i32, kind: u16, live: &[i32], hosts: &[u32], copies: usize) -> Vec<i32> {
    let mut census = take_census(owner, live, hosts);
    let home = census.iter().position(|host| host.id == hosts[owner as usize]);
    let home = home.expect("the owner's host is among the hosts");
    let (groups, starts) = other_hosts(owner, &mut census, home, hosts);
    let mates = ring_order(owner, &census[home].candidates);
    let plan = hosts_in_copy_order(&groups, mates.len(), copies);
    let dealt_elsewhere = plan.iter().filter(|&&host| host == Host::Elsewhere).count();
    let mut dealer = Dealer::new(groups, starts);
    for _ in 0..kind {
        dealer.deal(dealt_elsewhere);
    }
    let mut others = dealer.deal(dealt_elsewhere).into_iter();
    let mut mates = rotated(&mates, kind as usize);
    plan.into_iter()
        .map(|host| match host {
            Host::Elsewhere => others.next(),
            Host::Home => mates.next(),
        })
        .map(|rank| rank.expect("the plan counts the candidates of each host"))
        .collect()
}

/// Which kind of host one copy goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Host {
    /// A host other than the owner's.
    Elsewhere,
    /// The owner's host.
    Home,
}

/// The host of each of up to `copies` copies, in copy order: round after round, one copy on
/// each other host that has a candidate left (`groups`), then one on the owner's host while
/// `mates` has one left.
fn hosts_in_copy_order(groups: &[Vec<i32>], mates: usize, copies: usize) -> Vec<Host> {
    let rounds = groups.iter().map(Vec::len).max().unwrap_or(0).max(mates);
    let round = |r: usize| {
        let others = groups.iter().filter(|group| group.len() > r).count();
        std::iter::repeat_n(Host::Elsewhere, others).chain((mates > r).then_some(Host::Home))
    };
    (0..rounds).flat_map(round).take(copies).collect()
}

/// One host as a key's placement sees it.
struct HostCensus {
    id: u32,
    /// Its workers, dead ones included.
    workers: usize,
    /// Its live ranks other than the owner, in world-rank order.
    candidates: Vec<i32>,
}

/// Every host of `hosts`, in host id order.
fn take_census(owner: i32, live: &[i32], hosts: &[u32]) -> Vec<HostCensus> {
    let mut is_candidate = vec![false; hosts.len()];
    for &rank in live.iter().filter(|&&r| r != owner) {
        is_candidate[rank as usize] = true;
    }
    let mut index = std::collections::HashMap::<u32, usize>::new();
    let mut census: Vec<HostCensus> = Vec::new();
    for (worker, &id) in hosts.iter().enumerate() {
        let at = *index.entry(id).or_insert_with(|| {
            census.push(HostCensus { id, workers: 0, candidates: Vec::new() });
            census.len() - 1
        });
        census[at].workers += 1;
        if is_candidate[worker] {
            census[at].candidates.push(worker as i32);
        }
    }
    census.sort_unstable_by_key(|host| host.id);
    census
}

/// The candidates of the hosts other than `census[home]` that have some, in host id order from
/// the host after `home` (wrapping around), taken out of `census`; and where `owner` starts
/// dealing in each: its index among the workers of every host but that one, ordered by host id
/// from the host after that one (wrapping around), then by worker id. Dead workers count, so
/// the starts stay put across failures; and the owners that deal to one host start at
/// consecutive positions, so its ranks are dealt to evenly.
fn other_hosts(
    owner: i32,
    census: &mut [HostCensus],
    home: usize,
    hosts: &[u32],
) -> (Vec<Vec<i32>>, Vec<usize>) {
    let through: Vec<usize> = census
        .iter()
        .scan(0, |through, host| {
            *through += host.workers;
            Some(*through)
        })
        .collect();
    let workers = hosts.len();
    let mates_before = hosts[..owner as usize].iter().filter(|&&h| h == census[home].id).count();
    let owner_index = through[home] - census[home].workers + mates_before;
    let others = (home + 1..census.len()).chain(0..home);
    others
        .map(|at| {
            let start = (owner_index + workers - through[at]) % workers;
            (std::mem::take(&mut census[at].candidates), start)
        })
        .filter(|(candidates, _)| !candidates.is_empty())
        .unzip()
}

/// `mates` (in world-rank order) as a ring from `owner`: those after it, then those before.
fn ring_order(owner: i32, mates: &[i32]) -> Vec<i32> {
    let after = mates.partition_point(|&r| r < owner);
    mates[after..].iter().chain(&mates[..after]).copied().collect()
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
    /// Each group's cursor starts at its start: owners with different starts deal to
    /// different ranks first.
    fn new(groups: Vec<Vec<i32>>, starts: Vec<usize>) -> Dealer {
        Dealer { cursors: starts, groups, next: 0 }
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
    fn copies_take_turns_over_three_hosts_by_slot() {
        let all6: Vec<i32> = (0..6).collect();
        let table: Vec<Row> = vec![
            // owners of host 0 hand kind 0 to different ranks of hosts 1 and 2
            (0, 0, all6.clone(), 2, vec![2, 4]),
            (1, 0, all6.clone(), 2, vec![3, 5]),
            (0, 1, all6.clone(), 2, vec![3, 5]),
            (2, 0, all6.clone(), 2, vec![4, 0]),
            (3, 0, all6.clone(), 2, vec![5, 1]),
            (5, 1, all6.clone(), 2, vec![0, 2]),
            // a third copy: the owner's mate, before a second copy on hosts 1 or 2
            (0, 0, all6.clone(), 3, vec![2, 4, 1]),
            (4, 2, all6.clone(), 3, vec![0, 2, 5]),
            // then a second round over the other hosts
            (0, 0, all6.clone(), 5, vec![2, 4, 1, 3, 5]),
            // rank 3 died: host 1 keeps its copies on rank 2
            (1, 0, vec![0, 1, 2, 4, 5], 2, vec![2, 5]),
            (0, 1, vec![0, 1, 2, 4, 5], 3, vec![2, 5, 1]),
            // host 1 died: host 2, then the owner's mate; its dead owners keep two hosts
            (0, 0, vec![0, 1, 4, 5], 2, vec![4, 1]),
            (0, 0, vec![0, 1, 4, 5], 3, vec![4, 1, 5]),
            (1, 0, vec![0, 1, 4, 5], 2, vec![5, 0]),
            (2, 0, vec![0, 1, 4, 5], 2, vec![4, 0]),
            (3, 0, vec![0, 1, 4, 5], 2, vec![5, 1]),
        ];
        check(table, &BY_SLOT);
    }

    #[test]
    fn copies_take_turns_over_three_hosts_by_node() {
        let all6: Vec<i32> = (0..6).collect();
        let table: Vec<Row> = vec![
            (0, 0, all6.clone(), 2, vec![1, 2]),
            (3, 0, all6.clone(), 2, vec![4, 5]),
            (0, 1, all6.clone(), 2, vec![4, 5]),
            (1, 0, all6.clone(), 2, vec![2, 0]),
            (4, 3, all6.clone(), 2, vec![2, 0]),
            (0, 0, all6.clone(), 3, vec![1, 2, 3]),
            (0, 0, all6.clone(), 5, vec![1, 2, 3, 4, 5]),
            // rank 4 died: host 1 keeps its copies on rank 1
            (0, 0, vec![0, 1, 2, 3, 5], 3, vec![1, 2, 3]),
            (3, 0, vec![0, 1, 2, 3, 5], 2, vec![1, 5]),
            // host 2 died: host 1, then the owner's mate; its dead owners keep two hosts
            (0, 0, vec![0, 1, 3, 4], 2, vec![1, 3]),
            (0, 0, vec![0, 1, 3, 4], 3, vec![1, 3, 4]),
            (2, 0, vec![0, 1, 3, 4], 2, vec![0, 1]),
            (5, 0, vec![0, 1, 3, 4], 2, vec![3, 4]),
        ];
        check(table, &BY_NODE);
    }

    /// With two hosts the second copy goes to the owner's host: losing either host leaves one.
    #[test]
    fn copies_alternate_between_two_hosts() {
        let all6: Vec<i32> = (0..6).collect();
        let by_slot: Vec<Row> = vec![
            (0, 0, all6.clone(), 1, vec![3]),
            (0, 0, all6.clone(), 2, vec![3, 1]),
            (0, 0, all6.clone(), 3, vec![3, 1, 4]),
            (0, 0, all6.clone(), 5, vec![3, 1, 4, 2, 5]),
            (0, 1, all6.clone(), 2, vec![4, 2]),
            (1, 0, all6.clone(), 2, vec![4, 2]),
            (4, 0, all6.clone(), 2, vec![1, 5]),
            // rank 1 died: its keys keep a copy on each host
            (1, 0, vec![0, 2, 3, 4, 5], 2, vec![4, 2]),
            (0, 0, vec![0, 2, 3, 4, 5], 2, vec![3, 2]),
            (3, 0, vec![0, 1, 2, 4, 5], 2, vec![0, 4]),
            // the owner's mates died: only host 1 is left to hold them
            (0, 0, vec![0, 3, 4, 5], 2, vec![3, 4]),
        ];
        check(by_slot, &[0, 0, 0, 1, 1, 1]);
        let by_node: Vec<Row> = vec![
            (0, 0, all6.clone(), 2, vec![1, 2]),
            (0, 0, all6.clone(), 4, vec![1, 2, 3, 4]),
            (3, 0, all6.clone(), 2, vec![2, 5]),
            (3, 1, all6.clone(), 2, vec![4, 1]),
            (5, 0, all6.clone(), 3, vec![4, 1, 0]),
        ];
        check(by_node, &[0, 1, 0, 1, 0, 1]);
    }

    /// Hosts 1 and 2 have one rank each: a key of host 0 takes both before its mates, a key of
    /// host 1 takes host 2's rank and then two of host 0's.
    #[test]
    fn copies_take_turns_over_uneven_hosts() {
        let all6: Vec<i32> = (0..6).collect();
        let table: Vec<Row> = vec![
            (0, 0, all6.clone(), 2, vec![4, 5]),
            (0, 0, all6.clone(), 4, vec![4, 5, 1, 2]),
            (4, 0, all6.clone(), 3, vec![5, 0, 1]),
        ];
        check(table, &[0, 0, 0, 0, 1, 2]);
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

    /// (ranks, hosts) with as many ranks on every host.
    const EVEN_HOSTS: [(u32, u32); 10] =
        [(4, 2), (6, 2), (8, 2), (12, 2), (6, 3), (9, 3), (12, 3), (8, 4), (12, 4), (16, 4)];

    /// (ranks, hosts) that leave the last host with fewer ranks by slot, some hosts with fewer
    /// by node.
    const UNEVEN_HOSTS: [(u32, u32); 4] = [(7, 2), (8, 3), (11, 3), (10, 4)];

    #[test]
    fn every_rank_holds_as_many_slots_on_even_hosts() {
        for (ranks, host_count) in EVEN_HOSTS {
            for hosts in mapped(ranks, host_count) {
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
    /// every other host it can), but the ranks of one host stay within two slots of each other
    /// as Open MPI maps them, and within one in these layouts.
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
        for hosts in UNEVEN_HOSTS.iter().flat_map(|&(ranks, hosts)| mapped(ranks, hosts)) {
            let live: Vec<i32> = (0..hosts.len() as i32).collect();
            assert_within_hosts(&live, &hosts, 2);
        }
    }

    /// After one rank's death the ranks of each host stay within two slots of each other; after
    /// a whole host's, every live rank within one slot of every other.
    #[test]
    fn load_stays_even_after_failures() {
        for (ranks, host_count) in EVEN_HOSTS {
            for hosts in mapped(ranks, host_count) {
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
    fn copies_are_distinct_never_on_the_owner_and_take_turns_over_hosts() {
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
                        assert_hosts_take_turns(owner, &h, &live, &hosts);
                    }
                }
            }
        }
    }

    /// With two copies or more and live candidates on two hosts or more, losing any one host
    /// leaves every key a live copy: by slot and by node, over 2, 3 and 4 hosts of equal and of
    /// uneven sizes, with no rank, every rank and every pair of ranks dead, and over seeded
    /// scrambled layouts.
    #[test]
    fn losing_any_one_host_leaves_every_key_a_copy() {
        for hosts in
            EVEN_HOSTS.iter().chain(&UNEVEN_HOSTS).flat_map(|&(ranks, hosts)| mapped(ranks, hosts))
        {
            for live in with_up_to_two_dead(hosts.len() as i32) {
                assert_every_key_survives_any_one_host(&live, &hosts);
            }
        }
        for seed in 0..400 {
            let n = 2 + (seed % 15) as usize;
            let (hosts, live) = scrambled(seed, n, 2 + (seed % 4) as u32);
            assert_every_key_survives_any_one_host(&live, &hosts);
        }
    }

    /// `ranks` ranks over `hosts` hosts as Open MPI maps them: by slot (`⌈ranks / hosts⌉` per
    /// host, the last host left with fewer when it does not divide) and by node (round-robin).
    fn mapped(ranks: u32, hosts: u32) -> [Vec<u32>; 2] {
        let per_host = ranks.div_ceil(hosts);
        [(0..ranks).map(|r| r / per_host).collect(), (0..ranks).map(|r| r % hosts).collect()]
    }

    /// The live sets of `n` ranks with none, one or two of them dead.
    fn with_up_to_two_dead(n: i32) -> Vec<Vec<i32>> {
        let without = |a: i32, b: i32| (0..n).filter(|&r| r != a && r != b).collect();
        let dead_pairs = (0..n).flat_map(|a| (a..n).map(move |b| (a, b)));
        dead_pairs.map(|(a, b)| without(a, b)).chain([without(n, n)]).collect()
    }

    fn assert_every_key_survives_any_one_host(live: &[i32], hosts: &[u32]) {
        for owner in 0..hosts.len() as i32 {
            let candidate_hosts =
                distinct_hosts(live, hosts, owner) + has_mates(owner, live, hosts);
            if candidate_hosts < 2 {
                continue;
            }
            for (copies, kind) in (2..=4).flat_map(|c| (0..3).map(move |k| (c, k))) {
                let h = holders(owner, kind, live, hosts, copies);
                for lost in hosts {
                    let left = h.iter().filter(|&&r| hosts[r as usize] != *lost).count();
                    assert!(left > 0, "{owner} {kind} {copies} {live:?} on {hosts:?}: {h:?}");
                }
            }
        }
    }

    /// 1 if a live rank other than `owner` is on `owner`'s host, else 0.
    fn has_mates(owner: i32, live: &[i32], hosts: &[u32]) -> usize {
        let home = hosts[owner as usize];
        live.iter().any(|&r| r != owner && hosts[r as usize] == home) as usize
    }

    /// The copies take turns over the hosts of the live candidates: each goes to a host holding
    /// the fewest copies so far among those with a candidate left, and to the owner's host only
    /// when no other such host holds as few.
    fn assert_hosts_take_turns(owner: i32, held: &[i32], live: &[i32], hosts: &[u32]) {
        let home = hosts[owner as usize];
        let mut left = std::collections::BTreeMap::<u32, usize>::new();
        for &r in live.iter().filter(|&&r| r != owner) {
            *left.entry(hosts[r as usize]).or_default() += 1;
        }
        let mut count = std::collections::BTreeMap::<u32, usize>::new();
        for (i, &r) in held.iter().enumerate() {
            let open = left
                .iter()
                .filter(|(_, &n)| n > 0)
                .map(|(h, _)| count.get(h).copied().unwrap_or(0));
            let fewest = open.min().expect("a candidate left");
            let host = hosts[r as usize];
            let what = format!("copy {i} of {owner}'s on {held:?}, {live:?} on {hosts:?}");
            assert_eq!(count.get(&host).copied().unwrap_or(0), fewest, "{what}");
            if host == home {
                let other_as_few = left.iter().any(|(&h, &n)| {
                    h != home && n > 0 && count.get(&h).copied().unwrap_or(0) == fewest
                });
                assert!(!other_as_few, "{what}: the owner's host before another");
            }
            *count.entry(host).or_default() += 1;
            *left.get_mut(&host).expect("a live candidate's host") -= 1;
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
