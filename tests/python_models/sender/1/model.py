"""Answers each request through `request.get_response_sender()` in default mode, and returns
None from `execute`, as Triton 24.06 and later allow.

Y = 2X, with the response parameters {"batch", "doubled", "scale", "by"}. Even-numbered requests of a batch send the final flag with the response, odd ones send
it after, on its own. X = -1 fails the request with TritonError.INVALID_ARG, X = -2 with
TritonError.UNAVAILABLE, and X = 1000 sends two responses, which default mode refuses."""

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests):
        for i, request in enumerate(requests):
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if x.reshape(-1)[0] == -1:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "X must not be negative", pb_utils.TritonError.INVALID_ARG)), flags=FINAL)
                continue
            if x.reshape(-1)[0] == -2:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "warming up, try again", pb_utils.TritonError.UNAVAILABLE)), flags=FINAL)
                continue
            # BATCH is declared INT32 and answered with NumPy's int64, as Triton's examples do:
            # it is narrowed when it fits (X = 5000 answers a count that does not).
            batch = 2**40 if x.reshape(-1)[0] == 5000 else len(requests)
            response = pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("Y", (x * 2).astype(np.float32)),
                pb_utils.Tensor("BATCH", np.full((1, 1), batch)),
            ], parameters={"batch": len(requests), "doubled": True, "scale": 2.0, "by": "sender"})
            if x.reshape(-1)[0] == 1000:
                sender.send(response)
                sender.send(response)
            if i % 2 == 0:
                sender.send(response, flags=FINAL)
            else:
                sender.send(response)
                sender.send(flags=FINAL)
        return None
