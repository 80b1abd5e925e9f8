#!/usr/bin/env bash
# Served embeddings against an in-process loop, measured in one run on one machine.
#
# all-MiniLM-L6-v2 (the demo repository's `minilm`): first a hand-written in-process loop
# (tokenise, pad, ONNX Runtime, pool, normalise) at several batch sizes, the best being the
# reference; then sheaf serving the same folder on POST /v1/embeddings, one sentence per
# request, at concurrency 1, 8 and 64, with sentences/s, p50/p99 latency and served/in-process.
# Usage: bench/embeddings.sh [seconds per level, default 5]
set -euo pipefail
# The servers started here stop at once on SIGTERM: no load balancer waits for them.
export SHEAF_DRAIN_DELAY=0
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
secs=${1:-5}
port=${SHEAF_BENCH_PORT:-18432}
bash scripts/setup.sh
cargo build --release --locked -p sheaf
sheaf="${CARGO_TARGET_DIR:-./target}/release/sheaf"
repo=$(mktemp -d)
mkdir -p bench/out "$repo/minilm/1"
ln -s "$root/model_repository/minilm/1/model.onnx" "$repo/minilm/1/model.onnx"
ln -s "$root/model_repository/minilm/tokenizer.json" "$repo/minilm/tokenizer.json"
ln -s "$root/model_repository/minilm/config.yaml" "$repo/minilm/config.yaml"
log=bench/out/embeddings-server.log
"$sheaf" serve --model-repository "$repo" --http-port "$port" >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; rm -rf "$repo"' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null && break
  sleep 0.2
done
echo "machine: $(nproc) cores, $(uname -m); sheaf $(git rev-parse --short HEAD)"
echo
"$sheaf" bench --embed --url "http://127.0.0.1:$port" --model minilm --concurrency 1,8,64 \
  --duration "$secs" --in-process model_repository/minilm --batch-sizes 1,8,16,32,64
