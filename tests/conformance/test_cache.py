"""The response cache, through NVIDIA's tritonclient over HTTP and gRPC: a repeated request is
answered from the cache byte for byte as the model answered it, without running the model, and
counted as Triton counts it (`cache_hit`, `cache_miss`) and in /metrics; other inputs miss; the
least recently used answers leave a full cache; no answer survives an unload and reload or
crosses to a new version of the model; and the embedding model (text in, through /v1/embeddings
and TEI's /embed) and the image classifier (JPEG bytes in, classes out) are answered from it
too, byte for byte.
Models opt in with `response_cache: true` (config.yaml) or `response_cache { enable: true }`
(config.pbtxt)."""
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import ENCODER, ROOT, MODELS, launch, start

MLP = ROOT / MODELS["mlp"][0]


def make_repo(root):
    (root / "cached" / "1").mkdir(parents=True)
    (root / "cached" / "1" / "model.onnx").symlink_to(MLP)
    (root / "cached" / "config.yaml").write_text("max_batch_size: 32\nresponse_cache: true\n")
    (root / "triton_cached" / "1").mkdir(parents=True)
    (root / "triton_cached" / "1" / "model.onnx").symlink_to(MLP)
    (root / "triton_cached" / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 32\nresponse_cache { enable: true }\n')
    (root / "uncached" / "1").mkdir(parents=True)
    (root / "uncached" / "1" / "model.onnx").symlink_to(MLP)
    (root / "versioned" / "1").mkdir(parents=True)
    (root / "versioned" / "1" / "model.onnx").symlink_to(MLP)
    (root / "versioned" / "config.yaml").write_text("max_batch_size: 32\nresponse_cache: true\n")
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("cache-repo"))
    # Room for about 20 answers of the MLP (10 floats and the entry's bookkeeping).
    yield from start(repo, "--cache-size", "3400", "--model-control-mode", "on_demand")


def ask(module, client, model, x):
    given = module.InferInput("input", list(x.shape), "FP32")
    given.set_data_from_numpy(x)
    return client.infer(model, [given]).as_numpy("output")


def stats(server, model):
    client = httpclient.InferenceServerClient(server.http)
    s = client.get_inference_statistics(model)["model_stats"][0]
    return s["inference_stats"], s["execution_count"]


def item(seed):
    return np.random.default_rng(seed).standard_normal((1, 512)).astype(np.float32)


@pytest.mark.parametrize("model", ["cached", "triton_cached"])
def test_a_repeated_request_is_answered_from_the_cache_byte_for_byte(server, model):
    http = httpclient.InferenceServerClient(server.http)
    grpc = grpcclient.InferenceServerClient(server.grpc)
    x = item(hash(model) % 1000)
    first = ask(httpclient, http, model, x)
    before, executions = stats(server, model)
    again = ask(httpclient, http, model, x)
    over_grpc = ask(grpcclient, grpc, model, x)
    assert again.tobytes() == first.tobytes()
    assert over_grpc.tobytes() == first.tobytes()
    after, executions_after = stats(server, model)
    assert after["cache_hit"]["count"] == before["cache_hit"]["count"] + 2
    assert after["cache_miss"]["count"] == before["cache_miss"]["count"]
    assert after["success"]["count"] == before["success"]["count"] + 2
    assert executions_after == executions, "a hit ran the model"
    # Another input misses, and is answered by the model.
    other = item(12345)
    answer = ask(grpcclient, grpc, model, other)
    assert answer.tobytes() == ask(httpclient, http, "uncached", other).tobytes()
    last, _ = stats(server, model)
    assert last["cache_miss"]["count"] == after["cache_miss"]["count"] + 1
    metrics = urllib.request.urlopen(f"http://{server.metrics}/metrics").read().decode()
    hits = [line for line in metrics.splitlines()
            if line.startswith("sheaf_cache_hits_total") and f'model="{model}"' in line]
    assert hits and float(hits[0].split()[-1]) >= 2, hits


def test_a_model_that_does_not_enable_it_is_never_answered_from_it(server):
    http = httpclient.InferenceServerClient(server.http)
    x = item(7)
    ask(httpclient, http, "uncached", x)
    _, executions = stats(server, "uncached")
    ask(httpclient, http, "uncached", x)
    after, executions_after = stats(server, "uncached")
    assert executions_after == executions + 1
    assert after["cache_hit"]["count"] == 0 and after["cache_miss"]["count"] == 0


def test_the_least_recently_used_answers_leave_a_full_cache(server):
    http = httpclient.InferenceServerClient(server.http)
    first = item(1000)
    ask(httpclient, http, "cached", first)
    for seed in range(1001, 1041):  # 40 answers: twice the room
        ask(httpclient, http, "cached", item(seed))
    before, _ = stats(server, "cached")
    ask(httpclient, http, "cached", first)
    ask(httpclient, http, "cached", item(1040))
    after, _ = stats(server, "cached")
    assert after["cache_miss"]["count"] == before["cache_miss"]["count"] + 1, "first was evicted"
    assert after["cache_hit"]["count"] == before["cache_hit"]["count"] + 1, "the latest stayed"


def test_no_answer_survives_an_unload_and_reload(server):
    http = httpclient.InferenceServerClient(server.http)
    x = item(99)
    ask(httpclient, http, "cached", x)
    ask(httpclient, http, "cached", x)
    hit, _ = stats(server, "cached")
    assert hit["cache_hit"]["count"] >= 1
    http.unload_model("cached")
    ask(httpclient, http, "cached", x)  # loads it again
    after, executions = stats(server, "cached")
    assert after["cache_hit"]["count"] == 0 and after["cache_miss"]["count"] == 1
    assert executions == 1


def test_a_new_version_is_never_answered_with_the_old_versions_entries(server, tmp_path):
    import onnx
    from onnx import numpy_helper

    http = httpclient.InferenceServerClient(server.http)
    x = item(2024)
    old = ask(httpclient, http, "versioned", x)
    assert ask(httpclient, http, "versioned", x).tobytes() == old.tobytes()
    assert stats(server, "versioned")[0]["cache_hit"]["count"] == 1
    # Version 2: the same network with its last layer's weights doubled.
    graph = onnx.load(str(MLP))
    last = graph.graph.initializer[-1]
    last.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(last) * 2, last.name))
    folder = server.repo / "versioned" / "2"
    folder.mkdir()
    onnx.save(graph, str(folder / "model.onnx"))
    http.unload_model("versioned")
    http.load_model("versioned")
    assert http.get_model_metadata("versioned")["versions"] == ["2"]
    new = ask(httpclient, http, "versioned", x)
    after, executions = stats(server, "versioned")
    assert new.tobytes() != old.tobytes(), "version 2 was answered with version 1's output"
    assert after["cache_hit"]["count"] == 0 and after["cache_miss"]["count"] == 1
    assert executions == 1
    assert ask(httpclient, http, "versioned", x).tobytes() == new.tobytes()


@pytest.fixture(scope="module")
def roomy(tmp_path_factory):
    """A server with room for the encoder's and the classifier's answers."""
    repo = tmp_path_factory.mktemp("cache-roomy")
    encoder = ROOT / ENCODER
    (repo / "minilm" / "1").mkdir(parents=True)
    (repo / "minilm" / "1" / "model.onnx").symlink_to(encoder / "1" / "model.onnx")
    (repo / "minilm" / "tokenizer.json").symlink_to(encoder / "tokenizer.json")
    (repo / "minilm" / "config.yaml").write_text(
        (encoder / "config.yaml").read_text() + "response_cache: true\n")
    file, config = MODELS["efficientnet"]
    (repo / "efficientnet" / "1").mkdir(parents=True)
    (repo / "efficientnet" / "1" / "model.onnx").symlink_to(ROOT / file)
    (repo / "efficientnet" / "config.yaml").write_text(config + "response_cache: true\n")
    yield from start(repo, "--cache-size", str(64 << 20))


def post(server, path, body):
    import json
    request = urllib.request.Request(f"http://{server.http}{path}", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    return urllib.request.urlopen(request).read()


def test_embeddings_are_answered_from_the_cache(roomy):
    import json
    body = {"model": "minilm", "input": ["the cache keeps what was asked", "and answers it again"]}
    first = json.loads(post(roomy, "/v1/embeddings", body))
    before, executions = stats(roomy, "minilm")
    again = json.loads(post(roomy, "/v1/embeddings", body))
    tei = json.loads(post(roomy, "/embed", {"inputs": body["input"]}))
    after, executions_after = stats(roomy, "minilm")
    vectors = [d["embedding"] for d in first["data"]]
    assert [d["embedding"] for d in again["data"]] == vectors
    assert np.array_equal(np.array(tei, np.float32), np.array(vectors, np.float32))
    # Each text is one item: two texts, asked twice more, are four hits.
    assert after["cache_hit"]["count"] == before["cache_hit"]["count"] + 4
    assert executions_after == executions, "a hit ran the model"
    post(roomy, "/v1/embeddings", {"model": "minilm", "input": ["a sentence not asked before"]})
    last, _ = stats(roomy, "minilm")
    assert last["cache_miss"]["count"] == after["cache_miss"]["count"] + 1
    # The same texts' token states are another answer (an answer kept for the vectors holds
    # no states): two misses, whose states pool to the vectors; asked again, two hits.
    states = json.loads(post(roomy, "/embed_all", {"inputs": body["input"]}))
    missed, _ = stats(roomy, "minilm")
    assert missed["cache_miss"]["count"] == last["cache_miss"]["count"] + 2
    for s, v in zip(states, vectors):
        pooled = np.mean(np.array(s, np.float64), axis=0)
        assert np.allclose(pooled / np.linalg.norm(pooled), v, atol=1e-5)
    assert json.loads(post(roomy, "/embed_all", {"inputs": body["input"]})) == states
    hit, _ = stats(roomy, "minilm")
    assert hit["cache_hit"]["count"] == missed["cache_hit"]["count"] + 2


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_images_are_answered_from_the_cache(roomy, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(roomy.http if protocol == "http" else roomy.grpc)
    photo = (ROOT / ".cache/test-images/cat.png").read_bytes()

    def classes():
        given = module.InferInput("input", [1], "BYTES")
        given.set_data_from_numpy(np.array([photo], dtype=np.object_))
        out = module.InferRequestedOutput("logits", class_count=3)
        raw = module.InferRequestedOutput("logits")
        result = client.infer("efficientnet", [given], outputs=[out])
        logits = client.infer("efficientnet", [given], outputs=[raw]).as_numpy("logits")
        return result.as_numpy("logits"), logits

    first_classes, first_logits = classes()
    before, executions = stats(roomy, "efficientnet")
    again_classes, again_logits = classes()
    after, executions_after = stats(roomy, "efficientnet")
    assert again_logits.tobytes() == first_logits.tobytes()
    assert list(again_classes[0]) == list(first_classes[0])
    assert b"tiger cat" in first_classes[0][0] or "tiger cat" in str(first_classes[0][0])
    assert after["cache_hit"]["count"] == before["cache_hit"]["count"] + 2
    assert executions_after == executions, "a hit ran the model"


# A Triton ensemble that caches its answers as a whole: its two steps run the uncached MLP.
ENSEMBLE = '''
platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 512 ] } ]
output [ { name: "A" data_type: TYPE_FP32 dims: [ 10 ] },
         { name: "B" data_type: TYPE_FP32 dims: [ 10 ] } ]
response_cache { enable: true }
ensemble_scheduling { step [
  { model_name: "mlp" input_map { key: "input" value: "RAW" } output_map { key: "output" value: "A" } },
  { model_name: "mlp" input_map { key: "input" value: "RAW" } output_map { key: "output" value: "B" } }
] }
'''


def test_triton_s_cache_config_flag_sizes_the_cache(tmp_path):
    """`--cache-config local,size=BYTES`, as tritonserver takes it; other caches are refused."""
    repo = make_repo(tmp_path / "repo")
    for server in start(repo, "--cache-config", "local,size=1048576"):
        http = httpclient.InferenceServerClient(server.http)
        x = item(77)
        ask(httpclient, http, "cached", x)
        ask(httpclient, http, "cached", x)
        assert stats(server, "cached")[0]["cache_hit"]["count"] == 1
    for setting, says in (("redis,host=cache", "the local cache only"),
                          ("local,size=lots", "a number of bytes")):
        with pytest.raises(RuntimeError) as stopped:
            proc, _ = launch(repo, "--cache-config", setting)
            proc.kill()
        assert says in str(stopped.value), stopped.value


@pytest.fixture(scope="module")
def ensembles(tmp_path_factory):
    repo = tmp_path_factory.mktemp("cache-ensemble")
    (repo / "mlp" / "1").mkdir(parents=True)
    (repo / "mlp" / "1" / "model.onnx").symlink_to(MLP)
    (repo / "pair" / "1").mkdir(parents=True)
    (repo / "pair" / "config.pbtxt").write_text(ENSEMBLE)
    yield from start(repo, "--cache-size", str(1 << 20), "--model-control-mode", "on_demand")


def test_an_ensemble_s_answers_are_cached_as_a_whole(ensembles):
    """As Triton's top-level ensemble cache: a repeated request is answered without running a
    step, whichever outputs it asks for, and counted as the ensemble's hit; another input
    misses; an unload takes the ensemble's answers with it."""
    http = httpclient.InferenceServerClient(ensembles.http)
    grpc = grpcclient.InferenceServerClient(ensembles.grpc)

    def run(module, client, x, outputs=None):
        given = module.InferInput("RAW", list(x.shape), "FP32")
        given.set_data_from_numpy(x)
        asked = [module.InferRequestedOutput(o) for o in outputs] if outputs else None
        return client.infer("pair", [given], outputs=asked)

    x = item(31)
    first = run(httpclient, http, x)
    assert first.as_numpy("A").tobytes() == ask(httpclient, http, "mlp", x).tobytes()
    before, pair_runs = stats(ensembles, "pair")
    _, step_runs = stats(ensembles, "mlp")
    # Asked again over gRPC, for B alone: from the cache, no step runs.
    again = run(grpcclient, grpc, x, ["B"])
    assert again.as_numpy("B").tobytes() == first.as_numpy("B").tobytes()
    assert again.as_numpy("A") is None
    after, pair_after = stats(ensembles, "pair")
    assert after["cache_hit"]["count"] == before["cache_hit"]["count"] + 1
    assert after["success"]["count"] == before["success"]["count"] + 1
    assert pair_after == pair_runs and stats(ensembles, "mlp")[1] == step_runs, "a hit ran a step"
    # Another input misses, and runs both steps.
    run(httpclient, http, item(32))
    missed, _ = stats(ensembles, "pair")
    assert missed["cache_miss"]["count"] == after["cache_miss"]["count"] + 1
    assert stats(ensembles, "mlp")[1] == step_runs + 2
    # An output the ensemble lacks is refused, cached or not.
    with pytest.raises(Exception) as refused:
        run(httpclient, http, x, ["C"])
    assert "no output 'C'" in str(refused.value)
    # Unloaded and loaded again (on demand): the first answer is gone.
    http.unload_model("pair")
    run(httpclient, http, x)
    reloaded, _ = stats(ensembles, "pair")
    assert reloaded["cache_hit"]["count"] == 0 and reloaded["cache_miss"]["count"] == 1
