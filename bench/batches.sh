#!/usr/bin/env bash
# The same file of requests three ways, in one run: sent one by one by a client that keeps
# the engine's sequences busy (as many requests in flight as the model runs together), run
# by the server as an OpenAI batch (`POST /v1/files`, `POST /v1/batches`, polled until
# `completed`), and run offline by `sheaf run` (in process, no HTTP). Prints each way's
# requests/s and its ratio to the client's.
#
#   chat:        N chat completions of the demo's SmolLM2 (greedy, 32 tokens, `ignore_eos`);
#   embeddings:  20 x N one-sentence embeddings of the demo's all-MiniLM-L6-v2.
# The client and the server share this machine's cores, as the batch's in-process requests
# and the offline job do not: the ratios include what a client costs.
# Usage: bench/batches.sh [N]   (default 64)
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
n=${1:-64}
bash scripts/setup.sh --test >/dev/null
sheaf_binary
machine_line "N=$n"
mkdir -p "$work/repo"
link_model smollm2 "$work/repo"
link_model minilm "$work/repo"
serve "$work/serve.log" --model-repository "$work/repo" --http-port 18930 \
  --grpc-port 18931 --metrics-port 18932
.venv/bin/python - "$work" "$n" "$sheaf" <<'PY'
import io, json, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
import openai

work, n, sheaf = sys.argv[1], int(sys.argv[2]), sys.argv[3]
client = openai.OpenAI(base_url="http://127.0.0.1:18930/v1", api_key="-", timeout=600)
cases = {
    "chat": ("/v1/chat/completions", "smollm2", [
        {"model": "smollm2", "max_tokens": 32, "temperature": 0, "ignore_eos": True,
         "messages": [{"role": "user", "content": f"Tell me fact number {i} about the sea."}]}
        for i in range(n)]),
    "embeddings": ("/v1/embeddings", "minilm", [
        {"model": "minilm", "input": f"Sentence {i} is about boats, tides and the sea."}
        for i in range(20 * n)]),
}
# What each model runs together: the engine's default `generation.max_seqs`, and the demo
# encoder's `max_batch_size`; a server batch keeps as many in flight.
in_flight = {"smollm2": 16, "minilm": 64}
for name, (url, model, bodies) in cases.items():
    text = "".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": url, "body": b})
                   + "\n" for i, b in enumerate(bodies))
    path = f"{work}/{name}.jsonl"
    open(path, "w").write(text)
    def send(body, name=name):
        body = dict(body)
        # What the `openai` client has no argument for goes as extra body fields.
        extra = {k: body.pop(k) for k in ("ignore_eos",) if k in body}
        create = client.chat.completions.create if name == "chat" else client.embeddings.create
        return create(**body, extra_body=extra or None)
    send(bodies[0])  # warm
    started = time.perf_counter()
    with ThreadPoolExecutor(in_flight[model]) as pool:
        list(pool.map(send, bodies))
    one_by_one = len(bodies) / (time.perf_counter() - started)
    started = time.perf_counter()
    file = client.files.create(file=(f"{name}.jsonl", io.BytesIO(text.encode())), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint=url, completion_window="24h")
    while batch.status not in ("completed", "failed", "cancelled"):
        time.sleep(0.02)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == len(bodies), batch
    batched = len(bodies) / (time.perf_counter() - started)
    job = subprocess.run([sheaf, "run", "--model-repository", f"{work}/repo", "--model", model,
                          "--input", path, "--output", f"{work}/{name}.out",
                          "--max-concurrent-batches", str(in_flight[model])],
                         capture_output=True, text=True, check=True)
    offline = json.loads(job.stdout.splitlines()[-1])["items_per_s"]
    print(f"== {name}: {len(bodies)} requests, {in_flight[model]} in flight ==")
    for way, rate in [("client, one request each", one_by_one),
                      ("server, /v1/batches", batched), ("sheaf run, offline", offline)]:
        print(f"{way:28} {rate:9.1f} requests/s  {rate / one_by_one:5.2f}x the client")
PY
