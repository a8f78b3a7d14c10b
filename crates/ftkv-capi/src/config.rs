//! `ftkv_config`: every setting of a store, for `ftkv_store_open`.

use std::ffi::{c_char, c_int};
use std::time::Duration;

use ftkv::{Config, Detection, Recovery};

use crate::{invalid, Failure};

/// How the survivors repair the store after a failure (a field of [`ftkv_config`]).
pub type ftkv_recovery = u32;
/// Every survivor stops in `ftkv_recover`: shrink, new windows, every key copied.
pub const FTKV_RECOVERY_GLOBAL: ftkv_recovery = 0;
/// Copies that lived on a failed worker move to reserve holders in the background while the
/// survivors keep writing; the store falls back to global recovery (`FTKV_RECOVERY_NEEDED`)
/// when a key lost every copy or a copy has no live reserve left.
pub const FTKV_RECOVERY_LOCALIZED: ftkv_recovery = 1;

/// How a put learns of failed holders (a field of [`ftkv_config`]).
pub type ftkv_detection = u32;
/// A detector thread publishes the failed set; a watchdog bounds every data-path call.
pub const FTKV_DETECTION_BITMAP: ftkv_detection = 0;
/// As `FTKV_DETECTION_BITMAP`, plus a two-sided ping to every holder before each put.
pub const FTKV_DETECTION_PING: ftkv_detection = 1;

/// Every setting of a store. Start from `ftkv_config_default` and change fields; every rank
/// must pass the same settings to `ftkv_store_open`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ftkv_config {
    /// The names of the key kinds each worker owns (`n_kinds` NUL-terminated strings); a
    /// key is (owner, index into this array).
    pub kinds: *const *const c_char,
    pub n_kinds: usize,
    /// Holders per key, at least 1 and below the number of ranks; never the owner.
    pub copies: usize,
    /// Bytes per copy expected to be used; larger values up to `max_value` make more memory
    /// resident as they grow into it.
    pub initial_size: usize,
    /// The largest value a put accepts.
    pub max_value: usize,
    /// `FTKV_RECOVERY_GLOBAL` or `FTKV_RECOVERY_LOCALIZED`.
    pub recovery: ftkv_recovery,
    /// Reserve holders per copy (localized recovery needs at least 1): each reserves address
    /// space for a copy that moves there when its holder fails.
    pub reserve_holders: usize,
    /// `FTKV_DETECTION_BITMAP` or `FTKV_DETECTION_PING`.
    pub detection: ftkv_detection,
    /// A data-path MPI call that has not returned after this long ends the process
    /// (fail-stop); across hosts it is at least 8 s and the suspicion bound plus 2 s.
    pub watchdog_ms: u64,
    /// A recovery step that has not ended this long after every live member entered it ends
    /// the process (fail-stop).
    pub recovery_watchdog_ms: u64,
    /// How long a rank may be unresponsive before the others declare it failed: it must equal
    /// Open MPI's heartbeat detector timeout (`mpi_ft_detector_timeout`), which the default
    /// reads from the environment.
    pub suspicion_ms: u64,
    /// Nonzero: the store runs transactions (`ftkv_transaction`; needs localized recovery).
    /// It adds a kind of its own after the program's kinds for each worker's record.
    pub transactions: c_int,
}

/// The defaults for these kinds and copies: global recovery without reserve holders, 64 KiB
/// initial and 64 MiB maximum value size, bitmap detection, a 2 s watchdog, a 10 s recovery
/// watchdog, the suspicion bound of the environment's heartbeat detector timeout (10 s when
/// unset), no transactions. `kinds` is referenced, not copied: it must stay valid until
/// `ftkv_store_open` returns. Never fails.
#[no_mangle]
pub extern "C" fn ftkv_config_default(
    kinds: *const *const c_char,
    n_kinds: usize,
    copies: usize,
) -> ftkv_config {
    let defaults = Config::new(Vec::<String>::new(), copies);
    ftkv_config {
        kinds,
        n_kinds,
        copies,
        initial_size: defaults.initial_capacity,
        max_value: defaults.max_value,
        recovery: FTKV_RECOVERY_GLOBAL,
        reserve_holders: defaults.spares,
        detection: FTKV_DETECTION_BITMAP,
        watchdog_ms: millis(defaults.watchdog),
        recovery_watchdog_ms: millis(defaults.recovery_watchdog),
        suspicion_ms: millis(defaults.suspicion),
        transactions: 0,
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl ftkv_config {
    /// The store's configuration with the kind names `names` (read from `kinds` by the
    /// caller). Unknown enumeration values are refused here; the store checks the rest
    /// (`Config::validate`) on every rank at creation.
    pub(crate) fn to_config(self, names: Vec<String>) -> Result<Config, Failure> {
        let recovery = match self.recovery {
            FTKV_RECOVERY_GLOBAL => Recovery::Global,
            FTKV_RECOVERY_LOCALIZED => Recovery::Localized,
            other => return Err(invalid(&format!("unknown recovery mode {other}"))),
        };
        let detection = match self.detection {
            FTKV_DETECTION_BITMAP => Detection::Bitmap,
            FTKV_DETECTION_PING => Detection::Ping,
            other => return Err(invalid(&format!("unknown detection mode {other}"))),
        };
        let mut config = Config::new(names, self.copies);
        config.initial_capacity = self.initial_size;
        config.max_value = self.max_value;
        config.recovery = recovery;
        config.spares = self.reserve_holders;
        config.detection = detection;
        config.watchdog = Duration::from_millis(self.watchdog_ms);
        config.recovery_watchdog = Duration::from_millis(self.recovery_watchdog_ms);
        config.suspicion = Duration::from_millis(self.suspicion_ms);
        Ok(if self.transactions != 0 { config.with_transactions() } else { config })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_configuration_is_the_stores_default() {
        let c = ftkv_config_default(std::ptr::null(), 0, 2);
        let config = c.to_config(vec!["checkpoint".into()]).unwrap();
        let defaults = Config::new(["checkpoint"], 2);
        assert_eq!(format!("{config:?}"), format!("{defaults:?}"));
    }

    #[test]
    fn localized_recovery_with_transactions_adds_the_record_kind() {
        let mut c = ftkv_config_default(std::ptr::null(), 0, 2);
        c.recovery = FTKV_RECOVERY_LOCALIZED;
        c.reserve_holders = 1;
        c.transactions = 1;
        let config = c.to_config(vec!["account".into()]).unwrap();
        assert_eq!(config.recovery, Recovery::Localized);
        assert_eq!(config.kinds, ["account", ftkv::TX_RECORD_KIND]);
        config.validate(4).unwrap();
    }

    #[test]
    fn an_unknown_mode_is_refused() {
        let mut c = ftkv_config_default(std::ptr::null(), 0, 2);
        c.recovery = 7;
        assert!(c.to_config(vec!["a".into()]).is_err());
    }
}
