"""A SIGTERM under load from NVIDIA's tritonclient, over HTTP (keep-alive connections) and gRPC
(grpc-core): with a drain delay, readiness fails first, the clients stop a moment later as a
load balancer would stop routing to the replica, and every call they made succeeded: no
connection error, no reset, no call lost to a GOAWAY."""
import signal
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import launch, link_models


def infer_loop(module, url, stop, results):
    client = module.InferenceServerClient(url)
    data = np.full((1, 512), 0.25, dtype=np.float32)
    while not stop.is_set():
        given = module.InferInput("input", [1, 512], "FP32")
        given.set_data_from_numpy(data)
        try:
            answer = client.infer("mlp", [given])
            results.append((time.monotonic(), answer.as_numpy("output").shape))
        except Exception as e:  # every failure is recorded and fails the test
            results.append((time.monotonic(), f"{type(e).__name__}: {e}"))
    client.close()


def ready(url):
    try:
        with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_sigterm_under_tritonclient_load_answers_every_call(tmp_path):
    link_models(tmp_path, ["mlp"])
    # h2's own account of a connection error (a GOAWAY with an error code) goes into the log
    # that a failure prints.
    proc, server = launch(tmp_path, "--drain-delay", "2", "--log-level", "info,h2=debug")
    stop = threading.Event()
    results = {"http": [], "grpc": []}
    threads = []
    for protocol, module, url in (("http", httpclient, server.http),
                                  ("grpc", grpcclient, server.grpc)):
        for _ in range(4):
            t = threading.Thread(target=infer_loop, args=(module, url, stop, results[protocol]))
            t.start()
            threads.append(t)
    try:
        time.sleep(0.5)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        while ready(server.http) != 503:
            assert time.monotonic() - signalled < 2, "readiness never failed"
            time.sleep(0.01)
        unready = time.monotonic()
        # A load balancer stops routing here a moment after readiness fails.
        time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert proc.wait(timeout=40) == 0
    assert unready - signalled < 2
    for protocol, calls in results.items():
        failed = [(round(at - signalled, 3), r) for at, r in calls if r != (1, 10)]
        assert not failed, (protocol, "seconds after the signal:", failed[:5],
                            "server log:", [line for line in server.log
                                            if "h2" in line or "WARN" in line][-20:])
        during = [at for at, _ in calls if at > signalled]
        assert during, f"{protocol}: nothing was served during the drain delay"


# HTTP/2 by hand, for the one exchange no client library will write: frames on a stream that a
# client started before it read the server's GOAWAY, written after its PING acknowledgement.
def frame(kind, flags, stream, payload=b""):
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


DATA, HEADERS, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 4, 6, 7, 8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4


def get_live(stream):
    """HEADERS for `GET /v2/health/live` (HPACK: the static table's :method GET and :scheme http,
    :path and :authority as literals not indexed)."""
    path = b"/v2/health/live"
    block = b"\x82\x86" + b"\x04" + bytes([len(path)]) + path + b"\x01\x01x"
    return frame(HEADERS, END_STREAM | END_HEADERS, stream, block)


def read_frames(sock):
    """Yields (kind, flags, stream, payload) until the server closes the connection."""
    buffer = b""
    while True:
        while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
            size = int.from_bytes(buffer[:3], "big")
            yield (buffer[3], buffer[4], int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF,
                   buffer[9:9 + size])
            buffer = buffer[9 + size:]
        chunk = sock.recv(65536)
        if not chunk:
            return
        buffer += chunk


def test_a_stream_the_client_started_as_the_drain_began_does_not_end_the_connection(tmp_path):
    import socket
    link_models(tmp_path, ["mlp"])
    proc, server = launch(tmp_path, "--drain-delay", "2")
    host, port = server.http.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    try:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(SETTINGS, 0, 0) + get_live(1))
        frames = read_frames(sock)
        for kind, flags, stream, _ in frames:
            if kind == SETTINGS and not flags & ACK:
                sock.sendall(frame(SETTINGS, ACK, 0))
            if stream == 1 and flags & END_STREAM:
                break
        # The connection has served HTTP/2: the drain tells it to go away, in two steps.
        proc.send_signal(signal.SIGTERM)
        goaways, ping = [], None
        for kind, flags, stream, payload in frames:
            if kind == GOAWAY:
                goaways.append((int.from_bytes(payload[:4], "big") & 0x7FFFFFFF,
                                int.from_bytes(payload[4:8], "big")))
            if kind == PING and not flags & ACK:
                ping = payload
            if goaways and ping:
                break
        assert goaways == [(2**31 - 1, 0)], goaways
        # Stream 3 was started before the GOAWAY was read; its frames follow the ping's
        # acknowledgement, as grpc-core writes them.
        sock.sendall(frame(PING, ACK, 0, ping) + get_live(3)
                     + frame(WINDOW_UPDATE, 0, 3, (5).to_bytes(4, "big")))
        for kind, _, _, payload in frames:
            if kind == GOAWAY:
                goaways.append((int.from_bytes(payload[:4], "big") & 0x7FFFFFFF,
                                int.from_bytes(payload[4:8], "big")))
    finally:
        sock.close()
    # Stream 3 is above the last stream the second GOAWAY names, so the client knows it was
    # not processed and may send it elsewhere; no GOAWAY carries an error (1: PROTOCOL_ERROR).
    assert goaways[1:] == [(1, 0)], goaways
    assert proc.wait(timeout=20) == 0
