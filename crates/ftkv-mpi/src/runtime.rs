//! MPI initialisation and finalisation.

use std::ffi::c_int;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{check, other, Result};
use crate::ffi;

static INITIALISED: AtomicBool = AtomicBool::new(false);

/// Keeps MPI initialised; shared by every handle, so that [`Mpi::finalize`] can tell whether any
/// is still alive. Dropping it does not finalise MPI (see [`Mpi`]).
#[derive(Debug)]
pub(crate) struct Runtime {
    finalized: AtomicBool,
}

impl Runtime {
    fn finalize(&self) -> Result<()> {
        if self.finalized.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        // SAFETY: MPI was initialised by `Mpi::init`, and `Mpi::finalize` checked that no
        // handle that uses it is alive.
        check(unsafe { ffi::MPI_Finalize() }, "MPI_Finalize")
    }
}

/// The suspicion bound of Open MPI's heartbeat detector when the environment sets none: a rank
/// silent this long (stopped, frozen, cut off) is declared failed.
pub const DEFAULT_SUSPICION: std::time::Duration = std::time::Duration::from_secs(10);

/// The heartbeat period that goes with [`DEFAULT_SUSPICION`]: one tenth of the bound.
const DEFAULT_HEARTBEAT_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

/// Switches Open MPI's heartbeat failure detector on for this process, with a heartbeat every
/// second, the timeout [`DEFAULT_SUSPICION`] and failure notices spread
/// by reliable broadcast among the ranks: without it, a rank that stops responding without
/// dying (SIGSTOP, a frozen host) is never declared failed and every collective recovery waits
/// for it. The heartbeats go out from MPI progress, which a store's detector thread makes
/// every millisecond, not from a thread of Open MPI's own (`mpi_ft_detector_thread`): with that
/// thread, 4 of 90 failure-free demo runs beside two busy loops ended with a rank aborted by a
/// signal during start-up or with `MPI_Finalize` stuck on every rank (0 of 40 with the detector
/// off, 0 of 50 with it driven by progress, and 0 of 50 over 3 simulated hosts). A process that makes no MPI call for the whole
/// timeout while no store is open is declared failed. Leaves the detector alone when the environment already
/// configures it (`OMPI_MCA_mpi_ft_detector`, which `mpirun --mca mpi_ft_detector ...` sets,
/// `false` included), and each other parameter the environment sets. Open MPI reads them in
/// `MPI_Init`; every rank of a job runs this with the same environment, so all agree.
/// [`Mpi::init`] calls it; a program that initialises MPI itself calls it before `MPI_Init`
/// (ftkv's C library does when it is loaded).
pub fn default_heartbeat_detector() {
    if std::env::var_os("OMPI_MCA_mpi_ft_detector").is_some() {
        return;
    }
    let settings = [
        ("OMPI_MCA_mpi_ft_detector", "true".to_owned()),
        ("OMPI_MCA_mpi_ft_detector_thread", "false".to_owned()),
        ("OMPI_MCA_mpi_ft_detector_period", DEFAULT_HEARTBEAT_PERIOD.as_secs_f64().to_string()),
        ("OMPI_MCA_mpi_ft_detector_timeout", DEFAULT_SUSPICION.as_secs_f64().to_string()),
        ("OMPI_MCA_mpi_ft_propagator_with_rbcast", "true".to_owned()),
    ];
    for (name, value) in settings {
        if std::env::var_os(name).is_none() {
            std::env::set_var(name, value);
        }
    }
}

/// The collective components that are not fault tolerant, left out unless the environment
/// chooses the collective components itself (`OMPI_MCA_coll`, which `mpirun --mca coll ...`
/// overrides): Open MPI 5.0's `coll/han` (and `coll/cuda`, which stacks on it) is selected by
/// default on multi-host communicators, deadlocks `MPIX_Comm_agree` across nodes and crashes
/// collectives after a failure (open-mpi/ompi issue 13915; a C program's own `MPI_Allreduce`
/// after a host's ranks died ended in `mca_coll_han_comm_create`).
pub const NOT_FAULT_TOLERANT_COLLECTIVES: &str = "^han,cuda";

/// Open MPI settings that fault tolerance needs, each unless the environment sets it (read by
/// `MPI_Init`; [`Mpi::init`] calls this, and ftkv's C library when it is loaded):
///
/// - `OMPI_MCA_coll`: the collective components that are not fault tolerant left out
///   ([`NOT_FAULT_TOLERANT_COLLECTIVES`]);
/// - `OMPI_MCA_async_mpi_finalize=true`: `MPI_Finalize` without its closing PMIx fence over
///   every process of the job. After a failure that fence waits until every daemon has
///   accounted for its dead processes: a process the runtime killed on request held the
///   survivors' `MPI_Finalize` for 2.7 s (3 simulated hosts, a host's ranks stopped and ended
///   through the runtime: the job ended 3.1 s after them, 0.5 s with the fence off; measured
///   with `ftkv --nodes 3 demo -n 6 --kills 0 --stop 30 --stop-host --suspicion 3`). Under
///   ULFM `MPI_Finalize` first shrinks `MPI_COMM_WORLD` and runs a synchronous barrier among
///   the survivors, which flushes their messages, so the fence adds nothing a survivor needs.
pub fn fault_tolerant_defaults() {
    let settings = [
        ("OMPI_MCA_coll", NOT_FAULT_TOLERANT_COLLECTIVES),
        ("OMPI_MCA_async_mpi_finalize", "true"),
    ];
    for (name, value) in settings {
        if std::env::var_os(name).is_none() {
            std::env::set_var(name, value);
        }
    }
}

/// The MPI library, initialised once per process.
///
/// Only [`Mpi::finalize`] and [`Mpi::finalize_bounded`] finalise MPI. Dropping it does not: a
/// rank that leaves on an error path must not enter `MPI_Finalize`, which under ULFM waits for
/// peers that may never come (seen: 4 ranks spinning for 300 s after a failed window
/// allocation). A process that ends without finalising counts as failed for its peers; to end
/// the whole job instead, call [`end_job`].
#[derive(Debug)]
pub struct Mpi {
    runtime: Arc<Runtime>,
}

impl Mpi {
    /// Initialises MPI with `MPI_THREAD_MULTIPLE` and sets `MPI_ERRORS_RETURN` on
    /// `MPI_COMM_WORLD`. Open MPI's heartbeat detector runs with the [`DEFAULT_SUSPICION`]
    /// bound unless the environment configures it. Fails if the library does not provide `MPI_THREAD_MULTIPLE`, if MPI was
    /// initialised before in this process, or if the `MPI_Status` layout of the linked Open MPI
    /// differs from the one this crate was written for.
    pub fn init() -> Result<Mpi> {
        if INITIALISED.swap(true, Ordering::SeqCst) {
            return Err(other("MPI_Init_thread", "MPI was already initialised in this process"));
        }
        check_abi()?;
        default_heartbeat_detector();
        fault_tolerant_defaults();
        let mut provided: c_int = 0;
        // SAFETY: MPI permits NULL argc/argv; `provided` is a valid out-pointer.
        let rc = unsafe {
            ffi::MPI_Init_thread(
                ptr::null_mut(),
                ptr::null_mut(),
                ffi::ftkv_thread_multiple,
                &mut provided,
            )
        };
        check(rc, "MPI_Init_thread")?;
        let runtime = Arc::new(Runtime { finalized: AtomicBool::new(false) });
        // SAFETY: reading an immutable constant exported by the C shim.
        if provided != unsafe { ffi::ftkv_thread_multiple } {
            return Err(other("MPI_Init_thread", "MPI_THREAD_MULTIPLE is not provided"));
        }
        // SAFETY: MPI is initialised; both handles are valid predefined handles.
        let rc =
            unsafe { ffi::MPI_Comm_set_errhandler(ffi::ftkv_comm_world, ffi::ftkv_errors_return) };
        check(rc, "MPI_Comm_set_errhandler")?;
        Ok(Mpi { runtime })
    }

    /// The MPI library as the calling program initialised it (a C program that links ftkv):
    /// fails unless MPI is initialised with `MPI_THREAD_MULTIPLE` and has the `MPI_Status`
    /// layout this crate was written for. Never finalises MPI: the program does.
    pub fn attach() -> Result<Mpi> {
        check_abi()?;
        let mut initialised: c_int = 0;
        // SAFETY: MPI_Initialized may be called at any time; the flag is a valid out-pointer.
        check(unsafe { ffi::MPI_Initialized(&mut initialised) }, "MPI_Initialized")?;
        if initialised == 0 {
            return Err(other("MPI_Initialized", "MPI is not initialised"));
        }
        let mut provided: c_int = 0;
        // SAFETY: MPI is initialised; `provided` is a valid out-pointer.
        check(unsafe { ffi::MPI_Query_thread(&mut provided) }, "MPI_Query_thread")?;
        // SAFETY: reading an immutable constant exported by the C shim.
        if provided != unsafe { ffi::ftkv_thread_multiple } {
            return Err(other("MPI_Query_thread", "MPI_THREAD_MULTIPLE is not provided"));
        }
        INITIALISED.store(true, Ordering::SeqCst);
        ignore_broken_pipes()?;
        // Marked finalised already: `Mpi::finalize` on it is a no-op.
        Ok(Mpi { runtime: Arc::new(Runtime { finalized: AtomicBool::new(true) }) })
    }

    pub(crate) fn runtime(&self) -> Arc<Runtime> {
        self.runtime.clone()
    }

    /// Like [`Mpi::finalize`], but leaves the process with exit code 0 if `MPI_Finalize` has not
    /// returned after `bound`: after process failures Open MPI's ULFM finalisation (an internal
    /// shrink and agreement) sometimes never returns, although every survivor called it. Call
    /// it when all results are out.
    pub fn finalize_bounded(self, bound: std::time::Duration) -> Result<()> {
        let _bounded = crate::failpoint::exit_unless_done(bound, move || {
            tracing::error!("ftkv-mpi: MPI_Finalize has not returned after {bound:?}; exiting")
        });
        self.finalize()
    }

    /// Finalises MPI now and reports its return code. Fails without finalising if a [`Comm`](crate::Comm) or
    /// window created from this runtime is still alive.
    pub fn finalize(self) -> Result<()> {
        if Arc::strong_count(&self.runtime) > 1 {
            return Err(other("MPI_Finalize", "communicators or windows are still alive"));
        }
        self.runtime.finalize()
    }
}

/// Makes writes to a connection whose peer died fail with `EPIPE` instead of ending this
/// process with `SIGPIPE` (as Rust programs do from the start; a C program that links ftkv
/// would otherwise die with the first peer it writes to after that peer's death: across 3
/// simulated hosts a survivor of the C example died of SIGPIPE in 8 of 15 runs before this, in
/// none of 6 after). A handler the program installed stays. An error names the sigaction(2)
/// call that failed.
fn ignore_broken_pipes() -> Result<()> {
    let failed = |what: &str| {
        other("sigaction(SIGPIPE)", &format!("{what}: {}", std::io::Error::last_os_error()))
    };
    // SAFETY: querying the disposition of SIGPIPE with sigaction(2) into a valid,
    // zero-initialised struct.
    let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: as above; a null new action only reads the current one.
    if unsafe { libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut current) } != 0 {
        return Err(failed("reading the disposition"));
    }
    if current.sa_sigaction != libc::SIG_DFL {
        return Ok(());
    }
    // SAFETY: a zero-initialised sigaction is valid; SIG_IGN installs no handler function.
    let mut ignore: libc::sigaction = unsafe { std::mem::zeroed() };
    ignore.sa_sigaction = libc::SIG_IGN;
    // SAFETY: setting SIGPIPE's disposition from a valid struct; the old one is not asked for.
    if unsafe { libc::sigaction(libc::SIGPIPE, &ignore, std::ptr::null_mut()) } != 0 {
        return Err(failed("ignoring it"));
    }
    Ok(())
}

/// Ends the whole job after an error on this rank and leaves the process with `code`.
///
/// `MPI_Abort` does not do it under `--with-ft ulfm` (Open MPI 5.0.11, measured: the caller
/// exits and the others are never told; they wait in their next collective forever). So this
/// asks the launcher to end the job: SIGTERM to the parent process when it is PRRTE's
/// (`prterun`, or `prted` on a host of a multi-host job, whose loss ends the job), then `_exit`.
/// One rank per launcher sends it (several SIGTERMs at once left `prterun` deadlocked in about
/// 1 of 40 runs here); if the launcher is still there after 5 s, that rank SIGKILLs it and the
/// launcher's other ranks. The caller prints the error first.
pub fn end_job(code: i32) -> ! {
    use std::io::Write;
    let flushed = std::io::stdout().flush().and(std::io::stderr().flush());
    if flushed.is_ok() {
        // The launcher forwards output asynchronously: give the error line, and what other
        // ranks printed just before, time to reach it before it ends the job.
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // SAFETY: getppid(2) has no preconditions.
    let parent = unsafe { libc::getppid() };
    if is_launcher(parent) {
        if let Some(_claim) = claim_ending(parent) {
            end_launcher(parent);
        }
    }
    crate::failpoint::exit_now(code)
}

/// Claims the ending of `launcher`'s job for this process: an abstract Unix socket bound by name,
/// released when the process exits. `None`: another rank has it.
fn claim_ending(launcher: libc::pid_t) -> Option<std::os::unix::net::UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("ftkv-end-job-{launcher}");
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).ok()?;
    std::os::unix::net::UnixListener::bind_addr(&addr).ok()
}

/// SIGTERM to the launcher, and after 5 s without effect SIGKILL to its ranks and itself.
fn end_launcher(launcher: libc::pid_t) {
    signal(launcher, libc::SIGTERM);
    let started = std::time::Instant::now();
    while is_launcher(launcher) && started.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if !is_launcher(launcher) {
        return;
    }
    let me = std::process::id() as libc::pid_t;
    for sibling in children_of(launcher).into_iter().filter(|&pid| pid != me) {
        signal(sibling, libc::SIGKILL);
    }
    signal(launcher, libc::SIGKILL);
}

fn signal(pid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill(2) with a pid and a valid signal number; a failure (the process is gone)
    // needs no handling, since ending it was the purpose.
    unsafe { libc::kill(pid, signal) };
}

/// The pids whose parent is `parent`, from `/proc/<pid>/stat`.
fn children_of(parent: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let pids = entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok());
    pids.filter(|&pid| parent_of(pid) == Some(parent)).collect()
}

fn parent_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    crate::process::stat_field(u32::try_from(pid).ok()?, 4)?.parse().ok()
}

/// Whether process `pid` is one of PRRTE's launcher processes.
fn is_launcher(pid: libc::pid_t) -> bool {
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    matches!(name.trim(), "prterun" | "prted" | "mpirun" | "mpiexec")
}

/// Bytes of shared memory this host can give windows: the size of the file system behind
/// `/dev/shm` (where Open MPI's shared-memory windows live), at most the physical memory.
/// `None` when neither can be read.
pub fn shared_memory_capacity() -> Option<u64> {
    let shm = statvfs_size(c"/dev/shm");
    // SAFETY: sysconf(3) has no memory-safety preconditions.
    let (pages, page) =
        unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let physical = (pages > 0 && page > 0).then(|| pages as u64 * page as u64);
    match (shm, physical) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn statvfs_size(path: &std::ffi::CStr) -> Option<u64> {
    // SAFETY: an all-zero `statvfs` is a valid value of this plain C struct.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `stat` a valid out-pointer.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut stat) };
    (rc == 0).then(|| stat.f_blocks as u64 * stat.f_frsize as u64)
}

/// `MPI_Wtime`: seconds since an arbitrary point in the past.
pub fn wtime() -> f64 {
    // SAFETY: MPI_Wtime has no preconditions in Open MPI (it reads a clock).
    unsafe { ffi::MPI_Wtime() }
}

fn check_abi() -> Result<()> {
    // SAFETY: reading immutable constants exported by the C shim.
    let (size, source, tag, error, aint) = unsafe {
        (
            ffi::ftkv_status_size,
            ffi::ftkv_status_source_offset,
            ffi::ftkv_status_tag_offset,
            ffi::ftkv_status_error_offset,
            ffi::ftkv_aint_size,
        )
    };
    let ours = (
        std::mem::size_of::<ffi::MPI_Status>(),
        std::mem::offset_of!(ffi::MPI_Status, source),
        std::mem::offset_of!(ffi::MPI_Status, tag),
        std::mem::offset_of!(ffi::MPI_Status, error),
        std::mem::size_of::<ffi::MPI_Aint>(),
    );
    if ours != (size, source, tag, error, aint) {
        return Err(other("ABI check", "MPI_Status or MPI_Aint layout differs from mpi.h"));
    }
    Ok(())
}

/// Open MPI's `MPI_MAX_PROCESSOR_NAME`.
const MAX_PROCESSOR_NAME: usize = 256;

/// `MPI_Get_processor_name`: the name of the host this process runs on.
pub fn processor_name() -> Result<String> {
    let mut buf = [0 as std::os::raw::c_char; MAX_PROCESSOR_NAME + 1];
    let mut len = 0;
    // SAFETY: `buf` holds MPI_MAX_PROCESSOR_NAME + 1 characters, as the call requires, and `len`
    // is a valid out-pointer.
    let rc = unsafe { ffi::MPI_Get_processor_name(buf.as_mut_ptr(), &mut len) };
    check(rc, "MPI_Get_processor_name")?;
    let bytes: Vec<u8> =
        buf[..len.clamp(0, MAX_PROCESSOR_NAME as i32) as usize].iter().map(|&c| c as u8).collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// This host's IPv4 interfaces that are up, as (interface name, address), in the order
/// `getifaddrs` lists them.
pub(crate) fn ipv4_interfaces() -> Result<Vec<(String, std::net::Ipv4Addr)>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `list` is a valid out-pointer; the list is freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(other("getifaddrs", &std::io::Error::last_os_error().to_string()));
    }
    let mut found = Vec::new();
    let mut entry = list;
    while !entry.is_null() {
        // SAFETY: `entry` is a node of the list getifaddrs returned, not yet freed.
        let node = unsafe { &*entry };
        let up = node.ifa_flags & libc::IFF_UP as libc::c_uint != 0;
        // SAFETY: a non-null `ifa_addr` points to a sockaddr whose family field is valid.
        let is_v4 = !node.ifa_addr.is_null()
            && i32::from(unsafe { (*node.ifa_addr).sa_family }) == libc::AF_INET;
        if up && is_v4 {
            // SAFETY: the family is AF_INET, so the address is a sockaddr_in; the name is a
            // NUL-terminated string owned by the list.
            let (addr, name) = unsafe {
                let addr = *node.ifa_addr.cast::<libc::sockaddr_in>();
                (addr, std::ffi::CStr::from_ptr(node.ifa_name).to_string_lossy().into_owned())
            };
            found.push((name, std::net::Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr))));
        }
        entry = node.ifa_next;
    }
    // SAFETY: `list` came from getifaddrs and is freed once; no node is used afterwards.
    unsafe { libc::freeifaddrs(list) };
    Ok(found)
}

#[cfg(test)]
mod tests {
    #[test]
    fn status_layout_matches_mpi_h() {
        super::check_abi().expect("MPI_Status layout");
    }
}
