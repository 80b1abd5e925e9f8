"""Model folders written for Triton (`config.pbtxt`, version folders, files beside them) served
by the real `sheaf` binary: the fields sheaf reads take effect, and an ensemble of Python and
ONNX models runs as Triton runs it, seen through NVIDIA's tritonclient."""
import json
import os
import urllib.request

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, binary, launch, start

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

# Two models that meet: each leaves a mark for the request's token and waits (up to 20 s) for
# the other's. Run one after the other, the first would wait alone and say 0.
MEETING = '''
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.dir = args["model_repository"] + "/.."

    def execute(self, requests):
        responses = []
        for request in requests:
            token = pb_utils.get_input_tensor_by_name(request, "TOKEN").as_numpy()[0].decode()
            open(os.path.join(self.dir, f"{token}.{ME}"), "w").close()
            other = os.path.join(self.dir, f"{token}.{OTHER}")
            deadline = time.monotonic() + 20
            while not os.path.exists(other) and time.monotonic() < deadline:
                time.sleep(0.005)
            saw = np.array([int(os.path.exists(other))], np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SAW", saw)]))
        return responses
'''
MEETING_CONFIG = '''
backend: "python"
max_batch_size: 0
input [ { name: "TOKEN" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "SAW" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''
BOTH = '''
platform: "ensemble"
max_batch_size: 0
input [ { name: "TOKEN" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "LEFT_SAW" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "RIGHT_SAW" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "left" input_map { key: "TOKEN" value: "TOKEN" }
      output_map { key: "SAW" value: "LEFT_SAW" } },
    { model_name: "right" input_map { key: "TOKEN" value: "TOKEN" }
      output_map { key: "SAW" value: "RIGHT_SAW" } }
  ]
}
'''


# An ensemble whose step is an ensemble: the classify ensemble, then postprocess once more on
# its logits.
OUTER = '''
platform: "ensemble"
max_batch_size: 16
input [ { name: "RAW" data_type: TYPE_INT64 dims: [ 512 ] } ]
output [ { name: "AGAIN" data_type: TYPE_INT64 dims: [ 1 ] }, { name: "TOP" data_type: TYPE_INT64 dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "classify" input_map { key: "RAW" value: "RAW" }
      output_map [ { key: "TOP" value: "TOP" }, { key: "LOGITS" value: "scores" } ] },
    { model_name: "postprocess" input_map { key: "LOGITS" value: "scores" }
      output_map { key: "TOP" value: "AGAIN" } }
  ]
}
'''
# An ensemble that is its own step.
SELF = '''
platform: "ensemble"
max_batch_size: 16
input [ { name: "RAW" data_type: TYPE_INT64 dims: [ 512 ] } ]
output [ { name: "TOP" data_type: TYPE_INT64 dims: [ 1 ] } ]
ensemble_scheduling {
  step [ { model_name: "itself" input_map { key: "RAW" value: "RAW" }
           output_map { key: "TOP" value: "TOP" } } ]
}
'''
# An ensemble whose step model is nowhere in the repository.
BROKEN = '''
platform: "ensemble"
max_batch_size: 16
input [ { name: "RAW" data_type: TYPE_INT64 dims: [ 512 ] } ]
output [ { name: "TOP" data_type: TYPE_INT64 dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "preprocess" input_map { key: "RAW" value: "RAW" }
      output_map { key: "FEATURES" value: "TOP" } },
    { model_name: "missing" input_map { key: "x" value: "RAW" } output_map { key: "y" value: "z" } }
  ]
}
'''


def write_repo(repo):
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
    for me, other in (("left", "right"), ("right", "left")):
        (repo / me / "1").mkdir(parents=True)
        (repo / me / "1" / "model.py").write_text(
            f"ME, OTHER = {me!r}, {other!r}\n" + MEETING)
        (repo / me / "config.pbtxt").write_text(MEETING_CONFIG)
    (repo / "both" / "1").mkdir(parents=True)
    (repo / "both" / "config.pbtxt").write_text(BOTH)
    for name, config in (("outer", OUTER), ("itself", SELF), ("broken", BROKEN)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from start(write_repo(tmp_path_factory.mktemp("triton-repo")))


@pytest.fixture(scope="module")
def explicit(tmp_path_factory):
    yield from start(write_repo(tmp_path_factory.mktemp("triton-explicit")),
                     "--model-control-mode", "explicit")


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


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_an_ensemble_s_config_lists_its_steps_as_triton_s_does(server, module):
    """platform "ensemble", no backend, and `ensemble_scheduling` with each step's model,
    version (-1: the one served) and maps, in the order the steps run: what perf_analyzer
    reads to find an ensemble's composing models."""
    client = module.InferenceServerClient(server.http if module is httpclient else server.grpc)
    config = client.get_model_config("classify")
    meta = client.get_model_metadata("classify")
    if module is grpcclient:
        from google.protobuf.json_format import MessageToDict
        config = MessageToDict(config, preserving_proto_field_name=True)
        meta = MessageToDict(meta, preserving_proto_field_name=True)
    config = config.get("config", config)
    assert meta["platform"] == "ensemble"
    assert config["platform"] == "ensemble" and config.get("backend", "") == ""
    assert "dynamic_batching" not in config
    steps = config["ensemble_scheduling"]["step"]
    assert [(s["model_name"], int(s["model_version"])) for s in steps] == [
        ("preprocess", -1), ("scorer", 1), ("postprocess", -1)]
    assert [(s["input_map"], s["output_map"]) for s in steps] == [
        ({"RAW": "RAW"}, {"FEATURES": "features"}),
        ({"input": "features"}, {"output": "LOGITS"}),
        ({"LOGITS": "LOGITS"}, {"TOP": "TOP"})]


def test_an_ensemble_s_statistics_count_its_requests_and_sum_its_steps_compute(server):
    """As Triton keeps an ensemble's statistics: one execution per request of its items, a
    queue count per request (perf_analyzer finds an ensemble's version by it), and the compute
    times of its steps summed; the nv_ metrics carry the same."""
    http = httpclient.InferenceServerClient(server.http)
    grpc = grpcclient.InferenceServerClient(server.grpc)

    def stats(name):
        return http.get_inference_statistics(name)["model_stats"][0]

    before, scorer_before = stats("classify"), stats("scorer")
    rng = np.random.default_rng(8)
    for rows in (1, 3, 2):
        inputs = [httpclient.InferInput("RAW", [rows, 512], "INT64")]
        inputs[0].set_data_from_numpy(rng.integers(-100, 100, (rows, 512), dtype=np.int64))
        http.infer("classify", inputs)
    after, scorer_after = stats("classify"), stats("scorer")

    def grew(a, b, *path):
        for key in path:
            a, b = a[key], b[key]
        return int(b) - int(a)

    assert grew(before, after, "inference_count") == 6
    assert grew(before, after, "execution_count") == 3
    for counter in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert grew(before, after, "inference_stats", counter, "count") == 3, counter
    assert grew(before, after, "inference_stats", "fail", "count") == 0
    # The steps' compute, the scorer's among it, within the ensemble's whole time.
    summed = grew(before, after, "inference_stats", "compute_infer", "ns")
    scorer = grew(scorer_before, scorer_after, "inference_stats", "compute_infer", "ns")
    assert 0 < scorer <= summed <= grew(before, after, "inference_stats", "success", "ns")
    assert 3 in [int(b["batch_size"]) for b in after["batch_stats"]]
    # gRPC reads the same figures.
    over_grpc = grpc.get_inference_statistics("classify", as_json=True)["model_stats"][0]
    assert int(over_grpc["execution_count"]) == int(after["execution_count"])
    # A failed run counts as one.
    bad = [httpclient.InferInput("RAW", [1, 512], "INT64")]
    bad[0].set_data_from_numpy(np.zeros((1, 512), np.int64))
    with pytest.raises(InferenceServerException):
        http.infer("stale", bad)
    assert int(stats("stale")["inference_stats"]["fail"]["count"]) >= 1
    with urllib.request.urlopen(f"http://{server.metrics}/metrics") as r:
        metrics = r.read().decode()
    line = next(x for x in metrics.splitlines()
                if x.startswith('nv_inference_exec_count{model="classify",version="1"}'))
    assert int(float(line.split()[-1])) >= 3


def test_an_ensemble_s_steps_that_take_nothing_from_each_other_run_at_once(server):
    """left and right each wait for the other's mark: both see it only when they run together
    (one after the other, the first would give up after 20 s and say 0)."""
    client = httpclient.InferenceServerClient(server.http)
    for token in ("first", "second"):
        inputs = [httpclient.InferInput("TOKEN", [1], "BYTES")]
        inputs[0].set_data_from_numpy(np.array([token.encode()], dtype=np.object_))
        result = client.infer("both", inputs)
        assert (result.as_numpy("LEFT_SAW")[0], result.as_numpy("RIGHT_SAW")[0]) == (1, 1)


def raw_inputs(module, rows=5, seed=11):
    raw = np.random.default_rng(seed).integers(-100, 100, size=(rows, 512), dtype=np.int64)
    inputs = [module.InferInput("RAW", list(raw.shape), "INT64")]
    inputs[0].set_data_from_numpy(raw)
    session = ort.InferenceSession(str(ROOT / "model_repository/mlp/1/model.onnx"))
    return inputs, np.argmax(session.run(None, {"input": raw.astype(np.float32) / 100.0})[0], axis=1)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_an_ensemble_may_be_a_step_of_another(server, module):
    client = module.InferenceServerClient(server.http if module is httpclient else server.grpc)
    inputs, top = raw_inputs(module)
    result = client.infer("outer", inputs)
    np.testing.assert_array_equal(result.as_numpy("TOP")[:, 0], top)
    np.testing.assert_array_equal(result.as_numpy("AGAIN")[:, 0], top)


def test_an_ensemble_that_is_its_own_step_is_refused_with_the_reason(server):
    client = httpclient.InferenceServerClient(server.http)
    inputs, _ = raw_inputs(httpclient, rows=1)
    with pytest.raises(InferenceServerException) as e:
        client.infer("itself", inputs)
    assert e.value.status() == "400", e.value
    assert "pipeline 'itself' runs inside itself (itself -> itself)" in str(e.value)
    assert client.is_server_live()


def states(server):
    return {m["name"]: m.get("state") for m in
            httpclient.InferenceServerClient(server.http).get_model_repository_index()}


def test_loading_an_ensemble_loads_its_steps_and_unload_dependents_unloads_them(explicit):
    """As Triton loads an ensemble's composing models with it, in explicit control mode."""
    steps = ["preprocess", "scorer", "postprocess"]
    assert all(states(explicit).get(m) != "READY" for m in ["outer", "classify", *steps])
    http = httpclient.InferenceServerClient(explicit.http)
    grpc = grpcclient.InferenceServerClient(explicit.grpc)
    # The outer ensemble loads the inner one, which loads its three models.
    http.load_model("outer")
    assert {m: states(explicit)[m] for m in ["outer", "classify", *steps]} == dict.fromkeys(
        ["outer", "classify", *steps], "READY")
    inputs, top = raw_inputs(httpclient)
    np.testing.assert_array_equal(http.infer("outer", inputs).as_numpy("AGAIN")[:, 0], top)
    # A plain unload leaves the steps loaded.
    http.unload_model("outer")
    now = states(explicit)
    assert now["outer"] == "UNAVAILABLE" and now["classify"] == "READY", now
    # With unload_dependents the steps go too, over HTTP and over gRPC, through nested ones;
    # a step another loaded ensemble still runs (postprocess, a step of "classify") stays.
    http.load_model("outer")
    grpc.unload_model("outer", unload_dependents=True)
    now = states(explicit)
    assert all(now[m] == "UNAVAILABLE" for m in ["outer", "classify", *steps]), now
    http.load_model("classify")
    http.unload_model("classify", unload_dependents=True)
    now = states(explicit)
    assert all(now[m] == "UNAVAILABLE" for m in ["classify", *steps]), now
    http.load_model("outer")
    http.unload_model("classify", unload_dependents=True)
    now = states(explicit)
    assert now["postprocess"] == "READY" and now["scorer"] == "UNAVAILABLE", now


def test_an_ensemble_whose_step_cannot_load_is_unavailable_with_the_reason(explicit):
    http = httpclient.InferenceServerClient(explicit.http)
    with pytest.raises(InferenceServerException) as e:
        http.load_model("broken")
    assert "its step model 'missing' did not load" in str(e.value), e.value
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert index["broken"]["state"] == "UNAVAILABLE"
    assert "its step model 'missing' did not load" in index["broken"]["reason"]
    # The step that did load stays loaded; the server serves on.
    assert index["preprocess"]["state"] == "READY"
    assert http.is_server_ready()


def test_an_unload_dependents_that_is_no_bool_is_refused(explicit):
    import json
    import urllib.error
    import urllib.request
    request = urllib.request.Request(
        f"http://{explicit.http}/v2/repository/models/scorer/unload", method="POST",
        data=json.dumps({"parameters": {"unload_dependents": "yes"}}).encode(),
        headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request)
    assert e.value.code == 400
    assert "unload_dependents" in json.loads(e.value.read())["error"]


def test_load_model_loads_models_at_start_in_explicit_mode(tmp_path):
    """Triton's --load-model: the named models (and an ensemble's steps) load at start, the
    others wait for the repository API; `*` loads them all."""
    repo = write_repo(tmp_path / "repo")
    proc, server = launch(repo, "--model-control-mode", "explicit", "--load-model", "outer",
                          "--load-model", "left")
    try:
        now = states(server)
        loaded = ["outer", "classify", "preprocess", "scorer", "postprocess", "left"]
        assert {m: now[m] for m in loaded} == dict.fromkeys(loaded, "READY"), now
        assert now["right"] != "READY" and now["both"] != "READY", now
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    proc, server = launch(repo, "--model-control-mode", "explicit",
                          env={**os.environ, "SHEAF_LOAD_MODEL": "left,right"})
    try:
        now = states(server)
        assert (now["left"], now["right"], now["scorer"]) == ("READY", "READY", "UNAVAILABLE"), now
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    proc, server = launch(repo, "--model-control-mode", "explicit", "--load-model", "*")
    try:
        now = states(server)
        assert all(now[m] == "READY" for m in now if m != "broken"), now
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_load_model_naming_no_model_stops_the_start(tmp_path):
    import subprocess
    repo = write_repo(tmp_path / "repo")
    done = subprocess.run(
        [binary(), "serve", "--model-repository", str(repo), "--http-port", "0", "--grpc-port",
         "0", "--metrics-port", "0", "--model-control-mode", "explicit", "--load-model", "nope"],
        capture_output=True, text=True, timeout=60, env={"SHEAF_DRAIN_DELAY": "0", **os.environ})
    assert done.returncode != 0
    assert "--load-model 'nope': no such model (the models are both, broken, classify" in \
        done.stderr, done.stderr[-2000:]


def test_a_load_with_files_needs_a_config_and_an_admin_key(explicit):
    """Files sent with a load need the `config` Triton asks for with them, and a server with an
    admin key (this one has none): refused, clearly, and the model is not loaded by them (loads
    from files: test_load_config.py)."""
    http = httpclient.InferenceServerClient(explicit.http)
    grpc = grpcclient.InferenceServerClient(explicit.grpc)
    with pytest.raises(InferenceServerException) as e:
        http.load_model("left", files={"file:1/model.py": b"print(1)"})
    assert "needs the 'config' parameter" in str(e.value), e.value
    with pytest.raises(InferenceServerException) as e:
        grpc.load_model("left", config='{"max_batch_size": 4}',
                        files={"file:1/model.py": b"print(1)"})
    assert "PERMISSION_DENIED" in str(e.value.status()) and "--admin-key" in str(e.value)
    assert states(explicit)["left"] != "READY"


VERSIONED = '''
backend: "python"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
'''
VERSION_CODE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() * {factor})])
            for r in requests]
'''


def test_the_version_policy_picks_the_version_that_serves(tmp_path):
    """Versions 1, 2 and 3 of a model that multiplies by its version: Triton's default serves 3,
    `specific` pins 2, and a policy naming no version there fails the load with the reason."""
    for name, policy in (("newest", ""),
                         ("pinned", "version_policy: { specific: { versions: [ 2 ] } }"),
                         ("absent", "version_policy: { specific: { versions: [ 9 ] } }")):
        for v in (1, 2, 3):
            (tmp_path / name / str(v)).mkdir(parents=True)
            (tmp_path / name / str(v) / "model.py").write_text(VERSION_CODE.format(factor=v))
        (tmp_path / name / "config.pbtxt").write_text(VERSIONED + policy + "\n")
    for s in start(tmp_path, "--model-control-mode", "explicit", "--load-model", "newest",
                   "--load-model", "pinned"):
        client = httpclient.InferenceServerClient(s.http)

        def ask(model):
            x = httpclient.InferInput("x", [1, 1], "FP32")
            x.set_data_from_numpy(np.ones((1, 1), np.float32))
            return float(client.infer(model, [x]).as_numpy("y")[0, 0])

        assert ask("newest") == 3.0
        assert ask("pinned") == 2.0
        assert client.get_model_metadata("pinned")["versions"] == ["2"]
        with pytest.raises(InferenceServerException) as e:
            client.load_model("absent")
        assert "names no version the folder holds" in str(e.value), e.value


def test_a_policy_that_names_several_versions_serves_each_of_them(tmp_path):
    """`latest { num_versions: 2 }` over versions 1-3 of a model that multiplies by its version
    serves 2 and 3 side by side, as Triton does: a request without a version gets the newest, a
    request naming one gets it over HTTP and gRPC, and each has its own statistics and index
    row; version 1 is not served. An unload ends both."""
    for v in (1, 2, 3):
        (tmp_path / "both" / str(v)).mkdir(parents=True)
        (tmp_path / "both" / str(v) / "model.py").write_text(VERSION_CODE.format(factor=v))
    (tmp_path / "both" / "config.pbtxt").write_text(
        VERSIONED + "version_policy: { latest: { num_versions: 2 } }\n")
    for s in start(tmp_path, "--model-control-mode", "explicit", "--load-model", "both"):
        http = httpclient.InferenceServerClient(s.http)
        grpc = grpcclient.InferenceServerClient(s.grpc)

        def ask(module, client, version=""):
            x = module.InferInput("x", [1, 1], "FP32")
            x.set_data_from_numpy(np.ones((1, 1), np.float32))
            return float(client.infer("both", [x], model_version=version).as_numpy("y")[0, 0])

        assert ask(httpclient, http) == 3.0
        assert ask(httpclient, http, "2") == 2.0
        assert ask(grpcclient, grpc, "2") == 2.0
        assert ask(grpcclient, grpc, "3") == 3.0
        with pytest.raises(InferenceServerException) as e:
            ask(httpclient, http, "1")
        assert "unknown version '1' of model 'both' (versions '2', '3' are served)" in str(e.value)
        assert http.get_model_metadata("both")["versions"] == ["2", "3"]
        assert http.get_model_metadata("both", "2")["versions"] == ["2", "3"]
        assert http.is_model_ready("both", "2") and not http.is_model_ready("both", "1")
        rows = [(m["name"], m["version"], m["state"]) for m in http.get_model_repository_index()]
        assert ("both", "2", "READY") in rows and ("both", "3", "READY") in rows, rows
        stats = {m["version"]: m["inference_count"]
                 for m in http.get_inference_statistics("both")["model_stats"]}
        assert stats == {"2": 2, "3": 2}, stats
        only = http.get_inference_statistics("both", "2")["model_stats"]
        assert [m["version"] for m in only] == ["2"]
        with urllib.request.urlopen(f"http://{s.metrics}/metrics") as r:
            metrics = r.read().decode()
        for version in ("2", "3"):
            line = f'nv_inference_request_success{{model="both",version="{version}"}} 2'
            assert line in metrics.splitlines(), metrics
        # The dashboard's figures count both versions.
        with urllib.request.urlopen(f"http://{s.http}/stats") as r:
            both = json.loads(r.read())["models"]["both"]
        assert both["successful_requests"] == 4 and both["versions"] == ["2", "3"], both
        http.unload_model("both")
        for version in ("2", "3"):
            assert not http.is_model_ready("both", version)


def mlp_folder(repo, name, model_file, extra):
    """A Triton folder `name` holding the demo MLP as `1/model_file`, its config.pbtxt CONFIG
    renamed, without the labels file, with `extra` after it."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / model_file).symlink_to(ROOT / "model_repository/mlp/1/model.onnx")
    (repo / name / "config.pbtxt").write_text(
        CONFIG.replace('name: "scorer"', f'name: "{name}"').replace(
            'label_filename: "names.txt" ', '') + extra)


def answers_as_onnxruntime(server, name, rows, seed):
    """Asserts `name` answers `rows` random MLP inputs as onnxruntime does."""
    session = ort.InferenceSession(str(ROOT / "model_repository/mlp/1/model.onnx"))
    x = np.random.default_rng(seed).standard_normal((rows, 512)).astype(np.float32)
    client = httpclient.InferenceServerClient(server.http)
    given = httpclient.InferInput("input", [rows, 512], "FP32")
    given.set_data_from_numpy(x)
    got = client.infer(name, [given]).as_numpy("output")
    np.testing.assert_allclose(got, session.run(None, {"input": x})[0], rtol=1e-5, atol=1e-6)


def test_a_default_model_filename_names_the_model_file(tmp_path):
    """A Triton folder whose model file is not `model.onnx` says which it is: it serves, with the
    MLP's answers."""
    mlp_folder(tmp_path, "renamed", "mlp_fp32.onnx",
               'default_model_filename: "mlp_fp32.onnx"\n')
    for s in start(tmp_path):
        client = httpclient.InferenceServerClient(s.http)
        answers_as_onnxruntime(s, "renamed", 2, 3)
        assert client.get_model_config("renamed")["default_model_filename"] == "mlp_fp32.onnx"


def test_onnx_runtime_settings_in_a_triton_configuration_serve(tmp_path):
    """The MLP under a config.pbtxt that sets ONNX Runtime's threads, execution mode and graph
    level as Triton's onnxruntime backend reads them, and names TensorRT: it serves
    onnxruntime's answers, and the log names what it passed over."""
    mlp_folder(tmp_path, "tuned", "model.onnx", """
parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
parameters { key: "execution_mode" value: { string_value: "1" } }
parameters { key: "inter_op_thread_count" value: { string_value: "2" } }
optimization { graph { level: 2 }
  execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" } ] } }
""")
    for s in start(tmp_path):
        answers_as_onnxruntime(s, "tuned", 3, 5)
        warned = [line for line in s.log if '"WARN"' in line and "tensorrt" in line]
        assert warned, "".join(s.log)
