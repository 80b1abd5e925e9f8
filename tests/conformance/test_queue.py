"""Many sheaf instances behind one real NATS JetStream queue (Debian's nats-server -js).

Workers serve a simulated model (sim, y = 2x + 1, with a fixed batch latency), real ONNX
models (mlp, and the stateful gru demo, whose sequences must each stay on one worker) and two Python models (the digits demo, and `words`: BYTES in and out); a gateway serves nothing itself and forwards every request to the queue. NVIDIA's
tritonclient talks to the gateway; nats-py talks to the queue directly, as any NATS client may.
"""
import asyncio
import json
import os
import signal
import subprocess
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import nats
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, events, launch, link_models

SIM = """input: {name: x, shape: [-1, 4]}
output: {name: y}
latency_ms: {a: 40, b: 1}
"""
SIM_CONFIG = "max_batch_size: 8\nmax_queue_delay_us: 2000\n"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("queue-repo")
    (repo / "sim").mkdir()
    (repo / "sim" / "model.sim.yaml").write_text(SIM)
    (repo / "sim" / "config.yaml").write_text(SIM_CONFIG)
    link_models(repo, ["mlp"])
    import shutil
    shutil.copytree(ROOT / "model_repository/digits", repo / "digits")
    shutil.copytree(ROOT / "tests/python_models/words", repo / "words")
    shutil.copytree(ROOT / "tests/python_models/countdown", repo / "countdown")
    shutil.copytree(ROOT / "tests/python_models/interop", repo / "interop")
    (repo / "gru" / "1").mkdir(parents=True)
    (repo / "gru" / "1" / "model.onnx").symlink_to(ROOT / "model_repository/gru/1/model.onnx")
    # A sequence stays open a minute between requests here, not the demo's 5 s: a test holds
    # one open while it starts another worker, which a busy machine takes seconds to do.
    config = (ROOT / "model_repository/gru/config.pbtxt").read_text()
    assert "max_sequence_idle_microseconds: 5000000" in config
    (repo / "gru" / "config.pbtxt").write_text(config.replace(
        "max_sequence_idle_microseconds: 5000000", "max_sequence_idle_microseconds: 60000000"))
    return repo


class Fleet:
    """Workers and gateways on one stream; everything started is killed at the end."""

    def __init__(self, url, repo):
        self.url, self.repo = url, repo
        self.stream = "T" + uuid.uuid4().hex[:8]
        self.procs = []

    def queue_args(self, *extra):
        return ["--queue", self.url, "--queue-stream", self.stream,
                "--queue-prefix", f"{self.stream.lower()}.infer", *extra]

    def worker(self, *extra):
        proc, server = launch(self.repo, *self.queue_args(*extra))
        self.procs.append(proc)
        return proc, server

    def gateway(self, *extra):
        proc, server = launch(None, *self.queue_args(*extra))
        self.procs.append(proc)
        return server

    def stop(self):
        for proc in self.procs:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def fleet(nats_url, repo):
    fleet = Fleet(nats_url, repo)
    yield fleet
    fleet.stop()


def sim_infer(client, values):
    x = httpclient.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(np.asarray(values, dtype=np.float32).reshape(1, 4), binary_data=True)
    return client.infer("sim", [x]).as_numpy("y")


def test_a_gateway_forwards_to_workers_and_answers_are_correct(fleet):
    for _ in range(3):
        fleet.worker("--queue-ack-wait", "5")
    gateway = fleet.gateway("--queue-timeout", "20")
    client = httpclient.InferenceServerClient(gateway.http)

    # The real ONNX model answers through the queue as onnxruntime does in-process.
    session = ort.InferenceSession(str(ROOT / "model_repository/mlp/1/model.onnx"))
    data = np.random.default_rng(7).standard_normal((3, 512), dtype=np.float32)
    expected = session.run(None, {"input": data})[0]
    for binary in (False, True):
        tensor = httpclient.InferInput("input", [3, 512], "FP32")
        tensor.set_data_from_numpy(data, binary_data=binary)
        out = httpclient.InferRequestedOutput("output", binary_data=binary)
        got = client.infer("mlp", [tensor], outputs=[out]).as_numpy("output")
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)

    np.testing.assert_array_equal(sim_infer(client, [1, 2, 3, 4]), [[3, 5, 7, 9]])

    # gRPC clients go through the gateway too.
    grpc = grpcclient.InferenceServerClient(gateway.grpc)
    tensor = grpcclient.InferInput("input", [3, 512], "FP32")
    tensor.set_data_from_numpy(data)
    got = grpc.infer("mlp", [tensor]).as_numpy("output")
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    bad = grpcclient.InferInput("x", [1, 3], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 3), np.float32))
    with pytest.raises(InferenceServerException) as refused:
        grpc.infer("sim", [bad])
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "shape" in refused.value.message()

    # A worker's refusal comes back as it is: status and message.
    bad = httpclient.InferInput("x", [1, 3], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 3), np.float32))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("sim", [bad])
    assert refused.value.status() == "400" and "shape" in refused.value.message()

    # Priority travels as a request parameter: a level the model does not have is refused.
    x = httpclient.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(np.zeros((1, 4), np.float32))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("sim", [x], priority=9)
    assert refused.value.status() == "400" and "priority 9" in refused.value.message()


def test_python_models_answer_through_the_queue(fleet):
    import pickle
    from sklearn.datasets import load_digits
    fleet.worker()
    gateway = fleet.gateway("--queue-timeout", "20")
    client = httpclient.InferenceServerClient(gateway.http)
    pixels = (load_digits().data[:16] / 16.0).astype(np.float32)
    x = httpclient.InferInput("pixels", list(pixels.shape), "FP32")
    x.set_data_from_numpy(pixels)
    labels = client.infer("digits", [x]).as_numpy("label")[:, 0]
    with open(ROOT / "model_repository/digits/estimator.pkl", "rb") as f:
        np.testing.assert_array_equal(labels, pickle.load(f).predict(pixels))
    text = httpclient.InferInput("text", [2, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"queue"], [b"\x00\xff"]], dtype=np.object_))
    out = client.infer("words", [text]).as_numpy("reversed")
    assert list(out[:, 0]) == [b"eueuq", b"\xff\x00"]


def test_headers_the_gateway_forwards_reach_the_model_on_a_worker(fleet):
    # The gateway's patterns pick the headers; the worker, started without any, adds them.
    fleet.worker()
    gateway = fleet.gateway("--queue-timeout", "20", "--http-header-forward-pattern", "^my_",
                            "--grpc-header-forward-pattern", "^my_")
    x = np.array([[1.0, 2.0, 3.0]], np.float32)
    for module, url in ((httpclient, gateway.http), (grpcclient, gateway.grpc)):
        i = module.InferInput("X", [1, 3], "FP32")
        i.set_data_from_numpy(x)
        answer = module.InferenceServerClient(url).infer(
            "interop", [i], headers={"my_tenant": "blue", "other": "x"},
            parameters={"body_parameter": 7})
        params = json.loads(answer.as_numpy("PARAMS")[0, 0])
        assert params == {"my_tenant": "blue", "body_parameter": 7}, params
        np.testing.assert_array_equal(answer.as_numpy("TWICE"), 2 * x)
    # A forwarded header that the body names too is refused, by the worker as by the gateway.
    i = httpclient.InferInput("X", [1, 3], "FP32")
    i.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as refused:
        httpclient.InferenceServerClient(gateway.http).infer(
            "interop", [i], headers={"my_key": "1"}, parameters={"my_key": 2})
    assert refused.value.status() == "400", refused.value
    assert "given by the request and by a forwarded header" in refused.value.message()


def test_a_streaming_model_streams_through_the_queue(fleet):
    fleet.worker()
    fleet.worker()
    gateway = fleet.gateway("--queue-timeout", "20")
    n = lambda v: [{"name": "N", "shape": [1, 1], "datatype": "INT32", "data": [v]}]
    # Each response is an event as the worker sends it; several streams at once.
    with ThreadPoolExecutor(4) as pool:
        streams = list(pool.map(lambda v: events(gateway, "countdown", n(v)), [4, 2, 5, 1]))
    for v, got in zip([4, 2, 5, 1], streams):
        assert [e for e, _ in got] == ["message"] * v, got
        lefts = [next(o for o in d["outputs"] if o["name"] == "LEFT")["data"] for _, d in got]
        assert lefts == [[k] for k in range(v, 0, -1)]
        assert all(d["model_name"] == "countdown" for _, d in got)
    # An error response ends the stream as an error event, as on one server.
    assert events(gateway, "countdown", n(-1)) == [
        ("error", {"error": "inference failed: N must not be negative"})]
    # A request the worker refuses before any response is a plain 400.
    status, body = events(gateway, "countdown", [
        {"name": "N", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]}])
    assert status == 400 and "shape" in body["error"], body
    # A model that answers once answers once, asked for a stream or not.
    status, body = events(gateway, "sim", [
        {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}])
    assert status == 200 and body["outputs"][0]["data"] == [3, 5, 7, 9], body
    # A gRPC stream through the gateway: two countdowns and a model that answers once, at once.
    import queue
    got = queue.Queue()
    stream = grpcclient.InferenceServerClient(gateway.grpc)
    stream.start_stream(callback=lambda result, error: got.put((result, error)))
    for request_id, v in (("a", 3), ("b", 2)):
        i = grpcclient.InferInput("N", [1, 1], "INT32")
        i.set_data_from_numpy(np.array([[v]], np.int32))
        stream.async_stream_infer("countdown", [i], request_id=request_id,
                                  enable_empty_final_response=True)
    x = grpcclient.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(np.array([[1, 2, 3, 4]], np.float32))
    stream.async_stream_infer("sim", [x], request_id="once")
    lefts, finals, once = {"a": [], "b": []}, set(), None
    while len(finals) < 2 or once is None:
        result, error = got.get(timeout=30)
        assert error is None, error
        response = result.get_response()
        if response.id == "once":
            once = result.as_numpy("y").tolist()
        elif response.parameters["triton_final_response"].bool_param:
            finals.add(response.id)
        else:
            lefts[response.id].append(int(result.as_numpy("LEFT")[0, 0]))
    stream.stop_stream()
    assert lefts == {"a": [3, 2, 1], "b": [2, 1]}, lefts
    assert once == [[3, 5, 7, 9]]
    # The unary route says how to ask for a stream.
    client = httpclient.InferenceServerClient(gateway.http)
    i = httpclient.InferInput("N", [1, 1], "INT32")
    i.set_data_from_numpy(np.array([[2]], np.int32))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("countdown", [i])
    assert refused.value.status() == "400" and "stream" in refused.value.message()


def test_a_model_no_worker_serves_times_out_at_the_gateway(fleet):
    gateway = fleet.gateway("--queue-timeout", "1")
    client = httpclient.InferenceServerClient(gateway.http)
    x = httpclient.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(np.zeros((1, 4), np.float32))
    started = time.time()
    with pytest.raises(InferenceServerException) as refused:
        client.infer("nobody_serves_this", [x])
    assert refused.value.status() == "504" and "no worker answered" in refused.value.message()
    assert time.time() - started < 10
    # A name that cannot be a subject is unknown at once.
    with pytest.raises(InferenceServerException) as refused:
        client.infer("not.a.subject", [x])
    assert refused.value.status() == "404"


def test_any_nats_client_can_send_requests_and_deadlines_are_kept(fleet):
    fleet.worker()
    subject = f"{fleet.stream.lower()}.infer.sim"

    async def ask(payload, **headers):
        nc = await nats.connect(fleet.url)
        js = nc.jetstream()
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await js.publish(subject, payload, headers={"Sheaf-Reply": inbox, **headers})
        msg = await sub.next_msg(timeout=20)
        await nc.close()
        return int(msg.headers["Sheaf-Status"]), msg

    body = json.dumps({"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32",
                                   "data": list(range(8))}]}).encode()
    status, msg = asyncio.run(ask(body))
    assert status == 200
    assert json.loads(msg.data)["outputs"][0]["data"] == [2 * v + 1 for v in range(8)]

    # The binary tensor extension, as over HTTP.
    header = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 16}}],
                         "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
    data = np.array([1, 2, 3, 4], np.float32).tobytes()
    status, msg = asyncio.run(ask(header + data, **{"Inference-Header-Content-Length": str(len(header))}))
    assert status == 200
    n = int(msg.headers["Inference-Header-Content-Length"])
    np.testing.assert_array_equal(np.frombuffer(msg.data[n:], np.float32), [3, 5, 7, 9])

    # A request whose deadline has passed is answered 504 and not run.
    past = str(int(time.time() * 1000) - 1000)
    status, msg = asyncio.run(ask(body, **{"Sheaf-Deadline": past}))
    assert status == 504 and "not run" in json.loads(msg.data)["error"]
    status, msg = asyncio.run(ask(body, **{"Sheaf-Deadline": "soon"}))
    assert status == 400


def bench(gateway, worker, seconds=4):
    """Closed-loop load on the sim model through the gateway; returns items/s."""
    binary = os.environ.get("SHEAF_BIN", str(ROOT / "target" / "debug" / "sheaf"))
    out = f"/tmp/sheaf-queue-bench-{uuid.uuid4().hex}.json"
    subprocess.run([binary, "bench", "--url", f"http://{gateway.http}", "--http-url",
                    f"http://{worker.http}", "--model", "sim", "--concurrency", "96",
                    "--duration", str(seconds), "--json", out],
                   check=True, capture_output=True)
    with open(out) as f:
        result = json.load(f)[0]
    os.unlink(out)
    assert result["errors"] == 0
    return result["items_per_s"]


def executions(server):
    """The batches the sim model has run on `server`."""
    return sum(s["execution_count"] for s in sim_stats(server))


def busy_seconds(server):
    """The time the sim model has spent running batches on `server` (per batch, not per request)."""
    return sum(b["compute_infer"]["ns"] for s in sim_stats(server) for b in s["batch_stats"]) / 1e9


def sim_stats(server):
    with urllib.request.urlopen(f"http://{server.http}/v2/models/sim/stats") as r:
        return json.load(r)["model_stats"]


def test_three_workers_share_the_load_and_run_at_once(fleet):
    # What three workers buy in items/s is measured by bench/queue.sh (bench/RESULTS.md); a
    # test holds no wall-clock threshold. It checks what that number rests on: every worker
    # takes a share of the queue, and their batches run at the same time.
    workers = [fleet.worker()[1] for _ in range(3)]
    gateway = fleet.gateway()
    # A worker is ready before its first pull from the queue: short loads until each of the
    # three has run batches in the last one, so that all three are pulling when the measured
    # one starts.
    deadline = time.monotonic() + 60
    while True:
        before = [executions(w) for w in workers]
        bench(gateway, workers[0], seconds=1)
        after = [executions(w) for w in workers]
        if all(a > b for a, b in zip(after, before)):
            break
        assert time.monotonic() < deadline, f"not every worker pulls: {before} -> {after}"
    ran_before = [executions(w) for w in workers]
    busy_before = [busy_seconds(w) for w in workers]
    started = time.monotonic()
    bench(gateway, workers[0])
    elapsed = time.monotonic() - started
    ran = [executions(w) - b for w, b in zip(workers, ran_before)]
    busy = [busy_seconds(w) - b for w, b in zip(workers, busy_before)]
    print(f"batches per worker {ran}, busy {[f'{b:.2f}' for b in busy]} s in {elapsed:.2f} s")
    # Each worker ran at least half of an even share of the batches.
    assert min(ran) * 6 >= sum(ran), ran
    # The workers were busy for longer, together, than the load lasted: their batches overlapped.
    assert sum(busy) > elapsed, (busy, elapsed)


def test_a_worker_killed_mid_batch_loses_no_request(fleet):
    victim, victim_server = fleet.worker("--queue-ack-wait", "2")
    fleet.worker("--queue-ack-wait", "2")
    fleet.worker("--queue-ack-wait", "2")
    gateway = fleet.gateway("--queue-timeout", "30")

    # 48 clients send requests one after another from before the kill until well after the
    # killed worker's requests are due again (the 2 s ack wait): the worker holds some when it
    # dies, however fast the others answer.
    numbers = iter(range(10**9))
    stop = [time.monotonic() + 60.0]

    def client_loop():
        client = httpclient.InferenceServerClient(gateway.http)
        done = []
        while time.monotonic() < stop[0]:
            i = next(numbers)
            started = time.monotonic()
            y = sim_infer(client, [i, i + 1, i + 2, i + 3])
            done.append((i, y, time.monotonic() - started))
        return done

    with ThreadPoolExecutor(48) as pool:
        futures = [pool.submit(client_loop) for _ in range(48)]
        # A worker is ready before its first pull from the queue: the victim dies once it has
        # run batches, so that it is pulling (after a fixed second, one CI run saw no request
        # wait out the ack wait).
        deadline = time.monotonic() + 30
        while executions(victim_server) == 0:
            assert time.monotonic() < deadline, "the victim never pulled from the queue"
            time.sleep(0.05)
        victim.send_signal(signal.SIGKILL)
        stop[0] = time.monotonic() + 4.0
        results = [r for f in futures for r in f.result()]
    assert len(results) > 48
    for i, y, _ in results:
        np.testing.assert_array_equal(y, [[2 * v + 1 for v in range(i, i + 4)]])
    # The requests the killed worker held came back after the ack wait, from another worker.
    assert max(t for _, _, t in results) >= 2.0


def test_each_sequence_stays_on_the_worker_that_started_it(fleet):
    from test_sequence import Reference, expected, frames

    def sequence_step(client, sid, x, start=False, end=False):
        given = httpclient.InferInput("frame", [1, 80], "FP32")
        given.set_data_from_numpy(x)
        return client.infer("gru", [given], sequence_id=sid, sequence_start=start,
                            sequence_end=end).as_numpy("output")

    def served(server):
        stats = httpclient.InferenceServerClient(server.http).get_inference_statistics("gru")
        return stats["model_stats"][0]["inference_count"]

    reference = Reference()
    first_proc, first = fleet.worker()
    gateway = fleet.gateway("--queue-timeout", "20")
    client = httpclient.InferenceServerClient(gateway.http)
    xs = {"a": frames(1, 6), 7: frames(2, 6)}
    # Sequence "a" starts while the first worker is the only one.
    got = {"a": [sequence_step(client, "a", xs["a"][0], start=True)]}
    second_proc, second = fleet.worker()
    # With the first worker frozen (and its last pull expired), sequence 7 starts on the second.
    first_proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(2.5)
        got[7] = [sequence_step(client, 7, xs[7][0], start=True)]
    finally:
        first_proc.send_signal(signal.SIGCONT)
    # Interleaved, each sequence's frames reach the worker that holds its state.
    for i in range(1, 6):
        for sid in ("a", 7):
            got[sid].append(sequence_step(client, sid, xs[sid][i], end=i == 5))
    for sid in ("a", 7):
        for step, (g, w) in enumerate(zip(got[sid], expected(xs[sid], reference))):
            assert np.array_equal(g, w), (sid, step)
    assert (served(first), served(second)) == (6, 6)

    # A sequence that ended, or was never started, is not open on any worker.
    for sid in ("a", 12345):
        with pytest.raises(InferenceServerException) as refused:
            sequence_step(client, sid, xs["a"][0])
        assert refused.value.status() == "400", refused.value.message()
        assert "not open" in refused.value.message()
    # Nor is one whose worker stopped.
    sequence_step(client, 8, xs[7][0], start=True)
    holder = second_proc if served(second) == 7 else first_proc
    holder.kill()
    holder.wait(timeout=10)
    # Once the queue server has seen the worker's connection close (a request sent in that
    # moment waits for the gateway's timeout, 504, as any request to a worker that died).
    time.sleep(1)
    with pytest.raises(InferenceServerException) as refused:
        sequence_step(client, 8, xs[7][1])
    assert refused.value.status() == "400" and "not open on any worker" in refused.value.message()


def test_interleaved_sequences_through_a_gateway_answer_as_the_model_run_by_hand(fleet):
    from test_sequence import Reference, check_streamed, drive, expected, frames
    import threading

    fleet.worker()
    fleet.worker()
    gateway = fleet.gateway("--queue-timeout", "20")
    reference = Reference()
    ids = [201, 202, 203, "q-1", "q-2", "q-3"]
    for module, url in [(httpclient, gateway.http), (grpcclient, gateway.grpc)]:
        inputs = {sid: frames(300 + k, 8) for k, sid in enumerate(ids)}
        out, errors = {}, []
        threads = [threading.Thread(target=drive, args=(module, url, "gru", sid, inputs[sid],
                                                        out, errors)) for sid in ids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [], errors
        for sid in ids:
            for step, (g, w) in enumerate(zip(out[sid], expected(inputs[sid], reference))):
                assert np.array_equal(g, w), (module.__name__, sid, step)

    # A gRPC stream through the gateway sends sequences' frames back to back, interleaved:
    # each later frame waits for the one before it, then follows the start to its worker.
    check_streamed(gateway.grpc, "gru", {"stream-q": frames(99, 10)}, reference)
    sequences = {f"sq-{k}": frames(700 + k, 2 + k % 4) for k in range(12)}
    check_streamed(gateway.grpc, "gru", sequences, reference)
