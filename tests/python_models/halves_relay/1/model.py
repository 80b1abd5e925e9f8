"""Each request's X (BF16) is sent to `halves_batched` with `InferenceRequest.exec()`, and its
answer `y` (BF16) is this model's Y."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            answer = pb_utils.InferenceRequest(
                model_name="halves_batched", inputs=[pb_utils.Tensor("x", x.as_numpy())],
                requested_output_names=["y"]).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            y = pb_utils.get_output_tensor_by_name(answer, "y")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y.as_numpy())]))
        return responses
