"""BF16 through Triton's API: each request's X (bfloat16) goes out through `to_dlpack()` and
comes back through `Tensor.from_dlpack()`, as a PyTorch model's tensors do; DOUBLED is twice
it in bfloat16, WIDE it in float32, and DLPACK_TYPE the type the capsule declared (DLPack's
code, bits and lanes: 4, 16, 1 is bfloat16), read from the capsule itself."""
import ctypes

import numpy as np
import triton_python_backend_utils as pb_utils


class DLTensorHead(ctypes.Structure):
    # The start of DLPack's DLTensor: data, device (type, id), ndim, dtype (code, bits, lanes).
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


def declared_type(capsule):
    pointer = ctypes.pythonapi.PyCapsule_GetPointer
    pointer.restype = ctypes.c_void_p
    pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    head = DLTensorHead.from_address(pointer(capsule, b"dltensor"))
    return [head.code, head.bits, head.lanes]


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            capsule = x.to_dlpack()
            kind = declared_type(capsule)
            back = pb_utils.Tensor.from_dlpack("X", capsule).as_numpy()
            doubled = pb_utils.Tensor("DOUBLED", back * 2)
            wide = pb_utils.Tensor("WIDE", back.astype(np.float32))
            dlpack = pb_utils.Tensor("DLPACK_TYPE",
                                     np.array([kind] * len(back), dtype=np.int32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[doubled, wide, dlpack]))
        return responses
