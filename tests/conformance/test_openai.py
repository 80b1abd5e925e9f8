"""The `openai` Python package, unmodified, against sheaf's OpenAI-compatible routes, with the
real SmolLM2-135M-Instruct model."""
import json
import math
import urllib.request

import jsonschema
import openai
import pytest
from conftest import post_json

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_models_are_listed(client, server):
    assert "smollm2" in [m.id for m in client.models.list()]
    # With vLLM's `max_model_len`: what `/tokenize` reports, for each kind of model.
    cards = {m.id: m for m in client.models.list()}
    for name in ("smollm2", "minilm"):
        tokenized = post_json(server, "/tokenize", {"model": name, "prompt": "hi"})
        assert cards[name].model_extra["max_model_len"] == tokenized["max_model_len"] > 0
        assert client.models.retrieve(name).model_extra["max_model_len"] == \
            tokenized["max_model_len"]


def test_chat_completion_answers_with_usage(client):
    r = client.chat.completions.create(
        model="smollm2", messages=QUESTION, temperature=0, max_tokens=24)
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.completion_tokens > 0


def test_streamed_chat_equals_the_whole_answer(client):
    whole = client.chat.completions.create(
        model="smollm2", messages=QUESTION, temperature=0, max_tokens=24)
    stream = client.chat.completions.create(
        model="smollm2", messages=QUESTION, temperature=0, max_tokens=24, stream=True,
        stream_options={"include_usage": True})
    pieces, usage, reasons = [], None, []
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    assert "".join(pieces) == whole.choices[0].message.content
    assert reasons == [whole.choices[0].finish_reason]
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_every_chunk_carries_its_choice_s_usage_so_far(client):
    """vLLM's `continuous_usage_stats`: each chunk's usage is its prompt's tokens and its
    choice's tokens until then, and each choice's last chunk has the choice's whole count."""
    every = {"include_usage": True, "continuous_usage_stats": True}
    greedy = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0,
                                            max_tokens=16)
    stream = client.chat.completions.create(model="smollm2", messages=QUESTION, n=2,
                                            temperature=0, max_tokens=16, stream=True,
                                            logprobs=True, stream_options=every)
    counts, ends, last = {0: [0], 1: [0]}, {}, None
    for chunk in stream:
        assert chunk.usage is not None, chunk
        u = chunk.usage
        assert u.total_tokens == u.prompt_tokens + u.completion_tokens
        if not chunk.choices:
            last = u
            continue
        assert u.prompt_tokens == greedy.usage.prompt_tokens
        c = chunk.choices[0]
        if c.finish_reason:
            ends[c.index] = u.completion_tokens
            continue
        # The tokens this chunk's text holds are the ones its count adds.
        assert u.completion_tokens - counts[c.index][-1] == len(c.logprobs.content) >= 1, chunk
        counts[c.index].append(u.completion_tokens)
    assert ends == {0: greedy.usage.completion_tokens, 1: greedy.usage.completion_tokens}
    assert last.completion_tokens == 2 * greedy.usage.completion_tokens
    assert last.prompt_tokens == greedy.usage.prompt_tokens

    # Completions: each prompt's choices count that prompt's tokens; no log-probabilities shown
    # where none were asked for.
    prompts = ["Once upon a time", "The capital of France is a city that"]
    alone = [client.completions.create(model="smollm2", prompt=p, max_tokens=6, temperature=0)
             for p in prompts]
    seen = {0: [], 1: []}
    for chunk in client.completions.create(model="smollm2", prompt=prompts, max_tokens=6,
                                           temperature=0, stream=True, stream_options=every):
        for c in chunk.choices:
            assert c.logprobs is None
            seen[c.index].append((chunk.usage.prompt_tokens, chunk.usage.completion_tokens))
    for i, a in enumerate(alone):
        assert {p for p, _ in seen[i]} == {a.usage.prompt_tokens}
        assert [t for _, t in seen[i]] == sorted(t for _, t in seen[i])
        assert seen[i][-1][1] == a.usage.completion_tokens
    assert alone[0].usage.prompt_tokens != alone[1].usage.prompt_tokens

    # Without `include_usage`, as under vLLM, no chunk carries a usage.
    plain = client.completions.create(model="smollm2", prompt=prompts[0], max_tokens=4,
                                      stream=True,
                                      stream_options={"continuous_usage_stats": True})
    chunks = list(plain)
    assert chunks and all(chunk.usage is None for chunk in chunks)


def test_completion_stops_before_the_stop_string(client):
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    r = client.completions.create(
        model="smollm2", prompt=prompt, temperature=0, max_tokens=24, stop=["Paris"])
    assert "Paris" not in r.choices[0].text
    assert r.choices[0].finish_reason == "stop"
    seeded = [client.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=12,
                                        temperature=0.9, top_p=0.9, seed=7).choices[0].text
              for _ in range(2)]
    assert seeded[0] == seeded[1], "the same seed gives the same sample"


def test_errors_reach_the_client(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smollm2", prompt="word " * 9000, max_tokens=4)
    assert "context holds 8192 tokens" in str(e.value)
    # OpenAI's codes for the two cases, which clients read to tell them from other refusals.
    assert e.value.code == "context_length_exceeded" and e.value.param is None, e.value
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=QUESTION)
    assert "unknown model 'nope'" in str(e.value) and e.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("nope")
    assert e.value.code == "model_not_found", e.value
    # Other refusals name no code.
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smollm2", prompt="Hi", max_tokens=-1)
    assert e.value.code is None and e.value.param == "max_tokens", e.value


def test_chat_logprobs_are_the_greedy_argmax_and_stream_the_same(client):
    r = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0,
                                       max_tokens=16, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens - (r.choices[0].finish_reason == "stop")
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0
        assert len(t.top_logprobs) == 3
        assert [a.logprob for a in t.top_logprobs] == sorted(
            (a.logprob for a in t.top_logprobs), reverse=True)
        # Greedy decoding picks the most likely token.
        assert t.token == t.top_logprobs[0].token
        assert abs(t.logprob - t.top_logprobs[0].logprob) < 1e-6
        assert sum(math.exp(a.logprob) for a in t.top_logprobs) <= 1 + 1e-4
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token
    stream = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0,
                                            max_tokens=16, logprobs=True, top_logprobs=3,
                                            stream=True)
    streamed = [t for chunk in stream for c in chunk.choices if c.logprobs
                for t in c.logprobs.content]
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [
        (t.token, round(t.logprob, 4)) for t in content]
    plain = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0,
                                           max_tokens=16)
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_have_the_legacy_shape(client):
    r = client.completions.create(model="smollm2", prompt="The capital of France is",
                                  temperature=0, max_tokens=8, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert all(x <= 0 for x in lp.token_logprobs)
    assert lp.text_offset[0] == 0
    for token, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 2
        assert max(top.values()) == pytest.approx(chosen, abs=1e-6)


def test_logprob_fields_are_checked(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=QUESTION, top_logprobs=2)
    assert "top_logprobs" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=QUESTION, logprobs=True,
                                       top_logprobs=50)
    assert "top_logprobs" in str(e.value)


def reused_prefix_tokens(server):
    with urllib.request.urlopen(f"http://{server.http}/stats") as r:
        return json.loads(r.read())["generation"]["smollm2"]["prefix_tokens_reused"]


def test_n_choices_share_the_prompt_cells(client, server):
    greedy = client.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0,
                                            max_tokens=16)
    question = [{"role": "user", "content": "Name three colours of the rainbow, please."}]
    # Sampled choices repeat with their seeds when they start from the same cells: a prompt
    # computed whole and one read back from the prefix cache can differ in the last bits, and
    # at temperature 0.9 that may pick another token. Earlier tests leave other prompts in the
    # cache, so the prompt is computed once first, and the runs compared below both read it.
    client.chat.completions.create(model="smollm2", messages=question, n=3, temperature=0.9,
                                   seed=11, max_tokens=1)
    before = reused_prefix_tokens(server)
    r = client.chat.completions.create(model="smollm2", messages=question, n=3, temperature=0.9,
                                       seed=11, max_tokens=12)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content and c.finish_reason in ("stop", "length") for c in r.choices)
    # Choices 1 and 2 copied all but the last prompt token from choice 0.
    assert reused_prefix_tokens(server) - before >= 2 * (r.usage.prompt_tokens - 1)
    single = client.chat.completions.create(model="smollm2", messages=question, temperature=0.9,
                                            seed=11, max_tokens=12)
    assert r.usage.prompt_tokens == single.usage.prompt_tokens
    assert r.usage.completion_tokens >= 3
    again = client.chat.completions.create(model="smollm2", messages=question, n=3,
                                           temperature=0.9, seed=11, max_tokens=12)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]
    assert len({c.message.content for c in r.choices}) > 1, "each choice samples with its own seed"
    # Greedy choices that start from copied cells answer as a request alone does.
    r = client.chat.completions.create(model="smollm2", messages=QUESTION, n=3, temperature=0,
                                       max_tokens=16)
    assert [c.message.content for c in r.choices] == [greedy.choices[0].message.content] * 3
    stream = client.chat.completions.create(model="smollm2", messages=QUESTION, n=2, temperature=0,
                                            max_tokens=16, stream=True,
                                            stream_options={"include_usage": True})
    pieces, finished, usage = {0: [], 1: []}, [], None
    for chunk in stream:
        usage = chunk.usage or usage
        for c in chunk.choices:
            pieces[c.index].append(c.delta.content or "")
            if c.finish_reason:
                finished.append(c.index)
    assert sorted(finished) == [0, 1]
    assert ["".join(p) for p in pieces.values()] == [greedy.choices[0].message.content] * 2
    assert usage.completion_tokens == 2 * greedy.usage.completion_tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=QUESTION, n=0)
    assert "n:" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=QUESTION, n=500)
    assert "n:" in str(e.value)


CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer", "minimum": 0}},
    "required": ["city", "population"],
    "additionalProperties": False,
}


def test_json_schema_answers_validate_streamed_or_not(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    ask = [{"role": "user", "content": "What is the capital of France and its population?"}]
    r = client.chat.completions.create(model="smollm2", messages=ask, temperature=0,
                                       max_tokens=120, response_format=fmt)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), CITY)
    # Sampled: the city's name is bounded, so that a long one cannot outrun the token limit
    # (the engine's cached prompt prefixes make a sample depend on what ran before).
    bounded = json.loads(json.dumps(CITY))
    bounded["properties"]["city"]["maxLength"] = 40
    sampled = {"type": "json_schema", "json_schema": {"name": "city", "schema": bounded}}
    stream = client.chat.completions.create(model="smollm2", messages=ask, temperature=0.8,
                                            seed=3, max_tokens=200, response_format=sampled,
                                            stream=True)
    text = "".join(c.delta.content or "" for chunk in stream for c in chunk.choices)
    jsonschema.validate(json.loads(text), bounded)
    short = [{"role": "user", "content": "Reply with a JSON object whose one key, answer, holds "
                                         "the capital of France."}]
    r = client.chat.completions.create(model="smollm2", messages=short, temperature=0,
                                       max_tokens=120, response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_a_schema_that_cannot_be_compiled_is_a_400(client):
    bad = {"type": "json_schema",
           "json_schema": {"name": "x", "schema": {"$ref": "#/definitions/missing"}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=QUESTION, response_format=bad)
    assert "response_format" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=QUESTION,
                                       response_format={"type": "yaml"})
    assert "response_format" in str(e.value)


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather now in a city",
        "parameters": WEATHER}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
]
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_a_forced_tool_call_has_arguments_that_follow_the_schema(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in (named, "required"):
        r = client.chat.completions.create(model="smollm2", messages=ASK_WEATHER, temperature=0,
                                           max_tokens=60, tools=TOOLS, tool_choice=choice)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        assert c.message.content is None
        (call,) = c.message.tool_calls
        assert call.type == "function" and call.id
        assert call.function.name in ("get_weather", "get_time")
        if choice is named:
            assert call.function.name == "get_weather"
            jsonschema.validate(json.loads(call.function.arguments), WEATHER)
        else:
            assert isinstance(json.loads(call.function.arguments)["city"], str)
    # Streamed: the call comes as a delta, and the deltas add up to the same call.
    stream = client.chat.completions.create(model="smollm2", messages=ASK_WEATHER, temperature=0,
                                            max_tokens=60, tools=TOOLS, tool_choice=named,
                                            stream=True)
    name, arguments, reasons = "", "", []
    for chunk in stream:
        for c in chunk.choices:
            assert not c.delta.content
            for d in c.delta.tool_calls or []:
                name += d.function.name or ""
                arguments += d.function.arguments or ""
            if c.finish_reason:
                reasons.append(c.finish_reason)
    assert reasons == ["tool_calls"]
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments), WEATHER)


def test_several_forced_calls_when_asked_each_follow_the_schema_streamed_or_not(client):
    """`required` with `parallel_tool_calls: true` lets the model write more calls after its
    first, each held to a function's schema; by default a forced answer is one call. (The demo
    model, asked about two cities and let write several calls, writes one for each.)"""
    two_cities = [{"role": "user", "content": "What is the weather in Paris and in London?"}]

    def forced(**extra):
        return client.chat.completions.create(model="smollm2", messages=two_cities,
                                              temperature=0, max_tokens=200, tools=TOOLS,
                                              tool_choice="required", **extra)

    r = forced()
    assert r.choices[0].finish_reason == "tool_calls" and len(r.choices[0].message.tool_calls) == 1
    c = forced(parallel_tool_calls=True).choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None, c
    calls = [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls]
    assert len(calls) >= 2, calls
    assert len({t.id for t in c.message.tool_calls}) == len(calls), "each call has its own id"
    for name, arguments in calls:
        assert name in ("get_weather", "get_time")
        jsonschema.validate(arguments, WEATHER if name == "get_weather" else {"type": "object"})
    # Streamed: one delta per call, by index, adding up to the same calls.
    streamed, reasons = {}, []
    for chunk in forced(parallel_tool_calls=True, stream=True):
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or []:
                name, arguments = streamed.get(d.index, ("", ""))
                streamed[d.index] = (name + (d.function.name or ""),
                                     arguments + (d.function.arguments or ""))
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    assert reasons == ["tool_calls"]
    assert [(n, json.loads(a)) for _, (n, a) in sorted(streamed.items())] == calls


def test_auto_calls_as_the_chat_history_did_and_none_calls_nothing(client):
    """With `auto`, the model writes a call as it did earlier in the chat (its past call goes
    through the chat template), and the call is read out of the answer, streamed or not."""
    history = ASK_WEATHER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "user", "content": "What is the weather in Rome?"},
    ]
    r = client.chat.completions.create(model="smollm2", messages=history, temperature=0,
                                       max_tokens=60, tools=TOOLS)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    assert c.message.content is None
    (call,) = c.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Rome"}
    stream = client.chat.completions.create(model="smollm2", messages=history, temperature=0,
                                            max_tokens=60, tools=TOOLS, stream=True)
    deltas = [c.delta for chunk in stream for c in chunk.choices]
    assert not "".join(d.content or "" for d in deltas)
    calls = [t for d in deltas for t in d.tool_calls or []]
    assert [(t.function.name, json.loads(t.function.arguments)) for t in calls] == \
        [("get_weather", {"city": "Rome"})]
    # `none`: no call, and the prompt is the one without tools.
    plain = client.chat.completions.create(model="smollm2", messages=ASK_WEATHER, temperature=0,
                                           max_tokens=20)
    r = client.chat.completions.create(model="smollm2", messages=ASK_WEATHER, temperature=0,
                                       max_tokens=20, tools=TOOLS, tool_choice="none")
    assert r.usage.prompt_tokens == plain.usage.prompt_tokens
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    # With `auto`, the functions are in the prompt; an answer that calls none is text.
    r = client.chat.completions.create(model="smollm2", messages=ASK_WEATHER, temperature=0,
                                       max_tokens=20, tools=TOOLS)
    assert r.usage.prompt_tokens > plain.usage.prompt_tokens + 50
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.content


@pytest.mark.parametrize("messages, extra, says", [
    ([{"role": "robot", "content": "hi"}], {}, "messages[0].role"),
    ([{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                   {"type": "image_url", "image_url": {"url": "data:,"}}]}],
     {}, "messages[0].content[1]: sheaf's language models read text parts"),
    ([{"role": "user"}], {}, "messages[0].content"),
    (ASK_WEATHER + [{"role": "tool", "tool_call_id": "call_9", "content": "sunny"}], {},
     "messages[1]: no assistant message before it made a call with id"),
    (ASK_WEATHER, {"stream_options": {"include_usage": True}}, "stream_options"),
])
def test_what_the_model_could_not_read_is_refused_not_dropped(client, messages, extra, says):
    """A message the model could not read as sent is a 400 naming it, never dropped in part:
    an answer to a question the client did not ask would look like the model's fault."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="smollm2", messages=messages, max_tokens=4,
                                       **extra)
    assert says in str(refused.value), refused.value


def test_bad_tools_are_refused_by_name(client):
    for kwargs, says in [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0]"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="smollm2", messages=ASK_WEATHER, **kwargs)
        assert says in str(e.value), (kwargs, e.value)
