"""Model folders written for Triton (`config.pbtxt`, version folders, files beside them) served
by the real `sheaf` binary: the fields sheaf reads take effect, and an ensemble of Python and
ONNX models runs as Triton runs it, seen through NVIDIA's tritonclient."""
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, start

NAMES = [f"class-{i}" for i in range(10)]
CONFIG = '''
name: "scorer"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "input" data_type: TYPE_FP32 dims: [ 512 ] } ]
output [ { name: "output" data_type: TYPE_FP32 dims: [ 10 ] label_filename: "names.txt" } ]
'''
# Triton's ensemble pattern: Python pre-processing, the ONNX model, Python post-processing.
PREPROCESS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "FEATURES", pb_utils.get_input_tensor_by_name(r, "RAW").as_numpy().astype(np.float32)
            / 100.0)]) for r in requests]
'''
POSTPROCESS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            logits = pb_utils.get_input_tensor_by_name(r, "LOGITS").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("TOP", np.argmax(logits, axis=1).astype(np.int64)[:, None])]))
        return responses
'''
PYTHON_CONFIG = '''
backend: "python"
max_batch_size: 16
dynamic_batching {{ }}
input [ {{ name: "{i}" data_type: {it} dims: [ {idims} ] }} ]
output [ {{ name: "{o}" data_type: {ot} dims: [ {odims} ] }} ]
'''
# The steps are written last first: they run in the order their tensors allow, as under Triton.
ENSEMBLE = '''
name: "classify"
platform: "ensemble"
max_batch_size: 16
input [ { name: "RAW" data_type: TYPE_INT64 dims: [ 512 ] } ]
output [ { name: "TOP" data_type: TYPE_INT64 dims: [ 1 ] }, { name: "LOGITS" data_type: TYPE_FP32 dims: [ 10 ] } ]
ensemble_scheduling {
  step [
    { model_name: "postprocess" model_version: -1
      input_map { key: "LOGITS" value: "LOGITS" } output_map { key: "TOP" value: "TOP" } },
    { model_name: "scorer" model_version: 1
      input_map { key: "input" value: "features" }
      output_map [ { key: "output" value: "LOGITS" } ] },
    { model_name: "preprocess" model_version: -1
      input_map { key: "RAW" value: "RAW" } output_map { key: "FEATURES" value: "features" } }
  ]
}
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("triton-repo")
    (repo / "scorer" / "1").mkdir(parents=True)
    (repo / "scorer" / "1" / "model.onnx").symlink_to(ROOT / "model_repository/mlp/1/model.onnx")
    (repo / "scorer" / "config.pbtxt").write_text(CONFIG)
    (repo / "scorer" / "names.txt").write_text("\n".join(NAMES) + "\n")
    for name, code, config in (
            ("preprocess", PREPROCESS, PYTHON_CONFIG.format(
                i="RAW", it="TYPE_INT64", idims="512", o="FEATURES", ot="TYPE_FP32",
                odims="512")),
            ("postprocess", POSTPROCESS, PYTHON_CONFIG.format(
                i="LOGITS", it="TYPE_FP32", idims="10", o="TOP", ot="TYPE_INT64", odims="1"))):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(code)
        (repo / name / "config.pbtxt").write_text(config)
    # Triton's layout: the ensemble's folder holds its configuration and an empty version folder.
    (repo / "classify" / "1").mkdir(parents=True)
    (repo / "classify" / "config.pbtxt").write_text(ENSEMBLE)
    # An ensemble that asks for a version not served fails its requests with the reason.
    (repo / "stale" / "1").mkdir(parents=True)
    (repo / "stale" / "config.pbtxt").write_text(
        ENSEMBLE.replace('name: "classify"', 'name: "stale"').replace("model_version: 1", "model_version: 2"))
    yield from start(repo)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_an_output_s_label_filename_names_its_classes(server, module):
    client = module.InferenceServerClient(server.http if module is httpclient else server.grpc)
    x = np.random.default_rng(5).random((2, 512), dtype=np.float32)
    inputs = [module.InferInput("input", [2, 512], "FP32")]
    inputs[0].set_data_from_numpy(x)
    logits = client.infer("scorer", inputs).as_numpy("output")
    out = module.InferRequestedOutput("output", class_count=2)
    classes = client.infer("scorer", inputs, outputs=[out]).as_numpy("output")
    for row, scores in zip(classes, logits):
        best = np.argsort(-scores)[:2]
        got = [c.decode().split(":") for c in row]
        assert [int(index) for _, index, _ in got] == list(best)
        assert [name for _, _, name in got] == [NAMES[i] for i in best]


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_triton_ensemble_runs_its_python_and_onnx_steps(server, module):
    client = module.InferenceServerClient(server.http if module is httpclient else server.grpc)
    raw = np.random.default_rng(3).integers(-100, 100, size=(6, 512), dtype=np.int64)
    inputs = [module.InferInput("RAW", list(raw.shape), "INT64")]
    inputs[0].set_data_from_numpy(raw)
    result = client.infer("classify", inputs)
    session = ort.InferenceSession(str(ROOT / "model_repository/mlp/1/model.onnx"))
    logits = session.run(None, {"input": raw.astype(np.float32) / 100.0})[0]
    np.testing.assert_allclose(result.as_numpy("LOGITS"), logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(result.as_numpy("TOP")[:, 0], np.argmax(logits, axis=1))
    index = {m["name"]: m for m in httpclient.InferenceServerClient(server.http)
             .get_model_repository_index()}
    assert index["classify"]["state"] == "READY"


def test_an_ensemble_step_s_version_must_be_the_one_served(server):
    client = httpclient.InferenceServerClient(server.http)
    inputs = [httpclient.InferInput("RAW", [1, 512], "INT64")]
    inputs[0].set_data_from_numpy(np.zeros((1, 512), np.int64))
    with pytest.raises(InferenceServerException) as e:
        client.infer("stale", inputs)
    assert "unknown version '2' of model 'scorer' (version '1' is served)" in str(e.value)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_an_ensemble_s_metadata_lists_the_tensors_its_config_declares(server, module):
    """As under Triton, so that clients (perf_analyzer among them) can build its requests."""
    client = module.InferenceServerClient(server.http if module is httpclient else server.grpc)
    meta = client.get_model_metadata("classify")
    if module is grpcclient:
        from google.protobuf.json_format import MessageToDict
        meta = MessageToDict(meta, preserving_proto_field_name=True)
    tensors = {t["name"]: (t["datatype"], [int(d) for d in t["shape"]])
               for t in meta["inputs"] + meta["outputs"]}
    assert tensors == {"RAW": ("INT64", [-1, 512]), "TOP": ("INT64", [-1, 1]),
                       "LOGITS": ("FP32", [-1, 10])}
    config = client.get_model_config("classify")
    if module is grpcclient:
        config = MessageToDict(config, preserving_proto_field_name=True)
    config = config.get("config", config)
    assert int(config["max_batch_size"]) == 16
