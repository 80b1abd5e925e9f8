"""Triton's ragged batching, driven by NVIDIA's tritonclient over HTTP and gRPC: requests whose
inputs differ in length share one execution of an ONNX model that takes every request's values
in one dimension, with the batch inputs the server makes (where each request's values start and
end, how many it has, each item's shape), and each client gets its own part of a scattered
output back in the shape it sent; a model of sheaf's batched Python API gets the same batch as
NumPy arrays; warm-up samples reach a ragged model as requests assembled the same way; a
Triton-style Python model with a ragged input sees requests of different lengths in one
`execute`; every answer is checked against NumPy; configurations
that cannot be served fail to load with the reason."""
import concurrent.futures
import json
import subprocess
import threading

import numpy as np
import onnx
from onnx import helper
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import binary, start

F, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64

SUM_CONFIG = """\
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
batch_input [
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "offsets"
    data_type: TYPE_INT64 source_input: "x" },
  { kind: BATCH_ELEMENT_COUNT target_name: "count" data_type: TYPE_FP32 source_input: "x" }
]
output [
  { name: "sum" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "mean" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "doubled" data_type: TYPE_FP32 dims: [ -1 ] }
]
batch_output [ { target_name: "doubled" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "x" } ]
dynamic_batching { max_queue_delay_microseconds: 50000 }
"""

# sheaf's own YAML form of the same fields.
SHAPES_CONFIG = """\
max_batch_size: 16
max_queue_delay_us: 50000
inputs:
  - {name: x, data_type: FP32, dims: [-1, 2], allow_ragged_batch: true}
batch_inputs:
  - {kind: BATCH_ITEM_SHAPE, target_name: [shapes], data_type: INT64, source_input: [x]}
batch_outputs:
  - {kind: BATCH_SCATTER_WITH_INPUT_SHAPE, target_name: [plus], source_input: [x]}
"""

PY_CONFIG = """\
backend: "python"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [
  { name: "total" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "together" data_type: TYPE_INT64 dims: [ 1 ] }
]
dynamic_batching { max_queue_delay_microseconds: 50000 }
"""

# The same two models under sheaf's batched API: `infer` gets the batch as the ONNX models do,
# the ragged input in one dimension and the batch inputs beside it, as NumPy arrays.
INFER_SUM_CONFIG = """\
max_batch_size: 16
max_queue_delay_us: 50000
inputs:
  - {name: x, data_type: FP32, dims: [-1], allow_ragged_batch: true}
outputs:
  - {name: sum, data_type: FP32, dims: [1]}
  - {name: mean, data_type: FP32, dims: [1]}
  - {name: doubled, data_type: FP32, dims: [-1]}
batch_inputs:
  - {kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO, target_name: [offsets], data_type: INT64,
     source_input: [x]}
  - {kind: BATCH_ELEMENT_COUNT, target_name: [count], data_type: FP32, source_input: [x]}
batch_outputs:
  - {kind: BATCH_SCATTER_WITH_INPUT_SHAPE, target_name: [doubled], source_input: [x]}
"""

INFER_SUM = '''
import numpy as np


def infer(inputs):
    x, offsets, count = inputs["x"], inputs["offsets"], inputs["count"]
    if x.ndim != 1 or offsets.dtype != np.int64 or count.dtype != np.float32:
        raise TypeError(f"x {x.shape}, offsets {offsets.dtype}, count {count.dtype}")
    running = np.concatenate([[0.0], np.cumsum(x, dtype=np.float64)])
    sums = (running[offsets[1:]] - running[offsets[:-1]]).astype(np.float32)
    return {"sum": sums[:, None], "mean": (sums / count)[:, None], "doubled": x * 2}
'''

INFER_SHAPES_CONFIG = SHAPES_CONFIG + """\
outputs:
  - {name: item_shape, data_type: INT64, dims: [2]}
  - {name: plus, data_type: FP32, dims: [-1, 2]}
"""

INFER_SHAPES = '''
def infer(inputs):
    return {"item_shape": inputs["shapes"], "plus": inputs["x"] + 1}
'''

# A warm-up sample of three rows of 5 values, run twice as one request before the model is
# ready: `first` tells what its first call got (values, and where the one request ended), and
# `calls` how many calls came before this one.
WARM_CONFIG = """\
max_batch_size: 8
inputs: [{name: x, data_type: FP32, dims: [-1], allow_ragged_batch: true}]
outputs: [{name: calls, data_type: INT64, dims: [1]}, {name: first, data_type: INT64, dims: [2]}]
batch_inputs:
  - {kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO, target_name: [offsets], data_type: INT64,
     source_input: [x]}
model_warmup:
  - {name: rows, batch_size: 3, count: 2, inputs: {x: {data_type: FP32, dims: [5], random_data: true}}}
"""

WARM = '''
import numpy as np

CALLS = []


def infer(inputs):
    x, offsets = inputs["x"], inputs["offsets"]
    CALLS.append([x.size, int(offsets[-1])])
    n = len(offsets) - 1
    return {"calls": np.full((n, 1), len(CALLS) - 1, np.int64),
            "first": np.tile(np.array(CALLS[0], np.int64), (n, 1))}
'''

SUM_WARM_CONFIG = SUM_CONFIG + """\
model_warmup [ { name: "rows" batch_size: 2 count: 1
  inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } } } ]
"""

# `lengths`: how many lengths of x the model has seen so far, told to each request.
LENGTHS_CONFIG = """\
max_batch_size: 16
inputs: [{name: x, data_type: FP32, dims: [-1], allow_ragged_batch: true}]
outputs: [{name: lengths, data_type: INT64, dims: [1]}]
batch_inputs:
  - {kind: BATCH_ELEMENT_COUNT, target_name: [count], data_type: INT64, source_input: [x]}
"""

LENGTHS = '''
import numpy as np

SEEN = set()


def infer(inputs):
    SEEN.update(inputs["count"].tolist())
    return {"lengths": np.full((len(inputs["count"]), 1), len(SEEN), np.int64)}
'''

# `max_batch_size: auto` beside ragged batching: the probe times batches made of the warm-up
# samples, requests of 3 values and of 7 in turn.
AUTO_SAMPLES = """\
model_warmup:
  - {name: short, inputs: {x: {data_type: FP32, dims: [3], random_data: true}}}
  - {name: long, inputs: {x: {data_type: FP32, dims: [7], random_data: true}}}
"""

AUTO_SUM_CONFIG = INFER_SUM_CONFIG.replace("max_batch_size: 16", "max_batch_size: auto") \
    + AUTO_SAMPLES

# `probed`: what its first, eighth and fifteenth calls got (requests, values): the probe runs
# each batch size seven times, 1 item first, then 2, then 4.
AUTO_PROBED_CONFIG = """\
max_batch_size: auto
inputs: [{name: x, data_type: FP32, dims: [-1], allow_ragged_batch: true}]
outputs: [{name: probed, data_type: INT64, dims: [6]}]
batch_inputs:
  - {kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO, target_name: [offsets], data_type: INT64,
     source_input: [x]}
""" + AUTO_SAMPLES

AUTO_PROBED = '''
import numpy as np

CALLS = []


def infer(inputs):
    x, offsets = inputs["x"], inputs["offsets"]
    CALLS.append([len(offsets) - 1, x.size])
    n = len(offsets) - 1
    seen = [v for call in CALLS[0:15:7] for v in call] + [0] * 6
    return {"probed": np.tile(np.array(seen[:6], np.int64), (n, 1))}
'''

# Each request's own values, whatever their length; `together`: the requests of its execute.
PY_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            out.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("total", x.sum(axis=1, keepdims=True)),
                pb_utils.Tensor("together", np.full((x.shape[0], 1), len(requests), np.int64)),
            ]))
        return out
'''


def save(graph, path):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


def sum_model(path):
    """x: every request's values in a row; offsets: 0, then where each request's end; count:
    how many each has. sum and mean: one row per request; doubled: one per value."""
    nodes = [
        helper.make_node("CumSum", ["x", "axis"], ["running"]),
        helper.make_node("Concat", ["zero", "running"], ["ran"], axis=0),
        helper.make_node("Slice", ["offsets", "one", "end"], ["hi"]),
        helper.make_node("Slice", ["offsets", "start", "last"], ["lo"]),
        helper.make_node("Gather", ["ran", "hi"], ["upto_hi"]),
        helper.make_node("Gather", ["ran", "lo"], ["upto_lo"]),
        helper.make_node("Sub", ["upto_hi", "upto_lo"], ["sums"]),
        helper.make_node("Unsqueeze", ["sums", "one"], ["sum"]),
        helper.make_node("Div", ["sums", "count"], ["means"]),
        helper.make_node("Unsqueeze", ["means", "one"], ["mean"]),
        helper.make_node("Mul", ["x", "two"], ["doubled"]),
    ]
    graph = helper.make_graph(
        nodes, "ragged_sum",
        [helper.make_tensor_value_info("x", F, ["n"]),
         helper.make_tensor_value_info("offsets", I64, ["r1"]),
         helper.make_tensor_value_info("count", F, ["r"])],
        [helper.make_tensor_value_info("sum", F, ["r", 1]),
         helper.make_tensor_value_info("mean", F, ["r", 1]),
         helper.make_tensor_value_info("doubled", F, ["n"])],
        initializer=[
            helper.make_tensor("axis", I64, [], [0]),
            helper.make_tensor("zero", F, [1], [0.0]),
            helper.make_tensor("two", F, [1], [2.0]),
            helper.make_tensor("one", I64, [1], [1]),
            helper.make_tensor("start", I64, [1], [0]),
            helper.make_tensor("last", I64, [1], [-1]),
            helper.make_tensor("end", I64, [1], [2**62]),
        ])
    save(graph, path)


def shapes_model(path):
    """item_shape: the BATCH_ITEM_SHAPE input as it came; plus: every value plus one."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["shapes"], ["item_shape"]),
         helper.make_node("Add", ["x", "one"], ["plus"])],
        "ragged_shapes",
        [helper.make_tensor_value_info("x", F, ["n"]),
         helper.make_tensor_value_info("shapes", I64, ["items", 2])],
        [helper.make_tensor_value_info("item_shape", I64, ["items", 2]),
         helper.make_tensor_value_info("plus", F, ["n"])],
        initializer=[helper.make_tensor("one", F, [1], [1.0])])
    save(graph, path)


BROKEN = {
    # name: (configuration, its file, the model, what the reason says)
    "ragged_unbatched": (SUM_CONFIG.replace("max_batch_size: 16", "max_batch_size: 0"),
                         "config.pbtxt", sum_model, "give it a max_batch_size above 0"),
    "ragged_fp16": (SUM_CONFIG.replace("data_type: TYPE_FP32 source_input",
                                       "data_type: TYPE_FP16 source_input"),
                    "config.pbtxt", sum_model, "data_type FP16 is not one a batch input takes"),
    "ragged_no_target": (SUM_CONFIG.replace('target_name: "count"', 'target_name: "counts"'),
                         "config.pbtxt", sum_model,
                         "target_name 'counts' is not an input of the model"),
    "ragged_rank": (SHAPES_CONFIG.replace("BATCH_ITEM_SHAPE", "BATCH_ITEM_SHAPE_FLATTEN"),
                    "config.yaml", shapes_model, "this kind has 1 dimension(s)"),
    "ragged_sizes": (SHAPES_CONFIG + "allowed_batch_sizes: [4, 8]\n", "config.yaml",
                     shapes_model, "does not go with allowed_batch_sizes"),
    "ragged_auto_bare": (AUTO_SUM_CONFIG.replace(AUTO_SAMPLES, ""), "config.yaml", sum_model,
                         "does not go with max_batch_size: auto without a warm-up sample"),
}

# Python models that cannot be served: name: (configuration, its file, model.py, the reason).
BROKEN_PY = {
    "ragged_infer_fp16": (INFER_SUM_CONFIG.replace("data_type: FP32, source_input",
                                                   "data_type: FP16, source_input"),
                          "config.yaml", INFER_SUM, "data_type FP16 is not one a batch input takes"),
    "ragged_py_batch_input": (PY_CONFIG + 'batch_input [ { kind: BATCH_ELEMENT_COUNT '
                              'target_name: "n" data_type: TYPE_INT32 source_input: "x" } ]\n',
                              "config.pbtxt", PY_MODEL, "this model sees each request on its own"),
}


def make_repo(root):
    served = [("ragged_sum", SUM_CONFIG, "config.pbtxt", sum_model),
              ("ragged_sum_warm", SUM_WARM_CONFIG, "config.pbtxt", sum_model),
              ("ragged_shapes", SHAPES_CONFIG, "config.yaml", shapes_model),
              ("ragged_sum_auto", AUTO_SUM_CONFIG, "config.yaml", sum_model)]
    for name, config, file, build in served + [(n, *b[:3]) for n, b in BROKEN.items()]:
        (root / name / "1").mkdir(parents=True)
        build(root / name / "1" / "model.onnx")
        (root / name / file).write_text(config)
    python = [("ragged_py", PY_CONFIG, "config.pbtxt", PY_MODEL),
              ("ragged_infer_sum", INFER_SUM_CONFIG, "config.yaml", INFER_SUM),
              ("ragged_infer_short", INFER_SUM_CONFIG, "config.yaml",
               INFER_SUM.replace('"doubled": x * 2', '"doubled": x[1:] * 2')),
              ("ragged_infer_shapes", INFER_SHAPES_CONFIG, "config.yaml", INFER_SHAPES),
              ("ragged_infer_warm", WARM_CONFIG, "config.yaml", WARM),
              ("ragged_lengths", LENGTHS_CONFIG, "config.yaml", LENGTHS),
              ("ragged_infer_auto", AUTO_PROBED_CONFIG, "config.yaml", AUTO_PROBED)]
    for name, config, file, code in python + [(n, *b[:3]) for n, b in BROKEN_PY.items()]:
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(code)
        (root / name / file).write_text(config)
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from start(make_repo(tmp_path_factory.mktemp("ragged-repo")))


def client_of(server, protocol):
    """A new client (tritonclient's HTTP client is not shared between threads)."""
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.http)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc)


def executions(server, model):
    stats = httpclient.InferenceServerClient(server.http).get_inference_statistics(model)
    return stats["model_stats"][0]["execution_count"]


def concurrently(send, values):
    """Sends each of `values` from its own thread, all at once; returns the answers in order."""
    barrier = threading.Barrier(len(values))

    def one(v):
        barrier.wait()
        return send(v)

    with concurrent.futures.ThreadPoolExecutor(len(values)) as pool:
        return list(pool.map(one, values))


@pytest.mark.parametrize("model", ["ragged_sum", "ragged_infer_sum"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_requests_of_different_lengths_share_executions_and_each_gets_its_own_answer(
        server, protocol, model):
    rng = np.random.default_rng(7)

    def send(x):
        module, client = client_of(server, protocol)
        given = module.InferInput("x", list(x.shape), "FP32")
        given.set_data_from_numpy(x)
        r = client.infer(model, [given])
        return r.as_numpy("sum"), r.as_numpy("mean"), r.as_numpy("doubled")

    before = executions(server, model)
    requests = 0
    for _ in range(4):
        values = [rng.standard_normal((1, n)).astype(np.float32) for n in range(1, 9)]
        for x, (total, mean, doubled) in zip(values, concurrently(send, values)):
            np.testing.assert_allclose(total, x.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(mean, x.mean(axis=1, keepdims=True), rtol=1e-5, atol=1e-5)
            assert doubled.shape == x.shape
            np.testing.assert_array_equal(doubled, x * 2)
        requests += len(values)
    ran = executions(server, model) - before
    assert 0 < ran < requests, (ran, requests)


def test_warm_up_samples_run_as_requests_assembled_as_batches_are(server):
    http = httpclient.InferenceServerClient(server.http)
    given = httpclient.InferInput("x", [1, 4], "FP32")
    given.set_data_from_numpy(np.ones((1, 4), np.float32))
    r = http.infer("ragged_infer_warm", [given])
    # The sample's three rows of 5 came as one request's 15 values; it ran twice first.
    assert r.as_numpy("first").tolist() == [[15, 15]]
    assert r.as_numpy("calls")[0, 0] >= 2
    # The ONNX model warmed the same way answers as the one without samples.
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    given = httpclient.InferInput("x", [1, 6], "FP32")
    given.set_data_from_numpy(x)
    r = http.infer("ragged_sum_warm", [given])
    assert r.as_numpy("sum").tolist() == [[15.0]]
    np.testing.assert_array_equal(r.as_numpy("doubled"), x * 2)


def test_max_batch_size_auto_probes_a_ragged_model_with_batches_of_its_samples(server):
    http = httpclient.InferenceServerClient(server.http)
    # The probe's first batches: one request of the short sample; the short and the long one;
    # then four, short and long in turn. Each is 3 or 7 values, as clients send them.
    given = httpclient.InferInput("x", [1, 2], "FP32")
    given.set_data_from_numpy(np.ones((1, 2), np.float32))
    assert http.infer("ragged_infer_auto", [given]).as_numpy("probed").tolist() == \
        [[1, 3, 2, 10, 4, 20]]
    # Each settled on a probed size and logged the curve it chose from.
    for name in ("ragged_sum_auto", "ragged_infer_auto"):
        chosen = http.get_model_config(name)["max_batch_size"]
        assert chosen in [2 ** k for k in range(9)], (name, chosen)
        curves = [line for line in server.log
                  if "max_batch_size auto" in line and f'"model":"{name}"' in line]
        assert curves and f'"chosen":{chosen}' in curves[-1], (name, chosen, curves)
    # The ONNX model answers concurrent requests of any length.
    rng = np.random.default_rng(11)

    def send(x):
        given = httpclient.InferInput("x", list(x.shape), "FP32")
        given.set_data_from_numpy(x)
        r = httpclient.InferenceServerClient(server.http).infer("ragged_sum_auto", [given])
        return r.as_numpy("sum"), r.as_numpy("doubled")

    values = [rng.standard_normal((1, n)).astype(np.float32) for n in range(1, 13)]
    for x, (total, doubled) in zip(values, concurrently(send, values)):
        np.testing.assert_allclose(total, x.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(doubled, x * 2)


@pytest.mark.parametrize("model", ["ragged_sum", "ragged_infer_sum"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_of_several_items_is_refused_where_the_model_tells_only_requests_apart(
        server, protocol, model):
    # Its batch inputs count each request's values, and `sum` has a row per item: a request of
    # two rows would leave the batch it joins one row short, for every client in it.
    def send(x):
        module, client = client_of(server, protocol)
        given = module.InferInput("x", list(x.shape), "FP32")
        given.set_data_from_numpy(x)
        try:
            return client.infer(model, [given]).as_numpy("sum")
        except Exception as e:  # noqa: BLE001 - the refusal is the answer looked for
            return e

    values = [np.ones((2, 3), np.float32)] + [np.full((1, n), n, np.float32) for n in range(1, 6)]
    refused, *answers = concurrently(send, values)
    text = str(refused)
    assert ("input 'x' is ragged, and this model's batch inputs tell requests apart, not items: "
            "send one item per request (shape [1, ...]); this request has 2") in text, text
    assert ("400" in text) if protocol == "http" else ("INVALID_ARGUMENT" in text), text
    # The others in flight with it were answered.
    for n, total in zip(range(1, 6), answers):
        np.testing.assert_allclose(total, [[n * n]], rtol=1e-6)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sheaf_bench_sends_each_request_a_length_drawn_from_lengths(server, protocol, tmp_path):
    urls = {"http": ["--url", f"http://{server.http}"],
            "grpc": ["--protocol", "grpc", "--url", f"http://{server.grpc}",
                     "--http-url", f"http://{server.http}"]}[protocol]
    report = tmp_path / "bench.json"
    run = subprocess.run(
        [binary(), "bench", *urls, "--model", "ragged_sum", "--lengths", "1-12",
         "--concurrency", "1,4", "--requests", "40", "--json", str(report)],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    levels = json.loads(report.read_text())
    assert [(r["level"], r["requests"], r["errors"]) for r in levels] == [(1, 40, 0), (4, 40, 0)]
    # The model counts the lengths it has seen: 80 draws from 12 lengths bring most of them.
    run = subprocess.run(
        [binary(), "bench", *urls, "--model", "ragged_lengths", "--lengths", "1-12",
         "--concurrency", "2", "--requests", "80"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    http = httpclient.InferenceServerClient(server.http)
    given = httpclient.InferInput("x", [1, 1], "FP32")
    given.set_data_from_numpy(np.ones((1, 1), np.float32))
    assert http.infer("ragged_lengths", [given]).as_numpy("lengths")[0, 0] >= 8
    # Without --lengths, the dynamic dimension is named with the flag that shapes it.
    run = subprocess.run([binary(), "bench", *urls, "--model", "ragged_sum", "--requests", "2"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "--lengths MIN-MAX" in run.stderr, run.stderr


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_scattered_output_short_of_its_input_s_elements_fails_the_batch_by_name(
        server, protocol):
    module, client = client_of(server, protocol)
    given = module.InferInput("x", [1, 3], "FP32")
    given.set_data_from_numpy(np.ones((1, 3), np.float32))
    with pytest.raises(Exception) as e:
        client.infer("ragged_infer_short", [given])
    text = str(e.value)
    assert "output 'doubled' of shape [2] where 3 rows were due" in text, text
    assert ("500" in text) if protocol == "http" else ("INTERNAL" in text), text
    # The server goes on serving the same model's neighbours.
    assert client.is_model_ready("ragged_infer_sum")


@pytest.mark.parametrize("model", ["ragged_shapes", "ragged_infer_shapes"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_item_shapes_reach_the_model_and_a_scattered_output_keeps_each_request_s_shape(
        server, protocol, model):
    # Two items of [3, 2], one of [1, 2] and three of [4, 2], at once.
    values = [np.arange(12, dtype=np.float32).reshape(2, 3, 2),
              np.full((1, 1, 2), 7.0, np.float32),
              np.arange(24, dtype=np.float32).reshape(3, 4, 2) / 4]

    def send(x):
        module, client = client_of(server, protocol)
        given = module.InferInput("x", list(x.shape), "FP32")
        given.set_data_from_numpy(x)
        r = client.infer(model, [given])
        return r.as_numpy("item_shape"), r.as_numpy("plus")

    for x, (shape, plus) in zip(values, concurrently(send, values)):
        np.testing.assert_array_equal(shape, [list(x.shape[1:])] * x.shape[0])
        np.testing.assert_array_equal(plus, x + 1)


def test_a_python_model_sees_requests_of_different_lengths_in_one_execute(server):
    def send(x):
        module, client = client_of(server, "grpc")
        given = module.InferInput("x", list(x.shape), "FP32")
        given.set_data_from_numpy(x)
        r = client.infer("ragged_py", [given])
        return r.as_numpy("total"), r.as_numpy("together")

    seen_together = 0
    before = executions(server, "ragged_py")
    for _ in range(3):
        values = [np.arange(n, dtype=np.float32).reshape(1, n) for n in range(1, 7)]
        for x, (total, together) in zip(values, concurrently(send, values)):
            np.testing.assert_array_equal(total, x.sum(axis=1, keepdims=True))
            seen_together = max(seen_together, int(together[0, 0]))
    assert seen_together > 1
    assert executions(server, "ragged_py") - before < 18


@pytest.mark.parametrize("api", ["onnx", "infer"])
def test_clients_see_the_ragged_input_and_the_scattered_output_never_the_batch_inputs(
        server, api):
    sums, shapes = {"onnx": ("ragged_sum", "ragged_shapes"),
                    "infer": ("ragged_infer_sum", "ragged_infer_shapes")}[api]
    http = httpclient.InferenceServerClient(server.http)
    meta = http.get_model_metadata(sums)
    assert [(t["name"], t["shape"]) for t in meta["inputs"]] == [("x", [-1, -1])]
    assert {t["name"]: t["shape"] for t in meta["outputs"]} == {
        "sum": [-1, 1], "mean": [-1, 1], "doubled": [-1, -1]}
    meta = http.get_model_metadata(shapes)
    assert [(t["name"], t["shape"]) for t in meta["inputs"]] == [("x", [-1, -1, 2])]
    # The batch inputs are not a client's to send.
    given = httpclient.InferInput("x", [1, 2], "FP32")
    given.set_data_from_numpy(np.ones((1, 2), np.float32))
    offsets = httpclient.InferInput("offsets", [2], "INT64")
    offsets.set_data_from_numpy(np.array([0, 2], np.int64))
    with pytest.raises(Exception) as e:
        http.infer(sums, [given, offsets])
    assert "offsets" in str(e.value), str(e.value)


def test_the_configuration_shows_the_ragged_input_and_the_batch_inputs_and_outputs(server):
    http = httpclient.InferenceServerClient(server.http).get_model_config("ragged_sum")
    grpc = grpcclient.InferenceServerClient(server.grpc).get_model_config(
        "ragged_sum", as_json=True)["config"]
    for config in (http, grpc):
        assert config["input"][0]["name"] == "x"
        assert config["input"][0]["allow_ragged_batch"] is True
        # gRPC's JSON leaves an enum's first value (its default) out, as protobuf does.
        assert [(b.get("kind", "BATCH_ELEMENT_COUNT"), b["target_name"], b["data_type"],
                 b["source_input"]) for b in config["batch_input"]] == [
            ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", ["offsets"], "TYPE_INT64", ["x"]),
            ("BATCH_ELEMENT_COUNT", ["count"], "TYPE_FP32", ["x"])]
        out = config["batch_output"][0]
        assert (out["target_name"], out["source_input"]) == (["doubled"], ["x"])
        assert out.get("kind", "BATCH_SCATTER_WITH_INPUT_SHAPE") == "BATCH_SCATTER_WITH_INPUT_SHAPE"
    # The YAML form, the same way.
    config = httpclient.InferenceServerClient(server.http).get_model_config("ragged_shapes")
    assert config["batch_input"][0]["kind"] == "BATCH_ITEM_SHAPE"
    assert config["batch_input"][0]["data_type"] == "TYPE_INT64"


def test_what_cannot_be_served_fails_to_load_with_the_reason(server):
    index = {m["name"]: m for m in
             httpclient.InferenceServerClient(server.http).get_model_repository_index()}
    for name, (*_, says) in (BROKEN | BROKEN_PY).items():
        assert index[name]["state"] == "UNAVAILABLE", index[name]
        assert says in index[name]["reason"], index[name]
    for name in ("ragged_sum", "ragged_shapes", "ragged_py", "ragged_infer_sum",
                 "ragged_infer_shapes", "ragged_infer_warm", "ragged_sum_warm",
                 "ragged_lengths", "ragged_sum_auto", "ragged_infer_auto"):
        assert index[name]["state"] == "READY", index[name]
