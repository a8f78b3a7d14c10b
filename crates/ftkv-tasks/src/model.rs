//! The task models the pool runs a tree problem in: dynamic independent tasks (DIT), nested
//! fork-join (NFJ, [`crate::forkjoin`]).

use ftkv::fabric::Fabric;

use crate::forkjoin::ForkJoin;
use crate::pool::{self, Outcome, PoolConfig, PoolError};
use crate::problem::{solve_sequential, Problem};
use crate::uts::Counts;

/// A task model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Model {
    /// Dynamic independent tasks: every task adds its counts to its worker's partial result.
    #[default]
    Dit,
    /// Nested fork-join: every task returns its subtree's counts to its parent's frame.
    Nfj,
}

impl Model {
    pub const ALL: [Model; 2] = [Model::Dit, Model::Nfj];

    /// `dit` or `nfj`.
    pub fn name(self) -> &'static str {
        match self {
            Model::Dit => "dit",
            Model::Nfj => "nfj",
        }
    }

    pub fn parse(text: &str) -> Result<Model, String> {
        Model::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(text.trim()))
            .ok_or_else(|| format!("unknown task model {text:?} (dit or nfj)"))
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
        }
    }

    /// `problem`'s result computed on this thread by the model's sequential program.
    pub fn sequential<P: Problem>(self, problem: P) -> Counts {
        match self {
            Model::Dit => solve_sequential(&problem),
            Model::Nfj => solve_sequential(&ForkJoin { inner: problem }),
        }
    }
}
