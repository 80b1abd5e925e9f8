#!/usr/bin/env bash
# Scheduling benchmark on simulated devices with the seeds' GPU cost curves, and the three
# batching policies compared on sim and on a real ONNX model. Prints measured against analytical.
#
#   seed 000 (real-time lip-sync video): 1 frame 35 ms, 4 frames 52 ms, linear. How many 25 FPS
#            streams does one device hold with p99 <= 80 ms?
#   seed 001 (image generation): 1 image 15 s, 8 images 40 s, scaled x1/1000, max batch 8.
#            Last-user latency for a burst of 50 against the optimal schedule, on 1 device and
#            on 4 devices with queue_depth routing.
#   policies: fixed / queue_depth / latency_slo at concurrency 1, 8, 64 on a sim curve
#            (2 ms + 0.1 ms/item) and on the real MLP 512-2048-2048-10.
# Usage: bench/scheduling.sh [seconds per level, default 4]
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
secs=${1:-4}
port=${SHEAF_BENCH_PORT:-18451}
bash scripts/setup.sh
sheaf_binary
repo=.cache/bench-sched
rm -rf "$repo" && mkdir -p "$repo" bench/out

sim() { # name, latency, config
  mkdir -p "$repo/$1"
  printf 'input: {name: x, shape: [-1, 16]}\noutput: {name: y}\nlatency_ms: %b\n' "$2" >"$repo/$1/model.sim.yaml"
  printf '%b' "$3" >"$repo/$1/config.yaml"
}
sim seed000 "{points: [[1, 35], [4, 52]]}" "max_batch_size: 16\n"
sim seed001 "{points: [[1, 15000], [8, 40000]]}\ntime_scale: 0.001" "max_batch_size: 8\n"
for p in fixed queue_depth latency_slo; do
  policy="max_batch_size: 64\nmax_queue_delay_us: 2000\nbatching: {policy: $p, latency_slo_ms: 50, adaptive_threshold: 8, min_wait_us: 100}\n"
  sim "sim_$p" "{a: 2, b: 0.1}" "$policy"
  mkdir -p "$repo/mlp_$p/1"
  ln -sf "$root/model_repository/mlp/1/model.onnx" "$repo/mlp_$p/1/model.onnx"
  printf '%b' "$policy" >"$repo/mlp_$p/config.yaml"
done

server=""
start() { # extra args
  if [ -n "$server" ]; then stop "$server"; fi
  serve bench/out/sched_server.log --model-repository "$repo" --http-port "$port" \
    --grpc-port $((port + 1)) "$@"
}
bench() { "$sheaf" bench --url "http://127.0.0.1:$port" --duration "$secs" "$@"; }

echo "== seed 000: 25 FPS streams on one device (t(b) = 29.33 + 5.667 b ms) =="
echo "analytical: throughput bound 40/5.667 = 7.06 streams at unbounded batches; a batch of N aligned"
echo "frames must finish within one 40 ms period, t(N) <= 40 ms, so N = 1 holds p99 <= 80 ms with"
echo "room to spare (t(2) = 40.7 ms is just past the period)"
start
for n in 1 2 3 4 5 6; do bench --model seed000 --streams "$n" --fps 25; done

echo
echo "== seed 001: burst of 50, max batch 8 (t(b) = 11.43 + 3.571 b ms) =="
echo "analytical optimum, 1 device: 7 batches, 7 x 11.43 + 50 x 3.571 = 258.6 ms to the last user"
bench --model seed001 --burst 50
bench --model seed001 --burst 50
start --config <(printf "devices: ['sim:0', 'sim:1', 'sim:2', 'sim:3']\nrouting: queue_depth\n")
echo "analytical optimum, 4 devices: 13/13/12/12 items in 2 batches each, 2 x 11.43 + 13 x 3.571 = 69.3 ms"
bench --model seed001 --burst 50
bench --model seed001 --burst 50

echo
echo "== policies at concurrency 1, 8, 64 =="
start
for p in fixed queue_depth latency_slo; do
  echo "-- sim (2 ms + 0.1 ms/item), $p"
  bench --model "sim_$p" --concurrency 1,8,64
done
for p in fixed queue_depth latency_slo; do
  echo "-- real ONNX MLP 512-2048-2048-10, $p"
  bench --model "mlp_$p" --concurrency 1,8,64
done
