//! Where every copy of every key lives: holder ranks and window offsets, derived from
//! [`placement::holders`](crate::engine::placement::holders).
//!
//! Each key has a *chain* of candidate holders: its `copies` holders from
//! [`placement::holders`](crate::engine::placement::holders) first, then up to `copies × spares` reserve
//! holders (further ranks of the key's host-spread candidate order, never the owner). Every
//! candidate reserves a slot for the key in its window, so copies can move without new windows:
//! after failures, the key's copies live on the first `copies` live candidates of its chain.
//! That set depends only on the set of failed workers, never on the order in which they were
//! noticed, so ranks that know the same failures agree on every route without talking; and a
//! live holder stays a holder as the failed set grows (fewer live candidates can only precede
//! it), so only copies that lived on failed workers move. Reserved slots cost address space,
//! not memory: pages become resident only when a copy is written there.
//!
//! Each member's window starts with [`MARKS_LEN`] bytes before its slots: the word at
//! [`RECOVERY_MARK_AT`] is where the member marks the recovery step it entered, for the others
//! to read one-sidedly (the store's recovery deadline).

use crate::engine::placement::holders;
use crate::key::Key;
use crate::slot::SlotGeometry;

/// The bytes at the start of every member's window before its first slot (a cache line, so
/// that the mark and the first slot's lock word are not written on the same line).
pub const MARKS_LEN: usize = 64;

/// The offset of the recovery mark, a little-endian `u64` changed only by compare-and-swap.
pub const RECOVERY_MARK_AT: usize = 0;

/// One copy's location.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copy {
    /// Rank in the store's current communicator.
    pub rank: i32,
    /// Stable worker id of the holder.
    pub worker: i32,
    /// Offset of the slot in the holder's window.
    pub disp: i64,
}

/// How many keys each worker owns and how many slots each key reserves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub kinds: usize,
    pub copies: usize,
    /// Reserve holders per copy ([`crate::Config::spares`]).
    pub spares: usize,
}

/// The routes of all keys for a live set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Stable ids of the live workers when the windows were built; index = rank in the current
    /// communicator.
    pub live: Vec<i32>,
    workers: usize,
    kinds: usize,
    copies: usize,
    /// Per key: the candidate holders in order, each with its reserved slot.
    chains: Vec<Vec<Copy>>,
    /// Per key: the current holders (the first `copies` candidates not in `relocated`).
    routes: Vec<Vec<Copy>>,
    /// Workers of `live` that failed and whose copies moved to reserve holders, sorted.
    pub relocated: Vec<i32>,
    /// Slots this rank hosts (every chain position it holds), with their offsets in its window.
    pub local: Vec<(Key, i64)>,
    pub window_len: usize,
    /// The slots' geometry, which the offsets follow.
    geometry: SlotGeometry,
}

impl Layout {
    /// The layout for `live` workers without reserve holders, as seen by rank `me` (a stable
    /// id). `hosts[w]` is the host of worker `w`, for every worker ever (dead ones included):
    /// their number is `hosts.len()`.
    pub fn compute(
        live: &[i32],
        hosts: &[u32],
        kinds: usize,
        copies: usize,
        geometry: SlotGeometry,
        me: i32,
    ) -> Layout {
        Layout::with_spares(live, hosts, Shape { kinds, copies, spares: 0 }, geometry, me)
    }

    /// The layout for `live` workers with up to `shape.spares` reserve holders per copy.
    pub fn with_spares(
        live: &[i32],
        hosts: &[u32],
        shape: Shape,
        geometry: SlotGeometry,
        me: i32,
    ) -> Layout {
        let Shape { kinds, copies, spares } = shape;
        let workers = hosts.len();
        let mut used = vec![0usize; live.len()];
        let rank_of: std::collections::HashMap<i32, usize> =
            live.iter().enumerate().map(|(rank, &worker)| (worker, rank)).collect();
        let mut chains = Vec::with_capacity(workers * kinds);
        let mut local = Vec::new();
        for owner in 0..workers as i32 {
            for kind in 0..kinds as u16 {
                let key = Key::new(owner, kind);
                let candidates = chain_workers(owner, kind, live, hosts, copies, spares);
                let chain = candidates.into_iter().map(|worker| {
                    let rank = rank_of[&worker];
                    let disp = (MARKS_LEN + used[rank] * geometry.slot_len()) as i64;
                    used[rank] += 1;
                    if worker == me {
                        local.push((key, disp));
                    }
                    Copy { rank: rank as i32, worker, disp }
                });
                chains.push(chain.collect());
            }
        }
        let mine = live.iter().position(|&w| w == me).map_or(0, |r| used[r]);
        let window_len = MARKS_LEN + mine.max(1) * geometry.slot_len();
        let mut layout = Layout {
            live: live.to_vec(),
            workers,
            kinds,
            copies,
            routes: Vec::new(),
            chains,
            relocated: Vec::new(),
            local,
            window_len,
            geometry,
        };
        layout.routes = layout.routes_without(&[]).expect("every chain has a live head");
        layout
    }

    /// The same windows with the copies of `failed` workers (those of `live`; others are
    /// ignored) moved down their chains, or `None` when a chain has fewer than `copies` live
    /// candidates left (the copy count can then only be restored by rebuilding the windows).
    pub fn relocate(&self, failed: &[i32]) -> Option<Layout> {
        let mut relocated: Vec<i32> =
            failed.iter().copied().filter(|w| self.live.contains(w)).collect();
        relocated.sort_unstable();
        relocated.dedup();
        let routes = self.routes_without(&relocated)?;
        Some(Layout { routes, relocated, ..self.clone() })
    }

    /// The routes without the `failed` workers (sorted).
    fn routes_without(&self, failed: &[i32]) -> Option<Vec<Vec<Copy>>> {
        let route = |chain: &Vec<Copy>| {
            let live = chain.iter().filter(|c| failed.binary_search(&c.worker).is_err()).copied();
            let route: Vec<Copy> = live.take(self.copies).collect();
            (route.len() == self.copies.min(chain.len())).then_some(route)
        };
        self.chains.iter().map(route).collect()
    }

    /// The geometry of every slot: the offsets of a slot's halves, and where its values live.
    pub fn geometry(&self) -> SlotGeometry {
        self.geometry
    }

    /// The current copies of `key`, or `None` for a key outside the store.
    pub fn route(&self, key: Key) -> Option<&[Copy]> {
        self.index(key).and_then(|i| self.routes.get(i)).map(Vec::as_slice)
    }

    /// Every slot reserved for `key`, on every candidate of its chain.
    pub fn slots(&self, key: Key) -> impl Iterator<Item = &Copy> + '_ {
        self.index(key).into_iter().flat_map(move |i| self.chains[i].iter())
    }

    fn index(&self, key: Key) -> Option<usize> {
        let owner = usize::try_from(key.owner).ok().filter(|&o| o < self.workers)?;
        let kind = Some(key.kind as usize).filter(|&k| k < self.kinds)?;
        Some(owner * self.kinds + kind)
    }

    /// Every key of the store.
    pub fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        (0..self.workers as i32)
            .flat_map(move |o| (0..self.kinds as u16).map(move |k| Key::new(o, k)))
    }
}

/// The candidate holders of `(owner, kind)`: its holders from [`holders`], then up to
/// `copies × spares` reserves in the order of the key's longer host-spread candidate list
/// (the holders taken out), so reserves spread over hosts as the holders do.
fn chain_workers(
    owner: i32,
    kind: u16,
    live: &[i32],
    hosts: &[u32],
    copies: usize,
    spares: usize,
) -> Vec<i32> {
    let mut chain = holders(owner, kind, live, hosts, copies);
    if spares > 0 {
        let wider = holders(owner, kind, live, hosts, copies * (spares + 1));
        let reserves: Vec<i32> = wider.into_iter().filter(|w| !chain.contains(w)).collect();
        chain.extend(reserves.into_iter().take(copies * spares));
    }
    chain
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_dense_per_holder_and_agree_between_ranks() {
        let g = SlotGeometry::new(1000);
        let live = [0, 1, 2, 3];
        for hosts in [[0; 4], [0, 0, 1, 1], [0, 1, 0, 1]] {
            let layouts: Vec<Layout> =
                live.iter().map(|&me| Layout::compute(&live, &hosts, 2, 2, g, me)).collect();
            for layout in &layouts {
                assert_eq!(layout.local.len(), 4, "4 keys × 2 copies / 4 ranks on {hosts:?}");
                assert_eq!(layout.window_len, MARKS_LEN + 4 * g.slot_len());
            }
            for key in layouts[0].keys() {
                for copy in layouts[0].route(key).unwrap() {
                    let hosted = &layouts[copy.worker as usize].local;
                    assert!(hosted.contains(&(key, copy.disp)), "{key} at {copy:?} on {hosts:?}");
                }
            }
            assert!(layouts[0].route(Key::new(4, 0)).is_none());
            assert!(layouts[0].route(Key::new(0, 2)).is_none());
        }
    }

    #[test]
    fn dead_owners_keys_stay_routed_to_live_ranks() {
        let g = SlotGeometry::new(64);
        let layout = Layout::compute(&[0, 2, 3], &[0; 4], 1, 2, g, 0);
        let route = layout.route(Key::new(1, 0)).unwrap();
        let workers: Vec<i32> = route.iter().map(|c| c.worker).collect();
        assert_eq!(workers, vec![2, 3]);
        assert_eq!(route.iter().map(|c| c.rank).collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn reserves_take_over_only_failed_copies_whatever_the_order_of_failures() {
        let g = SlotGeometry::new(64);
        let live: Vec<i32> = (0..6).collect();
        for hosts in [vec![0; 6], vec![0, 0, 1, 1, 2, 2]] {
            let layouts: Vec<Layout> = live
                .iter()
                .map(|&me| {
                    Layout::with_spares(
                        &live,
                        &hosts,
                        Shape { kinds: 2, copies: 2, spares: 1 },
                        g,
                        me,
                    )
                })
                .collect();
            let base = &layouts[0];
            for key in base.keys() {
                let slots: Vec<i32> = base.slots(key).map(|c| c.worker).collect();
                assert_eq!(slots.len(), 4, "2 holders and 2 reserves for {key} on {hosts:?}");
                assert!(!slots.contains(&key.owner), "{key}: a slot on its owner");
                let mut distinct = slots.clone();
                distinct.sort_unstable();
                distinct.dedup();
                assert_eq!(distinct.len(), slots.len(), "{key}: one slot per worker");
            }
            for a in 0..6 {
                for b in 0..6 {
                    let one = base.relocate(&[a]).expect("one failure has reserves");
                    let Some(both) = base.relocate(&[a, b]) else { continue };
                    let stepwise = one.relocate(&[b, a]).expect("the same set");
                    for key in base.keys() {
                        assert_eq!(stepwise.route(key), both.route(key), "{key} after {a},{b}");
                        let before = base.route(key).unwrap();
                        let after = both.route(key).unwrap();
                        assert!(after.iter().all(|c| c.worker != a && c.worker != b));
                        for kept in before.iter().filter(|c| c.worker != a && c.worker != b) {
                            assert!(after.contains(kept), "{key}: live holder {kept:?} moved");
                        }
                        for copy in after {
                            let hosted = &layouts[copy.worker as usize].local;
                            assert!(hosted.contains(&(key, copy.disp)), "{key} at {copy:?}");
                        }
                    }
                }
            }
            let exhausted: Vec<i32> = (1..6).collect();
            assert!(base.relocate(&exhausted).is_none(), "no candidate left for worker 0's keys");
        }
    }

    /// What lets a localized store call on a key whose holders all live go ahead while the
    /// repairer moves other keys: relocation changes only the routes that lost a holder.
    #[test]
    fn a_route_without_a_failed_holder_is_the_same_after_relocation() {
        let g = SlotGeometry::new(64);
        let live: Vec<i32> = (0..8).collect();
        for hosts in [vec![0; 8], vec![0, 0, 0, 0, 1, 1, 1, 1], vec![0, 1, 2, 0, 1, 2, 0, 1]] {
            let shape = Shape { kinds: 2, copies: 2, spares: 2 };
            let base = Layout::with_spares(&live, &hosts, shape, g, 0);
            for failed in [vec![7], vec![0, 5], vec![1, 2, 3]] {
                let Some(next) = base.relocate(&failed) else { continue };
                for key in base.keys() {
                    let before = base.route(key).unwrap();
                    if before.iter().all(|c| !failed.contains(&c.worker)) {
                        assert_eq!(next.route(key), Some(before), "{key} after {failed:?}");
                    }
                }
            }
        }
    }
}
