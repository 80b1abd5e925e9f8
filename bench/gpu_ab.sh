#!/usr/bin/env bash
# Two builds of sheaf served in turn on one device, in one run: each round starts the first
# build, measures every model at each concurrency level, stops it, then does the same with the
# second, so that both see the same minutes of the machine. Beside them, the plain loop
# (bench/plain_loop.py) at the batch sizes given, for the ratios.
#
# Usage: bench/gpu_ab.sh OLD_SHEAF NEW_SHEAF [--device cuda:0] [--rounds 2] [--seconds 2]
#          [--levels 16,32,64,96] [--models nsfw,efficientnet] [--config "max_batch_size: 64"]
#          [--sizes 16,32,64] [--json DIR] [--new-config LINES]
# --new-config gives the second build's models other config lines than --config (for instance
# $'max_batch_size: 64\ninstances: 2'); with the same binary twice, it measures two
# configurations of one build in turn. On a GPU, each server's device memory after its models
# have loaded is printed.
# With --json, each build's levels of each model and round go to DIR/ROUND-BUILD-MODEL.json
# (`sheaf bench --json`: items/s, percentiles, the stages and the mean batch per level).
# Needs the models in model_repository/ (scripts/setup.sh) and, on a GPU, ONNX Runtime's CUDA
# build (scripts/setup.sh --gpu, or ORT_DYLIB_PATH as ../shared/gpu/unpack.sh sets it).
# Prints each build's `sheaf bench` lines, the stages with them, per round.
set -euo pipefail
export SHEAF_DRAIN_DELAY=0
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
[ $# -ge 2 ] || { sed -n '2,11p' "$0" >&2; exit 2; }
old=$1 new=$2
shift 2
device=cuda:0 rounds=2 secs=2 levels=16,32,64,96 models=nsfw,efficientnet
config="max_batch_size: 64" sizes=16,32,64 json= new_config=
while [ $# -gt 0 ]; do
  case $1 in
    --device) device=$2 ;;
    --rounds) rounds=$2 ;;
    --seconds) secs=$2 ;;
    --levels) levels=$2 ;;
    --models) models=$2 ;;
    --config) config=$2 ;;
    --new-config) new_config=$2 ;;
    --sizes) sizes=$2 ;;
    --json) json=$2 ;;
    *) echo "bench/gpu_ab.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
PY="$root/.venv/bin/python"
[ -x "$PY" ] || PY=python3
port=${SHEAF_BENCH_PORT:-18531}
IFS=, read -r -a names <<<"$models"
[ -z "$json" ] || mkdir -p "$json"
work=$(mktemp -d)
server=
trap 'if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; fi; rm -rf "$work"' EXIT
for m in "${names[@]}"; do
  file=model_repository/$m/1/model.onnx
  [ -s "$file" ] || { echo "bench/gpu_ab.sh: $file is missing: run scripts/setup.sh" >&2; exit 1; }
  mkdir -p "$work/repo/$m/1"
  ln -s "$root/$file" "$work/repo/$m/1/model.onnx"
done
printf 'devices: ["%s"]\n' "$device" >"$work/repo/sheaf.yaml"

for m in "${names[@]}"; do
  echo "plain loop, $m: $("$PY" bench/plain_loop.py "model_repository/$m/1/model.onnx" "$device" "$secs" "$sizes")"
done
for round in $(seq "$rounds"); do
  for build in old new; do
    bin=$old lines=$config
    [ "$build" = new ] && bin=$new lines=${new_config:-$config}
    for m in "${names[@]}"; do printf '%s\n' "$lines" >"$work/repo/$m/config.yaml"; done
    "$bin" serve --model-repository "$work/repo" --config "$work/repo/sheaf.yaml" \
      --http-port "$port" --grpc-port $((port + 1)) --metrics-port $((port + 2)) \
      >"$work/serve.log" 2>&1 &
    server=$!
    ready=false
    for _ in $(seq 1200); do
      if curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null; then ready=true; break; fi
      kill -0 "$server" 2>/dev/null || break
      sleep 0.25
    done
    $ready || { echo "bench/gpu_ab.sh: $bin did not become ready:" >&2; tail -20 "$work/serve.log" >&2; exit 1; }
    if [[ $device == cuda:* ]]; then
      echo "== round $round, $build: device memory $(nvidia-smi --query-compute-apps=pid,used_memory \
        --format=csv,noheader,nounits -i "${device#cuda:}" |
        awk -F', *' -v pid="$server" '$1 == pid { m += $2 } END { print m + 0 }') MiB after load"
    fi
    for m in "${names[@]}"; do
      echo "== round $round, $build ($bin), $m"
      "$bin" bench --url "http://127.0.0.1:$port" --model "$m" --concurrency "$levels" \
        --duration "$secs" ${json:+--json "$json/$round-$build-$m.json"}
    done
    code=0
    kill -TERM "$server"
    wait "$server" || code=$?
    server=
    echo "exit code: $code"
  done
done
