//! Ending a process that the survivors declared failed: a stopped or frozen rank is not dead,
//! and the launcher waits for every rank it started, so a job whose survivors have finished
//! would wait for it as long as it stays frozen.
//!
//! - [`own_tag`]: who this process is ([`ProcessTag`]: pid, start time, rank in the runtime),
//!   exchanged by the store's members at creation.
//! - [`kill_on_this_host`]: SIGKILL by pid, after checking that the pid still names the same
//!   process (its start time), so a pid that the kernel gave to another process since is left
//!   alone. Only for a process on this host: pids mean nothing on another machine.
//! - [`kill_through_runtime`]: asks the runtime (PMIx job control, through the local daemon,
//!   which routes it to the daemon of the target's host) to kill a rank of this job: what
//!   reaches a process on another host.

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::OnceLock;

use crate::error::{MpiError, Result};

/// Who a process is: enough to end it later and to know that it is still the same process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcessTag {
    /// Its pid on its host.
    pub pid: u32,
    /// Its start time in clock ticks after boot (`/proc/<pid>/stat`, field 22); 0 unknown.
    pub started: u64,
    /// Its rank in the runtime's job (`PMIX_RANK`); `u32::MAX` when not started by PMIx.
    pub runtime_rank: u32,
}

/// What a kill did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Killed {
    /// SIGKILL was sent (or the runtime accepted the request).
    Sent,
    /// The process had already ended (or its pid names another process now).
    Gone,
}

/// This process's tag.
pub fn own_tag() -> ProcessTag {
    let pid = std::process::id();
    let runtime_rank = std::env::var("PMIX_RANK").ok().and_then(|r| r.parse().ok());
    ProcessTag {
        pid,
        started: start_time(pid).unwrap_or(0),
        runtime_rank: runtime_rank.unwrap_or(u32::MAX),
    }
}

/// The start time of process `pid` (field 22 of `/proc/<pid>/stat`), `None` when it is gone.
fn start_time(pid: u32) -> Option<u64> {
    stat_field(pid, 22)?.parse().ok()
}

/// Whether the process `pid` is gone: no longer in `/proc`, or a zombie its parent has not
/// reaped yet (a stopped process is not gone).
pub fn is_gone(pid: u32) -> bool {
    matches!(stat_field(pid, 3).as_deref(), None | Some("Z") | Some("X"))
}

/// Field `number` (counted from 1, as proc(5) does; 3 or more) of `/proc/<pid>/stat`, `None`
/// when the process is gone.
pub(crate) fn stat_field(pid: u32, number: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 2 (the command) is in parentheses and may hold spaces: count after its end.
    let after_command = stat.rsplit_once(')')?.1;
    after_command.split_whitespace().nth(number.checked_sub(3)?).map(str::to_owned)
}

/// SIGKILLs the process `tag` names on this host, when its pid still names it (same start
/// time). SIGKILL ends a stopped process too. Never this process itself.
pub fn kill_on_this_host(tag: &ProcessTag) -> Result<Killed> {
    if tag.pid == std::process::id() || tag.pid == 0 || tag.started == 0 {
        return Err(MpiError::Other {
            op: "kill_on_this_host",
            class: 0,
            msg: format!("refusing to kill pid {} (this process or no tag)", tag.pid),
        });
    }
    if start_time(tag.pid) != Some(tag.started) {
        return Ok(Killed::Gone);
    }
    // SAFETY: kill(2) with a pid checked above to name the tagged process and a valid signal
    // number; it touches no memory of this process.
    let rc = unsafe { libc::kill(tag.pid as libc::pid_t, libc::SIGKILL) };
    match rc {
        0 => Ok(Killed::Sent),
        _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) => {
            Ok(Killed::Gone)
        }
        _ => Err(MpiError::Other {
            op: "kill_on_this_host",
            class: 0,
            msg: format!("kill({}, SIGKILL): {}", tag.pid, std::io::Error::last_os_error()),
        }),
    }
}

/// Asks the runtime to kill rank `runtime_rank` of this process's job (PMIx job control with
/// the kill directive, `PMIx_Job_control_nb`), and returns once the request is on its way; the
/// runtime's daemon on the target's host kills it (SIGKILL ends a stopped process too). The
/// request's outcome arrives later and is reported on stderr when it is an error. `Other` when
/// this process was not started by a PMIx runtime (no `PMIX_NAMESPACE`), when the PMIx library
/// does not offer job control, or when the local PMIx server refused the request at once.
pub fn kill_through_runtime(runtime_rank: u32) -> Result<Killed> {
    let refuse = |msg: String| MpiError::Other { op: "kill_through_runtime", class: 0, msg };
    let namespace = std::env::var("PMIX_NAMESPACE")
        .map_err(|_| refuse("not started by a PMIx runtime (no PMIX_NAMESPACE)".into()))?;
    let control = job_control()
        .ok_or_else(|| refuse("the PMIx library has no PMIx_Job_control_nb".into()))?;
    let request = Box::new(pmix::KillRequest::new(&namespace, runtime_rank).map_err(refuse)?);
    let raw = Box::into_raw(request);
    // SAFETY: `control` is PMIx_Job_control_nb as the loaded PMIx library exports it (looked up
    // by name, with the prototype of PMIx 4/5's pmix.h). The target and the directive live in
    // the boxed request, which stays allocated until the callback frees it (or below, when the
    // call refused at once and no callback comes).
    let status = unsafe {
        let request = &*raw;
        control(&request.target, 1, &request.directive, 1, Some(pmix::killed), raw.cast())
    };
    if status == pmix::SUCCESS {
        return Ok(Killed::Sent);
    }
    // SAFETY: the request was refused synchronously, so PMIx holds no pointer to it and the
    // callback will not run: this is its only owner.
    drop(unsafe { Box::from_raw(raw) });
    match status {
        pmix::OPERATION_SUCCEEDED => Ok(Killed::Sent),
        _ => Err(refuse(format!(
            "PMIx_Job_control_nb refused the kill of rank {runtime_rank}: PMIx status {status}"
        ))),
    }
}

type JobControl = unsafe extern "C" fn(
    *const pmix::Proc,
    usize,
    *const pmix::Info,
    usize,
    Option<pmix::InfoCallback>,
    *mut c_void,
) -> c_int;

/// `PMIx_Job_control_nb` of the PMIx library this process loaded with Open MPI, looked up once
/// by name (no PMIx header or link needed: a cluster's Open MPI may use its own PMIx).
fn job_control() -> Option<JobControl> {
    static FOUND: OnceLock<Option<JobControl>> = OnceLock::new();
    *FOUND.get_or_init(|| {
        let name = CString::new("PMIx_Job_control_nb").expect("no NUL in the name");
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads the loaded
        // libraries' symbol tables.
        let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        // SAFETY: the symbol is the PMIx function of that name, whose C prototype JobControl
        // declares (PMIx standard 4 and 5, stable ABI).
        (!symbol.is_null())
            .then(|| unsafe { std::mem::transmute::<*mut c_void, JobControl>(symbol) })
    })
}

/// The parts of PMIx's C ABI (OpenPMIx 4 and 5, x86_64 and aarch64) that a kill request needs.
mod pmix {
    use super::{c_char, c_int, c_void};

    pub const SUCCESS: c_int = 0;
    /// The request completed inside the call; no callback follows.
    pub const OPERATION_SUCCEEDED: c_int = -157;
    const BOOL: u16 = 1;
    const MAX_NSLEN: usize = 255;
    const MAX_KEYLEN: usize = 511;
    const JOB_CTRL_KILL: &str = "pmix.jctrl.kill";

    /// `pmix_proc_t`.
    #[repr(C)]
    pub struct Proc {
        nspace: [c_char; MAX_NSLEN + 1],
        rank: u32,
    }

    /// `pmix_value_t`: a type and a 24-byte union (its largest member, `pmix_envar_t`: two
    /// pointers and a char), 8-aligned.
    #[repr(C)]
    pub struct Value {
        kind: u16,
        data: [u64; 3],
    }

    /// `pmix_info_t`.
    #[repr(C)]
    pub struct Info {
        key: [c_char; MAX_KEYLEN + 1],
        flags: u32,
        value: Value,
    }

    /// `pmix_info_cbfunc_t`.
    pub type InfoCallback = unsafe extern "C" fn(
        status: c_int,
        info: *mut Info,
        ninfo: usize,
        cbdata: *mut c_void,
        release: Option<unsafe extern "C" fn(*mut c_void)>,
        release_data: *mut c_void,
    );

    /// A kill of one rank: the target and the directive, alive until the callback.
    pub struct KillRequest {
        pub target: Proc,
        pub directive: Info,
    }

    impl KillRequest {
        pub fn new(namespace: &str, rank: u32) -> Result<KillRequest, String> {
            if namespace.len() > MAX_NSLEN || namespace.bytes().any(|b| b == 0) {
                return Err(format!("PMIx namespace {namespace:?} is not a valid name"));
            }
            let mut target = Proc { nspace: [0; MAX_NSLEN + 1], rank };
            copy_name(&mut target.nspace, namespace);
            let value = Value { kind: BOOL, data: [1, 0, 0] };
            let mut directive = Info { key: [0; MAX_KEYLEN + 1], flags: 0, value };
            copy_name(&mut directive.key, JOB_CTRL_KILL);
            Ok(KillRequest { target, directive })
        }
    }

    fn copy_name(into: &mut [c_char], name: &str) {
        into.iter_mut().zip(name.bytes()).for_each(|(c, b)| *c = b as c_char);
    }

    /// The request's completion: frees it, releases PMIx's results, reports an error.
    ///
    /// # Safety
    /// `cbdata` is the `KillRequest` that `kill_through_runtime` leaked for this request.
    pub unsafe extern "C" fn killed(
        status: c_int,
        _info: *mut Info,
        _ninfo: usize,
        cbdata: *mut c_void,
        release: Option<unsafe extern "C" fn(*mut c_void)>,
        release_data: *mut c_void,
    ) {
        // SAFETY: the caller's contract: cbdata is the boxed request, owned by nobody else.
        let request = unsafe { Box::from_raw(cbdata.cast::<KillRequest>()) };
        if status != SUCCESS && status != OPERATION_SUCCEEDED {
            eprintln!(
                "ftkv: the runtime did not kill rank {}: PMIx status {status}",
                request.target.rank
            );
        }
        if let Some(release) = release {
            // SAFETY: PMIx's own release function with the data it gave for it.
            unsafe { release(release_data) };
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn stat_fields_count_as_proc_5_does() {
            let me = std::process::id();
            let parent = std::os::unix::process::parent_id().to_string();
            assert_eq!(super::super::stat_field(me, 4), Some(parent));
            assert!(super::super::start_time(me).is_some_and(|t| t > 0));
            assert_eq!(super::super::stat_field(me, 2), None);
        }

        #[test]
        fn the_structs_have_pmix_5s_sizes() {
            assert_eq!(std::mem::size_of::<super::Proc>(), 260);
            assert_eq!(std::mem::size_of::<super::Value>(), 32);
            assert_eq!(std::mem::size_of::<super::Info>(), 552);
        }
    }
}
