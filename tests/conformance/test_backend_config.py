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


def metric_lines(text, name):
    """{labels: value} of the samples of `name` (the exact name, labels as written)."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name):].rsplit(" ", 1)
            out[labels] = float(value)
    return out


def test_metrics_config_adds_summaries_and_drops_the_latency_counters(repo):
    """tritonserver's --metrics-config: the five latency summaries with the quantiles asked
    for, their _count and _sum the statistics extension's figures; counter_latencies=false
    takes the cumulative counters out; --metrics-interval-ms is taken and logged."""
    flags = ["--metrics-config", "summary_latencies=true",
             "--metrics-config=summary_quantiles=0.5:0.05,0.9:0.01,0.99:0.001",
             "--metrics-config", "counter_latencies=false", "--metrics-interval-ms=2000"]
    for server in start(repo, *flags):
        client = httpclient.InferenceServerClient(server.http)
        for i in range(20):
            x = httpclient.InferInput("input", [1, 512], "FP32")
            x.set_data_from_numpy(np.full((1, 512), i, dtype=np.float32))
            client.infer("mlp", [x])
        text = get(f"http://{server.metrics}/metrics")
        stats = client.get_inference_statistics("mlp")["model_stats"][0]["inference_stats"]
        base = '{model="mlp",version="1"}'
        assert "# TYPE nv_inference_request_summary_us summary" in text, text
        count = metric_lines(text, "nv_inference_request_summary_us_count")
        assert count == {base: 20.0}, count
        total = metric_lines(text, "nv_inference_request_summary_us_sum")[base]
        assert abs(total - stats["success"]["ns"] / 1000) < 1e-3, (total, stats["success"])
        for family in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
            q = metric_lines(text, f"nv_inference_{family}_summary_us")
            got = [q[f'{{model="mlp",version="1",quantile="{p}"}}'] for p in (0.5, 0.9, 0.99)]
            assert 0 <= got[0] <= got[1] <= got[2], (family, got)
        request = metric_lines(text, "nv_inference_request_summary_us")
        p99 = request['{model="mlp",version="1",quantile="0.99"}']
        assert 0 < p99 <= total, (p99, total)
        assert "nv_inference_request_duration_us" not in text
        assert "nv_inference_compute_infer_duration_us" not in text
        assert metric_lines(text, "nv_inference_request_success") == {base: 20.0}
        assert any("--metrics-interval-ms" in line for line in server.log), server.log[-5:]
    # By default: the counters, no summaries.
    for server in start(repo):
        text = get(f"http://{server.metrics}/metrics")
        assert "nv_inference_request_duration_us" in text and "_summary_us" not in text


@pytest.mark.parametrize("setting, why", [
    ("histogram_latencies=true", "sheaf takes summary_latencies"),
    ("summary_quantiles=2:0.1", "not QUANTILE:ERROR"),
    ("summary_latencies=maybe", "give true or false"),
])
def test_metrics_settings_sheaf_does_not_take_stop_the_start(repo, setting, why):
    with pytest.raises(RuntimeError) as stopped:
        proc, _ = launch(repo, "--metrics-config", setting)
        proc.kill()
    assert why in str(stopped.value)
