"""`--max-request-memory` bounds the bytes of requests the real `sheaf` binary holds at once.

While a slow client holds most of the bound with a body it has not finished, a request that
would pass it is refused at once with 503 and Retry-After over HTTP (its declared length before
any of its body is read, a chunked body as it arrives, a JSON tensor at its decoded size) and
RESOURCE_EXHAUSTED over gRPC (a stream's message in that stream alone, typed contents at their
decoded size), while requests that fit
are served; once the slow
request is answered its bytes are given back, and the same large requests are served. A bound
below one body stops the start."""
import queue
import socket

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import launch, link_models, start

MIB = 1 << 20
LIMIT = 8 * MIB
MAX_BODY = 6 * MIB
# 1,500 items of 512 floats: 3 MB, within one body, past what the slow client leaves.
LARGE = np.linspace(-1, 1, 1500 * 512, dtype=np.float32).reshape(1500, 512)
SMALL = LARGE[:2]


def address(url):
    host, port = url.rsplit(":", 1)
    return host, int(port)


def declare(url, size, send):
    """A raw connection that declares a `size`-byte body and sends `send` bytes of it."""
    conn = socket.create_connection(address(url))
    conn.sendall(
        f"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: sheaf\r\nContent-Length: {size}\r\n"
        f"Content-Type: application/octet-stream\r\n\r\n".encode()
    )
    conn.sendall(b"0" * send)
    return conn


def answer(conn):
    """The head of the answer on `conn` (status line and headers), and its body's start."""
    conn.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        assert more, f"the connection closed after {data!r}"
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    return head.decode().lower(), body.decode(errors="replace")


def infer(module, url, x):
    client = module.InferenceServerClient(url)
    tensor = module.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer("mlp", [tensor]).as_numpy("output")


def stream_answers(url, inputs):
    """Sends each of `inputs` on one gRPC stream; returns (result or error) per request."""
    client = grpcclient.InferenceServerClient(url)
    got = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        for n, x in enumerate(inputs):
            tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            client.async_stream_infer("mlp", [tensor], request_id=str(n))
        return [got.get(timeout=30) for _ in inputs]
    finally:
        client.stop_stream()


def test_requests_past_the_bound_are_refused_at_once_while_others_are_served(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    link_models(repo, ["mlp"])
    for server in start(repo, "--max-request-memory", str(LIMIT), "--max-body-bytes", str(MAX_BODY)):
        want_small = infer(httpclient, server.http, SMALL)
        want_large = infer(httpclient, server.http, LARGE)
        # A slow client holds 6 of the 8 MiB: it has sent all of its body but the last byte.
        slow = declare(server.http, MAX_BODY, MAX_BODY - 1)

        # A declared length past what is left: 503 at once, before any of the body is sent.
        conn = declare(server.http, 3 * MIB, 0)
        head, body = answer(conn)
        conn.close()
        assert head.startswith("http/1.1 503"), head
        assert "retry-after: 1" in head
        assert "--max-request-memory" in body and str(LIMIT) in body

        # tritonclient over HTTP and gRPC: the large request refused, a small one served.
        with pytest.raises(InferenceServerException) as refused:
            infer(httpclient, server.http, LARGE)
        assert "503" in str(refused.value)
        assert "--max-request-memory" in refused.value.message()
        with pytest.raises(InferenceServerException) as refused:
            infer(grpcclient, server.grpc, LARGE)
        assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "--max-request-memory" in refused.value.message()
        np.testing.assert_allclose(infer(httpclient, server.http, SMALL), want_small, rtol=1e-5)
        np.testing.assert_allclose(infer(grpcclient, server.grpc, SMALL), want_small, rtol=1e-5)

        # On a stream, the large message alone is refused; the stream serves on.
        answers = stream_answers(server.grpc, [SMALL, LARGE, SMALL])
        errors = [str(e) for _, e in answers if e is not None]
        served = {r.get_response().id: r.as_numpy("output") for r, e in answers if e is None}
        assert len(errors) == 1 and "--max-request-memory" in errors[0], errors
        assert sorted(served) == ["0", "2"]
        np.testing.assert_allclose(served["2"], want_small, rtol=1e-5)

        # A body sent without a length is held as it arrives, and refused where it passes.
        pieces = (b"1" * (512 * 1024) for _ in range(6))
        chunked = requests.post(f"http://{server.http}/v2/models/mlp/infer", data=pieces,
                                headers={"Content-Type": "application/octet-stream"})
        assert chunked.status_code == 503, chunked.text
        assert chunked.headers["retry-after"] == "1"

        # A JSON body that fits, whose tensor decodes to twice its length: refused once decoded.
        rows = 880  # "0," per element: 0.9 MB of JSON, 1.8 MB of FP32
        json_body = ('{"inputs":[{"name":"input","datatype":"FP32","shape":[%d,512],"data":[%s]}]}'
                     % (rows, ",".join(["0"] * (rows * 512)))).encode()
        assert len(json_body) < LIMIT - MAX_BODY < 3 * len(json_body)
        decoded = requests.post(f"http://{server.http}/v2/models/mlp/infer", data=json_body,
                                headers={"Content-Type": "application/json"})
        assert decoded.status_code == 503 and "--max-request-memory" in decoded.text, decoded.text

        # The slow request ends (it is not a tensor: 400), and its bytes are given back.
        slow.sendall(b"0")
        head, _ = answer(slow)
        slow.close()
        assert head.startswith("http/1.1 400"), head
        np.testing.assert_allclose(infer(httpclient, server.http, LARGE), want_large, rtol=1e-5)
        np.testing.assert_allclose(infer(grpcclient, server.grpc, LARGE), want_large, rtol=1e-5)
        served = requests.post(f"http://{server.http}/v2/models/mlp/infer", data=json_body,
                               headers={"Content-Type": "application/json"})
        assert served.status_code == 200, served.text[:200]
        # /metrics: nothing held now, the bound, and the six refusals above.
        metrics = requests.get(f"http://{server.metrics}/metrics").text
        for line in ("sheaf_request_memory_bytes 0", f"sheaf_request_memory_limit_bytes {LIMIT}",
                     "sheaf_request_memory_refused_total 6"):
            assert line + "\n" in metrics, line


def test_typed_grpc_contents_are_held_at_their_decoded_size(tmp_path):
    """`int64_contents` of zeros take one byte an element on the wire and eight decoded: a
    request whose message fits the bound but whose tensors do not is refused; a small one is
    served, its answer equal to onnxruntime's."""
    import grpc
    import onnxruntime
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    from conftest import ENCODER, ROOT, link_encoder
    repo = tmp_path / "repo"
    repo.mkdir()
    link_encoder(repo)

    def request(rows, tokens):
        ids = np.full((rows, tokens), 101, dtype=np.int64)
        message = service_pb2.ModelInferRequest(model_name="minilm")
        for name, values in (("input_ids", ids), ("attention_mask", np.ones_like(ids)),
                             ("token_type_ids", np.zeros_like(ids))):
            tensor = message.inputs.add(name=name, datatype="INT64", shape=[rows, tokens])
            tensor.contents.int64_contents.extend(values.flatten().tolist())
        message.outputs.add(name="embedding")
        return message, ids

    for server in start(repo, "--max-request-memory", str(2 * MIB), "--max-body-bytes", str(MIB)):
        with grpc.insecure_channel(server.grpc) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            large, _ = request(400, 250)
            assert large.ByteSize() < MIB < 2 * MIB < 3 * 8 * 400 * 250
            with pytest.raises(grpc.RpcError) as refused:
                stub.ModelInfer(large)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-request-memory" in refused.value.details()
            small, ids = request(2, 8)
            answer = stub.ModelInfer(small)
            # Asked in typed contents, answered in typed contents.
            got = np.array(answer.outputs[0].contents.fp32_contents, np.float32).reshape(2, 384)
            session = onnxruntime.InferenceSession(str(ROOT / ENCODER / "1" / "model.onnx"))
            states = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                        "token_type_ids": np.zeros_like(ids)})[0]
            np.testing.assert_allclose(got, states.mean(axis=1), atol=1e-4)


def test_a_bound_below_one_body_stops_the_start(tmp_path):
    with pytest.raises(RuntimeError) as stopped:
        proc, _ = launch(None, "--max-request-memory", "1000")
        proc.kill()
    assert "--max-request-memory 1000 is less than --max-body-bytes 67108864" in str(stopped.value)
