//! `ftkv probe` on the cases whose Open MPI behaviour ftkv's design rests on.

use std::process::Command;
use std::time::Duration;

use ftkv_cli::launch::output_within;
use serde_json::Value;

/// Every selected case runs in its own bounded job (the daemon's death once per PRRTE option
/// set, several seconds each); this bounds the whole command.
const PROBE_BOUND: Duration = Duration::from_secs(240);

/// Window, call (with `:<options>` for a runtime case), failure knowledge, outcome, and the
/// detail of an abort or of a runtime case's outcome.
type Row = (String, String, String, String, String);

fn probe(cases: &[&str]) -> Vec<Row> {
    let json = std::env::temp_dir().join(format!("ftkv-probe-test-{}.json", std::process::id()));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ftkv"));
    cmd.args(["probe", "--hang-after", "2", "--json"]).arg(&json);
    for case in cases {
        cmd.args(["--case", case]);
    }
    let out = output_within(cmd, PROBE_BOUND).expect("ftkv probe ends in time");
    assert!(out.status.success(), "probe failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&json).expect("probe wrote its JSON");
    std::fs::remove_file(&json).expect("remove the JSON");
    let rows: Vec<Value> = serde_json::from_str(&text).expect("valid JSON");
    rows.iter()
        .map(|r| {
            let field = |k: &str| r[k].as_str().expect("string field").to_owned();
            let detail = r["detail"].as_str().unwrap_or_default().to_owned();
            let call = match r["options"].as_str() {
                Some(options) => format!("{}:{options}", field("call")),
                None => field("call"),
            };
            (field("window"), call, field("failure"), field("outcome"), detail)
        })
        .collect()
}

#[test]
fn probe_reports_the_behaviour_the_design_rests_on() {
    let cases = [
        "allocate:put:known",
        "allocate:flush:known",
        "fence:known",
        "allocate:lock_exclusive_held:known",
        "create_dynamic:flush:known",
        "two_sided:eager_send",
        "two_sided:large_send:known",
        "two_sided:ssend:unknown",
        "two_sided:recv:unknown",
        "daemon_death",
    ];
    let rows = probe(&cases);
    let want = [
        ("allocate", "put", "known", "ok"),
        ("allocate", "flush", "known", "ok"),
        ("allocate", "fence", "known", "proc_failed"),
        ("create_dynamic", "fence", "known", "proc_failed"),
        ("allocate", "lock_exclusive_held", "known", "hang"),
        ("create_dynamic", "flush", "known", "hang"),
        ("two_sided", "eager_send", "unknown", "ok"),
        ("two_sided", "eager_send", "known", "proc_failed"),
        ("two_sided", "large_send", "known", "proc_failed"),
        ("two_sided", "ssend", "unknown", "proc_failed"),
        ("two_sided", "recv", "unknown", "proc_failed"),
        ("runtime", "daemon_death:shipped", "known", "job_terminated"),
        ("runtime", "daemon_death:recoverable_mca", "known", "job_terminated"),
        ("runtime", "daemon_death:continuous", "known", "job_terminated"),
        ("runtime", "daemon_death:autorestart", "known", "rejected_option"),
        ("runtime", "daemon_death:autorestart_mca", "known", "job_terminated"),
        ("runtime", "daemon_death:enable_recovery", "known", "job_terminated"),
        ("runtime", "daemon_death:errmgr_prted", "known", "rejected_option"),
    ];
    assert_eq!(rows.len(), want.len(), "one row per selected case: {rows:?}");
    for (window, call, failure, outcome) in want {
        let row = rows.iter().find(|(w, c, f, _, _)| w == window && c == call && f == failure);
        let got = row.map(|(_, _, _, o, _)| o.as_str());
        assert_eq!(got, Some(outcome), "{window}:{call}:{failure} in {rows:?}");
    }
    let lost = rows.iter().filter(|r| r.3 == "job_terminated");
    for (_, call, _, _, detail) in lost {
        assert!(detail.contains("lost communication with a remote daemon"), "{call}: {detail}");
    }
}

#[test]
fn probe_rejects_unknown_cases() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ftkv"));
    cmd.args(["probe", "--case", "allocate:teleport"]);
    let out = output_within(cmd, PROBE_BOUND).expect("ftkv ends in time");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no probe case matches"));
}
