"""Amazon SageMaker's container contract (tritonserver's --allow-sagemaker) against the real
`sheaf` binary, started as Triton's SageMaker `serve` script starts tritonserver (HTTP and gRPC
off): GET /ping, and POST /invocations to the endpoint's model (SAGEMAKER_TRITON_DEFAULT_MODEL_NAME)
in KServe JSON and in the binary form SageMaker clients send, its JSON length in the content
type; answers equal to ONNX Runtime's."""
import json
import os
import re

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

from conftest import ROOT, http, launch, link_models

BINARY = "application/vnd.sagemaker-triton.binary+json"


def sagemaker_address(server):
    for line in server.log:
        found = re.search(r'"sagemaker_address":"([^"]+)"', line)
        if found:
            return found.group(1)
    raise AssertionError("no SageMaker address in the log")


@pytest.fixture
def repo(tmp_path):
    link_models(tmp_path, ["mlp"])
    return tmp_path


def start_sagemaker(repo, *extra, model="mlp"):
    env = dict(os.environ)
    env.pop("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", None)
    if model:
        env["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"] = model
    proc, server = launch(repo, "--allow-sagemaker", "true", "--sagemaker-port", "0",
                          "--allow-http", "false", "--allow-grpc", "false", *extra, env=env)
    return proc, f"http://{sagemaker_address(server)}"


def test_ping_and_invocations_in_json_and_binary(repo):
    proc, url = start_sagemaker(repo)
    try:
        status, _, _ = http(f"{url}/ping")
        assert status == 200
        session = ort.InferenceSession(str(ROOT / "model_repository/mlp/1/model.onnx"))
        x = np.random.default_rng(3).standard_normal((4, 512), dtype=np.float32)
        expected = session.run(None, {"input": x})[0]
        body = json.dumps({"inputs": [{"name": "input", "shape": [4, 512], "datatype": "FP32",
                                       "data": x.flatten().tolist()}]}).encode()
        status, _, answer = http(f"{url}/invocations", body)
        assert status == 200, answer
        out = json.loads(answer)["outputs"][0]
        np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(out["shape"]),
                                   expected, rtol=1e-4, atol=1e-5)
        # The binary form: the request as tritonclient writes it, its JSON length named in the
        # content type, and the answer likewise.
        tensor = httpclient.InferInput("input", [4, 512], "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        wanted = httpclient.InferRequestedOutput("output", binary_data=True)
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            [tensor], outputs=[wanted])
        status, headers, answer = http(f"{url}/invocations", body,
                                       f"{BINARY};json-header-size={json_size}")
        assert status == 200, answer
        kind = headers["Content-Type"]
        assert kind.startswith(f"{BINARY};json-header-size="), kind
        length = int(kind.split("=")[1])
        result = httpclient.InferenceServerClient.parse_response_body(
            answer, header_length=length)
        np.testing.assert_allclose(result.as_numpy("output"), expected, rtol=1e-4, atol=1e-5)
        # A binary body that does not say where its JSON ends is refused.
        status, _, answer = http(f"{url}/invocations", body, BINARY)
        assert status == 400 and b"json-header-size" in answer, answer
        # Everything else on that port is not found.
        assert http(f"{url}/v2/models/mlp")[0] == 404
    finally:
        proc.kill()


def test_without_a_default_the_only_model_runs_and_keys_guard_invocations(repo):
    proc, url = start_sagemaker(repo, "--api-key", "sk-1", model=None)
    try:
        assert http(f"{url}/ping")[0] == 200, "probes need no key"
        body = json.dumps({"inputs": [{"name": "input", "shape": [1, 512], "datatype": "FP32",
                                       "data": [0.5] * 512}]}).encode()
        assert http(f"{url}/invocations", body)[0] == 401
        status, _, answer = http(f"{url}/invocations", body,
                                 headers={"Authorization": "Bearer sk-1"})
        assert status == 200 and json.loads(answer)["model_name"] == "mlp", answer
    finally:
        proc.kill()


def test_several_models_and_no_default_is_a_clear_error(repo):
    (repo / "second" / "1").mkdir(parents=True)
    (repo / "second" / "1" / "model.onnx").symlink_to(ROOT / "model_repository/mlp/1/model.onnx")
    proc, url = start_sagemaker(repo, model=None)
    try:
        body = json.dumps({"inputs": []}).encode()
        status, _, answer = http(f"{url}/invocations", body)
        assert status == 400 and b"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME" in answer, answer
    finally:
        proc.kill()


# A Triton ensemble running the MLP twice, as a multi-model endpoint's archive may hold it.
PAIR = '''
platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 512 ] } ]
output [ { name: "A" data_type: TYPE_FP32 dims: [ 10 ] },
         { name: "B" data_type: TYPE_FP32 dims: [ 10 ] } ]
ensemble_scheduling { step [
  { model_name: "step" input_map { key: "input" value: "RAW" } output_map { key: "output" value: "A" } },
  { model_name: "step" input_map { key: "input" value: "RAW" } output_map { key: "output" value: "B" } }
] }
'''
MLP_CONFIG = '''
max_batch_size: 8
input [ { name: "input" data_type: TYPE_FP32 dims: [ 512 ] } ]
output [ { name: "output" data_type: TYPE_FP32 dims: [ 10 ] } ]
'''


def mme_models(root):
    """Folders laid out as SageMaker unpacks a multi-model endpoint's archives, in
    /opt/ml/models/<hash>/model: one holding a model folder, one that is a model folder itself,
    one holding an ensemble and its step, one holding a model that cannot load."""
    mlp = ROOT / "model_repository/mlp/1/model.onnx"
    (root / "h1/model/mlp/1").mkdir(parents=True)
    (root / "h1/model/mlp/1/model.onnx").symlink_to(mlp)
    (root / "h2/model/1").mkdir(parents=True)
    (root / "h2/model/1/model.onnx").symlink_to(mlp)
    (root / "h2/model/config.pbtxt").write_text(MLP_CONFIG)
    (root / "h3/model/step/1").mkdir(parents=True)
    (root / "h3/model/step/1/model.onnx").symlink_to(mlp)
    (root / "h3/model/pair/1").mkdir(parents=True)
    (root / "h3/model/pair/config.pbtxt").write_text(PAIR)
    (root / "h4/model/broken/1").mkdir(parents=True)
    (root / "h4/model/broken/1/model.onnx").write_bytes(b"not an onnx graph")


def load(url, name, folder, target=None):
    body = json.dumps({"model_name": name, "url": str(folder)}).encode()
    headers = {"X-Amzn-SageMaker-Target-Model": target} if target else {}
    return http(f"{url}/models", body, headers=headers)


def test_a_multi_model_endpoint_loads_invokes_lists_and_unloads(tmp_path):
    """SageMaker's multi-model endpoint contract, on a server started as Triton's `serve`
    script starts one for it (an empty repository, explicit control): loads from the three
    layouts an archive unpacks to, under the target model's name or the hash; invoke in JSON
    and binary; the list; 409 for a name taken; 400 with the reason for a model that cannot
    load and for folders that are not models; unload takes an ensemble's step with it, and the
    name can load again."""
    mme_models(tmp_path / "models")
    (tmp_path / "empty").mkdir()
    proc, server = launch(tmp_path / "empty", "--allow-sagemaker", "true", "--sagemaker-port",
                          "0", "--model-control-mode", "explicit")
    url = f"http://{sagemaker_address(server)}"
    models = tmp_path / "models"
    try:
        status, _, answer = load(url, "h1", models / "h1/model", target="mlp.tar.gz")
        assert status == 200, answer
        assert load(url, "h2", models / "h2/model")[0] == 200
        status, _, answer = load(url, "h3", models / "h3/model", target="pair.tar.gz")
        assert status == 200, answer
        status, _, answer = http(f"{url}/models")
        assert status == 200, answer
        listed = {m["modelName"]: m["modelUrl"] for m in json.loads(answer)["models"]}
        assert listed == {"h1": str(models / "h1/model"), "h2": str(models / "h2/model"),
                          "h3": str(models / "h3/model")}, listed
        status, _, answer = http(f"{url}/models/h2")
        assert status == 200 and json.loads(answer) == {
            "modelName": "h2", "modelUrl": str(models / "h2/model")}, answer
        assert http(f"{url}/models/nope")[0] == 404

        session = ort.InferenceSession(str(ROOT / "model_repository/mlp/1/model.onnx"))
        x = np.random.default_rng(5).standard_normal((2, 512), dtype=np.float32)
        expected = session.run(None, {"input": x})[0]
        body = json.dumps({"inputs": [{"name": "input", "shape": [2, 512], "datatype": "FP32",
                                       "data": x.flatten().tolist()}]}).encode()
        status, _, answer = http(f"{url}/models/h1/invoke", body,
                                 headers={"X-Amzn-SageMaker-Target-Model": "mlp.tar.gz"})
        assert status == 200, answer
        out = json.loads(answer)
        assert out["model_name"] == "mlp.tar.gz", out
        np.testing.assert_allclose(np.array(out["outputs"][0]["data"], np.float32).reshape(2, 10),
                                   expected, rtol=1e-4, atol=1e-5)
        tensor = httpclient.InferInput("input", [2, 512], "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        wanted = httpclient.InferRequestedOutput("output", binary_data=True)
        binary, json_size = httpclient.InferenceServerClient.generate_request_body(
            [tensor], outputs=[wanted])
        status, headers, answer = http(f"{url}/models/h2/invoke", binary,
                                       f"{BINARY};json-header-size={json_size}")
        assert status == 200, answer
        length = int(headers["Content-Type"].split("=")[1])
        result = httpclient.InferenceServerClient.parse_response_body(answer,
                                                                      header_length=length)
        np.testing.assert_allclose(result.as_numpy("output"), expected, rtol=1e-4, atol=1e-5)
        body = json.dumps({"inputs": [{"name": "RAW", "shape": [2, 512], "datatype": "FP32",
                                       "data": x.flatten().tolist()}]}).encode()
        status, _, answer = http(f"{url}/models/h3/invoke", body)
        assert status == 200, answer
        outs = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"])
                for o in json.loads(answer)["outputs"]}
        np.testing.assert_allclose(outs["A"], expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(outs["B"], expected, rtol=1e-4, atol=1e-5)
        # The ensemble's step serves under its folder's name, beside the ensemble.
        index = {m["name"]: m["state"] for m in
                 httpclient.InferenceServerClient(server.http).get_model_repository_index()}
        assert index.get("step") == "READY" and index.get("pair.tar.gz") == "READY", index
        assert http(f"{url}/models/nope/invoke", body)[0] == 404

        # Taken: the hash, and the name (another hash for the same archive).
        status, _, answer = load(url, "h1", models / "h1/model", target="mlp.tar.gz")
        assert status == 409, answer
        status, _, answer = load(url, "h5", models / "h1/model", target="mlp.tar.gz")
        assert status == 409 and b"registered already" in answer, answer
        status, _, answer = load(url, "h6", models / "h4/model", target="mlp.tar.gz")
        assert status == 409 and b"exists already" in answer, answer
        # A model that cannot load is a 400 with the reason, and is not listed.
        status, _, answer = load(url, "h4", models / "h4/model")
        assert status == 400 and b"broken" in answer, answer
        assert http(f"{url}/models/h4")[0] == 404
        for given, says in (
            ({"model_name": "x", "url": "/proc/self"}, b"/dev, /proc or /sys"),
            ({"model_name": "x", "url": str(tmp_path / "absent")}, b"no such folder"),
            ({"model_name": "x"}, b"model_name"),
            ({"model_name": "x", "url": str(tmp_path / "empty")}, b"no model folder"),
        ):
            status, _, answer = http(f"{url}/models", json.dumps(given).encode())
            assert status == 400 and says in answer, (given, answer)

        # Unload: gone from the list, invoke is a 404, the ensemble's step goes with it.
        assert http(f"{url}/models/h3", method="DELETE")[0] == 200
        assert http(f"{url}/models/h3", method="DELETE")[0] == 404
        assert http(f"{url}/models/h3/invoke", body)[0] == 404
        status, _, answer = http(f"{url}/models")
        assert {m["modelName"] for m in json.loads(answer)["models"]} == {"h1", "h2"}, answer
        index = {m["name"] for m in
                 httpclient.InferenceServerClient(server.http).get_model_repository_index()}
        assert "step" not in index and "pair.tar.gz" not in index, index
        # Loaded again, it serves again.
        status, _, answer = load(url, "h3", models / "h3/model", target="pair.tar.gz")
        assert status == 200, answer
        assert http(f"{url}/models/h3/invoke", body)[0] == 200
    finally:
        proc.kill()


def test_a_multi_model_endpoint_needs_explicit_control_and_the_admin_key(tmp_path):
    mme_models(tmp_path / "models")
    (tmp_path / "empty").mkdir()
    folder = tmp_path / "models/h1/model"
    proc, server = launch(tmp_path / "empty", "--allow-sagemaker", "true", "--sagemaker-port",
                          "0")
    try:
        url = f"http://{sagemaker_address(server)}"
        status, _, answer = load(url, "h1", folder)
        assert status == 400 and b"--model-control-mode explicit" in answer, answer
    finally:
        proc.kill()
    proc, server = launch(tmp_path / "empty", "--allow-sagemaker", "true", "--sagemaker-port",
                          "0", "--model-control-mode", "explicit", "--api-key", "sk-1",
                          "--admin-key", "adm-1")
    try:
        url = f"http://{sagemaker_address(server)}"
        body = json.dumps({"model_name": "h1", "url": str(folder)}).encode()
        for key in (None, "sk-1"):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            status, _, answer = http(f"{url}/models", body, headers=headers)
            assert status in (401, 403), (key, status, answer)
        status, _, answer = http(f"{url}/models", body, headers={"Authorization": "Bearer adm-1"})
        assert status == 200, answer
        x = {"inputs": [{"name": "input", "shape": [1, 512], "datatype": "FP32",
                         "data": [0.5] * 512}]}
        status, _, answer = http(f"{url}/models/h1/invoke", json.dumps(x).encode(),
                                 headers={"Authorization": "Bearer sk-1"})
        assert status == 200, answer
    finally:
        proc.kill()


# What Triton's SageMaker image passes tritonserver in both modes (its `serve` script with no
# SAGEMAKER_* settings but the port, which a test cannot leave at 8080, and the safe port range
# SageMaker gives containers).
SERVE = ["--allow-sagemaker=true", "--allow-grpc=false", "--allow-http=false",
         "--allow-metrics=false", "--model-control-mode=explicit", "--model-namespacing=true",
         "--log-verbose=true", "--backend-config=python,shm-default-byte-size=16777216",
         "--backend-config=python,shm-growth-byte-size=1048576", "--sagemaker-port=0",
         "--sagemaker-safe-port-range=10000-10999"]


def test_triton_s_sagemaker_command_lines_start_and_serve(tmp_path, repo):
    """The single-model endpoint's command line (the default model loaded by name) and the
    multi-model one (an empty repository, models loaded through /models) start unchanged."""
    env = dict(os.environ, SAGEMAKER_TRITON_DEFAULT_MODEL_NAME="mlp")
    proc, server = launch(repo, *SERVE, "--load-model=mlp", env=env)
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 512], "datatype": "FP32",
                                   "data": [0.5] * 512}]}).encode()
    try:
        url = f"http://{sagemaker_address(server)}"
        status, _, answer = http(f"{url}/invocations", body)
        assert status == 200 and json.loads(answer)["model_name"] == "mlp", answer
        # --log-verbose=true is level 1: the server's debug lines are written.
        assert any('"level":"DEBUG"' in line for line in server.log), server.log[:5]
    finally:
        proc.kill()
    # A listener of its own outside the safe range stops the start.
    with pytest.raises(RuntimeError) as stopped:
        proc, _ = launch(repo, *SERVE[:2], "--allow-http=true", *SERVE[3:])
        proc.kill()
    assert "outside --sagemaker-safe-port-range 10000-10999" in str(stopped.value)
    mme_models(tmp_path / "models")
    (tmp_path / "sagemaker").mkdir()
    proc, server = launch(tmp_path / "sagemaker", *SERVE)
    try:
        url = f"http://{sagemaker_address(server)}"
        status, _, answer = load(url, "h1", tmp_path / "models/h1/model", target="mlp.tar.gz")
        assert status == 200, answer
        status, _, answer = http(f"{url}/models/h1/invoke", body)
        assert status == 200 and json.loads(answer)["model_name"] == "mlp.tar.gz", answer
    finally:
        proc.kill()


def test_invocations_take_the_generate_extension_s_bodies(tmp_path):
    """SAGEMAKER_TRITON_INFERENCE_TYPE=generate and generate_stream, as Triton's image reads
    them: /invocations answers as /generate (one JSON answer) and /generate_stream (an event per
    response of a streaming model)."""
    from test_generate import SHOUT, SHOUT_CONFIG, WORDS, WORDS_CONFIG, events
    repo = tmp_path / "repo"
    for name, model, config in [("shout", SHOUT, SHOUT_CONFIG), ("words", WORDS, WORDS_CONFIG)]:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(model)
        (repo / name / "config.pbtxt").write_text(config)
    for kind, model, body, check in (
        ("generate", "shout", {"text_input": "hi", "suffix": "!"},
         lambda h, a: json.loads(a)["text_output"] == "HI!"),
        ("generate_stream", "words", {"PROMPT": "one two three", "STREAM": True},
         lambda h, a: h["Content-Type"].startswith("text/event-stream")
         and [e["TEXT"] for e in events(a.decode())] == ["one", "two", "three"]),
    ):
        env = dict(os.environ, SAGEMAKER_TRITON_DEFAULT_MODEL_NAME=model,
                   SAGEMAKER_TRITON_INFERENCE_TYPE=kind)
        proc, server = launch(repo, "--allow-sagemaker", "true", "--sagemaker-port", "0",
                              "--allow-grpc", "false", env=env)
        try:
            url = f"http://{sagemaker_address(server)}"
            status, headers, answer = http(f"{url}/invocations", json.dumps(body).encode())
            assert status == 200 and check(headers, answer), (kind, answer)
        finally:
            proc.kill()
    env = dict(os.environ, SAGEMAKER_TRITON_INFERENCE_TYPE="predict")
    with pytest.raises(RuntimeError) as stopped:
        proc, _ = launch(repo, "--allow-sagemaker", "true", "--sagemaker-port", "0", env=env)
        proc.kill()
    assert "generate_stream" in str(stopped.value), stopped.value


@pytest.mark.parametrize("mode,draining", [("ready", 503), ("live", 200)])
def test_ping_tells_readiness_or_liveness(repo, mode, draining):
    """SAGEMAKER_TRITON_PING_MODE: while a SIGTERM's drain delay runs, a `ready` ping is 503
    (take the instance out of the endpoint) and a `live` one 200 (the process is up)."""
    import signal
    import time
    env = dict(os.environ, SAGEMAKER_TRITON_PING_MODE=mode, SHEAF_DRAIN_DELAY="3")
    proc, server = launch(repo, "--allow-sagemaker", "true", "--sagemaker-port", "0",
                          "--allow-grpc", "false", env=env)
    try:
        url = f"http://{sagemaker_address(server)}"
        assert http(f"{url}/ping")[0] == 200
        proc.send_signal(signal.SIGTERM)
        # The drain is announced at once; its delay keeps the port open for 3 s.
        time.sleep(0.5)
        assert http(f"{url}/ping")[0] == draining, mode
        assert any("drain" in line for line in server.log), server.log[-5:]
    finally:
        proc.kill()
