//! Rank programs for the multi-rank tests: `ftkv-mpitest <case>` under `mpirun`. Each rank prints
//! JSON reports (`kind {json}` lines, the types in `ftkv_cli::reports`) that the tests read back
//! rank by rank; `ready pid=<pid>` lines are read while the job runs.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ftkv_cli::launch::report_line;
use ftkv_cli::reports::{
    CasReport, DetectedReport, ErrorReport, HelloReport, Passed, RingReport, ShrunkReport,
    SwapsAfterKillReport,
};
use ftkv_mpi::{failpoint, Comm, HostWindow, LockedWindow, Mpi, Window};

mod intrude;
mod store_cases;

const PING: i32 = 101;
const PONG: i32 = 102;
const RING: i32 = 103;

fn main() {
    let case = std::env::args().nth(1).unwrap_or_default();
    if case == "intrude" {
        intrude::main();
    }
    ftkv_cli::trace::install();
    if let Err(e) = run(&case) {
        fail(&case, &e);
    }
}

/// Reports the error and leaves without MPI_Finalize, which waits for peers that may never come.
fn fail(case: &str, e: &anyhow::Error) -> ! {
    ftkv_cli::rank_println!("{}", report_line("error", &ErrorReport { message: format!("{e:#}") }));
    let line = format!("ftkv-mpitest {case}: {e:#}");
    eprintln!("{line}");
    ftkv_cli::records::record_rank_error(ftkv_cli::env::world_rank(), &line);
    failpoint::exit_now(1)
}

fn run(case: &str) -> Result<()> {
    let mpi = Mpi::init()?;
    let world = Arc::new(mpi.world()?.dup()?);
    let outcome = match case {
        "hello" => hello(&world),
        "sendrecv" => sendrecv(&world),
        "rma" => rma(&world),
        "host-cas" => host_cas(&world),
        "cas-victim" => cas_victim(&world),
        "detect" => detect(&world),
        "shrink" => shrink(&world),
        "error-on-one-rank" => error_on_one_rank(&world, false),
        "panic-on-one-rank" => error_on_one_rank(&world, true),
        store if store.starts_with("store-") => store_cases::run(store, &world),
        other => Err(anyhow::anyhow!("unknown case {other:?}")),
    };
    if let Err(e) = outcome {
        fail(case, &e);
    }
    drop(world);
    report_passed("done");
    mpi.finalize_bounded(Duration::from_secs(3))?;
    report_passed("finalized");
    Ok(())
}

/// Prints `kind {}`: the step `kind` passed on this rank.
fn report_passed(kind: &str) {
    ftkv_cli::rank_println!("{}", report_line(kind, &Passed {}));
}

/// Rank 1 meets an error (or panics) while the others wait in collectives: the ftkv binary's
/// rank-side handling must end the whole job and show the error, never leave the others waiting.
fn error_on_one_rank(world: &Comm, panic: bool) -> Result<()> {
    ftkv_cli::rank_failure::end_job_on_panic();
    world.barrier()?;
    if world.rank() == 1 {
        if panic {
            let empty: Vec<u32> = Vec::new();
            ftkv_cli::rank_println!("never {}", empty[world.rank() as usize]);
        }
        ftkv_cli::rank_failure::end_job_on_error(&anyhow::anyhow!("injected error"));
    }
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(120) {
        if world.barrier().is_err() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    bail!("the job was not ended")
}

fn hello(world: &Comm) -> Result<()> {
    world.barrier()?;
    ftkv_cli::rank_println!(
        "{}",
        report_line("hello", &HelloReport { rank: world.rank(), size: world.size() })
    );
    Ok(())
}

/// Answers pings on a helper thread until stopped, acknowledging failures it runs into.
struct Responder {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Result<()>>>,
}

impl Responder {
    fn start(comm: Arc<Comm>) -> Responder {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                if let Err(e) = comm.answer_pings(PING, PONG) {
                    ensure!(e.is_failure(), "responder: {e}");
                    comm.failed_ranks()?;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            Ok(())
        });
        Responder { stop, handle: Some(handle) }
    }

    fn stop(mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().expect("joined once").join().expect("responder thread panicked")
    }
}

fn sendrecv(world: &Arc<Comm>) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;
    let pending = world.irecv(64, prev, RING)?;
    world.send(format!("from {rank}").as_bytes(), next, RING)?;
    let (bytes, status) = pending.wait_until(deadline(5), Duration::from_secs(5))?;
    ensure!(status.source == prev, "ring message from {} not {prev}", status.source);
    ensure!(bytes == format!("from {prev}").into_bytes(), "ring payload {bytes:?}");
    let responder = Responder::start(world.clone());
    world.barrier()?;
    let rtt = world.ping(next, PING, PONG, Duration::from_secs(5))?;
    let report = RingReport { from: prev, ping_us: rtt.as_micros() as u64 };
    ftkv_cli::rank_println!("{}", report_line("ring", &report));
    world.barrier()?;
    responder.stop()
}

fn deadline(secs: u64) -> Instant {
    Instant::now() + Duration::from_secs(secs)
}

const WINDOW_BYTES: usize = 4096;
const COUNTER: i64 = 4000;

fn rma(world: &Comm) -> Result<()> {
    let (rank, size) = (world.rank(), world.size());
    let win = Window::allocate(world, WINDOW_BYTES)?.lock_all()?;
    world.barrier()?;
    let next = (rank + 1) % size;
    let payload = vec![rank as u8 + 1; 256];
    win.scope(|s| s.put(next, 256 * rank as i64, &payload))?;
    win.fetch_and_add(0, COUNTER, Some(1))?;
    world.barrier()?;
    check_neighbour_wrote(&win, rank, size)?;
    check_get_back(&win, rank, next, &payload)?;
    world.barrier()?;
    if rank == 0 {
        check_counter(&win, size)?;
    }
    world.barrier()?;
    report_passed("rma");
    win.unlock_all()?.free()?;
    Ok(())
}

/// Compare-and-swap through a [`HostWindow`]: every rank adds `FTKV_TEST_CAS_ROUNDS` (200 by
/// default) to a counter on every rank (its own included), each addition a
/// read-compare-swap loop, so members on the same host (shared memory) and on other hosts (a
/// serving thread) race on every word. Each rank then checks that its counter holds exactly
/// ranks × rounds and that the rest of its window is untouched, and reports a [`CasReport`]
/// with the connections its window's listener dropped.
fn host_cas(world: &Comm) -> Result<()> {
    const WINDOW: usize = 64;
    let rounds: u64 = match std::env::var("FTKV_TEST_CAS_ROUNDS") {
        Ok(text) => text.parse().context("FTKV_TEST_CAS_ROUNDS")?,
        Err(_) => 200,
    };
    let (rank, size) = (world.rank(), world.size());
    if std::env::var_os("FTKV_TEST_LISTENERS").is_some() {
        print_listeners();
    }
    let window = HostWindow::allocate(world, WINDOW)?;
    world.barrier()?;
    let mut retries = 0u64;
    for round in 0..rounds {
        for step in 0..size {
            let target = (rank + step + round as i32) % size;
            retries += add_one(&window, target)?;
        }
    }
    world.barrier()?;
    window.sync()?;
    let mut word = [0u8; 8];
    window.read_local(0, &mut word)?;
    let count = u64::from_le_bytes(word);
    ensure!(count == size as u64 * rounds, "counter {count} != {}", size as u64 * rounds);
    let mut rest = [0u8; WINDOW - 8];
    window.read_local(8, &mut rest)?;
    ensure!(rest.iter().all(|&b| b == 0), "bytes past the counter changed: {rest:?}");
    let unchanged = window.compare_and_swap((rank + 1) % size, 0, 0, 7)?;
    ensure!(unchanged == count, "a compare-and-swap with a wrong compare value saw {unchanged}");
    let rejected = window.rejected_connections();
    let report = CasReport { retries, spans_hosts: window.spans_hosts(), rejected };
    ftkv_cli::rank_println!("{}", report_line("cas", &report));
    world.barrier()?;
    window.close()?;
    Ok(())
}

/// `cas-victim` (3 ranks): ranks 1 and 2 race compare-and-swap loops on rank 1's word 0 while
/// the test SIGKILLs rank 1 from outside, 0.8 s after every rank printed `ready pid=<pid>`
/// (rank 1 swaps until it dies, and fails if it is still alive after 30 s). 2 s after `ready`,
/// ranks 0 and 2 swap for another second on the dead rank's word and on each other's, and
/// report how many swaps they made: a member killed inside a swap must block none of them.
fn cas_victim(world: &Comm) -> Result<()> {
    const VICTIM: i32 = 1;
    let rank = world.rank();
    ensure!(world.size() == 3, "cas-victim runs on 3 ranks");
    let window = HostWindow::allocate(world, 64)?;
    ensure!(!window.spans_hosts(), "cas-victim runs on one host");
    world.barrier()?;
    ftkv_cli::rank_println!("ready pid={}", std::process::id());
    std::io::Write::flush(&mut std::io::stdout())?;
    let ready = Instant::now();
    while rank == VICTIM || ready.elapsed() < Duration::from_secs(2) {
        if rank != 0 {
            add_one(&window, VICTIM)?;
        }
        ensure!(ready.elapsed() < Duration::from_secs(30), "rank {rank} was not killed");
    }
    let survivor = 2 - rank;
    let mut report = SwapsAfterKillReport { on_the_dead: 0, on_a_survivor: 0 };
    while ready.elapsed() < Duration::from_secs(3) {
        add_one(&window, VICTIM)?;
        add_one(&window, survivor)?;
        report.on_the_dead += 1;
        report.on_a_survivor += 1;
    }
    ftkv_cli::rank_println!("{}", report_line("swaps", &report));
    window.abandon();
    report_passed("done");
    // Without MPI_Finalize, which refuses the abandoned window; the runtime forwards output
    // asynchronously, so the other survivor's last lines need time to arrive first.
    std::thread::sleep(Duration::from_secs(1));
    failpoint::exit_now(0)
}

/// Prints `listeners pid=<pid> inodes=<i,j,...>`: the sockets this rank listens on before it
/// makes a window (MPI's own), so that a test can tell the window's listener from them.
fn print_listeners() {
    use std::io::Write;
    let pid = std::process::id();
    let inodes: Vec<String> =
        ftkv_cli::sockets::listening(pid).iter().map(|(inode, _)| inode.to_string()).collect();
    ftkv_cli::rank_println!("listeners pid={pid} inodes={}", inodes.join(","));
    let _ = std::io::stdout().flush();
}

/// Adds one to the counter at word 0 of `target`; returns how many swaps lost a race.
fn add_one(window: &HostWindow, target: i32) -> Result<u64> {
    let mut seen = window.compare_and_swap(target, 0, 0, 0)?;
    let mut lost = 0;
    loop {
        let held = window.compare_and_swap(target, 0, seen, seen + 1)?;
        if held == seen {
            return Ok(lost);
        }
        seen = held;
        lost += 1;
    }
}

fn check_neighbour_wrote(win: &LockedWindow, rank: i32, size: i32) -> Result<()> {
    let prev = (rank + size - 1) % size;
    win.sync()?;
    let mut local = vec![0u8; 256];
    win.window().read_local(256 * prev as usize, &mut local)?;
    ensure!(local.iter().all(|&b| b == prev as u8 + 1), "rank {prev}'s put did not arrive");
    Ok(())
}

fn check_get_back(win: &LockedWindow, rank: i32, next: i32, payload: &[u8]) -> Result<()> {
    let mut fetched = vec![0u8; payload.len()];
    win.scope(|s| s.get(next, 256 * rank as i64, &mut fetched))?;
    ensure!(fetched == payload, "get from {next} did not return what this rank put there");
    Ok(())
}

fn check_counter(win: &LockedWindow, size: i32) -> Result<()> {
    let count = win.fetch_and_add(0, COUNTER, None)?;
    ensure!(count == size as u64, "counter {count} != {size}");
    let old = win.compare_and_swap(0, COUNTER, size as u64, 1000)?;
    ensure!(old == size as u64, "CAS saw {old}");
    let unchanged = win.compare_and_swap(0, COUNTER, 0, 7)?;
    ensure!(unchanged == 1000, "CAS with a wrong compare value swapped ({unchanged})");
    let replaced = win.swap(0, COUNTER, 5)?;
    ensure!(replaced == 1000 && win.fetch_and_add(0, COUNTER, None)? == 5, "swap failed");
    report_passed("atomics");
    Ok(())
}

/// Every rank answers pings; the rank armed by `FTKV_FAILPOINT=detect_kill@R` dies after the
/// barrier; rank 0 pings it until MPI reports the failure and prints how long that took.
fn detect(world: &Arc<Comm>) -> Result<()> {
    let responder = Responder::start(world.clone());
    world.barrier()?;
    let killed_at = Instant::now();
    failpoint::hit("detect_kill");
    if world.rank() == 0 {
        let victim: i32 = std::env::var("FTKV_VICTIM").context("FTKV_VICTIM")?.parse()?;
        let detected = ping_until_failed(world, victim, killed_at)?;
        let report = DetectedReport { ms: detected.as_millis() as u64 };
        ftkv_cli::rank_println!("{}", report_line("detected", &report));
    }
    responder.stop()?;
    let shrunk = revoke_and_shrink(world)?;
    let report =
        ShrunkReport { size: shrunk.size(), failed: world.failed_ranks()?, barrier_failed: None };
    ftkv_cli::rank_println!("{}", report_line("shrunk", &report));
    Ok(())
}

fn ping_until_failed(world: &Comm, victim: i32, since: Instant) -> Result<Duration> {
    while since.elapsed() < Duration::from_secs(10) {
        match world.ping(victim, PING, PONG, Duration::from_millis(500)) {
            Ok(_) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) if e.is_failure() => return Ok(since.elapsed()),
            Err(e) => bail!("ping {victim}: {e}"),
        }
    }
    bail!("rank {victim} not reported failed within 10 s")
}

fn revoke_and_shrink(world: &Comm) -> Result<Comm> {
    world.revoke()?;
    let shrunk = world.shrink()?;
    shrunk.barrier()?;
    Ok(shrunk)
}

/// The rank armed by `FTKV_FAILPOINT=shrink_kill@R` dies after the window exists; survivors
/// notice, revoke, shrink, agree and run the RMA ring again on the shrunk communicator.
fn shrink(world: &Arc<Comm>) -> Result<()> {
    let win = Window::allocate(world, WINDOW_BYTES)?;
    world.barrier()?;
    failpoint::hit("shrink_kill");
    // A collective that meets a failure may fail with any error class on some members and
    // succeed on others; revoking makes every member leave it.
    let barrier_failed = world.barrier().is_err();
    world.revoke()?;
    let shrunk = world.shrink()?;
    let agreed = shrunk.agree(1)?;
    ensure!(agreed.value == 1, "agree returned {}", agreed.value);
    let report = ShrunkReport {
        size: shrunk.size(),
        failed: world.failed_ranks()?,
        barrier_failed: Some(barrier_failed),
    };
    ftkv_cli::rank_println!("{}", report_line("shrunk", &report));
    drop(win);
    rma(&shrunk)
}
