//! Fibonacci as independent tasks: running `fib(n)` for `n ≥ 2` creates `fib(n − 1)` and
//! `fib(n − 2)`; a `fib(1)` is a leaf worth one and a `fib(0)` a leaf worth nothing, so the
//! computation of `fib(N)` counts `F(N)` leaves ([`Counts::leaves`]) among `2·F(N+1) − 1`
//! nodes. The pool runs it as dynamic independent tasks whose counts add up.

use crate::problem::Problem;
use crate::uts::Counts;

/// The largest `N`: `2·F(N+1) − 1` nodes still fit a `u64` well before this, and a larger
/// tree would not end in a lifetime.
pub const MAX_N: u32 = 80;

/// The computation of `fib(n)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fib {
    pub n: u32,
}

/// One call `fib(n)` at `depth` calls below the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Call {
    pub n: u32,
    pub depth: u32,
}

impl Fib {
    pub fn new(n: u32) -> Result<Fib, String> {
        if n <= MAX_N {
            Ok(Fib { n })
        } else {
            Err(format!("fib:N needs N in 0..={MAX_N}, got {n}"))
        }
    }

    /// The counts the whole computation must reach: `2·F(N+1) − 1` nodes, `F(N)` leaves.
    pub fn expected(&self) -> (u64, u64) {
        (2 * value(self.n + 1) - 1, value(self.n))
    }
}

/// `F(n)` (`F(0) = 0`, `F(1) = 1`), computed iteratively.
pub fn value(n: u32) -> u64 {
    let (mut a, mut b) = (0u64, 1u64);
    for _ in 0..n {
        (a, b) = (b, a + b);
    }
    a
}

impl Problem for Fib {
    type Task = Call;

    fn roots(&self) -> Vec<Call> {
        vec![Call { n: self.n, depth: 0 }]
    }

    fn run(&self, call: &Call, pool: &mut Vec<Call>, counts: &mut Counts) {
        counts.nodes += 1;
        counts.max_depth = counts.max_depth.max(call.depth);
        match call.n {
            0 => {}
            1 => counts.leaves += 1,
            n => {
                pool.push(Call { n: n - 2, depth: call.depth + 1 });
                pool.push(Call { n: n - 1, depth: call.depth + 1 });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::solve_sequential;

    #[test]
    fn the_sequential_counts_are_the_closed_forms() {
        for n in 0..=25u32 {
            let counts = solve_sequential(&Fib::new(n).unwrap());
            assert_eq!((counts.nodes, counts.leaves), Fib::new(n).unwrap().expected(), "N = {n}");
            assert_eq!(counts.max_depth, n.saturating_sub(1), "N = {n}");
        }
        assert_eq!(value(30), 832_040);
        assert_eq!(Fib::new(30).unwrap().expected(), (2_692_537, 832_040));
        assert_eq!(value(MAX_N), 23_416_728_348_467_685);
        assert!(Fib::new(MAX_N + 1).is_err());
    }

    #[test]
    fn calls_round_trip_through_the_codec() {
        let call = Call { n: 17, depth: 4 };
        assert_eq!(ftkv::codec::decode::<Call>(&ftkv::codec::encode(&call)), Some(call));
    }
}
