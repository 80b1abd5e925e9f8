import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [2]})
        auto_complete_model_config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [2]})
        auto_complete_model_config.add_output({"name": "ID", "data_type": "TYPE_STRING", "dims": [1]})
        auto_complete_model_config.add_output({"name": "ASKED", "data_type": "TYPE_STRING", "dims": [1]})
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            ids = np.full((x.shape[0], 1), r.request_id().encode(), dtype=np.object_)
            asked = ",".join(r.requested_output_names()).encode()
            asked = np.full((x.shape[0], 1), asked, dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", x * 10), pb_utils.Tensor("ID", ids),
                 pb_utils.Tensor("ASKED", asked)]))
        return responses
