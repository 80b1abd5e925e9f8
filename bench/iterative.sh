#!/usr/bin/env bash
# Continuous batching of a Python step loop (Triton's iterative sequences) against the batching
# most hand-written loops do, both served by sheaf, side by side in one run on one machine.
#
# The models (bench/python/triton/stepper, stepper_static) run the same steps (step.py: 2 ms plus
# 0.1 ms a request of the batch, slept, as a GPU's step grows little with its batch). `stepper`
# runs one step of each request per execute and reschedules the request until its last step,
# so a finished request's place goes to a waiting one at once; `stepper_static` runs a batch
# until its longest request is done. Load: bench/python/iterative_load.py (tritonclient HTTP,
# closed loop, 80% of requests 4-8 steps, 20% 64 steps) at concurrency 4, 16 and 32.
# Usage: bench/iterative.sh [seconds per level, default 8]
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
secs=${1:-8}
port=${SHEAF_BENCH_PORT:-18480}
bash scripts/setup.sh
sheaf_binary

out=bench/out/iterative
rm -rf "$out" && mkdir -p "$out/repo"
cp -r bench/python/triton/stepper bench/python/triton/stepper_static "$out/repo/"
cp bench/python/triton/step.py "$out/repo/"
load() {
  for c in 4 16 32; do
    .venv/bin/python bench/python/iterative_load.py "127.0.0.1:$1" "$2" "$c" "$secs"
  done | tee "$out/$3.jsonl"
}

machine_line
echo; echo "== sheaf"
serve "$out/sheaf.log" --model-repository "$out/repo" --http-port "$port" \
  --grpc-port $((port + 1)) --metrics-port 0
wait_for "http://127.0.0.1:$port/v2/models/stepper/ready" "$server" "$out/sheaf.log"
wait_for "http://127.0.0.1:$port/v2/models/stepper_static/ready" "$server" "$out/sheaf.log"
load "$port" stepper sheaf-iterative
load "$port" stepper_static sheaf-static
stop "$server"

echo
.venv/bin/python - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = {p.stem: [json.loads(l) for l in p.read_text().splitlines()] for p in out.glob("*.jsonl")}
base = {r["concurrency"]: r for r in rows.get("sheaf-iterative", [])}
print("| batching | c | requests/s | steps/s | short p50 / p99 ms | long p50 / p99 ms | iterative / it (requests/s) |")
print("|---|---|---|---|---|---|---|")
for name in ("sheaf-iterative", "sheaf-static"):
    for r in rows.get(name, []):
        b = base.get(r["concurrency"])
        ratio = f'{b["requests_per_s"] / r["requests_per_s"]:.2f}' if b and r["requests_per_s"] and name != "sheaf-iterative" else ""
        print(f'| {name} | {r["concurrency"]} | {r["requests_per_s"]} | {r["steps_per_s"]} | '
              f'{r["short_p50_ms"]} / {r["short_p99_ms"]} | {r["long_p50_ms"]} / {r["long_p99_ms"]} | {ratio} |'
              + (f' errors: {r["errors"]}' if r["errors"] else ""))
PY
