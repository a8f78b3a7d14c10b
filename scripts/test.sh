#!/usr/bin/env bash
# The whole test suite on a fresh machine: set-up (idempotent), the formatting check, every unit
# and real-MPI test, the real-MPI tests that depend on the transport again over `btl self,tcp`
# and over 3 simulated hosts, and short chaos campaigns on one host and across hosts. The lints
# (`cargo clippy --workspace --all-targets -- -D warnings`, and the docs with
# `RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace`) are separate commands: each
# builds every dependency once more, minutes on a fresh 2-core machine.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
start=$(date +%s)
# Open MPI's heartbeat timeout and the store's suspicion bound (they follow this variable): a
# machine that leaves ranks unscheduled for seconds (4 of 7 ranks, 8.8 s, in one CI run) must
# not have them declared failed. Tests of stops and cut links set their own bounds.
export OMPI_MCA_mpi_ft_detector_timeout=30
# A job that times out prints its ranks' stacks (gdb) before it is killed: where a hang sat.
export FTKV_STACKS_ON_HANG=1
step() { printf '\n[test] %s (%d s so far)\n' "$*" "$(( $(date +%s) - start ))"; }
# Runs a multi-host campaign under a hard timeout, then checks that it left nothing behind: no
# simulated host's namespace, no rank or daemon process, no new shared-memory file.
across_hosts() {
  local bound=$1; shift
  local shm_before; shm_before=$(ls /dev/shm | sort)
  timeout --kill-after 10 "$bound" "$@"
  local netns; netns=$(ip netns list | grep -o '^ftkv[0-9]*x[0-9]*[a-z0-9]*' || true)
  [ -z "$netns" ] || { echo "namespaces left behind: $netns"; exit 1; }
  ! pgrep -f 'ftkv (chaos-rank|probe-case)|prted' || { echo "processes left behind"; exit 1; }
  local new; new=$(comm -13 <(echo "$shm_before") <(ls /dev/shm | sort))
  [ -z "$new" ] || { echo "shared-memory files left behind: $new"; exit 1; }
}
step "set-up"
scripts/setup.sh
step "fmt"
cargo fmt --all -- --check
step "the store and the pool build without MPI (no ftkv-mpi in the build)"
cargo build --release -p ftkv -p ftkv-sim -p ftkv-tasks --no-default-features --features ftkv/local,ftkv-tasks/sim --quiet
step "unit, scenario and real-MPI tests"
cargo test --workspace --release
step "simulated store recoveries, and the production store, its transactions and the pool driver (global and localized; independent tasks, fork-join and futures) on a deterministic world: 10000 seeded scenarios each, kills and stops at any step (no MPI)"
target/release/ftkv sim --runs 10000 --seed 1
step "placement and recovery decisions at 1,024 workers over 16 and 64 hosts (no MPI)"
target/release/ftkv sim --model scale --sizes 1024x16,1024x64
step "real-MPI tests over btl self,tcp"
# The reruns select their tests across the workspace: a package selection (-p) would unify
# features differently and build the crates again.
# The large-value tests write their values into extents (files on this host), not through Open
# MPI's btl; the watchdog's test exercises the store, not the transport; the intruder test makes
# its own hosts.
FTKV_TEST_BTL=tcp cargo test --workspace --release --test mpi_layer --test store --test tasks -- \
  --skip values_grow_to_256_mib --skip a_1_gib_value \
  --skip a_stuck_put --skip mismatched_or_invalid --skip bad_input --skip connections_from_outside
step "real-MPI store and task tests over 3 simulated hosts, and the C example"
# A 1 GiB value crosses the hosts' links in the 256 MiB growth test's extents already (a 1 GiB
# one takes 50 s there); configuration checks happen before any link exists; the intruder test
# makes its own hosts; a lone survivor of 2 ranks on 2 hosts is a minority, which leaves the
# store by design (`Error::Partitioned`).
FTKV_NODES=3 cargo test --workspace --release --test store --test tasks --test c_example -- \
  --skip a_1_gib_value --skip mismatched_or_invalid --skip bad_input \
  --skip connections_from_outside --skip a_lone_survivor_with_one_copy_stays_exact
step "chaos: 6 runs, 6 ranks, 2 copies, 1 kill each"
target/release/ftkv chaos --runs 6 --ranks 6 --copies 2 --kills 1 --seed 1
step "chaos across 3 simulated hosts: 3 runs, 6 ranks, 2 copies, 1 kill each"
across_hosts 300 target/release/ftkv chaos --nodes 3 --runs 3 --ranks 6 --copies 2 --kills 1 --seed 1
step "chaos across 3 simulated hosts, one host's link cut 2 s in: survivors exact, its ranks end"
across_hosts 300 target/release/ftkv chaos --nodes 3 --runs 2 --ranks 6 --copies 2 --kills 0 \
  --duration 5 --cut-link 2 --seed 1
step "chaos across 3 simulated hosts over slow links (20 Mbit/s, tc tbf): 2 runs, 1 kill each"
across_hosts 300 target/release/ftkv chaos --nodes 3 --runs 2 --ranks 6 --copies 2 --kills 1 \
  --duration 4 --slow-links 20mbit --seed 3
step "chaos with localized recovery: 3 runs, 1 kill each; 2 runs, 3 copies, 2 kills each"
target/release/ftkv chaos --recovery localized --runs 3 --ranks 6 --copies 2 --kills 1 --seed 1
target/release/ftkv chaos --recovery localized --runs 2 --ranks 6 --copies 3 --kills 2 --seed 1
step "chaos, a rank SIGSTOPped 1 s in past the suspicion bound: 1 run each, global and localized"
target/release/ftkv chaos --runs 1 --ranks 6 --copies 2 --kills 0 --stop 1 --seed 1
target/release/ftkv chaos --recovery localized --runs 1 --ranks 6 --copies 2 --kills 0 --stop 1 --seed 2
step "chaos, one simulated host's ranks SIGKILLed at once: 2 hosts by slot, 3 hosts by node"
across_hosts 300 target/release/ftkv chaos --nodes 2 --kill-host --runs 2 --ranks 6 --copies 2 \
  --kills 0 --seed 1
across_hosts 300 target/release/ftkv chaos --nodes 3 --map-by node --kill-host --runs 2 --ranks 6 \
  --copies 2 --kills 0 --recovery localized --seed 1
# Campaigns with a second kill during recovery (`--kills 2`) are run by hand: a kill that lands
# inside MPIX_Comm_shrink can leave Open MPI 5.0.11's shrink stuck on every survivor (see
# docs/limits.md), which no store design can prevent and which would make CI flaky.
step "bench store --quick (ftkv, raw RMA, Redis, etcd: runs and verifies every copy)"
target/release/ftkv bench store --quick --out results/ci
step "all tests passed"
