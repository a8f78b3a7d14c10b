//! `ftkv bench put` and `ftkv bench detect`: the put path against raw MPI RMA to the same
//! holders, in each detection mode, and how long the detector takes to notice a SIGKILL.

use std::time::{Duration, Instant};

use anyhow::Result;
use ftkv::{placement, Config, Detection, Key, Store};
use ftkv_mpi::{failpoint, Comm, LockedWindow, Mpi, Window};

/// One line of results, printed by rank 0 as `key=value` words.
fn report(mode: &str, size: usize, samples: &mut [Duration]) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    let mean = samples.iter().sum::<Duration>().as_secs_f64() * 1e6 / samples.len() as f64;
    println!(
        "mode={mode} size={size} puts={} p50_us={:.2} p99_us={:.2} mean_us={mean:.2}",
        samples.len(),
        at(0.5),
        at(0.99)
    );
}

/// The rank side of `ftkv bench put`: every rank writes its checkpoint `iterations` times per
/// size and mode; rank 0 reports its latencies. Raw RMA is put + flush of the same bytes to the
/// same holders with no header, checksum or failure check.
pub fn put_rank_main(copies: usize, sizes: &[usize], iterations: usize) -> Result<()> {
    let mpi = Mpi::init()?;
    let world = mpi.world()?.dup()?;
    for &size in sizes {
        let mut raw = raw_put(&world, copies, size, iterations)?;
        let mut bitmap = store_put(&world, copies, size, iterations, Detection::Bitmap)?;
        let mut ping = store_put(&world, copies, size, iterations, Detection::Ping)?;
        if world.rank() == 0 {
            report("raw_rma", size, &mut raw);
            report("ftkv_bitmap", size, &mut bitmap);
            report("ftkv_ping", size, &mut ping);
        }
    }
    drop(world);
    mpi.finalize_bounded(Duration::from_secs(3))?;
    Ok(())
}

fn holders(world: &Comm, copies: usize) -> Vec<i32> {
    let live: Vec<i32> = (0..world.size()).collect();
    placement::holders(world.rank(), 0, &live, copies)
}

fn raw_put(world: &Comm, copies: usize, size: usize, iterations: usize) -> Result<Vec<Duration>> {
    let window: LockedWindow = Window::allocate(world, size * world.size() as usize)?.lock_all()?;
    world.barrier()?;
    let targets = holders(world, copies);
    let data = vec![7u8; size];
    let disp = (world.rank() as usize * size) as i64;
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let start = Instant::now();
        window.scope(|s| targets.iter().try_for_each(|&t| s.put(t, disp, &data)))?;
        samples.push(start.elapsed());
    }
    world.barrier()?;
    Ok(samples)
}

fn store_put(
    world: &Comm,
    copies: usize,
    size: usize,
    iterations: usize,
    detection: Detection,
) -> Result<Vec<Duration>> {
    let mut config = Config::new(["checkpoint"], copies);
    config.max_value = size;
    config.initial_capacity = size;
    config.detection = detection;
    let mut store = Store::create(world, config)?;
    let key = Key::new(store.worker(), 0);
    let data = vec![7u8; size];
    store.sync()?;
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let start = Instant::now();
        store.put(key, &data)?;
        samples.push(start.elapsed());
    }
    store.sync()?;
    Ok(samples)
}

/// The rank side of `ftkv bench detect`: after a barrier the last rank SIGKILLs itself; rank 0
/// computes without MPI calls and polls `needs_recovery()` (an atomic flag the detector thread
/// sets), then prints the time since the barrier.
pub fn detect_rank_main() -> Result<()> {
    let mpi = Mpi::init()?;
    let world = mpi.world()?.dup()?;
    let store = Store::create(&world, Config::new(["checkpoint"], 1))?;
    world.barrier()?;
    let killed_at = Instant::now();
    if world.rank() == world.size() - 1 {
        failpoint::kill_self();
    }
    while !store.needs_recovery() && killed_at.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_micros(50));
    }
    if world.rank() == 0 {
        let noticed = store.needs_recovery();
        println!("detected={noticed} detect_ms={:.2}", killed_at.elapsed().as_secs_f64() * 1e3);
    }
    failpoint::exit_now(0)
}
