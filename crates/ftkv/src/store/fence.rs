//! Fencing failed writers out of the slots a rank holds, and reading slots through fences.
//!
//! One-sided writes cannot be refused at the target, so a holder fences after the fact: once
//! it learns that a worker failed, it records in each slot that worker wrote (or owns) the
//! newest version the slot held at that moment ([`crate::slot::Fence`]). Every reader, local
//! or remote, then ignores the worker's halves above that version, so a write the failed
//! worker issued late (stopped, slow, or in flight) may still land but is never read back as
//! current. The detector thread fences within one poll interval of learning of a failure;
//! the store fences again before it repairs or recovers, so nothing is copied unfenced.
//!
//! Limits: a slot records at most [`MAX_FENCED`] writers between two global recoveries, and a
//! handed writer that had not written a slot before it failed is fenced there only if it owns
//! the key (its first late write into a foreign slot is not told apart).

use std::sync::Mutex;

use crate::engine::layout::{Copy, Layout};
use crate::fabric::{FabricError, FabricResult, FabricWindow, RmaOps};
use crate::key::Key;
use crate::slot::{
    newest_loaded, Committed, Fence, FenceRead, Header, SlotGeometry, FENCE_LEN, HEADER_LEN,
    MAX_FENCED,
};
use crate::store::halves::{read_data, read_local_data};

/// Reads of a remote fence block caught while its holder rewrote it, before giving up.
const TORN_FENCE_RETRIES: usize = 1000;

/// Reads of a slot whose halves changed under the reader, before its last read stands.
const CHANGING_SLOT_RETRIES: usize = 100;

/// Runs `read` (one read of a slot: its newest complete version, and whether a header it did
/// not void named a version) again while it finds no complete version although a header named
/// one: a write replaced the halves while they were read (a writer can invalidate both halves
/// of a slot between one reader's header and data reads). After [`CHANGING_SLOT_RETRIES`]
/// reads the last one stands, so a half a dead writer left torn is read as such.
fn settled(
    mut read: impl FnMut() -> FabricResult<(Option<Committed>, bool)>,
) -> FabricResult<Option<Committed>> {
    let mut newest = None;
    for _ in 0..CHANGING_SLOT_RETRIES {
        let (found, named) = read()?;
        newest = found;
        if newest.is_some() || !named {
            break;
        }
    }
    Ok(newest)
}

/// Whether a header of `headers` that `fence` does not void names a version.
fn names_a_version(headers: &[(usize, Header)], fence: &Fence) -> bool {
    headers.iter().any(|(_, h)| !fence.voids(h))
}

/// The workers fenced so far in the slots one rank hosts in one window.
#[derive(Debug, Default)]
pub(crate) struct Fencer {
    fenced: Mutex<Vec<i32>>,
}

impl Fencer {
    /// Fences every worker of `failed` not fenced yet in every slot of `layout` this rank
    /// hosts in `window` that the worker owns or wrote; returns how many slots got a new fence.
    /// Safe to call from several threads (one fences at a time). On an error the workers of
    /// this call count as not fenced yet, and the next call fences them again.
    pub fn fence<W: FabricWindow>(
        &self,
        window: &W,
        layout: &Layout,
        failed: &[i32],
    ) -> FabricResult<usize> {
        let mut fenced = crate::rt::lock(&self.fenced);
        let new: Vec<i32> = failed.iter().copied().filter(|w| !fenced.contains(w)).collect();
        if new.is_empty() {
            return Ok(0);
        }
        window.sync()?;
        let mut changed = 0;
        for &(key, disp) in &layout.local {
            if fence_slot(window, key, disp as usize, &new, layout.geometry())? {
                changed += 1;
            }
        }
        fenced.extend(new);
        Ok(changed)
    }
}

/// Adds `new` failed workers to the fence of the slot at `disp`; whether it changed.
fn fence_slot<W: FabricWindow>(
    window: &W,
    key: Key,
    disp: usize,
    new: &[i32],
    geometry: SlotGeometry,
) -> FabricResult<bool> {
    let (mut fence, headers) = read_local_headers(window, disp, geometry)?;
    let wrote_here = |w: &i32| *w == key.owner || headers.iter().any(|(_, h)| h.writer == *w);
    let to_fence: Vec<i32> =
        new.iter().copied().filter(|w| wrote_here(w) && !fence.fences(*w)).collect();
    if to_fence.is_empty() {
        // Nothing to record: the data (possibly a large value) is not read.
        return Ok(false);
    }
    let current = newest_local_version(window, disp, geometry, &fence, &headers)?;
    let mut changed = false;
    for worker in to_fence {
        if fence.entries.len() == MAX_FENCED {
            crate::events::warn(format!(
                "slot of key {key} already fences {MAX_FENCED} writers; worker {worker} is not fenced there"
            ));
            continue;
        }
        fence.entries.push((worker, current));
        changed = true;
    }
    if changed {
        window.write_local(disp, &fence.encode())?;
    }
    Ok(changed)
}

/// The fence and the decodable half headers (with their index) of a slot in this rank's
/// window. Only this rank writes its fences (under the fencer's lock), so a local fence block is
/// never torn; one that does not decode counts as empty.
fn read_local_headers<W: FabricWindow>(
    window: &W,
    disp: usize,
    geometry: SlotGeometry,
) -> FabricResult<(Fence, Vec<(usize, Header)>)> {
    let mut fence = [0u8; FENCE_LEN];
    window.read_local(disp, &mut fence)?;
    let mut headers = Vec::with_capacity(2);
    for index in 0..2 {
        let mut header = [0u8; HEADER_LEN];
        window.read_local(disp + geometry.half_start(index), &mut header)?;
        if let Some(h) = Header::decode(&header) {
            headers.push((index, h));
        }
    }
    let fence = match Fence::decode(&fence) {
        FenceRead::Valid(fence) => fence,
        FenceRead::Torn => Fence::default(),
    };
    Ok((fence, headers))
}

/// The newest complete version `fence` does not void among a local slot's `headers`.
fn newest_local<W: FabricWindow>(
    window: &W,
    disp: usize,
    geometry: SlotGeometry,
    fence: &Fence,
    headers: &[(usize, Header)],
) -> FabricResult<Option<Committed>> {
    newest_loaded(headers, fence, |index, header| {
        read_local_data(window, disp, geometry, index, header)
    })
}

/// The version of a local slot's newest complete version that `fence` does not void (0:
/// none), from its `headers` as read. An ordered header stands for its value, which landed
/// before it ([`crate::slot`]), so only when the newest header is hashed is the slot read and
/// its data checked: fencing a slot that holds a large value does not read the value, and a
/// failure is published as soon as the slots are fenced.
fn newest_local_version<W: FabricWindow>(
    window: &W,
    disp: usize,
    geometry: SlotGeometry,
    fence: &Fence,
    headers: &[(usize, Header)],
) -> FabricResult<u64> {
    let unfenced = headers.iter().map(|(_, h)| h).filter(|h| !fence.voids(h));
    match unfenced.max_by_key(|h| h.version) {
        None => Ok(0),
        Some(newest) if newest.is_ordered() => Ok(newest.version),
        Some(_) => Ok(read_local_slot(window, disp, geometry)?.map_or(0, |c| c.header.version)),
    }
}

/// The newest complete, unfenced version of a slot in this rank's own window.
pub(crate) fn read_local_slot<W: FabricWindow>(
    window: &W,
    disp: usize,
    geometry: SlotGeometry,
) -> FabricResult<Option<Committed>> {
    settled(|| {
        let (fence, headers) = read_local_headers(window, disp, geometry)?;
        let newest = newest_local(window, disp, geometry, &fence, &headers)?;
        Ok((newest, names_a_version(&headers, &fence)))
    })
}

/// Reads one remote copy (fence block and both headers in one scope, then the data of the
/// newest decodable half, and of the older only when the newest is incomplete) and returns its
/// newest complete, unfenced version; again while its halves change under the read
/// ([`settled`]).
pub(crate) fn read_copy<W: FabricWindow>(
    window: &W,
    copy: &Copy,
    geometry: SlotGeometry,
) -> FabricResult<Option<Committed>> {
    settled(|| {
        let mut blocks = [[0u8; HEADER_LEN]; 3];
        let (fence, raw) = read_fence_and_headers(window, copy, geometry, &mut blocks)?;
        let headers: Vec<(usize, Header)> = raw
            .iter()
            .enumerate()
            .filter_map(|(i, bytes)| Some((i, Header::decode(bytes)?)))
            .collect();
        let newest = newest_loaded(&headers, &fence, |index, header| {
            read_data(window, copy, geometry, index, header)
        })?;
        Ok((newest, names_a_version(&headers, &fence)))
    })
}

/// The highest version a header of one remote copy names that its fence does not void (0:
/// none), from one scope of three small gets: whether a newer version than one about to be
/// copied there was written meanwhile (complete or still being written).
pub(crate) fn newest_header_version<W: FabricWindow>(
    window: &W,
    copy: &Copy,
    geometry: SlotGeometry,
) -> FabricResult<u64> {
    Ok(newest_unfenced_header(window, copy, geometry)?.map_or(0, |h| h.version))
}

/// The newest header of one remote copy that its fence does not void (`None`: no half names a
/// version), from one scope of three small gets.
pub(crate) fn newest_unfenced_header<W: FabricWindow>(
    window: &W,
    copy: &Copy,
    geometry: SlotGeometry,
) -> FabricResult<Option<Header>> {
    let mut blocks = [[0u8; HEADER_LEN]; 3];
    let (fence, headers) = read_fence_and_headers(window, copy, geometry, &mut blocks)?;
    let headers = headers.iter().filter_map(|bytes| Header::decode(bytes));
    Ok(headers.filter(|h| !fence.voids(h)).max_by_key(|h| h.version))
}

/// The fence and the two half headers of a remote slot, read again while the fence is caught
/// mid-rewrite.
fn read_fence_and_headers<'b, W: FabricWindow>(
    window: &W,
    copy: &Copy,
    geometry: SlotGeometry,
    blocks: &'b mut [[u8; HEADER_LEN]; 3],
) -> FabricResult<(Fence, &'b [[u8; HEADER_LEN]])> {
    for _ in 0..TORN_FENCE_RETRIES {
        let [fence, h0, h1] = &mut *blocks;
        window.scope(|s| {
            s.get(copy.rank, copy.disp, fence)?;
            s.get(copy.rank, copy.disp + geometry.half_start(0) as i64, h0)?;
            s.get(copy.rank, copy.disp + geometry.half_start(1) as i64, h1)
        })?;
        if let FenceRead::Valid(fence) = Fence::decode(&blocks[0]) {
            return Ok((fence, &blocks[1..]));
        }
    }
    Err(FabricError::Other {
        op: "read a copy",
        msg: format!("the fence of worker {}'s slot stayed torn", copy.worker),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::fabric::local::{LocalCluster, LocalWindow};
    use crate::fabric::Fabric;

    /// A window that counts the bytes read from its own memory.
    struct Counting {
        window: LocalWindow,
        read: AtomicUsize,
    }

    impl FabricWindow for Counting {
        type Scope<'buf> = <LocalWindow as FabricWindow>::Scope<'buf>;

        fn scope<'buf, R>(
            &self,
            issue: impl FnOnce(&mut Self::Scope<'buf>) -> FabricResult<R>,
        ) -> FabricResult<R> {
            self.window.scope(issue)
        }
        fn sync(&self) -> FabricResult<()> {
            self.window.sync()
        }
        fn read_local(&self, offset: usize, out: &mut [u8]) -> FabricResult<()> {
            self.read.fetch_add(out.len(), Ordering::Relaxed);
            self.window.read_local(offset, out)
        }
        fn read_local_extent(&self, id: u64, out: &mut [u8]) -> FabricResult<()> {
            self.read.fetch_add(out.len(), Ordering::Relaxed);
            self.window.read_local_extent(id, out)
        }
        fn write_local(&self, offset: usize, data: &[u8]) -> FabricResult<()> {
            self.window.write_local(offset, data)
        }
        fn compare_and_swap(&self, t: i32, d: i64, c: u64, s: u64) -> FabricResult<u64> {
            self.window.compare_and_swap(t, d, c, s)
        }
        fn close(self) -> FabricResult<()> {
            self.window.close()
        }
        fn abandon(self) {
            self.window.abandon()
        }
    }

    /// Writes `header` and `data` into half `index` of the slot at 0 of `window`.
    fn write_half(
        window: &Counting,
        geometry: SlotGeometry,
        index: usize,
        header: Header,
        data: &[u8],
    ) {
        let at = geometry.half_start(index);
        window.write_local(at + HEADER_LEN, data).unwrap();
        window.write_local(at, &header.encode()).unwrap();
    }

    #[test]
    fn fencing_a_slot_whose_newest_header_is_ordered_reads_no_value() {
        let value = vec![7u8; 1 << 20];
        let geometry = SlotGeometry::new(value.len());
        let versions = LocalCluster::new(1).run(|fabric| {
            let window = fabric.open_window(geometry.slot_len(), &[]).unwrap();
            let window = Counting { window, read: AtomicUsize::new(0) };
            let older = Header::for_ordered_value(value.len(), 1, 0, 1).hashed(&value);
            write_half(&window, geometry, 0, older, &value);
            write_half(
                &window,
                geometry,
                1,
                Header::for_ordered_value(value.len(), 2, 0, 1),
                &value,
            );
            let (fence, headers) = read_local_headers(&window, 0, geometry).unwrap();
            window.read.store(0, Ordering::Relaxed);
            let ordered = newest_local_version(&window, 0, geometry, &fence, &headers).unwrap();
            let read_for_ordered = window.read.load(Ordering::Relaxed);
            let newer = Header::for_ordered_value(value.len(), 3, 0, 1).hashed(&value);
            write_half(&window, geometry, 0, newer, &value);
            let (fence, headers) = read_local_headers(&window, 0, geometry).unwrap();
            window.read.store(0, Ordering::Relaxed);
            let hashed = newest_local_version(&window, 0, geometry, &fence, &headers).unwrap();
            let read_for_hashed = window.read.load(Ordering::Relaxed);
            (ordered, read_for_ordered, hashed, read_for_hashed)
        });
        let (ordered, read_for_ordered, hashed, read_for_hashed) = versions[0].unwrap();
        assert_eq!((ordered, read_for_ordered), (2, 0), "an ordered header stands for its value");
        assert_eq!(hashed, 3, "a hashed newest version, checked against its data");
        assert!(read_for_hashed >= value.len(), "the hashed value was read ({read_for_hashed} B)");
    }
}
