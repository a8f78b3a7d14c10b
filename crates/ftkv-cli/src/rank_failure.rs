//! How a rank of an ftkv job ends when it meets an error or a panic: it prints the error with
//! its rank on one line (`ftkv: rank R: error: ...`, [`rank_error_line`]) and ends the whole job
//! at once ([`ftkv_mpi::end_job`]), instead of returning into `MPI_Finalize`, where ULFM would
//! wait for the other ranks forever. Drivers read these lines back and show each message once,
//! with the ranks that reported it ([`crate::rank_errors`]).

use crate::env;
use crate::rank_errors::{rank_error_line, Ending};

/// Exit code of a rank that ended the job because of an error.
const ERROR_EXIT: i32 = 1;
/// Exit code of a rank that ended the job because of a panic.
const PANIC_EXIT: i32 = 101;

/// Prints `e` as this rank's error (also to the launcher's record,
/// [`crate::records::record_rank_error`]) and ends the job.
pub fn end_job_on_error(e: &anyhow::Error) -> ! {
    report(Ending::Error, &format!("{e:#}"));
    ftkv_mpi::end_job(ERROR_EXIT)
}

/// Makes a panic on any thread of this rank print its message (and record it) and end the job.
pub fn end_job_on_panic() {
    std::panic::set_hook(Box::new(|info| {
        report(Ending::Panic, &info.to_string());
        ftkv_mpi::end_job(PANIC_EXIT)
    }));
}

fn report(ending: Ending, message: &str) {
    let line = rank_error_line(env::world_rank(), ending, message);
    eprintln!("{line}");
    crate::records::record_rank_error(env::world_rank(), &line);
}
