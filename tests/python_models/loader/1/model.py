"""Loads (OP 1), unloads (OP 2) or only looks at (OP 0) the model NAME, then answers whether
it is ready. OP 3 loads it with files of its own, which sheaf refuses; OP 4 loads it with a
configuration of its own (the `words` model's, with a batch size of 4)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

WORDS = json.dumps({
    "backend": "python",
    "max_batch_size": 4,
    "input": [{"name": "text", "data_type": "TYPE_STRING", "dims": [1]}],
    "output": [{"name": "reversed", "data_type": "TYPE_STRING", "dims": [1]},
               {"name": "length", "data_type": "TYPE_INT64", "dims": [1]}],
})


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            op = int(pb_utils.get_input_tensor_by_name(request, "OP").as_numpy()[0])
            name = pb_utils.get_input_tensor_by_name(request, "NAME").as_numpy()[0].decode()
            try:
                if op == 1:
                    pb_utils.load_model(model_name=name)
                elif op == 2:
                    pb_utils.unload_model(model_name=name, unload_dependents=False)
                elif op == 3:
                    pb_utils.load_model(model_name=name, files={"file:1/model.py": b""})
                elif op == 4:
                    pb_utils.load_model(model_name=name, config=WORDS)
                ready = pb_utils.is_model_ready(model_name=name, model_version="1")
            except pb_utils.TritonModelException as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(e.message())))
                continue
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("READY", np.array([ready]))]))
        return responses
