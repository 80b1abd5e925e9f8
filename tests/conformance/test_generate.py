"""Triton's generate extension on the real `sheaf` binary: plain JSON requests for text models
(`/generate`, `/generate_stream`) answered by a batching Python model, a streaming (decoupled)
Python model written as Triton's own test LLM is, and the demo ONNX MLP, over real sockets."""
import json
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import onnxruntime
import tritonclient.http as httpclient

from conftest import link_models, start

# Upper-cases its text; a `suffix` parameter is added to it; counts its characters.
SHOUT = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            text = pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy()[0, 0].decode()
            suffix = json.loads(r.parameters() or "{}").get("suffix", "")
            out = (text.upper() + suffix).encode()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("text_output", np.array([[out]], dtype=object)),
                pb_utils.Tensor("length", np.array([[len(out)]], dtype=np.int32)),
            ]))
        return responses
'''
SHOUT_CONFIG = '''
backend: "python"
max_batch_size: 16
dynamic_batching { max_queue_delay_microseconds: 20000 }
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "length" data_type: TYPE_INT32 dims: [ 1 ] }
]
'''
# Sends its PROMPT's words one response each when STREAM is true (REPETITION times over, with
# DELAY seconds before each), else the whole text once; FAIL_LAST makes the last response an
# error.
WORDS = '''
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            params = json.loads(r.parameters() or "{}")
            sender = r.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(r, "PROMPT").as_numpy().reshape(-1)[0].decode()
            stream = bool(pb_utils.get_input_tensor_by_name(r, "STREAM").as_numpy().reshape(-1)[0])
            pieces = text.split() * params.get("REPETITION", 1) if stream else [text]
            for piece in pieces:
                time.sleep(params.get("DELAY", 0))
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("TEXT", np.array([[piece.encode()]], dtype=object))]))
            if params.get("FAIL_LAST"):
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("the last one fails")),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''
WORDS_CONFIG = '''
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: True }
input [
  { name: "PROMPT" data_type: TYPE_STRING dims: [ 1, 1 ] },
  { name: "STREAM" data_type: TYPE_BOOL dims: [ 1, 1 ] }
]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1, -1 ] } ]
'''


def server_on(tmp_path):
    repo = tmp_path / "repo"
    for name, model, config in [("shout", SHOUT, SHOUT_CONFIG), ("words", WORDS, WORDS_CONFIG)]:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(model)
        (repo / name / "config.pbtxt").write_text(config)
    link_models(repo, ["mlp"])
    return start(repo)


def post(server, model, route, body):
    """POSTs `body` (JSON, or text as it is): the status, the content type and the body."""
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{server.http}/v2/models/{model}/{route}",
                                     data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request) as r:
            return r.status, r.headers["content-type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["content-type"], e.read().decode()


def events(text):
    """The data of each server-sent event, as JSON."""
    return [json.loads(line[len("data:"):]) for line in text.splitlines()
            if line.startswith("data:")]


def test_generate_answers_a_batching_python_model_in_fewer_executions(tmp_path):
    for server in server_on(tmp_path):
        status, kind, body = post(server, "shout", "generate",
                                  {"text_input": "hello world", "parameters": {"suffix": "!"}})
        assert status == 200 and kind.startswith("application/json"), body
        assert json.loads(body) == {"model_name": "shout", "model_version": "1",
                                    "text_output": "HELLO WORLD!", "length": 12}
        # A field that names no input is a parameter too.
        assert json.loads(post(server, "shout", "generate",
                               {"text_input": "hi", "suffix": "?"})[2])["text_output"] == "HI?"
        # Many at once: each its own answer, in fewer executions than requests.
        answers = {}

        def ask(i):
            answers[i] = json.loads(post(server, "shout", "generate",
                                         {"text_input": f"request {i}"})[2])
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(answers[i]["text_output"] == f"REQUEST {i}" for i in range(32)), answers
        stats = httpclient.InferenceServerClient(server.http).get_inference_statistics("shout")
        counts = stats["model_stats"][0]
        assert counts["inference_count"] == 34, counts
        assert counts["execution_count"] < 34, counts
        # The same model streams one event on generate_stream.
        status, kind, body = post(server, "shout", "generate_stream", {"text_input": "once"})
        assert status == 200 and kind.startswith("text/event-stream"), body
        assert [e["text_output"] for e in events(body)] == ["ONCE"]


def test_generate_stream_sends_each_response_of_a_decoupled_model_as_it_comes(tmp_path):
    for server in server_on(tmp_path):
        status, kind, body = post(server, "words", "generate_stream",
                                  {"PROMPT": ["one two three"], "STREAM": True,
                                   "parameters": {"REPETITION": 2}})
        assert status == 200 and kind.startswith("text/event-stream"), body
        sent = events(body)
        assert [e["TEXT"] for e in sent] == ["one", "two", "three"] * 2, sent
        assert all(e["model_name"] == "words" for e in sent)
        # Each as it comes: read as a stream, the events arrive DELAY apart.
        data = json.dumps({"PROMPT": "a b c", "STREAM": True, "DELAY": 0.3}).encode()
        request = urllib.request.Request(f"http://{server.http}/v2/models/words/generate_stream",
                                         data=data, headers={"content-type": "application/json"})
        arrivals = []
        with urllib.request.urlopen(request) as r:
            for line in r:
                if line.startswith(b"data:"):
                    arrivals.append(time.monotonic())
        gaps = np.diff(arrivals)
        assert len(arrivals) == 3 and all(g > 0.15 for g in gaps), gaps
        # An error after the first response is an event of its own; the status was sent.
        status, _, body = post(server, "words", "generate_stream",
                               {"PROMPT": "last", "STREAM": True, "FAIL_LAST": True})
        assert status == 200
        sent = events(body)
        assert sent[0]["TEXT"] == "last" and "the last one fails" in sent[1]["error"], sent
        # An error before any response is a plain HTTP error.
        status, kind, body = post(server, "words", "generate_stream",
                                  {"PROMPT": "", "STREAM": True, "FAIL_LAST": True})
        assert status >= 400 and kind.startswith("application/json"), body
        assert "the last one fails" in json.loads(body)["error"]


def test_generate_takes_exactly_one_response_from_a_decoupled_model(tmp_path):
    for server in server_on(tmp_path):
        status, _, body = post(server, "words", "generate", {"PROMPT": "whole text", "STREAM": False})
        assert status == 200, body
        assert json.loads(body)["TEXT"] == "whole text"
        for words in ["two words", ""]:
            status, _, body = post(server, "words", "generate", {"PROMPT": words, "STREAM": True})
            assert status == 400, body
            assert "exactly 1 response" in json.loads(body)["error"], body


def test_an_onnx_model_answers_generate_as_onnxruntime_does(tmp_path):
    for server in server_on(tmp_path):
        x = np.linspace(-1, 1, 512, dtype=np.float32)
        status, _, body = post(server, "mlp", "generate", {"input": x.tolist()})
        assert status == 200, body
        got = np.array(json.loads(body)["output"], dtype=np.float32)
        session = onnxruntime.InferenceSession(server.model_file("mlp"))
        name = session.get_inputs()[0].name
        want = session.run(None, {name: x.reshape(1, 512)})[0].reshape(-1)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_bad_generate_requests_are_refused_naming_what_is_wrong(tmp_path):
    for server in server_on(tmp_path):
        for model, body, status, words in [
            ("words", {"PROMPT": "no stream flag"}, 400, "STREAM"),
            ("words", {}, 400, "PROMPT"),
            ("words", {"PROMPT": 123, "STREAM": False}, 400, "PROMPT"),
            ("words", {"PROMPT": "x", "STREAM": "false"}, 400, "STREAM"),
            ("words", {"PROMPT": {"USER": "x"}, "STREAM": True}, 400, "PROMPT"),
            ("words", {"PROMPT": "x", "STREAM": True, "PARAMS": {"a": 1}}, 400,
             "parameter 'PARAMS' has invalid type"),
            ("words", {"PROMPT": "x", "STREAM": True, "parameters": [1]}, 400, "parameters"),
            ("words", "not json", 400, "not a JSON object"),
            # A name given twice is refused, not one of its values dropped.
            ("words", '{"PROMPT": "a", "STREAM": true, "PROMPT": "b"}', 400,
             "'PROMPT' is given twice"),
            ("words", '{"PROMPT": "a", "STREAM": true, "parameters": {"k": 1, "k": 2}}', 400,
             "'k' is given twice"),
            ("mlp", {"input": [0.5] * 511}, 400, "input"),
            ("nonesuch", {"text_input": "x"}, 404, "nonesuch"),
        ]:
            for route in ("generate", "generate_stream"):
                got, kind, text = post(server, model, route, body)
                assert got == status, (route, body, text)
                assert kind.startswith("application/json"), (route, body, kind)
                assert words in json.loads(text)["error"], (route, body, text)


# A language model through the same routes, answered as Triton's vLLM backend answers them.
PROMPT = "The capital of France is"


def completion(server, **fields):
    """The greedy /v1/completions answer to PROMPT: its text, finish reason, usage and the
    log-probabilities of its tokens."""
    from conftest import post_json
    body = post_json(server, "/v1/completions", {
        "model": "smollm2", "prompt": PROMPT, "temperature": 0, "logprobs": 0, **fields})
    choice = body["choices"][0]
    return choice["text"], choice["finish_reason"], body["usage"], choice["logprobs"]["token_logprobs"]


def test_a_language_model_answers_generate_as_triton_s_vllm_backend_does(server):
    text, reason, usage, logprobs = completion(server, max_tokens=12)
    # The prompt leads the text unless excluded, and the parameters may come in `parameters`.
    status, _, got = post(server, "smollm2", "generate", {
        "text_input": PROMPT, "parameters": {"stream": False, "temperature": 0, "max_tokens": 12}})
    assert status == 200, got
    assert json.loads(got) == {"model_name": "smollm2", "model_version": "1",
                               "text_output": PROMPT + text}
    # What it adds when asked, from any of the three places parameters come in.
    status, _, got = post(server, "smollm2", "generate", {
        "text_input": PROMPT, "exclude_input_in_output": True, "return_finish_reason": True,
        "return_num_input_tokens": True, "return_num_output_tokens": True,
        "return_cumulative_logprob": True, "max_tokens": 12,
        "sampling_parameters": json.dumps({"temperature": 0})})
    assert status == 200, got
    got = json.loads(got)
    assert got["text_output"] == text and got["finish_reason"] == reason
    assert got["num_input_tokens"] == usage["prompt_tokens"]
    assert got["num_output_tokens"] == usage["completion_tokens"]
    assert abs(got["cumulative_logprob"] - sum(logprobs)) < 1e-3, (got, logprobs)
    # generate_stream without `stream`: the same answer, as one event.
    status, kind, body = post(server, "smollm2", "generate_stream", {
        "text_input": PROMPT, "temperature": 0, "max_tokens": 12})
    assert status == 200 and kind.startswith("text/event-stream"), body
    assert events(body) == [{"model_name": "smollm2", "model_version": "1",
                             "text_output": PROMPT + text}]


def test_a_language_model_streams_its_text_on_generate_stream(server):
    text, reason, usage, logprobs = completion(server, max_tokens=12)
    status, kind, body = post(server, "smollm2", "generate_stream", {
        "text_input": PROMPT, "stream": True, "return_finish_reason": True,
        "return_num_input_tokens": True, "return_num_output_tokens": True,
        "return_cumulative_logprob": True, "parameters": {"temperature": 0, "max_tokens": 12}})
    assert status == 200 and kind.startswith("text/event-stream"), body
    got = events(body)
    assert len(got) > 2, got
    # The pieces, without the prompt, make the completion's text; a last event ends it.
    assert "".join(e["text_output"] for e in got) == text
    assert got[-1]["text_output"] == "" and got[-1]["finish_reason"] == reason
    assert all(e["finish_reason"] is None for e in got[:-1])
    assert {e["num_input_tokens"] for e in got} == {usage["prompt_tokens"]}
    assert sum(e["num_output_tokens"] for e in got) == usage["completion_tokens"]
    assert abs(got[-1]["cumulative_logprob"] - sum(logprobs)) < 1e-3
    # Each piece's log-probability is added as it comes.
    sums = [e["cumulative_logprob"] for e in got]
    assert sums == sorted(sums, reverse=True), sums


def test_a_language_model_returns_each_token_s_log_probabilities_as_the_backend_does(server):
    """`return_logprobs`: per generated token, an object keyed by token id holding the chosen
    token and the `logprobs` most likely ones, the values /v1/completions gives for them."""
    import tritonclient.grpc as grpcclient
    from conftest import post_json
    body = post_json(server, "/v1/completions", {
        "model": "smollm2", "prompt": PROMPT, "temperature": 0, "max_tokens": 8, "logprobs": 2})
    expected = body["choices"][0]["logprobs"]
    greedy = {"temperature": 0, "max_tokens": 8, "logprobs": 2}
    status, _, got = post(server, "smollm2", "generate", {
        "text_input": PROMPT, "return_logprobs": True, "return_cumulative_logprob": True,
        "parameters": greedy})
    assert status == 200, got
    got = json.loads(got)
    positions = json.loads(got["logprobs"])
    assert len(positions) == len(expected["token_logprobs"]) > 2, (positions, expected)
    for position, chosen, chosen_logprob, top in zip(
            positions, expected["tokens"], expected["token_logprobs"], expected["top_logprobs"]):
        entries = {e["decoded_token"]: e for e in position.values()}
        assert len(position) == 2, position  # greedy: the chosen token is the most likely
        assert entries[chosen]["rank"] == 1
        assert abs(entries[chosen]["logprob"] - chosen_logprob) < 1e-4
        assert sorted(e["rank"] for e in position.values()) == [1, 2]
        for token, logprob in top.items():
            assert abs(entries[token]["logprob"] - logprob) < 1e-4, (position, top)
    assert all(k.isdigit() for p in positions for k in p)
    chosen_sum = sum(min(p.values(), key=lambda e: e["rank"])["logprob"] for p in positions)
    assert abs(got["cumulative_logprob"] - chosen_sum) < 1e-3
    # Without the sampling parameter, as the backend: "null".
    status, _, plain = post(server, "smollm2", "generate", {
        "text_input": PROMPT, "return_logprobs": True, "max_tokens": 4})
    assert status == 200 and json.loads(plain)["logprobs"] == "null", plain
    # Streamed, each event holds its own tokens' entries; together they are the whole answer's.
    status, _, streamed = post(server, "smollm2", "generate_stream", {
        "text_input": PROMPT, "stream": True, "return_logprobs": True, "parameters": greedy})
    assert status == 200, streamed
    pieces = [json.loads(e["logprobs"]) for e in events(streamed)]
    assert len(pieces) > 2 and sum(pieces, []) == positions
    # The same over gRPC, as a BYTES output.
    client = grpcclient.InferenceServerClient(server.grpc)
    answer = client.infer("smollm2", text_inputs(PROMPT, False, greedy, return_logprobs=True))
    assert json.loads(answer.as_numpy("logprobs")[0]) == positions
    client.close()


def test_several_outputs_come_as_the_backend_sends_them(server):
    """`n`: an element per output in each answer, as /v1/completions' choices with the same
    seeds; streamed, each answer moves one output, and an ended output keeps its reason."""
    import queue
    import tritonclient.grpc as grpcclient
    from conftest import post_json
    sampled = {"temperature": 0.9, "seed": 11, "max_tokens": 10}
    expected = post_json(server, "/v1/completions", {
        "model": "smollm2", "prompt": PROMPT, "n": 2, **sampled})
    texts = [c["text"] for c in expected["choices"]]
    reasons = [c["finish_reason"] for c in expected["choices"]]
    status, _, got = post(server, "smollm2", "generate", {
        "text_input": PROMPT, "n": 2, "return_finish_reason": True,
        "return_num_output_tokens": True, "return_num_input_tokens": True,
        "return_cumulative_logprob": True, "parameters": sampled})
    assert status == 200, got
    got = json.loads(got)
    assert got["text_output"] == [PROMPT + t for t in texts], (got, texts)
    assert got["finish_reason"] == reasons
    assert got["num_input_tokens"] == expected["usage"]["prompt_tokens"]
    assert sum(got["num_output_tokens"]) == expected["usage"]["completion_tokens"]
    assert len(got["cumulative_logprob"]) == 2
    # Streamed over gRPC: tensors of two elements, one output's piece in each answer.
    client = grpcclient.InferenceServerClient(server.grpc)
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer("smollm2", text_inputs(PROMPT, True, {**sampled, "n": 2},
                                                     return_finish_reason=True,
                                                     return_num_output_tokens=True),
                              enable_empty_final_response=True)
    pieces, counts, ends = [[], []], [0, 0], []
    while True:
        result, error = answers.get(timeout=60)
        assert error is None, error
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
        text = [t.decode() for t in result.as_numpy("text_output")]
        assert result.as_numpy("text_output").shape == (2,)
        assert sum(1 for t in text if t) <= 1, text
        for i in (0, 1):
            pieces[i].append(text[i])
            counts[i] += int(result.as_numpy("num_output_tokens")[i])
        ends.append([r.decode() for r in result.as_numpy("finish_reason")])
    client.stop_stream()
    client.close()
    assert ["".join(p) for p in pieces] == texts
    assert counts == got["num_output_tokens"]
    assert ends[-1] == reasons and ends[0] == ["None", "None"]
    # Once an output has ended, every later answer keeps its reason.
    for i in (0, 1):
        seen = [e[i] for e in ends]
        first = next(k for k, r in enumerate(seen) if r != "None")
        assert set(seen[first:]) == {reasons[i]}, seen


def test_a_language_model_refuses_what_generate_cannot_do_by_name(server):
    for route, body, words in [
        ("generate", {"text_input": PROMPT, "stream": True}, "use generate_stream"),
        ("generate_stream", {"text_input": PROMPT, "stream": True, "exclude_input_in_output": False},
         "exclude_input_in_output"),
        ("generate", {"max_tokens": 3}, "text_input: missing"),
        ("generate", {"text_input": PROMPT, "echo": True}, "'echo'"),
        ("generate", {"text_input": PROMPT, "return_logprobs": True, "logprobs": 9}, "logprobs"),
        ("generate", {"text_input": PROMPT, "n": 500}, "n: 500 choices"),
        ("generate", {"text_input": PROMPT, "max_tokens": 100000}, "max_tokens"),
        ("generate", {"text_input": PROMPT, "temperature": 7}, "temperature"),
        ("generate", {"text_input": PROMPT, "top_k": 2, "parameters": {"top_k": 3}}, "'top_k' is given twice"),
        ("generate_stream", {"text_input": PROMPT, "lora_name": "a"}, "LoRA"),
    ]:
        status, kind, text = post(server, "smollm2", route, body)
        assert status == 400 and kind.startswith("application/json"), (body, text)
        assert words in json.loads(text)["error"], (body, text)


def text_inputs(prompt, stream=None, sampling=None, **switches):
    """The inputs tritonclient sends a model of Triton's vLLM backend."""
    import tritonclient.grpc as grpcclient
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    inputs = [text]
    if sampling is not None:
        s = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
        s.set_data_from_numpy(np.array([json.dumps(sampling).encode()], dtype=object))
        inputs.append(s)
    for name, value in ([("stream", stream)] if stream is not None else []) + list(switches.items()):
        b = grpcclient.InferInput(name, [1], "BOOL")
        b.set_data_from_numpy(np.array([value]))
        inputs.append(b)
    return inputs


def test_a_language_model_answers_triton_s_vllm_backend_requests_over_grpc(server):
    import queue
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException
    text, reason, usage, _ = completion(server, max_tokens=12)
    client = grpcclient.InferenceServerClient(server.grpc)
    greedy = {"temperature": 0, "max_tokens": 12}
    answer = client.infer("smollm2", text_inputs(PROMPT, False, greedy, return_finish_reason=True,
                                                 return_num_output_tokens=True))
    assert answer.as_numpy("text_output")[0].decode() == PROMPT + text
    assert answer.as_numpy("finish_reason")[0].decode() == reason
    assert answer.as_numpy("num_output_tokens")[0] == usage["completion_tokens"]
    # Streamed, as the backend's own client sends it: the pieces, then the empty final response.
    got = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("smollm2", text_inputs(PROMPT, True, greedy, return_num_output_tokens=True),
                              request_id="r1", enable_empty_final_response=True)
    pieces, counts = [], []
    while True:
        result, error = got.get(timeout=60)
        assert error is None, error
        response = result.get_response()
        if response.parameters["triton_final_response"].bool_param:
            break
        assert response.id == "r1"
        pieces.append(result.as_numpy("text_output")[0].decode())
        counts.append(int(result.as_numpy("num_output_tokens")[0]))
    client.stop_stream()
    assert len(pieces) > 2 and "".join(pieces) == text and pieces[-1] == ""
    assert sum(counts) == usage["completion_tokens"]
    # The sampling parameters as request parameters; a unary call refuses to stream.
    answer = client.infer("smollm2", text_inputs(PROMPT, exclude_input_in_output=True),
                          parameters={"temperature": 0, "max_tokens": 12})
    assert answer.as_numpy("text_output")[0].decode() == text
    for inputs, words in [(text_inputs(PROMPT, True), "ModelStreamInfer"),
                          (text_inputs(PROMPT, sampling={"best_of": 2}), "'best_of'")]:
        try:
            client.infer("smollm2", inputs)
            raise AssertionError("refused")
        except InferenceServerException as e:
            assert e.status() == "StatusCode.INVALID_ARGUMENT" and words in e.message(), e
    client.close()


def test_a_language_model_answers_triton_s_vllm_backend_requests_on_the_infer_route(server):
    text, reason, usage, _ = completion(server, max_tokens=12)
    client = httpclient.InferenceServerClient(server.http)
    inputs = []
    for name, datatype, value in [("text_input", "BYTES", PROMPT.encode()),
                                  ("sampling_parameters", "BYTES",
                                   json.dumps({"temperature": 0, "max_tokens": 12}).encode()),
                                  ("return_num_input_tokens", "BOOL", True)]:
        i = httpclient.InferInput(name, [1], datatype)
        i.set_data_from_numpy(np.array([value], dtype=object if datatype == "BYTES" else bool))
        inputs.append(i)
    answer = client.infer("smollm2", inputs, request_id="q1")
    assert answer.get_response()["id"] == "q1"
    # JSON answers hold strings, which tritonclient gives as they are.
    assert answer.as_numpy("text_output")[0] == PROMPT + text
    assert answer.as_numpy("num_input_tokens")[0] == usage["prompt_tokens"]
    # Streamed as server-sent events of KServe responses; refused without them.
    body = {"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": [PROMPT]},
                       {"name": "stream", "shape": [1], "datatype": "BOOL", "data": [True]}],
            "parameters": {"temperature": 0, "max_tokens": 12}}
    request = urllib.request.Request(
        f"http://{server.http}/v2/models/smollm2/infer", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
    with urllib.request.urlopen(request, timeout=60) as r:
        got = events(r.read().decode())
    pieces = [next(o for o in e["outputs"] if o["name"] == "text_output")["data"][0] for e in got]
    assert "".join(pieces) == text and pieces[-1] == "" and len(pieces) > 2
    status, _, refused = post(server, "smollm2", "infer", body)
    assert status == 400 and "text/event-stream" in json.loads(refused)["error"], refused
    # A tensor the contract does not hold says what the model takes.
    status, _, refused = post(server, "smollm2", "infer", {
        "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]})
    assert status == 400 and "text_input" in json.loads(refused)["error"], refused
