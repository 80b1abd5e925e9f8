"""SAME: X through a DLPack capsule (Tensor.to_dlpack, then Tensor.from_dlpack, as Triton's
PyTorch examples do with torch.utils.dlpack); TWICE: 2X, from an array's own __dlpack__;
PARAMS: request.parameters(), the client's parameters as JSON, for each item. Each execute logs
a line at every level through pb_utils.Logger. A request with the parameter `reschedule` asks
for Triton's request rescheduling, refused as the model is not iterative (no
sequence_batching { iterative_sequence: true })."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.logger = pb_utils.Logger
        self.logger.log_info(f"interop loaded as {args['model_name']}")

    def execute(self, requests):
        self.logger.log_warn(f"interop runs {len(requests)} request(s)")
        self.logger.log_error("interop error line")
        self.logger.log_verbose("interop verbose line")
        pb_utils.Logger.log("interop info line", pb_utils.LogLevel.INFO)
        responses = []
        for request in requests:
            if json.loads(request.parameters()).get("reschedule"):
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            x = pb_utils.get_input_tensor_by_name(request, "X")
            same = pb_utils.Tensor.from_dlpack("SAME", x.to_dlpack())
            twice = pb_utils.Tensor.from_dlpack("TWICE", np.ascontiguousarray(x.as_numpy() * 2))
            params = np.array([[request.parameters().encode()]] * len(x.as_numpy()), np.object_)
            responses.append(pb_utils.InferenceResponse(
                [same, twice, pb_utils.Tensor("PARAMS", params)]))
        return responses
