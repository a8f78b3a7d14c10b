//! What ranks record beside their output: the launcher forwards a rank's stdout and stderr
//! asynchronously, and after a failure it can lose a rank's last lines (a job ended at once
//! lost the very error line that said why; survivors' final report lines went missing after an
//! outside kill). A job started by a [`crate::launch::Launch`] gets a directory of its own
//! ([`RECORDS_VAR`]); each rank appends its error lines ([`record_rank_error`]) and its report
//! lines ([`crate::rank_println!`]) to files there, and the job's output is completed from them when
//! it ends. Outside such a job the calls only print.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};

use anyhow::{Context, Result};

/// The variable naming the job's directory of rank records.
pub const RECORDS_VAR: &str = "FTKV_RANK_RECORDS";

/// Prints a line on stdout like `println!` and, in a rank of a launched job, records it too
/// ([`record_line`]). For the lines a driver reads back: reports, pids, progress.
#[macro_export]
macro_rules! rank_println {
    ($($arg:tt)*) => {
        $crate::records::print_and_record(&format!($($arg)*))
    };
}

/// Prints `line` on stdout, then records it ([`record_line`]).
pub fn print_and_record(line: &str) {
    println!("{line}");
    record_line(line);
}

/// Appends `line` to this rank's stdout record (`rank-<r>.out` in the job's [`RECORDS_VAR`]
/// directory) with one `write(2)`; nothing when the process is not a rank of a launched job,
/// and a failure to write is ignored (the line went to stdout too).
pub fn record_line(line: &str) {
    static RECORD: OnceLock<Option<Mutex<File>>> = OnceLock::new();
    let record = RECORD.get_or_init(|| {
        let rank = crate::env::world_rank()?;
        open_record(&format!("rank-{rank}.out")).map(Mutex::new)
    });
    if let Some(file) = record {
        let mut file = file.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = file.write_all(format!("{line}\n").as_bytes());
    }
}

/// Appends `line` to this rank's error record (`rank-<r>.err`, or `pid-<pid>.err` before the
/// rank is known) in the job's [`RECORDS_VAR`] directory, when the rank runs under a launched
/// job; a failure to write is ignored (the line went to stderr too).
pub fn record_rank_error(rank: Option<i32>, line: &str) {
    let name = rank.map_or_else(|| format!("pid-{}", std::process::id()), |r| format!("rank-{r}"));
    if let Some(mut file) = open_record(&format!("{name}.err")) {
        let _ = writeln!(file, "{line}");
    }
}

fn open_record(name: &str) -> Option<File> {
    let dir = std::env::var_os(RECORDS_VAR)?;
    std::fs::OpenOptions::new().create(true).append(true).open(Path::new(&dir).join(name)).ok()
}

/// A job's directory of rank records ([`RECORDS_VAR`]), removed with the job.
pub(crate) struct RankRecords {
    pub(crate) dir: PathBuf,
}

/// The prefix of every job's records directory, followed by `<driver pid>-<job number>`.
pub(crate) const RECORDS_PREFIX: &str = "ftkv-rank-records-";

impl RankRecords {
    /// Makes the job's directory, empty. A driver that was killed or exited at once (an
    /// interrupt) leaves its directories behind (the launcher removes those of drivers that
    /// are gone before each job); one left under this driver's own pid by an earlier process
    /// is emptied, so a job never reads another job's records.
    pub(crate) fn create() -> Result<RankRecords> {
        static JOBS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = JOBS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{RECORDS_PREFIX}{}-{n}", std::process::id());
        RankRecords::empty_at(std::env::temp_dir().join(name))
    }

    /// The records at `dir`, made empty: whatever an earlier process left there is removed.
    fn empty_at(dir: PathBuf) -> Result<RankRecords> {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(RankRecords { dir })
    }

    /// The recorded files whose names end with `suffix`, sorted, with their names without it.
    fn files(&self, suffix: &str) -> Vec<(String, String)> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
        paths.sort();
        paths
            .iter()
            .filter_map(|path| {
                let name = path.file_name()?.to_str()?.strip_suffix(suffix)?.to_owned();
                Some((name, std::fs::read_to_string(path).ok()?))
            })
            .collect()
    }

    /// Appends to `stderr` the recorded error lines it does not contain, each once and tagged
    /// with the record it came from (`rank-<r>`).
    pub(crate) fn append_missing_errors(&self, stderr: &mut String) {
        let mut missing = Vec::new();
        for (name, text) in self.files(".err") {
            let lines = text.lines().filter(|l| !l.is_empty() && !stderr.contains(*l));
            missing.extend(lines.map(|l| format!("[recorded by {name}] {l}\n")));
        }
        missing.iter().for_each(|line| stderr.push_str(line));
    }

    /// Completes every rank's forwarded stdout lines in `by_rank` with its recorded ones
    /// ([`completed`]).
    pub(crate) fn complete_stdout(&self, by_rank: &mut BTreeMap<usize, Vec<String>>) {
        for (name, text) in self.files(".out") {
            let Some(rank) = name.strip_prefix("rank-").and_then(|r| r.parse().ok()) else {
                continue;
            };
            let recorded = text.lines().map(str::to_owned).collect();
            let printed = by_rank.remove(&rank).unwrap_or_default();
            by_rank.insert(rank, completed(printed, recorded));
        }
    }
}

impl Drop for RankRecords {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A rank's stdout lines: the `recorded` ones in their order, then those it `printed` without
/// recording them (each printed line matches at most one recorded line).
fn completed(printed: Vec<String>, recorded: Vec<String>) -> Vec<String> {
    let mut unmatched: HashMap<&str, usize> = HashMap::new();
    for line in &recorded {
        *unmatched.entry(line.as_str()).or_default() += 1;
    }
    let mut unrecorded = Vec::new();
    for line in printed {
        match unmatched.get_mut(line.as_str()) {
            Some(n) if *n > 0 => *n -= 1,
            _ => unrecorded.push(line),
        }
    }
    recorded.into_iter().chain(unrecorded).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &[&str]) -> Vec<String> {
        text.iter().map(|l| l.to_string()).collect()
    }

    #[test]
    fn recorded_lines_complete_what_the_launcher_lost() {
        let printed = lines(&["pid=7", "write 1"]);
        let recorded = lines(&["pid=7", "write 1", "write 1", "done {}"]);
        assert_eq!(completed(printed, recorded.clone()), recorded);
    }

    #[test]
    fn lines_printed_but_not_recorded_stay() {
        let printed = lines(&["pid=7", "an Open MPI notice", "done {}"]);
        let recorded = lines(&["pid=7", "done {}"]);
        assert_eq!(
            completed(printed, recorded),
            lines(&["pid=7", "done {}", "an Open MPI notice"])
        );
    }

    #[test]
    fn recorded_rank_errors_missing_from_stderr_are_appended_once() {
        let records = RankRecords::create().expect("a directory");
        let dir = records.dir.clone();
        std::fs::write(dir.join("rank-1.err"), "ftkv: rank 1: error: lost\n").unwrap();
        std::fs::write(dir.join("rank-2.err"), "ftkv: rank 2: error: forwarded\n").unwrap();
        let mut stderr = "[1,2]<stderr>: ftkv: rank 2: error: forwarded\n".to_owned();
        records.append_missing_errors(&mut stderr);
        assert_eq!(
            stderr,
            "[1,2]<stderr>: ftkv: rank 2: error: forwarded\n\
             [recorded by rank-1] ftkv: rank 1: error: lost\n"
        );
        drop(records);
        assert!(!dir.exists(), "the directory goes with the job");
    }

    #[test]
    fn a_job_never_reads_records_an_earlier_process_left() {
        let left = std::env::temp_dir().join(format!("{RECORDS_PREFIX}test-left-behind"));
        std::fs::create_dir_all(&left).unwrap();
        std::fs::write(left.join("rank-0.out"), "progress {}\n").unwrap();
        let records = RankRecords::empty_at(left.clone()).expect("a directory");
        let mut by_rank = BTreeMap::new();
        records.complete_stdout(&mut by_rank);
        assert!(by_rank.is_empty(), "an earlier job's lines were read: {by_rank:?}");
    }

    #[test]
    fn recorded_stdout_completes_each_ranks_lines() {
        let records = RankRecords::create().expect("a directory");
        std::fs::write(records.dir.join("rank-1.out"), "pid=9\nresult {}\n").unwrap();
        let mut by_rank = BTreeMap::from([(0, lines(&["pid=8"])), (1, lines(&["pid=9"]))]);
        records.complete_stdout(&mut by_rank);
        assert_eq!(by_rank[&0], lines(&["pid=8"]));
        assert_eq!(by_rank[&1], lines(&["pid=9", "result {}"]));
    }
}
