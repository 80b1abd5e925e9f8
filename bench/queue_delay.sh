#!/usr/bin/env bash
# How long a configured batching delay is waited: the demo MLP under the `fixed` policy with
# `max_queue_delay_us` of 100 and 1000 (Triton's `max_queue_delay_microseconds`), against the
# same model under `latency_slo`, which never waits at concurrency 1, all in one server and one
# run. At concurrency 1 no second request can come, so each request waits out the whole delay:
# the server's queue stage against the delay shows how exactly it is kept, and the client's p50
# against the model that does not wait shows what the delay adds. At concurrency 64 the batches
# fill before the delay ends, and the three should serve alike.
# Usage: bench/queue_delay.sh [seconds per level, default 5]; SHEAF_BIN runs another build (a
# release `sheaf`) instead of building this checkout.
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
secs=${1:-5}
port=${SHEAF_BENCH_PORT:-18462}
bash scripts/setup.sh
sheaf_binary
out=bench/out/queue_delay
rm -rf "$out" && mkdir -p "$out/repo"
cp -r model_repository/mlp "$out/repo/mlp"
for us in 100 1000; do
  cp -r model_repository/mlp "$out/repo/mlp_fixed_$us"
  printf 'max_batch_size: 64\nmax_queue_delay_us: %s\nbatching: {policy: fixed}\n' "$us" \
    > "$out/repo/mlp_fixed_$us/config.yaml"
done
serve "$out/server.log" --model-repository "$out/repo" --http-port "$port" --grpc-port 0 \
  --metrics-port 0
machine_line
for m in mlp mlp_fixed_100 mlp_fixed_1000; do
  "$sheaf" bench --url "http://127.0.0.1:$port" --model "$m" --concurrency 1,64 \
    --duration "$secs" --json "$out/$m.json" > /dev/null
done
.venv/bin/python - "$out" <<'PY'
import json, sys
out = sys.argv[1]
runs = {m: {r["level"]: r for r in json.load(open(f"{out}/{m}.json"))}
        for m in ("mlp", "mlp_fixed_100", "mlp_fixed_1000")}
base = runs["mlp"]
print("| model | delay µs | c | items/s | p50 ms | queue µs | queue / delay | p50 added ms "
      "| items/s / latency_slo's |")
print("|---|---|---|---|---|---|---|---|---|")
for m, delay in (("mlp", 0), ("mlp_fixed_100", 100), ("mlp_fixed_1000", 1000)):
    for c in (1.0, 64.0):
        r = runs[m][c]
        queue = r["server"]["queue"] * 1000
        ratio = f"{queue / delay:.2f}" if delay else ""
        added = f"{r['p50_ms'] - base[c]['p50_ms']:.2f}" if delay else ""
        share = f"{r['items_per_s'] / base[c]['items_per_s']:.2f}" if delay else ""
        print(f"| {m} | {delay or 'none (latency_slo)'} | {int(c)} | {r['items_per_s']:,.0f} "
              f"| {r['p50_ms']:.2f} | {queue:.0f} | {ratio} | {added} | {share} |")
PY
