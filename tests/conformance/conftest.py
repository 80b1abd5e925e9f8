"""Starts the real `sheaf` binary for the conformance suite.

The server serves a temporary repository linked to the models that scripts/setup.sh fetched,
on free HTTP and gRPC ports read back from its JSON log. SHEAF_BIN names the binary
(scripts/test.sh sets it); the default is target/debug/sheaf.
"""
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

MODELS = {
    "mlp": ("model_repository/mlp/1/model.onnx", "batching: {policy: fixed}\nmax_batch_size: 32\nmax_queue_delay_us: 2000\n"),
    "orientation": ("model_repository/orientation/1/model.onnx", "max_batch_size: 8\n"),
    "echo": (".cache/test-models/allint.onnx", ""),
}
# A generation model, served on the OpenAI-compatible routes.
GGUF = "model_repository/smollm2/model.gguf"


class Server:
    def __init__(self, http, grpc, repo):
        self.http = http
        self.grpc = grpc
        self.repo = repo

    def model_file(self, name):
        return str(ROOT / MODELS[name][0])


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    for name, (file, config) in MODELS.items():
        source = ROOT / file
        assert source.is_file(), f"{source} is missing: run scripts/setup.sh --test"
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.onnx").symlink_to(source)
        if config:
            (repo / name / "config.yaml").write_text(config)
    gguf = ROOT / GGUF
    assert gguf.is_file(), f"{gguf} is missing: run scripts/setup.sh --test"
    (repo / "smollm2").mkdir()
    (repo / "smollm2" / "model.gguf").symlink_to(gguf)
    binary = os.environ.get("SHEAF_BIN", str(ROOT / "target" / "debug" / "sheaf"))
    proc = subprocess.Popen(
        [binary, "serve", "--model-repository", str(repo), "--http-port", "0", "--grpc-port", "0",
         "--metrics-port", "0", "--log-format", "json"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )
    http = grpc = None
    log = []
    for line in proc.stderr:
        log.append(line)
        fields = json.loads(line).get("fields", {})
        http = fields.get("address", http)
        grpc = fields.get("grpc_address", grpc)
        if "server ready" in fields.get("message", ""):
            break
    else:
        proc.kill()
        raise RuntimeError("sheaf exited before it was ready:\n" + "".join(log))
    # Keep draining the log so the server never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    yield Server(http, grpc, repo)
    proc.terminate()
    proc.wait(timeout=10)
