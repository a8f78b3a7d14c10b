#!/usr/bin/env bash
# The whole test suite on a fresh machine: set-up (idempotent), formatting and lint checks, then
# every unit, scenario and real-MPI test of the workspace.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
start=$(date +%s)
scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo test --workspace --release
echo "[test] all tests passed in $(( $(date +%s) - start )) s"
