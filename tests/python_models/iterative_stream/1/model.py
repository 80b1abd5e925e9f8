"""IN = N: N runs of the request, each sending one response OUT = N - 1, ..., 0 through the
request's response sender; the last with the final flag, the others followed by
RELEASE_RESCHEDULE. Progress is kept by correlation id."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.remaining = {}

    def execute(self, requests):
        for request in requests:
            key = request.correlation_id()
            if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                n = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                self.remaining[key] = int(n.reshape(-1)[0])
            self.remaining[key] -= 1
            left = self.remaining[key]
            response = pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([[left]], np.int32))])
            sender = request.get_response_sender()
            if left <= 0:
                del self.remaining[key]
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(response)
        return None
