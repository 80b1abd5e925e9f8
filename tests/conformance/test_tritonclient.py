"""Conformance: NVIDIA's tritonclient, unmodified, against sheaf over HTTP and gRPC.

Every inference result is checked against the same ONNX file run in-process by Python's
onnxruntime, within 1e-5 relative error.
"""
import functools
import queue

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

PROTOCOLS = ["http", "grpc"]
ECHO_TYPES = ["INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64",
              "BOOL", "FP16", "FP32", "FP64"]
NUMPY = {"INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
         "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
         "BOOL": np.bool_, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}


def lib(protocol):
    return httpclient if protocol == "http" else grpcclient


def connect(server, protocol):
    url = server.http if protocol == "http" else server.grpc
    return lib(protocol).InferenceServerClient(url=url)


@functools.lru_cache(maxsize=None)
def session(path):
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def reference(server, model, feeds):
    return session(server.model_file(model)).run(None, feeds)


def assert_close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.max(np.abs(want))))


def config_of(client, protocol, model):
    if protocol == "http":
        return client.get_model_config(model)
    return client.get_model_config(model, as_json=True)["config"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_health_and_readiness(server, protocol):
    c = connect(server, protocol)
    assert c.is_server_live()
    assert c.is_server_ready()
    assert c.is_model_ready("mlp")
    assert c.is_model_ready("mlp", "1")
    assert not c.is_model_ready("nope")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_server_and_model_metadata(server, protocol):
    c = connect(server, protocol)
    kwargs = {} if protocol == "http" else {"as_json": True}
    meta = c.get_server_metadata(**kwargs)
    assert meta["name"] == "sheaf"
    # Triton's names for the extensions sheaf implements; not CUDA shared memory.
    assert set(meta["extensions"]) == {
        "binary_tensor_data", "classification", "sequence", "schedule_policy", "parameters",
        "system_shared_memory", "statistics", "model_configuration", "model_repository",
        "model_repository(unload_dependents)", "logging", "trace"}
    m = c.get_model_metadata("orientation", **kwargs)
    assert m["name"] == "orientation"
    assert m["platform"] == "onnxruntime_onnx"
    (x,) = m["inputs"]
    assert (x["name"], x["datatype"]) == ("x", "FP32")
    assert [int(d) for d in x["shape"]] == [-1, 3, 224, 224]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_model_config(server, protocol):
    c = connect(server, protocol)
    config = config_of(c, protocol, "mlp")
    assert config["name"] == "mlp"
    assert int(config["max_batch_size"]) == 32
    assert config["input"][0]["name"] == "input"
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert [int(d) for d in config["input"][0]["dims"]] == [512]
    assert [int(d) for d in config["output"][0]["dims"]] == [10]
    assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 2000
    echo = config_of(c, protocol, "echo")
    assert {i["data_type"] for i in echo["input"]} == {f"TYPE_{t}" for t in ECHO_TYPES}


@pytest.mark.parametrize("protocol,binary", [("http", False), ("http", True), ("grpc", True)])
def test_infer_matches_in_process_on_a_real_cnn(server, protocol, binary):
    c = connect(server, protocol)
    m = lib(protocol)
    x = np.random.default_rng(3).uniform(-1, 1, (2, 3, 224, 224)).astype(np.float32)
    inp = m.InferInput("x", list(x.shape), "FP32")
    if protocol == "http":
        inp.set_data_from_numpy(x, binary_data=binary)
        out = m.InferRequestedOutput("fetch_name_0", binary_data=binary)
    else:
        inp.set_data_from_numpy(x)
        out = m.InferRequestedOutput("fetch_name_0")
    result = c.infer("orientation", [inp], outputs=[out])
    got = result.as_numpy("fetch_name_0")
    assert got.shape == (2, 4)
    assert_close(got, reference(server, "orientation", {"x": x})[0])


def echo_inputs(m, protocol, binary):
    rng = np.random.default_rng(9)
    arrays = {}
    inputs = []
    for t in ECHO_TYPES:
        dtype = NUMPY[t]
        if t == "BOOL":
            a = rng.integers(0, 2, (2, 3)).astype(np.bool_)
        elif np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            a = np.array([[info.min, 0, info.max], [1, 2, 3]], dtype=dtype)
        else:
            a = rng.uniform(-100, 100, (2, 3)).astype(dtype)
        arrays[t] = a
        inp = m.InferInput(f"in_{t}", [2, 3], t)
        if protocol == "http":
            # JSON has no FP16 form in tritonclient; it travels as binary.
            inp.set_data_from_numpy(a, binary_data=binary or t == "FP16")
        else:
            inp.set_data_from_numpy(a)
        inputs.append(inp)
    return arrays, inputs


@pytest.mark.parametrize("protocol,binary", [("http", False), ("http", True), ("grpc", True)])
def test_every_numeric_datatype_round_trips(server, protocol, binary):
    c = connect(server, protocol)
    m = lib(protocol)
    arrays, inputs = echo_inputs(m, protocol, binary)
    if protocol == "http":
        outputs = [m.InferRequestedOutput(f"out_{t}", binary_data=binary or t == "FP16") for t in ECHO_TYPES]
    else:
        outputs = [m.InferRequestedOutput(f"out_{t}") for t in ECHO_TYPES]
    result = c.infer("echo", inputs, outputs=outputs)
    for t in ECHO_TYPES:
        got = result.as_numpy(f"out_{t}")
        assert got.dtype == NUMPY[t], t
        np.testing.assert_array_equal(got, arrays[t], err_msg=t)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_selected_outputs_and_request_id(server, protocol):
    c = connect(server, protocol)
    m = lib(protocol)
    arrays, inputs = echo_inputs(m, protocol, True)
    outputs = [m.InferRequestedOutput("out_INT64"), m.InferRequestedOutput("out_FP32")]
    result = c.infer("echo", inputs, outputs=outputs, request_id="req-42")
    response = result.get_response()
    if protocol == "http":
        assert response["id"] == "req-42"
        names = [o["name"] for o in response["outputs"]]
    else:
        assert response.id == "req-42"
        names = [o.name for o in response.outputs]
    assert names == ["out_INT64", "out_FP32"]
    np.testing.assert_array_equal(result.as_numpy("out_INT64"), arrays["INT64"])
    assert result.as_numpy("out_BOOL") is None


def test_grpc_stream_of_200_frames_in_order(server):
    c = connect(server, "grpc")
    before = c.get_inference_statistics("mlp", as_json=True)["model_stats"][0]
    answers = queue.Queue()
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    frames = np.random.default_rng(5).uniform(-1, 1, (200, 1, 512)).astype(np.float32)
    for i, frame in enumerate(frames):
        inp = grpcclient.InferInput("input", [1, 512], "FP32")
        inp.set_data_from_numpy(frame)
        c.async_stream_infer("mlp", [inp], request_id=f"frame-{i}")
    got = [answers.get(timeout=60) for _ in range(200)]
    c.stop_stream()
    want = reference(server, "mlp", {"input": frames.reshape(200, 512)})[0]
    for i, (result, error) in enumerate(got):
        assert error is None, error
        assert result.get_response().id == f"frame-{i}"
        assert_close(result.as_numpy("output")[0], want[i])
    after = c.get_inference_statistics("mlp", as_json=True)["model_stats"][0]
    items = int(after["inference_count"]) - int(before.get("inference_count", 0))
    calls = int(after["execution_count"]) - int(before.get("execution_count", 0))
    assert items == 200
    assert calls < 200, f"200 streamed frames took {calls} backend calls"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_errors_reach_the_client_with_sheafs_message(server, protocol):
    c = connect(server, protocol)
    m = lib(protocol)

    def infer(model, name, shape, datatype):
        inp = m.InferInput(name, shape, datatype)
        inp.set_data_from_numpy(np.zeros(shape, dtype=NUMPY[datatype]))
        return c.infer(model, [inp])

    with pytest.raises(InferenceServerException) as e:
        infer("nope", "input", [1, 512], "FP32")
    assert "unknown model 'nope'" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        infer("mlp", "input", [1, 500], "FP32")
    assert "has shape [1, 500], but the model expects [-1, 512]" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        infer("mlp", "input", [1, 512], "FP64")
    assert "datatype FP64, but the model expects FP32" in e.value.message()
    if protocol == "grpc":
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    else:
        assert e.value.status() == "400"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_statistics(server, protocol):
    c = connect(server, protocol)
    x = np.zeros((3, 512), dtype=np.float32)
    inp = lib(protocol).InferInput("input", [3, 512], "FP32")
    inp.set_data_from_numpy(x)
    c.infer("mlp", [inp])
    kwargs = {} if protocol == "http" else {"as_json": True}
    stats = c.get_inference_statistics("mlp", **kwargs)["model_stats"][0]
    assert stats["name"] == "mlp"
    assert int(stats["inference_count"]) >= 3
    assert int(stats["inference_stats"]["success"]["count"]) >= 1
    assert sum(int(b["compute_infer"]["count"]) for b in stats["batch_stats"]) == int(stats["execution_count"])
