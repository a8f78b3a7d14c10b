#!/usr/bin/env bash
# The main job on a fresh machine: set-up (idempotent), a release build, then `ftkv demo`:
# UTS T1 on 8 ranks with task-level checkpointing, 2 workers SIGKILLed, the exact count.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/setup.sh
cargo build --release --quiet -p ftkv-cli
mkdir -p results
exec target/release/ftkv demo --json results/demo.json "$@"
