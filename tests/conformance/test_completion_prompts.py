"""Several prompts in one `/v1/completions` request, as OpenAI's API and vLLM take them and as
evaluation harnesses send them (lm-evaluation-harness batches its loglikelihood requests so),
against the real SmolLM2-135M-Instruct model: each prompt gets its own choices, in order, each
as it would alone."""
import openai
import pytest
from conftest import post_json

PROMPTS = ["The capital of France is", "The capital of Italy is", "One, two, three,"]


def alone(client, prompt, **asked):
    asked = {"temperature": 0, "max_tokens": 6, **asked}
    r = client.completions.create(model="smollm2", prompt=prompt, **asked)
    return r.choices[0], r.usage


def test_each_prompt_gets_its_own_choices_in_order(client):
    singles = [alone(client, p) for p in PROMPTS]
    r = client.completions.create(model="smollm2", prompt=PROMPTS, temperature=0, max_tokens=6,
                                  n=2)
    assert [c.index for c in r.choices] == list(range(6))
    for i, (single, _) in enumerate(singles):
        for c in r.choices[2 * i:2 * i + 2]:
            assert (c.text, c.finish_reason) == (single.text, single.finish_reason), (i, c)
    # Each prompt is counted once, each choice's tokens add up.
    assert r.usage.prompt_tokens == sum(u.prompt_tokens for _, u in singles)
    assert r.usage.completion_tokens == 2 * sum(u.completion_tokens for _, u in singles)
    assert len({c.text for c in r.choices}) == 3


def test_token_id_prompts_stream_with_their_indexes(client, server):
    ids = [post_json(server, "/tokenize", {"model": "smollm2", "prompt": p})["tokens"]
           for p in PROMPTS]
    chunks = list(client.completions.create(model="smollm2", prompt=ids, temperature=0,
                                            max_tokens=6, stream=True, echo=True,
                                            stream_options={"include_usage": True}))
    texts, reasons = ["", "", ""], [None] * 3
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] += c.text
            reasons[c.index] = c.finish_reason or reasons[c.index]
    for i, p in enumerate(PROMPTS):
        assert texts[i] == p + alone(client, p)[0].text, (i, texts[i])
    assert reasons == ["length"] * 3
    assert chunks[-1].usage.prompt_tokens == sum(len(t) for t in ids)


def test_a_batch_of_prompts_reads_each_prompt_s_logprobs(client):
    # lm-evaluation-harness's loglikelihood batch: token-id prompts, echo, logprobs, nothing
    # generated; each prompt's log-probabilities are the ones it gets alone.
    texts = [p + " Paris." for p in PROMPTS]
    batch = client.completions.create(model="smollm2", prompt=texts, max_tokens=0, echo=True,
                                      logprobs=1, temperature=0)
    for text, got in zip(texts, batch.choices):
        single = alone(client, text, max_tokens=0, echo=True, logprobs=1)[0]
        assert got.text == text
        assert got.logprobs.tokens == single.logprobs.tokens
        mine, its = got.logprobs.token_logprobs, single.logprobs.token_logprobs
        assert mine[0] is None and its[0] is None
        assert max(abs(a - b) for a, b in zip(mine[1:], its[1:])) < 0.5, (mine, its)
    # The last token, " Paris.", is likelier after France than after Italy.
    france, italy = (c.logprobs.token_logprobs for c in batch.choices[:2])
    assert sum(france[-2:]) > sum(italy[-2:])


def test_too_many_prompts_are_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smollm2", prompt=["x"] * 257, max_tokens=1)
    assert "257 prompts; at most 256 in one request" in str(e.value)


@pytest.mark.parametrize("prompt", ["Hi", ["Hi", "Ho"]])
def test_more_choices_than_the_engine_runs_are_a_400_before_anything_is_made(client, prompt):
    # Ten million choices would be ten million channels and buffers if made before the check.
    for n in (10 ** 7, 2 ** 40):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="smollm2", prompt=prompt, max_tokens=1, n=n)
        assert f"n: {n} choices; this model runs 1 to" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=1, n=10 ** 7, stream=True)
    assert "choices; this model runs 1 to" in str(e.value)
    assert client.completions.create(model="smollm2", prompt=prompt, max_tokens=1).choices
