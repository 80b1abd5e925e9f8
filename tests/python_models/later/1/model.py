"""Each request is answered by a thread of the model's own, once `execute` has returned and the
process waits for its next batch: Y = doubler's y for X (a request the thread sends itself),
then Y = [the sum of countdown's LEFT for N = 3, the number of its responses, 0] (a streaming
request), then the final flag."""
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            threading.Thread(target=self.answer,
                             args=(request.get_response_sender(), x)).start()
        return None

    def answer(self, sender, x):
        time.sleep(0.2)  # execute has long returned
        doubled = pb_utils.InferenceRequest(
            model_name="doubler", requested_output_names=["y"],
            inputs=[pb_utils.Tensor("x", x.reshape(1, 3))]).exec()
        if doubled.has_error():
            sender.send(doubled, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        y = pb_utils.get_output_tensor_by_name(doubled, "y").as_numpy().reshape(3)
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        total, count = 0, 0
        for response in pb_utils.InferenceRequest(
                model_name="countdown", requested_output_names=["LEFT"],
                inputs=[pb_utils.Tensor("N", np.array([[3]], np.int32))]).exec(decoupled=True):
            if len(response.output_tensors()) > 0:
                total += int(pb_utils.get_output_tensor_by_name(response, "LEFT").as_numpy()[0, 0])
                count += 1
        sender.send(pb_utils.InferenceResponse([
            pb_utils.Tensor("Y", np.array([total, count, 0], np.float32))]),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
