"""STEP 1, then, once the file PATH names exists, STEP 2, then the final flag. Past 20 s
without the file, the second response is an error saying so."""
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            path = pb_utils.get_input_tensor_by_name(request, "PATH").as_numpy()[0, 0].decode()
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("STEP", np.array([[1]], np.int32))]))
            give_up = time.monotonic() + 20
            while not os.path.exists(path) and time.monotonic() < give_up:
                time.sleep(0.01)
            if os.path.exists(path):
                second = pb_utils.InferenceResponse([pb_utils.Tensor("STEP", np.array([[2]], np.int32))])
            else:
                second = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"{path} was never made"))
            sender.send(second, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
