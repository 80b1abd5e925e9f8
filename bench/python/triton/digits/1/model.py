"""The digits demo's own `infer` (model_repository/digits/model.py), run by Triton's Python model
API: the requests of an `execute` call are concatenated, run as one batch, and split back, as
Triton users write a batching Python model."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        relative = config["parameters"]["function"]["string_value"]
        folder = (Path(args["model_repository"]) / relative).resolve()
        spec = importlib.util.spec_from_file_location("digits", folder / "model.py")
        self.digits = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.digits)
        self.digits.load({"model_dir": str(folder)})

    def execute(self, requests):
        parts = [pb_utils.get_input_tensor_by_name(r, "pixels").as_numpy() for r in requests]
        out = self.digits.infer({"pixels": np.concatenate(parts)})
        responses, at = [], 0
        for part in parts:
            n = part.shape[0]
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("probabilities", out["probabilities"][at:at + n]),
                pb_utils.Tensor("label", out["label"][at:at + n]),
            ]))
            at += n
        return responses
