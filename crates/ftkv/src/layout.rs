//! Where every copy of every key lives in one recovery epoch: holder ranks and window offsets,
//! derived from [`placement::holders`](crate::placement::holders).

use crate::key::Key;
use crate::placement::holders;
use crate::slot::SlotGeometry;

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

/// The routes of all keys for a live set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Stable ids of the live workers; index = rank in the current communicator.
    pub live: Vec<i32>,
    workers: usize,
    kinds: usize,
    routes: Vec<Vec<Copy>>,
    /// Slots this rank hosts, with their offsets in its window.
    pub local: Vec<(Key, i64)>,
    pub window_len: usize,
}

impl Layout {
    /// The layout for `live` workers, as seen by rank `me` (a stable id). `hosts[w]` is the host
    /// of worker `w`, for every worker ever (dead ones included): their number is `hosts.len()`.
    pub fn compute(
        live: &[i32],
        hosts: &[u32],
        kinds: usize,
        copies: usize,
        geometry: SlotGeometry,
        me: i32,
    ) -> Layout {
        let workers = hosts.len();
        let mut used = vec![0usize; live.len()];
        let mut routes = Vec::with_capacity(workers * kinds);
        let mut local = Vec::new();
        for owner in 0..workers as i32 {
            for kind in 0..kinds as u16 {
                let mut route = Vec::with_capacity(copies);
                for worker in holders(owner, kind, live, hosts, copies) {
                    let rank = live.iter().position(|&w| w == worker).expect("holder is live");
                    let disp = (used[rank] * geometry.slot_len()) as i64;
                    used[rank] += 1;
                    if worker == me {
                        local.push((Key::new(owner, kind), disp));
                    }
                    route.push(Copy { rank: rank as i32, worker, disp });
                }
                routes.push(route);
            }
        }
        let mine = live.iter().position(|&w| w == me).map_or(0, |r| used[r]);
        let window_len = mine.max(1) * geometry.slot_len();
        Layout { live: live.to_vec(), workers, kinds, routes, local, window_len }
    }

    /// The copies of `key`, or `None` for a key outside the store.
    pub fn route(&self, key: Key) -> Option<&[Copy]> {
        let owner = usize::try_from(key.owner).ok().filter(|&o| o < self.workers)?;
        let kind = Some(key.kind as usize).filter(|&k| k < self.kinds)?;
        self.routes.get(owner * self.kinds + kind).map(Vec::as_slice)
    }

    /// Every key of the store.
    pub fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        (0..self.workers as i32)
            .flat_map(move |o| (0..self.kinds as u16).map(move |k| Key::new(o, k)))
    }
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
                assert_eq!(layout.window_len, 4 * g.slot_len());
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
}
