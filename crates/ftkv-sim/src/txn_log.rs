//! Logs of transaction ids, and their judge: the workload of the transaction simulator and
//! tests (`ftkv_sim::transactions`, `tests/transactions.rs`, `ftkv-mpitest store-txn`). Each
//! transaction appends its id to the log (the value) of every key it locks; what the logs hold
//! afterwards shows whether transactions were atomic and serializable.

use std::collections::{BTreeMap, BTreeSet};

use ftkv::codec;
use ftkv::txn::Reads;
use ftkv::Key;

/// The log a value holds (empty for none).
pub fn log_of(value: &Option<Vec<u8>>) -> Vec<u64> {
    value.as_deref().and_then(codec::decode).unwrap_or_default()
}

/// The update of a transaction `id` that appends `id` to every key it read.
pub fn append(id: u64) -> impl FnOnce(&Reads) -> Vec<(Key, Option<Vec<u8>>)> {
    move |reads: &Reads| {
        let appended = |value: &Option<Vec<u8>>| {
            let mut log = log_of(value);
            log.push(id);
            Some(codec::encode(&log))
        };
        reads.iter().map(|(key, _, value)| (*key, appended(value))).collect()
    }
}

/// Judges final logs: no log repeats an id; every transaction of `planned` (id and the keys it
/// appends to) is in all of its keys' logs or in none; one whose coordinator saw it commit
/// (`ended`: id, committed) is in all, one it saw abort in none; and the logs admit a serial
/// order. Every violation, described.
pub fn judge(
    logs: &BTreeMap<Key, Vec<u64>>,
    planned: &[(u64, Vec<Key>)],
    ended: &[(u64, bool)],
) -> Vec<String> {
    let mut violations = Vec::new();
    for (key, log) in logs {
        let unique: BTreeSet<&u64> = log.iter().collect();
        if unique.len() != log.len() {
            violations.push(format!("key {key}: a transaction applied twice: {log:?}"));
        }
    }
    for (id, keys) in planned {
        let present: Vec<bool> =
            keys.iter().map(|k| logs.get(k).is_some_and(|l| l.contains(id))).collect();
        let (all, none) = (present.iter().all(|&p| p), present.iter().all(|&p| !p));
        if !all && !none {
            violations.push(format!("transaction {id:#x} applied to some keys only ({present:?})"));
        }
        match ended.iter().find(|(i, _)| i == id) {
            Some((_, true)) if !all => {
                violations.push(format!("transaction {id:#x} committed but is missing"))
            }
            Some((_, false)) if !none => {
                violations.push(format!("transaction {id:#x} aborted but was applied"))
            }
            _ => {}
        }
    }
    if let Some(cycle) = order_cycle(logs) {
        violations.push(format!("not serializable: {cycle}"));
    }
    violations
}

/// A cycle in the order the keys' logs (transaction ids, oldest first) impose on transactions,
/// if there is one: the logs are not the result of any serial order.
pub fn order_cycle(logs: &BTreeMap<Key, Vec<u64>>) -> Option<String> {
    let mut after: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for log in logs.values() {
        for pair in log.windows(2) {
            after.entry(pair[0]).or_default().insert(pair[1]);
        }
    }
    let nodes: BTreeSet<u64> = logs.values().flatten().copied().collect();
    let mut indegree: BTreeMap<u64, usize> = nodes.iter().map(|&n| (n, 0)).collect();
    for targets in after.values() {
        for t in targets {
            *indegree.get_mut(t).expect("a node") += 1;
        }
    }
    let mut ready: Vec<u64> = indegree.iter().filter(|(_, &d)| d == 0).map(|(&n, _)| n).collect();
    let mut seen = 0;
    while let Some(n) = ready.pop() {
        seen += 1;
        for t in after.get(&n).into_iter().flatten() {
            let d = indegree.get_mut(t).expect("a node");
            *d -= 1;
            if *d == 0 {
                ready.push(*t);
            }
        }
    }
    (seen < nodes.len()).then(|| format!("{} transactions in a cycle", nodes.len() - seen))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logs(entries: &[(i32, &[u64])]) -> BTreeMap<Key, Vec<u64>> {
        entries.iter().map(|(owner, log)| (Key::new(*owner, 0), log.to_vec())).collect()
    }

    #[test]
    fn the_judge_finds_every_kind_of_violation() {
        let keys = vec![Key::new(0, 0), Key::new(1, 0)];
        let planned = [(1, keys.clone()), (2, keys.clone())];
        let good = logs(&[(0, &[1, 2]), (1, &[1, 2])]);
        assert!(judge(&good, &planned, &[(1, true), (2, true)]).is_empty());
        type Case<'a> = (BTreeMap<Key, Vec<u64>>, &'a [(u64, bool)], &'a str);
        let cases: [Case; 5] = [
            (logs(&[(0, &[1, 2]), (1, &[2, 1])]), &[], "not serializable"),
            (logs(&[(0, &[1, 2]), (1, &[1])]), &[], "some keys only"),
            (logs(&[(0, &[1, 1, 2]), (1, &[1, 2])]), &[], "applied twice"),
            (logs(&[(0, &[1]), (1, &[1])]), &[(2, true)], "committed but is missing"),
            (logs(&[(0, &[1, 2]), (1, &[1, 2])]), &[(2, false)], "aborted but was applied"),
        ];
        for (logs, ended, want) in cases {
            let found = judge(&logs, &planned, ended);
            assert!(found.iter().any(|v| v.contains(want)), "{want}: {found:?}");
        }
    }
}
