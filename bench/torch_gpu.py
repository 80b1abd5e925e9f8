"""The answers and the memory of the PyTorch example (examples/torch_mlp) served by sheaf on
one device, which bench/torch_gpu.sh started (its in-process figures come from
bench/python/inprocess.py).

Usage: torch_gpu.py MODEL_DIR DEVICE URL MODEL   -> one JSON line
       torch_gpu.py booked URL MODEL             -> what /stats books and the driver lists now
"""
import concurrent.futures
import importlib.util
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np


def module(folder):
    spec = importlib.util.spec_from_file_location("torch_mlp", Path(folder) / "model.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def call(url, model, x):
    body = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                        "data": x.ravel().tolist()}]}
    req = urllib.request.Request(f"{url}/v2/models/{model}/infer", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        out = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in json.load(r)["outputs"]}
    return out


def gpu_listing():
    try:
        return subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                               "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def check(folder, device, url, model):
    """64 concurrent requests of 1-4 items against the same network on the CPU, then what the
    server books for the model and what the driver lists."""
    import torch
    net = module(folder).build()
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((int(rng.integers(1, 5)), 512)).astype(np.float32) for _ in range(64)]
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(lambda x: call(url, model, x), xs))
    with torch.inference_mode():
        want = [net(torch.from_numpy(x)).numpy() for x in xs]
    worst = max(float(np.max(np.abs(a["output"] - w))) for a, w in zip(answers, want))
    on_gpu = sorted({int(v) for a in answers for v in a["on_gpu"].ravel()})
    stats = json.load(urllib.request.urlopen(f"{url}/v2/models/{model}/stats"))
    executions = stats["model_stats"][0]["execution_count"]
    print(json.dumps({
        "requests": len(xs), "executions": executions, "max_abs_diff_vs_cpu": worst,
        "on_gpu": on_gpu, "device": device, **booked(url, model),
    }))


def booked(url, model):
    """What /stats books for the model (and where the figure comes from), and what the driver
    lists per process."""
    served = json.load(urllib.request.urlopen(f"{url}/stats"))
    entry = served.get("models", {}).get(model, {})
    return {"memory_bytes": entry.get("memory_bytes"), "memory_source": entry.get("memory_source"),
            "driver_listing": gpu_listing()}


if __name__ == "__main__":
    if sys.argv[1] == "booked":
        print(json.dumps(booked(*sys.argv[2:4])))
    else:
        check(*sys.argv[1:5])
