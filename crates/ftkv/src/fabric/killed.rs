//! How a killed rank's threads end on the in-process fabric and on a simulated world.

/// The unwinding payload of a killed rank's threads: at its next fabric call (or world step)
/// each thread of a killed rank unwinds with it, and the runners tell it from a bug's panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Killed(pub i32);
