"""API keys with the clients users have, unmodified: tritonclient (HTTP and gRPC), the openai
package, and curl, against a server started with --api-key, --admin-key and --protect-metrics."""
import json
import os
import subprocess

import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ADMIN_KEY, API_KEY, ROOT


def bearer(key, grpc=False):
    return {("authorization" if grpc else "Authorization"): f"Bearer {key}"}


def mlp_inputs(module):
    x = np.full((1, 512), 0.25, dtype=np.float32)
    tensor = module.InferInput("input", [1, 512], "FP32")
    tensor.set_data_from_numpy(x)
    return [tensor]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritonclient_sends_the_key_in_headers(protected, protocol):
    grpc = protocol == "grpc"
    module = grpcclient if grpc else httpclient
    client = module.InferenceServerClient(protected.grpc if grpc else protected.http)
    # Probes need no key.
    assert client.is_server_live() and client.is_server_ready()
    with pytest.raises(InferenceServerException) as refused:
        client.infer("mlp", mlp_inputs(module))
    assert "API key" in str(refused.value)
    with pytest.raises(InferenceServerException):
        client.infer("mlp", mlp_inputs(module), headers=bearer("sk-wrong", grpc))
    for key in (API_KEY, ADMIN_KEY):
        result = client.infer("mlp", mlp_inputs(module), headers=bearer(key, grpc))
        assert result.as_numpy("output").shape == (1, 10)
    # The repository API and statistics take the admin key only.
    with pytest.raises(InferenceServerException) as refused:
        client.get_model_repository_index(headers=bearer(API_KEY, grpc))
    assert "admin key" in str(refused.value)
    with pytest.raises(InferenceServerException):
        client.unload_model("mlp", headers=bearer(API_KEY, grpc))
    index = client.get_model_repository_index(headers=bearer(ADMIN_KEY, grpc))
    names = [m.name for m in index.models] if grpc else [m["name"] for m in index]
    assert "mlp" in names
    stats = client.get_inference_statistics("mlp", headers=bearer(ADMIN_KEY, grpc))
    assert stats is not None


def test_openai_client_sends_its_api_key(protected):
    good = openai.OpenAI(base_url=f"http://{protected.http}/v1", api_key=API_KEY)
    r = good.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert r.choices[0].message.content
    wrong = openai.OpenAI(base_url=f"http://{protected.http}/v1", api_key="sk-wrong")
    with pytest.raises(openai.AuthenticationError) as refused:
        wrong.models.list()
    # OpenAI's code for the case, which its clients read.
    assert refused.value.code == "invalid_api_key", refused.value


def curl(*args):
    out = subprocess.run(["curl", "-s", "-o", "/dev/stdout", "-w", "\n%{http_code}", *args],
                         capture_output=True, text=True, check=True).stdout
    body, code = out.rsplit("\n", 1)
    return int(code), body


def test_curl_with_and_without_a_key(protected):
    url = f"http://{protected.http}/v2/models/mlp/infer"
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 512], "datatype": "FP32",
                                   "data": [0.25] * 512}]})
    code, reply = curl("-X", "POST", url, "-H", "Content-Type: application/json", "-d", body)
    assert code == 401 and "API key" in json.loads(reply)["error"]
    code, reply = curl("-X", "POST", url, "-H", "Content-Type: application/json",
                       "-H", f"Authorization: Bearer {API_KEY}", "-d", body)
    assert code == 200, reply
    assert json.loads(reply)["outputs"][0]["shape"] == [1, 10]
    # curl's -d alone declares a form body, which is refused with what to send instead.
    code, reply = curl("-X", "POST", url, "-H", f"Authorization: Bearer {API_KEY}", "-d", body)
    assert code == 415 and "application/json" in json.loads(reply)["error"]
    code, _ = curl(f"http://{protected.http}/v2/health/ready")
    assert code == 200
    # TEI's embeddings at the root take the key inference takes; the dashboard page does not.
    root = f"http://{protected.http}/"
    tei = ["-X", "POST", root, "-H", "Content-Type: application/json", "-d", '{"inputs": "a"}']
    code, reply = curl(*tei)
    assert code == 401 and "API key" in json.loads(reply)["error"]
    code, reply = curl(*tei, "-H", f"Authorization: Bearer {API_KEY}")
    assert code == 404 and "no embedding model" in json.loads(reply)["error"], reply
    assert curl(root)[0] == 200
    # TEI's description of its model takes the key metadata takes.
    code, reply = curl(f"http://{protected.http}/info")
    assert code == 401 and "API key" in json.loads(reply)["error"]
    code, reply = curl(f"http://{protected.http}/info", "-H", f"Authorization: Bearer {API_KEY}")
    assert code == 404 and "no embedding model" in json.loads(reply)["error"], reply
    # vLLM's scores and Cohere's rerank route take it too, and answer in OpenAI's shape.
    for path, body in [("score", {"text_1": "a", "text_2": "b"}),
                       ("v2/rerank", {"query": "a", "documents": ["b"]})]:
        call = ["-X", "POST", f"http://{protected.http}/{path}",
                "-H", "Content-Type: application/json", "-d", json.dumps(body)]
        code, reply = curl(*call)
        assert code == 401 and "API key" in json.loads(reply)["error"]["message"], reply
        code, reply = curl(*call, "-H", f"Authorization: Bearer {API_KEY}")
        assert code == 404 and "no embedding model" in json.loads(reply)["error"]["message"]
    # TEI's and vLLM's health check is a probe, open as the others.
    assert curl(f"http://{protected.http}/health")[0] == 200


def test_tei_grpc_takes_the_key_inference_takes(protected, tei):
    import grpc
    pb, rpc = tei
    with grpc.insecure_channel(protected.grpc) as channel:
        for key, code in [(None, grpc.StatusCode.UNAUTHENTICATED),
                          ("sk-wrong", grpc.StatusCode.UNAUTHENTICATED),
                          (API_KEY, grpc.StatusCode.NOT_FOUND)]:
            metadata = [("authorization", f"Bearer {key}")] if key else []
            for call in (lambda: rpc.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="a"),
                                                                metadata=metadata),
                         lambda: rpc.InfoStub(channel).Info(pb.InfoRequest(), metadata=metadata)):
                with pytest.raises(grpc.RpcError) as e:
                    call()
                assert e.value.code() == code, (key, e.value)
                if code == grpc.StatusCode.NOT_FOUND:
                    assert "no embedding model" in e.value.details()


def test_metrics_take_the_admin_key_when_protected(protected):
    url = f"http://{protected.metrics}/metrics"
    assert curl(url)[0] == 401
    assert curl("-H", f"Authorization: Bearer {API_KEY}", url)[0] == 403
    code, text = curl("-H", f"Authorization: Bearer {ADMIN_KEY}", url)
    assert code == 200 and "sheaf_" in text


def bench(grpc, http, *extra):
    binary = os.environ.get("SHEAF_BIN", str(ROOT / "target" / "debug" / "sheaf"))
    run = subprocess.run(
        [binary, "bench", "--protocol", "grpc", "--url", f"http://{grpc.grpc}",
         "--http-url", f"http://{http.http}", "--model", "mlp", "--concurrency", "2",
         "--requests", "20", *extra],
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return next(line for line in run.stdout.splitlines()
                if line.strip().startswith("concurrency"))


def test_sheaf_bench_sends_the_key_over_grpc(protected, server):
    # sheaf bench prepares each gRPC request once and sends its tensors as they are; the key
    # travels as metadata, the server's answers are read, and a refusal is counted by status.
    assert bench(protected, protected, "--api-key", API_KEY).endswith(" 0")
    stats = json.loads(curl("-H", f"Authorization: Bearer {ADMIN_KEY}",
                            f"http://{protected.http}/v2/models/mlp/stats")[1])
    assert stats["model_stats"][0]["inference_count"] >= 20
    # The model's metadata from an open server, the calls to the protected one with a wrong key.
    refused = bench(protected, server, "--api-key", "sk-wrong")
    assert refused.endswith("grpc Unauthenticated: 20"), refused
