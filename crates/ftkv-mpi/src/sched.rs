//! Scheduling of ftkv's background threads next to the application's.

/// Puts the calling thread under Linux's `SCHED_BATCH` policy: it keeps its share of the
/// processor, but waking up no longer lets it preempt the thread running on its core. For a
/// thread that works beside the application (writing copies the application handed off), so
/// that handing work to it does not take the core from the thread that handed it.
///
/// Completion: the calling thread only is changed when this returns `Ok`. Failure: the
/// operating system's error, the policy unchanged.
pub fn yield_on_wakeup() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `sched_setscheduler` with pid 0 changes the calling thread's policy; `param` is a
    // valid `sched_param` (priority 0, the only one SCHED_BATCH takes) that outlives the call.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
