"""Runs `mlp` three times for each request, twice with `trace=request.trace()` (Triton's way
of tracing a BLS request with the request it serves) and once without, and answers with the
sum of the three outputs."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "input").as_numpy()
            total = None
            for traced in (True, True, False):
                extra = {"trace": request.trace()} if traced else {}
                answer = pb_utils.InferenceRequest(
                    model_name="mlp", requested_output_names=["output"],
                    inputs=[pb_utils.Tensor("input", x)], **extra).exec()
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                y = pb_utils.get_output_tensor_by_name(answer, "output").as_numpy()
                total = y if total is None else total + y
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("output", total)]))
        return responses
