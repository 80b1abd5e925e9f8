#!/usr/bin/env bash
# Generation throughput and latency, measured in one run on one machine: SmolLM2-135M-Instruct
# (GGUF) served by sheaf over the OpenAI-compatible routes at 1, 4, 16 and 32 concurrent streams
# (1 = the same requests one after another), against the same requests on an in-process engine,
# then against llama-cpp-python's OpenAI server as a peer when PEER_PYTHON names a Python that
# has `llama-cpp-python[server]` installed. Build the peer with the CPU features sheaf's llama.cpp
# uses, for a fair comparison (and never GGML_NATIVE):
#   CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_F16C=ON \
#     -DGGML_FMA=ON -DGGML_SSE42=ON" pip install 'llama-cpp-python[server]==0.3.36'
# Its server handles one request at a time; --interrupt_requests False makes the others queue
# (by default a new request cuts off the one streaming).
# Usage: bench/generation.sh [max tokens per answer, default 64]
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
tokens=${1:-64}
port=${SHEAF_BENCH_PORT:-18531}
peer_port=$((port + 1))
bash scripts/setup.sh
sheaf_binary
gguf=model_repository/smollm2/model.gguf
mkdir -p bench/out
repo=$work/repo
mkdir -p "$repo"
mkdir -p "$repo/smollm2"
ln -s "$root/$gguf" "$repo/smollm2/model.gguf"
serve bench/out/generation-server.log --model-repository "$repo" --http-port "$port" \
  --grpc-port 0 --metrics-port 0
machine_line
echo
"$sheaf" bench --generate --url "http://127.0.0.1:$port" --model smollm2 \
  --concurrency 1,4,16,32 --max-tokens "$tokens" --in-process "$gguf"
stop "$server"
if [ -n "${PEER_PYTHON:-}" ]; then
  echo
  echo "peer: llama-cpp-python $("$PEER_PYTHON" -c 'import llama_cpp; print(llama_cpp.__version__)') OpenAI server"
  "$PEER_PYTHON" -m llama_cpp.server --model "$gguf" --model_alias smollm2 --port "$peer_port" \
    --n_ctx 8192 --n_threads "$(nproc)" --interrupt_requests False \
    >bench/out/generation-peer.log 2>&1 &
  pids+=($!)
  wait_for "http://127.0.0.1:$peer_port/v1/models" "${pids[-1]}" bench/out/generation-peer.log
  "$sheaf" bench --generate --url "http://127.0.0.1:$peer_port" --model smollm2 \
    --concurrency 1,4,16,32 --max-tokens "$tokens"
  stop "${pids[-1]}"
fi

# What kept prefixes save: the same requests behind a long shared system prompt, with the prefix
# cache on (the default) and off (prefix_slots: 0), at concurrency 4.
system="You are a storyteller for a children's magazine. Every story you write is gentle, vivid and \
suitable for readers aged six to ten. Use simple words, short sentences and a clear beginning, \
middle and end. Give every main character a name, describe one place in detail with colours, \
sounds and smells, include one small problem that the characters solve together by being kind \
and clever, and finish with a calm, happy ending and a one-line moral."
for slots in 8 0; do
  echo
  echo "shared system prompt, prefix_slots: $slots"
  printf 'generation: {prefix_slots: %s}\n' "$slots" >"$repo/smollm2/config.yaml"
  serve bench/out/generation-server.log --model-repository "$repo" --http-port "$port" \
    --grpc-port 0 --metrics-port 0
  "$sheaf" bench --generate --url "http://127.0.0.1:$port" --model smollm2 \
    --concurrency 4 --requests 16 --max-tokens 16 --system "$system"
  curl -s "http://127.0.0.1:$port/stats" | "$root/.venv/bin/python" -c \
    'import json,sys; g=json.load(sys.stdin)["generation"]["smollm2"]; print("prefix hit rate %.2f, prompt tokens prefilled %d, reused %d" % (g["prefix_cache_hit_rate"], g["prompt_tokens"], g["prefix_tokens_reused"]))'
  stop "$server"
done
