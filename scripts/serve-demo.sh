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
bash scripts/setup.sh "${setup[@]}"
cargo build --release --locked -p sheaf
exec "${CARGO_TARGET_DIR:-./target}/release/sheaf" serve --model-repository model_repository "${config[@]}" "$@"
