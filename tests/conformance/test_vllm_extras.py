"""vLLM's own request fields, sent as vLLM's clients send them (the `openai` package's
`extra_body`), against the real SmolLM2-135M-Instruct model: guided decoding (`guided_choice`,
`guided_regex`, `guided_json`, `guided_grammar`, `structured_outputs`) and where an answer ends
(`min_tokens`, `ignore_eos`, `stop_token_ids`, `include_stop_str_in_output`,
`skip_special_tokens`)."""
import json
import re

import jsonschema
import openai
import pytest
from conftest import post_json

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def chat(client, extra, stream=False, **asked):
    asked = {"model": "smollm2", "messages": QUESTION, "temperature": 0, "max_tokens": 48,
             **asked}
    if not stream:
        r = client.chat.completions.create(extra_body=extra, **asked)
        return r.choices[0].message.content, r.choices[0].finish_reason, r.usage
    chunks = client.chat.completions.create(extra_body=extra, stream=True, **asked)
    text, reasons = [], []
    for chunk in chunks:
        for c in chunk.choices:
            text.append(c.delta.content or "")
            if c.finish_reason:
                reasons.append(c.finish_reason)
    return "".join(text), reasons[-1], None


def test_guided_choice_answers_one_choice_whole_streamed_or_not(client):
    # Strings the model would not write by itself: the grammar makes the answer one of them.
    odd = ["quokka-17", "zebra-42", "Paris, France"]
    for extra in ({"guided_choice": odd}, {"structured_outputs": {"choice": odd}}):
        whole, reason, _ = chat(client, extra)
        assert whole in odd and reason == "stop", (extra, whole)
        streamed, reason, _ = chat(client, extra, stream=True)
        assert streamed == whole and reason == "stop"
    sampled = {chat(client, {"guided_choice": ["yes", "no", "maybe"]}, temperature=1.0,
                    seed=s)[0] for s in range(6)}
    assert sampled <= {"yes", "no", "maybe"}, sampled


def test_guided_regex_answers_match_the_whole_pattern(client):
    free, _, _ = chat(client, {})
    for pattern in (r"\d{3}-[A-Z]{2}", r"^(?i:paris|lyon) is [a-z ]{3,20}\.$",
                    r"[^\n]{5,12}", r"(\w{1,10} ){2}\w{1,10}"):
        for extra in ({"guided_regex": pattern}, {"structured_outputs": {"regex": pattern}}):
            text, reason, _ = chat(client, extra)
            assert re.fullmatch(pattern, text), (pattern, text)
            assert reason == "stop", (pattern, text)
        assert not re.fullmatch(pattern, free), "the free answer matches already"
    streamed, _, _ = chat(client, {"guided_regex": r"\d{3}-[A-Z]{2}"}, stream=True)
    assert re.fullmatch(r"\d{3}-[A-Z]{2}", streamed), streamed


def test_guided_json_answers_validate(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                               "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    for extra in ({"guided_json": schema}, {"guided_json": json.dumps(schema)},
                  {"structured_outputs": {"json": schema}}):
        text, reason, _ = chat(client, extra, max_tokens=80)
        assert reason == "stop", text
        jsonschema.validate(json.loads(text), schema)
    short = [{"role": "user", "content": "Reply with a JSON object whose one key, answer, holds "
                                         "the capital of France."}]
    text, reason, _ = chat(client, {"structured_outputs": {"json_object": True}}, max_tokens=80,
                           messages=short)
    assert reason == "stop" and isinstance(json.loads(text), dict), text


def test_guided_grammar_answers_follow_the_client_s_grammar(client):
    grammar = 'root ::= "The answer is " digit digit? "." \ndigit ::= [0-9]'
    for extra in ({"guided_grammar": grammar}, {"structured_outputs": {"grammar": grammar}}):
        text, reason, _ = chat(client, extra)
        assert re.fullmatch(r"The answer is [0-9]{1,2}\.", text), text
        assert reason == "stop"


def test_min_tokens_keeps_the_answer_going_and_ignore_eos_runs_to_the_limit(client):
    free, reason, usage = chat(client, {}, max_tokens=64)
    assert reason == "stop" and usage.completion_tokens < 40, (free, usage)
    least = usage.completion_tokens + 12
    text, _, longer = chat(client, {"min_tokens": least}, max_tokens=64)
    assert longer.completion_tokens >= least, (text, longer)
    assert text.startswith(free), "greedy: the same answer, then more"
    text, reason, forced = chat(client, {"ignore_eos": True}, max_tokens=56)
    assert (forced.completion_tokens, reason) == (56, "length"), text
    # A stop string inside the first `min_tokens` does not end the answer; one after it does.
    stop = free.split()[1]
    text, reason, _ = chat(client, {"min_tokens": least}, max_tokens=64, stop=[stop])
    assert text.startswith(free) and reason == "stop", text
    r = client.completions.create(model="smollm2", prompt=PROMPT, temperature=0, max_tokens=64,
                                  extra_body={"ignore_eos": True}, stream=True)
    pieces = [c.choices[0] for c in r if c.choices]
    assert pieces[-1].finish_reason == "length"


def test_stop_token_ids_end_the_answer_before_the_token(client, server):
    free, _, _ = chat(client, {})
    tokens = post_json(server, "/tokenize", {"model": "smollm2", "prompt": free})["tokens"]
    # A token a few places in: the answer ends just before it, without its text.
    token = tokens[3]
    text, reason, usage = chat(client, {"stop_token_ids": [token]})
    assert reason == "stop"
    assert free.startswith(text) and len(text) < len(free), (text, free)
    before = post_json(server, "/detokenize", {"model": "smollm2", "tokens": tokens[:3]})["prompt"]
    assert text == before, (text, before)
    assert usage.completion_tokens == 4


def test_include_stop_str_in_output_returns_the_stop_string(client):
    r = client.completions.create(model="smollm2", prompt=PROMPT, temperature=0, max_tokens=24,
                                  stop=["Paris"], extra_body={"include_stop_str_in_output": True})
    assert r.choices[0].text.endswith("Paris") and r.choices[0].finish_reason == "stop"
    assert r.choices[0].text.count("Paris") == 1
    streamed = client.completions.create(
        model="smollm2", prompt=PROMPT, temperature=0, max_tokens=24, stop=["Paris"],
        stream=True, extra_body={"include_stop_str_in_output": True})
    assert "".join(c.choices[0].text for c in streamed if c.choices) == r.choices[0].text


def test_skip_special_tokens_false_renders_them(client):
    # `<|im_start|>` (id 1) made the only likely token: rendered only when asked for.
    asked = dict(model="smollm2", prompt=PROMPT, temperature=0, max_tokens=2,
                 logit_bias={"1": 100})
    shown = client.completions.create(extra_body={"skip_special_tokens": False}, **asked)
    assert shown.choices[0].text.startswith("<|im_start|>"), shown.choices[0].text
    hidden = client.completions.create(**asked)
    assert "<|im_start|>" not in hidden.choices[0].text, hidden.choices[0].text


@pytest.mark.parametrize("extra, says", [
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_regex and guided_choice: ask for one"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}},
     "guided_regex: cannot be combined with response_format"),
    ({"guided_choice": []}, "guided_choice: lists no choice"),
    ({"guided_regex": "a(b"}, "guided_regex: not a regular expression"),
    ({"guided_regex": r"\bword"}, "only a leading ^ and a trailing $"),
    ({"guided_regex": "a{5000}"}, "guided_regex: a repetition of more than 1000"),
    ({"guided_grammar": "root ::= missing"}, "guided_grammar: the grammar does not load"),
    ({"guided_grammar": "root ::= " + "(" * 80 + '"a"' + ")" * 80}, "nest 80 deep"),
    ({"guided_json": "{not json"}, "guided_json: not a JSON schema"),
    ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag: not"),
    ({"min_tokens": 50}, "min_tokens: 50 is more than max_tokens (48)"),
    ({"min_tokens": 2, "guided_choice": ["a"]}, "min_tokens: cannot be combined with a format"),
    ({"ignore_eos": True, "guided_regex": "a+"}, "ignore_eos: cannot be combined with a format"),
    ({"stop_token_ids": [10 ** 6]}, "stop_token_ids: token 1000000 is not in this model"),
    ({"stop_token_ids": [-3]}, "stop_token_ids: -3 is not a token id"),
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern: not supported"),
])
def test_what_cannot_be_followed_is_a_400_naming_it(client, extra, says):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            chat(client, extra, stream=stream)
        assert says in str(e.value), e.value
    # The server is up and answers after each.
    assert "Paris" in chat(client, {})[0]


def test_guided_decoding_cannot_be_combined_with_tools(client):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=QUESTION, tools=tools,
                                       extra_body={"guided_choice": ["a"]})
    assert "guided_choice: cannot be combined with tools" in str(e.value)


@pytest.mark.parametrize("extra, field", [
    # A NUL, which no token of the model writes: the format allows nothing from the start.
    ({"guided_regex": "\x00"}, "guided_regex"),
    ({"guided_grammar": 'root ::= "\\x00"'}, "guided_grammar"),
    # Two characters the model can write, then one it cannot.
    ({"guided_choice": ["ab\x00"]}, "guided_choice"),
])
def test_a_format_the_model_cannot_write_ends_the_answer_with_an_error(client, extra, field):
    says = f"{field}: after"
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, extra)
    assert says in str(e.value) and "allows none that this model can write" in str(e.value)
    # Streamed: a plain 400 when nothing could be written, else the text written so far,
    # then the error event.
    with pytest.raises(openai.APIError) as e:
        chunks = client.chat.completions.create(model="smollm2", messages=QUESTION,
                                                max_tokens=8, stream=True, extra_body=extra)
        for _ in chunks:
            pass
    assert says in str(e.value), e.value
    # The engine and the server are up and answer after each.
    assert "Paris" in chat(client, {})[0]
