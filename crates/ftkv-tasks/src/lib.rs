//! The application ftkv exists for: task-based computations with known answers (UTS, N-Queens)
//! whose work is split into tasks, and a work-stealing pool that checkpoints into the store.

pub mod uts;
