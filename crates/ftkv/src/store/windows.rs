//! What a store's windows look like, as one value: the window, the layout its slots follow
//! (whose slot geometry it carries), the recovery epoch it belongs to, and the workers fenced
//! out of this rank's slots in it. Creation opens the first [`Windows`]; a global recovery
//! opens the next and replaces the store's as a whole. The store's calls, the detector's
//! fencing, the repairer and the replicator all take the windows from there (the threads hold
//! an `Arc` of them), so none keeps a copy of its own that a recovery could leave behind.

use std::collections::HashMap;
use std::sync::Arc;

use crate::engine::layout::{Copy, Layout, MARKS_LEN, RECOVERY_MARK_AT};
use crate::error::Result;
use crate::fabric::{Fabric, FabricResult, FabricWindow};
use crate::key::Key;
use crate::slot::{Committed, Header, SlotGeometry, FENCE_LEN, HEADER_LEN};
use crate::store::fence::{read_local_slot, Fencer};
use crate::store::halves;

/// This rank's part of a store's windows of one epoch: its window, with the layout of every
/// rank's slots.
pub(crate) struct Windows<W> {
    window: W,
    /// The layout the windows were built with: the routes of a fresh set of windows (the
    /// store's routes start from it and follow failures without new windows).
    layout: Layout,
    /// The recovery epoch, which the headers written here name: 0 at creation; a recovery
    /// attempt's windows number one more than the windows opened before them.
    epoch: u64,
    fencer: Fencer,
}

impl<W: FabricWindow> Windows<W> {
    /// Allocates the window of `layout` collectively on `comm`, empties this rank's recovery
    /// mark and slot headers, opens the lock_all epoch and waits until every rank did, so no put can land
    /// before the headers are cleared. Fails with the fabric's error when the allocation or
    /// the barrier does (a process failure among the members, for one).
    pub fn open<F: Fabric<Window = W>>(comm: &F, layout: Layout, epoch: u64) -> Result<Self> {
        let geometry = layout.geometry();
        let headers = layout.local.iter().flat_map(|&(_, disp)| {
            let disp = disp as usize;
            let halves = [0, 1].map(|i| (disp + geometry.half_start(i), HEADER_LEN));
            [(disp, FENCE_LEN), halves[0], halves[1]]
        });
        let zeroed: Vec<_> = std::iter::once((0, MARKS_LEN)).chain(headers).collect();
        let window = comm.open_window(layout.window_len, &zeroed)?;
        comm.barrier()?;
        Ok(Windows { window, layout, epoch, fencer: Fencer::default() })
    }

    pub fn window(&self) -> &W {
        &self.window
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn geometry(&self) -> SlotGeometry {
        self.layout.geometry()
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Fences every worker of `failed` not fenced yet out of the slots this rank hosts (see
    /// [`Fencer::fence`]); returns how many slots got a new fence.
    pub fn fence(&self, failed: &[i32]) -> FabricResult<usize> {
        self.fencer.fence(&self.window, &self.layout, failed)
    }

    /// The newest complete version of every slot this rank hosts, after fencing every worker
    /// of these windows that is not in `live` (a shrunk communicator's workers). Fails with
    /// the fabric's error of the fencing or of the local reads.
    pub fn scan(&self, live: &[i32]) -> Result<HashMap<Key, Committed>> {
        let gone: Vec<i32> =
            self.layout.live.iter().copied().filter(|w| !live.contains(w)).collect();
        self.fence(&gone)?;
        self.window.sync()?;
        let mut found = HashMap::new();
        for &(key, disp) in &self.layout.local {
            if let Some(committed) = read_local_slot(&self.window, disp as usize, self.geometry())?
            {
                found.insert(key, committed);
            }
        }
        Ok(found)
    }

    /// Writes the versions of `sends` (from `held`) to their holders in these windows, each
    /// complete at its holders when it returns. Fails at the first fabric error (the versions
    /// written until then stay).
    pub fn copy_out(&self, sends: &[Key], held: &HashMap<Key, Committed>) -> Result<()> {
        for key in sends {
            let route = self.layout.route(*key).expect("planned keys are routed");
            self.put_committed(route, &held[key])?;
        }
        Ok(())
    }

    /// Writes a committed version (data and header into the version's half) to every copy of
    /// `targets`, completed by one scope. The copy's header is hashed whatever the original's
    /// integrity ([`Header::hashed`]): a copy may meet another writer in its half.
    fn put_committed(&self, targets: &[Copy], committed: &Committed) -> FabricResult<()> {
        let header = committed.header.hashed(&committed.data);
        halves::write_extents(&self.window, targets, self.geometry(), &header, &committed.data)?;
        self.put_inline(targets, header, &committed.data)
    }

    /// The rest of a version's write once its value's extents were written: the inline value
    /// (if it fits) and `header`, the one-sided calls the watchdog bounds. Complete at every
    /// target when it returns `Ok`.
    pub fn put_inline(&self, targets: &[Copy], header: Header, data: &[u8]) -> FabricResult<()> {
        let encoded = header.encode();
        let out = halves::Outgoing { header, encoded: &encoded, data, free_stale: true };
        self.window.scope(|s| halves::issue_version(s, targets, self.geometry(), &out))
    }

    /// The recovery mark of the member of rank `rank` in these windows (0 until it marked one):
    /// read by compare-and-swap, so never torn. Fails with the fabric's error (a failure error
    /// for a dead member on another host; on this host a dead member's last mark is read).
    pub fn recovery_mark(&self, rank: i32) -> FabricResult<u64> {
        self.window.compare_and_swap(rank, RECOVERY_MARK_AT as i64, 0, 0)
    }

    /// Raises the recovery mark of this member (rank `me`) to `mark`; a higher mark stays.
    /// Complete when it returns: a member that reads the mark afterwards sees it.
    pub fn raise_recovery_mark(&self, me: i32, mark: u64) -> FabricResult<()> {
        let mut held = self.recovery_mark(me)?;
        while held < mark {
            let before = self.window.compare_and_swap(me, RECOVERY_MARK_AT as i64, held, mark)?;
            if before == held {
                break;
            }
            held = before;
        }
        Ok(())
    }

    /// The window itself, to free or abandon.
    pub fn into_window(self) -> W {
        self.window
    }

    /// The window of shared windows, once nothing else holds them (the detector, repairer
    /// and replicator threads stopped); `None` while something still does.
    pub fn unshared(this: Arc<Self>) -> Option<W> {
        Arc::try_unwrap(this).ok().map(Windows::into_window)
    }

    /// Frees the window of windows a recovery replaced (collective over their members). Still
    /// shared, they stay allocated with a warning; an error of the free is returned.
    pub fn close_replaced(this: Arc<Self>) -> Result<()> {
        match Self::unshared_or_warn(this) {
            Some(window) => Ok(window.close()?),
            None => Ok(()),
        }
    }

    /// Leaves the window of windows a recovery replaced allocated until the process ends,
    /// without a collective call.
    pub fn abandon_replaced(this: Arc<Self>) {
        if let Some(window) = Self::unshared_or_warn(this) {
            window.abandon();
        }
    }

    fn unshared_or_warn(this: Arc<Self>) -> Option<W> {
        let window = Self::unshared(this);
        if window.is_none() {
            crate::events::warn("a retained window is still shared; it stays allocated");
        }
        window
    }
}
