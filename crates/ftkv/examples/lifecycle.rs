//! The whole lifecycle of a store: create, put, a failure, recover, read a dead owner's value.
//!
//! ```sh
//! cargo build --release --example lifecycle
//! .venv/bin/mpirun --with-ft ulfm --oversubscribe -n 4 target/release/examples/lifecycle
//! ```
//! (as root add `--allow-run-as-root`). Worker 3 writes a checkpoint and dies; the others
//! notice, recover, and worker 0 (worker 3's buddy) reads the checkpoint.

use std::time::Duration;

use ftkv::{Config, Key, Store};
use ftkv_mpi::{failpoint, Mpi};

const VICTIM: i32 = 3;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().without_time().with_target(false).init();
    let mpi = Mpi::init()?;
    let world = mpi.world()?;
    let mut store = Store::create(&world, Config::new(["checkpoint", "loot"], 2))?;
    let me = store.worker();
    let checkpoint = store.own_key("checkpoint")?;
    store.put(checkpoint, format!("tasks of worker {me}: [1, 2, 3]").as_bytes())?;
    store.sync()?;
    if me == VICTIM {
        failpoint::kill_self();
    }
    // The survivors keep working until the store tells them about the failure.
    let report = loop {
        match store.put(checkpoint, format!("tasks of worker {me}: [2, 3]").as_bytes()) {
            Ok(()) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) if e.needs_recovery() => break store.recover()?,
            Err(e) => return Err(e.into()),
        }
    };
    println!(
        "worker {me}: recovered from the failure of {:?} in {:?} ({} keys restored, {} lost)",
        report.failed,
        report.duration,
        report.keys_recovered,
        report.keys_lost.len()
    );
    if me == 0 {
        let adopted = store.get(Key::new(VICTIM, 0))?.unwrap_or_default();
        println!("worker 0 adopts: {}", String::from_utf8_lossy(&adopted));
    }
    store.sync()?;
    drop(store);
    drop(world);
    mpi.finalize_bounded(Duration::from_secs(3))?;
    Ok(())
}
