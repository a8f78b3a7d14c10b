//! N-Queens: count the placements of N non-attacking queens. A task is a partial board (the
//! rows filled so far as bitmasks of attacked columns and diagonals); running it places a
//! queen in every free column of the next row. A full board counts as a leaf: the solution
//! count is [`Counts::leaves`].

use crate::problem::Problem;
use crate::uts::Counts;

/// The problem of size `n` (1..=20).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NQueens {
    pub n: u32,
}

/// A partial board.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Board {
    pub row: u32,
    pub columns: u32,
    pub left: u32,
    pub right: u32,
}

/// Published solution counts, for N = 1..=16.
pub const SOLUTIONS: [u64; 16] =
    [1, 0, 0, 2, 10, 4, 40, 92, 352, 724, 2_680, 14_200, 73_712, 365_596, 2_279_184, 14_772_512];

impl NQueens {
    pub fn new(n: u32) -> Result<NQueens, String> {
        if (1..=20).contains(&n) {
            Ok(NQueens { n })
        } else {
            Err(format!("N-Queens size must be in 1..=20, got {n}"))
        }
    }

    /// The published solution count, when known.
    pub fn published(&self) -> Option<u64> {
        SOLUTIONS.get(self.n as usize - 1).copied()
    }
}

impl Problem for NQueens {
    type Task = Board;
    fn roots(&self) -> Vec<Board> {
        vec![Board { row: 0, columns: 0, left: 0, right: 0 }]
    }

    fn run(&self, board: &Board, pool: &mut Vec<Board>, counts: &mut Counts) {
        counts.nodes += 1;
        counts.max_depth = counts.max_depth.max(board.row);
        if board.row == self.n {
            counts.leaves += 1;
            return;
        }
        let all = (1u32 << self.n) - 1;
        let mut free = all & !(board.columns | board.left | board.right);
        while free != 0 {
            let bit = free & free.wrapping_neg();
            free &= free - 1;
            pool.push(Board {
                row: board.row + 1,
                columns: board.columns | bit,
                left: ((board.left | bit) << 1) & all,
                right: (board.right | bit) >> 1,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::solve_sequential;

    #[test]
    fn solution_counts_match_the_published_ones() {
        for n in 1..=10u32 {
            let counts = solve_sequential(&NQueens::new(n).unwrap());
            assert_eq!(Some(counts.leaves), NQueens::new(n).unwrap().published(), "N = {n}");
        }
        assert!(NQueens::new(0).is_err() && NQueens::new(21).is_err());
    }

    #[test]
    fn boards_round_trip_through_the_codec() {
        let board = Board { row: 3, columns: 0b1011, left: 7, right: 1 << 19 };
        assert_eq!(ftkv::codec::decode::<Board>(&ftkv::codec::encode(&board)), Some(board));
    }
}
