"""TEI's `/embed_all` and gRPC `EmbedAll`: each input's token states, unpooled, from the real
all-MiniLM-L6-v2 served by the real `sheaf` binary. Every state is checked against Python's
onnxruntime running the same model file on the text alone, and the pooled vectors of requests
batched beside them stay equal to theirs."""
import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import onnxruntime
import pytest
from tokenizers import Tokenizer

from conftest import ENCODER, ROOT
from test_embeddings import (SENTENCES, assert_matches, channel, post,  # noqa: F401 - fixtures
                             reference)


@pytest.fixture(scope="module")
def states():
    """The encoder's token states of a text run alone: `[tokens, 384]`."""
    tokenizer = Tokenizer.from_file(str(ROOT / ENCODER / "tokenizer.json"))
    tokenizer.no_padding()
    session = onnxruntime.InferenceSession(str(ROOT / ENCODER / "1" / "model.onnx"))

    def run(text, truncate=None, direction="right"):
        if truncate:
            tokenizer.enable_truncation(truncate, direction=direction)
        else:
            tokenizer.no_truncation()
        x = np.array([tokenizer.encode(text).ids], dtype=np.int64)
        return session.run(None, {"input_ids": x, "attention_mask": np.ones_like(x),
                                  "token_type_ids": np.zeros_like(x)})[0][0]

    return run


def assert_states(got, want, what):
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == want.shape, f"{what}: {got.shape} against {want.shape}"
    assert np.allclose(got, want, atol=1e-4), f"{what}: {np.abs(got - want).max()}"


def executions(server):
    stats = json.loads(urllib.request.urlopen(
        f"http://{server.http}/v2/models/minilm/stats").read())["model_stats"][0]
    return int(stats["execution_count"])


def test_each_text_s_token_states_equal_the_reference_in_one_padded_batch(server, states):
    texts = SENTENCES[:12] + ["Hello, world!", "東京は大きい"]
    before = executions(server)
    status, answer = post(server, "/embed_all", {"inputs": texts})
    assert status == 200, answer
    assert len(answer) == len(texts)
    for text, got in zip(texts, answer):
        # Texts of many lengths shared batches padded to their longest: each keeps its own
        # tokens' states, special tokens included, and none of the padding's.
        assert_states(got, states(text), text[:40])
    assert 0 < executions(server) - before < len(texts), "the texts were batched together"
    # One text as a string; the encoder may be named.
    status, answer = post(server, "/embed_all", {"inputs": "Hello, world!", "model": "minilm"})
    assert status == 200, answer
    assert len(answer) == 1
    assert_states(answer[0], states("Hello, world!"), "one string")


def test_token_states_and_pooled_vectors_asked_at_once_each_get_their_own(server, states,
                                                                         reference):
    """Requests for vectors and for token states share batches; each reads only its output."""
    texts = SENTENCES[20:44]

    def one(i):
        text = texts[i % len(texts)]
        if i % 2:
            status, answer = post(server, "/embed_all", {"inputs": [text]})
            assert status == 200, answer
            assert_states(answer[0], states(text), f"states {i}")
        else:
            status, answer = post(server, "/embed", {"inputs": [text]})
            assert status == 200, answer
            assert_matches(answer[0], reference(text)[0], f"vector {i}")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(96)))


def test_truncation_and_prompts_apply_as_on_embed(server, states):
    long = " ".join(SENTENCES[40:46] * 4)
    status, answer = post(server, "/embed_all", {"inputs": long})
    assert status == 413 and answer["error_type"] == "Validation", answer
    assert "256" in answer["error"], answer
    # The refusal counts the whole text's tokens, as the model's own tokenizer does.
    whole = Tokenizer.from_file(str(ROOT / ENCODER / "tokenizer.json"))
    whole.no_truncation()
    assert f"has {len(whole.encode(long).ids)} tokens" in answer["error"], answer
    status, answer = post(server, "/embed_all", {"inputs": long, "truncate": True})
    assert status == 200, answer
    assert_states(answer[0], states(long, truncate=256), "truncated")
    assert len(answer[0]) == 256
    status, answer = post(server, "/embed_all", {"inputs": long, "truncate": True,
                                                 "truncation_direction": "Left"})
    assert status == 200, answer
    assert_states(answer[0], states(long, truncate=256, direction="left"), "truncated on the left")


@pytest.mark.parametrize("body, status, names", [
    ({"inputs": []}, 413, "empty list"),
    ({"inputs": "a", "normalize": True}, 422, "normalize"),
    ({"inputs": "a", "dimensions": 8}, 422, "dimensions"),
    ({"inputs": "a", "truncation_direction": "middle"}, 413, "truncation_direction"),
    ({"inputs": "a", "prompt_name": "query"}, 413, "no prompts"),
    ({"inputs": "a", "model": "mlp"}, 413, "not an embedding model"),
    ({"inputs": "a", "model": "nope"}, 404, "nope"),
    # 50 texts of 443 tokens cut at 256: 12,800 tokens' states, 19 MiB of FP32.
    ({"inputs": [" ".join(SENTENCES[40:46])] * 50, "truncate": True}, 413,
     "the states of at most 10922 fit one answer (16 MiB"),
])
def test_bad_embed_all_requests_are_refused_by_name(server, body, status, names):
    got, answer = post(server, "/embed_all", body)
    assert got == status, answer
    assert names in answer["error"], answer


def test_grpc_embed_all_and_its_stream_answer_each_text_s_states(tei, channel, states):
    pb, rpc = tei
    embed = rpc.EmbedStub(channel)
    text = SENTENCES[7]
    answer = embed.EmbedAll(pb.EmbedAllRequest(inputs=text))
    want = states(text)
    assert_states([list(t.embeddings) for t in answer.token_embeddings], want, "EmbedAll")
    m = answer.metadata
    assert m.compute_tokens == len(want) and m.compute_chars == len(text), m
    assert 0 < m.inference_time_ns <= m.total_time_ns, m
    texts = SENTENCES[:20]
    answers = list(embed.EmbedAllStream(iter([pb.EmbedAllRequest(inputs=t) for t in texts])))
    assert len(answers) == len(texts)
    for t, a in zip(texts, answers):
        assert_states([list(e.embeddings) for e in a.token_embeddings], states(t), t[:40])
    cases = [
        (pb.EmbedAllRequest(inputs=""), grpc.StatusCode.INVALID_ARGUMENT, "empty string"),
        (pb.EmbedAllRequest(inputs=" ".join(SENTENCES[40:46] * 4)),
         grpc.StatusCode.INVALID_ARGUMENT, "256"),
        (pb.EmbedAllRequest(inputs="a", truncation_direction=7),
         grpc.StatusCode.INVALID_ARGUMENT, "neither RIGHT (0) nor LEFT (1)"),
    ]
    for message, code, names in cases:
        with pytest.raises(grpc.RpcError) as e:
            embed.EmbedAll(message)
        assert e.value.code() == code and names in e.value.details(), e.value.details()
