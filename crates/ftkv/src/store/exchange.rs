//! The records of a global recovery, exchanged among the survivors: the planner's input
//! ([`crate::engine::plan`]) gathered over the fabric.

use crate::codec;
use crate::engine::plan::Record;
use crate::error::Result;
use crate::fabric::{Fabric, FabricError};

/// Every survivor's records, on every survivor: each rank's records through [`codec`], in
/// frames of equal length ([`gather_frames`]).
pub(crate) fn exchange<F: Fabric>(comm: &F, mine: &[Record]) -> Result<Vec<Record>> {
    let frames = gather_frames(comm, &codec::encode(mine))?;
    let mut records = Vec::new();
    for frame in frames {
        let theirs: Vec<Record> = codec::decode(&frame).ok_or_else(|| FabricError::Other {
            op: "record exchange",
            msg: "a survivor's records do not decode".into(),
        })?;
        records.extend(theirs);
    }
    Ok(records)
}

/// Every member's `mine`, in rank order, although their lengths differ: an allgather of the
/// lengths (8 bytes each, little-endian), then one of the bytes padded to the longest.
fn gather_frames<F: Fabric>(comm: &F, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
    let lengths = comm.allgather(&(mine.len() as u64).to_le_bytes())?;
    let lengths: Vec<usize> = lengths
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")) as usize)
        .collect();
    let longest = lengths.iter().copied().max().unwrap_or(0);
    let mut padded = mine.to_vec();
    padded.resize(longest, 0);
    let all = comm.allgather(&padded)?;
    Ok(lengths
        .iter()
        .enumerate()
        .map(|(rank, &len)| all[rank * longest..rank * longest + len].to_vec())
        .collect())
}
