#!/usr/bin/env bash
# Images in, classes out: sheaf serving EfficientNet-Lite0 from JPEG bytes, against a Python
# loop that does the same work in-process (Pillow decode and resize, numpy normalisation,
# ONNX Runtime, top 5), measured in one run on one machine.
#
# The in-process loop runs at batch 1, 8 and 32 with 1 and 2 ONNX Runtime threads; its best is
# the reference. Then sheaf serves the demo repository's `efficientnet` (image_inputs decodes
# the JPEG on blocking threads; classification gives the top 5 with labels), loaded by
# `sheaf bench --image` over HTTP (binary BYTES) and gRPC at concurrency 1, 4, 16 and 64.
# Last, shared memory against binary HTTP for 1.2 MB inputs (bench/shm_vs_binary.py, the
# orientation model, tritonclient one request at a time).
# Usage: bench/images.sh [seconds per level, default 5]
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
secs=${1:-5}
port=${SHEAF_BENCH_PORT:-18452}
grpc_port=$((port + 1))
bash scripts/setup.sh --test
.venv/bin/python -m pip install -q --disable-pip-version-check pillow==13.0.0
sheaf_binary
mkdir -p bench/out
# The cat photograph as a JPEG (quality 90), 451x300.
.venv/bin/python -c "from PIL import Image; Image.open('.cache/test-images/cat.png').convert('RGB').save('bench/out/cat.jpg', quality=90)"
model=model_repository/efficientnet/1/model.onnx
machine_line
for threads in 1 2; do
  echo
  echo "Python in-process (Pillow + numpy + onnxruntime), $threads ONNX Runtime thread(s):"
  .venv/bin/python bench/images_inprocess.py "$model" bench/out/cat.jpg "$secs" "$threads" 1,8,32
done
repo=$work/repo
mkdir -p "$repo"
link_model efficientnet "$repo"
mkdir -p "$repo/orientation/1"
ln -s "$root/model_repository/orientation/1/model.onnx" "$repo/orientation/1/model.onnx"
serve bench/out/images-server.log --model-repository "$repo" --http-port "$port" \
  --grpc-port "$grpc_port" --metrics-port 0
echo
echo "sheaf, HTTP (binary BYTES), one JPEG per request, top 5 classes back:"
"$sheaf" bench --url "http://127.0.0.1:$port" --model efficientnet --image bench/out/cat.jpg \
  --classes 5 --concurrency 1,4,16,64 --duration "$secs"
echo
echo "sheaf, gRPC (raw BYTES), one JPEG per request, top 5 classes back:"
"$sheaf" bench --url "http://127.0.0.1:$grpc_port" --http-url "http://127.0.0.1:$port" \
  --protocol grpc --model efficientnet --image bench/out/cat.jpg --classes 5 \
  --concurrency 1,4,16,64 --duration "$secs"
echo
echo "Shared memory against binary HTTP (orientation, 2 items = 1.2 MB, one request at a time):"
.venv/bin/python bench/shm_vs_binary.py "127.0.0.1:$port" "$secs"
