//! Nested fork-join (NFJ) on the pool: a task forks its children and joins their results.
//!
//! [`ForkJoin`] turns a tree [`Problem`] into a fork-join program. Running a task runs its
//! node (its own counts) and, when it has children, opens a [`Frame`] that waits for every
//! child's result and spawns the children onto the worker's pool, each with a [`JoinRef`] to
//! its slot in the frame. The worker runs the last child spawned next (work first: the order of
//! the sequential program), thieves take the oldest spawned children (the continuations of the
//! oldest open frames). A task without children returns its counts to its parent's frame; a
//! frame whose children all returned closes and returns its node's counts plus theirs to its
//! own parent, up to the root, whose result is the computation's.
//!
//! Frames stay with the worker that opened them (and move only with its whole state, when a
//! buddy adopts it). A child stolen by another worker returns its result to the frame's
//! holder; the thief records it as [`Owed`] in its state and keeps it until the holder
//! acknowledges it. A frame applies a result only for a child still pending, so a result
//! returned twice (again after a failure, or by the buddy that adopted a thief's state)
//! counts once. How it returns is the program's model:
//! - [`ForkJoin`] (nested fork-join): by message; the holder checkpoints the result applied
//!   before it acknowledges;
//! - [`Futures`] (future-based cooperation): each child is a future its parent awaits; the
//!   thief borrows the holder's futures entry (the holder lends it to one worker at a time: the
//!   outer lock), appends the result to it with [`ftkv::Store::put_handed`] and gives it back;
//!   the holder acknowledges without a checkpoint of its own, since its entry holds the result
//!   until its next checkpoint does (a buddy that adopts it applies its entry too).
//!
//! A tree's frames have one parent each. A program whose results are awaited by several tasks
//! (a future read by more than its creator's frame, [`crate::wavefront`]) names its awaiting
//! frames itself: a **placed frame** ([`FrameId::placed`]) has a home worker and an index the
//! program plans statically, so every task that resolves one of its inputs finds it without
//! knowing who ran the others. Its holder (the home, or the buddy that adopted it) opens it at
//! the first input that arrives and remembers it closed ([`Joins::accept`]), so an input
//! returned twice counts once there as well. A closed placed frame becomes a ready
//! continuation ([`Joins::ready`]) that the program turns into a task ([`Problem::resume`],
//! [`start_ready`]).

use std::collections::BTreeMap;

use crate::problem::Problem;
use crate::uts::Counts;

/// A frame's identity: the worker that opened it and that worker's frame serial number; for
/// a placed frame ([`FrameId::placed`]), its home worker and its planned index.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct FrameId {
    pub creator: i32,
    pub serial: u64,
}

/// The serial bit of placed frames (opened frames count their serials up from 0).
const PLACED: u64 = 1 << 63;
/// Where a placed frame's number of inputs sits in its serial (the index is below).
const INPUTS_SHIFT: u32 = 48;
/// The largest index of a placed frame.
pub const MAX_PLACED_INDEX: u64 = (1 << INPUTS_SHIFT) - 1;

impl FrameId {
    /// The placed frame `index` (unique among `home`'s, at most [`MAX_PLACED_INDEX`]; best
    /// numbered in about the order the frames close, see [`Closed`]) homed on worker `home`,
    /// awaiting `inputs` results, children `0..inputs` (at most 255).
    pub fn placed(home: i32, index: u64, inputs: u32) -> FrameId {
        debug_assert!(index <= MAX_PLACED_INDEX && inputs < 256);
        let serial = PLACED | (u64::from(inputs) << INPUTS_SHIFT) | index;
        FrameId { creator: home, serial }
    }

    /// The program's index of a placed frame; `None` for a frame a task opened.
    pub fn placed_index(&self) -> Option<u64> {
        (self.serial & PLACED != 0).then_some(self.serial & MAX_PLACED_INDEX)
    }

    /// How many inputs a placed frame awaits.
    fn placed_inputs(&self) -> u32 {
        ((self.serial & !PLACED) >> INPUTS_SHIFT) as u32
    }
}

/// Where a task's result goes: its slot (child index) in its parent's frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JoinRef {
    pub frame: FrameId,
    pub child: u32,
}

/// A task of a fork-join program: the problem's task and the join its result goes to
/// (`None`: a root, whose result is the computation's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Spawned<T> {
    pub task: T,
    pub parent: Option<JoinRef>,
}

/// An open frame: a node waiting for its children's results.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Frame {
    pub id: FrameId,
    pub parent: Option<JoinRef>,
    /// The node's own counts plus its returned children's.
    pub sum: Counts,
    /// The children whose results have not returned.
    pub pending: Pending,
}

/// A frame's children whose results have not returned: a bit each for the first 64 (no
/// allocation for almost every node), a list for the others.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Pending {
    first: u64,
    others: Vec<u32>,
}

impl Pending {
    /// Children `0..children`, all pending.
    pub fn all(children: u32) -> Pending {
        let first = match children {
            0 => 0,
            1..=63 => (1u64 << children) - 1,
            _ => u64::MAX,
        };
        Pending { first, others: (64..children).collect() }
    }

    /// Marks `child` returned; `false` when it was not pending.
    pub fn take(&mut self, child: u32) -> bool {
        if child < 64 {
            let bit = 1u64 << child;
            let was = self.first & bit != 0;
            self.first &= !bit;
            return was;
        }
        match self.others.iter().position(|&c| c == child) {
            Some(at) => {
                self.others.swap_remove(at);
                true
            }
            None => false,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.first == 0 && self.others.is_empty()
    }

    /// The pending children, in order.
    pub fn children(&self) -> Vec<u32> {
        let first = (0..64).filter(|&c| self.first & (1u64 << c) != 0);
        let mut all: Vec<u32> = first.chain(self.others.iter().copied()).collect();
        all.sort_unstable();
        all
    }
}

/// A set of placed frames' indexes of one home: every index below `below`, and those set in
/// `bits` above it. A program that numbers its frames in about the order they close (the
/// wavefront: row by row within its column block) keeps it to a few words, whatever the
/// number of frames.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Closed {
    below: u64,
    bits: Vec<u64>,
}

impl Closed {
    pub fn contains(&self, index: u64) -> bool {
        let Some(offset) = index.checked_sub(self.below) else { return true };
        let word = self.bits.get((offset / 64) as usize).copied().unwrap_or(0);
        word & (1 << (offset % 64)) != 0
    }

    pub fn insert(&mut self, index: u64) {
        let Some(offset) = index.checked_sub(self.below) else { return };
        let word = (offset / 64) as usize;
        if self.bits.len() <= word {
            self.bits.resize(word + 1, 0);
        }
        self.bits[word] |= 1 << (offset % 64);
        let full = self.bits.iter().take_while(|&&w| w == u64::MAX).count();
        if full > 0 {
            self.bits.drain(..full);
            self.below += 64 * full as u64;
        }
    }

    /// Adds every index of `other`.
    fn absorb(&mut self, other: &Closed) {
        if other.below > self.below {
            let mine = std::mem::replace(self, other.clone());
            return self.absorb(&mine);
        }
        for (word, bits) in other.bits.iter().enumerate() {
            let base = other.below + 64 * word as u64;
            (0..64).filter(|b| bits & (1 << b) != 0).for_each(|b| self.insert(base + b));
        }
    }
}

/// A result for a frame held by another worker, kept until that worker acknowledges it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Owed {
    pub to: JoinRef,
    pub counts: Counts,
}

/// A worker's fork-join state, part of its checkpoint: its open frames, the results it owes
/// to frames held elsewhere, and for placed frames those that closed. Empty for independent
/// tasks.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Joins {
    /// The serial number of the next frame this worker opens.
    pub next_serial: u64,
    /// Frames opened by tasks, in the order they were opened.
    pub frames: Vec<Frame>,
    /// Open placed frames, by id.
    pub placed: BTreeMap<FrameId, Frame>,
    pub owed: Vec<Owed>,
    /// Placed frames that closed and whose continuation is not a task yet, with their sums.
    pub ready: Vec<(FrameId, Counts)>,
    /// The homes whose placed frames this state holds (its worker's own and those of the
    /// workers it adopted), each with the indexes of its placed frames that closed.
    closed: Vec<(i32, Closed)>,
}

impl Joins {
    /// The state of a worker that starts out holding the placed frames homed on it.
    pub fn hosting(home: i32) -> Joins {
        Joins { closed: vec![(home, Closed::default())], ..Joins::default() }
    }

    /// Whether this worker has no open frame, no ready continuation and owes no result.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
            && self.placed.is_empty()
            && self.owed.is_empty()
            && self.ready.is_empty()
    }

    /// Takes over an adopted worker's frames, owed results, ready continuations and closed
    /// placed frames (their ids stay unique: a frame id names its creator or home).
    pub fn absorb(&mut self, theirs: Joins) {
        self.frames.extend(theirs.frames);
        self.placed.extend(theirs.placed);
        self.owed.extend(theirs.owed);
        self.ready.extend(theirs.ready);
        for (home, closed) in theirs.closed {
            self.closed_of(home).absorb(&closed);
        }
    }

    /// The closed placed frames of `home` (an empty set at first).
    fn closed_of(&mut self, home: i32) -> &mut Closed {
        let at = match self.closed.iter().position(|(h, _)| *h == home) {
            Some(at) => at,
            None => {
                self.closed.push((home, Closed::default()));
                self.closed.len() - 1
            }
        };
        &mut self.closed[at].1
    }

    /// Applies a result for a frame this state holds: one it has open, or a placed frame of
    /// a home it hosts ([`Joins::hosting`], or adopted), which the first input opens. A result
    /// for a child no longer pending, for a placed frame that closed, or for a frame of a home
    /// this state does not hold (yet: an adoption that brings it may come later; its writer
    /// still owes it) changes nothing.
    pub fn accept(&mut self, to: JoinRef, counts: Counts, result: &mut Counts) {
        if !self.holds(to.frame) {
            let Some(index) = to.frame.placed_index() else { return };
            let home = self.closed.iter().find(|(home, _)| *home == to.frame.creator);
            if home.is_none_or(|(_, closed)| closed.contains(index)) {
                return;
            }
            let pending = Pending::all(to.frame.placed_inputs());
            let frame = Frame { id: to.frame, parent: None, sum: Counts::default(), pending };
            self.placed.insert(to.frame, frame);
        }
        self.deliver(Some(to), counts, result);
    }

    /// Whether this state holds frame `id`.
    pub fn holds(&self, id: FrameId) -> bool {
        self.placed.contains_key(&id) || self.frames.iter().any(|f| f.id == id)
    }

    /// Open frame `id`, if this state holds it.
    fn frame_mut(&mut self, id: FrameId) -> Option<&mut Frame> {
        if id.placed_index().is_some() {
            return self.placed.get_mut(&id);
        }
        self.frames.iter_mut().rev().find(|f| f.id == id)
    }

    /// Removes open frame `id`, which this state holds.
    fn remove_frame(&mut self, id: FrameId) -> Option<Frame> {
        if id.placed_index().is_some() {
            return self.placed.remove(&id);
        }
        let at = self.frames.iter().rposition(|f| f.id == id)?;
        Some(self.frames.remove(at))
    }

    /// Opens a frame of worker `me` and returns its id.
    fn open(&mut self, me: i32, parent: Option<JoinRef>, sum: Counts, children: u32) -> FrameId {
        let id = FrameId { creator: me, serial: self.next_serial };
        self.next_serial += 1;
        self.frames.push(Frame { id, parent, sum, pending: Pending::all(children) });
        id
    }

    /// Returns `counts` to `to` and closes every frame this completes, up to a root (whose
    /// result goes to `result`), a placed frame (then [`Joins::ready`]) or a frame this state
    /// does not hold (an [`Owed`] result). A result for a child that is no longer pending
    /// changes nothing.
    pub fn deliver(&mut self, mut to: Option<JoinRef>, mut counts: Counts, result: &mut Counts) {
        loop {
            let Some(join) = to else {
                result.add(&counts);
                return;
            };
            let Some(frame) = self.frame_mut(join.frame) else {
                self.owed.push(Owed { to: join, counts });
                return;
            };
            if !frame.pending.take(join.child) {
                return;
            }
            frame.sum.add(&counts);
            if !frame.pending.is_empty() {
                return;
            }
            let Some(closed) = self.remove_frame(join.frame) else { return };
            if let Some(index) = closed.id.placed_index() {
                self.closed_of(closed.id.creator).insert(index);
                self.ready.push((closed.id, closed.sum));
                return;
            }
            (to, counts) = (closed.parent, closed.sum);
        }
    }

    /// Drops the owed result for `to` once its frame's holder acknowledged it.
    pub fn acknowledged(&mut self, to: JoinRef) {
        self.owed.retain(|o| o.to != to);
    }

    /// Applies the results of a futures entry to the frames this state holds ([`Joins::accept`];
    /// the others are still owed by their writers).
    pub fn apply_handed(&mut self, handed: &[Owed], result: &mut Counts) {
        for owed in handed {
            self.accept(owed.to, owed.counts, result);
        }
    }
}

/// Decodes a futures entry (`None`: not an entry).
pub fn decode_handed(bytes: &[u8]) -> Option<Vec<Owed>> {
    ftkv::codec::decode(bytes)
}

/// Encodes a futures entry holding `handed`.
pub fn encode_handed(handed: &[Owed]) -> Vec<u8> {
    ftkv::codec::encode(&handed.to_vec())
}

/// What running a task may change: the worker's pool, its counts (a root's result) and its
/// fork-join state.
pub struct Work<'a, T> {
    /// The worker's id (it names the frames the worker opens).
    pub me: i32,
    /// How many workers the pool started with (the homes of placed frames are among them).
    pub workers: usize,
    pub pool: &'a mut Vec<T>,
    pub counts: &'a mut Counts,
    pub joins: &'a mut Joins,
}

impl<T> Work<'_, T> {
    /// Returns `counts` to `to`: applied here when this worker holds its frame or is the home
    /// of its placed frame, else owed to the frame's holder ([`Joins::deliver`]).
    pub fn deliver(&mut self, to: JoinRef, counts: Counts) {
        if to.frame.placed_index().is_some() && to.frame.creator == self.me {
            self.joins.accept(to, counts, self.counts);
        } else {
            self.joins.deliver(Some(to), counts, self.counts);
        }
    }
}

/// Turns every ready continuation of `work`'s placed frames into a task of `problem`
/// ([`Problem::resume`]) on the worker's pool.
pub fn start_ready<P: Problem>(problem: &P, work: &mut Work<'_, P::Task>) {
    for (frame, inputs) in std::mem::take(&mut work.joins.ready) {
        work.pool.extend(problem.resume(frame, inputs, work.workers));
    }
}

/// A tree problem as a program whose nodes join their children's results in frames (see the
/// module); `HANDED`: results for frames held elsewhere are handed over into the holder's
/// futures entry ([`Futures`]) instead of sent by message ([`ForkJoin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Joined<P, const HANDED: bool> {
    pub inner: P,
}

/// A tree problem as a nested fork-join program.
pub type ForkJoin<P> = Joined<P, false>;

/// A tree problem with futures: every node creates a future per child and awaits them all.
pub type Futures<P> = Joined<P, true>;

impl<P: Problem, const HANDED: bool> Problem for Joined<P, HANDED> {
    type Task = Spawned<P::Task>;
    const HANDS_OVER_RESULTS: bool = HANDED;

    fn roots(&self) -> Vec<Self::Task> {
        self.inner.roots().into_iter().map(|task| Spawned { task, parent: None }).collect()
    }

    /// Runs `task`'s whole subtree at once, forking and joining through frames of its own, and
    /// counts its result (the sequential program; the pool runs [`Problem::run_on`]).
    fn run(&self, task: &Self::Task, _pool: &mut Vec<Self::Task>, counts: &mut Counts) {
        let mut pool = vec![Spawned { task: task.task, parent: None }];
        let mut joins = Joins::default();
        let mut work = Work { me: 0, workers: 1, pool: &mut pool, counts, joins: &mut joins };
        while let Some(next) = work.pool.pop() {
            self.run_on(&next, &mut work);
        }
    }

    /// Runs `task`'s node; opens its frame (awaiting a future per child) and spawns its
    /// children, or returns its counts to its parent when it has none.
    fn run_on(&self, task: &Self::Task, work: &mut Work<'_, Self::Task>) {
        fork(&self.inner, task, work);
    }
}

/// Runs `task`'s node of `inner`: opens its frame and spawns its children, or returns its
/// counts to its parent when it has none.
fn fork<P: Problem>(inner: &P, task: &Spawned<P::Task>, work: &mut Work<'_, Spawned<P::Task>>) {
    let mut own = Counts::default();
    let mut children = Vec::new();
    inner.run(&task.task, &mut children, &mut own);
    if children.is_empty() {
        work.joins.deliver(task.parent, own, work.counts);
        return;
    }
    let frame = work.joins.open(work.me, task.parent, own, children.len() as u32);
    let spawned = children.into_iter().enumerate().map(|(child, task)| Spawned {
        task,
        parent: Some(JoinRef { frame, child: child as u32 }),
    });
    work.pool.extend(spawned);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fib::Fib;
    use crate::problem::solve_sequential;
    use crate::uts::{self, Params};

    #[test]
    fn the_sequential_fork_join_program_counts_what_the_independent_tasks_count() {
        let fib = Fib::new(20).unwrap();
        assert_eq!(solve_sequential(&ForkJoin { inner: fib }), solve_sequential(&fib));
        let small = Params::parse("-t 1 -a 3 -d 5 -b 4 -r 19").unwrap();
        assert_eq!(solve_sequential(&ForkJoin { inner: small }), uts::count_sequential(&small));
    }

    fn join(serial: u64, child: u32) -> Option<JoinRef> {
        Some(JoinRef { frame: FrameId { creator: 0, serial }, child })
    }

    #[test]
    fn a_result_counts_once_and_closes_its_frames_up_to_the_root() {
        let mut joins = Joins::default();
        let node = Counts { nodes: 1, leaves: 0, max_depth: 0 };
        let leaf = Counts { nodes: 1, leaves: 1, max_depth: 2 };
        let root = joins.open(0, None, node, 2);
        let inner = joins.open(0, Some(JoinRef { frame: root, child: 0 }), node, 1);
        let mut result = Counts::default();
        joins.deliver(join(inner.serial, 0), leaf, &mut result);
        assert_eq!(joins.frames.len(), 1, "the inner frame closed into the root");
        joins.deliver(join(root.serial, 0), leaf, &mut result);
        assert_eq!(result, Counts::default(), "a result for a joined child counts nothing");
        joins.deliver(join(root.serial, 1), leaf, &mut result);
        assert!(joins.is_empty());
        assert_eq!(result, Counts { nodes: 4, leaves: 2, max_depth: 2 });
    }

    #[test]
    fn closed_frames_numbered_in_order_take_a_few_words() {
        let mut closed = Closed::default();
        (0..1000).for_each(|i| closed.insert(i));
        closed.insert(1100);
        assert!((0..1000).all(|i| closed.contains(i)) && closed.contains(1100));
        assert!(!closed.contains(1000) && !closed.contains(1099) && !closed.contains(5000));
        assert_eq!((closed.below, closed.bits.len()), (960, 3), "only the words above 960");
        let mut other = Closed::default();
        [3, 1000, 1099].into_iter().for_each(|i| other.insert(i));
        other.absorb(&closed);
        assert!([3, 999, 1000, 1099, 1100].iter().all(|&i| other.contains(i)));
        assert!(!other.contains(1001));
    }

    #[test]
    fn pending_children_beyond_64_are_kept_too() {
        let mut pending = Pending::all(70);
        assert!(pending.take(69) && pending.take(3) && !pending.take(3) && !pending.take(70));
        let left: Vec<u32> = (0..69).filter(|&c| c != 3).collect();
        assert_eq!(pending.children(), left);
        left.iter().for_each(|&c| assert!(pending.take(c)));
        assert!(pending.is_empty());
        assert!(Pending::all(0).is_empty());
        assert_eq!(Pending::all(64).children(), (0..64).collect::<Vec<_>>());
    }

    #[test]
    fn a_result_for_a_frame_held_elsewhere_is_owed_until_acknowledged() {
        let mut joins = Joins::default();
        let mut result = Counts::default();
        let elsewhere = JoinRef { frame: FrameId { creator: 3, serial: 9 }, child: 1 };
        let counts = Counts { nodes: 5, leaves: 3, max_depth: 4 };
        joins.deliver(Some(elsewhere), counts, &mut result);
        assert_eq!(joins.owed, vec![Owed { to: elsewhere, counts }]);
        joins.acknowledged(elsewhere);
        assert!(joins.is_empty());
        assert_eq!(result, Counts::default());
    }
}
