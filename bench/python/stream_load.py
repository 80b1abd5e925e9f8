"""Closed-loop load on a streaming (decoupled) model over gRPC streams, with NVIDIA's
tritonclient: CONCURRENCY clients, each on a stream of its own, send a request, read its
responses to the empty final one, and send the next. Prints one JSON line: requests and
responses per second, and the p50 and p99 of the time to the first response and to the end.

Usage: stream_load.py HOST:PORT MODEL CONCURRENCY SECONDS COUNT DELAY_MS
"""
import json
import queue
import sys
import threading
import time

import numpy as np
import tritonclient.grpc as grpcclient


def client(url, model, count, delay_ms, until, out):
    got = queue.Queue()
    c = grpcclient.InferenceServerClient(url)
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    inputs = [grpcclient.InferInput("COUNT", [1], "INT32"),
              grpcclient.InferInput("DELAY_MS", [1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([count], np.int32))
    inputs[1].set_data_from_numpy(np.array([delay_ms], np.int32))
    firsts, totals, responses, errors = [], [], 0, 0
    sent = 0
    try:
        while time.monotonic() < until:
            sent += 1
            start = time.monotonic()
            c.async_stream_infer(model, inputs, request_id=str(sent),
                                 enable_empty_final_response=True)
            first = None
            while True:
                result, error = got.get(timeout=120)
                if error is not None:
                    # The stream ends with its error: the next request opens another, with a
                    # queue of its own.
                    errors += 1
                    c.stop_stream()
                    got = queue.Queue()
                    c.start_stream(callback=lambda result, error, q=got: q.put((result, error)))
                    break
                response = result.get_response()
                if response.id != str(sent):
                    continue  # left from a request that failed
                if response.parameters["triton_final_response"].bool_param:
                    break
                responses += 1
                first = first or time.monotonic() - start
            totals.append(time.monotonic() - start)
            firsts.append(first or 0.0)
    finally:
        c.stop_stream()
    out.append((firsts, totals, responses, errors))


def main(url, model, concurrency, seconds, count, delay_ms):
    out = []
    start = time.monotonic()
    until = start + seconds
    threads = [threading.Thread(target=client, args=(url, model, count, delay_ms, until, out))
               for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    firsts = sorted(f for o in out for f in o[0])
    totals = sorted(t for o in out for t in o[1])
    pct = lambda xs, p: 1000 * xs[min(len(xs) - 1, int(p * len(xs)))] if xs else 0.0
    print(json.dumps({
        "concurrency": concurrency, "requests_per_s": len(totals) / elapsed,
        "responses_per_s": sum(o[2] for o in out) / elapsed, "errors": sum(o[3] for o in out),
        "first_p50_ms": pct(firsts, 0.5), "first_p99_ms": pct(firsts, 0.99),
        "end_p50_ms": pct(totals, 0.5), "end_p99_ms": pct(totals, 0.99)}), flush=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], int(a[2]), float(a[3]), int(a[4]), int(a[5]))
