"""A prompt's own log-probabilities, as evaluation harnesses read them, against the real
SmolLM2-135M-Instruct model: `/v1/completions` with `echo` and `logprobs` (the prompt's tokens
first, the first one's log-probability null), `max_tokens: 0` to read the prompt alone, prompts
as token ids, and vLLM's `prompt_logprobs` on both routes."""
import json
import threading

import openai
import pytest
from conftest import post_json

PROMPT = "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"


def tokenize(server, text):
    return post_json(server, "/tokenize", {"model": "smollm2", "prompt": text})["tokens"]


def close(a, b):
    """Whether two reads of the same tokens' log-probabilities agree. llama.cpp's sums change a
    little with what else shares the batch and the KV cache (a kept prefix, another request),
    by up to a few tenths where a token is unlikely: each read is held to that, and the two to
    a mean difference a read of another position, or of another prompt, would far exceed."""
    differences = [abs(x - y) for x, y in zip(a, b)]
    return len(a) == len(b) and max(differences) < 0.5 and \
        sum(differences) / len(differences) < 0.05


def test_a_prompt_s_logprobs_are_the_ones_the_model_generated_it_with(client, server):
    # Generate greedily, then read the prompt and the answer back as one prompt: each answer
    # token's log-probability, read from the prompt, is the one it was generated with.
    made = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=12,
                                     temperature=0, logprobs=2)
    answer = made.choices[0]
    prompt_ids, whole = tokenize(server, PROMPT), tokenize(server, PROMPT + answer.text)
    assert whole[:len(prompt_ids)] == prompt_ids
    read = client.completions.create(model="smollm2", prompt=whole, max_tokens=0, echo=True,
                                     logprobs=2)
    got = read.choices[0]
    assert got.text == PROMPT + answer.text and got.finish_reason == "length"
    assert read.usage.completion_tokens == 0 and read.usage.prompt_tokens == len(whole)
    lp = got.logprobs
    assert len(lp.tokens) == len(whole) and lp.token_logprobs[0] is None
    assert lp.top_logprobs[0] is None
    assert "".join(lp.tokens) == got.text
    assert lp.tokens[len(prompt_ids):] == answer.logprobs.tokens
    mine, generated = lp.token_logprobs[len(prompt_ids):], answer.logprobs.token_logprobs
    assert close(mine, generated), (mine, generated)
    # Each position's offset is where its token starts in the text.
    for token, offset in zip(lp.tokens, lp.text_offset):
        assert got.text[offset:offset + len(token)] == token
    for position in lp.token_logprobs[1:]:
        assert position <= 0


def test_echo_leads_the_answer_with_the_prompt(client):
    plain = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=8, temperature=0)
    echoed = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=8,
                                       temperature=0, echo=True)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    assert echoed.choices[0].logprobs is None
    alone = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=0, echo=True)
    assert alone.choices[0].text == PROMPT and alone.usage.completion_tokens == 0


def test_prompts_as_token_ids_answer_as_their_text_does(client, server):
    ids = tokenize(server, PROMPT)
    by_text = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=8,
                                        temperature=0)
    for prompt in (ids, [ids]):
        by_ids = client.completions.create(model="smollm2", prompt=prompt, max_tokens=8,
                                           temperature=0)
        assert by_ids.choices[0].text == by_text.choices[0].text
        assert by_ids.usage.prompt_tokens == len(ids)
    echoed = client.completions.create(model="smollm2", prompt=ids, max_tokens=0, echo=True)
    assert echoed.choices[0].text == PROMPT


def test_vllm_prompt_logprobs_rank_each_prompt_token(client, server):
    ids = tokenize(server, PROMPT)
    r = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=1, temperature=0,
                                  extra_body={"prompt_logprobs": 3})
    positions = r.choices[0].model_extra["prompt_logprobs"]
    assert len(positions) == len(ids) and positions[0] is None
    for token, position in zip(ids[1:], positions[1:]):
        assert str(token) in position, "each position holds its own token"
        mine = position[str(token)]
        ranks = sorted(e["rank"] for e in position.values())
        assert len(position) in (3, 4) and ranks[:3] == [1, 2, 3]
        best = max(position.values(), key=lambda e: e["logprob"])
        assert best["rank"] == 1
        assert (mine["rank"] == 1) == (mine["logprob"] == best["logprob"])
    # Chat: once, beside the choices, for the prompt the template rendered.
    messages = [{"role": "user", "content": "Name three colours."}]
    chat = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=1,
                                          extra_body={"prompt_logprobs": 0})
    rendered = post_json(server, "/tokenize", {"model": "smollm2", "messages": messages})["tokens"]
    positions = chat.model_extra["prompt_logprobs"]
    assert len(positions) == len(rendered) == chat.usage.prompt_tokens
    assert all(list(p) == [str(t)] for t, p in zip(rendered[1:], positions[1:]))


def test_long_prompts_read_at_once_each_give_their_own_logprobs(client, server):
    # Longer than one step reads of a prompt, several at once and beside a generation.
    prompts = [f"Item {i}: " + "colour and shape " * (40 + 7 * i) for i in range(4)]
    alone = [client.completions.create(model="smollm2", prompt=p, max_tokens=0, echo=True,
                                       logprobs=0).choices[0].logprobs.token_logprobs
             for p in prompts]
    together = [None] * len(prompts)

    def read(i):
        together[i] = client.completions.create(
            model="smollm2", prompt=prompts[i], max_tokens=0, echo=True,
            logprobs=0).choices[0].logprobs.token_logprobs

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(prompts))]
    threads.append(threading.Thread(target=lambda: client.completions.create(
        model="smollm2", prompt=PROMPT, max_tokens=24, temperature=0)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (a, b) in enumerate(zip(alone, together)):
        assert len(a) == len(b) == len(tokenize(server, prompts[i])) > 100
        assert close(a[1:], b[1:]), (i, a, b)


@pytest.mark.parametrize("asked, says", [
    (dict(max_tokens=0), "max_tokens: must be at least 1"),
    (dict(extra_body={"prompt_logprobs": 1}, stream=True), "prompt_logprobs: not with stream"),
    (dict(extra_body={"prompt_logprobs": 21}), "prompt_logprobs: 21 is not a count from 0 to 20"),
    (dict(prompt=[1, 2, 10 ** 7]), "prompt: token 10000000 is not in this model's vocabulary"),
    (dict(prompt=[]), "prompt: the list of prompts is empty"),
    (dict(prompt=[[1, 2], []]), "prompt: a token list is empty"),
    (dict(prompt=["a", [1]]), "prompt: a text, a list of texts, a list of token ids"),
])
def test_what_cannot_be_read_is_a_400_naming_it(client, asked, says):
    asked = {"model": "smollm2", "prompt": PROMPT, "max_tokens": 4, **asked}
    with pytest.raises(openai.BadRequestError) as e:
        r = client.completions.create(**asked)
        if asked.get("stream"):
            list(r)
    assert says in str(e.value), e.value
