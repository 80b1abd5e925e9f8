"""Asks `autocomplete` with a request id, then `gate` (a streaming model) with PATH and a
timeout of TIMEOUT_US microseconds (0: none); answers the id autocomplete saw and gate's steps,
or the error that ended them, joined by ';'. PARAMS: the response parameters of `sender` and
of each response of `countdown` (N = 2), as JSON."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            path = pb_utils.get_input_tensor_by_name(request, "PATH").as_numpy()[0]
            timeout = int(pb_utils.get_input_tensor_by_name(request, "TIMEOUT_US").as_numpy()[0])
            echoed = pb_utils.InferenceRequest(
                model_name="autocomplete", request_id="asked-by-impatient",
                requested_output_names=["ID"],
                inputs=[pb_utils.Tensor("IN", np.array([[1, 2]], np.int32))]).exec()
            if echoed.has_error():
                raise pb_utils.TritonModelException(echoed.error().message())
            seen = pb_utils.get_output_tensor_by_name(echoed, "ID").as_numpy()[0, 0]
            steps = []
            gate = pb_utils.InferenceRequest(
                model_name="gate", timeout=timeout,
                inputs=[pb_utils.Tensor("PATH", np.array([[path]], np.object_))])
            for response in gate.exec(decoupled=True):
                if response.has_error():
                    steps.append(response.error().message())
                    break
                step = pb_utils.get_output_tensor_by_name(response, "STEP")
                if step is not None:
                    steps.append(str(step.as_numpy()[0, 0]))
            doubled = pb_utils.InferenceRequest(
                model_name="sender", inputs=[pb_utils.Tensor("X", np.array([[4.0]], np.float32))]
            ).exec()
            counted = pb_utils.InferenceRequest(
                model_name="countdown", inputs=[pb_utils.Tensor("N", np.array([[2]], np.int32))]
            ).exec(decoupled=True)
            params = {"sender": json.loads(doubled.parameters()),
                      "countdown": [json.loads(r.parameters()) for r in counted]}
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("ID", np.array([seen], np.object_)),
                pb_utils.Tensor("GATE", np.array([";".join(steps).encode()], np.object_)),
                pb_utils.Tensor("PARAMS", np.array([json.dumps(params).encode()], np.object_)),
            ]))
        return responses
