//! The one serialization of what ftkv and its task pool exchange and store, slot headers apart
//! (they keep an explicit layout with one encoder, [`crate::slot::Header`]): recovery records,
//! and the pool's checkpoints, loot and messages. serde with postcard: compact (integers as
//! varints), no schema in the bytes, and every decode checks its input.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// The bytes of `value`.
///
/// # Panics
/// Never for ftkv's own types (plain structs, vectors and integers); a type whose `Serialize`
/// fails (a map with keys postcard cannot write) would panic here.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).expect("ftkv's records and messages always serialize")
}

/// The value encoded in `bytes`, `None` when they are not one (truncated, corrupt, foreign).
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    let (value, rest) = postcard::take_from_bytes(bytes).ok()?;
    rest.is_empty().then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_garbage_is_refused() {
        let value: (u64, Vec<u32>, [u8; 3]) = (u64::MAX - 1, vec![1, 300, 70_000], [7, 8, 9]);
        let bytes = encode(&value);
        assert_eq!(decode::<(u64, Vec<u32>, [u8; 3])>(&bytes), Some(value));
        assert_eq!(decode::<(u64, Vec<u32>, [u8; 3])>(&bytes[..bytes.len() - 1]), None);
        assert_eq!(encode(&5u64).len(), 1, "small integers take one byte");
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(decode::<(u64, Vec<u32>, [u8; 3])>(&longer), None, "trailing bytes");
    }
}
