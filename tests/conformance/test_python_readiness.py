"""A Python model's readiness: Triton's `is_ready()` (and the batched API's), asked when a
client asks whether the model (or, under strict readiness, the server) is ready, answered while
batches run, bounded by five seconds; and a process that ends while idle, not ready until the
one started again at once has loaded."""

import concurrent.futures
import os
import shutil
import signal
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import ROOT, http, start
from conftest import runner_pids as shared_runner_pids

FIXTURES = ROOT / "tests" / "python_models"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("readiness-repo")
    for name in ("ready_gate", "ready_batched"):
        shutil.copytree(FIXTURES / name, repo / name)
    return repo


@pytest.fixture(scope="module")
def server(repo):
    yield from start(repo)


def set_state(repo, model, text):
    """What the model's `is_ready()` reads; None removes the file (ready)."""
    path = repo / model / "state"
    if text is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(text)


def model_ready(server, model, version=None):
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/ready"
    status, _, body = http(f"http://{server.http}" + path)
    return status, body.decode()


def pid_of(url, wait_ms=0):
    client = httpclient.InferenceServerClient(url)
    i = httpclient.InferInput("WAIT_MS", [1, 1], "INT32")
    i.set_data_from_numpy(np.array([[wait_ms]], np.int32))
    return int(client.infer("ready_gate", [i]).as_numpy("PID")[0, 0])


def runner_pids(repo, model):
    """The live processes running `model`'s model.py."""
    return shared_runner_pids(repo / model / "1" / "model.py")


@pytest.mark.parametrize("state,says", [
    ("no", "its is_ready() returned False"),
    ("raise", "RuntimeError: the feature store is unreachable"),
    ("number", "is_ready() must return a bool, not int"),
])
def test_a_models_is_ready_decides_its_readiness_over_http_and_grpc(server, state, says):
    grpc = grpcclient.InferenceServerClient(server.grpc)
    assert model_ready(server, "ready_gate") == (200, "")
    assert grpc.is_model_ready("ready_gate")
    try:
        set_state(server.repo, "ready_gate", state)
        for version in (None, "1"):
            status, body = model_ready(server, "ready_gate", version)
            assert status == 503, body
            assert "model 'ready_gate' is not ready" in body and says in body, body
        assert not grpc.is_model_ready("ready_gate")
        assert not grpc.is_model_ready("ready_gate", "1")
        # As under Triton: the model still serves, and without strict readiness the server
        # is ready.
        assert pid_of(server.http) in runner_pids(server.repo, "ready_gate")
        assert http(f"http://{server.http}" + "/v2/health/ready")[0] == 200
        assert grpc.is_server_ready()
    finally:
        set_state(server.repo, "ready_gate", None)
    assert model_ready(server, "ready_gate") == (200, "")
    assert grpc.is_model_ready("ready_gate")


def test_is_ready_is_answered_while_the_model_runs_batches(server):
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        running = [pool.submit(pid_of, server.http, 3000) for _ in range(4)]
        time.sleep(0.5)
        assert model_ready(server, "ready_gate") == (200, "")
        assert not any(r.done() for r in running), "answered after the batches, not during"
        pids = {r.result() for r in running}
    assert pids <= set(runner_pids(server.repo, "ready_gate"))


def test_an_is_ready_that_takes_over_five_seconds_is_not_ready(server):
    set_state(server.repo, "ready_gate", "slow")
    try:
        asked = time.monotonic()
        status, body = model_ready(server, "ready_gate")
        took = time.monotonic() - asked
        assert status == 503 and "its is_ready() gave no answer within 5 s" in body, body
        assert took >= 4.9, took
    finally:
        set_state(server.repo, "ready_gate", None)
    # The late answer is passed over; the next question's answer is read.
    deadline = time.monotonic() + 30
    while model_ready(server, "ready_gate")[0] != 200:
        assert time.monotonic() < deadline, "never ready again"
        time.sleep(0.2)


def test_the_batched_api_s_async_is_ready(server):
    assert model_ready(server, "ready_batched") == (200, "")
    try:
        set_state(server.repo, "ready_batched", "no")
        status, body = model_ready(server, "ready_batched")
        assert status == 503 and "its is_ready() returned False" in body, body
    finally:
        set_state(server.repo, "ready_batched", "yes")
    assert model_ready(server, "ready_batched") == (200, "")


def test_a_process_that_ends_while_idle_is_started_again_before_any_request(server):
    before = runner_pids(server.repo, "ready_gate")
    assert len(before) == 2, before
    victim = before[0]
    # Its next process takes two seconds to import: long enough to be seen not ready.
    (server.repo / "ready_gate" / "slow_start").write_text("")
    try:
        os.kill(victim, signal.SIGKILL)
        seen = []
        deadline = time.monotonic() + 30
        while True:
            status, body = model_ready(server, "ready_gate")
            seen.append((status, body))
            if status == 200 and any(s == 503 for s, _ in seen):
                break
            assert time.monotonic() < deadline, seen[-3:]
            time.sleep(0.05)
    finally:
        (server.repo / "ready_gate" / "slow_start").unlink()
    # Each answer names the process (the first may come before the loss is known: the
    # model's is_ready() could not be asked), and the restart is seen.
    down = [b for s, b in seen if s == 503]
    assert all("its Python process" in b for b in down), down[:3]
    assert any("was lost" in b and "being started again" in b for b in down), down[:3]
    # No request asked for it: the process was started as soon as the last one ended.
    after = runner_pids(server.repo, "ready_gate")
    assert len(after) == 2 and victim not in after, (before, after)
    assert pid_of(server.http) in after


def test_strict_readiness_asks_each_model(repo, tmp_path):
    strict = tmp_path / "repo"
    shutil.copytree(repo / "ready_batched", strict / "ready_batched")
    set_state(strict, "ready_batched", None)
    for s in start(strict, "--strict-readiness", "true"):
        grpc = grpcclient.InferenceServerClient(s.grpc)
        assert http(f"http://{s.http}" + "/v2/health/ready")[0] == 200
        assert grpc.is_server_ready()
        set_state(strict, "ready_batched", "no")
        assert http(f"http://{s.http}" + "/v2/health/ready")[0] == 503
        assert not grpc.is_server_ready()
        set_state(strict, "ready_batched", "yes")
        assert http(f"http://{s.http}" + "/v2/health/ready")[0] == 200
        assert grpc.is_server_ready()
