"""Closed-loop load on a step-loop model (`stepper` or `stepper_static`) over HTTP, with NVIDIA's
tritonclient: CONCURRENCY clients, each sending a request and, once it is answered, the next.
Each request asks for a number of steps drawn from a seeded mix: 80% short (4 to 8 steps), 20%
long (64). Prints one JSON line: requests and steps per second, and the p50 and p99 latency of
the short requests and of the long ones.

Usage: iterative_load.py HOST:PORT MODEL CONCURRENCY SECONDS
"""
import json
import random
import sys
import threading
import time

import numpy as np
import tritonclient.http as httpclient


def client(url, model, seed, until, out):
    rng = random.Random(seed)
    c = httpclient.InferenceServerClient(url)
    short, long_, steps, errors = [], [], 0, 0
    while time.monotonic() < until:
        n = 64 if rng.random() < 0.2 else rng.randint(4, 8)
        i = httpclient.InferInput("STEPS", [1, 1], "INT32")
        i.set_data_from_numpy(np.array([[n]], np.int32))
        start = time.monotonic()
        try:
            done = int(c.infer(model, [i]).as_numpy("DONE")[0, 0])
        except Exception:  # noqa: BLE001 - counted, and the load goes on
            errors += 1
            continue
        took = (time.monotonic() - start) * 1000
        assert done == n, (done, n)
        (long_ if n == 64 else short).append(took)
        steps += n
    out.append((short, long_, steps, errors))


def pct(xs, p):
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(p * len(xs)))], 1) if xs else None


def main():
    url, model, concurrency, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    out = []
    until = time.monotonic() + seconds
    threads = [threading.Thread(target=client, args=(url, model, k, until, out))
               for k in range(concurrency)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - started
    short = [x for s, _, _, _ in out for x in s]
    long_ = [x for _, l, _, _ in out for x in l]
    print(json.dumps({
        "model": model, "concurrency": concurrency,
        "requests_per_s": round((len(short) + len(long_)) / took, 1),
        "steps_per_s": round(sum(s for _, _, s, _ in out) / took, 1),
        "short_p50_ms": pct(short, 0.5), "short_p99_ms": pct(short, 0.99),
        "long_p50_ms": pct(long_, 0.5), "long_p99_ms": pct(long_, 0.99),
        "errors": sum(e for _, _, _, e in out),
    }), flush=True)


if __name__ == "__main__":
    main()
