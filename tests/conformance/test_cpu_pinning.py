"""Instances and the server's own threads on the cores they are given (`instance_cpus`,
`--io-cpus`), seen from outside: the kernel's view of each thread in /proc, and a real Python
model's process reporting its own cores."""
import concurrent.futures
import os
import shutil

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, launch, link_models

# Each answer says which process ran it and on which cores.
WHERE = '''
import os
import numpy as np

def infer(inputs):
    n = inputs["x"].shape[0]
    cores = sorted(os.sched_getaffinity(0))
    mask = sum(1 << c for c in cores)
    return {"pid": np.full((n, 1), os.getpid(), np.int64),
            "cores": np.full((n, 1), mask, np.int64)}
'''

CORES = sorted(os.sched_getaffinity(0))
FIRST, LAST = CORES[0], CORES[-1]


def threads(pid):
    """Each thread of `pid`: (name, cores it may run on)."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            name = open(f"/proc/{pid}/task/{task}/comm").read().strip()
            status = open(f"/proc/{pid}/task/{task}/status").read()
        except FileNotFoundError:
            continue
        allowed = next(l.split(":", 1)[1].strip() for l in status.splitlines()
                       if l.startswith("Cpus_allowed_list"))
        out.append((name, allowed))
    return out


@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    repo = tmp_path_factory.mktemp("pinned")
    (repo / "where").mkdir()
    (repo / "where" / "model.py").write_text(WHERE)
    (repo / "where" / "config.yaml").write_text(
        "inputs: [{name: x, data_type: FP32, dims: [1]}]\n"
        "outputs: [{name: pid, data_type: INT64, dims: [1]}, {name: cores, data_type: INT64, dims: [1]}]\n"
        f"preload: true\ninstances: 2\ninstance_cpus: ['{LAST}', '{FIRST}-{LAST}']\n")
    link_models(repo, ["mlp"])
    (repo / "mlp" / "config.yaml").write_text(
        (ROOT / "model_repository" / "mlp" / "config.yaml").read_text()
        + f"preload: true\ninstances: 1\ninstance_cpus: [{LAST}]\n")
    proc, server = launch(repo, "--io-cpus", str(FIRST), "--model-control-mode", "explicit")
    yield proc, server
    proc.terminate()
    proc.wait(timeout=10)


def test_instance_threads_run_on_their_cores_and_the_server_threads_on_io_cpus(pinned):
    proc, _ = pinned
    seen = threads(proc.pid)
    io = [allowed for name, allowed in seen if name.startswith("sheaf-io")]
    assert io and all(a == str(FIRST) for a in io), seen
    # The ONNX instance and the first Python instance on the last core; the second on all.
    assert ("sheaf-mlp@cpu-0", str(LAST)) in seen, seen
    assert ("sheaf-where@cpu", str(LAST)) in seen, seen
    everything = f"{FIRST}-{LAST}" if FIRST != LAST else str(FIRST)
    assert ("sheaf-where@cpu", everything) in seen, seen


def test_a_python_instance_process_runs_on_its_instance_cores(pinned):
    _, server = pinned

    def some(_):
        client = httpclient.InferenceServerClient(server.http)
        seen = set()
        for i in range(25):
            x = httpclient.InferInput("x", [1, 1], "FP32")
            x.set_data_from_numpy(np.full((1, 1), i, np.float32))
            result = client.infer("where", [x])
            seen.add((int(result.as_numpy("pid")[0, 0]), int(result.as_numpy("cores")[0, 0])))
        return seen

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = set().union(*pool.map(some, range(16)))
    masks = {cores for _, cores in answers}
    assert 1 << LAST in masks, answers
    assert sum(1 << c for c in range(FIRST, LAST + 1)) in masks, answers
    # One process per instance, each always on the same cores.
    assert len({pid for pid, _ in answers}) == len(answers) == 2, answers


def test_cores_an_instance_cannot_have_fail_its_load_with_the_reason(pinned):
    _, server = pinned
    repo = server.repo
    shutil.copytree(repo / "where", repo / "nowhere")
    (repo / "nowhere" / "config.yaml").write_text(
        (repo / "where" / "config.yaml").read_text().replace(
            f"instance_cpus: ['{LAST}', '{FIRST}-{LAST}']", "instance_cpus: [1000, 1001]"))
    client = httpclient.InferenceServerClient(server.http)
    with pytest.raises(InferenceServerException) as e:
        client.load_model("nowhere")
    assert "instance_cpus: cannot run on cores 1000" in str(e.value), e.value
    (repo / "nowhere" / "config.yaml").write_text(
        (repo / "where" / "config.yaml").read_text().replace(
            f"instance_cpus: ['{LAST}', '{FIRST}-{LAST}']", "instance_cpus: [0]"))
    with pytest.raises(InferenceServerException) as e:
        client.load_model("nowhere")
    assert "instance_cpus lists cores for 1 instance(s) but the model has 2" in str(e.value)
    # The server is up and its models still answer.
    assert client.is_server_ready()
    assert client.is_model_ready("where") and client.is_model_ready("mlp")


def test_io_cpus_that_are_not_a_list_stop_the_server_with_the_reason():
    import subprocess
    binary = os.environ.get("SHEAF_BIN", str(ROOT / "target" / "debug" / "sheaf"))
    done = subprocess.run([binary, "serve", "--io-cpus", "3-1", "--http-port", "0"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert "the range 3-1 runs backwards" in done.stderr, done.stderr
