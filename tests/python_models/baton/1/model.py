"""Each request is answered by a thread of the model's own, started by `execute`, which returns
at once (as Triton's decoupled examples do). The thread sends SEEN = [k, n]: the number k of
the execute call that brought the request and the number n of execute calls begun so far;
then waits up to WAIT_MS for a later execute call to begin, sends SEEN again, and the final
flag. `finalize` waits for the threads still running, as Triton's examples do."""
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        # Decoupled whatever its configuration file says, as Triton's own examples make sure.
        config.set_model_transaction_policy(dict(decoupled=True))
        return config

    def initialize(self, args):
        self.calls = 0
        self.changed = threading.Condition()
        self.threads = []

    def execute(self, requests):
        with self.changed:
            self.calls += 1
            k = self.calls
            self.changed.notify_all()
        for request in requests:
            wait_ms = int(pb_utils.get_input_tensor_by_name(request, "WAIT_MS").as_numpy()[0])
            thread = threading.Thread(
                target=self.answer, args=(request.get_response_sender(), k, wait_ms))
            thread.start()
            self.threads.append(thread)
        return None

    def seen(self, k):
        return pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", np.array([k, self.calls], np.int32))])

    def answer(self, sender, k, wait_ms):
        sender.send(self.seen(k))
        give_up = time.monotonic() + wait_ms / 1000
        with self.changed:
            while self.calls == k and time.monotonic() < give_up:
                self.changed.wait(max(0.0, give_up - time.monotonic()))
        sender.send(self.seen(k), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
