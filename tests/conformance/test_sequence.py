"""Stateful models through Triton's sequence API, driven by NVIDIA's tritonclient over HTTP and
gRPC (calls and streams): the demo GRU stream model, whose hidden state the server keeps between
a sequence's requests (implicit state), answers every step of many interleaved sequences
exactly as the same ONNX model run in-process with its state carried by hand; under both the
`oldest` and the `direct` strategy; a state that grows with each request (Triton's variable
state dims) starts from the values in its `initial_state/` file; a Triton-style Python model
that keeps its own state per process sees every request of a sequence in the same process, with
the CORRID it expects, also when another Python model sends the sequence's steps (business logic
scripting); and every error case is answered with a clear 4xx (or 503 when every slot is
taken)."""
import concurrent.futures
import threading
import time
import urllib.request
import json

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, start

GRU = ROOT / "model_repository/gru/1/model.onnx"
DEMO_CONFIG = ROOT / "model_repository/gru/config.pbtxt"

DIRECT = """\
max_batch_size: 4
instances: 2
sequence_batching:
  strategy: direct
  max_queue_delay_us: 3000
  max_sequence_idle_us: 5000000
  control_inputs:
    - {name: START, kind: start}
    - {name: READY, kind: ready}
  states:
    - {input: state_in, output: state_out}
"""

# Two rows on one instance: the third open sequence has no slot.
SMALL = DIRECT.replace("max_batch_size: 4\ninstances: 2", "max_batch_size: 2\ninstances: 1")

IDLE = DIRECT.replace("max_sequence_idle_us: 5000000", "max_sequence_idle_us: 300000")

TALLY_CONFIG = """\
backend: "python"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [
  { name: "total" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "pid" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "seen" data_type: TYPE_STRING dims: [ 1 ] }
]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 16 max_queue_delay_microseconds: 2000 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
  ]
}
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

# Keeps each sequence's running total in its own process: a request that reached another
# process than its sequence's start finds no total and fails.
TALLY_MODEL = '''
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.totals = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            if str(request.correlation_id()) != corrid[0, 0].decode():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"correlation_id() {request.correlation_id()!r} is not CORRID {corrid!r}")))
                continue
            # request.flags(): the start as the START control input says, the end on the
            # last request (x = 8 in the test that sends eight).
            flags = request.flags()
            starts = bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)
            ends = bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
            if starts != (start[0, 0] == 1) or ends != (x[0, 0] == 8):
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"flags() {flags} for START {start[0, 0]} and x {x[0, 0]}")))
                continue
            totals = np.zeros_like(x)
            for i in range(x.shape[0]):
                key = corrid[i, 0]
                if start[i, 0] == 1:
                    self.totals[key] = 0.0
                if key not in self.totals:
                    responses.append(pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"sequence {key!r} is not in process {os.getpid()}")))
                    break
                self.totals[key] += float(x[i, 0])
                totals[i, 0] = self.totals[key]
            else:
                pid = np.full(x.shape, os.getpid(), np.int64)
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("total", totals),
                    pb_utils.Tensor("pid", pid),
                    pb_utils.Tensor("seen", corrid.astype(object)),
                ]))
        return responses
'''

# Drives `tally` through business logic scripting: one sequence per request, named by CORRID
# (digits: an integer correlation id), its steps sent with Triton's START and END flags (END by
# `set_flags`).
DRIVER_CONFIG = """\
backend: "python"
max_batch_size: 0
input [
  { name: "xs" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "CORRID" data_type: TYPE_STRING dims: [ 1 ] }
]
output [
  { name: "totals" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "seen" data_type: TYPE_STRING dims: [ -1 ] }
]
"""

DRIVER_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils

START = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
END = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            xs = pb_utils.get_input_tensor_by_name(request, "xs").as_numpy()
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()[0].decode()
            corrid = int(corrid) if corrid.isdigit() else corrid
            totals, seen, error = [], [], None
            for i, x in enumerate(xs):
                step = pb_utils.InferenceRequest(
                    model_name="tally", correlation_id=corrid, flags=START if i == 0 else 0,
                    requested_output_names=["total", "seen"],
                    inputs=[pb_utils.Tensor("x", np.array([[x]], np.float32))])
                if i == len(xs) - 1:
                    # The last step's END flag set afterwards, as Triton's set_flags does.
                    step.set_flags(step.flags() | END)
                step = step.exec()
                if step.has_error():
                    error = step.error().message()
                    break
                totals.append(pb_utils.get_output_tensor_by_name(step, "total").as_numpy()[0, 0])
                seen.append(pb_utils.get_output_tensor_by_name(step, "seen").as_numpy()[0, 0])
            if error is not None:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(error)))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("totals", np.array(totals, np.float32)),
                pb_utils.Tensor("seen", np.array(seen, np.object_)),
            ]))
        return responses
'''


# A history that grows by one value each request: the state is every x so far, after the
# initial values. Triton's form of a variable state, its first values read from a file in the
# model folder's initial_state/ directory.
HISTORY_CONFIG = """\
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [
  { name: "seen" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "total" data_type: TYPE_FP32 dims: [ 1 ] }
]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  %s
  state [ { input_name: "hist_in" output_name: "hist_out" data_type: TYPE_FP32 dims: [ -1 ]
            initial_state { data_type: TYPE_FP32 dims: [ %d ] %s name: "start" } } ]
}
"""
HISTORY_START = np.array([10.0, 20.0], np.float32)


def history_model(path):
    """seen = hist_out = [hist_in, x] along the item's axis; total = its sum."""
    f = onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Concat", ["hist_in", "x"], ["hist_out"], axis=1),
         helper.make_node("Identity", ["hist_out"], ["seen"]),
         helper.make_node("ReduceSum", ["hist_out", "axes"], ["total"], keepdims=1)],
        "history",
        [helper.make_tensor_value_info("x", f, ["batch", 1]),
         helper.make_tensor_value_info("hist_in", f, ["batch", "n"])],
        [helper.make_tensor_value_info("hist_out", f, ["batch", "m"]),
         helper.make_tensor_value_info("seen", f, ["batch", "m"]),
         helper.make_tensor_value_info("total", f, ["batch", 1])],
        initializer=[helper.make_tensor("axes", onnx.TensorProto.INT64, [1], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


def make_repo(root):
    for name, config, file in [("gru", DEMO_CONFIG.read_text(), "config.pbtxt"),
                               ("gru_direct", DIRECT, "config.yaml"),
                               ("gru_small", SMALL, "config.yaml"),
                               ("gru_idle", IDLE, "config.yaml")]:
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").symlink_to(GRU)
        (root / name / file).write_text(config)
    (root / "tally" / "1").mkdir(parents=True)
    (root / "tally" / "config.pbtxt").write_text(TALLY_CONFIG)
    (root / "tally" / "1" / "model.py").write_text(TALLY_MODEL)
    (root / "driver" / "1").mkdir(parents=True)
    (root / "driver" / "config.pbtxt").write_text(DRIVER_CONFIG)
    (root / "driver" / "1" / "model.py").write_text(DRIVER_MODEL)
    oldest = "oldest { max_candidate_sequences: 16 max_queue_delay_microseconds: 20000 }"
    direct = "direct { max_queue_delay_microseconds: 20000 }"
    for name, strategy, dims, data in [
            ("history", oldest, 2, 'data_file: "start.bin"'),
            ("history_direct", direct, 2, 'data_file: "start.bin"'),
            # No file: the variable dimension starts at 1, zeros.
            ("history_zero", oldest, 1, "zero_data: true"),
            ("history_missing", oldest, 2, 'data_file: "none.bin"'),
            # Two values in the file, three in the dims.
            ("history_short", oldest, 3, 'data_file: "start.bin"')]:
        (root / name / "1").mkdir(parents=True)
        history_model(root / name / "1" / "model.onnx")
        (root / name / "config.pbtxt").write_text(HISTORY_CONFIG % (strategy, dims, data))
        (root / name / "initial_state").mkdir()
        (root / name / "initial_state" / "start.bin").write_bytes(HISTORY_START.tobytes())
    return root


def run_together(target, arguments):
    """Runs `target` once per entry of `arguments`, each in its own thread, all at once."""
    threads = [threading.Thread(target=target, args=args) for args in arguments]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from start(make_repo(tmp_path_factory.mktemp("sequence-repo")))


class Reference:
    """The GRU run in-process, one step at a time, its state carried by hand."""

    def __init__(self):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(GRU), options)

    def step(self, frame, state, start):
        flag = np.array([[1.0 if start else 0.0]], np.float32)
        output, state = self.session.run(None, {
            "frame": frame, "START": flag, "READY": np.ones((1, 1), np.float32), "state_in": state})
        return output, state


def frames(seed, steps):
    return np.random.default_rng(seed).standard_normal((steps, 1, 80)).astype(np.float32)


def call(module, client, model, frame, sid, start=False, end=False):
    given = module.InferInput("frame", [1, 80], "FP32")
    given.set_data_from_numpy(frame)
    return client.infer(model, [given], sequence_id=sid, sequence_start=start,
                        sequence_end=end).as_numpy("output")


def drive(module, url, model, sid, xs, out, errors):
    """One sequence, step by step, on a client of its own; its outputs land in `out[sid]`."""
    try:
        client = module.InferenceServerClient(url)
        out[sid] = [call(module, client, model, x, sid, start=i == 0, end=i == len(xs) - 1)
                    for i, x in enumerate(xs)]
    except Exception as e:  # noqa: BLE001 -- reported by the test's assertion
        errors.append((sid, e))


def expected(xs, reference):
    state = np.zeros((1, 1024), np.float32)
    answers = []
    for i, x in enumerate(xs):
        output, state = reference.step(x, state, start=i == 0)
        answers.append(output)
    return answers


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["gru", "gru_direct"])
def test_interleaved_sequences_answer_as_the_model_run_by_hand(server, protocol, model):
    module, url = (httpclient, server.http) if protocol == "http" else (grpcclient, server.grpc)
    reference = Reference()
    # Integer and string correlation ids, 8 sequences at once, 12 frames each.
    ids = [1001, 1002, 1003, 1004, "cam-a", "cam-b", "cam-c", "cam-d"]
    inputs = {sid: frames(k + (0 if protocol == "http" else 50), 12) for k, sid in enumerate(ids)}
    out, errors = {}, []
    executions = lambda: httpclient.InferenceServerClient(server.http).get_inference_statistics(
        model)["model_stats"][0]["execution_count"]
    before = executions()
    run_together(drive, [(module, url, model, sid, inputs[sid], out, errors) for sid in ids])
    assert errors == []
    for sid in ids:
        want = expected(inputs[sid], reference)
        for step, (got, w) in enumerate(zip(out[sid], want)):
            assert np.array_equal(got, w), (sid, step, float(np.abs(got - w).max()))
    # The sequences shared batches: fewer model executions than requests.
    ran = executions() - before
    assert 0 < ran < len(ids) * 12, ran


def stream(url, model, sequences):
    """Sends every frame of every sequence in `sequences` ({id: frames}) on one gRPC stream,
    interleaved (the first frame of each, then the second of each, ...), before the first
    answer comes back; returns each sequence's outputs by step."""
    client = grpcclient.InferenceServerClient(url)
    results, done = [], threading.Event()
    total = sum(len(xs) for xs in sequences.values())

    def collect(result, error):
        results.append((result, error))
        if len(results) == total:
            done.set()

    client.start_stream(callback=collect)
    for i in range(max(len(xs) for xs in sequences.values())):
        for sid, xs in sequences.items():
            if i >= len(xs):
                continue
            given = grpcclient.InferInput("frame", [1, 80], "FP32")
            given.set_data_from_numpy(xs[i])
            client.async_stream_infer(model, [given], request_id=f"{sid}/{i}", sequence_id=sid,
                                      sequence_start=i == 0, sequence_end=i == len(xs) - 1)
    assert done.wait(60)
    client.stop_stream()
    assert [e for _, e in results if e is not None] == []
    by_id = {}
    for r, _ in results:
        sid, step = r.get_response().id.rsplit("/", 1)
        by_id.setdefault(sid, {})[int(step)] = r.as_numpy("output")
    return {sid: by_id[str(sid)] for sid in sequences}


def check_streamed(url, model, sequences, reference):
    """Streams `sequences` on one gRPC stream and checks every answer against the reference."""
    by_id = stream(url, model, sequences)
    for sid, xs in sequences.items():
        for step, want in enumerate(expected(xs, reference)):
            assert np.array_equal(by_id[sid][step], want), (sid, step)


def test_a_grpc_stream_carries_one_sequence_in_order(server):
    check_streamed(server.grpc, "gru", {"stream-1": frames(77, 16)}, Reference())


def test_a_grpc_stream_carries_many_interleaved_sequences_each_in_order(server):
    # Frames of one sequence sent back to back, with those of 11 others between them: each
    # sequence's frames still reach the model in the order they were sent.
    sequences = {sid: frames(500 + k, 2 + k % 5)
                 for k, sid in enumerate([f"many-{k}" for k in range(6)] + list(range(7701, 7707)))}
    check_streamed(server.grpc, "gru", sequences, Reference())


def test_the_server_keeps_the_state_so_clients_send_one_frame(server):
    """The same frames as two sequences give different answers once their pasts differ."""
    client = httpclient.InferenceServerClient(server.http)
    xs = frames(5, 3)
    opened = open_now(server)
    a = [call(httpclient, client, "gru", xs[0], 71, start=True)]
    b = [call(httpclient, client, "gru", xs[1], 72, start=True)]
    # Both sequences show as open, in /stats and in /metrics.
    assert open_now(server) == (opened[0] + 2, opened[1] + 2)
    a.append(call(httpclient, client, "gru", xs[2], 71, end=True))
    b.append(call(httpclient, client, "gru", xs[2], 72, end=True))
    assert not np.array_equal(a[1], b[1])
    assert open_now(server) == opened


def open_now(server):
    """The gru model's open sequences, as /stats and /metrics count them."""
    stats = json.loads(urllib.request.urlopen(f"http://{server.http}/stats").read())
    metrics = urllib.request.urlopen(f"http://{server.metrics}/metrics").read().decode()
    gauge = [line for line in metrics.splitlines()
             if line.startswith('sheaf_sequences_open{model="gru"}')]
    assert len(gauge) == 1, gauge
    return stats["models"]["gru"]["sequences_open"], int(float(gauge[0].split()[-1]))


def test_a_python_model_sees_each_sequence_in_one_process_with_its_corrid(server):
    ids = [11, 12, 13, 14, "s-1", "s-2"]
    out, errors = {}, []

    def run(sid):
        try:
            client = grpcclient.InferenceServerClient(server.grpc)
            rows = []
            for i in range(8):
                given = grpcclient.InferInput("x", [1, 1], "FP32")
                given.set_data_from_numpy(np.array([[i + 1]], np.float32))
                r = client.infer("tally", [given], sequence_id=sid, sequence_start=i == 0,
                                 sequence_end=i == 7)
                rows.append((float(r.as_numpy("total")[0, 0]), int(r.as_numpy("pid")[0, 0]),
                             r.as_numpy("seen")[0, 0]))
            out[sid] = rows
        except Exception as e:  # noqa: BLE001
            errors.append((sid, e))

    run_together(run, [(sid,) for sid in ids])
    assert errors == [], [(sid, e.message()) for sid, e in errors]
    pids = set()
    for sid, rows in out.items():
        assert [t for t, _, _ in rows] == [sum(range(1, k + 2)) for k in range(8)], sid
        assert len({p for _, p, _ in rows}) == 1, sid
        assert {s for _, _, s in rows} == {str(sid).encode()}, sid
        pids.add(rows[0][1])
    # The sequences were spread over both instances (processes).
    assert len(pids) == 2


def test_a_model_drives_sequences_with_correlation_ids_and_flags(server):
    # Four sequences at once, each sent by the `driver` model to `tally` step by step: tally
    # checks each step's correlation_id and START/END flags against its control inputs, and
    # keeps each running total in the process its sequence started in.
    def drive(corrid):
        xs = grpcclient.InferInput("xs", [8], "FP32")
        xs.set_data_from_numpy(np.arange(1, 9, dtype=np.float32))
        cid = grpcclient.InferInput("CORRID", [1], "BYTES")
        cid.set_data_from_numpy(np.array([str(corrid).encode()], np.object_))
        r = grpcclient.InferenceServerClient(server.grpc).infer("driver", [xs, cid])
        return r.as_numpy("totals").tolist(), r.as_numpy("seen").tolist()

    ids = [21, 22, "bls-a", "bls-b"]
    with concurrent.futures.ThreadPoolExecutor(len(ids)) as pool:
        answers = dict(zip(ids, pool.map(drive, ids)))
    for corrid, (totals, seen) in answers.items():
        assert totals == [sum(range(1, k + 2)) for k in range(8)], corrid
        assert seen == [str(corrid).encode()] * 8, corrid
    # Without a correlation id, tally refuses the step, and the driver passes the reason on.
    with pytest.raises(InferenceServerException) as e:
        drive("")
    assert "sequence" in e.value.message(), e.value.message()


def expect_error(fn, code, says):
    with pytest.raises(InferenceServerException) as e:
        fn()
    assert code in str(e.value.status()), (e.value.status(), e.value.message())
    assert says in e.value.message(), e.value.message()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_misuse_of_a_sequence_gets_a_clear_error(server, protocol):
    module, url = (httpclient, server.http) if protocol == "http" else (grpcclient, server.grpc)
    bad = "400" if protocol == "http" else "INVALID_ARGUMENT"
    client = module.InferenceServerClient(url)
    x = frames(1, 1)[0]
    base = 500 if protocol == "http" else 600
    # No sequence at all.
    expect_error(lambda: client.infer("gru", [input_of(module, x)]), bad, "sequence_id")
    # A sequence never started.
    expect_error(lambda: call(module, client, "gru", x, base + 1), bad, "must carry sequence_start")
    # A second start of an open sequence.
    call(module, client, "gru", x, base + 2, start=True)
    expect_error(lambda: call(module, client, "gru", x, base + 2, start=True), bad, "already open")
    # A request after the end.
    call(module, client, "gru", x, base + 2, end=True)
    expect_error(lambda: call(module, client, "gru", x, base + 2), bad, "has ended")
    # Two items in one request of a sequence.
    two = module.InferInput("frame", [2, 80], "FP32")
    two.set_data_from_numpy(np.concatenate([x, x]))
    expect_error(lambda: client.infer("gru", [two], sequence_id=base + 3, sequence_start=True),
                 bad, "one item")
    # The state and control inputs are the server's: a client cannot send them.
    start = module.InferInput("START", [1, 1], "FP32")
    start.set_data_from_numpy(np.ones((1, 1), np.float32))
    expect_error(lambda: client.infer("gru", [input_of(module, x), start], sequence_id=base + 4,
                                      sequence_start=True), bad, "START")


def test_flags_without_an_id_are_refused(server):
    body = json.dumps({"inputs": [{"name": "frame", "datatype": "FP32", "shape": [1, 80],
                                   "data": [0.0] * 80}],
                       "parameters": {"sequence_start": True}}).encode()
    request = urllib.request.Request(f"http://{server.http}/v2/models/gru/infer", data=body,
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request)
    assert e.value.code == 400
    assert "need a sequence_id" in e.value.read().decode()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_start_with_every_slot_taken_is_refused_at_once(server, protocol):
    module, url = (httpclient, server.http) if protocol == "http" else (grpcclient, server.grpc)
    client = module.InferenceServerClient(url)
    x = frames(2, 1)[0]
    base = 700 if protocol == "http" else 800
    call(module, client, "gru_small", x, base + 1, start=True)
    call(module, client, "gru_small", x, base + 2, start=True)
    busy = "503" if protocol == "http" else "RESOURCE_EXHAUSTED"
    expect_error(lambda: call(module, client, "gru_small", x, base + 3, start=True), busy,
                 "as many as it has room for")
    # Ending one frees its slot.
    call(module, client, "gru_small", x, base + 1, end=True)
    call(module, client, "gru_small", x, base + 3, start=True)
    call(module, client, "gru_small", x, base + 2, end=True)
    call(module, client, "gru_small", x, base + 3, end=True)


def test_an_idle_sequence_is_closed_and_its_slot_freed(server):
    client = httpclient.InferenceServerClient(server.http)
    x = frames(3, 1)[0]
    call(httpclient, client, "gru_idle", x, 901, start=True)
    # A sequence that keeps talking stays open past the timeout.
    call(httpclient, client, "gru_idle", x, 902, start=True)
    for _ in range(6):
        time.sleep(0.1)
        call(httpclient, client, "gru_idle", x, 902)
    expect_error(lambda: call(httpclient, client, "gru_idle", x, 901), "400", "without a request")
    call(httpclient, client, "gru_idle", x, 902, end=True)


def test_the_configuration_shows_the_sequence_batcher(server):
    http = httpclient.InferenceServerClient(server.http).get_model_config("gru")
    seq = http["sequence_batching"]
    assert "dynamic_batching" not in http
    assert [c["name"] for c in seq["control_input"]] == ["START", "READY"]
    assert seq["state"][0]["input_name"] == "state_in" and seq["state"][0]["dims"] == [1024]
    assert seq["max_sequence_idle_microseconds"] == 5000000 and "oldest" in seq
    grpc = grpcclient.InferenceServerClient(server.grpc).get_model_config("gru_direct").config
    assert grpc.sequence_batching.direct.max_queue_delay_microseconds == 3000
    assert [c.name for c in grpc.sequence_batching.control_input] == ["START", "READY"]
    # Clients see the model without the control and state tensors.
    meta = httpclient.InferenceServerClient(server.http).get_model_metadata("gru")
    assert [i["name"] for i in meta["inputs"]] == ["frame"]
    assert [o["name"] for o in meta["outputs"]] == ["output"]


def input_of(module, x):
    given = module.InferInput("frame", list(x.shape), "FP32")
    given.set_data_from_numpy(x)
    return given


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["history", "history_direct"])
def test_a_state_that_grows_starts_from_its_file_and_sequences_of_one_length_share_batches(
        server, protocol, model):
    """Triton's variable state (dims [-1]) with its first values from initial_state/: every
    sequence sees the file's values and then each x it sent, in order; the sequences send each
    step together, and those whose histories have one length run in one batch."""
    module, url = (httpclient, server.http) if protocol == "http" else (grpcclient, server.grpc)
    ids = [f"{model}-{protocol}-{k}" for k in range(6)]
    steps = 5
    xs = {sid: [float(100 * k + i) for i in range(steps)] for k, sid in enumerate(ids)}
    together = threading.Barrier(len(ids))
    out, errors = {}, []
    executions = lambda: httpclient.InferenceServerClient(server.http).get_inference_statistics(
        model)["model_stats"][0]["execution_count"]
    before = executions()

    def run(sid):
        try:
            client = module.InferenceServerClient(url)
            out[sid] = []
            for i, x in enumerate(xs[sid]):
                given = module.InferInput("x", [1, 1], "FP32")
                given.set_data_from_numpy(np.array([[x]], np.float32))
                together.wait(timeout=30)
                r = client.infer(model, [given], sequence_id=sid, sequence_start=i == 0,
                                 sequence_end=i == steps - 1)
                out[sid].append((r.as_numpy("seen"), r.as_numpy("total")))
        except Exception as e:  # noqa: BLE001 -- reported by the test's assertion
            errors.append((sid, e))
            together.abort()

    run_together(run, [(sid,) for sid in ids])
    assert errors == []
    for sid in ids:
        for i, (seen, total) in enumerate(out[sid]):
            want = np.concatenate([HISTORY_START, np.array(xs[sid][:i + 1], np.float32)])
            assert seen.shape == (1, len(HISTORY_START) + i + 1), (sid, i, seen.shape)
            np.testing.assert_array_equal(seen[0], want)
            assert total[0, 0] == want.sum(), (sid, i, total)
    ran = executions() - before
    assert 0 < ran < len(ids) * steps, ran


def test_a_variable_state_without_a_file_starts_as_one_zero(server):
    client = httpclient.InferenceServerClient(server.http)
    given = httpclient.InferInput("x", [1, 1], "FP32")
    seen = []
    for i, x in enumerate([3.0, 4.0]):
        given.set_data_from_numpy(np.array([[x]], np.float32))
        seen.append(client.infer("history_zero", [given], sequence_id=4242, sequence_start=i == 0,
                                 sequence_end=i == 1).as_numpy("seen"))
    np.testing.assert_array_equal(seen[0], [[0.0, 3.0]])
    np.testing.assert_array_equal(seen[1], [[0.0, 3.0, 4.0]])


def test_an_initial_state_file_that_is_missing_or_short_fails_the_load_with_the_reason(server):
    index = {m["name"]: m for m in
             httpclient.InferenceServerClient(server.http).get_model_repository_index()}
    for name, says in [("history_missing", "initial_data_file 'none.bin' is not in"),
                       ("history_short", "8 bytes, where 3 elements of FP32 take 12")]:
        assert index[name]["state"] == "UNAVAILABLE", index[name]
        assert says in index[name]["reason"], index[name]
        assert "state 'hist_in'" in index[name]["reason"], index[name]
    assert index["history"]["state"] == "READY"


def test_the_configuration_shows_a_state_s_first_dims_and_file(server):
    http = httpclient.InferenceServerClient(server.http).get_model_config("history")
    state = http["sequence_batching"]["state"][0]
    assert state["dims"] == [-1]
    assert state["initial_state"][0]["dims"] == [2]
    assert state["initial_state"][0]["data_file"] == "start.bin"
    grpc = grpcclient.InferenceServerClient(server.grpc).get_model_config("history_zero").config
    initial = grpc.sequence_batching.state[0].initial_state[0]
    assert list(initial.dims) == [1] and initial.zero_data
