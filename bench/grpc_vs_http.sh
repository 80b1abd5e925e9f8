#!/usr/bin/env bash
# gRPC against HTTP with an image-sized input, measured in one run on one machine.
#
# The model averages a [N, 150528] float32 input (602 KB per item, a 224x224x3 image), so it costs
# almost nothing and the transport is what is measured. sheaf bench (binary tensors over HTTP,
# raw contents over gRPC) and NVIDIA's tritonclient each load it over both protocols, one item
# per request, and the gRPC/HTTP ratio is printed per level.
# Usage: bench/grpc_vs_http.sh [seconds per level, default 5]
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
secs=${1:-5}
port=${SHEAF_BENCH_PORT:-18631}
grpc_port=$((port + 1))
bash scripts/setup.sh --test
sheaf_binary
repo=$work/repo
mkdir -p "$repo"
mkdir -p "$repo/mean/1" bench/out
.venv/bin/python scripts/make_models.py mean "$repo/mean/1/model.onnx"
printf 'max_batch_size: 32\n' >"$repo/mean/config.yaml"
serve bench/out/grpc-server.log --model-repository "$repo" --http-port "$port" \
  --grpc-port "$grpc_port" --metrics-port 0
machine_line
items_per_s() { awk '$2 ~ /^[0-9]+$/ && NF >= 11 {print $2, $4}'; }
levels=1,8,32,64
echo
echo "== sheaf bench, items/s by concurrency"
http=$("$sheaf" bench --url "http://127.0.0.1:$port" --model mean --concurrency $levels \
  --duration "$secs" 2>/dev/null | items_per_s)
grpc=$("$sheaf" bench --url "http://127.0.0.1:$grpc_port" --http-url "http://127.0.0.1:$port" \
  --protocol grpc --model mean --concurrency $levels --duration "$secs" 2>/dev/null | items_per_s)
join <(echo "$http") <(echo "$grpc") | awk '{printf "c=%s: HTTP %s, gRPC %s items/s, gRPC/HTTP %.2f\n", $1, $2, $3, $3/$2}'
echo
echo "== tritonclient (NVIDIA's Python client), items/s by concurrency"
for c in 8 32 64; do
  h=$(.venv/bin/python bench/tritonclient_load.py http "127.0.0.1:$port" mean x 150528 $c "$secs")
  g=$(.venv/bin/python bench/tritonclient_load.py grpc "127.0.0.1:$grpc_port" mean x 150528 $c "$secs")
  echo "c=$c: HTTP $h; gRPC $g" | awk '{printf "%s gRPC/HTTP %.2f\n", $0, $8/$3}'
done
echo
echo "== server CPU time per request (sheaf bench, concurrency 8, 3000 requests each)"
cpu_ms() { awk '{print ($14 + $15) * 10}' "/proc/$server/stat"; }
for proto in http grpc; do
  before=$(cpu_ms)
  if [ $proto = http ]; then
    "$sheaf" bench --url "http://127.0.0.1:$port" --model mean --concurrency 8 --requests 3000 >/dev/null 2>&1
  else
    "$sheaf" bench --url "http://127.0.0.1:$grpc_port" --http-url "http://127.0.0.1:$port" \
      --protocol grpc --model mean --concurrency 8 --requests 3000 >/dev/null 2>&1
  fi
  echo "$proto $(( ($(cpu_ms) - before) * 1000 / 3000 ))"
done | awk '{us[$1] = $2; printf "%s: %d us of server CPU per request\n", $1, $2}
  END {printf "gRPC/HTTP cost: %.2f\n", us["grpc"] / us["http"]}'

