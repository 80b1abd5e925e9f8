"""Triton's Python backend utilities, as sheaf serves them.

A Triton model does `import triton_python_backend_utils as pb_utils` and finds here what
Triton's own module gives it: tensors, requests, responses, errors, the configuration helpers
and the string conversions, `Logger`, whose lines reach the server's log at their level, and
`MetricFamily`, whose metrics the server's `/metrics` shows.
Tensors are NumPy arrays (BF16: of ml_dtypes' bfloat16, which `to_dlpack()` hands on as
DLPack's bfloat16); an input tensor's array is a view of the shared memory the server
wrote the request into, valid while `execute` runs (a decoupled model's requests, which may
outlive `execute`, hold copies).
"""

import asyncio
import base64
import ctypes
import functools
import importlib
import json
import math
import struct
import sys

import numpy as np

# Triton's type names and their NumPy types (BYTES: object arrays of bytes).
_TO_NUMPY = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
    "TYPE_BYTES": np.object_,
}

# BF16 has no NumPy type of its own: its tensors are arrays of ml_dtypes' bfloat16 (the type
# JAX and ONNX use), where the interpreter has ml_dtypes, else None.
try:
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
    _TO_NUMPY["TYPE_BF16"] = ml_dtypes.bfloat16
except ImportError:
    BFLOAT16 = None


def triton_string_to_numpy(triton_type_string):
    """The NumPy type of a Triton type name (`TYPE_FP32` -> numpy.float32)."""
    return _TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor):
    """BYTES elements as the wire form: each element's length (4 bytes, little endian), then
    its bytes. Returns a one-dimensional uint8 array, or None for an empty tensor."""
    if input_tensor.size == 0:
        return None
    parts = []
    for item in input_tensor.flatten(order="C"):
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray)):
            item = str(item).encode("utf-8")
        parts.append(_LENGTH.pack(len(item)))
        parts.append(item)
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor):
    """The elements of the wire form, as a one-dimensional object array of bytes."""
    return _read_bytes(bytes(encoded_tensor), 0, None)


# A BYTES element's length, as the wire form writes it.
_LENGTH = struct.Struct("<I")


def _read_bytes(data, at, count):
    """`count` elements of the wire form in `data` (a buffer) from `at`, or every element to
    its end when `count` is None, as a one-dimensional object array of bytes."""
    items = []
    end = len(data)
    while (at < end) if count is None else (len(items) < count):
        (size,) = _LENGTH.unpack_from(data, at)
        at += 4
        items.append(bytes(data[at:at + size]))
        at += size
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out


def numpy_to_triton_string(numpy_type):  # noqa: D401
    """The Triton type name of a NumPy type (numpy.float32 -> `TYPE_FP32`)."""
    numpy_type = np.dtype(numpy_type).type
    if numpy_type in (np.object_, np.bytes_, np.str_):
        return "TYPE_STRING"
    for name, t in _TO_NUMPY.items():
        if t is numpy_type and name not in ("TYPE_STRING", "TYPE_BYTES"):
            return name
    return None


def get_input_config_by_name(model_config, name):
    """The `input` entry of `model_config` named `name`, or None."""
    for entry in model_config.get("input", []):
        if entry.get("name") == name:
            return entry
    return None


def get_output_config_by_name(model_config, name):
    """The `output` entry of `model_config` named `name`, or None."""
    for entry in model_config.get("output", []):
        if entry.get("name") == name:
            return entry
    return None


def using_decoupled_model_transaction_policy(model_config):
    """Whether the model's configuration (the dict of `json.loads(args["model_config"])`)
    makes it decoupled."""
    policy = model_config.get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


def get_input_tensor_by_name(inference_request, name):
    """The request's input tensor named `name`, or None."""
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response, name):
    """The response's output tensor named `name`, or None."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


class TritonError(Exception):
    """An error a model puts in a response: that request fails with `message`."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message, code=INTERNAL):
        super().__init__(message)
        self._message = message
        self._code = code

    def message(self):
        return self._message

    def code(self):
        return self._code


class TritonModelException(Exception):
    """Raised by a model to fail the whole `execute` call."""

    def __init__(self, message=""):
        super().__init__(message)
        self._message = message

    def message(self):
        return self._message


class Tensor:
    """A named tensor holding a NumPy array."""

    def __init__(self, name, data, dtype=None):
        if not isinstance(data, np.ndarray):
            data = np.asarray(data)
        self._name = name
        self._array = data

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array

    def shape(self):
        return list(self._array.shape)

    def triton_dtype(self):
        return numpy_to_triton_string(self._array.dtype)

    def is_cpu(self):
        return True

    @staticmethod
    def from_dlpack(name, capsule):
        """A tensor from a DLPack capsule (`torch.utils.dlpack.to_dlpack(t)`, as Triton's
        examples pass), or from any object with `__dlpack__` (a PyTorch, CuPy or NumPy array).
        Tensors reach the server through host memory, so a GPU tensor is copied to the host
        here (with PyTorch or CuPy, whichever made it)."""
        return Tensor(name, _host_array(capsule))

    def to_dlpack(self):
        """The tensor as a DLPack capsule (`torch.utils.dlpack.from_dlpack` reads it); a BF16
        tensor's capsule says bfloat16, as Triton's does."""
        if BFLOAT16 is not None and self._array.dtype == BFLOAT16:
            # NumPy exports no bfloat16: the same bits as uint16, then the capsule's type
            # set to DLPack's bfloat16.
            capsule = self._array.view(np.uint16).__dlpack__()
            _capsule_head(capsule).dtype.code = _DL_BFLOAT
            return capsule
        return self._array.__dlpack__()


# DLPack's device kinds (`DLDeviceType`) that NumPy reads in place.
_DL_HOST = (1, 3)  # kDLCPU, kDLCUDAHost
# DLPack's type codes (`DLDataTypeCode`) for unsigned integers and bfloat16.
_DL_UINT, _DL_BFLOAT = 1, 4


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensorHead(ctypes.Structure):
    """The start of DLPack's `DLTensor`, which starts a legacy capsule's `DLManagedTensor`."""
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType)]


class _Capsule:
    """A bare capsule, dressed as the object NumPy's `from_dlpack` takes."""

    def __init__(self, capsule, device):
        self._capsule = capsule
        self._device = device

    def __dlpack__(self, *args, **kwargs):
        return self._capsule

    def __dlpack_device__(self):
        return self._device


def _capsule_head(capsule):
    """The `DLTensor` of a legacy "dltensor" capsule, in place."""
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    if get_name(capsule) != b"dltensor":
        raise TritonModelException(
            "from_dlpack: the capsule is not an unused DLPack tensor (it was read already, or "
            "is of another DLPack version): pass the tensor itself")
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return _DLTensorHead.from_address(get(capsule, b"dltensor"))


def _capsule_device(capsule):
    """The (kind, index) of the device a legacy "dltensor" capsule's data lies on."""
    head = _capsule_head(capsule)
    return head.device.device_type, head.device.device_id


def _host_capsule(capsule, device):
    """The array of a capsule whose data is on the host: NumPy reads it in place, and a
    bfloat16 one (which NumPy does not take) as the same bits in uint16, viewed as bfloat16."""
    head = _capsule_head(capsule)
    if head.dtype.code != _DL_BFLOAT:
        return np.from_dlpack(_Capsule(capsule, device))
    if BFLOAT16 is None:
        raise TritonModelException(
            "from_dlpack: a bfloat16 tensor is read as ml_dtypes' bfloat16: install ml_dtypes "
            f"into {sys.executable}")
    if head.dtype.bits != 16 or head.dtype.lanes != 1:
        raise TritonModelException(
            f"from_dlpack: a bfloat16 type of {head.dtype.bits} bits and {head.dtype.lanes} "
            "lanes; BF16 is 16 bits, one lane")
    head.dtype.code = _DL_UINT
    return np.from_dlpack(_Capsule(capsule, device)).view(BFLOAT16)


def _host_array(source):
    """A NumPy array of `source` (a DLPack capsule or an object with `__dlpack__`), on the
    host."""
    if hasattr(source, "__dlpack__"):
        device = source.__dlpack_device__()
        kind = device[0]
        if kind not in _DL_HOST:
            if hasattr(source, "cpu"):  # PyTorch
                return _host_array(source.detach().cpu())
            if hasattr(source, "get"):  # CuPy
                return np.asarray(source.get())
            raise TritonModelException(f"from_dlpack: cannot copy a tensor on device kind "
                                       f"{kind} to the host")
        if isinstance(source, np.ndarray):
            return source
        # A legacy capsule (`__dlpack__()` as DLPack's first versions call it), read as one.
        return _host_capsule(source.__dlpack__(), device)
    kind, index = _capsule_device(source)
    if kind in _DL_HOST:
        return _host_capsule(source, (kind, index))
    for module, read in (("torch", lambda m: _host_array(m.utils.dlpack.from_dlpack(source).cpu())),
                         ("cupy", lambda m: m.from_dlpack(_Capsule(source, (kind, index))).get())):
        try:
            return read(importlib.import_module(module))
        except ImportError:
            continue
    raise TritonModelException(
        f"from_dlpack: the tensor is on device kind {kind}; copying it to the host takes "
        "PyTorch or CuPy in the model's interpreter")


# How `InferenceRequest.exec()` reaches the server: set by the process that runs the model.
_CALL = None
# How the model loading API reaches the server: set by the process that runs the model.
_MANAGE = None
# Where a request of default mode gets its response sender: set by the process that runs the
# model.
_SENDER_FOR = None
# Whether the model may ask for a request to run again (`sequence_batching {
# iterative_sequence: true }`): set by the process that runs the model.
_ITERATIVE = False


def _manage(op, model_name, version="", config="", files=None):
    if _MANAGE is None:
        raise TritonModelException(f"{op}: this process has no server to ask")
    return _MANAGE(op, str(model_name), str(version), str(config), files or {})


def load_model(model_name, config="", files=None):
    """Loads `model_name` and returns once it is ready, as the repository API's load does (the
    server runs with --model-control-mode explicit or on_demand). `config`, a configuration in
    Triton's JSON form, is loaded with in place of the folder's; `files`, Triton's
    `{"file:1/model.onnx": bytes, ...}`, are the model's files to load from in place of its
    folder (they need `config`)."""
    encoded = {}
    for path, data in (files or {}).items():
        if not isinstance(path, str) or not path.startswith("file:"):
            raise TritonModelException(
                f"load_model: a file's key is 'file:' and its path in the model's folder "
                f"(file:1/model.onnx), not {path!r}")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TritonModelException(
                f"load_model: the file {path!r} must be bytes, not {type(data).__name__}")
        encoded[path[len("file:"):]] = base64.b64encode(bytes(data)).decode("ascii")
    if encoded and not config:
        raise TritonModelException(
            "load_model: files need a config too: the model's configuration in Triton's JSON "
            "form")
    _manage("load", model_name, config=config, files=encoded)


def unload_model(model_name, unload_dependents=False):
    """Unloads `model_name` once the requests it admitted are answered."""
    _manage("unload", model_name)


def is_model_ready(model_name, model_version=""):
    """Whether `model_name` (at `model_version`, else its newest) is ready to serve."""
    return bool(_manage("ready", model_name, model_version))


class InferenceRequest:
    """One request of a batch (its inputs, id and parameters), or a request the model sends to
    another model of the server with `exec()` (business logic scripting)."""

    def __init__(self, inputs=None, request_id="", correlation_id=0, requested_output_names=None,
                 parameters="{}", model_name="", model_version=-1, flags=0, timeout=0,
                 preferred_memory=None, trace=None):
        self._inputs = list(inputs or [])
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._requested = list(requested_output_names or [])
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(parameters)
        self._model_name = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._trace = trace if isinstance(trace, InferenceTrace) else InferenceTrace()
        if preferred_memory is not None and not isinstance(preferred_memory, PreferredMemory):
            raise TritonModelException(
                "InferenceRequest: preferred_memory is a pb_utils.PreferredMemory")

    def inputs(self):
        return self._inputs

    def request_id(self):
        return self._request_id

    def correlation_id(self):
        return self._correlation_id

    def requested_output_names(self):
        return self._requested

    def parameters(self):
        return self._parameters

    def flags(self):
        return self._flags

    def set_flags(self, flags):
        """Sets the request's flags (the sequence START and END flags of a request the model
        sends with `exec()`), as Triton's `set_flags`."""
        if not isinstance(flags, int) or isinstance(flags, bool) or flags < 0:
            raise TritonModelException(f"set_flags: flags are a non-negative int, not {flags!r}")
        self._flags = flags

    def timeout(self):
        return self._timeout

    def _placed_parameters(self):
        """The parameters the request is sent with: its own, and what the server reads itself
        from a client's request: `timeout` (microseconds), and the sequence that
        `correlation_id` and the START and END flags name."""
        text = self._parameters.strip()
        try:
            params = json.loads(text) if text else {}
        except ValueError as e:
            raise TritonModelException(f"InferenceRequest parameters are not JSON: {e}") from None
        if not isinstance(params, dict):
            raise TritonModelException("InferenceRequest parameters must be a JSON object")
        if self._timeout:
            params["timeout"] = int(self._timeout)
        if self._correlation_id not in (0, ""):
            params["sequence_id"] = self._correlation_id
            params["sequence_start"] = bool(self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)
            params["sequence_end"] = bool(self._flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
        elif self._flags & (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
                            | TRITONSERVER_REQUEST_FLAG_SEQUENCE_END):
            raise TritonModelException(
                "InferenceRequest: the sequence START and END flags need a correlation_id")
        return json.dumps(params)

    def trace(self):
        """The request's trace, to pass on to the requests it sends (`InferenceRequest(...,
        trace=request.trace())`), as Triton's examples do: when this request is traced, so is
        each request sent with it, as a child of its trace."""
        return self._trace

    def set_release_flags(self, flags):
        """Triton's release flags: RELEASE_ALL, what every request gets, and
        RELEASE_RESCHEDULE: the request runs again in a later batch, with the same inputs, id
        and (decoupled) response sender, for a model whose configuration has
        `sequence_batching { iterative_sequence: true }`. In default mode its response in this
        `execute` is None; a decoupled model sets the flag before `execute` returns, and sends
        no final flag for it until the run that ends it."""
        if flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            if not _ITERATIVE:
                raise TritonModelException(
                    "set_release_flags: TRITONSERVER_REQUEST_RELEASE_RESCHEDULE needs "
                    "sequence_batching { iterative_sequence: true } in the model's "
                    "configuration, as under Triton")
            self._rescheduled = True
            return
        if flags != TRITONSERVER_REQUEST_RELEASE_ALL:
            raise TritonModelException(f"set_release_flags: unknown flags {flags!r}")
        self._rescheduled = False

    def is_cancelled(self):
        """Whether the client has gone (a decoupled model's requests; False for others)."""
        cancelled = getattr(self, "_cancelled", None)
        return bool(cancelled and cancelled())

    def get_response_sender(self):
        """Where this request's responses go: any number, then the final flag, for a decoupled
        model; exactly one, with the final flag or before it, in default mode (then
        `execute` returns None)."""
        sender = getattr(self, "_sender", None)
        if sender is None and _SENDER_FOR is not None:
            sender = _SENDER_FOR(self)
        if sender is None:
            raise TritonModelException(
                "get_response_sender: this request is not one the server gave the model "
                "in the execute call under way")
        return sender

    def exec(self, decoupled=False):
        """Runs this request on `model_name` (of the same server) and returns its
        InferenceResponse: the outputs named in `requested_output_names` (every output when
        none are named), or an error response saying why it failed. The request is queued and
        batched like any client's: its `timeout` (microseconds to start within), its
        `correlation_id` with the SEQUENCE_START and SEQUENCE_END flags (a stateful model's
        sequence), its `request_id` and any `priority` among its parameters place it as they
        would a client's.

        With `decoupled=True` (a streaming model, or any other), an iterator over its
        responses, then an empty final one, as Triton's: each response is yielded as soon as
        the model has sent it. A stream left unread is read to its end before the model's next
        request or its answer."""
        if _CALL is None:
            raise TritonModelException("exec: this process has no server to send requests to")
        version = str(self._model_version) if int(self._model_version) > 0 else None
        answer = _CALL(self._model_name, version, self._inputs, self._requested, decoupled,
                       self._placed_parameters(), str(self._request_id or ""),
                       self._trace._number)
        return answer

    async def async_exec(self, decoupled=False):
        """As exec(), for `async def execute`: the result is awaited, on a thread of the
        event loop's executor, so that the loop's other coroutines run meanwhile. A process
        sends one request at a time, so requests gathered with `asyncio.gather` run one after
        another."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, functools.partial(self.exec, decoupled))


class InferenceTrace:
    """What `InferenceRequest.trace()` gives. sheaf traces the requests that clients send
    (`--trace-config`, `/v2/trace/setting`); a request a model sends with `exec()` made with
    `trace=request.trace()` is traced with the request it was sent for, as a child of its trace
    (Triton's `parent_id`), when that one is traced and the answer comes before its own. There
    is no OpenTelemetry context to carry."""

    def __init__(self, _number=None):
        # The number the server gave the request's trace in its batch; None: not traced.
        self._number = _number

    def get_context(self, mode="opentelemetry"):  # noqa: ARG002 - Triton's signature
        return None


class InferenceResponse:
    """The answer to one request: output tensors, or an error, and parameters (a dict of
    str to bool, int, float or str, or its JSON text) that reach the client beside the
    outputs."""

    def __init__(self, output_tensors=None, error=None, parameters=None):
        self._outputs = list(output_tensors or [])
        self._error = error
        if isinstance(parameters, str):
            parameters = json.loads(parameters) if parameters.strip() else {}
        parameters = dict(parameters or {})
        for key, value in parameters.items():
            if (not isinstance(key, str) or not isinstance(value, (bool, int, float, str))
                    or (isinstance(value, float) and not math.isfinite(value))):
                raise TritonModelException(
                    f"InferenceResponse parameters are str keys with bool, int, finite float "
                    f"or str values, not {key!r}: {value!r}")
        self._parameters = parameters

    def parameters(self):
        """The response's parameters, as JSON text (as Triton's)."""
        return json.dumps(self._parameters)

    def output_tensors(self):
        return self._outputs

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error


class ModelConfig:
    """What `auto_complete_config` gets: the configuration, with setters that fill what it lacks.

    `max_batch_size_open`: the configuration's `max_batch_size` is the server's choice, not a
    number the user gave (a `config.yaml` without it, or with `auto`), so the model may set
    its own."""

    def __init__(self, model_config, max_batch_size_open=False):
        self._config = model_config
        self._max_batch_size_open = max_batch_size_open

    def as_dict(self):
        return self._config

    def set_max_batch_size(self, max_batch_size):
        current = self._config.get("max_batch_size", 0)
        if not self._max_batch_size_open and current not in (0, max_batch_size):
            raise ValueError(
                f"configuration specified max_batch_size {current}, but the model sets "
                f"{max_batch_size}")
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self):
        """Dynamic batching, unless the configuration already has it; a configuration that
        schedules the model otherwise (sequence batching, an ensemble) is refused, as under
        Triton: a model has one scheduler."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._config:
                raise ValueError(
                    f"the configuration schedules the model with {other}, so the model "
                    f"cannot set dynamic_batching")
        self._config.setdefault("dynamic_batching", {})

    def _add(self, kind, tensor):
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                raise ValueError(f"{kind} '{tensor.get('name', '')}' is missing '{key}'")
        entries = self._config.setdefault(kind, [])
        for entry in entries:
            if entry.get("name") == tensor["name"]:
                for key, value in tensor.items():
                    if key in entry and entry[key] != value and key != "name":
                        raise ValueError(
                            f"{kind} '{tensor['name']}': the configuration has {key} "
                            f"{entry[key]}, the model sets {value}")
                    entry.setdefault(key, value)
                return
        entries.append(dict(tensor))

    def add_input(self, input):  # noqa: A002 - Triton's name
        self._add("input", input)

    def add_output(self, output):
        self._add("output", output)

    def set_model_transaction_policy(self, transaction_policy_dict):
        self._config["model_transaction_policy"] = dict(transaction_policy_dict)


TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# Where a tensor's memory is, as Triton names it.
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2


class PreferredMemory:
    """Where a model would have the outputs of a request it sends (`InferenceRequest(...,
    preferred_memory=PreferredMemory(TRITONSERVER_MEMORY_CPU, 0))`), as Triton's BLS takes
    it. sheaf hands every output over as a NumPy array in host memory, which the model moves
    where it wants (`torch.from_numpy(...).cuda()`), so the preference is taken and checked,
    and the outputs come in host memory."""

    def __init__(self, preferred_memory_type, preferred_device_id=0):
        kinds = (TRITONSERVER_MEMORY_CPU, TRITONSERVER_MEMORY_CPU_PINNED, TRITONSERVER_MEMORY_GPU)
        if preferred_memory_type not in kinds:
            raise TritonModelException(
                f"PreferredMemory: memory type {preferred_memory_type!r} is not "
                "TRITONSERVER_MEMORY_CPU, TRITONSERVER_MEMORY_CPU_PINNED or "
                "TRITONSERVER_MEMORY_GPU")
        if not isinstance(preferred_device_id, int) or preferred_device_id < 0:
            raise TritonModelException(
                f"PreferredMemory: device id {preferred_device_id!r} is not a device number")
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class LogLevel:
    """The levels of `Logger.log`."""
    INFO = "info"
    WARNING = "warn"
    ERROR = "error"
    VERBOSE = "verbose"


class Logger:
    """Triton's logger: each line reaches the server's log at its level (verbose: debug), with
    the model instance's name. A line starts with a character (0x1E) that the server reads as
    the mark of a logged line, and then the level."""

    @staticmethod
    def log(message, level=LogLevel.INFO):
        levels = (LogLevel.INFO, LogLevel.WARNING, LogLevel.ERROR, LogLevel.VERBOSE)
        if message in levels and level not in levels:
            message, level = level, message  # log(level, message), as some models call it
        if level not in levels:
            level = LogLevel.INFO
        text = "".join(f"\x1e{level} {line}\n" for line in str(message).splitlines() or [""])
        sys.stderr.write(text)
        sys.stderr.flush()

    @staticmethod
    def log_info(message):
        Logger.log(message, LogLevel.INFO)

    @staticmethod
    def log_warn(message):
        Logger.log(message, LogLevel.WARNING)

    @staticmethod
    def log_error(message):
        Logger.log(message, LogLevel.ERROR)

    @staticmethod
    def log_verbose(message):
        Logger.log(message, LogLevel.VERBOSE)


# How metrics reach the server (a socket of the process's own): set by the process that runs
# the model, with `ask(message)` (answered) and `tell(message)` (not).
_METRICS = None


def _metrics():
    if _METRICS is None:
        raise TritonModelException("custom metrics: this process has no server to report to")
    return _METRICS


def _number(value, what):
    try:
        return repr(float(value))
    except (TypeError, ValueError):
        raise TritonModelException(f"{what}: {value!r} is not a number") from None


class MetricFamily:
    """A family of metrics the model defines (Triton's custom metrics), shown at the server's
    `/metrics` under its own name, beside the server's. Families are shared: every instance
    that declares the same name, with the same kind, counts into the same series. A family
    lives as long as a process that declared it (it leaves `/metrics` when its model unloads).
    """

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2
    _KINDS = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}

    def __init__(self, name, description, kind):
        if kind not in self._KINDS:
            raise TritonModelException(
                f"MetricFamily: kind {kind!r} is not COUNTER, GAUGE or HISTOGRAM")
        self._name = str(name)
        self._kind = kind
        answer = _metrics().ask({"op": "declare", "name": self._name,
                                 "description": str(description), "kind": self._KINDS[kind]})
        if "error" in answer:
            raise TritonModelException(f"MetricFamily: {answer['error']}")

    def Metric(self, labels=None, buckets=None):  # noqa: N802 - Triton's name
        """The family's metric with `labels` (a dict of strings); a histogram's takes its
        buckets' upper bounds, in increasing order."""
        return Metric(self, labels, buckets)


class Metric:
    """One series of a MetricFamily: `increment` (a counter by a value ≥ 0, a gauge by any),
    `set` (a gauge), `observe` (a histogram) and `value()` (a counter's or a gauge's, across
    every instance that counts into it)."""

    def __init__(self, family, labels=None, buckets=None):
        labels = dict(labels or {})
        for k, v in labels.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TritonModelException(
                    f"Metric: labels are strings, not {type(k).__name__}: {type(v).__name__}")
        self._family = family
        self._labels = labels
        message = {"op": "series", "family": family._name, "labels": labels}
        if buckets is not None:
            message["buckets"] = [_number(b, "Metric bucket") for b in buckets]
        elif family._kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("Metric: a histogram's metric needs its buckets")
        answer = _metrics().ask(message)
        if "error" in answer:
            raise TritonModelException(f"Metric: {answer['error']}")

    def _change(self, op, value):
        _metrics().tell({"op": op, "family": self._family._name, "labels": self._labels,
                         "value": value})

    def increment(self, value):
        kind = self._family._kind
        if kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("increment: a histogram takes observe()")
        text = _number(value, "increment")
        if kind == MetricFamily.COUNTER and float(text) < 0:
            raise TritonModelException(f"increment: a counter only goes up, not by {value}")
        self._change("increment", text)

    def set(self, value):
        if self._family._kind != MetricFamily.GAUGE:
            raise TritonModelException("set: only a gauge is set")
        self._change("set", _number(value, "set"))

    def observe(self, value):
        if self._family._kind != MetricFamily.HISTOGRAM:
            raise TritonModelException("observe: only a histogram observes")
        self._change("observe", _number(value, "observe"))

    def value(self):
        if self._family._kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("value: a histogram has no single value")
        answer = _metrics().ask({"op": "value", "family": self._family._name,
                                 "labels": self._labels})
        if "error" in answer:
            raise TritonModelException(f"value: {answer['error']}")
        return float(answer["ok"])
