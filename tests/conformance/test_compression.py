"""Compressed requests and answers, as NVIDIA's tritonclient sends and takes them
(`request_compression_algorithm` and `response_compression_algorithm` over HTTP,
`compression_algorithm` over gRPC) and Triton's frontends serve them, against the real `sheaf`
binary: gzip and deflate bodies and messages are answered as their plain forms are; other codings,
broken data and bodies that inflate past the limit are refused with a specific status; infer
answers go back compressed as `Accept-Encoding` asks, and gRPC answers with
`--grpc-infer-response-compression-level`."""
import gzip
import json
import socket
import subprocess
import threading
import zlib

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, binary, http, link_models, start

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


def test_infer_answers_are_compressed_as_accept_encoding_asks(server):
    url = f"http://{server.http}/v2/models/mlp/infer"
    body = json.dumps({"inputs": [{"name": "input", "shape": [2, 512], "datatype": "FP32",
                                   "data": [0.25] * 1024}]}).encode()
    status, headers, plain = http(url, body)
    assert status == 200 and headers["Content-Encoding"] is None, headers
    expected = json.loads(plain)
    inflate = {"gzip": gzip.decompress, "deflate": zlib.decompress}
    for accept, coding in [("gzip", "gzip"), ("deflate", "deflate"),
                           ("gzip;q=0.2, deflate;q=0.8", "deflate"),
                           ("deflate;q=0, gzip", "gzip"), ("br", None), ("identity", None)]:
        status, headers, answer = http(url, body, headers={"Accept-Encoding": accept})
        assert status == 200, answer
        assert headers["Content-Encoding"] == coding, (accept, dict(headers))
        assert "accept-encoding" in headers["Vary"].lower(), dict(headers)
        if coding:
            answer = inflate[coding](answer)
        assert json.loads(answer) == expected, accept
    # An error is answered as well, compressed as asked.
    status, headers, answer = http(f"http://{server.http}/v2/models/nope/infer", body,
                                   headers={"Accept-Encoding": "gzip"})
    assert status == 404, answer
    assert b"nope" in (gzip.decompress(answer) if headers["Content-Encoding"] else answer)
    # Routes other than infer stay plain.
    status, headers, _ = http(f"http://{server.http}/v2/models/mlp/config",
                              headers={"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] is None


class CountingProxy:
    """A TCP forwarder to `target` that counts the bytes the server sends back."""

    def __init__(self, target):
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.back = 0
        self.lock = threading.Lock()
        self.sockets = []
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [client, upstream]
            threading.Thread(target=self.pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self.pump, args=(upstream, client, True), daemon=True).start()

    def pump(self, source, sink, counted):
        try:
            while data := source.recv(1 << 16):
                if counted:
                    with self.lock:
                        self.back += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            # A shutdown, not a close: it ends the connection even while the other direction's
            # thread is still blocked reading it.
            shut(sink)

    def close(self):
        """Ends every connection, so that the server it forwards to has none left open."""
        self.listener.close()
        with self.lock:
            for s in self.sockets:
                shut(s)


def shut(s):
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


ECHO = """inputs: [{name: x, data_type: FP32, dims: [65536]}]
outputs: [{name: y, data_type: FP32, dims: [65536]}]
"""


@pytest.mark.parametrize("level", ["none", "low", "high"])
def test_grpc_answers_are_compressed_with_the_level_flag(tmp_path, level):
    (tmp_path / "echo").mkdir()
    (tmp_path / "echo" / "config.yaml").write_text(ECHO)
    (tmp_path / "echo" / "model.py").write_text("def infer(inputs):\n    return {'y': inputs['x']}\n")
    x = np.zeros((1, 65536), np.float32)
    x[0, ::1000] = 1.5
    for served in start(tmp_path, "--grpc-infer-response-compression-level", level):
        proxy = CountingProxy(served.grpc)
        client = grpcclient.InferenceServerClient(proxy.address)
        given = grpcclient.InferInput("x", [1, 65536], "FP32")
        given.set_data_from_numpy(x)
        before = proxy.back
        for _ in range(3):
            result = client.infer("echo", [given])
            np.testing.assert_array_equal(result.as_numpy("y"), x)
        sent = (proxy.back - before) / 3
        # 256 KiB of mostly zeros: a few KiB compressed.
        if level == "none":
            assert sent > x.nbytes, sent
        else:
            assert sent < x.nbytes / 20, sent
        client.close()
        proxy.close()


def test_an_unknown_compression_level_stops_the_start(tmp_path):
    proc = subprocess.run([binary(), "serve", "--model-repository", str(tmp_path),
                           "--grpc-infer-response-compression-level", "max"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert "none, low, medium, high" in proc.stderr, proc.stderr
