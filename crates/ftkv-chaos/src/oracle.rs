//! The verdict on one read of one key at the end of a chaos run: a pure function of the key's
//! write history, whether its owner survived, whether a recovery reported the key lost, and
//! what the survivor read.
//!
//! A live owner whose key lost every copy writes it again (its last acknowledged write, or a
//! delete when it had none): the rewrite is part of its history, so the read it restores is
//! judged like any other. Only a dead owner's key may stay lost, and only when a recovery
//! reported it lost; whether the failures of the run allowed that loss at all is judged per run
//! ([`may_lose_keys`]).

use ftkv_sim::history::{allowed, Observed, Op};

/// Whether a key's owner finished the run among the survivors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    Live,
    Dead,
}

/// What one read of one key shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyVerdict {
    /// The last acknowledged write, one tried after it, or absence where the history allows it.
    Allowed,
    /// A dead owner's key that a recovery reported lost.
    ReportedLost,
    /// A value older than the last acknowledged write: silently lost data.
    LostWrite,
    /// A value that is no write's.
    Torn,
    /// The key read as lost although no recovery reported it, or a live owner's key still lost
    /// at the end (its owner writes it again after the report).
    UnaccountedLoss,
}

impl KeyVerdict {
    /// Whether the verdict shows a defect of the store (a reported loss is not one by itself).
    pub fn is_violation(self) -> bool {
        !matches!(self, KeyVerdict::Allowed | KeyVerdict::ReportedLost)
    }
}

/// Judges `observed`, a survivor's final read of a key with write history `ops`, owned by a
/// `owner` that lived or died, which some recovery reported lost or not.
pub fn judge_key(ops: &[Op], owner: Owner, reported_lost: bool, observed: Observed) -> KeyVerdict {
    match observed {
        Observed::Torn => KeyVerdict::Torn,
        Observed::Lost if owner == Owner::Dead && reported_lost => KeyVerdict::ReportedLost,
        Observed::Lost => KeyVerdict::UnaccountedLoss,
        read if allowed(ops, read) => KeyVerdict::Allowed,
        _ => KeyVerdict::LostWrite,
    }
}

/// Whether a run may lose keys at all: only when one recovery saw at least `copies` workers
/// failed, and never when the only failure injected was one host's ranks (`host_kill_only`):
/// placement spreads every key's copies over the hosts, so one host's loss leaves each key a
/// copy once there are two hosts and two copies.
pub fn may_lose_keys(copies: usize, widest_recovery: usize, host_kill_only: bool) -> bool {
    !host_kill_only && widest_recovery >= copies
}

#[cfg(test)]
mod tests {
    use super::*;
    use KeyVerdict::*;
    use Owner::*;

    fn op(seq: u32, delete: bool, acked: bool) -> Op {
        Op { seq, delete, acked }
    }

    /// Case, history, owner, reported lost, read, verdict.
    type KeyCase<'a> = (&'a str, &'a [Op], Owner, bool, Observed, KeyVerdict);

    #[test]
    fn key_verdict_table() {
        let acked = [op(1, false, true), op(2, false, true), op(3, false, false)];
        let rewritten = [op(1, false, true), op(2, false, false), op(1, false, true)];
        let never_acked_deleted = [op(4, false, false), op(0, true, true)];
        let table: Vec<KeyCase> = vec![
            ("last acked", &acked, Live, false, Observed::Seq(2), Allowed),
            ("in flight", &acked, Dead, false, Observed::Seq(3), Allowed),
            ("older than acked", &acked, Live, false, Observed::Seq(1), LostWrite),
            ("absent after a put", &acked, Dead, false, Observed::Absent, LostWrite),
            ("torn", &acked, Live, false, Observed::Torn, Torn),
            ("torn and reported", &acked, Dead, true, Observed::Torn, Torn),
            ("dead owner, reported", &acked, Dead, true, Observed::Lost, ReportedLost),
            ("dead owner, unreported", &acked, Dead, false, Observed::Lost, UnaccountedLoss),
            ("live owner still lost", &acked, Live, true, Observed::Lost, UnaccountedLoss),
            ("live owner rewrote", &rewritten, Live, true, Observed::Seq(1), Allowed),
            ("rewrite then in flight", &rewritten, Live, true, Observed::Seq(2), LostWrite),
            ("rewrite of nothing", &never_acked_deleted, Live, true, Observed::Absent, Allowed),
            (
                "old put after rewrite",
                &never_acked_deleted,
                Live,
                true,
                Observed::Seq(4),
                LostWrite,
            ),
            ("dead owner's rewrite", &rewritten, Dead, true, Observed::Seq(1), Allowed),
        ];
        for (case, ops, owner, reported, observed, want) in table {
            assert_eq!(judge_key(ops, owner, reported, observed), want, "{case}");
        }
    }

    #[test]
    fn only_reported_losses_are_not_violations() {
        assert!(!Allowed.is_violation() && !ReportedLost.is_violation());
        assert!(LostWrite.is_violation() && Torn.is_violation() && UnaccountedLoss.is_violation());
    }

    #[test]
    fn losses_need_as_many_failures_as_copies_and_more_than_one_host() {
        let table = [
            (2, 1, false, false),
            (2, 2, false, true),
            (3, 2, false, false),
            (2, 3, true, false),
            (1, 1, true, false),
            (1, 1, false, true),
        ];
        for (copies, widest, host_only, want) in table {
            assert_eq!(may_lose_keys(copies, widest, host_only), want, "{copies} {widest}");
        }
    }
}
