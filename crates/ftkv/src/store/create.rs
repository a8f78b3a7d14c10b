//! [`Store::create`]: the collective creation of a store, after every member agreed on its
//! config and checked that its window fits this host's shared memory.

use std::collections::HashMap;
use std::sync::Arc;

use super::{follow, Store, Windows};
use crate::config::{Config, Recovery};
use crate::detector::Health;
use crate::engine::layout::Layout;
use crate::error::{Error, Result};
use crate::fabric::{Fabric, ProcessTag};
use crate::slot::SlotGeometry;
use crate::store::halves;

impl<F: Fabric> Store<F> {
    /// Creates the store collectively on every member of `comm`.
    ///
    /// Every rank must pass an equal `config`; a rank whose config is invalid gets
    /// [`Error::InvalidConfig`] (or [`Error::WindowTooLarge`] when its window would not fit
    /// this host's shared memory, checked before anything is allocated), and every other rank
    /// gets [`Error::ConfigMismatch`], also when configs differ (no rank hangs). A rank that
    /// cannot tell its host ([`Fabric::host_id`] fails) gets that error, the others
    /// [`Error::ConfigMismatch`]. A dead member makes creation fail with an MPI failure error.
    ///
    /// Every member learns every member's host id here, once: placement spreads each key's
    /// copies over hosts other than its owner's, now and after every recovery.
    ///
    /// # Example
    ///
    /// Three ranks (threads of the in-process fabric here; `ftkv_mpi::Comm` under `mpirun`)
    /// create a store whose keys each have 2 copies:
    ///
    /// ```
    /// use ftkv::fabric::local::LocalCluster;
    /// use ftkv::{Config, Store};
    ///
    /// let workers = LocalCluster::new(3).run(|fabric| {
    ///     let store = Store::create(&fabric, Config::new(["checkpoint"], 2)).unwrap();
    ///     store.workers()
    /// });
    /// assert_eq!(workers, vec![Some(3); 3]);
    /// ```
    pub fn create(comm: &F, config: Config) -> Result<Store<F>> {
        let workers = comm.size() as usize;
        let geometry = SlotGeometry::new(config.initial_capacity).limited(config.max_value);
        let live: Vec<i32> = (0..comm.size()).collect();
        let me = comm.rank();
        let host = comm.host_id();
        // A rank that cannot tell its host still joins the allgather, and then says no.
        let (hosts, processes) = gather_members(comm, host.as_ref().copied().unwrap_or(0))?;
        let valid = host
            .map_err(Error::from)
            .and_then(|_| config.validate(workers))
            .map(|()| Layout::with_spares(&live, &hosts, config.shape(), geometry, me));
        let valid = valid.and_then(|layout| {
            let on_my_host = hosts.iter().filter(|&&h| h == hosts[me as usize]).count();
            check_window_memory(comm, layout.window_len, on_my_host).map(|()| layout)
        });
        agree_on_config(comm, &config, valid.is_ok())?;
        let layout = valid?;
        let origin = comm.dup()?;
        let store_comm = Arc::new(comm.dup()?);
        let windows = Windows::open(store_comm.as_ref(), layout.clone(), 0)?;
        let health = Arc::new(Health::new(workers, config.recovery == Recovery::Global));
        let mut store = Store::<F> {
            versions: vec![0; config.kinds.len()],
            acked: Arc::new(follow::Acked::new(config.kinds.len())),
            config,
            me,
            workers,
            hosts,
            processes: Arc::new(processes),
            ending: crate::detector::ending::shared(),
            origin,
            comm: store_comm,
            windows: Some(Arc::new(windows)),
            routes: layout,
            handed: HashMap::new(),
            health,
            detector: None,
            watch_comm: None,
            recoveries: super::recover::RecoveryState::default(),
            lost: Vec::new(),
            followed: 0,
            repairs: Vec::new(),
            tx: super::transactions::TxState::default(),
            spills: halves::Spills::default(),
            asynchronous: super::asynchronous::AsyncState::default(),
            repairer: None,
        };
        store.start_detector()?;
        Ok(store)
    }
}

/// Every member's host id and process tag, by rank: one allgather of `host` (4 bytes
/// little-endian) and this member's [`ProcessTag`] each.
fn gather_members<F: Fabric>(comm: &F, host: u32) -> Result<(Vec<u32>, Vec<ProcessTag>)> {
    let mut mine = host.to_le_bytes().to_vec();
    mine.extend(comm.process_tag().to_bytes());
    let all = comm.allgather(&mine)?;
    let members = all.chunks(4 + ProcessTag::LEN);
    let hosts = members.clone().map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Ok((hosts, members.map(|c| ProcessTag::from_bytes(&c[4..])).collect()))
}

/// Every rank learns whether all configs are valid and equal before anyone acts on its own.
fn agree_on_config<F: Fabric>(comm: &F, config: &Config, valid: bool) -> Result<()> {
    let mut mine = config.fingerprint().to_le_bytes().to_vec();
    mine.push(valid as u8);
    let all = comm.allgather(&mine)?;
    let reference = &all[..9];
    let differing: Vec<i32> = all
        .chunks(9)
        .enumerate()
        .filter(|(_, c)| c[..8] != reference[..8] || c[8] == 0)
        .map(|(r, _)| r as i32)
        .collect();
    if differing.is_empty() || (!valid && differing.contains(&comm.rank())) {
        return Ok(());
    }
    Err(Error::ConfigMismatch { ranks: differing })
}

/// Refuses windows of `per_rank` bytes on each of this host's `ranks` ranks that its shared
/// memory could not hold. Memory is reserved, not resident, until values are written, but Open
/// MPI sizes the backing file for the whole reservation and fails when the file system is
/// smaller. Values beyond a slot's inline capacity live in extents, which take memory only as
/// they are written.
fn check_window_memory<F: Fabric>(comm: &F, per_rank: usize, ranks: usize) -> Result<()> {
    let Some(capacity) = comm.shared_memory_capacity() else { return Ok(()) };
    let total = (per_rank as u128) * ranks as u128;
    if total > capacity as u128 {
        return Err(Error::WindowTooLarge { per_rank, ranks, capacity });
    }
    Ok(())
}
