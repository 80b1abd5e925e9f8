"""Each request is answered by a thread of the model's own, started by `execute`, which returns
at once (as Triton's decoupled examples do). The thread sends SEEN = [k, n, w]: the number k of
the execute call that brought the request, the number n of execute calls begun so far, and
WAIT_MS as it reads it from the request then; waits up to WAIT_MS for a later execute call to
begin, sends SEEN again (reading WAIT_MS again), and the final flag. `finalize` waits for the
threads still running, as Triton's examples do."""
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
            thread = threading.Thread(target=self.answer, args=(request, k))
            thread.start()
            self.threads.append(thread)
        return None

    @staticmethod
    def wait_ms(request):
        return int(pb_utils.get_input_tensor_by_name(request, "WAIT_MS").as_numpy()[0])

    def seen(self, request, k):
        seen = np.array([k, self.calls, self.wait_ms(request)], np.int32)
        return pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", seen)])

    def answer(self, request, k):
        sender = request.get_response_sender()
        wait_ms = self.wait_ms(request)
        sender.send(self.seen(request, k))
        give_up = time.monotonic() + wait_ms / 1000
        with self.changed:
            while self.calls == k and time.monotonic() < give_up:
                self.changed.wait(max(0.0, give_up - time.monotonic()))
        sender.send(self.seen(request, k), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
