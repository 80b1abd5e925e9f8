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
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
secs=${1:-5}
rounds=${2:-1}
port=${SHEAF_BENCH_PORT:-18431}
bash scripts/setup.sh
sheaf_binary
mkdir -p bench/out
serve bench/out/server.log --model-repository model_repository --http-port "$port"
machine_line
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
