//! The work-stealing task pool with task-level checkpointing into ftkv (see DESIGN.md §2).
