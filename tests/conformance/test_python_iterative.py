"""Triton's iterative sequences and request rescheduling on the Python backend: a model with
`sequence_batching { iterative_sequence: true }` asks for a request to run again
(RELEASE_RESCHEDULE), and the server queues it again first, so that each execute batches the
requests still running with the new ones (continuous batching); each request gets a
correlation id and the START flag on its first run, as Triton's iterative sequencer gives."""

import concurrent.futures
import json
import queue
import shutil
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, events, http, link_models, start

FIXTURES = ROOT / "tests" / "python_models"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("iterative-repo")
    for name in ("iterative_steps", "iterative_stream"):
        shutil.copytree(FIXTURES / name, repo / name)
    # The same model configured by a config.yaml.
    (repo / "iterative_yaml").mkdir()
    shutil.copy(FIXTURES / "iterative_steps" / "1" / "model.py", repo / "iterative_yaml")
    (repo / "iterative_yaml" / "config.yaml").write_text(
        "inputs: [{name: STEPS, data_type: INT32, dims: [1]}]\n"
        "outputs:\n"
        + "".join(f"  - {{name: {n}, data_type: INT32, dims: [1]}}\n"
                  for n in ("RUNS", "SHARED", "FIRST_FLAGS", "LATER_FLAGS"))
        + "  - {name: CORRID, data_type: UINT64, dims: [1]}\n"
        "max_batch_size: 8\niterative_sequence: true\n")
    # The same with one instance, whose batches every request shares.
    shutil.copytree(FIXTURES / "iterative_steps", repo / "iterative_single")
    config = repo / "iterative_single" / "config.pbtxt"
    config.write_text(config.read_text().replace("count: 2", "count: 1"))
    # Iterative with control inputs: refused at load, with why.
    shutil.copytree(FIXTURES / "iterative_steps", repo / "iterative_controlled")
    config = repo / "iterative_controlled" / "config.pbtxt"
    config.write_text(config.read_text().replace(
        "sequence_batching { iterative_sequence: true }",
        'sequence_batching { iterative_sequence: true control_input [ { name: "START" '
        "control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] } ] }"))
    # An ONNX model cannot run a request again.
    link_models(repo, ["mlp"])
    (repo / "mlp" / "config.yaml").unlink()
    (repo / "mlp" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 32\n'
        "sequence_batching { iterative_sequence: true }\n")
    return repo


@pytest.fixture(scope="module")
def server(repo):
    yield from start(repo)


def steps(module, url, n, items=1, model="iterative_steps"):
    i = module.InferInput("STEPS", [items, 1], "INT32")
    i.set_data_from_numpy(np.full((items, 1), n, np.int32))
    with module.InferenceServerClient(url) as client:
        return client.infer(model, [i])


def execution_count(server, model):
    status, _, body = http(f"http://{server.http}/v2/models/{model}/stats")
    assert status == 200, body
    return json.loads(body)["model_stats"][0]["execution_count"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_each_request_runs_its_steps_batched_with_the_others(server, protocol):
    # Two instances, each a process keeping its own requests' progress: a request runs again
    # on the instance that began it.
    module, url = (httpclient, server.http) if protocol == "http" else (grpcclient, server.grpc)
    before = execution_count(server, "iterative_steps")
    wanted = list(range(1, 9))
    with concurrent.futures.ThreadPoolExecutor(len(wanted)) as pool:
        answers = list(pool.map(lambda n: steps(module, url, n), wanted))
    runs = [int(a.as_numpy("RUNS")[0, 0]) for a in answers]
    assert runs == wanted
    # START on the first run only, and a correlation id of its own from the server.
    assert {int(a.as_numpy("FIRST_FLAGS")[0, 0]) for a in answers} == {1}
    assert {int(a.as_numpy("LATER_FLAGS")[0, 0]) for a in answers} == {0}
    ids = {int(a.as_numpy("CORRID")[0, 0]) for a in answers}
    assert len(ids) == len(wanted) and 0 not in ids
    # The requests ran together: fewer executes than runs, and some shared one.
    assert max(int(a.as_numpy("SHARED")[0, 0]) for a in answers) > 1
    executed = execution_count(server, "iterative_steps") - before
    assert executed < sum(wanted), (executed, sum(wanted))


def test_a_new_request_joins_the_batch_while_another_runs_on(server):
    finished = []

    def run(n, tag):
        answer = steps(httpclient, server.http, n, model="iterative_single")
        finished.append(tag)
        return answer

    long = threading.Thread(target=run, args=(40, "long"))
    long.start()
    time.sleep(0.2)  # the long request is well into its 40 runs of 20 ms
    short = run(2, "short")
    long.join()
    # The short request did not wait for the long one: it ran in the long one's batches.
    assert finished == ["short", "long"]
    assert int(short.as_numpy("SHARED")[0, 0]) == 2


def test_a_decoupled_iterative_model_streams_a_response_per_run(server):
    # Over a gRPC stream, two requests at once.
    got = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    for n, rid in ((4, "four"), (3, "three")):
        i = grpcclient.InferInput("IN", [1, 1], "INT32")
        i.set_data_from_numpy(np.array([[n]], np.int32))
        client.async_stream_infer("iterative_stream", [i], request_id=rid,
                                  enable_empty_final_response=True)
    seen = {"four": [], "three": []}
    finals = 0
    while finals < 2:
        result, error = got.get(timeout=30)
        assert error is None, error
        response = result.get_response()
        if response.outputs:
            seen[response.id].append(int(result.as_numpy("OUT")[0, 0]))
        if response.parameters["triton_final_response"].bool_param:
            finals += 1
    client.stop_stream()
    assert seen == {"four": [3, 2, 1, 0], "three": [2, 1, 0]}
    # As server-sent events.
    answer = events(server, "iterative_stream",
                    [{"name": "IN", "datatype": "INT32", "shape": [1, 1], "data": [3]}])
    outs = [data["outputs"][0]["data"][0] for event, data in answer if data.get("outputs")]
    assert outs == [2, 1, 0]


def test_a_yaml_configuration_makes_a_model_iterative_too(server):
    answer = steps(httpclient, server.http, 3, model="iterative_yaml")
    assert int(answer.as_numpy("RUNS")[0, 0]) == 3
    assert int(answer.as_numpy("FIRST_FLAGS")[0, 0]) == 1


def test_a_request_that_does_not_fit_one_batch_is_refused(server):
    with pytest.raises(InferenceServerException) as refused:
        steps(httpclient, server.http, 2, items=9)
    assert refused.value.status() == "400"
    assert "an iterative model takes at most 8" in refused.value.message()


@pytest.mark.parametrize("model,says", [
    ("iterative_controlled", "iterative_sequence with control inputs or states is not supported"),
    ("mlp", "iterative_sequence: true } is for models that answer each request on their own"),
])
def test_what_cannot_run_iteratively_fails_its_load_with_why(server, model, says):
    status, _, body = http(f"http://{server.http}/v2/models/{model}/ready")
    assert status == 503 and says in body.decode(), body
