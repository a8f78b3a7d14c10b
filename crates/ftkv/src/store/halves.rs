//! One version's bytes into and out of a copy's slot: into the window when the value fits the
//! slot's inline capacity, into the half's extent when it does not (see [`SlotGeometry`]).
//!
//! Every write puts [`INVALIDATED_HEADER`] over the half's header before any byte of the value,
//! then the value, then the header; the fabric applies one target's operations in issue order.
//! A reader trusts a hashed header's data only when it matches the hash, and an ordered one's
//! ([`crate::slot::Integrity::Ordered`], the owner's own puts) only when the header reads the
//! same after the data. Either way a value in an extent is as safe from torn writes as one in
//! the window.

use crate::engine::layout::Copy;
use crate::fabric::{FabricResult, FabricWindow, RmaOps};
use crate::slot::{Header, SlotGeometry, HEADER_LEN, INVALIDATED_HEADER};

/// Writes `data`, `header`'s value, into the half's extent of every copy of `targets` when it
/// is too large for the slot (nothing otherwise), in a scope of its own, complete when it
/// returns; the half's header is invalidated before each extent ([`issue_invalidation`]). Extents are files on this host or reached through the holder's
/// serving thread on another, so this never waits on a dead holder (a file write completes; a
/// connection to a dead process ends): it runs outside the watchdog's bound on one-sided MPI
/// calls, which would otherwise have to grow with the bytes and with the writers sharing the
/// host's memory bandwidth.
pub(crate) fn write_extents<W: FabricWindow>(
    window: &W,
    targets: &[Copy],
    geometry: SlotGeometry,
    header: &Header,
    data: &[u8],
) -> FabricResult<()> {
    if !geometry.in_extent(data.len() as u64) {
        return Ok(());
    }
    let version = header.version;
    window.scope(|s| {
        for copy in targets {
            issue_invalidation(s, copy, geometry, version)?;
            s.put_extent(copy.rank, SlotGeometry::extent_id(copy.disp, version), data)?;
        }
        Ok(())
    })
}

/// Issues `data`, version `version`'s value, to `copy`'s slot when it fits inline (complete
/// when the scope completes); a larger value was written by [`write_extents`] before. With
/// `free_stale`, an inline value also gives back the half's extent, which an earlier, larger
/// value of that half left.
pub(crate) fn issue_data<'b, S: RmaOps<'b>>(
    s: &mut S,
    copy: &Copy,
    geometry: SlotGeometry,
    version: u64,
    data: &'b [u8],
    free_stale: bool,
) -> FabricResult<()> {
    if geometry.in_extent(data.len() as u64) {
        return Ok(());
    }
    let half = geometry.half_offset(version) as i64;
    s.put(copy.rank, copy.disp + half + HEADER_LEN as i64, data)?;
    if free_stale {
        s.free_extent(copy.rank, SlotGeometry::extent_id(copy.disp, version))?;
    }
    Ok(())
}

/// The bytes of `data` that go through one-sided MPI calls to each copy: the value when it
/// fits inline, and the header (for the watchdog's bound).
pub(crate) fn inline_bytes(geometry: SlotGeometry, data: &[u8]) -> usize {
    let inline = if geometry.in_extent(data.len() as u64) { 0 } else { data.len() };
    inline + HEADER_LEN
}

/// Issues [`INVALIDATED_HEADER`] over the header of `version`'s half in `copy`'s slot: what
/// every write issues before it changes any byte of the half's value or extent. A reader that
/// holds the half's previous header, ordered or hashed, then finds it changed: an ordered
/// header has no hash that would tell a value overwritten under it (see
/// [`crate::slot::Integrity::Ordered`]).
pub(crate) fn issue_invalidation<'b, S: RmaOps<'b>>(
    s: &mut S,
    copy: &Copy,
    geometry: SlotGeometry,
    version: u64,
) -> FabricResult<()> {
    s.put(copy.rank, copy.disp + geometry.half_offset(version) as i64, &INVALIDATED_HEADER)
}

/// Issues the encoded header of `version` to `copy`'s slot.
pub(crate) fn issue_header<'b, S: RmaOps<'b>>(
    s: &mut S,
    copy: &Copy,
    geometry: SlotGeometry,
    version: u64,
    encoded: &'b [u8],
) -> FabricResult<()> {
    s.put(copy.rank, copy.disp + geometry.half_offset(version) as i64, encoded)
}

/// One version on its way to a slot: its header, encoded header and value, and whether its
/// half's extent is stale ([`issue_data`]).
pub(crate) struct Outgoing<'b> {
    pub header: Header,
    pub encoded: &'b [u8],
    pub data: &'b [u8],
    pub free_stale: bool,
}

/// Issues a whole version to each of `targets`: the half's header invalidated first, then the
/// data, then the header (a value in extents was written by [`write_extents`] before).
pub(crate) fn issue_version<'b, S: RmaOps<'b>>(
    s: &mut S,
    targets: &[Copy],
    geometry: SlotGeometry,
    out: &Outgoing<'b>,
) -> FabricResult<()> {
    let version = out.header.version;
    for copy in targets {
        issue_value(s, copy, geometry, &out.header, out.data, out.free_stale)?;
        issue_header(s, copy, geometry, version, out.encoded)?;
    }
    Ok(())
}

/// Issues what goes before a version's header to `copy`: the invalidation of the half (when the
/// value is inline: an extent's write invalidated it), then the inline value ([`issue_data`]).
pub(crate) fn issue_value<'b, S: RmaOps<'b>>(
    s: &mut S,
    copy: &Copy,
    geometry: SlotGeometry,
    header: &Header,
    data: &'b [u8],
    free_stale: bool,
) -> FabricResult<()> {
    if !geometry.in_extent(data.len() as u64) {
        issue_invalidation(s, copy, geometry, header.version)?;
    }
    issue_data(s, copy, geometry, header.version, data, free_stale)
}

/// Copies `header`'s version, found in `source`'s slot, into the slot of every copy of
/// `targets` holder to holder, without a buffer of this member's: the half invalidated on each
/// target, the value copied memory to memory (or extent to extent, freeing a stale extent after
/// an inline value), then `source`'s header read again and, only when it reads the same, the
/// header written to every target. Complete at the targets when it returns `true`.
///
/// `false` (nothing written, or only invalidated halves, which hold no version) when it does
/// not apply: `header` is not ordered (a hashed value is checked against its hash, which needs
/// the bytes here), names more than the store's largest value, or a member is on another host;
/// or when `source`'s half changed during the copy (a newer write): the caller copies the
/// usual way.
pub(crate) fn copy_between_holders<W: FabricWindow>(
    window: &W,
    source: &Copy,
    targets: &[Copy],
    geometry: SlotGeometry,
    header: &Header,
    free_stale: bool,
) -> FabricResult<bool> {
    let len = header.len;
    if !header.is_ordered() || len > geometry.max_value as u64 {
        return Ok(false);
    }
    if !all_on_this_host(window, std::iter::once(source).chain(targets))? {
        return Ok(false);
    }
    let version = header.version;
    let half = geometry.half_offset(version) as i64;
    window.scope(|s| {
        for copy in targets {
            issue_invalidation(s, copy, geometry, version)?;
            let extent = |c: &Copy| SlotGeometry::extent_id(c.disp, version);
            if geometry.in_extent(len) {
                s.copy_extent(source.rank, extent(source), copy.rank, extent(copy), len)?;
            } else {
                let value = |c: &Copy| c.disp + half + HEADER_LEN as i64;
                s.copy(source.rank, value(source), copy.rank, value(copy), len as usize)?;
                if free_stale {
                    s.free_extent(copy.rank, extent(copy))?;
                }
            }
        }
        Ok(())
    })?;
    let mut again = [0u8; HEADER_LEN];
    window.scope(|s| s.get(source.rank, source.disp + half, &mut again))?;
    if !unchanged(header, &again) {
        return Ok(false);
    }
    let encoded = header.encode();
    window.scope(|s| {
        for copy in targets {
            issue_header(s, copy, geometry, version, &encoded)?;
        }
        Ok(())
    })?;
    Ok(true)
}

/// Whether every one of `copies` is held on this member's host, where
/// [`copy_between_holders`] reaches it.
pub(crate) fn all_on_this_host<'c, W: FabricWindow>(
    window: &W,
    copies: impl IntoIterator<Item = &'c Copy>,
) -> FabricResult<bool> {
    window.scope(|s| {
        for copy in copies {
            if !s.on_this_host(copy.rank)? {
                return Ok(false);
            }
        }
        Ok(true)
    })
}

/// The bytes `header` (decoded from half `index` of `copy`) names, read from the window or the
/// half's extent; `None` for a length above the store's largest value (a half to ignore), and
/// for an ordered header that no longer reads the same once the value is read (a write
/// replaced the half meanwhile).
pub(crate) fn read_data<W: FabricWindow>(
    window: &W,
    copy: &Copy,
    geometry: SlotGeometry,
    index: usize,
    header: &Header,
) -> FabricResult<Option<Vec<u8>>> {
    let mut data = Vec::new();
    let whole = read_data_into(window, copy, geometry, index, header, &mut data)?;
    Ok(whole.then_some(data))
}

/// As [`read_data`], into `data` (resized to the value): `false` where that returns `None`.
pub(crate) fn read_data_into<W: FabricWindow>(
    window: &W,
    copy: &Copy,
    geometry: SlotGeometry,
    index: usize,
    header: &Header,
    data: &mut Vec<u8>,
) -> FabricResult<bool> {
    let Some(len) = value_len(geometry, header) else { return Ok(false) };
    data.resize(len, 0);
    if geometry.in_extent(header.len) {
        let extent = SlotGeometry::extent_id(copy.disp, index as u64);
        window.scope(|s| s.get_extent(copy.rank, extent, data))?;
    } else {
        let at = copy.disp + (geometry.half_start(index) + HEADER_LEN) as i64;
        window.scope(|s| s.get(copy.rank, at, data))?;
    }
    if header.is_ordered() {
        let mut again = [0u8; HEADER_LEN];
        let at = copy.disp + geometry.half_start(index) as i64;
        window.scope(|s| s.get(copy.rank, at, &mut again))?;
        return Ok(unchanged(header, &again));
    }
    Ok(true)
}

/// As [`read_data`], from this rank's own slot at `disp`.
pub(crate) fn read_local_data<W: FabricWindow>(
    window: &W,
    disp: usize,
    geometry: SlotGeometry,
    index: usize,
    header: &Header,
) -> FabricResult<Option<Vec<u8>>> {
    let Some(mut data) = buffer_for(geometry, header) else { return Ok(None) };
    if geometry.in_extent(header.len) {
        window.read_local_extent(SlotGeometry::extent_id(disp as i64, index as u64), &mut data)?;
    } else {
        window.read_local(disp + geometry.half_start(index) + HEADER_LEN, &mut data)?;
    }
    if header.is_ordered() {
        let mut again = [0u8; HEADER_LEN];
        window.read_local(disp + geometry.half_start(index), &mut again)?;
        return Ok(unchanged(header, &again).then_some(data));
    }
    Ok(Some(data))
}

/// Whether the header bytes read again after a value still decode to `header`.
fn unchanged(header: &Header, again: &[u8]) -> bool {
    Header::decode(again).as_ref() == Some(header)
}

fn buffer_for(geometry: SlotGeometry, header: &Header) -> Option<Vec<u8>> {
    value_len(geometry, header).map(|len| vec![0u8; len])
}

/// The length `header` names, `None` above the store's largest value.
fn value_len(geometry: SlotGeometry, header: &Header) -> Option<usize> {
    usize::try_from(header.len).ok().filter(|&len| len <= geometry.max_value)
}

/// The halves of keys a writer last filled with a value in an extent: when an inline value
/// replaces one, the write gives the extent back. Knowing it here keeps the inline put free of
/// extent calls otherwise.
#[derive(Debug, Default)]
pub(crate) struct Spills {
    halves: std::collections::HashSet<(crate::key::Key, u64)>,
}

impl Spills {
    /// Whether writing `len` bytes as `key`'s `version` leaves its half's extent stale: the
    /// value fits inline and the half's last value was in the extent.
    pub fn stale(
        &self,
        key: crate::key::Key,
        version: u64,
        len: usize,
        geometry: SlotGeometry,
    ) -> bool {
        !self.halves.is_empty()
            && !geometry.in_extent(len as u64)
            && self.halves.contains(&(key, version % 2))
    }

    /// Records that `key`'s `version`, `len` bytes, is written on every copy.
    pub fn written(
        &mut self,
        key: crate::key::Key,
        version: u64,
        len: usize,
        geometry: SlotGeometry,
    ) {
        let half = (key, version % 2);
        if geometry.in_extent(len as u64) {
            self.halves.insert(half);
        } else if !self.halves.is_empty() {
            self.halves.remove(&half);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::local::LocalCluster;
    use crate::fabric::Fabric;

    /// A reader holds the header of an owner's ordered value while a later write of another
    /// kind, whose header is hashed, is under way in the same half: its value is written (a
    /// delete giving the half's extent back, or a handed value overwriting the inline bytes)
    /// and its header not yet. The reader's second look at the header finds the half changed,
    /// so it never takes the freed extent's zeros, or the overwritten bytes, for the value.
    #[test]
    fn a_reader_holding_an_ordered_header_sees_any_later_write_of_its_half() {
        let outcomes = LocalCluster::new(2).run(|fabric| {
            let geometry = SlotGeometry::new(64).limited(4096);
            let window = fabric.open_window(geometry.slot_len(), &[]).expect("window");
            let copy = Copy { rank: 1, worker: 1, disp: 0 };
            let mut outcomes = Vec::new();
            if fabric.rank() == 0 {
                for (len, in_extent) in [(1000, true), (10, false)] {
                    let ordered = Header::for_ordered_value(len, 3, 0, 0);
                    write_all(&window, &copy, geometry, &ordered, &vec![7u8; len]);
                    let (next, data) = match in_extent {
                        true => (Header::for_delete(5, 0, 0), vec![]),
                        false => (Header::for_value(&[9; 10], 5, 0, 1), vec![9u8; 10]),
                    };
                    write_before_header(&window, &copy, geometry, &next, &data, in_extent);
                    // Versions 3 and 5 share half 1.
                    let read = read_data(&window, &copy, geometry, 1, &ordered).expect("read");
                    outcomes.push(read.is_none());
                }
            }
            fabric.barrier().expect("barrier");
            outcomes
        });
        assert_eq!(outcomes[0], Some(vec![true, true]), "both stale reads are refused");
    }

    /// An ordered version, inline and in an extent, is copied holder to holder and reads back
    /// whole on both targets; a hashed one is left to the buffered way.
    #[test]
    fn an_ordered_version_is_copied_between_holders_and_a_hashed_one_is_not() {
        let outcomes = LocalCluster::new(3).run(|fabric| {
            let geometry = SlotGeometry::new(64).limited(1 << 16);
            let window = fabric.open_window(geometry.slot_len(), &[]).expect("window");
            let holder = |rank: i32| Copy { rank, worker: rank, disp: 0 };
            let (source, targets) = (holder(0), [holder(1), holder(2)]);
            let mut outcomes = Vec::new();
            if fabric.rank() == 0 {
                for (version, len) in [(3u64, 40usize), (4, 5000), (5, 20)] {
                    let value: Vec<u8> =
                        (0..len).map(|i| (i * 7 + version as usize) as u8).collect();
                    let ordered = Header::for_ordered_value(len, version, 0, 0);
                    write_all(&window, &source, geometry, &ordered, &value);
                    let copied =
                        copy_between_holders(&window, &source, &targets, geometry, &ordered, true);
                    let read = |copy: &Copy| {
                        read_data(&window, copy, geometry, (version % 2) as usize, &ordered)
                            .expect("read")
                    };
                    let whole = targets.iter().all(|c| read(c).as_deref() == Some(&value[..]));
                    outcomes.push((copied.expect("copy"), whole));
                }
                let hashed = Header::for_value(&[1; 8], 7, 0, 0);
                write_all(&window, &source, geometry, &hashed, &[1; 8]);
                let copied =
                    copy_between_holders(&window, &source, &targets, geometry, &hashed, true);
                outcomes.push((copied.expect("copy"), false));
            }
            fabric.barrier().expect("barrier");
            outcomes
        });
        let expected = vec![(true, true), (true, true), (true, true), (false, false)];
        assert_eq!(outcomes[0], Some(expected));
    }

    /// One whole write of `header` and `data` to `copy`, as a put issues it.
    fn write_all<W: FabricWindow>(
        window: &W,
        copy: &Copy,
        geometry: SlotGeometry,
        header: &Header,
        data: &[u8],
    ) {
        let targets = std::slice::from_ref(copy);
        write_extents(window, targets, geometry, header, data).expect("extent");
        let encoded = header.encode();
        let out = Outgoing { header: *header, encoded: &encoded, data, free_stale: false };
        window.scope(|s| issue_version(s, targets, geometry, &out)).expect("write");
    }

    /// What a write of an inline `data` under `header` issues before its header, giving back
    /// the half's extent when `free_stale`.
    fn write_before_header<W: FabricWindow>(
        window: &W,
        copy: &Copy,
        geometry: SlotGeometry,
        header: &Header,
        data: &[u8],
        free_stale: bool,
    ) {
        let issued = window.scope(|s| issue_value(s, copy, geometry, header, data, free_stale));
        issued.expect("write");
    }
}
