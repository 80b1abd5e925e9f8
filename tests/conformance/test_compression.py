"""Compressed requests, as NVIDIA's tritonclient sends them (`request_compression_algorithm`
over HTTP, `compression_algorithm` over gRPC) and Triton's frontends take them, against the real
`sheaf` binary: gzip and deflate bodies and messages are answered as their plain forms are; other
codings, broken data and bodies that inflate past the limit are refused with a specific status."""
import gzip
import json
import zlib

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, http, link_models, start

MLP = ROOT / "model_repository/mlp/1/model.onnx"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("compression")
    link_models(repo, ["mlp"])
    yield from start(repo, "--max-body-bytes", str(1 << 20))


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_are_answered_as_plain_ones(server, algorithm):
    x = np.random.default_rng(7).standard_normal((3, 512), dtype=np.float32)
    expected = ort.InferenceSession(str(MLP)).run(None, {"input": x})[0]
    for binary in (True, False):
        given = httpclient.InferInput("input", [3, 512], "FP32")
        given.set_data_from_numpy(x, binary_data=binary)
        result = httpclient.InferenceServerClient(server.http).infer(
            "mlp", [given], request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm)
        np.testing.assert_allclose(result.as_numpy("output"), expected, rtol=1e-4, atol=1e-5)
    given = grpcclient.InferInput("input", [3, 512], "FP32")
    given.set_data_from_numpy(x)
    result = grpcclient.InferenceServerClient(server.grpc).infer(
        "mlp", [given], compression_algorithm=algorithm)
    np.testing.assert_allclose(result.as_numpy("output"), expected, rtol=1e-4, atol=1e-5)


def test_other_codings_broken_data_and_bombs_are_refused(server):
    url = f"http://{server.http}/v2/models/mlp/infer"
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 512], "datatype": "FP32",
                                   "data": [0.5] * 512}]}).encode()
    status, headers, answer = http(url, body, headers={"Content-Encoding": "br"})
    assert status == 415 and headers["Accept-Encoding"] == "gzip, deflate", answer
    status, _, answer = http(url, b"not gzip at all", headers={"Content-Encoding": "gzip"})
    assert status == 400 and b"not valid gzip" in answer, answer
    # 8 MiB of zeros, a few KiB compressed: refused at the 1 MiB limit, not inflated whole.
    bomb = gzip.compress(b"0" * (8 << 20))
    assert len(bomb) < 64 << 10
    status, _, answer = http(url, bomb, headers={"Content-Encoding": "gzip"})
    assert status == 413 and b"inflates past the length limit" in answer, answer
    status, _, answer = http(url, zlib.compress(body), headers={"Content-Encoding": "deflate"})
    assert status == 200, answer
    # gRPC: a message that inflates past the limit is RESOURCE_EXHAUSTED.
    big = np.zeros((1024, 512), np.float32)
    given = grpcclient.InferInput("input", list(big.shape), "FP32")
    given.set_data_from_numpy(big)
    with pytest.raises(InferenceServerException) as refused:
        grpcclient.InferenceServerClient(server.grpc).infer("mlp", [given],
                                                            compression_algorithm="gzip")
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED", refused.value
