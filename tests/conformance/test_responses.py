"""OpenAI's Responses API (`client.responses.create`, as the OpenAI Agents SDK calls it) with
the `openai` package, unmodified, against the real SmolLM2-135M-Instruct model on sheaf: the
answer equals the chat route's for the same conversation; streamed, its typed events add up to
it; forced function calls come as function_call items; a response goes on from a kept one
(`previous_response_id`) as from the whole conversation sent again, and is retrieved and deleted;
one made in the background is answered at once, read back finished, or cancelled while it runs,
and, streamed, its events are read again from any one, while it runs and after;
what sheaf does not do is refused by name."""
import http.client as http_client
import json
import signal
import threading
import time

import jsonschema
import openai
import pytest

from conftest import launch, link_gguf, start
from test_openai import WEATHER


def chat_answer(client, messages, **extra):
    return client.chat.completions.create(model="smollm2", messages=messages, temperature=0,
                                          max_tokens=24, **extra)


def test_a_response_equals_the_chat_answer_to_the_same_conversation(client):
    r = client.responses.create(model="smollm2", instructions="Answer in one sentence.",
                                input="What is the capital of France?", temperature=0,
                                max_output_tokens=24)
    chat = chat_answer(client, [
        {"role": "system", "content": "Answer in one sentence."},
        {"role": "user", "content": "What is the capital of France?"}])
    assert r.object == "response" and r.model == "smollm2"
    assert r.output_text == chat.choices[0].message.content
    assert "Paris" in r.output_text
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant"
    assert item.content[0].type == "output_text"
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    # A conversation of items, text parts and a developer message among them.
    r = client.responses.create(model="smollm2", temperature=0, max_output_tokens=24, input=[
        {"role": "developer", "content": "Answer in one sentence."},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "What is the capital of France?"}]}])
    assert r.output_text == chat.choices[0].message.content
    # The token limit reached: incomplete, and why.
    short = client.responses.create(model="smollm2", input="Tell me a long story.",
                                    temperature=0, max_output_tokens=5)
    assert short.status == "incomplete", short
    assert short.incomplete_details.reason == "max_output_tokens"
    assert short.usage.output_tokens == 5


def test_a_streamed_response_s_events_add_up_to_the_answer(client):
    whole = client.responses.create(model="smollm2", input="What is the capital of France?",
                                    temperature=0, max_output_tokens=24)
    kinds, deltas, completed = [], [], None
    for event in client.responses.create(model="smollm2", input="What is the capital of France?",
                                         temperature=0, max_output_tokens=24, stream=True):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type in ("response.completed", "response.incomplete"):
            completed = event.response
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"], kinds
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"], kinds
    assert "".join(deltas) == whole.output_text
    assert completed.output_text == whole.output_text
    assert completed.usage.output_tokens == whole.usage.output_tokens


def test_a_forced_function_call_is_a_function_call_item(client):
    tools = [{"type": "function", "name": "get_weather", "description": "The weather now in a city",
              "parameters": WEATHER}]
    ask = "What is the weather in Paris?"
    r = client.responses.create(model="smollm2", input=ask, temperature=0, max_output_tokens=60,
                                tools=tools, tool_choice={"type": "function", "name": "get_weather"})
    calls = [item for item in r.output if item.type == "function_call"]
    assert len(calls) == 1, r.output
    assert calls[0].name == "get_weather" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    # The call and its output sent back: the model answers in text.
    follow = client.responses.create(model="smollm2", temperature=0, max_output_tokens=24,
                                     tools=tools, input=[
        {"role": "user", "content": ask},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
         "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}])
    assert follow.output_text, follow.output
    # Streamed: the call's arguments in its own events.
    arguments, items = "", []
    for event in client.responses.create(model="smollm2", input=ask, temperature=0,
                                         max_output_tokens=60, tools=tools, stream=True,
                                         tool_choice={"type": "function", "name": "get_weather"}):
        if event.type == "response.function_call_arguments.done":
            arguments = event.arguments
        if event.type == "response.output_item.done":
            items.append(event.item.type)
    assert "function_call" in items, items
    jsonschema.validate(json.loads(arguments), WEATHER)


def test_several_function_calls_are_items_of_their_own(client):
    """`parallel_tool_calls: true` with `required`: each call the model makes is a
    `function_call` item with its own `call_id`, streamed under its own `output_index`. (Asked
    about two cities, the demo model writes a call for each; asked about one, it also wrote two
    calls, but not in every state of a server that had served other requests.)"""
    tools = [{"type": "function", "name": "get_weather", "description": "The weather now in a city",
              "parameters": WEATHER}]
    asked = dict(model="smollm2", input="What is the weather in Paris and in London?",
                 temperature=0, max_output_tokens=200, tools=tools, tool_choice="required",
                 parallel_tool_calls=True)
    r = client.responses.create(**asked)
    assert r.status == "completed" and r.parallel_tool_calls is True, r
    calls = [item for item in r.output if item.type == "function_call"]
    assert len(calls) >= 2 and len({c.call_id for c in calls}) == len(calls), r.output
    for call in calls:
        assert call.name == "get_weather"
        jsonschema.validate(json.loads(call.arguments), WEATHER)
    done = {}
    for event in client.responses.create(**asked, stream=True):
        if event.type == "response.function_call_arguments.done":
            done[event.output_index] = event.arguments
    assert [json.loads(done[i]) for i in sorted(done)] == [json.loads(c.arguments) for c in calls]
    assert sorted(done) == list(range(len(calls)))


def test_a_json_schema_format_is_followed(client):
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}},
              "required": ["capital"], "additionalProperties": False}
    r = client.responses.create(
        model="smollm2", input="What is the capital of France? Answer in JSON.", temperature=0,
        max_output_tokens=120,
        text={"format": {"type": "json_schema", "name": "capital", "schema": schema}})
    # The grammar holds the answer to the schema; only the token limit could cut it.
    assert r.status == "completed", (r.status, r.output_text)
    jsonschema.validate(json.loads(r.output_text), schema)


def test_a_response_goes_on_from_a_kept_one_as_from_the_whole_conversation(client):
    first = client.responses.create(model="smollm2", input="My name is Ada. Say hello to me.",
                                    temperature=0, max_output_tokens=16)
    assert first.store is True and first.previous_response_id is None
    then = client.responses.create(model="smollm2", previous_response_id=first.id,
                                   input="What is my name?", temperature=0, max_output_tokens=16)
    assert then.previous_response_id == first.id
    whole = client.responses.create(model="smollm2", temperature=0, max_output_tokens=16, input=[
        {"role": "user", "content": "My name is Ada. Say hello to me."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}])
    # The same prompt as the whole conversation sent again. (The answers are not compared: the
    # engine reuses the cached prompt prefixes of earlier requests, whose numbers can tip a
    # greedy choice.)
    assert then.usage.input_tokens == whole.usage.input_tokens
    assert then.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert then.output_text
    # A chain: the third goes on from the second, which holds the first.
    third = client.responses.create(model="smollm2", previous_response_id=then.id,
                                    input="Thank you.", temperature=0, max_output_tokens=4)
    assert third.usage.input_tokens > then.usage.input_tokens + then.usage.output_tokens
    # Each response's own input items, newest first unless asked otherwise.
    items = client.responses.input_items.list(then.id)
    assert [i.content[0].text for i in items.data] == ["What is my name?"]
    assert items.data[0].role == "user" and items.data[0].id and not items.has_more
    items = client.responses.input_items.list(first.id, order="asc")
    assert [i.content[0].text for i in items.data] == ["My name is Ada. Say hello to me."]
    # Ids no one can guess.
    assert first.id.startswith("resp_") and len(first.id) > 30 and first.id != then.id
    # Retrieved as answered; deleted, it is gone for both.
    kept = client.responses.retrieve(first.id)
    assert kept.id == first.id and kept.output_text == first.output_text
    assert kept.usage.output_tokens == first.usage.output_tokens
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as gone:
        client.responses.create(model="smollm2", previous_response_id=first.id, input="hi")
    assert first.id in str(gone.value), gone.value
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(first.id)
    # Not kept when the request says so.
    unkept = client.responses.create(model="smollm2", input="hi", store=False,
                                     max_output_tokens=2)
    assert unkept.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)


def test_a_function_call_s_output_goes_on_from_the_kept_call(client):
    tools = [{"type": "function", "name": "get_weather", "description": "The weather now in a city",
              "parameters": WEATHER}]
    ask = "What is the weather in Paris?"
    call = client.responses.create(model="smollm2", input=ask, temperature=0, max_output_tokens=60,
                                   tools=tools,
                                   tool_choice={"type": "function", "name": "get_weather"})
    (fc,) = [item for item in call.output if item.type == "function_call"]
    output = {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny, 21 C"}
    kept = client.responses.create(model="smollm2", temperature=0, max_output_tokens=24,
                                   tools=tools, previous_response_id=call.id, input=[output])
    whole = client.responses.create(model="smollm2", temperature=0, max_output_tokens=24,
                                    tools=tools, input=[
        {"role": "user", "content": ask},
        {"type": "function_call", "call_id": fc.call_id, "name": "get_weather",
         "arguments": fc.arguments},
        output])
    assert kept.output_text
    assert kept.usage.input_tokens == whole.usage.input_tokens > call.usage.input_tokens


def test_a_streamed_response_is_kept_once_completed(client):
    completed = None
    for event in client.responses.create(model="smollm2", input="My name is Ada.", temperature=0,
                                         max_output_tokens=8, stream=True):
        if event.type in ("response.completed", "response.incomplete"):
            completed = event.response
    assert completed is not None and completed.store is True
    kept = client.responses.retrieve(completed.id)
    assert kept.output_text == completed.output_text
    then = client.responses.create(model="smollm2", previous_response_id=completed.id,
                                   input="What is my name?", max_output_tokens=4)
    assert then.usage.input_tokens > completed.usage.input_tokens + completed.usage.output_tokens


def finished(client, response_id, within_s=120):
    """The background response once it has left `queued` and `in_progress`, polled as OpenAI's
    background guide does."""
    deadline = time.monotonic() + within_s
    seen = []
    while time.monotonic() < deadline:
        r = client.responses.retrieve(response_id)
        seen.append(r.status)
        if r.status not in ("queued", "in_progress"):
            return r, seen
        time.sleep(0.05)
    raise AssertionError(f"still {seen[-1]} after {within_s} s")


def test_a_background_response_is_answered_at_once_and_read_back_finished(client):
    asked = dict(model="smollm2", input="What is the capital of France?", temperature=0,
                 max_output_tokens=24)
    whole = client.responses.create(**asked)
    queued = client.responses.create(background=True, **asked)
    assert queued.status == "queued" and queued.background is True, queued
    assert queued.output == [] and queued.usage is None
    done, seen = finished(client, queued.id)
    assert set(seen) <= {"queued", "in_progress", done.status}, seen
    assert done.status == whole.status and done.background is True
    assert done.output_text == whole.output_text and "Paris" in done.output_text
    assert done.usage.output_tokens == whole.usage.output_tokens
    items = client.responses.input_items.list(queued.id)
    assert [i.content[0].text for i in items.data] == ["What is the capital of France?"]
    # A finished background response is gone on from like any other; cancelling it now
    # answers it as it is.
    then = client.responses.create(model="smollm2", previous_response_id=queued.id,
                                   input="And of Italy?", max_output_tokens=4)
    assert then.usage.input_tokens > done.usage.input_tokens + done.usage.output_tokens
    assert client.responses.cancel(queued.id).status == done.status
    # Only background responses are cancelled.
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.cancel(whole.id)
    assert "background" in str(refused.value), refused.value
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_no_such_response")


def test_a_background_response_is_cancelled_while_it_runs(client):
    queued = client.responses.create(model="smollm2", input="Tell me a very long story.",
                                     temperature=0, max_output_tokens=4000, background=True)
    cancelled = client.responses.cancel(queued.id)
    assert cancelled.id == queued.id and cancelled.status == "cancelled", cancelled
    # It stays cancelled: its run has stopped, and does not write its answer over it.
    time.sleep(1.5)
    kept = client.responses.retrieve(queued.id)
    assert kept.status == "cancelled" and kept.output == []
    assert client.responses.cancel(queued.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="smollm2", previous_response_id=queued.id, input="hi")
    assert "is cancelled" in str(refused.value), refused.value
    # The engine is free for the next request.
    assert client.responses.create(model="smollm2", input="hi", max_output_tokens=2).output


def sse_events(http, path, body=None, stop_after=None):
    """The server-sent events of a GET (or of a POST with `body`), parsed; with `stop_after`,
    the connection is closed once an event with that sequence number has come."""
    method = "POST" if body is not None else "GET"
    connection = http_client.HTTPConnection(*http.split(":"), timeout=120)
    payload = json.dumps(body) if body is not None else None
    connection.request(method, path, body=payload, headers={"Content-Type": "application/json"})
    reply = connection.getresponse()
    if reply.status != 200:
        body = reply.read().decode()
        connection.close()
        return reply.status, body
    events = []
    for line in reply:
        if line.startswith(b"data:"):
            events.append(json.loads(line[5:]))
            if stop_after is not None and events[-1]["sequence_number"] == stop_after:
                break
    connection.close()
    return reply.status, events


def text_of(events):
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


def test_a_background_response_is_streamed_and_read_again_from_any_event(client, server):
    asked = dict(model="smollm2", input="What is the capital of France?", temperature=0,
                 max_output_tokens=24)
    whole = client.responses.create(**asked)
    # Streamed as it is made, with the `openai` package.
    events = list(client.responses.create(background=True, stream=True, **asked))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.queued", "response.in_progress"], kinds
    assert events[0].response.status == "queued" and events[0].response.background is True
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[-1] == f"response.{whole.status}", kinds
    ended = events[-1].response
    assert ended.output_text == whole.output_text and "Paris" in ended.output_text
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") \
        == whole.output_text
    # Kept finished before its stream ended; read again whole, or after any event.
    kept = client.responses.retrieve(ended.id)
    assert kept.status == whole.status and kept.output_text == whole.output_text
    again = list(client.responses.retrieve(ended.id, stream=True))
    assert [e.model_dump() for e in again] == [e.model_dump() for e in events]
    later = list(client.responses.retrieve(ended.id, stream=True, starting_after=4))
    assert [e.sequence_number for e in later] == list(range(5, len(events)))
    assert list(client.responses.retrieve(ended.id, stream=True, starting_after=10**6)) == []
    # It goes on from like any other.
    then = client.responses.create(model="smollm2", previous_response_id=ended.id,
                                   input="And of Italy?", max_output_tokens=4)
    assert then.usage.input_tokens > kept.usage.input_tokens + kept.usage.output_tokens


def test_a_background_stream_left_by_its_client_runs_on_and_is_picked_up(client, server):
    # Greedy, this prompt runs to the token limit: long enough to be left while it runs.
    asked = {"model": "smollm2", "input": "Tell me a long story.", "temperature": 0,
             "max_output_tokens": 200, "background": True, "stream": True}
    status, first = sse_events(server.http, "/v1/responses", asked, stop_after=5)
    assert status == 200 and [e["sequence_number"] for e in first] == list(range(6)), first
    response_id = first[0]["response"]["id"]
    assert client.responses.retrieve(response_id).status in ("in_progress", "incomplete")
    # Picked up where it was left: no event twice, none missing, while it runs or after.
    status, rest = sse_events(server.http, f"/v1/responses/{response_id}?stream=true"
                                           "&starting_after=5")
    assert status == 200, rest
    assert [e["sequence_number"] for e in rest] == list(range(6, 6 + len(rest)))
    assert rest[-1]["type"] == "response.incomplete", rest[-1]
    finished_object = rest[-1]["response"]
    assert finished_object["usage"]["output_tokens"] == 200
    text = text_of(first + rest)
    assert text == finished_object["output"][0]["content"][0]["text"]
    assert client.responses.retrieve(response_id).output_text == text


def test_a_background_stream_ends_when_its_response_is_cancelled(client, server):
    asked = {"model": "smollm2", "input": "Tell me a very long story.", "temperature": 0,
             "max_output_tokens": 4000, "background": True, "stream": True}
    status, first = sse_events(server.http, "/v1/responses", asked, stop_after=3)
    assert status == 200, first
    response_id = first[0]["response"]["id"]
    follower = {}
    reading = threading.Thread(target=lambda: follower.update(
        got=sse_events(server.http, f"/v1/responses/{response_id}?stream=true")))
    reading.start()
    time.sleep(0.3)
    assert client.responses.cancel(response_id).status == "cancelled"
    reading.join(timeout=30)
    assert not reading.is_alive(), "the stream of a cancelled response did not end"
    status, events = follower["got"]
    assert status == 200 and events[0]["type"] == "response.created"
    assert not any(e["type"] in ("response.completed", "response.incomplete") for e in events)
    assert client.responses.retrieve(response_id).status == "cancelled"


def test_only_a_background_streamed_response_is_streamed_again(client, server):
    plain = client.responses.create(model="smollm2", input="hi", max_output_tokens=2)
    polled = client.responses.create(model="smollm2", input="hi", max_output_tokens=2,
                                     background=True)
    finished(client, polled.id)
    for response_id in (plain.id, polled.id):
        status, said = sse_events(server.http, f"/v1/responses/{response_id}?stream=true")
        assert status == 400 and "background and stream" in said, said
    for query, says in [("stream=true&starting_after=x", "starting_after"),
                        ("stream=maybe", "stream"),
                        ("starting_after=3", "only with stream=true")]:
        status, said = sse_events(server.http, f"/v1/responses/{plain.id}?{query}")
        assert status == 400 and says in said, (query, said)
    status, said = sse_events(server.http, "/v1/responses/resp_none?stream=true")
    assert status == 404, said


def test_a_background_response_runs_on_through_the_drain_of_a_sigterm(tmp_path):
    link_gguf(tmp_path)
    # The drain's wait is bounded by this test, not by the default shutdown timeout (30 s),
    # which a busy machine's 300 tokens can outlast: the timeout fails what it cuts short.
    proc, served = launch(tmp_path, "--shutdown-timeout", "300")
    try:
        client = openai.OpenAI(base_url=f"http://{served.http}/v1", api_key="not-needed",
                               max_retries=0)
        # Greedy, this prompt runs to the token limit: 300 tokens, seconds on these cores.
        queued = client.responses.create(model="smollm2", input="Tell me a long story.",
                                         temperature=0, max_output_tokens=300, background=True)
        proc.send_signal(signal.SIGTERM)
        # The drain waits for it as for any admitted request: it runs on, and can still be
        # read, while new work is refused; the server exits once it has finished.
        seen, last = [], None
        while proc.poll() is None:
            try:
                last = client.responses.retrieve(queued.id)
            except openai.APIConnectionError:
                break
            seen.append(last.status)
            time.sleep(0.02)
        assert "in_progress" in seen, seen
        assert set(seen) <= {"queued", "in_progress", "completed", "incomplete"}, (seen, last)
        assert proc.wait(timeout=300) == 0
        # The drain counted it in flight, though its request had been answered.
        deadline = time.monotonic() + 10
        while not any("shut down" in line for line in served.log) and time.monotonic() < deadline:
            time.sleep(0.05)
        draining = [json.loads(line)["fields"] for line in served.log if "draining:" in line]
        assert draining and draining[0]["in_flight"] >= 1, served.log
    finally:
        proc.kill()


@pytest.mark.parametrize("extra, says", [
    ({"background": True, "store": False}, "needs store"),
    ({"background": "yes"}, "true or false"),
    ({"tools": [{"type": "web_search"}]}, "functions only"),
    ({"reasoning": {"effort": "low"}}, "reasoning"),
    ({"tools": {"type": "function", "name": "f"}}, "tools: a list"),
    ({"metadata": {str(k): "v" for k in range(17)}}, "at most 16 keys"),
    ({"metadata": {"user": 7}}, "metadata.user: a string"),
    ({"input": [{"type": "function_call_output", "call_id": "call_7", "output": "sunny"}]},
     "no function_call before this function_call_output"),
    ({"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]}, "text parts"),
])
def test_what_sheaf_does_not_do_is_refused_by_name(client, extra, says):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(**{"model": "smollm2", "input": "hi", **extra})
    assert says in str(refused.value), refused.value


def test_a_model_is_retrieved_by_name(client):
    assert client.models.retrieve("smollm2").id == "smollm2"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_a_server_that_keeps_no_responses_says_so(tmp_path):
    link_gguf(tmp_path)
    for served in start(tmp_path, "--responses-store-mib", "0"):
        client = openai.OpenAI(base_url=f"http://{served.http}/v1", api_key="not-needed")
        r = client.responses.create(model="smollm2", input="hi", max_output_tokens=2)
        assert r.store is False
        with pytest.raises(openai.NotFoundError) as gone:
            client.responses.retrieve(r.id)
        assert "keeps no responses" in str(gone.value)
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="smollm2", input="hi", previous_response_id=r.id)
        assert "--responses-store-mib 0" in str(refused.value), refused.value
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="smollm2", input="hi", background=True)
        assert "keeps no responses" in str(refused.value), refused.value
