"""Runs each request STEPS times (Triton's request rescheduling: RELEASE_RESCHEDULE and a None
response until the last step), keeping its progress by the correlation id the server gives it.
Answers with how many runs it took, the most requests it shared an execute with, and the
flags of its first and later runs. Each execute takes 20 ms."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.progress = {}

    def execute(self, requests):
        time.sleep(0.02)
        responses = []
        for request in requests:
            key = request.correlation_id()
            steps = int(pb_utils.get_input_tensor_by_name(request, "STEPS").as_numpy()[0, 0])
            if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.progress[key] = {"runs": 0, "shared": 0, "first": request.flags(),
                                      "later": 0}
            state = self.progress[key]
            state["runs"] += 1
            state["shared"] = max(state["shared"], len(requests))
            if state["runs"] > 1:
                state["later"] |= request.flags()
            if state["runs"] < steps:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
                continue
            del self.progress[key]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("RUNS", np.array([[state["runs"]]], np.int32)),
                pb_utils.Tensor("SHARED", np.array([[state["shared"]]], np.int32)),
                pb_utils.Tensor("FIRST_FLAGS", np.array([[state["first"]]], np.int32)),
                pb_utils.Tensor("LATER_FLAGS", np.array([[state["later"]]], np.int32)),
                pb_utils.Tensor("CORRID", np.array([[key]], np.uint64)),
            ]))
        return responses
