"""Closed-loop load from NVIDIA's tritonclient, over HTTP or gRPC, for comparing the two.

Usage: tritonclient_load.py http|grpc URL MODEL INPUT FEATURES CONCURRENCY SECONDS
Each of CONCURRENCY threads owns a client and sends one [1, FEATURES] float32 item per request
(binary tensors over HTTP, raw contents over gRPC) for SECONDS. Prints items/s."""
import sys
import threading
import time

import numpy as np


def main():
    protocol, url, model, name, features, clients, secs = sys.argv[1:8]
    features, clients, secs = int(features), int(clients), float(secs)
    if protocol == "http":
        import tritonclient.http as tc
    else:
        import tritonclient.grpc as tc
    data = np.random.default_rng(3).random((1, features), dtype=np.float32)
    counts = [0] * clients
    errors = []
    deadline = time.perf_counter() + secs

    def client(k):
        c = tc.InferenceServerClient(url=url)
        i = tc.InferInput(name, [1, features], "FP32")
        if protocol == "http":
            i.set_data_from_numpy(data, binary_data=True)
        else:
            i.set_data_from_numpy(data)
        while time.perf_counter() < deadline:
            try:
                c.infer(model, [i])
                counts[k] += 1
            except Exception as e:  # counted, and the load goes on
                errors.append(str(e))

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - started
    print(f"{sum(counts) / took:.1f} items/s ({len(errors)} errors)")
    if errors:
        print(errors[0], file=sys.stderr)


if __name__ == "__main__":
    main()
