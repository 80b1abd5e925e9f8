"""Shared memory against binary HTTP for 1.2 MB inputs, with tritonclient on one host.

The orientation model takes [N, 3, 224, 224] float32: two items are 1.2 MB. Each way sends the
same input for SECONDS, one request at a time: the binary tensor extension (bytes over the
socket), and system shared memory (the input and the output in regions, only names over the
socket). Prints requests/s and the median latency of each, and shm/binary.

Usage: shm_vs_binary.py HOST:PORT SECONDS
"""
import os
import statistics
import sys
import time

import numpy as np
import tritonclient.http as http
import tritonclient.utils.shared_memory as shm


def run(client, inputs, outputs, seconds):
    latencies, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        client.infer("orientation", inputs, outputs=outputs)
        latencies.append(time.perf_counter() - t)
    return len(latencies) / (time.perf_counter() - start), statistics.median(latencies) * 1e3


def main():
    url, seconds = sys.argv[1], float(sys.argv[2])
    client = http.InferenceServerClient(url)
    x = np.random.default_rng(1).standard_normal((2, 3, 224, 224)).astype(np.float32)
    print(f"input: {x.nbytes / 1e6:.2f} MB per request")

    inp = http.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    out = http.InferRequestedOutput("fetch_name_0", binary_data=True)
    binary = run(client, [inp], [out], seconds)
    print(f"binary HTTP:   {binary[0]:7.1f} requests/s, p50 {binary[1]:6.2f} ms")

    key = f"/sheaf_bench_{os.getpid()}"
    region = shm.create_shared_memory_region("in", key, x.nbytes)
    out_region = shm.create_shared_memory_region("out", key + "_out", 2 * 4 * 4)
    try:
        shm.set_shared_memory_region(region, [x])
        client.unregister_system_shared_memory()
        client.register_system_shared_memory("in", key, x.nbytes)
        client.register_system_shared_memory("out", key + "_out", 2 * 4 * 4)
        inp = http.InferInput("x", list(x.shape), "FP32")
        inp.set_shared_memory("in", x.nbytes)
        out = http.InferRequestedOutput("fetch_name_0")
        out.set_shared_memory("out", 2 * 4 * 4)
        shared = run(client, [inp], [out], seconds)
        print(f"shared memory: {shared[0]:7.1f} requests/s, p50 {shared[1]:6.2f} ms")
        print(f"shared memory / binary HTTP: {shared[0] / binary[0]:.2f} (throughput), "
              f"{binary[1] / shared[1]:.2f} (latency)")
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(region)
        shm.destroy_shared_memory_region(out_region)


if __name__ == "__main__":
    main()
