"""A batched-API model's `infer` (sheaf's `model.py` with `load(config)` and `infer(inputs)`)
called in a loop in this process, at several batch sizes: the reference a served Python model
is measured against. Prints one JSON line per batch size (items/s) and the best.

Usage: inprocess.py MODEL_DIR SECONDS BATCH_SIZES [INPUT WIDTH [DEVICE]]
  BATCH_SIZES comma-separated; the model's one input is INPUT, WIDTH values an item of random
  FP32 (default: the digits demo's `pixels`, 64); `load` is given the model's folder and
  DEVICE (default cpu), as the server gives them.
"""
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np


def main(folder, seconds, sizes, name="pixels", width=64, device="cpu"):
    folder = Path(folder)
    spec = importlib.util.spec_from_file_location("model", folder / "model.py")
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    model.load({"model_dir": str(folder), "device": device})
    rng = np.random.default_rng(0)
    best = (0, 0.0)
    for b in sizes:
        x = rng.random((b, width), dtype=np.float32)
        for _ in range(3):
            model.infer({name: x})
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            model.infer({name: x})
            done += b
        rate = done / (time.perf_counter() - start)
        print(json.dumps({"batch": b, "items_per_s": rate}), flush=True)
        best = max(best, (rate, b))
    print(json.dumps({"best_batch": best[1], "best_items_per_s": best[0]}))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], float(args[1]), [int(s) for s in args[2].split(",")],
         *([args[3], int(args[4])] if len(args) > 4 else []), *args[5:6])
