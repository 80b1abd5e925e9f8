"""OpenAI's Files and Batch APIs, with the `openai` Python package unmodified: a batch file
uploaded, run in the background through the `/v1` routes, its answers downloaded and checked
against the same requests sent one by one, with the real SmolLM2 and MiniLM models."""
import io
import json
import time

import httpx
import numpy as np
import openai
import pytest

from conftest import API_KEY, launch, link_encoder

QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?",
             "Say hello.", "Name a fruit.", "What colour is the sky?"]


def line(custom_id, url, body):
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}) + "\n"


def upload(client, text, name="batch.jsonl"):
    return client.files.create(file=(name, io.BytesIO(text.encode())), purpose="batch")


def finished(client, batch, within=120):
    deadline = time.time() + within
    while batch.status not in ("completed", "failed", "cancelled"):
        assert time.time() < deadline, batch
        time.sleep(0.1)
        batch = client.batches.retrieve(batch.id)
    return batch


def answering(client, batch, within=180):
    """The batch once its first answers are in."""
    deadline = time.time() + within
    while batch.request_counts.completed == 0:
        assert time.time() < deadline, batch
        time.sleep(0.02)
        batch = client.batches.retrieve(batch.id)
    return batch


def read_lines(client, file_id):
    return [json.loads(l) for l in client.files.content(file_id).text.splitlines()]


def test_a_batch_of_chats_is_answered_as_each_chat_is_alone(client):
    chats = [{"model": "smollm2", "temperature": 0, "max_tokens": 12,
              "messages": [{"role": "user", "content": q}]} for q in QUESTIONS]
    text = "".join(line(f"q{i}", "/v1/chat/completions", c) for i, c in enumerate(chats))
    # One request the route refuses: it is answered in the error file, and the rest run.
    text += line("bad", "/v1/chat/completions", {"model": "smollm2", "messages": "hi"})
    file = upload(client, text)
    assert file.purpose == "batch" and file.bytes == len(text.encode())
    assert file.filename == "batch.jsonl"
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"job": "nightly"})
    assert batch.status == "validating" and batch.metadata == {"job": "nightly"}
    batch = finished(client, batch)
    assert batch.status == "completed", batch
    assert batch.request_counts.total == 7
    assert batch.request_counts.completed == 6 and batch.request_counts.failed == 1
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    assert batch.errors is None
    answers = read_lines(client, batch.output_file_id)
    assert [a["custom_id"] for a in answers] == [f"q{i}" for i in range(6)]
    assert len({a["id"] for a in answers}) == 6
    for chat, answer in zip(chats, answers):
        assert answer["error"] is None and answer["response"]["status_code"] == 200
        alone = client.chat.completions.create(**chat)
        body = answer["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == "smollm2"
        # The same prompt; the text may differ in a token where the engine ran the requests
        # together (llama.cpp's sums depend on the batch), so it is compared alone below.
        assert body["usage"]["prompt_tokens"] == alone.usage.prompt_tokens
        assert 0 < body["usage"]["completion_tokens"] <= 12
    assert "Paris" in answers[0]["response"]["body"]["choices"][0]["message"]["content"]
    # The batch's usage sums its answers' (the refused one counts none).
    usage = [a["response"]["body"]["usage"] for a in answers]
    assert batch.usage.input_tokens == sum(u["prompt_tokens"] for u in usage)
    assert batch.usage.output_tokens == sum(u["completion_tokens"] for u in usage)
    assert batch.usage.total_tokens == batch.usage.input_tokens + batch.usage.output_tokens
    [refused] = read_lines(client, batch.error_file_id)
    assert refused["custom_id"] == "bad" and refused["response"]["status_code"] == 400
    assert "messages" in refused["response"]["body"]["error"]["message"]
    # The answers are files like the upload: listed, described and deleted.
    files = {f.id: f for f in client.files.list()}
    assert files[batch.output_file_id].purpose == "batch_output"
    assert files[batch.error_file_id].filename == f"{batch.id}_error.jsonl"
    assert [f.id for f in client.files.list(purpose="batch")][0] == file.id
    assert batch.id in [b.id for b in client.batches.list()]
    assert client.files.delete(batch.error_file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(batch.error_file_id)
    with pytest.raises(openai.NotFoundError):
        client.files.content(batch.error_file_id)


def test_a_request_alone_in_a_batch_is_answered_as_the_route_answers_it(client):
    chat = {"model": "smollm2", "temperature": 0, "max_tokens": 16,
            "messages": [{"role": "user", "content": QUESTIONS[2]}]}
    file = upload(client, line("only", "/v1/chat/completions", chat))
    batch = finished(client, client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"))
    [answer] = read_lines(client, batch.output_file_id)
    alone = client.chat.completions.create(**chat)
    body = answer["response"]["body"]
    assert body["choices"][0]["message"]["content"] == alone.choices[0].message.content
    assert body["usage"] == alone.usage.model_dump(exclude_none=True)


def test_a_batch_of_embeddings_equals_the_embeddings_route(client):
    texts = [f"sentence {i} about a cat" for i in range(40)]
    file = upload(client, "".join(
        line(f"e{i}", "/v1/embeddings", {"model": "minilm", "input": t})
        for i, t in enumerate(texts)))
    batch = finished(client, client.batches.create(
        input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h"))
    assert batch.status == "completed" and batch.request_counts.completed == 40, batch
    assert batch.error_file_id is None
    answers = read_lines(client, batch.output_file_id)
    alone = client.embeddings.create(model="minilm", input=texts)
    for answer, served in zip(answers, alone.data):
        got = answer["response"]["body"]["data"][0]["embedding"]
        np.testing.assert_allclose(got, served.embedding, rtol=1e-4, atol=1e-6)


def test_a_file_with_faults_fails_its_batch_naming_each_line(client):
    ok = line("a", "/v1/completions", {"model": "smollm2", "prompt": "x", "max_tokens": 1})
    text = (ok + "not json\n"
            + line("b", "/v1/embeddings", {"model": "minilm", "input": "x"})
            + ok
            + line("c", "/v1/completions", {"model": "smollm2", "prompt": "x", "stream": True}))
    batch = finished(client, client.batches.create(
        input_file_id=upload(client, text).id, endpoint="/v1/completions",
        completion_window="24h"))
    assert batch.status == "failed" and batch.failed_at, batch
    faults = [(e.line, e.code) for e in batch.errors.data]
    assert faults == [(2, "invalid_json_line"), (3, "mismatched_endpoint"),
                      (4, "duplicate_custom_id"), (5, "invalid_request")], faults
    assert "on line 1 too" in batch.errors.data[2].message
    assert batch.output_file_id is None and batch.request_counts.total == 0


def test_a_cancelled_batch_stops_and_keeps_what_it_answered(client):
    body = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 48,
            "temperature": 0, "ignore_eos": True}
    file = upload(client, "".join(line(f"s{i}", "/v1/completions", body) for i in range(60)))
    batch = answering(client, client.batches.create(
        input_file_id=file.id, endpoint="/v1/completions", completion_window="24h"))
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled"), cancelling
    batch = finished(client, cancelling)
    assert batch.status == "cancelled" and batch.cancelled_at, batch
    done = batch.request_counts.completed
    assert 0 < done < 60, batch
    kept = read_lines(client, batch.output_file_id)
    assert [k["custom_id"] for k in kept] == [f"s{i}" for i in range(done)]
    # The engine is free for the server's other clients at once.
    answer = client.completions.create(model="smollm2", prompt="Hi", max_tokens=4)
    assert answer.usage.completion_tokens > 0
    with pytest.raises(openai.APIStatusError) as refused:
        client.batches.cancel(batch.id)
    assert refused.value.status_code == 409


def test_requests_for_files_and_batches_are_refused_with_clear_errors(client, server):
    import requests
    url = f"http://{server.http}/v1"
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-999999", endpoint="/v1/completions",
                              completion_window="24h")
    file = upload(client, line("a", "/v1/completions", {"model": "smollm2", "prompt": "x"}))
    for fields, says in [({"endpoint": "/v1/images/generations"}, "endpoint"),
                         ({"completion_window": "1h"}, "completion_window: '1h'"),
                         ({"metadata": {"n": 3}}, "metadata.n: a string")]:
        body = {"input_file_id": file.id, "endpoint": "/v1/completions",
                "completion_window": "24h", **fields}
        r = requests.post(f"{url}/batches", json=body)
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
    with pytest.raises(openai.BadRequestError) as bad:
        client.files.create(file=("x.jsonl", io.BytesIO(b"{}")), purpose="fine-tune")
    assert "purpose: 'fine-tune'" in bad.value.message
    r = requests.post(f"{url}/files", files={"purpose": (None, "batch")})
    assert r.status_code == 400 and "file: missing" in r.json()["error"]["message"]
    r = requests.post(f"{url}/files", data=b"{}", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    for path in ("/batches/batch_999999", "/batches/nothing", "/files/file-999999",
                 "/files/nothing/content"):
        assert requests.get(url + path).status_code == 404, path
    assert requests.get(f"{url}/batches", params={"limit": 0}).status_code == 400
    assert requests.get(f"{url}/files", params={"order": "up"}).status_code == 400


def test_files_and_batches_take_the_inference_key(protected):
    keyless = openai.OpenAI(base_url=f"http://{protected.http}/v1", api_key="wrong")
    with pytest.raises(openai.AuthenticationError):
        keyless.files.list()
    keyed = openai.OpenAI(base_url=f"http://{protected.http}/v1", api_key=API_KEY)
    file = upload(keyed, line("a", "/v1/completions",
                              {"model": "smollm2", "prompt": "x", "max_tokens": 2}))
    batch = finished(keyed, keyed.batches.create(
        input_file_id=file.id, endpoint="/v1/completions", completion_window="24h"))
    # The batch's requests run as its creator's: the key is not asked again.
    assert batch.status == "completed" and batch.request_counts.completed == 1, batch


def test_files_and_batches_in_a_folder_given_outlive_the_server(tmp_path):
    """With --files-dir, a server started again on the folder lists the same files and batches,
    and a batch the last one was killed in the middle of goes on from the answers it kept."""
    repo = tmp_path / "repo"
    repo.mkdir()
    link_encoder(repo)
    folder = tmp_path / "files"
    embed = lambda i: line(f"e{i}", "/v1/embeddings", {"model": "minilm", "input": f"text {i}"})
    proc, server = launch(repo, "--files-dir", str(folder))
    try:
        client = openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="none")
        small = upload(client, "".join(embed(i) for i in range(3)))
        done = finished(client, client.batches.create(
            input_file_id=small.id, endpoint="/v1/embeddings", completion_window="24h",
            metadata={"job": "kept"}))
        assert done.status == "completed" and done.usage.input_tokens > 0, done
        answers = client.files.content(done.output_file_id).text
        large = upload(client, "".join(embed(i) for i in range(1500)))
        running = answering(client, client.batches.create(
            input_file_id=large.id, endpoint="/v1/embeddings", completion_window="24h"))
        assert running.status == "in_progress", running
        # The server writes down the answers it has five times a second: kill it after it has.
        saved = folder / f"{running.id}.json"
        deadline = time.time() + 60
        while (kept := json.loads(saved.read_text())["request_counts"]["completed"]) == 0:
            assert time.time() < deadline
            time.sleep(0.02)
        assert kept < 1500, "the batch ended before it could be cut short"
        proc.kill()
        proc.wait(timeout=10)
    finally:
        proc.kill()
        proc.wait(timeout=10)

    proc, server = launch(repo, "--files-dir", str(folder))
    try:
        client = openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="none")
        # The files and the finished batch, as they were.
        assert client.files.retrieve(small.id).bytes == small.bytes
        assert client.files.retrieve(large.id).filename == "batch.jsonl"
        again = client.batches.retrieve(done.id)
        assert again.model_dump() == done.model_dump()
        assert client.files.content(done.output_file_id).text == answers
        # The batch killed in the middle goes on from the answers kept, and asks the model
        # only for the rest: every answer once, in order.
        going = client.batches.retrieve(running.id)
        assert going.status == "in_progress" and going.request_counts.completed >= kept, going
        assert going.in_progress_at == running.in_progress_at
        resumed = finished(client, going, within=300)
        assert resumed.status == "completed", resumed
        assert resumed.request_counts.completed == 1500 and resumed.request_counts.failed == 0
        ids = [a["custom_id"] for a in read_lines(client, resumed.output_file_id)]
        assert ids == [f"e{i}" for i in range(1500)]
        stats = httpx.get(f"http://{server.http}/v2/models/minilm/stats").json()
        assert stats["model_stats"][0]["inference_count"] == 1500 - kept, (stats, kept)
        assert not list(folder.glob("batch_*_output.jsonl")), "answer files became the store's"
        # New files are numbered after the kept ones; every id is listed once.
        newer = upload(client, embed(0))
        listed = [f.id for f in client.files.list()]
        assert newer.id not in (small.id, large.id, done.output_file_id)
        assert len(listed) == len(set(listed)) and newer.id in listed
        assert [b.id for b in client.batches.list()][:2] == [running.id, done.id]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_files_dir_that_cannot_hold_files_stops_the_start(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("a file, not a folder")
    repo = tmp_path / "repo"
    repo.mkdir()
    link_encoder(repo)
    with pytest.raises(RuntimeError) as stopped:
        proc, _ = launch(repo, "--files-dir", str(taken / "files"))
        proc.kill()
    assert f"--files-dir {taken / 'files'}: cannot keep files there" in str(stopped.value)
