//! How a rank of an ftkv job ends when it meets an error or a panic: it prints the error with
//! its rank (`ftkv: rank R: error: ...`) and ends the whole job at once ([`ftkv_mpi::end_job`]),
//! instead of returning into `MPI_Finalize`, where ULFM would wait for the other ranks forever.
//! Drivers look for [`ERROR_PREFIX`] lines to show the error.

use crate::env;

/// What every rank's error line starts with, before the rank number.
pub const ERROR_PREFIX: &str = "ftkv: rank ";

/// Exit code of a rank that ended the job because of an error.
const ERROR_EXIT: i32 = 1;
/// Exit code of a rank that ended the job because of a panic.
const PANIC_EXIT: i32 = 101;

/// Prints `e` as this rank's error (also to the launcher's record,
/// [`crate::launch::record_rank_error`]) and ends the job.
pub fn end_job_on_error(e: &anyhow::Error) -> ! {
    report(&format!("{}: error: {e:#}", rank_label()));
    ftkv_mpi::end_job(ERROR_EXIT)
}

/// Makes a panic on any thread of this rank print its message (and record it) and end the job.
pub fn end_job_on_panic() {
    std::panic::set_hook(Box::new(|info| {
        report(&format!("{}: panic: {info}", rank_label()));
        ftkv_mpi::end_job(PANIC_EXIT)
    }));
}

fn report(line: &str) {
    eprintln!("{line}");
    crate::launch::record_rank_error(env::world_rank(), line);
}

fn rank_label() -> String {
    match env::world_rank() {
        Some(rank) => format!("{ERROR_PREFIX}{rank}"),
        None => "ftkv: rank ?".to_owned(),
    }
}

/// The error lines of ranks in a job's stderr (`[job,rank]<stderr>: ftkv: rank R: error: ...`),
/// without Open MPI's tags, at most `limit` of them.
pub fn error_lines(stderr: &str, limit: usize) -> Vec<String> {
    let own = stderr.lines().filter_map(|line| {
        let at = line.find(ERROR_PREFIX)?;
        let text = &line[at..];
        (text.contains(": error: ") || text.contains(": panic: ")).then(|| text.trim().to_owned())
    });
    own.take(limit).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_lines_are_found_with_and_without_tags() {
        let stderr = "[1,2]<stderr>: ftkv: rank 2: error: window too large\n\
                      noise\n\
                      ftkv: rank 0: panic: panicked at bench.rs:13\n\
                      [1,1]<stderr>: ftkv: rank 1 epoch 0: recovery: revoked\n";
        assert_eq!(
            error_lines(stderr, 10),
            vec![
                "ftkv: rank 2: error: window too large".to_owned(),
                "ftkv: rank 0: panic: panicked at bench.rs:13".to_owned()
            ]
        );
        assert_eq!(error_lines(stderr, 1).len(), 1);
    }
}
