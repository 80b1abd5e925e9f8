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
