"""Triton's trace extension: the real `sheaf` binary traces sampled requests to the demo MLP,
set at start with Triton's --trace-config words and changed while it runs over HTTP and gRPC
with NVIDIA's tritonclient, and writes them in Triton's JSON trace format."""
import json
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ADMIN_KEY, API_KEY, launch, link_models, start

MIDDLE = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
          "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]
HTTP_POINTS = ["HTTP_RECV_START", "HTTP_RECV_END", *MIDDLE, "HTTP_SEND_START", "HTTP_SEND_END"]
GRPC_POINTS = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *MIDDLE, "GRPC_SEND_START",
               "GRPC_SEND_END"]


def call(url, body=None, headers=None):
    """GET (or POST `body` as JSON) `url`: its status and its JSON body."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={
        "content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        text = e.read()
        return e.code, json.loads(text) if text.startswith(b"{") else text


def mlp_repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    link_models(repo, ["mlp"])
    return repo


def infer(module, url, request_id):
    x = np.full((1, 512), 0.5, dtype=np.float32)
    given = module.InferInput("input", [1, 512], "FP32")
    given.set_data_from_numpy(x)
    result = module.InferenceServerClient(url).infer("mlp", [given], request_id=request_id)
    assert result.as_numpy("output").shape[0] == 1


def traces_in(path):
    """The traces of one trace file, by id: the request's fields and its points."""
    objects = json.loads(path.read_text())
    traces = {}
    for o in objects:
        traces.setdefault(o["id"], {}).update(o)
    return list(traces.values())


def wait_for(path, timeout=10):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} was not written"
        time.sleep(0.05)
    # The writer thread may still be writing it.
    time.sleep(0.2)
    return path


def check_points(trace, names):
    assert [p["name"] for p in trace["timestamps"]] == names, trace
    ns = [p["ns"] for p in trace["timestamps"]]
    assert ns == sorted(ns), trace
    # Nanoseconds since the Unix epoch: within a minute of now.
    assert abs(ns[0] / 1e9 - time.time()) < 60, ns[0]
    assert ns[-1] > ns[0]


def test_traces_go_to_files_log_frequency_at_a_time_until_the_count_runs_out(tmp_path):
    trace_file = tmp_path / "trace.json"
    for server in start(mlp_repo(tmp_path), "--trace-config", f"triton,file={trace_file}",
                        "--trace-config", "triton,log-frequency=2", "--trace-config", "rate=1",
                        "--trace-config", "level=TIMESTAMPS", "--trace-config", "count=3"):
        http = httpclient.InferenceServerClient(server.http)
        assert "trace" in http.get_server_metadata()["extensions"]
        assert http.get_trace_settings() == {
            "trace_file": str(trace_file), "trace_level": ["TIMESTAMPS"], "trace_rate": "1",
            "trace_count": "3", "log_frequency": "2", "trace_mode": "triton",
        }
        infer(httpclient, server.http, "h0")
        infer(httpclient, server.http, "h1")
        first = traces_in(wait_for(tmp_path / "trace.json.0"))
        assert [t["request_id"] for t in first] == ["h0", "h1"]
        for t in first:
            assert (t["model_name"], t["model_version"]) == ("mlp", 1)
            check_points(t, HTTP_POINTS)
        # The third trace is the count's last: written at once, to the next file.
        infer(grpcclient, server.grpc, "g0")
        second = traces_in(wait_for(tmp_path / "trace.json.1"))
        assert [t["request_id"] for t in second] == ["g0"]
        check_points(second[0], GRPC_POINTS)
        assert http.get_trace_settings()["trace_count"] == "0"
        # No count left: nothing more is traced.
        infer(grpcclient, server.grpc, "g1")
        infer(httpclient, server.http, "h2")
        time.sleep(0.5)
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("trace")) == [
            "trace.json.0", "trace.json.1"]


def test_with_log_frequency_0_the_traces_are_written_at_shutdown(tmp_path):
    trace_file = tmp_path / "trace.json"
    proc, server = launch(mlp_repo(tmp_path), "--trace-config", f"triton,file={trace_file}",
                          "--trace-config", "rate=2", "--trace-config", "level=TIMESTAMPS")
    try:
        for i in range(6):
            infer(httpclient, server.http, f"r{i}")
        time.sleep(0.3)
        assert not trace_file.exists()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    # One request in two: the 2nd, 4th and 6th.
    assert [t["request_id"] for t in traces_in(trace_file)] == ["r1", "r3", "r5"]


def test_triton_s_older_trace_flags_are_the_settings_they_became(tmp_path):
    """--trace-file, --trace-level, --trace-rate, --trace-count and --trace-log-frequency, as
    older Triton command lines give them; a --trace-config setting given too wins."""
    trace_file = tmp_path / "trace.json"
    for server in start(mlp_repo(tmp_path), "--trace-file", str(trace_file),
                        "--trace-level=TIMESTAMPS", "--trace-rate", "1", "--trace-count", "5",
                        "--trace-log-frequency", "1", "--trace-config", "count=2"):
        http = httpclient.InferenceServerClient(server.http)
        assert http.get_trace_settings() == {
            "trace_file": str(trace_file), "trace_level": ["TIMESTAMPS"], "trace_rate": "1",
            "trace_count": "2", "log_frequency": "1", "trace_mode": "triton",
        }
        infer(httpclient, server.http, "old")
        (trace,) = traces_in(wait_for(tmp_path / "trace.json.0"))
        assert trace["request_id"] == "old"
        check_points(trace, HTTP_POINTS)


def test_a_model_s_settings_over_http_and_grpc_and_traces_in_the_log(tmp_path):
    for server in start(mlp_repo(tmp_path)):
        http = httpclient.InferenceServerClient(server.http)
        grpc = grpcclient.InferenceServerClient(server.grpc)
        default = {"trace_file": "", "trace_level": ["OFF"], "trace_rate": "1000",
                   "trace_count": "-1", "log_frequency": "0", "trace_mode": "triton"}
        assert http.get_trace_settings() == default
        # A model's first settings copy the server's for what they leave out.
        mine = http.update_trace_settings("mlp", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
        assert mine == {**default, "trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
        assert http.get_trace_settings() == default
        shown = grpc.get_trace_settings(model_name="mlp", as_json=True)["settings"]
        assert shown["trace_level"] == {"value": ["TIMESTAMPS"]}, shown
        assert shown["trace_rate"] == {"value": ["1"]}, shown
        # No file: each trace is a log line of its own.
        mark = len(server.log)
        infer(httpclient, server.http, "to-the-log")
        deadline = time.monotonic() + 10
        line = None
        while line is None:
            assert time.monotonic() < deadline, "no trace line:\n" + "".join(server.log[mark:])
            for text in server.log[mark:]:
                entry = json.loads(text)
                if entry.get("target") == "sheaf::trace":
                    line = entry
            time.sleep(0.05)
        info, times = json.loads(line["fields"]["message"])
        assert (info["model_name"], info["request_id"]) == ("mlp", "to-the-log")
        check_points(times, HTTP_POINTS)
        # gRPC clears the model's level (no value): the server's, off, again.
        cleared = grpc.update_trace_settings("mlp", {"trace_level": None}, as_json=True)
        assert cleared["settings"]["trace_level"] == {"value": ["OFF"]}
        assert cleared["settings"]["trace_rate"] == {"value": ["1"]}
        # And over HTTP, null clears the rate.
        assert http.update_trace_settings("mlp", {"trace_rate": None})["trace_rate"] == "1000"
        # The server's own settings change over gRPC.
        changed = grpc.update_trace_settings(settings={"trace_count": "5"}, as_json=True)
        assert changed["settings"]["trace_count"] == {"value": ["5"]}
        assert http.get_trace_settings()["trace_count"] == "5"


def test_bad_settings_are_refused_and_change_nothing(tmp_path):
    for server in start(mlp_repo(tmp_path)):
        url = f"http://{server.http}"
        grpc = grpcclient.InferenceServerClient(server.grpc)
        status, before = call(f"{url}/v2/trace/setting")
        assert status == 200
        for body, words in [
            ({"trace_level": ["TENSORS"]}, "TENSORS"),
            ({"trace_level": "LOUD"}, "neither OFF nor TIMESTAMPS"),
            ({"trace_rate": "0", "trace_count": "5"}, "trace_rate"),
            ({"trace_file": "/tmp/elsewhere.json"}, "set when the server starts"),
            ({"trace_colour": "red"}, "unknown trace setting"),
            ({"trace_rate": {"n": 1}}, "takes a string"),
        ]:
            status, answer = call(f"{url}/v2/trace/setting", body)
            assert status == 400, (body, answer)
            assert words in answer["error"], (body, answer)
        assert call(f"{url}/v2/trace/setting") == (200, before)
        status, answer = call(f"{url}/v2/models/nonesuch/trace/setting")
        assert status == 404, answer
        with pytest.raises(InferenceServerException) as refused:
            grpc.update_trace_settings(settings={"trace_level": ["TENSORS"]})
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
        with pytest.raises(InferenceServerException) as refused:
            grpc.get_trace_settings(model_name="nonesuch")
        assert refused.value.status() == "StatusCode.NOT_FOUND"


def test_the_settings_take_the_admin_key(tmp_path):
    for server in start(mlp_repo(tmp_path), "--api-key", API_KEY, "--admin-key", ADMIN_KEY):
        url = f"http://{server.http}/v2/trace/setting"
        user = {"Authorization": f"Bearer {API_KEY}"}
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        assert call(url, headers=user)[0] == 403
        assert call(url, {"trace_rate": "1"}, headers=user)[0] == 403
        status, shown = call(url, headers=admin)
        assert status == 200 and shown["trace_rate"] == "1000"
        grpc = grpcclient.InferenceServerClient(server.grpc)
        with pytest.raises(InferenceServerException):
            grpc.get_trace_settings(headers={"authorization": f"Bearer {API_KEY}"})
        shown = grpc.get_trace_settings(headers={"authorization": f"Bearer {ADMIN_KEY}"},
                                        as_json=True)
        assert shown["settings"]["trace_rate"] == {"value": ["1000"]}


# An ensemble whose two steps run the MLP at once, and one that runs it as its only step.
PAIR = '''
platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 512 ] } ]
output [ { name: "A" data_type: TYPE_FP32 dims: [ 10 ] },
         { name: "B" data_type: TYPE_FP32 dims: [ 10 ] } ]
ensemble_scheduling { step [
  { model_name: "mlp" model_version: -1
    input_map { key: "input" value: "RAW" } output_map { key: "output" value: "A" } },
  { model_name: "mlp" model_version: -1
    input_map { key: "input" value: "RAW" } output_map { key: "output" value: "B" } }
] }
'''
OUTER = PAIR.split("ensemble_scheduling")[0] + '''
ensemble_scheduling { step [
  { model_name: "pair" model_version: -1 input_map { key: "RAW" value: "RAW" }
    output_map [ { key: "A" value: "A" }, { key: "B" value: "B" } ] }
] }
'''


def test_an_ensemble_s_steps_are_traced_under_its_trace(tmp_path):
    """As Triton traces an ensemble: its own trace with the protocol's points around
    REQUEST_START and REQUEST_END, and one trace per step whose parent_id is the ensemble's,
    an ensemble inside another one level down."""
    repo = mlp_repo(tmp_path)
    for name, config in (("pair", PAIR), ("outer", OUTER)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
    trace_file = tmp_path / "trace.json"
    for server in start(repo, "--trace-config", f"triton,file={trace_file}",
                        "--trace-config", "rate=1", "--trace-config", "level=TIMESTAMPS",
                        "--trace-config", "count=2"):
        for module, url, model, request_id in ((httpclient, server.http, "pair", "p"),
                                               (grpcclient, server.grpc, "outer", "o")):
            given = module.InferInput("RAW", [1, 512], "FP32")
            given.set_data_from_numpy(np.full((1, 512), 0.5, dtype=np.float32))
            result = module.InferenceServerClient(url).infer(model, [given],
                                                             request_id=request_id)
            np.testing.assert_array_equal(result.as_numpy("A"), result.as_numpy("B"))
        # The count was 2: the ensembles' steps took none of it, and the second was its last.
        traces = traces_in(wait_for(tmp_path / "trace.json.0"))
        by_id = {t["id"]: t for t in traces}
        assert len(traces) == 7, traces
        top = {t["model_name"]: t for t in traces if "parent_id" not in t}
        assert sorted(top) == ["outer", "pair"], traces

        def children(parent):
            return [t for t in traces if t.get("parent_id") == parent["id"]]

        def within(child, parent):
            at = {p["name"]: p["ns"] for p in parent["timestamps"]}
            ns = [p["ns"] for p in child["timestamps"]]
            assert at["REQUEST_START"] <= ns[0] and ns[-1] <= at["REQUEST_END"], (child, parent)

        pair = top["pair"]
        check_points(pair, ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "REQUEST_END",
                            "HTTP_SEND_START", "HTTP_SEND_END"])
        assert pair["request_id"] == "p"
        steps = children(pair)
        assert [(s["model_name"], s["model_version"]) for s in steps] == [("mlp", 1)] * 2
        for step in steps:
            check_points(step, MIDDLE)
            within(step, pair)

        outer = top["outer"]
        check_points(outer, ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "REQUEST_START",
                             "REQUEST_END", "GRPC_SEND_START", "GRPC_SEND_END"])
        [inner] = children(outer)
        assert inner["model_name"] == "pair" and inner["request_id"] == "o"
        check_points(inner, ["REQUEST_START", "REQUEST_END"])
        within(inner, outer)
        for step in children(inner):
            assert step["model_name"] == "mlp"
            check_points(step, MIDDLE)
            within(step, inner)
        assert len(children(inner)) == 2
        # Every parent_id names a trace of the file.
        assert all(t["parent_id"] in by_id for t in traces if "parent_id" in t)


def test_requests_a_python_model_sends_with_its_request_s_trace_are_traced_under_it(tmp_path):
    """Triton's BLS under a trace: a request a Python model sends with
    `trace=request.trace()` has a trace whose parent_id is the request's, inside its compute;
    one sent without it has none; a BLS model called that way traces its own calls one level
    down. The calls take nothing of the count, and an unsampled request's calls are not
    traced."""
    import shutil

    from conftest import ROOT

    repo = mlp_repo(tmp_path)
    for name in ("traced_bls", "traced_outer"):
        shutil.copytree(ROOT / "tests" / "python_models" / name, repo / name)
    trace_file = tmp_path / "trace.json"
    x = np.random.default_rng(3).random((1, 512), dtype=np.float32)
    for server in start(repo, "--trace-config", f"triton,file={trace_file}",
                        "--trace-config", "rate=1", "--trace-config", "level=TIMESTAMPS",
                        "--trace-config", "count=2"):
        def ask(module, url, model, request_id):
            given = module.InferInput("input", [1, 512], "FP32")
            given.set_data_from_numpy(x)
            return module.InferenceServerClient(url).infer(
                model, [given], request_id=request_id).as_numpy("output")

        # The mlp request is the count's first, traced_bls's its second and last.
        alone = ask(httpclient, server.http, "mlp", "")
        np.testing.assert_allclose(ask(httpclient, server.http, "traced_bls", "b"), 3 * alone,
                                   rtol=1e-5)
        traces = traces_in(wait_for(tmp_path / "trace.json.0"))
        # The count was 2: the mlp request, then traced_bls's; its calls took none of it.
        by_model = {}
        for t in traces:
            by_model.setdefault(t["model_name"], []).append(t)
        [direct, *calls] = by_model["mlp"]
        assert "parent_id" not in direct, direct
        [bls] = by_model["traced_bls"]
        assert bls["request_id"] == "b" and "parent_id" not in bls
        check_points(bls, HTTP_POINTS)
        # Two of its three calls carried its trace.
        assert len(calls) == 2, traces
        at = {p["name"]: p["ns"] for p in bls["timestamps"]}
        for call in calls:
            assert call["parent_id"] == bls["id"], call
            assert call["model_version"] == 1
            check_points(call, MIDDLE)
            ns = [p["ns"] for p in call["timestamps"]]
            assert at["COMPUTE_INPUT_END"] <= ns[0] and ns[-1] <= at["COMPUTE_OUTPUT_START"], \
                (call, bls)
        # The count has run out: the next request, and its calls, are not traced.
        np.testing.assert_allclose(ask(grpcclient, server.grpc, "traced_outer", "o"), 3 * alone,
                                   rtol=1e-5)
        time.sleep(0.5)
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("trace")) == [
            "trace.json.0"]
        # A fresh count: a BLS model called with the trace traces its own calls under its own.
        http = httpclient.InferenceServerClient(server.http)
        http.update_trace_settings(settings={"trace_count": "1"})
        np.testing.assert_allclose(ask(grpcclient, server.grpc, "traced_outer", "o2"),
                                   3 * alone, rtol=1e-5)
        traces = traces_in(wait_for(tmp_path / "trace.json.1"))
        assert len(traces) == 4, traces
        [outer] = [t for t in traces if "parent_id" not in t]
        assert outer["model_name"] == "traced_outer" and outer["request_id"] == "o2"
        check_points(outer, GRPC_POINTS)
        [inner] = [t for t in traces if t.get("parent_id") == outer["id"]]
        assert inner["model_name"] == "traced_bls", inner
        check_points(inner, MIDDLE)
        calls = [t for t in traces if t.get("parent_id") == inner["id"]]
        assert [c["model_name"] for c in calls] == ["mlp", "mlp"], traces
        for call in calls:
            check_points(call, MIDDLE)
