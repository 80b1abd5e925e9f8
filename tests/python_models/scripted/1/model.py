import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers each request with what other models of the server answer: `target` names the
    model the features go to (the MLP, or a model that does not exist), and the text goes to
    `words`, asked for one of its two outputs only."""

    def execute(self, requests):
        responses = []
        for request in requests:
            features = pb_utils.get_input_tensor_by_name(request, "features").as_numpy()
            text = pb_utils.get_input_tensor_by_name(request, "text").as_numpy()
            target = pb_utils.get_input_tensor_by_name(request, "target").as_numpy()[0, 0]
            # The outputs asked for in host memory, as Triton's BLS examples do.
            scored = pb_utils.InferenceRequest(
                model_name=target.decode(),
                requested_output_names=["output"],
                inputs=[pb_utils.Tensor("input", features)],
                preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0),
            ).exec()
            if scored.has_error():
                logits = np.zeros((features.shape[0], 10), np.float32)
                error = scored.error().message()
            else:
                logits = pb_utils.get_output_tensor_by_name(scored, "output").as_numpy()
                error = ""
            # Passing the request's trace on, as Triton's tracing guide shows.
            words = pb_utils.InferenceRequest(
                model_name="words", requested_output_names=["reversed"],
                inputs=[pb_utils.Tensor("text", text)], trace=request.trace()).exec()
            if words.has_error():
                raise pb_utils.TritonModelException(words.error().message())
            names = [t.name() for t in words.output_tensors()]
            if names != ["reversed"]:
                raise pb_utils.TritonModelException(f"asked for 'reversed', got {names}")
            reversed_text = pb_utils.get_output_tensor_by_name(words, "reversed").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("logits", logits),
                pb_utils.Tensor("reversed", reversed_text),
                pb_utils.Tensor("error", np.array([[error.encode()]] * features.shape[0],
                                                  dtype=np.object_)),
            ]))
            request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL)
        return responses
