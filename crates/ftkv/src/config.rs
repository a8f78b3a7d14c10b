//! The store's configuration: what every rank passes to [`Store::create`](crate::Store::create).

use crate::error::{Error, Result};

/// How the put path learns that a holder died.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detection {
    /// A detector thread keeps MPI progressing and publishes ULFM's failed set in a bitmap that
    /// every put reads (two atomic loads per holder); a watchdog bounds every data-path call.
    Bitmap,
    /// As `Bitmap`, plus the reference paper's two-sided ping to every holder before each put.
    Ping,
}

/// How the survivors repair the store after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Every survivor stops in [`Store::recover`](crate::Store::recover): revoke, shrink, new
    /// windows, every key's newest version copied to its new holders.
    Global,
    /// No revoke, no new windows: a copy that lived on a failed worker moves to the next
    /// reserve holder of its chain ([`crate::engine::layout`]). Each worker's repairer thread copies
    /// the newest surviving version there as soon as the failure is published, whether or not
    /// the worker makes store calls: the owner's thread for its own keys, the first live holder's
    /// for a key whose owner failed too. Ranks whose keys lost no copy only recompute their
    /// routes, and their calls go on meanwhile. The store falls back to [`Recovery::Global`] (an
    /// [`Error::RecoveryNeeded`] on every survivor) when a copy has no live reserve left, a key
    /// lost its owner and every copy, or the survivors hold no quorum across hosts. Collective
    /// calls on the store's communicator ([`Store::sync`](crate::Store::sync),
    /// [`Store::communicator`](crate::Store::communicator)) fail while a failed member is not
    /// yet shrunk away.
    Localized,
}

/// The kind that holds each worker's transaction record ([`Config::with_transactions`]).
pub const TX_RECORD_KIND: &str = "ftkv.tx-record";

/// The collective configuration of a [`Store`](crate::Store); every rank must pass the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Names of the key kinds each worker owns (e.g. `checkpoint`, `loot`).
    pub kinds: Vec<String>,
    /// Holders per key (master + replicas), ≥ 1, at most `ranks − 1`. Copies never live on the
    /// owner.
    pub copies: usize,
    /// Capacity per slot that is expected to be used; memory beyond it is reserved as address
    /// space and becomes resident only when a value grows into it.
    pub initial_capacity: usize,
    /// Largest value a put accepts.
    pub max_value: usize,
    pub detection: Detection,
    /// A data-path MPI call that has not returned after this long ends the process (fail-stop).
    /// On a store whose ranks span hosts the bound is at least [`CROSS_HOST_WATCHDOG`]
    /// ([`Config::effective_watchdog`]). With a heartbeat detector that declares silent ranks
    /// failed, set it above the detector's timeout: a put to a silent holder on another host
    /// waits until the holder is declared, and a shorter watchdog ends the healthy writer.
    pub watchdog: std::time::Duration,
    /// How often the detector thread polls MPI for failures.
    pub poll_interval: std::time::Duration,
    /// A recovery step that has not ended this long after every live member entered it (plus
    /// the time the attempt's bytes take) ends the process (fail-stop): Open MPI's
    /// `MPIX_Comm_shrink` can stay stuck on one member, or on all. A member that has not entered
    /// the step (a survivor that calls [`Store::recover`](crate::Store::recover) late) stops
    /// the bound: the others wait for it, however long.
    pub recovery_watchdog: std::time::Duration,
    /// The suspicion bound: how long a rank may be unresponsive (stopped, starved, cut off)
    /// before the others may declare it failed and go on without it. The declaring is done by
    /// Open MPI's heartbeat detector, which `ftkv_mpi::Mpi::init` switches on with a 10 s
    /// timeout unless the environment configures it (`mpi_ft_detector_timeout`; ftkv's
    /// launcher sets it to the bound it is given); a program that initialises MPI itself
    /// passes the same MCA parameters to `mpirun`. It must equal the detector's timeout, which
    /// is what [`Config::new`] takes ([`suspicion_from_environment`]). The store's part is the other side: a process whose
    /// detector thread finds that it itself did not run for more than half the bound (it was
    /// SIGSTOPped, or its host froze) ends itself as a fail-stop failure with a message saying
    /// so, instead of rejoining a computation that has gone on without it.
    pub suspicion: std::time::Duration,
    /// Whether the survivors make a process they declared failed dead (see
    /// [`suspicion`](Config::suspicion)): a stopped or frozen rank is not dead, and the job's
    /// launcher waits for every process it started, so without this a job whose survivors
    /// finished would wait until the frozen rank runs again and ends itself. Its host mates
    /// SIGKILL it by pid (also one the store's own heartbeat among the members that share keys
    /// found silent); with [`Config::end_through_runtime`] a rank on another host that was
    /// silent before it was declared, and whose host still answers, is ended by its heartbeat
    /// peers through the runtime (PMIx job control through that host's daemon). On by default
    /// (and with it the heartbeat); off where [`END_DECLARED_VAR`] is `0`.
    pub end_declared: bool,
    /// Whether a silent worker on another host is ended through the runtime (PMIx job control)
    /// as well, when its host still completes a TCP connection to the worker's listener (its
    /// kernel runs and is reachable: the worker is frozen, and the host's daemon can end it).
    /// A host that does not answer is cut off or down: nothing is asked for it, since a request
    /// for a rank behind a cut link left PRRTE 3.0.14 and every survivor stuck. On by default;
    /// off where [`END_THROUGH_RUNTIME_VAR`] is `0`.
    pub end_through_runtime: bool,
    /// How failures are repaired.
    pub recovery: Recovery,
    /// Reserve holders per copy: each reserves a slot (address space) for the copy, so
    /// [`Recovery::Localized`] can move the copy there when its holder fails. A window reserves
    /// `1 + spares` times the slots it would without.
    pub spares: usize,
}

/// The shortest watchdog on a store whose ranks span hosts: a dead holder there is reported by
/// its TCP connection, not by a stall, and on a loaded machine a healthy cross-host put of a
/// large value took longer than 2 s (a failure-free CI run lost two writers to the 2 s default).
pub const CROSS_HOST_WATCHDOG: std::time::Duration = std::time::Duration::from_secs(8);

/// The suspicion bound when the environment does not configure Open MPI's heartbeat detector:
/// the timeout `ftkv_mpi::Mpi::init` then gives the detector.
pub const DEFAULT_SUSPICION: std::time::Duration = std::time::Duration::from_secs(10);

/// The environment variable through which Open MPI reads its heartbeat detector's timeout in
/// seconds (`mpirun --mca mpi_ft_detector_timeout S` sets it in every rank).
pub const DETECTOR_TIMEOUT_VAR: &str = "OMPI_MCA_mpi_ft_detector_timeout";

/// The suspicion bound this process's ranks run with: Open MPI's heartbeat detector timeout as
/// the environment sets it ([`DETECTOR_TIMEOUT_VAR`], a positive number of seconds), else
/// [`DEFAULT_SUSPICION`]. A store whose bound differed from the detector's would end a rank
/// for a gap the detector forgives, or let one the detector declared failed go on.
pub fn suspicion_from_environment() -> std::time::Duration {
    suspicion_from(std::env::var(DETECTOR_TIMEOUT_VAR).ok().as_deref())
}

/// The suspicion bound for a detector timeout given as `seconds`: [`DEFAULT_SUSPICION`] when
/// absent, unreadable, zero or negative.
fn suspicion_from(seconds: Option<&str>) -> std::time::Duration {
    seconds
        .and_then(|seconds| seconds.trim().parse::<f64>().ok())
        .and_then(|seconds| std::time::Duration::try_from_secs_f64(seconds).ok())
        .filter(|bound| !bound.is_zero())
        .unwrap_or(DEFAULT_SUSPICION)
}

/// The environment variable that switches [`Config::end_declared`] off when `0`.
pub const END_DECLARED_VAR: &str = "FTKV_END_DECLARED";

/// [`Config::end_declared`] as the environment sets it: on unless [`END_DECLARED_VAR`] is `0`.
pub fn end_declared_from_environment() -> bool {
    std::env::var(END_DECLARED_VAR).map_or(true, |v| v.trim() != "0")
}

/// The environment variable that switches [`Config::end_through_runtime`] off when `0`.
pub const END_THROUGH_RUNTIME_VAR: &str = "FTKV_END_THROUGH_RUNTIME";

/// [`Config::end_through_runtime`] as the environment sets it: on unless
/// [`END_THROUGH_RUNTIME_VAR`] is `0`.
pub fn end_through_runtime_from_environment() -> bool {
    std::env::var(END_THROUGH_RUNTIME_VAR).map_or(true, |v| v.trim() != "0")
}

/// How much longer than the suspicion bound the watchdog waits across hosts: a put to a silent
/// holder on another host waits until the heartbeat detector declares it, and the declaration
/// then takes a poll of the failed set to reach the put.
pub const SUSPICION_MARGIN: std::time::Duration = std::time::Duration::from_secs(2);

impl Config {
    /// The watchdog bound for ranks on `hosts` (one host id per live worker): the configured
    /// one; when the ranks span more than one host, at least [`CROSS_HOST_WATCHDOG`] and the
    /// suspicion bound plus [`SUSPICION_MARGIN`]: a put to a silent (stopped, frozen) holder on
    /// another host waits until the heartbeat detector declares it, and a shorter watchdog
    /// would end the healthy writer first.
    pub fn effective_watchdog(&self, hosts: &[u32]) -> std::time::Duration {
        let spans_hosts = hosts.iter().any(|h| Some(h) != hosts.first());
        if spans_hosts {
            self.watchdog.max(CROSS_HOST_WATCHDOG).max(self.suspicion + SUSPICION_MARGIN)
        } else {
            self.watchdog
        }
    }

    /// A configuration with the given kinds and copies, 64 KiB initial and 64 MiB maximum
    /// value size, bitmap detection, 2 s watchdog, 1 ms polling, a 10 s recovery watchdog, the
    /// environment's suspicion bound ([`suspicion_from_environment`], 10 s when unset), the
    /// ending of declared processes on ([`end_declared_from_environment`]) and global recovery
    /// (no reserve holders).
    pub fn new<S: Into<String>>(kinds: impl IntoIterator<Item = S>, copies: usize) -> Config {
        Config {
            kinds: kinds.into_iter().map(Into::into).collect(),
            copies,
            initial_capacity: 64 << 10,
            max_value: 64 << 20,
            detection: Detection::Bitmap,
            watchdog: std::time::Duration::from_secs(2),
            poll_interval: std::time::Duration::from_millis(1),
            recovery_watchdog: std::time::Duration::from_secs(10),
            suspicion: suspicion_from_environment(),
            end_declared: end_declared_from_environment(),
            end_through_runtime: end_through_runtime_from_environment(),
            recovery: Recovery::Global,
            spares: 0,
        }
    }

    /// The layout's shape: kinds, copies and reserve holders.
    pub fn shape(&self) -> crate::engine::layout::Shape {
        crate::engine::layout::Shape {
            kinds: self.kinds.len(),
            copies: self.copies,
            spares: self.spares,
        }
    }

    /// This configuration with one more kind, [`TX_RECORD_KIND`], which holds each worker's
    /// transaction record: needed by [`Store::transaction`](crate::Store::transaction). A record
    /// carries the values its transaction writes, so their sum must fit `max_value`.
    pub fn with_transactions(mut self) -> Config {
        if !self.kinds.iter().any(|k| k == TX_RECORD_KIND) {
            self.kinds.push(TX_RECORD_KIND.to_owned());
        }
        self
    }

    /// This configuration with [`Recovery::Localized`] and one reserve holder per copy.
    pub fn localized(self) -> Config {
        Config { recovery: Recovery::Localized, spares: self.spares.max(1), ..self }
    }

    /// Checks the configuration on its own and against the number of ranks.
    pub fn validate(&self, ranks: usize) -> Result<()> {
        let invalid = |why: String| Err(Error::InvalidConfig(why));
        if self.kinds.is_empty() || self.kinds.len() > u16::MAX as usize {
            return invalid(format!("needs 1..=65535 kinds, got {}", self.kinds.len()));
        }
        if self.copies == 0 || self.copies >= ranks.max(1) {
            return invalid(format!(
                "copies must be in 1..{ranks} (never on the owner), got {}",
                self.copies
            ));
        }
        if self.initial_capacity > self.max_value {
            return invalid(format!(
                "initial capacity {} exceeds the maximum value size {}",
                self.initial_capacity, self.max_value
            ));
        }
        if self.watchdog.is_zero()
            || self.poll_interval.is_zero()
            || self.recovery_watchdog.is_zero()
            || self.suspicion.is_zero()
        {
            return invalid("watchdogs, poll interval and suspicion bound must be positive".into());
        }
        if self.suspicion <= self.poll_interval * 10 {
            return invalid(format!(
                "the suspicion bound {:?} must exceed ten poll intervals ({:?})",
                self.suspicion, self.poll_interval
            ));
        }
        if self.recovery == Recovery::Localized && self.spares == 0 {
            return invalid("localized recovery needs at least one reserve holder (spares)".into());
        }
        Ok(())
    }

    /// A canonical byte encoding, compared across ranks at creation.
    pub(crate) fn fingerprint(&self) -> u64 {
        let text = format!(
            "{:?}|{}|{}|{}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{}",
            self.kinds,
            self.copies,
            self.initial_capacity,
            self.max_value,
            self.detection,
            self.watchdog,
            self.poll_interval,
            self.recovery_watchdog,
            self.suspicion,
            self.recovery,
            self.spares
        );
        crate::slot::xxh3_64(text.as_bytes())
    }

    /// The index of the kind called `name`.
    pub fn kind(&self, name: &str) -> Result<u16> {
        let index = self.kinds.iter().position(|k| k == name);
        index.map(|i| i as u16).ok_or_else(|| Error::UnknownKind(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn configurations_are_checked_before_any_collective() {
        let base = || Config::new(["checkpoint"], 2);
        let with = |change: fn(&mut Config)| {
            let mut config = base();
            change(&mut config);
            config
        };
        let table: Vec<(&str, Config, usize, bool)> = vec![
            ("the defaults on 3 ranks", base(), 3, true),
            ("copies as many as the ranks", base(), 2, false),
            ("no kinds", with(|c| c.kinds.clear()), 3, false),
            ("initial above the maximum", with(|c| c.initial_capacity = c.max_value + 1), 3, false),
            ("no watchdog", with(|c| c.watchdog = Duration::ZERO), 3, false),
            ("no suspicion bound", with(|c| c.suspicion = Duration::ZERO), 3, false),
            ("a bound of ten polls", with(|c| c.suspicion = c.poll_interval * 10), 3, false),
            ("a bound of eleven polls", with(|c| c.suspicion = c.poll_interval * 11), 3, true),
            ("localized recovery", base().localized(), 3, true),
            ("localized without reserves", with(|c| c.recovery = Recovery::Localized), 3, false),
        ];
        for (case, config, ranks, valid) in table {
            assert_eq!(config.validate(ranks).is_ok(), valid, "{case}");
        }
        assert_ne!(base().fingerprint(), with(|c| c.suspicion *= 2).fingerprint());
        assert_ne!(base().fingerprint(), base().localized().fingerprint());
    }

    #[test]
    fn the_suspicion_bound_is_open_mpis_detector_timeout() {
        assert_eq!(suspicion_from(Some("30")), Duration::from_secs(30));
        assert_eq!(suspicion_from(Some(" 2.5 ")), Duration::from_millis(2500));
        for unusable in [None, Some(""), Some("ten"), Some("0"), Some("-3")] {
            assert_eq!(suspicion_from(unusable), DEFAULT_SUSPICION, "{unusable:?}");
        }
    }

    #[test]
    fn across_hosts_the_watchdog_outlasts_the_floor_and_the_suspicion_bound() {
        let config = Config::new(["checkpoint"], 2);
        let past_suspicion = config.suspicion + SUSPICION_MARGIN;
        assert_eq!(config.effective_watchdog(&[0, 0, 0]), config.watchdog);
        assert_eq!(config.effective_watchdog(&[0, 1, 0]), past_suspicion);
        let short = Config { suspicion: Duration::from_secs(1), ..config.clone() };
        assert_eq!(short.effective_watchdog(&[0, 1]), CROSS_HOST_WATCHDOG);
        let long = Config { watchdog: past_suspicion * 2, ..config };
        assert_eq!(long.effective_watchdog(&[0, 1]), past_suspicion * 2);
    }
}
