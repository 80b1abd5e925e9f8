"""A step loop served by continuous batching: each `execute` runs one step of every request in
the batch (`step.py`'s cost, as a GPU's step grows little with the batch), and a request is
rescheduled until it has run its STEPS steps."""

import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.dont_write_bytecode = True  # no __pycache__ in the repository, which Triton would read
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from step import step  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        self.done = {}

    def execute(self, requests):
        step(len(requests))
        responses = []
        for request in requests:
            key = request.correlation_id()
            if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.done[key] = 0
            self.done[key] += 1
            wanted = int(pb_utils.get_input_tensor_by_name(request, "STEPS").as_numpy()[0, 0])
            if self.done[key] < wanted:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
                continue
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("DONE", np.array([[self.done.pop(key)]], np.int32))]))
        return responses
