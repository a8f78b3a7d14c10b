#!/usr/bin/env bash
# The main job on a fresh machine: set-up (idempotent), a release build, then `ftkv probe`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/setup.sh
cargo build --release --quiet -p ftkv-cli
mkdir -p results
exec target/release/ftkv probe --json results/probe.json "$@"
