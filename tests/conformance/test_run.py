"""`sheaf run`: offline jobs over files, in process, checked against the server and onnxruntime.

Each job is the real `sheaf` binary. Its answers are compared with what `sheaf serve` answers
over HTTP (tritonclient) for the same items, and with onnxruntime in Python for ONNX models.
"""
import asyncio
import json
import os
import shutil
import signal
import subprocess
import time

import nats
import numpy as np
import onnxruntime as ort
import pytest
import requests
import tritonclient.http as httpclient

from conftest import ROOT, link_encoder, link_gguf, link_models, start

BINARY = os.environ.get("SHEAF_BIN", str(ROOT / "target" / "debug" / "sheaf"))

# y = 2x + 1 on frames of 4 values, 40 ms + 1 ms per item for each batch.
SIM = """input: {name: x, shape: [-1, 4]}
output: {name: y}
latency_ms: {a: 40, b: 1}
time_scale: 0.1
"""
# The same on decoded images: load (decoding) and compute can overlap.
SIM_IMAGES = """input: {name: x, shape: [-1, 3, 64, 64]}
output: {name: y}
latency_ms: {a: 1, b: 0}
"""
IMAGE_CONFIG = """max_batch_size: 16
image_inputs:
  x: {resize: 64, crop: [64, 64]}
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("run-repo")
    (repo / "sim").mkdir()
    (repo / "sim" / "model.sim.yaml").write_text(SIM)
    (repo / "sim" / "config.yaml").write_text("max_batch_size: 32\n")
    (repo / "simimages").mkdir()
    (repo / "simimages" / "model.sim.yaml").write_text(SIM_IMAGES)
    (repo / "simimages" / "config.yaml").write_text(IMAGE_CONFIG)
    link_models(repo, ["mlp", "efficientnet"])
    (repo / "faces").mkdir()
    (repo / "faces" / "1").mkdir()
    (repo / "faces" / "1" / "model.onnx").symlink_to(ROOT / "model_repository/faces/1/model.onnx")
    (repo / "faces" / "config.yaml").symlink_to(ROOT / "model_repository/faces/config.yaml")
    link_gguf(repo)
    link_encoder(repo)
    return repo


@pytest.fixture(scope="module")
def server(repo):
    yield from start(repo)


def run(repo, *args, check=True):
    """Runs `sheaf run` on `repo`; returns its summary (the JSON line on stdout) or, with
    check=False, the finished process."""
    proc = subprocess.run([BINARY, "run", "--model-repository", str(repo), *args],
                          capture_output=True, text=True, timeout=600)
    if not check:
        return proc
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def served(server, model, name, data, output, chunk=64):
    """The server's answers for `data`, `chunk` items per request."""
    client = httpclient.InferenceServerClient(server.http)
    parts = []
    for start_at in range(0, len(data), chunk):
        part = data[start_at:start_at + chunk]
        tensor = httpclient.InferInput(name, list(part.shape), "FP32")
        tensor.set_data_from_numpy(part, binary_data=True)
        wanted = httpclient.InferRequestedOutput(output, binary_data=True)
        parts.append(client.infer(model, [tensor], outputs=[wanted]).as_numpy(output))
    return np.concatenate(parts)


def test_a_thousand_frames_give_the_servers_answers(repo, server, tmp_path):
    frames = np.random.default_rng(1).standard_normal((1000, 512), dtype=np.float32)
    np.save(tmp_path / "frames.npy", frames)
    for strategy in ("sequential", "concurrent", "pipelined"):
        out = tmp_path / f"out-{strategy}"
        summary = run(repo, "--model", "mlp", "--input", str(tmp_path / "frames.npy"),
                      "--output", str(out), "--strategy", strategy, "--batch-size", "48")
        assert summary["items"] == 1000 and summary["skipped"] == 0, summary
        got = np.load(out / "output.npy")
        assert got.shape == (1000, 10) and got.dtype == np.float32
        expected = served(server, "mlp", "input", frames, "output")
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        reference = ort.InferenceSession(server.model_file("mlp")).run(None, {"input": frames})[0]
        np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-5)
        assert json.loads((out / "progress.json").read_text())["done"] == 1000

    # The sim model: exact answers, and the default output folder beside the input.
    values = np.arange(4000, dtype=np.float32).reshape(1000, 4)
    np.save(tmp_path / "sim.npy", values)
    summary = run(repo, "--model", "sim", "--input", f"x={tmp_path / 'sim.npy'}")
    assert summary["output"] == str(tmp_path / "sim.out")
    got = np.load(tmp_path / "sim.out" / "y.npy")
    np.testing.assert_array_equal(got, served(server, "sim", "x", values, "y"))
    np.testing.assert_array_equal(got, 2 * values + 1)

    # Raw little-endian items of the input's item shape work as NPY does.
    (tmp_path / "sim.raw").write_bytes(values.tobytes())
    run(repo, "--model", "sim", "--input", str(tmp_path / "sim.raw"),
        "--output", str(tmp_path / "raw-out"))
    np.testing.assert_array_equal(np.load(tmp_path / "raw-out" / "y.npy"), 2 * values + 1)


def images(folder, count):
    """`count` photographs (the test suite's two, copied), named so that they sort in order."""
    folder.mkdir()
    sources = sorted((ROOT / ".cache/test-images").glob("*.png"))
    assert sources, "run scripts/setup.sh --test for the test photographs"
    for i in range(count):
        shutil.copy(sources[i % len(sources)], folder / f"img{i:03}.png")
    return folder


def test_a_folder_of_images_is_classified_in_file_order(repo, server, tmp_path):
    folder = images(tmp_path / "photos", 6)
    summary = run(repo, "--model", "efficientnet", "--input", str(folder), "--classes", "3",
                  "--output", str(tmp_path / "out"))
    assert summary["items"] == 6
    lines = (tmp_path / "out" / "logits.jsonl").read_text().splitlines()
    assert len(lines) == 6
    client = httpclient.InferenceServerClient(server.http)
    for i, line in enumerate(lines):
        classes = json.loads(line)
        assert len(classes) == 3
        image = httpclient.InferInput("input", [1], "BYTES")
        image.set_data_from_numpy(np.array([(folder / f"img{i:03}.png").read_bytes()], dtype=object))
        wanted = httpclient.InferRequestedOutput("logits", class_count=3)
        answer = client.infer("efficientnet", [image], outputs=[wanted]).as_numpy("logits")
        # The same classes, in the same order; scores agree to print precision.
        assert [c.split(":", 1)[1] for c in classes] == \
            [c.decode().split(":", 1)[1] for c in answer[0]]
    assert "tiger cat" in lines[0] or "tabby" in lines[0]


@pytest.mark.parametrize("pipeline", ["classify", "classify_python"])
def test_a_folder_of_images_goes_through_a_pipeline_and_its_step_models(pipeline, tmp_path):
    """A pipeline is run as it is served: `sheaf run` loads the step models beside it (the
    built-in image step or the Python one, then EfficientNet), and the images go as BYTES
    elements to the input its steps imply; the top classes are the model's own."""
    folder = images(tmp_path / "photos", 4)
    out = tmp_path / "out"
    summary = run(ROOT / "model_repository", "--model", pipeline, "--input", str(folder),
                  "--output", str(out), "--strategy", "concurrent")
    assert summary["items"] == 4 and summary["model"] == pipeline, summary
    lines = [json.loads(line) for line in (out / "classes.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(len(classes) == 5 for classes in lines), lines
    top = [classes[0].split(":", 2)[2] for classes in lines]
    assert top[0] == top[2] and top[1] == top[3] and top[0] != top[1], top
    assert top[0] in ("tiger cat", "tabby", "Egyptian cat"), top


def test_image_outputs_are_written_as_files(repo, tmp_path):
    z = np.random.default_rng(3).standard_normal((20, 100, 1, 1), dtype=np.float32)
    np.save(tmp_path / "z.npy", z)
    summary = run(repo, "--model", "faces", "--input", str(tmp_path / "z.npy"),
                  "--batch-size", "8")
    assert summary["items"] == 20
    files = sorted((tmp_path / "z.out" / "image").iterdir())
    assert [f.name for f in files] == [f"{i:02}.png" for i in range(20)]
    for f in files:
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pipelined_is_faster_than_sequential_when_load_and_compute_overlap(repo, tmp_path):
    folder = images(tmp_path / "frames", 48)
    # The cost of loading (decoding) and writing a chunk, with next to no compute: a sequential
    # job on a model whose batches take 1 ms.
    base = run(repo, "--model", "simimages", "--input", str(folder), "--strategy", "sequential",
               "--batch-size", "8", "--output", str(tmp_path / "base"))
    per_chunk_ms = max(20.0, base["seconds"] * 1000 / 6)
    # A model whose compute takes as long as a chunk's load and write.
    matched = tmp_path / "matched-repo" / "matched"
    matched.mkdir(parents=True)
    (matched / "model.sim.yaml").write_text(
        SIM_IMAGES.replace("a: 1,", f"a: {per_chunk_ms:.0f},"))
    (matched / "config.yaml").write_text(IMAGE_CONFIG)
    seconds = {}
    for strategy in ("sequential", "pipelined"):
        summary = run(matched.parent, "--model", "matched", "--input", str(folder),
                      "--strategy", strategy, "--batch-size", "8",
                      "--output", str(tmp_path / strategy))
        assert summary["items"] == 48
        seconds[strategy] = summary["seconds"]
    a = np.load(tmp_path / "sequential" / "y.npy")
    b = np.load(tmp_path / "pipelined" / "y.npy")
    assert a.shape == (48, 3, 64, 64)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, np.load(tmp_path / "base" / "y.npy"))
    print(f"load and write {per_chunk_ms:.0f} ms a chunk; {seconds}")
    # Sequential pays load + compute for each chunk, pipelined about the larger of the two.
    assert seconds["pipelined"] < 0.8 * seconds["sequential"], seconds


def test_a_stopped_job_resumes_where_it_stopped(repo, tmp_path):
    values = np.arange(4 * 2000, dtype=np.float32).reshape(2000, 4)
    np.save(tmp_path / "x.npy", values)
    out = tmp_path / "out"
    args = [BINARY, "run", "--model-repository", str(repo), "--model", "sim", "--input",
            str(tmp_path / "x.npy"), "--output", str(out), "--batch-size", "8"]
    # Batches of 8 take ~5 ms: 250 of them take over a second; stop the job part-way.
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        progress = out / "progress.json"
        if progress.exists() and json.loads(progress.read_text())["done"] >= 400:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = json.loads((out / "progress.json").read_text())["done"]
    assert 0 < done < 2000, done
    summary = run(repo, "--model", "sim", "--input", str(tmp_path / "x.npy"), "--output",
                  str(out), "--batch-size", "8")
    assert summary["skipped"] >= done and summary["items"] == 2000, summary
    np.testing.assert_array_equal(np.load(out / "y.npy"), 2 * values + 1)

    # Another job's folder is not overwritten unless asked.
    np.save(tmp_path / "other.npy", values[:10])
    refused = run(repo, "--model", "sim", "--input", str(tmp_path / "other.npy"), "--output",
                  str(out), check=False)
    assert refused.returncode != 0 and "another job" in refused.stderr
    summary = run(repo, "--model", "sim", "--input", str(tmp_path / "other.npy"), "--output",
                  str(out), "--restart")
    assert summary["items"] == 10 and summary["skipped"] == 0
    np.testing.assert_array_equal(np.load(out / "y.npy"), 2 * values[:10] + 1)


def test_bad_inputs_are_refused_with_a_clear_error(repo, tmp_path):
    np.save(tmp_path / "f64.npy", np.zeros((4, 512)))
    np.save(tmp_path / "narrow.npy", np.zeros((4, 500), np.float32))
    cases = [
        (["--model", "mlp", "--input", str(tmp_path / "f64.npy")], "FP64"),
        (["--model", "mlp", "--input", str(tmp_path / "narrow.npy")], "do not fit"),
        (["--model", "mlp", "--input", str(tmp_path / "missing.npy")], "missing.npy"),
        (["--model", "nosuchmodel", "--input", str(tmp_path / "f64.npy")], "no model folder"),
        (["--model", "mlp", "--input", f"nosuch={tmp_path / 'narrow.npy'}"], "no input 'nosuch'"),
        (["--model", "mlp", "--input", str(tmp_path)], "decodes no images"),
        (["--model", "mlp", "--input", str(tmp_path / "narrow.npy"), "--batch-size", "0"],
         "'0' is not a count from 1 to 1048576"),
        # A count no semaphore holds panicked where it was used; each is refused as it is read.
        *[(["--model", "mlp", "--input", str(tmp_path / "narrow.npy"), flag, given],
           f"'{given}' is not a count from 1 to 1048576")
          for flag in ["--batch-size", "--pipeline-depth", "--max-concurrent-batches"]
          for given in ["0", "18446744073709551615"]],
    ]
    for args, message in cases:
        proc = run(repo, *args, check=False)
        assert proc.returncode != 0, args
        assert message in proc.stderr, (args, proc.stderr)
        assert "panicked" not in proc.stderr


def test_every_response_of_a_streaming_model_is_written_for_each_item(tmp_path):
    # countdown (Triton's decoupled mode) answers N with N responses, LEFT = N .. 1.
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "tests" / "python_models" / "countdown", repo / "countdown")
    counts = [3, 0, 2, 1, 4, 2, 5, 1]
    path = tmp_path / "n.npy"
    # Item 3 fails the job the first time (N < 0 is an error response).
    np.save(path, np.array([[n if i != 3 else -1] for i, n in enumerate(counts)], np.int32))
    out = tmp_path / "n.out"
    proc = run(repo, "--model", "countdown", "--input", str(path), check=False)
    assert proc.returncode != 0
    assert "item 3: " in proc.stderr and "N must not be negative" in proc.stderr, proc.stderr
    assert "panicked" not in proc.stderr
    written = (out / "responses.jsonl").read_text().splitlines()
    assert len(written) <= 3
    assert json.loads((out / "progress.json").read_text())["done"] == len(written)
    # Mended, the rerun starts after the items written, and every item is answered in order.
    np.save(path, np.array([[n] for n in counts], np.int32))
    summary = run(repo, "--model", "countdown", "--input", str(path))
    assert summary["items"] == len(counts) and summary["skipped"] == len(written)
    lines = [json.loads(l) for l in (out / "responses.jsonl").read_text().splitlines()]
    assert [l["item"] for l in lines] == list(range(len(counts)))
    batches = set()
    for line, n in zip(lines, counts):
        left = []
        for response in line["responses"]:
            outputs = {o["name"]: o for o in response["outputs"]}
            assert outputs["LEFT"]["datatype"] == "INT32" and outputs["LEFT"]["shape"] == [1, 1]
            left.append(outputs["LEFT"]["data"][0])
            batches.add(outputs["WORD"]["data"][0])
        assert left == list(range(n, 0, -1)), (n, line)
    # The items were in flight together, and the batcher ran several in one execution.
    assert batches - {"batch of 1"}, batches
    # --batch-size cannot group a streaming model's items: each is its own request.
    proc = run(repo, "--model", "countdown", "--input", str(path), "--batch-size", "4",
               "--restart", check=False)
    assert proc.returncode != 0 and "leave out --batch-size" in proc.stderr, proc.stderr


def test_a_stream_job_on_a_streaming_model_is_refused_with_a_clear_error(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "tests" / "python_models" / "countdown", repo / "countdown")
    proc = run(repo, "--model", "countdown", "--input", "nats://127.0.0.1:4222/items",
               "--output", "nats://127.0.0.1:4222/answers", check=False)
    assert proc.returncode != 0
    assert "stream of responses (decoupled)" in proc.stderr, proc.stderr
    assert "panicked" not in proc.stderr


def test_prompts_are_completed_in_input_order(repo, server, tmp_path):
    prompts = [
        {"id": "capital", "prompt": "The capital of France is"},
        "One, two, three,",
        {"id": "chat", "messages": [{"role": "user", "content": "Say hello in one word."}]},
        {"prompt": "A long time ago, in a small village at the edge of a great forest, there lived",
         "max_tokens": 4},
        "Water boils at",
    ]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    summary = run(repo, "--model", "smollm2", "--input", str(path), "--max-tokens", "12",
                  "--batch-size", "2")
    assert summary["items"] == 5
    done = [json.loads(l) for l in (tmp_path / "prompts.out" / "completions.jsonl").read_text().splitlines()]
    assert [c["index"] for c in done] == [0, 1, 2, 3, 4]
    assert done[0]["id"] == "capital" and done[2]["id"] == "chat"
    assert done[3]["completion_tokens"] <= 4
    for c in done:
        assert c["text"] and 0 < c["completion_tokens"] <= 12
        assert c["finish_reason"] in ("stop", "length")
    assert not (tmp_path / "prompts.out" / "completions.partial.jsonl").exists()
    # Greedy completions are the server's.
    from openai import OpenAI
    client = OpenAI(base_url=f"http://{server.http}/v1", api_key="none")
    answer = client.completions.create(model="smollm2", prompt=prompts[0]["prompt"],
                                       temperature=0, max_tokens=12)
    assert answer.choices[0].text == done[0]["text"]

    # A bad line names its line number.
    path.write_text('"fine"\n{"prompt": 3}\n')
    proc = run(repo, "--model", "smollm2", "--input", str(path), "--output",
               str(tmp_path / "bad"), check=False)
    assert proc.returncode != 0 and "line 2" in proc.stderr, proc.stderr
    # Sampling settings out of range are refused, by line or by flag, as the OpenAI routes
    # refuse them (a NaN temperature wrote noise, a max_tokens of 0 one token).
    for line, says in [({"prompt": "a", "temperature": -5}, "temperature -5 is not between 0 and 2"),
                       ({"prompt": "a", "temperature": 1e30}, "is not between 0 and 2"),
                       ({"prompt": "a", "max_tokens": 0}, "max_tokens must be at least 1")]:
        path.write_text('"fine"\n' + json.dumps(line) + "\n")
        proc = run(repo, "--model", "smollm2", "--input", str(path), "--output",
                   str(tmp_path / "bad"), check=False)
        assert proc.returncode != 0 and "line 2: " in proc.stderr and says in proc.stderr, \
            proc.stderr
    for flag, given in [("--temperature", "nan"), ("--temperature", "3"), ("--max-tokens", "0")]:
        proc = run(repo, "--model", "smollm2", "--input", str(path), "--output",
                   str(tmp_path / "bad"), f"{flag}={given}", check=False)
        assert proc.returncode != 0 and f"'{given}' is not a" in proc.stderr, proc.stderr


def batch_line(custom_id, url, body):
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}) + "\n"


def test_an_openai_batch_file_is_answered_as_the_server_answers_each_request(repo, server,
                                                                            tmp_path):
    chat = {"model": "smollm2", "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    completion = {"prompt": "Water boils at", "max_tokens": 8, "temperature": 0, "n": 2}
    path = tmp_path / "requests.jsonl"
    path.write_text(batch_line("chat", "/v1/chat/completions", chat)
                    + batch_line("completion", "/v1/completions", completion)
                    + "\n"
                    + batch_line("bad", "/v1/completions", {"prompt": "a", "max_tokens": -3})
                    + batch_line("tools", "/v1/chat/completions", {
                        "messages": [{"role": "user", "content": "Weather in Paris?"}],
                        "tool_choice": "required", "max_tokens": 60, "temperature": 0,
                        "tools": [{"type": "function", "function": {
                            "name": "weather", "parameters": {
                                "type": "object", "properties": {"city": {"type": "string"}},
                                "required": ["city"]}}}]}))
    summary = run(repo, "--model", "smollm2", "--input", str(path))
    assert summary["items"] == 4 and summary["errors"] == 1, summary
    lines = [json.loads(l) for l in (tmp_path / "requests.out" / "batch_output.jsonl")
             .read_text().splitlines()]
    assert [l["custom_id"] for l in lines] == ["chat", "completion", "bad", "tools"]
    assert len({l["id"] for l in lines}) == 4
    assert all(l["error"] is None for l in lines)
    status = [l["response"]["status_code"] for l in lines]
    assert status == [200, 200, 400, 200], lines
    # Each answer is the server's for the same body (greedy: the same text).
    from openai import OpenAI
    client = OpenAI(base_url=f"http://{server.http}/v1", api_key="none")
    answer = client.chat.completions.create(**chat)
    body = lines[0]["response"]["body"]
    assert body["object"] == "chat.completion" and body["model"] == "smollm2"
    assert body["choices"][0]["message"]["content"] == answer.choices[0].message.content
    assert body["usage"]["prompt_tokens"] == answer.usage.prompt_tokens
    answer = client.completions.create(model="smollm2", **completion)
    body = lines[1]["response"]["body"]
    assert [c["text"] for c in body["choices"]] == [c.text for c in answer.choices]
    assert body["model"] == "smollm2"  # named by the job where the line names none
    # A bad body gets the route's own error, as the server sends it.
    error = lines[2]["response"]["body"]["error"]
    assert error["type"] == "invalid_request_error" and "-3" in error["message"], error
    assert error["message"].startswith("max_tokens: "), error
    # The summary's usage sums the answers' (the refused one counts none).
    usage = [l["response"]["body"].get("usage") for l in lines]
    assert summary["usage"]["input_tokens"] == sum(u["prompt_tokens"] for u in usage if u)
    assert summary["usage"]["output_tokens"] == sum(u["completion_tokens"] for u in usage if u)
    assert summary["usage"]["output_tokens"] > 0
    call = lines[3]["response"]["body"]["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "weather"
    assert "city" in json.loads(call["function"]["arguments"])

    # A text encoder: embeddings, scores and rerankings, each equal to the server's.
    path = tmp_path / "texts.jsonl"
    path.write_text(batch_line("e", "/v1/embeddings", {"input": ["a cat sat", "hello"]})
                    + batch_line("s", "/v1/score", {"text_1": "a cat", "text_2": ["a kitten", "a car"]})
                    + batch_line("r", "/v1/rerank", {"query": "a cat", "documents": ["a car", "a kitten"]}))
    summary = run(repo, "--model", "minilm", "--input", str(path))
    assert summary["items"] == 3 and summary["errors"] == 0, summary
    assert summary["usage"]["input_tokens"] > 0 and summary["usage"]["output_tokens"] == 0
    lines = [json.loads(l) for l in (tmp_path / "texts.out" / "batch_output.jsonl")
             .read_text().splitlines()]
    served = client.embeddings.create(model="minilm", input=["a cat sat", "hello"])
    for mine, theirs in zip(lines[0]["response"]["body"]["data"], served.data):
        np.testing.assert_allclose(mine["embedding"], theirs.embedding, rtol=1e-4, atol=1e-6)
    scores = requests.post(f"http://{server.http}/v1/score", json={
        "model": "minilm", "text_1": "a cat", "text_2": ["a kitten", "a car"]}).json()
    got = [d["score"] for d in lines[1]["response"]["body"]["data"]]
    np.testing.assert_allclose(got, [d["score"] for d in scores["data"]], rtol=1e-4)
    ranked = lines[2]["response"]["body"]["results"]
    assert [r["index"] for r in ranked] == [1, 0], ranked  # the kitten first


def test_a_batch_file_is_checked_whole_before_it_runs(repo, tmp_path):
    path = tmp_path / "requests.jsonl"
    fine = batch_line("a", "/v1/completions", {"prompt": "x", "max_tokens": 1})
    cases = [
        (batch_line("a", "/v1/completions", {"prompt": "y"}), "custom_id 'a' is on line 1 too"),
        (batch_line("b", "/v1/completions", {"prompt": "y", "stream": True}), "body.stream"),
        (batch_line("b", "/v2/models/smollm2/infer", {}), "is not a route a batch runs"),
        (batch_line("b", "/v1/completions", {"model": "gpt-4o", "prompt": "y"}),
         "'gpt-4o' is not this job's model 'smollm2'"),
        ('{"custom_id": "b", "url": "/v1/completions", "body": {}}\n', "missing field `method`"),
        ('{"custom_id": "b", "method": "GET", "url": "/v1/completions", "body": {}}\n',
         "a batch request is a POST"),
        ('{"custom_id": 7, "method": "POST", "url": "/v1/completions", "body": {}}\n',
         "invalid type"),
    ]
    for line, says in cases:
        path.write_text(fine + line)
        proc = run(repo, "--model", "smollm2", "--input", str(path), "--output",
                   str(tmp_path / "out"), check=False)
        assert proc.returncode != 0 and "line 2: " in proc.stderr and says in proc.stderr, \
            (says, proc.stderr)
        assert "panicked" not in proc.stderr
        assert not (tmp_path / "out" / "batch_output.jsonl").exists()
    # A model that no route of a batch file answers for.
    path.write_text(batch_line("a", "/v1/embeddings", {"input": "x"}))
    proc = run(repo, "--model", "mlp", "--input", str(path), check=False)
    assert proc.returncode != 0 and "neither a generation model nor a text encoder" in proc.stderr
    proc = run(repo, "--model", "smollm2", "--input", str(path), "--batch-size", "4",
               check=False)
    assert proc.returncode != 0 and "leave out --batch-size" in proc.stderr, proc.stderr


def test_a_stopped_batch_job_resumes_after_the_answers_on_disk(repo, tmp_path):
    path = tmp_path / "requests.jsonl"
    texts = [f"sentence number {i} about cats and dogs" for i in range(1000)]
    path.write_text("".join(batch_line(f"req-{i}", "/v1/embeddings", {"input": t})
                            for i, t in enumerate(texts)))
    out = tmp_path / "out"
    args = [BINARY, "run", "--model-repository", str(repo), "--model", "minilm", "--input",
            str(path), "--output", str(out), "--max-concurrent-batches", "4"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        progress = out / "progress.json"
        if progress.exists() and json.loads(progress.read_text())["done"] > 0:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = json.loads((out / "progress.json").read_text())["done"]
    assert 0 < done < 1000, done
    summary = run(repo, "--model", "minilm", "--input", str(path), "--output", str(out))
    assert summary["skipped"] >= done and summary["items"] == 1000, summary
    lines = [json.loads(l) for l in (out / "batch_output.jsonl").read_text().splitlines()]
    assert [l["custom_id"] for l in lines] == [f"req-{i}" for i in range(1000)]
    assert all(l["response"]["status_code"] == 200 for l in lines)
    # The answers written before the stop and after it are the same encoder's.
    first, last = (np.array(lines[i]["response"]["body"]["data"][0]["embedding"])
                   for i in (0, 999))
    assert first.shape == last.shape == (384,)
    assert abs(np.linalg.norm(first) - 1) < 1e-4 and abs(np.linalg.norm(last) - 1) < 1e-4


async def publish(url, subject, payloads):
    nc = await nats.connect(url)
    js = nc.jetstream()
    for p in payloads:
        await js.publish(subject, p)
    await nc.close()


async def answers(url, subject, count):
    """The first `count` answers on `subject`'s stream: (headers, status, outputs by name)."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    sub = await js.pull_subscribe(subject, durable=None)
    got = []
    while len(got) < count:
        got += await sub.fetch(count - len(got), timeout=20)
    await nc.close()
    decoded = []
    for m in got:
        status = int(m.headers["Sheaf-Status"])
        outputs = {}
        if status == 200:
            n = int(m.headers["Inference-Header-Content-Length"])
            header = json.loads(m.data[:n])
            at = n
            for o in header["outputs"]:
                size = o["parameters"]["binary_data_size"]
                assert o["datatype"] == "FP32"
                outputs[o["name"]] = np.frombuffer(m.data[at:at + size], np.float32).reshape(o["shape"])
                at += size
        decoded.append((m.headers, status, outputs or json.loads(m.data)))
    return decoded


def test_a_stream_of_frames_flows_through_the_pipelined_engine(repo, nats_url):
    source = f"{nats_url}/frames.in"
    sink = f"{nats_url}/frames.out"
    frames = np.random.default_rng(5).standard_normal((300, 512), dtype=np.float32)
    payloads = [f.tobytes() for f in frames]
    payloads.insert(150, b"not a frame")
    # The job makes the streams of both subjects; a first run has nothing to do yet.
    summary = run(repo, "--model", "mlp", "--input", source, "--output", sink)
    assert summary["items"] == 0
    asyncio.run(publish(nats_url, "frames.in", payloads))
    summary = run(repo, "--model", "mlp", "--input", source, "--output", sink, "--batch-size", "32")
    assert summary["items"] == 301, summary

    got = asyncio.run(answers(nats_url, "frames.out", 301))
    sequences = [int(h["Sheaf-Source-Sequence"]) for h, _, _ in got]
    assert sequences == sorted(sequences) and len(set(sequences)) == 301
    bad = got.pop(150)
    assert bad[1] == 400 and "2048 bytes" in bad[2]["error"], bad
    reference = ort.InferenceSession(str(ROOT / "model_repository/mlp/1/model.onnx")).run(
        None, {"input": frames})[0]
    for i, (_, status, outputs) in enumerate(got):
        assert status == 200
        np.testing.assert_allclose(outputs["output"], reference[i:i + 1], rtol=1e-4, atol=1e-5)

    # What was done is remembered: a rerun takes only the new frames.
    asyncio.run(publish(nats_url, "frames.in", payloads[:5]))
    summary = run(repo, "--model", "mlp", "--input", source, "--output", sink)
    assert summary["items"] == 5, summary

    # With --follow the job waits for frames as they come.
    proc = subprocess.Popen([BINARY, "run", "--model-repository", str(repo), "--model", "sim",
                             "--input", f"{nats_url}/sim.in", "--output", f"{nats_url}/sim.out",
                             "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(2)
        values = np.arange(12, dtype=np.float32).reshape(3, 4)
        asyncio.run(publish(nats_url, "sim.in", [v.tobytes() for v in values]))
        got = asyncio.run(answers(nats_url, "sim.out", 3))
        for v, (_, status, outputs) in zip(values, got):
            assert status == 200
            np.testing.assert_array_equal(outputs["y"], [2 * v + 1])
        assert proc.poll() is None, "the job stopped while following"
    finally:
        proc.kill()
        proc.wait()

    # A stream output needs a stream input, and a stream input a stream output.
    refused = run(repo, "--model", "mlp", "--input", source, "--output", "/tmp/x", check=False)
    assert refused.returncode != 0 and "stream output" in refused.stderr
    # An ack wait that is no number of seconds a stream can keep is refused, not a panic.
    for given in ["0.5", "1e300", "nan"]:
        refused = run(repo, "--model", "mlp", "--input", source, "--output", sink,
                      "--ack-wait", given, check=False)
        assert refused.returncode != 0, given
        assert "--ack-wait must be a number of seconds, at least 1" in refused.stderr, refused.stderr
        assert "panicked" not in refused.stderr
