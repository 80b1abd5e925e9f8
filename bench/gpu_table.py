"""Writes the table of one bench/gpu.sh run (see there) into a Markdown file, appended."""
import argparse
import json
import re
from pathlib import Path

STAGES = ["receive", "queue", "input", "wait", "infer", "output", "reply", "send", "other"]

a = argparse.ArgumentParser()
for flag in ["work", "models", "device", "levels", "machine", "commit", "memory-loaded",
             "memory-after", "exit-codes", "command", "out"]:
    a.add_argument("--" + flag, required=True)
args = a.parse_args()
work = Path(args.work)
models = args.models.split(",")


def bench_in_process(model):
    """items/s by batch size from `sheaf bench --in-process`'s printed table."""
    rows, inside = {}, False
    for line in (work / f"{model}-http.txt").read_text().splitlines():
        if line.startswith("in-process:"):
            inside = True
        elif line.startswith("in-process best"):
            break
        elif inside and re.fullmatch(r"\s*\d+\s+[\d.]+\s+[\d.]+", line):
            b, _, items = line.split()
            rows[int(b)] = float(items)
    return rows


def probe_curves():
    """items/s by batch size from the server's `max_batch_size: auto` probe, by model."""
    curves = {}
    for line in (work / "server.log").read_text().splitlines():
        try:
            f = json.loads(line)["fields"]
        except (ValueError, KeyError):
            continue
        if f.get("message", "").startswith("max_batch_size auto: measured"):
            curves[f["model"]] = {int(b): float(v.rstrip("/s")) for b, v in
                                  (p.split(": ") for p in f["curve"].split(", "))}
    return curves


plain = {m: json.loads((work / f"plain-{m}.json").read_text()) for m in models}
probes = probe_curves()
memory = json.loads((work / "memory.json").read_text())
stats = json.loads((work / "stats.json").read_text())
fmt = lambda v: "-" if v is None else f"{v:,.1f}"
out = [f"\n## bench/gpu.sh on {args.machine} ({args.device}), sheaf {args.commit}\n",
       f"`{args.command}`\n",
       "\n### In-process, items/s by batch size: the plain loop, `sheaf bench --in-process`, the auto probe\n",
       "| model | batch | plain loop | sheaf bench | bench / plain | auto probe | probe / plain |",
       "|---|---|---|---|---|---|---|"]
for m in models:
    loop = {int(b): v for b, v in plain[m]["items_per_s"].items()}
    bench = bench_in_process(m)
    probe = probes.get(m, {})
    for b in sorted(loop):
        ratio = lambda x: "-" if x is None else f"{x / loop[b]:.2f}"
        out.append(f"| {m} | {b} | {fmt(loop[b])} | {fmt(bench.get(b))} | {ratio(bench.get(b))} | "
                   f"{fmt(probe.get(b))} | {ratio(probe.get(b))} |")
out += ["\n### Served, one item a request: items/s against the plain loop's best, the client's p50 "
        "and the server's mean ms per stage\n",
        "| model | protocol | clients | items/s | of plain best | client p50 | "
        + " | ".join(STAGES) + " | server | outside the server |",
        "|---" * (8 + len(STAGES)) + "|"]
for m in models:
    best = max(plain[m]["items_per_s"].values())
    for protocol in ["http", "grpc"]:
        for level in json.loads((work / f"{m}-{protocol}.json").read_text()):
            s = level.get("server") or {}
            stages = " | ".join(f"{s.get(k, 0):.2f}" for k in STAGES)
            total = s.get("total")
            outside = "-" if total is None else f"{level['p50_ms'] - total:.2f}"
            out.append(f"| {m} | {protocol} | {level['level']:g} | {fmt(level['items_per_s'])} | "
                       f"{level['items_per_s'] / best:.2f} | {level['p50_ms']:.2f} | {stages} | "
                       f"{fmt(total)} | {outside} |")
out += ["\n### Memory on the device (MiB): each model as it loads, against its largest batch "
        "size alone in the plain loop\n",
        "| model | on load | largest size alone | load / alone | ledger after the run |",
        "|---|---|---|---|---|"]
for m in models:
    load = memory[m]["load_mib"]
    alone = plain[m]["largest_alone_mib"]
    booked = stats["models"].get(m, {}).get("memory_bytes", 0) / 2**20
    out.append(f"| {m} | {load:.1f} | {alone:.1f} | {load / alone if alone else 0:.2f} | {booked:.1f} |")
out.append(f"\nThe server held {float(args.memory_loaded):.1f} MiB with every model loaded and "
           f"{float(args.memory_after):.1f} MiB after the run.\n")
codes = args.exit_codes.split()
out.append(f"\n### SIGTERM exits\n\nExit codes of {len(codes)} shutdowns, each after serving every "
           f"model: {' '.join(codes)} ({codes.count('0')} of {len(codes)} exited 0).\n")
with open(args.out, "a") as f:
    f.write("\n".join(out) + "\n")
