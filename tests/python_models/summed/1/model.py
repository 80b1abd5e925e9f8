import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """SUM and COUNT of the LEFT outputs `countdown` streams for N (its empty final response
    skipped, an error response's message in ERROR); ONCE and DOUBLED: how many responses
    `doubler` gives when asked the same way (its answer, then the empty final one), and its y."""

    def execute(self, requests):
        responses = []
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "N")
            total, count, errors = 0, 0, []
            streamed = pb_utils.InferenceRequest(
                model_name="countdown", requested_output_names=["LEFT"],
                inputs=[n]).exec(decoupled=True)
            for response in streamed:
                if response.has_error():
                    errors.append(response.error().message())
                elif len(response.output_tensors()) > 0:
                    left = pb_utils.get_output_tensor_by_name(response, "LEFT").as_numpy()
                    total += int(left[0, 0])
                    count += 1
            x = np.full((1, 3), float(n.as_numpy()[0, 0]), np.float32)
            once = list(pb_utils.InferenceRequest(
                model_name="doubler", requested_output_names=["y"],
                inputs=[pb_utils.Tensor("x", x)]).exec(decoupled=True))
            doubled = pb_utils.get_output_tensor_by_name(once[0], "y").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SUM", np.array([[total]], np.int32)),
                pb_utils.Tensor("COUNT", np.array([[count]], np.int32)),
                pb_utils.Tensor("ONCE", np.array([[len(once)]], np.int32)),
                pb_utils.Tensor("DOUBLED", doubled),
                pb_utils.Tensor("ERROR", np.array([["; ".join(errors).encode()]], np.object_)),
            ]))
        return responses
