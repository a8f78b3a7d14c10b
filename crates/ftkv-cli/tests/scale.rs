//! `ftkv demo` at a real node's size: 64 ranks on one host, and 32 ranks over 4 simulated
//! hosts, localized recovery (the library's reserve holders, values in extents past the slots'
//! inline capacity), ranks SIGKILLed from outside by PID: the published counts, and no rank
//! falls back to a global recovery on one host.

use std::process::Command;
use std::time::Duration;

use ftkv_cli::launch::output_within;

const FTKV: &str = env!("CARGO_BIN_EXE_ftkv");

/// Runs `ftkv demo` on T1 with `args` and `kills` random SIGKILLs; its stdout, once it printed
/// the published counts with MATCH and made that many kills.
fn t1_demo(kills: usize, args: &[&str]) -> String {
    let mut cmd = Command::new(FTKV);
    cmd.env("FTKV_MAX_RANKS", "256")
        .args(["demo", "--recovery", "localized", "--kills", &kills.to_string()])
        .args(["--timeout", "240"])
        .args(args);
    let _alone = ftkv_cli::launch::job_slot();
    let out = output_within(cmd, Duration::from_secs(300)).expect("the demo ends in time");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("4130071 nodes, 3305118 leaves"), "{stdout}");
    assert!(stdout.contains("MATCH") && !stdout.contains("MISMATCH"), "{stdout}");
    assert_eq!(stderr.matches("SIGKILL rank").count(), kills, "{kills} kills:\n{stderr}");
    stdout
}

#[test]
fn t1_on_64_ranks_of_one_host_is_exact_after_two_kills_without_a_global_recovery() {
    let stdout = t1_demo(2, &["-n", "64", "--seed", "3"]);
    assert!(stdout.contains("global recoveries: 0"), "{stdout}");
}

#[test]
fn t1_on_32_ranks_over_4_simulated_hosts_is_exact_after_two_kills() {
    t1_demo(2, &["-n", "32", "--nodes", "4", "--seed", "3"]);
}
