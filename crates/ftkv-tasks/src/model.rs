//! The task models the pool runs a tree problem in: dynamic independent tasks (DIT), nested
//! fork-join (NFJ) and future-based cooperation (FBC) ([`crate::forkjoin`]).

use ftkv::fabric::Fabric;

use crate::forkjoin::{ForkJoin, Futures};
use crate::pool::{self, Outcome, PoolConfig, PoolError};
use crate::problem::{solve_sequential, Problem};
use crate::uts::Counts;

/// A task model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Model {
    /// Dynamic independent tasks: every task adds its counts to its worker's partial result.
    #[default]
    Dit,
    /// Nested fork-join: every task returns its subtree's counts to its parent's frame; a
    /// stolen subtree's by message.
    Nfj,
    /// Future-based cooperation: every task is a future its parent awaits; a stolen future's
    /// value is written into its awaiting frame's holder's futures entry by the thief, under
    /// the holder's lock.
    Fbc,
}

impl Model {
    pub const ALL: [Model; 3] = [Model::Dit, Model::Nfj, Model::Fbc];

    /// `dit`, `nfj` or `fbc`.
    pub fn name(self) -> &'static str {
        match self {
            Model::Dit => "dit",
            Model::Nfj => "nfj",
            Model::Fbc => "fbc",
        }
    }

    pub fn parse(text: &str) -> Result<Model, String> {
        Model::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(text.trim()))
            .ok_or_else(|| format!("unknown task model {text:?} (dit, nfj or fbc)"))
    }

    /// Runs `problem` in this model on the pool (collective over `world`; see [`pool::run`]).
    pub fn run<P: Problem, F: Fabric>(
        self,
        world: &F,
        problem: P,
        config: &PoolConfig,
    ) -> Result<Outcome, PoolError> {
        match self {
            Model::Dit => pool::run(world, &problem, config),
            Model::Nfj => pool::run(world, &ForkJoin { inner: problem }, config),
            Model::Fbc => pool::run(world, &Futures { inner: problem }, config),
        }
    }

    /// `problem`'s result computed on this thread by the model's sequential program.
    pub fn sequential<P: Problem>(self, problem: P) -> Counts {
        match self {
            Model::Dit => solve_sequential(&problem),
            Model::Nfj => solve_sequential(&ForkJoin { inner: problem }),
            Model::Fbc => solve_sequential(&Futures { inner: problem }),
        }
    }
}
