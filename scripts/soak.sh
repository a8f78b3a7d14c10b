#!/usr/bin/env bash
# Chaos campaigns at a cluster's rates (not part of the suite: hours of machine time). Runs
# each campaign below in chunks of CHUNK runs, a fifth of the chunks with two busy loops beside
# the job, and writes one JSON summary per chunk into OUT plus a total (soak.json) of every
# chunk found there, so that the campaigns can be run in parts (by time or by campaign) and
# added up:
#
#   scripts/soak.sh [--runs N] [--chunk N] [--out DIR] [--only NAME ...] [--hours H]
#
# Campaigns (default runs: 500 each, 100 for the 32-rank one):
#   host-localized      one host, localized, 6 ranks, 3 copies, 2 kills
#   hosts3-localized    3 simulated hosts, localized, 6 ranks, 3 copies, 2 kills
#   kill-host-slot2     --kill-host, 2 simulated hosts by slot, 6 ranks, 2 copies
#   kill-host-node3     --kill-host, 3 simulated hosts by node, localized, 6 ranks, 2 copies
#   stop                a rank SIGSTOPped past the suspicion bound, 6 ranks, 2 copies
#   hosts2-32-localized 32 ranks over 2 simulated hosts, localized, 3 copies, 2 kills
#   stop4-busy          a rank of 4 SIGSTOPped, two busy loops beside every run (50 runs)
#   stop8-busy          a rank of 8 SIGSTOPped, two busy loops beside every run (50 runs)
#
# A stop run fails unless the survivors declared the stopped rank, ended it within the bound
# plus 2 s of its stop, and declared no healthy rank.
#
# A chunk already in OUT (same campaign, same first seed) is not run again. The total counts
# runs, lost and torn writes, hangs and unexplained endings (`failed_runs`) per campaign.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
runs="" chunk=20 out="$root/results/soak" hours="" only=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --chunk) chunk=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --only) only+=("$2"); shift 2 ;;
    --hours) hours=$2; shift 2 ;;
    *) echo "soak.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
scripts/setup.sh >/dev/null
cargo build --release -p ftkv-cli --quiet
# The campaigns run a copy of the binary, so that a build meanwhile does not replace it under
# a running job.
mkdir -p "$out/bin"
cp "$root/target/release/ftkv" "$out/bin/ftkv.new" && mv "$out/bin/ftkv.new" "$out/bin/ftkv"
ftkv="$out/bin/ftkv"
deadline=""
[ -n "$hours" ] && deadline=$(( $(date +%s) + ${hours%.*} * 3600 ))

declare -A args=(
  [host-localized]="--recovery localized --ranks 6 --copies 3 --kills 2"
  [hosts3-localized]="--nodes 3 --recovery localized --ranks 6 --copies 3 --kills 2"
  [kill-host-slot2]="--nodes 2 --kill-host --ranks 6 --copies 2 --kills 0"
  [kill-host-node3]="--nodes 3 --map-by node --kill-host --recovery localized --ranks 6 --copies 2 --kills 0"
  [stop]="--ranks 6 --copies 2 --kills 0 --stop 1"
  [hosts2-32-localized]="--nodes 2 --recovery localized --ranks 32 --copies 3 --kills 2"
  [stop4-busy]="--ranks 4 --copies 2 --kills 0 --stop 1"
  [stop8-busy]="--ranks 8 --copies 2 --kills 0 --stop 1"
)
order=(host-localized hosts3-localized kill-host-slot2 kill-host-node3 stop hosts2-32-localized
  stop4-busy stop8-busy)
[ ${#only[@]} -gt 0 ] && order=("${only[@]}")

busy_pids=()
start_busy_loops() { for _ in 1 2; do (while :; do :; done) & busy_pids+=($!); done; }
stop_busy_loops() { for pid in "${busy_pids[@]}"; do kill "$pid" 2>/dev/null || true; done; busy_pids=(); }
trap stop_busy_loops EXIT

run_chunk() {
  local name=$1 seed=$2 n=$3 busy=$4
  local file="$out/$name-seed$seed.json"
  [ -f "$file" ] && return 0
  [ "$busy" = 1 ] && start_busy_loops
  local status=0
  # shellcheck disable=SC2086
  FTKV_MAX_RANKS=64 timeout --kill-after 30 $(( n * 240 )) \
    "$ftkv" chaos ${args[$name]} --runs "$n" --seed "$seed" --json "$file.part" \
    --transcripts "$out/transcripts-$name" >"$out/$name-seed$seed.log" 2>&1 || status=$?
  stop_busy_loops
  if [ -f "$file.part" ]; then
    python3 - "$file.part" "$file" "$busy" "$status" <<'EOF'
import json, sys
summary = json.load(open(sys.argv[1]))
summary["busy_loops"] = int(sys.argv[3])
summary["exit_status"] = int(sys.argv[4])
json.dump(summary, open(sys.argv[2], "w"))
EOF
    rm -f "$file.part"
  else
    echo "{\"runs\": $n, \"failed_runs\": $n, \"exit_status\": $status, \"busy_loops\": $busy, \"no_summary\": true}" >"$file"
  fi
  echo "[soak] $name seed $seed: $(cat "$file")"
}

for name in "${order[@]}"; do
  [ -n "${args[$name]:-}" ] || { echo "soak.sh: no campaign $name" >&2; exit 2; }
  total=${runs:-500}
  [ -z "$runs" ] && [ "$name" = hosts2-32-localized ] && total=100
  [ -z "$runs" ] && [[ "$name" == *-busy ]] && total=50
  for (( first = 0, i = 0; first < total; first += chunk, i++ )); do
    [ -n "$deadline" ] && [ "$(date +%s)" -ge "$deadline" ] && break 2
    n=$(( total - first < chunk ? total - first : chunk ))
    busy=$(( i % 5 == 4 ? 1 : 0 ))
    [[ "$name" == *-busy ]] && busy=1
    run_chunk "$name" $(( 1000 + first )) "$n" "$busy"
  done
done

python3 - "$out" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
totals = {}
keys = ["runs", "lost_writes", "torn_reads", "hangs", "failed_runs", "stuck_runs", "stall_failures",
        "unaccounted_losses"]
for path in sorted(glob.glob(os.path.join(out, "*-seed*.json"))):
    name = os.path.basename(path).rsplit("-seed", 1)[0]
    chunk = json.load(open(path))
    t = totals.setdefault(name, {k: 0 for k in keys} | {"busy_runs": 0, "chunks": 0,
                                 "healthy_declared": 0, "stall_ended_after_ms_max": 0})
    for k in keys:
        t[k] += int(chunk.get(k, 0))
    t["healthy_declared"] += int(chunk.get("healthy_declared", 0))
    t["stall_ended_after_ms_max"] = max([t["stall_ended_after_ms_max"]] + chunk.get("stall_ended_after_ms", []))
    t["busy_runs"] += int(chunk.get("runs", 0)) if chunk.get("busy_loops") else 0
    t["chunks"] += 1
json.dump(totals, open(os.path.join(out, "soak.json"), "w"), indent=1)
print(json.dumps(totals, indent=1))
EOF
