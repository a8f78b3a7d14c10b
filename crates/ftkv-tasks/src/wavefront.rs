//! A wavefront of futures: the program with real future dependencies. On an `N × N` grid,
//! cell `(i, j)` is a future whose value is `1` on the first row and column and
//! `v(i − 1, j) + v(i, j − 1) mod p` inside (`p` = [`MODULUS`]); the last cell's value is
//! `C(2N − 2, N − 1) mod p`, checked against that closed form and against the plain table
//! computed on one thread ([`Wavefront::table`]).
//!
//! Every cell's future is awaited by two others (the cell below and the cell to the right),
//! and every inner cell awaits two futures resolved by different tasks, often on different
//! workers: a dependency graph, not a tree, so it cannot be written as nested fork-join, where
//! each result has exactly one awaiting frame. Each cell is a placed frame of
//! [`crate::forkjoin`] homed statically by column block (the store's placement, planned once):
//! the task that resolves a cell returns its value to both awaiting cells' frames, on
//! whichever workers hold them, by the futures' hand-over; a frame whose two inputs arrived
//! becomes the cell's task, which any worker may steal.
//!
//! Counts: every cell is a node (`N²`), the last cell's value is the leaves count, the depth
//! is `2N − 2`.

use crate::forkjoin::{start_ready, FrameId, JoinRef, Joins, Work};
use crate::problem::Problem;
use crate::uts::Counts;

/// The prime the cells' values are taken modulo.
pub const MODULUS: u64 = 1_000_000_007;

/// The largest `N` (67 million cells; a cell's index within its block fits easily).
pub const MAX_N: u32 = 8192;

/// The wavefront on an `n × n` grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wavefront {
    pub n: u32,
}

/// The task of cell `(i, j)`, whose awaited inputs returned: their sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cell {
    pub i: u32,
    pub j: u32,
    pub inputs: u64,
}

impl Wavefront {
    pub fn new(n: u32) -> Result<Wavefront, String> {
        if (1..=MAX_N).contains(&n) {
            Ok(Wavefront { n })
        } else {
            Err(format!("wave:N needs N in 1..={MAX_N}, got {n}"))
        }
    }

    /// The counts the whole computation must reach: `N²` cells, the last cell's value
    /// `C(2N − 2, N − 1) mod p`, depth `2N − 2`.
    pub fn expected(&self) -> Counts {
        let n = u64::from(self.n);
        let last = binomial_mod(2 * n - 2, n - 1, MODULUS);
        Counts { nodes: n * n, leaves: last, max_depth: 2 * self.n - 2 }
    }

    /// The counts of the plain table computed row by row on this thread (no futures).
    pub fn table(&self) -> Counts {
        let n = self.n as usize;
        let mut row = vec![1u64; n];
        for _ in 1..n {
            for j in 1..n {
                row[j] = (row[j] + row[j - 1]) % MODULUS;
            }
        }
        Counts { nodes: (n * n) as u64, leaves: row[n - 1], max_depth: 2 * self.n - 2 }
    }

    /// The frame of cell `(i, j)`: homed on the worker of its column block, numbered row by
    /// row within the block (about the order the cells close) from 0, the root cell `(0, 0)`
    /// left out (no frame awaits it), awaiting the cell above (child 0, when there is one)
    /// and the cell to the left (the next child).
    fn frame(&self, i: u32, j: u32, workers: usize) -> FrameId {
        let home = (u64::from(j) * workers as u64 / u64::from(self.n)) as usize;
        let (start, width) = self.block(home, workers);
        let cell = u64::from(i) * u64::from(width) + u64::from(j - start);
        let index = cell - u64::from(home == 0);
        FrameId::placed(home as i32, index, u32::from(i > 0) + u32::from(j > 0))
    }

    /// The first column and the width of worker `home`'s column block: the columns `j` with
    /// `⌊j · workers / N⌋ = home`.
    fn block(&self, home: usize, workers: usize) -> (u32, u32) {
        let start = |h: usize| (h as u64 * u64::from(self.n)).div_ceil(workers as u64) as u32;
        (start(home), start(home + 1) - start(home))
    }

    /// Where cell `(i, j)`'s value goes: the cells below and to the right that exist.
    fn awaiting(&self, i: u32, j: u32, workers: usize) -> impl Iterator<Item = JoinRef> {
        let below =
            (i + 1 < self.n).then(|| JoinRef { frame: self.frame(i + 1, j, workers), child: 0 });
        let right = (j + 1 < self.n)
            .then(|| JoinRef { frame: self.frame(i, j + 1, workers), child: u32::from(i > 0) });
        below.into_iter().chain(right)
    }
}

impl Problem for Wavefront {
    type Task = Cell;
    const HANDS_OVER_RESULTS: bool = true;

    fn roots(&self) -> Vec<Cell> {
        vec![Cell { i: 0, j: 0, inputs: 0 }]
    }

    /// Runs the whole grid from `cell` with its futures on this thread (the sequential
    /// program of the same model) and counts its result.
    fn run(&self, cell: &Cell, _pool: &mut Vec<Cell>, counts: &mut Counts) {
        let mut pool = vec![*cell];
        let mut joins = Joins::hosting(0);
        let mut work = Work { me: 0, workers: 1, pool: &mut pool, counts, joins: &mut joins };
        while let Some(next) = work.pool.pop() {
            self.run_on(&next, &mut work);
            start_ready(self, &mut work);
        }
    }

    /// Resolves `cell`'s future and returns its value to the two cells that await it.
    fn run_on(&self, cell: &Cell, work: &mut Work<'_, Cell>) {
        let value = if cell.i == 0 || cell.j == 0 { 1 } else { cell.inputs % MODULUS };
        work.counts.nodes += 1;
        work.counts.max_depth = work.counts.max_depth.max(cell.i + cell.j);
        if cell.i + 1 == self.n && cell.j + 1 == self.n {
            work.counts.leaves += value;
        }
        let returned = Counts { nodes: 0, leaves: value, max_depth: 0 };
        for to in self.awaiting(cell.i, cell.j, work.workers) {
            work.deliver(to, returned);
        }
    }

    fn resume(&self, frame: FrameId, inputs: Counts, workers: usize) -> Option<Cell> {
        let home = usize::try_from(frame.creator).ok()?;
        let cell = frame.placed_index()? + u64::from(home == 0);
        let (start, width) = self.block(home, workers);
        let width = u64::from(width.max(1));
        let (i, j) = ((cell / width) as u32, start + (cell % width) as u32);
        Some(Cell { i, j, inputs: inputs.leaves })
    }
}

/// `C(n, k) mod p` for a prime `p` larger than `n`.
fn binomial_mod(n: u64, k: u64, p: u64) -> u64 {
    let mul = |a: u64, b: u64| ((u128::from(a) * u128::from(b)) % u128::from(p)) as u64;
    let (mut top, mut bottom) = (1u64, 1u64);
    for t in 0..k {
        top = mul(top, (n - t) % p);
        bottom = mul(bottom, (t + 1) % p);
    }
    mul(top, power_mod(bottom, p - 2, p))
}

fn power_mod(mut base: u64, mut exponent: u64, p: u64) -> u64 {
    let mul = |a: u64, b: u64| ((u128::from(a) * u128::from(b)) % u128::from(p)) as u64;
    let mut result = 1;
    while exponent > 0 {
        if exponent & 1 == 1 {
            result = mul(result, base);
        }
        base = mul(base, base);
        exponent >>= 1;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::solve_sequential;

    #[test]
    fn the_futures_program_the_table_and_the_closed_form_agree() {
        for n in [1, 2, 3, 7, 40] {
            let wave = Wavefront::new(n).unwrap();
            assert_eq!(wave.table(), wave.expected(), "N = {n}");
            assert_eq!(solve_sequential(&wave), wave.expected(), "N = {n}");
        }
        assert_eq!(Wavefront::new(5).unwrap().expected().leaves, 70);
        assert_eq!(binomial_mod(100, 50, MODULUS), 538_992_043);
        assert!(Wavefront::new(0).is_err() && Wavefront::new(MAX_N + 1).is_err());
    }

    #[test]
    fn every_cell_is_awaited_by_the_two_cells_it_feeds_and_homed_by_column_block() {
        let wave = Wavefront::new(4).unwrap();
        let awaiting: Vec<JoinRef> = wave.awaiting(1, 1, 2).collect();
        assert_eq!(
            awaiting,
            vec![
                JoinRef { frame: wave.frame(2, 1, 2), child: 0 },
                JoinRef { frame: wave.frame(1, 2, 2), child: 1 },
            ]
        );
        assert_eq!(wave.frame(3, 1, 2).creator, 0);
        assert_eq!(wave.frame(0, 2, 2).creator, 1);
        assert_eq!(wave.awaiting(3, 3, 2).count(), 0, "the last cell is the result");
        let inputs = Counts { nodes: 0, leaves: 9, max_depth: 0 };
        for workers in [1, 2, 3, 5, 8] {
            let cells = (0..4).flat_map(|i| (0..4).map(move |j| (i, j)));
            for (i, j) in cells.filter(|&cell| cell != (0, 0)) {
                let cell = wave.resume(wave.frame(i, j, workers), inputs, workers);
                assert_eq!(cell, Some(Cell { i, j, inputs: 9 }), "{workers} workers");
            }
        }
    }

    #[test]
    fn an_input_returned_twice_counts_once_even_after_its_frame_closed() {
        let wave = Wavefront::new(3).unwrap();
        let mut joins = Joins::hosting(0);
        let mut result = Counts::default();
        let value = Counts { nodes: 0, leaves: 4, max_depth: 0 };
        let [above, left] = [0, 1].map(|child| JoinRef { frame: wave.frame(1, 1, 1), child });
        joins.accept(above, value, &mut result);
        joins.accept(above, value, &mut result);
        assert!(joins.ready.is_empty(), "one input of two");
        joins.accept(left, value, &mut result);
        assert_eq!(joins.ready, vec![(above.frame, Counts { nodes: 0, leaves: 8, max_depth: 0 })]);
        joins.ready.clear();
        joins.accept(left, value, &mut result);
        assert!(joins.placed.is_empty() && joins.ready.is_empty(), "a closed frame stays closed");
        let mut adopter = Joins::hosting(1);
        adopter.accept(above, value, &mut result);
        assert!(adopter.placed.is_empty(), "home 0's frames are not the adopter's yet");
        adopter.absorb(joins);
        adopter.accept(above, value, &mut result);
        assert!(adopter.placed.is_empty(), "closed frames move with an adoption");
        assert_eq!(result, Counts::default());
    }

    #[test]
    fn the_closed_cells_of_every_block_take_a_few_words() {
        let wave = Wavefront::new(64).unwrap();
        let mut pool = vec![Cell { i: 0, j: 0, inputs: 0 }];
        let (mut counts, mut joins) = (Counts::default(), Joins::hosting(0));
        let mut work =
            Work { me: 0, workers: 1, pool: &mut pool, counts: &mut counts, joins: &mut joins };
        while let Some(next) = work.pool.pop() {
            wave.run_on(&next, &mut work);
            start_ready(&wave, &mut work);
        }
        assert_eq!(counts, wave.expected());
        let words = ftkv::codec::encode(&joins).len();
        assert!(words < 64, "the closed set of 4,095 frames in {words} bytes");
    }
}
