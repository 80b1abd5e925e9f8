"""Triton's custom metrics (`pb_utils.MetricFamily`) from a Python model, read at the real
server's `/metrics`.

The model is tests/python_models/metered: two instances count into shared counters, a gauge
and a histogram. Requests go through NVIDIA's tritonclient over HTTP and gRPC; the exposition is
checked by Prometheus' own promtool and read back here.
"""
import concurrent.futures
import re
import shutil
import subprocess
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, infer_scalar, start

FIXTURES = ROOT / "tests" / "python_models"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("metrics-repo")
    shutil.copytree(FIXTURES / "metered", repo / "metered")
    for server in start(repo, "--model-control-mode", "explicit"):
        httpclient.InferenceServerClient(server.http).load_model("metered")
        yield server


def ask(module, url, x):
    answer = infer_scalar(module, url, "metered", "X", x)
    return float(answer.as_numpy("COUNT")[0, 0]), int(answer.as_numpy("PID")[0, 0])


def scrape(server):
    return urllib.request.urlopen(f"http://{server.metrics}/metrics").read().decode()


def samples(text):
    """{(name, labels as a sorted tuple): value} of every sample line."""
    found = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)', line)
        assert m, f"not a sample line: {line!r}"
        labels = tuple(sorted(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                         m.group(2) or "")))
        found[(m.group(1), labels)] = float(m.group(3))
    return found


def test_a_model_s_metrics_are_shared_by_its_instances_and_shown_at_metrics(server):
    values = [0.5, 5.0, 50.0, 500.0] * 10
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(
            lambda ix: ask(*((httpclient, server.http) if ix[0] % 2 else (grpcclient, server.grpc)),
                           ix[1]),
            enumerate(values)))
    counts = [c for c, _ in answers]
    pids = {p for _, p in answers}
    assert len(pids) == 2, "both instances answered"
    assert max(counts) == len(values), "the count both instances share reached every request"
    assert all(1 <= c <= len(values) for c in counts)
    # One more request sees every one before it, whichever instance takes it.
    assert ask(httpclient, server.http, 2.0)[0] == len(values) + 1

    text = scrape(server)
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          text=True)
    # promtool's lint asks counters to end in _total; the model's names are Triton's, and must
    # stay as the model gave them, as the server's Triton-named lines (nv_*) do. Anything else,
    # a parse error above all, fails.
    complaints = [line for line in (lint.stdout + lint.stderr).splitlines() if line.strip()]
    assert lint.returncode in (0, 3), complaints
    assert all(line.startswith(("requests_process_latency_ns ", "metered_requests ", "nv_"))
               for line in complaints), complaints

    assert "# HELP requests_process_latency_ns Cumulative time spent processing requests" in text
    assert "# TYPE requests_process_latency_ns counter" in text
    assert "# TYPE metered_batch_size gauge" in text
    assert "# TYPE metered_value histogram" in text
    got = samples(text)
    assert got[("requests_process_latency_ns", (("model", "metered"), ("version", "1")))] > 0
    assert got[("metered_requests", (("model", "metered"),))] == len(values) + 1
    assert 1 <= got[("metered_batch_size", ())] <= 16
    model = (("model", "metered"),)
    bucket = {le: got[("metered_value_bucket", tuple(sorted(model + (("le", le),))))]
              for le in ("1", "10", "100", "+Inf")}
    # 0.5 ×10 ≤ 1; 2.0 and 5.0 ×10 ≤ 10; 50.0 ×10 ≤ 100; 500.0 ×10 above.
    assert bucket == {"1": 10, "10": 21, "100": 31, "+Inf": 41}
    assert got[("metered_value_count", model)] == 41
    assert got[("metered_value_sum", model)] == pytest.approx(10 * 555.5 + 2.0)


@pytest.mark.parametrize("x,says", [(-1, "a counter only goes up"),
                                     (-2, "exists already as a counter, not a gauge")])
def test_a_metric_used_wrongly_fails_that_request_with_the_reason(server, x, says):
    before = samples(scrape(server))[("metered_requests", (("model", "metered"),))]
    for module, url in ((httpclient, server.http), (grpcclient, server.grpc)):
        with pytest.raises(InferenceServerException, match=says):
            ask(module, url, x)
    count, _ = ask(httpclient, server.http, 1.0)
    assert count == before + 1, "the refused changes counted nothing, and the model serves"


def test_a_model_s_metrics_go_when_it_unloads(server):
    ask(httpclient, server.http, 1.0)
    assert "metered_requests{" in scrape(server)
    client = httpclient.InferenceServerClient(server.http)
    client.unload_model("metered")
    # The families go as the model's processes end.
    deadline = time.monotonic() + 15
    while "metered_requests" in scrape(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    text = scrape(server)
    assert "metered_requests" not in text and "requests_process_latency_ns" not in text, text
    client.load_model("metered")
    count, _ = ask(httpclient, server.http, 1.0)
    assert count == 1, "a model loaded again counts from zero"
