#!/usr/bin/env bash
# sheaf on an NVIDIA GPU against in-process ONNX Runtime on the same GPU, measured in one run.
#
# For each model (the demo's opennsfw, EfficientNet-Lite0 when its file is given, the demo MLP):
# in-process ONNX Runtime (CUDA) at batch sizes 1..256, each in a warmed session of its own (the
# limit), then sheaf serving it on cuda:0 over HTTP (binary tensors) and over gRPC at
# concurrency 1, 16, 64 and 256, one item per request, with served/in-process per level.
# Then the memory ledger against the driver's figure, with every model loaded together.
#
# Needs a GPU and its driver, and ONNX Runtime's CUDA build: `scripts/setup.sh --gpu`, or
# ORT_DYLIB_PATH pointing at it. On a machine without cargo, set SHEAF_BIN to a release build.
# Usage: bench/gpu.sh [seconds per level, default 5] [efficientnet-lite0.onnx]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
secs=${1:-5}
effnet=${2:-}
port=${SHEAF_BENCH_PORT:-18531}
grpc_port=$((port + 1))
if [ -z "${SHEAF_BIN:-}" ]; then
  bash scripts/setup.sh --gpu
  cargo build --release --locked -p sheaf
  SHEAF_BIN=./target/release/sheaf
fi
nvidia-smi -L >/dev/null || { echo "bench/gpu.sh: no NVIDIA GPU answers (nvidia-smi)" >&2; exit 1; }

# A repository of the models with the demo's batching settings, every model on cuda:0.
repo=$(mktemp -d)
trap 'kill $server 2>/dev/null || true; rm -rf "$repo"' EXIT
server=
add() { # add NAME FILE CONFIG
  mkdir -p "$repo/$1/1"
  ln -s "$(realpath "$2")" "$repo/$1/1/model.onnx"
  printf '%s\n' "$3" >"$repo/$1/config.yaml"
}
add nsfw model_repository/nsfw/1/model.onnx "max_batch_size: auto"
add mlp model_repository/mlp/1/model.onnx "max_batch_size: 128"
models=(nsfw mlp)
if [ -n "$effnet" ]; then
  add effnet "$effnet" "max_batch_size: 64"
  models=(nsfw effnet mlp)
fi
echo 'devices: ["cuda:0"]' >"$repo/sheaf.yaml"

mkdir -p bench/out
log=bench/out/gpu-server.log
used_before=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0)
"$SHEAF_BIN" serve --model-repository "$repo" --config "$repo/sheaf.yaml" \
  --http-port "$port" --grpc-port "$grpc_port" --metrics-port 0 >"$log" 2>&1 &
server=$!
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null && break
  kill -0 $server 2>/dev/null || { echo "sheaf exited; see $log" >&2; exit 1; }
  sleep 0.5
done
echo "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i 0), $(nproc) cores; sheaf $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

echo
echo "== memory: the ledger against the driver, ${#models[@]} models loaded together"
used_after=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0)
curl -sf "http://127.0.0.1:$port/stats" | python3 -c '
import json, sys
s = json.load(sys.stdin)
driver = int(sys.argv[1])
mib = 2 ** 20
for gpu in s["per_gpu_stats"]:
    booked = gpu["memory_used_bytes"] // mib
    print("%s: ledger %d MiB, driver %d MiB more in use than before sheaf started: ledger/driver %.2f;"
          " installed %d MiB" % (gpu["device"], booked, driver, booked / max(driver, 1),
                                 gpu["memory_total_bytes"] // mib))
for name, m in s["models"].items():
    print("  %s: %d MiB (%s)" % (name, m.get("memory_bytes", 0) // mib, m.get("memory_source")))
' "$((used_after - used_before))"

for m in "${models[@]}"; do
  file="$repo/$m/1/model.onnx"
  chosen=$(curl -sf "http://127.0.0.1:$port/v2/models/$m/config" | python3 -c 'import json,sys; print(json.load(sys.stdin)["max_batch_size"])')
  echo
  echo "== $m (max_batch_size in force: $chosen), HTTP"
  "$SHEAF_BIN" bench --url "http://127.0.0.1:$port" --model "$m" --concurrency 1,16,64,256 \
    --duration "$secs" --in-process "$file" --device cuda:0 --batch-sizes 1,2,4,8,16,32,64,128,256
  echo
  echo "== $m, gRPC"
  "$SHEAF_BIN" bench --url "http://127.0.0.1:$grpc_port" --http-url "http://127.0.0.1:$port" \
    --protocol grpc --model "$m" --concurrency 1,16,64,256 --duration "$secs" \
    --in-process "$file" --device cuda:0 --batch-sizes 1,2,4,8,16,32,64,128,256
done
