"""baton with `async def execute`: the coroutine answers each request with SEEN = [k, n, w] (the
number k of the execute call, the number n of calls begun so far, WAIT_MS as read from the
request then), awaits up to WAIT_MS for a later call to begin, answers again and sends the final
flag. As in Triton's Python backend, a decoupled model's coroutine is not waited for: the next
batch's `execute` begins while it awaits."""
import asyncio
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    async def execute(self, requests):
        self.calls += 1
        k = self.calls
        await asyncio.gather(*(self.answer(request, k) for request in requests))
        return None

    def seen(self, request, k):
        wait_ms = int(pb_utils.get_input_tensor_by_name(request, "WAIT_MS").as_numpy()[0])
        seen = np.array([k, self.calls, wait_ms], np.int32)
        return pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", seen)]), wait_ms

    async def answer(self, request, k):
        sender = request.get_response_sender()
        first, wait_ms = self.seen(request, k)
        sender.send(first)
        give_up = time.monotonic() + wait_ms / 1000
        while self.calls == k and time.monotonic() < give_up:
            await asyncio.sleep(0.005)
        sender.send(self.seen(request, k)[0], flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
