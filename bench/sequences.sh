#!/usr/bin/env bash
# Stateful streams at 25 frames per second: how many sequences of the demo GRU stream model one
# CPU instance carries with p99 under 40 ms, batching across sequences against one at a time.
#
# One server, one repository, two models from the same ONNX file (model_repository/gru):
#   gru      -- the demo configuration: the `oldest` strategy batches the ready frames of
#               different sequences together (max_batch_size 64);
#   gru_one  -- the same with max_batch_size 1: each frame runs alone, one sequence at a time.
# `sheaf bench --streams N --fps 25 --sequences` opens N sequences, each sending a frame every
# 40 ms on its own clock (open loop: a late answer does not slow the stream), over HTTP.
# Usage: bench/sequences.sh [seconds per level, default 5] [stream counts, default 25,50,...]
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
secs=${1:-5}
levels=${2:-25,50,75,100,150,200,300,400,500}
port=${SHEAF_BENCH_PORT:-18435}
bash scripts/setup.sh
sheaf_binary
for name in gru gru_one; do
  mkdir -p "$work/$name/1"
  ln -s "$root/model_repository/gru/1/model.onnx" "$work/$name/1/model.onnx"
done
cp model_repository/gru/config.pbtxt "$work/gru/config.pbtxt"
sed 's/^max_batch_size: 64/max_batch_size: 1/' model_repository/gru/config.pbtxt >"$work/gru_one/config.pbtxt"
mkdir -p bench/out
machine_line "$secs s per level"
serve bench/out/sequences-server.log --model-repository "$work" --http-port "$port" \
  --grpc-port 0 --metrics-port 0
for model in gru gru_one; do
  echo
  echo "== $model"
  "$sheaf" bench --url "http://127.0.0.1:$port" --model "$model" --streams "$levels" --fps 25 \
    --sequences --duration "$secs" | tee "bench/out/sequences-$model.txt"
done
echo
echo "== sequences carried at p99 < 40 ms, no errors (the most streams of the levels run)"
for model in gru gru_one; do
  awk -v m="$model" '$1 == "streams" && $8 < 40 && $NF == "0" {best = $2}
    END {printf "%s: %s\n", m, best ? best : "none"}' "bench/out/sequences-$model.txt"
done
