"""Python models (`model.py`) served by the real `sheaf` binary, driven by NVIDIA's tritonclient.

The models are in tests/python_models/: Triton's add_sub example with its config.pbtxt, a model
on sheaf's batched API, a model that fails on purpose in every way a process can, one that
does not import, and one that answers with requests of its own to other models (BLS). Every model runs in a real interpreter (the project's .venv) with real NumPy;
answers are checked against NumPy in this process.
"""
import concurrent.futures
import json
import os
import queue
import re
import shutil
import signal
import threading
import time
import urllib.request

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, binary, events, infer_scalar, launch, link_models, open_events, start
from conftest import runner_pids as shared_runner_pids

FIXTURES = ROOT / "tests" / "python_models"

# A pipeline: Python pre-processing -> the ONNX MLP -> Python post-processing.
PREP = '''
import numpy as np

def infer(inputs):
    return {"features": inputs["raw"].astype(np.float32) / 100.0}
'''
POST = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "logits").as_numpy()
            top = np.argmax(logits, axis=1).astype(np.int64)[:, None]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("top", top)]))
        return responses
'''
PIPELINE = """inputs: [raw]
steps:
  - model: prep
    inputs: {raw: raw}
    outputs: {features: features}
  - model: mlp
    inputs: {input: features}
    outputs: {output: logits}
  - model: post
    inputs: {logits: logits}
    outputs: {top: top}
outputs: [top]
"""
# A streaming pipeline: Python pre-processing -> the decoupled countdown -> a Python model on
# each of its responses.
TWICE = '''
import numpy as np

def infer(inputs):
    return {"n": np.rint(inputs["x"] * 2).astype(np.int32)}
'''
SQUARED = '''
def infer(inputs):
    return {"sq": inputs["left"] * inputs["left"]}
'''
COUNTING = """inputs: [x]
steps:
  - model: twice
  - model: countdown
    inputs: {N: n}
    outputs: {LEFT: left, WORD: word}
  - model: squared
outputs: [left, sq, word]
"""
# The countdown twice over: one model step of a pipeline may stream.
TWO_STREAMS = """inputs: [N]
steps:
  - model: countdown
    outputs: {LEFT: N}
  - model: countdown
outputs: [LEFT]
"""
# A model that grows as it serves: its first batch allocates 256 MiB that it keeps (as a
# framework's caching allocator does).
HOARDER = '''
import numpy as np

KEPT = []

def infer(inputs):
    if not KEPT:
        KEPT.append(np.ones(32 << 20, np.float64))
    return {"y": inputs["x"] + 1.0}
'''


_local = threading.local()


def own_client(module, url):
    """A client of this thread's own: tritonclient's HTTP client must not cross threads."""
    key = (module.__name__, url)
    clients = _local.__dict__.setdefault("clients", {})
    if key not in clients:
        clients[key] = module.InferenceServerClient(url)
    return clients[key]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("python-repo")
    for name in ("add_sub", "doubler", "faulty", "broken", "words", "autocomplete", "countdown",
                 "scripted", "summed", "gate", "relay", "interop", "async_bls", "ticker",
                 "slow_start", "sender", "loader", "impatient", "baton", "async_baton", "flood", "later",
                 "canceller"):
        shutil.copytree(FIXTURES / name, repo / name)
    # baton with an execution timeout of 1 s, which its streams count against.
    shutil.copytree(FIXTURES / "baton" / "1", repo / "baton_hurried")
    (repo / "baton_hurried" / "config.yaml").write_text(
        "inputs: [{name: WAIT_MS, data_type: INT32, dims: [1]}]\n"
        "outputs: [{name: SEEN, data_type: INT32, dims: [3]}]\n"
        "max_batch_size: 0\ninstances: 1\nexecution_timeout_ms: 1000\n")
    # ticker with the same timeout: it sends a response every 20 ms for as long as it streams.
    shutil.copytree(FIXTURES / "ticker" / "1", repo / "ticker_hurried")
    (repo / "ticker_hurried" / "config.yaml").write_text(
        "inputs: [{name: PATH, data_type: BYTES, dims: [1]}]\n"
        "outputs: [{name: TICK, data_type: INT32, dims: [1]}]\n"
        "max_batch_size: 8\nexecution_timeout_ms: 1000\n")
    marker = repo / "unloaded.txt"
    config = repo / "doubler" / "config.yaml"
    config.write_text(config.read_text().replace(
        'parameters: {factor: "2.5"}', f"parameters: {{factor: '2.5', marker: '{marker}'}}"))
    # The same model under a configuration that batches it as sequences: its
    # set_dynamic_batching() is refused, as under Triton.
    shutil.copytree(FIXTURES / "autocomplete" / "1", repo / "sequenced" / "1")
    (repo / "sequenced" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 8\nsequence_batching { }\n')
    # Triton's auto-complete examples come with no configuration file at all.
    shutil.copytree(FIXTURES / "autocomplete" / "1", repo / "bare" / "1")
    link_models(repo, ["mlp"])
    digits = ROOT / "model_repository" / "digits"
    assert (digits / "estimator.pkl").is_file(), "run scripts/setup.sh"
    shutil.copytree(digits, repo / "digits")
    # The digits model on an interpreter that cannot import NumPy (Python without its site
    # packages): the runner fails before it can answer, and says why only on stderr.
    shutil.copytree(digits, repo / "no_numpy")
    bare = tmp_path_factory.mktemp("bin") / "python-without-site"
    bare.write_text(f'#!/bin/sh\nexec {ROOT / ".venv" / "bin" / "python"} -S "$@"\n')
    bare.chmod(0o755)
    with open(repo / "no_numpy" / "config.yaml", "a") as f:
        f.write(f"python: {bare}\n")
    (repo / "prep").mkdir()
    (repo / "prep" / "model.py").write_text(PREP)
    (repo / "prep" / "config.yaml").write_text(
        "inputs: [{name: raw, data_type: INT64, dims: [512]}]\n"
        "outputs: [{name: features, data_type: FP32, dims: [512]}]\n")
    (repo / "post" / "1").mkdir(parents=True)
    (repo / "post" / "1" / "model.py").write_text(POST)
    (repo / "post" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 64\ndynamic_batching {}\n'
        'input [ { name: "logits" data_type: TYPE_FP32 dims: [ 10 ] } ]\n'
        'output [ { name: "top" data_type: TYPE_INT64 dims: [ 1 ] } ]\n')
    (repo / "classes").mkdir()
    (repo / "classes" / "pipeline.yaml").write_text(PIPELINE)
    for name, code, config in (
            ("twice", TWICE, "inputs: [{name: x, data_type: FP32, dims: [1]}]\n"
                             "outputs: [{name: n, data_type: INT32, dims: [1]}]\n"),
            ("squared", SQUARED, "inputs: [{name: left, data_type: INT32, dims: [1]}]\n"
                                 "outputs: [{name: sq, data_type: INT32, dims: [1]}]\n"),
            ("hoarder", HOARDER, "inputs: [{name: x, data_type: FP32, dims: [1]}]\n"
                                 "outputs: [{name: y, data_type: FP32, dims: [1]}]\n")):
        (repo / name).mkdir()
        (repo / name / "model.py").write_text(code)
        (repo / name / "config.yaml").write_text(config)
    for name, text in (("counting", COUNTING), ("two_streams", TWO_STREAMS)):
        (repo / name).mkdir()
        (repo / name / "pipeline.yaml").write_text(text)
    return repo


@pytest.fixture(scope="module")
def server(repo):
    yield from start(repo)


def add_sub_inputs(module, a, b):
    inputs = [module.InferInput("INPUT0", list(a.shape), "FP32"),
              module.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_triton_python_model_serves_unchanged_and_batches_requests(server, protocol):
    module = httpclient if protocol == "http" else grpcclient
    url = server.http if protocol == "http" else server.grpc
    client = own_client(module, url)
    meta = client.get_model_metadata("add_sub")
    platform = meta["platform"] if protocol == "http" else meta.platform
    assert platform == "python"
    before = stats(server, "add_sub")
    rng = np.random.default_rng(7)
    pairs = [(rng.random((1, 4), dtype=np.float32), rng.random((1, 4), dtype=np.float32))
             for _ in range(64)]

    def one(pair):
        a, b = pair
        result = own_client(module, url).infer("add_sub", add_sub_inputs(module, a, b))
        return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, pairs))
    for (a, b), (plus, minus) in zip(pairs, answers):
        np.testing.assert_array_equal(plus, a + b)
        np.testing.assert_array_equal(minus, a - b)
    after = stats(server, "add_sub")
    requests = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert requests == 64
    assert executions < requests, f"{executions} executions for {requests} requests"


def test_an_error_response_fails_that_request_alone(server):
    client = httpclient.InferenceServerClient(server.http, concurrency=8)
    good = np.ones((1, 4), np.float32)
    bad = -np.ones((1, 4), np.float32)
    pending = [client.async_infer("add_sub", add_sub_inputs(httpclient, x, good))
               for x in [good, bad, good, bad, good, good]]
    outcomes = []
    for p in pending:
        try:
            outcomes.append(p.get_result().as_numpy("OUTPUT0"))
        except InferenceServerException as e:
            outcomes.append(e)
    for x, outcome in zip([good, bad, good, bad, good, good], outcomes):
        if x is bad:
            assert isinstance(outcome, InferenceServerException)
            assert "must not start with a negative number" in outcome.message()
        else:
            np.testing.assert_array_equal(outcome, good + good)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_batched_api_gets_one_concatenated_batch(server, protocol):
    module = httpclient if protocol == "http" else grpcclient
    url = server.http if protocol == "http" else server.grpc
    xs = [np.arange(3 * n, dtype=np.float32).reshape(n, 3) + n for n in (1, 2, 3, 1, 2, 1, 1, 3)]

    def one(x):
        i = module.InferInput("x", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        r = own_client(module, url).infer("doubler", [i])
        return r.as_numpy("y"), r.as_numpy("batch")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, xs))
    for x, (y, batch) in zip(xs, answers):
        np.testing.assert_array_equal(y, x * np.float32(2.5))
        assert batch.shape == (x.shape[0], 1)
    # Items of several requests ran in one call of infer().
    assert max(int(b.max()) for _, b in answers) > 3


def faulty(client, what):
    i = httpclient.InferInput("X", [1, 1], "INT64")
    i.set_data_from_numpy(np.array([[what]], np.int64))
    return client.infer("faulty", [i])


def runner_pids(server, model):
    """The live processes running `model`'s model.py for this server's repository."""
    return shared_runner_pids(server.repo / model / "model.py")


def faulty_here(server, what):
    """`faulty` with this thread's own client."""
    return faulty(own_client(httpclient, server.http), what)


@pytest.mark.parametrize("what,says", [
    (1, "ValueError: the model cannot take 1"),
    (4, "output 'Y': the model returned FP64; it declares INT64"),
    (5, "output 'Y' of shape [1, 2]"),
    (6, "the model returned no output 'Y'"),
])
def test_model_errors_are_named_and_the_model_keeps_serving(server, what, says):
    client = httpclient.InferenceServerClient(server.http)
    with pytest.raises(InferenceServerException) as e:
        faulty(client, what)
    assert says in e.value.message()
    assert e.value.status() == "500"
    assert faulty(client, 0).as_numpy("Y")[0, 0] == 0


@pytest.mark.parametrize("what,says", [(2, "exit status: 3"), (3, "execution timeout (1500 ms)")])
def test_a_process_that_dies_or_hangs_fails_its_batch_and_comes_back(server, what, says):
    client = httpclient.InferenceServerClient(server.http)
    with pytest.raises(InferenceServerException) as e:
        faulty(client, what)
    assert "Python process" in e.value.message() and says in e.value.message()
    # The lost process is started again at once, before any request asks for it.
    deadline = time.monotonic() + 30
    while len(runner_pids(server, "faulty")) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(runner_pids(server, "faulty")) == 2
    # Every later request is answered.
    for k in range(6):
        assert faulty(client, 0).as_numpy("Y")[0, 0] == 0
    assert client.is_server_live()


def test_killing_a_process_under_load_keeps_the_server_and_the_other_instance(server):
    client = httpclient.InferenceServerClient(server.http)
    pids = set()
    while len(pids) < 2:  # both instances seen
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            pids |= {int(r.as_numpy("PID")[0, 0]) for r in pool.map(lambda _: faulty_here(server, 0), range(16))}
    victim = min(pids)
    outcomes = []
    stop = time.monotonic() + 3.0

    def load():
        mine = []
        while time.monotonic() < stop:
            try:
                r = faulty_here(server, 0)
                mine.append(("ok", int(r.as_numpy("Y")[0, 0]), int(r.as_numpy("PID")[0, 0])))
            except InferenceServerException as e:
                mine.append(("error", e.message(), None))
        return mine

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(load) for _ in range(8)]
        time.sleep(1.0)
        os.kill(victim, signal.SIGKILL)
        for f in futures:
            outcomes.extend(f.result())
    errors = [o for o in outcomes if o[0] == "error"]
    answered = [o for o in outcomes if o[0] == "ok"]
    assert all(o[1] == 0 for o in answered)
    assert all("Python process" in o[1] for o in errors), errors[:3]
    assert len(errors) <= 8, f"only the killed process's batch fails: {len(errors)} errors"
    # The other instance kept answering after the kill, and the killed one came back.
    after = set()
    deadline = time.monotonic() + 30
    while not (after - pids) and time.monotonic() < deadline:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            after |= {int(r.as_numpy("PID")[0, 0]) for r in pool.map(lambda _: faulty_here(server, 0), range(16))}
    assert after - pids, f"no new process: {after}"
    assert client.is_server_ready()


def test_a_model_that_fails_to_import_is_a_clear_load_error_and_the_server_serves(server):
    client = httpclient.InferenceServerClient(server.http)
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["broken"]["state"] == "UNAVAILABLE"
    assert "No module named 'a_module_that_does_not_exist'" in index["broken"]["reason"]
    assert "ModuleNotFoundError" in index["broken"]["reason"]
    assert client.is_model_ready("add_sub")


def test_auto_complete_cannot_set_dynamic_batching_beside_sequence_batching(server):
    client = httpclient.InferenceServerClient(server.http)
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["sequenced"]["state"] == "UNAVAILABLE"
    assert ("the configuration schedules the model with sequence_batching, so the model cannot "
            "set dynamic_batching" in index["sequenced"]["reason"]), index["sequenced"]["reason"]
    assert client.is_model_ready("autocomplete")


def test_a_server_without_onnx_runtime_serves_python_models_and_says_what_onnx_ones_lack(tmp_path):
    """A Python model needs no ONNX Runtime: with none named and no .venv above the binary or
    the working directory, the server starts, warns, serves the digits demo, and the ONNX model
    is UNAVAILABLE with the reason and how to fix it."""
    import pickle
    alone = tmp_path / "sheaf"
    try:
        os.link(binary(), alone)
    except OSError:
        shutil.copy2(binary(), alone)
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(ROOT / "model_repository" / "digits", repo / "digits")
    link_models(repo, ["mlp"])
    env = {k: v for k, v in os.environ.items() if k not in ("ORT_DYLIB_PATH", "SHEAF_ONNXRUNTIME_LIB")}
    proc, server = launch(repo, "--python", str(ROOT / ".venv" / "bin" / "python"),
                          program=str(alone), cwd=tmp_path, env=env)
    try:
        assert any("ONNX models will not load" in line and "WARN" in line for line in server.log), server.log
        client = httpclient.InferenceServerClient(server.http)
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert index["digits"]["state"] == "READY", index
        assert index["mlp"]["state"] == "UNAVAILABLE", index
        assert "ONNX Runtime is not loaded" in index["mlp"]["reason"]
        assert "scripts/setup.sh" in index["mlp"]["reason"]
        from sklearn.datasets import load_digits
        pixels = (load_digits().data[:5] / 16.0).astype(np.float32)
        i = httpclient.InferInput("pixels", list(pixels.shape), "FP32")
        i.set_data_from_numpy(pixels)
        labels = client.infer("digits", [i]).as_numpy("label")[:, 0]
        with open(ROOT / "model_repository" / "digits" / "estimator.pkl", "rb") as f:
            np.testing.assert_array_equal(labels, pickle.load(f).predict(pixels))
        with pytest.raises(InferenceServerException, match="ONNX Runtime is not loaded|not ready|unavailable"):
            client.infer("mlp", [httpclient.InferInput("features", [1, 512], "FP32").set_data_from_numpy(
                np.zeros((1, 512), np.float32))])
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    # A library that is named must load: the start fails with the reason.
    env["ORT_DYLIB_PATH"] = str(tmp_path / "no-such-library.so")
    with pytest.raises(RuntimeError, match="no-such-library.so"):
        launch(repo, program=str(alone), cwd=tmp_path, env=env)


def test_a_process_that_dies_before_it_answers_says_why_in_the_load_error(server):
    """An interpreter without NumPy: the process ends saying so on stderr, and the load error
    carries its last lines and its exit status (not a kill by the server)."""
    client = httpclient.InferenceServerClient(server.http)
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["no_numpy"]["state"] == "UNAVAILABLE", index["no_numpy"]
    reason = index["no_numpy"]["reason"]
    assert "was lost: it stopped; exit status: 1" in reason, reason
    assert "cannot import NumPy (No module named 'numpy')" in reason, reason
    assert "set `python:` in the model's config" in reason, reason
    assert client.is_model_ready("digits")


def test_a_pipeline_runs_python_steps_around_an_onnx_model(server):
    client = httpclient.InferenceServerClient(server.http, concurrency=8)
    rng = np.random.default_rng(3)
    raw = rng.integers(-100, 100, size=(6, 512), dtype=np.int64)
    i = httpclient.InferInput("raw", list(raw.shape), "INT64")
    i.set_data_from_numpy(raw)
    top = client.infer("classes", [i]).as_numpy("top")
    session = ort.InferenceSession(server.model_file("mlp"))
    logits = session.run(None, {session.get_inputs()[0].name: raw.astype(np.float32) / 100.0})[0]
    np.testing.assert_array_equal(top[:, 0], np.argmax(logits, axis=1))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_digits_demo_answers_as_its_estimator_does_in_process(server, protocol):
    import pickle
    from sklearn.datasets import load_digits
    module = httpclient if protocol == "http" else grpcclient
    url = server.http if protocol == "http" else server.grpc
    with open(ROOT / "model_repository" / "digits" / "estimator.pkl", "rb") as f:
        estimator = pickle.load(f)
    pixels = (load_digits().data[1500:1700] / 16.0).astype(np.float32)
    requests = [pixels[i:i + n] for i, n in zip(range(0, 200, 5), [1, 2, 3, 4, 5] * 8)]

    def one(x):
        i = module.InferInput("pixels", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        r = own_client(module, url).infer("digits", [i])
        return r.as_numpy("probabilities"), r.as_numpy("label")

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, requests))
    for x, (probabilities, label) in zip(requests, answers):
        expected = estimator.predict_proba(x).astype(np.float32)
        np.testing.assert_allclose(probabilities, expected, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(label[:, 0], estimator.predict(x))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bytes_go_in_and_come_out_as_numpy_object_arrays(server, protocol):
    module = httpclient if protocol == "http" else grpcclient
    url = server.http if protocol == "http" else server.grpc
    texts = [[b"sheaf"], ["caf\u00e9".encode()], [b""], [bytes(range(256))], [b"a" * 70000]]

    def one(text):
        i = module.InferInput("text", [1, 1], "BYTES")
        i.set_data_from_numpy(np.array([text], dtype=np.object_))
        r = own_client(module, url).infer("words", [i])
        return r.as_numpy("reversed"), r.as_numpy("length")

    with concurrent.futures.ThreadPoolExecutor(len(texts)) as pool:
        answers = list(pool.map(one, texts))
    for (text,), (reversed_, length) in zip(texts, answers):
        assert reversed_.shape == (1, 1) and reversed_[0, 0] == text[::-1]
        assert length[0, 0] == len(text)
    # Several items in one request, in JSON over HTTP.
    client = own_client(httpclient, server.http)
    i = httpclient.InferInput("text", [3, 1], "BYTES")
    i.set_data_from_numpy(np.array([[b"ab"], [b"cde"], [b"f"]], dtype=np.object_), binary_data=False)
    r = client.infer("words", [i])
    assert [x for x in r.as_numpy("reversed")[:, 0]] == [b"ba", b"edc", b"f"]
    np.testing.assert_array_equal(r.as_numpy("length")[:, 0], [2, 3, 1])


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo's two image pipelines and the models they run, as scripts/setup.sh leaves them
    (linked from the demo repository, without its other models to load)."""
    repo = tmp_path_factory.mktemp("demo")
    for name in ("classify", "classify_python", "preprocess", "efficientnet"):
        (repo / name).symlink_to(ROOT / "model_repository" / name)
    yield from start(repo)


def test_a_python_image_step_in_a_pipeline_classifies_as_the_built_in_one(demo):
    photos = sorted((ROOT / ".cache/test-images").glob("*.png"))
    assert photos, "run scripts/setup.sh --test for the test photographs"
    client = httpclient.InferenceServerClient(demo.http)

    def top(pipeline, photo):
        i = httpclient.InferInput("image", [1, 1], "BYTES")
        i.set_data_from_numpy(np.array([[photo.read_bytes()]], dtype=np.object_))
        classes = client.infer(pipeline, [i]).as_numpy("classes")
        return classes.reshape(-1)[0].decode().split(":")

    for photo in photos:
        python, built_in = top("classify_python", photo), top("classify", photo)
        assert python[1] == built_in[1], (photo.name, python, built_in)
        # The same resize (bilinear, in floating point, rounded once), so nearly the same logit.
        assert abs(float(python[0]) - float(built_in[0])) < 0.01, (python, built_in)
    # A file that is no image fails that request, as the client's error, with Pillow's reason.
    i = httpclient.InferInput("image", [1, 1], "BYTES")
    i.set_data_from_numpy(np.array([[b"not an image"]], dtype=np.object_))
    with pytest.raises(InferenceServerException) as e:
        client.infer("classify_python", [i])
    assert "cannot decode the image: not an image Pillow decodes" in e.value.message()
    assert e.value.status() == "400", e.value


def test_the_demo_pipelines_metadata_comes_from_their_steps_and_sheaf_bench_sends_them_images(
        demo):
    """Neither demo pipeline declares its tensors: its metadata and its configuration are read
    from its steps (the image input from the built-in image step, or from the Python step's
    config; the classes from the classify step), over HTTP and gRPC, and `sheaf bench --image`
    builds its requests from it."""
    import subprocess

    photo = sorted((ROOT / ".cache/test-images").glob("*.png"))[0]
    http = httpclient.InferenceServerClient(demo.http)
    grpc = grpcclient.InferenceServerClient(demo.grpc)
    for name, image in [("classify", [-1]), ("classify_python", [-1, 1])]:
        meta = http.get_model_metadata(name)
        assert meta["inputs"] == [{"name": "image", "datatype": "BYTES", "shape": image}], meta
        assert meta["outputs"] == [{"name": "classes", "datatype": "BYTES", "shape": [-1, 5]}]
        over_grpc = grpc.get_model_metadata(name)
        assert [(t.name, t.datatype, list(t.shape)) for t in over_grpc.inputs] == \
            [("image", "BYTES", image)]
        # Its configuration lists the same tensors (neither pipeline batches, so its dims are
        # the metadata's shapes), as Triton's clients read it to build requests.
        config = http.get_model_config(name)
        assert config["max_batch_size"] == 0, config
        assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == \
            [("image", "TYPE_STRING", image)], config
        assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == \
            [("classes", "TYPE_STRING", [-1, 5])], config
        config = grpc.get_model_config(name).config
        assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == \
            [("image", 13, image)], config
        assert [(t.name, list(t.dims)) for t in config.output] == [("classes", [-1, 5])]
        for protocol in (["--url", f"http://{demo.http}"],
                         ["--protocol", "grpc", "--url", f"http://{demo.grpc}",
                          "--http-url", f"http://{demo.http}"]):
            run = subprocess.run(
                [binary(), "bench", *protocol, "--model", name, "--image", str(photo),
                 "--classes", "5", "--items", "2", "--concurrency", "2", "--requests", "6"],
                capture_output=True, text=True, timeout=300)
            assert run.returncode == 0, run.stdout + run.stderr
            row = next(l for l in run.stdout.splitlines()
                       if l.strip().startswith("concurrency"))
            assert row.endswith(" 0"), (name, protocol, row)
    # Without an image to send, it says what the BYTES input needs.
    run = subprocess.run([binary(), "bench", "--url", f"http://{demo.http}", "--model", "classify",
                          "--requests", "2"], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "give --image FILE" in run.stderr, run.stderr


def test_a_model_s_configuration_says_it_streams_its_parameters_types_and_instances(server):
    """What Triton's clients read from a model's configuration to build their requests:
    whether it answers with a stream (perf_analyzer streams only to a decoupled model), its
    `parameters`, byte strings as `TYPE_STRING`, and where its instances run; over HTTP and
    gRPC alike."""
    http = httpclient.InferenceServerClient(server.http)
    grpc = grpcclient.InferenceServerClient(server.grpc)
    for name, decoupled in [("countdown", True), ("add_sub", False), ("doubler", False)]:
        assert http.get_model_config(name)["model_transaction_policy"] == \
            {"decoupled": decoupled}, name
        assert grpc.get_model_config(name).config.model_transaction_policy.decoupled == \
            decoupled, name
    config = http.get_model_config("doubler")
    assert config["parameters"]["factor"] == {"string_value": "2.5"}, config
    assert grpc.get_model_config("doubler").config.parameters["factor"].string_value == "2.5"
    # A BYTES tensor is Triton's TYPE_STRING (13), declared in config.yaml or config.pbtxt.
    for name, tensor in [("words", "text"), ("countdown", "WORD")]:
        config = http.get_model_config(name)
        declared = {t["name"]: t["data_type"] for t in config["input"] + config["output"]}
        assert declared[tensor] == "TYPE_STRING", config
        config = grpc.get_model_config(name).config
        declared = {t.name: t.data_type for t in list(config.input) + list(config.output)}
        assert declared[tensor] == 13, config
    # This machine's instances are on its CPU.
    groups = http.get_model_config("add_sub")["instance_group"]
    assert [g["kind"] for g in groups] == ["KIND_CPU"], groups
    assert [g.kind for g in grpc.get_model_config("add_sub").config.instance_group] == [2]


def test_a_decoupled_model_streams_its_responses_over_a_grpc_stream(server):
    got = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    counts = {"a": 3, "b": 4, "c": 1, "bad": -1}
    for request_id, n in counts.items():
        i = grpcclient.InferInput("N", [1, 1], "INT32")
        i.set_data_from_numpy(np.array([[n]], np.int32))
        client.async_stream_infer("countdown", [i], request_id=request_id,
                                  enable_empty_final_response=True)
    lefts = {k: [] for k in counts}
    finals, errors, words = set(), {}, set()
    # Every request's stream ends with the empty final response, the one answered with an
    # error included.
    while len(finals) < len(counts):
        result, error = got.get(timeout=30)
        if error is not None:
            errors[error.message()] = error
            continue
        response = result.get_response()
        if response.parameters["triton_final_response"].bool_param:
            finals.add(response.id)
            continue
        lefts[response.id].append(int(result.as_numpy("LEFT")[0, 0]))
        words.add(result.as_numpy("WORD")[0, 0])
    client.stop_stream()
    for request_id in ("a", "b", "c"):
        assert lefts[request_id] == list(range(counts[request_id], 0, -1)), lefts
    assert any("N must not be negative" in m for m in errors), errors
    # Requests of one stream were batched into one execute call.
    assert any(w != b"batch of 1" for w in words), words


def count(n):
    """The countdown's input: N = n."""
    return [{"name": "N", "shape": [1, 1], "datatype": "INT32", "data": [n]}]


def test_a_decoupled_model_streams_server_sent_events_over_http(server):
    got = events(server, "countdown", count(4))
    assert [e for e, _ in got] == ["message"] * 4
    lefts = [next(o for o in d["outputs"] if o["name"] == "LEFT")["data"] for _, d in got]
    assert lefts == [[4], [3], [2], [1]]
    words = {tuple(next(o for o in d["outputs"] if o["name"] == "WORD")["data"]) for _, d in got}
    assert all(w[0].startswith("batch of") for w in words)
    bad = events(server, "countdown", count(-1))
    assert bad == [("error", {"error": "inference failed: N must not be negative"})]


def test_a_decoupled_model_refuses_the_unary_route(server):
    client = httpclient.InferenceServerClient(server.http)
    i = httpclient.InferInput("N", [1, 1], "INT32")
    i.set_data_from_numpy(np.array([[2]], np.int32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("countdown", [i])
    assert e.value.status() == "400" and "stream" in e.value.message()


def test_a_pipeline_streams_the_responses_of_its_decoupled_model_step(server):
    # Over HTTP: x = 1.5 -> twice -> N = 3 -> countdown: 3, 2, 1 -> squared on each.
    got = events(server, "counting",
                 [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.5]}])
    assert [e for e, _ in got] == ["message"] * 3, got
    out = lambda d, name: next(o for o in d["outputs"] if o["name"] == name)["data"]
    assert [out(d, "left") for _, d in got] == [[3], [2], [1]]
    assert [out(d, "sq") for _, d in got] == [[9], [4], [1]]
    assert all(out(d, "word")[0].startswith("batch of") for _, d in got)
    assert all(d["model_name"] == "counting" for _, d in got)
    # Over a gRPC stream, several requests at once, each with Triton's empty final response.
    got = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    xs = {"a": 2.0, "b": 0.5, "c": 2.5}
    for request_id, x in xs.items():
        i = grpcclient.InferInput("x", [1, 1], "FP32")
        i.set_data_from_numpy(np.array([[x]], np.float32))
        client.async_stream_infer("counting", [i], request_id=request_id,
                                  enable_empty_final_response=True)
    squares, finals = {k: [] for k in xs}, set()
    while len(finals) < len(xs):
        result, error = got.get(timeout=30)
        assert error is None, error
        response = result.get_response()
        if response.parameters["triton_final_response"].bool_param:
            finals.add(response.id)
            continue
        assert response.model_name == "counting"
        squares[response.id].append(int(result.as_numpy("sq")[0, 0]))
    client.stop_stream()
    assert squares == {"a": [16, 9, 4, 1], "b": [1], "c": [25, 16, 9, 4, 1]}, squares
    # The unary route cannot carry a stream, and says how to ask for one.
    client = httpclient.InferenceServerClient(server.http)
    i = httpclient.InferInput("x", [1, 1], "FP32")
    i.set_data_from_numpy(np.array([[1.0]], np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("counting", [i])
    assert e.value.status() == "400", e.value
    assert "step 2 (model 'countdown')" in e.value.message()
    assert "text/event-stream" in e.value.message()


def test_only_one_model_step_of_a_pipeline_may_stream(server):
    status, body = events(server, "two_streams", count(2))
    assert status == 400
    assert "steps 1 and 2 both stream their responses" in body["error"], body


def test_a_pipeline_that_does_not_stream_answers_a_stream_request_once(server):
    # The Python pipeline (prep -> ONNX MLP -> post) on a gRPC stream and with SSE asked for.
    raw = np.arange(512, dtype=np.int64)[None, :] % 97
    i = grpcclient.InferInput("raw", [1, 512], "INT64")
    i.set_data_from_numpy(raw)
    got = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("classes", [i], request_id="one")
    result, error = got.get(timeout=30)
    assert error is None, error
    unary = grpcclient.InferenceServerClient(server.grpc).infer("classes", [i])
    assert result.as_numpy("top").tolist() == unary.as_numpy("top").tolist()
    client.stop_stream()
    assert got.empty()


def test_a_model_reads_the_responses_of_a_streaming_model_it_calls(server):
    # Triton's BLS with decoupled=True: countdown's responses, summed, over HTTP and gRPC, with
    # several requests at once (batched into one execute of `summed`).
    for module, url in ((httpclient, server.http), (grpcclient, server.grpc)):
        def one(n):
            i = module.InferInput("N", [1, 1], "INT32")
            i.set_data_from_numpy(np.array([[n]], np.int32))
            return own_client(module, url).infer("summed", [i])
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = dict(zip([3, 4, 1, -1], pool.map(one, [3, 4, 1, -1])))
        for n, result in results.items():
            assert int(result.as_numpy("COUNT")[0, 0]) == max(n, 0), n
            assert int(result.as_numpy("SUM")[0, 0]) == max(n, 0) * (max(n, 0) + 1) // 2, n
            # A model that answers once gives its answer, then the empty final response.
            assert int(result.as_numpy("ONCE")[0, 0]) == 2
            np.testing.assert_allclose(result.as_numpy("DOUBLED"), np.full((1, 3), 2.5 * n))
            error = result.as_numpy("ERROR")[0, 0]
            assert (b"N must not be negative" in error) == (n < 0), (n, error)


def path_input(path):
    """The KServe JSON inputs of `gate`, `relay` and `ticker`: PATH naming `path`."""
    return [{"name": "PATH", "shape": [1, 1], "datatype": "BYTES", "data": [str(path)]}]


def written(path, within=25):
    """What the model wrote to `path`, once it has (waiting up to `within` seconds)."""
    deadline = time.monotonic() + within
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.read_text()


def test_a_model_reads_each_response_of_a_streaming_model_as_it_comes(server, tmp_path):
    # `relay` passes on each response of `gate`, which sends its second response only once a
    # file exists. The client sees relay's first response before making the file: exec's
    # iterator yielded gate's first response while gate was still running.
    path = tmp_path / "open-sse"
    answer, data = open_events(server, "relay", path_input(path))
    with answer:
        first = next(data)
        assert not path.exists()
        assert first["outputs"][0]["data"] == [11], first
        path.touch()
        rest = list(data)
    assert [r["outputs"][0]["data"] for r in rest] == [[12]], rest
    # The same over a gRPC stream, with Triton's empty final response.
    path = tmp_path / "open-grpc"
    got = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        i = grpcclient.InferInput("PATH", [1, 1], "BYTES")
        i.set_data_from_numpy(np.array([[str(path).encode()]], np.object_))
        client.async_stream_infer("relay", [i], enable_empty_final_response=True)
        result, error = got.get(timeout=30)
        assert error is None and not path.exists()
        assert result.as_numpy("STEP").tolist() == [[11]]
        path.touch()
        result, error = got.get(timeout=30)
        assert error is None and result.as_numpy("STEP").tolist() == [[12]]
        result, error = got.get(timeout=30)
        final = result.get_response()
        assert error is None and final.parameters["triton_final_response"].bool_param
        assert not final.outputs
    finally:
        client.stop_stream()


def test_a_model_s_request_carries_its_id_and_timeout_and_its_answer_the_parameters(server, tmp_path):
    params = []

    def impatient(path, timeout_us):
        inputs = [httpclient.InferInput("PATH", [1], "BYTES"),
                  httpclient.InferInput("TIMEOUT_US", [1], "UINT64")]
        inputs[0].set_data_from_numpy(np.array([str(path).encode()], np.object_))
        inputs[1].set_data_from_numpy(np.array([timeout_us], np.uint64))
        answer = own_client(httpclient, server.http).infer("impatient", inputs)
        params.append(json.loads(answer.as_numpy("PARAMS")[0]))
        return answer.as_numpy("ID")[0], answer.as_numpy("GATE")[0].decode()

    # A client's request holds gate's one instance until `held` exists; the model's own request
    # to gate, with a timeout of 300 ms, waits behind it in the queue and times out there.
    held, free = tmp_path / "held", tmp_path / "free"
    free.touch()
    answer, data = open_events(server, "gate", path_input(held))
    with answer:
        assert next(data)["outputs"][0]["data"] == [1]
        seen, steps = impatient(free, 300_000)
        assert seen == b"asked-by-impatient"
        # The server's own account of the wait: at least the request's timeout.
        waited_us = re.search(r"timed out after (\d+) µs in the queue", steps)
        assert waited_us and int(waited_us.group(1)) >= 300_000, steps
        held.touch()
        assert [r["outputs"][0]["data"] for r in data] == [[2]]
    # Without the client's request in the way, the same timeout is met.
    seen, steps = impatient(free, 300_000)
    assert (seen, steps) == (b"asked-by-impatient", "1;2")
    # The answers the model got carried the parameters their models set: sender's, and each of
    # countdown's responses', then the empty final response's none.
    assert params[-1] == {
        "sender": {"batch": 1, "doubled": True, "scale": 2.0, "by": "sender"},
        "countdown": [{"left": 2, "last": False}, {"left": 1, "last": True}, {}]}, params


def test_dlpack_tensors_and_the_logger_work_as_under_triton(server):
    x = np.array([[1.5, -2.0, 3.25], [0.0, 7.0, -1.0]], np.float32)
    for module, url in ((httpclient, server.http), (grpcclient, server.grpc)):
        i = module.InferInput("X", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        answer = own_client(module, url).infer("interop", [i])
        np.testing.assert_array_equal(answer.as_numpy("SAME"), x)
        np.testing.assert_array_equal(answer.as_numpy("TWICE"), 2 * x)
        # Request rescheduling without an iterative configuration is refused with what to do,
        # and the model serves on.
        with pytest.raises(InferenceServerException) as refused:
            own_client(module, url).infer("interop", [i], parameters={"reschedule": True})
        assert "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE" in str(refused.value), refused.value
        assert "iterative_sequence: true" in str(refused.value), refused.value
    # pb_utils.Logger's lines reach the server's log at their level, without the mark.
    def logged():
        lines = [json.loads(l) for l in list(server.log) if "sheaf_python::model_output" in l]
        return {l["fields"]["message"]: l["level"] for l in lines
                if l["fields"]["message"].startswith("interop")}
    deadline = time.monotonic() + 10
    while "interop info line" not in logged() and time.monotonic() < deadline:
        time.sleep(0.1)
    levels = logged()
    assert levels["interop loaded as interop"] == "INFO", levels
    assert any(m.startswith("interop runs") and v == "WARN" for m, v in levels.items()), levels
    assert levels["interop error line"] == "ERROR", levels
    assert levels["interop info line"] == "INFO", levels
    # Verbose lines are debug: not in a log at the default level.
    assert "interop verbose line" not in levels, levels
    assert not any("\x1e" in m for m in levels), levels


def test_a_model_reads_the_parameters_the_client_sent(server):
    # Triton's request.parameters(): the request's parameters as JSON, less those sheaf reads
    # itself (priority, timeout, the sequence's).
    x = np.ones((1, 3), np.float32)
    sent = {"temperature": 0.5, "tag": "blue", "n": 3, "greedy": True}
    for module, url in ((httpclient, server.http), (grpcclient, server.grpc)):
        i = module.InferInput("X", [1, 3], "FP32")
        i.set_data_from_numpy(x)
        client = own_client(module, url)
        answer = client.infer("interop", [i], parameters=sent, priority=1)
        assert json.loads(answer.as_numpy("PARAMS")[0, 0]) == sent, module.__name__
        assert json.loads(client.infer("interop", [i]).as_numpy("PARAMS")[0, 0]) == {}
    # Requests batched into one execute keep their own parameters.
    def one(k):
        i = httpclient.InferInput("X", [1, 3], "FP32")
        i.set_data_from_numpy(x)
        answer = own_client(httpclient, server.http).infer("interop", [i], parameters={"k": k})
        return json.loads(answer.as_numpy("PARAMS")[0, 0])
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(one, range(16))) == [{"k": k} for k in range(16)]


def test_an_async_execute_awaits_the_requests_it_sends(server):
    # Triton's async BLS: `async def execute` gathers two async_exec() calls to `doubler`, then
    # asks `interop` with parameters of its own.
    x = np.array([[1.0, -2.0, 0.5], [4.0, 0.0, -1.0]], np.float32)
    for module, url in ((httpclient, server.http), (grpcclient, server.grpc)):
        def one(k):
            i = module.InferInput("x", [2, 3], "FP32")
            i.set_data_from_numpy(x * k)
            return own_client(module, url).infer("async_bls", [i])
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for k, answer in zip(range(1, 5), pool.map(one, range(1, 5))):
                np.testing.assert_allclose(answer.as_numpy("SUM"), 7.5 * x * k, rtol=1e-6)
                # The parameters a model's own request carries reach the model it calls.
                seen = [json.loads(p) for p in answer.as_numpy("PARAMS")[:, 0]]
                assert seen == [{"via": "bls", "k": 7}] * 2, seen


def test_a_streaming_model_sees_its_client_go(server, tmp_path):
    # `ticker` streams until is_cancelled(); the client reads three events and hangs up.
    path = tmp_path / "how-sse"
    answer, data = open_events(server, "ticker", path_input(path))
    ticks = [next(data)["outputs"][0]["data"][0] for _ in range(3)]
    assert ticks == [1, 2, 3]
    answer.close()
    assert written(path).startswith("cancelled after"), written(path)
    # The same over a gRPC stream the client stops.
    path = tmp_path / "how-grpc"
    got = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    i = grpcclient.InferInput("PATH", [1, 1], "BYTES")
    i.set_data_from_numpy(np.array([[str(path).encode()]], np.object_))
    client.async_stream_infer("ticker", [i])
    result, error = got.get(timeout=30)
    assert error is None and result.as_numpy("TICK").tolist() == [[1]]
    client.stop_stream(cancel_requests=True)
    assert written(path).startswith("cancelled after"), written(path)


def test_a_model_cancels_a_stream_it_began(server, tmp_path):
    # `canceller` reads three of `ticker`'s responses through exec(decoupled=True), then calls
    # cancel() on the iterator: ticker sees is_cancelled() and stops; the iterator gives what
    # had come, then an error response with the code CANCELLED, then ends.
    path = tmp_path / "how-bls"
    client = httpclient.InferenceServerClient(server.http)
    inputs = [httpclient.InferInput("PATH", [1], "BYTES"), httpclient.InferInput("READ", [1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([str(path).encode()], np.object_))
    inputs[1].set_data_from_numpy(np.array([3], np.int32))
    answer = client.infer("canceller", inputs)
    assert answer.as_numpy("TICKS").tolist() == [1, 2, 3]
    assert answer.as_numpy("CODE").tolist() == [7]  # pb_utils.TritonError.CANCELLED
    assert b"cancelled by the model that sent it" in answer.as_numpy("ERROR")[0]
    stopped = written(path)
    assert stopped.startswith("cancelled after"), stopped
    # Only the responses already on their way came after the cancel: ticker stopped at once.
    assert int(stopped.split()[-1]) < 3 + 50, stopped
    assert answer.as_numpy("AFTER")[0] <= int(stopped.split()[-1]) - 3
    # The model keeps serving: a second request streams and cancels the same way.
    path2 = tmp_path / "how-bls-2"
    inputs[0].set_data_from_numpy(np.array([str(path2).encode()], np.object_))
    inputs[1].set_data_from_numpy(np.array([1], np.int32))
    assert client.infer("canceller", inputs).as_numpy("TICKS").tolist() == [1]
    assert written(path2).startswith("cancelled after")


def baton(wait_ms):
    """baton's input: WAIT_MS = wait_ms."""
    return [{"name": "WAIT_MS", "shape": [1], "datatype": "INT32", "data": [wait_ms]}]


@pytest.mark.parametrize("model", ["baton", "async_baton"])
def test_a_decoupled_model_takes_its_next_request_while_an_earlier_one_streams(server, model):
    # baton's one instance answers each request from a thread of the model's own after
    # `execute` has returned, and the thread waits for a later `execute` call (async_baton: from
    # the coroutine of an `async def execute`). As under Triton, the instance takes the next
    # request while the first streams: the second request's `execute` begins, and ends, before
    # the first request does. The first request's input, read again at its end, is still its
    # own, though the second request's came after it.
    answer, data = open_events(server, model, baton(20_000))
    with answer:
        k, begun, wait_ms = next(data)["outputs"][0]["data"]
        assert (begun, wait_ms) == (k, 20_000)
        second = events(server, model, baton(0))
        assert [(e, d["outputs"][0]["data"]) for e, d in second] == \
            [("message", [k + 1, k + 1, 0])] * 2, second
        rest = [d["outputs"][0]["data"] for d in data]
    assert rest == [[k, k + 1, 20_000]], rest


def test_streams_open_after_execute_fail_when_the_process_dies_and_it_comes_back(server):
    answer, data = open_events(server, "baton", baton(20_000))
    with answer:
        next(data)
        (pid,) = runner_pids(server, "baton/1")
        os.kill(pid, signal.SIGKILL)
        rest = list(data)
    assert len(rest) == 1 and "Python process" in rest[0]["error"], rest
    # The next request starts the process again, and is answered.
    got = events(server, "baton", baton(0))
    assert [e for e, _ in got] == ["message"] * 2, got
    assert runner_pids(server, "baton/1") not in ([], [pid])


def test_a_stream_silent_for_the_execution_timeout_fails_and_the_process_comes_back(server):
    # baton_hurried's execution timeout is 1 s; after its first response its thread would wait
    # 20 s for another call.
    answer, data = open_events(server, "baton_hurried", baton(20_000))
    with answer:
        assert len(next(data)["outputs"][0]["data"]) == 3
        (pid,) = runner_pids(server, "baton_hurried")
        rest = list(data)
    assert len(rest) == 1, rest
    assert "went the model's execution timeout (1000 ms) without a response" in rest[0]["error"], rest
    got = events(server, "baton_hurried", baton(0))
    assert [e for e, _ in got] == ["message"] * 2, got
    assert pid not in runner_pids(server, "baton_hurried")


def test_a_stream_that_keeps_sending_outlasts_the_execution_timeout(server, tmp_path):
    # ticker_hurried's execution timeout is 1 s; 100 ticks, 20 ms apart, take 2 s at least.
    path = tmp_path / "outlasts"
    answer, data = open_events(server, "ticker_hurried", path_input(path))
    with answer:
        ticks = [next(data)["outputs"][0]["data"][0] for _ in range(100)]
    assert ticks == list(range(1, 101))
    assert written(path).startswith("cancelled after"), written(path)


def test_many_large_responses_from_two_threads_reach_the_client_whole(server):
    # flood's two threads each send 60 responses of 256 KiB (together 30 MiB, many times the
    # shared memory they pass through) at once, over a gRPC stream.
    got = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        inputs = [grpcclient.InferInput("COUNT", [1], "INT32"),
                  grpcclient.InferInput("SIZE", [1], "INT32")]
        inputs[0].set_data_from_numpy(np.array([60], np.int32))
        inputs[1].set_data_from_numpy(np.array([65536], np.int32))
        client.async_stream_infer("flood", inputs, enable_empty_final_response=True)
        seen = {1: [], 2: []}
        while True:
            result, error = got.get(timeout=60)
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            fill = result.as_numpy("FILL")
            assert fill.shape == (65536,) and (fill == fill[0]).all(), fill
            seen[int(fill[0]) // 1000].append(int(fill[0]) % 1000)
    finally:
        client.stop_stream()
    # Each thread's responses, whole and in the order it sent them.
    assert seen == {1: list(range(60)), 2: list(range(60))}, seen


def test_a_model_s_thread_sends_requests_of_its_own_after_execute_has_returned(server):
    # `later` answers from a thread that, once execute has returned, asks doubler (y = 2.5 x)
    # and streams countdown (N = 3: LEFT 3, 2, 1).
    x = [{"name": "X", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]
    for _ in range(2):
        got = events(server, "later", x)
        assert [(e, d["outputs"][0]["data"]) for e, d in got] == [
            ("message", [2.5, 5.0, 7.5]), ("message", [6.0, 3.0, 0.0])], got


def test_a_model_may_take_longer_to_load_than_its_execution_timeout(server):
    # slow_start imports for 1.5 s, with a 300 ms execution timeout: it loads, and answers.
    client = httpclient.InferenceServerClient(server.http)
    assert client.is_model_ready("slow_start")
    i = httpclient.InferInput("x", [1, 2], "FP32")
    i.set_data_from_numpy(np.array([[1.0, 2.0]], np.float32))
    np.testing.assert_array_equal(client.infer("slow_start", [i]).as_numpy("y"), [[2.0, 3.0]])


def test_auto_complete_config_declares_the_tensors_and_the_batch_size(server):
    client = httpclient.InferenceServerClient(server.http)
    meta = client.get_model_metadata("autocomplete")
    assert meta["inputs"] == [{"name": "IN", "datatype": "INT32", "shape": [-1, 2]}]
    assert meta["outputs"] == [{"name": "OUT", "datatype": "INT32", "shape": [-1, 2]},
                               {"name": "ID", "datatype": "BYTES", "shape": [-1, 1]},
                               {"name": "ASKED", "datatype": "BYTES", "shape": [-1, 1]}]
    x = np.array([[1, 2], [3, 4], [5, 6]], np.int32)
    i = httpclient.InferInput("IN", [3, 2], "INT32")
    i.set_data_from_numpy(x)
    answer = client.infer("autocomplete", [i], request_id="req-7")
    np.testing.assert_array_equal(answer.as_numpy("OUT"), x * 10)
    # The model saw the client's id as request.request_id(), over both protocols.
    assert list(answer.as_numpy("ID")[:, 0]) == [b"req-7"] * 3
    g = grpcclient.InferInput("IN", [1, 2], "INT32")
    g.set_data_from_numpy(x[:1])
    by_grpc = grpcclient.InferenceServerClient(server.grpc).infer("autocomplete", [g], request_id="g-1")
    assert by_grpc.as_numpy("ID")[0, 0] == b"g-1"
    # Past the batch size it declared: run in two executions, answered whole.
    big = httpclient.InferInput("IN", [9, 2], "INT32")
    big.set_data_from_numpy(np.zeros((9, 2), np.int32))
    np.testing.assert_array_equal(client.infer("autocomplete", [big]).as_numpy("OUT"), np.zeros((9, 2)))
    # Without an id, the model sees an empty one.
    assert client.infer("autocomplete", [i]).as_numpy("ID")[0, 0] == b""
    # request.requested_output_names(): what the client asked for, else every output.
    assert client.infer("autocomplete", [i]).as_numpy("ASKED")[0, 0] == b"OUT,ID,ASKED"
    for module, url, given in [(httpclient, server.http, i), (grpcclient, server.grpc, g)]:
        asked = [module.InferRequestedOutput("ASKED"), module.InferRequestedOutput("OUT")]
        answer = module.InferenceServerClient(url).infer("autocomplete", [given], outputs=asked)
        assert answer.as_numpy("ASKED")[0, 0] == b"ASKED,OUT"
        assert answer.as_numpy("ID") is None


def test_a_python_model_with_no_configuration_file_is_completed_by_the_model(server):
    client = httpclient.InferenceServerClient(server.http)
    meta = client.get_model_metadata("bare")
    assert meta["inputs"] == [{"name": "IN", "datatype": "INT32", "shape": [-1, 2]}]
    before = stats(server, "bare")
    x = np.arange(18, dtype=np.int32).reshape(9, 2)
    i = httpclient.InferInput("IN", [9, 2], "INT32")
    i.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer("bare", [i]).as_numpy("OUT"), x * 10)
    after = stats(server, "bare")
    # The batch size the model set (8), not a default: 9 items take two executions.
    assert after["inference_count"] - before["inference_count"] == 9
    assert after["execution_count"] - before["execution_count"] == 2


def sender_ask(module, url, x):
    answer = infer_scalar(module, url, "sender", "X", x)
    return float(answer.as_numpy("Y")[0, 0]), int(answer.as_numpy("BATCH")[0, 0])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_default_mode_model_answers_through_its_response_sender(server, protocol):
    module, url = (httpclient, server.http) if protocol == "http" else (grpcclient, server.grpc)
    xs = [float(x) for x in range(1, 17)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda x: sender_ask(module, url, x), xs))
    assert [y for y, _ in answers] == [2 * x for x in xs]
    assert max(b for _, b in answers) > 1, "requests shared an execute, and each got its own"
    with pytest.raises(InferenceServerException, match="one response per request"):
        sender_ask(module, url, 1000.0)
    assert sender_ask(module, url, 3.0)[0] == 6.0
    # An int64 answer for an INT32 output is narrowed when it fits (above), refused when not.
    with pytest.raises(InferenceServerException, match="returned INT64; it declares INT32"):
        sender_ask(module, url, 5000.0)


def test_a_model_s_response_parameters_reach_the_client(server):
    by_http = infer_scalar(httpclient, server.http, "sender", "X", 4.0)
    assert by_http.get_response()["parameters"] == {
        "batch": 1, "doubled": True, "scale": 2.0, "by": "sender"}
    p = infer_scalar(grpcclient, server.grpc, "sender", "X", 4.0).get_response().parameters
    assert (p["batch"].int64_param, p["doubled"].bool_param, p["scale"].double_param,
            p["by"].string_param) == (1, True, 2.0, "sender")
    # A model that sets none: no parameters in the answer.
    plain = httpclient.InferInput("X", [1, 3], "FP32")
    plain.set_data_from_numpy(np.ones((1, 3), np.float32))
    assert "parameters" not in httpclient.InferenceServerClient(server.http).infer(
        "interop", [plain]).get_response()
    # Each streamed response carries its own: as server-sent events, and on a gRPC stream
    # beside Triton's final-response flag.
    got = events(server, "countdown", [{"name": "N", "shape": [1, 1], "datatype": "INT32",
                                        "data": [3]}])
    assert [d.get("parameters") for _, d in got] == [
        {"left": 3, "last": False}, {"left": 2, "last": False}, {"left": 1, "last": True}]
    streamed = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    client.start_stream(callback=lambda result, error: streamed.put((result, error)))
    n = grpcclient.InferInput("N", [1, 1], "INT32")
    n.set_data_from_numpy(np.array([[2]], np.int32))
    client.async_stream_infer("countdown", [n], enable_empty_final_response=True)
    seen = []
    while True:
        result, error = streamed.get(timeout=30)
        assert error is None, error
        p = result.get_response().parameters
        if p["triton_final_response"].bool_param:
            break
        seen.append((p["left"].int64_param, p["last"].bool_param))
    client.stop_stream()
    assert seen == [(2, False), (1, True)]


def test_a_response_error_with_triton_s_code_gets_its_status(server):
    import urllib.error
    import urllib.request
    for x, status, code, says in ((-1, 400, "INVALID_ARGUMENT", "X must not be negative"),
                                  (-2, 503, "UNAVAILABLE", "warming up")):
        body = json.dumps({"inputs": [{"name": "X", "shape": [1, 1], "datatype": "FP32",
                                       "data": [x]}]}).encode()
        request = urllib.request.Request(f"http://{server.http}/v2/models/sender/infer",
                                         data=body, headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request)
        assert e.value.code == status
        assert says in json.loads(e.value.read())["error"]
        with pytest.raises(InferenceServerException) as e:
            sender_ask(grpcclient, server.grpc, x)
        assert e.value.status() == f"StatusCode.{code}" and says in e.value.message()
    # An error without a code stays the model's failure.
    client = httpclient.InferenceServerClient(server.http)
    a = np.array([[-1.0, 0, 0, 0]], np.float32)
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", add_sub_inputs(httpclient, a, a))
    assert e.value.status() == "500"


def test_python_models_show_in_stats_and_metrics(server):
    import urllib.request
    client = httpclient.InferenceServerClient(server.http)
    faulty(client, 0)
    assert stats(server, "faulty")["inference_count"] > 0
    metrics = urllib.request.urlopen(f"http://{server.metrics}/metrics").read().decode()
    assert 'model="faulty"' in metrics


def test_a_model_that_grows_as_it_serves_is_booked_at_what_it_holds(server):
    import urllib.request

    def lifecycle():
        url = f"http://{server.http}/v2/models/hoarder/stats"
        return json.loads(urllib.request.urlopen(url).read())["model_stats"][0]

    loaded = lifecycle()
    assert loaded["memory_source"] == "backend"
    client = httpclient.InferenceServerClient(server.http)
    x = httpclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[2.0]], np.float32))
    assert client.infer("hoarder", [x]).as_numpy("y").tolist() == [[3.0]]
    # Its process read what it holds after that first batch; the manager books it within a
    # second or two.
    for _ in range(100):
        now = lifecycle()
        if now["memory_source"] == "serving":
            break
        time.sleep(0.1)
    assert now["memory_source"] == "serving", now
    held = lambda s: sum(u["byte_size"] for u in s["memory_usage"])
    assert held(now) >= held(loaded) + (250 << 20), (loaded, now)


def stats(server, model):
    client = httpclient.InferenceServerClient(server.http)
    return client.get_inference_statistics(model)["model_stats"][0]


@pytest.fixture(scope="module")
def explicit(repo):
    yield from start(repo, "--model-control-mode", "explicit")


def test_unload_calls_finalize_and_ends_the_process_and_reload_serves(explicit, repo):
    client = httpclient.InferenceServerClient(explicit.http)
    marker = repo / "unloaded.txt"
    marker.unlink(missing_ok=True)
    x = np.ones((1, 3), np.float32)

    def ask():
        i = httpclient.InferInput("x", [1, 3], "FP32")
        i.set_data_from_numpy(x)
        return client.infer("doubler", [i]).as_numpy("y")

    client.load_model("doubler")
    np.testing.assert_array_equal(ask(), x * np.float32(2.5))
    client.unload_model("doubler")
    deadline = time.monotonic() + 10
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    line = marker.read_text().split()
    assert line[0] == "unloaded"
    pid = int(line[1])
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}"), "the process ended"
    with pytest.raises(InferenceServerException):
        ask()
    client.load_model("doubler")
    np.testing.assert_array_equal(ask(), x * np.float32(2.5))


def loader(url, op, name):
    inputs = [httpclient.InferInput("OP", [1], "INT32"), httpclient.InferInput("NAME", [1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([op], np.int32))
    inputs[1].set_data_from_numpy(np.array([name.encode()], np.object_))
    return bool(httpclient.InferenceServerClient(url).infer("loader", inputs).as_numpy("READY")[0])


def test_a_model_loads_and_unloads_the_models_it_needs(explicit):
    client = httpclient.InferenceServerClient(explicit.http)
    client.load_model("loader")
    client.unload_model("words")
    assert loader(explicit.http, 0, "words") is False
    assert loader(explicit.http, 1, "words") is True, "loaded, and ready once load_model returns"
    assert client.is_model_ready("words")
    assert loader(explicit.http, 2, "words") is False
    assert not client.is_model_ready("words")
    # From files of its own: it serves them until loaded again.
    assert loader(explicit.http, 3, "words") is True
    text = httpclient.InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"abc"]], dtype=np.object_))
    answer = client.infer("words", [text])
    assert answer.as_numpy("reversed")[0, 0] == b"cba" and answer.as_numpy("length")[0, 0] == -1
    with pytest.raises(InferenceServerException, match="files need a config too"):
        loader(explicit.http, 5, "words")
    # With a configuration of its own: it serves with it until loaded again.
    assert loader(explicit.http, 4, "words") is True
    assert client.get_model_config("words")["max_batch_size"] == 4
    client.load_model("words")
    assert client.get_model_config("words")["max_batch_size"] != 4
    with pytest.raises(InferenceServerException, match="missing"):
        loader(explicit.http, 1, "missing")


def test_the_model_loading_api_follows_the_control_mode(server):
    # The server of this module runs in the 'none' mode: every model is loaded and stays.
    assert loader(server.http, 0, "words") is True
    with pytest.raises(InferenceServerException, match="model control mode is 'none'"):
        loader(server.http, 2, "words")
    assert loader(server.http, 0, "words") is True


@pytest.fixture(scope="module")
def on_demand(repo):
    yield from start(repo, "--model-control-mode", "on_demand")


def streamed(url, model, inputs):
    """The responses of one request sent on a gRPC stream, up to its empty final response:
    (outputs by name, or None) and the error messages."""
    got = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer(model, inputs, enable_empty_final_response=True)
    answers, errors = [], []
    try:
        while True:
            result, error = got.get(timeout=60)
            if error is not None:
                errors.append(error.message())
                # A refusal is the request's only answer.
                if not answers:
                    break
                continue
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                break
            answers.append({o.name: result.as_numpy(o.name) for o in response.outputs})
    finally:
        client.stop_stream()
        client.close()
    return answers, errors


def test_a_stream_request_loads_its_streaming_model_on_demand(on_demand):
    http = httpclient.InferenceServerClient(on_demand.http)
    assert not http.is_model_ready("countdown")
    n = grpcclient.InferInput("N", [1, 1], "INT32")
    n.set_data_from_numpy(np.array([[3]], np.int32))
    answers, errors = streamed(on_demand.grpc, "countdown", [n])
    assert errors == [] and [int(a["LEFT"][0, 0]) for a in answers] == [3, 2, 1]
    # Each request on a stream counts one use of its model (what `lfu` eviction weighs).
    uses = lambda model: json.loads(urllib.request.urlopen(
        f"http://{on_demand.http}/stats").read())["models"][model]["usage_count"]
    before = uses("countdown")
    streamed(on_demand.grpc, "countdown", [n])
    assert uses("countdown") == before + 1
    x = grpcclient.InferInput("x", [1, 3], "FP32")
    x.set_data_from_numpy(np.ones((1, 3), np.float32))
    for expected in (1, 2):
        got = queue.Queue()
        client = grpcclient.InferenceServerClient(on_demand.grpc)
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer("doubler", [x])
        result, error = got.get(timeout=60)
        client.stop_stream()
        client.close()
        assert error is None and result.as_numpy("y")[0, 0] == 2.5
        assert uses("doubler") == expected
    # Over HTTP's server-sent events, after an unload.
    http.unload_model("countdown")
    got = events(on_demand, "countdown", count(2))
    assert [d["outputs"][0]["data"] for _, d in got] == [[2], [1]], got
    # A pipeline with a streaming step, none of its models loaded.
    http.unload_model("countdown")
    assert not http.is_model_ready("counting")
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[1.5]], np.float32))
    answers, errors = streamed(on_demand.grpc, "counting", [x])
    assert errors == [] and [int(a["sq"][0, 0]) for a in answers] == [9, 4, 1]


def test_sheaf_run_classifies_a_file_through_the_python_model(repo, tmp_path):
    import json
    import pickle
    import subprocess
    from sklearn.datasets import load_digits
    binary = os.environ.get("SHEAF_BIN", str(ROOT / "target" / "debug" / "sheaf"))
    pixels = (load_digits().data[:500] / 16.0).astype(np.float32)
    np.save(tmp_path / "pixels.npy", pixels)
    # The repository given relative to a working directory with no .venv above it: the
    # interpreter and ONNX Runtime come from the flags.
    library = next((ROOT / ".venv").glob("lib/python*/site-packages/onnxruntime/capi/libonnxruntime.so.*"))
    proc = subprocess.run(
        [binary, "run", "--model-repository", repo.name, "--model", "digits", "--input",
         str(tmp_path / "pixels.npy"), "--output", str(tmp_path / "out"), "--batch-size", "32",
         "--python", str(ROOT / ".venv" / "bin" / "python"), "--onnxruntime-lib", str(library)],
        capture_output=True, text=True, timeout=300, cwd=repo.parent)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["items"] == 500, summary
    with open(ROOT / "model_repository" / "digits" / "estimator.pkl", "rb") as f:
        estimator = pickle.load(f)
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "label.npy")[:, 0],
                                  estimator.predict(pixels))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_answers_with_requests_of_its_own_to_other_models(server, protocol):
    """Triton's business logic scripting: `InferenceRequest(...).exec()` inside `execute` runs
    the ONNX MLP and the `words` Python model through the server, and a request to a model that
    does not exist comes back as an error response the model can read."""
    module = httpclient if protocol == "http" else grpcclient
    url = server.http if protocol == "http" else server.grpc
    session = ort.InferenceSession(str(ROOT / "model_repository/mlp/1/model.onnx"))
    rng = np.random.default_rng(11)

    def ask(k, target="mlp"):
        features = rng.standard_normal((1, 512), dtype=np.float32)
        text = np.array([[f"bls-{k}".encode()]], dtype=np.object_)
        inputs = [module.InferInput("features", [1, 512], "FP32"),
                  module.InferInput("text", [1, 1], "BYTES"),
                  module.InferInput("target", [1, 1], "BYTES")]
        inputs[0].set_data_from_numpy(features)
        inputs[1].set_data_from_numpy(text)
        inputs[2].set_data_from_numpy(np.array([[target.encode()]], dtype=np.object_))
        result = own_client(module, url).infer("scripted", inputs)
        return features, k, result

    before = stats(server, "mlp")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(24)))
    for features, k, result in answers:
        np.testing.assert_allclose(result.as_numpy("logits"),
                                   session.run(None, {"input": features})[0],
                                   rtol=1e-4, atol=1e-5)
        assert result.as_numpy("reversed")[0, 0] == f"bls-{k}".encode()[::-1]
        assert result.as_numpy("error")[0, 0] == b""
    # Each request of the model's own was served by the MLP like any client's.
    assert stats(server, "mlp")["inference_count"] - before["inference_count"] == 24

    _, _, result = ask(99, target="no_such_model")
    message = result.as_numpy("error")[0, 0].decode()
    assert "no_such_model" in message, message
    assert not result.as_numpy("logits").any()
