# shellcheck shell=bash
# Sourced first by every bench script: source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
#
# Leaves the script in strict mode, in the checkout's root (`root`), with the servers it starts
# stopping at once on SIGTERM (no load balancer waits for them), and gives it what every bench
# does the same way: the binary measured (SHEAF_BIN, or this checkout built), the wait for a
# server, the machine line, and background processes and a scratch folder (`work`) that go when
# the script ends, however it ends. The scripts made for the GPU machine (gpu.sh, gpu_ab.sh,
# torch_gpu.sh, pinning.sh) stand alone: they run from a copied tree, with a binary built
# elsewhere.
set -euo pipefail
export SHEAF_DRAIN_DELAY=0
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
mkdir -p bench/out

# sheaf_binary: sets `sheaf` to $SHEAF_BIN, or to this checkout's release binary, built first;
# `label` names what is measured (the binary's path, or the commit).
sheaf_binary() {
  label=${SHEAF_BIN:-$(git rev-parse --short HEAD)}
  if [ -z "${SHEAF_BIN:-}" ]; then
    cargo build --release --locked -p sheaf
    SHEAF_BIN="${CARGO_TARGET_DIR:-$root/target}/release/sheaf"
  fi
  sheaf=$SHEAF_BIN
}

# wait_for URL [PID [LOG]]: returns once URL answers with success, or fails after 150 s saying
# so; with PID, fails at once when that process has exited, showing the end of LOG where given.
wait_for() {
  for _ in $(seq 1500); do
    curl -sf "$1" >/dev/null && return 0
    if [ -n "${2:-}" ] && ! kill -0 "$2" 2>/dev/null; then
      echo "the server for $1 exited" >&2
      if [ -n "${3:-}" ]; then tail -20 "$3" >&2; fi
      return 1
    fi
    sleep 0.1
  done
  echo "nothing answered at $1" >&2
  return 1
}

# machine_line [MORE]: the line every bench prints first: the machine and what is measured.
machine_line() {
  echo "machine: $(nproc) cores, $(uname -m); sheaf ${label:-$(git rev-parse --short HEAD)}${1:+; $1}"
}

# serve LOG ARG...: starts `$sheaf serve ARG...` in the background, its output in LOG, and waits
# until it is ready on the --http-port given; `server` is its pid.
serve() {
  local log=$1
  shift
  "$sheaf" serve "$@" >"$log" 2>&1 &
  server=$!
  pids+=("$server")
  local port="" prev="" arg
  for arg in "$@"; do
    [ "$prev" = --http-port ] && port=$arg
    prev=$arg
  done
  wait_for "http://127.0.0.1:${port:-8000}/v2/health/ready" "$server" "$log"
}

# stop PID...: ends background processes and waits for them.
stop() {
  local p keep=()
  for p in "$@"; do kill "$p" 2>/dev/null || true; done
  for p in "$@"; do wait "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do [[ " $* " == *" $p "* ]] || keep+=("$p"); done
  pids=("${keep[@]}")
}

# link_model NAME DIR: the demo repository's model NAME in DIR/NAME, its files as symbolic links
# (a script that changes a file removes the link first, so the demo's stays as it is).
link_model() {
  cp -rs "$root/model_repository/$1" "$2/$1"
}

# When the script ends, the processes in `pids` are ended and `work`, its scratch folder, goes.
pids=()
work=$(mktemp -d)
bench_exit() {
  stop "${pids[@]}"
  rm -rf "$work"
}
trap bench_exit EXIT
