"""The digits demo's `infer` behind Ray Serve, batched with `@serve.batch` (up to 64 items, 1 ms
wait, two replicas), with an ingress that speaks enough of the KServe v2 HTTP protocol for
`sheaf bench` to drive it as it drives sheaf and Triton: metadata, and inference with JSON or
binary tensors.

Usage: ray_digits.py MODEL_DIR PORT
"""
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

FOLDER = Path(sys.argv[1]).resolve()
PORT = int(sys.argv[2])
METADATA = {
    "name": "digits", "versions": ["1"], "platform": "ray_serve",
    "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}],
    "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]},
                {"name": "label", "datatype": "INT64", "shape": [-1, 1]}],
}


@serve.deployment(num_replicas=2, max_ongoing_requests=256)
class Digits:
    def __init__(self):
        spec = importlib.util.spec_from_file_location("digits", FOLDER / "model.py")
        self.digits = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.digits)
        self.digits.load({"model_dir": str(FOLDER)})

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.001)
    async def run(self, parts):
        out = self.digits.infer({"pixels": np.concatenate(parts)})
        answers, at = [], 0
        for part in parts:
            n = part.shape[0]
            answers.append((out["probabilities"][at:at + n], out["label"][at:at + n]))
            at += n
        return answers

    async def __call__(self, request: Request):
        if request.method == "GET":
            return JSONResponse(METADATA)
        body = await request.body()
        header_length = request.headers.get("inference-header-content-length")
        if header_length is not None:
            n = int(header_length)
            header = json.loads(body[:n])
            spec = header["inputs"][0]
            pixels = np.frombuffer(body[n:], dtype=np.float32).reshape(spec["shape"])
        else:
            spec = json.loads(body)["inputs"][0]
            pixels = np.asarray(spec["data"], dtype=np.float32).reshape(spec["shape"])
        probabilities, label = await self.run(pixels)
        return JSONResponse({"model_name": "digits", "outputs": [
            {"name": "probabilities", "datatype": "FP32", "shape": list(probabilities.shape),
             "data": probabilities.reshape(-1).tolist()},
            {"name": "label", "datatype": "INT64", "shape": list(label.shape),
             "data": label.reshape(-1).tolist()},
        ]})


if __name__ == "__main__":
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(Digits.bind(), name="digits", route_prefix="/v2/models/digits")
    print("ray serve ready", flush=True)
    while True:
        time.sleep(3600)
