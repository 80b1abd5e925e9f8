"""Tokens/s of answers held to a format (a JSON schema, by llama.cpp's grammar) against free
answers, on one server in one run: `python bench/guided.py URL [--model smollm2] [--seconds 8]
[--concurrency 1,4]`. Each level runs the free and the guided requests in turn, several rounds,
and prints each one's completion tokens/s and the ratio guided / free."""
import argparse
import json
import threading
import time
import urllib.request

STORY = [{"role": "user", "content": "Write a long story about a cat who sails the sea."}]
SCHEMA = {"type": "object", "properties": {"title": {"type": "string"},
                                           "story": {"type": "string"}},
          "required": ["title", "story"]}


def ask(url, body):
    request = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as r:
        return json.load(r)["usage"]["completion_tokens"]


def level(url, body, clients, seconds):
    """Completion tokens/s of `clients` closed-loop clients sending `body` for `seconds`."""
    tokens = [0] * clients
    end = time.monotonic() + seconds

    def client(i):
        while time.monotonic() < end:
            tokens[i] += ask(url, body)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(tokens) / (time.monotonic() - start)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("url")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--seconds", type=float, default=8)
    p.add_argument("--concurrency", default="1,4")
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    free = {"model": a.model, "messages": STORY, "max_tokens": 64, "temperature": 0.7, "seed": 1}
    guided = {**free, "response_format": {"type": "json_schema",
                                          "json_schema": {"name": "story", "schema": SCHEMA}}}
    ask(a.url, free)
    print("| c | free tokens/s | guided tokens/s | guided / free |")
    print("|---|---|---|---|")
    for c in (int(x) for x in a.concurrency.split(",")):
        for _ in range(a.rounds):
            f = level(a.url, free, c, a.seconds)
            g = level(a.url, guided, c, a.seconds)
            print(f"| {c} | {f:.1f} | {g:.1f} | {g / f:.2f} |", flush=True)


if __name__ == "__main__":
    main()
