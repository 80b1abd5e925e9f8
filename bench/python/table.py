"""The tables bench/python.sh prints: items/s and p50 of each server at each concurrency, against
the in-process best and against each other; the per-batch cost of crossing into Python; and the
identity model through Triton's API against the batched API.

Usage: table.py OUT_DIR
"""
import json
import sys
from pathlib import Path


def main(out):
    out = Path(out)
    lines = [json.loads(l) for l in (out / "inprocess.jsonl").read_text().splitlines()]
    best = lines[-1]
    servers = [("sheaf (batched API)", "sheaf"), ("sheaf (Triton API)", "sheaf_triton_api"),
               ("Triton Python backend", "triton"), ("Ray Serve", "ray")]
    results = {}
    for _, key in servers:
        path = out / f"{key}.json"
        if path.exists():
            results[key] = {int(l["level"]): l for l in json.loads(path.read_text())}
    print(f"in-process best: {best['best_items_per_s']:.0f} items/s at batch {best['best_batch']}")
    print()
    print("| server | c | items/s | p50 ms | p99 ms | / in-process | sheaf / it |")
    print("|---|---|---|---|---|---|---|")
    for name, key in servers:
        for c, level in sorted(results.get(key, {}).items()):
            sheaf = results.get("sheaf", {}).get(c)
            versus = sheaf["items_per_s"] / level["items_per_s"] if sheaf and key != "sheaf" else None
            print(f"| {name} | {c} | {level['items_per_s']:.0f} | {level['p50_ms']:.2f} | "
                  f"{level['p99_ms']:.2f} | {level['items_per_s'] / best['best_items_per_s']:.2f} | "
                  f"{'' if versus is None else f'{versus:.2f}'} |")
    stats = json.loads((out / "echo_stats.json").read_text())["model_stats"][0]
    infer = stats["inference_stats"]["compute_infer"]
    batches = stats["execution_count"]
    if batches:
        echo = json.loads((out / "echo.json").read_text())[0]
        print()
        print(f"crossing into Python (identity model, 64 floats, c=1): "
              f"{infer['ns'] / infer['count'] / 1000:.0f} us per batch in the backend "
              f"(shared-memory write, message, NumPy views, the function, answer read back); "
              f"client p50 {echo['p50_ms'] * 1000:.0f} us")
    api_table(out)


def api_table(out):
    """The identity through each API at each concurrency: what Triton's API (its request,
    tensor and response objects per request) costs over the batched API."""
    apis = [("batched", "echo"), ("Triton", "echo_triton")]
    results = {}
    for _, key in apis:
        path = out / f"api_{key}.json"
        if path.exists():
            results[key] = {int(l["level"]): l for l in json.loads(path.read_text())}
    if len(results) < 2:
        return
    print()
    print("identity model, 64 floats, through each API (backend time is the infer stage):")
    print("| API | c | items/s | mean batch | backend us per batch | us per request | "
          "Triton / batched (items/s) |")
    print("|---|---|---|---|---|---|---|")
    for name, key in apis:
        for c, level in sorted(results[key].items()):
            batch = level.get("mean_batch") or 1.0
            infer = level["server"]["infer"] * 1000
            batched = results["echo"].get(c)
            versus = (f"{level['items_per_s'] / batched['items_per_s']:.2f}"
                      if key != "echo" and batched else "")
            print(f"| {name} | {c} | {level['items_per_s']:.0f} | {batch:.1f} | {infer:.0f} | "
                  f"{infer / batch:.1f} | {versus} |")


if __name__ == "__main__":
    main(sys.argv[1])
