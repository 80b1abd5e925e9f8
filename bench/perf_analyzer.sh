#!/usr/bin/env bash
# Triton's own load generator, perf_analyzer, against sheaf over HTTP (binary tensors) and gRPC,
# at concurrency 1, 8, 32 and 64, on an MLP 512->1024->10 with 1x512 FP32 requests.
#
# perf_analyzer comes from the tritonclient 2.40.0 wheel (its data/bin folder). It needs
# libcudart (PyPI nvidia-cuda-runtime-cu12) and Debian's libb64-0d, even on a CPU-only machine.
# Per-level CSVs go to bench/out/; a summary table is printed at the end.
# Usage: bench/perf_analyzer.sh [measurement interval in ms, default 3000]
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
interval=${1:-3000}
http_port=${SHEAF_BENCH_PORT:-18441}
grpc_port=$((http_port + 1))
cache="${SHEAF_CACHE:-$HOME/.cache/sheaf}"
pa_dir=.cache/perf_analyzer

bash scripts/setup.sh
sheaf_binary

if [ ! -x "$pa_dir/perf_analyzer" ] || [ ! -e "$pa_dir/libcudart.so.12" ]; then
  mkdir -p "$pa_dir" "$cache/wheels"
  .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps -d "$cache/wheels" \
    "tritonclient==2.40.0" "nvidia-cuda-runtime-cu12==12.9.79"
  unzip -o -q -j "$cache"/wheels/tritonclient-2.40.0-*.whl 'tritonclient-2.40.0.data/data/bin/perf_analyzer' -d "$pa_dir"
  unzip -o -q -j "$cache"/wheels/nvidia_cuda_runtime_cu12-12.9.79-*.whl 'nvidia/cuda_runtime/lib/libcudart.so.12' -d "$pa_dir"
  chmod +x "$pa_dir/perf_analyzer"
fi
if ! ldconfig -p | grep -q 'libb64.so.0d'; then
  apt-get install -y -q libb64-0d >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q libb64-0d >/dev/null; }
fi

repo=.cache/bench-repo
if [ ! -s "$repo/mlp_small/1/model.onnx" ]; then
  mkdir -p "$repo/mlp_small/1"
  .venv/bin/python scripts/make_models.py mlp_small "$repo/mlp_small/1/model.onnx"
fi
printf 'max_batch_size: 32\nmax_queue_delay_us: 500\n' >"$repo/mlp_small/config.yaml"

mkdir -p bench/out
serve bench/out/perf_analyzer_server.log --model-repository "$repo" --http-port "$http_port" \
  --grpc-port "$grpc_port"
machine_line

for protocol in http grpc; do
  port=$http_port
  [ "$protocol" = grpc ] && port=$grpc_port
  for c in 1 8 32 64; do
    echo "perf_analyzer: $protocol, concurrency $c" >&2
    LD_LIBRARY_PATH="$root/$pa_dir" "$pa_dir/perf_analyzer" -m mlp_small -u "127.0.0.1:$port" -i "$protocol" \
      --concurrency-range "$c:$c" --measurement-interval "$interval" \
      -f "bench/out/pa_${protocol}_${c}.csv" >"bench/out/pa_${protocol}_${c}.log" 2>&1 \
      || { cat "bench/out/pa_${protocol}_${c}.log" >&2; exit 1; }
  done
done

.venv/bin/python - <<'PY'
import csv
print(f"{'protocol':>8} {'concurrency':>11} {'infer/s':>10} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8}")
for protocol in ("http", "grpc"):
    for c in (1, 8, 32, 64):
        with open(f"bench/out/pa_{protocol}_{c}.csv") as f:
            row = next(csv.DictReader(f))
        ms = lambda k: int(row[k]) / 1000
        print(f"{protocol:>8} {c:>11} {float(row['Inferences/Second']):>10.1f} "
              f"{ms('p50 latency'):>8.2f} {ms('p90 latency'):>8.2f} {ms('p99 latency'):>8.2f}")
PY
