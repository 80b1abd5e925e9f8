"""Sends TICK = 1, 2, ... every 20 ms while neither the response sender nor the request says it
is cancelled, for at most 30 s. Then it writes how it stopped to the file PATH names
("cancelled after N", or "ran out"), and sends the final flag."""
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        # Decoupled whatever its configuration file says, as Triton's own examples make sure.
        config.set_model_transaction_policy(dict(decoupled=True))
        return config

    def execute(self, requests):
        for request in requests:
            path = pb_utils.get_input_tensor_by_name(request, "PATH").as_numpy()[0, 0].decode()
            sender = request.get_response_sender()
            tick, give_up, how = 0, time.monotonic() + 30, "ran out"
            while time.monotonic() < give_up:
                if sender.is_cancelled() or request.is_cancelled():
                    how = f"cancelled after {tick}"
                    break
                tick += 1
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("TICK", np.array([[tick]], np.int32))]))
                time.sleep(0.02)
            # Written whole, then named: a reader never sees it half written.
            with open(path + ".part", "w") as f:
                f.write(how)
            os.replace(path + ".part", path)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
