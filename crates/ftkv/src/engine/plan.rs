//! Recovery planning: which surviving copy of each key is the newest, and who sends it where.
//! Without I/O: the store gathers the records over its fabric and passes them in.

use std::collections::HashMap;

use crate::engine::layout::Layout;
use crate::key::Key;

/// A surviving copy: key, version, and the rank (in the shrunk communicator) that holds it; or,
/// with `source` [`OWNER_MARK`], a live owner's statement that it wrote the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    pub key: Key,
    pub version: u64,
    pub source: i32,
}

/// `source` of a record that marks a key as written by its live owner (not a copy).
pub const OWNER_MARK: i32 = -1;

/// What one rank does in a recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Keys whose newest version this rank sends to all the key's new holders.
    pub sends: Vec<Key>,
    /// Keys with a surviving version.
    pub recovered: usize,
    /// Keys without any surviving copy.
    pub lost_candidates: Vec<Key>,
    /// Keys their live owners say they wrote.
    pub marked: Vec<Key>,
}

/// For every key the newest surviving version wins; of the ranks holding it the lowest sends.
pub fn plan(records: &[Record], layout: &Layout, me: i32) -> Plan {
    let mut best: HashMap<Key, (u64, i32)> = HashMap::new();
    let mut marked: Vec<Key> =
        records.iter().filter(|r| r.source == OWNER_MARK).map(|r| r.key).collect();
    marked.sort_unstable();
    for r in records.iter().filter(|r| r.source != OWNER_MARK) {
        let entry = best.entry(r.key).or_insert((r.version, r.source));
        if (r.version, -r.source) > (entry.0, -entry.1) {
            *entry = (r.version, r.source);
        }
    }
    let mut sends: Vec<Key> = best.iter().filter(|(_, (_, s))| *s == me).map(|(k, _)| *k).collect();
    sends.sort_unstable();
    let lost_candidates = layout.keys().filter(|k| !best.contains_key(k)).collect();
    Plan { sends, recovered: best.len(), lost_candidates, marked }
}

/// Whether the survivors `live` of a shrink may go on as the store, given the live set
/// `previous` of the last completed recovery (or creation) and every worker's host.
///
/// On one host nothing can split the ranks, so any survivors go on. Once `previous` spans hosts
/// a network partition looks, to each side, exactly like the death of the other side; only one
/// side may keep the store, or both would accept writes to the same keys. The side that holds
/// more than half of `previous` goes on; at exactly half, the side with the lowest worker of
/// `previous`. Every other side must end (its ranks cannot tell whether the others died).
pub fn keeps_quorum(previous: &[i32], live: &[i32], hosts: &[u32]) -> bool {
    let host_of = |w: &i32| hosts.get(*w as usize).copied();
    let first_host = previous.first().and_then(host_of);
    if previous.iter().all(|w| host_of(w) == first_host) {
        return true;
    }
    let kept = live.iter().filter(|w| previous.contains(w)).count();
    let lowest = previous.iter().min();
    kept * 2 > previous.len()
        || (kept * 2 == previous.len() && lowest.is_some_and(|l| live.contains(l)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slot::SlotGeometry;

    /// Hosts of every worker, previous live set, survivors, whether they keep the store.
    type QuorumCase<'a> = (&'a [u32], &'a [i32], &'a [i32], bool);

    #[test]
    fn only_one_side_of_a_split_across_hosts_keeps_the_store() {
        let three_hosts = [0, 0, 1, 1, 2, 2];
        let one_host = [0; 6];
        let all = [0, 1, 2, 3, 4, 5];
        let table: [QuorumCase; 10] = [
            (&one_host, &all, &[4, 5], true),
            (&one_host, &all, &[5], true),
            (&three_hosts, &all, &[0, 1, 2, 3], true),
            (&three_hosts, &all, &[2, 3, 4, 5], true),
            (&three_hosts, &all, &[4, 5], false),
            (&three_hosts, &all, &[0, 1, 2], true),
            (&three_hosts, &all, &[3, 4, 5], false),
            (&three_hosts, &[2, 3, 4, 5], &[2, 3], true),
            (&three_hosts, &[2, 3, 4, 5], &[4, 5], false),
            (&three_hosts, &[1, 4], &[4], false),
        ];
        for (hosts, previous, live, keeps) in table {
            assert_eq!(
                keeps_quorum(previous, live, hosts),
                keeps,
                "{previous:?} → {live:?} on {hosts:?}"
            );
        }
    }

    #[test]
    fn newest_version_wins_and_the_lowest_holder_sends_it() {
        let layout = Layout::compute(&[0, 2, 3], &[0; 4], 1, 2, SlotGeometry::new(64), 0);
        let k = |o| Key::new(o, 0);
        let records = [
            Record { key: k(0), version: 4, source: 1 },
            Record { key: k(0), version: 5, source: 2 },
            Record { key: k(1), version: 9, source: 2 },
            Record { key: k(1), version: 9, source: 0 },
            Record { key: k(3), version: 1, source: 1 },
            Record { key: k(2), version: 1, source: OWNER_MARK },
        ];
        let table = [(0, vec![k(1)]), (1, vec![k(3)]), (2, vec![k(0)])];
        for (me, sends) in table {
            let p = plan(&records, &layout, me);
            assert_eq!(p.sends, sends, "rank {me}");
            assert_eq!(p.recovered, 3);
            assert_eq!(p.lost_candidates, vec![k(2)]);
            assert_eq!(p.marked, vec![k(2)]);
        }
    }

    #[test]
    fn records_round_trip() {
        let r = vec![Record { key: Key::new(7, 3), version: u64::MAX - 1, source: OWNER_MARK }];
        assert_eq!(crate::codec::decode::<Vec<Record>>(&crate::codec::encode(&r)), Some(r));
    }
}
