"""The digits demo's `infer` called in a loop in this process, at several batch sizes: the
reference a served Python model is measured against. Prints one JSON line per batch size
(items/s) and the best.

Usage: inprocess.py MODEL_DIR SECONDS BATCH_SIZES (comma-separated)
"""
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np


def main(folder, seconds, sizes):
    folder = Path(folder)
    spec = importlib.util.spec_from_file_location("digits", folder / "model.py")
    digits = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(digits)
    digits.load({"model_dir": str(folder)})
    rng = np.random.default_rng(0)
    best = (0, 0.0)
    for b in sizes:
        x = rng.random((b, 64), dtype=np.float32)
        digits.infer({"pixels": x})
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            digits.infer({"pixels": x})
            done += b
        rate = done / (time.perf_counter() - start)
        print(json.dumps({"batch": b, "items_per_s": rate}))
        best = max(best, (rate, b))
    print(json.dumps({"best_batch": best[1], "best_items_per_s": best[0]}))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")])
