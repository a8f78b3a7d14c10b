//! `ftkv probe`: which one-sided and two-sided MPI calls report a dead peer.
