#!/usr/bin/env bash
# A PyTorch model (examples/torch_mlp) served by sheaf's Python backend on a GPU, against the
# same model called in-process on the same GPU, in one run:
# 1. in-process: the model's `infer` in a loop at each batch size (the reference);
# 2. served: 64 concurrent requests checked against the network on the CPU, the execution count
#    (fewer than requests: they were batched), what /stats books for the instance and what the
#    driver lists per process;
# 3. `sheaf bench` over HTTP at each concurrency, items/s against the in-process best, then the
#    booking and the driver's listing again;
# 4. unload: the instance's process and its device memory are gone.
# Usage: bench/torch_gpu.sh [--device cuda:0] [--seconds 3] [--levels 1,16,64,256]
# It needs a Python with PyTorch (`--python`, default python3) and, on a machine without cargo,
# SHEAF_BIN set to a release build. `--device cpu` runs it anywhere PyTorch is installed.
set -euo pipefail
export SHEAF_DRAIN_DELAY=0
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
device=cuda:0 secs=3 levels=1,16,64,256 py=python3
while [ $# -gt 0 ]; do
  case $1 in
    --device) device=$2 ;;
    --seconds) secs=$2 ;;
    --levels) levels=$2 ;;
    --python) py=$2 ;;
    *) echo "bench/torch_gpu.sh: unknown option $1 (see the usage at the top)" >&2; exit 2 ;;
  esac
  shift 2
done
"$py" -c "import torch" || { echo "bench/torch_gpu.sh: $py has no PyTorch" >&2; exit 1; }
if [ -z "${SHEAF_BIN:-}" ]; then
  cargo build --release --locked -p sheaf
  SHEAF_BIN="${CARGO_TARGET_DIR:-$root/target}/release/sheaf"
fi
port=${SHEAF_BENCH_PORT:-18561}
work=$(mktemp -d)
server=
trap 'if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; fi; rm -rf "$work"' EXIT
mkdir -p "$work/repo"
cp -r examples/torch_mlp "$work/repo/torch_mlp"
printf 'devices: ["%s"]\n' "$device" >"$work/repo/sheaf.yaml"

echo "== in-process ($device)"
"$py" bench/python/inprocess.py examples/torch_mlp "$secs" 1,16,64,128,256 input 512 "$device" |
  tee "$work/inprocess.jsonl"

echo "== served ($device)"
"$SHEAF_BIN" serve --model-repository "$work/repo" --config "$work/repo/sheaf.yaml" \
  --python "$(command -v "$py")" --model-control-mode explicit --http-port "$port" \
  --grpc-port 0 --metrics-port 0 >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 240); do
  curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null && break
  kill -0 "$server" 2>/dev/null || { tail -20 "$work/server.log" >&2; exit 1; }
  sleep 0.25
done
curl -sf -X POST "http://127.0.0.1:$port/v2/repository/models/torch_mlp/load" >/dev/null ||
  { echo "load failed:" >&2; tail -20 "$work/server.log" >&2; exit 1; }
"$py" bench/torch_gpu.py examples/torch_mlp "$device" "http://127.0.0.1:$port" torch_mlp |
  tee "$work/check.json"
"$SHEAF_BIN" bench --url "http://127.0.0.1:$port" --model torch_mlp --concurrency "$levels" \
  --duration "$secs" --json "$work/served.json"
best=$(tail -1 "$work/inprocess.jsonl")
"$py" - "$work/served.json" "$best" <<'PY'
import json, sys
levels, best = json.load(open(sys.argv[1])), json.loads(sys.argv[2])
print(f"in-process best: {best['best_items_per_s']:.0f} items/s at batch {best['best_batch']}")
print("| c | served items/s | / in-process | p50 ms |")
print("|---|---|---|---|")
for l in levels:
    print(f"| {l['level']} | {l['items_per_s']:.0f} | {l['items_per_s'] / best['best_items_per_s']:.2f} | {l['p50_ms']:.2f} |")
PY
# The manager books the instance again as it grows while serving (memory_source: serving).
echo "after the levels: $("$py" bench/torch_gpu.py booked "http://127.0.0.1:$port" torch_mlp)"
curl -sf -X POST "http://127.0.0.1:$port/v2/repository/models/torch_mlp/unload" >/dev/null
sleep 2
echo "after unload, the driver lists: [$(nvidia-smi --query-compute-apps=pid,used_memory \
  --format=csv,noheader,nounits 2>/dev/null | tr '\n' ';')]"
echo "python processes left: $(pgrep -fc sheaf_runner || true)"
kill -TERM "$server"
code=0
wait "$server" || code=$?
server=
echo "exit code: $code"
