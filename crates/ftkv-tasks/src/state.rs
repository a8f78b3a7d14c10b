//! What a worker writes into the store: its checkpoint (pool, partial result and the
//! bookkeeping that makes recovery exact) and, while a steal is in flight, the loot.
//!
//! Invariants the steal protocol keeps (see [`crate::pool`]):
//! - a victim writes the loot key, then a checkpoint without the loot (`last_given` = its steal
//!   id), and only then sends the loot;
//! - a thief writes a checkpoint that includes the loot (`received[victim]` ≥ steal id) before
//!   it acknowledges; the victim deletes the loot key on the acknowledgement.

use crate::forkjoin::{Joins, Owed};
use crate::problem::Problem;
use crate::uts::Counts;

/// A worker's checkpointed state (stored through [`ftkv::codec`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Checkpoint<T> {
    pub counts: Counts,
    /// Steal id of the last loot this worker gave away (left out of its pool).
    pub last_given: u64,
    /// Per victim: the highest steal id whose loot this state includes.
    pub received: Vec<u64>,
    /// Dead workers whose checkpointed state this state includes.
    pub adopted: Vec<i32>,
    pub pool: Vec<T>,
    /// Set on a failed worker's checkpoint once a localized recovery moved its pool and
    /// counts to this worker (they are then empty here; the steal bookkeeping stays).
    pub adopted_by: Option<i32>,
    /// Open fork-join frames and results owed to other workers' frames
    /// ([`crate::forkjoin`]; empty for independent tasks).
    pub joins: Joins,
}

/// Loot in flight from a victim to a thief (stored through [`ftkv::codec`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Loot<T> {
    pub steal_id: u64,
    pub thief: i32,
    pub tasks: Vec<T>,
}

impl<T: Copy> Checkpoint<T> {
    /// The state every worker starts from: the roots on worker 0, nothing elsewhere.
    pub fn initial<P: Problem<Task = T>>(problem: &P, worker: i32, workers: usize) -> Self {
        Checkpoint {
            counts: Counts::default(),
            last_given: 0,
            received: vec![0; workers],
            adopted: Vec::new(),
            pool: if worker == 0 { problem.roots() } else { Vec::new() },
            adopted_by: None,
            joins: Joins::hosting(worker),
        }
    }

    /// What remains of this (failed worker's) checkpoint once `buddy` adopted it: no tasks,
    /// no counts, no frames, the steal bookkeeping unchanged.
    pub fn emptied(&self, buddy: i32) -> Self {
        Checkpoint {
            counts: Counts::default(),
            pool: Vec::new(),
            adopted_by: Some(buddy),
            received: self.received.clone(),
            adopted: self.adopted.clone(),
            last_given: self.last_given,
            joins: Joins::default(),
        }
    }

    /// Takes in the checkpoint of the failed worker `dead` that this worker adopts: its tasks,
    /// counts, frames and owed results, and the results its futures entry held (`handed`).
    pub fn take_in(&mut self, dead: i32, theirs: Checkpoint<T>, handed: &[Owed]) {
        self.pool.extend(theirs.pool);
        self.counts.add(&theirs.counts);
        self.joins.absorb(theirs.joins);
        self.joins.apply_handed(handed, &mut self.counts);
        self.adopted.push(dead);
    }

    /// Whether this state holds loot `steal_id` of `victim`.
    pub fn holds_loot(&self, victim: i32, steal_id: u64) -> bool {
        self.received.get(victim as usize).is_some_and(|&r| r >= steal_id)
    }

    pub fn encode(&self) -> Vec<u8>
    where
        T: serde::Serialize,
    {
        ftkv::codec::encode(self)
    }

    /// `None` when `bytes` are not a checkpoint.
    pub fn decode(bytes: &[u8]) -> Option<Self>
    where
        T: serde::de::DeserializeOwned,
    {
        ftkv::codec::decode(bytes)
    }
}

impl<T: serde::Serialize + serde::de::DeserializeOwned> Loot<T> {
    pub fn encode(&self) -> Vec<u8> {
        ftkv::codec::encode(self)
    }

    /// `None` when `bytes` are not a loot.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        ftkv::codec::decode(bytes)
    }
}

/// What the store says about one worker after a recovery.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Seen {
    /// Its checkpoint's bookkeeping (`None`: it never wrote one, so it is in its initial state).
    pub last_given: u64,
    pub received: Vec<u64>,
    pub adopted: Vec<i32>,
    /// Its loot key: steal id and thief.
    pub loot: Option<(u64, i32)>,
}

/// One worker's part of a recovery.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Dead workers whose checkpoint this worker adopts.
    pub adopt: Vec<i32>,
    /// Victims whose stored loot this worker adds to its pool.
    pub take_loot: Vec<i32>,
    /// Victims whose loot key this worker deletes.
    pub delete_loot: Vec<i32>,
    /// Whether this worker's own pending loot (steal id given) goes back into its pool; when
    /// false and it had one, the thief's side has it.
    pub take_back_pending: bool,
}

/// The first live worker after `dead` in ring order.
pub fn buddy(dead: i32, live: &[i32], workers: usize) -> i32 {
    (1..=workers as i32)
        .map(|d| (dead + d).rem_euclid(workers as i32))
        .find(|w| live.contains(w))
        .expect("at least one live worker")
}

/// Whether some worker's state includes loot `steal_id` of `victim`.
fn included(seen: &[Seen], victim: i32, steal_id: u64) -> bool {
    seen.iter().any(|s| s.received.get(victim as usize).is_some_and(|&r| r >= steal_id))
}

/// Computes `me`'s part of the recovery, the same way on every live worker: every dead worker
/// that no state includes yet is adopted by its buddy; every stored loot is resolved once (by
/// its victim if alive, else by the victim's buddy): it goes into the resolver's pool if the
/// victim's checkpoint left it out and no state includes it, and its key is deleted.
/// `pending`: the steal id of `me`'s own loot in flight, if any.
pub fn plan(me: i32, live: &[i32], seen: &[Seen], pending: Option<u64>) -> Plan {
    let workers = seen.len();
    let mut plan = Plan::default();
    for dead in (0..workers as i32).filter(|w| !live.contains(w)) {
        let covered = seen.iter().any(|s| s.adopted.contains(&dead));
        if !covered && buddy(dead, live, workers) == me {
            plan.adopt.push(dead);
        }
    }
    for (victim, s) in seen.iter().enumerate() {
        let victim = victim as i32;
        let Some((steal_id, _thief)) = s.loot else { continue };
        let alive = live.contains(&victim);
        let resolver = if alive { victim } else { buddy(victim, live, workers) };
        if resolver != me {
            continue;
        }
        plan.delete_loot.push(victim);
        let left_out = s.last_given >= steal_id;
        if !alive && left_out && !included(seen, victim, steal_id) {
            plan.take_loot.push(victim);
        }
    }
    if let Some(steal_id) = pending {
        plan.take_back_pending = !included(seen, me, steal_id);
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nqueens::Board;

    fn seen(
        last_given: u64,
        received: [u64; 4],
        adopted: &[i32],
        loot: Option<(u64, i32)>,
    ) -> Seen {
        Seen { last_given, received: received.to_vec(), adopted: adopted.to_vec(), loot }
    }

    #[test]
    fn buddies_are_the_next_live_workers() {
        assert_eq!(buddy(1, &[0, 2, 3], 4), 2);
        assert_eq!(buddy(3, &[0, 2], 4), 0);
        assert_eq!(buddy(2, &[1], 4), 1);
    }

    /// (case, me, live, what the store says, own pending loot, expected plan)
    type Case = (&'static str, i32, Vec<i32>, Vec<Seen>, Option<u64>, Plan);

    #[test]
    fn recovery_plan_table() {
        let quiet = || seen(0, [0; 4], &[], None);
        let table: Vec<Case> = vec![
            (
                "dead worker adopted by its buddy",
                2,
                vec![0, 2, 3],
                vec![quiet(), quiet(), quiet(), quiet()],
                None,
                Plan { adopt: vec![1], ..Plan::default() },
            ),
            (
                "already adopted by a worker that died since: only that one is adopted",
                3,
                vec![0, 3],
                vec![quiet(), quiet(), seen(0, [0; 4], &[1], None), quiet()],
                None,
                Plan { adopt: vec![2], ..Plan::default() },
            ),
            (
                "victim died after giving loot the thief never checkpointed: buddy takes it",
                2,
                vec![0, 2, 3],
                vec![quiet(), seen(5, [0; 4], &[], Some((5, 3))), quiet(), quiet()],
                None,
                Plan {
                    adopt: vec![1],
                    take_loot: vec![1],
                    delete_loot: vec![1],
                    ..Plan::default()
                },
            ),
            (
                "victim died after giving loot the thief checkpointed: nobody takes it",
                2,
                vec![0, 2, 3],
                vec![
                    quiet(),
                    seen(5, [0; 4], &[], Some((5, 3))),
                    quiet(),
                    seen(0, [0, 5, 0, 0], &[], None),
                ],
                None,
                Plan { adopt: vec![1], delete_loot: vec![1], ..Plan::default() },
            ),
            (
                "victim died between loot key and checkpoint: the loot is still in its pool",
                2,
                vec![0, 2, 3],
                vec![quiet(), seen(4, [0; 4], &[], Some((5, 3))), quiet(), quiet()],
                None,
                Plan { adopt: vec![1], delete_loot: vec![1], ..Plan::default() },
            ),
            (
                "thief died before checkpointing the loot: the live victim takes it back",
                0,
                vec![0, 2, 3],
                vec![seen(7, [0; 4], &[], Some((7, 1))), quiet(), quiet(), quiet()],
                Some(7),
                Plan { delete_loot: vec![0], take_back_pending: true, ..Plan::default() },
            ),
            (
                "thief died after checkpointing the loot: its buddy's adoption has it",
                0,
                vec![0, 2, 3],
                vec![
                    seen(7, [0; 4], &[], Some((7, 1))),
                    seen(0, [7, 0, 0, 0], &[], None),
                    quiet(),
                    quiet(),
                ],
                Some(7),
                Plan { delete_loot: vec![0], take_back_pending: false, ..Plan::default() },
            ),
            (
                "loot already taken back by its victim in an earlier attempt",
                0,
                vec![0, 2, 3],
                vec![seen(7, [7, 0, 0, 0], &[], Some((7, 1))), quiet(), quiet(), quiet()],
                Some(7),
                Plan { delete_loot: vec![0], take_back_pending: false, ..Plan::default() },
            ),
        ];
        for (case, me, live, seen, pending, want) in table {
            assert_eq!(plan(me, &live, &seen, pending), want, "{case}");
        }
    }

    #[test]
    fn checkpoints_and_loot_round_trip() {
        let board = Board { row: 2, columns: 5, left: 10, right: 2 };
        let checkpoint = Checkpoint {
            counts: Counts { nodes: 9, leaves: 4, max_depth: 3 },
            last_given: 12,
            received: vec![0, 3, 9],
            adopted: vec![2],
            pool: vec![board, board],
            adopted_by: None,
            joins: Joins::default(),
        };
        let bytes = checkpoint.encode();
        assert_eq!(Checkpoint::decode(&bytes), Some(checkpoint));
        assert_eq!(Checkpoint::<Board>::decode(&bytes[..bytes.len() - 1]), None);
        let loot = Loot { steal_id: 4, thief: 1, tasks: vec![board] };
        assert_eq!(Loot::decode(&loot.encode()), Some(loot));
    }
}
