#!/usr/bin/env bash
# A streaming (decoupled) Python model served by sheaf and by Triton's Python backend, side by
# side in one run on one machine.
#
# The model (bench/python/triton/streamer) is in the form of Triton's decoupled examples:
# `execute` starts a thread per request and returns at once, and the thread sends 10 responses,
# 10 ms apart (a token generator's pace), then the final flag; one instance. Each server is
# driven by bench/python/stream_load.py (NVIDIA's tritonclient, one gRPC stream per client,
# closed loop) at concurrency 1, 8 and 32. One request alone takes ~100 ms; a server whose
# instance takes the next request while earlier ones stream answers about `concurrency` of them
# per 100 ms, one that waits for each request's end about one.
# Usage: bench/streaming.sh [seconds per level, default 8]
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
secs=${1:-8}
port=${SHEAF_BENCH_PORT:-18470}
bash scripts/setup.sh
sheaf_binary
# shellcheck source=bench/python/triton_peer.sh
source bench/python/triton_peer.sh
peer_setup pytriton nvidia-pytriton==0.5.7 numpy==2.4.6

out=bench/out/streaming
rm -rf "$out" && mkdir -p "$out/repo"
cp -r bench/python/triton/streamer "$out/repo/streamer"
load() {
  for c in 1 8 32; do
    .venv/bin/python bench/python/stream_load.py "127.0.0.1:$1" streamer "$c" "$secs" 10 10
  done | tee "$out/$2.jsonl"
}

machine_line
echo; echo "== sheaf"
serve "$out/sheaf.log" --model-repository "$out/repo" --http-port "$port" \
  --grpc-port $((port + 1)) --metrics-port 0
wait_for "http://127.0.0.1:$port/v2/models/streamer/ready" "$server" "$out/sheaf.log"
load $((port + 1)) sheaf
stop "$server"

echo; echo "== Triton (tritonserver $(triton_version))"
start_triton "$out/repo" $((port + 10)) "$out/triton.log"
pids+=($!)
wait_for "http://127.0.0.1:$((port + 10))/v2/models/streamer/ready" "${pids[-1]}" "$out/triton.log"
load $((port + 11)) triton
stop "${pids[-1]}"

echo
.venv/bin/python - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = {k: [json.loads(l) for l in open(f"{out}/{k}.jsonl")] for k in ("sheaf", "triton")}
print("| c | sheaf requests/s | Triton requests/s | sheaf / Triton | sheaf first response p50 ms "
      "| Triton first p50 ms | sheaf end p50 ms | Triton end p50 ms | errors |")
print("|---|---|---|---|---|---|---|---|---|")
for s, t in zip(rows["sheaf"], rows["triton"]):
    print(f"| {s['concurrency']} | {s['requests_per_s']:.1f} | {t['requests_per_s']:.1f} "
          f"| {s['requests_per_s'] / max(t['requests_per_s'], 1e-9):.2f} "
          f"| {s['first_p50_ms']:.1f} | {t['first_p50_ms']:.1f} | {s['end_p50_ms']:.1f} "
          f"| {t['end_p50_ms']:.1f} | {s['errors']} / {t['errors']} |")
PY
