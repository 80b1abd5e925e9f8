"""The plain loop: ONNX Runtime in-process, one session per batch size, with the session options
sheaf serves the model with (one intra-op thread and no spinning on the CPU; on CUDA, TF32 on,
exhaustive cuDNN search and an arena that grows by what is asked). It is the figure served
throughput is held against.

Usage: plain_loop.py MODEL.onnx cpu|cuda:N SECONDS BATCH[,BATCH...]
Prints one JSON object: items/s by batch size, and the memory the largest size held alone (MiB:
resident memory on the CPU, the driver's figure for this process on CUDA).
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort

path, device, seconds, sizes = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
sizes = sorted(int(b) for b in sizes.split(","))


def session():
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if device == "cpu":
        return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    cuda = {"device_id": device.split(":")[1], "use_tf32": "1",
            "cudnn_conv_algo_search": "EXHAUSTIVE", "arena_extend_strategy": "kSameAsRequested"}
    return ort.InferenceSession(path, opts, providers=[("CUDAExecutionProvider", cuda)])


def feed(s, b):
    types = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32}
    rng = np.random.default_rng(17)
    out = {}
    for i in s.get_inputs():
        shape = [b if k == 0 else (d if isinstance(d, int) else 1) for k, d in enumerate(i.shape)]
        out[i.name] = rng.random(shape).astype(types.get(i.type, np.float32))
    return out


def memory_mib():
    if device == "cpu":
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20
    rows = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    return sum(float(r.split(",")[1]) for r in rows.splitlines()
               if r.strip() and int(r.split(",")[0]) == os.getpid())


before = memory_mib()
largest = session()
f = feed(largest, sizes[-1])
for _ in range(3):
    largest.run(None, f)
alone = memory_mib() - before
del largest

items = {}
for b in sizes:
    s = session()
    f = feed(s, b)
    for _ in range(3):
        s.run(None, f)
    runs, started = 0, time.perf_counter()
    while runs < 3 or time.perf_counter() - started < seconds:
        s.run(None, f)
        runs += 1
    items[b] = runs * b / (time.perf_counter() - started)
print(json.dumps({"items_per_s": items, "largest_alone_mib": round(alone, 1)}))
