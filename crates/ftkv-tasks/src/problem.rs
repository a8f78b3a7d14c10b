//! A computation split into independent tasks: each task, when run, adds to the result and may
//! create more tasks. Results add up, so the order and the worker do not matter.

use crate::forkjoin::{FrameId, Work};
use crate::uts::{self, Counts, Node};

/// A task-parallel computation with a known answer.
pub trait Problem: Sync {
    /// A task; checkpoints, loot and steal messages carry tasks through [`ftkv::codec`].
    type Task: Copy + Send + serde::Serialize + serde::de::DeserializeOwned;

    /// How results return to frames held by another worker ([`crate::forkjoin`]): `false`, by
    /// message to the holder, which checkpoints before it acknowledges (nested fork-join);
    /// `true`, written by the returning worker into the holder's futures entry under the
    /// holder's lock (future-based cooperation).
    const HANDS_OVER_RESULTS: bool = false;

    /// The tasks the computation starts from.
    fn roots(&self) -> Vec<Self::Task>;
    /// Runs `task`: adds to `counts` and pushes the tasks it creates.
    fn run(&self, task: &Self::Task, pool: &mut Vec<Self::Task>, counts: &mut Counts);

    /// Runs `task` on a worker of the pool, whose state also holds fork-join frames
    /// ([`crate::forkjoin`]). Independent tasks need none: the default is [`Problem::run`].
    fn run_on(&self, task: &Self::Task, work: &mut Work<'_, Self::Task>) {
        self.run(task, work.pool, work.counts);
    }

    /// The task that continues placed frame `frame` once all its inputs returned (their sum
    /// is `inputs`; see [`crate::forkjoin`]) on a pool that started with `workers` workers.
    /// Only a program that places frames has any: the default, for every other, is none.
    fn resume(&self, frame: FrameId, inputs: Counts, workers: usize) -> Option<Self::Task> {
        let _ = (frame, inputs, workers);
        None
    }
}

impl Problem for uts::Params {
    type Task = Node;

    fn roots(&self) -> Vec<Node> {
        vec![self.root()]
    }

    fn run(&self, task: &Node, pool: &mut Vec<Node>, counts: &mut Counts) {
        uts::expand(self, task, pool, counts);
    }
}

/// Runs a problem to the end on one thread.
pub fn solve_sequential<P: Problem>(problem: &P) -> Counts {
    let mut pool = problem.roots();
    let mut counts = Counts::default();
    while let Some(task) = pool.pop() {
        problem.run(&task, &mut pool, &mut counts);
    }
    counts
}

/// What a whole computation must count: its nodes (when known) and leaves, from a published
/// table or a sequential run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reference {
    pub nodes: Option<u64>,
    pub leaves: u64,
}

impl From<Counts> for Reference {
    fn from(counts: Counts) -> Reference {
        Reference { nodes: Some(counts.nodes), leaves: counts.leaves }
    }
}

/// The pool's exactness oracle, for the simulator and the real-MPI runs alike: every task
/// counted exactly once gives exactly the reference's nodes and leaves (a task lost or run
/// twice changes the node count; N-Queens' solutions are its leaves). `Err` says what differs.
pub fn check_exact(total: &Counts, reference: Reference) -> Result<(), String> {
    let nodes_ok = reference.nodes.is_none_or(|n| n == total.nodes);
    if nodes_ok && total.leaves == reference.leaves {
        return Ok(());
    }
    let nodes = reference.nodes.map_or("?".to_string(), |n| n.to_string());
    Err(format!(
        "counted {} nodes and {} leaves, the reference {nodes} and {}",
        total.nodes, total.leaves, reference.leaves
    ))
}
