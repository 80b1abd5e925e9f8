#!/usr/bin/env bash
# Workers behind one NATS JetStream queue, all on this machine, with simulated devices.
#
#   scaling: a gateway and 1, 2 and 3 workers serving a sim model (20 ms + 1 ms per item, max
#            batch 8); closed-loop load at concurrency 96 through the gateway. Prints items/s
#            against one worker, and one worker served directly (no queue) for the queue's cost.
#   seed 001: a burst of 50 image requests (1 image 15 s, 8 images 40 s, scaled x1/1000, max
#            batch 8) through a gateway to 4 workers of one sim device each. Prints the last
#            user's latency against the optimal schedule (2 batches per device, 69.3 ms).
# Needs nats-server (scripts/setup.sh --test installs it). Usage: bench/queue.sh [seconds per level]
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
secs=${1:-5}
port=${SHEAF_BENCH_PORT:-18651}
bash scripts/setup.sh --test >/dev/null
sheaf_binary
repo=.cache/bench-queue
rm -rf "$repo" && mkdir -p "$repo/sim" "$repo/seed001" bench/out
printf 'input: {name: x, shape: [-1, 16]}\noutput: {name: y}\nlatency_ms: {a: 20, b: 1}\n' >"$repo/sim/model.sim.yaml"
printf 'max_batch_size: 8\nmax_queue_delay_us: 2000\n' >"$repo/sim/config.yaml"
printf 'input: {name: x, shape: [-1, 16]}\noutput: {name: y}\nlatency_ms: {points: [[1, 15000], [8, 40000]]}\ntime_scale: 0.001\n' \
  >"$repo/seed001/model.sim.yaml"
printf 'max_batch_size: 8\n' >"$repo/seed001/config.yaml"

workers=()
stop_all() { stop "${workers[@]}"; workers=(); }
store=$work/store
mkdir -p "$store"
nats-server -js -a 127.0.0.1 -p "$port" -sd "$store" >bench/out/queue_nats.log 2>&1 &
pids+=($!)
sleep 0.5
n=0
worker() { # stream, repository or "", extra args; starts a sheaf and waits until it is ready
  local http=$((port + 10 + n * 3)) stream=$1 repo_arg=()
  n=$((n + 1))
  [ -n "$2" ] && repo_arg=(--model-repository "$2")
  serve "bench/out/queue_server_$http.log" "${repo_arg[@]}" --http-port "$http" \
    --grpc-port $((http + 1)) --metrics-port $((http + 2)) --queue "nats://127.0.0.1:$port" \
    --queue-stream "$stream" --queue-prefix "$(echo "$stream" | tr A-Z a-z).infer" "${@:3}"
  workers+=("$server")
  last=$http
}
rate() { # gateway port, worker port; prints items/s
  "$sheaf" bench --url "http://127.0.0.1:$1" --http-url "http://127.0.0.1:$2" --model sim --concurrency 96 \
    --duration "$secs" --json bench/out/queue_bench.json >/dev/null 2>&1
  .venv/bin/python -c 'import json; r = json.load(open("bench/out/queue_bench.json"))[0]; assert r["errors"] == 0, r; print(r["items_per_s"])'
}

echo "== scaling: sim (20 ms + 1 ms/item, max batch 8), concurrency 96 =="
worker SCALE "$repo"; w1=$last
direct=$("$sheaf" bench --url "http://127.0.0.1:$w1" --model sim --concurrency 96 --duration "$secs" --json bench/out/queue_bench.json >/dev/null 2>&1 \
  && .venv/bin/python -c 'import json; print(json.load(open("bench/out/queue_bench.json"))[0]["items_per_s"])')
worker SCALE ""; gw=$last
one=$(rate "$gw" "$w1")
printf 'one worker, direct HTTP (no queue)   %8.1f items/s\n' "$direct"
printf '1 worker behind the queue            %8.1f items/s  %.2fx direct\n' "$one" "$(.venv/bin/python -c "print($one / $direct)")"
for k in 2 3; do
  worker SCALE "$repo"
  r=$(rate "$gw" "$w1")
  printf '%d workers behind the queue           %8.1f items/s  %.2fx one worker\n' "$k" "$r" "$(.venv/bin/python -c "print($r / $one)")"
done
stop_all

echo
echo "== seed 001: burst of 50, 4 workers of one sim device each =="
echo "optimal schedule: 13/13/12/12 items in 2 batches per device, 2 x 11.43 + 13 x 3.571 = 69.3 ms"
for _ in 1 2 3 4; do worker BURST "$repo"; w=$last; done
worker BURST ""; gw=$last
for k in 1 2 3; do
  "$sheaf" bench --url "http://127.0.0.1:$gw" --http-url "http://127.0.0.1:$w" --model seed001 --burst 50 \
    --json bench/out/queue_bench.json >/dev/null 2>&1
  .venv/bin/python -c 'import json, sys
r = json.load(open("bench/out/queue_bench.json"))[0]
assert r["errors"] == 0, r
last, median = r["max_ms"], r["p50_ms"]
print(f"burst {sys.argv[1]}: last user {last:.1f} ms, median {median:.1f} ms, {last / 69.3:.2f}x optimal")' "$k"
done
