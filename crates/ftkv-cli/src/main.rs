//! The `ftkv` command.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use ftkv::Recovery;
use ftkv_cli::args::{self, Opt};
use ftkv_cli::{bench_store, chaos, env, launch, probe, rank_failure, tasks};
use ftkv_tasks::model::Model;

#[derive(Parser)]
#[command(
    name = "ftkv",
    version,
    about = "ftkv: a resilient in-memory key-value store on MPI RMA and ULFM"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    hosts: HostArgs,
}

/// Where the ranks of the jobs ftkv launches run.
#[derive(clap::Args)]
struct HostArgs {
    /// Run the ranks over N hosts simulated on this machine (network namespaces, a daemon per
    /// host, TCP between them; needs root): the way to test multi-host behaviour on one machine.
    #[arg(long, global = true, value_name = "N", value_parser = args::at_least(1usize))]
    #[arg(allow_negative_numbers = true)]
    nodes: Option<usize>,
    /// A real cluster's hostfile for mpirun; ranks follow its slots.
    #[arg(long, global = true, value_name = "FILE", conflicts_with = "nodes")]
    hostfile: Option<PathBuf>,
    /// mpirun's --map-by (default: by slot).
    #[arg(long, global = true, value_name = "SPEC")]
    map_by: Option<String>,
}

impl HostArgs {
    /// Hands the choice to the launcher (and to jobs this process starts) by environment.
    fn export(&self) {
        if let Some(nodes) = self.nodes {
            std::env::set_var(ftkv_cli::cluster::NODES_VAR, nodes.to_string());
        }
        if let Some(file) = &self.hostfile {
            std::env::set_var(ftkv_cli::cluster::HOSTFILE_VAR, file);
        }
        if let Some(spec) = &self.map_by {
            std::env::set_var(ftkv_cli::cluster::MAP_BY_VAR, spec);
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// The main job: UTS on a work-stealing pool that checkpoints into ftkv, with workers
    /// SIGKILLed at random moments; prints progress, the result and whether it equals the
    /// published count, recovery times and checkpoint traffic.
    Demo {
        #[command(flatten)]
        pool: PoolArgs,
        /// Workers to SIGKILL at random moments.
        #[arg(long, default_value_t = DEMO_KILLS, value_parser = args::at_least(0usize))]
        #[arg(allow_negative_numbers = true)]
        kills: usize,
        /// SIGSTOP one random worker at a random moment (10–50% of the work) for SECS seconds,
        /// then SIGCONT it: past the suspicion bound the others declare it failed, end its
        /// process and finish without it (with FTKV_END_DECLARED=0 it ends itself once resumed).
        #[arg(long, value_parser = args::seconds, value_name = "SECS")]
        #[arg(allow_negative_numbers = true)]
        stop: Option<Duration>,
        /// With --stop: SIGSTOP every worker on the chosen one's simulated host at once (a
        /// frozen host; needs --nodes 2 or more).
        #[arg(long, requires = "stop")]
        stop_host: bool,
        /// The suspicion bound: a worker silent this long is declared failed (Open MPI's
        /// heartbeat detector, always on), and a worker that did not run for half of it ends
        /// itself [default: Open MPI's `mpi_ft_detector_timeout` from the environment, else 10].
        #[arg(long, value_parser = args::seconds, value_name = "SECS")]
        #[arg(allow_negative_numbers = true)]
        suspicion: Option<Duration>,
        /// Also write the report as JSON.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
    },
    /// The rank side of `ftkv bench recovery`.
    #[command(hide = true)]
    BenchRecoveryRank {
        bytes: usize,
        #[arg(long)]
        localized: bool,
        /// Localized rows: one put every this many µs.
        #[arg(long, default_value_t = ftkv_cli::bench_recovery::FLAT_OUT_PACE_US)]
        pace_us: u64,
    },
    /// The rank side of `ftkv bench growth`.
    #[command(hide = true)]
    BenchGrowthRank { copies: usize, stored: usize, millis: u64 },
    /// The rank side of `ftkv bench scale`.
    #[command(hide = true)]
    BenchScaleRank { stored: usize, millis: u64 },
    /// The MPI side of `ftkv bench store` (ftkv and raw RMA writers).
    #[command(hide = true)]
    BenchStoreRank { systems: String, writers: usize, sizes: String, millis: u64, copies: usize },
    /// One pool worker on the ranks of an mpirun job (used by `ftkv demo` and `ftkv bench uts`).
    #[command(hide = true)]
    TasksRank {
        workload: String,
        interval: String,
        copies: usize,
        seed: u64,
        suspicion_ms: u64,
        watchdog_ms: u64,
        #[arg(long)]
        localized: bool,
        #[arg(long, default_value = "dit")]
        model: String,
    },
    /// Which MPI calls report a dead peer: one-sided calls per window kind, and two-sided calls.
    #[command(long_about = PROBE_HELP)]
    Probe {
        /// Also write the outcomes as JSON: [{"window", "call", "outcome"}].
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// Seconds after which a call that has not returned counts as `hang`.
        #[arg(long, default_value = "5", value_parser = args::seconds, value_name = "SECS")]
        #[arg(allow_negative_numbers = true)]
        hang_after: Duration,
        /// Run only these cases: `window:call[:known|unknown]` (e.g. `allocate:put`) or a call.
        #[arg(long = "case", value_name = "CASE")]
        cases: Vec<String>,
    },
    /// Two-sided round-trip times from rank 0 to every other rank (the cost of a ping).
    Ping {
        /// Number of ranks, at least 2 (ftkv starts itself under mpirun when run without it).
        #[arg(short = 'n', long = "ranks", default_value_t = DEFAULT_RANKS)]
        #[arg(value_parser = args::at_least(1usize), allow_negative_numbers = true)]
        ranks: usize,
        /// Round trips per peer.
        #[arg(long, default_value_t = 1000, value_parser = args::at_least(1usize))]
        #[arg(allow_negative_numbers = true)]
        count: usize,
    },
    /// Seeded simulations (no MPI, no threads, virtual time) of the store's recovery protocol
    /// and of the task pool (UTS and N-Queens with kills of victims, thieves, buddies and
    /// recovering workers, stalled puts, slow workers, delayed and reordered messages). Prints
    /// each failing seed and a summary whose digest hashes every run's trace (the same
    /// arguments give the same digest).
    Sim {
        /// Which protocol to simulate.
        #[arg(long, value_enum, default_value_t = SimModel::All)]
        model: SimModel,
        /// Scenarios to run per model.
        #[arg(long, default_value_t = 10_000, value_parser = args::at_least(1u64))]
        #[arg(allow_negative_numbers = true)]
        runs: u64,
        /// Seed of the first scenario; scenario i uses seed + i.
        #[arg(long, default_value_t = 1, value_parser = args::at_least(0u64))]
        #[arg(allow_negative_numbers = true)]
        seed: u64,
        /// Print every step of each run (to replay a failing seed: `--runs 1 --trace`).
        #[arg(long)]
        trace: bool,
        /// `--model scale`: job sizes as workers x hosts (`16384x256` takes about 100 s per
        /// case here).
        #[arg(long, value_delimiter = ',', default_values = ["1024x16", "1024x64"])]
        sizes: Vec<String>,
    },
    /// Randomized SIGKILL campaign against the store, checked against the write history.
    Chaos {
        /// Jobs to run, one after another.
        #[arg(long, default_value_t = 10, value_parser = args::at_least(1usize))]
        #[arg(allow_negative_numbers = true)]
        runs: usize,
        /// Ranks of each job.
        #[arg(long, default_value_t = CHAOS_RANKS, value_parser = args::at_least(1usize))]
        #[arg(allow_negative_numbers = true)]
        ranks: usize,
        /// Copies of every key, held by ranks other than its owner.
        #[arg(long, default_value_t = CHAOS_COPIES, value_parser = args::at_least(1usize))]
        #[arg(allow_negative_numbers = true)]
        copies: usize,
        /// Ranks SIGKILLed per job: the 1st, 3rd, ... at a random moment of the run, the 2nd,
        /// 4th, ... as soon as a survivor reports that it is recovering. Every fault counts
        /// from the moment all ranks created their store (a death inside `MPI_Init` or the
        /// store's creation ends any job).
        #[arg(long, default_value_t = CHAOS_KILLS, value_parser = args::at_least(0usize))]
        #[arg(allow_negative_numbers = true)]
        kills: usize,
        /// Seed of the first job (its victims, kill times and writes); job i uses seed + i.
        #[arg(long, default_value_t = 1, value_parser = args::at_least(0u64))]
        #[arg(allow_negative_numbers = true)]
        seed: u64,
        /// Seconds each run writes before the survivors check.
        #[arg(long, default_value = "2", value_parser = args::seconds, value_name = "SECS")]
        #[arg(allow_negative_numbers = true)]
        duration: Duration,
        /// Cut one simulated host's network link this many seconds into each run's writing (needs
        /// `--nodes 3` or more); its ranks must end, the others finish exact. The link comes
        /// back once they are done.
        #[arg(long, value_parser = args::seconds, value_name = "SECS")]
        cut_link: Option<Duration>,
        /// Limit every simulated host's link to this rate (a `tc` rate such as `200mbit`, with
        /// up to 20 ms of queueing delay; needs `--nodes`).
        #[arg(long, value_name = "RATE")]
        slow_links: Option<String>,
        /// How the ranks' store repairs a failure: `global` (every survivor recovers together)
        /// or `localized` (only the owners of lost copies move them, the others keep writing;
        /// a final global recovery before the last reads). Survivors read every key before
        /// that final recovery too, judged by the same oracle.
        #[arg(long, value_enum, default_value_t = RecoveryArg::Global)]
        recovery: RecoveryArg,
        /// SIGSTOP one random rank this many seconds into each run's writing, for 6 s (twice the 3 s
        /// suspicion bound, with Open MPI's heartbeat detector on), then SIGCONT it: the others
        /// must declare it failed and finish exact, and the stopped rank must end: killed by the
        /// survivors while still stopped, or by itself once resumed.
        #[arg(long, value_parser = args::seconds, value_name = "SECS")]
        stop: Option<Duration>,
        /// SIGKILL every rank of one simulated host at once at a random moment (needs `--nodes`
        /// 2 or more; `--map-by` places the ranks): a host whose loss leaves the others the
        /// store's quorum. With 2 copies no key may be lost.
        #[arg(long)]
        kill_host: bool,
        /// Write the whole transcript of every failed run into this directory.
        #[arg(long, value_name = "DIR")]
        transcripts: Option<PathBuf>,
        /// Write the summary as JSON.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
    },
    /// Benchmarks: put, detect, store, recovery, growth, scale and uts.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// One chaos run on the ranks of an mpirun job (used by `ftkv chaos`).
    #[command(hide = true)]
    ChaosRank {
        copies: usize,
        millis: u64,
        seed: u64,
        /// The store's watchdog bound for one data-path call, in milliseconds.
        #[arg(long, default_value_t = 2000)]
        watchdog_ms: u64,
        /// Localized recovery instead of global.
        #[arg(long)]
        localized: bool,
        /// The store's suspicion bound in milliseconds (the heartbeat detector's timeout).
        #[arg(long)]
        suspicion_ms: Option<u64>,
    },
    /// One probe case on the ranks of an mpirun job (used by `ftkv probe`).
    #[command(hide = true)]
    ProbeCase {
        window: String,
        call: String,
        failure: String,
        #[arg(long, default_value = "5", value_parser = args::seconds)]
        hang_after: Duration,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Put latency: raw MPI RMA vs ftkv (bitmap detection) vs ftkv (ping before every put).
    Put {
        /// Number of ranks (ftkv starts itself under mpirun when run without it).
        #[arg(short = 'n', long = "ranks", default_value_t = DEFAULT_RANKS)]
        #[arg(value_parser = args::at_least(1usize), allow_negative_numbers = true)]
        ranks: usize,
        /// Copies of every value, held by ranks other than the writer.
        #[arg(long, default_value_t = PUT_COPIES, value_parser = args::at_least(1usize))]
        #[arg(allow_negative_numbers = true)]
        copies: usize,
        /// Value sizes in bytes.
        #[arg(long, value_delimiter = ',', default_values_t = [1024usize, 1 << 20])]
        #[arg(value_parser = args::at_least(1usize), allow_negative_numbers = true)]
        sizes: Vec<usize>,
        /// Puts per size and mode; rank 0 reports the p50, p99 and mean of its own.
        #[arg(long, default_value_t = 2000, value_parser = args::at_least(1usize))]
        #[arg(allow_negative_numbers = true)]
        iterations: usize,
        /// Results file (JSON: rows and ftkv's p50 over raw RMA and over two-sided); the plot of
        /// every mode's p50 against size goes beside it (same name, `.svg`).
        #[arg(long, default_value = "results/bench_put.json", value_name = "FILE")]
        out: PathBuf,
    },
    /// Milliseconds from a SIGKILL to the first survivor's alarm.
    Detect {
        /// Number of ranks, at least 2: the last one is killed, rank 0 measures.
        #[arg(short = 'n', long = "ranks", default_value_t = DEFAULT_RANKS)]
        #[arg(value_parser = args::at_least(1usize), allow_negative_numbers = true)]
        ranks: usize,
    },
    /// The checkpoint workload on ftkv, raw MPI RMA, Redis (SET + WAIT 2) and etcd, 3 copies
    /// each, side by side: table, ratios, results/bench_store.json and SVG plots.
    Store {
        /// Systems to measure.
        #[arg(long, value_delimiter = ',', default_value = "ftkv,raw_rma,redis,etcd")]
        systems: Vec<String>,
        /// Writer counts (ranks, or client threads for Redis and etcd).
        #[arg(long, value_delimiter = ',', default_values_t = [2usize, 4])]
        #[arg(value_parser = args::at_least(1usize), allow_negative_numbers = true)]
        writers: Vec<usize>,
        /// Value sizes in bytes.
        #[arg(long, value_delimiter = ',', default_values_t = [1024usize, 65536, 1 << 20])]
        #[arg(value_parser = args::at_least(1usize), allow_negative_numbers = true)]
        sizes: Vec<usize>,
        /// Milliseconds each (system, writers, size) runs.
        #[arg(long, default_value_t = 2000, value_parser = args::at_least(1u64))]
        #[arg(allow_negative_numbers = true)]
        millis: u64,
        /// Under 2 minutes: 2 writers, 1 s per run.
        #[arg(long)]
        quick: bool,
        /// Where the JSON and the plots go.
        #[arg(long, default_value = "results")]
        out: PathBuf,
        /// The JSON report's path (default: `<out>/bench_store.json`).
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
    },
    /// SIGKILL one rank of 4 and of 8: kill → detection, detection → copies restored, for
    /// each amount of data per rank, and the put latency around the recovery.
    Recovery {
        /// Job sizes, each at least 3 (2 copies, then the last rank is killed).
        #[arg(long, value_delimiter = ',', default_values_t = [4usize, 8])]
        #[arg(value_parser = args::at_least(1usize), allow_negative_numbers = true)]
        ranks: Vec<usize>,
        /// Bytes stored per rank.
        #[arg(long, value_delimiter = ',', default_values_t = [1usize << 20, 16 << 20, 64 << 20])]
        #[arg(value_parser = args::at_least(1usize), allow_negative_numbers = true)]
        sizes: Vec<usize>,
        /// Where bench_recovery.json goes.
        #[arg(long, default_value = "results")]
        out: PathBuf,
    },
    /// 1 KiB put latency and window memory as the job grows.
    Growth {
        /// Job sizes, each at least 2.
        #[arg(long, value_delimiter = ',', default_values_t = [2usize, 4, 8, 16])]
        #[arg(value_parser = args::at_least(1usize), allow_negative_numbers = true)]
        ranks: Vec<usize>,
        /// Bytes each rank stores for the memory measurement.
        #[arg(long, default_value_t = 16 << 20, value_parser = args::at_least(1usize))]
        #[arg(allow_negative_numbers = true)]
        stored: usize,
        /// Milliseconds of puts per job.
        #[arg(long, default_value_t = 1000, value_parser = args::at_least(1u64))]
        #[arg(allow_negative_numbers = true)]
        millis: u64,
        /// Where bench_growth.json goes.
        #[arg(long, default_value = "results")]
        out: PathBuf,
    },
    /// What a store with the library's defaults costs as the job grows: creation, put
    /// latency, memory, threads and sockets per rank, one kill's recoveries.
    Scale {
        /// Job layouts: ranks on this machine (`64`) or over simulated hosts (`64x8`).
        #[arg(long, value_delimiter = ',', default_values = ["8", "16", "32", "64", "128", "32x4", "64x8"])]
        layouts: Vec<ftkv_cli::bench_scale::Layout>,
        /// Bytes every key holds for the memory measurement.
        #[arg(long, default_value_t = 1 << 20, value_parser = args::at_least(1usize))]
        #[arg(allow_negative_numbers = true)]
        stored: usize,
        /// Milliseconds of 1 KiB puts per job.
        #[arg(long, default_value_t = 1000, value_parser = args::at_least(1u64))]
        #[arg(allow_negative_numbers = true)]
        millis: u64,
        /// Leave out the recoveries (one SIGKILL, global and localized, per layout).
        #[arg(long)]
        no_recovery: bool,
        /// Where bench_scale.json and bench_scale.svg go.
        #[arg(long, default_value = "results")]
        out: PathBuf,
    },
    /// Checkpointing overhead: the same tree failure-free without and with checkpointing.
    Uts {
        #[command(flatten)]
        pool: PoolArgs,
        /// Runs of each variant (alternating); the medians are compared.
        #[arg(long, default_value_t = 5, value_parser = args::at_least(1usize))]
        #[arg(allow_negative_numbers = true)]
        repeat: usize,
        /// Also runs with this many workers SIGKILLed, with global and with localized
        /// recovery, and compares the task rate of the workers not involved in a recovery
        /// in the 400 ms after the first kill with the 400 ms before it.
        #[arg(long, default_value_t = 0, value_parser = args::at_least(0usize))]
        #[arg(allow_negative_numbers = true)]
        kills: usize,
        /// Also runs both variants over this many hosts simulated on this machine (network
        /// namespaces, needs root), alternating with the runs on one host, and compares each
        /// variant's median across hosts with its median on one host.
        #[arg(long, value_name = "HOSTS", value_parser = args::at_least(2usize))]
        #[arg(allow_negative_numbers = true)]
        across: Option<usize>,
        /// Compares these task models side by side (e.g. `dit,nfj,fbc`), each without and
        /// with checkpointing, instead of `--model`'s alone.
        #[arg(long, value_enum, value_delimiter = ',', value_name = "MODELS")]
        models: Vec<ModelArg>,
        /// Where the comparison goes: both variants' times, checkpoints and medians.
        #[arg(long, default_value = "results/bench_uts.json", value_name = "FILE")]
        json: PathBuf,
    },
}

/// What the pool computes and how (shared by `demo` and `bench uts`).
#[derive(clap::Args)]
struct PoolArgs {
    /// UTS tree: the reference's flags (e.g. "-t 1 -a 3 -d 10 -b 4 -r 19"), a sample name
    /// (default, T1 to T5, T1L, T2L, T3L), `queens:N` for N-Queens, `fib:N` for Fibonacci, or
    /// `wave:N` for the wavefront of futures on an N×N grid (`--model fbc` only).
    #[arg(long, default_value = "T1", allow_hyphen_values = true)]
    tree: String,
    /// Number of ranks, one worker on each.
    #[arg(short = 'n', long, default_value_t = POOL_RANKS, value_parser = args::at_least(1usize))]
    #[arg(allow_negative_numbers = true)]
    ranks: usize,
    /// A worker's periodic checkpoint interval: `100ms`, `5000tasks`, or `off`.
    #[arg(long, default_value = "100ms", allow_negative_numbers = true)]
    interval: String,
    /// Copies of every checkpoint.
    #[arg(long, default_value_t = POOL_COPIES, value_parser = args::at_least(1usize))]
    #[arg(allow_negative_numbers = true)]
    copies: usize,
    /// Seed of the random choices: which workers are killed and when, whom idle workers rob.
    #[arg(long, default_value_t = 1, value_parser = args::at_least(0u64))]
    #[arg(allow_negative_numbers = true)]
    seed: u64,
    /// Seconds after which the job counts as hung.
    #[arg(long, default_value = "120", value_parser = args::seconds, value_name = "SECS")]
    #[arg(allow_negative_numbers = true)]
    timeout: Duration,
    /// How a failure is recovered: `global` (every survivor stops, the store is rebuilt on
    /// the survivors) or `localized` (the dead worker's buddy and its victims and thieves
    /// settle its work in store transactions while the others keep working).
    #[arg(long, value_enum, default_value_t = RecoveryArg::Global)]
    recovery: RecoveryArg,
    /// The task model: `dit` (dynamic independent tasks: every task adds to its worker's
    /// result), `nfj` (nested fork-join: every task returns its subtree's result to its
    /// parent's frame, thieves return stolen subtrees' results by message) or `fbc`
    /// (future-based cooperation: every child is a future its parent awaits, a thief writes a
    /// stolen future's value into its victim's futures entry under the victim's lock).
    #[arg(long, value_enum, default_value_t = ModelArg::Dit)]
    model: ModelArg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ModelArg {
    Dit,
    Nfj,
    Fbc,
}

impl From<ModelArg> for Model {
    fn from(arg: ModelArg) -> Model {
        match arg {
            ModelArg::Dit => Model::Dit,
            ModelArg::Nfj => Model::Nfj,
            ModelArg::Fbc => Model::Fbc,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RecoveryArg {
    Global,
    Localized,
}

impl From<RecoveryArg> for Recovery {
    fn from(arg: RecoveryArg) -> Recovery {
        match arg {
            RecoveryArg::Global => Recovery::Global,
            RecoveryArg::Localized => Recovery::Localized,
        }
    }
}

impl PoolArgs {
    /// The pool job these options describe, refused before any launch when it cannot run:
    /// `kills` (`None` for `bench uts`, which kills nobody) must leave two workers alive.
    fn demo(&self, kills: Option<usize>) -> Result<tasks::Demo> {
        let ranks = Opt::with_default("--ranks", self.ranks, POOL_RANKS);
        args::check_before_launch(&[ranks])?;
        args::check_copies(Opt::with_default("--copies", self.copies, POOL_COPIES), ranks)?;
        if let Some(kills) = kills {
            args::check_kills(Opt::with_default("--kills", kills, DEMO_KILLS), ranks)?;
        }
        tasks::parse_interval(&self.interval)?;
        let workload = tasks::Workload::parse(&self.tree)?;
        workload.check_model(self.model.into())?;
        Ok(tasks::Demo {
            workload,
            model: self.model.into(),
            ranks: self.ranks,
            kills: kills.unwrap_or(0),
            interval: self.interval.clone(),
            copies: self.copies,
            seed: self.seed,
            timeout: self.timeout,
            stop: None,
            stop_host: false,
            suspicion: None,
            localized: self.recovery == RecoveryArg::Localized,
            hosts: None,
        })
    }
}

/// Ranks of a job when `-n` is not given: 4, so that ranks outnumber the cores of a 2-core
/// machine, as they do on every busy node.
const DEFAULT_RANKS: usize = 4;

/// The defaults of `demo` and `bench uts` (`POOL_*`), `demo --kills`, `chaos` and `bench put
/// --copies`, which error messages name when they were in effect.
const POOL_RANKS: usize = 8;
const POOL_COPIES: usize = 3;
const DEMO_KILLS: usize = 2;
const CHAOS_RANKS: usize = 6;
const CHAOS_COPIES: usize = 2;
const CHAOS_KILLS: usize = 1;
const PUT_COPIES: usize = 3;

const PROBE_HELP: &str = "\
Reproduces, with ftkv's own MPI layer, the experiment that shows Open MPI's ULFM does not \
cover one-sided communication.

For each window kind (MPI_Win_allocate, MPI_Win_create_dynamic) and each one-sided call (lock \
exclusive/shared, lock_all, put, get, accumulate, compare-and-swap, fetch-and-op, flush, unlock, \
fence, free) the target process is SIGKILLed first; once the caller's ULFM lists it as failed, \
the call is made (failure `known`); in a second run of each case the caller makes no MPI call \
for 300 ms after the kill and then calls (failure `unknown`: dead, but not yet noticed). The *_held cases lock a live target whose exclusive lock a dead process held. \
The two-sided cases send to (eager 8 B, 4 MiB, synchronous) or receive/probe from the dead rank. The runtime case daemon_death runs 3 ranks on 3 simulated hosts: one rank SIGKILLs its host's PRRTE daemon and itself, and the others try to shrink and synchronise. It runs once per set of PRRTE recovery options (shipped: ftkv's flags only; recoverable_mca, continuous, autorestart, autorestart_mca, enable_recovery, errmgr_prted; select one with e.g. daemon_death:continuous), each reported with the PRRTE message that decided it.

Each case runs in its own mpirun, so a hang cannot block the others. Outcomes: ok (the call \
returned success: silent success against a dead process), proc_failed, revoked, error:<class>, \
hang (no return within --hang-after seconds), abort (the job ended without a report), job_terminated (the runtime ended the job after losing a daemon), rejected_option (mpirun refused the options before any rank started), survivors_shrank (the ranks on the other hosts shrank and synchronised for 5 s).

Why it matters: ftkv's data path is one-sided. A call that hangs must be bounded by a watchdog, \
a call that silently succeeds must not count as a live copy, and only the calls reported here \
as proc_failed can serve as failure detectors.";

fn main() {
    let cli = Cli::parse();
    if !env::running_under_mpirun() {
        cli.hosts.export();
    }
    if env::running_under_mpirun() {
        rank_failure::end_job_on_panic();
        ftkv_cli::trace::install();
    }
    if let Err(e) = run(cli.command) {
        if env::running_under_mpirun() {
            rank_failure::end_job_on_error(&e);
        }
        if ftkv_cli::interrupt::interrupted() {
            eprintln!("ftkv: interrupted");
            std::process::exit(130);
        }
        eprintln!("ftkv: {e:#}");
        std::process::exit(1);
    }
}

fn run(command: Command) -> Result<()> {
    let exe = || std::env::current_exe().context("locating the ftkv binary");
    match command {
        Command::Demo { pool, kills, stop, stop_host, suspicion, json } => {
            let demo = tasks::Demo { stop, stop_host, suspicion, ..pool.demo(Some(kills))? };
            let report = tasks::run_demo(&exe()?, &demo)?;
            if let Some(path) = json {
                std::fs::write(&path, serde_json::to_string_pretty(&report)? + "\n")
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            Ok(())
        }
        Command::TasksRank {
            workload,
            interval,
            copies,
            seed,
            suspicion_ms,
            watchdog_ms,
            localized,
            model,
        } => {
            let bounds = (Duration::from_millis(suspicion_ms), Duration::from_millis(watchdog_ms));
            let recovery = if localized { Recovery::Localized } else { Recovery::Global };
            let model = Model::parse(&model).map_err(anyhow::Error::msg)?;
            tasks::rank_main(&workload, model, &interval, (copies, recovery), seed, bounds)
        }
        Command::Bench(BenchCommand::Store {
            systems,
            writers,
            sizes,
            millis,
            quick,
            out,
            json,
        }) => {
            let systems = systems
                .iter()
                .map(|s| {
                    ftkv_bench::reports::System::ALL
                        .into_iter()
                        .find(|x| x.name() == s.trim())
                        .with_context(|| {
                            format!("unknown system {s:?} (ftkv, raw_rma, redis, etcd)")
                        })
                })
                .collect::<Result<Vec<_>>>()?;
            let (writers, millis) = if quick { (vec![2], 1000) } else { (writers, millis) };
            check_jobs("--writers", &writers, 1, "bench store")?;
            let bench = bench_store::StoreBench {
                systems,
                writers,
                sizes,
                millis,
                copies: 3,
                out_dir: out,
                json,
            };
            bench_store::run(&exe()?, &bench).map(drop)
        }
        Command::Bench(BenchCommand::Recovery { ranks, sizes, out }) => {
            check_jobs("--ranks", &ranks, 3, "bench recovery (2 copies, then a kill)")?;
            ftkv_cli::bench_recovery::run_recovery(&exe()?, &ranks, &sizes, &out).map(drop)
        }
        Command::Bench(BenchCommand::Growth { ranks, stored, millis, out }) => {
            check_jobs("--ranks", &ranks, 2, "bench growth")?;
            ftkv_cli::bench_recovery::run_growth(&exe()?, &ranks, stored, millis, &out).map(drop)
        }
        Command::BenchRecoveryRank { bytes, localized: false, .. } => {
            ftkv_cli::bench::recovery_rank_main(bytes)
        }
        Command::BenchRecoveryRank { bytes, localized: true, pace_us } => {
            ftkv_cli::bench::localized_recovery_rank_main(bytes, pace_us)
        }
        Command::BenchGrowthRank { copies, stored, millis } => {
            ftkv_cli::bench::growth_rank_main(copies, stored, millis)
        }
        Command::Bench(BenchCommand::Scale { layouts, stored, millis, no_recovery, out }) => {
            let ranks: Vec<usize> = layouts.iter().map(|l| l.ranks).collect();
            check_jobs("--layouts", &ranks, 4, "bench scale")?;
            let exe = exe()?;
            ftkv_cli::bench_scale::run_scale(&exe, &layouts, stored, millis, !no_recovery, &out)
                .map(drop)
        }
        Command::BenchScaleRank { stored, millis } => {
            ftkv_cli::bench_scale::scale_rank_main(stored, millis)
        }
        Command::BenchStoreRank { systems, writers, sizes, millis, copies } => {
            let sizes = sizes.split(',').map(str::parse).collect::<Result<Vec<usize>, _>>()?;
            let systems: Vec<&str> = systems.split(',').collect();
            ftkv_cli::bench::store_rank_main(&systems, writers, &sizes, millis, copies)
        }
        Command::Bench(BenchCommand::Uts { pool, repeat, kills, across, models, json }) => {
            let demo = pool.demo(Some(kills))?;
            let models: Vec<Model> = models.into_iter().map(Model::from).collect();
            models.iter().try_for_each(|&model| demo.workload.check_model(model))?;
            let plan = tasks::BenchPlan { repeat, kills, across, models };
            tasks::run_bench(&exe()?, &tasks::Demo { kills: 0, ..demo }, &plan, &json)
        }
        Command::Probe { json, hang_after, cases } => run_probe(json, hang_after, &cases),
        Command::Ping { ranks, count } => {
            check_jobs("--ranks", &[ranks], 2, "ping (rank 0 and a peer)")?;
            launch_under_mpirun(ranks)?;
            ftkv_cli::ping::rank_main(count)
        }
        Command::Sim { model: SimModel::Scale, seed, sizes, .. } => run_sim_scale(&sizes, seed),
        Command::Sim { model, runs, seed, trace, .. } => run_sim(model, seed, runs, trace),
        Command::Chaos {
            runs,
            ranks,
            copies,
            kills,
            seed,
            duration,
            cut_link,
            slow_links,
            recovery,
            stop,
            kill_host,
            transcripts,
            json,
        } => {
            check_chaos(ranks, copies, kills)?;
            let campaign = chaos::Campaign {
                runs,
                ranks,
                copies,
                kills,
                seed,
                duration,
                cut_link,
                slow_links,
                transcripts,
                recovery: recovery.into(),
                stop,
                kill_host,
            };
            run_chaos(&campaign, json)
        }
        Command::Bench(BenchCommand::Put { ranks, copies, sizes, iterations, out }) => {
            let ranks = Opt::with_default("--ranks", ranks, DEFAULT_RANKS);
            args::check_before_launch(&[ranks])?;
            args::check_copies(Opt::with_default("--copies", copies, PUT_COPIES), ranks)?;
            launch_under_mpirun(ranks.value)?;
            ftkv_cli::bench::put_rank_main(copies, &sizes, iterations, &out)
        }
        Command::Bench(BenchCommand::Detect { ranks }) => {
            check_jobs("--ranks", &[ranks], 2, "bench detect (a rank to kill and rank 0)")?;
            launch_under_mpirun(ranks)?;
            ftkv_cli::bench::detect_rank_main()
        }
        Command::ChaosRank { copies, millis, seed, watchdog_ms, localized, suspicion_ms } => {
            chaos::rank_main(&chaos::RankArgs {
                copies,
                duration: Duration::from_millis(millis),
                seed,
                watchdog: Duration::from_millis(watchdog_ms),
                recovery: if localized { Recovery::Localized } else { Recovery::Global },
                suspicion: suspicion_ms.map(Duration::from_millis),
            })
        }
        Command::ProbeCase { window, call, failure, hang_after } => {
            let failure = probe::Knowledge::parse(&failure)?;
            probe::rank_main(&window, &call, failure, hang_after)
        }
    }
}

/// The checks of a subcommand whose jobs have the sizes given by `flag`: each at least `min`
/// ranks (`what` says who needs them), none beyond the rank limit, and a working directory.
fn check_jobs(flag: &'static str, sizes: &[usize], min: usize, what: &str) -> Result<()> {
    let jobs: Vec<Opt> = sizes.iter().map(|&n| Opt::new(flag, n)).collect();
    args::check_before_launch(&jobs)?;
    jobs.iter().try_for_each(|&ranks| args::check_min_ranks(ranks, min, what))
}

/// `chaos`'s checks before its first job, naming the defaults in effect.
fn check_chaos(ranks: usize, copies: usize, kills: usize) -> Result<()> {
    let ranks = Opt::with_default("--ranks", ranks, CHAOS_RANKS);
    args::check_before_launch(&[ranks])?;
    args::check_copies(Opt::with_default("--copies", copies, CHAOS_COPIES), ranks)?;
    args::check_kills(Opt::with_default("--kills", kills, CHAOS_KILLS), ranks)
}

fn run_chaos(campaign: &chaos::Campaign, json: Option<PathBuf>) -> Result<()> {
    let exe = std::env::current_exe().context("locating the ftkv binary")?;
    let summary = chaos::run(&exe, campaign)?;
    let text = serde_json::to_string(&summary)?;
    println!("{text}");
    if let Some(path) = json {
        std::fs::write(&path, text + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let clean = summary.lost_writes == 0 && summary.torn_reads == 0 && summary.hangs == 0;
    anyhow::ensure!(
        clean && summary.failed_runs == 0,
        "{} of {} runs failed",
        summary.failed_runs,
        summary.runs
    );
    Ok(())
}

/// The protocols `ftkv sim` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SimModel {
    /// The store's global recovery (`ftkv_sim::recovery`).
    Store,
    /// The production store (data path, detector, global recovery, localized repairer,
    /// fencing, growth) on a deterministic world: every thread a task of one seeded scheduler,
    /// virtual time, kills at any step (`ftkv_sim::store`).
    World,
    /// The production pool driver over the production store on a deterministic world (global
    /// and localized recovery, kills at named protocol points and at any step;
    /// `ftkv_tasks::sim_world`).
    PoolWorld,
    /// `pool-world` with the problems as nested fork-join programs (frames, results returned
    /// by message; kills also at the results' protocol points; `ftkv_tasks::sim_world`).
    NfjWorld,
    /// `pool-world` with the problems written with futures (results handed over into the
    /// holder's futures entry under its lock; kills also at every hand-over step;
    /// `ftkv_tasks::sim_world`).
    FbcWorld,
    /// The production store's transactions on a deterministic world: coordinators, the
    /// backups' resolution and the in-doubt finish, kills at any step and at every named step
    /// of the protocol (`ftkv_sim::transactions`).
    TxnWorld,
    /// The store's recovery, and the store, its transactions and the pool driver on the
    /// world, `--runs` scenarios each.
    All,
    /// Placement and recovery decisions at 1,024 to 16,384 workers (`--sizes`): messages,
    /// bytes and ranks of a localized repair and of a global recovery, and placement balance,
    /// after 1 % and 10 % of the workers failed.
    Scale,
}

/// `ftkv sim --model scale`: every case of `sizes` (`workers x hosts`), a table, the cases
/// whose placement is above 1.25 × the mean, and a check that each localized repair moves
/// exactly the copies that lived on failed workers.
fn run_sim_scale(sizes: &[String], seed: u64) -> Result<()> {
    let parse = |s: &String| -> Result<(usize, usize)> {
        let (w, h) = s.split_once('x').with_context(|| format!("{s:?}: want WORKERSxHOSTS"))?;
        let (w, h): (usize, usize) = (w.trim().parse()?, h.trim().parse()?);
        anyhow::ensure!(
            w >= 8 && h >= 1 && h <= w,
            "{s:?}: needs 8+ workers and 1..=workers hosts"
        );
        Ok((w, h))
    };
    let sizes = sizes.iter().map(parse).collect::<Result<Vec<_>>>()?;
    let mut outcomes = Vec::new();
    for case in ftkv_cli::sim_scale::cases(&sizes, seed) {
        let started = std::time::Instant::now();
        outcomes.push(ftkv_cli::sim_scale::simulate(case));
        eprintln!("[sim scale] {case:?}: {:.1} s", started.elapsed().as_secs_f64());
    }
    ftkv_cli::sim_scale::print(&outcomes);
    let unbalanced = outcomes
        .iter()
        .filter(|o| o.balance_global > 1.25 || o.balance_localized.is_some_and(|b| b > 1.25))
        .count();
    println!("cases with a live worker above 1.25 × the mean copies: {unbalanced}");
    let wrong: Vec<_> = outcomes
        .iter()
        .filter(|o| o.localized && o.copies_moved != o.copies_lost)
        .map(|o| (o.case.workers, o.case.hosts, o.case.mapping, o.failed))
        .collect();
    anyhow::ensure!(
        wrong.is_empty(),
        "a localized repair moved other copies than the lost: {wrong:?}"
    );
    Ok(())
}

/// One run of a world model: its report and, when traced, its steps.
type WorldRun = fn(u64, bool) -> (ftkv_sim::recovery::RunReport, Vec<String>);
/// A world model's campaign: the failing runs and the digest.
type WorldCampaign = fn(u64, u64) -> (Vec<ftkv_sim::recovery::RunReport>, u64);

fn run_sim(model: SimModel, seed: u64, runs: u64, trace: bool) -> Result<()> {
    let started = std::time::Instant::now();
    if trace {
        ftkv_cli::trace::install();
    }
    let end = seed.saturating_add(runs);
    let mut failing = Vec::new();
    let mut digests = Vec::new();
    let worlds: [(SimModel, &'static str, WorldRun, WorldCampaign); 5] = [
        (SimModel::World, "world", ftkv_sim::store::run, ftkv_sim::store::campaign),
        (
            SimModel::TxnWorld,
            "txn-world",
            ftkv_sim::transactions::run,
            ftkv_sim::transactions::campaign,
        ),
        (
            SimModel::PoolWorld,
            "pool-world",
            ftkv_tasks::sim_world::run,
            ftkv_tasks::sim_world::campaign,
        ),
        (
            SimModel::NfjWorld,
            "nfj-world",
            ftkv_tasks::sim_world::run_nfj,
            ftkv_tasks::sim_world::campaign_nfj,
        ),
        (
            SimModel::FbcWorld,
            "fbc-world",
            ftkv_tasks::sim_world::run_fbc,
            ftkv_tasks::sim_world::campaign_fbc,
        ),
    ];
    for (world_model, name, run, campaign) in worlds {
        if model != world_model && model != SimModel::All {
            continue;
        }
        if trace {
            for seed in seed..end {
                let (report, lines) = run(seed, true);
                println!("{name} seed={seed} {} steps={}", report.scenario, report.steps);
                lines.iter().for_each(|line| println!("  {line}"));
            }
        }
        let (world_failing, digest) = campaign(seed, runs);
        println!("{name} runs={runs} violations={} digest={digest:016x}", world_failing.len());
        failing.extend(world_failing.into_iter().map(|r| (name, r)));
        digests.push(digest);
    }
    if matches!(model, SimModel::Store | SimModel::All) {
        if trace {
            for seed in seed..end {
                let (report, steps) = ftkv_sim::recovery::run_traced(seed);
                println!("store seed={seed} {}", report.scenario);
                steps.iter().for_each(|step| println!("  {step}"));
            }
        }
        let (store_failing, digest) = ftkv_sim::recovery::campaign(seed, runs);
        println!("store runs={runs} violations={} digest={digest:016x}", store_failing.len());
        failing.extend(store_failing.into_iter().map(|r| ("store", r)));
        digests.push(digest);
    }
    for (model, report) in &failing {
        println!("{model} {report}");
    }
    let digest = digests.iter().fold(0, |h, d| ftkv_sim::recovery::mix(h, *d));
    let total = runs * digests.len() as u64;
    println!(
        "runs={total} violations={} digest={digest:016x} seconds={:.2}",
        failing.len(),
        started.elapsed().as_secs_f64()
    );
    anyhow::ensure!(failing.is_empty(), "{} of {total} simulated runs failed", failing.len());
    Ok(())
}

fn run_probe(json: Option<PathBuf>, hang_after: Duration, filters: &[String]) -> Result<()> {
    args::check_before_launch(&[])?;
    let cases = probe::select_cases(filters)?;
    let exe = std::env::current_exe().context("locating the ftkv binary")?;
    let outcomes = probe::run_cases(&exe, &cases, hang_after)?;
    print!("{}", probe::markdown(&outcomes));
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&outcomes)?;
        std::fs::write(&path, text + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Outside `mpirun`, runs `mpirun -n <ranks> <this binary> <same args>` on the hosts the
/// options chose, with the job's output as this process's, and exits with its status; under
/// `mpirun`, returns at once.
fn launch_under_mpirun(ranks: usize) -> Result<()> {
    if env::running_under_mpirun() {
        return Ok(());
    }
    anyhow::ensure!(ranks >= 1, "-n must be at least 1");
    let exe = std::env::current_exe().context("locating the ftkv binary")?;
    let args = std::env::args_os().skip(1).map(|a| a.to_string_lossy().into_owned());
    let out =
        launch::Launch::new(exe, ranks).args(args).attached().timeout(ATTACHED_JOB_LIMIT).run()?;
    anyhow::ensure!(!out.timed_out, "the job did not end within {ATTACHED_JOB_LIMIT:?}");
    std::process::exit(out.status.and_then(|s| s.code()).unwrap_or(1));
}

/// The longest a job started by [`launch_under_mpirun`] may run.
const ATTACHED_JOB_LIMIT: Duration = Duration::from_secs(3600);
