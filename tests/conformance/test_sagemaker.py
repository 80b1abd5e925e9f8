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
