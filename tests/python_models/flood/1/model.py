"""Two threads each send COUNT responses of SIZE int32 values at once: thread t's i-th response
is filled with 1000 * t + i; the second thread to finish sends the final flag. Their responses
pass each other in shared memory, so the client can check that none was overwritten."""
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class Flood:
    def __init__(self, sender, count, size):
        self.sender, self.count, self.size = sender, count, size
        self.left = 2
        self.lock = threading.Lock()

    def send(self, t):
        for i in range(self.count):
            fill = np.full(self.size, 1000 * t + i, np.int32)
            self.sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("FILL", fill)]))
        with self.lock:
            self.left -= 1
            last = self.left == 0
        if last:
            self.sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            size = int(pb_utils.get_input_tensor_by_name(request, "SIZE").as_numpy()[0])
            flood = Flood(request.get_response_sender(), count, size)
            for t in (1, 2):
                threading.Thread(target=flood.send, args=(t,)).start()
        return None
