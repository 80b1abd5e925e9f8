"""One instance of a Python model, in its own process, driven by the sheaf server.

The server starts `python sheaf_runner.py MODEL_FILE INPUT_SHM OUTPUT_SHM CALLS_SHM CONTROL_SHM
METRICS_SOCKET READY_SOCKET` and speaks over the process's stdin and its original stdout (the model's own
prints go to stderr). Each message is a 4-byte little-endian length, then JSON. Tensor bytes do
not cross the pipe: the server writes a batch's inputs into INPUT_SHM, this process writes the
outputs into OUTPUT_SHM (growing it when they do not fit) and each side says where each tensor
lies. The server's operations are for the main thread, its answers to the model's own requests
for the thread that asked (`Inbox`).

Messages from the server: `init` (the model's configuration and Triton's `args`), `execute`
(Triton's API: requests, each answered on its own), `infer` (sheaf's batched API: one batch) and
`finalize`. Every answer is `{"ok": ...}` or `{"error": "..."}`.

A decoupled model's `execute` is answered as soon as it returns: the server then sends the next
batch, while the model's own threads may go on answering earlier requests. Each response goes
out as it is sent, as `{"partial": {"call", "request", "outputs", "span", "final"}}` (or with
`"error"`), and a final flag sent alone as `{"final": {"call", "request"}}`. The responses' tensors
go one after another around OUTPUT_SHM as a ring: the server counts the bytes it has read in the
first 8 bytes of CONTROL_SHM, and a response is written only over bytes it has read (`Ring`).
The byte at 64 + the request's `slot` in CONTROL_SHM turns 1 once its client has gone
(`is_cancelled()`).

A model may send requests of its own to the server while it runs, from `execute` or from a
thread of its own (Triton's business logic scripting: `pb_utils.InferenceRequest(...).exec()`):
`{"call": {"model", "version", "inputs", "outputs", "parameters", "id", "decoupled", "trace"}}`
(the parameters carrying the timeout and the sequence, as a client's JSON request does; `trace`
the number a request of the batch carried as its `trace`, when it is sent with that request's
trace, so that the server traces it with that request), its inputs in
CALLS_SHM, answered by `{"ok": {"outputs": [...], "parameters": {...}}}` (the outputs in
CALLS_SHM; the parameters when the answering model set some) or `{"error": "..."}`. With
`decoupled`, each response of the stream comes as `{"part": {"outputs": [...], ...}}` or
`{"part": {"error": "..."}}` while the model iterates; the process copies it out of CALLS_SHM and
says `{"next": {}}` before the server writes the next, and `{"ok": {}}` (or `{"error": "..."}`)
ends the stream. One call at a time per process: a stream the model has not read to its end is
read before the next call or the answer. `{"manage": {"op", "model", "version"}}` loads, unloads
(`op` "load", "unload") or asks after ("ready") a model of the server, answered `{"ok": ...}` or
`{"error": "..."}`.

The metrics the model defines (`pb_utils.MetricFamily`) go over METRICS_SOCKET, a Unix socket
apart from the pipes, one line of JSON each way (`MetricsLine`), so that any thread may count
at any time.

A model that defines `is_ready()` (Triton's API: a method of the model; the batched API: a
function of the module) is asked whether it can serve on READY_SOCKET, a Unix socket this
process listens on once the model has loaded (`init` answers `"is_ready": true`), answered by a
thread of its own while batches run (`ReadyLine`).
"""

import asyncio
import collections
import importlib.util
import inspect
import json
import math
import mmap
import os
import socket
import sys
import threading
import time
import traceback

PROTOCOL_OUT = os.fdopen(os.dup(1), "wb", buffering=0)
# The model's prints must not reach the protocol: stdout is the server's log from here on.
os.dup2(2, 1)
sys.stdout = sys.stderr
PROTOCOL_IN = os.fdopen(os.dup(0), "rb", buffering=0)

try:
    import numpy as np  # noqa: E402  (after the protocol's file descriptors are set up)
except ImportError as e:
    # Said on stderr, which the server quotes in the load error.
    sys.stderr.write(f"{sys.executable} cannot import NumPy ({e}), which every Python model "
                     "needs: install numpy into it, or set `python:` in the model's config (or "
                     "the server's --python) to an interpreter that has it\n")
    sys.exit(1)

import triton_python_backend_utils as pb_utils  # noqa: E402

NUMPY = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}
# BF16 tensors are arrays of ml_dtypes' bfloat16 (NumPy has no type of its own for it), where
# the interpreter has ml_dtypes; a model that declares one needs it.
if pb_utils.BFLOAT16 is not None:
    NUMPY["BF16"] = pb_utils.BFLOAT16
# The protocol's name of each NumPy type sheaf serves, looked up once per output.
PROTOCOL_NAMES = {np.dtype(t): name for name, t in NUMPY.items()}
ALIGN = 64


def protocol_name(dtype):
    name = PROTOCOL_NAMES.get(dtype)
    if name is not None:
        return name
    if dtype == np.object_ or dtype.kind in ("S", "U"):
        return "BYTES"
    return str(dtype)


def read_exact(n):
    data = b""
    while len(data) < n:
        chunk = PROTOCOL_IN.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


class Inbox:
    """The server's messages, for the thread each is for: its operations for the main thread,
    its answers to the model's own requests for the thread that asked (one at a time, under
    `Runner.calling`). A thread that waits reads stdin itself while no other does, keeping
    for the other what it reads for it; so a batch reaches the main thread with no hand-over."""

    def __init__(self):
        self.changed = threading.Condition()
        self.reading = False
        self.kept = {True: collections.deque(), False: collections.deque()}

    def take(self, operation):
        """The next operation (`operation`), or the next answer."""
        mine = self.kept[operation]
        with self.changed:
            while not mine and self.reading:
                self.changed.wait()
            if mine:
                return mine.popleft()
            self.reading = True
        try:
            while True:
                message = self.read()
                if ("op" in message) == operation:
                    return message
                with self.changed:
                    self.kept["op" in message].append(message)
                    self.changed.notify_all()
        finally:
            with self.changed:
                self.reading = False
                self.changed.notify_all()

    @staticmethod
    def read():
        size = read_exact(4)
        body = read_exact(int.from_bytes(size, "little")) if size is not None else None
        if body is None:
            os._exit(0)  # the server has gone
        return json.loads(body)


INBOX = Inbox()


def receive():
    """The server's answer to the model's own request."""
    return INBOX.take(False)


SENDING = threading.Lock()


def send(message):
    body = json.dumps(message).encode()
    with SENDING:
        PROTOCOL_OUT.write(len(body).to_bytes(4, "little") + body)


CODE_NAMES = {
    pb_utils.TritonError.UNKNOWN: "UNKNOWN", pb_utils.TritonError.INTERNAL: "INTERNAL",
    pb_utils.TritonError.NOT_FOUND: "NOT_FOUND", pb_utils.TritonError.INVALID_ARG: "INVALID_ARG",
    pb_utils.TritonError.UNAVAILABLE: "UNAVAILABLE",
    pb_utils.TritonError.UNSUPPORTED: "UNSUPPORTED",
    pb_utils.TritonError.ALREADY_EXISTS: "ALREADY_EXISTS",
    pb_utils.TritonError.CANCELLED: "CANCELLED",
}
CODES = {name: code for code, name in CODE_NAMES.items()}


def error_answer(e, **fields):
    """A response's error as the server reads it: its message, and Triton's code by name (the
    server answers INVALID_ARG with 400 / INVALID_ARGUMENT and UNAVAILABLE with 503 /
    UNAVAILABLE; any other with 500 / INTERNAL)."""
    answer = dict(fields)
    answer["error"] = message_of(e)
    code = e.code() if callable(getattr(e, "code", None)) else None
    if code in CODE_NAMES:
        answer["code"] = CODE_NAMES[code]
    return answer


def message_of(e):
    """An error's message: Triton's errors say it with `message()`, others with `str`."""
    return e.message() if callable(getattr(e, "message", None)) else str(e)


def error_text(e):
    """The exception as the client sees it: its type and message, and where it was raised."""
    frames = traceback.extract_tb(e.__traceback__)
    where = ""
    if frames:
        last = frames[-1]
        where = f" (at {os.path.basename(last.filename)}:{last.lineno} in {last.name})"
    return f"{type(e).__name__}: {message_of(e)}{where}"


class MetricsLine:
    """The process's connection to the server's custom metrics: `tell` sends a change, `ask`
    sends a question and reads its answer, one message at a time."""

    def __init__(self, path):
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socket.connect(path)
        self.answers = self.socket.makefile("rb")
        self.lock = threading.Lock()

    def tell(self, message):
        line = json.dumps(message).encode() + b"\n"
        with self.lock:
            self.socket.sendall(line)

    def ask(self, message):
        line = json.dumps(message).encode() + b"\n"
        with self.lock:
            self.socket.sendall(line)
            answer = self.answers.readline()
        if not answer:
            raise pb_utils.TritonModelException("custom metrics: the server has gone")
        return json.loads(answer)


class Region:
    """A shared-memory file mapped into this process."""

    def __init__(self, path):
        self.file = open(path, "r+b")
        self.map = None
        self.size = 0

    def ensure(self, size, grow=False):
        if size <= self.size and self.map is not None:
            return
        if grow:
            size = max(size, 2 * self.size, 1 << 20)
            os.ftruncate(self.file.fileno(), size)
        # Arrays the model kept may still view the old map; it is freed when they go.
        self.map = mmap.mmap(self.file.fileno(), size)
        self.size = size


class ReadyLine:
    """Answers the server's readiness questions with the model's `is_ready()`, one at a time
    on a thread of its own: each question a line `{"id": N}`, each answer `{"id": N, "ready":
    bool}` or `{"id": N, "error": "..."}`. An `async def is_ready` runs on the event loop of
    the model's `async def execute`."""

    def __init__(self, runner, path):
        self.runner = runner
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(1)
        threading.Thread(target=self.serve, name="sheaf-ready", daemon=True).start()

    def serve(self):
        connection, _ = self.listener.accept()
        self.listener.close()
        with connection, connection.makefile("rb") as questions:
            for question in questions:
                answer = self.answer(json.loads(question)["id"])
                connection.sendall(json.dumps(answer).encode() + b"\n")

    def answer(self, question):
        try:
            ready = self.runner.model.is_ready()
            if inspect.isawaitable(ready):
                ready = asyncio.run_coroutine_threadsafe(
                    ready, self.runner.background()).result()
            if not isinstance(ready, (bool, np.bool_)):
                raise TypeError(
                    f"is_ready() must return a bool, not {type(ready).__name__}")
            return {"id": question, "ready": bool(ready)}
        except Exception as e:  # noqa: BLE001 - the server says why the model is not ready
            traceback.print_exc()
            return {"id": question, "error": error_text(e)}


class Runner:
    def __init__(self, model_file, input_shm, output_shm, calls_shm, control_shm,
                 metrics_socket, ready_socket):
        self.model_file = model_file
        self.ready_socket = ready_socket
        self.ready_line = None
        pb_utils._METRICS = MetricsLine(metrics_socket)
        self.inputs = Region(input_shm)
        self.outputs = Region(output_shm)
        self.calls = Region(calls_shm)
        self.control = Region(control_shm)
        self.control.ensure(os.fstat(self.control.file.fileno()).st_size)
        self.ring = Ring(self)
        self.calling = threading.Lock()
        self.stream = None
        self.loop = None
        self.background_loop = None
        pb_utils._CALL = self.call
        pb_utils._MANAGE = self.manage
        pb_utils._SENDER_FOR = self.sender_for
        self.executing = None
        self.sent = None
        self.model = None
        self.api = None
        self.config = None
        self.decoupled = False
        self.integer_outputs = {}

    # Loading ------------------------------------------------------------------------------
    def check_types(self, config):
        """Refuses a BF16 tensor where the interpreter cannot hold it."""
        if pb_utils.BFLOAT16 is not None:
            return
        for t in (config.get("input") or []) + (config.get("output") or []):
            if self.declared(t, 0)["datatype"] == "BF16":
                raise RuntimeError(
                    f"'{t.get('name')}' is BF16, which a model's arrays hold as ml_dtypes' "
                    f"bfloat16: install ml_dtypes into {sys.executable}")

    def init(self, message):
        config = message["model_config"]
        # Before the model's code runs, as far as the configuration says it already; again
        # once `auto_complete_config` has had its say.
        self.check_types(config)
        spec = importlib.util.spec_from_file_location("model", self.model_file)
        module = importlib.util.module_from_spec(spec)
        sys.modules["model"] = module
        spec.loader.exec_module(module)
        if hasattr(module, "TritonPythonModel"):
            cls = module.TritonPythonModel
            # Not called when the server's --disable-auto-complete-config is given.
            if message.get("auto_complete", True) and hasattr(cls, "auto_complete_config"):
                completed = cls.auto_complete_config(pb_utils.ModelConfig(
                    config, max_batch_size_open=message.get("max_batch_size_open", False)))
                if completed is not None and hasattr(completed, "as_dict"):
                    config = completed.as_dict()
            self.decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled"))
            self.model = cls()
            args = dict(message["args"])
            args["model_config"] = json.dumps(config)
            if hasattr(self.model, "initialize"):
                self.model.initialize(args)
            self.api = "triton"
        elif hasattr(module, "infer"):
            self.model = module
            if hasattr(module, "load"):
                module.load(message["load_config"])
            self.api = "batched"
        else:
            raise RuntimeError(
                "model.py defines neither class TritonPythonModel (Triton's API) nor "
                "def infer(inputs) (sheaf's batched API)")
        self.check_types(config)
        self.config = config
        pb_utils._ITERATIVE = bool(
            (config.get("sequence_batching") or {}).get("iterative_sequence"))
        self.integer_outputs = {}
        for t in config.get("output") or []:
            kind = NUMPY.get(self.declared(t, 0)["datatype"])
            if kind is not None and np.dtype(kind).kind in "iu":
                self.integer_outputs[t["name"]] = np.dtype(kind)
        batch = config.get("max_batch_size", 0) or 0
        if not config.get("input") or not config.get("output"):
            raise RuntimeError(
                "the model declares no inputs or no outputs: list them in config.pbtxt "
                "(input, output), config.yaml (inputs, outputs) or auto_complete_config"
                if message.get("auto_complete", True) else
                "the model declares no inputs or no outputs: list them in config.pbtxt "
                "(input, output) or config.yaml (inputs, outputs); auto_complete_config is "
                "not called, as the server runs with --disable-auto-complete-config")
        is_ready = callable(getattr(self.model, "is_ready", None))
        if is_ready and self.ready_line is None:
            self.ready_line = ReadyLine(self, self.ready_socket)
        return {
            "api": self.api,
            "decoupled": self.decoupled,
            "is_ready": is_ready,
            "max_batch_size": batch,
            "inputs": [self.declared(t, batch) for t in config["input"]],
            "outputs": [self.declared(t, batch) for t in config["output"]],
        }

    @staticmethod
    def parameters_of(response):
        """`{"parameters": {...}}` when the response has any, else nothing."""
        parameters = getattr(response, "_parameters", None)
        return {"parameters": parameters} if parameters else {}

    def conform(self, name, value):
        """`(name, array)` of an output, an integer array made the integer type the output
        declares when every value fits it: NumPy's integers are int64 unless told otherwise,
        and Triton's own examples answer an INT32 output with them. Any other difference is
        left for the server to refuse."""
        declared = self.integer_outputs.get(name)
        a = np.asarray(value)
        if declared is None or a.dtype == declared or a.dtype.kind not in "iu":
            return name, value
        limits = np.iinfo(declared)
        if a.size and (a.min() < limits.min or a.max() > limits.max):
            return name, value
        return name, a.astype(declared)

    @staticmethod
    def declared(t, batch):
        # A reshaped tensor reaches the model in its reshape; clients send it with its dims.
        reshape = t.get("reshape")
        dims = [int(d) for d in (reshape.get("shape", []) if isinstance(reshape, dict)
                                 else t.get("dims", []))]
        data_type = str(t.get("data_type", "TYPE_FP32"))
        data_type = data_type[5:] if data_type.startswith("TYPE_") else data_type
        data_type = "BYTES" if data_type == "STRING" else data_type
        return {"name": t["name"], "datatype": data_type,
                "shape": ([-1] if batch > 0 else []) + dims}

    # Tensors ------------------------------------------------------------------------------
    def array(self, t, region=None, copy=False):
        """The tensor `t` places in `region` (the input region by default), as a view, or with
        `copy` as an array of its own."""
        region = region or self.inputs
        count = math.prod(t["shape"])
        dtype = NUMPY.get(t["datatype"])
        if dtype is not None:
            view = np.frombuffer(region.map, dtype=dtype, count=count,
                                 offset=t["offset"]).reshape(t["shape"])
            return view.copy() if copy else view
        if t["datatype"] == "BYTES":
            # Each element's length (4 bytes, little endian), then its bytes.
            return pb_utils._read_bytes(region.map, t["offset"], count).reshape(t["shape"])
        raise RuntimeError(f"input '{t['name']}': {t['datatype']} is not supported")

    def write(self, named, start=0, region=None):
        """Writes `(name, array)` pairs into `region` (the output region by default) from
        `start`; returns where each lies, and where the writing ended."""
        region = region or self.outputs
        placed, arrays, size = self.prepare(named)
        region.ensure(start + size, grow=True)
        self.put(placed, arrays, start, region)
        return placed, start + size

    @staticmethod
    def prepare(named):
        """`(name, array)` pairs as bytes to write: where each will lie counted from 0, the
        byte arrays, and the bytes they take (each starting at a multiple of ALIGN)."""
        placed = []
        arrays = []
        at = 0
        for name, value in named:
            a = np.asarray(value)
            if a.dtype == np.object_ or a.dtype.kind in ("S", "U"):
                shape = list(a.shape)
                a = pb_utils.serialize_byte_tensor(a)
                a = np.zeros(0, np.uint8) if a is None else a
                placed.append({"name": name, "datatype": "BYTES", "shape": shape,
                               "offset": at, "nbytes": a.nbytes})
            else:
                a = np.ascontiguousarray(a)
                placed.append({"name": name, "datatype": protocol_name(a.dtype),
                               "shape": list(a.shape), "offset": at, "nbytes": a.nbytes})
            arrays.append(a)
            at += (a.nbytes + ALIGN - 1) // ALIGN * ALIGN
        return placed, arrays, at

    @staticmethod
    def put(placed, arrays, start, region):
        """Writes prepared arrays into `region` from `start`, and moves their offsets there."""
        data = region.map
        for p, a in zip(placed, arrays):
            p["offset"] += start
            if a.nbytes:
                # A C-contiguous array's bytes, copied by the map itself.
                data[p["offset"]:p["offset"] + a.nbytes] = a

    def call(self, model, version, inputs, outputs, decoupled=False, parameters="{}",
             request_id="", trace=None):
        """Sends a request of the model's own to `model` of the server, and returns the
        InferenceResponse: its outputs (copied out of the calls region, which the next call
        reuses), or the server's error. With `decoupled`, a CallStream over its responses,
        read from the server as the model iterates."""
        with self.calling:
            self.finish_stream()
            named = [(t.name(), t.as_numpy()) for t in inputs]
            placed, _ = self.write(named, 0, self.calls)
            call = {"model": model, "version": version, "inputs": placed,
                    "outputs": list(outputs), "parameters": parameters, "id": request_id,
                    "decoupled": decoupled}
            if trace is not None:
                call["trace"] = trace
            send({"call": call})
            if decoupled:
                self.stream = CallStream(self)
                return self.stream
            answer = receive()
            if "error" in answer:
                return pb_utils.InferenceResponse(error=pb_utils.TritonError(answer["error"]))
            return self.response(answer["ok"])

    def manage(self, op, model, version="", config="", files=None):
        """Loads, unloads or asks after a model of the server (Triton's model loading API);
        returns the server's answer, or raises its error. `files`: a load's files, each path's
        bytes in base64."""
        with self.calling:
            self.finish_stream()
            send({"manage": {"op": op, "model": model, "version": version, "config": config,
                             "files": files or {}}})
            answer = receive()
        if "error" in answer:
            raise pb_utils.TritonModelException(answer["error"])
        return answer["ok"]

    def finish_stream(self):
        """Reads what is left of the stream the model last asked for (the server sends the
        next request's answer only after it), kept for the model should it read on. The
        caller holds `calling`."""
        if self.stream is not None:
            self.stream.read_to_end()
            self.stream = None

    def response(self, answer):
        """One InferenceResponse of a call's answer: its outputs, copied out of the calls
        region, and the parameters the answering model set; or its error."""
        if "error" in answer:
            code = CODES.get(answer.get("code"), pb_utils.TritonError.INTERNAL)
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(answer["error"], code))
        placed = answer["outputs"]
        end = max((p["offset"] + p["nbytes"] for p in placed), default=0)
        if end > self.calls.size:
            self.calls.ensure(os.fstat(self.calls.file.fileno()).st_size)
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor(p["name"], np.array(self.array(p, self.calls), copy=True))
            for p in placed], parameters=answer.get("parameters"))

    # Running ------------------------------------------------------------------------------
    def cancelled(self, slot):
        """Whether the streaming request with flag `slot` has lost its client."""
        if slot is None or FLAGS_AT + slot >= self.control.size:
            return False
        return self.control.map[FLAGS_AT + slot] != 0

    def finish(self, returned):
        """What the model's `execute` (or `infer`) returned; for an `async def`, what its
        coroutine returns, run to its end on the process's event loop (Triton's asynchronous
        BLS: `await asyncio.gather(*(r.async_exec() for r in ...))`)."""
        if not inspect.iscoroutine(returned):
            return returned
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
        return self.loop.run_until_complete(returned)

    def execute(self, message):
        self.inputs.ensure(message["size"])
        requests = []
        # A decoupled model's requests may outlive `execute`, and the next batch overwrites the
        # input region: they get copies.
        array, copy, tensor = self.array, self.decoupled, pb_utils.Tensor
        model_name = self.config.get("name", "")
        every_output = [o["name"] for o in self.config["output"]]
        for r in message["requests"]:
            tensors = [tensor(t["name"], array(t, copy=copy)) for t in r["inputs"]]
            # Triton names the outputs the client asked for, or every output.
            asked = r.get("outputs") or every_output
            trace = r.get("trace")
            requests.append(pb_utils.InferenceRequest(
                tensors, request_id=r.get("id", ""), model_name=model_name,
                correlation_id=r.get("correlation_id", 0), requested_output_names=asked,
                parameters=r.get("parameters", "{}"), flags=r.get("flags", 0),
                trace=None if trace is None else pb_utils.InferenceTrace(trace)))
        if self.decoupled:
            return self.execute_decoupled(requests, message)
        # Triton's default mode may answer through the response sender too: one response per
        # request, and the final flag with it or after it; `execute` then returns None. The
        # senders are made only for a model that asks for one (`sender_for`).
        self.executing, self.sent = requests, None
        try:
            responses = self.finish(self.model.execute(requests))
        finally:
            sent, self.executing, self.sent = self.sent, None, None
        if responses is None and sent is not None and sent.used:
            # A request asked to run again sends nothing in this run.
            with sent.done:
                sent.open -= {i for i, r in enumerate(requests)
                              if getattr(r, "_rescheduled", False)}
            sent.wait()
            responses = sent.responses
        elif sent is not None and sent.used:
            raise RuntimeError("execute both returned responses and sent some through "
                               "get_response_sender(): a model in default mode does one or "
                               "the other")
        if responses is None or len(responses) != len(requests):
            got = "None" if responses is None else len(responses)
            raise RuntimeError(f"execute returned {got} responses for {len(requests)} requests")
        named, answers, conform = [], [], self.conform
        for request, response in zip(requests, responses):
            if getattr(request, "_rescheduled", False):
                # It runs again in a later batch (Triton's request rescheduling).
                answers.append({"rescheduled": True} if response is None else {
                    "error": "the request was rescheduled (TRITONSERVER_REQUEST_RELEASE_"
                             "RESCHEDULE), so its response in this execute must be None"})
                continue
            if response is None:
                answers.append({"error": "execute returned None for this request"})
                continue
            if response.has_error():
                answers.append(error_answer(response.error()))
                continue
            outputs = response.output_tensors()
            answers.append({"count": len(outputs), **self.parameters_of(response)})
            for t in outputs:
                named.append(conform(t.name(), t.as_numpy()))
        placed, size = self.write(named)
        at = 0
        for a in answers:
            if "count" in a:
                a["outputs"] = placed[at:at + a.pop("count")]
                at += len(a["outputs"])
        return {"size": size, "responses": answers}

    def sender_for(self, request):
        """The response sender of a request of the `execute` call under way (Triton's default
        mode), made when the model first asks; none outside such a call."""
        if self.executing is None:
            return None
        if self.sent is None:
            self.sent = Sent(self, len(self.executing))
        for i, r in enumerate(self.executing):
            if r is request:
                request._sender = ResponseSender(self.sent, i)
                return request._sender
        return None

    def execute_decoupled(self, requests, message):
        """Triton's decoupled mode: each request's responses go to the server as the model
        sends them, from `execute` or from threads of the model's own, and the call is
        answered as soon as `execute` returns: the server sends the next batch while these
        requests still stream, until each one's final flag. An `async def execute` is not
        awaited here: its coroutine runs on an event loop of its own thread, shared by the
        calls of this process, so that the next batch starts while it awaits (as in Triton's
        Python backend)."""
        slots = [r.get("slot") for r in message["requests"]]
        stream = Stream(self, message.get("call", 0), slots)
        for i, request in enumerate(requests):
            request._sender = ResponseSender(stream, i)
            request._cancelled = request._sender.is_cancelled
        try:
            returned = self.model.execute(requests)
            if inspect.iscoroutine(returned):
                running = asyncio.run_coroutine_threadsafe(returned, self.background())
                running.add_done_callback(
                    lambda done: self.async_done(stream, requests, done))
                returned = None
            elif returned is None:
                stream.reschedule(requests)
            if returned is not None:
                raise RuntimeError("a decoupled model's execute returns None; it sends its "
                                   "responses through request.get_response_sender()")
        except BaseException:
            # The server fails the call's requests: what the model still sends for them goes
            # nowhere.
            stream.close()
            raise
        return {"size": 0, "responses": []}

    def background(self):
        """The event loop that runs a decoupled model's `async def execute` calls, on a thread
        of its own."""
        if self.background_loop is None:
            self.background_loop = asyncio.new_event_loop()
            threading.Thread(target=self.background_loop.run_forever, name="sheaf-async",
                             daemon=True).start()
        return self.background_loop

    @staticmethod
    def async_done(stream, requests, done):
        """An `async def execute` of a decoupled model has ended: its requests it asked to run
        again go back to the server; if it raised (or returned something), each of its
        requests still open gets the error as its final response."""
        if not done.cancelled() and done.exception() is None:
            stream.reschedule(requests)
        if done.cancelled():
            failure = "the model's execute was cancelled"
        elif done.exception() is not None:
            e = done.exception()
            traceback.print_exception(type(e), e, e.__traceback__)
            failure = error_text(e)
        elif done.result() is not None:
            failure = ("a decoupled model's execute returns None; it sends its responses "
                       "through request.get_response_sender()")
        else:
            return
        with stream.done:
            still_open = list(stream.open)
        for index in still_open:
            try:
                stream.send(index, pb_utils.InferenceResponse(error=pb_utils.TritonError(failure)),
                            pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except pb_utils.TritonModelException:
                pass  # its final response came meanwhile

    def infer(self, message):
        self.inputs.ensure(message["size"])
        (request,) = message["requests"]
        inputs = {t["name"]: self.array(t) for t in request["inputs"]}
        outputs = self.finish(self.model.infer(inputs))
        if not isinstance(outputs, dict):
            raise RuntimeError(f"infer returned {type(outputs).__name__}, not a dict of arrays")
        placed, size = self.write([self.conform(k, v) for k, v in outputs.items()])
        return {"size": size, "responses": [{"outputs": placed}]}

    def finalize(self):
        if self.api == "triton" and hasattr(self.model, "finalize"):
            self.model.finalize()
        elif self.api == "batched" and hasattr(self.model, "unload"):
            self.model.unload()


class Senders:
    """The responses the requests of one `execute` call send through their response senders,
    until each has sent the final flag: `send` checks and counts, `take` does what the mode
    does with a response."""

    def __init__(self, runner, count):
        self.runner = runner
        self.open = set(range(count))
        self.closed = False
        self.rescheduled = set()
        self.done = threading.Condition()

    def close(self):
        """No request of the call may send any more (it has failed)."""
        with self.done:
            self.open.clear()
            self.closed = True
            self.done.notify_all()

    def send(self, index, response, flags):
        with self.done:
            if index not in self.open:
                raise pb_utils.TritonModelException(
                    "this request has failed" if self.closed else
                    "this request was rescheduled: it sends again in the execute that runs it "
                    "next" if index in self.rescheduled else
                    "this request's final response was already sent")
            final = bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            self.take(index, response, final)
            if final:
                self.open.discard(index)
                self.done.notify_all()

    def wait(self):
        with self.done:
            while self.open:
                self.done.wait()


class Stream(Senders):
    """The responses of one decoupled `execute` call (numbered `call`), each sent to the
    server as it comes, through the ring in the output region."""

    def __init__(self, runner, call, slots):
        super().__init__(runner, len(slots))
        self.call = call
        self.slots = slots

    def reschedule(self, requests):
        """The requests the model asked to run again, once `execute` has returned: each still
        open (no final flag sent) is closed here without one, and the server queues it again;
        its response sender takes no more in this run."""
        for index, request in enumerate(requests):
            if not getattr(request, "_rescheduled", False):
                continue
            with self.done:
                if index not in self.open:
                    continue
                self.open.discard(index)
                self.rescheduled.add(index)
                self.done.notify_all()
            self.runner.ring.send_alone(
                {"rescheduled": {"call": self.call, "request": index}})

    def take(self, index, response, final):
        which = {"call": self.call, "request": index}
        if response is None:
            if final:
                self.runner.ring.send_alone({"final": which})
            return
        if response.has_error():
            self.runner.ring.send_alone(
                {"partial": error_answer(response.error(), span=0, final=final, **which)})
            return
        named = [self.runner.conform(t.name(), t.as_numpy()) for t in response.output_tensors()]
        self.runner.ring.send(named, {"final": final, **which,
                                      **self.runner.parameters_of(response)})


FLAGS_AT = 64


class Ring:
    """The output region as a ring for the responses of a decoupled model, which its threads
    send at any time: each response is written after the last, wrapping to the start, and only
    over bytes the server has read. The server adds each response's `span` (its bytes, with
    the bytes skipped to wrap) to the counter in the first 8 bytes of the control region once it
    has copied the response out. Placing a response and sending its message happen under one
    lock, so the server reads them in the order they were placed."""

    def __init__(self, runner):
        self.runner = runner
        self.lock = threading.Lock()
        self.head = 0  # where the next response goes
        self.sent = 0  # bytes handed to the server, spans summed

    def read(self):
        """Bytes the server has read, spans summed."""
        m = self.runner.control.map
        while True:
            a = int.from_bytes(m[0:8], "little")
            if a == int.from_bytes(m[0:8], "little"):
                return a

    def place(self, n):
        """Where `n` bytes go, and the span to report; waits while the server has not read
        enough of what came before."""
        region = self.runner.outputs
        if n == 0:
            return self.head, 0
        while True:
            unread = self.sent - self.read()
            if unread == 0:
                # Everything was read: start again at 0, with room for at least two of these.
                if 2 * n > region.size:
                    region.ensure(2 * n, grow=True)
                self.head = n
                return 0, n
            size = region.size
            if unread + n <= size:
                tail = (self.head - unread) % size
                if tail < self.head:
                    # What is unread lies in [tail, head): room after it, or at the start.
                    if size - self.head >= n:
                        at, self.head = self.head, self.head + n
                        return at, n
                    if tail >= n:
                        skipped = size - self.head
                        self.head = n
                        return 0, skipped + n
                elif tail - self.head >= n:
                    # What is unread wraps past the end: room between its end and its start.
                    at, self.head = self.head, self.head + n
                    return at, n
            time.sleep(0.0002)

    def send(self, named, fields):
        placed, arrays, size = Runner.prepare(named)
        with self.lock:
            at, span = self.place(size)
            Runner.put(placed, arrays, at, self.runner.outputs)
            self.sent += span
            send({"partial": {"outputs": placed, "span": span, **fields}})

    def send_alone(self, message):
        """A message about the responses that carries no tensors, in their order."""
        with self.lock:
            send(message)


class Sent(Senders):
    """The responses a model in default mode sends through `get_response_sender()`: exactly
    one per request, with the final flag or before a flag-only final, kept for the answer."""

    def __init__(self, runner, count):
        super().__init__(runner, count)
        self.responses = [None] * count
        self.used = False

    def take(self, index, response, final):
        self.used = True
        if response is not None:
            if self.responses[index] is not None:
                raise pb_utils.TritonModelException(
                    "a model in default mode sends one response per request (set "
                    "model_transaction_policy { decoupled: true } to send more)")
            self.responses[index] = response
        if final and self.responses[index] is None:
            self.responses[index] = pb_utils.InferenceResponse(
                error=pb_utils.TritonError("the model sent the final flag and no response"))


class CallStream:
    """What `exec(decoupled=True)` returns: the responses of the called model, each read from
    the server when the model asks for the next one (copied out of the calls region, then
    `{"next": {}}` lets the server write the one after), then an empty final response. An
    error from the server is a response too, and ends the stream."""

    def __init__(self, runner):
        self.runner = runner
        self.read = collections.deque()
        self.ended = False
        self.cancelled = False

    def __iter__(self):
        return self

    def cancel(self):
        """Stops the stream (Triton's `cancel()`): the server drops the request, so that the
        called model sees its client gone (`is_cancelled()`) or skips it while it waits. The
        responses that came before are still yielded, then an error response with the code
        CANCELLED, then the end."""
        with self.runner.calling:
            if not self.ended and not self.cancelled:
                self.cancelled = True
                send({"cancel": {}})

    def __next__(self):
        with self.runner.calling:
            if not self.read and not self.ended:
                self.read_one()
        if self.read:
            return self.read.popleft()
        raise StopIteration

    def read_one(self):
        answer = receive()
        if "part" in answer:
            self.read.append(self.runner.response(answer["part"]))
            send({"next": {}})
            return
        if "error" in answer:
            self.read.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(answer["error"])))
        self.read.append(pb_utils.InferenceResponse())
        self.ended = True
        if self.runner.stream is self:
            self.runner.stream = None

    def read_to_end(self):
        while not self.ended:
            self.read_one()


class ResponseSender:
    """What `request.get_response_sender()` gives a decoupled model."""

    def __init__(self, stream, index):
        self._stream = stream
        self._index = index

    def send(self, response=None, flags=0):
        self._stream.send(self._index, response, flags)

    def is_cancelled(self):
        """Whether the request's client has gone (the server raises its flag in the control
        region), so that the model may stop sending."""
        slots = getattr(self._stream, "slots", None)
        if slots is None:
            return False
        return self._stream.runner.cancelled(slots[self._index])


def main():
    runner = Runner(*sys.argv[1:8])
    while True:
        message = INBOX.take(True)
        op = message.get("op")
        try:
            if op == "init":
                answer = runner.init(message)
            elif op == "execute":
                answer = runner.execute(message)
            elif op == "infer":
                answer = runner.infer(message)
            elif op == "finalize":
                runner.finalize()
                send({"ok": True})
                return
            else:
                raise RuntimeError(f"unknown operation {op!r}")
            with runner.calling:
                runner.finish_stream()
            send({"ok": answer})
        except Exception as e:  # noqa: BLE001 - every failure goes back to the server
            traceback.print_exc()
            try:
                with runner.calling:
                    runner.finish_stream()
            except Exception:  # noqa: BLE001 - the server has the stream's error already
                traceback.print_exc()
            send({"error": error_text(e)})


if __name__ == "__main__":
    main()
