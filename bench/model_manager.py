"""Model-manager benchmark: cache hit rates of LRU and LFU eviction against the offline optimum
(Belady) on one Zipf trace, and cold-load latency of a real ONNX model.

Run by bench/model_manager.sh, which builds sheaf and starts the servers this script talks to.
Hit rate = 1 - loads / requests, with loads read from the server's own /metrics counter.
"""
import concurrent.futures
import json
import random
import statistics
import sys
import time
import urllib.request


def post(url, body=None):
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read() or b"null")


def zipf_trace(n, count, seed=42, s=1.1):
    rng = random.Random(seed)
    weights = [1 / (k ** s) for k in range(1, n + 1)]
    return rng.choices(range(n), weights=weights, k=count)


def belady_misses(trace, capacity, start=0):
    """Misses at positions >= start of the optimal offline policy (evict the model whose next
    use is furthest away), over the whole trace."""
    next_use = [0] * len(trace)
    last = {}
    for i in range(len(trace) - 1, -1, -1):
        next_use[i] = last.get(trace[i], float("inf"))
        last[trace[i]] = i
    cache, misses = {}, 0  # model -> next use
    for i, m in enumerate(trace):
        if m not in cache:
            misses += i >= start
            if len(cache) >= capacity:
                victim = max(cache, key=cache.get)
                del cache[victim]
        cache[m] = next_use[i]
    return misses


def loads(metrics_url):
    with urllib.request.urlopen(metrics_url) as r:
        text = r.read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith("sheaf_model_loads_total{"))


def run_trace(http, metrics, trace, names):
    before = loads(metrics)
    body = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 1.0]}]}
    # Sequential, so the cache sees the trace in order, as the offline optimum does.
    for i in trace:
        post(f"{http}/v2/models/{names[i]}/infer", body)
    return loads(metrics) - before


def main():
    mode = sys.argv[1]
    if mode == "hits":
        http_lru, metrics_lru, http_lfu, metrics_lfu, n, capacity, count = sys.argv[2:9]
        n, capacity, count = int(n), int(capacity), int(count)
        names = [f"m{i:04d}" for i in range(n)]
        trace = zipf_trace(n, count)
        warm = zipf_trace(n, count, seed=7)
        rows = []
        for policy, http, metrics in (("lru", http_lru, metrics_lru), ("lfu", http_lfu, metrics_lfu)):
            run_trace(http, metrics, warm, names)  # fill the cache first
            misses = run_trace(http, metrics, trace, names)
            rows.append((policy, 1 - misses / count))
        optimum = 1 - belady_misses(warm + trace, capacity, start=len(warm)) / count
        print(f"trace: {count} requests over {n} models (Zipf s=1.1), room for {capacity} models")
        print(f"{'policy':>8} {'hit rate':>9} {'/ optimum':>10}")
        for policy, hit in rows:
            print(f"{policy:>8} {hit:>9.3f} {hit / optimum:>10.3f}")
        print(f"{'belady':>8} {optimum:>9.3f} {1.0:>10.3f}   (offline optimum on the same trace, after the same warm-up)")
    elif mode == "cold":
        http, model, rounds = sys.argv[2], sys.argv[3], int(sys.argv[4])
        load_ms, first_ms = [], []
        body = {"inputs": [{"name": "input", "shape": [1, 512], "datatype": "FP32", "data": [0.1] * 512}]}
        for _ in range(rounds):
            post(f"{http}/v2/repository/models/{model}/unload")
            t = time.perf_counter()
            post(f"{http}/v2/repository/models/{model}/load")
            load_ms.append((time.perf_counter() - t) * 1000)
            post(f"{http}/v2/repository/models/{model}/unload")
            t = time.perf_counter()
            post(f"{http}/v2/models/{model}/infer", body)  # on_demand: this request loads it
            first_ms.append((time.perf_counter() - t) * 1000)
        q = lambda v, p: statistics.quantiles(v, n=100, method="inclusive")[p - 1]
        print(f"cold load of '{model}' ({rounds} rounds): p50 {q(load_ms, 50):.1f} ms, p99 {q(load_ms, 99):.1f} ms")
        print(f"first request to a cold '{model}' (on_demand): p50 {q(first_ms, 50):.1f} ms, p99 {q(first_ms, 99):.1f} ms")


if __name__ == "__main__":
    main()
