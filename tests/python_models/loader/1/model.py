"""Loads (OP 1), unloads (OP 2) or only looks at (OP 0) the model NAME, then answers whether
it is ready. OP 3 loads it from files of its own (a model that answers every length as -1,
with the `words` model's configuration); OP 4 loads it with a configuration of its own (the
`words` model's, with a batch size of 4); OP 5 sends files without a configuration."""

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


# Reverses as `words` does, and answers every length as -1.
UPLOADED = b"""
import numpy as np


def infer(inputs):
    text = inputs["text"]
    reversed_ = np.array([[t[::-1] for t in row] for row in text], dtype=np.object_)
    return {"reversed": reversed_, "length": np.full(text.shape, -1, dtype=np.int64)}
"""


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
                    pb_utils.load_model(model_name=name, config=WORDS,
                                        files={"file:1/model.py": UPLOADED})
                elif op == 4:
                    pb_utils.load_model(model_name=name, config=WORDS)
                elif op == 5:
                    pb_utils.load_model(model_name=name, files={"file:1/model.py": UPLOADED})
                ready = pb_utils.is_model_ready(model_name=name, model_version="1")
            except pb_utils.TritonModelException as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(e.message())))
                continue
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("READY", np.array([ready]))]))
        return responses
