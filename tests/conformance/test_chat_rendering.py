"""How a prompt is rendered, and which stop ended an answer, as vLLM's clients ask and read them,
against the real SmolLM2-135M-Instruct model (and the MiniLM text encoder for `/tokenize`):
`continue_final_message` (an assistant reply begun by the client), `add_generation_prompt`,
`add_special_tokens`, `echo` on chat and streamed, `return_token_strs`, and `stop_reason`."""
import json
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest
from conftest import post_json

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# The greedy answer to QUESTION, cut where a client begins it.
BEGUN = "The capital of France is"
# The assistant's turn as SmolLM2's template opens it: `<|im_start|>assistant\n`.
OPENING = [1, 520, 9531, 198]


def chat(client, extra=None, messages=QUESTION, stream=False, **asked):
    asked = {"model": "smollm2", "messages": messages, "temperature": 0, "max_tokens": 32,
             **asked}
    if not stream:
        r = client.chat.completions.create(extra_body=extra or {}, **asked)
        return r.choices[0]
    return list(client.chat.completions.create(extra_body=extra or {}, stream=True, **asked))


def streamed_text(chunks):
    return "".join(c.delta.content or "" for chunk in chunks for c in chunk.choices)


def tokenize(server, **body):
    return post_json(server, "/tokenize", {"model": "smollm2", **body})


def refused(server, route, body):
    """The status and error message of a request that must fail."""
    request = urllib.request.Request(f"http://{server.http}{route}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=120)
    return e.value.code, json.load(e.value)["error"]["message"]


def test_a_begun_reply_is_continued_not_answered_anew(client):
    free = chat(client).message.content
    assert free.startswith(BEGUN + " "), free
    begun = QUESTION + [{"role": "assistant", "content": BEGUN}]
    for extra in ({"continue_final_message": True},
                  {"continue_final_message": True, "add_generation_prompt": False}):
        rest = chat(client, extra, messages=begun).message.content
        # The model writes the rest of its own greedy answer, not a new reply after it.
        assert BEGUN + rest == free, (extra, rest)
    # Without it, the final message is closed and a new turn answers after it.
    anew = chat(client, messages=begun).message.content
    assert not anew.startswith(" "), anew
    assert BEGUN + anew != free


def test_echo_leads_the_answer_with_the_begun_reply_streamed_or_not(client):
    free = chat(client).message.content
    begun = QUESTION + [{"role": "assistant", "content": BEGUN}]
    extra = {"continue_final_message": True, "echo": True}
    assert chat(client, extra, messages=begun).message.content == free
    chunks = chat(client, extra, messages=begun, stream=True)
    assert chunks[0].choices[0].delta.content == BEGUN
    assert streamed_text(chunks) == free
    # Only an assistant's final message is echoed: a user's is the prompt, not the answer.
    plain = chat(client, {"echo": True}).message.content
    assert plain == free, plain
    two = client.chat.completions.create(model="smollm2", messages=begun, temperature=0,
                                         max_tokens=32, n=2, extra_body=extra)
    assert [c.message.content for c in two.choices] == [free, free]


def test_tokenize_renders_a_chat_as_generation_would(server):
    begun = QUESTION + [{"role": "assistant", "content": BEGUN}]
    opened = tokenize(server, messages=QUESTION)["tokens"]
    closed = tokenize(server, messages=QUESTION, add_generation_prompt=False)["tokens"]
    assert opened == closed + OPENING
    begun_closed = tokenize(server, messages=begun, add_generation_prompt=False)["tokens"]
    continued = tokenize(server, messages=begun, continue_final_message=True,
                         add_generation_prompt=False)
    # The reply is left open: its end-of-turn tokens `<|im_end|>\n` are gone, nothing else.
    assert continued["tokens"] == begun_closed[:-2]
    assert begun_closed[-2:] == [2, 198]
    assert continued["tokens"][:len(opened)] == opened
    assert continued["count"] == len(continued["tokens"])


def test_tokenize_returns_each_token_s_text(server):
    answer = tokenize(server, prompt="The capital of France is Paris.", return_token_strs=True)
    strs = answer["token_strs"]
    assert len(strs) == answer["count"] == len(answer["tokens"])
    assert "".join(strs) == "The capital of France is Paris."
    assert strs[1] == " capital"
    chat = tokenize(server, messages=QUESTION, return_token_strs=True)
    assert chat["token_strs"][0] == "<|im_start|>"
    text = post_json(server, "/detokenize", {"model": "smollm2", "tokens": chat["tokens"]})
    assert "".join(chat["token_strs"]) == text["prompt"]
    assert "token_strs" not in tokenize(server, prompt="x")


def test_add_special_tokens_adds_what_the_tokenizer_adds(server):
    body = {"model": "minilm", "prompt": "Paris"}
    plain = post_json(server, "/tokenize", {**body, "return_token_strs": True})
    assert plain["token_strs"][0] == "[CLS]" and plain["token_strs"][-1] == "[SEP]"
    bare = post_json(server, "/tokenize", {**body, "add_special_tokens": False})
    assert bare["tokens"] == plain["tokens"][1:-1]
    # SmolLM2's tokenizer adds no start token to a text, and a chat's template writes its own,
    # so the field changes neither (as under vLLM).
    text = tokenize(server, prompt="Paris")["tokens"]
    assert tokenize(server, prompt="Paris", add_special_tokens=True)["tokens"] == text
    assert tokenize(server, prompt="Paris", add_special_tokens=False)["tokens"] == text


def test_stop_reason_names_the_stop_that_ended_each_choice(client, server):
    by_string = chat(client, {"stop": ["xyz", "France"]})
    assert (by_string.message.content, by_string.finish_reason) == ("The capital of ", "stop")
    assert by_string.model_extra["stop_reason"] == "France"
    paris = tokenize(server, prompt=" Paris")["tokens"]
    assert len(paris) == 1
    by_token = client.completions.create(model="smollm2", prompt=BEGUN, temperature=0,
                                         max_tokens=8, extra_body={"stop_token_ids": paris})
    assert by_token.choices[0].text == ""
    assert by_token.choices[0].model_extra["stop_reason"] == paris[0]
    # The end of the turn, and a length, name no stop.
    ended = chat(client)
    assert ended.finish_reason == "stop" and ended.model_extra["stop_reason"] is None
    cut = chat(client, max_tokens=3)
    assert cut.finish_reason == "length" and cut.model_extra["stop_reason"] is None
    # Streamed, the choice's last chunk carries it.
    chunks = chat(client, stream=True, stop=["Paris"])
    last = [c for chunk in chunks for c in chunk.choices if c.finish_reason][-1]
    assert last.finish_reason == "stop" and last.model_extra["stop_reason"] == "Paris"


def test_a_completion_s_echo_streams_the_prompt_first(client):
    whole = client.completions.create(model="smollm2", prompt=BEGUN, temperature=0, max_tokens=6,
                                      echo=True)
    chunks = list(client.completions.create(model="smollm2", prompt=BEGUN, temperature=0,
                                            max_tokens=6, echo=True, stream=True))
    assert chunks[0].choices[0].text == BEGUN
    assert "".join(c.text for chunk in chunks for c in chunk.choices) == whole.choices[0].text
    only = list(client.completions.create(model="smollm2", prompt=BEGUN, max_tokens=0, echo=True,
                                          stream=True))
    texts = [c.text for chunk in only for c in chunk.choices]
    assert texts[0] == BEGUN and "".join(texts) == BEGUN
    assert [c.finish_reason for chunk in only for c in chunk.choices][-1] == "length"


def test_an_echoed_prompt_streams_with_its_log_probabilities(client):
    """Streamed, the echoed prompt's chunk carries its tokens' log-probabilities, and the
    chunks' columns joined are the whole answer's: the same tokens, numbers and offsets."""
    asked = dict(model="smollm2", prompt=[BEGUN, "The sky is"], temperature=0, max_tokens=5,
                 echo=True, logprobs=2, n=2)
    whole = client.completions.create(**asked)
    chunks = list(client.completions.create(**asked, stream=True))
    for index, answer in enumerate(whole.choices):
        mine = [c for chunk in chunks for c in chunk.choices if c.index == index]
        prompt = BEGUN if index < 2 else "The sky is"
        assert mine[0].text == prompt and mine[0].logprobs.token_logprobs[0] is None
        assert len(mine[0].logprobs.tokens) > 2
        assert "".join(c.text for c in mine) == answer.text
        joined = {k: [] for k in ("tokens", "token_logprobs", "text_offset", "top_logprobs")}
        for c in mine:
            for k in joined:
                joined[k] += getattr(c.logprobs, k) if c.logprobs else []
        assert joined["tokens"] == answer.logprobs.tokens
        assert joined["text_offset"] == answer.logprobs.text_offset
        assert joined["token_logprobs"][0] is None
        np.testing.assert_allclose(joined["token_logprobs"][1:],
                                   answer.logprobs.token_logprobs[1:], atol=1e-3)
        assert [len(t or {}) for t in joined["top_logprobs"]] == \
            [len(t or {}) for t in answer.logprobs.top_logprobs]


@pytest.mark.parametrize("route, body, says", [
    ("/v1/chat/completions", {"messages": QUESTION + [{"role": "assistant", "content": "Hi"}],
                              "continue_final_message": True, "add_generation_prompt": True},
     "set add_generation_prompt: false"),
    ("/v1/chat/completions", {"messages": QUESTION + [{"role": "assistant", "content": " "}],
                              "continue_final_message": True}, "the final message is empty"),
    ("/v1/completions", {"prompt": "Hi", "continue_final_message": True},
     "continue_final_message: a chat's field"),
    ("/v1/completions", {"prompt": "Hi", "add_generation_prompt": False},
     "add_generation_prompt: a chat's field"),
    ("/v1/completions", {"prompt": "Hi", "prompt_logprobs": 1, "stream": True},
     "prompt_logprobs: not with stream: true"),
    ("/tokenize", {"prompt": "Hi", "continue_final_message": True},
     "continue_final_message: a chat's field"),
    ("/tokenize", {"messages": QUESTION, "return_token_strs": "yes"}, "return_token_strs"),
])
def test_rendering_that_cannot_be_done_is_a_400_naming_it(server, client, route, body, says):
    status, message = refused(server, route, {"model": "smollm2", **body})
    assert status == 400 and says in message, message
    assert chat(client, max_tokens=2).finish_reason == "length"
