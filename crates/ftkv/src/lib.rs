//! ftkv: a resilient, replicated in-memory key-value store for task-level checkpointing on MPI.
//!
//! ```text
//! let mut store = Store::create(&world, Config::new(["checkpoint", "loot"], 2))?;
//! let key = store.own_key("checkpoint")?;
//! store.put(key, &bytes)?;            // returns when both holders have the value
//! match store.put(key, &more) {
//!     Err(e) if e.needs_recovery() => { store.recover()?; }   // on every survivor
//!     other => other?,
//! }
//! let dead_workers_value = store.get(Key::new(dead, 0))?;    // a buddy reads it
//! ```
//!
//! - **Keys** are `(owner, kind)`; the owner is the worker's rank in the communicator the store
//!   was created on. Copies are placed by [`placement::holders`](engine::placement::holders), never on the owner: one on
//!   each other host, then one on the owner's host, before a second on any, so losing one host
//!   costs each key as few copies as the hosts allow.
//! - **put / delete** are blocking: `Ok` means every holder has the new version. The data path
//!   is one-sided: copies with the processor's own loads and stores into the shared memory of
//!   the holders on this host (one `MPI_Win_allocate_shared` window per host), and requests on
//!   connections of the store's own to holders on other hosts. No holder's application thread
//!   is involved.
//! - **Torn writes** cannot be read: each copy is a double buffer of self-checked halves
//!   ([`slot`]); a reader takes the newest half whose value is whole: by the value's hash, or,
//!   for the owner's own puts, which hash nothing, by the half's header reading the same before
//!   and after the value (the owner invalidates it before writing the value).
//! - **Value growth**: a slot holds values up to its inline capacity in the window; a larger
//!   value goes to its half's *extent*, a segment of the holder's own sized to the value, so no
//!   slot reserves the largest value and no window enlargement (and no dynamic window, whose
//!   flush hangs against a dead target) is needed (`docs/store.md`, "Values that grow").
//! - **Failure detection** never hangs: a detector thread publishes ULFM's failed set to the put
//!   path, and a watchdog turns a one-sided call that never returns into a fail-stop exit.
//!   [`Detection::Ping`] adds the reference paper's per-put ping.
//! - **Recovery** ([`Store::recover`]) is global: revoke, shrink, new windows, newest surviving
//!   version of every key copied to its new holders. With [`Recovery::Localized`] a failure that
//!   every key survives is repaired without it: copies move to reserve holders ([`layout`](engine::layout)) and
//!   only the owners of lost copies copy data, while the other ranks keep writing. Up to `copies − 1` failures between two
//!   recoveries lose no acknowledged write. A recovery step stuck inside Open MPI (shrink can
//!   stay blocked on one member, or on all) ends the members stuck in it after
//!   [`Config::recovery_watchdog`], counted from the moment the last live member entered the
//!   step, a fail-stop like any other; a survivor that calls recover late holds the others
//!   (they wait and name it), it never makes them end themselves.
//! - **Fabrics**: the store talks to a [`fabric::Fabric`]: MPI's `ftkv_mpi::Comm` in
//!   production (the default `mpi` feature), [`fabric::local::LocalCluster`] (ranks as
//!   threads, killable at named points) for protocol tests; without the `mpi` feature the
//!   crate builds and tests on a machine without MPI.

#![forbid(unsafe_code)]

#[cfg(not(any(feature = "mpi", feature = "local", test)))]
compile_error!(
    "ftkv needs a fabric: the `mpi` feature (production) or `local` (the in-process one)"
);

pub mod codec;
mod config;
mod detector;
pub mod engine;
mod error;
pub mod events;
pub mod fabric;
mod key;
pub mod rt;
pub mod slot;
mod store;

pub use config::{
    end_declared_from_environment, end_through_runtime_from_environment,
    suspicion_from_environment, Config, Detection, Recovery, CROSS_HOST_WATCHDOG,
    DEFAULT_SUSPICION, DETECTOR_TIMEOUT_VAR, END_DECLARED_VAR, END_THROUGH_RUNTIME_VAR,
    SUSPICION_MARGIN, TX_RECORD_KIND,
};
pub use engine::plan::keeps_quorum;
pub use error::{Error, Result};
pub use key::Key;
pub use store::txn;
pub use store::{
    DefaultFabric, DetachedPut, PendingPut, RecoveryReport, RepairReport, Store,
    WRITE_THROUGH_BYTES,
};
