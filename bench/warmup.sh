#!/usr/bin/env bash
# The first requests a freshly loaded model answers, with and without warm-up samples
# (`model_warmup`), measured in one run on one machine.
#
# Two copies of the digits demo (a scikit-learn forest behind the Python backend, two
# instances) load in one server: `digits` as the demo configures it, with a sample of random
# pixels, and `cold`, the same folder without the sample. Each round starts the server afresh
# and sends each model four one-item requests, one after another (the first two reach one
# instance each), taking the models in turns of order. Prints each request's time and, per
# round, the mean of the first two with warm-up against without.
# Usage: bench/warmup.sh [rounds, default 5]
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
rounds=${1:-5}
port=${SHEAF_BENCH_PORT:-18461}
bash scripts/setup.sh
sheaf_binary
repo=$work/repo
mkdir -p "$repo"
cp -r model_repository/digits "$repo/digits"
cp -r model_repository/digits "$repo/cold"
grep -v 'model_warmup\|name: noise' model_repository/digits/config.yaml > "$repo/cold/config.yaml"
machine_line
rm -f bench/out/warmup-ratios.txt
for round in $(seq "$rounds"); do
  serve bench/out/warmup-server.log --model-repository "$repo" --http-port "$port" \
    --grpc-port 0 --metrics-port 0
  order="digits cold"
  [ $((round % 2)) -eq 0 ] && order="cold digits"
  .venv/bin/python - "$port" "$round" $order <<'PY'
import json, sys, time, urllib.request

port, round_, models = sys.argv[1], sys.argv[2], sys.argv[3:]
body = json.dumps({"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                               "data": [0.5] * 64}]}).encode()
# The client's own first request (its imports, its first connection) is not the model's.
urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready").read()
first = {}
for model in models:
    times = []
    for _ in range(4):
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{model}/infer",
                                         body, {"Content-Type": "application/json"})
        t = time.perf_counter()
        urllib.request.urlopen(request).read()
        times.append((time.perf_counter() - t) * 1000)
    first[model] = sum(times[:2]) / 2
    print(f"round {round_} {model:6} ms: " + " ".join(f"{x:6.1f}" for x in times))
ratio = first["digits"] / first["cold"]
print(f"round {round_} first two, warmed / cold: {ratio:.2f}")
with open("bench/out/warmup-ratios.txt", "a") as f:
    f.write(f"{ratio}\n")
PY
  stop "$server"
done
sort -g bench/out/warmup-ratios.txt | awk '{r[NR] = $1} END {
  printf "first two requests, warmed / cold: median %.2f (%.2f-%.2f) over %d rounds\n",
    r[int((NR + 1) / 2)], r[1], r[NR], NR }'
