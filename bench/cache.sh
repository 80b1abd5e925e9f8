#!/usr/bin/env bash
# The response cache on the embedding model, measured in one run on one machine.
#
# all-MiniLM-L6-v2 (the demo repository's `minilm`) served twice from one folder: once with the
# response cache (`response_cache: true`, --cache-size 64 MiB) and once without. `sheaf bench
# --embed` sends one sentence per request, half of them repeats of 64 sentences and half never
# sent before (--repeat-rate 0.5), at concurrency 1, 8 and 64, against each server in turn.
# Usage: bench/cache.sh [seconds per level, default 5] [repeat rate, default 0.5]
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
secs=${1:-5}
repeat=${2:-0.5}
port=${SHEAF_BENCH_PORT:-18434}
bash scripts/setup.sh
sheaf_binary
for kind in on off; do
  mkdir -p "$work/$kind"
  link_model minilm "$work/$kind"
  rm "$work/$kind/minilm/config.yaml"
  cp model_repository/minilm/config.yaml "$work/$kind/minilm/config.yaml"
done
echo "response_cache: true" >>"$work/on/minilm/config.yaml"
mkdir -p bench/out
machine_line "repeat rate $repeat"
for kind in off on; do
  serve "bench/out/cache-$kind.log" --model-repository "$work/$kind" --http-port "$port" \
    --grpc-port 0 --metrics-port 0 --cache-size $((64 << 20))
  echo
  echo "== cache $kind"
  "$sheaf" bench --embed --url "http://127.0.0.1:$port" --model minilm --concurrency 1,8,64 \
    --duration "$secs" --repeat-rate "$repeat" | tee "bench/out/cache-$kind.txt"
  curl -s "http://127.0.0.1:$port/v2/models/minilm/stats" | .venv/bin/python -c '
import json, sys
s = json.load(sys.stdin)["model_stats"][0]["inference_stats"]
print("cache hits", s["cache_hit"]["count"], "misses", s["cache_miss"]["count"])'
  stop "$server"
done
echo
echo "== cache on / off"
join <(awk '$1 ~ /^[0-9]+$/ {print $1, $2, $3}' bench/out/cache-off.txt) \
     <(awk '$1 ~ /^[0-9]+$/ {print $1, $2, $3}' bench/out/cache-on.txt) |
  awk '{printf "c=%s: %.1f -> %.1f sentences/s (%.2fx), p50 %.2f -> %.2f ms\n", $1, $2, $4, $4/$2, $3, $5}'
