"""Triton's `reshape` in config.pbtxt: clients send and get tensors with the declared dims while
the model (ONNX or Python) takes and gives them in the reshaped form, through the real `sheaf`
binary and NVIDIA's tritonclient."""
import concurrent.futures

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from conftest import start

# y = x * [1, 2, 3, 4]: one number per item in, four out.
SCALE = '''
platform: "onnxruntime_onnx"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 2000 }
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2, 2 ] reshape: { shape: [ 4 ] } } ]
model_warmup [ { name: "zeros" batch_size: 2
  inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } } ]
'''
# The Python model says how many dimensions it was given, per item.
SEEN = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("NDIM", np.full(x.shape[0], x.ndim, np.int32)),
                pb_utils.Tensor("DOUBLE", x * 2)]))
        return responses
'''
SEEN_CONFIG = '''
backend: "python"
max_batch_size: 8
dynamic_batching { }
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
output [ { name: "NDIM" data_type: TYPE_INT32 dims: [ 1 ] reshape: { shape: [ ] } },
         { name: "DOUBLE" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
'''

BAD = '''
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] reshape: { shape: [ 4 ] } } ]
'''


def scale_model(path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    factors = helper.make_tensor("factors", TensorProto.FLOAT, [1, 4], [1, 2, 3, 4])
    graph = helper.make_graph(
        [helper.make_node("Unsqueeze", ["x", "axes"], ["column"]),
         helper.make_node("Mul", ["column", "factors"], ["y"])],
        "scale", [x], [y], initializer=[axes, factors])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("reshape-repo")
    (repo / "scale" / "1").mkdir(parents=True)
    scale_model(repo / "scale" / "1" / "model.onnx")
    (repo / "scale" / "config.pbtxt").write_text(SCALE)
    (repo / "seen" / "1").mkdir(parents=True)
    (repo / "seen" / "1" / "model.py").write_text(SEEN)
    (repo / "seen" / "config.pbtxt").write_text(SEEN_CONFIG)
    # Two dims that cannot hold the same elements.
    (repo / "bad" / "1").mkdir(parents=True)
    scale_model(repo / "bad" / "1" / "model.onnx")
    (repo / "bad" / "config.pbtxt").write_text(BAD)
    yield from start(repo)


def client_of(module, server):
    return module.InferenceServerClient(server.http if module is httpclient else server.grpc)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_clients_use_the_dims_and_the_model_its_reshape(server, module):
    client = client_of(module, server)
    x = np.arange(1, 6, dtype=np.float32).reshape(5, 1)
    given = [module.InferInput("x", [5, 1], "FP32")]
    given[0].set_data_from_numpy(x)
    y = client.infer("scale", given).as_numpy("y")
    assert y.shape == (5, 2, 2)
    np.testing.assert_array_equal(y, (x * np.array([1, 2, 3, 4], np.float32)).reshape(5, 2, 2))
    meta = client.get_model_metadata("scale")
    if module is grpcclient:
        from google.protobuf.json_format import MessageToDict
        meta = MessageToDict(meta, preserving_proto_field_name=True)
    shapes = {t["name"]: [int(d) for d in t["shape"]] for t in meta["inputs"] + meta["outputs"]}
    assert shapes == {"x": [-1, 1], "y": [-1, 2, 2]}


def test_reshaped_requests_batch_together_and_each_gets_its_own_answer(server):
    client = httpclient.InferenceServerClient(server.http)
    before = client.get_inference_statistics("scale")["model_stats"][0]["execution_count"]

    def one(k):
        client = httpclient.InferenceServerClient(server.http)
        rows = 1 + k % 3
        x = (np.arange(rows, dtype=np.float32) + 10 * k).reshape(rows, 1)
        given = [httpclient.InferInput("x", [rows, 1], "FP32")]
        given[0].set_data_from_numpy(x)
        y = client.infer("scale", given).as_numpy("y")
        return np.array_equal(y, (x * np.array([1, 2, 3, 4], np.float32)).reshape(rows, 2, 2))

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        assert all(pool.map(one, range(48)))
    ran = client.get_inference_statistics("scale")["model_stats"][0]["execution_count"] - before
    assert 0 < ran < 48, ran


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_python_model_gets_its_inputs_in_their_reshape(server, module):
    client = client_of(module, server)
    x = np.array([[1.5], [2.5], [4.0]], np.float32)
    given = [module.InferInput("X", [3, 1], "FP32")]
    given[0].set_data_from_numpy(x)
    result = client.infer("seen", given)
    # The model saw [3] (a scalar per item), and clients get [3, 1] back.
    np.testing.assert_array_equal(result.as_numpy("NDIM"), np.ones((3, 1), np.int32))
    np.testing.assert_array_equal(result.as_numpy("DOUBLE"), x * 2)


def test_a_reshape_that_cannot_hold_the_dims_fails_the_load_with_the_reason(server):
    index = {m["name"]: m for m in
             httpclient.InferenceServerClient(server.http).get_model_repository_index()}
    assert index["bad"]["state"] == "UNAVAILABLE"
    assert "reshape [4] cannot hold the elements of dims [3]" in index["bad"]["reason"], index["bad"]
    assert index["scale"]["state"] == "READY"
