//! What the store asks of the operating system besides its fabric: threads, the clock, sleeps,
//! locks and waits.
//!
//! In production these are `std`'s, one call each. On a simulated world ([`crate::world`], the
//! `sim` feature) the same calls go to the world's scheduler when the calling thread is one of
//! its tasks: a spawned thread becomes a task, the clock is virtual, a sleep lets other tasks
//! run until the virtual time comes, and a wait for a lock, a message or another thread's end
//! polls in virtual time instead of blocking the thread, so that only the task the seeded
//! scheduler picked ever runs. The production code runs unchanged on both.
//!
//! Waits may return early (as `Condvar`'s may): callers loop on their condition.

use std::sync::mpsc;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A thread started by [`spawn`].
pub struct Thread<T> {
    handle: std::thread::JoinHandle<T>,
    #[cfg(feature = "sim")]
    task: Option<crate::world::TaskRef>,
}

impl<T> Thread<T> {
    /// Waits for the thread's end and returns its result (`Err` with the payload when it
    /// panicked).
    pub fn join(self) -> std::thread::Result<T> {
        #[cfg(feature = "sim")]
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
    #[cfg(feature = "sim")]
    let body = match crate::world::spawn_task(name, body) {
        Ok((task, run)) => {
            let handle = std::thread::Builder::new().name(name.into()).spawn(run);
            let handle = handle.inspect_err(|_| task.abandon())?;
            step("spawn");
            return Ok(Thread { handle, task: Some(task) });
        }
        Err(body) => body,
    };
    let handle = std::thread::Builder::new().name(name.into()).spawn(body)?;
    Ok(Thread {
        handle,
        #[cfg(feature = "sim")]
        task: None,
    })
}

/// The time now.
pub fn now() -> Instant {
    #[cfg(feature = "sim")]
    if let Some(now) = crate::world::now() {
        return now;
    }
    Instant::now()
}

/// The time elapsed since `earlier` (zero if it is later than now).
pub fn since(earlier: Instant) -> Duration {
    now().saturating_duration_since(earlier)
}

/// Sleeps for `span`.
pub fn sleep(span: Duration) {
    #[cfg(feature = "sim")]
    if crate::world::sleep(span) {
        return;
    }
    std::thread::sleep(span);
}

/// Sleeps for at most `span`, or until [`Thread::unpark`].
pub fn park_timeout(span: Duration) {
    #[cfg(feature = "sim")]
    if crate::world::sleep(span) {
        return;
    }
    std::thread::park_timeout(span);
}

/// A step of the calling task on a simulated world, where the scheduler may run another task
/// (and where a planned fault may strike); nothing in production.
pub fn step(what: &'static str) {
    #[cfg(feature = "sim")]
    crate::world::step(what);
    #[cfg(not(feature = "sim"))]
    let _ = what;
}

/// Locks `mutex`, also when a thread panicked while holding it (the data guarded here stays
/// consistent at every point a panic can leave it).
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(feature = "sim")]
    if crate::world::in_world() {
        loop {
            match mutex.try_lock() {
                Ok(guard) => return guard,
                Err(std::sync::TryLockError::Poisoned(p)) => return p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => crate::world::wait_a_little("lock"),
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
    #[cfg(feature = "sim")]
    if crate::world::in_world() {
        drop(guard);
        crate::world::sleep_as(what, span);
        return lock(mutex);
    }
    let _ = (mutex, what);
    match changed.wait_timeout(guard, span) {
        Ok((guard, _)) => guard,
        Err(poisoned) => poisoned.into_inner().0,
    }
}

/// The next value from `queue`, `Err` once every sender is gone.
pub fn recv<T>(queue: &mpsc::Receiver<T>) -> Result<T, mpsc::RecvError> {
    #[cfg(feature = "sim")]
    if crate::world::in_world() {
        loop {
            match queue.try_recv() {
                Ok(value) => return Ok(value),
                Err(mpsc::TryRecvError::Disconnected) => return Err(mpsc::RecvError),
                Err(mpsc::TryRecvError::Empty) => crate::world::wait_a_little("recv"),
            }
        }
    }
    queue.recv()
}

/// Tells on a thread of its own, within `timeout` and half a second more, whether the process listening
/// at `address` is frozen: its host's kernel completes a TCP connection (it does so for a
/// stopped process), and the listener's owner then neither reads nor closes it. The probe
/// sends 4 KiB of zeros, which a running owner rejects as a wrong introduction by closing the
/// connection within [`FROZEN_AFTER`] (so a member that runs, in a recovery for one, is not
/// taken for frozen); a
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
        // Closed (0 bytes) or answered: the owner runs.
        Ok(0) => false,
        Ok(_) => false,
    }
}
