#!/usr/bin/env bash
# Model-manager benchmark (see bench/model_manager.py): LRU and LFU hit rates against Belady's
# offline optimum on a Zipf trace over 1,200 sim models with room for 120, then cold-load
# latency and time-to-first-answer of the real ONNX MLP.
# Usage: bench/model_manager.sh [requests in the trace, default 4000]
set -euo pipefail
# The servers started here stop at once on SIGTERM: no load balancer waits for them.
export SHEAF_DRAIN_DELAY=0
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
count=${1:-4000}
base=${SHEAF_BENCH_PORT:-18461}
bash scripts/setup.sh
cargo build --release --locked -p sheaf
sheaf="${CARGO_TARGET_DIR:-./target}/release/sheaf"
repo=.cache/bench-models
rm -rf "$repo" && mkdir -p "$repo" bench/out
for i in $(seq -f "%04g" 0 1199); do
  mkdir -p "$repo/m$i"
  printf 'input: {name: x, shape: [-1, 2]}\noutput: {name: y}\nlatency_ms: {a: 0.05, b: 0}\nmemory_mb: 10\n' >"$repo/m$i/model.sim.yaml"
  printf 'warmup: false\n' >"$repo/m$i/config.yaml"
done
mkdir -p "$repo-onnx/mlp/1" && ln -sf "$root/model_repository/mlp/1/model.onnx" "$repo-onnx/mlp/1/model.onnx"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
serve() { # port, repository, extra args
  local port=$1 dir=$2; shift 2
  "$sheaf" serve --model-repository "$dir" --http-port "$port" --grpc-port $((port + 1)) --metrics-port $((port + 2)) \
    --model-control-mode on_demand "$@" >"bench/out/model_manager_$port.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 150); do curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null && return; sleep 0.2; done
  echo "server on $port did not start" >&2; exit 1
}
serve "$base" "$repo" --config <(printf 'memory_budget_mb: 1200\neviction_policy: lru\n')
serve $((base + 10)) "$repo" --config <(printf 'memory_budget_mb: 1200\neviction_policy: lfu\n')
serve $((base + 20)) "$repo-onnx"
py=.venv/bin/python
$py bench/model_manager.py hits "http://127.0.0.1:$base" "http://127.0.0.1:$((base + 2))/metrics" \
  "http://127.0.0.1:$((base + 10))" "http://127.0.0.1:$((base + 12))/metrics" 1200 120 "$count"
$py bench/model_manager.py cold "http://127.0.0.1:$((base + 20))" mlp 20
