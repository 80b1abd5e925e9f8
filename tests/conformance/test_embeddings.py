"""Text embeddings with the real all-MiniLM-L6-v2 encoder, through the unmodified `openai` package
(`/v1/embeddings`) and TEI's `/embed`. Every vector is checked against a reference computed here
with Python's onnxruntime and HF `tokenizers` on the same files, each text run alone."""
import base64
import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime
import openai
import pytest
from tokenizers import Tokenizer

from conftest import ENCODER, ROOT, link_encoder, link_gguf, start

WORDS = ("the river carries light across a valley where old stones remember rain and every "
         "morning a quiet bell counts the hours for travellers who never stop to listen").split()
# 50 sentences from 1 to 120 words, of every length in between, some with punctuation and
# other scripts.
SENTENCES = [" ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(1 + (i * 37) % 120))
             for i in range(46)] + ["Hello, world!", "Größe und Übermaß.", "東京は大きい", "?"]
MAX_TOKENS = 256
# Longer than the model takes, and unlike at its two ends: English words, then German ones.
TWO_ENDS = " ".join(WORDS * 5) + " " + " ".join(["Größe und Übermaß im Wald."] * 40)


@pytest.fixture(scope="module")
def reference():
    tokenizer = Tokenizer.from_file(str(ROOT / ENCODER / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    session = onnxruntime.InferenceSession(str(ROOT / ENCODER / "1" / "model.onnx"))

    def embed(text, normalize=True, truncate=False, direction="right", at=MAX_TOKENS):
        if truncate:
            tokenizer.enable_truncation(at, direction=direction)
        ids = tokenizer.encode(text).ids
        tokenizer.no_truncation()
        return by_ids(ids, normalize), len(ids)

    def by_ids(ids, normalize=True):
        x = np.array([ids], dtype=np.int64)
        hidden = session.run(None, {"input_ids": x, "attention_mask": np.ones_like(x),
                                    "token_type_ids": np.zeros_like(x)})[0]
        v = hidden[0].mean(axis=0)
        return v / np.linalg.norm(v) if normalize else v

    embed.by_ids = by_ids
    return embed


def post(server, path, body):
    request = urllib.request.Request(f"http://{server.http}{path}", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def cosine(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def assert_matches(got, want, what):
    assert len(got) == 384, what
    assert cosine(got, want) > 1 - 1e-4, f"{what}: cosine {cosine(got, want)}"
    assert np.allclose(got, want, atol=1e-4), what


def test_the_encoder_is_listed(client):
    assert "minilm" in [m.id for m in client.models.list()]


def test_one_by_one_and_as_one_batch_equal_the_reference(client, reference, server):
    want = [reference(s) for s in SENTENCES]
    for s, (v, n) in zip(SENTENCES, want):
        r = client.embeddings.create(model="minilm", input=s, encoding_format="float")
        assert_matches(r.data[0].embedding, v, f"alone: {s[:40]}")
        assert r.usage.prompt_tokens == n
        assert r.usage.total_tokens == n
        assert r.model == "minilm"
    # The client asks for base64 by default and decodes it.
    r = client.embeddings.create(model="minilm", input=SENTENCES)
    assert [d.index for d in r.data] == list(range(len(SENTENCES)))
    for s, d, (v, _) in zip(SENTENCES, r.data, want):
        assert_matches(d.embedding, v, f"in the batch: {s[:40]}")
        assert abs(np.linalg.norm(d.embedding) - 1) < 1e-5
    assert r.usage.prompt_tokens == sum(n for _, n in want)
    # The texts of one request were batched together, padded to their bucket's longest.
    stats = json.loads(urllib.request.urlopen(f"http://{server.http}/v2/models/minilm/stats").read())
    sizes = [b["batch_size"] for b in stats["model_stats"][0]["batch_stats"]]
    assert max(sizes) > 1, sizes


def test_concurrent_clients_get_their_own_vectors(client, reference):
    def one(s):
        return s, client.embeddings.create(model="minilm", input=s, encoding_format="float")

    with ThreadPoolExecutor(16) as pool:
        for s, r in pool.map(one, SENTENCES * 2):
            assert_matches(r.data[0].embedding, reference(s)[0], f"concurrent: {s[:40]}")


def test_base64_is_little_endian_float32(server, reference):
    status, body = post(server, "/v1/embeddings",
                        {"model": "minilm", "input": ["Hello, world!"], "encoding_format": "base64"})
    assert status == 200, body
    v = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    assert_matches(v, reference("Hello, world!")[0], "base64")


def test_token_ids_are_embedded_as_given(client, reference):
    tokenizer = Tokenizer.from_file(str(ROOT / ENCODER / "tokenizer.json"))
    tokenizer.no_padding()
    ids = tokenizer.encode("Hello, world!").ids
    r = client.embeddings.create(model="minilm", input=[ids, ids], encoding_format="float")
    for d in r.data:
        assert_matches(d.embedding, reference("Hello, world!")[0], "token ids")


def test_tei_embed_normalize_and_truncate(server, reference):
    status, body = post(server, "/embed", {"inputs": SENTENCES[:5]})
    assert status == 200, body
    for s, v in zip(SENTENCES[:5], body):
        assert_matches(v, reference(s)[0], f"/embed: {s[:40]}")
    status, body = post(server, "/embed", {"inputs": "Hello, world!", "normalize": False})
    assert status == 200, body
    raw = reference("Hello, world!", normalize=False)[0]
    assert abs(np.linalg.norm(body[0]) - np.linalg.norm(raw)) < 1e-3 * np.linalg.norm(raw)
    assert_matches(body[0], raw, "not normalised")
    long = " ".join(WORDS * 10)
    status, body = post(server, "/embed", {"inputs": long})
    assert status == 413, body
    assert body["error_type"] == "Validation"
    assert "tokens" in body["error"] and str(MAX_TOKENS) in body["error"], body
    status, body = post(server, "/embed", {"inputs": [long], "truncate": True})
    assert status == 200, body
    assert_matches(body[0], reference(long, truncate=True)[0], "truncated")
    # TEI's truncation_direction: Left cuts a long text's start and keeps its end.
    right, left = (reference(TWO_ENDS, truncate=True, direction=d)[0] for d in ("right", "left"))
    assert cosine(right, left) < 0.9, "the text's two ends read alike"
    for direction, want in (("Right", right), ("Left", left), ("left", left)):
        status, body = post(server, "/embed", {"inputs": [TWO_ENDS], "truncate": True,
                                               "truncation_direction": direction})
        assert status == 200, body
        assert_matches(body[0], want, f"truncated, {direction}")
    # Token ids are cut as they are: the first 256, or the last.
    ids = list(range(1000, 1300))
    for direction, kept in (("Right", ids[:MAX_TOKENS]), ("Left", ids[-MAX_TOKENS:])):
        status, body = post(server, "/embed", {"inputs": [ids], "truncate": True,
                                               "truncation_direction": direction})
        assert status == 200, body
        assert_matches(body[0], reference.by_ids(kept), f"token ids truncated, {direction}")
    status, body = post(server, "/embed", {"inputs": ""})
    assert (status, body["error_type"]) == (413, "Validation"), body
    assert "empty string" in body["error"], body


def test_hugging_face_s_client_embeds_through_the_server_s_address(server, reference):
    # `InferenceClient(model=URL)` posts feature extraction to the URL itself, as it does to a
    # TEI deployment (and so do the LangChain and LlamaIndex classes built on it).
    from huggingface_hub import InferenceClient
    client = InferenceClient(model=f"http://{server.http}")
    vectors = client.feature_extraction(SENTENCES[:3])
    assert vectors.shape == (3, 384)
    for s, v in zip(SENTENCES[:3], vectors):
        assert_matches(v, reference(s)[0], f"POST /: {s[:40]}")
    one = client.feature_extraction("Hello, world!", normalize=False)
    assert_matches(one[0], reference("Hello, world!", normalize=False)[0], "not normalised")
    long = " ".join(WORDS * 10)
    assert_matches(client.feature_extraction(long, truncate=True)[0],
                   reference(long, truncate=True)[0], "truncated")
    # TEI's error, as at /embed; the dashboard stays at GET /.
    status, body = post(server, "/", {"inputs": long})
    assert (status, body["error_type"]) == (413, "Validation"), body
    with urllib.request.urlopen(f"http://{server.http}/") as r:
        assert r.status == 200 and b"<html" in r.read().lower()


def test_sentence_similarity_compares_a_source_with_each_sentence(server, reference):
    from huggingface_hub import InferenceClient
    source, others = SENTENCES[0], SENTENCES[1:4] + ["Hello, world!"]
    want = [cosine(reference(source)[0], reference(s)[0]) for s in others]
    # Hugging Face's client, at the server's address as at TEI's.
    client = InferenceClient(model=f"http://{server.http}")
    got = client.sentence_similarity(source, other_sentences=others)
    assert np.allclose(got, want, atol=1e-4), (got, want)
    # TEI's own route, with its parameters.
    status, body = post(server, "/similarity", {
        "inputs": {"source_sentence": source, "sentences": others},
        "parameters": {"truncate": False, "truncation_direction": "Right"}})
    assert status == 200 and np.allclose(body, want, atol=1e-4), body
    long = " ".join(WORDS * 10)
    status, body = post(server, "/similarity", {
        "inputs": {"source_sentence": long, "sentences": [long, source]}, "model": "minilm",
        "parameters": {"truncate": True}})
    assert status == 200, body
    truncated = reference(long, truncate=True)[0]
    assert body[0] == pytest.approx(1.0, abs=1e-4)
    assert body[1] == pytest.approx(cosine(truncated, reference(source)[0]), abs=1e-4)
    status, body = post(server, "/similarity", {
        "inputs": {"source_sentence": source, "sentences": [TWO_ENDS]},
        "parameters": {"truncate": True, "truncation_direction": "Left"}})
    assert status == 200, body
    left = reference(TWO_ENDS, truncate=True, direction="left")[0]
    assert body[0] == pytest.approx(cosine(left, reference(source)[0]), abs=1e-4)


@pytest.mark.parametrize("body, status, names", [
    ({"inputs": {"source_sentence": "a", "sentences": []}}, 413, "`inputs.sentences` is an empty"),
    ({"inputs": {"source_sentence": "", "sentences": ["a"]}}, 413, "source_sentence"),
    ({"inputs": {"source_sentence": "a", "sentences": ["b", ""]}}, 413, "`inputs.sentences`[1]"),
    ({"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": {"truncate": 1}},
     422, "truncate"),
    ({"inputs": {"source_sentence": "a"}}, 422, "sentences"),
    ({"inputs": {"source_sentence": "a", "sentences": ["b"]}, "extra": 1}, 422, "extra"),
    ({"inputs": {"source_sentence": "a", "sentences": ["b"]}, "model": "mlp"}, 413,
     "not an embedding model"),
    ({"inputs": {"source_sentence": " ".join(WORDS * 10), "sentences": ["b"]}}, 413, "at most 256"),
])
@pytest.mark.parametrize("path", ["/similarity", "/"])
def test_bad_similarity_requests_are_refused_by_name(server, path, body, status, names):
    got, answer = post(server, path, body)
    assert got == status and answer["error_type"] == "Validation", answer
    assert names in answer["error"], answer


@pytest.mark.parametrize("body, names", [
    ({"model": "minilm", "input": "a", "dimensions": 100}, "dimensions"),
    ({"model": "minilm", "input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"model": "minilm", "input": "a", "truncate": True}, "truncate"),
    ({"model": "minilm", "input": []}, "input"),
    ({"model": "minilm", "input": ""}, "`input` is an empty string"),
    ({"model": "minilm", "input": ["a", ""]}, "`input`[1] is an empty string"),
    ({"model": "minilm", "input": [[1, 2], "a"]}, "input"),
    ({"model": "minilm", "input": [99999999]}, "vocabulary"),
    ({"model": "minilm", "input": " ".join(WORDS * 10)}, "at most 256"),
    ({"model": "mlp", "input": "a"}, "not an embedding model"),
])
def test_bad_requests_are_refused_by_name(server, body, names):
    status, answer = post(server, "/v1/embeddings", body)
    assert status == 400, answer
    assert names in answer["error"]["message"], answer


def test_an_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="a")


def test_vllm_s_truncate_prompt_tokens_keeps_each_text_s_last_tokens(server, reference):
    # k keeps the last k tokens, special tokens included, as vLLM does (its truncation_side
    # defaults to left); -1 cuts at the model's longest input; a text shorter than k is whole.
    for k, texts in ((20, [TWO_ENDS, "Hello, world!"]), (3, [TWO_ENDS])):
        status, body = post(server, "/v1/embeddings", {"model": "minilm", "input": texts,
                                                       "truncate_prompt_tokens": k})
        assert status == 200, body
        want = [reference(t, truncate=True, direction="left", at=k) for t in texts]
        for d, (vector, _) in zip(body["data"], want):
            assert_matches(d["embedding"], vector, f"truncate_prompt_tokens {k}")
        assert body["usage"]["prompt_tokens"] == sum(n for _, n in want), body
    assert reference("Hello, world!", truncate=True, direction="left", at=20)[1] < 20
    for side, extra in (("left", {}), ("left", {"truncation_side": "left"}),
                        ("right", {"truncation_side": "right"})):
        status, body = post(server, "/v1/embeddings", {"model": "minilm", "input": TWO_ENDS,
                                                       "truncate_prompt_tokens": -1, **extra})
        assert status == 200, body
        assert_matches(body["data"][0]["embedding"],
                       reference(TWO_ENDS, truncate=True, direction=side)[0], f"-1, {extra}")
    status, body = post(server, "/v1/embeddings", {"model": "minilm", "input": TWO_ENDS,
                                                   "truncate_prompt_tokens": 20,
                                                   "truncation_side": "right"})
    assert status == 200, body
    assert_matches(body["data"][0]["embedding"],
                   reference(TWO_ENDS, truncate=True, at=20)[0], "20, right")
    # Token ids are cut as they are.
    ids = list(range(1000, 1300))
    status, body = post(server, "/v1/embeddings", {"model": "minilm", "input": ids,
                                                   "truncate_prompt_tokens": 10})
    assert status == 200, body
    assert_matches(body["data"][0]["embedding"], reference.by_ids(ids[-10:]), "token ids")
    # The scoring routes read it alike.
    status, body = post(server, "/score", {"model": "minilm", "text_1": SENTENCES[5],
                                           "text_2": TWO_ENDS, "truncate_prompt_tokens": 30})
    assert status == 200, body
    want = cosine(reference(SENTENCES[5], truncate=True, direction="left", at=30)[0],
                  reference(TWO_ENDS, truncate=True, direction="left", at=30)[0])
    assert body["data"][0]["score"] == pytest.approx(want, abs=1e-4), body


def test_score_takes_one_text_against_many_or_pairs(server, reference):
    # vLLM's /score with an embedding model: the cosine similarity of the texts' vectors.
    query, others = SENTENCES[5], [SENTENCES[6], "Hello, world!", SENTENCES[7]]
    status, body = post(server, "/score", {"model": "minilm", "text_1": query, "text_2": others})
    assert status == 200, body
    assert body["object"] == "list" and body["model"] == "minilm", body
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    want = [cosine(reference(query)[0], reference(s)[0]) for s in others]
    assert np.allclose([d["score"] for d in body["data"]], want, atol=1e-4), body
    tokens = sum(reference(s)[1] for s in [query, *others])
    assert body["usage"]["prompt_tokens"] == tokens, body
    # Lists of one length pair up, at /v1/score too; `model` may be left out with one encoder.
    firsts, seconds = [SENTENCES[8], SENTENCES[9]], [SENTENCES[10], SENTENCES[9]]
    status, body = post(server, "/v1/score", {"text_1": firsts, "text_2": seconds})
    assert status == 200, body
    want = [cosine(reference(a)[0], reference(b)[0]) for a, b in zip(firsts, seconds)]
    assert np.allclose([d["score"] for d in body["data"]], want, atol=1e-4), body
    assert body["data"][1]["score"] == pytest.approx(1.0, abs=1e-4)
    # -1 cuts each text at the model's longest input, keeping its last tokens as vLLM does.
    long = " ".join(WORDS * 10)
    status, body = post(server, "/score", {"text_1": long, "text_2": query,
                                           "truncate_prompt_tokens": -1})
    assert status == 200, body
    want = cosine(reference(long, truncate=True, direction="left")[0], reference(query)[0])
    assert body["data"][0]["score"] == pytest.approx(want, abs=1e-4)


def test_cohere_s_client_reranks_documents_by_their_score(server, reference):
    import cohere
    query = "Hello, world!"
    documents = SENTENCES[10:16] + ["Hello, world! Hello!", "Größe und Übermaß."]
    scores = [cosine(reference(query)[0], reference(d)[0]) for d in documents]
    order = sorted(range(len(documents)), key=lambda i: -scores[i])
    client = cohere.ClientV2(api_key="not-needed", base_url=f"http://{server.http}")
    answer = client.rerank(model="minilm", query=query, documents=documents, top_n=3)
    assert [r.index for r in answer.results] == order[:3], (answer, scores)
    for r in answer.results:
        assert r.relevance_score == pytest.approx(scores[r.index], abs=1e-4)
    # vLLM's and Jina's form: documents as objects, every one ranked, each with its text.
    status, body = post(server, "/v1/rerank", {
        "query": query, "documents": [{"text": d} for d in documents], "top_n": 0})
    assert status == 200, body
    assert [r["index"] for r in body["results"]] == order, body
    assert [r["document"]["text"] for r in body["results"]] == [documents[i] for i in order]
    tokens = sum(reference(s)[1] for s in [query, *documents])
    assert body["usage"]["total_tokens"] == tokens, body
    # Cohere's return_documents: false leaves the texts out.
    status, body = post(server, "/rerank", {"model": "minilm", "query": query,
                                            "documents": documents[:2], "return_documents": False})
    assert status == 200 and "document" not in body["results"][0], body


def test_tei_s_rerank_body_gets_tei_s_answer(server, reference):
    # TEI's form of /rerank (`texts`): a list of {index, score}, every text best first.
    query = SENTENCES[3]
    texts = SENTENCES[20:26] + [query]
    scores = [cosine(reference(query)[0], reference(t)[0]) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: -scores[i])
    status, body = post(server, "/rerank", {"query": query, "texts": texts})
    assert status == 200, body
    assert [r["index"] for r in body] == order, (body, scores)
    assert order[0] == len(texts) - 1 and body[0]["score"] == pytest.approx(1.0, abs=1e-4)
    for r in body:
        assert r["score"] == pytest.approx(scores[r["index"]], abs=1e-4)
        assert "text" not in r
    # return_text puts each text beside its score; truncate cuts a long one at 256 tokens.
    long = " ".join(WORDS * 10)
    status, body = post(server, "/rerank", {"query": query, "texts": [long, texts[0]],
                                            "return_text": True, "truncate": True,
                                            "model": "minilm", "raw_scores": False})
    assert status == 200, body
    want = {0: cosine(reference(query)[0], reference(long, truncate=True)[0]), 1: scores[0]}
    for r in body:
        assert r["score"] == pytest.approx(want[r["index"]], abs=1e-4)
        assert r["text"] == [long, texts[0]][r["index"]]


@pytest.mark.parametrize("body, status, names", [
    ({"query": "", "texts": ["a"]}, 413, "`query` is an empty string"),
    ({"query": "a", "texts": []}, 413, "`texts` is an empty list"),
    ({"query": "a", "texts": ["b", ""]}, 413, "`texts`[1]"),
    ({"query": "a", "texts": ["b"], "raw_scores": True}, 413, "raw_scores"),
    ({"query": "a", "texts": ["b"], "truncation_direction": "middle"}, 413,
     "'middle' is neither 'Right' nor 'Left'"),
    ({"query": "a", "texts": [" ".join(WORDS * 10)]}, 413, "256"),
    ({"query": "a", "texts": ["b"], "model": "mlp"}, 413, "not an embedding model"),
    ({"query": "a", "texts": ["b"], "model": "nope"}, 404, "nope"),
    ({"query": "a", "texts": ["b"], "top_n": 1}, 422, "top_n"),
    ({"query": "a", "texts": "b"}, 422, "texts"),
])
def test_bad_tei_rerank_requests_are_refused_by_name(server, body, status, names):
    got, answer = post(server, "/rerank", body)
    assert got == status and answer["error_type"] in ("Validation",), answer
    assert names in answer["error"], answer


@pytest.mark.parametrize("path, body, names", [
    ("/score", {"text_1": [], "text_2": "a"}, "`text_1` is an empty list"),
    ("/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "`text_1` holds 2 texts"),
    ("/score", {"text_1": [1, 2], "text_2": "a"}, "`text_1` must be a string or a list"),
    ("/score", {"text_1": "a", "text_2": ["b", ""]}, "`text_2`[1] is an empty string"),
    ("/score", {"text_1": "a"}, "text_2"),
    ("/score", {"text_1": "a", "text_2": "b", "extra": 1}, "extra"),
    ("/score", {"text_1": "a", "text_2": "b", "model": "mlp"}, "not an embedding model"),
    ("/score", {"text_1": "a", "text_2": "b", "truncate_prompt_tokens": 0},
     "truncate_prompt_tokens 0 is neither -1"),
    ("/score", {"text_1": "a", "text_2": "b", "truncate_prompt_tokens": 257},
     "truncate_prompt_tokens 257 is more than the model takes (256 tokens)"),
    ("/v1/rerank", {"query": "a", "documents": ["b"], "truncate_prompt_tokens": -1,
                    "truncation_side": "middle"}, "truncation_side 'middle' is neither"),
    ("/v1/embeddings", {"model": "minilm", "input": "a", "truncate_prompt_tokens": 2},
     "truncate_prompt_tokens 2 leaves no room for the text: the model adds 2 special tokens"),
    ("/v1/score", {"text_1": " ".join(WORDS * 10), "text_2": "b"}, "at most 256"),
    ("/rerank", {"query": "", "documents": ["a"]}, "`query` is an empty string"),
    ("/rerank", {"query": "a", "documents": []}, "`documents` is an empty list"),
    ("/rerank", {"query": "a", "documents": ["b", {"text": ""}]}, "`documents`[1]"),
    ("/rerank", {"query": "a", "documents": [5]}, "documents"),
    ("/v1/rerank", {"query": "a", "documents": ["b"], "top_n": -1}, "top_n"),
    ("/v2/rerank", {"query": "a", "documents": ["b"], "max_tokens_per_doc": 10},
     "max_tokens_per_doc"),
])
def test_bad_scoring_requests_are_refused_by_name(server, path, body, names):
    status, answer = post(server, path, body)
    assert status == 400, answer
    assert names in answer["error"]["message"], answer


def test_scoring_an_unknown_model_is_404(server):
    status, answer = post(server, "/score", {"model": "nope", "text_1": "a", "text_2": "b"})
    assert status == 404 and "nope" in answer["error"]["message"], answer


def test_tei_tokenize_and_decode_use_the_model_s_tokenizer(server):
    tokenizer = Tokenizer.from_file(str(ROOT / ENCODER / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    texts = ["Hello, world! Größe und Übermaß.", "東京は大きい"]
    status, body = post(server, "/tokenize", {"inputs": texts})
    assert status == 200 and len(body) == 2, body
    for text, tokens in zip(texts, body):
        want = tokenizer.encode(text)
        assert [t["id"] for t in tokens] == want.ids
        assert tokens[0] == {"id": want.ids[0], "text": "[CLS]", "special": True,
                             "start": None, "stop": None}
        assert tokens[-1]["special"] and tokens[-1]["text"] == "[SEP]"
        # Every other token is a piece of the text, at its place in the text's bytes.
        raw = text.encode()
        for t in tokens[1:-1]:
            assert not t["special"]
            assert raw[t["start"]:t["stop"]].decode() == t["text"], t
    status, body = post(server, "/tokenize", {"inputs": texts[0], "add_special_tokens": False,
                                              "model": "minilm"})
    assert status == 200, body
    assert [t["id"] for t in body[0]] == tokenizer.encode(texts[0], add_special_tokens=False).ids
    # /decode gives the text back, without the special tokens unless asked.
    ids = [tokenizer.encode(t).ids for t in texts]
    status, body = post(server, "/decode", {"ids": ids[0]})
    assert status == 200 and body == [tokenizer.decode(ids[0])], body
    status, body = post(server, "/decode", {"ids": ids, "skip_special_tokens": False})
    assert status == 200, body
    assert body == [tokenizer.decode(i, skip_special_tokens=False) for i in ids]
    assert body[0].startswith("[CLS]")


@pytest.mark.parametrize("path, body, status, names", [
    ("/tokenize", {"inputs": ""}, 413, "`inputs` is an empty string"),
    ("/tokenize", {"inputs": [1, 2]}, 413, "`inputs` must be a string or a list of strings"),
    ("/tokenize", {"inputs": "a", "extra": 1}, 422, "extra"),
    ("/tokenize", {"inputs": "a", "model": "mlp"}, 413, "not an embedding model"),
    ("/decode", {"ids": [99999999]}, 413, "vocabulary"),
    ("/decode", {"ids": "abc"}, 413, "`ids` must be"),
    ("/decode", {"ids": []}, 413, "`ids` must be"),
    ("/decode", {"ids": [1], "extra": 1}, 422, "extra"),
])
def test_bad_tei_token_requests_are_refused_by_name(server, path, body, status, names):
    got, answer = post(server, path, body)
    assert got == status and answer["error_type"] == "Validation", answer
    assert names in answer["error"], answer


@pytest.mark.parametrize("path, names", [
    ("/embed_sparse", "sparse embeddings are not served"),
    ("/predict", "no sequence classifier is served"),
])
def test_tei_routes_for_what_no_encoder_computes_say_why(server, path, names):
    """TEI's routes that sheaf's encoders do not serve answer 501 with the reason its gRPC calls
    give, not an unknown route."""
    got, answer = post(server, path, {"inputs": "a"})
    assert got == 501 and answer["error_type"] == "Backend", answer
    assert names in answer["error"], answer


def get(server, path):
    try:
        with urllib.request.urlopen(f"http://{server.http}{path}") as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_tei_info_describes_the_encoder_from_its_config(server, reference):
    # The repository has one encoder, so /info needs no name; named, the answer is the same.
    status, info = get(server, "/info")
    assert status == 200, info
    assert get(server, "/info?model=minilm") == (200, info)
    assert info["model_id"] == "minilm" and info["served_model_name"] == "minilm"
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["model_dtype"] == "float32"
    # model_repository/minilm/config.yaml: 256 tokens, 64 texts and 8,192 tokens a batch.
    assert info["max_input_length"] == 256
    assert info["max_batch_requests"] == 64
    assert info["max_batch_tokens"] == 8192
    assert info["auto_truncate"] is False
    assert info["max_client_batch_size"] == 2048
    assert info["max_concurrent_requests"] > 0 and info["tokenization_workers"] >= 1
    assert info["version"] and info["model_sha"] is None
    # What it says holds: a text one token over max_input_length is refused unless truncated,
    # and a request of max_client_batch_size texts is served while one more is refused.
    tokenizer = Tokenizer.from_file(str(ROOT / ENCODER / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    words = ["stone"] * 400
    text = " ".join(words[:next(n for n in range(400)
                                if len(tokenizer.encode(" ".join(words[:n])).ids) > 256)])
    assert len(tokenizer.encode(text).ids) == info["max_input_length"] + 1
    status, body = post(server, "/embed", {"inputs": text})
    assert status == 413 and "256" in body["error"], body
    status, body = post(server, "/embed", {"inputs": text, "truncate": True})
    assert status == 200 and np.allclose(body[0], reference(text, truncate=True)[0], atol=1e-4)
    n = info["max_client_batch_size"]
    status, body = post(server, "/embed", {"inputs": ["a"] * n})
    assert status == 200 and len(body) == n
    status, body = post(server, "/embed", {"inputs": ["a"] * (n + 1)})
    assert status == 413 and str(n) in body["error"], body


@pytest.mark.parametrize("path, status, names", [
    ("/info?model=mlp", 400, "not an embedding model"),
    ("/info?model=nothing-here", 404, "nothing-here"),
    ("/info?name=minilm", 422, "name"),
])
def test_bad_tei_info_requests_are_refused_by_name(server, path, status, names):
    got, answer = get(server, path)
    assert got == status and answer["error_type"] == "Validation", answer
    assert names in answer["error"], answer


def test_vllm_s_tokenize_and_detokenize_name_a_text_encoder_too(server):
    tokenizer = Tokenizer.from_file(str(ROOT / ENCODER / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    text = "Hello, world! Größe und Übermaß."
    status, body = post(server, "/tokenize", {"model": "minilm", "prompt": text})
    want = tokenizer.encode(text).ids
    assert status == 200 and body == {"count": len(want), "max_model_len": MAX_TOKENS,
                                      "tokens": want}, body
    status, body = post(server, "/detokenize", {"model": "minilm", "tokens": want})
    assert status == 200 and body == {"prompt": tokenizer.decode(want, skip_special_tokens=False)}
    status, body = post(server, "/tokenize", {"model": "minilm", "messages": [
        {"role": "user", "content": "a"}]})
    assert status == 400 and "give `prompt`" in body["error"]["message"], body
    status, body = post(server, "/detokenize", {"model": "minilm", "tokens": [-1]})
    assert status == 400 and "negative" in body["error"]["message"], body


@pytest.fixture(scope="module")
def channel(server):
    import grpc
    with grpc.insecure_channel(server.grpc) as channel:
        yield channel


def test_tei_grpc_info_and_embed_match_the_reference(tei, channel, reference):
    pb, rpc = tei
    info = rpc.InfoStub(channel).Info(pb.InfoRequest())
    assert info.model_id == "minilm" and info.model_type == pb.MODEL_TYPE_EMBEDDING
    assert (info.max_input_length, info.max_batch_requests, info.max_batch_tokens) == (256, 64, 8192)
    assert info.model_dtype == "float32" and info.max_client_batch_size == 2048 and info.version
    embed = rpc.EmbedStub(channel)
    text = SENTENCES[12]
    want, tokens = reference(text)
    answer = embed.Embed(pb.EmbedRequest(inputs=text, normalize=True))
    assert_matches(list(answer.embeddings), want, "gRPC Embed")
    m = answer.metadata
    assert m.compute_tokens == tokens and m.compute_chars == len(text), m
    # The server's account of the call: each part within the whole.
    assert 0 < m.inference_time_ns <= m.total_time_ns and m.queue_time_ns <= m.total_time_ns, m
    assert 0 < m.tokenization_time_ns <= m.total_time_ns, m
    # normalize as sent: false gives the pooled vector as it is.
    raw = embed.Embed(pb.EmbedRequest(inputs=text, normalize=False)).embeddings
    assert np.allclose(raw, reference(text, normalize=False)[0], atol=1e-4)
    # The encoder may be named in the call's metadata.
    named = embed.Embed(pb.EmbedRequest(inputs=text, normalize=True), metadata=[("model", "minilm")])
    assert_matches(list(named.embeddings), want, "named")
    # A long text cut on the side the call names.
    for direction, name in ((pb.TRUNCATION_DIRECTION_RIGHT, "right"),
                            (pb.TRUNCATION_DIRECTION_LEFT, "left")):
        cut = embed.Embed(pb.EmbedRequest(inputs=TWO_ENDS, normalize=True, truncate=True,
                                          truncation_direction=direction))
        assert_matches(list(cut.embeddings),
                       reference(TWO_ENDS, truncate=True, direction=name)[0], f"gRPC, {name}")


def test_tei_grpc_embed_stream_answers_each_text_in_order_in_shared_batches(tei, channel, reference,
                                                                           server):
    pb, rpc = tei
    stats = lambda: json.loads(urllib.request.urlopen(
        f"http://{server.http}/v2/models/minilm/stats").read())["model_stats"][0]
    before = stats()
    texts = SENTENCES * 2
    answers = list(rpc.EmbedStub(channel).EmbedStream(
        iter([pb.EmbedRequest(inputs=t, normalize=True) for t in texts])))
    assert len(answers) == len(texts)
    for t, a in zip(texts, answers):
        assert_matches(list(a.embeddings), reference(t)[0], f"stream: {t[:40]}")
    after = stats()
    # The stream's texts were batched together: fewer executions than texts.
    runs = int(after["execution_count"]) - int(before["execution_count"])
    assert 0 < runs < len(texts), (runs, len(texts))


def test_tei_grpc_rerank_and_its_stream_rank_by_the_reference_scores(tei, channel, reference):
    pb, rpc = tei
    query = "Hello, world!"
    texts = SENTENCES[30:36] + ["Hello, world! Hello!"]
    scores = [cosine(reference(query)[0], reference(t)[0]) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: -scores[i])
    stub = rpc.RerankStub(channel)
    answer = stub.Rerank(pb.RerankRequest(query=query, texts=texts, return_text=True))
    assert [r.index for r in answer.ranks] == order
    for r in answer.ranks:
        assert r.score == pytest.approx(scores[r.index], abs=1e-4)
        assert r.text == texts[r.index]
    assert answer.metadata.compute_tokens == sum(reference(s)[1] for s in [query, *texts])
    # Streamed: one (query, text) pair a message, ranked once all are in.
    pairs = [(query, t) for t in texts[:4]] + [(SENTENCES[1], SENTENCES[1])]
    answer = stub.RerankStream(iter([pb.RerankStreamRequest(query=q, text=t) for q, t in pairs]))
    want = [cosine(reference(q)[0], reference(t)[0]) for q, t in pairs]
    assert [r.index for r in answer.ranks][0] == 4
    assert [r.index for r in answer.ranks] == sorted(range(5), key=lambda i: -want[i])
    for r in answer.ranks:
        assert r.score == pytest.approx(want[r.index], abs=1e-4) and not r.HasField("text")


def test_tei_grpc_tokenize_and_decode_use_the_model_s_tokenizer(tei, channel):
    pb, rpc = tei
    tokenizer = Tokenizer.from_file(str(ROOT / ENCODER / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    stub = rpc.TokenizeStub(channel)
    text = "Größe und Übermaß."
    got = stub.Tokenize(pb.EncodeRequest(inputs=text, add_special_tokens=True)).tokens
    want = tokenizer.encode(text)
    assert [t.id for t in got] == want.ids
    raw = text.encode()
    for t in got:
        if t.special:
            assert not t.HasField("start"), t
        else:
            assert raw[t.start:t.stop].decode() == t.text, t
    plain = stub.Tokenize(pb.EncodeRequest(inputs=text)).tokens
    assert [t.id for t in plain] == tokenizer.encode(text, add_special_tokens=False).ids
    decoded = stub.Decode(pb.DecodeRequest(ids=want.ids, skip_special_tokens=True)).text
    assert decoded == tokenizer.decode(want.ids)
    streamed = list(stub.DecodeStream(iter([pb.DecodeRequest(ids=want.ids),
                                            pb.DecodeRequest(ids=want.ids[1:3])])))
    assert [s.text for s in streamed] == [tokenizer.decode(want.ids, skip_special_tokens=False),
                                          tokenizer.decode(want.ids[1:3], skip_special_tokens=False)]
    encoded = list(stub.TokenizeStream(iter([pb.EncodeRequest(inputs=s) for s in SENTENCES[:5]])))
    assert [[t.id for t in e.tokens] for e in encoded] == [
        tokenizer.encode(s, add_special_tokens=False).ids for s in SENTENCES[:5]]


def test_tei_grpc_refusals_name_what_is_wrong(tei, channel):
    import grpc
    pb, rpc = tei
    embed, rerank = rpc.EmbedStub(channel), rpc.RerankStub(channel)
    long = " ".join(WORDS * 10)
    cases = [
        (lambda: embed.Embed(pb.EmbedRequest(inputs="")), grpc.StatusCode.INVALID_ARGUMENT,
         "empty string"),
        (lambda: embed.Embed(pb.EmbedRequest(inputs=long)), grpc.StatusCode.INVALID_ARGUMENT,
         "256"),
        (lambda: embed.Embed(pb.EmbedRequest(inputs="a", truncation_direction=7)),
         grpc.StatusCode.INVALID_ARGUMENT, "truncation_direction 7 is neither RIGHT"),
        (lambda: embed.Embed(pb.EmbedRequest(inputs="a"), metadata=[("model", "mlp")]),
         grpc.StatusCode.INVALID_ARGUMENT, "not an embedding model"),
        (lambda: embed.Embed(pb.EmbedRequest(inputs="a"), metadata=[("model", "nope")]),
         grpc.StatusCode.NOT_FOUND, "nope"),
        (lambda: embed.EmbedSparse(pb.EmbedSparseRequest(inputs="a")),
         grpc.StatusCode.UNIMPLEMENTED, "sparse"),
        (lambda: rpc.PredictStub(channel).Predict(pb.PredictRequest(inputs="a")),
         grpc.StatusCode.UNIMPLEMENTED, "classifier"),
        (lambda: rerank.Rerank(pb.RerankRequest(query="a", texts=[])),
         grpc.StatusCode.INVALID_ARGUMENT, "`texts` is an empty list"),
        (lambda: rerank.Rerank(pb.RerankRequest(query="a", texts=["b"], raw_scores=True)),
         grpc.StatusCode.INVALID_ARGUMENT, "raw_scores"),
        (lambda: rerank.RerankStream(iter([])), grpc.StatusCode.INVALID_ARGUMENT, "no pair"),
        (lambda: rpc.TokenizeStub(channel).Decode(pb.DecodeRequest(ids=[99999999])),
         grpc.StatusCode.INVALID_ARGUMENT, "vocabulary"),
    ]
    for call, code, names in cases:
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == code and names in e.value.details(), (names, e.value)
    # A failing message ends a stream with its status, after the answers before it.
    stream = embed.EmbedStream(iter([pb.EmbedRequest(inputs="a"), pb.EmbedRequest(inputs=""),
                                     pb.EmbedRequest(inputs="b")]))
    first = next(stream)
    assert len(first.embeddings) == 384
    with pytest.raises(grpc.RpcError) as e:
        next(stream)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "empty" in e.value.details()


@pytest.fixture(scope="module")
def on_demand(tmp_path_factory):
    """The encoder and the generation model in the `on_demand` control mode: neither loaded."""
    repo = tmp_path_factory.mktemp("on-demand")
    link_encoder(repo)
    link_gguf(repo)
    yield from start(repo, "--model-control-mode", "on_demand")


def test_models_not_loaded_yet_are_listed_and_tei_s_route_loads_the_only_encoder(on_demand, reference):
    def ready(model):
        try:
            return urllib.request.urlopen(f"http://{on_demand.http}/v2/models/{model}/ready").status == 200
        except urllib.error.HTTPError:
            return False

    assert not ready("minilm") and not ready("smollm2")
    listed = json.loads(urllib.request.urlopen(f"http://{on_demand.http}/v1/models").read())
    assert sorted(m["id"] for m in listed["data"]) == ["minilm", "smollm2"], listed
    # TEI's /embed names no model: the server's only encoder is loaded for it.
    status, body = post(on_demand, "/embed", {"inputs": "Hello, world!"})
    assert status == 200, body
    np.testing.assert_allclose(body[0], reference("Hello, world!")[0], atol=1e-4)
    assert ready("minilm") and not ready("smollm2")
    listed = json.loads(urllib.request.urlopen(f"http://{on_demand.http}/v1/models").read())
    lengths = {m["id"]: m.get("max_model_len") for m in listed["data"]}
    assert lengths == {"minilm": MAX_TOKENS, "smollm2": None}, listed
