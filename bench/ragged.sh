#!/usr/bin/env bash
# Requests of different lengths: ragged batching against padding, one server, one run.
#
# The same computation three ways: a small MLP (1 -> 256 -> 256 -> 1, ReLU) applied to every
# value of a request, whose cost grows with the values a batch holds. `ragged` takes the batch's
# values in one dimension (`allow_ragged_batch`, its output scattered back to each request);
# `padded` takes [requests, longest] with shorter requests padded by the server (`padding`),
# its output trimmed back; `bucketed` pads too, but only requests within 32 of each other's
# length share a batch (`bucket_width: 32`). Every model batches up to 64 requests under the
# same policy, two ONNX Runtime threads; `ragged_auto` is `ragged` with `max_batch_size: auto`,
# probed at load on batches of its warm-up samples (requests of 16, 64, 128 and 256 values in
# turn). `sheaf bench --lengths 1-256` sends each request a length drawn at random (the same
# draws for each model), one request of one row at a time per client, at each concurrency
# level, over HTTP; the models are measured in turn, twice, and the table gives each round's
# requests/s, p50 and mean batch, ragged against padded and bucketed, and auto against ragged,
# after the size auto settled on and the curve it measured.
# Usage: bench/ragged.sh [seconds per level, default 5] [lengths, default 1-256]; SHEAF_BIN
# runs another build (a release `sheaf`) instead of building this checkout.
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
secs=${1:-5}
lengths=${2:-1-256}
port=${SHEAF_BENCH_PORT:-18463}
bash scripts/setup.sh
sheaf_binary
out=bench/out/ragged
rm -rf "$out" && mkdir -p "$out/repo"
.venv/bin/python - "$out/repo" <<'PY'
import os
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper

repo = sys.argv[1]
rng = np.random.default_rng(0)
weights = [(rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)
           for s in ((1, 256), (256, 256), (256, 1))]
F, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64


def save(name, x_shape, y_shape, config, batch="64"):
    """x in its shape -> one value a row -> the MLP -> y in x's shape."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Reshape", ["x", "column"], ["rows"])]
    h = "rows"
    for k in range(3):
        nodes.append(helper.make_node("MatMul", [h, f"w{k}"], [f"m{k}"]))
        h = f"m{k}"
        if k < 2:
            nodes.append(helper.make_node("Relu", [h], [f"r{k}"]))
            h = f"r{k}"
    nodes.append(helper.make_node("Reshape", [h, "shape"], ["y"]))
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", F, x_shape)],
        [helper.make_tensor_value_info("y", F, y_shape)],
        initializer=[numpy_helper.from_array(w, f"w{k}") for k, w in enumerate(weights)]
        + [numpy_helper.from_array(np.array([-1, 1], np.int64), "column")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    os.makedirs(f"{repo}/{name}/1")
    onnx.save(model, f"{repo}/{name}/1/model.onnx")
    with open(f"{repo}/{name}/config.yaml", "w") as f:
        f.write(f"max_batch_size: {batch}\nintra_op_threads: 2\n" + config)


ragged = ("inputs: [{name: x, data_type: FP32, dims: [-1], allow_ragged_batch: true}]\n"
          "batch_outputs: [{kind: BATCH_SCATTER_WITH_INPUT_SHAPE, target_name: [y], "
          "source_input: [x]}]\n")
save("ragged", ["n"], ["n"], ragged)
save("ragged_auto", ["n"], ["n"], ragged + "model_warmup:\n" + "".join(
    f"  - {{name: l{n}, inputs: {{x: {{data_type: FP32, dims: [{n}], random_data: true}}}}}}\n"
    for n in (16, 64, 128, 256)), batch="auto")
save("padded", ["b", "l"], ["b", "l"], "padding: {value: 0}\n")
save("bucketed", ["b", "l"], ["b", "l"], "padding: {value: 0, bucket_width: 32}\n")
PY
serve "$out/server.log" --model-repository "$out/repo" --http-port "$port" --grpc-port 0 \
  --metrics-port 0
machine_line "lengths $lengths"
for round in 1 2; do
  for m in ragged padded bucketed ragged_auto; do
    "$sheaf" bench --url "http://127.0.0.1:$port" --model "$m" --concurrency 1,16,64 \
      --lengths "$lengths" --duration "$secs" --json "$out/$m-$round.json" > /dev/null
  done
done
chosen=$(curl -s "http://127.0.0.1:$port/v2/models/ragged_auto/config" \
  | .venv/bin/python -c 'import json, sys; print(json.load(sys.stdin)["max_batch_size"])')
echo "ragged_auto: max_batch_size auto settled on $chosen"
grep "max_batch_size auto" "$out/server.log" | sed 's/\x1b\[[0-9;]*m//g; s/.*curve=/probed: /' | head -1
.venv/bin/python - "$out" <<'PY'
import json, sys
out = sys.argv[1]
models = ("ragged", "padded", "bucketed", "ragged_auto")
print("| round | c | ragged req/s | p50 ms | padded req/s | p50 ms | bucketed req/s | p50 ms "
      "| auto req/s | p50 ms | ragged / padded | ragged / bucketed | auto / ragged "
      "| mean batch (r · p · b · a) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for round_ in (1, 2):
    runs = {m: {r["level"]: r for r in json.load(open(f"{out}/{m}-{round_}.json"))}
            for m in models}
    for c in sorted(runs["ragged"]):
        r, p, b, a = (runs[m][c] for m in models)
        errors = sum(x.get("errors", 0) for x in (r, p, b, a))
        batches = " · ".join(f"{x.get('mean_batch') or 0:.1f}" for x in (r, p, b, a))
        print(f"| {round_} | {int(c)} | {r['items_per_s']:,.0f} | {r['p50_ms']:.2f} "
              f"| {p['items_per_s']:,.0f} | {p['p50_ms']:.2f} | {b['items_per_s']:,.0f} "
              f"| {b['p50_ms']:.2f} | {a['items_per_s']:,.0f} | {a['p50_ms']:.2f} "
              f"| {r['items_per_s'] / p['items_per_s']:.2f} "
              f"| {r['items_per_s'] / b['items_per_s']:.2f} "
              f"| {a['items_per_s'] / r['items_per_s']:.2f} | {batches} |"
              + (f" errors {errors}" if errors else ""))
PY
