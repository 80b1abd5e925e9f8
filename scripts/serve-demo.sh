#!/usr/bin/env bash
# One command from a fresh clone to a running server: set up (ONNX Runtime + demo models),
# build sheaf in release mode, and serve model_repository/ on http://127.0.0.1:8000.
# With --gpu first: ONNX Runtime's CUDA build is installed and the models run on cuda:0
# (scripts/gpu.yaml). Other arguments go to `sheaf serve` (e.g. --http-port 9000 --host 0.0.0.0).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
setup=()
config=()
if [ "${1:-}" = "--gpu" ]; then
  shift
  setup=(--gpu)
  config=(--config scripts/gpu.yaml)
fi
# The apt packages first (llama.cpp's build needs cmake and clang); the rest of the setup
# (ONNX Runtime, the models) downloads while cargo compiles.
bash scripts/setup.sh "${setup[@]}" --system
setup_log=$(mktemp)
bash scripts/setup.sh "${setup[@]}" >"$setup_log" 2>&1 &
setup_pid=$!
built=0
cargo build --release --locked -p sheaf || built=$?
rc=0
wait "$setup_pid" || rc=$?
cat "$setup_log" >&2
rm -f "$setup_log"
[ "$built" = 0 ] || exit "$built"
[ "$rc" = 0 ] || exit "$rc"
exec "${CARGO_TARGET_DIR:-./target}/release/sheaf" serve --model-repository model_repository "${config[@]}" "$@"
