"""tritonserver's start-up flags for what a failed model means: `--exit-on-error` stops the real
`sheaf` binary at start naming the model and why, and `--strict-readiness` keeps it not ready
(over HTTP and gRPC) while a model's last load failed, ready again once that model loads; and a
Triton model of a kind sheaf does not run is listed as unavailable with the reason. And at
start the server raises its own limit on open files to the hard limit."""
import os
import resource
import shlex
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, binary, launch, link_models, start


def broken_repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    link_models(repo, ["mlp"])
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    return repo


def test_exit_on_error_stops_the_start_naming_the_model(tmp_path):
    repo = broken_repo(tmp_path)
    with pytest.raises(RuntimeError) as stopped:
        proc, _ = launch(repo, "--exit-on-error=true")
        proc.kill()
    assert "--exit-on-error: 1 model(s) did not load: 'broken'" in str(stopped.value)


def test_without_strict_readiness_a_failed_model_leaves_the_server_ready(tmp_path):
    # Triton's name for --shutdown-timeout is taken too.
    for server in start(broken_repo(tmp_path), "--exit-timeout-secs", "5"):
        assert httpclient.InferenceServerClient(server.http).is_server_ready()
        assert not httpclient.InferenceServerClient(server.http).is_model_ready("broken")


def test_strict_readiness_waits_for_every_model_that_was_tried(tmp_path):
    repo = broken_repo(tmp_path)
    for server in start(repo, "--strict-readiness", "true", "--model-control-mode", "explicit",
                        "--load-model", "*"):
        http = httpclient.InferenceServerClient(server.http)
        grpc = grpcclient.InferenceServerClient(server.grpc)
        assert http.is_server_live() and grpc.is_server_live()
        assert not http.is_server_ready() and not grpc.is_server_ready()
        assert http.is_model_ready("mlp")
        # The model mended and loaded again: ready.
        os.remove(repo / "broken" / "1" / "model.onnx")
        (repo / "broken" / "1" / "model.onnx").symlink_to(ROOT / "model_repository/mlp/1/model.onnx")
        http.load_model("broken")
        assert http.is_server_ready() and grpc.is_server_ready()


def test_a_triton_model_sheaf_does_not_run_is_listed_unavailable_with_the_reason(tmp_path):
    """A TorchScript folder from a Triton repository is not left out as if it were not there:
    the index lists it UNAVAILABLE saying what it is and what to do, and its requests get that."""
    repo = broken_repo(tmp_path)
    (repo / "torchscript" / "1").mkdir(parents=True)
    (repo / "torchscript" / "1" / "model.pt").write_bytes(b"TorchScript archive")
    (repo / "torchscript" / "config.pbtxt").write_text(
        'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n')
    for server in start(repo):
        http = httpclient.InferenceServerClient(server.http)
        index = {m["name"]: m for m in http.get_model_repository_index()}
        assert index["torchscript"]["state"] == "UNAVAILABLE", index
        assert "platform 'pytorch_libtorch'" in index["torchscript"]["reason"], index
        assert "Export the model to ONNX" in index["torchscript"]["reason"], index
        assert not http.is_model_ready("torchscript")
        given = httpclient.InferInput("INPUT__0", [1, 4], "FP32")
        given.set_data_from_numpy(np.zeros((1, 4), np.float32))
        with pytest.raises(InferenceServerException) as refused:
            http.infer("torchscript", [given])
        assert "pytorch_libtorch" in str(refused.value), refused.value
        assert http.is_model_ready("mlp")


def test_allow_flags_leave_out_the_endpoints_they_turn_off(tmp_path):
    """`--allow-grpc false` and `--allow-metrics false`, as tritonserver takes them: no listener
    opens for those, HTTP serves; and turning off both HTTP and gRPC is refused."""
    repo = tmp_path / "repo"
    repo.mkdir()
    link_models(repo, ["mlp"])
    for server in start(repo, "--allow-grpc", "false", "--allow-metrics=false"):
        # No listener was opened for them (the log names each listener it opens).
        assert server.grpc is None and server.metrics is None
        log = "".join(server.log)
        assert "gRPC listening" not in log and "metrics on" not in log, log
        assert "gRPC off (--allow-grpc false)" in log and "metrics off" in log, log
        assert httpclient.InferenceServerClient(server.http).is_model_ready("mlp")
    with pytest.raises(RuntimeError) as stopped:
        proc, _ = launch(repo, "--allow-http", "false", "--allow-grpc", "false")
        proc.kill()
    assert "leave no way to reach the models" in str(stopped.value)


def test_each_listener_binds_the_address_its_flag_gives(tmp_path):
    """`--grpc-address` and `--metrics-address`, as tritonserver takes them, in place of
    --host for that listener (127.0.0.2 is this machine too)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    link_models(repo, ["mlp"])
    for server in start(repo, "--grpc-address", "127.0.0.2", "--metrics-address", "127.0.0.2"):
        assert server.http.startswith("127.0.0.1:"), server.http
        assert server.grpc.startswith("127.0.0.2:") and server.metrics.startswith("127.0.0.2:")
        assert grpcclient.InferenceServerClient(server.grpc).is_model_ready("mlp")
        with urllib.request.urlopen(f"http://{server.metrics}/metrics") as r:
            assert r.status == 200


# A Python model whose initialize takes 1 s and records when it began and ended.
RECORDING = '''
import os
import time


class TritonPythonModel:
    def initialize(self, args):
        began = time.time()
        time.sleep(1.0)
        folder = os.path.dirname(args["model_repository"])
        with open(os.path.join(folder, args["model_name"] + ".times"), "w") as f:
            f.write(f"{began} {time.time()}")

    def execute(self, requests):
        return []
'''
RECORDING_CONFIG = '''
backend: "python"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
'''


@pytest.mark.parametrize("at_once", [1, 0])
def test_model_load_thread_count_bounds_the_loads_at_start(tmp_path, at_once):
    """`--model-load-thread-count 1` (Triton's flag) loads the models at start one at a time: no
    two initialize calls overlap; 0, the default, loads them all at once."""
    repo = tmp_path / "repo"
    for name in ("a", "b", "c"):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(RECORDING)
        (repo / name / "config.pbtxt").write_text(RECORDING_CONFIG)
    for server in start(repo, "--model-load-thread-count", str(at_once)):
        http = httpclient.InferenceServerClient(server.http)
        assert all(http.is_model_ready(m) for m in ("a", "b", "c"))
    spans = sorted(tuple(map(float, (repo / f"{m}.times").read_text().split()))
                   for m in ("a", "b", "c"))
    overlaps = sum(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:]))
    if at_once == 1:
        assert overlaps == 0, spans
    else:
        assert overlaps >= 1, spans


AUTO_COMPLETED = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_max_batch_size(8)
        config.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [2]})
        config.add_output({"name": "y", "data_type": "TYPE_FP32", "dims": [2]})
        return config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() * 2)]) for r in requests]
'''
MLP_CONFIG = '''
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ { name: "input" data_type: TYPE_FP32 dims: [ 512 ] } ]
output [ { name: "output" data_type: TYPE_FP32 dims: [ 10 ] } ]
'''


def auto_complete_repo(tmp_path):
    """An ONNX model with no configuration, the same with a whole one, one that leaves its
    output out, and a Python model whose configuration comes from its auto_complete_config."""
    repo = tmp_path / "repo"
    repo.mkdir()
    link_models(repo, ["mlp"])
    (repo / "mlp" / "config.yaml").unlink()
    for name, config in (("declared", MLP_CONFIG),
                         ("half", MLP_CONFIG.split("output")[0])):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.onnx").symlink_to(ROOT / "model_repository/mlp/1/model.onnx")
        (repo / name / "config.pbtxt").write_text(config)
    (repo / "completes" / "1").mkdir(parents=True)
    (repo / "completes" / "1" / "model.py").write_text(AUTO_COMPLETED)
    return repo


@pytest.mark.parametrize("flag", [["--disable-auto-complete-config"],
                                  ["--strict-model-config=true"]])
def test_without_auto_complete_a_model_s_configuration_gives_all_it_serves(tmp_path, flag):
    """tritonserver's --disable-auto-complete-config (and its older --strict-model-config=true):
    a model whose configuration leaves out an input, an output or their types fails to load
    naming what is missing, a whole configuration serves as it says, and a Python model's
    auto_complete_config is not called."""
    for server in start(auto_complete_repo(tmp_path), *flag):
        http = httpclient.InferenceServerClient(server.http)
        index = {m["name"]: m for m in http.get_model_repository_index()}
        assert index["declared"]["state"] == "READY", index
        for name, says in (("mlp", "the model's input 'input' is not declared"),
                           ("half", "the model's output 'output' is not declared"),
                           ("completes", "auto_complete_config is not called")):
            assert index[name]["state"] == "UNAVAILABLE", index
            assert says in index[name]["reason"], index[name]
        assert "--disable-auto-complete-config" in index["mlp"]["reason"]
        assert http.get_model_config("declared")["max_batch_size"] == 16
        given = httpclient.InferInput("input", [3, 512], "FP32")
        x = np.random.default_rng(0).standard_normal((3, 512), dtype=np.float32)
        given.set_data_from_numpy(x)
        assert http.infer("declared", [given]).as_numpy("output").shape == (3, 10)


def test_with_auto_complete_the_same_models_serve(tmp_path):
    """The default, and --strict-model-config=false as older Triton command lines give it:
    the configurations are completed from the models."""
    for server in start(auto_complete_repo(tmp_path), "--strict-model-config=false"):
        http = httpclient.InferenceServerClient(server.http)
        index = {m["name"]: m["state"] for m in http.get_model_repository_index()}
        assert index == {"mlp": "READY", "declared": "READY", "half": "READY",
                         "completes": "READY"}, index
        assert http.get_model_config("completes")["max_batch_size"] == 8
        given = httpclient.InferInput("x", [1, 2], "FP32")
        given.set_data_from_numpy(np.array([[1, 2]], np.float32))
        assert http.infer("completes", [given]).as_numpy("y").tolist() == [[2, 4]]


def ensemble(output):
    return f'''
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "RAW" data_type: TYPE_FP32 dims: [ 512 ] }} ]
output [ {{ name: "{output}" data_type: TYPE_FP32 dims: [ 10 ] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "mlp" input_map {{ key: "input" value: "RAW" }}
    output_map {{ key: "output" value: "{output}" }} }}
] }}
'''


def test_model_config_name_reads_each_folder_s_custom_configuration(tmp_path):
    """tritonserver's --model-config-name h100: a folder's configs/h100.pbtxt is read over its
    own configuration (config.pbtxt, or sheaf's config.yaml), for models and ensembles alike; a
    folder without one keeps its own."""
    repo = tmp_path / "repo"
    repo.mkdir()
    link_models(repo, ["mlp"])  # with a config.yaml: max_batch_size 32
    (repo / "mlp" / "configs").mkdir()
    (repo / "mlp" / "configs" / "h100.pbtxt").write_text(MLP_CONFIG.replace("16", "4"))
    (repo / "plain" / "1").mkdir(parents=True)
    (repo / "plain" / "1" / "model.onnx").symlink_to(ROOT / "model_repository/mlp/1/model.onnx")
    (repo / "plain" / "config.pbtxt").write_text(MLP_CONFIG)
    (repo / "plain" / "configs").mkdir()
    (repo / "plain" / "configs" / "a100.pbtxt").write_text(MLP_CONFIG.replace("16", "2"))
    (repo / "pair" / "1").mkdir(parents=True)
    (repo / "pair" / "config.pbtxt").write_text(ensemble("BY_DEFAULT"))
    (repo / "pair" / "configs").mkdir()
    (repo / "pair" / "configs" / "h100.pbtxt").write_text(ensemble("ON_H100"))
    x = np.random.default_rng(1).standard_normal((1, 512), dtype=np.float32)
    for named, sizes, output in (([], (32, 16), "BY_DEFAULT"),
                                 (["--model-config-name", "h100"], (4, 16), "ON_H100")):
        for server in start(repo, *named):
            http = httpclient.InferenceServerClient(server.http)
            assert http.get_model_config("mlp")["max_batch_size"] == sizes[0]
            assert http.get_model_config("plain")["max_batch_size"] == sizes[1]
            metadata = http.get_model_metadata("pair")
            assert metadata["platform"] == "ensemble", metadata
            assert [o["name"] for o in metadata["outputs"]] == [output], metadata
            given = httpclient.InferInput("RAW", [1, 512], "FP32")
            given.set_data_from_numpy(x)
            answer = http.infer("pair", [given]).as_numpy(output)
            mlp = httpclient.InferInput("input", [1, 512], "FP32")
            mlp.set_data_from_numpy(x)
            assert np.allclose(answer, http.infer("mlp", [mlp]).as_numpy("output"))


def test_a_model_config_name_that_is_not_a_plain_name_is_refused(tmp_path):
    repo = broken_repo(tmp_path)
    with pytest.raises(RuntimeError) as stopped:
        proc, _ = launch(repo, "--model-config-name", "../h100")
        proc.kill()
    assert "--model-config-name '../h100': give a plain name" in str(stopped.value)


def test_id_names_the_server_and_model_store_is_the_repository(tmp_path):
    """tritonserver's --id names the server in its metadata over HTTP and gRPC, and
    --model-store is its other name for --model-repository."""
    repo = broken_repo(tmp_path)
    proc, server = launch(None, "--model-store", str(repo), "--id", "edge-7")
    try:
        http = httpclient.InferenceServerClient(server.http)
        assert http.get_server_metadata()["name"] == "edge-7"
        grpc = grpcclient.InferenceServerClient(server.grpc)
        assert grpc.get_server_metadata().name == "edge-7"
        assert http.is_model_ready("mlp")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_tritonserver_flag_sheaf_does_not_take_is_refused_with_what_to_do(tmp_path):
    repo = broken_repo(tmp_path)
    for flag, says in (("--pinned-memory-pool-byte-size=268435456",
                        "pinned staging memory per model instance"),
                       ("--http-thread-count=16", "server threads are set with --io-cpus")):
        with pytest.raises(RuntimeError) as stopped:
            proc, _ = launch(repo, flag)
            proc.kill()
        refused = str(stopped.value)
        assert f"tritonserver's {flag.split('=')[0]} is not one of sheaf's flags" in refused
        assert says in refused, refused


def test_several_model_repositories_serve_as_one(tmp_path):
    """--model-repository given twice (as tritonserver takes it): the models of both serve, an
    ensemble in one runs a model of the other, and a name in both fails saying where."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    link_models(first, ["mlp"])
    for repo in (first, second):
        (repo / "dup" / "1").mkdir(parents=True)
        (repo / "dup" / "1" / "model.onnx").symlink_to(ROOT / "model_repository/mlp/1/model.onnx")
    (second / "pair" / "1").mkdir(parents=True)
    (second / "pair" / "config.pbtxt").write_text(ensemble("OUT"))
    proc, server = launch(first, "--model-repository", str(second))
    try:
        http = httpclient.InferenceServerClient(server.http)
        index = {m["name"]: m for m in http.get_model_repository_index()}
        assert index["mlp"]["state"] == "READY" and index["pair"]["state"] == "READY", index
        assert index["dup"]["state"] == "UNAVAILABLE", index
        assert "is in more than one model repository" in index["dup"]["reason"], index
        given = httpclient.InferInput("RAW", [1, 512], "FP32")
        given.set_data_from_numpy(np.ones((1, 512), np.float32))
        assert http.infer("pair", [given]).as_numpy("OUT").shape == (1, 10)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def http2_frames(sock, seconds):
    """The HTTP/2 frames (type, flags) read from `sock` for `seconds`, or until it closes; and
    whether it closed."""
    import time
    sock.settimeout(0.1)
    data, frames, deadline = b"", [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            return frames, True
        data += chunk
        while len(data) >= 9:
            length = int.from_bytes(data[:3], "big")
            if len(data) < 9 + length:
                break
            frames.append((data[3], data[4]))
            data = data[9 + length:]
    return frames, False


def test_grpc_keepalive_pings_each_connection_and_closes_a_silent_one(tmp_path):
    """tritonserver's --grpc-keepalive-time and --grpc-keepalive-timeout: the gRPC port pings an
    open connection at that interval (an HTTP/2 PING frame), and closes one whose ping is not
    answered in time; tritonclient, which answers, is served across the pings. Without the flag
    there are no pings."""
    import socket
    import time
    repo = broken_repo(tmp_path)
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
    for server in start(repo, "--grpc-keepalive-time", "300", "--grpc-keepalive-timeout", "500"):
        host, port = server.grpc.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as silent:
            silent.sendall(preface)
            frames, closed = http2_frames(silent, 5)
        PING, GOAWAY = 6, 7
        assert (PING, 0) in frames, frames
        assert closed or GOAWAY in [t for t, _ in frames], (frames, "the silent one was kept")
        grpc = grpcclient.InferenceServerClient(server.grpc)
        given = grpcclient.InferInput("input", [1, 512], "FP32")
        given.set_data_from_numpy(np.ones((1, 512), np.float32))
        for _ in range(3):
            assert grpc.infer("mlp", [given]).as_numpy("output").shape == (1, 10)
            time.sleep(0.6)
    for server in start(repo):
        host, port = server.grpc.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as quiet:
            quiet.sendall(preface)
            frames, closed = http2_frames(quiet, 1.5)
        assert (6, 0) not in frames and not closed, frames
    with pytest.raises(RuntimeError) as stopped:
        proc, _ = launch(repo, "--grpc-keepalive-timeout", "500")
        proc.kill()
    assert "is read with --grpc-keepalive-time" in str(stopped.value)


def test_servers_share_a_port_with_reuse_port(tmp_path):
    """--reuse-http-port and --reuse-grpc-port (SO_REUSEPORT): two servers on one HTTP port and
    one gRPC port both start and both serve the connections the kernel spreads over them; a
    server without the flag cannot take the port."""
    from conftest import free_port
    repo = tmp_path / "repo"
    repo.mkdir()
    link_models(repo, ["mlp"])
    http_port, grpc_port = free_port(), free_port()
    shared = ["--http-port", str(http_port), "--grpc-port", str(grpc_port),
              "--reuse-http-port=true", "--reuse-grpc-port", "true"]
    servers = [launch(repo, *shared) for _ in range(2)]
    try:
        x = httpclient.InferInput("input", [1, 512], "FP32")
        x.set_data_from_numpy(np.full((1, 512), 0.5, dtype=np.float32))
        for _ in range(40):
            # A client per request: a connection each, placed by the kernel.
            httpclient.InferenceServerClient(f"127.0.0.1:{http_port}").infer("mlp", [x])
        g = grpcclient.InferInput("input", [1, 512], "FP32")
        g.set_data_from_numpy(np.full((1, 512), 0.5, dtype=np.float32))
        for _ in range(10):
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
            client.infer("mlp", [g])
            client.close()
        # Each server's own count, read on its own metrics port.
        counts = []
        for _, server in servers:
            with urllib.request.urlopen(f"http://{server.metrics}/metrics") as r:
                text = r.read().decode()
            line = next(l for l in text.splitlines()
                        if l.startswith("nv_inference_request_success{"))
            counts.append(float(line.rsplit(" ", 1)[1]))
        assert sum(counts) == 50 and min(counts) > 0, counts
        with pytest.raises(RuntimeError) as refused:
            proc, _ = launch(repo, "--http-port", str(http_port))
            proc.kill()
        assert "cannot listen" in str(refused.value), refused.value
    finally:
        for proc, _ in servers:
            proc.kill()


# Fails to initialize on its first try, and loads on the next (a marker file beside it says
# which try it is).
FLAKY = '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        marker = os.path.join(os.path.dirname(__file__), "tried")
        if not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("not this time")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())]) for r in requests]
'''
FLAKY_CONFIG = '''
backend: "python"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
'''


def flaky_repo(path):
    (path / "flaky" / "1").mkdir(parents=True)
    (path / "flaky" / "1" / "model.py").write_text(FLAKY)
    (path / "flaky" / "config.pbtxt").write_text(FLAKY_CONFIG)
    return path


def test_model_load_retry_count_tries_a_failed_load_again(tmp_path):
    for server in start(flaky_repo(tmp_path / "retried"), "--model-load-retry-count", "1"):
        client = httpclient.InferenceServerClient(server.http)
        assert client.is_model_ready("flaky")
        assert any("trying again" in line and "not this time" in line for line in server.log)
    for server in start(flaky_repo(tmp_path / "once")):
        client = httpclient.InferenceServerClient(server.http)
        assert not client.is_model_ready("flaky")
        (entry,) = [m for m in client.get_model_repository_index() if m["name"] == "flaky"]
        assert "not this time" in entry["reason"], entry


def test_grpc_max_connection_age_sends_clients_away_then_closes(tmp_path):
    """tritonserver's --grpc-max-connection-age and --grpc-max-connection-age-grace: a gRPC
    connection gets a GOAWAY (no error) once it is that old, and one whose call is still open
    is closed the grace later; tritonclient reconnects and every call is answered."""
    import socket
    import time
    repo = broken_repo(tmp_path)
    path = b"/inference.GRPCInferenceService/ModelInfer"
    # HPACK: POST, http, the path and authority as literals, content-type (static 31), te.
    block = (b"\x83\x86" + b"\x04" + bytes([len(path)]) + path + b"\x01\x01x"
             + b"\x0f\x10\x10application/grpc" + b"\x00\x02te\x08trailers")
    open_call = len(block).to_bytes(3, "big") + bytes([1, 4]) + (1).to_bytes(4, "big") + block
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
    for server in start(repo, "--grpc-max-connection-age", "400",
                        "--grpc-max-connection-age-grace", "600"):
        host, port = server.grpc.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            began = time.monotonic()
            # A call whose request never ends: the connection has a stream open throughout.
            sock.sendall(preface + open_call)
            goaway_at, buffer = None, b""
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                buffer += chunk
                while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
                    size = int.from_bytes(buffer[:3], "big")
                    if buffer[3] == 7 and goaway_at is None:
                        goaway_at = time.monotonic() - began
                        assert int.from_bytes(buffer[13:17], "big") == 0, buffer[9:9 + size]
                    buffer = buffer[9 + size:]
            closed_at = time.monotonic() - began
        assert goaway_at is not None and goaway_at >= 0.35, goaway_at
        # Closed at the grace's end, not at the body timeout's (60 s).
        assert 0.95 <= closed_at < 10, (goaway_at, closed_at)
        client = grpcclient.InferenceServerClient(server.grpc)
        given = grpcclient.InferInput("input", [1, 512], "FP32")
        given.set_data_from_numpy(np.ones((1, 512), np.float32))
        for _ in range(12):
            assert client.infer("mlp", [given]).as_numpy("output").shape == (1, 10)
            time.sleep(0.1)
    with pytest.raises(RuntimeError) as stopped:
        proc, _ = launch(repo, "--grpc-max-connection-age-grace", "500")
        proc.kill()
    assert "is read with --grpc-max-connection-age" in str(stopped.value)


def test_the_server_raises_its_open_files_limit_to_the_hard_limit(tmp_path):
    # Started with a soft limit of 256, below the hard limit (a shell's `ulimit -Sn`), the server
    # raises its own: each connection, Python instance and configured batching delay holds a
    # descriptor, and a thousand models need more than the common default of 1,024.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == resource.RLIM_INFINITY or hard > 256, hard
    repo = tmp_path / "repo"
    repo.mkdir()
    link_models(repo, ["mlp"])
    low = tmp_path / "low-limit"
    low.write_text(f'#!/bin/sh\nulimit -Sn 256\nexec {shlex.quote(binary())} "$@"\n')
    low.chmod(0o755)
    proc, server = launch(repo, program=str(low))
    try:
        limits = Path(f"/proc/{proc.pid}/limits").read_text().splitlines()
        soft_now, hard_now = next(l for l in limits if l.startswith("Max open files")).split()[3:5]
        assert soft_now == hard_now, limits
        assert httpclient.InferenceServerClient(server.http).is_model_ready("mlp")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
