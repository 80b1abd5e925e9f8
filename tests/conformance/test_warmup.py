"""Warm-up samples (Triton's `model_warmup`), run by the real `sheaf` binary on real models.

A Triton-style Python model with `model_warmup` in its config.pbtxt (data from a file in the
model's `warmup/` folder, as under Triton) remembers what it ran before its first client, and
tells it; the ONNX MLP warms with random data from config.yaml; samples that fail or do not fit
the model make clear load errors while the server serves the rest.
"""
import concurrent.futures
import re

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import link_models, start

# Tells each request what its instance ran before it: how many executions, and the first batch.
RECALL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.runs = 0
        self.first = None

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            t = pb_utils.get_input_tensor_by_name(request, "T").as_numpy()
            if self.first is None:
                self.first = x.copy()
                self.first_text = b"|".join(t[0])
            n = len(x)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("RUNS", np.full((n, 1), self.runs, np.int32)),
                pb_utils.Tensor("FIRST_ROWS", np.full((n, 1), len(self.first), np.int32)),
                pb_utils.Tensor("FIRST", np.tile(self.first[0], (n, 1))),
                pb_utils.Tensor("TEXT", np.array([[b"|".join(t[0])]] * n, np.object_)),
                pb_utils.Tensor("FIRST_TEXT", np.array([[self.first_text]] * n, np.object_)),
            ]))
        self.runs += 1
        return responses
'''
RECALL_CONFIG = '''
backend: "python"
max_batch_size: 8
dynamic_batching { }
instance_group [ { count: 2 kind: KIND_CPU } ]
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "T" data_type: TYPE_STRING dims: [ 2 ] } ]
output [ { name: "RUNS" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "FIRST_ROWS" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "FIRST" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] },
         { name: "FIRST_TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
model_warmup [
  {
    name: "from_files"
    batch_size: 3
    count: 2
    inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "x.raw" } }
    inputs { key: "T" value: { data_type: TYPE_STRING dims: [ 2 ] input_data_file: "t.raw" } }
  }
]
'''
# Counts the batches its process ran, and dies when asked to: a process started again after
# the crash runs the warm-up sample again before its first client.
PHOENIX = '''
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.runs = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if x[0, 0] < 0:
                os._exit(3)
            n = len(x)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("RUNS", np.full((n, 1), self.runs, np.int32)),
                pb_utils.Tensor("PID", np.full((n, 1), os.getpid(), np.int64))]))
        self.runs += 1
        return responses
'''
PHOENIX_CONFIG = '''
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "RUNS" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
model_warmup [ { name: "ones" batch_size: 2 count: 3
  inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } } ]
'''
WARM_X = np.array([0.5, -1.25, 3.0, 8.0], np.float32)
WARM_T = [b"warm", b"up"]

# Raises on the warm-up's data: the load fails, naming the sample and the exception.
REFUSING = '''
import numpy as np


def infer(inputs):
    if np.all(inputs["x"] == 0):
        raise ValueError("zeros are not a digit")
    return {"y": inputs["x"]}
'''


# Slower per item the larger its batch (2 ms times the batch's square): `max_batch_size: auto`
# measures batch 1 best, yet the sample of 8 items must run.
QUADRATIC = '''
import time


def infer(inputs):
    time.sleep(0.002 * len(inputs["x"]) ** 2)
    return {"y": inputs["x"]}
'''


# A fixed cost per batch, so that `max_batch_size: auto` probes up to its limit. Each answer
# says what the model was told its max_batch_size was, and the largest batch it has run.
TOLD_BATCHED = '''
import time
import numpy as np

seen = {"told": -1, "largest": 0}


def load(config):
    seen["told"] = config["max_batch_size"]


def infer(inputs):
    time.sleep(0.002)
    n = len(inputs["x"])
    seen["largest"] = max(seen["largest"], n)
    return {"y": inputs["x"], "told": np.full((n, 1), seen["told"], np.int64),
            "largest": np.full((n, 1), seen["largest"], np.int64)}
'''
TOLD_TRITON = '''
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.told = json.loads(args["model_config"])["max_batch_size"]
        self.largest = 0

    def execute(self, requests):
        time.sleep(0.002)
        xs = [pb_utils.get_input_tensor_by_name(r, "x").as_numpy() for r in requests]
        self.largest = max(self.largest, sum(len(x) for x in xs))
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("y", x),
            pb_utils.Tensor("told", np.full((len(x), 1), self.told, np.int64)),
            pb_utils.Tensor("largest", np.full((len(x), 1), self.largest, np.int64)),
        ]) for x in xs]
'''
# The same, with a limit of its own set in auto_complete_config.
TOLD_TRITON_SETS_8 = TOLD_TRITON.replace("class TritonPythonModel:\n", """class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_max_batch_size(8)
        return config

""")
TOLD_CONFIG = """inputs: [{name: x, data_type: FP32, dims: [2]}]
outputs: [{name: y, data_type: FP32, dims: [2]}, {name: told, data_type: INT64, dims: [1]},
          {name: largest, data_type: INT64, dims: [1]}]
max_batch_size: auto
"""


def strings(items):
    return b"".join(len(s).to_bytes(4, "little") + s for s in items)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("warmup-repo")
    (repo / "recall" / "1").mkdir(parents=True)
    (repo / "recall" / "1" / "model.py").write_text(RECALL)
    (repo / "recall" / "config.pbtxt").write_text(RECALL_CONFIG)
    (repo / "recall" / "warmup").mkdir()
    (repo / "recall" / "warmup" / "x.raw").write_bytes(WARM_X.tobytes())
    (repo / "recall" / "warmup" / "t.raw").write_bytes(strings(WARM_T))
    (repo / "phoenix" / "1").mkdir(parents=True)
    (repo / "phoenix" / "1" / "model.py").write_text(PHOENIX)
    (repo / "phoenix" / "config.pbtxt").write_text(PHOENIX_CONFIG)
    link_models(repo, ["mlp"])
    (repo / "mlp" / "config.yaml").write_text(
        "max_batch_size: 32\nmodel_warmup:\n"
        "  - {name: random, batch_size: 5, count: 2,\n"
        "     inputs: {input: {data_type: FP32, dims: [512], random_data: true}}}\n")
    declared = "inputs: [{name: x, data_type: FP32, dims: [2]}]\n" \
               "outputs: [{name: y, data_type: FP32, dims: [2]}]\n"
    failing = {
        # The model raises on the sample.
        "refusing": "model_warmup: [{name: zeros, inputs: {x: {data_type: FP32, dims: [2], "
                    "zero_data: true}}}]\n",
        # The sample does not fit the model.
        "misfit": "model_warmup: [{name: wide, inputs: {x: {data_type: FP32, dims: [3], "
                  "zero_data: true}}}]\n",
        # The sample's form is wrong before any model is seen.
        "undecided": "model_warmup: [{inputs: {x: {data_type: FP32, dims: [2], "
                     "zero_data: true, random_data: true}}}]\n",
        # The file is not there.
        "fileless": "model_warmup: [{inputs: {x: {data_type: FP32, dims: [2], "
                    "input_data_file: gone.raw}}}]\n",
    }
    (repo / "quadratic").mkdir()
    (repo / "quadratic" / "model.py").write_text(QUADRATIC)
    (repo / "quadratic" / "config.yaml").write_text(
        declared + "instances: 2\nmax_batch_size: auto\nmodel_warmup: [{name: eight, "
        "batch_size: 8, inputs: {x: {data_type: FP32, dims: [2], random_data: true}}}]\n")
    for name, code, extra in [("told_batched", TOLD_BATCHED, ""),
                              ("told_triton", TOLD_TRITON, ""),
                              ("told_allowed", TOLD_BATCHED, "allowed_batch_sizes: [1, 4, 16]\n")]:
        (repo / name).mkdir()
        (repo / name / "model.py").write_text(code)
        (repo / name / "config.yaml").write_text(TOLD_CONFIG + extra)
    # The model sets 8 under `auto`, with no max_batch_size, and against a configured 16.
    for name, given in [("sets_under_auto", "max_batch_size: auto"), ("sets_alone", ""),
                        ("sets_against", "max_batch_size: 16")]:
        (repo / name).mkdir()
        (repo / name / "model.py").write_text(TOLD_TRITON_SETS_8)
        (repo / name / "config.yaml").write_text(
            TOLD_CONFIG.replace("max_batch_size: auto", given))
    for name, warmup in failing.items():
        (repo / name).mkdir()
        (repo / name / "model.py").write_text(REFUSING)
        (repo / name / "config.yaml").write_text(declared + warmup)
    yield from start(repo)


def recall_inputs(module, x, texts):
    inputs = [module.InferInput("X", list(x.shape), "FP32"),
              module.InferInput("T", [len(x), 2], "BYTES")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(np.array([texts] * len(x), dtype=np.object_))
    return inputs


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_triton_model_warms_up_on_its_files_before_its_first_client(server, module):
    """Each instance ran the sample's batch of 3 twice, from warmup/x.raw and warmup/t.raw,
    before it answered anyone: every answer, from either instance, says so."""
    url = server.http if module is httpclient else server.grpc

    def ask(i):
        client = module.InferenceServerClient(url)
        x = np.full((1, 4), i, np.float32)
        result = client.infer("recall", recall_inputs(module, x, [b"a", b"b"]))
        return [result.as_numpy(name) for name in ("RUNS", "FIRST_ROWS", "FIRST", "TEXT",
                                                       "FIRST_TEXT")]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(16)))
    for runs, first_rows, first, text, first_text in answers:
        assert runs[0, 0] >= 2, "the sample's two runs came first"
        assert first_rows[0, 0] == 3, "the first batch was the sample's"
        np.testing.assert_array_equal(first[0], WARM_X)
        assert first_text[0, 0] == b"warm|up"
        # The request's own strings come back: the warm-up changed nothing of its answer.
        assert text[0, 0] == b"a|b"


def test_an_onnx_model_warms_up_on_random_data_from_config_yaml(server):
    """The MLP's sample ran, and the model serves as before."""
    ran = [line for line in server.log
           if "warm-up samples ran" in line and '"model":"mlp' in line]
    assert ran, "no warm-up line for mlp"
    client = httpclient.InferenceServerClient(server.http)
    assert client.is_model_ready("mlp")
    x = np.random.default_rng(3).random((2, 512), dtype=np.float32)
    inputs = [httpclient.InferInput("input", [2, 512], "FP32")]
    inputs[0].set_data_from_numpy(x)
    assert client.infer("mlp", inputs).as_numpy("output").shape == (2, 10)


def test_max_batch_size_auto_settles_on_no_less_than_the_largest_sample(server):
    client = httpclient.InferenceServerClient(server.http)
    assert client.get_model_config("quadratic")["max_batch_size"] == 8
    curve = [line for line in server.log
             if "max_batch_size auto" in line and '"model":"quadratic"' in line]
    # The probe measured a size below 8 best; the sample's 8 items ran all the same. Of the two
    # instances, one probed, and the other took its size.
    assert len(curve) == 1, curve
    measured = {int(b): float(rate) for b, rate in re.findall(r"(\d+): (\d+)/s", curve[0])}
    assert max(measured, key=measured.get) < 8 and '"chosen":8' in curve[0], curve
    warmed = [line for line in server.log
              if "warm-up samples ran" in line and '"model":"quadratic"' in line]
    assert len(warmed) == 2, warmed
    x = np.arange(16, dtype=np.float32).reshape(8, 2)
    inputs = [httpclient.InferInput("x", [8, 2], "FP32")]
    inputs[0].set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer("quadratic", inputs).as_numpy("y"), x)


def echoed(client, model):
    """A request of 3 items to a model that echoes `x` as `y`: its answer, `y` checked."""
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    inputs = [httpclient.InferInput("x", [3, 2], "FP32")]
    inputs[0].set_data_from_numpy(x)
    result = client.infer(model, inputs)
    np.testing.assert_array_equal(result.as_numpy("y"), x)
    return result


@pytest.mark.parametrize("model,limit", [("told_batched", 256), ("told_triton", 256),
                                         ("told_allowed", 16)])
def test_max_batch_size_auto_tells_the_model_the_most_it_may_be_sent(server, model, limit):
    """The model reads its max_batch_size when it loads, before the probe: it is told the
    probe's limit (256, or the largest allowed size), and no batch it runs is larger. A fixed
    cost per batch makes the probe climb past sheaf's default of 32 up to that limit."""
    client = httpclient.InferenceServerClient(server.http)
    result = echoed(client, model)
    told, largest = result.as_numpy("told")[0, 0], result.as_numpy("largest")[0, 0]
    assert told == limit
    assert 0 < largest <= told, (told, largest)
    if limit > 32:
        # The probe went past the default the model used to be told.
        assert largest > 32, largest


@pytest.mark.parametrize("model", ["sets_under_auto", "sets_alone"])
def test_a_config_yaml_that_gives_no_max_batch_size_lets_the_model_set_its_own(server, model):
    """auto_complete_config's set_max_batch_size(8) holds where config.yaml gives no number (it
    leaves max_batch_size out, or says auto): the model is told 8 and runs no larger batch,
    and under `auto` the probe goes no further than 8."""
    client = httpclient.InferenceServerClient(server.http)
    chosen = int(client.get_model_config(model)["max_batch_size"])
    assert 1 <= chosen <= 8
    result = echoed(client, model)
    assert result.as_numpy("told")[0, 0] == 8
    assert result.as_numpy("largest")[0, 0] <= 8
    curve = [line for line in server.log
             if "max_batch_size auto" in line and f'"model":"{model}"' in line]
    if model == "sets_under_auto":
        assert len(curve) == 1, curve
        probed = [int(b) for b in re.findall(r"(\d+): \d+/s", curve[0])]
        assert max(probed) == 8, curve
    else:
        assert chosen == 8 and not curve, curve


def test_a_model_that_sets_another_max_batch_size_than_config_yaml_gives_fails_to_load(server):
    client = httpclient.InferenceServerClient(server.http)
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["sets_against"]["state"] == "UNAVAILABLE"
    assert ("configuration specified max_batch_size 16, but the model sets 8"
            in index["sets_against"]["reason"]), index["sets_against"]["reason"]


@pytest.mark.parametrize("model,says", [
    ("refusing", ["model_warmup[0] 'zeros' failed", "ValueError", "zeros are not a digit"]),
    ("misfit", ["model_warmup[0] 'wide'", "input 'x' has dims [3] in the sample, but the "
                "model's are [2]"]),
    ("undecided", ["model_warmup[0], input 'x'", "exactly one of zero_data, random_data and "
                   "input_data_file"]),
    ("fileless", ["input_data_file 'gone.raw' is not in fileless/warmup"]),
])
def test_a_sample_that_fails_is_a_clear_load_error_and_the_server_serves(server, model, says):
    client = httpclient.InferenceServerClient(server.http)
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index[model]["state"] == "UNAVAILABLE"
    for part in says:
        assert part in index[model]["reason"], index[model]["reason"]
    assert client.is_model_ready("recall")


def test_a_python_process_started_again_after_a_crash_warms_up_again(server):
    client = httpclient.InferenceServerClient(server.http)

    def ask(value):
        x = httpclient.InferInput("X", [1, 1], "FP32")
        x.set_data_from_numpy(np.full((1, 1), value, np.float32))
        result = client.infer("phoenix", [x])
        return result.as_numpy("RUNS")[0, 0], result.as_numpy("PID")[0, 0]

    runs, pid = ask(1.0)
    assert runs >= 3, "the sample's three runs came first"
    with pytest.raises(Exception):
        ask(-1.0)
    runs, again = ask(1.0)
    assert again != pid, "a new process answers"
    assert runs == 3, "the new process ran the sample three times before this request"
