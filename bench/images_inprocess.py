"""The Python baseline for image serving: decode a JPEG with Pillow, resize the shorter side to
256 (bilinear), centre-crop 224, normalise with numpy, run EfficientNet-Lite0 on ONNX Runtime
in-process, and take the top 5 classes; batches of each size for SECONDS, images/s printed per
batch size and the best last.

Usage: images_inprocess.py MODEL.onnx IMAGE SECONDS THREADS BATCH_SIZES (comma-separated)
"""
import io
import sys
import time

import numpy as np
import onnxruntime as ort
from PIL import Image


def preprocess(data):
    image = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = image.size
    short = 256
    size = (short, h * short // w) if w <= h else (w * short // h, short)
    image = image.resize(size, Image.BILINEAR)
    left = round((size[0] - 224) / 2)
    top = round((size[1] - 224) / 2)
    image = image.crop((left, top, left + 224, top + 224))
    x = np.asarray(image, dtype=np.float32) / 255.0
    return ((x - 0.5) / 0.5).transpose(2, 0, 1)


def main():
    model, image, seconds, threads, sizes = sys.argv[1:]
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(threads)
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    data = open(image, "rb").read()
    best = 0.0
    for batch in [int(b) for b in sizes.split(",")]:
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < float(seconds):
            x = np.stack([preprocess(data) for _ in range(batch)])
            logits = session.run(None, {"input": x})[0]
            np.argsort(-logits, axis=1)[:, :5]
            done += batch
        rate = done / (time.perf_counter() - start)
        best = max(best, rate)
        print(f"in-process batch {batch:>3}: {rate:8.1f} images/s")
    print(f"in-process best: {best:.1f} images/s")


if __name__ == "__main__":
    main()
