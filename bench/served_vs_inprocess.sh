#!/usr/bin/env bash
# Served against in-process throughput, measured in one run on one machine.
#
# For each model: ONNX Runtime in-process at several batch sizes (the best is the reference),
# then sheaf serving the same file over HTTP (binary tensors) at concurrency 1, 8 and 64, with
# the ratio served/in-process per level, and the served compute per batch against one in-process
# batch at the mean batch size the level formed (time lost inside the instance). Models: the generated MLP 512-2048-2048-10 and the
# real text-orientation CNN from model_repository/.
# With ROUNDS above 1, c=64 is measured again in ROUNDS rounds, each right after the in-process
# loop ran again at its best batch size (`sheaf bench --alternate`), and each ratio pairs two
# figures taken seconds apart: on a virtual machine whose cores change speed from minute to
# minute, that is the comparison that holds.
# Usage: bench/served_vs_inprocess.sh [seconds per level, default 5] [ROUNDS, default 1]
set -euo pipefail
# The servers started here stop at once on SIGTERM: no load balancer waits for them.
export SHEAF_DRAIN_DELAY=0
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
secs=${1:-5}
rounds=${2:-1}
port=${SHEAF_BENCH_PORT:-18431}
bash scripts/setup.sh
cargo build --release --locked -p sheaf
sheaf="${CARGO_TARGET_DIR:-./target}/release/sheaf"
mkdir -p bench/out
log=bench/out/server.log
"$sheaf" serve --model-repository model_repository --http-port "$port" >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null && break
  sleep 0.2
done
echo "machine: $(nproc) cores, $(uname -m); sheaf $(git rev-parse --short HEAD)"
echo
"$sheaf" bench --url "http://127.0.0.1:$port" --model mlp --concurrency 1,8,64 --duration "$secs" \
  --in-process model_repository/mlp/1/model.onnx --batch-sizes 1,8,32,64
echo
"$sheaf" bench --url "http://127.0.0.1:$port" --model orientation --concurrency 1,8,64 --duration "$secs" \
  --in-process model_repository/orientation/1/model.onnx --batch-sizes 1,4,16
if [ "$rounds" -gt 1 ]; then
  for spec in "mlp 1,8,32,64" "orientation 1,4,16"; do
    set -- $spec
    echo
    "$sheaf" bench --url "http://127.0.0.1:$port" --model "$1" --concurrency 64 --duration "$secs" \
      --in-process "model_repository/$1/1/model.onnx" --batch-sizes "$2" --alternate "$rounds"
  done
fi
