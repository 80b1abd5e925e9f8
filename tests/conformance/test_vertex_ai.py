"""Google Vertex AI's custom-container contract (tritonserver's --allow-vertex-ai) against the
real `sheaf` binary, with HTTP and gRPC off and the routes Vertex AI sets in AIP_PREDICT_ROUTE
and AIP_HEALTH_ROUTE: the health route, prediction on the default model in JSON and in the
binary form, and X-Vertex-Ai-Triton-Redirect to other routes of the HTTP API, which keep their
own keys."""
import json
import os
import re

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

from conftest import ROOT, http, launch, link_models

BINARY = "application/vnd.vertex-ai-triton.binary+json"
PREDICT = "/v1/endpoints/123/deployedModels/456:predict"
HEALTH = "/v1/endpoints/123/deployedModels/456"


def start_vertex(repo, *extra):
    env = {**os.environ, "AIP_PREDICT_ROUTE": PREDICT, "AIP_HEALTH_ROUTE": HEALTH}
    proc, server = launch(repo, "--allow-vertex-ai", "true", "--vertex-ai-port", "0",
                          "--allow-http", "false", "--allow-grpc", "false", *extra, env=env)
    for line in server.log:
        found = re.search(r'"vertex_address":"([^"]+)"', line)
        if found:
            return proc, f"http://{found.group(1)}"
    proc.kill()
    raise AssertionError("no Vertex AI address in the log")


@pytest.fixture
def repo(tmp_path):
    link_models(tmp_path, ["mlp"])
    (tmp_path / "second" / "1").mkdir(parents=True)
    (tmp_path / "second" / "1" / "model.onnx").symlink_to(ROOT / "model_repository/mlp/1/model.onnx")
    return tmp_path


def test_health_prediction_and_redirects(repo):
    proc, url = start_vertex(repo, "--vertex-ai-default-model", "mlp", "--api-key", "sk-1")
    key = {"Authorization": "Bearer sk-1"}
    try:
        assert http(f"{url}{HEALTH}")[0] == 200, "the health route needs no key"
        session = ort.InferenceSession(str(ROOT / "model_repository/mlp/1/model.onnx"))
        x = np.random.default_rng(5).standard_normal((2, 512), dtype=np.float32)
        expected = session.run(None, {"input": x})[0]
        body = json.dumps({"inputs": [{"name": "input", "shape": [2, 512], "datatype": "FP32",
                                       "data": x.flatten().tolist()}]}).encode()
        assert http(f"{url}{PREDICT}", body)[0] == 401, "prediction takes the API key"
        status, _, answer = http(f"{url}{PREDICT}", body, headers=key)
        assert status == 200, answer
        answer = json.loads(answer)
        assert answer["model_name"] == "mlp"
        out = answer["outputs"][0]
        np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(out["shape"]),
                                   expected, rtol=1e-4, atol=1e-5)
        # Binary, its JSON length in the content type both ways.
        tensor = httpclient.InferInput("input", [2, 512], "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        body_bin, json_size = httpclient.InferenceServerClient.generate_request_body(
            [tensor], outputs=[httpclient.InferRequestedOutput("output", binary_data=True)])
        status, headers, answer = http(f"{url}{PREDICT}", body_bin,
                                       f"{BINARY};json-header-size={json_size}", key)
        assert status == 200, answer
        length = int(headers["Content-Type"].split("json-header-size=")[1])
        result = httpclient.InferenceServerClient.parse_response_body(answer, header_length=length)
        np.testing.assert_allclose(result.as_numpy("output"), expected, rtol=1e-4, atol=1e-5)
        # Redirected: another model's inference, a model's readiness (a GET there).
        redirect = {**key, "X-Vertex-Ai-Triton-Redirect": "v2/models/second/infer"}
        status, _, answer = http(f"{url}{PREDICT}", body, headers=redirect)
        assert status == 200 and json.loads(answer)["model_name"] == "second", answer
        ready = {**key, "X-Vertex-Ai-Triton-Redirect": "v2/models/second/ready"}
        assert http(f"{url}{PREDICT}", b"", headers=ready)[0] == 200
        missing = {**key, "X-Vertex-Ai-Triton-Redirect": "v2/models/none/ready"}
        assert http(f"{url}{PREDICT}", b"", headers=missing)[0] != 200
        # A redirected request keeps the key its route takes.
        nokey = {"X-Vertex-Ai-Triton-Redirect": "v2/models/second/infer"}
        assert http(f"{url}{PREDICT}", body, headers=nokey)[0] == 401
    finally:
        proc.kill()


def test_a_redirected_body_is_held_in_the_request_memory_once(repo):
    """A redirected prediction passes two gates (the Vertex AI port's, then the main API's);
    its body is counted once against --max-request-memory."""
    limit = 1 << 20
    proc, url = start_vertex(repo, "--max-body-bytes", str(limit),
                             "--max-request-memory", str(limit))
    try:
        session = ort.InferenceSession(str(ROOT / "model_repository/mlp/1/model.onnx"))
        # 300 items of 512 floats: 614 KB, more than half of the bound.
        x = np.random.default_rng(6).standard_normal((300, 512), dtype=np.float32)
        tensor = httpclient.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            [tensor], outputs=[httpclient.InferRequestedOutput("output", binary_data=True)])
        assert limit / 2 < len(body) < limit
        headers = {"X-Vertex-Ai-Triton-Redirect": "v2/models/second/infer",
                   "Inference-Header-Content-Length": str(json_size),
                   "Content-Type": "application/octet-stream"}
        status, answer_headers, answer = http(f"{url}{PREDICT}", body, headers=headers)
        assert status == 200, answer
        length = int(answer_headers["Inference-Header-Content-Length"])
        result = httpclient.InferenceServerClient.parse_response_body(answer, header_length=length)
        np.testing.assert_allclose(result.as_numpy("output"), session.run(None, {"input": x})[0],
                                   rtol=1e-4, atol=1e-5)
    finally:
        proc.kill()


def test_routes_that_are_no_paths_stop_the_start(repo):
    env = {**os.environ, "AIP_PREDICT_ROUTE": "predict", "AIP_HEALTH_ROUTE": HEALTH}
    with pytest.raises(RuntimeError) as stopped:
        proc, _ = launch(repo, "--allow-vertex-ai", "true", "--vertex-ai-port", "0", env=env)
        proc.kill()
    assert "--vertex-ai-predict-route (AIP_PREDICT_ROUTE) 'predict'" in str(stopped.value)
