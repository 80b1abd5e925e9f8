"""tritonserver's --http-header-forward-pattern and --grpc-header-forward-pattern against the
real `sheaf` binary: the headers (gRPC metadata) whose names match reach a Python model as
string request parameters, over HTTP, gRPC (unary and streaming) and the generate extension,
with NVIDIA's tritonclient; others do not; a header named as a parameter the server reads, or
as one the body gives too, is refused."""
import json
import queue
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import launch, start

# Answers its request's parameters as JSON text.
ECHO_PARAMETERS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "params", np.array([[r.parameters().encode()]], dtype=object))]) for r in requests]
'''
CONFIG = '''
backend: "python"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "params" data_type: TYPE_STRING dims: [ 1 ] } ]
'''
HEADERS = {"my_header_1": "one", "My_Header_2": 'a "quoted" value', "header_3": "three"}
FORWARDED = {"my_header_1": "one", "my_header_2": 'a "quoted" value'}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("forward")
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "1" / "model.py").write_text(ECHO_PARAMETERS)
    (repo / "echo" / "config.pbtxt").write_text(CONFIG)
    yield from start(repo, "--http-header-forward-pattern", "my_header.*",
                     "--grpc-header-forward-pattern", "my_header.*")


def given(client):
    x = client.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones((1, 1), np.float32))
    return [x]


def parameters(result):
    return json.loads(result.as_numpy("params")[0, 0])


def test_matching_headers_reach_the_model_over_http_and_grpc(server):
    http = httpclient.InferenceServerClient(server.http)
    # A copy: tritonclient's HTTP client adds its own headers to the dict it is given.
    got = parameters(http.infer("echo", given(httpclient), headers=dict(HEADERS),
                                parameters={"body_parameter": 7}))
    assert got == {**FORWARDED, "body_parameter": 7}, got
    grpc = grpcclient.InferenceServerClient(server.grpc)
    # gRPC metadata keys are lower case.
    got = parameters(grpc.infer("echo", given(grpcclient),
                                headers={k.lower(): v for k, v in HEADERS.items()}))
    assert got == FORWARDED, got
    # No header matched: no parameter.
    assert parameters(http.infer("echo", given(httpclient), headers={"other": "x"})) == {}


def test_a_grpc_stream_s_metadata_reaches_each_of_its_requests(server):
    grpc = grpcclient.InferenceServerClient(server.grpc)
    answers = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)),
                      headers={"my_header_1": "streamed"})
    try:
        for _ in range(3):
            grpc.async_stream_infer("echo", given(grpcclient))
        for _ in range(3):
            result, error = answers.get(timeout=30)
            assert error is None, error
            assert parameters(result) == {"my_header_1": "streamed"}
    finally:
        grpc.stop_stream()


def test_the_generate_extension_forwards_them_too(server):
    request = urllib.request.Request(
        f"http://{server.http}/v2/models/echo/generate",
        data=json.dumps({"x": 1.0}).encode(),
        headers={"content-type": "application/json", "my_header_1": "generated"})
    with urllib.request.urlopen(request) as r:
        answer = json.loads(r.read())
    assert json.loads(answer["params"]) == {"my_header_1": "generated"}, answer


def test_a_header_the_server_reads_or_the_body_gives_is_refused(tmp_path):
    repo = tmp_path / "repo"
    (repo / "echo" / "1").mkdir(parents=True)
    (repo / "echo" / "1" / "model.py").write_text(ECHO_PARAMETERS)
    (repo / "echo" / "config.pbtxt").write_text(CONFIG)
    for server in start(repo, "--http-header-forward-pattern", ".*priority|my_.*",
                        "--grpc-header-forward-pattern", "(?-i)MY_.*|timeout"):
        http = httpclient.InferenceServerClient(server.http)
        with pytest.raises(InferenceServerException) as refused:
            http.infer("echo", given(httpclient), headers={"priority": "1"})
        assert "'priority' is a parameter the server reads itself" in str(refused.value)
        with pytest.raises(InferenceServerException) as refused:
            http.infer("echo", given(httpclient), headers={"my_key": "1"},
                       parameters={"my_key": 2})
        assert "given by the request and by a forwarded header" in str(refused.value)
        grpc = grpcclient.InferenceServerClient(server.grpc)
        with pytest.raises(InferenceServerException) as refused:
            grpc.infer("echo", given(grpcclient), headers={"timeout": "5"})
        assert "StatusCode.INVALID_ARGUMENT" in str(refused.value), refused.value
        # The gRPC pattern is case-sensitive: lower-case metadata does not match MY_.
        assert parameters(grpc.infer("echo", given(grpcclient), headers={"my_key": "1"})) == {}
    with pytest.raises(RuntimeError) as stopped:
        proc, _ = launch(repo, "--http-header-forward-pattern", "(")
        proc.kill()
    assert "--http-header-forward-pattern: not a regular expression" in str(stopped.value)
