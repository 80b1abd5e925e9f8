"""Asks `ticker` for a stream (its PATH passed on), reads READ responses, cancels the stream
with `cancel()` and reads it to its end. Answers with the ticks read before the cancel, how
many responses with outputs came after it, and the code and message of its error response."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            path = pb_utils.get_input_tensor_by_name(request, "PATH")
            wanted = int(pb_utils.get_input_tensor_by_name(request, "READ").as_numpy()[0])
            call = pb_utils.InferenceRequest(
                model_name="ticker", requested_output_names=["TICK"],
                inputs=[pb_utils.Tensor("PATH", path.as_numpy().reshape(1, 1))])
            stream = call.exec(decoupled=True)
            ticks = []
            for response in stream:
                ticks.append(int(pb_utils.get_output_tensor_by_name(response, "TICK")
                                 .as_numpy()[0, 0]))
                if len(ticks) == wanted:
                    break
            stream.cancel()
            stream.cancel()  # a second cancel does nothing
            after, code, error = 0, -1, ""
            for response in stream:
                if response.has_error():
                    code, error = response.error().code(), response.error().message()
                elif response.output_tensors():
                    after += 1
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("TICKS", np.array(ticks, np.int32)),
                pb_utils.Tensor("AFTER", np.array([after], np.int32)),
                pb_utils.Tensor("CODE", np.array([code], np.int32)),
                pb_utils.Tensor("ERROR", np.array([error.encode()], np.object_)),
            ]))
        return responses
