"""Calls `gate` with exec(decoupled=True) and sends each of its responses on as it reads it
(STEP plus 10), then the final flag; an error response is passed on as it is."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            streamed = pb_utils.InferenceRequest(
                model_name="gate", requested_output_names=["STEP"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "PATH")]).exec(decoupled=True)
            for response in streamed:
                if response.has_error():
                    sender.send(response)
                elif len(response.output_tensors()) > 0:
                    step = pb_utils.get_output_tensor_by_name(response, "STEP").as_numpy()
                    sender.send(pb_utils.InferenceResponse(
                        [pb_utils.Tensor("STEP", step + 10)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
