"""tritonserver's rate limiter (--rate-limit execution_count, --rate-limit-resource) against the
real `sheaf` binary: two Python models, two instances each, whose instances need one copy of the
resource R. Each execution writes when it starts and ends; with the limiter on and one copy, no
two executions of the four instances overlap, with two copies at most two do, and with it off
they overlap freely. A count below an instance's need fails the model's load, in Triton's
words."""
import concurrent.futures
import json
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import launch, start

# Sleeps 150 ms per execute, and appends "start end" (monotonic, shared by every process of
# this machine) to the file its model's parameter names.
SLOW = '''
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = json.loads(args["model_config"])["parameters"]["log"]["string_value"]

    def execute(self, requests):
        began = time.monotonic()
        time.sleep(0.15)
        ended = time.monotonic()
        with open(self.log, "a") as f:
            f.write(f"{began} {ended}\\n")
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())]) for r in requests]
'''
CONFIG = '''
backend: "python"
max_batch_size: 0
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 2 kind: KIND_CPU
                   rate_limiter {{ resources [ {{ name: "R" count: 1 }} ] priority: 1 }} }} ]
parameters {{ key: "log" value: {{ string_value: "{log}" }} }}
'''
MODELS = ("slow_a", "slow_b")


@pytest.fixture
def repo(tmp_path):
    for name in MODELS:
        (tmp_path / "repo" / name / "1").mkdir(parents=True)
        (tmp_path / "repo" / name / "1" / "model.py").write_text(SLOW)
        (tmp_path / "repo" / name / "config.pbtxt").write_text(
            CONFIG.format(log=tmp_path / f"{name}.log"))
    return tmp_path


def most_at_once(server, folder):
    """Sends 16 requests at once, 8 to each model; the most executions that ran at once."""
    def ask(k):
        client = httpclient.InferenceServerClient(server.http)
        x = httpclient.InferInput("x", [1], "FP32")
        x.set_data_from_numpy(np.array([k], np.float32))
        answer = client.infer(MODELS[k % 2], [x])
        assert answer.as_numpy("y")[0] == k
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(ask, range(16)))
    spans = []
    for name in MODELS:
        spans += [tuple(map(float, line.split())) for line in (folder / f"{name}.log").read_text().splitlines()]
        (folder / f"{name}.log").unlink()
    assert len(spans) == 16, spans
    events = sorted([(t, 1) for t, _ in spans] + [(t, -1) for _, t in spans],
                    key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def test_one_copy_runs_one_execution_at_a_time_across_models(repo):
    for server in start(repo / "repo", "--rate-limit", "execution_count"):
        assert most_at_once(server, repo) == 1


def test_two_copies_run_two_at_a_time(repo):
    for server in start(repo / "repo", "--rate-limit=execution_count",
                        "--rate-limit-resource=r:2"):
        assert most_at_once(server, repo) == 2


def test_off_the_rate_limiter_is_ignored(repo):
    for server in start(repo / "repo"):
        assert most_at_once(server, repo) >= 3


def test_a_count_below_a_need_fails_the_load(repo):
    for server in start(repo / "repo", "--rate-limit", "execution_count",
                        "--rate-limit-resource", "R:0"):
        with urllib.request.urlopen(urllib.request.Request(
                f"http://{server.http}/v2/repository/index", data=b"{}", method="POST",
                headers={"Content-Type": "application/json"})) as r:
            index = {m["name"]: m for m in json.loads(r.read())}
        for name in MODELS:
            assert index[name]["state"] == "UNAVAILABLE", index
            assert ('Resource count for "r" is limited to 0 which will prevent scheduling of '
                    'one or more model instances, the minimum required count is 1'
                    in index[name]["reason"]), index[name]


def test_counts_without_the_rate_limiter_stop_the_start(repo):
    with pytest.raises(RuntimeError) as stopped:
        proc, _ = launch(repo / "repo", "--rate-limit-resource", "R:1")
        proc.kill()
    assert "give --rate-limit execution_count too" in str(stopped.value)
    with pytest.raises(RuntimeError) as stopped:
        proc, _ = launch(repo / "repo", "--rate-limit", "execution_count",
                         "--rate-limit-resource", "R")
        proc.kill()
    assert "NAME:COUNT" in str(stopped.value)
