#!/usr/bin/env bash
# A Python model served by sheaf against the same Python function in-process, behind Triton's
# Python backend and behind Ray Serve, side by side in one run on one machine.
#
# The function is the digits demo's `infer` (model_repository/digits/model.py: a scikit-learn
# random forest). References and peers, each measured in this run:
#   in-process    the function called in a loop in one Python process, at batch sizes 1..64;
#                 the best is the reference (bench/python/inprocess.py)
#   sheaf         model_repository/digits as it is (sheaf's batched API, two instances)
#   sheaf/Triton  bench/python/triton/digits: the same function behind Triton's Python model API,
#                 served by sheaf unchanged
#   Triton        the same folder served by tritonserver (its Python backend, from PyPI's
#                 nvidia-pytriton), dynamic batching, two instances
#   Ray Serve     bench/python/ray_digits.py: @serve.batch(64), two replicas
# Every server is driven by `sheaf bench` over HTTP with binary tensors, one item per request, at
# concurrency 1, 16 and 64. The per-batch cost of crossing into a Python process is measured on
# an identity model: the backend's time per batch at concurrency 1, against the function's own.
# The same identity behind Triton's API (bench/python/triton/echo), at each concurrency against
# the batched API's, says what that API's per-request objects cost.
# Usage: bench/python.sh [seconds per level, default 10]; SHEAF_BIN runs another build
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
secs=${1:-10}
port=${SHEAF_BENCH_PORT:-18450}
bash scripts/setup.sh
sheaf_binary
# shellcheck source=bench/python/triton_peer.sh
source bench/python/triton_peer.sh
peer_setup "pytriton, ray.serve, sklearn" nvidia-pytriton==0.5.7 "ray[serve]==2.60.0" \
  numpy==2.4.6 scikit-learn==1.9.1

out=bench/out/python
rm -rf "$out" && mkdir -p "$out/repo"
cp -r model_repository/digits "$out/repo/digits"
cp -r bench/python/triton/digits "$out/repo/digits_triton"
sed -i "s#\"../../../../model_repository/digits\"#\"$root/model_repository/digits\"#" \
  "$out/repo/digits_triton/config.pbtxt"
mkdir -p "$out/repo/echo"
printf 'def infer(inputs):\n    return {"y": inputs["x"]}\n' >"$out/repo/echo/model.py"
printf 'inputs: [{name: x, data_type: FP32, dims: [64]}]\noutputs: [{name: y, data_type: FP32, dims: [64]}]\nmax_batch_size: 64\ninstances: 2\n' \
  >"$out/repo/echo/config.yaml"
cp -r bench/python/triton/echo "$out/repo/echo_triton"

bench() { "$sheaf" bench --url "http://127.0.0.1:$1" --model "$2" --concurrency 1,16,64 \
  --duration "$secs" --json "$out/$3.json"; }

machine_line
echo
echo "== in-process: the function in a loop"
.venv/bin/python bench/python/inprocess.py model_repository/digits "$secs" 1,8,16,32,64 \
  | tee "$out/inprocess.jsonl"

echo; echo "== sheaf"
serve "$out/sheaf.log" --model-repository "$out/repo" --http-port "$port" --grpc-port 0 \
  --metrics-port 0
wait_for "http://127.0.0.1:$port/v2/models/digits" "$server" "$out/sheaf.log"
bench "$port" digits sheaf
bench "$port" digits_triton sheaf_triton_api
"$sheaf" bench --url "http://127.0.0.1:$port" --model echo --concurrency 1 --duration "$secs" \
  --json "$out/echo.json" >/dev/null
curl -s "http://127.0.0.1:$port/v2/models/echo/stats" >"$out/echo_stats.json"
for m in echo echo_triton; do
  "$sheaf" bench --url "http://127.0.0.1:$port" --model "$m" --concurrency 1,16,64 \
    --duration "$secs" --json "$out/api_$m.json" >/dev/null
done
stop "$server"

echo; echo "== Triton (tritonserver $(triton_version))"
rm -rf "$out/triton_repo" && mkdir -p "$out/triton_repo"
cp -r "$out/repo/digits_triton" "$out/triton_repo/digits"
start_triton "$out/triton_repo" $((port + 10)) "$out/triton.log"
pids+=($!)
wait_for "http://127.0.0.1:$((port + 10))/v2/models/digits" "${pids[-1]}" "$out/triton.log"
bench $((port + 10)) digits triton
stop "${pids[-1]}"

echo; echo "== Ray Serve ($("$peers/bin/python" -c 'import ray; print(ray.__version__)'))"
"$peers/bin/python" bench/python/ray_digits.py model_repository/digits $((port + 20)) \
  >"$out/ray.log" 2>&1 &
pids+=($!)
wait_for "http://127.0.0.1:$((port + 20))/v2/models/digits" "${pids[-1]}" "$out/ray.log"
bench $((port + 20)) digits ray
stop "${pids[-1]}"
"$peers/bin/ray" stop --force >/dev/null 2>&1 || true

echo
.venv/bin/python bench/python/table.py "$out"
