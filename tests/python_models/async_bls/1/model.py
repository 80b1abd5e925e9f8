"""SUM = doubler(x) + doubler(2x), the two requests sent with async_exec and awaited together
with asyncio.gather inside `async def execute`, as in Triton's async BLS example. PARAMS: what
`interop` saw as request.parameters() when asked with parameters of this model's own."""
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            calls = [
                pb_utils.InferenceRequest(
                    model_name="doubler", requested_output_names=["y"],
                    inputs=[pb_utils.Tensor("x", x * k)]).async_exec()
                for k in (1, 2)
            ]
            answers = await asyncio.gather(*calls)
            for answer in answers:
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
            total = sum(pb_utils.get_output_tensor_by_name(a, "y").as_numpy() for a in answers)
            seen = pb_utils.InferenceRequest(
                model_name="interop", requested_output_names=["PARAMS"],
                inputs=[pb_utils.Tensor("X", x)], parameters={"via": "bls", "k": 7}).exec()
            if seen.has_error():
                raise pb_utils.TritonModelException(seen.error().message())
            params = pb_utils.get_output_tensor_by_name(seen, "PARAMS").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("SUM", total), pb_utils.Tensor("PARAMS", params)]))
        return responses
