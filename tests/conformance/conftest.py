"""Starts the real `sheaf` binary for the conformance suite.

The server serves a temporary repository linked to the models that scripts/setup.sh fetched,
on free HTTP and gRPC ports read back from its JSON log. SHEAF_BIN names the binary
(scripts/test.sh sets it); the default is target/debug/sheaf.
"""
import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]

MODELS = {
    "mlp": ("model_repository/mlp/1/model.onnx", "batching: {policy: fixed}\nmax_batch_size: 32\nmax_queue_delay_us: 2000\n"),
    "orientation": ("model_repository/orientation/1/model.onnx", "max_batch_size: 8\n"),
    "echo": (".cache/test-models/allint.onnx", ""),
    # JPEG/PNG in, ImageNet classes out (labels.txt from the demo repository).
    "efficientnet": ("model_repository/efficientnet/1/model.onnx",
                     (ROOT / "model_repository/efficientnet/config.yaml").read_text()
                     + f"labels: {ROOT / 'model_repository/efficientnet/labels.txt'}\n"),
}
# A generation model, served on the OpenAI-compatible routes.
GGUF = "model_repository/smollm2/model.gguf"


class Server:
    def __init__(self, http, grpc, metrics, repo, log):
        self.http = http
        self.grpc = grpc
        self.metrics = metrics
        self.repo = repo
        # The server's log lines (JSON), read on as it runs.
        self.log = log

    def model_file(self, name):
        return str(ROOT / MODELS[name][0])


def binary():
    """The `sheaf` binary under test."""
    return os.environ.get("SHEAF_BIN", str(ROOT / "target" / "debug" / "sheaf"))


def launch(repo, *extra, program=None, cwd=None, env=None):
    """Starts `sheaf serve` on `repo` (None: no repository) with `extra` arguments and waits until
    it is ready; returns the process and its Server. `program`, `cwd` and `env` replace the
    binary, the working directory and the environment."""
    where = ["--model-repository", str(repo)] if repo is not None else []
    # Free ports, except those `extra` names.
    given = {str(e).split("=")[0] for e in extra}
    ports = [part for flag in ("--http-port", "--grpc-port", "--metrics-port")
             if flag not in given for part in (flag, "0")]
    proc = subprocess.Popen(
        [program or binary(), "serve", *where, *ports, "--log-format", "json", *extra],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=cwd,
        # No load balancer routes to these servers: a SIGTERM needs no drain delay.
        env={"SHEAF_DRAIN_DELAY": "0", **(os.environ if env is None else env)},
    )
    http = grpc = metrics = None
    log = []
    for line in proc.stderr:
        log.append(line)
        try:
            fields = json.loads(line).get("fields", {})
        except ValueError:
            # What the process prints as it exits on an error is plain text.
            fields = {}
        http = fields.get("address", http)
        grpc = fields.get("grpc_address", grpc)
        metrics = fields.get("metrics_address", metrics)
        if "server ready" in fields.get("message", ""):
            break
    else:
        proc.kill()
        raise RuntimeError("sheaf exited before it was ready:\n" + "".join(log))
    # Keep reading the log so the server never blocks on a full pipe.
    threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()
    return proc, Server(http, grpc, metrics, repo, log)


def start(repo, *extra):
    """Runs `sheaf serve` on `repo` with `extra` arguments; yields the Server, then stops it,
    also when the test using it fails (a `for s in start(...)` loop left by an exception
    closes the generator)."""
    proc, server = launch(repo, *extra)
    try:
        yield server
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def link_gguf(repo):
    gguf = ROOT / GGUF
    assert gguf.is_file(), f"{gguf} is missing: run scripts/setup.sh --test"
    (repo / "smollm2").mkdir()
    (repo / "smollm2" / "model.gguf").symlink_to(gguf)


# A text encoder with its tokenizer and the demo repository's config, served on the embeddings
# routes.
ENCODER = "model_repository/minilm"


def link_encoder(repo):
    source = ROOT / ENCODER
    for part in ("1/model.onnx", "tokenizer.json", "config.yaml"):
        assert (source / part).is_file(), f"{source / part} is missing: run scripts/setup.sh --test"
    (repo / "minilm" / "1").mkdir(parents=True)
    (repo / "minilm" / "1" / "model.onnx").symlink_to(source / "1" / "model.onnx")
    (repo / "minilm" / "tokenizer.json").symlink_to(source / "tokenizer.json")
    (repo / "minilm" / "config.yaml").symlink_to(source / "config.yaml")


def link_models(repo, names):
    for name in names:
        file, config = MODELS[name]
        source = ROOT / file
        assert source.is_file(), f"{source} is missing: run scripts/setup.sh --test"
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.onnx").symlink_to(source)
        if config:
            (repo / name / "config.yaml").write_text(config)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    link_models(repo, MODELS)
    link_gguf(repo)
    link_encoder(repo)
    yield from start(repo)


# The keys of the `protected` server.
API_KEY = "sk-test-inference"
ADMIN_KEY = "sk-test-admin"


@pytest.fixture(scope="session")
def protected(tmp_path_factory):
    """A server that takes an API key for inference and an admin key for the rest."""
    repo = tmp_path_factory.mktemp("protected")
    link_models(repo, ["mlp"])
    link_gguf(repo)
    yield from start(repo, "--api-key", API_KEY, "--admin-key", ADMIN_KEY, "--protect-metrics")


def make_certificates(folder):
    """A CA, a server certificate for localhost and 127.0.0.1, and a client certificate, all
    made with the openssl command; returns their paths."""
    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=folder)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=sheaf test CA",
            "-keyout", "ca.key", "-out", "ca.pem")
    (folder / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    (folder / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")
    return {name: str(folder / name) for name in
            ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


@pytest.fixture(scope="session")
def certificates(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certificates"))


@pytest.fixture(scope="session")
def tls(tmp_path_factory, certificates):
    """A server on TLS: mlp and the generation model."""
    repo = tmp_path_factory.mktemp("tls")
    link_models(repo, ["mlp"])
    link_gguf(repo)
    yield from start(repo, "--tls-cert", certificates["server.pem"],
                     "--tls-key", certificates["server.key"])


@pytest.fixture(scope="session")
def mtls(tmp_path_factory, certificates):
    """A server on mutual TLS: clients must present a certificate the test CA signed."""
    repo = tmp_path_factory.mktemp("mtls")
    link_models(repo, ["mlp"])
    yield from start(repo, "--tls-cert", certificates["server.pem"],
                     "--tls-key", certificates["server.key"],
                     "--tls-client-ca", certificates["ca.pem"])


def infer_scalar(module, url, model, name, value, datatype="FP32"):
    """Sends `value` as the [1, 1] input `name` of `model`, with a client of tritonclient's
    `module` (http or grpc) of its own, closed after; returns the InferResult."""
    import numpy as np
    from tritonclient.utils import triton_to_np_dtype
    i = module.InferInput(name, [1, 1], datatype)
    i.set_data_from_numpy(np.array([[value]], triton_to_np_dtype(datatype)))
    with module.InferenceServerClient(url) as client:
        return client.infer(model, [i])


def events(server, model, inputs):
    """POSTs the KServe JSON `inputs` to `model` asking for server-sent events: the (event,
    data) pairs of the stream, or (status, JSON body) when the server answers without one."""
    import urllib.error
    import urllib.request
    body = json.dumps({"inputs": inputs}).encode()
    request = urllib.request.Request(
        f"http://{server.http}/v2/models/{model}/infer", data=body,
        headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
    try:
        answer = urllib.request.urlopen(request, timeout=30)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    with answer:
        if not answer.headers["Content-Type"].startswith("text/event-stream"):
            return answer.status, json.loads(answer.read())
        got, event = [], "message"
        for line in answer:
            line = line.decode().rstrip("\n")
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                got.append((event, json.loads(line[5:])))
                event = "message"
        return got


def open_events(server, model, inputs):
    """POSTs the KServe JSON `inputs` to `model` asking for server-sent events, and returns the
    open response (for the caller to close) with an iterator over its events' data, parsed,
    read as they come."""
    import urllib.request
    body = json.dumps({"inputs": inputs}).encode()
    request = urllib.request.Request(
        f"http://{server.http}/v2/models/{model}/infer", data=body,
        headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
    answer = urllib.request.urlopen(request, timeout=60)
    return answer, (json.loads(line[5:]) for line in answer if line.startswith(b"data:"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory):
    """A JetStream-enabled nats-server on a loopback port."""
    port = free_port()
    store = tmp_path_factory.mktemp("jetstream")
    proc = subprocess.Popen(
        ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError("nats-server did not start")
    yield f"nats://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)


# A batched-API Python model that multiplies its input by a factor written into its code: a
# model whose answers show which of its versions (or loads) served.
SCALED_CODE = '''
def infer(inputs):
    return {{"y": inputs["x"] * {factor}}}
'''
SCALED_CONFIG = '''
backend: "python"
max_batch_size: 8
dynamic_batching { }
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
'''


def write_scaled(folder, factor):
    """A scaled model (see SCALED_CODE) in `folder`, Triton's layout: its code in version 1."""
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.py").write_text(SCALED_CODE.format(factor=factor))
    (folder / "config.pbtxt").write_text(SCALED_CONFIG)


def ask_scaled(client, model):
    """A scaled model's answer to 1 over HTTP."""
    import numpy as np
    import tritonclient.http as httpclient
    x = httpclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones((1, 1), np.float32))
    return float(client.infer(model, [x]).as_numpy("y")[0, 0])


def http(url, body=None, content_type="application/json", headers=(), method=None):
    """A GET (no body) or a POST of `body` to `url` (or `method`): its status, headers and body,
    errors included."""
    method = method or ("POST" if body is not None else "GET")
    request = urllib.request.Request(url, data=body, method=method,
                                     headers={"Content-Type": content_type, **dict(headers)})
    try:
        with urllib.request.urlopen(request) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def post_json(server, route, body):
    """POSTs `body` as JSON to `route` on `server`'s HTTP port: its JSON answer (an error
    status raises)."""
    request = urllib.request.Request(f"http://{server.http}{route}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.load(r)


@pytest.fixture(scope="module")
def client(server):
    """The `openai` package's client, unmodified, on the shared server's `/v1` routes."""
    return openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="not-needed")


def runner_pids(model_file):
    """The live processes running the Python model file `model_file`."""
    wanted = str(model_file).encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if wanted in args and state != "Z":
            pids.append(int(entry))
    return sorted(pids)


@pytest.fixture(scope="session")
def tei(tmp_path_factory):
    """TEI's gRPC stubs, generated from the proto sheaf serves as TEI's users generate theirs."""
    import importlib
    import sys
    out = tmp_path_factory.mktemp("tei_stubs")
    proto = ROOT / "crates" / "sheaf-server" / "proto"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{proto}", f"--python_out={out}",
                    f"--grpc_python_out={out}", str(proto / "tei.proto")], check=True)
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module("tei_pb2"), importlib.import_module("tei_pb2_grpc")
    finally:
        sys.path.remove(str(out))
