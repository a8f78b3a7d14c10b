//! The layout of one copy of a key in a holder's window, and its encoding.
//!
//! A slot is a fence block followed by two halves; version `v` goes into half `v mod 2`, so a
//! put never overwrites the newest complete version. A half is a 64-byte header followed by the
//! value bytes:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `FTKV` |
//! | 4..8 | state: 1 value, 2 deleted; bit 8 set: written in order, no hash |
//! | 8..16 | version (≥ 1) |
//! | 16..24 | value length |
//! | 24..32 | recovery epoch of the writer |
//! | 32..40 | xxh3 of the value bytes (0 when written in order) |
//! | 40..44 | the writer's worker id |
//! | 48..56 | xxh3 of bytes 0..48 |
//!
//! Every write gives each copy, in this order, [`INVALIDATED_HEADER`] over the half's header,
//! then the value, then the header (the fabric applies one target's operations in issue
//! order). A half's value is then known whole in one of two ways ([`Integrity`]). A hashed
//! header commits the xxh3 of the value, and a reader accepts the half only if both hashes
//! match. The owner's own puts, the hot path, hash nothing, and a reader accepts such a half
//! only if its header reads the same before and after the value. Either way a writer that dies
//! mid-put leaves a half that fails the check, and the reader falls back to the other half, the
//! previous complete version. Copies that other writers make (repairs, recoveries, handed and
//! transactional writes) are hashed: two of them may meet in one half (a repair and a thief),
//! and whichever header lands last may sit over the other's bytes, which only a hash tells.
//!
//! The fence block (64 bytes) is written only by the slot's holder, never by writers: once the
//! holder learns that a worker failed, it records `(writer, version)`, the newest version the
//! slot held then, and readers ignore every half of that writer with a higher version. A write
//! the failed worker issued late (it was stopped, slow, or its put was in flight) can land in
//! the slot but is never read back as current:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `FNCE` |
//! | 4..8 | entries (≤ 3) |
//! | 8..44 | per entry: writer id (4 bytes), version (8 bytes) |
//! | 48..56 | xxh3 of bytes 0..48 |
//! | 56..64 | lock word of transactions: 0 free, else the id of the holding transaction |
//!
//! The lock word changes only by compare-and-swap ([`crate::fabric::FabricWindow::compare_and_swap`]),
//! from any member; fence writes stop before it.

/// XXH3 (64 bit); `twox-hash` picks its AVX2 loop at run time where the CPU has it (about twice
/// as fast as SSE2 on a 1 MiB value, which a hashed copy's writer and readers hash).
pub(crate) fn xxh3_64(bytes: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(bytes)
}

pub const HEADER_LEN: usize = 64;
/// Bytes of the fence block at the start of every slot (as long as a header, so one buffer
/// shape serves both).
pub const FENCE_LEN: usize = HEADER_LEN;
/// Where a slot's lock word lies (8 bytes, 8-byte aligned when the slot is): the end of the
/// fence block, which fence writes leave alone.
pub const LOCK_AT: usize = FENCE_LEN - 8;
const MAGIC: [u8; 4] = *b"FTKV";
/// The state word's bit of an [`Integrity::Ordered`] header.
const ORDERED: u32 = 1 << 8;
/// What a writer in order puts over a half's header before it writes the value: not a header
/// (it decodes as an empty half), so no reader takes the half while its value changes.
pub static INVALIDATED_HEADER: [u8; HEADER_LEN] = [0; HEADER_LEN];
const FENCE_MAGIC: [u8; 4] = *b"FNCE";
/// Fenced writers a slot can record; a slot has one writer at a time, so more than its owner
/// and two handed writers failing between two global recoveries is not expected.
pub const MAX_FENCED: usize = 3;

/// What a committed half holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Value,
    Deleted,
}

/// How a reader tells that a half's value bytes are the whole value its header commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Integrity {
    /// The xxh3 of the value bytes: whatever order its bytes landed in.
    Hash(u64),
    /// Written in order by the key's only writer, its owner: the header invalidated, then the
    /// value, then the header. The value is whole when the half's header reads the same
    /// before and after it.
    Ordered,
}

/// A decoded, self-consistent header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub state: State,
    pub version: u64,
    pub len: u64,
    pub epoch: u64,
    pub integrity: Integrity,
    /// The worker that wrote this version (a copy made in recovery keeps the original writer).
    pub writer: i32,
}

impl Header {
    /// The header of `value` at `version`.
    pub fn for_value(value: &[u8], version: u64, epoch: u64, writer: i32) -> Header {
        Header {
            state: State::Value,
            version,
            len: value.len() as u64,
            epoch,
            integrity: Integrity::Hash(xxh3_64(value)),
            writer,
        }
    }

    /// The header of a `len`-byte value at `version` that its owner writes in order
    /// ([`Integrity::Ordered`]): nothing is computed over the value.
    pub fn for_ordered_value(len: usize, version: u64, epoch: u64, writer: i32) -> Header {
        let integrity = Integrity::Ordered;
        Header { state: State::Value, version, len: len as u64, epoch, integrity, writer }
    }

    /// The header of a deletion at `version`.
    pub fn for_delete(version: u64, epoch: u64, writer: i32) -> Header {
        let integrity = Integrity::Hash(xxh3_64(&[]));
        Header { state: State::Deleted, version, len: 0, epoch, integrity, writer }
    }

    /// This header with the hash of `data`, its whole value: for a copy of a committed version
    /// written by anyone but the owner's own put, which may meet another writer in the half.
    pub fn hashed(self, data: &[u8]) -> Header {
        Header { integrity: Integrity::Hash(xxh3_64(data)), ..self }
    }

    /// Whether a reader must read this half's header again after its value
    /// ([`Integrity::Ordered`]).
    pub fn is_ordered(&self) -> bool {
        self.integrity == Integrity::Ordered
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..4].copy_from_slice(&MAGIC);
        let state: u32 = match self.state {
            State::Value => 1,
            State::Deleted => 2,
        };
        let (ordered, hash) = match self.integrity {
            Integrity::Hash(hash) => (0, hash),
            Integrity::Ordered => (ORDERED, 0),
        };
        out[4..8].copy_from_slice(&(state | ordered).to_le_bytes());
        out[8..16].copy_from_slice(&self.version.to_le_bytes());
        out[16..24].copy_from_slice(&self.len.to_le_bytes());
        out[24..32].copy_from_slice(&self.epoch.to_le_bytes());
        out[32..40].copy_from_slice(&hash.to_le_bytes());
        out[40..44].copy_from_slice(&self.writer.to_le_bytes());
        let check = xxh3_64(&out[0..48]);
        out[48..56].copy_from_slice(&check.to_le_bytes());
        out
    }

    /// The header in `bytes`, or `None` for an empty, torn or foreign one.
    pub fn decode(bytes: &[u8]) -> Option<Header> {
        if bytes.len() < HEADER_LEN || bytes[0..4] != MAGIC {
            return None;
        }
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        if word(48) != xxh3_64(&bytes[0..48]) {
            return None;
        }
        let word4 = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
        let state = match word4 & !ORDERED {
            1 => State::Value,
            2 => State::Deleted,
            _ => return None,
        };
        let integrity =
            if word4 & ORDERED != 0 { Integrity::Ordered } else { Integrity::Hash(word(32)) };
        let version = word(8);
        (version > 0).then_some(Header {
            state,
            version,
            len: word(16),
            epoch: word(24),
            integrity,
            writer: i32::from_le_bytes(bytes[40..44].try_into().expect("4 bytes")),
        })
    }

    /// Whether `data` is the complete value this header commits: by its hash, or, for an
    /// ordered header, by its length (the reader checked that the header did not change while
    /// it read the value).
    pub fn matches(&self, data: &[u8]) -> bool {
        let whole = match self.integrity {
            Integrity::Hash(hash) => xxh3_64(data) == hash,
            Integrity::Ordered => true,
        };
        data.len() as u64 == self.len && whole
    }
}

/// Geometry of the slots of one store: a fence block, then two halves of a header plus
/// `inline` bytes each, rounded up to 64 bytes. A value up to the inline capacity lives in its
/// half; a larger one (up to `max_value`) in the half's *extent*
/// ([`crate::fabric::RmaOps::put_extent`], id [`SlotGeometry::extent_id`]), which grows and
/// shrinks with it: no slot reserves the largest value a put may bring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotGeometry {
    pub half_len: usize,
    /// Largest value length a header may name; a longer one reads as a torn half.
    pub max_value: usize,
}

impl SlotGeometry {
    /// Slots with `inline` bytes of value in each half and no limit on longer values.
    pub fn new(inline: usize) -> SlotGeometry {
        SlotGeometry { half_len: HEADER_LEN + inline.div_ceil(64) * 64, max_value: usize::MAX }
    }

    /// These slots for values up to `max_value` bytes.
    pub fn limited(self, max_value: usize) -> SlotGeometry {
        SlotGeometry { max_value, ..self }
    }

    pub fn slot_len(&self) -> usize {
        FENCE_LEN + 2 * self.half_len
    }

    /// Bytes of value a half holds in the window itself.
    pub fn inline_capacity(&self) -> usize {
        self.half_len - HEADER_LEN
    }

    /// Whether a value of `len` bytes lives in its half's extent instead of the window.
    pub fn in_extent(&self, len: u64) -> bool {
        len > self.inline_capacity() as u64
    }

    /// Offset of half `index` (0 or 1) from the slot's start.
    pub fn half_start(&self, index: usize) -> usize {
        FENCE_LEN + index * self.half_len
    }

    /// Offset of the half that holds `version`, from the slot's start.
    pub fn half_offset(&self, version: u64) -> usize {
        self.half_start((version % 2) as usize)
    }

    /// The id of the extent of the half that holds `version` in the slot at `disp`: unique per
    /// half within a holder's window.
    pub fn extent_id(disp: i64, version: u64) -> u64 {
        ((disp as u64) << 1) | (version % 2)
    }
}

/// A committed version read from a slot: its header and (for values) the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub header: Header,
    pub data: Vec<u8>,
}

/// The writers a holder fenced in one slot: a half written by `writer` at a version above
/// the recorded one is void.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fence {
    pub entries: Vec<(i32, u64)>,
}

/// A fence block as read: a valid one (all zeros is the empty fence), or one caught while its
/// holder was writing it (the reader reads again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceRead {
    Valid(Fence),
    Torn,
}

impl Fence {
    /// Whether `header` is a write this fence voids.
    pub fn voids(&self, header: &Header) -> bool {
        let voided =
            |&(writer, version): &(i32, u64)| header.writer == writer && header.version > version;
        self.entries.iter().any(voided)
    }

    /// Whether `writer` is fenced here already.
    pub fn fences(&self, writer: i32) -> bool {
        self.entries.iter().any(|&(w, _)| w == writer)
    }

    /// The fence's bytes, up to the lock word (a fence write never touches the lock).
    pub fn encode(&self) -> [u8; LOCK_AT] {
        assert!(self.entries.len() <= MAX_FENCED, "a slot fences at most {MAX_FENCED} writers");
        let mut out = [0u8; LOCK_AT];
        out[0..4].copy_from_slice(&FENCE_MAGIC);
        out[4..8].copy_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for (i, &(writer, version)) in self.entries.iter().enumerate() {
            let at = 8 + 12 * i;
            out[at..at + 4].copy_from_slice(&writer.to_le_bytes());
            out[at + 4..at + 12].copy_from_slice(&version.to_le_bytes());
        }
        let check = xxh3_64(&out[0..48]);
        out[48..56].copy_from_slice(&check.to_le_bytes());
        out
    }

    /// The fence in `bytes` (a fence block; its lock word is ignored).
    pub fn decode(bytes: &[u8]) -> FenceRead {
        if bytes.len() < LOCK_AT {
            return FenceRead::Torn;
        }
        if bytes[..LOCK_AT].iter().all(|&b| b == 0) {
            return FenceRead::Valid(Fence::default());
        }
        let check = u64::from_le_bytes(bytes[48..56].try_into().expect("8 bytes"));
        if bytes[0..4] != FENCE_MAGIC || check != xxh3_64(&bytes[0..48]) {
            return FenceRead::Torn;
        }
        let count = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")) as usize;
        if count > MAX_FENCED {
            return FenceRead::Torn;
        }
        let entry = |i: usize| {
            let at = 8 + 12 * i;
            let writer = i32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
            (writer, u64::from_le_bytes(bytes[at + 4..at + 12].try_into().expect("8 bytes")))
        };
        FenceRead::Valid(Fence { entries: (0..count).map(entry).collect() })
    }
}

/// The newest complete version among candidate halves `(header bytes, data bytes)` that
/// `fence` does not void. An ordered half counts when its length fits: the header read again
/// after the data, which proves it whole, is the caller's part (see [`Integrity::Ordered`]).
pub fn newest(
    halves: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
    fence: &Fence,
) -> Option<Committed> {
    let mut halves: Vec<(Header, Vec<u8>)> =
        halves.into_iter().filter_map(|(h, data)| Some((Header::decode(&h)?, data))).collect();
    halves.sort_by_key(|(header, _)| std::cmp::Reverse(header.version));
    halves.into_iter().find_map(|(header, data)| complete(header, data, fence))
}

/// The newest complete version among the decoded `headers` of a slot's halves (with their
/// half's index) that `fence` does not void, loading each half's data (`None`: unreadable, or
/// an ordered half whose header changed while it was read) newest first and only until one is
/// complete: a large value is read once.
pub fn newest_loaded<E>(
    headers: &[(usize, Header)],
    fence: &Fence,
    mut load: impl FnMut(usize, &Header) -> Result<Option<Vec<u8>>, E>,
) -> Result<Option<Committed>, E> {
    let mut order: Vec<&(usize, Header)> =
        headers.iter().filter(|(_, h)| !fence.voids(h)).collect();
    order.sort_by_key(|(_, header)| std::cmp::Reverse(header.version));
    for &(index, header) in order {
        if let Some(found) = load(index, &header)?.and_then(|data| complete(header, data, fence)) {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// `header` with `data` (trimmed to its length) when `fence` does not void it and the data is
/// complete.
fn complete(header: Header, mut data: Vec<u8>, fence: &Fence) -> Option<Committed> {
    if fence.voids(&header) || data.len() < header.len as usize {
        return None;
    }
    data.truncate(header.len as usize);
    header.matches(&data).then_some(Committed { header, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_reject_damage() {
        let h = Header::for_value(b"hello", 7, 2, 5);
        assert_eq!(Header::decode(&h.encode()), Some(h));
        let d = Header::for_delete(8, 2, 5);
        assert_eq!(Header::decode(&d.encode()), Some(d));
        assert_eq!(Header::decode(&[0u8; HEADER_LEN]), None, "zeroed memory is empty");
        for byte in (0..44).chain(48..56) {
            let mut torn = h.encode();
            torn[byte] ^= 0x40;
            assert_eq!(Header::decode(&torn), None, "flipped byte {byte}");
        }
        let mut half_written = Header::for_value(b"x", 9, 0, 5).encode();
        half_written[24..].copy_from_slice(&h.encode()[24..]);
        assert_eq!(Header::decode(&half_written), None, "mix of two headers");
    }

    #[test]
    fn ordered_headers_round_trip_hash_nothing_and_turn_hashed_for_copies() {
        let h = Header::for_ordered_value(5, 7, 2, 5);
        assert_eq!(h.integrity, Integrity::Ordered);
        assert_eq!(Header::decode(&h.encode()), Some(h));
        assert!(h.matches(b"hello") && !h.matches(b"hell"), "only the length is checked here");
        let copy = h.hashed(b"hello");
        assert_eq!(copy.integrity, Integrity::Hash(xxh3_64(b"hello")));
        assert_eq!((copy.version, copy.len, copy.epoch, copy.writer), (7, 5, 2, 5));
        assert_eq!(Header::decode(&copy.encode()), Some(copy));
        assert!(copy.matches(b"hello") && !copy.matches(b"jello"));
        assert_ne!(h.encode(), copy.encode(), "the two kinds of header differ");
        assert_eq!(Header::decode(&INVALIDATED_HEADER), None, "an invalidated half is empty");
        let mut flag_flipped = h.encode();
        flag_flipped[5] ^= 1;
        assert_eq!(Header::decode(&flag_flipped), None, "the flag is under the header's check");
    }

    /// Candidate halves (header bytes, data bytes) and the version `newest` must pick.
    type Row = (Vec<(Vec<u8>, Vec<u8>)>, Option<u64>);

    #[test]
    fn newest_complete_version_wins_and_torn_data_falls_back() {
        let old = b"version one".to_vec();
        let new = b"version two!".to_vec();
        let h1 = Header::for_value(&old, 1, 0, 3).encode().to_vec();
        let h2 = Header::for_value(&new, 2, 0, 3).encode().to_vec();
        let mut torn = new.clone();
        torn[3] = b'#';
        let table: Vec<Row> = vec![
            (vec![(h1.clone(), old.clone()), (h2.clone(), new.clone())], Some(2)),
            (vec![(h1.clone(), old.clone()), (h2.clone(), torn)], Some(1)),
            (vec![(h1.clone(), old.clone()), (vec![0; 64], new.clone())], Some(1)),
            (vec![(h1.clone(), old[..4].to_vec())], None),
            (vec![(vec![0; 64], vec![]), (vec![0; 64], vec![])], None),
        ];
        for (halves, want) in table {
            assert_eq!(newest(halves, &Fence::default()).map(|c| c.header.version), want);
        }
    }

    /// Candidate halves, the fence over them, and the version `newest` must pick.
    type FencedRow = (Vec<(Vec<u8>, Vec<u8>)>, Fence, Option<u64>);

    /// A fenced writer's halves above its fenced version are void, whoever else wrote the
    /// slot; a torn or foreign fence block is told apart from an empty one.
    #[test]
    fn a_fence_voids_only_its_writers_later_versions() {
        let half = |version: u64, writer: i32| {
            let value = format!("v{version} by {writer}").into_bytes();
            (Header::for_value(&value, version, 0, writer).encode().to_vec(), value)
        };
        let fence = |entries: &[(i32, u64)]| Fence { entries: entries.to_vec() };
        let table: Vec<FencedRow> = vec![
            (vec![half(4, 3), half(5, 3)], fence(&[]), Some(5)),
            (vec![half(4, 3), half(5, 3)], fence(&[(3, 4)]), Some(4)),
            (vec![half(4, 3), half(5, 3)], fence(&[(3, 5)]), Some(5)),
            (vec![half(4, 3), half(5, 3)], fence(&[(3, 3)]), None),
            (vec![half(4, 3), half(5, 7)], fence(&[(3, 4)]), Some(5)),
            (vec![half(4, 3), half(5, 7)], fence(&[(1, 0), (7, 4)]), Some(4)),
        ];
        for (halves, fence, want) in table {
            assert_eq!(Fence::decode(&fence.encode()), FenceRead::Valid(fence.clone()));
            assert_eq!(newest(halves, &fence).map(|c| c.header.version), want, "{fence:?}");
        }
        assert_eq!(Fence::decode(&[0u8; FENCE_LEN]), FenceRead::Valid(Fence::default()));
        let mut locked = [0u8; FENCE_LEN];
        locked[LOCK_AT..].copy_from_slice(&7u64.to_le_bytes());
        assert_eq!(Fence::decode(&locked), FenceRead::Valid(Fence::default()));
        locked[..LOCK_AT].copy_from_slice(&fence(&[(3, 4)]).encode());
        assert_eq!(Fence::decode(&locked), FenceRead::Valid(fence(&[(3, 4)])));
        let mut torn = fence(&[(3, 4)]).encode();
        torn[13] ^= 1;
        assert_eq!(Fence::decode(&torn), FenceRead::Torn);
        assert_eq!(Fence::decode(&Header::for_value(b"x", 1, 0, 0).encode()), FenceRead::Torn);
    }

    #[test]
    fn geometry_alternates_halves() {
        let g = SlotGeometry::new(1000);
        assert_eq!(g.half_len, 64 + 1024);
        assert_eq!(g.slot_len(), 64 + 2 * 1088);
        let offsets = (g.half_offset(1), g.half_offset(2), g.half_offset(3));
        assert_eq!(offsets, (64 + 1088, 64, 64 + 1088));
    }
}
