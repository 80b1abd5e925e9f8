"""tritonserver's --backend-config, --allow-cpu-metrics and --allow-gpu-metrics against the real
`sheaf` binary: default-max-batch-size completes a model whose configuration gives no batch
size (the backend's own value before every backend's), and batches keep to it; the Python
backend's stub settings are taken and said so in the log; other settings and backends stop the
start; --allow-cpu-metrics false leaves the host's gauges out of /metrics."""
import json
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import ROOT, launch, start


@pytest.fixture
def repo(tmp_path):
    # The MLP with no configuration: its batch size is the server's default.
    (tmp_path / "mlp" / "1").mkdir(parents=True)
    (tmp_path / "mlp" / "1" / "model.onnx").symlink_to(ROOT / "model_repository/mlp/1/model.onnx")
    return tmp_path


def get(url):
    with urllib.request.urlopen(url) as r:
        return r.read().decode()


def test_default_max_batch_size_completes_the_config_and_bounds_the_batches(repo):
    flags = ["--backend-config", "default-max-batch-size=4",
             "--backend-config", "python,default-max-batch-size=2",
             "--backend-config=python,shm-default-byte-size=67108864",
             "--backend-config=python,stub-timeout-seconds=600"]
    for server in start(repo, *flags):
        config = json.loads(get(f"http://{server.http}/v2/models/mlp/config"))
        assert config["max_batch_size"] == 4, config
        client = httpclient.InferenceServerClient(server.http)
        x = httpclient.InferInput("input", [10, 512], "FP32")
        x.set_data_from_numpy(np.full((10, 512), 0.5, np.float32))
        assert client.infer("mlp", [x]).as_numpy("output").shape == (10, 10)
        stats = client.get_inference_statistics("mlp")["model_stats"][0]
        sizes = [b["batch_size"] for b in stats["batch_stats"]]
        assert sizes and max(sizes) <= 4, stats
        deadline = time.monotonic() + 5
        taken = []
        while len(taken) < 2 and time.monotonic() < deadline:
            taken = [l for l in server.log if "taken with nothing to set" in l]
            time.sleep(0.05)
        assert any("shm-default-byte-size" in l and "grow" in l for l in taken), taken
        assert any("stub-timeout-seconds" in l for l in taken), taken
    # Without the flag: sheaf's own default.
    for server in start(repo):
        config = json.loads(get(f"http://{server.http}/v2/models/mlp/config"))
        assert config["max_batch_size"] == 32, config


def test_a_backend_s_own_default_comes_before_every_backend_s(repo):
    for server in start(repo, "--backend-config=default-max-batch-size=4",
                        "--backend-config=onnxruntime,default-max-batch-size=6"):
        config = json.loads(get(f"http://{server.http}/v2/models/mlp/config"))
        assert config["max_batch_size"] == 6, config


def test_host_metrics_can_be_left_out(repo):
    for server in start(repo, "--allow-cpu-metrics=false", "--allow-gpu-metrics", "true"):
        text = get(f"http://{server.metrics}/metrics")
        assert "nv_inference_count" in text or "sheaf_" in text
        assert "nv_cpu_" not in text, text
    for server in start(repo):
        assert "nv_cpu_memory_total_bytes" in get(f"http://{server.metrics}/metrics")


@pytest.mark.parametrize("flag, why", [
    ("--backend-config=tensorflow,version=2", "sheaf has no 'tensorflow' backend"),
    ("--backend-config=onnxruntime,enable-global-threadpool=1", "settings are per model"),
    ("--backend-config=python,shm-default-byte-size=big", "is not a number"),
])
def test_settings_sheaf_does_not_take_stop_the_start(repo, flag, why):
    with pytest.raises(RuntimeError) as stopped:
        proc, _ = launch(repo, flag)
        proc.kill()
    assert why in str(stopped.value)
