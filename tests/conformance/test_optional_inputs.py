"""Triton's optional inputs (`optional: true` in config.pbtxt): the real `sheaf` binary, a Triton
Python model that adds a bias when a request carries one, clients over HTTP and gRPC
(NVIDIA's tritonclient) that leave it out or send it, and a model that cannot take them."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, start

# Each answer says whether the request carried the bias, how many requests its execute call
# held, and whether that call held requests with and without it.
MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        biases = [pb_utils.get_input_tensor_by_name(r, "bias") for r in requests]
        mixed = len({b is None for b in biases}) > 1
        names = [sorted(t.name() for t in r.inputs()) for r in requests]
        responses = []
        for request, bias, seen in zip(requests, biases, names):
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            # The bias may have any length, none included: its sum is added.
            add = bias.as_numpy().sum(axis=1, keepdims=True) if bias is not None else 100.0
            rows = x.shape[0]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("y", (x + add).astype(np.float32)),
                pb_utils.Tensor("calls", np.full((rows, 1), len(requests), np.int32)),
                pb_utils.Tensor("mixed", np.full((rows, 1), int(mixed), np.int32)),
                pb_utils.Tensor("inputs", np.full((rows, 1), len(seen), np.int32)),
            ]))
        return responses
'''
CONFIG = '''
backend: "python"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 200000 }
input [
  { name: "x" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "bias" data_type: TYPE_FP32 dims: [ -1 ] optional: true }
]
output [
  { name: "y" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "calls" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "mixed" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "inputs" data_type: TYPE_INT32 dims: [ 1 ] }
]
'''
# An ONNX model answers assembled batches, which have every input: it cannot take them.
ONNX = '''
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "input" data_type: TYPE_FP32 dims: [ 512 ] optional: true } ]
output [ { name: "output" data_type: TYPE_FP32 dims: [ 10 ] } ]
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("optional")
    (repo / "biased" / "1").mkdir(parents=True)
    (repo / "biased" / "1" / "model.py").write_text(MODEL)
    (repo / "biased" / "config.pbtxt").write_text(CONFIG)
    (repo / "scorer" / "1").mkdir(parents=True)
    (repo / "scorer" / "1" / "model.onnx").symlink_to(ROOT / "model_repository/mlp/1/model.onnx")
    (repo / "scorer" / "config.pbtxt").write_text(ONNX)
    yield from start(repo, "--model-control-mode", "explicit", "--load-model", "biased")


def request(module, x, bias=None):
    """`bias`: one row per item of `x` (a list of lists; rows may be empty)."""
    inputs = [module.InferInput("x", [len(x), 1], "FP32")]
    inputs[0].set_data_from_numpy(np.array(x, np.float32).reshape(-1, 1))
    if bias is not None:
        rows = np.array(bias, np.float32).reshape(len(x), -1)
        inputs.append(module.InferInput("bias", list(rows.shape), "FP32"))
        inputs[1].set_data_from_numpy(rows)
    return inputs


def test_a_request_may_leave_an_optional_input_out(server):
    for module, url in ((httpclient, server.http), (grpcclient, server.grpc)):
        client = module.InferenceServerClient(url)
        without = client.infer("biased", request(module, [1.0, 2.0]))
        assert without.as_numpy("y").ravel().tolist() == [101.0, 102.0]
        # The model is not given the input it did not get: only 'x'.
        assert without.as_numpy("inputs").ravel().tolist() == [1, 1]
        given = client.infer("biased", request(module, [1.0, 2.0], [[0.5], [-1.0]]))
        assert given.as_numpy("y").ravel().tolist() == [1.5, 1.0]
        assert given.as_numpy("inputs").ravel().tolist() == [2, 2]


def test_a_required_input_is_still_required(server):
    client = httpclient.InferenceServerClient(server.http)
    bias = httpclient.InferInput("bias", [1, 1], "FP32")
    bias.set_data_from_numpy(np.ones((1, 1), np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("biased", [bias])
    assert "missing input 'x'" in str(e.value), e.value


def test_requests_with_other_inputs_never_share_a_batch(server):
    """As Triton batches only requests that carry the same inputs: 32 concurrent requests,
    every other one with a bias of no elements (so that its tensor has the shape that leaving
    it out gives too), each answered right; none ran beside a request whose inputs differ, and
    the model still ran them in fewer calls than requests."""
    url = server.http

    def ask(k):
        client = httpclient.InferenceServerClient(url)
        bias = [[]] if k % 2 else None
        got = client.infer("biased", request(httpclient, [float(k)], bias))
        return k, got.as_numpy("y")[0, 0], got.as_numpy("calls")[0, 0], got.as_numpy("mixed")[0, 0]

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(ask, range(32)))
    for k, y, _, mixed in answers:
        assert y == (k if k % 2 else k + 100.0), (k, y)
        assert mixed == 0, f"request {k} shared an execute call with requests of other inputs"
    assert max(calls for _, _, calls, _ in answers) > 1, "requests were batched"


def test_the_model_config_shows_the_input_optional(server):
    config = httpclient.InferenceServerClient(server.http).get_model_config("biased")
    bias = [i for i in config["input"] if i["name"] == "bias"][0]
    assert bias["optional"] is True
    assert "optional" not in [i for i in config["input"] if i["name"] == "x"][0]
    grpc = grpcclient.InferenceServerClient(server.grpc).get_model_config("biased").config
    assert [(i.name, i.optional) for i in grpc.input] == [("x", False), ("bias", True)]


def test_a_model_that_takes_assembled_batches_cannot_have_optional_inputs(server):
    client = httpclient.InferenceServerClient(server.http)
    with pytest.raises(InferenceServerException) as e:
        client.load_model("scorer")
    message = str(e.value)
    assert "input 'input' is optional" in message and "assembled batches" in message, message
