"""A model that says whether it can serve with Triton's `is_ready()`: as the file `state` in
its folder says (no file or "yes": ready; "no": not; "raise": it raises; "slow": it answers
after 7 s; "number": it returns 1). `execute` sleeps WAIT_MS and answers with its process id.
Once the file `slow_start` exists, importing it takes two seconds."""

import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FOLDER = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if os.path.exists(os.path.join(FOLDER, "slow_start")):
    time.sleep(2)


class TritonPythonModel:
    def is_ready(self):
        try:
            with open(os.path.join(FOLDER, "state")) as f:
                state = f.read().strip()
        except FileNotFoundError:
            return True
        if state == "raise":
            raise RuntimeError("the feature store is unreachable")
        if state == "slow":
            time.sleep(7)
            return True
        if state == "number":
            return 1
        return state == "yes"

    def execute(self, requests):
        responses = []
        for request in requests:
            wait = pb_utils.get_input_tensor_by_name(request, "WAIT_MS").as_numpy()
            time.sleep(float(wait.max()) / 1000)
            pid = np.full(wait.shape, os.getpid(), np.int64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PID", pid)]))
        return responses
