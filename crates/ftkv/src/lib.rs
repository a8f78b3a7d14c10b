//! The resilient store: key space, placement, slots, put/get/delete, recovery (DESIGN.md §2).
