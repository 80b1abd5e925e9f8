"""Counts down from N: N responses (LEFT = N, N-1, ..., 1, with WORD naming the batch's size),
then the final flag alone. Requests with an odd N are answered from a thread of the model's own;
Each response carries the parameters {"left": LEFT, "last": LEFT == 1}. N < 0 gets an error
response. It refuses to load unless its configuration makes it decoupled,
as Triton's own decoupled examples do."""
import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        if not pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"])):
            raise pb_utils.TritonModelException("countdown must be decoupled")

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0, 0])
            sender = request.get_response_sender()
            if n % 2:
                threading.Thread(target=self.count, args=(sender, n, len(requests))).start()
            else:
                self.count(sender, n, len(requests))
        return None

    def count(self, sender, n, batch):
        if n < 0:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("N must not be negative")),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        for left in range(n, 0, -1):
            sender.send(pb_utils.InferenceResponse([
                pb_utils.Tensor("LEFT", np.array([[left]], np.int32)),
                pb_utils.Tensor("WORD", np.array([[f"batch of {batch}".encode()]], np.object_)),
            ], parameters={"left": left, "last": left == 1}))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
