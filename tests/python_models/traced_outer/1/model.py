"""Answers each request with `traced_bls`'s answer to it, asked with the request's trace."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            answer = pb_utils.InferenceRequest(
                model_name="traced_bls", requested_output_names=["output"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "input")],
                trace=request.trace()).exec()
            responses.append(answer)
        return responses
