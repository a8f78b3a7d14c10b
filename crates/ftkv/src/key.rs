//! Keys: (owner, kind).

/// A key: the owning worker's stable id (its world rank, unchanged by shrinking) and the index
/// of a kind in [`Config::kinds`](crate::Config::kinds).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Key {
    pub owner: i32,
    pub kind: u16,
}

impl Key {
    pub fn new(owner: i32, kind: u16) -> Key {
        Key { owner, kind }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "({}, kind {})", self.owner, self.kind)
    }
}
