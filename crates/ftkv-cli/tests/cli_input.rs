//! The `ftkv` command line: values it cannot run with are refused with a message that names
//! them, without a panic and before anything is launched; every option of every visible
//! subcommand has a help text.
//!
//! No test here starts MPI: `FTKV_MPIRUN` points to a file that does not exist, so a check that
//! failed to refuse would end in "cannot start ..." instead of launching ranks, and each test
//! asserts that this text is absent.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use ftkv_cli::launch::output_within;

const FTKV: &str = env!("CARGO_BIN_EXE_ftkv");

/// Where the `mpirun` of every command run here is said to be: nowhere.
const NO_MPIRUN: &str = "/nonexistent/ftkv-cli-input-test/mpirun";

/// How long a refusal may take: parsing arguments takes milliseconds, even on a loaded machine.
const FAST: Duration = Duration::from_secs(2);

/// The hard bound on every command, after which it is killed and the test fails.
const BOUND: Duration = Duration::from_secs(30);

/// `cmd` with an environment that makes it a launcher (not a rank), with the default rank
/// limit and with `mpirun` nowhere.
fn isolated(mut cmd: Command) -> Command {
    cmd.env("FTKV_MPIRUN", NO_MPIRUN)
        .env_remove("FTKV_MAX_RANKS")
        .env_remove("OMPI_COMM_WORLD_SIZE")
        .env_remove("OMPI_COMM_WORLD_RANK");
    cmd
}

fn ftkv(args: &str) -> Command {
    let mut cmd = Command::new(FTKV);
    cmd.args(args.split_whitespace());
    isolated(cmd)
}

fn run(cmd: Command) -> (Output, Duration) {
    let start = Instant::now();
    let out = output_within(cmd, BOUND).expect("ftkv ends within the bound");
    (out, start.elapsed())
}

/// Runs `cmd` and asserts that it failed fast, without a panic or a launch, saying `expected`.
fn assert_refused(cmd: Command, expected: &str) {
    let what = format!("{cmd:?}");
    let (out, elapsed) = run(cmd);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{what} succeeded:\n{stderr}");
    assert!(stderr.contains(expected), "{what}: expected {expected:?} in:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{what} panicked:\n{stderr}");
    assert!(!stderr.contains(NO_MPIRUN), "{what} tried to launch mpirun:\n{stderr}");
    assert!(elapsed < FAST, "{what} took {elapsed:?}: did it launch something?");
}

fn assert_all_refused(table: &[(&str, &str)]) {
    for &(args, expected) in table {
        assert_refused(ftkv(args), expected);
    }
}

const SECONDS: &str = "must be a number of seconds from 0.001 to 86400 (one day)";

#[test]
fn seconds_must_be_positive_finite_and_at_most_a_day() {
    assert_all_refused(&[
        ("demo --timeout inf", "invalid value 'inf' for '--timeout <SECS>'"),
        ("demo --timeout nan", SECONDS),
        ("demo --timeout 0", SECONDS),
        ("demo --timeout -5", SECONDS),
        ("demo --timeout 1e9", SECONDS),
        ("bench uts --timeout inf", SECONDS),
        ("chaos --duration inf", "invalid value 'inf' for '--duration <SECS>'"),
        ("chaos --duration nan", SECONDS),
        ("chaos --duration 0", SECONDS),
        ("probe --hang-after inf", "invalid value 'inf' for '--hang-after <SECS>'"),
        ("probe --hang-after -1", SECONDS),
    ]);
}

#[test]
fn negative_and_zero_counts_name_the_option_and_its_bound() {
    assert_all_refused(&[
        ("demo -n -3", "invalid value '-3' for '--ranks <RANKS>': must be a whole number ≥ 1"),
        ("chaos --runs -3", "invalid value '-3' for '--runs <RUNS>': must be a whole number ≥ 1"),
        ("chaos --runs 0", "invalid value '0' for '--runs <RUNS>': must be a whole number ≥ 1"),
        ("demo --kills -1", "invalid value '-1' for '--kills <KILLS>': must be a whole number ≥ 0"),
        ("chaos --kills -1", "'--kills <KILLS>': must be a whole number ≥ 0"),
        ("chaos --ranks -6", "'--ranks <RANKS>': must be a whole number ≥ 1"),
        ("demo --copies 0", "'--copies <COPIES>': must be a whole number ≥ 1"),
        ("demo --seed -1", "'--seed <SEED>': must be a whole number ≥ 0"),
        ("ping --count 0", "'--count <COUNT>': must be a whole number ≥ 1"),
        ("ping --count -2", "'--count <COUNT>': must be a whole number ≥ 1"),
        ("ping -n -1", "'--ranks <RANKS>': must be a whole number ≥ 1"),
        ("bench put --iterations 0", "'--iterations <ITERATIONS>': must be a whole number ≥ 1"),
        ("bench put --sizes -1", "'--sizes <SIZES>': must be a whole number ≥ 1"),
        ("bench detect -n -4", "'--ranks <RANKS>': must be a whole number ≥ 1"),
        ("bench uts --repeat 0", "'--repeat <REPEAT>': must be a whole number ≥ 1"),
        ("bench store --millis 0", "'--millis <MILLIS>': must be a whole number ≥ 1"),
        ("bench store --writers 2,0", "'--writers <WRITERS>': must be a whole number ≥ 1"),
        ("bench growth --ranks -2", "'--ranks <RANKS>': must be a whole number ≥ 1"),
        ("bench growth --stored 0", "'--stored <STORED>': must be a whole number ≥ 1"),
        ("bench recovery --sizes 0", "'--sizes <SIZES>': must be a whole number ≥ 1"),
        ("demo --interval -5", "interval \"-5\""),
    ]);
}

/// The limit this machine gets without `FTKV_MAX_RANKS`.
fn limit_text() -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("exceeds the limit of {} ranks (8 per core, {cores} cores)", 8 * cores)
}

#[test]
fn jobs_beyond_the_rank_limit_are_refused() {
    let table = [
        ("demo -n 1000000", "--ranks"),
        ("bench uts -n 1000000", "--ranks"),
        ("ping -n 1000000", "--ranks"),
        ("bench put -n 1000000", "--ranks"),
        ("bench detect -n 1000000", "--ranks"),
        ("chaos --ranks 1000000", "--ranks"),
        ("bench recovery --ranks 4,1000000", "--ranks"),
        ("bench growth --ranks 2,1000000", "--ranks"),
        ("bench store --writers 2,1000000", "--writers"),
    ];
    for (args, flag) in table {
        assert_refused(ftkv(args), &format!("{flag} 1000000 {}", limit_text()));
        assert_refused(ftkv(args), "; set FTKV_MAX_RANKS=1000000 to allow it");
    }
}

#[test]
fn bench_growth_default_sizes_fit_the_limit_of_two_cores() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores >= 2 {
        let refused = "--ranks 1 is too few: bench growth needs at least 2 ranks";
        assert_refused(ftkv("bench growth --ranks 2,4,8,16,1"), refused);
    }
}

#[test]
fn ftkv_max_ranks_overrides_the_limit_and_must_be_a_number() {
    let mut raised = ftkv("demo -n 1000000 --copies 1000000");
    raised.env("FTKV_MAX_RANKS", "1000000");
    assert_refused(raised, "--copies 1000000 must be less than --ranks 1000000:");
    for bad in ["lots", "0", "-1"] {
        let mut cmd = ftkv("demo");
        cmd.env("FTKV_MAX_RANKS", bad);
        assert_refused(cmd, &format!("FTKV_MAX_RANKS must be a whole number ≥ 1, got \"{bad}\""));
    }
}

#[test]
fn inconsistent_values_name_the_values_in_effect() {
    assert_all_refused(&[
        ("demo -n 2", "--copies 3 (the default) must be less than --ranks 2:"),
        ("demo --copies 8", "--copies 8 must be less than --ranks 8 (the default):"),
        ("demo --kills 7", "--kills 7 must leave at least 2 of --ranks 8 (the default) alive"),
        ("demo -n 4 --copies 2 --kills 3", "--kills 3 must leave at least 2 of --ranks 4 alive"),
        ("bench uts -n 3", "--copies 3 (the default) must be less than --ranks 3:"),
        ("chaos --ranks 2", "--copies 2 (the default) must be less than --ranks 2:"),
        ("chaos --copies 6", "--copies 6 must be less than --ranks 6 (the default):"),
        ("chaos --kills 5", "--kills 5 must leave at least 2 of --ranks 6 (the default) alive"),
        ("bench put -n 2", "--copies 3 (the default) must be less than --ranks 2:"),
        ("bench put --copies 4", "--copies 4 must be less than --ranks 4 (the default):"),
        ("ping -n 1", "--ranks 1 is too few: ping (rank 0 and a peer) needs at least 2 ranks"),
        ("bench detect -n 1", "--ranks 1 is too few: bench detect"),
        ("bench recovery --ranks 4,2", "--ranks 2 is too few: bench recovery"),
        ("bench growth --ranks 1", "--ranks 1 is too few: bench growth"),
    ]);
}

/// `args` run from a directory deleted after `cd`-ing into it.
fn from_deleted_dir(args: &str, index: usize) -> Command {
    let dir = std::env::temp_dir().join(format!("ftkv-cli-gone-{}-{index}", std::process::id()));
    std::fs::create_dir(&dir).expect("create the directory to delete");
    let mut cmd = Command::new("sh");
    let script = r#"cd "$1" && rmdir "$1" && shift && exec "$0" "$@""#;
    cmd.args(["-c", script, FTKV]).arg(&dir).args(args.split_whitespace());
    isolated(cmd)
}

#[test]
fn a_deleted_working_directory_is_refused_before_any_launch() {
    let launching = [
        "demo",
        "probe",
        "ping",
        "chaos",
        "bench put",
        "bench detect",
        "bench store",
        "bench recovery",
        "bench growth",
        "bench uts",
    ];
    for (index, args) in launching.into_iter().enumerate() {
        let expected = "the current directory no longer exists";
        assert_refused(from_deleted_dir(args, index), expected);
    }
}

fn help(path: &[&str], flag: &str) -> String {
    let mut cmd = isolated(Command::new(FTKV));
    cmd.args(path).arg(flag);
    let (out, _) = run(cmd);
    assert!(out.status.success(), "ftkv {path:?} {flag} failed");
    String::from_utf8(out.stdout).expect("UTF-8 help")
}

/// The `Commands:` section of a help text: (name, summary), clap's own `help` left out.
fn subcommands(help: &str) -> Vec<(String, String)> {
    help.lines()
        .skip_while(|line| *line != "Commands:")
        .skip(1)
        .take_while(|line| !line.is_empty())
        .filter_map(|line| line.trim().split_once(' '))
        .map(|(name, summary)| (name.to_string(), summary.trim().to_string()))
        .filter(|(name, _)| name != "help")
        .collect()
}

/// The options and arguments of a help text that have no description: clap shows an option as
/// `  -x, --foo <FOO>  text` (short help) or with the text on the next, deeper indented line
/// (long help), and adds `[default: ...]` also where there is no text.
fn undocumented(help: &str) -> Vec<String> {
    let lines: Vec<&str> = help.lines().collect();
    let mut missing = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if !(1..=6).contains(&indent) || !(trimmed.starts_with('-') || trimmed.starts_with('<')) {
            continue;
        }
        let same_line = trimmed.split_once("  ").map_or("", |(_, text)| text);
        let next_line = lines.get(i + 1).filter(|next| {
            let next_indent = next.len() - next.trim_start().len();
            next_indent > indent && !next.trim().is_empty()
        });
        let text = if same_line.trim().is_empty() {
            next_line.map_or("", |l| l.trim())
        } else {
            same_line
        };
        if without_clap_notes(text).is_empty() {
            missing.push(trimmed.split("  ").next().unwrap_or(trimmed).to_string());
        }
    }
    missing
}

/// A description without the notes clap appends (`[default: 10]`, `[possible values: ...]`).
fn without_clap_notes(text: &str) -> &str {
    let notes = ["[default:", "[possible values:", "[aliases:", "[env:"];
    let end = notes.iter().filter_map(|n| text.find(n)).min().unwrap_or(text.len());
    text[..end].trim()
}

#[test]
fn the_help_parser_finds_options_without_description() {
    let short = "Options:\n      --runs <RUNS>      [default: 10]\n  -n, --ranks <N>  Ranks [default: 4]\n  -h, --help  Print help\n";
    assert_eq!(undocumented(short), ["--runs <RUNS>"]);
    let long = "Options:\n      --json <FILE>\n          Also write JSON\n\n      --hang-after <SECS>\n          [default: 5]\n\n  -h, --help\n          Print help\n";
    assert_eq!(undocumented(long), ["--hang-after <SECS>"]);
}

/// Every visible subcommand path below `path`, `path` included.
fn visible_paths(path: Vec<String>) -> Vec<Vec<String>> {
    let args: Vec<&str> = path.iter().map(String::as_str).collect();
    let children = subcommands(&help(&args, "--help"));
    let mut paths = vec![path.clone()];
    for (name, _) in children {
        let mut child = path.clone();
        child.push(name);
        paths.extend(visible_paths(child));
    }
    paths
}

#[test]
fn every_option_of_every_visible_subcommand_has_a_description() {
    let paths = visible_paths(Vec::new());
    assert!(paths.len() >= 12, "too few subcommands found: {paths:?}");
    for path in paths {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        for flag in ["-h", "--help"] {
            let missing = undocumented(&help(&args, flag));
            assert!(
                missing.is_empty(),
                "ftkv {} {flag}: no description for {missing:?}",
                path.join(" ")
            );
        }
    }
}

#[test]
fn the_bench_summary_names_exactly_its_subcommands() {
    let top = subcommands(&help(&[], "--help"));
    let (_, summary) = top.iter().find(|(name, _)| name == "bench").expect("a bench subcommand");
    let list = summary.strip_prefix("Benchmarks: ").expect("the summary lists the benchmarks");
    let list = list.trim_end_matches('.').replace(" and ", ", ");
    let mut named: Vec<&str> = list.split(", ").collect();
    let mut existing: Vec<String> =
        subcommands(&help(&["bench"], "--help")).into_iter().map(|(name, _)| name).collect();
    named.sort_unstable();
    existing.sort_unstable();
    assert_eq!(named, existing, "the bench summary: {summary:?}");
}

/// `ftkv sim` needs no MPI: it runs the seeded store and pool simulations (the pool with global
/// and with localized recovery, in its three task models), prints the summary line, and the
/// same arguments give the same digest.
#[test]
fn sim_runs_without_mpi_and_replays_its_digest() {
    let summary = |args: &str, runs: u64| {
        let out = output_within(ftkv(&format!("sim {args}")), BOUND).unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = stdout.lines().last().expect("a summary line").to_owned();
        assert!(line.starts_with(&format!("runs={runs} violations=0 digest=")), "{line}");
        line.split_whitespace().nth(2).expect("the digest").to_owned()
    };
    // All six models: the store's recovery, and the store, its transactions and the pool
    // driver (independent tasks, fork-join, futures) on the deterministic world.
    assert_eq!(summary("--runs 100 --seed 5", 600), summary("--runs 100 --seed 5", 600));
    assert_ne!(summary("--runs 100 --seed 5", 600), summary("--runs 100 --seed 6", 600));
    let pool = summary("--runs 300 --seed 5 --model pool-world", 300);
    assert_eq!(pool, summary("--runs 300 --seed 5 --model pool-world", 300));
    assert_ne!(pool, summary("--runs 300 --seed 5 --model store", 300));
    let futures = summary("--runs 100 --seed 5 --model fbc-world", 100);
    assert_eq!(futures, summary("--runs 100 --seed 5 --model fbc-world", 100));
    assert_ne!(futures, summary("--runs 100 --seed 5 --model nfj-world", 100));
    let out = output_within(ftkv("sim --runs 0"), BOUND).unwrap();
    assert!(!out.status.success(), "0 runs is refused");
}
