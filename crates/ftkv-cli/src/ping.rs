//! `ftkv ping`: two-sided round trips from rank 0 to every other rank, answered by a helper
//! thread on each rank (the ping the reference paper puts before every one-sided call).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Result};
use ftkv_mpi::{Comm, Mpi};

const PING: i32 = 11;
const PONG: i32 = 12;

/// The rank side: every rank answers pings until rank 0 has measured `count` round trips to each
/// peer; rank 0 prints one line per peer with the median and 99th percentile in microseconds.
/// A job of one rank has nobody to ping and fails instead of printing nothing.
pub fn rank_main(count: usize) -> Result<()> {
    ensure!(count >= 1, "--count {count} must be at least 1");
    let mpi = Mpi::init()?;
    let world = Arc::new(mpi.world()?.dup()?);
    ensure!(world.size() >= 2, "ping needs at least 2 ranks, this job has {}", world.size());
    let stop = Arc::new(AtomicBool::new(false));
    let responder = spawn_responder(world.clone(), stop.clone());
    world.barrier()?;
    if world.rank() == 0 {
        for peer in 1..world.size() {
            let mut rtts = measure(&world, peer, count)?;
            rtts.sort_unstable();
            let pick = |q: f64| rtts[((rtts.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
            println!("peer={peer} count={count} p50_us={:.1} p99_us={:.1}", pick(0.5), pick(0.99));
        }
    }
    world.barrier()?;
    stop.store(true, Ordering::Relaxed);
    responder.join().expect("responder thread panicked")?;
    drop(world);
    mpi.finalize_bounded(std::time::Duration::from_secs(3))?;
    Ok(())
}

fn measure(world: &Comm, peer: i32, count: usize) -> Result<Vec<Duration>> {
    (0..count)
        .map(|_| world.ping(peer, PING, PONG, Duration::from_secs(5)).map_err(Into::into))
        .collect()
}

fn spawn_responder(world: Arc<Comm>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Result<()>> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            world.answer_pings(PING, PONG)?;
            std::thread::yield_now();
        }
        Ok(())
    })
}
