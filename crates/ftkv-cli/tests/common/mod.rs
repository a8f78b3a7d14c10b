//! Helpers shared by the real-MPI tests: jobs of the `ftkv-mpitest` rank program with a hard
//! timeout, on the transport `FTKV_TEST_BTL` selects.

use std::time::Duration;

use ftkv_cli::launch::{JobOutput, Launch};

const TEST_PROGRAM: &str = env!("CARGO_BIN_EXE_ftkv-mpitest");

/// A job of `ranks` ranks running `ftkv-mpitest <case>`, killed after `timeout`.
pub fn job(case: &str, ranks: usize, timeout: Duration) -> Launch {
    Launch::new(TEST_PROGRAM, ranks).args([case]).timeout(timeout).transport_from_env()
}

/// Runs the job and fails the test if it hung.
pub fn run(launch: Launch) -> JobOutput {
    let out = launch.run().expect("mpirun starts");
    assert!(!out.timed_out, "job hung:\n{}", out.transcript());
    out
}
