"""`stepper`'s steps in one `execute`: every request of the batch steps together until the one
with the most steps is done (a finished request's place idles meanwhile)."""

import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.dont_write_bytecode = True  # no __pycache__ in the repository, which Triton would read
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from step import step  # noqa: E402


class TritonPythonModel:
    def execute(self, requests):
        wanted = [int(pb_utils.get_input_tensor_by_name(r, "STEPS").as_numpy()[0, 0])
                  for r in requests]
        for _ in range(max(wanted)):
            step(len(requests))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("DONE", np.array([[w]], np.int32))])
                for w in wanted]
