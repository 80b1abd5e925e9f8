#!/usr/bin/env bash
# `sheaf run` strategies on a streaming-science shape: detector frames through a model on a
# device, read from disk, computed, written back. Prints each strategy's items/s and its ratio
# to sequential, measured in one run.
#
#   frames:  2,000 detector frames of 1x256x256 float32 (256 KB each, 512 MB) in one NPY file,
#            through a simulated device (5 ms + 0.25 ms per frame, max batch 32) that writes
#            frames of the same size back;
#   images:  480 PNG photographs decoded and cropped to 224x224 on the CPU, through a simulated
#            device (20 ms + 1 ms per image, max batch 16): load and compute both cost;
#   mlp:     200,000 frames of 512 float32 through the real ONNX MLP 512-2048-2048-10 on the CPU.
# Usage: bench/run.sh
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
bash scripts/setup.sh --test >/dev/null
sheaf_binary
work=.cache/bench-run
rm -rf "$work" && mkdir -p "$work/repo/frames" "$work/repo/images" "$work/repo/mlp/1" "$work/photos"
printf 'input: {name: x, shape: [-1, 1, 256, 256]}\noutput: {name: y}\nlatency_ms: {a: 5, b: 0.25}\n' \
  >"$work/repo/frames/model.sim.yaml"
printf 'max_batch_size: 32\n' >"$work/repo/frames/config.yaml"
printf 'input: {name: x, shape: [-1, 3, 224, 224]}\noutput: {name: y}\nlatency_ms: {a: 20, b: 1}\n' \
  >"$work/repo/images/model.sim.yaml"
printf 'max_batch_size: 16\nimage_inputs:\n  x: {resize: 256, crop: [224, 224]}\n' >"$work/repo/images/config.yaml"
ln -s "$root/model_repository/mlp/1/model.onnx" "$work/repo/mlp/1/model.onnx"
printf 'max_batch_size: 256\n' >"$work/repo/mlp/config.yaml"
.venv/bin/python - "$work" <<'PY'
import shutil, sys
from pathlib import Path
import numpy as np
work = Path(sys.argv[1])
rng = np.random.default_rng(0)
np.save(work / "frames.npy", rng.standard_normal((2000, 1, 256, 256), dtype=np.float32))
np.save(work / "mlp.npy", rng.standard_normal((200000, 512), dtype=np.float32))
photos = sorted(Path(".cache/test-images").glob("*.png"))
for i in range(480):
    shutil.copy(photos[i % len(photos)], work / "photos" / f"{i:04}.png")
PY

job() { # model, input, strategy, extra args; prints items/s
  "$sheaf" run --model-repository "$work/repo" --model "$1" --input "$2" --strategy "$3" \
    --output "$work/out" --restart "${@:4}" 2>/dev/null | .venv/bin/python -c \
    'import json, sys; print(json.loads(sys.stdin.read().splitlines()[-1])["items_per_s"])'
}
for case in "frames $work/frames.npy" "images $work/photos" "mlp $work/mlp.npy"; do
  set -- $case
  echo "== $1 =="
  base=""
  for s in "sequential" "concurrent" "pipelined" "pipelined --max-concurrent-batches 2"; do
    # shellcheck disable=SC2086
    rate=$(job "$1" "$2" $s)
    [ -z "$base" ] && base=$rate
    printf '%-45s %10.1f items/s  %.2fx sequential\n' "$s" "$rate" \
      "$(.venv/bin/python -c "print($rate / $base)")"
  done
done
