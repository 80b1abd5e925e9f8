"""tritonserver's restricted API groups (--http-restricted-api, --grpc-restricted-protocol), as
PyTriton and BentoML start Triton, against the real `sheaf` binary with NVIDIA's tritonclient:
a restricted category needs its header with its value (gRPC: `triton-grpc-protocol-KEY`),
the other categories stay open, and the groups add to the API keys rather than replace them."""
import json
import queue
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import launch, link_models, start

ADMIN = {"admin-key": "admin-value"}
INFER = {"infer-key": "infer-value"}
GRPC_ADMIN = {"triton-grpc-protocol-admin-key": "admin-value"}
GRPC_INFER = {"triton-grpc-protocol-infer-key": "infer-value"}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("restricted")
    link_models(repo, ["mlp"])
    return repo


@pytest.fixture(scope="module")
def server(repo):
    yield from start(
        repo,
        "--http-restricted-api=model-repository:admin-key=admin-value",
        "--http-restricted-api", "inference,metadata:infer-key=infer-value",
        "--grpc-restricted-protocol=model-repository,health:admin-key=admin-value",
        "--grpc-restricted-protocol", "inference,metadata:infer-key=infer-value")


def mlp_inputs(module):
    tensor = module.InferInput("input", [2, 512], "FP32")
    tensor.set_data_from_numpy(np.full((2, 512), 0.25, dtype=np.float32))
    return [tensor]


def post(url, body, headers=()):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **dict(headers)})
    try:
        with urllib.request.urlopen(request) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_http_categories_need_their_group_s_header(server):
    client = httpclient.InferenceServerClient(server.http)
    # Health and statistics are in no group: open, with a group's header or without.
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp")
    client.get_inference_statistics("mlp")
    client.get_inference_statistics("mlp", headers=dict(INFER))
    # Inference and metadata take infer-key; the admin group's header is not it.
    for headers in ({}, dict(ADMIN), {"infer-key": "wrong"}):
        with pytest.raises(InferenceServerException, match="This API is restricted, "
                           "expecting header 'infer-key'"):
            client.infer("mlp", mlp_inputs(httpclient), headers=headers)
        with pytest.raises(InferenceServerException, match="This API is restricted"):
            client.get_model_metadata("mlp", headers=headers)
    result = client.infer("mlp", mlp_inputs(httpclient), headers=dict(INFER))
    assert result.as_numpy("output").shape == (2, 10)
    assert client.get_model_metadata("mlp", headers=dict(INFER))["name"] == "mlp"
    # The repository API takes admin-key.
    with pytest.raises(InferenceServerException, match="expecting header 'admin-key'"):
        client.get_model_repository_index(headers=dict(INFER))
    index = client.get_model_repository_index(headers=dict(ADMIN))
    assert "mlp" in [m["name"] for m in index]
    # The refusal is a 403 in KServe's shape, and in OpenAI's under /v1/.
    status, body = post(f"http://{server.http}/v2/repository/index", {})
    assert status == 403 and "admin-key" in body["error"], body
    status, body = post(f"http://{server.http}/v1/completions", {"model": "x", "prompt": "y"})
    assert status == 403 and "infer-key" in body["error"]["message"], body


def test_grpc_calls_need_the_prefixed_metadata(server):
    client = grpcclient.InferenceServerClient(server.grpc)
    # Health is restricted over gRPC here (not over HTTP): even the probes need the header.
    with pytest.raises(InferenceServerException) as refused:
        client.is_server_live()
    assert "This protocol is restricted, expecting header " \
           "'triton-grpc-protocol-admin-key'" in str(refused.value)
    assert "PERMISSION_DENIED" in str(refused.value), refused.value
    assert client.is_server_live(headers=GRPC_ADMIN)
    assert client.is_model_ready("mlp", headers=GRPC_ADMIN)
    # The HTTP header's name, without the prefix, does not open a gRPC group.
    with pytest.raises(InferenceServerException, match="triton-grpc-protocol-infer-key"):
        client.infer("mlp", mlp_inputs(grpcclient), headers=dict(INFER))
    result = client.infer("mlp", mlp_inputs(grpcclient), headers=GRPC_INFER)
    assert result.as_numpy("output").shape == (2, 10)
    client.get_inference_statistics("mlp")
    index = client.get_model_repository_index(headers=GRPC_ADMIN)
    assert "mlp" in [m.name for m in index.models]
    with pytest.raises(InferenceServerException, match="restricted"):
        client.get_model_repository_index(headers=GRPC_INFER)


def test_a_grpc_stream_needs_the_header_when_it_opens(server):
    client = grpcclient.InferenceServerClient(server.grpc)
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        try:
            client.async_stream_infer("mlp", mlp_inputs(grpcclient))
        except InferenceServerException as e:
            # The refusal may end the stream before the request is written: tritonclient then
            # refuses to write, and the callback has the reason.
            assert "no longer in valid state" in str(e), e
        result, error = answers.get(timeout=30)
        assert result is None and "triton-grpc-protocol-infer-key" in str(error), error
    finally:
        client.stop_stream()
    client.start_stream(callback=lambda result, error: answers.put((result, error)),
                        headers=GRPC_INFER)
    try:
        client.async_stream_infer("mlp", mlp_inputs(grpcclient))
        result, error = answers.get(timeout=30)
        assert error is None and result.as_numpy("output").shape == (2, 10), error
    finally:
        client.stop_stream()


def test_groups_add_to_the_api_keys(repo):
    for server in start(repo, "--api-key", "sk-k", "--http-restricted-api", "inference:k=v"):
        client = httpclient.InferenceServerClient(server.http)
        key = {"Authorization": "Bearer sk-k"}
        with pytest.raises(InferenceServerException, match="API key"):
            client.infer("mlp", mlp_inputs(httpclient), headers={"k": "v"})
        with pytest.raises(InferenceServerException, match="expecting header 'k'"):
            client.infer("mlp", mlp_inputs(httpclient), headers=dict(key))
        result = client.infer("mlp", mlp_inputs(httpclient), headers={**key, "k": "v"})
        assert result.as_numpy("output").shape == (2, 10)


@pytest.mark.parametrize("flags, why", [
    (["--http-restricted-api=model-reposit,health:k1=v1"], "unknown restricted api 'model-reposit'"),
    (["--grpc-restricted-protocol=model-repository,health:k1=v1",
      "--grpc-restricted-protocol=metadata,health:k2=v2"],
     "api 'health' can not be specified in multiple config groups"),
    (["--http-restricted-api=inference"], "give APIS:KEY=VALUE"),
])
def test_bad_groups_stop_the_start(repo, flags, why):
    with pytest.raises(RuntimeError) as stopped:
        proc, _ = launch(repo, *flags)
        proc.kill()
    assert why in str(stopped.value)


def test_sheaf_models_sends_the_header_a_group_needs(server):
    from conftest import binary
    import subprocess
    run = lambda *extra: subprocess.run(
        [binary(), "models", "--url", f"http://{server.http}", *extra, "list"],
        capture_output=True, text=True, timeout=60)
    refused = run()
    assert refused.returncode != 0 and "expecting header 'admin-key'" in refused.stderr, refused
    listed = run("--header", "admin-key:admin-value")
    assert listed.returncode == 0 and "mlp" in listed.stdout, listed
    bad = run("--header", "no colon")
    assert bad.returncode != 0 and "give NAME:VALUE" in bad.stderr, bad


def test_sheaf_bench_sends_the_headers_a_group_needs(server):
    """`sheaf bench --header` over HTTP (the model's metadata and the calls) and over gRPC
    (metadata on each call): refused without, every request served with."""
    from conftest import binary
    import subprocess

    def bench(*extra):
        run = subprocess.run(
            [binary(), "bench", "--model", "mlp", "--concurrency", "2", "--requests", "20",
             *extra], capture_output=True, text=True, timeout=120)
        return run

    http_url = f"http://{server.http}"
    refused = bench("--url", http_url)
    assert refused.returncode != 0 and "403" in refused.stderr, refused
    served = bench("--url", http_url, "--header", "infer-key:infer-value")
    assert served.returncode == 0, served.stdout + served.stderr
    row = next(l for l in served.stdout.splitlines() if l.strip().startswith("concurrency"))
    assert row.endswith(" 0"), row
    grpc = ["--protocol", "grpc", "--url", f"http://{server.grpc}", "--http-url", http_url]
    # The metadata call over HTTP needs the HTTP group's header; the gRPC calls their own.
    refused = bench(*grpc, "--header", "infer-key:infer-value")
    row = next(l for l in refused.stdout.splitlines() if l.strip().startswith("concurrency"))
    assert "grpc PermissionDenied: 20" in row, row
    served = bench(*grpc, "--header", "infer-key:infer-value",
                   "--header", "triton-grpc-protocol-infer-key:infer-value")
    assert served.returncode == 0, served.stdout + served.stderr
    row = next(l for l in served.stdout.splitlines() if l.strip().startswith("concurrency"))
    assert row.endswith(" 0"), row
    bad = bench("--url", http_url, "--header", "no colon")
    assert bad.returncode != 0 and "give NAME:VALUE" in bad.stderr, bad
