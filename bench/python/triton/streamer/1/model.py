"""A token generator's shape without its arithmetic: `execute` starts a thread per request
and returns at once, as Triton's decoupled examples do; the thread sends COUNT responses
(OUT = 1, 2, ...), DELAY_MS apart (the time a real model would take per token), then the final
flag. `finalize` waits for the threads still running."""
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        self.threads = [t for t in self.threads if t.is_alive()]
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            delay = int(pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()[0])
            thread = threading.Thread(target=self.generate,
                                      args=(request.get_response_sender(), count, delay / 1000))
            thread.start()
            self.threads.append(thread)
        return None

    def generate(self, sender, count, delay):
        for i in range(1, count + 1):
            time.sleep(delay)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
