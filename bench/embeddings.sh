#!/usr/bin/env bash
# Served embeddings against an in-process loop, measured in one run on one machine.
#
# all-MiniLM-L6-v2 (the demo repository's `minilm`): first a hand-written in-process loop
# (tokenise, pad, ONNX Runtime, pool, normalise) at several batch sizes, the best being the
# reference; then sheaf serving the same folder on POST /v1/embeddings, one sentence per
# request, at concurrency 1, 8 and 64, with sentences/s, p50/p99 latency and served/in-process.
# Usage: bench/embeddings.sh [seconds per level, default 5]
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
secs=${1:-5}
port=${SHEAF_BENCH_PORT:-18432}
bash scripts/setup.sh
sheaf_binary
repo=$work/repo
mkdir -p "$repo"
link_model minilm "$repo"
mkdir -p bench/out
serve bench/out/embeddings-server.log --model-repository "$repo" --http-port "$port"
machine_line
echo
"$sheaf" bench --embed --url "http://127.0.0.1:$port" --model minilm --concurrency 1,8,64 \
  --duration "$secs" --in-process model_repository/minilm --batch-sizes 1,8,16,32,64
