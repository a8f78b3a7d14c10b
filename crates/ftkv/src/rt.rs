//! What the store asks of the operating system besides its fabric: threads, the clock, sleeps,
//! locks and waits.
//!
//! In production these are `std`'s, one call each, after one relaxed atomic load that finds no
//! simulated world. A simulated world (the `ftkv-sim` crate) installs itself at run time, as
//! FoundationDB swaps its network: each of its task threads carries a [`WorldTask`]
//! ([`enter_task`]), and the same calls then go to the world's scheduler. A spawned thread
//! becomes a task, the clock is virtual, a sleep lets other tasks run until the virtual time
//! comes, and a wait for a lock, a message or another thread's end polls in virtual time
//! instead of blocking the thread, so that only the task the seeded scheduler picked ever
//! runs. The production code runs unchanged on both.
//!
//! Waits may return early (as `Condvar`'s may): callers loop on their condition.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A task of a simulated world, as the store's calls see the world that runs the calling
/// thread. Its methods are called only from that thread (or, for [`WorldTask::await_end`] and
/// [`WorldTask::abandon`], from the task that spawned it).
pub trait WorldTask: Send + Sync {
    /// False once the world's run ended: its threads then finish as plain threads.
    fn running(&self) -> bool;
    /// The virtual time now.
    fn now(&self) -> Instant;
    /// The virtual time as ticks of the coarse clock (`coarsetime`).
    fn coarse_ticks(&self) -> u64;
    /// A step, where the scheduler may run another task and a planned fault may strike.
    fn step(&self, what: &'static str);
    /// Lets the other tasks run for `span` of virtual time, the step labelled `what`; `false`
    /// (without waiting) when the run ended.
    fn sleep(&self, what: &'static str, span: Duration) -> bool;
    /// Lets the other tasks run for a short while: one round of a wait that polls.
    fn wait_a_little(&self, what: &'static str);
    /// A new task of this task's rank, named `name`, for a thread this task starts.
    fn spawn_child(&self, name: &str) -> Arc<dyn WorldTask>;
    /// Runs `body` as this task on the calling thread (a new one): waits for the scheduler's
    /// turn first, hands it on at the end; `Err` with the payload when `body` panicked or the
    /// task was killed before its turn.
    fn run(&self, body: Box<dyn FnOnce() + Send + '_>) -> std::thread::Result<()>;
    /// Waits, as the calling task, until this task's thread ended.
    fn await_end(&self);
    /// Marks this task ended before it ran (its thread could not be started).
    fn abandon(&self);
    /// A seeded span of up to `longest` (whole microseconds): a delay the world chooses.
    fn seeded_delay(&self, longest: Duration) -> Duration;
    /// A seeded coin that comes up `true` with probability `p`.
    fn coin(&self, p: f64) -> bool;
}

/// How many threads carry a world's task: while none does, no call looks further.
static TASKS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static CURRENT: RefCell<Option<Arc<dyn WorldTask>>> = const { RefCell::new(None) };
}

/// Makes the calling thread `task`'s until [`leave_task`]: its calls here go to the world.
pub fn enter_task(task: Arc<dyn WorldTask>) {
    let before = CURRENT.with(|c| c.borrow_mut().replace(task));
    if before.is_none() {
        TASKS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Ends what [`enter_task`] began on the calling thread.
pub fn leave_task() {
    if CURRENT.with(|c| c.borrow_mut().take()).is_some() {
        TASKS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The calling thread's world task, if it is one.
#[inline]
pub fn current_task() -> Option<Arc<dyn WorldTask>> {
    if TASKS.load(Ordering::Relaxed) == 0 {
        return None;
    }
    CURRENT.with(|c| c.borrow().clone())
}

/// The calling thread's task while its world runs.
fn running_task() -> Option<Arc<dyn WorldTask>> {
    current_task().filter(|task| task.running())
}

/// A thread started by [`spawn`].
pub struct Thread<T> {
    handle: std::thread::JoinHandle<T>,
    task: Option<Arc<dyn WorldTask>>,
}

impl<T> Thread<T> {
    /// Waits for the thread's end and returns its result (`Err` with the payload when it
    /// panicked).
    pub fn join(self) -> std::thread::Result<T> {
        if let Some(task) = &self.task {
            task.await_end();
        }
        self.handle.join()
    }

    /// Wakes the thread from [`park_timeout`] (on a simulated world it wakes by itself).
    pub fn unpark(&self) {
        self.handle.thread().unpark();
    }
}

/// Starts `body` on a new thread named `name`; on a simulated world, as a task of the calling
/// task's rank.
pub fn spawn<T: Send + 'static>(
    name: &str,
    body: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<Thread<T>> {
    let Some(parent) = current_task() else {
        let handle = std::thread::Builder::new().name(name.into()).spawn(body)?;
        return Ok(Thread { handle, task: None });
    };
    let task = parent.spawn_child(name);
    let runner = task.clone();
    let run = move || {
        let mut value = None;
        match runner.run(Box::new(|| value = Some(body()))) {
            Ok(()) => value.expect("the task's body returned"),
            Err(payload) => std::panic::resume_unwind(payload),
        }
    };
    let handle = std::thread::Builder::new().name(name.into()).spawn(run);
    let handle = handle.inspect_err(|_| task.abandon())?;
    step("spawn");
    Ok(Thread { handle, task: Some(task) })
}

/// The time now.
pub fn now() -> Instant {
    match current_task() {
        Some(task) => task.now(),
        None => Instant::now(),
    }
}

/// The time on the coarse monotonic clock (`coarsetime`, without a cache update).
#[inline]
pub fn coarse_now() -> coarsetime::Instant {
    match current_task() {
        Some(task) => coarsetime::Instant::from_ticks(task.coarse_ticks()),
        None => coarsetime::Instant::now_without_cache_update(),
    }
}

/// The time elapsed since `earlier` (zero if it is later than now).
pub fn since(earlier: Instant) -> Duration {
    now().saturating_duration_since(earlier)
}

/// Sleeps for `span`.
pub fn sleep(span: Duration) {
    if current_task().is_some_and(|task| task.sleep("sleep", span)) {
        return;
    }
    std::thread::sleep(span);
}

/// Sleeps for at most `span`, or until [`Thread::unpark`].
pub fn park_timeout(span: Duration) {
    if current_task().is_some_and(|task| task.sleep("sleep", span)) {
        return;
    }
    std::thread::park_timeout(span);
}

/// A step of the calling task on a simulated world, where the scheduler may run another task
/// (and where a planned fault may strike); nothing in production.
#[inline]
pub fn step(what: &'static str) {
    if let Some(task) = current_task() {
        task.step(what);
    }
}

/// Locks `mutex`, also when a thread panicked while holding it (the data guarded here stays
/// consistent at every point a panic can leave it).
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    if let Some(task) = running_task() {
        loop {
            match mutex.try_lock() {
                Ok(guard) => return guard,
                Err(std::sync::TryLockError::Poisoned(p)) => return p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => task.wait_a_little("lock"),
            }
        }
    }
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Waits on `changed` for at most `span`, with `guard` (of `mutex`) released meanwhile; `what`
/// names the wait in a simulated world's trace.
pub fn wait_timeout<'a, T>(
    what: &'static str,
    changed: &Condvar,
    mutex: &'a Mutex<T>,
    guard: MutexGuard<'a, T>,
    span: Duration,
) -> MutexGuard<'a, T> {
    if let Some(task) = running_task() {
        drop(guard);
        task.sleep(what, span);
        return lock(mutex);
    }
    match changed.wait_timeout(guard, span) {
        Ok((guard, _)) => guard,
        Err(poisoned) => poisoned.into_inner().0,
    }
}

/// The next value from `queue`, `Err` once every sender is gone.
pub fn recv<T>(queue: &mpsc::Receiver<T>) -> Result<T, mpsc::RecvError> {
    if let Some(task) = running_task() {
        loop {
            match queue.try_recv() {
                Ok(value) => return Ok(value),
                Err(mpsc::TryRecvError::Disconnected) => return Err(mpsc::RecvError),
                Err(mpsc::TryRecvError::Empty) => task.wait_a_little("recv"),
            }
        }
    }
    queue.recv()
}

/// Tells on a thread of its own whether the process listening at `address` is frozen, within
/// twice `timeout` and half a second more (the connection, the write, then [`FROZEN_AFTER`]):
/// its host's kernel completes a TCP connection (it does so for a stopped process), and the
/// listener's owner then neither reads nor closes it. The probe sends 4 KiB of zeros, which a
/// running owner rejects as a wrong introduction by closing the connection within
/// [`FROZEN_AFTER`] (so a member that runs, in a recovery for one, is not taken for frozen). A
/// refused connection (the process is dead) or none within `timeout` (the host is cut off or
/// down) answers no as well. The channel ends without a word when the thread could not start.
/// Never used on a simulated world (its fabric has no listeners).
pub fn probe_tcp(address: std::net::SocketAddr, timeout: Duration) -> mpsc::Receiver<bool> {
    let (tell, told) = mpsc::channel();
    let probe = move || {
        let _ = tell.send(is_frozen(address, timeout));
    };
    let _ = std::thread::Builder::new().name("ftkv-probe".into()).spawn(probe);
    told
}

/// How long a probe waits for a running listener's owner to reject its bytes: its serving
/// thread sleeps in `poll` and answers within milliseconds, also beside busy loops.
pub const FROZEN_AFTER: Duration = Duration::from_millis(500);

fn is_frozen(address: std::net::SocketAddr, timeout: Duration) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&address, timeout) else {
        return false;
    };
    if stream.set_write_timeout(Some(timeout)).is_err() || stream.write_all(&[0; 4096]).is_err() {
        return false;
    }
    if stream.set_read_timeout(Some(timeout.min(FROZEN_AFTER))).is_err() {
        return false;
    }
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Err(e) => matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
        // Closed (no byte) or answered (a byte): the owner runs.
        Ok(0) => false,
        Ok(_answered) => false,
    }
}
