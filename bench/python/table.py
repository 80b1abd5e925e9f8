"""The table bench/python.sh prints: items/s and p50 of each server at each concurrency, against
the in-process best and against each other, and the per-batch cost of crossing into Python.

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


if __name__ == "__main__":
    main(sys.argv[1])
