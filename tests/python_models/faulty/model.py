import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.pid = os.getpid()

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            what = int(x[0, 0])
            pid = np.full(x.shape, self.pid, dtype=np.int64)
            if what == 1:
                raise ValueError("the model cannot take 1")
            if what == 2:
                os._exit(3)
            if what == 3:
                time.sleep(60)
            y = x * 2
            if what == 4:
                y = y.astype(np.float64)
            if what == 5:
                y = np.concatenate([y, y], axis=1)
            outputs = [pb_utils.Tensor("PID", pid)]
            if what != 6:
                outputs.append(pb_utils.Tensor("Y", y))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
