//! The command line's values, checked before any job starts: clap value parsers for counts and
//! seconds, error messages that name the values in effect (defaults included), and the checks
//! every subcommand that launches ranks makes first (the rank limit, the working directory).

use std::ffi::OsString;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use crate::env;

/// The shortest time a seconds-valued option accepts: one millisecond, the resolution in which
/// the ranks receive their run time.
pub const MIN_SECONDS: f64 = 0.001;

/// The longest: one day. Anything longer is a typo, and infinite or huge values would make
/// `Duration::from_secs_f64` panic.
pub const MAX_SECONDS: f64 = 86_400.0;

/// Ranks per core a job may have unless `FTKV_MAX_RANKS` says otherwise: room for the
/// oversubscription the tests and benchmarks use (`bench growth` runs 16 ranks on 2 cores), none
/// for a mistyped `-n 1000`.
pub const RANKS_PER_CORE: usize = 8;

/// Clap value parser for seconds: a number from [`MIN_SECONDS`] to [`MAX_SECONDS`] (`inf`,
/// `nan` and negative values are refused).
pub fn seconds(text: &str) -> Result<Duration, String> {
    let refuse =
        || format!("must be a number of seconds from {MIN_SECONDS} to {MAX_SECONDS} (one day)");
    let value: f64 = text.trim().parse().map_err(|_| refuse())?;
    if !(MIN_SECONDS..=MAX_SECONDS).contains(&value) {
        return Err(refuse());
    }
    Ok(Duration::from_secs_f64(value))
}

/// Clap value parser for a whole number of at least `min`. The argument also needs
/// `allow_negative_numbers = true`: without it clap takes `-3` for an unknown option and the
/// user never sees this parser's message.
pub fn at_least<T>(min: T) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: FromStr + PartialOrd + fmt::Display + Copy + Send + Sync + 'static,
{
    move |text: &str| match text.trim().parse::<T>() {
        Ok(value) if value >= min => Ok(value),
        _ => Err(format!("must be a whole number ≥ {min}")),
    }
}

/// An option's value as an error message names it: `--copies 3 (the default)` when it equals
/// the default, because the user may not know which value was in effect.
#[derive(Debug, Clone, Copy)]
pub struct Opt {
    pub flag: &'static str,
    pub value: usize,
    pub default: Option<usize>,
}

impl Opt {
    /// A value whose default is unknown here (a library caller's).
    pub fn new(flag: &'static str, value: usize) -> Opt {
        Opt { flag, value, default: None }
    }

    /// A value from the command line, where `default` applies when the option is absent.
    pub fn with_default(flag: &'static str, value: usize, default: usize) -> Opt {
        Opt { flag, value, default: Some(default) }
    }
}

impl fmt::Display for Opt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.flag, self.value)?;
        if self.default == Some(self.value) {
            write!(f, " (the default)")?;
        }
        Ok(())
    }
}

/// The store keeps every key's copies on ranks other than its owner, so a job needs more ranks
/// than copies.
pub fn check_copies(copies: Opt, ranks: Opt) -> Result<()> {
    ensure!(copies.value >= 1, "{copies} must be at least 1");
    ensure!(
        copies.value < ranks.value,
        "{copies} must be less than {ranks}: the copies live on ranks other than the key's owner"
    );
    Ok(())
}

/// A job that SIGKILLs `kills` ranks must keep at least two alive, or nobody is left to
/// recover with.
pub fn check_kills(kills: Opt, ranks: Opt) -> Result<()> {
    ensure!(kills.value + 2 <= ranks.value, "{kills} must leave at least 2 of {ranks} alive");
    Ok(())
}

/// `what` needs at least `min` ranks.
pub fn check_min_ranks(ranks: Opt, min: usize, what: &str) -> Result<()> {
    ensure!(ranks.value >= min, "{ranks} is too few: {what} needs at least {min} ranks");
    Ok(())
}

/// The checks of a subcommand that launches jobs, made before the first launch: the current
/// directory still exists, and no job has more ranks than [`rank_limit`] allows. A process
/// that runs as a rank skips them: it launches nothing, and `mpirun`'s binding can hide cores
/// from it.
pub fn check_before_launch(ranks: &[Opt]) -> Result<()> {
    if env::running_under_mpirun() {
        return Ok(());
    }
    check_working_dir()?;
    ranks.iter().try_for_each(|&r| check_rank_limit(r))
}

/// `mpirun` starts every rank in the current directory; started from one that was deleted,
/// the ranks never run and a job reports only missing results.
fn check_working_dir() -> Result<()> {
    let gone = "the current directory no longer exists (deleted?); cd to one that does";
    let dir = std::env::current_dir().context(gone)?;
    ensure!(dir.exists(), "{gone}: {}", dir.display());
    Ok(())
}

/// Refuses a job of more ranks than [`rank_limit`], naming the limit and its override.
pub fn check_rank_limit(ranks: Opt) -> Result<()> {
    let limit = rank_limit()?;
    ensure!(
        ranks.value <= limit.ranks,
        "{ranks} exceeds the limit of {limit}; set FTKV_MAX_RANKS={} to allow it",
        ranks.value
    );
    Ok(())
}

/// The most ranks a job may have, and where that number comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankLimit {
    pub ranks: usize,
    /// The cores it was derived from; `None`: set by `FTKV_MAX_RANKS`.
    pub cores: Option<usize>,
}

impl fmt::Display for RankLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cores {
            Some(cores) => {
                write!(f, "{} ranks ({RANKS_PER_CORE} per core, {cores} cores)", self.ranks)
            }
            None => write!(f, "{} ranks (FTKV_MAX_RANKS)", self.ranks),
        }
    }
}

/// `FTKV_MAX_RANKS`, or [`RANKS_PER_CORE`] times the cores this process may run on.
pub fn rank_limit() -> Result<RankLimit> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    rank_limit_from(env::max_ranks(), cores)
}

fn rank_limit_from(variable: Option<OsString>, cores: usize) -> Result<RankLimit> {
    let Some(value) = variable else {
        return Ok(RankLimit { ranks: RANKS_PER_CORE * cores, cores: Some(cores) });
    };
    let ranks = value.to_str().and_then(|text| at_least(1)(text).ok());
    let ranks = ranks
        .with_context(|| format!("FTKV_MAX_RANKS must be a whole number ≥ 1, got {value:?}"))?;
    Ok(RankLimit { ranks, cores: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_accepts_positive_finite_values_up_to_a_day() {
        assert_eq!(seconds("120"), Ok(Duration::from_secs(120)));
        assert_eq!(seconds("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(seconds(" 2 "), Ok(Duration::from_secs(2)));
        assert_eq!(seconds("0.001"), Ok(Duration::from_millis(1)));
        assert_eq!(seconds("86400"), Ok(Duration::from_secs(86_400)));
    }

    #[test]
    fn seconds_refuses_what_is_not_a_sane_duration() {
        for text in ["inf", "-inf", "nan", "NaN", "0", "-1", "0.0001", "86401", "1e300", "", "2s"] {
            let error = seconds(text).expect_err(text);
            assert!(error.contains("from 0.001 to 86400"), "{text}: {error}");
        }
    }

    #[test]
    fn at_least_takes_whole_numbers_from_its_minimum() {
        assert_eq!(at_least(1usize)("1"), Ok(1));
        assert_eq!(at_least(0usize)("0"), Ok(0));
        assert_eq!(at_least(1u64)("18446744073709551615"), Ok(u64::MAX));
        for text in ["0", "-3", "1.5", "x", ""] {
            assert_eq!(at_least(1usize)(text), Err("must be a whole number ≥ 1".into()), "{text}");
        }
        assert_eq!(at_least(0usize)("-1"), Err("must be a whole number ≥ 0".into()));
    }

    #[test]
    fn opt_marks_the_default_value() {
        assert_eq!(Opt::with_default("--copies", 3, 3).to_string(), "--copies 3 (the default)");
        assert_eq!(Opt::with_default("--copies", 2, 3).to_string(), "--copies 2");
        assert_eq!(Opt::new("--copies", 3).to_string(), "--copies 3");
    }

    #[test]
    fn copies_must_be_fewer_than_ranks() {
        let ranks = Opt::new("--ranks", 2);
        check_copies(Opt::new("--copies", 1), ranks).unwrap();
        let error = check_copies(Opt::with_default("--copies", 3, 3), ranks).unwrap_err();
        assert!(
            error.to_string().starts_with("--copies 3 (the default) must be less than --ranks 2"),
            "{error}"
        );
        let error = check_copies(Opt::new("--copies", 0), ranks).unwrap_err();
        assert_eq!(error.to_string(), "--copies 0 must be at least 1");
    }

    #[test]
    fn kills_must_leave_two_survivors() {
        check_kills(Opt::new("--kills", 2), Opt::new("--ranks", 4)).unwrap();
        let error = check_kills(Opt::new("--kills", 3), Opt::with_default("--ranks", 4, 4));
        assert_eq!(
            error.unwrap_err().to_string(),
            "--kills 3 must leave at least 2 of --ranks 4 (the default) alive"
        );
    }

    #[test]
    fn min_ranks_names_what_needs_them() {
        check_min_ranks(Opt::new("--ranks", 2), 2, "ping").unwrap();
        let error = check_min_ranks(Opt::new("--ranks", 1), 2, "ping").unwrap_err();
        assert_eq!(error.to_string(), "--ranks 1 is too few: ping needs at least 2 ranks");
    }

    #[test]
    fn rank_limit_is_eight_per_core_unless_overridden() {
        assert_eq!(rank_limit_from(None, 2).unwrap(), RankLimit { ranks: 16, cores: Some(2) });
        let set = rank_limit_from(Some("1000".into()), 2).unwrap();
        assert_eq!(set, RankLimit { ranks: 1000, cores: None });
        assert_eq!(set.to_string(), "1000 ranks (FTKV_MAX_RANKS)");
        assert_eq!(rank_limit_from(None, 2).unwrap().to_string(), "16 ranks (8 per core, 2 cores)");
        for bad in ["0", "-1", "many", ""] {
            let error = rank_limit_from(Some(bad.into()), 2).unwrap_err().to_string();
            assert!(error.starts_with("FTKV_MAX_RANKS must be a whole number ≥ 1"), "{error}");
        }
    }

    #[test]
    fn the_limit_refuses_only_larger_jobs() {
        let limit = rank_limit().unwrap().ranks;
        check_rank_limit(Opt::new("--ranks", limit)).unwrap();
        let error = check_rank_limit(Opt::new("--ranks", limit + 1)).unwrap_err().to_string();
        assert!(
            error.contains(&format!("set FTKV_MAX_RANKS={} to allow it", limit + 1)),
            "{error}"
        );
    }
}
