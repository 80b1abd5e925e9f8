"""A text encoder's prompts (sentence-transformers' `prompts` and `default_prompt_name`, TEI's
`prompt_name`), with the real all-MiniLM-L6-v2 served by the real `sheaf` binary: a named prompt
is put before each text, the default before the texts of a request that names none (on every
route), either from `config.yaml` or from the model folder's `config_sentence_transformers.json`;
every vector is checked against the reference of the prompted text run alone."""
import json

import grpc
import openai
import pytest
from tokenizers import Tokenizer

from conftest import ENCODER, ROOT, start
from test_embeddings import assert_matches, post, reference  # noqa: F401 - the fixture

PROMPTS = ('prompts: {query: "query: ", passage: "passage: "}\n'
           "  default_prompt_name: passage\n")
TEXT = "the river carries light across a valley"


def encoder_folder(repo, name, config_extra="", files=()):
    """A copy of the demo encoder's folder named `name`, its `embedding` section extended."""
    source = ROOT / ENCODER
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.onnx").symlink_to(source / "1" / "model.onnx")
    (repo / name / "tokenizer.json").symlink_to(source / "tokenizer.json")
    config = (source / "config.yaml").read_text()
    if config_extra:
        config = config.replace("embedding:\n", "embedding:\n  " + config_extra, 1)
    (repo / name / "config.yaml").write_text(config)
    for file, text in files:
        (repo / name / file).write_text(text)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("prompts")
    encoder_folder(repo, "e5", PROMPTS)
    encoder_folder(repo, "plain")
    # The prompts of sentence-transformers' own file, where the config names none.
    saved = {"__version__": {"sentence_transformers": "3.0.0"},
             "prompts": {"query": "Represent this sentence for searching: ", "document": ""},
             "default_prompt_name": "query", "similarity_fn_name": "cosine"}
    encoder_folder(repo, "bge", files=[("config_sentence_transformers.json", json.dumps(saved))])
    # A default that names no prompt: the model fails to load, the server serves on.
    encoder_folder(repo, "broken", 'prompts: {query: "q: "}\n  default_prompt_name: passage\n')
    for server in start(repo):
        yield server


def test_a_named_prompt_and_the_default_one_come_before_the_text(server, reference):
    status, body = post(server, "/embed", {"model": "e5", "inputs": [TEXT, "a cat"],
                                           "prompt_name": "query"})
    assert status == 200, body
    assert_matches(body[0], reference("query: " + TEXT)[0], "query prompt")
    assert_matches(body[1], reference("query: a cat")[0], "query prompt, second text")
    # No prompt named: the default one (passage), on TEI's route and on OpenAI's.
    status, body = post(server, "/embed", {"model": "e5", "inputs": TEXT})
    assert status == 200, body
    want, tokens = reference("passage: " + TEXT)
    assert_matches(body[0], want, "default prompt")
    client = openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="not-needed")
    answer = client.embeddings.create(model="e5", input=TEXT)
    assert_matches(answer.data[0].embedding, want, "default prompt over OpenAI's route")
    # The prompt's tokens are counted.
    assert answer.usage.prompt_tokens == tokens
    # /similarity scores the prompted texts.
    status, scores = post(server, "/similarity", {
        "model": "e5", "inputs": {"source_sentence": TEXT, "sentences": ["a cat"]},
        "parameters": {"prompt_name": "query"}})
    assert status == 200, scores
    a, b = reference("query: " + TEXT)[0], reference("query: a cat")[0]
    assert abs(scores[0] - float(a @ b)) < 1e-4


def test_the_prompts_of_config_sentence_transformers_json_are_read(server, reference):
    status, body = post(server, "/embed", {"model": "bge", "inputs": TEXT})
    assert status == 200, body
    want = reference("Represent this sentence for searching: " + TEXT)[0]
    assert_matches(body[0], want, "the file's default prompt")
    status, body = post(server, "/embed", {"model": "bge", "inputs": TEXT,
                                           "prompt_name": "document"})
    assert status == 200, body
    assert_matches(body[0], reference(TEXT)[0], "the file's empty prompt")


def test_tokenize_shows_the_prompt_s_tokens_first(server):
    tokenizer = Tokenizer.from_file(str(ROOT / ENCODER / "tokenizer.json"))
    tokenizer.no_padding()
    status, body = post(server, "/tokenize", {"model": "e5", "inputs": TEXT,
                                              "prompt_name": "query"})
    assert status == 200, body
    prompted = "query: " + TEXT
    assert [t["id"] for t in body[0]] == tokenizer.encode(prompted).ids
    assert [t["text"] for t in body[0][1:3]] == ["query", ":"]
    # Places are in the prompt and the text together.
    word = body[0][3]
    assert prompted.encode()[word["start"]:word["stop"]].decode() == word["text"] == "the"


def test_unknown_prompts_and_prompts_for_token_ids_are_refused(server):
    status, body = post(server, "/embed", {"model": "e5", "inputs": TEXT, "prompt_name": "nope"})
    assert status == 413, body
    assert "prompt_name 'nope'" in body["error"] and "passage, query" in body["error"]
    status, body = post(server, "/embed", {"model": "plain", "inputs": TEXT,
                                           "prompt_name": "query"})
    assert status == 413 and "the model has no prompts" in body["error"], body
    # Without prompts, the text is embedded as it is.
    status, body = post(server, "/embed", {"model": "plain", "inputs": TEXT})
    assert status == 200
    status, body = post(server, "/embed", {"model": "e5", "inputs": [[101, 102]],
                                           "prompt_name": "query"})
    assert status == 413 and "token ids" in body["error"], body
    # A default prompt that names no prompt fails the model's load, saying so.
    status, index = post(server, "/v2/repository/index", {})
    broken = next(m for m in index if m["name"] == "broken")
    assert broken["state"] == "UNAVAILABLE", broken
    assert "default_prompt_name 'passage' is not one of its prompts (query)" in broken["reason"]


def test_tei_grpc_embed_and_tokenize_take_a_prompt_name(server, tei, reference):
    pb, rpc = tei
    with grpc.insecure_channel(server.grpc) as channel:
        model = [("model", "e5")]
        answer = rpc.EmbedStub(channel).Embed(
            pb.EmbedRequest(inputs=TEXT, normalize=True, prompt_name="query"), metadata=model)
        assert_matches(list(answer.embeddings), reference("query: " + TEXT)[0], "gRPC Embed")
        tokens = rpc.TokenizeStub(channel).Tokenize(
            pb.EncodeRequest(inputs=TEXT, add_special_tokens=True, prompt_name="query"),
            metadata=model).tokens
        assert [t.text for t in tokens[1:3]] == ["query", ":"]
        with pytest.raises(grpc.RpcError) as e:
            rpc.EmbedStub(channel).Embed(pb.EmbedRequest(inputs=TEXT, prompt_name="nope"),
                                         metadata=model)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "passage, query" in e.value.details()
