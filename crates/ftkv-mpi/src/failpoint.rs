//! Named failure points: a process kills itself with SIGKILL where a test asks it to.
//!
//! `FTKV_FAILPOINT` holds `;`-separated entries `name` or `name@r1,r2,...` (world ranks, read from
//! `OMPI_COMM_WORLD_RANK`), optionally with `#n` to fire on the n-th hit only (1-based), e.g.
//! `after_put@1#3;in_recovery@2`. An unset variable costs one relaxed atomic load per hit.
//! Any point `name` can also stop its process (SIGSTOP) when `name:stop` is armed.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    name: String,
    ranks: Option<Vec<i32>>,
    nth: Option<u64>,
}

fn parse(spec: &str) -> Vec<Entry> {
    spec.split(';').filter(|s| !s.trim().is_empty()).filter_map(parse_entry).collect()
}

fn parse_entry(entry: &str) -> Option<Entry> {
    let (rest, nth) = match entry.trim().split_once('#') {
        Some((rest, n)) => (rest, Some(n.parse().ok()?)),
        None => (entry.trim(), None),
    };
    let (name, ranks) = match rest.split_once('@') {
        Some((name, ranks)) => {
            (name, Some(ranks.split(',').map(|r| r.trim().parse()).collect::<Result<_, _>>().ok()?))
        }
        None => (rest, None),
    };
    Some(Entry { name: name.to_owned(), ranks, nth })
}

struct Armed {
    entries: Vec<Entry>,
    rank: i32,
    hits: Mutex<HashMap<String, u64>>,
}

#[inline]
fn armed() -> &'static Option<Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED.get_or_init(|| {
        let spec = std::env::var("FTKV_FAILPOINT").ok()?;
        let rank = std::env::var("OMPI_COMM_WORLD_RANK").ok().and_then(|r| r.parse().ok());
        Some(Armed { entries: parse(&spec), rank: rank.unwrap_or(-1), hits: Mutex::default() })
    })
}

/// Kills this process with SIGKILL if the failure point `name` is armed for this rank (and this
/// is the armed hit). Prints `failpoint <name> fired` to stderr first.
#[inline]
pub fn hit(name: &str) {
    if armed().is_some() {
        hit_armed(name);
    }
}

fn hit_armed(name: &str) {
    if fires(name) {
        tracing::warn!("failpoint {name} fired on rank {}", rank());
        kill_self();
    }
}

/// Blocks this thread forever if the failure point `name` fires: a call that never returns, as
/// a one-sided MPI call against some dead targets does.
#[inline]
pub fn stall(name: &str) {
    if armed().is_some() {
        stall_armed(name);
    }
}

fn stall_armed(name: &str) {
    if fires(name) {
        tracing::warn!("failpoint {name} stalls rank {}", rank());
        loop {
            std::thread::park();
        }
    }
}

/// Stops this process with SIGSTOP (every thread, as a frozen host would) if the failure point
/// `<point>:stop` fires, and goes on once something sends it SIGCONT.
#[inline]
pub fn stop(point: &str) {
    if armed().is_some() {
        stop_armed(point);
    }
}

fn stop_armed(point: &str) {
    let name = format!("{point}:stop");
    if fires(&name) {
        tracing::warn!("failpoint {name} stops rank {}", rank());
        // SAFETY: raise(3) has no memory-safety preconditions.
        let raised = unsafe { libc::raise(libc::SIGSTOP) };
        if raised != 0 {
            tracing::error!("failpoint {name}: raise(SIGSTOP) failed");
        }
    }
}

fn rank() -> i32 {
    armed().as_ref().map_or(-1, |a| a.rank)
}

/// Counts a hit of `name` on this rank and says whether it is the armed one.
fn fires(name: &str) -> bool {
    let Some(armed) = armed() else { return false };
    let Some(entry) = armed.entries.iter().find(|e| e.name == name && matches_rank(e, armed.rank))
    else {
        return false;
    };
    let count = {
        let mut hits = armed.hits.lock().unwrap_or_else(|p| p.into_inner());
        let n = hits.entry(name.to_owned()).or_insert(0);
        *n += 1;
        *n
    };
    entry.nth.is_none_or(|nth| nth == count)
}

fn matches_rank(entry: &Entry, rank: i32) -> bool {
    entry.ranks.as_ref().is_none_or(|ranks| ranks.contains(&rank))
}

/// Ends this process at once with SIGKILL: a fail-stop failure, no clean-up, no MPI_Finalize.
pub fn kill_self() -> ! {
    // SAFETY: raise(3) has no memory-safety preconditions.
    unsafe { libc::raise(libc::SIGKILL) };
    unreachable!("SIGKILL cannot be caught")
}

/// Disarms an [`exit_unless_done`] timer when dropped.
#[derive(Debug)]
pub struct DoneGuard(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for DoneGuard {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Runs `on_expiry` and leaves the process with [`exit_now`]`(0)` unless the returned guard is
/// dropped within `bound`: for a call that may never return (a one-sided call against a dead
/// target, `MPI_Finalize` after failures).
pub fn exit_unless_done(
    bound: std::time::Duration,
    on_expiry: impl FnOnce() + Send + 'static,
) -> DoneGuard {
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    std::thread::spawn(move || {
        std::thread::sleep(bound);
        if !flag.load(std::sync::atomic::Ordering::SeqCst) {
            on_expiry();
            exit_now(0);
        }
    });
    DoneGuard(done)
}

/// Leaves the process at once with `code` (`_exit`): no destructors, no atexit handlers, no
/// `MPI_Finalize`. For a rank whose MPI state is wedged (a call that never returns).
pub fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let flushed = std::io::stdout().flush().and(std::io::stderr().flush());
    if let Err(e) = flushed {
        tracing::error!("exit_now: cannot flush output: {e}");
    }
    // SAFETY: _exit(2) has no memory-safety preconditions.
    unsafe { libc::_exit(code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_ranks_and_counts() {
        let table = [
            ("a", vec![Entry { name: "a".into(), ranks: None, nth: None }]),
            ("a@1,3", vec![Entry { name: "a".into(), ranks: Some(vec![1, 3]), nth: None }]),
            ("b@2#4", vec![Entry { name: "b".into(), ranks: Some(vec![2]), nth: Some(4) }]),
            (
                "a#2; b@0",
                vec![
                    Entry { name: "a".into(), ranks: None, nth: Some(2) },
                    Entry { name: "b".into(), ranks: Some(vec![0]), nth: None },
                ],
            ),
            ("a@x", vec![]),
            ("", vec![]),
        ];
        for (spec, want) in table {
            assert_eq!(parse(spec), want, "spec {spec:?}");
        }
    }
}
