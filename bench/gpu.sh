#!/usr/bin/env bash
# sheaf on one device against a plain in-process loop on the same device, measured in one run,
# written as one table into bench/RESULTS.md.
#
# For each model (the demo's nsfw (ResNet-50, 602 KB an item), EfficientNet-Lite0 (602 KB), the
# DCGAN face generator (400 bytes) and the MLP):
# 1. in-process three ways at each batch size: a plain Python loop over ONNX Runtime
#    (bench/plain_loop.py), `sheaf bench --in-process` (loaded as the server loads it), and the
#    server's own `max_batch_size: auto` probe where the model uses it: one in-process truth;
# 2. the device memory each model takes as it loads, one after the other, against what its
#    largest batch size holds alone in the plain loop, and the whole after the run;
# 3. served over HTTP (binary tensors) and gRPC at each concurrency level, one item a request:
#    items/s against the plain loop's best, the client's p50, and the server's stages;
# 4. SIGTERM exits with their exit codes, each after serving every model.
#
# Usage: bench/gpu.sh [--device cuda:0|cpu] [--seconds 5] [--levels 1,8,16,64,256]
#                     [--exits 10] [--out bench/RESULTS.md] [--models nsfw,efficientnet,faces,mlp]
#                     [--config "io_binding: false"]  (a line added to every model's config.yaml)
# On a GPU it needs the driver and ONNX Runtime's CUDA build (`scripts/setup.sh --gpu`, or
# ORT_DYLIB_PATH); on a machine without cargo, set SHEAF_BIN to a release build. With
# `--device cpu` it runs anywhere, with CPU-sized batches: the test suite runs it that way.
set -euo pipefail
# The servers started here stop at once on SIGTERM: no load balancer waits for them.
export SHEAF_DRAIN_DELAY=0
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
device=cuda:0 secs=5 levels=1,8,16,64,256 exits=10 out=bench/RESULTS.md
models=nsfw,efficientnet,faces,mlp model_line=
while [ $# -gt 0 ]; do
  case $1 in
    --device) device=$2 ;;
    --seconds) secs=$2 ;;
    --levels) levels=$2 ;;
    --exits) exits=$2 ;;
    --out) out=$2 ;;
    --models) models=$2 ;;
    --config) model_line=$2 ;;
    *) echo "bench/gpu.sh: unknown option $1 (see the usage at the top of the script)" >&2; exit 2 ;;
  esac
  shift 2
done
case $device in
  cpu) on_gpu=false ;;
  cuda:[0-9]*) on_gpu=true ;;
  *) echo "bench/gpu.sh: --device is cpu or cuda:N, not $device" >&2; exit 2 ;;
esac
PY="$root/.venv/bin/python"
if [ -z "${SHEAF_BIN:-}" ]; then
  if $on_gpu; then bash scripts/setup.sh --gpu; else bash scripts/setup.sh; fi
  cargo build --release --locked -p sheaf
  SHEAF_BIN="${CARGO_TARGET_DIR:-$root/target}/release/sheaf"
fi
[ -x "$PY" ] || PY=python3
if $on_gpu; then
  nvidia-smi -L >/dev/null || { echo "bench/gpu.sh: no NVIDIA GPU answers (nvidia-smi)" >&2; exit 1; }
  gpu_id=${device#cuda:}
fi
port=${SHEAF_BENCH_PORT:-18531}
grpc_port=$((port + 1))
metrics_port=$((port + 2))

# Batch sizes: the GPU's buckets, or what a CPU core gets through in a few seconds.
declare -A config sizes
if $on_gpu; then
  config=([nsfw]="max_batch_size: auto" [efficientnet]="max_batch_size: 64"
    [faces]="max_batch_size: 64" [mlp]="max_batch_size: auto")
  sizes=([nsfw]=1,2,4,8,16,32,64,128,256 [efficientnet]=1,2,4,8,16,32,64,128,256
    [faces]=1,2,4,8,16,32,64,128,256 [mlp]=1,2,4,8,16,32,64,128,256)
else
  config=([nsfw]="max_batch_size: 4" [efficientnet]="max_batch_size: 8"
    [faces]="max_batch_size: 16" [mlp]="max_batch_size: auto")
  sizes=([nsfw]=1,2,4 [efficientnet]=1,2,4,8 [faces]=1,4,16 [mlp]=1,4,16,64)
fi
IFS=, read -r -a names <<<"$models"

work=$(mktemp -d)
server=
trap 'if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; fi; rm -rf "$work"' EXIT
repo=$work/repo
for m in "${names[@]}"; do
  file=model_repository/$m/1/model.onnx
  [ -s "$file" ] || { echo "bench/gpu.sh: $file is missing: run scripts/setup.sh" >&2; exit 1; }
  [ -n "${config[$m]:-}" ] || { echo "bench/gpu.sh: unknown model $m" >&2; exit 2; }
  mkdir -p "$repo/$m/1"
  ln -s "$root/$file" "$repo/$m/1/model.onnx"
  printf '%s\n' "${config[$m]}" ${model_line:+"$model_line"} >"$repo/$m/config.yaml"
done
printf 'devices: ["%s"]\n' "$device" >"$repo/sheaf.yaml"

# Memory the server process holds on the device, in MiB.
memory() {
  if $on_gpu; then
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -i "$gpu_id" |
      awk -F', *' -v pid="$1" '$1 == pid { m += $2 } END { print m + 0 }'
  else
    awk '/^VmRSS:/ { printf "%.1f\n", $2 / 1024 }' "/proc/$1/status"
  fi
}
start() { # start LOG [serve flags...]: starts the server, waits until it is ready
  local log=$1
  shift
  "$SHEAF_BIN" serve --model-repository "$repo" --config "$repo/sheaf.yaml" --log-format json \
    --http-port "$port" --grpc-port "$grpc_port" --metrics-port "$metrics_port" "$@" >"$log" 2>&1 &
  server=$!
  for _ in $(seq 1200); do
    curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null && return 0
    kill -0 "$server" 2>/dev/null || { echo "bench/gpu.sh: sheaf exited; see its log:" >&2; tail -20 "$log" >&2; exit 1; }
    sleep 0.25
  done
  echo "bench/gpu.sh: sheaf never became ready" >&2
  exit 1
}
stop() { # stop: SIGTERM, then adds the exit code to $codes
  local code=0
  kill -TERM "$server"
  wait "$server" || code=$?
  server=
  codes="${codes:+$codes }$code"
}

echo "== plain loop, in-process ($device)"
for m in "${names[@]}"; do
  "$PY" bench/plain_loop.py "model_repository/$m/1/model.onnx" "$device" "$secs" "${sizes[$m]}" \
    >"$work/plain-$m.json"
  echo "$m: $(cat "$work/plain-$m.json")"
done

echo "== loading the models one by one"
start "$work/server.log" --model-control-mode explicit
echo "{}" >"$work/memory.json"
for m in "${names[@]}"; do
  before=$(memory "$server")
  curl -sf -X POST "http://127.0.0.1:$port/v2/repository/models/$m/load" >/dev/null
  after=$(memory "$server")
  "$PY" - "$work/memory.json" "$m" "$before" "$after" <<'EOF'
import json, sys
path, model, before, after = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
d = json.load(open(path)); d[model] = {"load_mib": after - before}; json.dump(d, open(path, "w"))
EOF
  echo "$m: $(awk -v a="$after" -v b="$before" 'BEGIN { printf "%.1f", a - b }') MiB"
done
loaded=$(memory "$server")

for m in "${names[@]}"; do
  for protocol in http grpc; do
    url=http://127.0.0.1:$port
    [ "$protocol" = grpc ] && url=http://127.0.0.1:$grpc_port
    echo "== $m over $protocol"
    extra=()
    # The repository's own file, so that the in-process run reads the served model's config.
    [ "$protocol" = http ] && extra=(--in-process "$repo/$m/1/model.onnx" --device "$device"
      --batch-sizes "${sizes[$m]}")
    "$SHEAF_BIN" bench --url "$url" --http-url "http://127.0.0.1:$port" --protocol "$protocol" \
      --model "$m" --concurrency "$levels" --duration "$secs" --json "$work/$m-$protocol.json" \
      "${extra[@]}" | tee "$work/$m-$protocol.txt"
  done
done
after_run=$(memory "$server")
curl -sf "http://127.0.0.1:$port/stats" >"$work/stats.json"
codes=
stop

echo "== SIGTERM exits"
for i in $(seq 2 "$exits"); do
  start "$work/exit-$i.log"
  for m in "${names[@]}"; do
    "$SHEAF_BIN" bench --url "http://127.0.0.1:$port" --model "$m" --concurrency 8 --requests 32 \
      >/dev/null
  done
  stop
done
echo "exit codes: $codes"

machine=$(if $on_gpu; then nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i "$gpu_id"; else echo "CPU"; fi)
"$PY" bench/gpu_table.py --work "$work" --models "$models" --device "$device" --levels "$levels" \
  --machine "$machine, $(nproc) cores" --commit "$(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
  --memory-loaded "$loaded" --memory-after "$after_run" --exit-codes "$codes" \
  --command "bench/gpu.sh --device $device --seconds $secs --levels $levels --exits $exits" \
  --out "$out"
echo "table written to $out"
