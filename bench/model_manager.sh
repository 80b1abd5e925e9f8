#!/usr/bin/env bash
# Model-manager benchmark (see bench/model_manager.py): LRU and LFU hit rates against Belady's
# offline optimum on a Zipf trace over 1,200 sim models with room for 120, then cold-load
# latency and time-to-first-answer of the real ONNX MLP.
# Usage: bench/model_manager.sh [requests in the trace, default 4000]
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
count=${1:-4000}
base=${SHEAF_BENCH_PORT:-18461}
bash scripts/setup.sh
sheaf_binary
repo=.cache/bench-models
rm -rf "$repo" && mkdir -p "$repo" bench/out
for i in $(seq -f "%04g" 0 1199); do
  mkdir -p "$repo/m$i"
  printf 'input: {name: x, shape: [-1, 2]}\noutput: {name: y}\nlatency_ms: {a: 0.05, b: 0}\nmemory_mb: 10\n' >"$repo/m$i/model.sim.yaml"
  printf 'warmup: false\n' >"$repo/m$i/config.yaml"
done
mkdir -p "$repo-onnx/mlp/1" && ln -sf "$root/model_repository/mlp/1/model.onnx" "$repo-onnx/mlp/1/model.onnx"
on_demand() { # port, repository, extra args
  local port=$1 dir=$2
  shift 2
  serve "bench/out/model_manager_$port.log" --model-repository "$dir" --http-port "$port" \
    --grpc-port $((port + 1)) --metrics-port $((port + 2)) --model-control-mode on_demand "$@"
}
on_demand "$base" "$repo" --config <(printf 'memory_budget_mb: 1200\neviction_policy: lru\n')
on_demand $((base + 10)) "$repo" --config <(printf 'memory_budget_mb: 1200\neviction_policy: lfu\n')
on_demand $((base + 20)) "$repo-onnx"
py=.venv/bin/python
$py bench/model_manager.py hits "http://127.0.0.1:$base" "http://127.0.0.1:$((base + 2))/metrics" \
  "http://127.0.0.1:$((base + 10))" "http://127.0.0.1:$((base + 12))/metrics" 1200 120 "$count"
$py bench/model_manager.py cold "http://127.0.0.1:$((base + 20))" mlp 20
